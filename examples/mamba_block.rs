//! A Mamba block (Mamba-1's mixer) end to end on Tessera kernels, checked against a float64
//! host reference of the same math, step by step in time:
//!
//! ```text
//! x [batch·L, d_model]
//!   → in-projection GEMM            xz = x·W_inᵀ                      [batch·L, 2·D]
//!   → causal depthwise conv + SiLU  u = silu(conv_b + Σ_k conv_w[k]·x_{t−K+1+k})   (x = xz's first D)
//!   → x-projection GEMMs            Δ_low = u·W_Δᵀ [.., R],  B = u·W_Bᵀ,  C = u·W_Cᵀ [.., N]
//!   → Δ projection GEMM             δ = Δ_low·W_dtᵀ                    [batch·L, D]
//!   → selective scan                h_t = exp(Δ·A)·h + Δ·B·u,  y = (C·h + D·u)·silu(z),  Δ = softplus(δ + dt_bias)
//!   → out-projection GEMM           out = y·W_outᵀ                     [batch·L, d_model]
//! ```
//!
//! The GEMMs take token-major activations (`[batch·L, width]`, bf16); the selective scan takes
//! channel-major ones (`[batch, channels, L]`). Two kernels of this file, written in Tessera's
//! language, do what the library does not: the causal convolution over the GEMM's token-major
//! output (any width K, zeros before the sequence's start; the library's `Conv1d` takes
//! channel-major activations) and a tile copy that changes the layout by storing through a
//! transposed view.
//!
//! `cargo run --release --example mamba_block`: on the GPU where there is one (and then timed
//! at a larger size), else on the CPU interpreter at a small size.

use tessera::{bf16, kernel, Device, Grid, Result, Tensor};
use tessera_kernels::prelude::silu;
use tessera_kernels::{gemm, SelectiveScan};

/// `u[b, t, c] = silu(bias[c] + Σ_k w[k, c]·xz[b, t − K + 1 + k, c])` for `c < D` (`u`'s
/// width), `K = w.dim(0)`; steps before the start read zeros. 64 steps × 64 channels a block.
#[kernel]
pub fn causal_conv_silu(xz: Global<bf16, 3>, w: Global<f32, 2>, bias: Global<f32, 1>, u: Global<bf16, 3>) {
    let b = block::id_z();
    let t = block::id_y() * 64;
    let c = block::id_x() * 64;
    let taps = w.dim(0);
    let mut acc = Tile::<f32, 64, 64>::zeros() + bias.load::<Tile<f32, 1, 64>>([c]);
    for k in (0..taps).step_by(1) {
        let x: Tile<bf16, 64, 64> = xz.load([b, t + k + 1 - taps, c]);
        acc = acc + x.cast::<f32>() * w.load::<Tile<f32, 1, 64>>([k, c]);
    }
    u.store([b, t, c], silu(acc).cast::<bf16>());
}

/// `y[b, i, j] = x[b, i, j + col0]` in 64×64 tiles. With `y` or `x` a transposed view (strides
/// `[W·L, 1, L]` over a `[batch, W, L]` tensor) it turns token-major into channel-major or back.
#[kernel]
pub fn copy_tiles(x: Global<bf16, 3>, col0: i32, y: Global<bf16, 3>) {
    let b = block::id_z();
    let i = block::id_y() * 64;
    let j = block::id_x() * 64;
    let t: Tile<bf16, 64, 64> = x.load([b, i, j + col0]);
    y.store([b, i, j], t);
}

/// The block's sizes.
#[derive(Clone, Copy, Debug)]
pub struct Sizes {
    /// Sequences.
    pub batch: usize,
    /// Steps a sequence.
    pub len: usize,
    /// The model's width.
    pub model: usize,
    /// Channels of the scan (`D`, 2× the model's width in Mamba).
    pub inner: usize,
    /// d_state (16, 32 or 64).
    pub states: usize,
    /// Δ's rank.
    pub rank: usize,
    /// The convolution's width.
    pub taps: usize,
}

/// The block's parameters as host vectors (bf16 where a GEMM reads them, f32 elsewhere).
pub struct Params {
    in_proj: Vec<bf16>,
    conv_w: Vec<f32>,
    conv_b: Vec<f32>,
    x_dt: Vec<bf16>,
    x_b: Vec<bf16>,
    x_c: Vec<bf16>,
    dt_proj: Vec<bf16>,
    dt_bias: Vec<f32>,
    a: Vec<f32>,
    d: Vec<f32>,
    out_proj: Vec<bf16>,
}

impl Params {
    /// Random parameters at the scales of Mamba's initialization: weights uniform in
    /// ±1/√fan_in, `A = −(1, 2, …, N)` for every channel, `dt_bias` the inverse softplus of step
    /// sizes between 0.001 and 0.1, `D = 1`.
    pub fn random(s: Sizes, rng: &mut tessera::testing::Uniform) -> Params {
        let w = |rng: &mut tessera::testing::Uniform, n: usize, fan_in: usize| {
            let k = 1.0 / (fan_in as f32).sqrt();
            rng.vec(n, |v| bf16::from_f32(v * k))
        };
        let dt_bias = rng.vec(s.inner, |v| {
            let dt = (0.001f32.ln() + (v + 1.0) * 0.5 * (0.1f32.ln() - 0.001f32.ln())).exp();
            dt + (-(-dt).exp_m1()).ln()
        });
        Params {
            in_proj: w(rng, 2 * s.inner * s.model, s.model),
            conv_w: rng.vec(s.taps * s.inner, |v| v / (s.taps as f32).sqrt()),
            conv_b: rng.vec(s.inner, |v| v * 0.1),
            x_dt: w(rng, s.rank * s.inner, s.inner),
            x_b: w(rng, s.states * s.inner, s.inner),
            x_c: w(rng, s.states * s.inner, s.inner),
            dt_proj: w(rng, s.inner * s.rank, s.rank),
            dt_bias,
            a: (0..s.inner * s.states).map(|i| -((i % s.states) as f32 + 1.0)).collect(),
            d: vec![1.0; s.inner],
            out_proj: w(rng, s.model * s.inner, s.inner),
        }
    }
}

/// The parameters on a device.
pub struct Block {
    sizes: Sizes,
    in_proj: Tensor<bf16>,
    conv_w: Tensor<f32>,
    conv_b: Tensor<f32>,
    x_dt: Tensor<bf16>,
    x_b: Tensor<bf16>,
    x_c: Tensor<bf16>,
    dt_proj: Tensor<bf16>,
    dt_bias: Tensor<f32>,
    a: Tensor<f32>,
    d: Tensor<f32>,
    out_proj: Tensor<bf16>,
}

impl Block {
    /// Uploads `p`.
    ///
    /// # Errors
    /// A driver failure.
    pub fn new(dev: &Device, s: Sizes, p: &Params) -> Result<Block> {
        Ok(Block {
            sizes: s,
            in_proj: Tensor::from_host(dev, &p.in_proj, &[2 * s.inner, s.model])?,
            conv_w: Tensor::from_host(dev, &p.conv_w, &[s.taps, s.inner])?,
            conv_b: Tensor::from_host(dev, &p.conv_b, &[s.inner])?,
            x_dt: Tensor::from_host(dev, &p.x_dt, &[s.rank, s.inner])?,
            x_b: Tensor::from_host(dev, &p.x_b, &[s.states, s.inner])?,
            x_c: Tensor::from_host(dev, &p.x_c, &[s.states, s.inner])?,
            dt_proj: Tensor::from_host(dev, &p.dt_proj, &[s.inner, s.rank])?,
            dt_bias: Tensor::from_host(dev, &p.dt_bias, &[s.inner])?,
            a: Tensor::from_host(dev, &p.a, &[s.inner, s.states])?,
            d: Tensor::from_host(dev, &p.d, &[s.inner])?,
            out_proj: Tensor::from_host(dev, &p.out_proj, &[s.model, s.inner])?,
        })
    }

    /// The block on `x` (`[batch·L, d_model]`) into `out` (the same shape); returns the scan's
    /// last state `[batch, D, N]` (f32), which a decode loop would go on from.
    ///
    /// # Errors
    /// A launch's or the library's errors (shapes that do not fit).
    pub fn forward(&self, dev: &Device, x: &Tensor<bf16>, out: &mut Tensor<bf16>) -> Result<Tensor<f32>> {
        let Sizes { batch: nb, len: l, inner: d, states: n, rank: r, .. } = self.sizes;
        let rows = nb * l;
        let mut xz = Tensor::<bf16>::scratch(dev, &[rows, 2 * d])?;
        gemm(x, &self.in_proj).run(dev, &mut xz)?;

        let grid = |width: usize| (Grid::tiles(width, 64), Grid::tiles(l, 64), nb as u32);
        let mut u_tok = Tensor::<bf16>::scratch(dev, &[rows, d])?;
        {
            let xz3 = xz.view(&[nb, l, 2 * d], &[l * 2 * d, 2 * d, 1])?;
            let mut u3 = u_tok.view_mut(&[nb, l, d], &[l * d, d, 1])?;
            causal_conv_silu::launch(dev, grid(d), &xz3, &self.conv_w, &self.conv_b, &mut u3)?;
        }
        let mut dt_low = Tensor::<bf16>::scratch(dev, &[rows, r])?;
        let mut b_tok = Tensor::<bf16>::scratch(dev, &[rows, n])?;
        let mut c_tok = Tensor::<bf16>::scratch(dev, &[rows, n])?;
        let mut delta_tok = Tensor::<bf16>::scratch(dev, &[rows, d])?;
        gemm(&u_tok, &self.x_dt).run(dev, &mut dt_low)?;
        gemm(&u_tok, &self.x_b).run(dev, &mut b_tok)?;
        gemm(&u_tok, &self.x_c).run(dev, &mut c_tok)?;
        gemm(&dt_low, &self.dt_proj).run(dev, &mut delta_tok)?;

        // Token-major [batch·L, width] (from column `col0`) into channel-major [batch, width, L].
        let to_channels = |src: &Tensor<bf16>, col0: usize, width: usize| -> Result<Tensor<bf16>> {
            let stride = src.shape()[1];
            let mut dst = Tensor::<bf16>::scratch(dev, &[nb, width, l])?;
            let s3 = src.view(&[nb, l, stride], &[l * stride, stride, 1])?;
            let mut t3 = dst.view_mut(&[nb, l, width], &[width * l, 1, l])?;
            copy_tiles::launch(dev, grid(width), &s3, col0 as i32, &mut t3)?;
            Ok(dst)
        };
        let u = to_channels(&u_tok, 0, d)?;
        let z = to_channels(&xz, d, d)?;
        let delta = to_channels(&delta_tok, 0, d)?;
        let bm = to_channels(&b_tok, 0, n)?.restride(0, &[nb, 1, n, l], &[n * l, n * l, l, 1])?;
        let cm = to_channels(&c_tok, 0, n)?.restride(0, &[nb, 1, n, l], &[n * l, n * l, l, 1])?;

        let mut y = Tensor::<bf16>::scratch(dev, &[nb, d, l])?;
        let mut h_last = Tensor::<f32>::scratch(dev, &[nb, d, n])?;
        SelectiveScan::new(dev, &u, &delta, &self.a, &bm, &cm)
            .d(&self.d)
            .z(&z)
            .delta_bias(&self.dt_bias)
            .delta_softplus(true)
            .run(&mut y, &mut h_last)?;

        let mut y_tok = Tensor::<bf16>::scratch(dev, &[rows, d])?;
        {
            let ych = y.view(&[nb, l, d], &[d * l, 1, l])?;
            let mut yt = y_tok.view_mut(&[nb, l, d], &[l * d, d, 1])?;
            copy_tiles::launch(dev, grid(d), &ych, 0, &mut yt)?;
        }
        gemm(&y_tok, &self.out_proj).run(dev, out)?;
        Ok(h_last)
    }
}

fn wide(v: &[bf16]) -> Vec<f64> {
    v.iter().map(|x| f64::from(x.to_f32())).collect()
}

/// `x·Wᵀ`: x `[rows, k]`, W `[n, k]`.
fn matmul_t(x: &[f64], w: &[f64], k: usize) -> Vec<f64> {
    let n = w.len() / k;
    x.chunks(k)
        .flat_map(|row| w.chunks(k).map(move |wr| row.iter().zip(wr).map(|(a, b)| a * b).sum::<f64>()))
        .take(x.len() / k * n)
        .collect()
}

fn silu64(v: f64) -> f64 {
    v / (1.0 + (-v).exp())
}

/// The block in float64 on the host, one time step after another: `out` `[batch·L, d_model]`
/// and the last state `[batch, D, N]`.
pub fn reference(s: Sizes, p: &Params, x: &[bf16]) -> (Vec<f64>, Vec<f64>) {
    let Sizes { batch: nb, len: l, model: dm, inner: d, states: n, rank: r, taps: kw } = s;
    let xz = matmul_t(&wide(x), &wide(&p.in_proj), dm);
    let mut u = vec![0.0; nb * l * d];
    for b in 0..nb {
        for t in 0..l {
            for c in 0..d {
                let mut acc = f64::from(p.conv_b[c]);
                for k in 0..kw {
                    if let Some(src) = (t + k + 1).checked_sub(kw) {
                        acc += f64::from(p.conv_w[k * d + c]) * xz[(b * l + src) * 2 * d + c];
                    }
                }
                u[(b * l + t) * d + c] = silu64(acc);
            }
        }
    }
    let dt_low = matmul_t(&u, &wide(&p.x_dt), d);
    let bm = matmul_t(&u, &wide(&p.x_b), d);
    let cm = matmul_t(&u, &wide(&p.x_c), d);
    let delta = matmul_t(&dt_low, &wide(&p.dt_proj), r);
    let mut y = vec![0.0; nb * l * d];
    let mut h_last = vec![0.0; nb * d * n];
    for b in 0..nb {
        for c in 0..d {
            let mut h = vec![0.0f64; n];
            for t in 0..l {
                let row = b * l + t;
                let v = delta[row * d + c] + f64::from(p.dt_bias[c]);
                let dt = if v > 20.0 { v } else { v.exp().ln_1p() };
                let ut = u[row * d + c];
                let mut o = f64::from(p.d[c]) * ut;
                for k in 0..n {
                    h[k] = (dt * f64::from(p.a[c * n + k])).exp() * h[k] + dt * bm[row * n + k] * ut;
                    o += cm[row * n + k] * h[k];
                }
                y[row * d + c] = o * silu64(xz[row * 2 * d + d + c]);
            }
            h_last[(b * d + c) * n..(b * d + c + 1) * n].copy_from_slice(&h);
        }
    }
    (matmul_t(&y, &wide(&p.out_proj), d), h_last)
}

/// Runs the block at `s` on random inputs and returns the relative errors (L2) of the output
/// and of the last state against [`reference`]; the output is poisoned before the run.
///
/// # Errors
/// The block's.
pub fn check(dev: &Device, s: Sizes) -> Result<(f64, f64)> {
    let mut rng = tessera::testing::Uniform::new();
    let p = Params::random(s, &mut rng);
    let hx = rng.vec(s.batch * s.len * s.model, bf16::from_f32);
    let block = Block::new(dev, s, &p)?;
    let x = Tensor::from_host(dev, &hx, &[s.batch * s.len, s.model])?;
    let mut out = Tensor::full(dev, &[s.batch * s.len, s.model], bf16::NAN)?;
    let h = block.forward(dev, &x, &mut out)?;
    let (want, want_h) = reference(s, &p, &hx);
    let got: Vec<f64> = wide(&out.to_host()?);
    let got_h: Vec<f64> = h.to_host()?.into_iter().map(f64::from).collect();
    Ok((tessera::testing::rel_error(&got, &want), tessera::testing::rel_error(&got_h, &want_h)))
}

#[allow(dead_code)]
fn main() -> Result<()> {
    let dev = Device::gpu_or_cpu();
    let gpu = !dev.is_cpu();
    let s = if gpu {
        Sizes { batch: 2, len: 1000, model: 256, inner: 512, states: 16, rank: 16, taps: 4 }
    } else {
        Sizes { batch: 2, len: 37, model: 64, inner: 128, states: 16, rank: 8, taps: 4 }
    };
    let (err, err_h) = check(&dev, s)?;
    println!(
        "Mamba block on {}: {s:?}\n  relative error: output {err:.2e}, last state {err_h:.2e}",
        if gpu { dev.name() } else { "the CPU interpreter" }
    );
    assert!(err < 2e-2 && err_h < 2e-2, "relative errors {err}, {err_h}");
    if gpu {
        // Mamba-370M's widths, batch 8 × 2048 tokens.
        let s = Sizes { batch: 8, len: 2048, model: 1024, inner: 2048, states: 16, rank: 64, taps: 4 };
        let mut rng = tessera::testing::Uniform::new();
        let block = Block::new(&dev, s, &Params::random(s, &mut rng))?;
        let x = Tensor::from_host(&dev, &rng.vec(s.batch * s.len * s.model, bf16::from_f32), &[s.batch * s.len, s.model])?;
        let mut out = Tensor::<bf16>::scratch(&dev, &[s.batch * s.len, s.model])?;
        let ms = tessera::testing::time_ms(&dev, 3, 10, || {
            block.forward(&dev, &x, &mut out).map(drop).unwrap_or_else(|e| panic!("{e}"));
        })?;
        println!("  {s:?}: {ms:.3} ms a forward");
    }
    Ok(())
}
