#!/usr/bin/env bash
# Everything that needs a GPU, in one script: build (Release, CUDA on, benchmarks on), every
# CUDA op test against the CPU backend, the NCCL communicator tests, the fixture golden tests
# on the CUDA backend, and the GPU benchmark (tessera-bench on generated ~1B Llama- and
# BLOOM-shaped f16 models). Each step runs
# under `timeout`, and no step gets more than what is left of a total budget, so the whole
# script ends within BUDGET_S seconds (default 450: under 8 minutes on one H200 with 16
# cores, margin included). Without a GPU it still runs: the GPU tests report SKIPPED and
# the benchmark is not run; the summary says so.
#
# Usage: tests/gpu/run.sh
#   OUT=dir        results: summary.txt, one log per step, JUnit XML, bench.jsonl (gpu-results)
#   BUILD_DIR=dir  build folder (build-gpu under the checkout)
#   JOBS=n         build and test parallelism (nproc)
#   CUDA_ARCHS=90  CUDA architectures (default: the GPU's own, else the project default 80;90)
#   TESSERA_FIXTURES=dir  reference fixtures (default ../shared/fixtures beside the checkout)
#   BENCH_LLAMA=dir, BENCH_BLOOM=dir  benchmark checkpoints, generated once (/tmp/tessera-*-1b)
#   BUDGET_S=seconds      total time budget (450)
# Exit status: 0 when every step passed (or, without a GPU, everything GPU was skipped).
set -uo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
out="${OUT:-gpu-results}"
mkdir -p "$out" && out="$(cd "$out" && pwd)"
build="${BUILD_DIR:-$root/build-gpu}"
jobs="${JOBS:-$(nproc)}"
budget="${BUDGET_S:-450}"
summary="$out/summary.txt"
start=$(date +%s)
failed=0
: >"$summary"

log() { echo "$*" | tee -a "$summary"; }
left() { echo $((budget - ($(date +%s) - start))); }

# run_step NAME LIMIT CMD...: at most LIMIT seconds (and never past the budget); output in
# $out/NAME.log; one summary line.
run_step() {
  local name=$1 limit=$2
  shift 2
  local remaining
  remaining=$(left)
  if ((remaining < 10)); then
    log "$name: NOT RUN (the ${budget}s budget is spent)"
    failed=1
    return 124
  fi
  ((limit > remaining)) && limit=$remaining
  local t0 rc
  t0=$(date +%s)
  timeout --kill-after=5 "$limit" "$@" >"$out/$name.log" 2>&1
  rc=$?
  local dt=$(($(date +%s) - t0))
  if ((rc == 124 || rc == 137)); then
    log "$name: TIMEOUT after ${limit}s (log: $name.log)"
    failed=1
  elif ((rc != 0)); then
    log "$name: FAILED (exit $rc, ${dt}s; log: $name.log)"
    failed=1
  else
    log "$name: ok (${dt}s)"
  fi
  return $rc
}

# "N passed, N failed, N skipped of N" from a ctest log.
ctest_counts() {
  local logf=$1 total failed_n skipped passed
  total=$(grep -Eo 'tests failed out of [0-9]+' "$logf" | grep -Eo '[0-9]+$' | tail -1)
  failed_n=$(grep -Eo '[0-9]+ tests failed out of' "$logf" | grep -Eo '^[0-9]+' | tail -1)
  skipped=$(grep -c '(Skipped)' "$logf")
  if [ -z "$total" ]; then
    echo "no test results (see the log)"
    return
  fi
  passed=$((total - failed_n - skipped))
  echo "$passed passed, $failed_n failed, $skipped skipped of $total"
}

# ---- the machine ------------------------------------------------------------------------------
gpu=""
if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; then
  gpu=$(nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | head -1)
fi
log "tessera GPU run, $(date -u +%Y-%m-%dT%H:%M:%SZ), commit $(git -C "$root" rev-parse --short HEAD 2>/dev/null || echo unknown)"
log "host: $(nproc) cores; GPU: ${gpu:-none (GPU tests will report SKIPPED)}"
if ! command -v nvcc >/dev/null 2>&1 && [ ! -x /usr/local/cuda/bin/nvcc ]; then
  log "nvcc: not found (the CUDA backend cannot be built; configure with TESSERA_CUDA=ON will fail)"
fi
archs="${CUDA_ARCHS:-}"
if [ -z "$archs" ] && [ -n "$gpu" ]; then
  archs=$(nvidia-smi --query-gpu=compute_cap --format=csv,noheader | head -1 | tr -d '. ')
fi

# ---- build ------------------------------------------------------------------------------------
cfg=(-S "$root" -B "$build" -DCMAKE_BUILD_TYPE=Release -DTESSERA_CUDA=ON -DTESSERA_BUILD_TESTS=ON
     -DTESSERA_BUILD_BENCH=ON)
[ -n "$archs" ] && cfg+=("-DCMAKE_CUDA_ARCHITECTURES=$archs")
run_step configure 90 cmake "${cfg[@]}" || { log "overall: FAIL (configure)"; exit 1; }
run_step build 300 cmake --build "$build" -j "$jobs" --target tessera_kernels_tests tessera_worker_tests \
  tessera-bench tessera-make-checkpoint || { log "overall: FAIL (build)"; exit 1; }

# ---- tests ------------------------------------------------------------------------------------
# CUDA op tests: tests/kernels/cuda_backend_test.cc, cuda_linear_int8_test.cc and cuda_linear_int4_test.cc (CudaBackendTest.*, CudaBackendSelection.*; the int8 and 4-bit kernels against the CPU ones).
run_step cuda_op_tests 120 ctest --test-dir "$build" -R '^(CudaBackend|Nccl)' -j "$jobs" --timeout 110 \
  --output-on-failure --output-junit "$out/cuda_op_tests.xml"
log "  cuda op tests: $(ctest_counts "$out/cuda_op_tests.log")"
# The fixture goldens on the CUDA backend: tests/worker/golden_test.cc, FixturesCuda/*.
run_step cuda_golden_tests 150 ctest --test-dir "$build" -R '^FixturesCuda/' -j "$jobs" --timeout 140 \
  --output-on-failure --output-junit "$out/cuda_golden_tests.xml"
log "  cuda golden tests: $(ctest_counts "$out/cuda_golden_tests.log")"
grep -h 'REPORT' "$out/cuda_golden_tests.log" 2>/dev/null | sed 's/^/    /' >>"$summary"

# ---- benchmark --------------------------------------------------------------------------------
# The issue's GPU benchmark: a generated ~1.1B Llama (TinyLlama's shape: GQA 32/4 heads) and a
# ~1.3B BLOOM-shaped model, f16 weights: batch-1 decode (latency per token, and weight bandwidth
# as a fraction of the device's peak: tessera-bench's roofline_fraction on the CUDA backend),
# throughput at batch 32 and 128, prefill tokens/s, kernel injection on vs. off.
json_field() { grep -o "\"$2\": *[0-9.eE+-]*" <<<"$1" | head -1 | sed 's/.*: *//'; }
bench_case() {  # NAME MODEL BATCH GEN [extra flags]
  local name=$1 model=$2 batch=$3 gen=$4
  shift 4
  if run_step "bench_$name" 60 "$build/bin/tessera-bench" --backend cuda --model "$model" --dtype float16 \
    --prompt-len 128 --gen-len "$gen" --batch "$batch" --json "$@"; then
    local line
    line=$(grep '^{' "$out/bench_$name.log" | tail -1)
    echo "{\"case\": \"$name\", \"batch\": $batch, \"result\": $line}" >>"$out/bench.jsonl"
    log "  $name: decode $(json_field "$line" decode_tok_s) tok/s, prefill $(json_field "$line" prefill_tok_s) tok/s," \
        "roofline $(json_field "$line" roofline_fraction) of $(json_field "$line" bandwidth_gb_s) GB/s"
    eval "decode_$name=$(json_field "$line" decode_tok_s)"
  fi
}
ratio() { awk -v a="${1:-0}" -v b="${2:-0}" 'BEGIN { if (b > 0) printf "%.2f", a / b; else print "n/a" }'; }
if [ -z "$gpu" ]; then
  log "bench: SKIPPED: no CUDA device"
else
  llama="${BENCH_LLAMA:-/tmp/tessera-llama-1b}"
  bloom="${BENCH_BLOOM:-/tmp/tessera-bloom-1b}"
  [ -f "$llama/config.json" ] || run_step make_llama_1b 90 "$build/bin/tessera-make-checkpoint" --arch llama \
    --hidden 2048 --layers 22 --heads 32 --kv-heads 4 --ffn 5632 --vocab 32000 --dtype float16 --out "$llama"
  [ -f "$bloom/config.json" ] || run_step make_bloom_1b 90 "$build/bin/tessera-make-checkpoint" --arch bloom \
    --hidden 2048 --layers 24 --heads 16 --ffn 8192 --vocab 50304 --dtype float16 --out "$bloom"
  : >"$out/bench.jsonl"
  bench_case llama_b1 "$llama" 1 64
  bench_case llama_b1_plain "$llama" 1 64 --no-kernel-inject
  bench_case llama_b32 "$llama" 32 32
  bench_case llama_b128 "$llama" 128 16
  bench_case bloom_b1 "$bloom" 1 64
  bench_case bloom_b1_plain "$bloom" 1 64 --no-kernel-inject
  bench_case bloom_b32 "$bloom" 32 32
  log "  injected / plain decode, batch 1: llama $(ratio "${decode_llama_b1:-}" "${decode_llama_b1_plain:-}")x," \
      "bloom $(ratio "${decode_bloom_b1:-}" "${decode_bloom_b1_plain:-}")x (target >= 2x)"
  log "  batch-1 latency per token: llama $(awk -v d="${decode_llama_b1:-0}" 'BEGIN { if (d > 0) printf "%.2f ms", 1000 / d; else print "n/a" }')," \
      "bloom $(awk -v d="${decode_bloom_b1:-0}" 'BEGIN { if (d > 0) printf "%.2f ms", 1000 / d; else print "n/a" }')"
fi

# ---- verdict ----------------------------------------------------------------------------------
elapsed=$(($(date +%s) - start))
if ((failed)); then
  log "overall: FAIL (${elapsed}s)"
  exit 1
fi
if [ -z "$gpu" ]; then
  log "overall: SKIPPED (no GPU: the build passed, every GPU test reported SKIPPED) (${elapsed}s)"
else
  log "overall: PASS (${elapsed}s)"
fi
exit 0
