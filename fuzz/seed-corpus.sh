#!/usr/bin/env bash
# Rebuilds the committed seed corpus fuzz/corpus/<target>/ from the project's own examples: the
# golden bus fixtures, example subjects, deploy/examples/*.toml and the effective configuration
# `aware config` prints for it (JSON), loadgen/examples/apps.yaml (YAML and JSON), tiny DDPG and
# meta-learner checkpoints, and Prometheus answers of each shape. Each seed starts with the
# selector byte(s) its target reads first (see fuzz/fuzz_targets/*.rs). Needs python3 with PyYAML.
set -euo pipefail
cd "$(dirname "$0")/.."
C=fuzz/corpus
rm -rf "$C"
mkdir -p "$C"/{bus_message,bus_subject,config_file,app_file,checkpoint,prometheus_response,model_store_uri}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

# bus_message: selector = index of the kind in EventKind::ALL, then the fixture.
i=0
for kind in obs action applied episode lifecycle embedding model target; do
  { printf "\\x$(printf %02x $i)"; cat "bus-schemas/fixtures/$kind.msgpack"; } > "$C/bus_message/$kind"
  printf 'aware.v1.%s.203.prod.api_v2' "$kind" > "$C/bus_subject/$kind"
  i=$((i + 1))
done
printf 'aware.v1.*.*.*.*' > "$C/bus_subject/filter"
printf 'aware.v1.>' > "$C/bus_subject/all"

# config_file: selector 0 TOML, 1 YAML, 2 JSON.
for f in deploy/examples/*.toml; do
  { printf '\x00'; cat "$f"; } > "$C/config_file/$(basename "$f" .toml)"
done
cargo run -q --bin aware -- config --config deploy/examples/simulator-instability.toml > "$tmp/effective.json"
{ printf '\x02'; cat "$tmp/effective.json"; } > "$C/config_file/effective-json"
python3 -c 'import json, sys, yaml; print(yaml.safe_dump(json.load(open(sys.argv[1])), sort_keys=False))' \
  "$tmp/effective.json" > "$tmp/effective.yaml"
{ printf '\x01'; cat "$tmp/effective.yaml"; } > "$C/config_file/effective-yaml"

# app_file: selector 0 YAML, 1 JSON.
{ printf '\x00'; cat loadgen/examples/apps.yaml; } > "$C/app_file/apps-yaml"
python3 -c 'import json, sys, yaml; print(json.dumps(yaml.safe_load(open(sys.argv[1])), indent=1))' \
  loadgen/examples/apps.yaml > "$tmp/apps.json"
{ printf '\x01'; cat "$tmp/apps.json"; } > "$C/app_file/apps-json"

# checkpoint: selector bit 0 = body gets its checksum appended, bit 1 = meta-learner.
cargo run -q -p aware-shared-model --example checkpoint_seeds "$tmp"
{ printf '\x00'; cat "$tmp/ddpg.ckpt"; } > "$C/checkpoint/ddpg"
{ printf '\x01'; head -c -8 "$tmp/ddpg.ckpt"; } > "$C/checkpoint/ddpg-body"
{ printf '\x02'; cat "$tmp/meta.ckpt"; } > "$C/checkpoint/meta"
{ printf '\x03'; head -c -8 "$tmp/meta.ckpt"; } > "$C/checkpoint/meta-body"

# prometheus_response: two bytes of HTTP status, then the body.
p() { { printf "$1"; printf '%s' "$3"; } > "$C/prometheus_response/$2"; }
p '\x00\xc8' vector '{"status":"success","data":{"resultType":"vector","result":[{"metric":{"namespace":"prod","pod":"web-7d9f-abcde"},"value":[1700000000.123,"0.25"]},{"metric":{},"value":[1700000000,"NaN"]}]}}'
p '\x00\xc8' scalar '{"status":"success","data":{"resultType":"scalar","result":[1700000000.5,"+Inf"]}}'
p '\x00\xc8' empty '{"status":"success","data":{"resultType":"vector","result":[]}}'
p '\x01\x90' error '{"status":"error","errorType":"bad_data","error":"parse error at char 4"}'
p '\x00\xc8' matrix '{"status":"success","data":{"resultType":"matrix","result":[{"metric":{},"values":[[1,"1"]]}]}}'

# model_store_uri: URIs of the target's store (a fixed directory under the temporary directory).
root=$(realpath -m "${TMPDIR:-/tmp}/aware-fuzz-store")
printf 'file://%s/ns/app/base_learner/v%020d.ckpt' "$root" 7 > "$C/model_store_uri/stored"
printf 'file://%s/ns/app/../app/base_learner/v%020d.ckpt' "$root" 7 > "$C/model_store_uri/dotdot"
printf 'nats-object://aware-models/ns/app/base_learner/v%020d.ckpt' 7 > "$C/model_store_uri/nats"
du -sh "$C"
