#!/usr/bin/env bash
# Unpacks the pieces of the CUDA 13.0 toolkit that candle's `cuda` feature builds with (nvcc,
# cicc, the runtime's and CCCL's headers) from NVIDIA's pinned pip wheels into .tools/, where no
# toolkit is installed, and exports what candle's build looks for. Source it:
#   source scripts/cuda-toolkit.sh && cargo test -p tessera-candle --features cuda
# No GPU is needed to build: CUDA_COMPUTE_CAP names the target (90, Hopper). Where the machine
# has no CUDA libraries to link against (no driver, no cuBLAS, no NCCL), it writes link stubs into
# .tools/ — empty functions under the real libraries' names and sonames, generated from
# cudarc's bindings — so that test binaries link here; they load the real libraries on the
# GPU machine (LD_LIBRARY_PATH=/usr/local/cuda/lib64 there).
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

tessera_lib="$tessera_cuda/lib"
if ! ldconfig -p 2>/dev/null | grep -q 'libcuda\.so ' && [ ! -e "$tessera_lib/libcuda.so" ] && [ -d "$tessera_lib" ]; then
  tessera_cudarc=$(cd "$tessera_root" && cargo metadata --format-version 1 2>/dev/null |
    python3 -c 'import sys, json; print(next(p["manifest_path"] for p in json.load(sys.stdin)["packages"] if p["name"] == "cudarc"))' 2>/dev/null || true)
  if [ -n "$tessera_cudarc" ]; then
    echo "writing CUDA link stubs into ${tessera_lib#"$tessera_root"/}"
    tessera_src=$(dirname "$tessera_cudarc")/src
    # name, soname, bindings, which of their functions
    while read -r lib soname sys pattern; do
      grep -ohE "^\s+fn ${pattern}\(" "$tessera_src/$sys/sys/mod.rs" | sed -E 's/^\s+fn (\w+)\(/void \1(void) {}/' | sort -u > "$tessera_lib/stub_$lib.c"
      cc -shared -fPIC -o "$tessera_lib/lib$lib.so" -Wl,-soname,"$soname" "$tessera_lib/stub_$lib.c" || return 1
      rm -f "$tessera_lib/stub_$lib.c"
    done <<'STUBS'
cuda libcuda.so.1 driver cu[A-Z]\w*
nvrtc libnvrtc.so.13 nvrtc nvrtc\w*
curand libcurand.so.10 curand curand\w*
cublas libcublas.so.13 cublas cublas\w*
cublasLt libcublasLt.so.13 cublaslt cublasLt\w*
nccl libnccl.so.2 nccl nccl\w*
STUBS
    ln -sf libcudart.so.13 "$tessera_lib/libcudart.so"
  fi
fi
