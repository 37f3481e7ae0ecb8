#!/usr/bin/env bash
# Serving throughput and latency, Tessera against llama-server, on the same model, machine and
# trace (docs/benchmarks.md, "Serving against llama-server"). In order:
#   1. tessera-serve (bf16, prefix caching off): batch-1 TPOT (one user, 12 requests), the
#      sweep, batch-1 TPOT again;
#   2. llama-server (-np SLOTS, --no-cache-prompt): the same sweep;
#   3. a fresh tessera-serve with prefix caching on, twice: RATE1_REQUESTS requests at 1 req/s,
#      for the TTFT tail (p99 / p50).
# The sweep: token-id prompts of 128 tokens, 64 generated (--logprobs: a generated checkpoint
# has no tokenizer, so only logprob events stream), Poisson arrivals at each of RATES.
# Prints one table with the ratios (out tok/s Tessera / llama-server, p50 TPOT / batch-1 TPOT);
# the loadgen results are left in OUT_DIR.
#   LLAMA_CPP_DIR=DIR bench/serving_sweep.sh MODEL_DIR GGUF [OUT_DIR]
# MODEL_DIR: a bf16 Hugging Face checkpoint (bench/make_models.sh 100m-bf16); GGUF: the same
# weights converted by llama.cpp's convert_hf_to_gguf.py; LLAMA_CPP_DIR: a llama.cpp checkout
# built by hand outside this repository with its server (-DLLAMA_BUILD_SERVER=ON).
# Environment: BUILD (default build), THREADS (2), RATES (1,2,4,8), REQUESTS (40 per rate),
# SLOTS (llama-server's -np, 8), RATE1_REQUESTS (40), OUT_DIR default serving-sweep,
# SERVE_FLAGS (more tessera-serve flags for every Tessera server, split at spaces, e.g.
# "--set scheduler.max_tpot_slowdown=1.5").
set -euo pipefail
# shellcheck source=bench/lib.sh
source "$(dirname "$0")/lib.sh"
(($# >= 2)) || die "usage: LLAMA_CPP_DIR=DIR $0 MODEL_DIR GGUF [OUT_DIR]"
model=$1; gguf=$2; out=${3:-serving-sweep}
build=${BUILD:-build}
threads=${THREADS:-2}
rates=${RATES:-1,2,4,8}
requests=${REQUESTS:-40}
slots=${SLOTS:-8}
rate1_requests=${RATE1_REQUESTS:-40}
read -r -a serve_flags <<<"${SERVE_FLAGS:-}"
[[ -n ${LLAMA_CPP_DIR:-} ]] || die "LLAMA_CPP_DIR is not set (a llama.cpp checkout built by hand, with build/bin/llama-server)"
need_bin "$LLAMA_CPP_DIR/build/bin" "LLAMA_CPP_DIR must hold a llama.cpp built with -DLLAMA_BUILD_SERVER=ON" llama-server
need_bin "$build/bin" "$BUILD_HINT" tessera-serve tessera-loadgen
need_model "$model"
[[ -f $gguf ]] || die "no GGUF file at $gguf (convert the checkpoint with llama.cpp's convert_hf_to_gguf.py)"
need_whole_numbers "THREADS, REQUESTS, SLOTS, RATE1_REQUESTS" "$threads" "$requests" "$slots" "$rate1_requests"
[[ $rates =~ ^[0-9.]+(,[0-9.]+)*$ ]] || die "RATES must be a comma-separated list of request rates, not '$rates'"
mkdir -p "$out"
TRACE=(--input-len 128 --output-len 64 --logprobs --no-progress)
LLAMA_PID=""
trap 'stop_pid "$SERVE_PID"; stop_pid "$LLAMA_PID"' EXIT
loadgen() {  # PORT JSON loadgen flags...
  local port=$1 json=$2
  shift 2
  "$build/bin/tessera-loadgen" --url "http://127.0.0.1:$port" "${TRACE[@]}" --json "$json" "$@" >"${json%.json}.txt" ||
    die "tessera-loadgen failed against port $port (see ${json%.json}.txt)"
}
tessera_serve() {  # NAME [tessera-serve flags...]
  local dir=$out/$1
  shift
  rm -rf "$dir"
  start_tessera_serve "$build/bin" "$dir" --model "$model" --threads "$threads" --set model.dtype=bfloat16 "${serve_flags[@]}" "$@" ||
    die "tessera-serve did not start (log: $dir/serve.log)"
}

echo "# $(date -u '+%Y-%m-%d %H:%M UTC'), $(uname -n), $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2- | xargs)"
echo "# $model against $gguf (llama.cpp $(git -C "$LLAMA_CPP_DIR" rev-parse --short=12 HEAD 2>/dev/null || echo unknown)), $threads threads"

tessera_serve tessera --set scheduler.prefix_caching=false
loadgen "$SERVE_PORT" "$out/batch1_before.json" --concurrency 1 --requests 12
loadgen "$SERVE_PORT" "$out/tessera.json" --sweep "$rates" --requests "$requests"
loadgen "$SERVE_PORT" "$out/batch1_after.json" --concurrency 1 --requests 12
stop_pid "$SERVE_PID"; SERVE_PID=""

port=$(python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
"$LLAMA_CPP_DIR/build/bin/llama-server" -m "$gguf" -t "$threads" -c 4096 -np "$slots" --no-cache-prompt \
  --host 127.0.0.1 --port "$port" >"$out/llama-server.log" 2>&1 &
LLAMA_PID=$!
for _ in $(seq 600); do
  curl -sf "http://127.0.0.1:$port/health" >/dev/null 2>&1 && break
  kill -0 "$LLAMA_PID" 2>/dev/null || die "llama-server exited (log: $out/llama-server.log)"
  sleep 0.2
done
curl -sf "http://127.0.0.1:$port/health" >/dev/null || die "llama-server was not ready within 120 s (log: $out/llama-server.log)"
loadgen "$port" "$out/llama-server.json" --sweep "$rates" --requests "$requests"
stop_pid "$LLAMA_PID"; LLAMA_PID=""

for i in 1 2; do
  tessera_serve "caching$i" --set scheduler.prefix_caching=true
  loadgen "$SERVE_PORT" "$out/rate1_caching$i.json" --rate 1 --requests "$rate1_requests"
  stop_pid "$SERVE_PID"; SERVE_PID=""
done

python3 - "$out" <<'PY'
import json, os, sys
out = sys.argv[1]
load = lambda name: json.load(open(os.path.join(out, name)))["runs"]
b1 = [load(f)[0]["tpot_s"]["p50"] for f in ("batch1_before.json", "batch1_after.json")]
b1_mean = sum(b1) / len(b1)
ms = lambda s: f"{s * 1e3:.1f}" if s is not None else "-"
print(f"batch-1 p50 TPOT before / after the sweep: {ms(b1[0])} / {ms(b1[1])} ms")
print("| offered req/s | Tessera out tok/s | llama-server out tok/s (all streamed) | **ratio** | Tessera p50 TPOT ms "
      "| **÷ batch 1** | llama-server p50 TPOT ms | Tessera TTFT p50 / p99 ms | llama-server TTFT p50 / p99 ms | llama-server failed |")
print("| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |")
for t, l in zip(load("tessera.json"), load("llama-server.json")):
    streamed = (l["output_tokens"] + l.get("failed_output_tokens", 0)) / l["duration_s"]
    tp = t["tpot_s"]["p50"]
    print(f"| {t['rate']:g} | {t['output_tokens_per_s']:.1f} | {l['output_tokens_per_s']:.1f} ({streamed:.1f}) "
          f"| **{t['output_tokens_per_s'] / l['output_tokens_per_s']:.2f}** | {ms(tp)} "
          f"| **{tp / b1_mean:.2f}** | {ms(l['tpot_s']['p50'])} | {ms(t['ttft_s']['p50'])} / {ms(t['ttft_s']['p99'])} "
          f"| {ms(l['ttft_s']['p50'])} / {ms(l['ttft_s']['p99'])} | {l['failed']} of {l['issued']} |")
for i in (1, 2):
    r = load(f"rate1_caching{i}.json")[0]
    p50, p99 = r["ttft_s"]["p50"], r["ttft_s"]["p99"]
    print(f"1 req/s, prefix caching on, fresh server {i}: TTFT p50 {ms(p50)} ms, p99 {ms(p99)} ms, **p99 / p50 {p99 / p50:.2f}**")
PY
