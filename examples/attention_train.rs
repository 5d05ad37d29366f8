//! A causal attention layer's training step with dropout (0.1 of the probabilities, Philox's
//! mask from a seed and the step's offset): the forward keeps its log-sum-exp, a loss
//! `L = Σ O ∘ W` (W random, so `∂L/∂O = W`) is differentiated by `attention_backward` (the same
//! mask, drawn again from the seed), and each
//! gradient is checked against central differences of a float64 forward on the host, taken
//! along the gradient itself (`(L(x + εg) − L(x − εg)) / 2ε` against `Σ g²`). On the GPU it then
//! times forward + backward at a training shape in both backward modes.
//!
//! `cargo run --release --example attention_train` (the GPU where there is one, else the
//! interpreter at a smaller shape).

use tessera::testing::{time_ms, Uniform};
use tessera::{bf16, Device, Tensor};
use tessera_kernels::{attention_backward, attention_dropout_keep, attention_with_lse, Attention};

/// The dropout: probability, Philox seed, this step's offset.
const DROPOUT: (f32, u64, u32) = (0.1, 0x5eed_cafe, 17);

/// Batch, sequence, query heads, key/value heads, head dim; `[batch, seq, heads, dim]`.
#[derive(Clone, Copy)]
struct Shape {
    b: usize,
    s: usize,
    h: usize,
    hk: usize,
    d: usize,
}

/// `Σ O ∘ W` of causal attention in float64 (scale `1/√d`, key/value head `h / group`), each
/// probability kept or dropped as the kernels' mask says (`attention_dropout_keep`) and the
/// kept ones scaled by `1 / (1 − p)`.
fn loss(c: Shape, q: &[f64], k: &[f64], v: &[f64], w: &[f64]) -> f64 {
    let (group, scale) = (c.h / c.hk, 1.0 / (c.d as f64).sqrt());
    let at = |heads: usize, bi: usize, si: usize, hi: usize| ((bi * c.s + si) * heads + hi) * c.d;
    let mut total = 0.0;
    for bi in 0..c.b {
        for hi in 0..c.h {
            for i in 0..c.s {
                let qi = at(c.h, bi, i, hi);
                let kv = |j: usize| at(c.hk, bi, j, hi / group);
                let s: Vec<f64> = (0..=i).map(|j| (0..c.d).map(|x| q[qi + x] * k[kv(j) + x]).sum::<f64>() * scale).collect();
                let m = s.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
                let e: Vec<f64> = s.iter().map(|x| (x - m).exp()).collect();
                let sum: f64 = e.iter().sum();
                let (p, seed, offset) = DROPOUT;
                let z: Vec<f64> = (0..=i)
                    .map(|j| if attention_dropout_keep(seed, offset, bi * c.h + hi, i, j, p) { 1.0 / (1.0 - f64::from(p)) } else { 0.0 })
                    .collect();
                for x in 0..c.d {
                    let o: f64 = (0..=i).map(|j| e[j] * z[j] * v[kv(j) + x]).sum::<f64>() / sum;
                    total += o * w[qi + x];
                }
            }
        }
    }
    total
}

fn main() -> tessera::Result<()> {
    let (dev, gpu) = match Device::new(0) {
        Ok(d) => (d, true),
        Err(_) => (Device::cpu(), false),
    };
    let c = if gpu { Shape { b: 2, s: 333, h: 8, hk: 2, d: 128 } } else { Shape { b: 1, s: 70, h: 2, hk: 1, d: 64 } };
    let mut rng = Uniform::new();
    let (qs, ks) = ([c.b, c.s, c.h, c.d], [c.b, c.s, c.hk, c.d]);
    let mut input = |shape: &[usize], r: f32| {
        let x = rng.vec(shape.iter().product(), |u| bf16::from_f32(u * r));
        let wide: Vec<f64> = x.iter().map(|v| v.to_f64()).collect();
        Tensor::from_host(&dev, &x, shape).map(|t| (t, wide))
    };
    let ((q, qw), (k, kw), (v, vw), (w, ww)) = (input(&qs, 2.0)?, input(&ks, 2.0)?, input(&ks, 1.0)?, input(&qs, 1.0)?);
    let (p, seed, offset) = DROPOUT;
    let opts = Attention::new().causal(true).dropout(p, seed, offset);
    let mut o = Tensor::<bf16>::zeros(&dev, &qs)?;
    let mut lse = Tensor::<f32>::zeros(&dev, &[c.b, c.h, c.s])?;
    attention_with_lse(&dev, &opts, &q, &k, &v, &mut o, &mut lse)?;
    let grads = attention_backward(&dev, &opts, &q, &k, &v, &o, &lse, &w)?;
    println!(
        "causal attention, dropout {p}, b{} s{} h{}/{} d{} on {}: L = {:.4}",
        c.b,
        c.s,
        c.h,
        c.hk,
        c.d,
        dev.name(),
        loss(c, &qw, &kw, &vw, &ww)
    );
    let mut worst: f64 = 0.0;
    for (name, g) in [("dq", &grads.dq), ("dk", &grads.dk), ("dv", &grads.dv)] {
        let g: Vec<f64> = g.to_host()?.iter().map(|x| x.to_f64()).collect();
        let eps = 1e-3 / g.iter().map(|x| x * x).sum::<f64>().sqrt();
        let moved = |sign: f64| {
            let shift = |x: &[f64], on: bool| {
                if on {
                    x.iter().zip(&g).map(|(a, b)| a + sign * eps * b).collect()
                } else {
                    x.to_vec()
                }
            };
            loss(c, &shift(&qw, name == "dq"), &shift(&kw, name == "dk"), &shift(&vw, name == "dv"), &ww)
        };
        let numeric = (moved(1.0) - moved(-1.0)) / (2.0 * eps);
        let analytic: f64 = g.iter().map(|x| x * x).sum();
        let err = (numeric - analytic).abs() / analytic;
        worst = worst.max(err);
        println!("  {name}: along the gradient {analytic:.5e}, central difference {numeric:.5e}, relative error {err:.1e}");
    }
    if worst > 2e-2 {
        eprintln!("gradient check failed: relative error {worst:.1e}");
        std::process::exit(1);
    }
    if gpu {
        // A training shape: B4 H16 S4096 d128 causal; FLOPs 2·B·H·S²·d forward (causal halves
        // 4·B·H·S²·d), 2.5× that backward.
        let (b, h, s, d) = (4, 16, 4096, 128);
        let shape = [b, s, h, d];
        let mut t = || Tensor::from_host(&dev, &rng.vec(b * s * h * d, bf16::from_f32), &shape);
        let (q, k, v, w) = (t()?, t()?, t()?, t()?);
        let mut o = Tensor::<bf16>::zeros(&dev, &shape)?;
        let mut lse = Tensor::<f32>::zeros(&dev, &[b, h, s])?;
        let flop = 2.0 * (b * h * s * s * d) as f64;
        for det in [false, true] {
            let opts = opts.deterministic(det);
            let mut step = || {
                attention_with_lse(&dev, &opts, &q, &k, &v, &mut o, &mut lse).expect("forward");
                drop(attention_backward(&dev, &opts, &q, &k, &v, &o, &lse, &w).expect("backward"));
            };
            let ms = time_ms(&dev, 3, 10, &mut step)?;
            println!(
                "  b{b} h{h} s{s} d{d} causal, dropout {p}, deterministic={det}: forward + backward {ms:.2} ms, {:.0} TFLOP/s",
                flop * 3.5 / ms * 1e-9
            );
        }
    }
    Ok(())
}
