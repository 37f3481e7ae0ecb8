#!/usr/bin/env bash
# Reproduces the per-family decode figures in docs/benchmarks.md: generates ~100M-parameter
# checkpoints of Llama and three other rows of the architecture table (once), shaped so that
# one decode step streams about the same weight bytes (Falcon's dense MLP gets 1.5x the
# width of the gated ones), then runs tessera-bench on each, round-robin, `rounds` times,
# and prints one markdown row per family with the median and the ratio to Llama measured in
# the same run. Usage: bench/families_bench.sh [BUILD_DIR] [DTYPE] [ROUNDS]
set -euo pipefail
build=${1:-build}
dtype=${2:-bfloat16}
rounds=${3:-3}
families="llama qwen2 gemma2 falcon"
for f in $families; do
  dir=/tmp/tessera-$f-100m
  extra=(); [ "$f" = falcon ] && extra=(--ffn 3072)
  [ -f "$dir/config.json" ] || "$build/bin/tessera-make-checkpoint" --arch "$f" --preset 100m --out "$dir" "${extra[@]}"
done
results=$(mktemp)
for _ in $(seq "$rounds"); do
  for f in $families; do
    "$build/bin/tessera-bench" --model "/tmp/tessera-$f-100m" --dtype "$dtype" --prompt-len 64 --gen-len 32 --batch 1 \
      --json | python3 -c "import json,sys; r=json.load(sys.stdin); print('$f', r['decode_tok_s'], r['roofline_fraction'], r['weight_bytes'], r['prefill_tok_s'])" >>"$results"
  done
done
python3 - "$results" "$families" "$dtype" <<'PY'
import statistics, sys
rows = [l.split() for l in open(sys.argv[1])]
fams = sys.argv[2].split()
med = {f: [statistics.median(float(r[i]) for r in rows if r[0] == f) for i in (1, 2, 3, 4)] for f in fams}
print(f"| family ({sys.argv[3]}, batch 1) | weights/step (MB) | prefill tok/s | decode tok/s | roofline | decode vs llama | roofline vs llama |")
print("| --- | --- | --- | --- | --- | --- | --- |")
for f in fams:
    d, roof, wb, pf = med[f]
    print(f"| {f} | {wb/1e6:.0f} | {pf:.0f} | {d:.1f} | {roof:.2f} | {d/med['llama'][0]:.2f} | {roof/med['llama'][1]:.2f} |")
PY
rm -f "$results"
