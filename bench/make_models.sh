#!/usr/bin/env bash
# Makes the generated checkpoints the figures in docs/ are measured on (random weights, no
# tokenizer), each only when missing:
#   tessera-llama-100m       ~100M-parameter Llama (hidden 768, 12 layers, 12 / 4 KV heads,
#                            FFN 2048, vocab 32000; 124.7M parameters), float32
#   tessera-llama-100m-bf16  the same shape in bfloat16
#   tessera-llama-1b-bf16    ~1.1B Llama in TinyLlama's shape (hidden 2048, 22 layers, 32 / 4 KV
#                            heads, FFN 5632, vocab 32000), bfloat16 (2.2 GB)
# Usage: bench/make_models.sh [OUT_DIR (default /tmp)] [100m|100m-bf16|1b-bf16|all (default all)]
# Environment: BUILD (default build).
set -euo pipefail
# shellcheck source=bench/lib.sh
source "$(dirname "$0")/lib.sh"
out=${1:-/tmp}
which=${2:-all}
build=${BUILD:-build}
need_bin "$build/bin" "$BUILD_HINT" tessera-make-checkpoint
case $which in 100m | 100m-bf16 | 1b-bf16 | all) ;; *) die "unknown model '$which' (100m, 100m-bf16, 1b-bf16 or all)" ;; esac
mkdir -p "$out"
make_one() {  # NAME FLAGS...
  local dir=$out/$1
  shift
  if [[ -f $dir/config.json ]]; then echo "$dir: present"; return 0; fi
  "$build/bin/tessera-make-checkpoint" --arch llama --preset 100m --out "$dir" "$@"
  echo "$dir: made"
}
if [[ $which == all || $which == 100m ]]; then make_one tessera-llama-100m; fi
if [[ $which == all || $which == 100m-bf16 ]]; then make_one tessera-llama-100m-bf16 --dtype bfloat16; fi
if [[ $which == all || $which == 1b-bf16 ]]; then
  make_one tessera-llama-1b-bf16 --hidden 2048 --layers 22 --heads 32 --kv-heads 4 --ffn 5632 --vocab 32000 \
    --max-positions 2048 --dtype bfloat16
fi
