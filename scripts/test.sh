#!/usr/bin/env bash
# Runs every test of the workspace. On a fresh machine it first unpacks ptxas from the pinned
# nvidia-cuda-nvcc==13.0.88 wheel (CUDA 13.0, the GPU machine's driver) into .tools/, so that
# the ptxas test assembles every emitted PTX. Extra arguments go to `cargo test`. Then the CUDA
# side of tessera-candle is linted (candle's `cuda` feature, its kernels left uncompiled;
# scripts/cuda-toolkit.sh unpacks nvcc and CUDA's headers from NVIDIA's wheels where none is
# installed; its tests run where there is a GPU). TESSERA_SKIP_CANDLE_CUDA=1 skips that build.
set -euo pipefail
cd "$(dirname "$0")/.."
ptxas=.tools/nvidia/cu13/bin/ptxas
if [ -z "${TESSERA_PTXAS:-}" ] && ! command -v ptxas >/dev/null && [ ! -x "$ptxas" ]; then
  echo "installing ptxas from nvidia-cuda-nvcc==13.0.88 into .tools/"
  tmp=$(mktemp -d)
  python3 -m pip download --quiet --no-deps --only-binary=:all: --platform manylinux2014_x86_64 -d "$tmp" nvidia-cuda-nvcc==13.0.88
  mkdir -p .tools
  python3 -c 'import sys, zipfile; zipfile.ZipFile(sys.argv[1]).extract("nvidia/cu13/bin/ptxas", ".tools")' "$tmp"/nvidia_cuda_nvcc-13.0.88-*.whl
  chmod +x "$ptxas"
  rm -rf "$tmp"
fi
cargo test --workspace "$@"
if [ -z "${TESSERA_SKIP_CANDLE_CUDA:-}" ]; then
  source scripts/cuda-toolkit.sh
  # Linted here, never run: candle's kernels are not compiled (scripts/nvcc-lint-only.sh gives
  # their build empty outputs; they are compiled for real by the GPU commands in the README).
  NVCC="$PWD/scripts/nvcc-lint-only.sh" cargo clippy -p tessera-candle --all-targets --features cuda -- -D warnings
  for ptx in "${CARGO_TARGET_DIR:-target}"/debug/build/candle-kernels-*/out/affine.ptx; do
    if grep -qs nvcc-lint-only "$ptx"; then rm -f "$(dirname "$ptx")/.cudaforge_cache.json"; fi
  done
fi
