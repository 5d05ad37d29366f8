"""PyTorch's fp8 GEMM (`torch._scaled_mm`, cuBLASLt), the baseline of `benches/gemm.rs`'s
`TESSERA_BENCH_GEMM=fp8`.

Reads lines `m n k mode fast [out]` and prints `m n k mode fast tflops` for each: A [m, k] and
B [n, k] in e4m3 (B passed transposed, column-major, as `_scaled_mm` takes it), C in bf16 (or
e4m3 where `out` is `e4m3`, with a `scale_result`, or f32 where it is `f32`),
`mode` `tensor` (one f32 scale each), `row` (A's [m, 1], B's [1, n]) or `block` (A's per 1×128
block [m, k/128], outer-dim-major; B's per 128×128 block), `fast` 1 for `use_fast_accum`
(cuBLASLt's fp8 sums without promotion; refused with block scales). CUDA-event timing of 30
calls after 5, TFLOP/s counting 2·m·n·k. Prints `error <reason>` where PyTorch or the mode
is missing, so the bench can say why it has no baseline.
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


def operands(m, n, k, mode):
    a = (torch.randn(m, k, device="cuda") * 4).to(torch.float8_e4m3fn)
    b = (torch.randn(n, k, device="cuda") * 4).to(torch.float8_e4m3fn)
    if mode == "tensor":
        sa, sb = torch.tensor(0.5, device="cuda"), torch.tensor(0.25, device="cuda")
    elif mode == "row":
        sa = torch.rand(m, 1, device="cuda") + 0.5
        sb = torch.rand(1, n, device="cuda") + 0.5
    else:
        sa = (torch.rand(m, k // 128, device="cuda") + 0.5).t().contiguous().t()
        sb = (torch.rand(n // 128, k // 128, device="cuda") + 0.5).t()
    return a, b.t(), sa, sb


for line in iter(sys.stdin.readline, ""):
    words = line.split()
    m, n, k = (int(x) for x in words[:3])
    mode, fast = words[3], words[4] == "1"
    out = words[5] if len(words) > 5 else "bf16"
    try:
        a, b, sa, sb = operands(m, n, k, mode)
        if out == "e4m3":
            sc = torch.tensor(0.01, device="cuda")
            ms = time_ms(
                lambda: torch._scaled_mm(a, b, sa, sb, scale_result=sc, out_dtype=torch.float8_e4m3fn, use_fast_accum=fast)
            )
        else:
            dtype = torch.float32 if out == "f32" else torch.bfloat16
            ms = time_ms(lambda: torch._scaled_mm(a, b, sa, sb, out_dtype=dtype, use_fast_accum=fast))
    except Exception as e:
        print(f"error {type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}", flush=True)
        continue
    print(m, n, k, mode, int(fast), f"{2.0 * m * n * k / ms * 1e-9:.1f}", flush=True)
