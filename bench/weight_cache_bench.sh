#!/usr/bin/env bash
# Start-up with streamed weights (docs/benchmarks.md, "Start-up from a weight cache file"): the
# wall time of one tessera-generate run that loads MODEL in bfloat16 with --weights-budget
# BUDGET and generates 8 tokens from a 16-token prompt, six ways back to back in each round
# (so a change of load on a shared machine hits them alike):
#   resident         every weight resident (--weights-budget all), for reference
#   spill            streamed from an unnamed spill file in a named spill folder, written at
#                    every start
#   from-checkpoint  the default (read, no folder named): the layers stored as the kernels
#                    read them are read from the checkpoint itself each step, nothing written
#   cache-write      the first start with --weights-cache-dir (an empty folder): writes the file
#   cache-read       the next start: reads the streamed layers back from it
#   mapped           --weights-streaming map with no folder named: those layers mapped from
#                    the checkpoint, nothing written
# The checkpoint is read once before the rounds (reread_model_files), so every start finds it
# in the page cache.
# Prints each round and the medians, with each way's time over the spill start's.
# Usage: bench/weight_cache_bench.sh MODEL_DIR [BUDGET] [ROUNDS]   (defaults 25%, 3)
# Environment: BUILD (default build), THREADS (default 2), CACHE_PARENT (where the cache
#   folders go; default $TMPDIR, else /var/tmp: a disk, as a cache folder should be).
set -euo pipefail
# shellcheck source=bench/lib.sh
source "$(dirname "$0")/lib.sh"
(($# >= 1)) || die "usage: $0 MODEL_DIR [BUDGET] [ROUNDS]"
model=$1
budget=${2:-25%}
rounds=${3:-3}
build=${BUILD:-build}
need_whole_numbers "ROUNDS, THREADS" "$rounds" "${THREADS:-2}"
need_bin "$build/bin" "$BUILD_HINT" tessera-generate
need_model "$model"
parent=${CACHE_PARENT:-${TMPDIR:-/var/tmp}}
work=$(mktemp -d "$parent/tessera-cache-bench.XXXXXX")
trap 'rm -rf "$work"' EXIT

reread_model_files "$model"  # into the page cache for every way alike
prompt=$(seq -s, 11 26)
run() {  # NAME BUDGET [FLAGS...]: one start, its wall seconds appended to $work/times
  local name=$1 b=$2 start end
  shift 2
  start=$(date +%s.%N)
  "$build/bin/tessera-generate" --model "$model" --dtype bfloat16 --threads "${THREADS:-2}" --prompt-ids "$prompt" \
    --max-new-tokens 8 --weights-budget "$b" "$@" >/dev/null 2>"$work/err" ||
    die "tessera-generate failed ($name): $(tail -n 3 "$work/err")"
  end=$(date +%s.%N)
  echo "$name $(python3 -c "print($end - $start)")" >>"$work/times"
}
echo "# $(date -u '+%Y-%m-%d %H:%M UTC'), $(uname -n); $model, bf16, budget $budget, ${THREADS:-2} threads, cache folders under $parent"
for round in $(seq "$rounds"); do
  run resident all
  run spill "$budget" --weights-spill-dir "$parent"
  run from-checkpoint "$budget"
  run cache-write "$budget" --weights-cache-dir "$work/cache-$round"
  run cache-read "$budget" --weights-cache-dir "$work/cache-$round"
  run mapped "$budget" --weights-streaming map
  rm -rf "$work/cache-$round"
done
python3 - "$work/times" "$rounds" <<'PY'
import statistics, sys
times = {}
for line in open(sys.argv[1]):
    name, seconds = line.split()
    times.setdefault(name, []).append(float(seconds))
ways = ["resident", "spill", "from-checkpoint", "cache-write", "cache-read", "mapped"]
print("| round | " + " | ".join(f"{w} s" for w in ways) + " |")
print("| --- " * (len(ways) + 1) + "|")
for r in range(int(sys.argv[2])):
    print(f"| {r + 1} | " + " | ".join(f"{times[w][r]:.2f}" for w in ways) + " |")
spill = statistics.median(times["spill"])
print()
print("| start-up | median s | over the spill start |")
print("| --- | --- | --- |")
for w in ways:
    m = statistics.median(times[w])
    print(f"| {w} | {m:.2f} | **{m / spill:.2f}** |")
PY
