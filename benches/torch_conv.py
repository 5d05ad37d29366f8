"""PyTorch's 1-D convolutions, the baselines of the conv rows in `benches/memory_bound.rs`.

`python3 torch_conv.py BATCH CHANNELS L TAPS` prints lines `name ms` (CUDA-event timing of 30
calls after 5):

- `fftconv`: the FFT convolution the issue measures (f32: rfft of x and of the filter at 2L,
  their product, irfft, the first L steps — causal), with the filter's FFT in the timing;
- `conv1d_bf16`: `torch.nn.functional.conv1d` depthwise (groups = channels), bf16, padded
  `TAPS − 1` on the left and cut to L: the causal short convolution as PyTorch runs it.

Prints `error <reason>` and exits 0 where PyTorch or CUDA is missing, so the bench can say
why it has no baseline.
"""
import os
import sys

try:
    import torch
    import torch.nn.functional as F

    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    from cuda_timing import time_ms

    assert torch.cuda.is_available(), "no CUDA device for PyTorch"
except Exception as e:  # no PyTorch here
    print(f"error {type(e).__name__}: {e}")
    sys.exit(0)

b, h, n, taps = (int(a) for a in sys.argv[1:5])
x = torch.randn(b, h, n, device="cuda", dtype=torch.float32)
k = torch.randn(h, taps, device="cuda", dtype=torch.float32) / taps**0.5


def fftconv():
    size = 2 * n
    kf = torch.fft.rfft(k, n=size)
    xf = torch.fft.rfft(x, n=size)
    return torch.fft.irfft(xf * kf, n=size)[..., :n]


print(f"fftconv {time_ms(fftconv):.4f}")
if taps <= 64:
    xb = x.to(torch.bfloat16)
    wb = k.to(torch.bfloat16).flip(-1).unsqueeze(1)
    print(f"conv1d_bf16 {time_ms(lambda: F.conv1d(xb, wb, padding=taps - 1, groups=h)[..., :n]):.4f}")
