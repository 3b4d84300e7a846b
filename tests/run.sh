#!/usr/bin/env bash
# The whole test suite: installs what the tests need when missing (nats-server, prometheus, python3
# with venv for the manifest checks; the Kubernetes control plane that tests/k8s/build.sh builds;
# the upstream HPA/VPA driver that tests/upstream/build.sh builds; the QuestDB jar), validates the
# Dockerfile, chart and manifests, builds every binary (integration tests run them as separate
# processes) after checking which crates may depend on the simulator and on dfdx
# (tests/check-deps.sh), runs every test, then the chaos test on its own and every
# fuzz target for 60 s (tests/fuzz.sh).
set -euo pipefail
cd "$(dirname "$0")/.."

need=()
have() { command -v "$1" >/dev/null 2>&1 || [ -x "/usr/sbin/$1" ] || [ -x "/usr/bin/$1" ]; }
have nats-server || need+=(nats-server)
have prometheus || need+=(prometheus)
python3 -c 'import venv, ensurepip' >/dev/null 2>&1 || need+=(python3 python3-venv python3-pip)
if [ ${#need[@]} -gt 0 ]; then
  SUDO=""
  [ "$(id -u)" -eq 0 ] || SUDO="sudo"
  echo "installing: ${need[*]}"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${need[@]}" >/dev/null
fi
# Debian installs nats-server under /usr/sbin, which is not on every user's PATH.
export PATH="$PATH:/usr/sbin:/usr/bin"

# The real control plane of the Kubernetes end-to-end tests (kube-apiserver, etcd,
# kube-controller-manager, kube-scheduler, kubectl, kwok, helm): built from the pinned Go module
# tests/k8s/ once into ~/.cache/aware-rs/k8s-<version>-<hash>/, reused at once afterwards.
AWARE_K8S_BIN=$(bash tests/k8s/build.sh | tail -n 1)
export AWARE_K8S_BIN
# The prometheus-operator CRDs the chart's monitoring objects need (the chart test installs them),
# from the Go module proxy, pinned, cached under ~/.cache/aware-rs/prometheus-operator-crds-<version>/.
AWARE_PROMETHEUS_OPERATOR_CRDS=$(bash tests/k8s/prometheus-operator-crds.sh | tail -n 1)
export AWARE_PROMETHEUS_OPERATOR_CRDS
# The driver of the recommender's differential test against upstream's HPA replica calculator and
# VPA recommender (services/recommender/tests/upstream_diff.rs), built from the pinned Go module
# tests/upstream/ once into ~/.cache/aware-rs/upstream-<versions>-<hash>/, reused at once afterwards.
AWARE_UPSTREAM_BIN=$(bash tests/upstream/build.sh | tail -n 1)
export AWARE_UPSTREAM_BIN

# The QuestDB server jar (Maven Central; runs on the machine's Java 17) the trajectory store's
# conformance tests and `aware bench store` start, cached under ~/.cache/aware-rs/questdb-<version>.
bash tests/questdb/install.sh >/dev/null
bash tests/validate-manifests.sh  # Dockerfile, Helm chart, deploy/ manifests (installs its Python tools once)
bash tests/check-deps.sh  # who may depend on the simulator (aware-loadgen) and on dfdx
cargo build --workspace --bins --locked
# The production collector builds without the simulator (its default-on `simulator` feature off).
cargo check -p aware-metrics-collector --no-default-features --locked
cargo test --workspace --locked --no-fail-fast
# The chaos test (every service and nats-server killed -9 once, ~10 min) runs alone.
cargo test -p aware-tests --test integration --locked chaos -- --ignored --nocapture
# Every fuzz target for 60 s from its seed corpus (docs/benchmarks/fuzz.md has the long runs).
bash tests/fuzz.sh 60
