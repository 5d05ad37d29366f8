#!/usr/bin/env bash
# An `nvcc` for scripts/test.sh's lint of tessera-candle's CUDA side (`NVCC=` this script): the
# lint type-checks Tessera's code against candle's `cuda` API and never runs candle's kernels,
# so their compilation (nine minutes of CI's two cores, most of the CUDA step) is replaced by
# empty outputs of the kinds candle-kernels' build script asks for — a PTX file per source
# (`--ptx --output-directory D`), an empty object (`-c -o F`), a static library of objects
# (`--lib -o F`). Anything else (`--version`) goes to the real nvcc on PATH. Cargo reruns the
# build script when NVCC changes; scripts/test.sh then deletes the build's record of what it
# compiled (`.cudaforge_cache.json`), so that a real build afterwards compiles the kernels.
set -euo pipefail
args=("$@") mode="" out="" dir="" sources=() objects=()
while [ $# -gt 0 ]; do
  case "$1" in
    --ptx) mode=ptx ;;
    -c) mode=obj ;;
    --lib) mode=lib ;;
    -o) out="$2"; shift ;;
    --output-directory) dir="$2"; shift ;;
    *.cu) sources+=("$1") ;;
    *.o) objects+=("$1") ;;
  esac
  shift
done
case "$mode" in
  ptx)
    for s in "${sources[@]}"; do
      name="$(basename "${s%.cu}").ptx"
      printf '// nvcc-lint-only\n.version 8.0\n.target sm_90\n.address_size 64\n' > "${dir:-.}/$name"
    done ;;
  obj) cc -c -x c /dev/null -o "$out" ;;
  lib) rm -f "$out" && ar rcs "$out" "${objects[@]}" ;;
  *) exec nvcc "${args[@]}" ;;
esac
