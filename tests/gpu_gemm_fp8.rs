//! The fp8 GEMM against a float64 reference: fp8 inputs decoded exactly, scales per tensor,
//! per row and per block, with and without promotion, e4m3 and e5m2 A, bf16 and f16 C, bias and
//! activation; odd M and N, K not a multiple of a tile; and its argument errors.

mod common;

use common::{gelu_tanh, random};
use tessera::testing::{gpu_or_skip, rel_error};
use tessera::{bf16, f16, Device, Tensor, F8E4M3, F8E5M2};
use tessera_kernels::{gemm_fp8, Activation, Bias, Fp8Element, Fp8Gemm, Fp8Scaling};

/// An fp8 type's host conversions.
trait Fp8Host: Fp8Element {
    fn encode(x: f32) -> Self;
    fn decode(self) -> f64;
}

impl Fp8Host for F8E4M3 {
    fn encode(x: f32) -> Self {
        F8E4M3::from_f32(x)
    }
    fn decode(self) -> f64 {
        f64::from(self.to_f32())
    }
}

impl Fp8Host for F8E5M2 {
    fn encode(x: f32) -> Self {
        F8E5M2::from_f32(x)
    }
    fn decode(self) -> f64 {
        f64::from(self.to_f32())
    }
}

/// An output type's host conversions.
trait Out: tessera_kernels::GemmElement {
    fn decode(self) -> f64;
    fn encode(x: f32) -> Self;
    /// The relative error allowed (its rounding, and fp8's wgmma sums).
    const TOL: f64;
}

impl Out for bf16 {
    fn decode(self) -> f64 {
        self.to_f64()
    }
    fn encode(x: f32) -> Self {
        bf16::from_f32(x)
    }
    const TOL: f64 = 8e-3;
}

impl Out for f16 {
    fn decode(self) -> f64 {
        self.to_f64()
    }
    fn encode(x: f32) -> Self {
        f16::from_f32(x)
    }
    const TOL: f64 = 4e-3;
}

#[derive(Clone, Copy, Debug, PartialEq)]
enum Mode {
    Tensor,
    Row,
    Block,
}

/// One GEMM of `m×k` A (`P`) and `n×k` B (e4m3) into `U`, scaled as `mode` says, checked
/// against float64.
fn check<P: Fp8Host + Fp8Gemm<U>, U: Out>(dev: &Device, m: usize, n: usize, k: usize, mode: Mode, promote: bool, epilogue: bool) {
    // Values spread over fp8's range (×8 and ×1/4 around 1), each decoded exactly.
    let ha: Vec<P> = random(m * k, -8.0, 8.0).into_iter().map(P::encode).collect();
    let hb: Vec<F8E4M3> = random(n * k, -0.25, 0.25).into_iter().map(F8E4M3::from_f32).collect();
    let kb = k.div_ceil(128);
    let (sa_shape, sb_shape) = match mode {
        Mode::Tensor => (vec![1], vec![1]),
        Mode::Row => (vec![m], vec![n]),
        Mode::Block => (vec![m, kb], vec![n.div_ceil(128), kb]),
    };
    let hsa = random(sa_shape.iter().product(), 0.5, 2.0);
    let hsb = random(sb_shape.iter().product(), 0.5, 2.0);
    let scale_a = |i: usize, kk: usize| {
        f64::from(match mode {
            Mode::Tensor => hsa[0],
            Mode::Row => hsa[i],
            Mode::Block => hsa[i * kb + kk / 128],
        })
    };
    let scale_b = |j: usize, kk: usize| {
        f64::from(match mode {
            Mode::Tensor => hsb[0],
            Mode::Row => hsb[j],
            Mode::Block => hsb[(j / 128) * kb + kk / 128],
        })
    };
    let hbias: Vec<U> = random(n, -1.0, 1.0).into_iter().map(U::encode).collect();
    // The operands decoded (exactly) and scaled, once.
    let wa: Vec<f64> = (0..m * k).map(|x| ha[x].decode() * scale_a(x / k, x % k)).collect();
    let wb: Vec<f64> = (0..n * k).map(|x| f64::from(hb[x].to_f32()) * scale_b(x / k, x % k)).collect();
    let want: Vec<f64> = (0..m * n)
        .map(|ij| {
            let (i, j) = (ij / n, ij % n);
            let dot: f64 = wa[i * k..(i + 1) * k].iter().zip(&wb[j * k..(j + 1) * k]).map(|(x, y)| x * y).sum();
            if epilogue {
                gelu_tanh(dot + hbias[j].decode())
            } else {
                dot
            }
        })
        .collect();
    let a = Tensor::from_host(dev, &ha, &[m, k]).unwrap();
    let b = Tensor::from_host(dev, &hb, &[n, k]).unwrap();
    let sa = Tensor::from_host(dev, &hsa, &sa_shape).unwrap();
    let sb = Tensor::from_host(dev, &hsb, &sb_shape).unwrap();
    let bias = Tensor::from_host(dev, &hbias, &[n]).unwrap();
    let scaling = match mode {
        Mode::Tensor => Fp8Scaling::Tensorwise { a: &sa, b: &sb },
        Mode::Row => Fp8Scaling::Rowwise { a: &sa, b: &sb },
        Mode::Block => Fp8Scaling::Blockwise { a: &sa, b: &sb },
    };
    let mut c = Tensor::full(dev, &[m, n], U::encode(f32::NAN)).unwrap();
    let mut g = gemm_fp8(&a, &b, scaling).fast_accumulation(!promote);
    if epilogue {
        g = g.bias(Bias::PerColumn(&bias)).activation(Activation::GeluTanh);
    }
    let what = format!("{m}×{n}×{k} {} → {} {mode:?} promote={promote} epilogue={epilogue}", P::DTYPE, U::DTYPE);
    g.run(dev, &mut c).unwrap_or_else(|e| panic!("{what}: {e}"));
    let got: Vec<f64> = c.to_host().unwrap().into_iter().map(U::decode).collect();
    let err = rel_error(&got, &want);
    eprintln!("{what}: relative error {err:.2e}");
    assert!(err < U::TOL, "{what}: relative error {err}");
}

fn all_modes(dev: &Device, m: usize, n: usize, k: usize) {
    for (mode, promote) in [(Mode::Tensor, false), (Mode::Row, false), (Mode::Tensor, true), (Mode::Row, true), (Mode::Block, true)] {
        check::<F8E4M3, bf16>(dev, m, n, k, mode, promote, false);
    }
    check::<F8E5M2, bf16>(dev, m, n, k, Mode::Row, false, true);
    check::<F8E4M3, f16>(dev, m, n, k, Mode::Block, true, true);
    check::<F8E5M2, f16>(dev, m, n, k, Mode::Tensor, true, false);
}

#[test]
fn gpu_gemm_fp8_matches_f64_reference() {
    let Some(dev) = gpu_or_skip("gpu_gemm_fp8_matches_f64_reference") else { return };
    // (N 261: rows of C not 16-byte multiples, written padded and copied.)
    for (m, n, k) in [(1, 8, 16), (130, 136, 272), (300, 261, 4112), (64, 136, 16384)] {
        all_modes(&dev, m, n, k);
    }
}

#[test]
fn interp_gemm_fp8_matches_f64_reference() {
    // K 272: two full steps of 128 and a tail of 16 (an odd count of steps), 256 an even
    // count; 136 columns: two 128-wide blocks of B.
    let dev = Device::cpu_with_threads(2);
    all_modes(&dev, 70, 136, 272);
    check::<F8E4M3, bf16>(&dev, 70, 136, 256, Mode::Block, true, false);
    check::<F8E4M3, bf16>(&dev, 70, 136, 256, Mode::Row, true, true);
    // N not a multiple of 8: a padded C.
    check::<F8E4M3, bf16>(&dev, 33, 130, 144, Mode::Row, false, true);
    check::<F8E5M2, f16>(&dev, 33, 130, 144, Mode::Block, true, false);
}

#[test]
fn bad_input_gemm_fp8_names_the_argument() {
    let dev = Device::cpu();
    let q = |r: usize, c: usize| Tensor::from_host(&dev, &vec![F8E4M3::from_f32(1.0); r * c], &[r, c]).unwrap();
    let s = |shape: &[usize]| Tensor::from_host(&dev, &vec![1.0f32; shape.iter().product()], shape).unwrap();
    let (a, b) = (q(64, 256), q(128, 256));
    let err = |r: tessera::Result<()>| format!("{:?}", r.expect_err("an argument error"));
    let (one, rows_a, rows_b) = (s(&[1]), s(&[64]), s(&[128]));
    let mut out = Tensor::<bf16>::zeros(&dev, &[64, 128]).unwrap();
    // A blockwise scale of the rowwise shape.
    let e = err(gemm_fp8(&a, &b, Fp8Scaling::Blockwise { a: &rows_a, b: &one }).run(&dev, &mut out));
    assert!(e.contains("scale_a") && e.contains("[64, 2]"), "{e}");
    let e = err(gemm_fp8(&a, &b, Fp8Scaling::Rowwise { a: &rows_a, b: &one }).run(&dev, &mut out));
    assert!(e.contains("scale_b") && e.contains("[128]"), "{e}");
    // K not a multiple of 16.
    let (a2, b2) = (q(64, 200), q(128, 200));
    let e = err(gemm_fp8(&a2, &b2, Fp8Scaling::Tensorwise { a: &one, b: &one }).run(&dev, &mut out));
    assert!(e.contains("multiple of 16") && e.contains("K = 200"), "{e}");
    // B of another K, C of another shape, N not a multiple of 8.
    let e = err(gemm_fp8(&a, &q(128, 128), Fp8Scaling::Tensorwise { a: &one, b: &one }).run(&dev, &mut out));
    assert!(e.contains("`b`") || e.contains("\"b\""), "{e}");
    let mut wrong = Tensor::<bf16>::zeros(&dev, &[64, 120]).unwrap();
    let e = err(gemm_fp8(&a, &b, Fp8Scaling::Rowwise { a: &rows_a, b: &rows_b }).run(&dev, &mut wrong));
    assert!(e.contains("c") && e.contains("[64, 128]"), "{e}");
    // A variant of the fast-accumulation kernel: named, and only with it.
    let e = err(gemm_fp8(&a, &b, Fp8Scaling::Tensorwise { a: &one, b: &one }).fast_accumulation(true).variant("nope").run(&dev, &mut out));
    assert!(e.contains("variant") && e.contains("nope") && e.contains("gemm_fp8_f8e4m3_bf16__bn256_stages4"), "{e}");
    let e = err(gemm_fp8(&a, &b, Fp8Scaling::Tensorwise { a: &one, b: &one })
        .variant("gemm_fp8_f8e4m3_bf16__bn256_stages4")
        .run(&dev, &mut out));
    assert!(e.contains("fast_accumulation(true)"), "{e}");
    // Block scales are always promoted.
    let (ba, bb) = (s(&[64, 2]), s(&[1, 2]));
    let e = err(gemm_fp8(&a, &b, Fp8Scaling::Blockwise { a: &ba, b: &bb }).fast_accumulation(true).run(&dev, &mut out));
    assert!(e.contains("scaling") && e.contains("blockwise"), "{e}");
    // The right shapes run (the interpreter).
    gemm_fp8(&a, &b, Fp8Scaling::Blockwise { a: &ba, b: &bb }).run(&dev, &mut out).expect("block scales of the right shapes");
}
