#!/usr/bin/env bash
# int8 weights against bf16 on one model (docs/quantization.md, "Speed"): tessera-bench with
# --dtype bfloat16, once as is and once with --quantize int8, the two back to back in each
# round so that a change of load on a shared machine hits both alike. Prints each round's
# decode and prefill tok/s and their int8 / bf16 ratios, then the medians, and the ratio the
# weight bytes alone allow (bf16 bytes per decode step / int8 bytes).
# Usage: bench/int8_vs_bf16.sh MODEL_DIR [BATCH] [GEN_LEN] [ROUNDS] [-- more tessera-bench flags for the int8 runs]
#   defaults: batch 1, 48 generated tokens, 3 rounds; e.g. -- --quantize-rule lm_head=int8
# Environment: BUILD (default build), PROMPT_LEN (default 64), THREADS (default 2).
set -euo pipefail
# shellcheck source=bench/lib.sh
source "$(dirname "$0")/lib.sh"
positional=()
while (($#)) && [[ $1 != -- ]]; do positional+=("$1"); shift; done
(($#)) && shift  # the "--"
((${#positional[@]} >= 1)) || die "usage: $0 MODEL_DIR [BATCH] [GEN_LEN] [ROUNDS] [-- int8 flags]"
model=${positional[0]}
batch=${positional[1]:-1}
gen=${positional[2]:-48}
rounds=${positional[3]:-3}
build=${BUILD:-build}
need_whole_numbers "BATCH, GEN_LEN, ROUNDS, PROMPT_LEN, THREADS" "$batch" "$gen" "$rounds" "${PROMPT_LEN:-64}" "${THREADS:-2}"
need_bin "$build/bin" "$BUILD_HINT" tessera-bench
need_model "$model"
results=$(mktemp)
trap 'rm -f "$results"' EXIT
run() {  # KIND [flags]: one tessera-bench run, appended to $results as "KIND JSON"
  local kind=$1 out
  shift
  out=$("$build/bin/tessera-bench" --model "$model" --dtype bfloat16 --prompt-len "${PROMPT_LEN:-64}" \
    --gen-len "$gen" --batch "$batch" --threads "${THREADS:-2}" --json "$@") || die "tessera-bench failed ($kind run)"
  echo "$kind $out" >>"$results"
}
echo "# $(date -u '+%Y-%m-%d %H:%M UTC'), $(uname -n); $model, batch $batch, prompt ${PROMPT_LEN:-64}, $gen generated, ${THREADS:-2} threads; int8 flags: ${*:-none}"
for _ in $(seq "$rounds"); do
  run bf16
  run int8 --quantize int8 "$@"
done
python3 - "$results" <<'PY'
import json, statistics, sys
rounds, pending = [], None
for line in open(sys.argv[1]):
    kind, text = line.split(" ", 1)
    r = json.loads(text)
    if kind == "bf16":
        pending = r
    else:
        rounds.append((pending, r))
print("| round | bf16 decode tok/s | int8 decode tok/s | **int8 / bf16** | prefill int8 / bf16 | int8 roofline |")
print("| --- | --- | --- | --- | --- | --- |")
ratios, pre = [], []
for i, (b, q) in enumerate(rounds, 1):
    ratios.append(q["decode_tok_s"] / b["decode_tok_s"])
    pre.append(q["prefill_tok_s"] / b["prefill_tok_s"])
    print(f"| {i} | {b['decode_tok_s']:.1f} | {q['decode_tok_s']:.1f} | **{ratios[-1]:.2f}** | {pre[-1]:.2f} "
          f"| {q['roofline_fraction']:.2f} |")
b, q = rounds[0]
print(f"median int8 / bf16: decode {statistics.median(ratios):.2f}x, prefill {statistics.median(pre):.2f}x; "
      f"weights per decode step {b['weight_bytes'] / 1e6:.1f} MB bf16, {q['weight_bytes'] / 1e6:.1f} MB int8 "
      f"(bytes allow {b['weight_bytes'] / q['weight_bytes']:.2f}x)")
PY
