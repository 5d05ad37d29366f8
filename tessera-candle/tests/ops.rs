//! Softmax, the linear layer and RoPE as candle ops on the CPU (Tessera's interpreter) against float64
//! references, fresh random inputs, odd shapes and ranks; and their misfit errors.

mod common;

use candle_core::{DType, Device};
use common::{random, rel_error, tensor, values};
use tessera_candle::{Activation, HeadLayout, RopeStyle};

#[test]
fn softmax_matches_f64_reference() {
    for dev in common::devices() {
        softmax_matches_f64_reference_on(&dev);
    }
}

fn softmax_matches_f64_reference_on(dev: &Device) {
    for (dims, dtype, tol) in [(vec![3, 5, 70], DType::BF16, 8e-3), (vec![7, 3000], DType::F16, 2e-3), (vec![1, 4099], DType::F32, 1e-5)] {
        let n = *dims.last().unwrap();
        let (x, xv) = tensor(dev, &random(dims.iter().product(), 6.0), &dims, dtype);
        let y = tessera_candle::softmax_last_dim(&x).unwrap();
        assert_eq!((y.dims(), y.dtype()), (x.dims(), dtype));
        let mut want = Vec::with_capacity(xv.len());
        for row in xv.chunks(n) {
            let m = row.iter().cloned().fold(f64::MIN, f64::max);
            let sum: f64 = row.iter().map(|v| (v - m).exp()).sum();
            want.extend(row.iter().map(|v| (v - m).exp() / sum));
        }
        let err = rel_error(&values(&y), &want);
        assert!(err < tol, "softmax {dims:?} {dtype:?}: relative error {err}");
    }
}

/// tanh-approximated GELU, in float64.
fn gelu_tanh(x: f64) -> f64 {
    0.5 * x * (1.0 + ((2.0 / std::f64::consts::PI).sqrt() * (x + 0.044715 * x * x * x)).tanh())
}

#[test]
fn linear_matches_f64_reference() {
    for dev in common::devices() {
        linear_matches_f64_reference_on(&dev);
    }
}

fn linear_matches_f64_reference_on(dev: &Device) {
    for (dims, n, dtype, bias) in
        [(vec![2, 37, 70], 100, DType::BF16, true), (vec![130, 48], 24, DType::F16, false), (vec![64], 136, DType::BF16, true)]
    {
        let k = *dims.last().unwrap();
        let m: usize = dims.iter().product::<usize>() / k;
        let (x, xv) = tensor(dev, &random(m * k, 1.0), &dims, dtype);
        let (w, wv) = tensor(dev, &random(n * k, 1.0), &[n, k], dtype);
        let (b, bv) = tensor(dev, &random(n, 1.0), &[n], dtype);
        let act = if bias { Activation::GeluTanh } else { Activation::None };
        let y = tessera_candle::linear(&x, &w, bias.then_some(&b), act).unwrap();
        let mut out_dims = dims.clone();
        *out_dims.last_mut().unwrap() = n;
        assert_eq!(y.dims(), &out_dims[..]);
        let want: Vec<f64> = (0..m * n)
            .map(|ij| {
                let (i, j) = (ij / n, ij % n);
                let dot: f64 = (0..k).map(|kk| xv[i * k + kk] * wv[j * k + kk]).sum();
                if bias {
                    gelu_tanh(dot + bv[j])
                } else {
                    dot
                }
            })
            .collect();
        let err = rel_error(&values(&y), &want);
        assert!(err < 1e-2, "linear {dims:?}×{n} {dtype:?} bias={bias}: relative error {err}");
    }
}

#[test]
fn swiglu_matches_f64_reference() {
    for dev in common::devices() {
        for (dims, n, dtype) in [(vec![2, 37, 70], 100, DType::BF16), (vec![130, 48], 24, DType::F16)] {
            let k = *dims.last().unwrap();
            let m: usize = dims.iter().product::<usize>() / k;
            let (x, xv) = tensor(&dev, &random(m * k, 1.0), &dims, dtype);
            let (wg, wgv) = tensor(&dev, &random(n * k, 1.0), &[n, k], dtype);
            let (wu, wuv) = tensor(&dev, &random(n * k, 1.0), &[n, k], dtype);
            let y = tessera_candle::swiglu(&x, &wg, &wu).unwrap();
            let mut out_dims = dims.clone();
            *out_dims.last_mut().unwrap() = n;
            assert_eq!((y.dims(), y.dtype()), (&out_dims[..], dtype));
            let dot = |w: &[f64], i: usize, j: usize| (0..k).map(|kk| xv[i * k + kk] * w[j * k + kk]).sum::<f64>();
            let want: Vec<f64> = (0..m * n)
                .map(|ij| {
                    let (i, j) = (ij / n, ij % n);
                    let g = dot(&wgv, i, j);
                    g / (1.0 + (-g).exp()) * dot(&wuv, i, j)
                })
                .collect();
            // The up projection is rounded to 16 bits before the product.
            let err = rel_error(&values(&y), &want);
            assert!(err < 1e-2, "swiglu {dims:?}×{n} {dtype:?}: relative error {err}");
        }
        let (x, _) = tensor(&dev, &random(4 * 64, 1.0), &[4, 64], DType::BF16);
        let (wg, _) = tensor(&dev, &random(32 * 64, 1.0), &[32, 64], DType::BF16);
        let (wu, _) = tensor(&dev, &random(16 * 64, 1.0), &[16, 64], DType::BF16);
        let e = tessera_candle::swiglu(&x, &wg, &wu).unwrap_err().to_string();
        assert!(e.contains("`w_up`") && e.contains("[32, 64]"), "{e}");
    }
}

#[test]
fn misfit_ops_are_candle_errors() {
    for dev in common::devices() {
        misfit_ops_are_candle_errors_on(&dev);
    }
}

fn misfit_ops_are_candle_errors_on(dev: &Device) {
    let (x, _) = tensor(dev, &random(4 * 64, 1.0), &[4, 64], DType::BF16);
    let (w, _) = tensor(dev, &random(32 * 60, 1.0), &[32, 60], DType::BF16);
    let e = tessera_candle::linear(&x, &w, None, Activation::None).unwrap_err().to_string();
    assert!(e.contains("`w`") && e.contains("[N, 64]") && e.contains("[32, 60]"), "{e}");
    let (w, _) = tensor(dev, &random(32 * 64, 1.0), &[32, 64], DType::BF16);
    let e = tessera_candle::linear(&x.to_dtype(DType::F32).unwrap(), &w.to_dtype(DType::F32).unwrap(), None, Activation::None)
        .unwrap_err()
        .to_string();
    assert!(e.contains("bf16 or f16") && e.contains("F32"), "{e}");
    let (b, _) = tensor(dev, &random(31, 1.0), &[31], DType::BF16);
    let e = tessera_candle::linear(&x, &w, Some(&b), Activation::None).unwrap_err().to_string();
    assert!(e.contains("`bias`") && e.contains("[32]") && e.contains("[31]"), "{e}");
    let e = tessera_candle::softmax_last_dim(&x.t().unwrap()).unwrap_err().to_string();
    assert!(e.contains("contiguous"), "{e}");
}

#[test]
fn rope_matches_f64_reference() {
    for dev in common::devices() {
        rope_matches_f64_reference_on(&dev);
    }
}

fn rope_matches_f64_reference_on(dev: &Device) {
    for (style, layout, dtype, tol) in [
        (RopeStyle::HalfSplit, HeadLayout::Bshd, DType::BF16, 8e-3),
        (RopeStyle::Interleaved, HeadLayout::Bhsd, DType::F32, 1e-5),
        (RopeStyle::HalfSplit, HeadLayout::Bhsd, DType::F16, 2e-3),
    ] {
        let (b, s, h, d) = (2, 7, 3, 64);
        let dims = match layout {
            HeadLayout::Bshd => [b, s, h, d],
            HeadLayout::Bhsd => [b, h, s, d],
        };
        let (base, offset) = (500_000.0f64, 11);
        let (x, xv) = tensor(dev, &random(b * s * h * d, 2.0), &dims, dtype);
        let y = tessera_candle::rope(&x, style, layout, base as f32, offset).unwrap();
        assert_eq!(y.dims(), &dims);
        let mut want = vec![0f64; xv.len()];
        for row in 0..b * s * h {
            // The row's token: its `s` index in either layout.
            let tok = match layout {
                HeadLayout::Bshd => (row / h) % s,
                HeadLayout::Bhsd => row % s,
            };
            let p = (offset + tok) as f64;
            let x = &xv[row * d..(row + 1) * d];
            for i in 0..d / 2 {
                let (j, k) = match style {
                    RopeStyle::HalfSplit => (i, i + d / 2),
                    RopeStyle::Interleaved => (2 * i, 2 * i + 1),
                };
                let a = p * base.powf(-2.0 * i as f64 / d as f64);
                want[row * d + j] = x[j] * a.cos() - x[k] * a.sin();
                want[row * d + k] = x[k] * a.cos() + x[j] * a.sin();
            }
        }
        let err = rel_error(&values(&y), &want);
        assert!(err < tol, "rope {style:?} {layout:?} {dtype:?}: relative error {err}");
    }
    let e = tessera_candle::rope(&tensor(dev, &random(64, 1.0), &[8, 8], DType::F32).0, RopeStyle::HalfSplit, HeadLayout::Bshd, 1e4, 0)
        .unwrap_err()
        .to_string();
    assert!(e.contains("4-D") && e.contains("[8, 8]"), "{e}");
}

/// Attention in float64 from the definition: `q` `[b, sq, h, d]`, `k`/`v` `[b, sk, hk, d]`,
/// query head `i` reading key/value head `i / (h / hk)`, key `j` masked from query `i` when
/// `j > i + sk − sq` (causal).
#[allow(clippy::too_many_arguments)]
fn attention_reference(q: &[f64], k: &[f64], v: &[f64], [b, sq, h, d]: [usize; 4], [sk, hk]: [usize; 2], causal: bool) -> Vec<f64> {
    let scale = 1.0 / (d as f64).sqrt();
    let mut o = vec![0.0; q.len()];
    for bi in 0..b {
        for hi in 0..h {
            let kh = hi / (h / hk);
            for i in 0..sq {
                let qi = &q[((bi * sq + i) * h + hi) * d..][..d];
                let keys = if causal { (i + sk - sq + 1).min(sk) } else { sk };
                let s: Vec<f64> = (0..keys)
                    .map(|j| qi.iter().zip(&k[((bi * sk + j) * hk + kh) * d..][..d]).map(|(a, b)| a * b).sum::<f64>() * scale)
                    .collect();
                let m = s.iter().cloned().fold(f64::MIN, f64::max);
                let p: Vec<f64> = s.iter().map(|x| (x - m).exp()).collect();
                let sum: f64 = p.iter().sum();
                for (j, pj) in p.iter().enumerate() {
                    for c in 0..d {
                        o[((bi * sq + i) * h + hi) * d + c] += pj / sum * v[((bi * sk + j) * hk + kh) * d + c];
                    }
                }
            }
        }
    }
    o
}

#[test]
fn attention_matches_f64_reference() {
    for dev in common::devices() {
        attention_matches_f64_reference_on(&dev);
    }
}

fn attention_matches_f64_reference_on(dev: &Device) {
    // Prefill (causal, GQA 4/2), a decode step against a longer cache, and no mask.
    for (b, sq, sk, h, hk, d, causal, dtype) in
        [(1, 70, 70, 4, 2, 64, true, DType::BF16), (2, 3, 130, 4, 1, 128, true, DType::F16), (1, 33, 50, 2, 2, 64, false, DType::BF16)]
    {
        let (q, qv) = tensor(dev, &random(b * sq * h * d, 1.0), &[b, sq, h, d], dtype);
        let (k, kv) = tensor(dev, &random(b * sk * hk * d, 1.0), &[b, sk, hk, d], dtype);
        let (v, vv) = tensor(dev, &random(b * sk * hk * d, 1.0), &[b, sk, hk, d], dtype);
        let o = tessera_candle::attention(&q, &k, &v, causal, None).unwrap();
        assert_eq!((o.dims(), o.dtype()), (q.dims(), dtype));
        let err = rel_error(&values(&o), &attention_reference(&qv, &kv, &vv, [b, sq, h, d], [sk, hk], causal));
        assert!(err < 1e-2, "attention {b}×{sq}×{sk} {h}/{hk} d{d} causal={causal} {dtype:?}: relative error {err}");
    }
    let (q, _) = tensor(dev, &random(2 * 8 * 64, 1.0), &[2, 8, 64], DType::BF16);
    let e = tessera_candle::attention(&q, &q, &q, true, None).unwrap_err().to_string();
    assert!(e.contains("`q`") && e.contains("4-D"), "{e}");
}

#[test]
fn linear_residual_matches_f64_reference() {
    for dev in common::devices() {
        linear_residual_matches_f64_reference_on(&dev);
    }
}

fn linear_residual_matches_f64_reference_on(dev: &Device) {
    let (m, k, n) = (37, 72, 40);
    let (x, xv) = tensor(dev, &random(m * k, 1.0), &[1, m, k], DType::BF16);
    let (w, wv) = tensor(dev, &random(n * k, 1.0), &[n, k], DType::BF16);
    let (r, rv) = tensor(dev, &random(m * n, 4.0), &[1, m, n], DType::BF16);
    let y = tessera_candle::linear_residual(&x, &w, &r).unwrap();
    let want: Vec<f64> =
        (0..m * n).map(|ij| rv[ij] + (0..k).map(|kk| xv[(ij / n) * k + kk] * wv[(ij % n) * k + kk]).sum::<f64>()).collect();
    let err = rel_error(&values(&y), &want);
    assert!(err < 1e-2, "linear_residual: relative error {err}");
    let e = tessera_candle::linear_residual(&x, &w, &r.narrow(1, 0, 36).unwrap()).unwrap_err().to_string();
    assert!(e.contains("`residual`") && e.contains("[1, 37, 40]"), "{e}");
}

/// The gradients of `Σ o ⊙ g` for attention's `o`, in float64 from the definition (layouts and
/// the mask as [`attention_reference`]): `dv = pᵀ·g`, `ds = p ⊙ (g·vᵀ − Σ_d g ⊙ o)`, `dq =
/// ds·k·scale`, `dk = dsᵀ·q·scale`, the grouped heads' shares summed.
#[allow(clippy::too_many_arguments)]
fn attention_grads_reference(
    q: &[f64], k: &[f64], v: &[f64], g: &[f64], [b, sq, h, d]: [usize; 4], [sk, hk]: [usize; 2], causal: bool,
) -> (Vec<f64>, Vec<f64>, Vec<f64>) {
    let scale = 1.0 / (d as f64).sqrt();
    let (mut dq, mut dk, mut dv) = (vec![0.0; q.len()], vec![0.0; k.len()], vec![0.0; v.len()]);
    let o = attention_reference(q, k, v, [b, sq, h, d], [sk, hk], causal);
    for bi in 0..b {
        for hi in 0..h {
            let kh = hi / (h / hk);
            for i in 0..sq {
                let row = ((bi * sq + i) * h + hi) * d;
                let keys = if causal { (i + sk - sq + 1).min(sk) } else { sk };
                let at = |j: usize| ((bi * sk + j) * hk + kh) * d;
                let s: Vec<f64> = (0..keys).map(|j| (0..d).map(|c| q[row + c] * k[at(j) + c]).sum::<f64>() * scale).collect();
                let m = s.iter().cloned().fold(f64::MIN, f64::max);
                let sum: f64 = s.iter().map(|x| (x - m).exp()).sum();
                let delta: f64 = (0..d).map(|c| g[row + c] * o[row + c]).sum();
                for (j, sj) in s.iter().enumerate() {
                    let p = (sj - m).exp() / sum;
                    let dp: f64 = (0..d).map(|c| g[row + c] * v[at(j) + c]).sum();
                    let ds = p * (dp - delta);
                    for c in 0..d {
                        dv[at(j) + c] += p * g[row + c];
                        dq[row + c] += ds * k[at(j) + c] * scale;
                        dk[at(j) + c] += ds * q[row + c] * scale;
                    }
                }
            }
        }
    }
    (dq, dk, dv)
}

#[test]
fn attention_gradients_through_candle_autograd() {
    for dev in common::devices() {
        attention_gradients_through_candle_autograd_on(&dev);
    }
}

fn attention_gradients_through_candle_autograd_on(dev: &Device) {
    for (b, sq, sk, h, hk, d, causal) in [(1, 70, 70, 4, 2, 64, true), (2, 33, 50, 2, 1, 128, false)] {
        let var = |n: usize, dims: &[usize]| {
            let (t, v) = tensor(dev, &random(n, 1.0), dims, DType::BF16);
            (candle_core::Var::from_tensor(&t).unwrap(), v)
        };
        let (q, qv) = var(b * sq * h * d, &[b, sq, h, d]);
        let (k, kv) = var(b * sk * hk * d, &[b, sk, hk, d]);
        let (v, vv) = var(b * sk * hk * d, &[b, sk, hk, d]);
        let (g, gv) = tensor(dev, &random(b * sq * h * d, 1.0), &[b, sq, h, d], DType::BF16);
        let o = tessera_candle::attention(&q, &k, &v, causal, None).unwrap();
        let loss = (o * &g).unwrap().to_dtype(DType::F32).unwrap().sum_all().unwrap();
        let grads = loss.backward().unwrap();
        let (dq, dk, dv) = attention_grads_reference(&qv, &kv, &vv, &gv, [b, sq, h, d], [sk, hk], causal);
        for (name, x, want) in [("dq", &q, dq), ("dk", &k, dk), ("dv", &v, dv)] {
            let got = grads.get(x.as_tensor()).unwrap_or_else(|| panic!("no gradient for {name}"));
            assert_eq!(got.dims(), x.dims(), "{name}");
            let err = rel_error(&values(got), &want);
            assert!(err < 2e-2, "{name} {b}×{sq}×{sk} {h}/{hk} d{d} causal={causal}: relative error {err}");
        }
    }
}
