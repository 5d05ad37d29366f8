#!/usr/bin/env bash
# Builds the GPU test and bench executables here (release), gathers them in .gpu/ with the
# runner. Carry `.gpu` to the GPU machine and run `bash .gpu/run.sh` there.
set -euo pipefail
cd "$(dirname "$0")/.."
rm -rf .gpu && mkdir -p .gpu/bin
exes() { python3 -c '
import json, sys
for line in sys.stdin:
    try: m = json.loads(line)
    except ValueError: continue
    if m.get("reason") == "compiler-artifact" and m.get("executable"):
        print(m["target"]["name"], m["executable"])'; }
{
  cargo test --release --workspace --no-run --message-format=json | exes
  cargo bench --no-run --message-format=json 2>/dev/null | exes
  cargo build --release --example quickstart --example gemm_vs_cublas --example tune --example attention_probe --message-format=json 2>/dev/null | exes
} | while read -r name path; do
  case "$name" in
    gpu_*|ptxas|memory_bound|gemm|attention|attention_probe|gemm_vs_cublas|quickstart|tune) cp "$path" ".gpu/bin/$name"; strip ".gpu/bin/$name" ;;
  esac
done
cp scripts/gpu-run.sh .gpu/run.sh
cp scripts/sanitize.sh .gpu/sanitize.sh
cp benches/*.py .gpu/bin/
# mamba-ssm's Triton kernels for the decode-step baseline (needs the network: skipped without).
bash scripts/fetch-baselines.sh .gpu/bin || echo "gpu-build: no mamba-ssm baseline (fetch failed)"

ls .gpu/bin
# The executables embed the kernels' PTX, zstd-packed, the same bytes in each: one archive
# with a dictionary larger than all of them keeps one copy (106 MB → 18 MB), under the carry
# to the GPU machine (64 MiB). run.sh unpacks it.
tar -C .gpu -cf - bin | xz -T0 --lzma2=preset=6,dict=256MiB > .gpu/bin.tar.xz && rm -rf .gpu/bin
du -sh .gpu
