//! Causal linear attention (chunked) against a float64 sequential recurrence on the host,
//! `H_t = exp(g_t)·H_{t−1} + β_t·k_tᵀv_t`, `o_t = scale·q_t·H_t`: fresh random inputs, odd
//! lengths (1, 7, 1000, 4099), head dims 64/128, both layouts, grouped q/k heads, with and
//! without a decay, a β and an initial state; the output and last state poisoned before each
//! launch. On the GPU (sm_90a) and, at small sizes, in the interpreter.
//!
//! bf16 tolerance: the kernel rounds P, the state it multiplies queries by and `w·V` to bf16
//! (as FlashAttention rounds P): outputs agree to about 2.5e-3 relative (we assert 1e-2), the
//! last state, accumulated in f32 from bf16 operands, to about 1.6e-3 (we assert 5e-3).

mod common;

use common::random;
use tessera::testing::{gpu_or_skip, rel_error};
use tessera::{bf16, Device, Tensor};
use tessera_kernels::{AttentionLayout, LinearAttention};

#[derive(Clone, Copy, Debug)]
struct Case {
    batch: usize,
    heads: usize,
    qk_heads: usize,
    len: usize,
    dk: usize,
    dv: usize,
    layout: AttentionLayout,
    decay: bool,
    beta: bool,
    h0: bool,
}

/// Element `[b, h, t, d]` of a `[batch, seq, heads, d]` or `[batch, heads, seq, d]` tensor.
fn at(c: Case, heads: usize, d: usize, b: usize, h: usize, t: usize, i: usize) -> usize {
    match c.layout {
        AttentionLayout::Bshd => ((b * c.len + t) * heads + h) * d + i,
        AttentionLayout::Bhsd => ((b * heads + h) * c.len + t) * d + i,
    }
}

/// The output and the last state, sequentially in f64.
#[allow(clippy::too_many_arguments)]
fn reference(c: Case, q: &[f64], k: &[f64], v: &[f64], g: &[f64], beta: &[f64], h0: &[f64], scale: f64) -> (Vec<f64>, Vec<f64>) {
    let (dk, dv, group) = (c.dk, c.dv, c.heads / c.qk_heads);
    let mut o = vec![0.0; c.batch * c.heads * c.len * dv];
    let mut last = vec![0.0; c.batch * c.heads * dk * dv];
    for b in 0..c.batch {
        for h in 0..c.heads {
            let bh = b * c.heads + h;
            let mut s: Vec<f64> = if c.h0 { h0[bh * dk * dv..(bh + 1) * dk * dv].to_vec() } else { vec![0.0; dk * dv] };
            for t in 0..c.len {
                let decay = if c.decay { g[bh * c.len + t].exp() } else { 1.0 };
                let w = if c.beta { beta[bh * c.len + t] } else { 1.0 };
                for i in 0..dk {
                    let kt = k[at(c, c.qk_heads, dk, b, h / group, t, i)];
                    for j in 0..dv {
                        s[i * dv + j] = decay * s[i * dv + j] + w * kt * v[at(c, c.heads, dv, b, h, t, j)];
                    }
                }
                for j in 0..dv {
                    let dot: f64 = (0..dk).map(|i| q[at(c, c.qk_heads, dk, b, h / group, t, i)] * s[i * dv + j]).sum();
                    o[at(c, c.heads, dv, b, h, t, j)] = scale * dot;
                }
            }
            last[bh * dk * dv..(bh + 1) * dk * dv].copy_from_slice(&s);
        }
    }
    (o, last)
}

fn run_case(dev: &Device, c: Case) {
    let shape = |heads: usize, d: usize| match c.layout {
        AttentionLayout::Bshd => vec![c.batch, c.len, heads, d],
        AttentionLayout::Bhsd => vec![c.batch, heads, c.len, d],
    };
    let bf = |n: usize| random(n, -1.0, 1.0).into_iter().map(bf16::from_f32).collect::<Vec<_>>();
    let wide = |x: &[bf16]| x.iter().map(|v| f64::from(v.to_f32())).collect::<Vec<_>>();
    let (nq, nv) = (c.batch * c.qk_heads * c.len * c.dk, c.batch * c.heads * c.len * c.dv);
    let (hq, hk, hv) = (bf(nq), bf(nq), bf(nv));
    let steps = c.batch * c.heads * c.len;
    // Log decays as a gate gives them: between e^-0.6 and e^-0.002 a step.
    let hg = random(steps, -0.6, -0.002);
    let hb = random(steps, 0.1, 1.0);
    let hh0 = random(c.batch * c.heads * c.dk * c.dv, -1.0, 1.0);
    let q = Tensor::from_host(dev, &hq, &shape(c.qk_heads, c.dk)).unwrap();
    let k = Tensor::from_host(dev, &hk, &shape(c.qk_heads, c.dk)).unwrap();
    let v = Tensor::from_host(dev, &hv, &shape(c.heads, c.dv)).unwrap();
    let g = Tensor::from_host(dev, &hg, &[c.batch, c.heads, c.len]).unwrap();
    let beta = Tensor::from_host(dev, &hb, &[c.batch, c.heads, c.len]).unwrap();
    let h0 = Tensor::from_host(dev, &hh0, &[c.batch, c.heads, c.dk, c.dv]).unwrap();
    let mut o = Tensor::full(dev, &shape(c.heads, c.dv), bf16::from_f32(f32::NAN)).unwrap();
    let mut last = Tensor::full(dev, &[c.batch, c.heads, c.dk, c.dv], f32::NAN).unwrap();
    let mut la = LinearAttention::new(dev, &q, &k, &v).layout(c.layout);
    if c.decay {
        la = la.decay(&g);
    }
    if c.beta {
        la = la.beta(&beta);
    }
    if c.h0 {
        la = la.initial_state(&h0);
    }
    la.run(&mut o, Some(&mut last)).unwrap();
    let scale = 1.0 / (c.dk as f64).sqrt();
    let f = |x: &[f32]| x.iter().map(|&v| f64::from(v)).collect::<Vec<_>>();
    let (want_o, want_h) = reference(c, &wide(&hq), &wide(&hk), &wide(&hv), &f(&hg), &f(&hb), &f(&hh0), scale);
    let got_o = wide(&o.to_host().unwrap());
    let got_h = f(&last.to_host().unwrap());
    let (eo, eh) = (rel_error(&got_o, &want_o), rel_error(&got_h, &want_h));
    assert!(eo < 1e-2, "{c:?}: output relative error {eo}");
    assert!(eh < 5e-3, "{c:?}: last state relative error {eh}");
}

fn case(len: usize, dk: usize, dv: usize) -> Case {
    Case { batch: 2, heads: 2, qk_heads: 2, len, dk, dv, layout: AttentionLayout::Bshd, decay: false, beta: false, h0: false }
}

fn gated(c: Case) -> Case {
    Case { decay: true, beta: true, h0: true, ..c }
}

#[test]
fn gpu_linear_attention_matches_recurrence() {
    let Some(dev) = gpu_or_skip("gpu_linear_attention_matches_recurrence") else { return };
    for len in [1, 7, 1000, 4099] {
        for (dk, dv) in [(128, 128), (64, 64), (128, 64), (64, 128)] {
            run_case(&dev, case(len, dk, dv));
            run_case(&dev, gated(case(len, dk, dv)));
        }
    }
    // The other layout, grouped q/k heads (Mamba-2's groups), decay alone, β alone.
    let c = Case { batch: 3, heads: 4, qk_heads: 2, layout: AttentionLayout::Bhsd, ..case(1000, 128, 64) };
    run_case(&dev, c);
    run_case(&dev, Case { decay: true, ..c });
    run_case(&dev, Case { beta: true, qk_heads: 1, layout: AttentionLayout::Bshd, ..c });
}

#[test]
fn interp_linear_attention_matches_recurrence() {
    let dev = Device::cpu();
    for len in [1, 7, 130] {
        run_case(&dev, gated(case(len, 64, 64)));
    }
    run_case(&dev, case(70, 128, 128));
    run_case(&dev, Case { batch: 1, heads: 4, qk_heads: 2, layout: AttentionLayout::Bhsd, decay: true, ..case(100, 128, 64) });
}
