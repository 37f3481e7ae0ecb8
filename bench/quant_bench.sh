#!/usr/bin/env bash
# Reproduces the int8 figures of docs/quantization.md and docs/benchmarks.md: tessera-bench
# decode speed of int8 weights against bf16 on one model, the two interleaved run by run (so a
# load change on a shared machine hits both alike), REPEAT pairs, medians and their ratio.
# Usage: bench/quant_bench.sh MODEL_DIR [BATCH] [GEN_LEN] [REPEAT] [more tessera-bench flags for the int8 runs]
set -euo pipefail
model=$1; batch=${2:-1}; gen=${3:-16}; repeat=${4:-3}; shift $(( $# < 4 ? $# : 4 ))
build=${BUILD:-build}
run() {
  "$build/bin/tessera-bench" --model "$model" --dtype bfloat16 --prompt-len 16 --gen-len "$gen" --batch "$batch" --json "$@"
}
for i in $(seq "$repeat"); do
  echo "bf16 $(run)"
  echo "int8 $(run --quantize int8 "$@")"
done | python3 "$(dirname "$0")/quant_bench_report.py"
