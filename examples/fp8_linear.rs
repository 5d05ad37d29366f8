//! A linear layer in fp8: `y = x·Wᵀ` with bf16 activations and weights quantized to e4m3, two
//! ways — one scale per tensor (`quantize_fp8` on the device, amax taken on the host) and
//! DeepSeek-V3's blocks (a scale per 1×128 block of x and per 128×128 block of W, quantized
//! on the host) — each run by `gemm_fp8` into bf16 and compared with float64 on the bf16
//! inputs, beside the bf16 GEMM; then the output itself in e4m3 (`run_fp8`), scaled as delayed
//! scaling does: a first call's amax of y sets the next call's output scale. On the GPU, or on
//! the CPU interpreter where there is none (smaller sizes).
//!
//! `cargo run --release --example fp8_linear`

use tessera::testing::{rel_error, Uniform};
use tessera::{bf16, Device, Tensor, F8E4M3};
use tessera_kernels::{gemm, gemm_fp8, quantize_fp8, Fp8Scaling};

/// E4M3's largest finite value.
const E4M3_MAX: f32 = 448.0;

fn main() -> tessera::Result<()> {
    let (dev, (tokens, d_in, d_out)) = match Device::new(0) {
        Ok(dev) => (dev, (1000, 4096, 2048)),
        Err(e) => {
            println!("no GPU here ({e}): on the CPU interpreter, smaller");
            (Device::cpu(), (70, 384, 144))
        }
    };
    let mut rng = Uniform::new();
    let x: Vec<bf16> = rng.vec(tokens * d_in, bf16::from_f32);
    let w: Vec<bf16> = rng.vec(d_out * d_in, |v| bf16::from_f32(v * 0.05));
    let xt = Tensor::from_host(&dev, &x, &[tokens, d_in])?;
    let wt = Tensor::from_host(&dev, &w, &[d_out, d_in])?;
    let want: Vec<f64> = (0..tokens * d_out)
        .map(|ij| {
            let (i, j) = (ij / d_out, ij % d_out);
            (0..d_in).map(|k| x[i * d_in + k].to_f64() * w[j * d_in + k].to_f64()).sum()
        })
        .collect();
    let read = |y: &Tensor<bf16>| -> tessera::Result<Vec<f64>> { Ok(y.to_host()?.into_iter().map(|v| v.to_f64()).collect()) };

    // bf16, for comparison.
    let mut y = Tensor::<bf16>::zeros(&dev, &[tokens, d_out])?;
    gemm(&xt, &wt).run(&dev, &mut y)?;
    let e_bf16 = rel_error(&read(&y)?, &want);

    // Per tensor: q = x · (448 / amax), dequantized by the reciprocal in the GEMM.
    let amax = |v: &[bf16]| v.iter().fold(0.0f32, |a, b| a.max(b.to_f32().abs()));
    let (sx, sw) = (E4M3_MAX / amax(&x), E4M3_MAX / amax(&w));
    let mut xq = Tensor::<F8E4M3>::zeros(&dev, &[tokens, d_in])?;
    let mut wq = Tensor::<F8E4M3>::zeros(&dev, &[d_out, d_in])?;
    quantize_fp8(&dev, &xt, sx, &mut xq)?;
    quantize_fp8(&dev, &wt, sw, &mut wq)?;
    let (dx, dw) = (Tensor::from_host(&dev, &[1.0 / sx], &[1])?, Tensor::from_host(&dev, &[1.0 / sw], &[1])?);
    gemm_fp8(&xq, &wq, Fp8Scaling::Tensorwise { a: &dx, b: &dw }).run(&dev, &mut y)?;
    let e_tensor = rel_error(&read(&y)?, &want);
    let (xq_t, wq_t) = (xq, wq);

    // Per block (host-side quantization): each 1×128 block of x and 128×128 block of W to its
    // own amax.
    let kb = d_in.div_ceil(128);
    let quantize_blocks = |v: &[bf16], rows: usize, block_rows: usize| -> (Vec<F8E4M3>, Vec<f32>) {
        let row_blocks = rows.div_ceil(block_rows);
        let mut scales = vec![0.0f32; row_blocks * kb];
        for (i, x) in v.iter().enumerate() {
            let s = &mut scales[(i / d_in / block_rows) * kb + (i % d_in) / 128];
            *s = s.max(x.to_f32().abs());
        }
        let scales: Vec<f32> = scales.into_iter().map(|a| if a > 0.0 { a / E4M3_MAX } else { 1.0 }).collect();
        let q = v
            .iter()
            .enumerate()
            .map(|(i, x)| F8E4M3::from_f32(x.to_f32() / scales[(i / d_in / block_rows) * kb + (i % d_in) / 128]))
            .collect();
        (q, scales)
    };
    let (xq_h, xs) = quantize_blocks(&x, tokens, 1);
    let (wq_h, ws) = quantize_blocks(&w, d_out, 128);
    let (xq, wq) = (Tensor::from_host(&dev, &xq_h, &[tokens, d_in])?, Tensor::from_host(&dev, &wq_h, &[d_out, d_in])?);
    let (xs, ws) = (Tensor::from_host(&dev, &xs, &[tokens, kb])?, Tensor::from_host(&dev, &ws, &[d_out.div_ceil(128), kb])?);
    gemm_fp8(&xq, &wq, Fp8Scaling::Blockwise { a: &xs, b: &ws }).run(&dev, &mut y)?;
    let e_block = rel_error(&read(&y)?, &want);

    // The output in e4m3 too (per-tensor inputs as above): the kernel keeps y's amax (before
    // the output scale); the next call scales y by 448 / amax, the scale delayed scaling keeps.
    let mut yq = Tensor::<F8E4M3>::zeros(&dev, &[tokens, d_out])?;
    let mut y_amax = Tensor::<f32>::zeros(&dev, &[1])?;
    let fp8_out = gemm_fp8(&xq_t, &wq_t, Fp8Scaling::Tensorwise { a: &dx, b: &dw });
    fp8_out.run_fp8(&dev, &mut yq, &Tensor::from_host(&dev, &[1.0f32], &[1])?, Some(&mut y_amax))?;
    let got_amax = y_amax.to_host()?[0];
    let sy = E4M3_MAX / got_amax;
    fp8_out.run_fp8(&dev, &mut yq, &Tensor::from_host(&dev, &[sy], &[1])?, None)?;
    let yq_back: Vec<f64> = yq.to_host()?.into_iter().map(|q| f64::from(q.to_f32() / sy)).collect();
    let e_out = rel_error(&yq_back, &want);
    let want_amax = want.iter().fold(0.0f64, |a, v| a.max(v.abs()));

    println!("device: {}", dev.name());
    println!("y = x·Wᵀ, {tokens}×{d_out} from {tokens}×{d_in} and {d_out}×{d_in}; relative error against float64:");
    println!("  bf16 GEMM                           {e_bf16:.2e}");
    println!("  fp8 e4m3, a scale per tensor        {e_tensor:.2e}");
    println!("  fp8 e4m3, 1×128 / 128×128 blocks    {e_block:.2e}");
    println!("  fp8 e4m3 in and out (y·448/amax)    {e_out:.2e}   (amax {got_amax:.4}, float64 {want_amax:.4})");
    println!("(fp8 keeps 3 mantissa bits: a few percent is its rounding, not the GEMM's)");
    Ok(())
}
