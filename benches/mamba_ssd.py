"""mamba-ssm's Triton `mamba_chunk_scan_combined` (Mamba-2's SSD), the baseline of the SSD rows
in `benches/memory_bound.rs`.

`python3 mamba_ssd.py B L H P N` prints, in ms, `fwd` (forward, chunk 256, D, dt bias,
softplus, one group) and `fwd_bwd` (forward + backward) for bf16 x [B, L, H, P], dt [B, L, H],
B and C [B, L, 1, N], f32 A, D, dt_bias; CUDA-event timing (`cuda_timing.py`) after warm-up
calls, which include Triton's autotuning. mamba-ssm's kernels are loaded alone by
`mamba_triton.py` (which says where the sources come from). Prints `error <reason>` and exits
0 where any of it is missing.
"""
import os
import sys

here = os.path.dirname(os.path.abspath(__file__))
try:
    sys.path.insert(0, here)
    from mamba_triton import load

    import torch
    from cuda_timing import time_ms

    mamba_chunk_scan_combined = load("ops.triton.ssd_combined").mamba_chunk_scan_combined
except Exception as e:
    print(f"error {type(e).__name__}: {e}")
    sys.exit(0)

Bt, L, H, P, N = (int(a) for a in sys.argv[1:6])
dev, bf = "cuda", torch.bfloat16
x = torch.randn(Bt, L, H, P, device=dev, dtype=bf)
dt = torch.randn(Bt, L, H, device=dev, dtype=bf) - 1.0
A = -torch.rand(H, device=dev, dtype=torch.float32) * 3 - 0.5
Bm, Cm = (torch.randn(Bt, L, 1, N, device=dev, dtype=bf) for _ in range(2))
D = torch.randn(H, device=dev, dtype=torch.float32)
dt_bias = torch.rand(H, device=dev, dtype=torch.float32) - 0.5


def fwd():
    return mamba_chunk_scan_combined(x, dt, A, Bm, Cm, 256, D=D, dt_bias=dt_bias, dt_softplus=True)


xg, dtg, Bg, Cg = (t.detach().clone().requires_grad_() for t in (x, dt, Bm, Cm))
dy = torch.randn_like(x)


def fwd_bwd():
    y = mamba_chunk_scan_combined(xg, dtg, A, Bg, Cg, 256, D=D, dt_bias=dt_bias, dt_softplus=True)
    y.backward(dy)


for name, f in (("fwd", fwd), ("fwd_bwd", fwd_bwd)):
    try:
        print(f"{name} {time_ms(f, warm=3, iters=10):.5f}", flush=True)
    except Exception as e:
        print(f"{name}: {type(e).__name__}: {e}", file=sys.stderr)
