#!/usr/bin/env bash
# Unpacks the pieces of the CUDA 13.0 toolkit that candle's `cuda` feature builds with (nvcc,
# cicc, the runtime's and CCCL's headers) from NVIDIA's pinned pip wheels into .tools/, where no
# toolkit is installed, and exports what candle's build looks for. Source it:
#   source scripts/cuda-toolkit.sh && cargo test -p tessera-candle --features cuda
# No GPU is needed to build: CUDA_COMPUTE_CAP names the target (90, Hopper).
tessera_root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
tessera_cuda="$tessera_root/.tools/nvidia/cu13"
if ! command -v nvcc >/dev/null && { [ ! -x "$tessera_cuda/bin/nvcc" ] || [ ! -x "$tessera_cuda/nvvm/bin/cicc" ]; }; then
  echo "installing nvcc, cicc and the CUDA 13.0 headers from NVIDIA's wheels into .tools/"
  tessera_tmp=$(mktemp -d)
  python3 -m pip download --quiet --no-deps --only-binary=:all: --platform manylinux2014_x86_64 -d "$tessera_tmp" \
    nvidia-cuda-nvcc==13.0.88 nvidia-nvvm==13.0.88 nvidia-cuda-crt==13.0.88 nvidia-cuda-runtime==13.0.96 \
    nvidia-cuda-cccl==13.0.85 || return 1
  for w in "$tessera_tmp"/*.whl; do
    python3 -c 'import sys, zipfile; zipfile.ZipFile(sys.argv[1]).extractall(sys.argv[2])' "$w" "$tessera_root/.tools" || return 1
  done
  chmod +x "$tessera_cuda"/bin/* "$tessera_cuda"/nvvm/bin/*
  rm -rf "$tessera_tmp"
fi
if ! command -v nvcc >/dev/null; then
  export PATH="$tessera_cuda/bin:$PATH" CUDA_ROOT="$tessera_cuda" CUDA_PATH="$tessera_cuda"
fi
export CUDA_COMPUTE_CAP="${CUDA_COMPUTE_CAP:-90}"
