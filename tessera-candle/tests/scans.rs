//! The prefix scans as candle ops against float64 sequential scans, and their gradients through
//! candle's autograd against the float64 derivative of each scan, fresh random inputs, odd
//! lengths; on the CPU (Tessera's interpreter) and, with the `cuda` feature, the GPU.

mod common;

use candle_core::{DType, Device, Var};
use common::{random, rel_error, tensor, values};
use tessera_candle::ScanKind;

/// Each row's scan and its gradient under the loss `Σ y ⊙ g`, in float64.
fn reference(kind: ScanKind, x: &[f64], g: &[f64]) -> (Vec<f64>, Vec<f64>) {
    let n = x.len();
    let mut y = Vec::with_capacity(n);
    let mut acc = match kind {
        ScanKind::Cumsum => 0.0,
        ScanKind::Cumprod => 1.0,
        ScanKind::LogCumSumExp => f64::NEG_INFINITY,
    };
    for &v in x {
        acc = match kind {
            ScanKind::Cumsum => acc + v,
            ScanKind::Cumprod => acc * v,
            ScanKind::LogCumSumExp => acc.max(v) + (-(acc - v).abs()).exp().ln_1p(),
        };
        y.push(acc);
    }
    // dy_k/dx_j for k ≥ j, summed against g; a cumprod's product of every factor but x_j
    // built up as k grows (the factors before j, then each x_k past j).
    let dx = (0..n)
        .map(|j| {
            let mut others: f64 = x[..j].iter().product();
            (j..n)
                .map(|k| {
                    if k > j {
                        others *= x[k];
                    }
                    g[k] * match kind {
                        ScanKind::Cumsum => 1.0,
                        ScanKind::Cumprod => others,
                        ScanKind::LogCumSumExp => (x[j] - y[k]).exp(),
                    }
                })
                .sum()
        })
        .collect();
    (y, dx)
}

#[test]
fn scans_and_their_gradients_match_f64_reference() {
    for dev in common::devices() {
        scans_and_their_gradients_match_f64_reference_on(&dev);
    }
}

fn scans_and_their_gradients_match_f64_reference_on(dev: &Device) {
    for kind in [ScanKind::Cumsum, ScanKind::Cumprod, ScanKind::LogCumSumExp] {
        for (dims, dtype, tol) in
            [(vec![3, 5, 300], DType::F32, 1e-4), (vec![7, 1000], DType::BF16, 2e-2), (vec![1, 299], DType::F16, 5e-3)]
        {
            let n = *dims.last().unwrap();
            let len: usize = dims.iter().product();
            // Products of factors near 1 stay well scaled.
            let xs: Vec<f32> = match kind {
                ScanKind::Cumprod => random(len, 0.01).into_iter().map(|v| 1.0 + v).collect(),
                _ => random(len, 2.0),
            };
            let (x, xv) = tensor(dev, &xs, &dims, dtype);
            let (g, gv) = tensor(dev, &random(len, 1.0), &dims, dtype);
            let x = Var::from_tensor(&x).unwrap();
            let y = tessera_candle::scan(&x, kind).unwrap();
            assert_eq!((y.dims(), y.dtype()), (&dims[..], dtype));
            let grads = (&y * &g).unwrap().to_dtype(DType::F32).unwrap().sum_all().unwrap().backward().unwrap();
            let (mut want_y, mut want_dx) = (Vec::new(), Vec::new());
            for (xr, gr) in xv.chunks(n).zip(gv.chunks(n)) {
                let (y, dx) = reference(kind, xr, gr);
                want_y.extend(y);
                want_dx.extend(dx);
            }
            let err = rel_error(&values(&y), &want_y);
            assert!(err < tol, "{kind:?} {dims:?} {dtype:?}: relative error {err}");
            let dx = grads.get(x.as_tensor()).expect("a gradient for x");
            let err = rel_error(&values(dx), &want_dx);
            assert!(err < tol * 2.0, "{kind:?} backward {dims:?} {dtype:?}: relative error {err}");
        }
    }
    let (s, _) = tensor(dev, &random(1, 1.0), &[1], DType::F32);
    let e = tessera_candle::scan(&s.squeeze(0).unwrap(), ScanKind::Cumsum).unwrap_err().to_string();
    assert!(e.contains("scalar"), "{e}");
}
