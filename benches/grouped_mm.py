"""PyTorch's grouped GEMM (`torch._grouped_mm`), the baseline of `benches/gemm.rs`'s
`TESSERA_BENCH_GEMM=grouped`.

Reads lines `n k end_1,end_2,… [fp8]` and prints `tflops` for each: A [M, k] in bf16 (M the
last end), the experts' weights [E, n, k] passed as [E, k, n] (transposed views, as
`_grouped_mm` takes B), `offs` the ends in int32. With `fp8`, A and B in e4m3 with rowwise
scales (A's [M], B's [E, n]) through `torch._scaled_grouped_mm`, bf16 out. CUDA-event timing
of 30 calls after 5, TFLOP/s counting 2·M·n·k. Prints `error <reason>` where PyTorch or the
function is missing.
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
    words = line.split()
    n, k = int(words[0]), int(words[1])
    ends = [int(x) for x in words[2].split(",")]
    try:
        m = ends[-1]
        a = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
        w = torch.randn(len(ends), n, k, device="cuda", dtype=torch.bfloat16)
        offs = torch.tensor(ends, device="cuda", dtype=torch.int32)
        if len(words) > 3 and words[3] == "fp8":
            a8, w8 = a.to(torch.float8_e4m3fn), w.to(torch.float8_e4m3fn)
            sa = torch.rand(m, device="cuda") + 0.5
            sb = torch.rand(len(ends), n, device="cuda") + 0.5
            f = lambda: torch._scaled_grouped_mm(a8, w8.transpose(-2, -1), sa, sb, offs=offs, out_dtype=torch.bfloat16)
        else:
            f = lambda: torch._grouped_mm(a, w.transpose(-2, -1), offs=offs, out_dtype=torch.bfloat16)
        ms = time_ms(f)
    except Exception as e:
        print(f"error {type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}", flush=True)
        continue
    print(f"{2.0 * m * n * k / ms * 1e-9:.1f}", flush=True)
