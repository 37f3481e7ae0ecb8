# Shared by the bench/*.sh scripts (sourced, not run): refusing missing inputs in one line,
# and starting / stopping a tessera-serve on a free port.
# shellcheck shell=bash

die() {  # MESSAGE...: prints "SCRIPT: MESSAGE" on stderr and exits 2
  echo "$(basename "$0"): $*" >&2
  exit 2
}

need_bin() {  # DIR HINT NAME...: each DIR/NAME must be an executable; HINT says how to get one (NAME in it: the name)
  local dir=$1 hint=$2 name
  shift 2
  for name in "$@"; do
    [[ -x $dir/$name ]] || die "no executable $dir/$name (${hint//NAME/$name})"
  done
}
# shellcheck disable=SC2034  # used by the scripts that source this file
BUILD_HINT="build it with cmake --build build --target NAME, or set BUILD to the build folder"

need_model() {  # DIR: a Hugging Face checkpoint folder
  [[ -f $1/config.json ]] || die "no checkpoint at $1 (no config.json; bench/make_models.sh makes the ones docs/benchmarks.md uses)"
}

# MODEL BUILD: need_model, after making bench/make_models.sh's ~100M bf16 Llama with BUILD's
# programs when MODEL is that model's default path and it is not there yet.
need_model_or_make_default() {
  if [[ $1 == /tmp/tessera-llama-100m-bf16 && ! -f $1/config.json ]]; then
    BUILD=$2 "$(dirname "$0")/make_models.sh" /tmp 100m-bf16 >/dev/null
  fi
  need_model "$1"
}

need_whole_numbers() {  # NAMES VALUE...: each VALUE a positive whole number; NAMES: the settings they come from
  local names=$1 n
  shift
  for n in "$@"; do
    [[ $n =~ ^[1-9][0-9]*$ ]] || die "'$n' is not a positive whole number ($names)"
  done
}

# tessera-serve on a free port, logging to DIR/serve.log; sets SERVE_PID and SERVE_PORT.
# Usage: start_tessera_serve BIN_DIR DIR [tessera-serve flags...]
SERVE_PID=""
SERVE_PORT=""
start_tessera_serve() {
  local bin=$1 dir=$2
  shift 2
  mkdir -p "$dir"
  "$bin/tessera-serve" --port 0 --set "server.control=ipc://$dir/control.ipc" \
    --set "server.zmq_client=ipc://$dir/client.ipc" "$@" >"$dir/serve.log" 2>&1 &
  SERVE_PID=$!
  for _ in $(seq 600); do
    SERVE_PORT=$(grep -oP 'listening on http://127\.0\.0\.1:\K[0-9]+' "$dir/serve.log" || true)
    [[ -n $SERVE_PORT ]] && return 0
    kill -0 "$SERVE_PID" 2>/dev/null || { cat "$dir/serve.log" >&2; return 1; }
    sleep 0.2
  done
  echo "tessera-serve did not start within 120 s (log: $dir/serve.log)" >&2
  return 1
}

stop_pid() {  # PID: SIGTERM and wait (an already finished process is fine)
  [[ -n ${1:-} ]] || return 0
  if kill -TERM "$1" 2>/dev/null; then wait "$1" 2>/dev/null || true; fi
}

# kjv-llama padded to 32 layers and FFN 8192 in bf16 (309 MB, the same logits: models.md), the
# speculative-decoding benchmarks' target; made once.
# Usage: make_padded_kjv_llama BIN_DIR KJV_DIR OUT_DIR
drop_cached_files() {  # FILE...: each dropped from the page cache (written back first)
  python3 - "$@" <<'PY'
import os, sys
for path in sys.argv[1:]:
    fd = os.open(path, os.O_RDONLY)
    os.fdatasync(fd)
    os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    os.close(fd)
PY
}
reread_files() {  # FILE...: each dropped from the page cache, then read once
  # A file just written (bench/make_models.sh, llama.cpp's converter) sits in the page cache on
  # small pages, and a process mapping it runs slower than on the 2 MiB pages of a file read
  # from the disk (worker/checkpoint_huge_pages.h). Read back from the disk here, every start
  # finds it as a file downloaded earlier is held.
  local f
  drop_cached_files "$@"
  for f in "$@"; do cat "$f" >/dev/null; done
}

reread_model_files() {  # DIR: its *.safetensors, as reread_files
  reread_files "$1"/*.safetensors
}

make_padded_kjv_llama() {
  [[ -f $3/config.json ]] || "$1/tessera-make-checkpoint" --pad-from "$2" --out "$3" \
    --layers 32 --ffn 8192 --dtype bfloat16 >/dev/null
}

# A memory cgroup of LIMIT bytes, no swap (root; cgroup v2's memory.max where the unified
# hierarchy has the memory controller, else v1's memory hierarchy); sets MEMORY_CGROUP. The
# caller removes it (rmdir) once the processes run in it have ended.
# Usage: make_memory_cgroup LIMIT NAME
MEMORY_CGROUP=""
make_memory_cgroup() {
  local limit=$1 name=$2
  if grep -qw memory /sys/fs/cgroup/cgroup.controllers 2>/dev/null; then
    echo +memory >/sys/fs/cgroup/cgroup.subtree_control 2>/dev/null || true
    MEMORY_CGROUP=/sys/fs/cgroup/$name
    if ! { mkdir "$MEMORY_CGROUP" && echo "$limit" >"$MEMORY_CGROUP/memory.max" &&
      echo 0 >"$MEMORY_CGROUP/memory.swap.max"; }; then
      die "cannot make a memory cgroup of $limit bytes under /sys/fs/cgroup (run as root)"
    fi
  else
    MEMORY_CGROUP=/sys/fs/cgroup/memory/$name
    if ! { mkdir "$MEMORY_CGROUP" && echo "$limit" >"$MEMORY_CGROUP/memory.limit_in_bytes"; }; then
      die "cannot make a memory cgroup of $limit bytes under /sys/fs/cgroup/memory (run as root)"
    fi
  fi
}

in_memory_cgroup() {  # COMMAND...: runs it inside MEMORY_CGROUP
  sh -c 'echo $$ >"$0/cgroup.procs" && exec "$@"' "$MEMORY_CGROUP" "$@"
}

memory_cgroup_peak() {  # the most MEMORY_CGROUP has held, page cache included (bytes)
  cat "$MEMORY_CGROUP/memory.peak" 2>/dev/null || cat "$MEMORY_CGROUP/memory.max_usage_in_bytes"
}
