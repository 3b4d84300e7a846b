#!/usr/bin/env bash
# Builds the driver of the recommender's differential test (main.go beside this script): upstream's
# HPA replica calculator (k8s.io/kubernetes) and VPA recommender (k8s.io/autoscaler/
# vertical-pod-autoscaler) answering JSON cases, from the Go module pinned by go.mod and go.sum
# here, into
#   ${AWARE_CACHE_DIR:-$HOME/.cache/aware-rs}/upstream-<kubernetes version>-<vpa version>-<hash of go.mod, go.sum, main.go and this script>/
# Prints the binary's path as its last line. Idempotent (a complete directory is reused at once);
# Go's module and build caches are the ones tests/k8s/build.sh uses, so the Kubernetes packages
# both need compile once.
set -euo pipefail
cd "$(dirname "$0")"

cache_root=${AWARE_CACHE_DIR:-$HOME/.cache/aware-rs}
k8s_version=$(awk '$1 == "k8s.io/kubernetes" && $2 ~ /^v/ { print $2; exit }' go.mod)
vpa_version=$(awk '$1 == "k8s.io/autoscaler/vertical-pod-autoscaler" { print $2; exit }' go.mod)
[ -n "$k8s_version" ] && [ -n "$vpa_version" ] ||
  { echo "build.sh: go.mod must require k8s.io/kubernetes and the VPA" >&2; exit 1; }
key="$k8s_version-$vpa_version-$(cat go.mod go.sum main.go build.sh | sha256sum | cut -c1-12)"
out="$cache_root/upstream-$key"
bin="$out/upstream-diff"

if [ -x "$bin" ] && [ -f "$out/.complete" ]; then
  echo "$bin"
  exit 0
fi

command -v go >/dev/null || PATH="$PATH:/usr/local/go/bin"
command -v go >/dev/null || { echo "build.sh: the Go toolchain (go 1.26) is not installed" >&2; exit 1; }
mkdir -p "$cache_root"
exec 9>"$cache_root/upstream-$key.lock"
flock 9
if [ -x "$bin" ] && [ -f "$out/.complete" ]; then
  echo "$bin"
  exit 0
fi
rm -rf "$cache_root/upstream-$key.tmp."*
tmp=$(mktemp -d "$cache_root/upstream-$key.tmp.XXXXXX")
trap 'rm -rf "$tmp"' EXIT

export GOMODCACHE="$cache_root/go/mod" GOCACHE="$cache_root/go/build"
export GOFLAGS="-modcacherw -mod=readonly -buildvcs=false" GOTOOLCHAIN=local CGO_ENABLED=0
start=$(date +%s)
echo "build.sh: building the upstream HPA/VPA driver (Kubernetes $k8s_version, VPA $vpa_version) into $out" >&2
go build -trimpath -ldflags="-s -w" -o "$tmp/upstream-diff" .
touch "$tmp/.complete"
rm -rf "$out"
mv "$tmp" "$out"
trap - EXIT
echo "build.sh: built in $(($(date +%s) - start)) s" >&2
echo "$bin"
