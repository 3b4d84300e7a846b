#!/usr/bin/env bash
# Builds every cargo-fuzz target in fuzz/ and runs each for SECONDS (default 60) from its seed
# corpus fuzz/corpus/<target>/; fails when any target crashes, hangs or breaks its invariant, and
# prints each target's executions and exec/s (libFuzzer's final stats). Long runs and figures:
# docs/benchmarks/fuzz.md.
#
#   bash tests/fuzz.sh [SECONDS] [TARGET...]
#
# Installs cargo-fuzz once into ~/.cache/aware-rs/cargo-fuzz-<version>.
# Builds into $CARGO_TARGET_DIR/fuzz (or fuzz/target); new inputs and crash artifacts go to
# $FUZZ_WORK_DIR (default: a temporary directory, kept when something crashed). Extra libFuzzer
# flags: FUZZ_FLAGS (e.g. FUZZ_FLAGS="-runs=10000000" for a count instead of a time).
set -euo pipefail
cd "$(dirname "$0")/.."

seconds="${1:-60}"
shift || true
CARGO_FUZZ_VERSION=0.13.2

cache="$HOME/.cache/aware-rs/cargo-fuzz-$CARGO_FUZZ_VERSION"
if [ ! -x "$cache/bin/cargo-fuzz" ]; then
  echo "installing cargo-fuzz $CARGO_FUZZ_VERSION into $cache"
  cargo install cargo-fuzz --locked --version "$CARGO_FUZZ_VERSION" --root "$cache" --quiet
fi
export PATH="$cache/bin:$PATH"

# The project's stable toolchain, not a nightly one: dfdx (the model crate's tensor library)
# turns on code of its own that nightly compilers refuse as soon as it sees one. cargo-fuzz's
# unstable compiler flags are allowed on stable with RUSTC_BOOTSTRAP=1. FUZZ_TOOLCHAIN picks
# another toolchain (`+name`).
export RUSTC_BOOTSTRAP=1
fuzz=(cargo ${FUZZ_TOOLCHAIN:+"+$FUZZ_TOOLCHAIN"} fuzz)
toolchain="$(cargo ${FUZZ_TOOLCHAIN:+"+$FUZZ_TOOLCHAIN"} --version), RUSTC_BOOTSTRAP=1"

targets=("$@")
if [ ${#targets[@]} -eq 0 ]; then
  mapfile -t targets < <(cd fuzz/fuzz_targets && ls -- *.rs | sed 's/\.rs$//')
fi

target_dir="${CARGO_TARGET_DIR:-$PWD/target}/fuzz"
work="${FUZZ_WORK_DIR:-$(mktemp -d -t aware-fuzz.XXXXXX)}"
mkdir -p "$work"

# Release with debug assertions and overflow checks. No sanitizer: the workspace forbids unsafe
# code, so a crash is a panic, an abort (stack overflow, out of memory) or a timeout, which
# libFuzzer catches without one, at two to three times the speed.
build=(build --release --debug-assertions --sanitizer none --target-dir "$target_dir")
start=$(date +%s)
echo "fuzz: building the targets ($toolchain)"
"${fuzz[@]}" "${build[@]}"
echo "fuzz: built in $(($(date +%s) - start)) s"

failed=()
printf '%-22s %14s %10s %s\n' target executions exec/s result
for t in "${targets[@]}"; do
  mkdir -p "$work/corpus/$t" "$work/artifacts/$t"
  log="$work/$t.log"
  # The first corpus directory receives new inputs; the committed seeds stay as they are.
  # shellcheck disable=SC2086
  if "${fuzz[@]}" run "${build[@]:1}" "$t" "$work/corpus/$t" "fuzz/corpus/$t" -- \
    -max_total_time="$seconds" -timeout=10 -rss_limit_mb=2048 -print_final_stats=1 \
    -artifact_prefix="$work/artifacts/$t/" ${FUZZ_FLAGS:-} >"$log" 2>&1; then
    result=ok
  else
    result="CRASH (log $log, artifacts $work/artifacts/$t/)"
    failed+=("$t")
  fi
  runs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log" | tail -1)
  rate=$(sed -n 's/^stat::average_exec_per_sec: *//p' "$log" | tail -1)
  printf '%-22s %14s %10s %s\n' "$t" "${runs:-?}" "${rate:-?}" "$result"
done
echo "fuzz: build and runs took $(($(date +%s) - start)) s"

if [ ${#failed[@]} -gt 0 ]; then
  for t in "${failed[@]}"; do
    echo "--- $t (last lines of $work/$t.log)"
    tail -n 40 "$work/$t.log"
  done
  echo "fuzz: failed ${failed[*]}; reproduce with"
  echo "  RUSTC_BOOTSTRAP=1 cargo fuzz run --release --debug-assertions --sanitizer none <target> <artifact>"
fi
[ ${#failed[@]} -gt 0 ] || [ -n "${FUZZ_WORK_DIR:-}" ] || rm -rf "$work"
echo "fuzz: $((${#targets[@]} - ${#failed[@]})) passed, ${#failed[@]} failed"
[ ${#failed[@]} -eq 0 ]
