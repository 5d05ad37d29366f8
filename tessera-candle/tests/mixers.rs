//! The selective scan and causal linear attention as candle ops against float64 sequential
//! recurrences, and their gradients through candle's autograd against float64 gradients of the
//! same recurrences (the selective scan's by central differences of the float64 recurrence, the
//! linear attention's by its reverse recurrence); fresh random inputs, lengths that cross the
//! kernels' 64-step chunks; on the CPU (Tessera's interpreter) and, with the `cuda` feature,
//! the GPU.

mod common;

use candle_core::{DType, Device, Tensor, Var};
use common::{random, rel_error, tensor, values};
use tessera_candle::{FeatureMap, LinearAttentionOptions, SelectiveScanOptions};

/// A selective scan's sizes.
#[derive(Clone, Copy, Debug)]
struct Scan {
    batch: usize,
    channels: usize,
    groups: usize,
    states: usize,
    len: usize,
    /// D, z, the delta bias and softplus.
    extras: bool,
}

/// The scan's inputs in float64, in the packed order: u, delta, b, c, z, a, d, bias.
type ScanInputs = [Vec<f64>; 8];

/// `y` of the scan, sequentially in float64 from a zero state.
fn scan_reference(s: Scan, x: &ScanInputs) -> Vec<f64> {
    scan_reference_and_state(s, x).0
}

/// `y` of the scan and its last state `[batch, channels, d_state]`, sequentially in float64
/// from a zero state.
fn scan_reference_and_state(s: Scan, [u, delta, b, c, z, a, d, bias]: &ScanInputs) -> (Vec<f64>, Vec<f64>) {
    let (n, l) = (s.states, s.len);
    let mut y = vec![0.0; s.batch * s.channels * l];
    let mut last = vec![0.0; s.batch * s.channels * n];
    for bi in 0..s.batch {
        for di in 0..s.channels {
            let gi = di / (s.channels / s.groups);
            let row = bi * s.channels + di;
            let mut h = vec![0.0; n];
            for t in 0..l {
                let x = delta[row * l + t] + if s.extras { bias[di] } else { 0.0 };
                let dt = if s.extras { x.max(0.0) + (-x.abs()).exp().ln_1p() } else { x };
                let ut = u[row * l + t];
                let mut out = 0.0;
                for (k, hk) in h.iter_mut().enumerate() {
                    let at = ((bi * s.groups + gi) * n + k) * l + t;
                    *hk = (dt * a[di * n + k]).exp() * *hk + dt * b[at] * ut;
                    out += c[at] * *hk;
                }
                if s.extras {
                    out += d[di] * ut;
                    let zt = z[row * l + t];
                    out *= zt / (1.0 + (-zt).exp());
                }
                y[row * l + t] = out;
            }
            last[row * n..(row + 1) * n].copy_from_slice(&h);
        }
    }
    (y, last)
}

#[test]
fn selective_scan_and_its_gradients_match_f64_reference() {
    for dev in common::devices() {
        for s in [
            Scan { batch: 1, channels: 2, groups: 1, states: 16, len: 1, extras: true },
            Scan { batch: 2, channels: 3, groups: 1, states: 16, len: 7, extras: false },
            Scan { batch: 1, channels: 4, groups: 2, states: 32, len: 70, extras: true },
        ] {
            selective_scan_matches(&dev, s, DType::F32, 1e-4, 2e-4);
            selective_scan_matches(&dev, s, DType::BF16, 2e-2, 5e-2);
        }
    }
}

fn selective_scan_matches(dev: &Device, s: Scan, dtype: DType, tol: f64, grad_tol: f64) {
    let (bt, ch, n, l) = (s.batch, s.channels, s.states, s.len);
    let seq = [bt, ch, l];
    let bc = [bt, s.groups, n, l];
    let shift = |v: Vec<f32>, by: f32| v.into_iter().map(|x| x + by).collect::<Vec<_>>();
    // Step sizes positive without softplus; decaying states.
    let delta = if s.extras { random(bt * ch * l, 1.0) } else { shift(random(bt * ch * l, 0.2), 0.3) };
    let own: [(&[usize], Vec<f32>); 5] = [
        (&seq, random(bt * ch * l, 1.0)),
        (&seq, delta),
        (&bc, random(bt * s.groups * n * l, 1.0)),
        (&bc, random(bt * s.groups * n * l, 1.0)),
        (&seq, random(bt * ch * l, 2.0)),
    ];
    let f32s: [(&[usize], Vec<f32>); 3] =
        [(&[ch, n], shift(random(ch * n, 0.7), -0.8)), (&[ch], random(ch, 1.0)), (&[ch], random(ch, 0.5))];
    let mut vars = Vec::new();
    let mut inputs: Vec<Vec<f64>> = Vec::new();
    for (dims, v) in &own {
        let (t, tv) = tensor(dev, v, dims, dtype);
        vars.push(Var::from_tensor(&t).unwrap());
        inputs.push(tv);
    }
    for (dims, v) in &f32s {
        let (t, tv) = tensor(dev, v, dims, DType::F32);
        vars.push(Var::from_tensor(&t).unwrap());
        inputs.push(tv);
    }
    let x: ScanInputs = inputs.try_into().unwrap();
    let opts = SelectiveScanOptions {
        d: s.extras.then_some(vars[6].as_tensor()),
        z: s.extras.then_some(vars[4].as_tensor()),
        delta_bias: s.extras.then_some(vars[7].as_tensor()),
        delta_softplus: s.extras,
    };
    let y = tessera_candle::selective_scan(&vars[0], &vars[1], &vars[5], &vars[2], &vars[3], &opts).unwrap();
    assert_eq!((y.dims(), y.dtype()), (&seq[..], dtype));
    let err = rel_error(&values(&y), &scan_reference(s, &x));
    assert!(err < tol, "{s:?} {dtype:?}: y relative error {err}");
    // No input needing a gradient: the inputs are read as given (nothing packed), the same y.
    let t: Vec<Tensor> = vars.iter().map(|v| v.as_tensor().detach()).collect();
    let given =
        SelectiveScanOptions { d: opts.d.map(|_| &t[6]), z: opts.z.map(|_| &t[4]), delta_bias: opts.delta_bias.map(|_| &t[7]), ..opts };
    let y_given = tessera_candle::selective_scan(&t[0], &t[1], &t[5], &t[2], &t[3], &given).unwrap();
    assert_eq!(values(&y_given), values(&y), "{s:?} {dtype:?}: y of the inputs as given");

    // The loss Σ y ⊙ w; each input's gradient by central differences of the float64 scan.
    let (w, wv) = tensor(dev, &random(bt * ch * l, 1.0), &seq, dtype);
    let grads = (&y * &w).unwrap().to_dtype(DType::F32).unwrap().sum_all().unwrap().backward().unwrap();
    let loss = |x: &ScanInputs| scan_reference(s, x).iter().zip(&wv).map(|(y, w)| y * w).sum::<f64>();
    let names = ["u", "delta", "b", "c", "z", "a", "d", "delta_bias"];
    for (i, name) in names.iter().enumerate() {
        if !s.extras && matches!(*name, "z" | "d" | "delta_bias") {
            assert!(grads.get(&vars[i]).is_none(), "{s:?}: a gradient for `{name}`, which the scan was not given");
            continue;
        }
        let got = grads.get(&vars[i]).unwrap_or_else(|| panic!("{s:?}: no gradient for `{name}`"));
        assert_eq!((got.dims(), got.dtype()), (vars[i].dims(), vars[i].dtype()), "{name}'s gradient");
        let mut x = x.clone();
        let want: Vec<f64> = (0..x[i].len())
            .map(|j| {
                let (v, h) = (x[i][j], 1e-5 * x[i][j].abs().max(1.0));
                x[i][j] = v + h;
                let up = loss(&x);
                x[i][j] = v - h;
                let down = loss(&x);
                x[i][j] = v;
                (up - down) / (2.0 * h)
            })
            .collect();
        let got = values(got);
        // A gradient that is zero by the math (dA of one step from a zero state) is compared
        // by its size.
        let zero = want.iter().all(|&w| w == 0.0);
        let err = if zero { got.iter().map(|g| g * g).sum::<f64>().sqrt() } else { rel_error(&got, &want) };
        assert!(err < grad_tol, "{s:?} {dtype:?}: d{name} relative error {err}");
    }
}

/// A linear attention's sizes: q, k `[batch, seq, k_heads, dk]`, v `[batch, seq, heads, dv]`.
#[derive(Clone, Copy, Debug)]
struct Lin {
    batch: usize,
    seq: usize,
    heads: usize,
    k_heads: usize,
    dk: usize,
    dv: usize,
    decay: bool,
    feature: FeatureMap,
}

/// `φ(x)` and `φ′(x)`.
fn feature(f: FeatureMap, x: f64) -> (f64, f64) {
    match f {
        FeatureMap::Identity => (x, 1.0),
        FeatureMap::EluPlusOne if x > 0.0 => (x + 1.0, 1.0),
        FeatureMap::EluPlusOne => (x.exp(), x.exp()),
        FeatureMap::Relu => (x.max(0.0), if x > 0.0 { 1.0 } else { 0.0 }),
    }
}

/// The output and, given `dout`, the gradients of q, k, v, the decay and β, in float64: the
/// forward recurrence `H_t = exp(g_t)·H_{t−1} + β_t·φ(k_t)ᵀv_t`, `o_t = scale·φ(q_t)·H_t` (no
/// decay: `g` 0; no β: 1), and its reverse, `G_t = scale·φ(q_t)ᵀdo_t + exp(g_{t+1})·G_{t+1}` (the
/// gradient reaching `H_t`). `g` and `β` are `[batch, heads, seq]`.
#[allow(clippy::type_complexity, clippy::too_many_arguments)]
fn lin_reference(
    c: Lin, scale: f64, q: &[f64], k: &[f64], v: &[f64], g: Option<&[f64]>, beta: Option<&[f64]>, dout: &[f64],
) -> (Vec<f64>, [Vec<f64>; 5]) {
    let (t_n, dk, dv) = (c.seq, c.dk, c.dv);
    let qk_at = |b: usize, t: usize, h: usize| ((b * t_n + t) * c.k_heads + h / (c.heads / c.k_heads)) * dk;
    let v_at = |b: usize, t: usize, h: usize| ((b * t_n + t) * c.heads + h) * dv;
    let step = |b: usize, h: usize, t: usize| (b * c.heads + h) * t_n + t;
    let decay = |at: usize| g.map_or(1.0, |g| g[at].exp());
    let weight = |at: usize| beta.map_or(1.0, |w| w[at]);
    let mut o = vec![0.0; v.len()];
    let (mut dq, mut dk_, mut dv_) = (vec![0.0; q.len()], vec![0.0; k.len()], vec![0.0; v.len()]);
    let (mut dg, mut dbeta) = (vec![0.0; g.map_or(0, <[f64]>::len)], vec![0.0; beta.map_or(0, <[f64]>::len)]);
    for b in 0..c.batch {
        for h in 0..c.heads {
            let mut hs = vec![vec![0.0; dk * dv]; t_n + 1];
            for t in 0..t_n {
                let (qa, va, st) = (qk_at(b, t, h), v_at(b, t, h), step(b, h, t));
                for i in 0..dk {
                    let ki = weight(st) * feature(c.feature, k[qa + i]).0;
                    for j in 0..dv {
                        hs[t + 1][i * dv + j] = decay(st) * hs[t][i * dv + j] + ki * v[va + j];
                    }
                }
                for j in 0..dv {
                    o[va + j] = scale * (0..dk).map(|i| feature(c.feature, q[qa + i]).0 * hs[t + 1][i * dv + j]).sum::<f64>();
                }
            }
            let mut gs = vec![0.0; dk * dv];
            for t in (0..t_n).rev() {
                let (qa, va, st) = (qk_at(b, t, h), v_at(b, t, h), step(b, h, t));
                let a_next = if t + 1 < t_n { decay(step(b, h, t + 1)) } else { 0.0 };
                for i in 0..dk {
                    let qi = feature(c.feature, q[qa + i]).0;
                    for j in 0..dv {
                        gs[i * dv + j] = a_next * gs[i * dv + j] + scale * qi * dout[va + j];
                    }
                }
                let mut db = 0.0;
                for i in 0..dk {
                    let (_, dqi) = feature(c.feature, q[qa + i]);
                    dq[qa + i] += dqi * scale * (0..dv).map(|j| dout[va + j] * hs[t + 1][i * dv + j]).sum::<f64>();
                    let (ki, dki) = feature(c.feature, k[qa + i]);
                    let gv = (0..dv).map(|j| gs[i * dv + j] * v[va + j]).sum::<f64>();
                    dk_[qa + i] += dki * weight(st) * gv;
                    db += ki * gv;
                    for j in 0..dv {
                        dv_[va + j] += weight(st) * gs[i * dv + j] * ki;
                    }
                }
                if g.is_some() {
                    dg[st] = decay(st) * gs.iter().zip(&hs[t]).map(|(g, h)| g * h).sum::<f64>();
                }
                if beta.is_some() {
                    dbeta[st] = db;
                }
            }
        }
    }
    (o, [dq, dk_, dv_, dg, dbeta])
}

#[test]
fn linear_attention_and_its_gradients_match_f64_reference() {
    let c = |batch, seq, heads, k_heads, dk, dv, decay, feature| Lin { batch, seq, heads, k_heads, dk, dv, decay, feature };
    for dev in common::devices() {
        for lin in [
            c(1, 7, 1, 1, 64, 64, false, FeatureMap::Identity),
            c(1, 70, 2, 1, 64, 128, true, FeatureMap::Identity),
            c(2, 33, 1, 1, 128, 64, true, FeatureMap::EluPlusOne),
        ] {
            linear_attention_matches(&dev, lin, DType::BF16);
        }
        linear_attention_matches(&dev, c(1, 65, 1, 1, 64, 64, true, FeatureMap::Relu), DType::F16);
    }
}

/// Fresh q, k, v (of `dtype`) and decay (f32) tensors of `c`'s sizes with their values, and v's
/// shape.
fn lin_inputs(dev: &Device, c: Lin, dtype: DType) -> ([(Tensor, Vec<f64>); 4], [usize; 4]) {
    let (qd, vd, gd) = ([c.batch, c.seq, c.k_heads, c.dk], [c.batch, c.seq, c.heads, c.dv], [c.batch, c.heads, c.seq]);
    let n = |d: &[usize]| d.iter().product::<usize>();
    // Decays of 0.9–1 a step.
    let g: Vec<f32> = random(n(&gd), 0.05).into_iter().map(|x| x - 0.055).collect();
    let inputs = [
        tensor(dev, &random(n(&qd), 1.0), &qd, dtype),
        tensor(dev, &random(n(&qd), 1.0), &qd, dtype),
        tensor(dev, &random(n(&vd), 1.0), &vd, dtype),
        tensor(dev, &g, &gd, DType::F32),
    ];
    (inputs, vd)
}

fn linear_attention_matches(dev: &Device, c: Lin, dtype: DType) {
    let ([(q, qv), (k, kv), (v, vv), (g, gv)], vd) = lin_inputs(dev, c, dtype);
    let n = |d: &[usize]| d.iter().product::<usize>();
    let (q, k, v, g) =
        (Var::from_tensor(&q).unwrap(), Var::from_tensor(&k).unwrap(), Var::from_tensor(&v).unwrap(), Var::from_tensor(&g).unwrap());
    let opts = LinearAttentionOptions { scale: None, feature_map: c.feature, decay: c.decay.then_some(g.as_tensor()) };
    let o = tessera_candle::linear_attention(&q, &k, &v, &opts).unwrap();
    assert_eq!((o.dims(), o.dtype()), (&vd[..], dtype));
    let g_given = g.as_tensor().detach();
    let given = LinearAttentionOptions { decay: opts.decay.map(|_| &g_given), ..opts };
    let o_given =
        tessera_candle::linear_attention(&q.as_tensor().detach(), &k.as_tensor().detach(), &v.as_tensor().detach(), &given).unwrap();
    assert_eq!(values(&o_given), values(&o), "{c:?} {dtype:?}: o of the inputs as given");
    let (w, wv) = tensor(dev, &random(n(&vd), 1.0), &vd, dtype);
    let (want_o, want) = lin_reference(c, 1.0 / (c.dk as f64).sqrt(), &qv, &kv, &vv, c.decay.then_some(&gv[..]), None, &wv);
    let err = rel_error(&values(&o), &want_o);
    assert!(err < 1e-2, "{c:?} {dtype:?}: o relative error {err}");
    let grads = (&o * &w).unwrap().to_dtype(DType::F32).unwrap().sum_all().unwrap().backward().unwrap();
    for (name, var, want) in [("q", &q, &want[0]), ("k", &k, &want[1]), ("v", &v, &want[2]), ("decay", &g, &want[3])] {
        let Some(got) = grads.get(var) else {
            assert!(name == "decay" && !c.decay, "{c:?}: no gradient for `{name}`");
            continue;
        };
        assert_eq!((got.dims(), got.dtype()), (var.dims(), var.dtype()), "{name}'s gradient");
        let err = rel_error(&values(got), want);
        // The decay's gradient sums many near-cancelling terms of 16-bit operands.
        let tol = if name == "decay" { 3e-2 } else { 1e-2 };
        assert!(err < tol, "{c:?} {dtype:?}: d{name} relative error {err}");
    }
}

/// Mamba's x and z as the halves of one projection `[batch, 2·channels, L]`: views that are not
/// contiguous, taken as given (copied contiguous) where no input needs a gradient — the y of
/// contiguous copies.
#[test]
fn selective_scan_takes_halves_of_one_projection() {
    let dev = Device::Cpu;
    let (bt, ch, n, l) = (2, 3, 16, 9);
    let xz = Tensor::randn(0f32, 1.0, (bt, 2 * ch, l), &dev).unwrap();
    let (x, z) = (xz.narrow(1, 0, ch).unwrap(), xz.narrow(1, ch, ch).unwrap());
    assert!(!x.is_contiguous() && !z.is_contiguous());
    let delta = (Tensor::rand(0f32, 1.0, (bt, ch, l), &dev).unwrap() * 0.2).unwrap();
    let a = Tensor::rand(-1f32, -0.1, (ch, n), &dev).unwrap();
    let b = Tensor::randn(0f32, 1.0, (bt, 1, n, l), &dev).unwrap();
    let c = Tensor::randn(0f32, 1.0, (bt, 1, n, l), &dev).unwrap();
    let run = |x: &Tensor, z: &Tensor| {
        let opts = SelectiveScanOptions { z: Some(z), ..Default::default() };
        values(&tessera_candle::selective_scan(x, &delta, &a, &b, &c, &opts).unwrap())
    };
    assert_eq!(run(&x, &z), run(&x.contiguous().unwrap(), &z.contiguous().unwrap()));
}

#[test]
fn mixers_refuse_bad_input() {
    let dev = Device::Cpu;
    let t = |dims: &[usize], dtype| Tensor::ones(dims, dtype, &dev).unwrap();
    let (u, a, b) = (t(&[1, 2, 5], DType::F32), t(&[2, 16], DType::F32), t(&[1, 1, 16, 5], DType::F32));
    let msg = |r: candle_core::Result<Tensor>| r.map(|_| ()).unwrap_err().to_string();
    let none = SelectiveScanOptions::default();
    assert!(msg(tessera_candle::selective_scan(&u, &u, &a, &b, &t(&[1, 1, 16, 5], DType::BF16), &none)).contains("`c` must be F32"));
    assert!(msg(tessera_candle::selective_scan(&u, &u, &t(&[2, 16], DType::BF16), &b, &b, &none)).contains("`a` must be F32"));
    let e = msg(tessera_candle::selective_scan(&u, &u, &t(&[3, 16], DType::F32), &b, &b, &none));
    assert!(e.contains("`a`"), "{e}");
    let f16 = t(&[1, 2, 5], DType::F16);
    let e = msg(tessera_candle::selective_scan(&f16, &f16, &a, &t(&[1, 1, 16, 5], DType::F16), &t(&[1, 1, 16, 5], DType::F16), &none));
    assert!(e.contains("BF16 or F32"), "{e}");
    let q = t(&[1, 4, 1, 64], DType::BF16);
    let e = msg(tessera_candle::linear_attention(&q, &q, &t(&[1, 5, 1, 64], DType::BF16), &Default::default()));
    assert!(e.contains("`q`") && e.contains("seq 5"), "{e}");
    let e = msg(tessera_candle::linear_attention(
        &q,
        &q,
        &q,
        &LinearAttentionOptions { decay: Some(&t(&[1, 1, 4], DType::BF16)), ..Default::default() },
    ));
    assert!(e.contains("`decay` must be F32"), "{e}");
}

#[test]
fn ssd_and_its_gradients_match_f64_reference() {
    for dev in common::devices() {
        ssd_matches(&dev, 1, 70, 2, 1, 64, 64, true, DType::BF16);
        ssd_matches(&dev, 2, 9, 2, 2, 64, 64, false, DType::F16);
    }
}

/// The SSD against the linear attention's float64 recurrence (q = C, k = B, v = x, the decay
/// `A_h·Δ`, β = Δ, scale 1) plus the skip, its per-step gradients taken back to `dt` through the
/// softplus, and the per-head sums (dA, dD, the dt bias's) against the sums of their terms'
/// magnitudes (they may cancel).
#[allow(clippy::too_many_arguments)]
fn ssd_matches(dev: &Device, batch: usize, len: usize, heads: usize, groups: usize, p: usize, n: usize, extras: bool, dtype: DType) {
    let (xd, dtd, bd) = ([batch, len, heads, p], [batch, len, heads], [batch, len, groups, n]);
    let count = |d: &[usize]| d.iter().product::<usize>();
    let (x, xv) = tensor(dev, &random(count(&xd), 1.0), &xd, dtype);
    let dt_raw: Vec<f32> = if extras { random(count(&dtd), 1.0) } else { random(count(&dtd), 0.05).into_iter().map(|v| v + 0.1).collect() };
    let (dt, dtv) = tensor(dev, &dt_raw, &dtd, dtype);
    let (b, bv) = tensor(dev, &random(count(&bd), 0.5), &bd, dtype);
    let (c, cv) = tensor(dev, &random(count(&bd), 0.5), &bd, dtype);
    let (a, av) = tensor(dev, &random(heads, 0.3).into_iter().map(|v| v - 0.5).collect::<Vec<_>>(), &[heads], DType::F32);
    let (d, dv) = tensor(dev, &random(heads, 1.0), &[heads], DType::F32);
    let (bias, biasv) = tensor(dev, &random(heads, 0.5), &[heads], DType::F32);
    let vars: Vec<Var> = [&x, &dt, &b, &c, &a, &d, &bias].iter().map(|t| Var::from_tensor(t).unwrap()).collect();
    let opts = tessera_candle::SsdOptions {
        d: extras.then_some(vars[5].as_tensor()),
        dt_bias: extras.then_some(vars[6].as_tensor()),
        dt_softplus: extras,
    };
    let y = tessera_candle::ssd(&vars[0], &vars[1], &vars[4], &vars[2], &vars[3], &opts).unwrap();
    assert_eq!((y.dims(), y.dtype()), (&xd[..], dtype));
    let t: Vec<Tensor> = vars.iter().map(|v| v.as_tensor().detach()).collect();
    let given = tessera_candle::SsdOptions { d: opts.d.map(|_| &t[5]), dt_bias: opts.dt_bias.map(|_| &t[6]), ..opts };
    let y_given = tessera_candle::ssd(&t[0], &t[1], &t[4], &t[2], &t[3], &given).unwrap();
    assert_eq!(values(&y_given), values(&y), "ssd {dtype:?}: y of the inputs as given");
    let (w, wv) = tensor(dev, &random(count(&xd), 1.0), &xd, dtype);

    // Δ and the decay A·Δ as [batch, heads, L].
    let (mut delta, mut pre) = (vec![0.0; count(&dtd)], vec![0.0; count(&dtd)]);
    for bi in 0..batch {
        for t in 0..len {
            for h in 0..heads {
                let raw = dtv[(bi * len + t) * heads + h] + if extras { biasv[h] } else { 0.0 };
                let at = (bi * heads + h) * len + t;
                pre[at] = raw;
                delta[at] = if extras { raw.max(0.0) + (-raw.abs()).exp().ln_1p() } else { raw };
            }
        }
    }
    let g: Vec<f64> = delta.iter().enumerate().map(|(i, dl)| av[(i / len) % heads] * dl).collect();
    let lin = Lin { batch, seq: len, heads, k_heads: groups, dk: n, dv: p, decay: true, feature: FeatureMap::Identity };
    let (mut want_y, [dc, db, mut dx, dg, dbeta]) = lin_reference(lin, 1.0, &cv, &bv, &xv, Some(&g), Some(&delta), &wv);
    let (mut ddt, mut da, mut dd, mut dbias) = (vec![0.0; count(&dtd)], vec![0.0; heads], vec![0.0; heads], vec![0.0; heads]);
    let (mut da_mag, mut dd_mag, mut dbias_mag) = (vec![0.0; heads], vec![0.0; heads], vec![0.0; heads]);
    for bi in 0..batch {
        for t in 0..len {
            for h in 0..heads {
                let at = (bi * heads + h) * len + t;
                let dl = av[h] * dg[at] + dbeta[at];
                let grad = if extras { dl / (1.0 + (-pre[at]).exp()) } else { dl };
                ddt[(bi * len + t) * heads + h] = grad;
                da[h] += dg[at] * delta[at];
                da_mag[h] += (dg[at] * delta[at]).abs();
                dbias[h] += grad;
                dbias_mag[h] += grad.abs();
                if extras {
                    for j in 0..p {
                        let e = ((bi * len + t) * heads + h) * p + j;
                        want_y[e] += dv[h] * xv[e];
                        dx[e] += dv[h] * wv[e];
                        dd[h] += wv[e] * xv[e];
                        dd_mag[h] += (wv[e] * xv[e]).abs();
                    }
                }
            }
        }
    }
    let err = rel_error(&values(&y), &want_y);
    assert!(err < 1e-2, "ssd {batch}x{len}x{heads} G{groups} {dtype:?}: y relative error {err}");
    let grads = (&y * &w).unwrap().to_dtype(DType::F32).unwrap().sum_all().unwrap().backward().unwrap();
    let got = |i: usize| {
        let t = grads.get(&vars[i]).unwrap_or_else(|| panic!("no gradient for input {i}"));
        assert_eq!((t.dims(), t.dtype()), (vars[i].dims(), vars[i].dtype()), "input {i}'s gradient");
        values(t)
    };
    for (name, i, want, tol) in [("x", 0, &dx, 1e-2), ("dt", 1, &ddt, 3e-2), ("b", 2, &db, 1e-2), ("c", 3, &dc, 1e-2)] {
        let err = rel_error(&got(i), want);
        assert!(err < tol, "ssd {batch}x{len}x{heads} G{groups} {dtype:?}: d{name} relative error {err}");
    }
    let mut sums = vec![("a", 4, da, da_mag)];
    if extras {
        sums.extend([("d", 5, dd, dd_mag), ("dt_bias", 6, dbias, dbias_mag)]);
    } else {
        assert!(grads.get(&vars[5]).is_none() && grads.get(&vars[6]).is_none(), "gradients of inputs the SSD was not given");
    }
    for (name, i, want, mag) in sums {
        for (h, (g, w)) in got(i).iter().zip(&want).enumerate() {
            let err = (g - w).abs() / mag[h];
            assert!(err < 1e-2, "ssd {batch}x{len}x{heads} G{groups} {dtype:?}: d{name}[{h}] error {err} of its terms' sum");
        }
    }
}

/// The decode steps, token by token from a zero state carried in place: the scan's float64 `y`
/// and last state, and the linear attention's `o`.
#[test]
fn decode_steps_match_the_f64_recurrence() {
    for dev in common::devices() {
        for (s, dtype, tol) in [
            (Scan { batch: 2, channels: 3, groups: 1, states: 16, len: 5, extras: true }, DType::F32, 1e-4),
            (Scan { batch: 1, channels: 4, groups: 2, states: 32, len: 4, extras: false }, DType::BF16, 2e-2),
        ] {
            selective_scan_steps_match(&dev, s, dtype, tol);
        }
        let c = |batch, seq, heads, k_heads, dk, dv, decay, feature| Lin { batch, seq, heads, k_heads, dk, dv, decay, feature };
        linear_attention_steps_match(&dev, c(1, 5, 2, 1, 64, 64, true, FeatureMap::Identity), DType::BF16);
        linear_attention_steps_match(&dev, c(2, 3, 1, 1, 64, 128, false, FeatureMap::EluPlusOne), DType::F16);
    }
}

fn selective_scan_steps_match(dev: &Device, s: Scan, dtype: DType, tol: f64) {
    let (bt, ch, n, l) = (s.batch, s.channels, s.states, s.len);
    let (seq, bc) = ([bt, ch, l], [bt, s.groups, n, l]);
    let delta: Vec<f32> = if s.extras { random(bt * ch * l, 1.0) } else { random(bt * ch * l, 0.2).into_iter().map(|x| x + 0.3).collect() };
    let own = [
        (&seq[..], random(bt * ch * l, 1.0)),
        (&seq, delta),
        (&bc, random(bt * s.groups * n * l, 1.0)),
        (&bc, random(bt * s.groups * n * l, 1.0)),
        (&seq, random(bt * ch * l, 2.0)),
    ];
    let f32s =
        [(&[ch, n][..], random(ch * n, 0.7).into_iter().map(|x| x - 0.8).collect()), (&[ch], random(ch, 1.0)), (&[ch], random(ch, 0.5))];
    let (mut t, mut x) = (Vec::new(), Vec::new());
    for ((dims, v), dt) in own.iter().map(|p| (p, dtype)).chain(f32s.iter().map(|p| (p, DType::F32))) {
        let (tensor, values) = tensor(dev, v, dims, dt);
        t.push(tensor);
        x.push(values);
    }
    let x: ScanInputs = x.try_into().unwrap();
    let (want_y, want_state) = scan_reference_and_state(s, &x);
    let state = Tensor::zeros((bt, ch, n), DType::F32, dev).unwrap();
    let mut ys = Vec::new();
    for step in 0..l {
        let at = |i: usize| t[i].narrow(t[i].rank() - 1, step, 1).unwrap();
        let (z, d, bias) = (at(4), &t[6], &t[7]);
        let opts = SelectiveScanOptions {
            z: s.extras.then_some(&z),
            d: s.extras.then_some(d),
            delta_bias: s.extras.then_some(bias),
            delta_softplus: s.extras,
        };
        let y = tessera_candle::selective_scan_step(&state, &at(0), &at(1), &t[5], &at(2), &at(3), &opts).unwrap();
        assert_eq!((y.dims(), y.dtype()), (&[bt, ch, 1][..], dtype));
        ys.push(y);
    }
    let y = Tensor::cat(&ys, 2).unwrap();
    let err = rel_error(&values(&y), &want_y);
    assert!(err < tol, "{s:?} {dtype:?}: the steps' y relative error {err}");
    let err = rel_error(&values(&state), &want_state);
    assert!(err < tol, "{s:?} {dtype:?}: the last state's relative error {err}");
}

fn linear_attention_steps_match(dev: &Device, c: Lin, dtype: DType) {
    let ([(q, qv), (k, kv), (v, vv), (g, gv)], _) = lin_inputs(dev, c, dtype);
    let (want_o, _) = lin_reference(c, 1.0 / (c.dk as f64).sqrt(), &qv, &kv, &vv, c.decay.then_some(&gv[..]), None, &vv);
    let state = Tensor::zeros((c.batch, c.heads, c.dk, c.dv), DType::F32, dev).unwrap();
    let mut os = Vec::new();
    for step in 0..c.seq {
        let g_t = g.narrow(2, step, 1).unwrap();
        let opts = LinearAttentionOptions { scale: None, feature_map: c.feature, decay: c.decay.then_some(&g_t) };
        let at = |t: &Tensor| t.narrow(1, step, 1).unwrap();
        let o = tessera_candle::linear_attention_step(&state, &at(&q), &at(&k), &at(&v), &opts).unwrap();
        assert_eq!((o.dims(), o.dtype()), (&[c.batch, 1, c.heads, c.dv][..], dtype));
        os.push(o);
    }
    let err = rel_error(&values(&Tensor::cat(&os, 1).unwrap()), &want_o);
    assert!(err < 1e-2, "{c:?} {dtype:?}: the steps' o relative error {err}");
}

#[test]
fn decode_steps_refuse_bad_state() {
    let dev = Device::Cpu;
    let t = |dims: &[usize], dtype| Tensor::ones(dims, dtype, &dev).unwrap();
    let (u, b) = (t(&[1, 2, 1], DType::F32), t(&[1, 1, 16, 1], DType::F32));
    let none = SelectiveScanOptions::default();
    let msg = |r: candle_core::Result<Tensor>| r.map(|_| ()).unwrap_err().to_string();
    let a = t(&[2, 16], DType::F32);
    let e = msg(tessera_candle::selective_scan_step(&t(&[1, 2, 16], DType::BF16), &u, &u, &a, &b, &b, &none));
    assert!(e.contains("`state` must be F32"), "{e}");
    let e = msg(tessera_candle::selective_scan_step(&t(&[1, 2, 8], DType::F32), &u, &u, &a, &b, &b, &none));
    assert!(e.contains("state"), "{e}");
    let e = msg(tessera_candle::selective_scan_step(
        &t(&[1, 2, 16], DType::F32),
        &t(&[1, 2, 3], DType::F32),
        &t(&[1, 2, 3], DType::F32),
        &a,
        &t(&[1, 1, 16, 3], DType::F32),
        &t(&[1, 1, 16, 3], DType::F32),
        &none,
    ));
    assert!(e.contains("one step"), "{e}");
    // A state sharing a storage with `a`: refused, not a lock waiting on itself.
    let both = t(&[2, 2, 16], DType::F32);
    let (state, a) = (both.narrow(0, 0, 1).unwrap(), both.get(1).unwrap());
    let e = msg(tessera_candle::selective_scan_step(&state, &u, &u, &a, &b, &b, &none));
    assert!(e.contains("shares its storage with `a`"), "{e}");
    let strided = t(&[1, 16, 2], DType::F32).transpose(1, 2).unwrap();
    let e = msg(tessera_candle::selective_scan_step(&strided, &u, &u, &t(&[2, 16], DType::F32), &b, &b, &none));
    assert!(e.contains("contiguous"), "{e}");
}
