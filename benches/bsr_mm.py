"""PyTorch's block-sparse × dense GEMM, the baseline of `benches/gemm.rs`'s
`TESSERA_BENCH_GEMM=bsr`.

Reads lines `m n k per_row [block]` and prints `tflops how` for each: A m×k bf16 in block-CSR
with `block`×`block` blocks (128 unless given), `per_row` random nonzero blocks in each block row, times B k×n (dense), by
`torch.sparse._triton_ops.bsr_dense_mm` (PyTorch's Triton kernel) where it runs, else
`A @ B`. CUDA-event timing of 30 calls after 5; TFLOP/s counting the nonzero blocks' work,
2·m·n·(per_row·block). Prints `error <reason>` where PyTorch or BSR matmul is missing.
"""
import os
import sys

try:
    import torch

    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    from cuda_timing import time_ms
except Exception as e:  # no PyTorch here
    print(f"error {type(e).__name__}: {e}")
    sys.exit(0)

for line in iter(sys.stdin.readline, ""):
    words = [int(x) for x in line.split()]
    m, n, k, per_row = words[:4]
    blk = words[4] if len(words) > 4 else 128
    try:
        rows, cols = m // blk, k // blk
        mask = torch.zeros(rows, cols, dtype=torch.bool)
        for r in range(rows):
            mask[r, torch.randperm(cols)[:per_row]] = True
        dense = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
        dense *= mask.repeat_interleave(blk, 0).repeat_interleave(blk, 1).cuda()
        a = dense.to_sparse_bsr((blk, blk))
        b = torch.randn(k, n, device="cuda", dtype=torch.bfloat16)
        how = "triton"
        try:
            from torch.sparse._triton_ops import bsr_dense_mm

            bsr_dense_mm(a, b)
            f = lambda: bsr_dense_mm(a, b)
        except Exception:
            how = "matmul"
            f = lambda: a @ b
        ms = time_ms(f)
    except Exception as e:
        print(f"error {type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}", flush=True)
        continue
    print(f"{2.0 * m * n * per_row * blk / ms * 1e-9:.1f} {how}", flush=True)
