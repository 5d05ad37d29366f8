//! A Hyena operator (order 2) end to end on Tessera kernels, checked against a float64 host
//! reference of the same math:
//!
//! ```text
//! u [batch, d_model, L]                      (channel-major, bf16)
//!   → three projection GEMMs     v, x1, x2 = W_v·u, W_1·u, W_2·u            [batch, D, L]
//!   → short causal convolutions  each: Σ_j s[c, j]·(·)[t − j] + b[c]        (3 taps, Conv1d)
//!   → long causal convolution    z1 = x1 ⊙ (h1 ∗ v + D1·v)                  (filters as long as L)
//!   → long causal convolution    z2 = x2 ⊙ (h2 ∗ z1 + D2·z1)
//!   → output projection GEMM     out = W_o·z2                               [batch, d_model, L]
//! ```
//!
//! Each long convolution is one [`Conv1d`] with its epilogue chain: the skip term `D·x` and the
//! gate `⊙ x_i` are fused into the convolution's store (`.skip(d).gate(x)`), as Hyena needs
//! them. The long filters are Hyena's implicit ones in spirit (decaying, as long as the
//! sequence), drawn at random here. The GEMMs read the weights as a strided batch, one copy a
//! sequence (`[batch, D, d_model]`), so that the activations stay channel-major throughout.
//!
//! `cargo run --release --example hyena_block`: on the GPU where there is one, else on the CPU
//! interpreter at a small size. The long convolutions take the direct path for now (its cost
//! grows with the filter's length; the FFT paths are to come, notes/ISSUE-31.md).

use tessera::{bf16, Device, Result, Tensor};
use tessera_kernels::{gemm, BLayout, Conv1d, ConvMode};

/// The operator's sizes.
#[derive(Clone, Copy, Debug)]
pub struct Sizes {
    /// Sequences.
    pub batch: usize,
    /// Steps a sequence.
    pub len: usize,
    /// The model's width.
    pub model: usize,
    /// Channels of the convolutions (`D`).
    pub inner: usize,
    /// The short convolutions' taps.
    pub taps: usize,
}

/// The parameters as host vectors (bf16 where a GEMM reads them, f32 elsewhere).
pub struct Params {
    /// `W_v`, `W_1`, `W_2`, each `[D, d_model]`.
    proj: [Vec<bf16>; 3],
    /// The short filters `[D, taps]` and biases `[D]`, one a branch.
    short: [Vec<f32>; 3],
    short_bias: [Vec<f32>; 3],
    /// The long filters `[D, L]` and skips `[D]`.
    long: [Vec<f32>; 2],
    skip: [Vec<f32>; 2],
    /// `W_o` `[d_model, D]`.
    out: Vec<bf16>,
}

impl Params {
    /// Random parameters: weights uniform in ±1/√fan_in, short filters in ±1/√taps, long ones
    /// decaying as `e^(−3j/L)` (scaled by 2/√L), skips near 1.
    pub fn random(s: Sizes, rng: &mut tessera::testing::Uniform) -> Params {
        let w = |rng: &mut tessera::testing::Uniform, n: usize, fan_in: usize| {
            let k = 1.0 / (fan_in as f32).sqrt();
            rng.vec(n, |v| bf16::from_f32(v * k))
        };
        let short = |rng: &mut tessera::testing::Uniform| rng.vec(s.inner * s.taps, |v| v / (s.taps as f32).sqrt());
        let long = |rng: &mut tessera::testing::Uniform| {
            let scale = 2.0 / (s.len as f32).sqrt();
            let mut h = rng.vec(s.inner * s.len, |v| v * scale);
            for (i, v) in h.iter_mut().enumerate() {
                *v *= (-3.0 * (i % s.len) as f32 / s.len as f32).exp();
            }
            h
        };
        Params {
            proj: [w(rng, s.inner * s.model, s.model), w(rng, s.inner * s.model, s.model), w(rng, s.inner * s.model, s.model)],
            short: [short(rng), short(rng), short(rng)],
            short_bias: [rng.vec(s.inner, |v| v * 0.1), rng.vec(s.inner, |v| v * 0.1), rng.vec(s.inner, |v| v * 0.1)],
            long: [long(rng), long(rng)],
            skip: [rng.vec(s.inner, |v| 1.0 + 0.1 * v), rng.vec(s.inner, |v| 1.0 + 0.1 * v)],
            out: w(rng, s.model * s.inner, s.inner),
        }
    }
}

/// The parameters on a device.
pub struct Block {
    sizes: Sizes,
    proj: Vec<Tensor<bf16>>,
    short: Vec<Tensor<f32>>,
    short_bias: Vec<Tensor<f32>>,
    long: Vec<Tensor<f32>>,
    skip: Vec<Tensor<f32>>,
    out: Tensor<bf16>,
}

impl Block {
    /// Uploads `p`, the GEMMs' weights once a sequence.
    ///
    /// # Errors
    /// A driver failure.
    pub fn new(dev: &Device, s: Sizes, p: &Params) -> Result<Block> {
        let batched = |w: &[bf16], rows: usize, cols: usize| Tensor::from_host(dev, &w.repeat(s.batch), &[s.batch, rows, cols]);
        Ok(Block {
            sizes: s,
            proj: p.proj.iter().map(|w| batched(w, s.inner, s.model)).collect::<Result<_>>()?,
            short: p.short.iter().map(|k| Tensor::from_host(dev, k, &[s.inner, s.taps])).collect::<Result<_>>()?,
            short_bias: p.short_bias.iter().map(|b| Tensor::from_host(dev, b, &[s.inner])).collect::<Result<_>>()?,
            long: p.long.iter().map(|h| Tensor::from_host(dev, h, &[s.inner, s.len])).collect::<Result<_>>()?,
            skip: p.skip.iter().map(|d| Tensor::from_host(dev, d, &[s.inner])).collect::<Result<_>>()?,
            out: batched(&p.out, s.model, s.inner)?,
        })
    }

    /// The operator on `u` (`[batch, d_model, L]`) into `out` (the same shape).
    ///
    /// # Errors
    /// A launch's or the library's errors (shapes that do not fit).
    pub fn forward(&self, dev: &Device, u: &Tensor<bf16>, out: &mut Tensor<bf16>) -> Result<()> {
        let Sizes { batch: nb, len: l, inner: d, .. } = self.sizes;
        // Projection then short convolution, a branch at a time: [batch, D, L].
        let branch = |i: usize| -> Result<Tensor<bf16>> {
            let mut p = Tensor::<bf16>::scratch(dev, &[nb, d, l])?;
            gemm(&self.proj[i], u).b_layout(BLayout::KxN).run(dev, &mut p)?;
            let mut s = Tensor::<bf16>::scratch(dev, &[nb, d, l])?;
            Conv1d::new(dev, &p, &self.short[i], ConvMode::Causal).bias(&self.short_bias[i]).run(&mut s)?;
            Ok(s)
        };
        let (v, x1, x2) = (branch(0)?, branch(1)?, branch(2)?);
        // The long convolutions, the skip and the gate in their epilogues.
        let mut z1 = Tensor::<bf16>::scratch(dev, &[nb, d, l])?;
        Conv1d::new(dev, &v, &self.long[0], ConvMode::Causal).skip(&self.skip[0]).gate(&x1).run(&mut z1)?;
        let mut z2 = Tensor::<bf16>::scratch(dev, &[nb, d, l])?;
        Conv1d::new(dev, &z1, &self.long[1], ConvMode::Causal).skip(&self.skip[1]).gate(&x2).run(&mut z2)?;
        gemm(&self.out, &z2).b_layout(BLayout::KxN).run(dev, out)
    }
}

fn wide(v: &[bf16]) -> Vec<f64> {
    v.iter().map(|x| f64::from(x.to_f32())).collect()
}

/// `W·x` for each sequence: W `[n, k]`, x `[batch, k, L]` → `[batch, n, L]`.
fn project(w: &[f64], x: &[f64], k: usize, l: usize) -> Vec<f64> {
    let n = w.len() / k;
    let mut out = Vec::with_capacity(x.len() / k * n);
    for xb in x.chunks(k * l) {
        for wr in w.chunks(k) {
            out.extend((0..l).map(|t| wr.iter().enumerate().map(|(j, a)| a * xb[j * l + t]).sum::<f64>()));
        }
    }
    out
}

/// `y[c, t] = Σ_j h[c, j]·x[c, t − j] (+ bias[c]) (+ skip[c]·x[c, t])`, times `gate` where
/// given, for every sequence (`h` `[D, taps]`): a causal convolution from its definition.
fn causal(x: &[f64], h: &[f32], d: usize, l: usize, bias: Option<&[f32]>, skip: Option<&[f32]>, gate: Option<&[f64]>) -> Vec<f64> {
    let taps = h.len() / d;
    let mut y = vec![0.0; x.len()];
    for (r, row) in x.chunks(l).enumerate() {
        let c = r % d;
        for t in 0..l {
            let mut acc: f64 = (0..taps.min(t + 1)).map(|j| f64::from(h[c * taps + j]) * row[t - j]).sum();
            acc += bias.map_or(0.0, |b| f64::from(b[c]));
            acc += skip.map_or(0.0, |s| f64::from(s[c]) * row[t]);
            y[r * l + t] = acc * gate.map_or(1.0, |g| g[r * l + t]);
        }
    }
    y
}

/// The operator in float64 on the host: `out` `[batch, d_model, L]`.
pub fn reference(s: Sizes, p: &Params, u: &[bf16]) -> Vec<f64> {
    let Sizes { len: l, model: dm, inner: d, .. } = s;
    let u = wide(u);
    let br: Vec<Vec<f64>> =
        (0..3).map(|i| causal(&project(&wide(&p.proj[i]), &u, dm, l), &p.short[i], d, l, Some(&p.short_bias[i]), None, None)).collect();
    let z1 = causal(&br[0], &p.long[0], d, l, None, Some(&p.skip[0]), Some(&br[1]));
    let z2 = causal(&z1, &p.long[1], d, l, None, Some(&p.skip[1]), Some(&br[2]));
    project(&wide(&p.out), &z2, d, l)
}

/// Runs the operator at `s` on random inputs and returns the output's relative error (L2)
/// against [`reference`]; the output is poisoned before the run.
///
/// # Errors
/// The operator's.
pub fn check(dev: &Device, s: Sizes) -> Result<f64> {
    let mut rng = tessera::testing::Uniform::new();
    let p = Params::random(s, &mut rng);
    let hu = rng.vec(s.batch * s.model * s.len, bf16::from_f32);
    let block = Block::new(dev, s, &p)?;
    let u = Tensor::from_host(dev, &hu, &[s.batch, s.model, s.len])?;
    let mut out = Tensor::full(dev, &[s.batch, s.model, s.len], bf16::NAN)?;
    block.forward(dev, &u, &mut out)?;
    Ok(tessera::testing::rel_error(&wide(&out.to_host()?), &reference(s, &p, &hu)))
}

#[allow(dead_code)]
fn main() -> Result<()> {
    let dev = Device::gpu_or_cpu();
    let gpu = !dev.is_cpu();
    let s = if gpu {
        Sizes { batch: 2, len: 1000, model: 128, inner: 256, taps: 3 }
    } else {
        Sizes { batch: 2, len: 45, model: 32, inner: 48, taps: 3 }
    };
    let err = check(&dev, s)?;
    println!("Hyena operator on {}: {s:?}\n  relative error: {err:.2e}", if gpu { dev.name() } else { "the CPU interpreter" });
    assert!(err < 2e-2, "relative error {err}");
    if gpu {
        let s = Sizes { batch: 4, len: 4096, model: 768, inner: 768, taps: 3 };
        let mut rng = tessera::testing::Uniform::new();
        let block = Block::new(&dev, s, &Params::random(s, &mut rng))?;
        let u = Tensor::from_host(&dev, &rng.vec(s.batch * s.model * s.len, bf16::from_f32), &[s.batch, s.model, s.len])?;
        let mut out = Tensor::<bf16>::scratch(&dev, &[s.batch, s.model, s.len])?;
        let ms = tessera::testing::time_ms(&dev, 1, 3, || {
            block.forward(&dev, &u, &mut out).unwrap_or_else(|e| panic!("{e}"));
        })?;
        println!("  {s:?}: {ms:.3} ms a forward (the long convolutions on the direct path)");
    }
    Ok(())
}
