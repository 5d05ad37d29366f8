#!/usr/bin/env bash
# Runs every test of the workspace. On a fresh machine it first unpacks ptxas from the pinned
# nvidia-cuda-nvcc==13.0.88 wheel (CUDA 13.0, the GPU machine's driver) into .tools/, so that
# the ptxas test assembles every emitted PTX. Extra arguments go to `cargo test`.
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
