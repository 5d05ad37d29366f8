//! Causal linear attention (chunked) against a float64 sequential recurrence on the host,
//! `H_t = exp(g_t)·H_{t−1} + β_t·k_tᵀv_t`, `o_t = scale·q_t·H_t`: fresh random inputs, odd
//! lengths (1, 7, 1000, 4099), head dims 64/128, both layouts, grouped q/k heads, with and
//! without a decay, a β and an initial state; the output and last state poisoned before each
//! launch; per-channel gates (GLA: `H_t = diag(exp(g_t))·H_{t−1} + …`, forward and steps);
//! feature maps (elu + 1, relu) on q and k, their gradients taken through φ′ on the
//! host. On the GPU (sm_90a) and, at small sizes, in the interpreter.
//!
//! bf16 tolerance: the kernel rounds P, the state it multiplies queries by and `w·V` to bf16
//! (as FlashAttention rounds P): outputs agree to about 2.5e-3 relative (we assert 1e-2), the
//! last state, accumulated in f32 from bf16 operands, to about 1.6e-3 (we assert 5e-3). The
//! gradients (dq, dk, dv, dg, dβ, the initial state's) agree to about 2.5e-3 (we assert 1e-2).
//! The SSD (`Ssd`, Mamba-2) runs through the same kernels and is checked the same way.

mod common;

use common::random;
use tessera::testing::{gpu_or_skip, rel_error};
use tessera::{bf16, Device, Tensor};
use tessera_kernels::{AttentionLayout, FeatureMap, LinearAttention};

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
    feature: FeatureMap,
    /// Per-channel gates (GLA) instead of a scalar decay.
    gates: bool,
}

/// φ(x) and φ′(x) of a feature map.
fn phi(f: FeatureMap, x: f64) -> (f64, f64) {
    match f {
        FeatureMap::Identity => (x, 1.0),
        FeatureMap::EluPlusOne if x > 0.0 => (x + 1.0, 1.0),
        FeatureMap::EluPlusOne => (x.exp(), x.exp()),
        FeatureMap::Relu if x > 0.0 => (x, 1.0),
        FeatureMap::Relu => (0.0, 0.0),
    }
}

fn mapped(c: Case, x: &[f64]) -> Vec<f64> {
    x.iter().map(|&v| phi(c.feature, v).0).collect()
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
fn reference(
    c: Case, q: &[f64], k: &[f64], v: &[f64], g: &[f64], beta: &[f64], h0: &[f64], gv: &[f64], scale: f64,
) -> (Vec<f64>, Vec<f64>) {
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
                    let decay = if c.gates { gv[at(c, c.qk_heads, dk, b, h / group, t, i)].exp() } else { decay };
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

/// A case's inputs, on the host (bf16 as the kernels read them, widened) and on the device.
struct Inputs {
    q: Tensor<bf16>,
    k: Tensor<bf16>,
    v: Tensor<bf16>,
    g: Tensor<f32>,
    beta: Tensor<f32>,
    h0: Tensor<f32>,
    gv: Tensor<f32>,
    host: [Vec<f64>; 7],
}

fn shape(c: Case, heads: usize, d: usize) -> Vec<usize> {
    match c.layout {
        AttentionLayout::Bshd => vec![c.batch, c.len, heads, d],
        AttentionLayout::Bhsd => vec![c.batch, heads, c.len, d],
    }
}

fn bf16_random(n: usize) -> (Vec<bf16>, Vec<f64>) {
    let x: Vec<bf16> = random(n, -1.0, 1.0).into_iter().map(bf16::from_f32).collect();
    let w = x.iter().map(|v| f64::from(v.to_f32())).collect();
    (x, w)
}

fn inputs(dev: &Device, c: Case) -> Inputs {
    let (nq, nv) = (c.batch * c.qk_heads * c.len * c.dk, c.batch * c.heads * c.len * c.dv);
    let ((hq, wq), (hk, wk), (hv, wv)) = (bf16_random(nq), bf16_random(nq), bf16_random(nv));
    let steps = c.batch * c.heads * c.len;
    // Log decays as a gate gives them: between e^-0.6 and e^-0.002 a step.
    let (hg, hb) = (random(steps, -0.6, -0.002), random(steps, 0.1, 1.0));
    let hh0 = random(c.batch * c.heads * c.dk * c.dv, -1.0, 1.0);
    // Per-channel log gates, as k: between e^-0.1 and e^-0.002 a step (GLA's logsigmoid/16
    // gates are near −0.04). Their gradient is the difference q̂·dq̂ − k̂·dk̂ of 16-bit gradients
    // (as fla's chunk_gla takes it): about 1e-2 relative at −0.2, 1.7e-2 at −0.6.
    let hgv = random(nq, -0.1, -0.002);
    let f = |x: &[f32]| x.iter().map(|&v| f64::from(v)).collect::<Vec<_>>();
    Inputs {
        q: Tensor::from_host(dev, &hq, &shape(c, c.qk_heads, c.dk)).unwrap(),
        k: Tensor::from_host(dev, &hk, &shape(c, c.qk_heads, c.dk)).unwrap(),
        v: Tensor::from_host(dev, &hv, &shape(c, c.heads, c.dv)).unwrap(),
        g: Tensor::from_host(dev, &hg, &[c.batch, c.heads, c.len]).unwrap(),
        beta: Tensor::from_host(dev, &hb, &[c.batch, c.heads, c.len]).unwrap(),
        h0: Tensor::from_host(dev, &hh0, &[c.batch, c.heads, c.dk, c.dv]).unwrap(),
        gv: Tensor::from_host(dev, &hgv, &shape(c, c.qk_heads, c.dk)).unwrap(),
        host: [wq, wk, wv, f(&hg), f(&hb), f(&hh0), f(&hgv)],
    }
}

impl Inputs {
    fn attention<'a>(&'a self, dev: &'a Device, c: Case) -> LinearAttention<'a, bf16> {
        let mut la = LinearAttention::new(dev, &self.q, &self.k, &self.v).layout(c.layout);
        if c.decay {
            la = la.decay(&self.g);
        }
        if c.beta {
            la = la.beta(&self.beta);
        }
        if c.h0 {
            la = la.initial_state(&self.h0);
        }
        if c.gates {
            la = la.gates(&self.gv);
        }
        la.feature_map(c.feature)
    }
}

fn wide<T: Copy + Into<f64>>(x: &[T]) -> Vec<f64> {
    x.iter().map(|&v| v.into()).collect()
}

fn wide_bf16(x: &[bf16]) -> Vec<f64> {
    x.iter().map(|v| f64::from(v.to_f32())).collect()
}

fn run_case(dev: &Device, c: Case) {
    let inp = inputs(dev, c);
    let mut o = Tensor::full(dev, &shape(c, c.heads, c.dv), bf16::from_f32(f32::NAN)).unwrap();
    let mut last = Tensor::full(dev, &[c.batch, c.heads, c.dk, c.dv], f32::NAN).unwrap();
    inp.attention(dev, c).run(&mut o, Some(&mut last)).unwrap();
    let [q, k, v, g, b, h0, gv] = &inp.host;
    let (want_o, want_h) = reference(c, &mapped(c, q), &mapped(c, k), v, g, b, h0, gv, 1.0 / (c.dk as f64).sqrt());
    let (eo, eh) = (rel_error(&wide_bf16(&o.to_host().unwrap()), &want_o), rel_error(&wide(&last.to_host().unwrap()), &want_h));
    assert!(eo < 1e-2, "{c:?}: output relative error {eo}");
    assert!(eh < 5e-3, "{c:?}: last state relative error {eh}");
}

/// The gradients (dq, dk, dv, dg, dβ, dh0) of `⟨o, dout⟩ + ⟨h_last, dh_last⟩` in f64 by
/// reverse-mode through the sequential recurrence: the states kept every 64 steps, each
/// segment's rebuilt from its checkpoint on the way back.
#[allow(clippy::too_many_arguments)]
fn reference_backward(
    c: Case, q: &[f64], k: &[f64], v: &[f64], g: &[f64], beta: &[f64], h0: &[f64], gates: &[f64], dout: &[f64], dh_last: &[f64], scale: f64,
) -> [Vec<f64>; 6] {
    let (dk, dv, group) = (c.dk, c.dv, c.heads / c.qk_heads);
    let mut gq = vec![0.0; q.len()];
    let mut gk = vec![0.0; k.len()];
    let mut gv = vec![0.0; v.len()];
    // ∂L/∂g: a scalar decay's ([batch, heads, seq]) or the gates' (as k).
    let mut gg = vec![0.0; if c.gates { k.len() } else { g.len() }];
    let mut gb = vec![0.0; beta.len()];
    let mut gh0 = vec![0.0; h0.len()];
    for b in 0..c.batch {
        for h in 0..c.heads {
            let bh = b * c.heads + h;
            let decay = |t: usize| if c.decay { g[bh * c.len + t].exp() } else { 1.0 };
            let w = |t: usize| if c.beta { beta[bh * c.len + t] } else { 1.0 };
            let qi = |t: usize, i: usize| at(c, c.qk_heads, dk, b, h / group, t, i);
            let vi = |t: usize, j: usize| at(c, c.heads, dv, b, h, t, j);
            // The decay of state row i at step t: the scalar one, or the gate of channel i.
            let dec = |t: usize, i: usize| -> f64 {
                if c.gates {
                    gates[qi(t, i)].exp()
                } else {
                    decay(t)
                }
            };
            let step = |s: &mut [f64], t: usize| {
                for i in 0..dk {
                    for j in 0..dv {
                        s[i * dv + j] = dec(t, i) * s[i * dv + j] + w(t) * k[qi(t, i)] * v[vi(t, j)];
                    }
                }
            };
            // States before each 64-step segment.
            let mut s: Vec<f64> = if c.h0 { h0[bh * dk * dv..(bh + 1) * dk * dv].to_vec() } else { vec![0.0; dk * dv] };
            let mut marks = Vec::new();
            for t in 0..c.len {
                if t % 64 == 0 {
                    marks.push(s.clone());
                }
                step(&mut s, t);
            }
            let mut dh: Vec<f64> =
                if c.decay || c.beta || c.h0 || c.gates { dh_last[bh * dk * dv..(bh + 1) * dk * dv].to_vec() } else { vec![0.0; dk * dv] };
            for seg in (0..marks.len()).rev() {
                // H_{t−1} for each t of the segment, rebuilt forward.
                let mut states = vec![marks[seg].clone()];
                let end = ((seg + 1) * 64).min(c.len);
                for t in seg * 64..end {
                    let mut n = states.last().unwrap().clone();
                    step(&mut n, t);
                    states.push(n);
                }
                for t in (seg * 64..end).rev() {
                    let (prev, cur) = (&states[t - seg * 64], &states[t - seg * 64 + 1]);
                    for i in 0..dk {
                        for j in 0..dv {
                            dh[i * dv + j] += scale * q[qi(t, i)] * dout[vi(t, j)];
                        }
                    }
                    for i in 0..dk {
                        gq[qi(t, i)] += scale * (0..dv).map(|j| dout[vi(t, j)] * cur[i * dv + j]).sum::<f64>();
                        gk[qi(t, i)] += w(t) * (0..dv).map(|j| dh[i * dv + j] * v[vi(t, j)]).sum::<f64>();
                    }
                    for j in 0..dv {
                        gv[vi(t, j)] += w(t) * (0..dk).map(|i| k[qi(t, i)] * dh[i * dv + j]).sum::<f64>();
                    }
                    gb[bh * c.len + t] = (0..dk).map(|i| k[qi(t, i)] * (0..dv).map(|j| dh[i * dv + j] * v[vi(t, j)]).sum::<f64>()).sum();
                    if c.gates {
                        for i in 0..dk {
                            let row: f64 = (0..dv).map(|j| dh[i * dv + j] * prev[i * dv + j]).sum();
                            gg[qi(t, i)] += dec(t, i) * row;
                            dh[i * dv..(i + 1) * dv].iter_mut().for_each(|x| *x *= dec(t, i));
                        }
                    } else {
                        gg[bh * c.len + t] = decay(t) * dh.iter().zip(prev).map(|(x, y)| x * y).sum::<f64>();
                        dh.iter_mut().for_each(|x| *x *= decay(t));
                    }
                }
            }
            gh0[bh * dk * dv..(bh + 1) * dk * dv].copy_from_slice(&dh);
        }
    }
    [gq, gk, gv, gg, gb, gh0]
}

fn run_backward(dev: &Device, c: Case) {
    let inp = inputs(dev, c);
    let (hdo, wdo) = bf16_random(c.batch * c.heads * c.len * c.dv);
    let dout = Tensor::from_host(dev, &hdo, &shape(c, c.heads, c.dv)).unwrap();
    let hdl = random(c.batch * c.heads * c.dk * c.dv, -1.0, 1.0);
    let dh_last = Tensor::from_host(dev, &hdl, &[c.batch, c.heads, c.dk, c.dv]).unwrap();
    // The last state's gradient rides along with any of the state's extras.
    let with_dh = c.decay || c.beta || c.h0 || c.gates;
    let grads = inp.attention(dev, c).backward(&dout, with_dh.then_some(&dh_last)).unwrap();
    let [q, k, v, g, b, h0, gv] = &inp.host;
    let (fq, fk) = (mapped(c, q), mapped(c, k));
    let mut want = reference_backward(c, &fq, &fk, v, g, b, h0, gv, &wdo, &wide(&hdl), 1.0 / (c.dk as f64).sqrt());
    // Through φ: ∂L/∂x = ∂L/∂φ(x)·φ′(x).
    for (grad, x) in want.iter_mut().zip([q, k]) {
        grad.iter_mut().zip(x).for_each(|(d, &x)| *d *= phi(c.feature, x).1);
    }
    let got: [(&str, Option<Vec<f64>>); 6] = [
        ("dq", Some(wide_bf16(&grads.dq.to_host().unwrap()))),
        ("dk", Some(wide_bf16(&grads.dk.to_host().unwrap()))),
        ("dv", Some(wide_bf16(&grads.dv.to_host().unwrap()))),
        ("dg", grads.dg.map(|t| wide(&t.to_host().unwrap()))),
        ("dbeta", grads.dbeta.map(|t| wide(&t.to_host().unwrap()))),
        ("dh0", grads.dh0.map(|t| wide(&t.to_host().unwrap()))),
    ];
    let expected = [true, true, true, c.decay || c.gates, c.beta, c.h0];
    for ((name, got), (want, present)) in got.into_iter().zip(want.iter().zip(expected)) {
        assert_eq!(got.is_some(), present, "{c:?}: {name} present");
        if let Some(got) = got {
            let err = rel_error(&got, want);
            // dg and dβ are a number a step, each a sum over the heads' dot products that
            // largely cancel, from bf16 operands: at length 1 (four numbers in all) their
            // relative error reaches 1–2% by chance (a run in 20 or so above 1%).
            let tol = if matches!(name, "dg" | "dbeta") { 3e-2 } else { 1e-2 };
            assert!(err < tol, "{c:?}: {name} relative error {err}");
        }
    }
}

fn case(len: usize, dk: usize, dv: usize) -> Case {
    Case {
        batch: 2,
        heads: 2,
        qk_heads: 2,
        len,
        dk,
        dv,
        layout: AttentionLayout::Bshd,
        decay: false,
        beta: false,
        h0: false,
        feature: FeatureMap::Identity,
        gates: false,
    }
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
    // Value heads of 64 in pairs a block (two sharing their q and k heads, side by side), and
    // grouped heads that cannot pair (three to a group).
    for len in [7, 4099] {
        run_case(&dev, Case { heads: 4, qk_heads: 2, ..gated(case(len, 128, 64)) });
        run_case(&dev, Case { heads: 3, qk_heads: 1, ..gated(case(len, 64, 64)) });
    }
    // Feature maps on q and k.
    run_case(&dev, Case { feature: FeatureMap::EluPlusOne, ..gated(case(1000, 128, 128)) });
    run_case(&dev, Case { feature: FeatureMap::EluPlusOne, ..case(4099, 64, 64) });
    run_case(&dev, Case { feature: FeatureMap::Relu, decay: true, ..c });
    // Per-channel gates (GLA).
    for len in [1, 7, 1000, 4099] {
        run_case(&dev, Case { gates: true, beta: true, h0: true, ..case(len, 128, 128) });
    }
    run_case(&dev, Case { gates: true, ..case(1000, 64, 64) });
    run_case(&dev, Case { gates: true, heads: 4, qk_heads: 2, layout: AttentionLayout::Bhsd, ..case(1000, 128, 64) });
}

#[test]
fn gpu_linear_attention_backward_matches_reverse_mode() {
    let Some(dev) = gpu_or_skip("gpu_linear_attention_backward_matches_reverse_mode") else { return };
    for len in [1, 7, 1000, 4099] {
        for (dk, dv) in [(128, 128), (64, 64), (128, 64)] {
            run_backward(&dev, case(len, dk, dv));
            run_backward(&dev, gated(case(len, dk, dv)));
        }
    }
    let c = Case { batch: 3, heads: 4, qk_heads: 2, layout: AttentionLayout::Bhsd, ..case(1000, 128, 64) };
    run_backward(&dev, Case { decay: true, ..c });
    run_backward(&dev, Case { beta: true, qk_heads: 1, layout: AttentionLayout::Bshd, ..c });
    for len in [7, 4099] {
        run_backward(&dev, Case { heads: 4, qk_heads: 2, ..gated(case(len, 128, 64)) });
        run_backward(&dev, Case { heads: 3, qk_heads: 1, ..gated(case(len, 64, 64)) });
    }
    run_backward(&dev, Case { feature: FeatureMap::EluPlusOne, ..gated(case(1000, 128, 128)) });
    run_backward(&dev, Case { feature: FeatureMap::Relu, decay: true, ..c });
    // Per-channel gates (GLA).
    for len in [1, 7, 1000, 4099] {
        run_backward(&dev, Case { gates: true, beta: true, h0: true, ..case(len, 128, 128) });
    }
    run_backward(&dev, Case { gates: true, ..case(1000, 64, 64) });
    run_backward(&dev, Case { gates: true, layout: AttentionLayout::Bhsd, ..c });
}

#[test]
fn interp_linear_attention_backward_matches_reverse_mode() {
    let dev = Device::cpu();
    for len in [1, 7, 130] {
        run_backward(&dev, gated(case(len, 64, 64)));
    }
    run_backward(&dev, case(70, 128, 128));
    run_backward(&dev, Case { batch: 1, heads: 4, qk_heads: 2, layout: AttentionLayout::Bhsd, decay: true, ..case(100, 128, 64) });
    // Heads in pairs a block, and grouped heads that cannot pair.
    run_backward(&dev, Case { batch: 1, heads: 4, qk_heads: 2, ..gated(case(70, 128, 64)) });
    run_backward(&dev, Case { batch: 1, heads: 3, qk_heads: 1, ..gated(case(70, 64, 64)) });
    run_backward(&dev, Case { feature: FeatureMap::EluPlusOne, ..gated(case(7, 64, 64)) });
    run_backward(&dev, Case { feature: FeatureMap::Relu, ..case(70, 64, 128) });
    run_backward(&dev, Case { gates: true, beta: true, h0: true, ..case(130, 64, 64) });
    run_backward(&dev, Case { gates: true, heads: 4, qk_heads: 2, layout: AttentionLayout::Bhsd, ..case(70, 128, 64) });
}

#[test]
fn interp_linear_attention_matches_recurrence() {
    let dev = Device::cpu();
    for len in [1, 7, 130] {
        run_case(&dev, gated(case(len, 64, 64)));
    }
    run_case(&dev, case(70, 128, 128));
    run_case(&dev, Case { batch: 1, heads: 4, qk_heads: 2, layout: AttentionLayout::Bhsd, decay: true, ..case(100, 128, 64) });
    run_case(&dev, Case { batch: 1, heads: 4, qk_heads: 2, ..gated(case(70, 128, 64)) });
    run_case(&dev, Case { batch: 1, heads: 3, qk_heads: 1, ..gated(case(70, 64, 64)) });
    run_case(&dev, Case { feature: FeatureMap::EluPlusOne, ..gated(case(7, 64, 64)) });
    run_case(&dev, Case { feature: FeatureMap::Relu, ..case(70, 64, 128) });
    run_case(&dev, Case { gates: true, beta: true, h0: true, ..case(130, 64, 64) });
    run_case(&dev, Case { gates: true, heads: 4, qk_heads: 2, layout: AttentionLayout::Bhsd, ..case(70, 128, 64) });
}

/// Mamba-2's SSD (`Ssd`): the same recurrence with q = C, k = B, v = x, g = A·Δ, β = Δ,
/// scale 1, plus D·x, Δ = softplus(dt + bias); checked against `reference` (sequential, f64)
/// on those inputs, and its gradients against `reference_backward` taken on through Δ's
/// softplus, A and D on the host.
#[allow(clippy::too_many_arguments, clippy::needless_range_loop)]
fn run_ssd(dev: &Device, batch: usize, len: usize, heads: usize, groups: usize, n: usize, p: usize, with_h0: bool) {
    use tessera_kernels::Ssd;
    let c = Case {
        batch,
        heads,
        qk_heads: groups,
        len,
        dk: n,
        dv: p,
        layout: AttentionLayout::Bshd,
        decay: true,
        beta: true,
        h0: with_h0,
        feature: FeatureMap::Identity,
        gates: false,
    };
    let ((hx, wx), (hb, wb), (hc, wc)) =
        (bf16_random(batch * len * heads * p), bf16_random(batch * len * groups * n), bf16_random(batch * len * groups * n));
    let hdt: Vec<bf16> = random(batch * len * heads, -2.0, 0.5).into_iter().map(bf16::from_f32).collect();
    let (ha, hbias, hd) = (random(heads, -3.0, -0.5), random(heads, -1.0, 0.5), random(heads, -1.0, 1.0));
    let hh0 = random(batch * heads * n * p, -1.0, 1.0);
    let x = Tensor::from_host(dev, &hx, &[batch, len, heads, p]).unwrap();
    let bm = Tensor::from_host(dev, &hb, &[batch, len, groups, n]).unwrap();
    let cm = Tensor::from_host(dev, &hc, &[batch, len, groups, n]).unwrap();
    let dt = Tensor::from_host(dev, &hdt, &[batch, len, heads]).unwrap();
    let a = Tensor::from_host(dev, &ha, &[heads]).unwrap();
    let bias = Tensor::from_host(dev, &hbias, &[heads]).unwrap();
    let d = Tensor::from_host(dev, &hd, &[heads]).unwrap();
    let h0 = Tensor::from_host(dev, &hh0, &[batch, heads, n, p]).unwrap();
    let mut ssd = Ssd::new(dev, &x, &dt, &a, &bm, &cm).d(&d).dt_bias(&bias).dt_softplus(true);
    if with_h0 {
        ssd = ssd.initial_state(&h0);
    }
    let mut y = Tensor::full(dev, &[batch, len, heads, p], bf16::from_f32(f32::NAN)).unwrap();
    let mut last = Tensor::full(dev, &[batch, heads, n, p], f32::NAN).unwrap();
    ssd.run(&mut y, Some(&mut last)).unwrap();
    // Δ, g = A·Δ as [batch, heads, L], in f64 from the bf16 dt.
    let pre = |bi: usize, h: usize, t: usize| f64::from(hdt[(bi * len + t) * heads + h].to_f32()) + f64::from(hbias[h]);
    let sp = |x: f64| x.max(0.0) + (-x.abs()).exp().ln_1p();
    let mut delta = vec![0.0; batch * heads * len];
    let mut g = vec![0.0; batch * heads * len];
    for bi in 0..batch {
        for h in 0..heads {
            for t in 0..len {
                let i = (bi * heads + h) * len + t;
                delta[i] = sp(pre(bi, h, t));
                g[i] = f64::from(ha[h]) * delta[i];
            }
        }
    }
    let wh0 = wide(&hh0);
    let (mut want_y, want_h) = reference(c, &wc, &wb, &wx, &g, &delta, &wh0, &[], 1.0);
    for (i, yv) in want_y.iter_mut().enumerate() {
        *yv += f64::from(hd[(i / p) % heads]) * wx[i];
    }
    let (ey, eh) = (rel_error(&wide_bf16(&y.to_host().unwrap()), &want_y), rel_error(&wide(&last.to_host().unwrap()), &want_h));
    assert!(ey < 1e-2 && eh < 5e-3, "ssd {batch}x{len}x{heads}x{p} N{n} G{groups}: y {ey}, last state {eh}");

    let (hdy, wdy) = bf16_random(batch * len * heads * p);
    let dy = Tensor::from_host(dev, &hdy, &[batch, len, heads, p]).unwrap();
    let hdl = random(batch * heads * n * p, -1.0, 1.0);
    let dl = Tensor::from_host(dev, &hdl, &[batch, heads, n, p]).unwrap();
    let gr = ssd.backward(&dy, Some(&dl)).unwrap();
    let [gc, gb, gx, gg, gbeta, gh0] = reference_backward(c, &wc, &wb, &wx, &g, &delta, &wh0, &[], &wdy, &wide(&hdl), 1.0);
    // dg and dβ are inner products over the whole state (N·P terms) that can cancel to near
    // zero: the same gradients of the inputs' magnitudes (every term ≥ 0, as Δ and e^g are)
    // give the sums of their terms' magnitudes, the scale their errors are measured against.
    let abs = |x: &[f64]| x.iter().map(|v| v.abs()).collect::<Vec<f64>>();
    let [_, _, _, gg_mag, gbeta_mag, _] =
        reference_backward(c, &abs(&wc), &abs(&wb), &abs(&wx), &g, &delta, &abs(&wh0), &[], &abs(&wdy), &abs(&wide(&hdl)), 1.0);
    let mut want_dx = gx;
    // Per-head sums over every step (dD, dA, the bias's) can cancel: each is checked against
    // the sum of its terms' magnitudes (`scale_*`, down to dg's and dβ's own terms), not
    // against its own size.
    let mut want_dd = vec![0.0; heads];
    let mut scale_dd = vec![0.0; heads];
    for (i, v) in want_dx.iter_mut().enumerate() {
        let h = (i / p) % heads;
        *v += f64::from(hd[h]) * wdy[i];
        want_dd[h] += wdy[i] * wx[i];
        scale_dd[h] += (wdy[i] * wx[i]).abs();
    }
    let (mut want_da, mut want_dbias) = (vec![0.0; heads], vec![0.0; heads]);
    let (mut scale_da, mut scale_dbias) = (vec![0.0; heads], vec![0.0; heads]);
    let mut want_ddt = vec![0.0; batch * len * heads];
    let mut scale_ddt = vec![0.0; batch * len * heads];
    for bi in 0..batch {
        for h in 0..heads {
            for t in 0..len {
                let i = (bi * heads + h) * len + t;
                want_da[h] += gg[i] * delta[i];
                scale_da[h] += gg_mag[i] * delta[i];
                let sig = 1.0 / (1.0 + (-pre(bi, h, t)).exp());
                let dd = (gbeta[i] + f64::from(ha[h]) * gg[i]) * sig;
                want_ddt[(bi * len + t) * heads + h] = dd;
                want_dbias[h] += dd;
                scale_ddt[(bi * len + t) * heads + h] = (gbeta_mag[i] + f64::from(ha[h]).abs() * gg_mag[i]) * sig;
                scale_dbias[h] += scale_ddt[(bi * len + t) * heads + h];
            }
        }
    }
    type Sum<'a> = (&'a str, Vec<f64>, &'a [f64], &'a [f64]);
    let sums: [Sum; 3] = [
        ("dd", wide(&gr.dd.unwrap().to_host().unwrap()), &want_dd, &scale_dd),
        ("da", wide(&gr.da.to_host().unwrap()), &want_da, &scale_da),
        ("d_dt_bias", wide(&gr.d_dt_bias.unwrap().to_host().unwrap()), &want_dbias, &scale_dbias),
    ];
    for (name, got, want, scale) in sums {
        for h in 0..heads {
            let err = (got[h] - want[h]).abs() / scale[h].max(1e-30);
            assert!(err < 2e-3, "ssd {batch}x{len}x{heads}x{p} N{n} G{groups}: {name}[{h}] error {err} of its terms' sum");
        }
    }
    // dΔ = (dβ + A·dg)·σ: its error against the norm of its terms' magnitudes.
    let got_ddt = wide_bf16(&gr.ddt.to_host().unwrap());
    let norm = |x: &mut dyn Iterator<Item = f64>| x.map(|v| v * v).sum::<f64>().sqrt();
    let err = norm(&mut got_ddt.iter().zip(&want_ddt).map(|(a, b)| a - b)) / norm(&mut scale_ddt.iter().copied()).max(1e-30);
    assert!(err < 1e-2, "ssd {batch}x{len}x{heads}x{p} N{n} G{groups}: ddt error {err} of its terms' magnitudes");
    let checks: [(&str, Vec<f64>, &[f64], f64); 4] = [
        ("dx", wide_bf16(&gr.dx.to_host().unwrap()), &want_dx, 1e-2),
        ("db", wide_bf16(&gr.db.to_host().unwrap()), &gb, 1e-2),
        ("dc", wide_bf16(&gr.dc.to_host().unwrap()), &gc, 1e-2),
        ("dh0", gr.dh0.map_or_else(|| gh0.clone(), |t| wide(&t.to_host().unwrap())), &gh0, 1e-2),
    ];
    for (name, got, want, tol) in checks {
        let err = rel_error(&got, want);
        assert!(err < tol, "ssd {batch}x{len}x{heads}x{p} N{n} G{groups}: {name} relative error {err}");
    }
}

#[test]
fn gpu_ssd_matches_recurrence() {
    let Some(dev) = gpu_or_skip("gpu_ssd_matches_recurrence") else { return };
    for len in [1, 7, 1000, 4099] {
        // Mamba-2's default shape: headdim 64, d_state 128, one group.
        run_ssd(&dev, 2, len, 4, 1, 128, 64, len % 2 == 1);
    }
    run_ssd(&dev, 1, 1000, 4, 2, 64, 128, true);
}

#[test]
fn interp_ssd_matches_recurrence() {
    let dev = Device::cpu();
    for len in [1, 7, 130] {
        run_ssd(&dev, 1, len, 2, 1, 64, 64, true);
    }
    run_ssd(&dev, 1, 70, 2, 2, 128, 64, false);
}

/// The decode path: `run_step` a step at a time, the state in place from the initial one,
/// against the sequential reference's outputs and last state.
fn run_steps(dev: &Device, c: Case) {
    let inp = inputs(dev, c);
    let [q, k, v, g, b, h0, gv] = &inp.host;
    let (want_o, want_h) = reference(c, &mapped(c, q), &mapped(c, k), v, g, b, h0, gv, 1.0 / (c.dk as f64).sqrt());
    let step = Case { len: 1, ..c };
    let host = |x: &Tensor<bf16>| x.to_host().unwrap();
    let (hq, hk, hv) = (host(&inp.q), host(&inp.k), host(&inp.v));
    let (hg, hb, hgv) = (inp.g.to_host().unwrap(), inp.beta.to_host().unwrap(), inp.gv.to_host().unwrap());
    let h0_or_zeros = if c.h0 { inp.h0.to_host().unwrap() } else { vec![0.0; c.batch * c.heads * c.dk * c.dv] };
    let mut state = Tensor::from_host(dev, &h0_or_zeros, &[c.batch, c.heads, c.dk, c.dv]).unwrap();
    let mut got_o = vec![0.0; want_o.len()];
    for t in 0..c.len {
        // Step t's rows of each [batch, seq, heads, d] tensor, as a sequence of length 1.
        fn rows_of<E: Copy>(c: Case, t: usize, x: &[E], heads: usize, d: usize) -> Vec<E> {
            (0..c.batch).flat_map(|bi| (0..heads * d).map(move |j| (bi, j))).map(|(bi, j)| x[(bi * c.len + t) * heads * d + j]).collect()
        }
        let rows = |x: &[bf16], heads: usize, d: usize| rows_of(c, t, x, heads, d);
        let at_t = |x: &[f32]| -> Vec<f32> { (0..c.batch * c.heads).map(|i| x[i * c.len + t]).collect() };
        let qt = Tensor::from_host(dev, &rows(&hq, c.qk_heads, c.dk), &shape(step, c.qk_heads, c.dk)).unwrap();
        let kt = Tensor::from_host(dev, &rows(&hk, c.qk_heads, c.dk), &shape(step, c.qk_heads, c.dk)).unwrap();
        let vt = Tensor::from_host(dev, &rows(&hv, c.heads, c.dv), &shape(step, c.heads, c.dv)).unwrap();
        let gt = Tensor::from_host(dev, &at_t(&hg), &[c.batch, c.heads, 1]).unwrap();
        let bt = Tensor::from_host(dev, &at_t(&hb), &[c.batch, c.heads, 1]).unwrap();
        let mut ot = Tensor::full(dev, &shape(step, c.heads, c.dv), bf16::from_f32(f32::NAN)).unwrap();
        let gvt = Tensor::from_host(dev, &rows_of(c, t, &hgv, c.qk_heads, c.dk), &shape(step, c.qk_heads, c.dk)).unwrap();
        let mut la = LinearAttention::new(dev, &qt, &kt, &vt).feature_map(c.feature);
        if c.gates {
            la = la.gates(&gvt);
        }
        if c.decay {
            la = la.decay(&gt);
        }
        if c.beta {
            la = la.beta(&bt);
        }
        la.run_step(&mut state, &mut ot).unwrap();
        for (j, o) in ot.to_host().unwrap().iter().enumerate() {
            let (bi, rest) = (j / (c.heads * c.dv), j % (c.heads * c.dv));
            got_o[(bi * c.len + t) * c.heads * c.dv + rest] = f64::from(o.to_f32());
        }
    }
    let (eo, eh) = (rel_error(&got_o, &want_o), rel_error(&wide(&state.to_host().unwrap()), &want_h));
    // The same kernel's state to rounding, unless q and k go through a map (rounded to 16 bits).
    let state_tol = if c.feature == FeatureMap::Identity { 1e-5 } else { 5e-3 };
    assert!(eo < 1e-2 && eh < state_tol, "{c:?} step by step: output {eo}, state {eh}");
}

#[test]
fn gpu_linear_attention_steps_match_recurrence() {
    let Some(dev) = gpu_or_skip("gpu_linear_attention_steps_match_recurrence") else { return };
    for (dk, dv) in [(128, 128), (64, 64), (128, 64)] {
        run_steps(&dev, case(7, dk, dv));
        run_steps(&dev, Case { qk_heads: 1, ..gated(case(7, dk, dv)) });
    }
    run_steps(&dev, Case { feature: FeatureMap::EluPlusOne, ..gated(case(7, 128, 128)) });
    run_steps(&dev, Case { gates: true, beta: true, h0: true, ..case(7, 128, 128) });
    run_steps(&dev, Case { gates: true, ..case(7, 64, 64) });
}

#[test]
fn interp_linear_attention_steps_match_recurrence() {
    let dev = Device::cpu();
    run_steps(&dev, gated(case(7, 64, 64)));
    run_steps(&dev, Case { qk_heads: 1, ..gated(case(5, 128, 128)) });
    run_steps(&dev, Case { feature: FeatureMap::Relu, ..gated(case(5, 64, 64)) });
    run_steps(&dev, Case { gates: true, beta: true, h0: true, ..case(5, 64, 128) });
}

/// Every kernel of the linear attention keeps a variant for both key head dims: one dropped at
/// build time (over the shared memory, say) would leave a head dim without its kernel, or a
/// launch that takes another kernel's variant index onto the wrong one.
#[test]
fn every_key_head_dim_has_its_kernels() {
    use tessera_kernels::kernels::*;
    let kernels: [(&str, &[&tessera::KernelSpec]); 18] = [
        ("fwd", linear_attention_fwd_bf16::VARIANTS),
        ("fwd f16", linear_attention_fwd_f16::VARIANTS),
        ("fwd_v64", linear_attention_fwd_v64_bf16::VARIANTS),
        ("fwd_v64 f16", linear_attention_fwd_v64_f16::VARIANTS),
        ("bwd_dq", linear_attention_bwd_dq_bf16::VARIANTS),
        ("bwd_dq f16", linear_attention_bwd_dq_f16::VARIANTS),
        ("bwd_dq_v64", linear_attention_bwd_dq_v64_bf16::VARIANTS),
        ("bwd_dq_v64 f16", linear_attention_bwd_dq_v64_f16::VARIANTS),
        ("bwd_dkv", linear_attention_bwd_dkv_bf16::VARIANTS),
        ("bwd_dkv f16", linear_attention_bwd_dkv_f16::VARIANTS),
        ("bwd_dkv_v64", linear_attention_bwd_dkv_v64_bf16::VARIANTS),
        ("bwd_dkv_v64 f16", linear_attention_bwd_dkv_v64_f16::VARIANTS),
        ("step", linear_attention_step_bf16::VARIANTS),
        ("step f16", linear_attention_step_f16::VARIANTS),
        ("gla_prepare", gla_prepare_bf16::VARIANTS),
        ("gla_prepare f16", gla_prepare_f16::VARIANTS),
        ("gla_finish", gla_finish_bf16::VARIANTS),
        ("gla_finish f16", gla_finish_f16::VARIANTS),
    ];
    for (name, variants) in kernels {
        let dks: Vec<i64> = variants.iter().filter_map(|v| v.knob("DK")).collect();
        assert!(dks.contains(&128) && dks.contains(&64), "{name}: variants for DK {dks:?}");
    }
}
