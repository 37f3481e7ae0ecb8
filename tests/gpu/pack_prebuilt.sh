#!/usr/bin/env bash
# Packs a GPU build for a GPU host that cannot build Tessera itself: a machine with the CUDA
# toolkit and driver but none of Tessera's other build dependencies (Boost, ZeroMQ, spdlog,
# yaml-cpp, ICU, OpenBLAS headers). tests/gpu/run.sh unpacks the result when PREBUILT names
# it and runs the same steps without configuring or building.
#
# The archive holds, relative to its own root:
#   build/bin/…          the programs run.sh runs (test programs, tessera-bench, …)
#   build/**/*.cmake     the ctest files that list their tests (paths as recorded here)
#   lib/                 every shared library those programs link that is neither the C
#                        library, libstdc++/libgcc nor part of the CUDA driver or NCCL
#                        (libnccl is 200+ MB: the host's own is used, see run.sh)
#   fixtures/            the models the golden tests read (tiny-*, kjv-llama), less any file
#                        the checkout holds byte for byte (the bundled kjv-llama weights):
#                        a `same_as FIXTURE_FILE CHECKOUT_FILE` line says where to copy it from
#   manifest             where the build, the checkout and the fixtures lived here (ctest's
#                        files and the test programs name these absolute paths), same_as lines
#
# Usage: tests/gpu/pack_prebuilt.sh BUILD_DIR OUT.tar.xz [FIXTURES_DIR]
set -euo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
build="$(cd "${1:?usage: pack_prebuilt.sh BUILD_DIR OUT.tar.xz [FIXTURES_DIR]}" && pwd)"
archive="${2:?usage: pack_prebuilt.sh BUILD_DIR OUT.tar.xz [FIXTURES_DIR]}"
fixtures="${3:-$(grep '^TESSERA_FIXTURES_DIR:' "$build/CMakeCache.txt" | cut -d= -f2-)}"
programs=(tessera_kernels_tests tessera_worker_tests tessera-bench tessera-make-checkpoint tessera-worker tessera-perplexity
  tessera-generate)

stage="$(mktemp -d)"
trap 'rm -rf "$stage"' EXIT
mkdir -p "$stage/build/bin" "$stage/lib" "$stage/fixtures"

for p in "${programs[@]}"; do
  [ -x "$build/bin/$p" ] || { echo "pack_prebuilt: $build/bin/$p is not built" >&2; exit 1; }
  cp "$build/bin/$p" "$stage/build/bin/"
done
# ctest's files: CTestTestfile.cmake in each folder and the test lists gtest_discover_tests wrote.
(cd "$build" && find . -name CTestTestfile.cmake -o -name '*_tests*.cmake' -path './tests/*') |
  while read -r f; do mkdir -p "$stage/build/$(dirname "$f")" && cp "$build/$f" "$stage/build/$f"; done

# Libraries: what the loader resolves here, less the C library, the compiler's runtime (a
# newer one on the host serves), the CUDA driver and NCCL.
skip='^(linux-vdso|ld-linux|libc\.|libm\.|libpthread|libdl\.|librt\.|libresolv|libstdc\+\+|libgcc_s|libcuda\.|libnccl)'
for p in "${programs[@]}"; do
  ldd "$build/bin/$p" | awk '$2 == "=>" && $3 ~ /^\// { print $1, $3 }'
done | sort -u | while read -r name path; do
  [[ $name =~ $skip ]] || cp -L "$path" "$stage/lib/$name"
done

cat >"$stage/manifest" <<EOF
source=$root
build=$build
fixtures=$fixtures
commit=$(git -C "$root" rev-parse --short HEAD 2>/dev/null || echo unknown)
EOF
# The archive must travel beside the checkout within a transfer limit, so the weights the
# checkout already has are named, not packed.
if [ -d "$fixtures" ]; then
  (cd "$fixtures" && find tiny-* kjv-llama kjv-llama-draft -type f) | while read -r f; do
    mkdir -p "$stage/fixtures/$(dirname "$f")"
    twin="models/$f"
    if [ -f "$root/$twin" ] && cmp -s "$fixtures/$f" "$root/$twin"; then
      echo "same_as $f $twin" >>"$stage/manifest"
    else
      cp "$fixtures/$f" "$stage/fixtures/$f"
    fi
  done
else
  echo "pack_prebuilt: no fixtures at '$fixtures': the golden tests will skip there" >&2
fi
# Symbols are not needed to run them, and the archive must fit the transfer limit.
strip "$stage"/build/bin/* 2>/dev/null || true
strip --strip-unneeded "$stage"/lib/* 2>/dev/null || true
XZ_OPT="-T0 -9" tar -C "$stage" -cJf "$archive" .
echo "pack_prebuilt: $(du -h "$archive" | cut -f1) in $archive ($(ls "$stage/lib" | wc -l) libraries)"
