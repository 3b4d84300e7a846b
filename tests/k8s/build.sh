#!/usr/bin/env bash
# Builds the real control plane the Kubernetes end-to-end tests run — kube-apiserver,
# kube-controller-manager, kube-scheduler, kubectl, etcd, kwok and helm — from the Go module pinned
# by go.mod and go.sum beside this script (pin.sh regenerates them), into
#   ${AWARE_CACHE_DIR:-$HOME/.cache/aware-rs}/k8s-<kubernetes version>-<hash of go.mod, go.sum and this script>/
# with bin/ (the binaries) and kwok-stages/ (kwok's stage configs of the pinned kwok, which make
# its fake nodes Ready and its pods Running). Prints that directory's bin/ as its last line.
# Idempotent: a complete directory is reused at once; an interrupted build leaves only a temporary
# directory that the next run removes. Go's module and build caches live beside it (go/mod,
# go/build), so a rebuild after a bump reuses what did not change.
set -euo pipefail
cd "$(dirname "$0")"

cache_root=${AWARE_CACHE_DIR:-$HOME/.cache/aware-rs}
k8s_version=$(awk '$1 == "require" && $2 == "k8s.io/kubernetes" { print $3 }' go.mod)
[ -n "$k8s_version" ] || { echo "build.sh: go.mod requires no k8s.io/kubernetes" >&2; exit 1; }
key="$k8s_version-$(cat go.mod go.sum build.sh | sha256sum | cut -c1-12)"
out="$cache_root/k8s-$key"
bins=(kube-apiserver kube-controller-manager kube-scheduler kubectl etcd kwok helm)

complete() {
  [ -f "$out/.complete" ] || return 1
  for b in "${bins[@]}"; do [ -x "$out/bin/$b" ] || return 1; done
}
if complete; then
  echo "$out/bin"
  exit 0
fi

# The machines' Go lives in /usr/local/go, which not every shell has on PATH.
command -v go >/dev/null || PATH="$PATH:/usr/local/go/bin"
command -v go >/dev/null || { echo "build.sh: the Go toolchain (go 1.26) is not installed" >&2; exit 1; }
mkdir -p "$cache_root"
# One build at a time (tests started together may all ask for the binaries); the others then find
# the directory complete.
exec 9>"$cache_root/k8s-$key.lock"
flock 9
if complete; then
  echo "$out/bin"
  exit 0
fi
rm -rf "$cache_root/k8s-$key.tmp."*
tmp=$(mktemp -d "$cache_root/k8s-$key.tmp.XXXXXX")
trap 'rm -rf "$tmp"' EXIT

export GOMODCACHE="$cache_root/go/mod" GOCACHE="$cache_root/go/build"
export GOFLAGS="-modcacherw -mod=readonly -buildvcs=false" GOTOOLCHAIN=local CGO_ENABLED=0
start=$(date +%s)
echo "build.sh: building Kubernetes $k8s_version, etcd, kwok and helm into $out (a few minutes the first time)" >&2

# Release builds stamp their version through ldflags; without it kube-apiserver reports
# v0.0.0-master, and helm then refuses charts whose kubeVersion constraint names a real release.
minor=${k8s_version#v1.}
minor=${minor%%.*}
k8s_info=$(go mod download -json "k8s.io/kubernetes@$k8s_version" | sed -n 's/^\t"Info": "\(.*\)",$/\1/p')
k8s_date=$(sed -n 's/.*"Time":"\([^"]*\)".*/\1/p' "$k8s_info")
helm_version=$(go list -m -f '{{.Version}}' helm.sh/helm/v4)
ldflags="-s -w"
for pkg in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
  ldflags+=" -X $pkg.gitVersion=$k8s_version -X $pkg.gitMajor=1 -X $pkg.gitMinor=$minor"
  ldflags+=" -X $pkg.gitTreeState=clean -X $pkg.buildDate=$k8s_date"
done
ldflags+=" -X helm.sh/helm/v4/internal/version.version=$helm_version"

# One invocation, so the packages the binaries share (client-go, apiserver, …) compile once.
go build -trimpath -ldflags="$ldflags" -o "$tmp/bin/" \
  k8s.io/kubernetes/cmd/kube-apiserver \
  k8s.io/kubernetes/cmd/kube-controller-manager \
  k8s.io/kubernetes/cmd/kube-scheduler \
  k8s.io/kubernetes/cmd/kubectl \
  go.etcd.io/etcd/server/v3 \
  sigs.k8s.io/kwok/cmd/kwok \
  helm.sh/helm/v4/cmd/helm
# go names a module root's binary after its path without the major version: etcd's is "server".
mv "$tmp/bin/server" "$tmp/bin/etcd"

kwok_dir=$(go list -m -f '{{.Dir}}' sigs.k8s.io/kwok)
mkdir -p "$tmp/kwok-stages"
for f in node/fast/node-initialize.yaml node/heartbeat-with-lease/node-heartbeat-with-lease.yaml \
  pod/fast/pod-ready.yaml pod/fast/pod-complete.yaml pod/fast/pod-delete.yaml; do
  cp "$kwok_dir/kustomize/stage/$f" "$tmp/kwok-stages/"
done

for b in "${bins[@]}"; do
  case $b in
    kubectl) args=(version --client) ;;
    helm) args=(version --short) ;;
    *) args=(--version) ;;
  esac
  v=$("$tmp/bin/$b" "${args[@]}" 2>&1) || { echo "build.sh: $b ${args[*]} failed: $v" >&2; exit 1; }
  echo "build.sh: $b: ${v%%$'\n'*}" >&2
done

touch "$tmp/.complete"
rm -rf "$out"
mv "$tmp" "$out"
trap - EXIT
echo "build.sh: built in $(($(date +%s) - start)) s" >&2
echo "$out/bin"
