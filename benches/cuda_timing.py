"""CUDA-event timing shared by the benches' Python baselines (`attention_cudnn.py`,
`torch_scans.py`, `mamba_step.py`, `mamba_ssd.py`, `fla_linear_attn.py`, `scaled_mm.py`, `grouped_mm.py`), which import it from their own folder."""
import torch


def time_ms(f, warm=5, iters=30):
    """Milliseconds per call of `f`: `warm` calls, then `iters` between two CUDA events."""
    for _ in range(warm):
        f()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(iters):
        f()
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) / iters
