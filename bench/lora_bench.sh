#!/usr/bin/env bash
# LoRA adapters against the base alone (docs/benchmarks.md, "LoRA adapters"): tessera-bench on
# the serving path (--engine), bf16, decode tok/s of
#   batch32  32 sequences of 8 random rank-R adapters taken in turn (every sequence adapted;
#            neighbours use different adapters), against the same 32 with the base alone
#   batch1   one sequence with one adapter, against it alone
# each case's base and adapted runs back to back in every round, so that a change of load on a
# shared machine hits both alike. Prints each round's tok/s and ratio, then each case's median.
# The adapters (tessera-make-checkpoint --lora-of, every linear layer) are made once in $WORK.
# Usage: bench/lora_bench.sh [MODEL (default /tmp/tessera-llama-100m-bf16, made when missing)] [ROUNDS (3)]
# Environment: BUILD (build), WORK (/tmp/tessera-lora-bench), THREADS (2), RANK (16), ADAPTERS (8),
#   GEN_LEN (64), PROMPT_LEN (64).
set -euo pipefail
# shellcheck source=bench/lib.sh
source "$(dirname "$0")/lib.sh"
model=${1:-/tmp/tessera-llama-100m-bf16}
rounds=${2:-3}
build=${BUILD:-build}
work=${WORK:-/tmp/tessera-lora-bench}
threads=${THREADS:-2}
rank=${RANK:-16}
count=${ADAPTERS:-8}
gen=${GEN_LEN:-64}
prompt=${PROMPT_LEN:-64}
need_whole_numbers "ROUNDS, THREADS, RANK, ADAPTERS, GEN_LEN, PROMPT_LEN" "$rounds" "$threads" "$rank" "$count" "$gen" "$prompt"
need_bin "$build/bin" "$BUILD_HINT" tessera-bench tessera-make-checkpoint
need_model_or_make_default "$model" "$build"
mkdir -p "$work"

# The adapters, made once per model, rank and number.
adapters=()
for i in $(seq "$count"); do
  dir=$work/$(basename "$model")-r$rank-$i
  [[ -f $dir/adapter_config.json ]] || "$build/bin/tessera-make-checkpoint" --lora-of "$model" --out "$dir" \
    --lora-rank "$rank" --seed "$i" 2>/dev/null
  adapters+=(--lora "a$i=$dir")
done

results=$(mktemp)
trap 'rm -f "$results"' EXIT
bench() {  # CASE KIND BATCH [flags]: one tessera-bench run, appended to $results as "CASE KIND JSON"
  local case=$1 kind=$2 batch=$3 out
  shift 3
  out=$("$build/bin/tessera-bench" --model "$model" --dtype bfloat16 --threads "$threads" --batch "$batch" \
    --prompt-len "$prompt" --gen-len "$gen" --engine --json "$@") || die "tessera-bench failed ($case, $kind)"
  echo "$case $kind $out" >>"$results"
}
echo "# $(date -u '+%Y-%m-%d %H:%M UTC'), $(uname -n); $(basename "$model"), bf16, $threads threads, rank $rank," \
  "$gen generated tokens after $prompt prompt tokens"
for _ in $(seq "$rounds"); do
  bench batch32 base 32
  bench batch32 lora 32 "${adapters[@]}"
  bench batch1 base 1
  bench batch1 lora 1 "${adapters[@]:0:2}"
done
python3 - "$results" <<'PY'
import json, statistics, sys
runs = {}
for line in open(sys.argv[1]):
    case, kind, text = line.split(" ", 2)
    runs.setdefault(case, {"base": [], "lora": []})[kind].append(json.loads(text))
print("| case | round | base decode tok/s | with adapters | **ratio** |")
print("| --- | --- | --- | --- | --- |")
for case, r in runs.items():
    ratios = []
    for i, (b, l) in enumerate(zip(r["base"], r["lora"]), 1):
        ratios.append(l["decode_tok_s"] / b["decode_tok_s"])
        print(f"| {case} ({l['lora_adapters']} adapters) | {i} | {b['decode_tok_s']:.1f} | {l['decode_tok_s']:.1f} "
              f"| **{ratios[-1]:.2f}** |")
    print(f"{case}: median {statistics.median(ratios):.2f}x the base alone")
PY
