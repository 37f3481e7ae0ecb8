#!/usr/bin/env bash
# Collectives between CPU ranks (docs/benchmarks.md, "Collectives: shared memory and Gloo"):
#   1. all_reduce latency and bandwidth, world 2, f32 messages of 4 KB to 16 MB
#      (build/bin/communicator_bench --sweep): shared memory (ranks forked), Gloo over loopback,
#      and Gloo between two network namespaces joined by a veth pair (root and `ip netns`;
#      skipped with a note otherwise);
#   2. decode tok/s of MODEL at TP 1, TP 2 over shared memory and TP 2 over Gloo (loopback),
#      batch 1 and batch 16: tessera-generate with GEN_SHORT and with GEN_LONG new tokens, the
#      difference of the two wall times being GEN_LONG - GEN_SHORT decode steps (the load and
#      the prefill cancel); the configurations take turns in every round.
# Usage: bench/collectives_bench.sh [MODEL (default /tmp/tessera-llama-100m-bf16, made when missing)] [ROUNDS (3)]
# Environment: BUILD (build), WORK (/tmp/tessera-collectives-bench), GEN_SHORT (16), GEN_LONG (144),
#   QUICK (1: shorter all-reduce loops).
set -euo pipefail
# shellcheck source=bench/lib.sh
source "$(dirname "$0")/lib.sh"
model=${1:-/tmp/tessera-llama-100m-bf16}
rounds=${2:-3}
build=${BUILD:-build}
work=${WORK:-/tmp/tessera-collectives-bench}
short=${GEN_SHORT:-16}
long=${GEN_LONG:-144}
need_whole_numbers "ROUNDS, GEN_SHORT, GEN_LONG" "$rounds" "$short" "$long"
((long > short)) || die "GEN_LONG ($long) must be above GEN_SHORT ($short)"
need_bin "$build/bin" "$BUILD_HINT" communicator_bench tessera-generate
need_model_or_make_default "$model" "$build"
quick=()
[[ ${QUICK:-0} == 1 ]] && quick=(--quick)
mkdir -p "$work"
bench=$(cd "$build/bin" && pwd)/communicator_bench

echo "== all_reduce, world 2 =="
"$bench" --sweep shm "${quick[@]}"
rm -rf "$work/rv-lo"
"$bench" --sweep gloo --rank 1 --rendezvous "$work/rv-lo" --address 127.0.0.1 "${quick[@]}" &
"$bench" --sweep gloo --rank 0 --rendezvous "$work/rv-lo" --address 127.0.0.1 "${quick[@]}" | sed 's/^gloo /gloo-lo /'
wait
if ((EUID == 0)) && ip netns list >/dev/null 2>&1; then
  a=tcb-a-$$ b=tcb-b-$$
  cleanup() { ip netns del "$a" 2>/dev/null || true; ip netns del "$b" 2>/dev/null || true; }
  trap cleanup EXIT
  ip netns add "$a" && ip netns add "$b"
  ip -n "$a" link add eth0 type veth peer name eth0 netns "$b"
  ip -n "$a" addr add 10.214.0.1/24 dev eth0 && ip -n "$b" addr add 10.214.0.2/24 dev eth0
  for n in "$a" "$b"; do ip -n "$n" link set eth0 up && ip -n "$n" link set lo up; done
  rm -rf "$work/rv-veth"
  ip netns exec "$b" "$bench" --sweep gloo --rank 1 --rendezvous "$work/rv-veth" --address 10.214.0.2 "${quick[@]}" &
  ip netns exec "$a" "$bench" --sweep gloo --rank 0 --rendezvous "$work/rv-veth" --address 10.214.0.1 "${quick[@]}" |
    sed 's/^gloo /gloo-veth /'
  wait
else
  echo "(Gloo over a veth pair skipped: needs root and ip netns)"
fi

echo "== decode, $model =="
: >"$work/prompt16.txt"
echo "1,450,2000,31,7,99,1024,5,6,7,8,9,10,11,12,13" >"$work/prompt1.txt"
for i in $(seq 16); do echo "1,$((100 + i)),2000,31,7,99,1024,5,6,7,8,9,10,11,12,$i" >>"$work/prompt16.txt"; done
seconds() {  # CMD...: wall seconds of the command (its output discarded; a failure stops the script)
  local t0 t1
  t0=$(date +%s.%N)
  "$@" >/dev/null 2>"$work/last.err" || { cat "$work/last.err" >&2; die "failed: $*"; }
  t1=$(date +%s.%N)
  echo "$t1 - $t0" | bc -l
}
declare -A rates
configs=("tp1:--tensor-parallel 1" "tp2-shm:--tensor-parallel 2 --collectives shm" "tp2-gloo:--tensor-parallel 2 --collectives gloo")
for round in $(seq "$rounds"); do
  for batch in 1 16; do
    for entry in "${configs[@]}"; do
      name=${entry%%:*}
      read -r -a flags <<<"${entry#*:}"
      gen=("$build/bin/tessera-generate" --model "$model" --dtype bfloat16 --threads 0 --prompt-ids-file "$work/prompt$batch.txt"
           "${flags[@]}")
      t_short=$(seconds "${gen[@]}" --max-new-tokens "$short")
      t_long=$(seconds "${gen[@]}" --max-new-tokens "$long")
      rate=$(echo "$batch * ($long - $short) / ($t_long - $t_short)" | bc -l)
      rates[$name-$batch]+="$(printf '%.1f' "$rate") "
      printf 'round %d  batch %2d  %-9s %8.1f tok/s\n' "$round" "$batch" "$name" "$rate"
    done
  done
done
median() { tr ' ' '\n' | grep -v '^$' | sort -g | awk '{v[NR]=$1} END {print v[int((NR+1)/2)]}'; }
echo "== medians (tok/s) =="
for batch in 1 16; do
  line="batch $batch:"
  for entry in "${configs[@]}"; do
    name=${entry%%:*}
    line+="  $name $(median <<<"${rates[$name-$batch]}")"
  done
  echo "$line"
done
