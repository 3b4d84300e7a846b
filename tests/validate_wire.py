"""Reads AWARE bus messages the way a tool in another language would, without any of our code:
MessagePack (the `msgpack` package) checked against the published JSON Schemas
(`bus-schemas/schemas/<kind>.schema.json`, with `jsonschema`).

    python validate_wire.py SCHEMAS_DIR FILE.msgpack...

A file's name starts with the event kind its subject carries (`obs-12.msgpack`); the message's
own `schema` field must name that kind. Prints one line per file and a summary; exits 1 if any
message fails (or none was given), 2 on bad usage.
"""

import json
import os
import sys

import jsonschema
import msgpack


def check(schemas_dir, path, validators):
    kind = os.path.basename(path).split("-", 1)[0].split(".", 1)[0]
    with open(path, "rb") as f:
        raw = f.read()
    try:
        msg = msgpack.unpackb(raw, raw=False, strict_map_key=True)
    except Exception as e:  # any decoding failure is a finding
        return [f"not MessagePack: {e}"], kind
    if not isinstance(msg, dict):
        return [f"not a map but {type(msg).__name__}"], kind
    schema_field = msg.get("schema")
    if not isinstance(schema_field, str) or schema_field.split("/", 1)[0] != kind:
        return [f"`schema` is {schema_field!r}, the subject says {kind}"], kind
    if kind not in validators:
        schema_path = os.path.join(schemas_dir, f"{kind}.schema.json")
        with open(schema_path) as f:
            schema = json.load(f)
        cls = jsonschema.validators.validator_for(schema)
        cls.check_schema(schema)
        validators[kind] = cls(schema)
    errors = sorted(validators[kind].iter_errors(msg), key=lambda e: list(e.absolute_path))
    return [f"{'/'.join(map(str, e.absolute_path)) or '(root)'}: {e.message}" for e in errors], kind


def main(argv):
    if len(argv) < 2:
        print(__doc__, file=sys.stderr)
        return 2
    schemas_dir, files = argv[0], argv[1:]
    validators, kinds, failed = {}, {}, 0
    for path in files:
        errors, kind = check(schemas_dir, path, validators)
        if errors:
            failed += 1
            print(f"FAIL {path}")
            for e in errors:
                print(f"  {e}")
        else:
            kinds[kind] = kinds.get(kind, 0) + 1
    summary = ", ".join(f"{k} {n}" for k, n in sorted(kinds.items()))
    print(f"valid: {summary}; failed: {failed}")
    return 1 if failed or not kinds else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
