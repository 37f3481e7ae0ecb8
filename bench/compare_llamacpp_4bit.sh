#!/usr/bin/env bash
# 4-bit weights against llama.cpp (docs/benchmarks.md, "4-bit weights against llama.cpp"), on
# 2 threads, every figure a ratio measured within one round:
#  1. the Q4_0 and Q4_K_M files, each read by both engines (Tessera keeps their q4 blocks):
#     prefill of 512 tokens and batch-1 decode (llama-bench), batch-8 decode
#     (llama-batched-bench) - bench/compare_llamacpp.sh with PREFILL_LENS=512 BATCHES=8;
#  2. Tessera's bf16 batch-1 decode on the Hugging Face checkpoint against llama.cpp's on the
#     BF16 file;
#  3. Tessera's --quantize int4 against its own bf16, batch-1 decode, on the checkpoint (each
#     round bf16, int4, int4, bf16);
#  4. start-up: from launching the server to the first answered completion (a token-id prompt,
#     one token out) on the Q4_K_M file, tessera-serve against llama-server.
#   LLAMA_CPP_DIR=DIR bench/compare_llamacpp_4bit.sh HF_DIR BF16_GGUF Q4_0_GGUF Q4_K_M_GGUF [ROUNDS] [PARTS]
# PARTS: a comma-separated subset of files,bf16,int4,startup (default: all four).
# HF_DIR: the bfloat16 checkpoint (bench/make_models.sh 1b-bf16); the GGUF files: the same
# weights converted and quantized by llama.cpp's tools (bench/make_gguf_files.sh).
# LLAMA_CPP_DIR: a llama.cpp checkout built by hand outside this repository (CPU only,
# Release, -DGGML_NATIVE=ON) with llama-bench, llama-batched-bench and llama-server in
# build/bin. Environment: BUILD (default build), THREADS (default 2). Default: 2 rounds.
set -euo pipefail
# shellcheck source=bench/lib.sh
source "$(dirname "$0")/lib.sh"
(($# >= 4)) || die "usage: LLAMA_CPP_DIR=DIR $0 HF_DIR BF16_GGUF Q4_0_GGUF Q4_K_M_GGUF [ROUNDS] [PARTS]"
hf=$1; bf16=$2; q4_0=$3; q4_k_m=$4; rounds=${5:-2}; parts=",${6:-files,bf16,int4,startup},"
for p in ${parts//,/ }; do
  case $p in files | bf16 | int4 | startup) ;; *) die "unknown part '$p' (files, bf16, int4 or startup)" ;; esac
done
part() { [[ $parts == *",$1,"* ]]; }
build=${BUILD:-build}
threads=${THREADS:-2}
here=$(dirname "$0")
[[ -n ${LLAMA_CPP_DIR:-} ]] || die "LLAMA_CPP_DIR is not set (a llama.cpp checkout built by hand, with build/bin/llama-bench)"
llama=$LLAMA_CPP_DIR/build/bin
need_bin "$llama" "LLAMA_CPP_DIR must hold a built llama.cpp" llama-bench llama-batched-bench llama-server
need_bin "$build/bin" "$BUILD_HINT" tessera-bench tessera-serve
need_model "$hf"
for f in "$bf16" "$q4_0" "$q4_k_m"; do [[ -f $f ]] || die "no GGUF file at $f (bench/make_gguf_files.sh makes them)"; done
[[ $rounds =~ ^[1-9][0-9]*$ ]] || die "ROUNDS must be a positive whole number, not '$rounds'"
commit=$(git -C "$LLAMA_CPP_DIR" rev-parse --short=12 HEAD 2>/dev/null || echo unknown)
echo "# $(date -u '+%Y-%m-%d %H:%M UTC'), $(uname -n), $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2- | xargs)"
echo "# llama.cpp $commit, $threads threads, $rounds rounds"

if part files; then
  for f in "$q4_0" "$q4_k_m"; do
    echo
    echo "## $(basename "$f"): the same file in both engines"
    PREFILL_LENS=512 BATCHES=8 "$here/compare_llamacpp.sh" "$f" "$f" bfloat16 "$rounds" all | grep -v '^#'
  done
fi

if part bf16; then
  # Tessera's default (coded bf16 where the CPU has AVX-512 BF16: the same values in 12 bits
  # a weight, docs/quantization.md), then its weights as 16-bit bfloat16.
  echo
  echo "## bfloat16: the checkpoint in Tessera (--bf16-coding auto), $(basename "$bf16") in llama.cpp"
  "$here/compare_llamacpp.sh" "$hf" "$bf16" bfloat16 "$rounds" decode | grep -v '^#'
  echo
  echo "## bfloat16: the checkpoint in Tessera (--bf16-coding off), $(basename "$bf16") in llama.cpp"
  ENGINE_FLAGS="--bf16-coding off" "$here/compare_llamacpp.sh" "$hf" "$bf16" bfloat16 "$rounds" decode | grep -v '^#'
fi

decode_tok_s() {  # tessera-bench flags...: batch-1 decode tok/s
  "$build/bin/tessera-bench" --model "$hf" --dtype bfloat16 --threads "$threads" --json --prompt-len 64 \
    --gen-len 64 --batch 1 "$@" | python3 -c "import json, sys; print(json.load(sys.stdin)['decode_tok_s'])"
}
if part int4; then
  echo
  echo "## --quantize int4 against bfloat16 (16 bits a weight: --bf16-coding off), Tessera alone, batch-1 decode"
  # Each round runs bf16, int4, int4, bf16: the host's memory bandwidth drifts within
  # minutes, and the ratio of the sums cancels a drift that is steady over the round.
  echo "| round | bf16 tok/s | int4 tok/s | **int4 / bf16** (sums) |"
  echo "| --- | --- | --- | --- |"
  for round in $(seq "$rounds"); do
    b1=$(decode_tok_s --quantize none --bf16-coding off)
    q1=$(decode_tok_s --quantize int4)
    q2=$(decode_tok_s --quantize int4)
    b2=$(decode_tok_s --quantize none --bf16-coding off)
    python3 -c "print(f'| $round | {$b1:.1f}, {$b2:.1f} | {$q1:.1f}, {$q2:.1f} | **{($q1 + $q2) / ($b1 + $b2):.2f}** |')"
  done
fi
part startup || exit 0

# Seconds from launching CMD... until a completion request to URL with BODY is answered.
seconds_to_first_answer() {  # URL BODY CMD...
  local url=$1 body=$2 start pid
  shift 2
  start=$(date +%s.%N)
  "$@" >/dev/null 2>&1 &
  pid=$!
  until curl -sf -m 30 "$url" -H 'Content-Type: application/json' -d "$body" >/dev/null 2>&1; do
    kill -0 "$pid" 2>/dev/null || die "the server exited before answering: $*"
    sleep 0.05
  done
  python3 -c "print(f'{$(date +%s.%N) - $start:.2f}')"
  stop_pid "$pid"
}
free_port() { python3 -c "import socket; s = socket.socket(); s.bind(('127.0.0.1', 0)); print(s.getsockname()[1])"; }
echo
echo "## start-up to the first answered completion, $(basename "$q4_k_m")"
echo "| round | tessera-serve s | llama-server s | **Tessera / llama.cpp** |"
echo "| --- | --- | --- | --- |"
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
for round in $(seq "$rounds"); do
  port=$(free_port)
  t=$(seconds_to_first_answer "http://127.0.0.1:$port/v1/completions" '{"prompt": [1, 450, 4996], "max_tokens": 1}' \
    "$build/bin/tessera-serve" --model "$q4_k_m" --dtype bfloat16 --threads "$threads" --port "$port" \
    --set "server.control=ipc://$dir/control.ipc" --set "server.zmq_client=ipc://$dir/client.ipc")
  port=$(free_port)
  l=$(seconds_to_first_answer "http://127.0.0.1:$port/completion" '{"prompt": [1, 450, 4996], "n_predict": 1}' \
    "$llama/llama-server" -m "$q4_k_m" -t "$threads" --port "$port" -c 2048)
  python3 -c "print(f'| $round | {$t:.2f} | {$l:.2f} | **{$t / $l:.2f}** |')"
done
