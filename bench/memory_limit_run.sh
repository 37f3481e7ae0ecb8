#!/usr/bin/env bash
# A model served in a memory cgroup smaller than its weights (docs/benchmarks.md, "Weights
# beyond a memory budget"): tessera-generate greedy on 8 token ids, once unlimited with every
# weight resident (the reference tokens), once in a cgroup of LIMIT_BYTES with
# --weights-budget BUDGET, and once in a fresh cgroup of the same size with every weight
# resident. Prints each run's exit status, whether the budgeted run's tokens equal the
# reference's, and the most each group held (page cache included). Needs root and a memory
# cgroup (v2, or v1's memory hierarchy).
# Usage: bench/memory_limit_run.sh MODEL_DIR [BUDGET]     (default budget 25%)
# Environment: BUILD (default build), THREADS (default 2), LIMIT_BYTES (default: half the
#   checkpoint's *.safetensors bytes), STREAMING (default read: --weights-streaming).
set -euo pipefail
# shellcheck source=bench/lib.sh
source "$(dirname "$0")/lib.sh"
(($# >= 1)) || die "usage: $0 MODEL_DIR [BUDGET]"
model=$1
budget=${2:-25%}
build=${BUILD:-build}
need_bin "$build/bin" "$BUILD_HINT" tessera-generate
need_model "$model"
checkpoint_bytes=$(cat "$model"/*.safetensors | wc -c)
limit=${LIMIT_BYTES:-$((checkpoint_bytes / 2))}
[[ $limit =~ ^[1-9][0-9]*$ ]] || die "LIMIT_BYTES '$limit' is not a whole number of bytes"
work=$(mktemp -d)
groups=()
cleanup() {
  local g
  for g in "${groups[@]}"; do rmdir "$g" 2>/dev/null || true; done
  rm -rf "$work"
}
trap cleanup EXIT

generate() {  # OUT [FLAGS...]: token ids to OUT; the exit status is the command's
  local out=$1
  shift
  "$@" "$build/bin/tessera-generate" --model "$model" --dtype bfloat16 --prompt-ids 1,2,3,4,5,6,7,8 \
    --max-new-tokens 8 --threads "${THREADS:-2}" --json --weights-streaming "${STREAMING:-read}" "${extra[@]}" \
    >"$work/$out.json" 2>"$work/$out.log"
}
ids() { python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["output_ids"])' "$work/$1.json"; }

extra=()
generate reference || die "the unlimited run failed: $(tail -3 "$work/reference.log")"
echo "# $(date -u '+%Y-%m-%d %H:%M UTC'), $(uname -n); $model ($checkpoint_bytes bytes of safetensors), bf16, ${THREADS:-2} threads; cgroup limit $limit bytes"
echo "unlimited, every weight resident: exit 0, tokens $(ids reference)"

make_memory_cgroup "$limit" "tessera-memory-limit-$$-budget"
groups+=("$MEMORY_CGROUP")
extra=(--weights-budget "$budget")
status=0
generate budgeted in_memory_cgroup || status=$?
same="no"
[[ $status == 0 && $(ids budgeted) == "$(ids reference)" ]] && same="yes"
echo "in the cgroup, --weights-budget $budget (${STREAMING:-read}): exit $status, the same tokens: $same, the group's peak $(memory_cgroup_peak) bytes"

make_memory_cgroup "$limit" "tessera-memory-limit-$$-all"
groups+=("$MEMORY_CGROUP")
extra=()
status=0
generate resident in_memory_cgroup || status=$?
echo "in the cgroup, every weight resident: exit $status$( ((status == 137)) && echo " (killed)"), the group's peak $(memory_cgroup_peak) bytes"
