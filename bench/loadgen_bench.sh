#!/usr/bin/env bash
# Reproduces docs/benchmarks.md, "Load generator": tessera-loadgen against tessera-serve on the
# generated ~100M-parameter Llama (bf16, CPU backend).
#   bench/loadgen_bench.sh [BUILD_DIR] [all|sweep|modes|overload]
# Environment: MODEL (default /tmp/llama-100m, generated when missing), OUT (default
# /tmp/loadgen-bench), OVERLOAD_S (default 60).
set -euo pipefail
# shellcheck source=bench/lib.sh
source "$(dirname "$0")/lib.sh"
BUILD=${1:-build}
WHAT=${2:-all}
MODEL=${MODEL:-/tmp/llama-100m}
OUT=${OUT:-/tmp/loadgen-bench}
OVERLOAD_S=${OVERLOAD_S:-60}
BIN=$BUILD/bin
need_bin "$BIN" "$BUILD_HINT" tessera-serve tessera-loadgen tessera-make-checkpoint
mkdir -p "$OUT"
[ -f "$MODEL/config.json" ] || "$BIN/tessera-make-checkpoint" --arch llama --preset 100m --out "$MODEL"

# The same seeded trace everywhere: token-id prompts of 32-96 tokens, 16-48 generated tokens
# (ignore_eos), --logprobs because a generated checkpoint has no tokenizer (so no text).
TRACE=(--input-len uniform:32:96 --output-len uniform:16:48 --seed 1 --logprobs --no-progress)

# Every server: bf16 weights, 1024 KV blocks of 16 tokens (~0.4 GB; `auto` would size the cache
# from the machine's free memory).
PID=""
PORT=""
start_server() {  # NAME [tessera-serve flags...]: sets PID and PORT
  local dir=$OUT/$1
  shift
  rm -rf "$dir"
  start_tessera_serve "$BIN" "$dir" --model "$MODEL" --set model.dtype=bfloat16 --set cache.num_blocks=1024 "$@"
  PID=$SERVE_PID
  PORT=$SERVE_PORT
  # warm up (page the weights in) before anything is counted
  "$BIN/tessera-loadgen" --url "http://127.0.0.1:$PORT" --concurrency 4 --requests 32 "${TRACE[@]}" \
    --json "$dir/warmup.json" >/dev/null
}
stop_server() { stop_pid "$PID"; }
counters() {  # the server's request and token counters, one line
  curl -s "http://127.0.0.1:$PORT/metrics" | awk '
    /^tessera:request_success_total/ {ok += $NF}
    /^tessera:generation_tokens_total/ {gen = $NF}
    /^tessera:prompt_tokens_total/ {prompt = $NF}
    /^tessera:http_responses_total.*code="429"/ {r429 = $NF}
    END {printf "request_success %d generation_tokens %d prompt_tokens %d http_429 %d\n", ok, gen, prompt, r429}'
}

if [[ $WHAT == all || $WHAT == sweep ]]; then
  # Acceptance 1: a 3-rate sweep; its counts against the server's /metrics deltas.
  start_server sweep
  counters | tee "$OUT/sweep/metrics_before.txt"
  "$BIN/tessera-loadgen" --url "http://127.0.0.1:$PORT" --sweep 2,8,16 --requests 40 "${TRACE[@]}" \
    --slo ttft=2s,tpot=200ms --json "$OUT/sweep/result.json" --plots "$OUT/sweep/plots" | tee "$OUT/sweep/table.txt"
  counters | tee "$OUT/sweep/metrics_after.txt"
  stop_server
fi

if [[ $WHAT == all || $WHAT == modes ]]; then
  # Acceptance 3: the same seeded trace against continuous and static batching.
  for mode in continuous static; do
    start_server "$mode" --set scheduler.mode=$mode --set scheduler.max_num_seqs=16
    "$BIN/tessera-loadgen" --url "http://127.0.0.1:$PORT" --sweep 2,4,8,12,16,24 --requests 80 "${TRACE[@]}" \
      --json "$OUT/$mode/result.json" | tee "$OUT/$mode/table.txt"
    stop_server
  done
  "$BIN/tessera-loadgen" --compare "continuous=$OUT/continuous/result.json" --compare "static=$OUT/static/result.json" \
    --slo ttft=500ms --plots "$OUT/modes_plots" | tee "$OUT/modes_compare.txt"
fi

if [[ $WHAT == all || $WHAT == overload ]]; then
  # Acceptance 4: a minute well above capacity with a small queue; RSS of every server
  # process sampled each second.
  start_server overload --set server.max_queued_requests=8 --set scheduler.max_num_seqs=8
  (
    echo "t_ms coordinator_rss_kb workers_rss_kb"
    t0=$(date +%s%N)
    while kill -0 "$PID" 2>/dev/null; do
      c=$(awk '/VmRSS/ {print $2}' "/proc/$PID/status" 2>/dev/null || echo 0)
      w=0
      for k in $(pgrep -P "$PID" || true); do
        w=$((w + $(awk '/VmRSS/ {print $2}' "/proc/$k/status" 2>/dev/null || echo 0)))
      done
      echo "$((($(date +%s%N) - t0) / 1000000)) $c $w"
      sleep 1
    done
  ) >"$OUT/overload/rss.txt" &
  SAMPLER=$!
  counters | tee "$OUT/overload/metrics_before.txt"
  "$BIN/tessera-loadgen" --url "http://127.0.0.1:$PORT" --rate 30 --duration "$OVERLOAD_S" "${TRACE[@]}" \
    --json "$OUT/overload/result.json" --plots "$OUT/overload/plots" | tee "$OUT/overload/table.txt"
  counters | tee "$OUT/overload/metrics_after.txt"
  stop_server
  wait "$SAMPLER" || true
  awk 'NR > 1 {n++; if (min == "" || $2 + $3 < min) min = $2 + $3; if ($2 + $3 > max) max = $2 + $3}
       END {printf "server RSS (coordinator + workers): %d samples, min %.1f MiB, max %.1f MiB\n", n, min / 1024, max / 1024}' \
    "$OUT/overload/rss.txt" | tee "$OUT/overload/rss_summary.txt"
fi
