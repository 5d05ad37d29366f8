"""PyTorch's prefix scans, the baseline of the scan rows in `benches/memory_bound.rs`.

`python3 torch_scans.py ROWS COLS` prints one line `name ms` for each of torch.cumsum and
torch.logcumsumexp along the last axis of a ROWS×COLS f32 tensor, torch.cumsum of the same in
bf16, and a device copy of the f32 tensor (the same bytes as Tessera's copy row): CUDA-event
timing of 30 calls after 5. Prints `error <reason>` and exits 0 where PyTorch or CUDA is
missing, so the bench can say why it has no baseline.
"""
import os
import sys

try:
    import torch

    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    from cuda_timing import time_ms

    assert torch.cuda.is_available(), "no CUDA device for PyTorch"
except Exception as e:  # no PyTorch here
    print(f"error {type(e).__name__}: {e}")
    sys.exit(0)


rows, cols = int(sys.argv[1]), int(sys.argv[2])
x = torch.randn(rows, cols, device="cuda", dtype=torch.float32)
xb = x.to(torch.bfloat16)
y = torch.empty_like(x)
yb = torch.empty_like(xb)
print(f"copy {time_ms(lambda: y.copy_(x)):.4f}")
print(f"cumsum {time_ms(lambda: torch.cumsum(x, dim=1, out=y)):.4f}")
print(f"logcumsumexp {time_ms(lambda: torch.logcumsumexp(x, dim=1, out=y)):.4f}")
print(f"cumsum_bf16 {time_ms(lambda: torch.cumsum(xb, dim=1, out=yb)):.4f}")
