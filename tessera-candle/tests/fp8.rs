//! fp8 quantization as candle ops (`quantize_fp8`, `dequantize_fp8`) on the CPU (Tessera's
//! interpreter) and, with the `cuda` feature, the GPU: every code against a float64 decoding of
//! the E4M3 format written here, fresh random inputs, odd shapes, saturation and NaN; candle's
//! own F8E4M3 conversion reads the codes as the same values; misfit inputs are errors.

mod common;

use candle_core::{DType, Device, Tensor};
use common::random;

/// The value of E4M3 code `c` (OCP E4M3FN: bias 7, no infinities, `S.1111.111` NaN), in float64.
fn decode(c: u8) -> f64 {
    let (sign, e, m) = (if c & 0x80 != 0 { -1.0 } else { 1.0 }, i32::from((c >> 3) & 0xF), f64::from(c & 7));
    match (e, c & 0x7F) {
        (_, 0x7F) => f64::NAN,
        (0, _) => sign * m / 8.0 * 2f64.powi(-6),
        _ => sign * (1.0 + m / 8.0) * 2f64.powi(e - 7),
    }
}

/// The code nearest `v` (ties to the even code), saturating at ±448; NaN gives 0x7F.
fn nearest(v: f64) -> u8 {
    if v.is_nan() {
        return 0x7F;
    }
    let a = v.abs().min(448.0);
    let best = (0u8..0x7F)
        .min_by(|&x, &y| {
            let (dx, dy) = ((decode(x) - a).abs(), (decode(y) - a).abs());
            dx.total_cmp(&dy).then((x & 1).cmp(&(y & 1)))
        })
        .unwrap();
    if v.is_sign_negative() {
        best | 0x80
    } else {
        best
    }
}

/// A tensor's fp8 codes, read on the CPU.
fn codes(t: &Tensor) -> Vec<u8> {
    t.to_device(&Device::Cpu).unwrap().flatten_all().unwrap().to_vec1::<float8::F8E4M3>().unwrap().iter().map(|q| q.to_bits()).collect()
}

#[test]
fn quantize_fp8_matches_f64_rounding() {
    for dev in common::devices() {
        // [2, 4, 256]: a multiple of the kernels' 256-column tiles; the others rows of their
        // last axis.
        for (dims, dtype) in
            [(vec![3, 7, 33], DType::BF16), (vec![1000], DType::F16), (vec![2, 4, 256], DType::F32), (vec![5, 301], DType::F32)]
        {
            let n: usize = dims.iter().product();
            let mut v = random(n, 20.0);
            if dtype == DType::F32 {
                v[..6].copy_from_slice(&[f32::NAN, f32::INFINITY, f32::NEG_INFINITY, -0.0, 1e-9, -600.0]);
            }
            let x = Tensor::from_vec(v, dims.as_slice(), &dev).unwrap().to_dtype(dtype).unwrap();
            let scale = 37.0f32;
            let q = tessera_candle::quantize_fp8(&x, scale).unwrap();
            assert_eq!((q.dims(), q.dtype()), (x.dims(), DType::F8E4M3));
            // The product is taken in f32, as the kernel does, then rounded once.
            let xs = common::values(&x);
            let want: Vec<u8> = xs.iter().map(|&x| nearest(f64::from(x as f32 * scale))).collect();
            let got = codes(&q);
            let wrong: Vec<_> = (0..n).filter(|&i| got[i] != want[i]).take(5).map(|i| (i, xs[i], got[i], want[i])).collect();
            assert!(wrong.is_empty(), "quantize_fp8 {dims:?} {dtype:?} on {dev:?}: (index, x, code, want) {wrong:?}");
            // candle's own conversion reads the codes as the values they stand for.
            let widened = common::values(&q.to_device(&Device::Cpu).unwrap().to_dtype(DType::F32).unwrap());
            for (i, (&w, &c)) in widened.iter().zip(&got).enumerate() {
                assert!(w == decode(c) || (w.is_nan() && decode(c).is_nan()), "code {c:#04x} at {i}: candle reads {w}");
            }
        }
    }
}

#[test]
fn dequantize_fp8_widens_every_code() {
    for dev in common::devices() {
        // Every code once, then random ones, in an odd shape.
        let mut bytes: Vec<u8> = (0..=255).collect();
        bytes.extend(random(3 * 7 * 33 - 256, 1.0).iter().map(|r| ((r + 1.0) * 127.9) as u8));
        let q = Tensor::from_vec(bytes.iter().map(|&b| float8::F8E4M3::from_bits(b)).collect::<Vec<_>>(), (3, 7, 33), &Device::Cpu)
            .unwrap()
            .to_device(&dev)
            .unwrap();
        let scale = 0.375f32;
        for dtype in [DType::BF16, DType::F16, DType::F32] {
            let y = tessera_candle::dequantize_fp8(&q, scale, dtype).unwrap();
            assert_eq!((y.dims(), y.dtype()), (&[3, 7, 33][..], dtype));
            let got = common::values(&y);
            for (i, (&g, &b)) in got.iter().zip(&bytes).enumerate() {
                // The product in f32 (exact: four significant bits by two), rounded once to the dtype.
                let p = (decode(b) * f64::from(scale)) as f32;
                let want = match dtype {
                    DType::BF16 => f64::from(half::bf16::from_f32(p).to_f32()),
                    DType::F16 => f64::from(half::f16::from_f32(p).to_f32()),
                    _ => f64::from(p),
                };
                assert!(g == want || (g.is_nan() && want.is_nan()), "code {b:#04x} at {i} as {dtype:?} on {dev:?}: {g}, want {want}");
            }
        }
    }
}

#[test]
fn fp8_misfits_are_errors() {
    let dev = Device::Cpu;
    let x = Tensor::ones((4, 6), DType::F32, &dev).unwrap();
    let q = tessera_candle::quantize_fp8(&x, 1.0).unwrap();
    let err = |r: candle_core::Result<Tensor>| r.err().map(|e| e.to_string()).unwrap_or_default();
    let e = err(tessera_candle::quantize_fp8(&x.to_dtype(DType::F64).unwrap(), 1.0));
    assert!(e.contains("`x` must be bf16, f16 or f32") && e.contains("F64"), "{e}");
    let e = err(tessera_candle::quantize_fp8(&x.t().unwrap(), 1.0));
    assert!(e.contains("`x` must be contiguous"), "{e}");
    let e = err(tessera_candle::quantize_fp8(&x, f32::NAN));
    assert!(e.contains("scale"), "{e}");
    let e = err(tessera_candle::quantize_fp8(&Tensor::new(1f32, &dev).unwrap(), 1.0));
    assert!(e.contains("scalar"), "{e}");
    let e = err(tessera_candle::dequantize_fp8(&x, 1.0, DType::F32));
    assert!(e.contains("`x` must be F8E4M3") && e.contains("F32"), "{e}");
    let e = err(tessera_candle::dequantize_fp8(&q, 1.0, DType::F64));
    assert!(e.contains("`dtype` must be bf16, f16 or f32") && e.contains("F64"), "{e}");
}
