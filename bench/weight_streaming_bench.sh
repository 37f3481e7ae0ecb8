#!/usr/bin/env bash
# Weights streamed from a spill file against every weight resident (docs/benchmarks.md,
# "Weights beyond a memory budget"): tessera-bench with --dtype bfloat16, once with every
# weight resident and once with --weights-budget BUDGET, back to back in each round so that a
# change of load on a shared machine hits both alike, at each batch size. Prints per round
# decode and prefill tok/s and the streamed / resident ratios, then the medians, the bytes a
# step streams and the most the streamed run held resident (its own accounting).
# Usage: bench/weight_streaming_bench.sh MODEL_DIR [BUDGET] [ROUNDS] [BATCH...]
#   defaults: budget 25%, 3 rounds, batches 1 and 32.
# Environment: BUILD (default build), PROMPT_LEN (default 64), GEN_LEN (default 32),
#   THREADS (default 2), SPILL_DIR (default: none named: with map, units stored as the
#   kernels read them are mapped from the checkpoint, the rest go to a spill file in $TMPDIR or
#   /var/tmp), STREAMING (default read: --weights-streaming, map, read or direct),
#   COMPARE_SPILL_DIR (default none: when set, each round also runs the budget with
#   --weights-spill-dir COMPARE_SPILL_DIR, every streamed unit from a spill file there, and
#   reports it beside the first streamed run).
set -euo pipefail
# shellcheck source=bench/lib.sh
source "$(dirname "$0")/lib.sh"
(($# >= 1)) || die "usage: $0 MODEL_DIR [BUDGET] [ROUNDS] [BATCH...]"
model=$1
budget=${2:-25%}
rounds=${3:-3}
shift $(($# < 3 ? $# : 3))
batches=("$@")
((${#batches[@]})) || batches=(1 32)
build=${BUILD:-build}
need_whole_numbers "ROUNDS, BATCH, PROMPT_LEN, GEN_LEN, THREADS" "$rounds" "${PROMPT_LEN:-64}" "${GEN_LEN:-32}" "${THREADS:-2}" "${batches[@]}"
need_bin "$build/bin" "$BUILD_HINT" tessera-bench
need_model "$model"
results=$(mktemp)
trap 'rm -f "$results"' EXIT
spill=(--weights-streaming "${STREAMING:-read}")
[[ -n ${SPILL_DIR:-} ]] && spill+=(--weights-spill-dir "$SPILL_DIR")
run() {  # BATCH KIND BUDGET [FLAG...]: one tessera-bench run, appended to $results as "BATCH KIND JSON"
  local out
  out=$("$build/bin/tessera-bench" --model "$model" --dtype bfloat16 --prompt-len "${PROMPT_LEN:-64}" \
    --gen-len "${GEN_LEN:-32}" --batch "$1" --threads "${THREADS:-2}" --weights-budget "$3" "${spill[@]}" "${@:4}" \
    --json 2>/dev/null) || die "tessera-bench failed (batch $1, budget $3)"
  echo "$1 $2 $out" >>"$results"
}
reread_model_files "$model"
echo "# $(date -u '+%Y-%m-%d %H:%M UTC'), $(uname -n); $model, bf16, budget $budget (${STREAMING:-read}), prompt ${PROMPT_LEN:-64}, ${GEN_LEN:-32} generated, ${THREADS:-2} threads"
for _ in $(seq "$rounds"); do
  for b in "${batches[@]}"; do
    run "$b" resident all
    run "$b" streamed "$budget"
    [[ -n ${COMPARE_SPILL_DIR:-} ]] && run "$b" spilled "$budget" --weights-spill-dir "$COMPARE_SPILL_DIR"
  done
done
python3 - "$results" <<'PY'
import json, statistics, sys
runs = {}
for line in open(sys.argv[1]):
    batch, kind, text = line.split(" ", 2)
    runs.setdefault(int(batch), {}).setdefault(kind, []).append(json.loads(text))
print("| batch | round | resident decode tok/s | streamed decode tok/s | **decode streamed / resident** | prefill streamed / resident |")
print("| --- | --- | --- | --- | --- | --- |")
summary = []
for batch in sorted(runs):
    res, st = runs[batch]["resident"], runs[batch]["streamed"]
    dec, pre = [], []
    for i, (a, b) in enumerate(zip(res, st), 1):
        dec.append(b["decode_tok_s"] / a["decode_tok_s"])
        pre.append(b["prefill_tok_s"] / a["prefill_tok_s"])
        print(f"| {batch} | {i} | {a['decode_tok_s']:.1f} | {b['decode_tok_s']:.1f} | **{dec[-1]:.2f}** | {pre[-1]:.2f} |")
    summary.append((batch, statistics.median(dec), statistics.median(pre), st[0], res[0]))
for batch, d, p, s, r in summary:
    print(f"batch {batch}: median streamed / resident decode {d:.2f}x, prefill {p:.2f}x; "
          f"budget {s['weights_budget_bytes'] / 2**20:.1f} MiB, streamed per step {s['weights_streamed_bytes'] / 2**20:.1f} MiB, "
          f"most held {s['weights_peak_resident_bytes'] / 2**20:.1f} MiB of {r['weights_peak_resident_bytes'] / 2**20:.1f} MiB")
for batch in sorted(runs):
    if "spilled" not in runs[batch]:
        continue
    res, st, sp = runs[batch]["resident"], runs[batch]["streamed"], runs[batch]["spilled"]
    over = [b["decode_tok_s"] / c["decode_tok_s"] for b, c in zip(st, sp)]
    print(f"batch {batch}: spill folder named: decode tok/s " + ", ".join(f"{c['decode_tok_s']:.1f}" for c in sp) +
          f" (resident " + ", ".join(f"{a['decode_tok_s']:.1f}" for a in res) + "); "
          f"median streamed / spill-folder decode {statistics.median(over):.2f}x")
PY
