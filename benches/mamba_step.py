"""mamba-ssm's Triton `selective_state_update`, the baseline of the selective scan's decode step
in `benches/memory_bound.rs`.

`python3 mamba_step.py BATCH DIM DSTATE` prints `ms <t>` for one decode step: f32 state
[BATCH, DIM, DSTATE] updated in place, bf16 x, dt, z, B, C ([BATCH, 1, DSTATE]), f32 A, D and
dt_bias, softplus on — the call captured in a CUDA graph (so that Python's launch overhead
is not counted) and replayed, CUDA-event timing of 50 replays after 10. mamba-ssm's kernel
is loaded alone by `mamba_triton.py` (which says where the sources come from). Prints
`error <reason>` and exits 0 where any of it is missing.
"""
import os
import sys

here = os.path.dirname(os.path.abspath(__file__))
try:
    sys.path.insert(0, here)
    from mamba_triton import load

    import torch
    from cuda_timing import time_ms

    selective_state_update = load("ops.triton.selective_state_update").selective_state_update
except Exception as e:
    print(f"error {type(e).__name__}: {e}")
    sys.exit(0)


batch, dim, dstate = (int(a) for a in sys.argv[1:4])
dev, bf = "cuda", torch.bfloat16
state = torch.randn(batch, dim, dstate, device=dev, dtype=torch.float32)
x, dt, z = (torch.randn(batch, dim, device=dev, dtype=bf) for _ in range(3))
A = -torch.rand(dim, dstate, device=dev, dtype=torch.float32) - 0.1
B, C = (torch.randn(batch, 1, dstate, device=dev, dtype=bf) for _ in range(2))
D = torch.randn(dim, device=dev, dtype=torch.float32)
dt_bias = torch.randn(dim, device=dev, dtype=torch.float32)
try:
    step = lambda: selective_state_update(state, x, dt, A, B, C, D=D, z=z, dt_bias=dt_bias, dt_softplus=True)
    step()  # compiles the Triton kernel
    torch.cuda.synchronize()
    # Replayed from a CUDA graph: the kernel's own time, not Python's launch overhead.
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        step()
    ms = time_ms(graph.replay, warm=10, iters=50)
except Exception as e:
    print(f"error {type(e).__name__}: {e}")
    sys.exit(0)
print(f"ms {ms:.5f}")
