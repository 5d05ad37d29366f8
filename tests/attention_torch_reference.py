"""Attention's gradients at training sizes beside PyTorch: the float64 reference of
`tests/gpu_attention_backward.rs`'s `gpu_attention_backward_matches_torch_at_scale`.

`python3 attention_torch_reference.py DIR` reads `DIR/meta.txt` (`batch seq_q seq_k heads
kv_heads dim causal scale softcap window`, 0 for no soft-capping or window) and the bf16 bits of
`q`, `k`, `v`, `dout` and Tessera's `dq`, `dk`, `dv` (`[batch, seq, heads, dim]`), computes the
gradients in float64 on the GPU from the definition (the causal diagonal aligned at the end,
soft-capping `c·tanh(s/c)`, a window of the last `window` keys) and prints a line `name ours
torch` for each gradient: the relative error (‖got − ref‖ / ‖ref‖) of Tessera's and of PyTorch's
own bf16 backward (`scaled_dot_product_attention`, its default backend; `-` where it has no such
modifier). Prints `error <reason>` and exits 0 where PyTorch or a GPU is missing.
"""
import sys

try:
    import numpy as np
    import torch
    import torch.nn.functional as F

    if not torch.cuda.is_available():
        raise RuntimeError("no CUDA device")
except Exception as e:
    print(f"error {type(e).__name__}: {e}")
    sys.exit(0)

d = sys.argv[1]
words = open(f"{d}/meta.txt").read().split()
b, sq, sk, h, hk, dim, causal = (int(x) for x in words[:7])
scale, softcap = float(words[7]), float(words[8])
window = int(words[9])


def load(name, s):
    bits = np.fromfile(f"{d}/{name}.bin", dtype=np.int16)
    return torch.from_numpy(bits).view(torch.bfloat16).reshape(b, s, -1, dim).cuda()


q, k, v, dout = load("q", sq), load("k", sk), load("v", sk), load("dout", sq)
ours = {n: load(n, sq if n == "dq" else sk) for n in ("dq", "dk", "dv")}
group = h // hk
i = torch.arange(sq, device="cuda").view(-1, 1)
j = torch.arange(sk, device="cuda").view(1, -1)
visible = torch.ones(sq, sk, dtype=torch.bool, device="cuda")
if causal:
    visible = j <= i + (sk - sq)
if window:
    visible &= j > i + (sk - sq) - window


def grads(dtype, reference):
    xs = [x.to(dtype).transpose(1, 2).detach().requires_grad_() for x in (q, k, v)]
    qx, kx, vx = xs
    ke, ve = kx.repeat_interleave(group, dim=1), vx.repeat_interleave(group, dim=1)
    if reference:
        s = (qx @ ke.transpose(-1, -2)) * scale
        if softcap:
            s = softcap * torch.tanh(s / softcap)
        p = torch.softmax(s.masked_fill(~visible, float("-inf")), dim=-1).nan_to_num(0.0)
        o = p @ ve
    else:
        o = F.scaled_dot_product_attention(qx, ke, ve, is_causal=bool(causal), scale=scale)
    o.backward(dout.to(dtype).transpose(1, 2))
    return {n: x.grad.transpose(1, 2) for n, x in zip(("dq", "dk", "dv"), xs)}


ref = grads(torch.float64, True)
# PyTorch's own bf16 backward where SDPA has the mask (causal aligned at the start: square only).
theirs = grads(torch.bfloat16, False) if not softcap and not window and (not causal or sq == sk) else None
err = lambda got, want: ((got.double() - want).norm() / want.norm()).item()
for n in ("dq", "dk", "dv"):
    t = f"{err(theirs[n], ref[n]):.3e}" if theirs else "-"
    print(n, f"{err(ours[n], ref[n]):.3e}", t, flush=True)
