#!/usr/bin/env bash
# Fetches, on this machine (which has the network), the Python pieces the benches' baselines
# need on the GPU machine (which has PyTorch and Triton but no network), into an ignored
# folder to carry there:
#   <dir>/mamba_src  mamba-ssm's source tree (its Triton kernels load alone; the package's
#                    CUDA extensions are not built) for `benches/mamba_step.py`;
#   <dir>/mamba_csrc mamba-ssm 2.3.1's CUDA sources (the first sdist that ships them), for
#                    `scripts/mamba-selective-scan.sh` (the selective scan forward's baseline);
#   <dir>/pylib      einops, which those kernels import, and flash-linear-attention
#                    (`flash-linear-attention` + `fla-core`, pure Python on Triton) for
#                    `benches/fla_linear_attn.py`.
# Usage: bash scripts/fetch-baselines.sh [.gpu2]   (then carry <dir> and run the bench there,
# with the scripts beside it or TESSERA_MAMBA_SRC / TESSERA_PYLIB naming the folders).
set -euo pipefail
cd "$(dirname "$0")/.."
dir="${1:-.gpu2}"
version=2.2.4
mkdir -p "$dir/pylib"
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
# The sdist from PyPI's simple index, checked against the hash the index gives.
link="$(curl -fsSL https://pypi.org/simple/mamba-ssm/ | grep -o "https://[^\"]*mamba_ssm-$version.tar.gz#sha256=[0-9a-f]*" | head -1)"
[ -n "$link" ] || { echo "mamba-ssm $version not found on PyPI" >&2; exit 1; }
curl -fsSL "${link%%#*}" -o "$tmp/mamba.tar.gz"
echo "${link##*sha256=}  $tmp/mamba.tar.gz" | sha256sum -c --quiet
tar -C "$tmp" -xzf "$tmp/mamba.tar.gz"
rm -rf "$dir/mamba_src" && mv "$tmp/mamba_ssm-$version" "$dir/mamba_src"
# mamba-ssm's CUDA sources: 2.3.1's sdist is the first to carry csrc/.
link="$(curl -fsSL https://pypi.org/simple/mamba-ssm/ | grep -o "https://[^\"]*mamba_ssm-2.3.1.tar.gz#sha256=[0-9a-f]*" | head -1)"
[ -n "$link" ] || { echo "mamba-ssm 2.3.1 not found on PyPI" >&2; exit 1; }
curl -fsSL "${link%%#*}" -o "$tmp/mamba231.tar.gz"
echo "${link##*sha256=}  $tmp/mamba231.tar.gz" | sha256sum -c --quiet
tar -C "$tmp" -xzf "$tmp/mamba231.tar.gz" mamba_ssm-2.3.1/csrc
rm -rf "$dir/mamba_csrc" && mv "$tmp/mamba_ssm-2.3.1" "$dir/mamba_csrc"
fla=0.6.0
pip download --quiet --no-deps --only-binary :all: einops "flash-linear-attention==$fla" "fla-core==$fla" -d "$tmp/wheels"
for w in "$tmp"/wheels/*.whl; do python3 -m zipfile -e "$w" "$dir/pylib"; done
echo "fetched into $dir: mamba_src (mamba-ssm $version), mamba_csrc (2.3.1), pylib (einops, flash-linear-attention $fla)"
