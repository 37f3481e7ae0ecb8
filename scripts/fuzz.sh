#!/usr/bin/env bash
# Builds the libFuzzer fuzzers (tests/fuzz/*_fuzzer.cc) with clang, AddressSanitizer and
# UndefinedBehaviorSanitizer in build-sanitize/, then runs each for SECONDS (default 60) on a
# copy of its seed corpus (tests/fuzz/corpus/<fuzzer>/) in a temporary folder, so the
# repository is never written to. Fails on any crash, hang (-timeout), memory blow-up,
# leak or sanitizer report; the input that caused it is kept in build-sanitize/fuzz-artifacts/.
# With --with-tests it builds the unit tests in the same tree too (CI then runs them there
# with ctest: one sanitized build serves both). See docs/fuzzing.md.
#
# usage: scripts/fuzz.sh [--with-tests] [SECONDS]     (TESSERA_FIXTURES: the fixtures folder, as for ctest)
set -euo pipefail
tests=OFF
if [[ ${1:-} == --with-tests ]]; then
  tests=ON
  shift
fi
seconds=${1:-60}
cd "$(dirname "$0")/.."
root=$(pwd)
build="$root/build-sanitize"

fuzzers=()
for src in tests/fuzz/*_fuzzer.cc; do
  fuzzers+=("$(basename "$src" .cc)")
done

start=$(date +%s)
# -O1 -g1 (line tables, enough for the sanitizers' reports): on 2 cores -O2 -g took about
# twice as long to compile, and in a one-minute run per fuzzer the build costs more than the
# slower executions. Clang compiles this build in about 0.7x of GCC's time (measured on
# coordinator/api/openai_api.cc: 13.8 s against 18.7 s).
# Linked by lld: it links a sanitized test program in 0.7 s where GNU ld takes 2.3 s.
# -Wno-pass-failed: clang does not vectorize at -O1, and says so for every `#pragma omp simd` loop.
CC=clang CXX=clang++ cmake -S . -B "$build" -DCMAKE_BUILD_TYPE=RelWithDebInfo -DTESSERA_FUZZ=ON \
  -DCMAKE_EXE_LINKER_FLAGS=-fuse-ld=lld \
  -DCMAKE_CXX_FLAGS_RELWITHDEBINFO="-O1 -g1 -DNDEBUG -Wno-pass-failed" -DCMAKE_C_FLAGS_RELWITHDEBINFO="-O1 -g1 -DNDEBUG" \
  -DTESSERA_CUDA=OFF -DTESSERA_BUILD_BENCH=OFF -DTESSERA_BUILD_TESTS="$tests" >/dev/null
if [[ $tests == ON ]]; then
  cmake --build "$build" -j"$(nproc)"
else
  cmake --build "$build" -j"$(nproc)" --target "${fuzzers[@]}"
fi
echo "fuzz: build took $(( $(date +%s) - start )) s"

work=$(mktemp -d "${TMPDIR:-/tmp}/tessera-fuzz.XXXXXX")
trap 'rm -rf "$work"' EXIT
artifacts="$build/fuzz-artifacts"
mkdir -p "$artifacts"

# Leak checking is on: the server and engine the HTTP fuzzer starts once stay reachable
# through a static pointer, so they are not leaks.
export ASAN_OPTIONS=detect_leaks=1:abort_on_error=1:strict_string_checks=1:detect_stack_use_after_return=1
export UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1
export TESSERA_LOG_LEVEL=${TESSERA_LOG_LEVEL:-error}

# One fuzzer: its exit code in $work/<fuzzer>.rc, its log in $work/<fuzzer>.log.
run_fuzzer() {
  local f=$1 corpus="$work/$1" rc=0
  mkdir -p "$corpus"
  cp -r "tests/fuzz/corpus/$f/." "$corpus/"
  echo "fuzz: $f for ${seconds} s ($(ls "$corpus" | wc -l) seed inputs)"
  "$build/bin/$f" -max_total_time="$seconds" -timeout=10 -rss_limit_mb=4096 -print_final_stats=1 \
    -artifact_prefix="$artifacts/$f-" "$corpus" >"$work/$f.log" 2>&1 || rc=$?
  echo "$rc" >"$work/$f.rc"
}

# As many fuzzers at once as there are cores (each is one process on one core), so the
# wall time is SECONDS per round of nproc fuzzers, not per fuzzer.
running=0
for f in "${fuzzers[@]}"; do
  if ((running >= $(nproc))); then
    wait -n || true
    running=$((running - 1))
  fi
  run_fuzzer "$f" &
  running=$((running + 1))
done
wait

failed=()
for f in "${fuzzers[@]}"; do
  log="$work/$f.log"
  rc=$(cat "$work/$f.rc" 2>/dev/null || echo "missing")
  if [[ "$rc" != 0 ]] || grep -qE "ERROR: (AddressSanitizer|LeakSanitizer|UndefinedBehaviorSanitizer|libFuzzer)|runtime error:|invariant failed" "$log"; then
    echo "fuzz: $f FAILED (exit $rc); the end of its log:"
    tail -n 60 "$log"
    ls -1 "$artifacts" | sed "s|^|fuzz: reproducer $artifacts/|" | grep -F "$f-" || true
    failed+=("$f")
    continue
  fi
  # "#123 DONE cov: 456 ft: 789 corp: ..." and the final stats.
  done_line=$(grep -E "^#[0-9]+[[:space:]]+DONE" "$log" | tail -n 1 || true)
  eps=$(sed -n 's/^stat::average_exec_per_sec:[[:space:]]*//p' "$log")
  runs=$(sed -n 's/^stat::number_of_executed_units:[[:space:]]*//p' "$log")
  echo "fuzz: $f ok: ${runs:-?} runs, ${eps:-?} exec/s; ${done_line:-no DONE line}"
done

echo "fuzz: total $(( $(date +%s) - start )) s"
if ((${#failed[@]})); then
  echo "fuzz: FAILED: ${failed[*]}"
  exit 1
fi
