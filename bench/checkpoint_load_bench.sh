#!/usr/bin/env bash
# Load time and peak RSS of the same model as safetensors and as PyTorch .bin shards (the
# figures of docs/checkpoints.md and docs/benchmarks.md, issue 18). Generates a ~440 MB f32
# Llama once in each format with tessera-make-checkpoint (100 MB shards), then runs
# `tessera-generate --max-new-tokens 1` on each, round-robin, `rounds` times, at TP 1 and 2,
# under /usr/bin/time: wall seconds (start-up + load + one prefill and one decode step) and
# maximum RSS. At TP 2 the RSS GNU time reports is the largest of tessera-generate and its
# worker processes (the kernel folds waited-for children into ru_maxrss), i.e. the largest
# rank. Usage: bench/checkpoint_load_bench.sh [BUILD_DIR] [ROUNDS]
set -euo pipefail
build=${1:-build}
rounds=${2:-3}
shape=(--arch llama --hidden 1024 --layers 4 --heads 16 --kv-heads 4 --ffn 2816 --vocab 32000 --dtype float32 --seed 1 --shard-mb 100)
for fmt in safetensors bin; do
  dir=/tmp/tessera-load-$fmt
  [ -f "$dir/config.json" ] || "$build/bin/tessera-make-checkpoint" "${shape[@]}" --format "$fmt" --out "$dir"
done
size=$(du -sb /tmp/tessera-load-bin --exclude=config.json | cut -f1)
results=$(mktemp)
for _ in $(seq "$rounds"); do
  for tp in 1 2; do
    for fmt in safetensors bin; do
      /usr/bin/time -f "$fmt $tp %e %M" -a -o "$results" "$build/bin/tessera-generate" --model /tmp/tessera-load-$fmt \
        --prompt-ids 1,2,3,4 --max-new-tokens 1 --dtype float32 --tensor-parallel "$tp" >/dev/null
    done
  done
done
python3 - "$results" "$size" <<'PY'
import statistics, sys
rows = [l.split() for l in open(sys.argv[1]) if l.strip()]
size = int(sys.argv[2])
print(f"model: {size/1e6:.0f} MB of .bin shards")
print("| format | TP | wall s (median) | peak RSS MB (max rank, median) | RSS / file | wall vs safetensors |")
print("| --- | --- | --- | --- | --- | --- |")
med = {}
for fmt in ("safetensors", "bin"):
    for tp in ("1", "2"):
        sel = [r for r in rows if r[0] == fmt and r[1] == tp]
        med[fmt, tp] = (statistics.median(float(r[2]) for r in sel), statistics.median(int(r[3]) * 1024 for r in sel))
for tp in ("1", "2"):
    for fmt in ("safetensors", "bin"):
        w, rss = med[fmt, tp]
        print(f"| {fmt} | {tp} | {w:.2f} | {rss/1e6:.0f} | {rss/size:.2f} | {w/med['safetensors', tp][0]:.2f} |")
PY
rm -f "$results"
