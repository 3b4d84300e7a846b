#!/usr/bin/env bash
# The crate map's two import rules, checked on the resolved dependency graph
# (`cargo metadata --locked`):
#
# 1. The simulator (`aware-loadgen`) is research and test equipment: no workspace crate reaches it
#    through its normal dependencies (dev-dependencies are fine) except the metrics collector,
#    whose simulator source must be an optional dependency (cargo feature `simulator`), the CLI
#    (`aware sim`, `aware demo`, `aware bench`) and its harness (`aware-harness`: the demo's paced
#    services, meta-training), the benchmarks and the tests.
# 2. Only the model crate (`aware-shared-model`) depends on the tensor library (`dfdx`), in any
#    kind of dependency; everything else uses the model crate's types.
#
# Exits 1 naming every crate that breaks a rule.
set -euo pipefail
cd "$(dirname "$0")/.."

meta="$(mktemp)"
trap 'rm -f "$meta"' EXIT
cargo metadata --format-version 1 --locked >"$meta"
python3 - "$meta" <<'PY'
import json
import sys

SIMULATOR = "aware-loadgen"
SIMULATOR_USERS = {
    "aware-metrics-collector", "aware-cli", "aware-harness", "aware-tests", "aware-bench", "aware-fuzz",
}
OPTIONAL_USERS = {"aware-metrics-collector"}
TENSOR = "dfdx"
TENSOR_USERS = {"aware-shared-model"}

with open(sys.argv[1]) as f:
    meta = json.load(f)
packages = {p["id"]: p for p in meta["packages"]}
members = set(meta["workspace_members"])
name = lambda pid: packages[pid]["name"]

# Normal dependencies of every package in the resolved graph.
normal = {}
for node in meta["resolve"]["nodes"]:
    normal[node["id"]] = [
        d["pkg"] for d in node["deps"]
        if any(k["kind"] is None for k in d["dep_kinds"])
    ]

def path_to(start, goal):
    """The shortest chain of normal dependencies from start to a package named goal."""
    seen, queue = {start}, [[start]]
    while queue:
        chain = queue.pop(0)
        for dep in normal.get(chain[-1], []):
            if dep in seen:
                continue
            if name(dep) == goal:
                return chain + [dep]
            seen.add(dep)
            queue.append(chain + [dep])
    return None

errors = []
for pid in sorted(members, key=name):
    pkg = packages[pid]
    n = pkg["name"]
    if n == SIMULATOR:
        continue
    if pkg["name"] not in SIMULATOR_USERS:
        chain = path_to(pid, SIMULATOR)
        if chain:
            errors.append(
                f"{n} depends on the simulator ({SIMULATOR}): "
                + " -> ".join(name(p) for p in chain)
                + "; only the collector (feature `simulator`), the CLI, benchmarks and tests may"
            )
    if pkg["name"] in OPTIONAL_USERS:
        for d in pkg["dependencies"]:
            if d["name"] == SIMULATOR and d["kind"] is None and not d["optional"]:
                errors.append(
                    f"{n} depends on the simulator ({SIMULATOR}) unconditionally; "
                    "it must be optional, behind the `simulator` feature"
                )

for pkg in sorted(packages.values(), key=lambda p: p["name"]):
    p_name = pkg["name"]
    if p_name in TENSOR_USERS:
        continue
    for d in pkg["dependencies"]:
        if d["name"] == TENSOR:
            kind = d["kind"] or "normal"
            errors.append(
                f"{p_name} depends on the tensor library ({TENSOR}, {kind} dependency); "
                "only aware-shared-model may"
            )

if errors:
    for e in errors:
        print(f"check-deps: {e}", file=sys.stderr)
    sys.exit(1)
print(f"check-deps: {len(members)} workspace crates follow the import rules")
PY
