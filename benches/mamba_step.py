"""mamba-ssm's Triton `selective_state_update`, the baseline of the selective scan's decode step
in `benches/memory_bound.rs`.

`python3 mamba_step.py BATCH DIM DSTATE` prints `ms <t>` for one decode step: f32 state
[BATCH, DIM, DSTATE] updated in place, bf16 x, dt, z, B, C ([BATCH, 1, DSTATE]), f32 A, D and
dt_bias, softplus on — the call captured in a CUDA graph (so that Python's launch overhead
is not counted) and replayed, CUDA-event timing of 50 replays after 10. mamba-ssm is not installed
whole (its CUDA extensions are not built here): `TESSERA_MAMBA_SRC` names an unpacked
mamba-ssm source tree whose Triton kernel is loaded alone, `TESSERA_PYLIB` a folder with
einops (default `mamba_src` and `pylib` beside this script: `scripts/fetch-baselines.sh`
fetches both). Prints `error <reason>` and exits 0 where any of it is missing.
"""
import os
import sys
import types

here = os.path.dirname(os.path.abspath(__file__))
try:
    sys.path.insert(0, os.environ.get("TESSERA_PYLIB", os.path.join(here, "pylib")))
    import torch

    sys.path.insert(0, here)
    from cuda_timing import time_ms

    root = os.environ.get("TESSERA_MAMBA_SRC", os.path.join(here, "mamba_src"))
    pkg = types.ModuleType("mamba_ssm")  # skip the package's __init__, which loads CUDA extensions
    pkg.__path__ = [os.path.join(root, "mamba_ssm")]
    sys.modules["mamba_ssm"] = pkg
    from mamba_ssm.ops.triton.selective_state_update import selective_state_update
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
