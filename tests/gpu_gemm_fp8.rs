//! The fp8 GEMM against a float64 reference: fp8 inputs decoded exactly, scales per tensor,
//! per row and per block, with and without promotion, e4m3 and e5m2 A, bf16, f16 and f32 C, bias and
//! activation; fp8 C with an output scale and amax; odd M and N, K not a multiple of a tile; and
//! its argument errors.

mod common;

use common::{gelu_tanh, random};
use tessera::testing::{gpu_or_skip, rel_error};
use tessera::{bf16, f16, Device, Tensor, F8E4M3, F8E5M2};
use tessera_kernels::{gemm_fp8, Activation, Bias, Fp8Element, Fp8Gemm, Fp8QuantizedGemm, Fp8Scaling};

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
trait Out: tessera::Element {
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

impl Out for f32 {
    fn decode(self) -> f64 {
        f64::from(self)
    }
    fn encode(x: f32) -> Self {
        x
    }
    const TOL: f64 = 4e-3;
}

#[derive(Clone, Copy, Debug, PartialEq)]
enum Mode {
    Tensor,
    Row,
    Block,
}

/// The operands of one test GEMM (`m×k` A in `P`, `n×k` B in e4m3, scales as `mode` says, a
/// bf16-exact bias per column in [-1, 1)), on `dev`, and C's float64 reference (the bias and
/// tanh-GELU applied where `epilogue`). Values spread over fp8's range (×8 and ×1/4 around 1),
/// each decoded exactly; where `negative`, A's are all below 0 and B's above, so that every
/// dot product is negative (about −1).
struct Case<P: Fp8Element> {
    a: Tensor<P>,
    b: Tensor<F8E4M3>,
    sa: Tensor<f32>,
    sb: Tensor<f32>,
    bias: Vec<f32>,
    want: Vec<f64>,
}

impl<P: Fp8Host> Case<P> {
    fn new(dev: &Device, [m, n, k]: [usize; 3], mode: Mode, epilogue: bool, negative: bool) -> Case<P> {
        let (lo, hi) = if negative { (-8.0, -0.5) } else { (-8.0, 8.0) };
        let ha: Vec<P> = random(m * k, lo, hi).into_iter().map(P::encode).collect();
        let (lo, hi) = if negative { (0.02, 0.25) } else { (-0.25, 0.25) };
        let hb: Vec<F8E4M3> = random(n * k, lo, hi).into_iter().map(F8E4M3::from_f32).collect();
        let kb = k.div_ceil(128);
        let (sa_shape, sb_shape) = match mode {
            Mode::Tensor => (vec![1], vec![1]),
            Mode::Row => (vec![m], vec![n]),
            Mode::Block => (vec![m, kb], vec![n.div_ceil(128), kb]),
        };
        // (Negative dot products of about −1: A's scales shrunk by 2/K.)
        let shrink = if negative { 2.0 / k as f32 } else { 1.0 };
        let hsa: Vec<f32> = random(sa_shape.iter().product(), 0.5, 2.0).into_iter().map(|x| x * shrink).collect();
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
        let bias: Vec<f32> = random(n, -1.0, 1.0).into_iter().map(|x| bf16::from_f32(x).to_f32()).collect();
        // The operands decoded (exactly) and scaled, once.
        let wa: Vec<f64> = (0..m * k).map(|x| ha[x].decode() * scale_a(x / k, x % k)).collect();
        let wb: Vec<f64> = (0..n * k).map(|x| f64::from(hb[x].to_f32()) * scale_b(x / k, x % k)).collect();
        let want: Vec<f64> = (0..m * n)
            .map(|ij| {
                let (i, j) = (ij / n, ij % n);
                let dot: f64 = wa[i * k..(i + 1) * k].iter().zip(&wb[j * k..(j + 1) * k]).map(|(x, y)| x * y).sum();
                if epilogue {
                    gelu_tanh(dot + f64::from(bias[j]))
                } else {
                    dot
                }
            })
            .collect();
        Case {
            a: Tensor::from_host(dev, &ha, &[m, k]).unwrap(),
            b: Tensor::from_host(dev, &hb, &[n, k]).unwrap(),
            sa: Tensor::from_host(dev, &hsa, &sa_shape).unwrap(),
            sb: Tensor::from_host(dev, &hsb, &sb_shape).unwrap(),
            bias,
            want,
        }
    }

    fn scaling(&self, mode: Mode) -> Fp8Scaling<'_> {
        let (a, b) = (&self.sa, &self.sb);
        match mode {
            Mode::Tensor => Fp8Scaling::Tensorwise { a, b },
            Mode::Row => Fp8Scaling::Rowwise { a, b },
            Mode::Block => Fp8Scaling::Blockwise { a, b },
        }
    }
}

/// One GEMM of `m×k` A (`P`) and `n×k` B (e4m3) into `U`, scaled as `mode` says, checked
/// against float64.
fn check<P: Fp8Host + Fp8Gemm<U>, U: Out>(dev: &Device, m: usize, n: usize, k: usize, mode: Mode, promote: bool, epilogue: bool) {
    let case = Case::<P>::new(dev, [m, n, k], mode, epilogue, false);
    let hbias: Vec<U> = case.bias.iter().map(|&x| U::encode(x)).collect();
    let bias = Tensor::from_host(dev, &hbias, &[n]).unwrap();
    let mut c = Tensor::full(dev, &[m, n], U::encode(f32::NAN)).unwrap();
    let mut g = gemm_fp8(&case.a, &case.b, case.scaling(mode)).fast_accumulation(!promote);
    if epilogue {
        g = g.bias(Bias::PerColumn(&bias)).activation(Activation::GeluTanh);
    }
    let what = format!("{m}×{n}×{k} {} → {} {mode:?} promote={promote} epilogue={epilogue}", P::DTYPE, U::DTYPE);
    g.run(dev, &mut c).unwrap_or_else(|e| panic!("{what}: {e}"));
    let got: Vec<f64> = c.to_host().unwrap().into_iter().map(U::decode).collect();
    let err = rel_error(&got, &case.want);
    eprintln!("{what}: relative error {err:.2e}");
    assert!(err < U::TOL, "{what}: relative error {err}");
}

/// One GEMM into fp8 `Q` (bias in bf16): C decoded over the output scale against float64
/// (within fp8's rounding: 3 bits of mantissa for e4m3, 2 for e5m2), and the amax against the
/// reference's largest |value| — the scale chosen from it so that C uses most of `Q`'s range
/// unsaturated. With `negative` inputs and the GELU epilogue every value of C lies in
/// (−0.17, 0], while the rows and columns past C (a tile's padding) hold GELU(bias) up to 0.84:
/// an amax that counted them would be several times too large.
fn check_q<P: Fp8Host + Fp8QuantizedGemm<Q>, Q: Fp8Host>(
    dev: &Device, [m, n, k]: [usize; 3], mode: Mode, promote: bool, epilogue: bool, negative: bool,
) {
    let case = Case::<P>::new(dev, [m, n, k], mode, epilogue, negative);
    let bias: Vec<bf16> = case.bias.iter().map(|&x| bf16::from_f32(x)).collect();
    let bias = Tensor::from_host(dev, &bias, &[n]).unwrap();
    let peak = case.want.iter().fold(0.0f64, |a, v| a.max(v.abs()));
    let top = Q::decode(Q::encode(f32::MAX));
    let s = (0.8 * top / peak) as f32;
    let scale = Tensor::from_host(dev, &[s], &[1]).unwrap();
    let mut amax = Tensor::from_host(dev, &[1e30f32], &[1]).unwrap();
    let mut c = Tensor::full(dev, &[m, n], Q::encode(f32::NAN)).unwrap();
    let mut g = gemm_fp8(&case.a, &case.b, case.scaling(mode)).fast_accumulation(!promote);
    if epilogue {
        g = g.bias(Bias::PerColumn(&bias)).activation(Activation::GeluTanh);
    }
    let what = format!("{m}×{n}×{k} {} → {} {mode:?} promote={promote} epilogue={epilogue} negative={negative}", P::DTYPE, Q::DTYPE);
    g.run_fp8(dev, &mut c, &scale, Some(&mut amax)).unwrap_or_else(|e| panic!("{what}: {e}"));
    let got: Vec<f64> = c.to_host().unwrap().into_iter().map(|q| q.decode() / f64::from(s)).collect();
    let err = rel_error(&got, &case.want);
    let got_amax = f64::from(amax.to_host().unwrap()[0]);
    eprintln!("{what}: relative error {err:.2e}, amax {got_amax:.5e} (float64 {peak:.5e})");
    let tol = if Q::DTYPE == tessera::DType::F8E4M3 { 0.05 } else { 0.1 };
    assert!(err < tol, "{what}: relative error {err}");
    assert!((got_amax - peak).abs() <= 1e-2 * peak, "{what}: amax {got_amax}, float64 {peak}");
}

fn all_modes(dev: &Device, m: usize, n: usize, k: usize) {
    for (mode, promote) in [(Mode::Tensor, false), (Mode::Row, false), (Mode::Tensor, true), (Mode::Row, true), (Mode::Block, true)] {
        check::<F8E4M3, bf16>(dev, m, n, k, mode, promote, false);
    }
    check::<F8E5M2, bf16>(dev, m, n, k, Mode::Row, false, true);
    check::<F8E4M3, f16>(dev, m, n, k, Mode::Block, true, true);
    check::<F8E5M2, f16>(dev, m, n, k, Mode::Tensor, true, false);
    // f32 C: N a multiple of 4.
    if n.is_multiple_of(4) {
        check::<F8E4M3, f32>(dev, m, n, k, Mode::Row, false, true);
        check::<F8E5M2, f32>(dev, m, n, k, Mode::Block, true, false);
    }
}

/// fp8 outputs: both formats, each scaling, fast and promoted, padded tiles (M and N not
/// multiples of the tile).
fn fp8_outputs(dev: &Device, [m, n, k]: [usize; 3]) {
    check_q::<F8E4M3, F8E4M3>(dev, [m, n, k], Mode::Tensor, false, true, false);
    check_q::<F8E4M3, F8E4M3>(dev, [m, n, k], Mode::Row, true, false, false);
    check_q::<F8E4M3, F8E5M2>(dev, [m, n, k], Mode::Block, true, true, false);
    check_q::<F8E5M2, F8E4M3>(dev, [m, n, k], Mode::Row, false, false, false);
    check_q::<F8E5M2, F8E5M2>(dev, [m, n, k], Mode::Tensor, true, true, false);
    // The padding left out of the amax, fast and promoted. (Fast accumulation only at short
    // K: its fp8 sums of products of one sign drift, 4% at K = 4112.)
    if k <= 1024 {
        check_q::<F8E4M3, F8E4M3>(dev, [m, n, k], Mode::Row, false, true, true);
    }
    check_q::<F8E4M3, F8E4M3>(dev, [m, n, k], Mode::Block, true, true, true);
}

#[test]
fn gpu_gemm_fp8_matches_f64_reference() {
    let Some(dev) = gpu_or_skip("gpu_gemm_fp8_matches_f64_reference") else { return };
    // (N 261: rows of C not 16-byte multiples, written padded and copied.)
    for (m, n, k) in [(1, 8, 16), (130, 136, 272), (300, 261, 4112), (64, 136, 16384)] {
        all_modes(&dev, m, n, k);
    }
    for shape in [[1, 16, 16], [130, 144, 272], [300, 528, 4112]] {
        fp8_outputs(&dev, shape);
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
    fp8_outputs(&dev, [70, 144, 272]);
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
    // An f32 C: N a multiple of 4.
    let mut f = Tensor::<f32>::zeros(&dev, &[64, 130]).unwrap();
    let b4 = q(130, 256);
    let e = err(gemm_fp8(&a, &b4, Fp8Scaling::Tensorwise { a: &one, b: &one }).run(&dev, &mut f));
    assert!(e.contains("\"c\"") && e.contains("multiple of 4") && e.contains("[64, 130]"), "{e}");
    // An fp8 C: N a multiple of 16, scale and amax of one element.
    let mut q8 = Tensor::<F8E4M3>::zeros(&dev, &[64, 120]).unwrap();
    let (a3, b3) = (q(64, 256), q(120, 256));
    let e = err(gemm_fp8(&a3, &b3, Fp8Scaling::Tensorwise { a: &one, b: &one }).run_fp8(&dev, &mut q8, &one, None));
    assert!(e.contains("\"c\"") && e.contains("multiple of 16") && e.contains("[64, 120]"), "{e}");
    let mut q = Tensor::<F8E4M3>::zeros(&dev, &[64, 128]).unwrap();
    let e = err(gemm_fp8(&a, &b, Fp8Scaling::Tensorwise { a: &one, b: &one }).run_fp8(&dev, &mut q, &rows_a, None));
    assert!(e.contains("scale") && e.contains("[1]") && e.contains("[64]"), "{e}");
    let mut amax = s(&[2]);
    let e = err(gemm_fp8(&a, &b, Fp8Scaling::Tensorwise { a: &one, b: &one }).run_fp8(&dev, &mut q, &one, Some(&mut amax)));
    assert!(e.contains("amax") && e.contains("[2]"), "{e}");
    // The right shapes run (the interpreter).
    gemm_fp8(&a, &b, Fp8Scaling::Blockwise { a: &ba, b: &bb }).run(&dev, &mut out).expect("block scales of the right shapes");
    let mut amax = s(&[1]);
    gemm_fp8(&a, &b, Fp8Scaling::Blockwise { a: &ba, b: &bb }).run_fp8(&dev, &mut q, &one, Some(&mut amax)).expect("an fp8 C");
}
