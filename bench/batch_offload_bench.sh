#!/usr/bin/env bash
# Offline batches with weights streamed beyond a budget against every weight resident
# (docs/benchmarks.md, "Offline batches beyond a memory budget"): tessera-batch on BATCH
# token-id completions at once (scheduler.max_num_seqs BATCH, --max-in-flight BATCH), once
# with every weight resident and once with model.weights_memory_budget BUDGET, back to back in
# each round. Prints each run's completion tokens/s, the streamed / resident ratio, and the
# bound the streamed run is held to: min(the resident run's rate, read bandwidth ÷ the bytes a
# step streams × BATCH tokens a step). The bandwidth is that of reading the checkpoint's files
# from the page cache (dd, warm) for map and read, which map or copy (pread) the layers from
# the checkpoint where it holds them as computed, else from the spill file written at
# start-up, through the page cache: page-cache-warm runs; and the disk's (dd iflag=direct)
# for direct, which reads the same with O_DIRECT every step: the cold-read case.
# Usage: bench/batch_offload_bench.sh MODEL_DIR [BUDGET] [ROUNDS] [BATCH...]
#   defaults: budget 25%, 1 round, batches 32 and 128.
# Environment: BUILD (default build), PROMPT_LEN (default 16), GEN_LEN (default 32),
#   THREADS (default 2), LIMIT_BYTES (default none: the page-cache-warm case): the streamed
#   run goes into a memory cgroup of that many bytes (root; cgroup v2 or v1's memory
#   hierarchy), where the spill file's pages cannot all stay cached, so it reads them from the
#   disk — the cold case; every bandwidth is then the disk's. STEP_TOKENS
#   (scheduler.max_num_batched_tokens; default: the config's 4096, or 512 with LIMIT_BYTES,
#   whose steps' activations must fit beside the weights and the KV pool: a 4096-token step of
#   the ~1.1B model plans 829 MiB of them at batch 128).
#   STREAMING (default read): model.weights_streaming, or several ("map read direct"), each
#   run streamed after the same resident run; PREFETCH (default 2): weights_prefetch_layers.
set -euo pipefail
# shellcheck source=bench/lib.sh
source "$(dirname "$0")/lib.sh"
(($# >= 1)) || die "usage: $0 MODEL_DIR [BUDGET] [ROUNDS] [BATCH...]"
model=$1
budget=${2:-25%}
rounds=${3:-1}
shift $(($# < 3 ? $# : 3))
batches=("$@")
((${#batches[@]})) || batches=(32 128)
build=${BUILD:-build}
prompt_len=${PROMPT_LEN:-16}
gen_len=${GEN_LEN:-32}
threads=${THREADS:-2}
read -ra streamings <<<"${STREAMING:-read}"
prefetch=${PREFETCH:-2}
for s in "${streamings[@]}"; do
  [[ $s =~ ^(map|read|direct)$ ]] || die "STREAMING '$s' is not map, read or direct"
done
need_whole_numbers "ROUNDS, BATCH, PROMPT_LEN, GEN_LEN, THREADS" "$rounds" "$prompt_len" "$gen_len" "$threads" "$prefetch" "${batches[@]}"
need_bin "$build/bin" "$BUILD_HINT" tessera-batch
need_model "$model"
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

# Read bandwidth (GB/s) of the checkpoint's files: from the page cache (each read once to warm
# it, then timed by dd) or from the disk (dd iflag=direct).
limit=${LIMIT_BYTES:-}
[[ -z $limit || $limit =~ ^[1-9][0-9]*$ ]] || die "LIMIT_BYTES '$limit' is not a whole number of bytes"
step_tokens=${STEP_TOKENS:-$([[ -n $limit ]] && echo 512 || echo 4096)}
need_whole_numbers "STEP_TOKENS" "$step_tokens"
read_bandwidth() {  # cache|disk
  local f line bytes=0 seconds=0
  for f in "$model"/*.safetensors; do
    if [[ $1 == disk ]]; then
      line=$(LC_ALL=C dd if="$f" of=/dev/null bs=4M iflag=direct 2>&1 | tail -1)
    else
      dd if="$f" of=/dev/null bs=1M status=none
      line=$(LC_ALL=C dd if="$f" of=/dev/null bs=1M 2>&1 | tail -1)  # "N bytes (...) copied, T s, R GB/s"
    fi
    bytes=$((bytes + ${line%% *}))
    seconds=$(echo "$seconds + $(echo "$line" | sed 's/.* copied, \([0-9.]*\) s,.*/\1/')" | bc -l)
  done
  echo "$bytes / $seconds / 1000000000" | bc -l
}
disk_bandwidth=$(read_bandwidth disk)
cache_bandwidth=$disk_bandwidth
[[ -n $limit ]] || cache_bandwidth=$(read_bandwidth cache)

if [[ -n $limit ]]; then
  make_memory_cgroup "$limit" "tessera-offload-bench-$$"
  trap 'rm -rf "$work"; rmdir "$MEMORY_CGROUP" 2>/dev/null || true' EXIT
fi

requests() {  # BATCH: BATCH token-id completions of PROMPT_LEN tokens, GEN_LEN generated each
  local i
  for ((i = 0; i < $1; i++)); do
    printf '{"custom_id":"r%d","method":"POST","url":"/v1/completions","body":{"prompt":[%s],"max_tokens":%d,"ignore_eos":true,"temperature":0}}\n' \
      "$i" "$(seq -s, $((100 + i)) $((100 + i + prompt_len - 1)))" "$gen_len"
  done
}
run() {  # BATCH BUDGET [STREAMING]: writes "TOKENS_PER_S STREAMED_BYTES" to $work/result
  local log="$work/log" rate streamed
  requests "$1" >"$work/in.jsonl"
  local inside=()
  # The cold case: the streamed run inside the memory cgroup (the resident one cannot fit it).
  if [[ -n $MEMORY_CGROUP && $2 != all ]]; then
    inside=(in_memory_cgroup)
    # Each streamed run starts cold, as a fresh container would: the pages the run before left
    # in the group's page cache (map's, still active) are not this run's to count against it.
    drop_cached_files "$model"/*.safetensors
  fi
  "${inside[@]}" "$build/bin/tessera-batch" "$work/in.jsonl" "$work/out.jsonl" --model "$model" --dtype bfloat16 \
    --threads "$threads" --max-in-flight "$1" --progress-s 0 --set "scheduler.max_num_seqs=$1" --set "scheduler.max_num_batched_tokens=$step_tokens" \
    --set "model.weights_memory_budget=$2" --set "model.weights_streaming=${3:-read}" \
    --set "model.weights_prefetch_layers=$prefetch" >"$work/summary" 2>"$log" ||
    die "tessera-batch failed (batch $1, budget $2): $(tail -3 "$log")"
  grep -q ' completed, 0 failed;' "$work/summary" ||
    die "requests failed (batch $1, budget $2, ${3:-read}): $(cat "$work/summary"); $(grep -v ' info ' "$log" | tail -5)"
  rate=$(sed -n 's/.* and \([0-9]*\) completion tokens in \([0-9.e+-]*\) s$/\1 \2/p' "$work/summary" | awk '{printf "%.2f", $1 / $2}')
  # The worker's plan line: "weights: budget ...; streamed N.N MiB per step (...)".
  streamed=$(sed -n 's/.*weights: budget .*; streamed \([0-9.]*\) MiB per step.*/\1/p' "$log" | head -1)
  echo "$rate $(echo "${streamed:-0} * 1048576" | bc -l)" >"$work/result"
}
case_name="page-cache read $(printf %.1f "$cache_bandwidth") GB/s"
[[ -n $limit ]] && case_name="streamed run in a memory cgroup of $limit bytes"
echo "# $(date -u '+%Y-%m-%d %H:%M UTC'), $(uname -n); $model, bf16, budget $budget, prompt $prompt_len, $gen_len generated, $threads threads, $prefetch in flight, steps of at most $step_tokens tokens; $case_name; disk read (O_DIRECT) $(printf %.1f "$disk_bandwidth") GB/s"
for _ in $(seq "$rounds"); do
  for b in "${batches[@]}"; do
    run "$b" all  # not in a subshell: a failure stops the script
    read -r resident _ <"$work/result"
    for s in "${streamings[@]}"; do
      run "$b" "$budget" "$s"
      read -r streamed bytes <"$work/result"
      [[ $(echo "$bytes > 0" | bc) == 1 ]] || die "no streamed bytes in the plan of the batch-$b run at budget $budget"
      bandwidth=$cache_bandwidth
      [[ $s == direct ]] && bandwidth=$disk_bandwidth
      bound=$(echo "r = $resident; s = $bandwidth * 1000000000 / $bytes * $b; if (s < r) s else r" | bc -l)
      printf 'batch %4d: resident %8.2f tok/s, streamed (%s) %8.2f tok/s (%.2fx), %.2f GB a step; bound %.2f tok/s, streamed at %.0f%% of it\n' \
        "$b" "$resident" "$s" "$streamed" "$(echo "$streamed / $resident" | bc -l)" "$(echo "$bytes / 1000000000" | bc -l)" \
        "$bound" "$(echo "100 * $streamed / $bound" | bc -l)"
    done
  done
done
