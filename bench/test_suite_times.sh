#!/usr/bin/env bash
# What the test suite costs (docs/benchmarks.md, "Test suite"): how long each GoogleTest
# program takes to start and list no test (ctest runs every test in a process of its own, so
# this is paid once per test), then the whole suite through ctest, two tests at a time as the
# README and .ci/run run it, with its wall time and the N slowest tests.
#   bench/test_suite_times.sh [BUILD_DIR] [N]     (defaults: build, 10)
# BUILD_DIR: a configured and built tree (the README's build, or CI's build-sanitize). CTEST_ARGS
# replaces the default "-j2" (e.g. "-j1" for one at a time, "-j2 -R Serve"); LOG (default
# BUILD_DIR/test-suite-times.log) keeps ctest's output.
set -euo pipefail
# shellcheck source=bench/lib.sh
source "$(dirname "$0")/lib.sh"
build=${1:-build}
slowest=${2:-10}
log=${LOG:-$build/test-suite-times.log}
[[ -f $build/CTestTestfile.cmake ]] || die "no ctest tree at $build (configure and build it first, as the README says)"
[[ $slowest =~ ^[0-9]+$ ]] || die "N must be a number of tests, got '$slowest'"
read -r -a ctest_args <<<"${CTEST_ARGS:--j2}"

echo "# $(date -u '+%Y-%m-%d %H:%M UTC'), $(uname -n), $(nproc) cores, $build"
echo "# start-up of each test program (seconds to list no test, best of 3)"
for program in "$build"/bin/tessera_*_tests; do
  [[ -x $program ]] || continue
  best=""
  for _ in 1 2 3; do
    start=$(date +%s.%N)
    "$program" --gtest_filter=NoSuchTest >/dev/null
    took=$(echo "$(date +%s.%N) - $start" | bc)
    if [[ -z $best ]] || (($(echo "$took < $best" | bc))); then best=$took; fi
  done
  printf '%-28s %6.3f\n' "$(basename "$program")" "$best"
done

echo "# ctest --test-dir $build ${ctest_args[*]} (log: $log)"
start=$(date +%s)
status=0
ctest --test-dir "$build" --output-on-failure "${ctest_args[@]}" >"$log" 2>&1 || status=$?
echo "wall: $(($(date +%s) - start)) s; $(grep -E 'tests passed|tests failed' "$log" | tail -n 1)"
echo "# the $slowest slowest tests (seconds)"
sed -nE 's/^ *[0-9]+\/[0-9]+ Test +#[0-9]+: ([^ ]+) .* (Passed|Failed|\*\*\*Failed|Skipped) +([0-9.]+) sec$/\3 \1/p' "$log" |
  sort -rn | sed -n "1,${slowest}p"  # sed reads all: head would end sort with SIGPIPE under pipefail
exit "$status"
