#!/usr/bin/env bash
# Speculative decoding against plain decoding (docs/benchmarks.md, "Speculative decoding"):
# tessera-bench on the serving path (--engine), batch 1, bf16, K proposals per step, each
# case's plain and speculative runs back to back in every round so that a change of load on
# a shared machine hits both alike. Prints each round's decode tok/s and ratio, then per case
# the median ratio, the acceptance rate and the mean accepted length (tokens per speculating
# step, the bonus token included).
#   self    kjv-llama padded to >= 300 MB (tessera-make-checkpoint --pad-from), kjv-llama itself
#           as the draft: the same logits, so acceptance ~100% (the upper bound)
#   draft   the padded target, the trained draft fixture (greedy agreement 0.78)
#   ngram   the padded target, n-gram lookup, prompts that quote the passage to be continued
#   small   kjv-llama unpadded, the draft fixture (a step's fixed costs weigh more)
#   random  a generated ~1.1B Llama, a generated draft of another seed (acceptance near 0)
# Prompts: the first PROMPTS held-out chapters of kjv-llama (fixtures/kjv-llama/heldout.txt),
# their first 48 tokens; for ngram, their first 160 tokens then the first 16 again (the model
# goes on quoting). The random case uses random prompt ids.
# Usage: bench/speculative_bench.sh [ROUNDS] [CASE...]   (default: 3 rounds, every case)
# Environment: BUILD (build), FIXTURES (../shared/fixtures), WORK (models are made there once;
#   default /tmp/tessera-spec-bench), THREADS (2), K (4), GEN_LEN (96), PROMPTS (4).
set -euo pipefail
# shellcheck source=bench/lib.sh
source "$(dirname "$0")/lib.sh"
rounds=${1:-3}
shift || true
cases=("$@")
((${#cases[@]})) || cases=(self draft ngram small random)
build=${BUILD:-build}
fixtures=${FIXTURES:-$(dirname "$0")/../../shared/fixtures}
work=${WORK:-/tmp/tessera-spec-bench}
threads=${THREADS:-2}
k=${K:-4}
gen=${GEN_LEN:-96}
nprompts=${PROMPTS:-4}
need_whole_numbers "ROUNDS, THREADS, K, GEN_LEN, PROMPTS" "$rounds" "$threads" "$k" "$gen" "$nprompts"
for c in "${cases[@]}"; do
  [[ $c =~ ^(self|draft|ngram|small|random)$ ]] || die "unknown case '$c' (self, draft, ngram, small, random)"
done
need_bin "$build/bin" "$BUILD_HINT" tessera-bench tessera-make-checkpoint tessera-tokenize
kjv=$fixtures/kjv-llama
kjv_draft=$fixtures/kjv-llama-draft
need_model "$kjv"
need_model "$kjv_draft"
mkdir -p "$work"

# The models: made once, kept in $work.
padded=$work/kjv-llama-padded
make_padded_kjv_llama "$build/bin" "$kjv" "$padded"
big=$work/llama-1b-bf16
big_draft=$work/llama-1b-random-draft
if [[ " ${cases[*]} " == *" random "* ]]; then
  [[ -f $big/config.json ]] || "$build/bin/tessera-make-checkpoint" --arch llama --out "$big" --hidden 2048 \
    --layers 22 --heads 32 --kv-heads 4 --ffn 5632 --vocab 32000 --max-positions 2048 --dtype bfloat16 >/dev/null
  [[ -f $big_draft/config.json ]] || "$build/bin/tessera-make-checkpoint" --arch llama --out "$big_draft" \
    --hidden 256 --layers 2 --heads 4 --kv-heads 2 --ffn 704 --vocab 32000 --max-positions 2048 --seed 7 \
    --dtype bfloat16 >/dev/null
fi

# The prompts, as token ids (one line each).
python3 - "$kjv/heldout.txt" "$nprompts" "$work" "$build/bin/tessera-tokenize" "$kjv" <<'PY'
import json, subprocess, sys
heldout, n, work, tokenize, tokenizer = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4], sys.argv[5]
chapters = [line.strip() for line in open(heldout, encoding="utf-8") if line.strip()][:n]
def ids(text):
    out = subprocess.run([tokenize, "--tokenizer", tokenizer, "--text", text, "--add-special-tokens", "--json"],
                         check=True, capture_output=True, text=True).stdout
    return json.loads(out)["ids"]
with open(f"{work}/verses.ids", "w") as plain, open(f"{work}/quoting.ids", "w") as quoting:
    for chapter in chapters:
        toks = ids(chapter)
        plain.write(",".join(map(str, toks[:48])) + "\n")
        quoting.write(",".join(map(str, toks[:160] + toks[1:17])) + "\n")
PY

results=$(mktemp)
trap 'rm -f "$results"' EXIT
bench() {  # CASE KIND MODEL [flags]: one tessera-bench run, appended to $results as "CASE KIND JSON"
  local case=$1 kind=$2 model=$3 out
  shift 3
  out=$("$build/bin/tessera-bench" --model "$model" --dtype bfloat16 --threads "$threads" --batch 1 \
    --gen-len "$gen" --engine --json "$@") || die "tessera-bench failed ($case, $kind)"
  echo "$case $kind $out" >>"$results"
}
run_case() {  # CASE: its plain run, then its speculative run
  case $1 in
    self) bench self plain "$padded" --prompt-ids-file "$work/verses.ids"
      bench self spec "$padded" --prompt-ids-file "$work/verses.ids" --speculative draft --draft-model "$kjv" \
        --speculative-tokens "$k" ;;
    draft) bench draft plain "$padded" --prompt-ids-file "$work/verses.ids"
      bench draft spec "$padded" --prompt-ids-file "$work/verses.ids" --speculative draft --draft-model "$kjv_draft" \
        --speculative-tokens "$k" ;;
    ngram) bench ngram plain "$padded" --prompt-ids-file "$work/quoting.ids"
      bench ngram spec "$padded" --prompt-ids-file "$work/quoting.ids" --speculative ngram --speculative-tokens "$k" ;;
    small) bench small plain "$kjv" --prompt-ids-file "$work/verses.ids"
      bench small spec "$kjv" --prompt-ids-file "$work/verses.ids" --speculative draft --draft-model "$kjv_draft" \
        --speculative-tokens "$k" ;;
    random) bench random plain "$big" --prompt-len 64
      bench random spec "$big" --prompt-len 64 --speculative draft --draft-model "$big_draft" --speculative-tokens "$k" ;;
  esac
}
echo "# $(date -u '+%Y-%m-%d %H:%M UTC'), $(uname -n); batch 1, bf16, $threads threads, k = $k, $gen generated" \
  "tokens, $nprompts prompts per run; padded target $(($(stat -c %s "$padded/model.safetensors") / 1000000)) MB"
for _ in $(seq "$rounds"); do
  for c in "${cases[@]}"; do run_case "$c"; done
done
python3 - "$results" <<'PY'
import json, statistics, sys
runs = {}
for line in open(sys.argv[1]):
    case, kind, text = line.split(" ", 2)
    runs.setdefault(case, {"plain": [], "spec": []})[kind].append(json.loads(text))
print("| case | round | plain decode tok/s | speculative tok/s | **ratio** | acceptance | mean accepted length |")
print("| --- | --- | --- | --- | --- | --- | --- |")
summary = []
for case, r in runs.items():
    ratios = []
    for i, (p, s) in enumerate(zip(r["plain"], r["spec"]), 1):
        ratios.append(s["decode_tok_s"] / p["decode_tok_s"])
        print(f"| {case} | {i} | {p['decode_tok_s']:.1f} | {s['decode_tok_s']:.1f} | **{ratios[-1]:.2f}** "
              f"| {s['acceptance_rate']:.3f} | {s['mean_accepted_length']:.2f} |")
    summary.append((case, statistics.median(ratios), r["spec"][-1]))
for case, ratio, s in summary:
    print(f"{case}: median {ratio:.2f}x plain; acceptance {s['acceptance_rate']:.3f}, mean accepted length "
          f"{s['mean_accepted_length']:.2f}")
PY
