#!/usr/bin/env bash
# The prometheus-operator CRDs (monitoring.coreos.com: ServiceMonitor, PodMonitor, PrometheusRule,
# …) the chart's `monitoring.*` objects need, for the Kubernetes end-to-end tests. They come from
# the Go module proxy: the module github.com/prometheus-operator/prometheus-operator carries them
# in example/prometheus-operator-crd/. The version and the module's go.sum hash are pinned here;
# `go mod download` checks the zip against that hash (and the checksum database), and the CRD
# files are copied into
#   ${AWARE_CACHE_DIR:-$HOME/.cache/aware-rs}/prometheus-operator-crds-<version>/
# Prints that directory as its last line. Idempotent: a complete directory is reused at once.
# (The proxy serves only v0.85.0 of the root module; its newer releases are served as the
# pkg/apis/monitoring submodule alone, which has the Go types but not the CRDs.)
set -euo pipefail

version=v0.85.0
sum="h1:M5xLCLEoaW2IJfnuCwFzzpL+jSVQu3KGT84Pye+fW8s="
module=github.com/prometheus-operator/prometheus-operator

cache_root=${AWARE_CACHE_DIR:-$HOME/.cache/aware-rs}
out="$cache_root/prometheus-operator-crds-$version"
if [ -f "$out/.complete" ]; then
  echo "$out"
  exit 0
fi

command -v go >/dev/null || PATH="$PATH:/usr/local/go/bin"
command -v go >/dev/null || { echo "prometheus-operator-crds.sh: the Go toolchain is not installed" >&2; exit 1; }
mkdir -p "$cache_root"
exec 9>"$out.lock"
flock 9
if [ -f "$out/.complete" ]; then
  echo "$out"
  exit 0
fi
rm -rf "$out.tmp."*
tmp=$(mktemp -d "$out.tmp.XXXXXX")
trap 'rm -rf "$tmp"' EXIT

# The same module cache as tests/k8s/build.sh.
export GOMODCACHE="$cache_root/go/mod" GOFLAGS="-modcacherw" GOTOOLCHAIN=local
json=$(cd "$tmp" && go mod download -json "$module@$version")
got=$(printf '%s\n' "$json" | sed -n 's/^\t"Sum": "\(.*\)",$/\1/p')
if [ "$got" != "$sum" ]; then
  printf 'prometheus-operator-crds.sh: %s@%s: expected %s, got:\n%s\n' "$module" "$version" "$sum" "$json" >&2
  exit 1
fi
dir=$(printf '%s\n' "$json" | sed -n 's/^\t"Dir": "\(.*\)",$/\1/p')
cp "$dir"/example/prometheus-operator-crd/monitoring.coreos.com_*.yaml "$tmp/"
for kind in servicemonitors podmonitors prometheusrules; do
  [ -s "$tmp/monitoring.coreos.com_$kind.yaml" ] || {
    echo "prometheus-operator-crds.sh: $module@$version has no CRD of $kind" >&2
    exit 1
  }
done
chmod 644 "$tmp"/*.yaml
touch "$tmp/.complete"
rm -rf "$out"
mv "$tmp" "$out"
trap - EXIT
echo "$out"
