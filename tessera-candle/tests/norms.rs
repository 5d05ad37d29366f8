//! The norms as candle ops on the CPU (Tessera's interpreter) against a float64 reference of the
//! math: fresh random inputs each run, odd shapes and ranks, each dtype; and the errors a
//! misfit tensor gives (candle errors naming it, never a panic).

mod common;

use candle_core::{DType, Device};
use common::{random, rel_error, tensor, values};

/// The float64 norm of each row of `x` (`hidden` wide): RMS where `bias` is `None`, else layer
/// norm (biased variance).
fn reference(x: &[f64], hidden: usize, w: &[f64], bias: Option<&[f64]>, eps: f64) -> Vec<f64> {
    let mut y = Vec::with_capacity(x.len());
    for row in x.chunks(hidden) {
        let n = hidden as f64;
        let mean = if bias.is_some() { row.iter().sum::<f64>() / n } else { 0.0 };
        let var = row.iter().map(|v| (v - mean).powi(2)).sum::<f64>() / n;
        let r = 1.0 / (var + eps).sqrt();
        for (j, v) in row.iter().enumerate() {
            y.push((v - mean) * r * w[j] + bias.map_or(0.0, |b| b[j]));
        }
    }
    y
}

/// The rounding each dtype's output allows, relative.
fn tolerance(dtype: DType) -> f64 {
    match dtype {
        DType::BF16 => 8e-3,
        DType::F16 => 1e-3,
        _ => 1e-5,
    }
}

#[test]
fn rms_norm_matches_f64_reference() {
    for dev in common::devices() {
        rms_norm_matches_f64_reference_on(&dev);
    }
}

fn rms_norm_matches_f64_reference_on(dev: &Device) {
    for (dims, dtype) in
        [(vec![3, 5, 70], DType::BF16), (vec![7, 1000], DType::F16), (vec![129], DType::F32), (vec![2, 3, 4097], DType::F32)]
    {
        let hidden = *dims.last().unwrap();
        let n: usize = dims.iter().product();
        let (x, xv) = tensor(dev, &random(n, 3.0), &dims, dtype);
        let (w, wv) = tensor(dev, &random(hidden, 2.0), &[hidden], dtype);
        let y = tessera_candle::rms_norm(&x, &w, 1e-5).unwrap();
        assert_eq!(y.dims(), x.dims());
        assert_eq!(y.dtype(), dtype);
        let err = rel_error(&values(&y), &reference(&xv, hidden, &wv, None, 1e-5));
        assert!(err < tolerance(dtype), "rms_norm {dims:?} {dtype:?}: relative error {err}");
    }
}

#[test]
fn layer_norm_matches_f64_reference() {
    for dev in common::devices() {
        layer_norm_matches_f64_reference_on(&dev);
    }
}

fn layer_norm_matches_f64_reference_on(dev: &Device) {
    for (dims, dtype) in [(vec![3, 5, 70], DType::BF16), (vec![7, 1000], DType::F16), (vec![2, 3, 4097], DType::F32)] {
        let hidden = *dims.last().unwrap();
        let n: usize = dims.iter().product();
        // Rows off zero mean: the variance taken about the mean, not about 0.
        let xs: Vec<f32> = random(n, 3.0).into_iter().map(|v| v + 5.0).collect();
        let (x, xv) = tensor(dev, &xs, &dims, dtype);
        let (w, wv) = tensor(dev, &random(hidden, 2.0), &[hidden], dtype);
        let (b, bv) = tensor(dev, &random(hidden, 1.0), &[hidden], dtype);
        let y = tessera_candle::layer_norm(&x, &w, &b, 1e-5).unwrap();
        let err = rel_error(&values(&y), &reference(&xv, hidden, &wv, Some(&bv), 1e-5));
        assert!(err < tolerance(dtype), "layer_norm {dims:?} {dtype:?}: relative error {err}");
    }
}

#[test]
fn add_norms_match_f64_reference() {
    for dev in common::devices() {
        add_norms_match_f64_reference_on(&dev);
    }
}

fn add_norms_match_f64_reference_on(dev: &Device) {
    for (dims, dtype, layer) in [
        (vec![3, 5, 70], DType::BF16, false),
        (vec![7, 1000], DType::F16, true),
        (vec![2, 3, 4097], DType::F32, false),
        (vec![5, 2304], DType::BF16, true),
    ] {
        let hidden = *dims.last().unwrap();
        let n: usize = dims.iter().product();
        let (x, xv) = tensor(dev, &random(n, 3.0), &dims, dtype);
        // A residual off zero mean: LayerNorm's variance is taken about the mean.
        let rs: Vec<f32> = random(n, 2.0).into_iter().map(|v| v + 4.0).collect();
        let (r, rv) = tensor(dev, &rs, &dims, dtype);
        let (w, wv) = tensor(dev, &random(hidden, 2.0), &[hidden], dtype);
        let (b, bv) = tensor(dev, &random(hidden, 1.0), &[hidden], dtype);
        let (y, h) = if layer {
            tessera_candle::add_layer_norm(&x, &r, &w, &b, 1e-5).unwrap()
        } else {
            tessera_candle::add_rms_norm(&x, &r, &w, 1e-5).unwrap()
        };
        assert_eq!((y.dims(), h.dims(), y.dtype(), h.dtype()), (x.dims(), x.dims(), dtype, dtype));
        let hv: Vec<f64> = xv.iter().zip(&rv).map(|(a, b)| a + b).collect();
        let want = reference(&hv, hidden, &wv, layer.then_some(&bv[..]), 1e-5);
        let what = format!("{} {dims:?} {dtype:?}", if layer { "add_layer_norm" } else { "add_rms_norm" });
        let err = rel_error(&values(&h), &hv);
        assert!(err < tolerance(dtype), "{what}: h's relative error {err}");
        let err = rel_error(&values(&y), &want);
        assert!(err < tolerance(dtype), "{what}: y's relative error {err}");
        // `h` is a view of the op's buffer that the next op reads in place.
        let again = tessera_candle::rms_norm(&h, &w, 1e-5).unwrap();
        let err = rel_error(&values(&again), &reference(&values(&h), hidden, &wv, None, 1e-5));
        assert!(err < tolerance(dtype), "{what}: rms_norm of h, relative error {err}");
    }
}

#[test]
fn misfit_tensors_are_candle_errors() {
    for dev in common::devices() {
        misfit_tensors_are_candle_errors_on(&dev);
    }
}

fn misfit_tensors_are_candle_errors_on(dev: &Device) {
    let (x, _) = tensor(dev, &random(4 * 64, 1.0), &[4, 64], DType::F32);
    let (w, _) = tensor(dev, &random(64, 1.0), &[64], DType::F32);
    let e = tessera_candle::rms_norm(&x, &w.narrow(0, 0, 32).unwrap(), 1e-5).unwrap_err().to_string();
    assert!(e.contains("`weight`") && e.contains("[64]") && e.contains("[32]"), "{e}");
    let e = tessera_candle::rms_norm(&x, &w.to_dtype(DType::BF16).unwrap(), 1e-5).unwrap_err().to_string();
    assert!(e.contains("`weight`") && e.contains("F32") && e.contains("BF16"), "{e}");
    let e = tessera_candle::rms_norm(&x.t().unwrap(), &tensor(dev, &random(4, 1.0), &[4], DType::F32).0, 1e-5).unwrap_err().to_string();
    assert!(e.contains("contiguous"), "{e}");
    let e = tessera_candle::rms_norm(&x.to_dtype(DType::F64).unwrap(), &w.to_dtype(DType::F64).unwrap(), 1e-5).unwrap_err().to_string();
    assert!(e.contains("bf16, f16 or f32") && e.contains("F64"), "{e}");
    let e = tessera_candle::layer_norm(&x, &w, &w.narrow(0, 1, 63).unwrap(), 1e-5).unwrap_err().to_string();
    assert!(e.contains("`bias`") && e.contains("[63]"), "{e}");
    let e = tessera_candle::add_rms_norm(&x, &x.narrow(0, 0, 3).unwrap(), &w, 1e-5).unwrap_err().to_string();
    assert!(e.contains("`residual`") && e.contains("[4, 64]") && e.contains("[3, 64]"), "{e}");
    let e = tessera_candle::add_rms_norm(&x, &x.to_dtype(DType::F16).unwrap(), &w, 1e-5).unwrap_err().to_string();
    assert!(e.contains("`residual`") && e.contains("F16"), "{e}");
    let e = tessera_candle::add_layer_norm(&x, &x, &w, &w.narrow(0, 0, 8).unwrap(), 1e-5).unwrap_err().to_string();
    assert!(e.contains("`bias`") && e.contains("[8]"), "{e}");
    let e = tessera_candle::add_layer_norm(&x, &x, &w, &w.to_dtype(DType::BF16).unwrap(), 1e-5).unwrap_err().to_string();
    assert!(e.contains("`bias`") && e.contains("BF16"), "{e}");
}
