"""flash-linear-attention's chunked kernels, the baselines of the linear attention rows in
`benches/memory_bound.rs`.

`python3 fla_linear_attn.py B T H D` prints, in ms, for bf16 q, k, v [B, T, H, D]:
`fwd` chunk_linear_attn forward (normalize=False: o_t = scale·q_t·Σ k_sᵀv_s, as ours),
`fwd_norm` the same with its default normalization, `fwd_bwd` forward + backward of the
first, `gla_fwd` chunk_simple_gla with a scalar log-decay a head and step, `gla_fwd_bwd` with its
backward (where this Triton runs them; the issue reports its gated backward wrong here),
`fwd_elu` and `fwd_bwd_elu` the first two with the elu + 1 feature map applied to q and k in
torch first (as fla's layers apply their feature maps), `gla_vec_fwd` chunk_gla with per-channel
log gates (as k; GLA) where this Triton runs it. CUDA-event timing (`cuda_timing.py`) after warm-up calls, which include Triton's
autotuning. flash-linear-attention is not installed on the GPU machine: `TESSERA_PYLIB` names
a folder with it and einops unpacked (default `pylib` beside this script;
`scripts/fetch-baselines.sh` fetches them). Prints `error <reason>` and exits 0 where it cannot
import them; a kernel that fails prints its reason on stderr and no line.
"""
import os
import sys

here = os.path.dirname(os.path.abspath(__file__))
try:
    sys.path.insert(0, os.environ.get("TESSERA_PYLIB", os.path.join(here, "pylib")))
    import torch

    sys.path.insert(0, here)
    from cuda_timing import time_ms
    from fla.ops.linear_attn import chunk_linear_attn
    from fla.ops.simple_gla import chunk_simple_gla
    from fla.ops.gla import chunk_gla
except Exception as e:
    print(f"error {type(e).__name__}: {e}")
    sys.exit(0)

B, T, H, D = (int(a) for a in sys.argv[1:5])
dev, bf = "cuda", torch.bfloat16
q, k, v = (torch.randn(B, T, H, D, device=dev, dtype=bf) for _ in range(3))
g = -torch.rand(B, T, H, device=dev, dtype=torch.float32) * 0.6


def report(name, f, warm=3, iters=10):
    try:
        print(f"{name} {time_ms(f, warm=warm, iters=iters):.5f}", flush=True)
    except Exception as e:
        print(f"{name}: {type(e).__name__}: {e}", file=sys.stderr)


report("fwd", lambda: chunk_linear_attn(q, k, v, normalize=False))
report("fwd_norm", lambda: chunk_linear_attn(q, k, v))
qg, kg, vg = (t.detach().clone().requires_grad_() for t in (q, k, v))
do = torch.randn_like(v)


def fwd_bwd():
    o, _ = chunk_linear_attn(qg, kg, vg, normalize=False)
    o.backward(do)


report("fwd_bwd", fwd_bwd)
report("gla_fwd", lambda: chunk_simple_gla(q, k, v, g=g))
gg = g.detach().clone().requires_grad_()


def gla_fwd_bwd():
    o, _ = chunk_simple_gla(qg, kg, vg, g=gg)
    o.backward(do)


report("gla_fwd_bwd", gla_fwd_bwd)


def elu1(x):
    return torch.nn.functional.elu(x) + 1


report("fwd_elu", lambda: chunk_linear_attn(elu1(q), elu1(k), v, normalize=False))


def fwd_bwd_elu():
    o, _ = chunk_linear_attn(elu1(qg), elu1(kg), vg, normalize=False)
    o.backward(do)


report("fwd_bwd_elu", fwd_bwd_elu)

gk = -torch.rand(B, T, H, D, device=dev, dtype=torch.float32) * 0.1
report("gla_vec_fwd", lambda: chunk_gla(q, k, v, g=gk))
