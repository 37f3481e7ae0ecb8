#!/usr/bin/env bash
# Speculative decoding under load (docs/benchmarks.md, "Speculative decoding under load"):
# tessera-loadgen --sweep on the padded kjv-llama target (>= 300 MB, bf16; made as in
# bench/speculative_bench.sh), served plainly and with each draft in turn, one server at a time
# on the same trace: held-out chapters' openings as text prompts, 64 generated tokens
# (ignore_eos), Poisson arrivals at each of RATES. Prints per rate and draft the output tok/s
# and p50 time per output token as ratios to the plain server's, and the proposals accepted.
#   self   kjv-llama itself as the draft (the same logits: acceptance ~100%)
#   draft  the trained draft fixture (greedy agreement 0.78)
# Usage: bench/speculative_sweep.sh [DRAFT...]   (default: self draft)
# Environment: BUILD (build), FIXTURES (../shared/fixtures), WORK (models and results;
#   default /tmp/tessera-spec-sweep), THREADS (2), K (4), RATES (1,2,4,8), REQUESTS (40 per rate),
#   OUTPUT_LEN (64).
set -euo pipefail
# shellcheck source=bench/lib.sh
source "$(dirname "$0")/lib.sh"
drafts=("$@")
((${#drafts[@]})) || drafts=(self draft)
build=${BUILD:-build}
fixtures=${FIXTURES:-$(dirname "$0")/../../shared/fixtures}
work=${WORK:-/tmp/tessera-spec-sweep}
threads=${THREADS:-2}
k=${K:-4}
rates=${RATES:-1,2,4,8}
requests=${REQUESTS:-40}
output_len=${OUTPUT_LEN:-64}
need_whole_numbers "THREADS, K, REQUESTS, OUTPUT_LEN" "$threads" "$k" "$requests" "$output_len"
[[ $rates =~ ^[0-9.]+(,[0-9.]+)*$ ]] || die "RATES must be a comma-separated list of request rates, not '$rates'"
for d in "${drafts[@]}"; do
  [[ $d =~ ^(self|draft)$ ]] || die "unknown draft '$d' (self, draft)"
done
need_bin "$build/bin" "$BUILD_HINT" tessera-serve tessera-loadgen tessera-make-checkpoint
kjv=$fixtures/kjv-llama
need_model "$kjv"
need_model "$fixtures/kjv-llama-draft"
mkdir -p "$work"
padded=$work/kjv-llama-padded
make_padded_kjv_llama "$build/bin" "$kjv" "$padded"

# The trace: each held-out chapter's first 240 characters, cut at a word.
python3 - "$kjv/heldout.txt" "$work/prompts.jsonl" "$output_len" <<'PY'
import json, sys
heldout, out, n = sys.argv[1], sys.argv[2], int(sys.argv[3])
with open(out, "w") as f:
    for line in open(heldout, encoding="utf-8"):
        line = line.strip()
        if line:
            f.write(json.dumps({"prompt": line[:240].rsplit(" ", 1)[0], "output_len": n}) + "\n")
PY

SERVE_PID=""
trap 'stop_pid "$SERVE_PID"' EXIT
sweep() {  # NAME [tessera-serve flags...]: one server, one sweep, results in $work/NAME.json
  local name=$1
  shift
  rm -rf "${work:?}/$name"
  start_tessera_serve "$build/bin" "$work/$name" --model "$padded" --threads "$threads" \
    --set model.dtype=bfloat16 --set scheduler.prefix_caching=false "$@" ||
    die "tessera-serve did not start (log: $work/$name/serve.log)"
  "$build/bin/tessera-loadgen" --url "http://127.0.0.1:$SERVE_PORT" --dataset "$work/prompts.jsonl" \
    --sweep "$rates" --requests "$requests" --temperature 0 --no-progress --json "$work/$name.json" \
    >"$work/$name.txt" || die "tessera-loadgen failed (see $work/$name.txt)"
  curl -sf "http://127.0.0.1:$SERVE_PORT/metrics" >"$work/$name.metrics" || true
  grep -m1 "speculation: a step's time by its rows" "$work/$name/serve.log" >"$work/$name.rows" || true
  stop_pid "$SERVE_PID"; SERVE_PID=""
}

echo "# $(date -u '+%Y-%m-%d %H:%M UTC'), $(uname -n), $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2- | xargs)"
echo "# padded kjv-llama $(du -m "$padded/model.safetensors" | cut -f1) MB bf16, $threads threads, k = $k," \
  "rates $rates, $requests requests each, $output_len tokens"
sweep plain
for d in "${drafts[@]}"; do
  case $d in
    self) draft_model=$kjv ;;
    draft) draft_model=$fixtures/kjv-llama-draft ;;
  esac
  sweep "$d" --set speculative.method=draft --set "speculative.draft_model=$draft_model" \
    --set "speculative.num_tokens=$k"
done

python3 - "$work" "${drafts[@]}" <<'PY'
import json, os, re, sys
work, drafts = sys.argv[1], sys.argv[2:]
load = lambda name: json.load(open(os.path.join(work, name + ".json")))["runs"]
def counter(name, metric):
    try:
        text = open(os.path.join(work, name + ".metrics")).read()
    except OSError:
        return None
    m = re.search(rf"^{re.escape(metric)}(?:{{[^}}]*}})? ([0-9.e+]+)$", text, re.M)
    return float(m.group(1)) if m else None
plain = load("plain")
ms = lambda s: f"{s * 1e3:.1f}" if s is not None else "-"
print("| draft | offered req/s | plain out tok/s | spec out tok/s | **out tok/s ratio** | plain p50 TPOT ms "
      "| spec p50 TPOT ms | **p50 TPOT ratio** |")
print("| --- | --- | --- | --- | --- | --- | --- | --- |")
for d in drafts:
    for p, s in zip(plain, load(d)):
        print(f"| {d} | {p['rate']:g} | {p['output_tokens_per_s']:.1f} | {s['output_tokens_per_s']:.1f} "
              f"| **{s['output_tokens_per_s'] / p['output_tokens_per_s']:.2f}** | {ms(p['tpot_s']['p50'])} "
              f"| {ms(s['tpot_s']['p50'])} | **{s['tpot_s']['p50'] / p['tpot_s']['p50']:.2f}** |")
for d in drafts:
    drafted = counter(d, "vllm:spec_decode_num_draft_tokens_total")
    accepted = counter(d, "vllm:spec_decode_num_accepted_tokens_total")
    rate = f"{accepted / drafted:.3f}" if drafted else "-"
    rows = open(os.path.join(work, d + ".rows")).read().strip().split("speculation: ")[-1]
    print(f"{d}: {accepted:.0f} of {drafted:.0f} proposals accepted ({rate}); {rows}")
PY
