#!/bin/sh
# Builds the libFuzzer targets with clang in a build dir of their own and
# runs each for a bounded time.
#
#   tests/fuzz/run.sh [SECONDS] [TARGET...]     (default: 60 s, every target)
#
# First every committed input of tests/fuzz/corpus/<target>/ is replayed
# (seeds, and crash-* files kept as regression inputs), then the target is
# fuzzed with that corpus as its seed.  New inputs and crash artifacts go to
# the build dir ($FUZZ_BUILD, default build-fuzz/, ignored by git): copy an
# interesting one into the corpus by hand.  FUZZ_RPC_STRICT=1 makes the
# findings fuzz_rpc knows of fatal (see tests/fuzz/rpc_harness.lua).
# Ends with "N passed, N failed" (one per target).
set -u
cd "$(dirname "$0")/../.."
ROOT=$(pwd)
SECS=${1:-${FUZZ_SECONDS:-60}}
[ $# -gt 0 ] && shift
BUILD=${FUZZ_BUILD:-$ROOT/build-fuzz}
TARGETS=${*:-$(for f in tests/fuzz/fuzz_*.c; do basename "$f" .c; done)}

CC=${CC:-clang}
if ! command -v "$CC" >/dev/null; then
  echo "fuzz: $CC not found (apt-get install clang libclang-rt-14-dev)"
  exit 1
fi
cmake -S "$ROOT" -B "$BUILD" -DTUPPER_FUZZ=ON -DCMAKE_C_COMPILER="$CC" \
  -DCMAKE_BUILD_TYPE=RelWithDebInfo >"$BUILD.cmake.log" 2>&1 || { cat "$BUILD.cmake.log"; exit 1; }
rm -f "$BUILD.cmake.log"
# shellcheck disable=SC2086
cmake --build "$BUILD" -j"$(nproc)" --target $TARGETS || exit 1

export TUPPER_ROOT="$ROOT"
export ASAN_OPTIONS=${ASAN_OPTIONS:-abort_on_error=1:detect_leaks=1}
export UBSAN_OPTIONS=${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1}

target_opts() {
  case $1 in
    fuzz_frame) echo "-max_len=65536" ;; # room for the 4160-field limit
    fuzz_sframe) echo "-max_len=70000" ;; # several frames and a long ERROR
    # the Lua state keeps its heap from one input to the next (the GC frees
    # it later): libFuzzer's per-input leak check would take that for a leak
    # and rescan the heap after every mutation, at a tenth of the speed
    fuzz_rpc) echo "-max_len=8192 -detect_leaks=0" ;;
    fuzz_net) echo "-max_len=4096 -detect_leaks=0" ;; # a Lua state too
    # each input is unpacked to disk: slower, and 64 KiB holds a few entries
    fuzz_layer) echo "-max_len=65536" ;;
    *) echo "-max_len=8192" ;;
  esac
}

passed=0
failed=0
for t in $TARGETS; do
  bin="$BUILD/fuzz/$t"
  seeds="$ROOT/tests/fuzz/corpus/$t"
  work="$BUILD/corpus/$t"
  art="$BUILD/artifacts/$t"
  mkdir -p "$work" "$art" "$seeds"
  dict=""
  [ -f "tests/fuzz/${t#fuzz_}.dict" ] && dict="-dict=tests/fuzz/${t#fuzz_}.dict"
  echo "=== $t: replaying $(ls "$seeds" | wc -l) committed inputs"
  ok=1
  for f in "$seeds"/*; do
    [ -f "$f" ] || continue
    if ! "$bin" "$f" >"$art/replay.log" 2>&1; then
      echo "$t: $(basename "$f") fails:"
      tail -n 30 "$art/replay.log"
      ok=0
    fi
  done
  echo "=== $t: fuzzing for $SECS s"
  # shellcheck disable=SC2086
  if ! "$bin" -max_total_time="$SECS" $(target_opts "$t") -timeout=10 -rss_limit_mb=2048 \
      -print_final_stats=1 -artifact_prefix="$art/" $dict "$work" "$seeds" >"$art/fuzz.log" 2>&1; then
    ok=0
    echo "$t: the fuzzer stopped on a finding (artifacts in $art):"
    grep -E '^(==|SUMMARY|fuzz_|.*runtime error)' "$art/fuzz.log" | head -n 20
    tail -n 40 "$art/fuzz.log"
  fi
  grep -E '^(stat::number_of_executed_units|stat::new_units_added|#[0-9]+.*DONE)|known finding' \
    "$art/fuzz.log" | sed "/^$t: /!s/^/$t: /"
  if [ "$ok" = 1 ]; then passed=$((passed + 1)); else failed=$((failed + 1)); fi
done
echo "fuzz: $passed passed, $failed failed"
[ "$failed" -eq 0 ]
