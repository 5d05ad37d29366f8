#!/usr/bin/env bash
# On the GPU machine: builds mamba-ssm's selective scan CUDA kernels, forward and backward (the
# baselines of the bench's `selective_scan` rows) with the machine's nvcc and PyTorch's c10 headers, and runs
# it at the bench's shape. Usage: bash scripts/mamba-selective-scan.sh <mamba_src> [batch dim len
# d_state]. `mamba_src` is the mamba-ssm 2.3.1 sdist unpacked (`scripts/fetch-baselines.sh`).
set -euo pipefail
src="$1"; shift
torch="$(python3 -c 'import torch, os; print(os.path.dirname(torch.__file__))')"
out="${TMPDIR:-/tmp}/mamba_selective_scan"
cu="$(dirname "$0")/../benches/mamba_selective_scan.cu"
# Built once a machine (the bench calls this at several shapes).
if [ ! -x "$out" ] || [ "$cu" -nt "$out" ]; then
nvcc -O3 -std=c++17 -arch=sm_90a --use_fast_math --expt-relaxed-constexpr --expt-extended-lambda \
  -U__CUDA_NO_HALF_OPERATORS__ -U__CUDA_NO_HALF_CONVERSIONS__ -U__CUDA_NO_BFLOAT16_OPERATORS__ \
  -U__CUDA_NO_BFLOAT16_CONVERSIONS__ -U__CUDA_NO_BFLOAT162_OPERATORS__ -U__CUDA_NO_BFLOAT162_CONVERSIONS__ \
  -I "$src/csrc/selective_scan" -I "$torch/include" -L "$torch/lib" -lc10 -lc10_cuda -Xlinker -rpath="$torch/lib" \
  "$cu" -o "$out"
fi
"$out" "$@"
