#!/usr/bin/env bash
# Reproduces the engine figures in docs/benchmarks.md: generates the ~100M-parameter
# Llama-shaped checkpoint (once) and runs tessera-bench for each dtype, fused and plain,
# printing one markdown row per run. Usage: bench/engine_bench.sh [BUILD_DIR] [MODEL_DIR]
set -euo pipefail
build=${1:-build}
model=${2:-/tmp/tessera-llama-100m}
[ -f "$model/config.json" ] || "$build/bin/tessera-make-checkpoint" --arch llama --preset 100m --out "$model"
echo "| dtype | path | prefill tok/s | decode tok/s | weights/step (MB) | copy GB/s | roofline | peak RSS (MB) |"
echo "| --- | --- | --- | --- | --- | --- | --- | --- |"
for dtype in float32 bfloat16 float16; do
  for path in fused plain; do
    flag=""; [ "$path" = plain ] && flag="--no-kernel-inject"
    "$build/bin/tessera-bench" --model "$model" --dtype "$dtype" --prompt-len 64 --gen-len 32 --batch 1 --json $flag |
      python3 -c "import json,sys; r=json.load(sys.stdin); print(f\"| $dtype | $path | {r['prefill_tok_s']:.0f} | {r['decode_tok_s']:.1f} | {r['weight_bytes']/1e6:.0f} | {r['bandwidth_gb_s']:.1f} | {r['roofline_fraction']:.2f} | {r['peak_rss_bytes']/1e6:.0f} |\")"
  done
done
