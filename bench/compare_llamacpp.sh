#!/usr/bin/env bash
# Tessera against llama.cpp on the same model and the same 2 threads (docs/performance-cpu.md,
# "Against llama.cpp"): prefill of 64 and 512 tokens (tessera-bench against llama-bench -p),
# batch-1 decode of 64 tokens (llama-bench -n), and batched decode of 8 and 32 sequences of 64
# prompt + 32 generated tokens (tessera-bench --batch against llama-batched-bench's S_TG).
# Each round runs Tessera and llama.cpp back to back, so the ratio printed for a round is
# measured within minutes on the same machine; medians follow. Prefill and batch-1 decode
# time 3 runs in each engine (tessera-bench --repetitions 3, llama-bench -r 3): the host's
# memory bandwidth swings within seconds, and one 64-token decode (about a second) against
# llama.cpp's three caught those swings in one engine only. Batch-1 decode, the case closest
# to the bandwidth, runs Tessera, llama.cpp, llama.cpp, Tessera in each round and prints the
# means of each engine's two. Both engines' files are dropped
# from the page cache and read back from the disk first (lib.sh's reread_files).
#   LLAMA_CPP_DIR=DIR bench/compare_llamacpp.sh MODEL_DIR GGUF DTYPE [ROUNDS] [all|prefill|decode|batched]
# MODEL_DIR: the Hugging Face checkpoint (bench/make_models.sh), or a GGUF file that Tessera
# then reads itself (the same file as GGUF: a quantized one is compared on its own blocks);
# GGUF: the same weights converted by llama.cpp's own tools; DTYPE: float32 or bfloat16 (the
# GGUF's type, or for a quantized file the type of its unquantized tensors). LLAMA_CPP_DIR: a
# llama.cpp checkout built by hand outside this repository (CPU only, Release,
# -DGGML_NATIVE=ON), with llama-bench and llama-batched-bench in build/bin.
# Environment: BUILD (default build), THREADS (default 2), PREFILL_LENS (default "64 512"),
# BATCHES (default "8 32"), ENGINE_FLAGS (more tessera-bench flags, e.g. "--bf16-coding off").
# Defaults: 2 rounds, all.
set -euo pipefail
# shellcheck source=bench/lib.sh
source "$(dirname "$0")/lib.sh"
(($# >= 3)) || die "usage: LLAMA_CPP_DIR=DIR $0 MODEL_DIR GGUF DTYPE [ROUNDS] [all|prefill|decode|batched]"
model=$1; gguf=$2; dtype=$3; rounds=${4:-2}; what=${5:-all}
build=${BUILD:-build}
threads=${THREADS:-2}
read -r -a prefill_lens <<<"${PREFILL_LENS:-64 512}"
read -r -a batches <<<"${BATCHES:-8 32}"
[[ -n ${LLAMA_CPP_DIR:-} ]] || die "LLAMA_CPP_DIR is not set (a llama.cpp checkout built by hand, with build/bin/llama-bench)"
llama=$LLAMA_CPP_DIR/build/bin
need_bin "$llama" "LLAMA_CPP_DIR must hold a built llama.cpp" llama-bench llama-batched-bench
need_bin "$build/bin" "$BUILD_HINT" tessera-bench
if [[ $model == *.gguf ]]; then
  [[ -f $model ]] || die "no GGUF file at $model"
else
  need_model "$model"
fi
[[ -f $gguf ]] || die "no GGUF file at $gguf (convert the checkpoint with llama.cpp's convert_hf_to_gguf.py)"
[[ $dtype == float32 || $dtype == bfloat16 ]] || die "DTYPE must be float32 or bfloat16, not '$dtype'"
[[ $rounds =~ ^[1-9][0-9]*$ ]] || die "ROUNDS must be a positive whole number, not '$rounds'"
case $what in all | prefill | decode | batched) ;; *) die "unknown part '$what' (all, prefill, decode or batched)" ;; esac
# Both engines find their files in the page cache as a download read earlier is held (lib.sh).
if [[ $model == *.gguf ]]; then reread_files "$model"; else reread_model_files "$model"; fi
[[ $gguf == "$model" ]] || reread_files "$gguf"

tessera() {  # FIELDS tessera-bench flags...: prints the FIELDS (Python over its JSON r) of one run
  local fields=$1 out
  shift
  # shellcheck disable=SC2086 # ENGINE_FLAGS is a list of flags
  out=$("$build/bin/tessera-bench" --model "$model" --dtype "$dtype" --threads "$threads" --json ${ENGINE_FLAGS:-} "$@") ||
    die "tessera-bench failed: tessera-bench --model $model --dtype $dtype ${ENGINE_FLAGS:-} $*"
  json "$fields" <<<"$out"
}
llama_json() {  # TOOL FIELDS args...: runs a llama.cpp tool, prints FIELDS (Python over its JSON r)
  local tool=$1 fields=$2 out
  shift 2
  out=$("$llama/$tool" "$@" 2>/dev/null) || die "$tool failed: $llama/$tool $*"
  json "$fields" <<<"$out"
}
json() {  # EXPR: evaluates a Python expression over the JSON on stdin (bound to r)
  python3 -c "import json, sys; r = json.load(sys.stdin); print(*[$1])"
}
results=$(mktemp)
trap 'rm -f "$results"' EXIT
commit=$(git -C "$LLAMA_CPP_DIR" rev-parse --short=12 HEAD 2>/dev/null || echo unknown)
echo "# $(date -u '+%Y-%m-%d %H:%M UTC'), $(uname -n), $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2- | xargs)"
echo "# $model ($dtype) against $gguf, llama.cpp $commit, $threads threads, $rounds rounds"
for round in $(seq "$rounds"); do
  if [[ $what == all || $what == prefill ]]; then
    for p in "${prefill_lens[@]}"; do
      t=$(tessera "r['prefill_tok_s'], r['prefill_gflop_s'], r['prefill_compute_fraction']" --prompt-len "$p" --gen-len 2 \
        --repetitions 3)
      echo "prefill-$p $round $t" >>"$results"
    done
    llama_json llama-bench "'\n'.join(f\"llama prefill-{x['n_prompt']} $round {x['avg_ts']}\" for x in r)" \
      -m "$gguf" -p "$(IFS=,; echo "${prefill_lens[*]}")" -n 0 -t "$threads" -r 3 -o json >>"$results"
  fi
  if [[ $what == all || $what == decode ]]; then
    # Tessera, llama.cpp, llama.cpp, Tessera: the means of each pair cancel a drift of the
    # host's bandwidth that is steady over the round.
    t1=$(tessera "r['decode_tok_s'], r['roofline_fraction']" --prompt-len 64 --gen-len 64 --batch 1 --repetitions 3)
    l1=$(llama_json llama-bench "r[0]['avg_ts']" -m "$gguf" -p 0 -n 64 -t "$threads" -r 3 -o json)
    l2=$(llama_json llama-bench "r[0]['avg_ts']" -m "$gguf" -p 0 -n 64 -t "$threads" -r 3 -o json)
    t2=$(tessera "r['decode_tok_s'], r['roofline_fraction']" --prompt-len 64 --gen-len 64 --batch 1 --repetitions 3)
    read -r t1s t1r <<<"$t1"
    read -r t2s t2r <<<"$t2"
    python3 -c "print('decode-1 $round', ($t1s + $t2s) / 2, ($t1r + $t2r) / 2)" >>"$results"
    python3 -c "print('llama decode-1 $round', ($l1 + $l2) / 2)" >>"$results"
  fi
  if [[ $what == all || $what == batched ]]; then
    for b in "${batches[@]}"; do
      t=$(tessera "r['decode_tok_s'], r['roofline_fraction']" --prompt-len 64 --gen-len 32 --batch "$b")
      echo "decode-$b $round $t" >>"$results"
    done
    # Its table: | PP | TG | B | N_KV | T_PP s | S_PP t/s | T_TG s | S_TG t/s | T s | S t/s |
    npl=$(IFS=,; echo "${batches[*]}")
    out=$("$llama/llama-batched-bench" -m "$gguf" -c 4096 -npp 64 -ntg 32 -npl "$npl" -t "$threads" 2>/dev/null) ||
      die "llama-batched-bench failed: $llama/llama-batched-bench -m $gguf -c 4096 -npp 64 -ntg 32 -npl $npl -t $threads"
    echo "$out" |
      awk -F'|' -v round="$round" '$2 ~ /^ *[0-9]+ *$/ {gsub(/ /, "", $4); gsub(/ /, "", $9); print "llama decode-" $4, round, $9}' >>"$results"
  fi
done
python3 - "$results" <<'PY'
import statistics, sys
tessera, llama = {}, {}
for line in open(sys.argv[1]):
    f = line.split()
    if f[0] == "llama":
        llama[(f[1], f[2])] = float(f[3])
    else:
        tessera[(f[0], f[1])] = [float(v) for v in f[2:]]
order = lambda c: (c.split("-")[0] != "prefill", int(c.split("-")[1]))
cases = sorted({k[0] for k in tessera}, key=order)
print("| case | Tessera tok/s | llama.cpp tok/s | **Tessera / llama.cpp** | Tessera GFLOP/s (fraction of peak) or roofline |")
print("| --- | --- | --- | --- | --- |")
for c in cases:
    keys = sorted(k for k in tessera if k[0] == c)
    t = [tessera[k][0] for k in keys]
    l = [llama.get(k) for k in keys]
    if None in l:
        sys.exit(f"llama.cpp printed no figure for {c}; see its output by running its command by hand")
    ratios = [a / b for a, b in zip(t, l)]
    extra = ", ".join(f"{tessera[k][1]:.0f} ({tessera[k][2]:.2f})" if c.startswith("prefill") else f"{tessera[k][1]:.2f}"
                      for k in keys)
    fmt = lambda xs: ", ".join(f"{x:.1f}" for x in xs)
    print(f"| {c} | {fmt(t)} | {fmt(l)} | **{', '.join(f'{r:.2f}' for r in ratios)}** (median {statistics.median(ratios):.2f}) | {extra} |")
PY
