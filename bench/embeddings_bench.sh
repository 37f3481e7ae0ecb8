#!/usr/bin/env bash
# Embedding throughput against the engine's own prefill rate (docs/benchmarks.md,
# "Embeddings"): BATCH inputs of PROMPT_LEN token ids in one POST /v1/embeddings to a
# tessera-serve, against tessera-bench's prefill tokens/s at the same batch and length, in
# interleaved rounds; prints both and their ratio. An embedding is a prefill whose last
# hidden states are pooled, so the ratio says what the serving path (HTTP, JSON, pooling)
# costs on top of the forward passes.
#   bench/embeddings_bench.sh MODEL_DIR [OUT_DIR]
# MODEL_DIR: a Hugging Face checkpoint (bench/make_models.sh 100m-bf16 makes the ~100M model).
# Environment: BUILD (default build), THREADS (2), BATCH (256), PROMPT_LEN (128), ROUNDS (3),
# DTYPE (bfloat16), OUT_DIR default embeddings-bench.
set -euo pipefail
# shellcheck source=bench/lib.sh
source "$(dirname "$0")/lib.sh"
(($# >= 1)) || die "usage: $0 MODEL_DIR [OUT_DIR]"
model=$1; out=${2:-embeddings-bench}
build=${BUILD:-build}
threads=${THREADS:-2}
batch=${BATCH:-256}
prompt_len=${PROMPT_LEN:-128}
rounds=${ROUNDS:-3}
dtype=${DTYPE:-bfloat16}
need_bin "$build/bin" "$BUILD_HINT" tessera-serve tessera-bench
need_model "$model"
need_whole_numbers "THREADS, BATCH, PROMPT_LEN, ROUNDS" "$threads" "$batch" "$prompt_len" "$rounds"
mkdir -p "$out"
trap 'stop_pid "$SERVE_PID"' EXIT

# The inputs: random ids below the vocabulary, the same in every round.
vocab=$(python3 -c 'import json, sys; print(json.load(open(sys.argv[1]))["vocab_size"])' "$model/config.json")
python3 - "$vocab" "$batch" "$prompt_len" >"$out/request.json" <<'EOF'
import json, random, sys
vocab, batch, length = map(int, sys.argv[1:])
rng = random.Random(0)
print(json.dumps({"input": [[rng.randrange(3, vocab) for _ in range(length)] for _ in range(batch)]}))
EOF
# The same ids for tessera-bench, one comma-separated line per input.
python3 -c 'import json, sys; [print(",".join(map(str, r))) for r in json.load(open(sys.argv[1]))["input"]]' \
  "$out/request.json" >"$out/prompts.txt"

start_tessera_serve "$build/bin" "$out/serve" --model "$model" --threads "$threads" --set "model.dtype=$dtype" \
  --set model.pooling=mean || die "tessera-serve did not start (log: $out/serve/serve.log)"

echo "# $(date -u '+%Y-%m-%d %H:%M UTC'), $(uname -n), $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2- | xargs)"
echo "# $model ($dtype), $threads threads, $batch inputs of $prompt_len tokens"
printf '%-6s %16s %16s %8s\n' round "embed tok/s" "prefill tok/s" ratio
for r in $(seq "$rounds"); do
  # Serving: one request of every input, timed by curl from the first byte sent to the last read.
  seconds=$(curl -sf -o "$out/answer.json" -w '%{time_total}' -H 'Content-Type: application/json' \
    --data-binary "@$out/request.json" "http://127.0.0.1:$SERVE_PORT/v1/embeddings") ||
    die "POST /v1/embeddings failed (log: $out/serve/serve.log)"
  tokens=$(python3 -c 'import json, sys; print(json.load(open(sys.argv[1]))["usage"]["prompt_tokens"])' "$out/answer.json")
  embed=$(python3 -c "print($tokens / $seconds)")
  # The engine alone: prefill of the same prompts at the same batch (the server is idle meanwhile).
  "$build/bin/tessera-bench" --model "$model" --dtype "$dtype" --threads "$threads" --batch "$batch" \
    --prompt-ids-file "$out/prompts.txt" --gen-len 2 --json >"$out/bench_$r.json" 2>"$out/bench_$r.log" ||
    die "tessera-bench failed (log: $out/bench_$r.log)"
  prefill=$(python3 -c 'import json, sys; print(json.load(open(sys.argv[1]))["prefill_tok_s"])' "$out/bench_$r.json")
  printf '%-6s %16.0f %16.0f %8.3f\n' "$r" "$embed" "$prefill" "$(python3 -c "print($embed / $prefill)")"
done
