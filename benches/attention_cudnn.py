"""cuDNN's scaled-dot-product attention forward, the baseline of `benches/attention.rs`.

Reads lines `batch heads seq dim causal` on stdin and prints `batch heads seq dim causal
tflops` for each: bf16 Q, K, V in [batch, heads, seq, dim], CUDA-event timing of 30 calls after 5,
TFLOP/s counting 4·B·H·S²·D (half of that when causal). A sixth word `bwd` times cuDNN's
backward alone instead (the gradients of Q, K, V from a saved forward), counting 2.5× the
forward's FLOPs. Prints `error <reason>` and exits 0
where PyTorch or cuDNN attention is missing, so the bench can say why it has no baseline.
"""
import os
import sys

try:
    import torch

    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    from cuda_timing import time_ms
    from torch.nn.attention import SDPBackend, sdpa_kernel
    import torch.nn.functional as F
except Exception as e:  # no PyTorch here
    print(f"error {type(e).__name__}: {e}")
    sys.exit(0)


# One shape a line, answered before the next is read: the bench asks right before timing its
# own kernel on the shape, so both run in the same thermal state.
for line in iter(sys.stdin.readline, ""):
    words = line.split()
    b, h, s, d, causal = (int(x) for x in words[:5])
    bwd = len(words) > 5 and words[5] == "bwd"
    q, k, v = (torch.randn(b, h, s, d, device="cuda", dtype=torch.bfloat16, requires_grad=bwd) for _ in range(3))
    try:
        with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
            if bwd:
                out = F.scaled_dot_product_attention(q, k, v, is_causal=bool(causal))
                do = torch.randn_like(out)
                ms = time_ms(lambda: torch.autograd.grad(out, (q, k, v), do, retain_graph=True))
            else:
                ms = time_ms(lambda: F.scaled_dot_product_attention(q, k, v, is_causal=bool(causal)))
    except Exception as e:
        print(f"error {type(e).__name__}: {e}")
        sys.exit(0)
    flop = 4.0 * b * h * s * s * d / (2 if causal else 1) * (2.5 if bwd else 1.0)
    print(b, h, s, d, causal, f"{flop / ms * 1e-9:.1f}", flush=True)
