#!/usr/bin/env bash
# Runs every test of the workspace. On a fresh machine it first unpacks ptxas from the pinned
# nvidia-cuda-nvcc==13.0.88 wheel (CUDA 13.0, the GPU machine's driver) into .tools/, so that
# the ptxas test assembles every emitted PTX. Extra arguments go to `cargo test`. Then the CUDA
# side of tessera-candle is built and linted (candle's `cuda` feature, whose kernels nvcc
# compiles: scripts/cuda-toolkit.sh unpacks it from NVIDIA's wheels where none is installed;
# its tests run where there is a GPU). TESSERA_SKIP_CANDLE_CUDA=1 skips that build.
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
  # Built and linted here, never run: candle's kernels compiled without device optimization
  # (cicc and ptxas at -O0) build in half the time. A debug build with `--features cuda`
  # afterwards reuses them; release builds (the GPU commands below in the README) do not.
  NVCC_APPEND_FLAGS="${NVCC_APPEND_FLAGS:-} -Xptxas -O0 -Xcicc -O0" cargo clippy -p tessera-candle --all-targets --features cuda -- -D warnings
fi
