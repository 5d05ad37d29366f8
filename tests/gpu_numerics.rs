//! Numerics pinned at the edges: softmax rows of −∞ only (0, not NaN) and of ±1e4, a NaN in
//! an input reaching the outputs that read it and no other (softmax, the norms, GEMM), and
//! GEMM's epilogues past the output type's range (f16 and bf16: ±∞ as an IEEE
//! round-to-nearest cast gives, through every epilogue), `sin`/`cos` with and without range
//! reduction. On the GPU and in the interpreter, which must agree. Attention's edges are in `gpu_attention.rs`.

mod common;

use common::{erf, gelu_tanh, random};
use tessera::testing::{gpu_or_skip, rel_error};
use tessera::{bf16, f16, kernel, Device, Grid, Tensor};
use tessera_kernels::{Activation, Bias};

/// Softmax rows through each of its paths (four rows a block, a row a block, tiled): row 1 is
/// −∞ throughout, row 3 holds one NaN, row 4 logits of ±1e4; the others random.
fn softmax_edge_rows(dev: &Device) {
    for n in [300, 5000, 17000] {
        let m = 6;
        let mut x: Vec<f32> = random(m * n, -3.0, 3.0);
        x[n..2 * n].fill(f32::NEG_INFINITY);
        let nan_at = 3 * n + (random(1, 0.0, n as f32)[0] as usize).min(n - 1);
        x[nan_at] = f32::NAN;
        for (j, v) in x[4 * n..5 * n].iter_mut().enumerate() {
            *v = if j % 3 == 0 { 1e4 - j as f32 * 1e-2 } else { -1e4 };
        }
        let xt = Tensor::from_host(dev, &x, &[m, n]).unwrap();
        let mut y = Tensor::full(dev, &[m, n], -7.0f32).unwrap();
        tessera_kernels::softmax(dev, &xt, &mut y).unwrap();
        let y = y.to_host().unwrap();
        assert!(y[n..2 * n].iter().all(|&v| v == 0.0), "width {n}: a row of −∞ gives 0");
        assert!(y[3 * n..4 * n].iter().all(|v| v.is_nan()), "width {n}: the NaN's row is NaN");
        for r in [0, 2, 4, 5] {
            let row: Vec<f64> = x[r * n..(r + 1) * n].iter().map(|&v| f64::from(v)).collect();
            let mx = row.iter().copied().fold(f64::NEG_INFINITY, f64::max);
            let e: Vec<f64> = row.iter().map(|v| (v - mx).exp()).collect();
            let s: f64 = e.iter().sum();
            let want: Vec<f64> = e.iter().map(|v| v / s).collect();
            let got: Vec<f64> = y[r * n..(r + 1) * n].iter().map(|&v| f64::from(v)).collect();
            let err = rel_error(&got, &want);
            assert!(err < 1e-5, "width {n}, row {r}: relative error {err}");
        }
    }
}

#[test]
fn gpu_numerics_softmax_edge_rows() {
    if let Some(dev) = gpu_or_skip("gpu_numerics_softmax_edge_rows") {
        softmax_edge_rows(&dev);
    }
}

#[test]
fn interp_numerics_softmax_edge_rows() {
    softmax_edge_rows(&Device::cpu());
}

/// `f` on `x`, then on `x` with one element NaN: the NaN's row is NaN throughout, every other
/// row bit for bit as without it.
fn nan_stays_in_its_row(what: &str, m: usize, n: usize, x: &[bf16], nan_at: usize, f: impl Fn(&[bf16]) -> Vec<bf16>) {
    let clean = f(x);
    let mut poisoned = x.to_vec();
    poisoned[nan_at] = bf16::NAN;
    let got = f(&poisoned);
    let row = nan_at / x.len().div_ceil(m).max(1);
    let width = clean.len() / m;
    for r in 0..m {
        let (g, c) = (&got[r * width..(r + 1) * width], &clean[r * width..(r + 1) * width]);
        if r == row {
            assert!(g.iter().all(|v| v.is_nan()), "{what} {m}×{n}: row {r} (the NaN's) not NaN throughout");
        } else {
            assert!(g.iter().zip(c).all(|(a, b)| a.to_bits() == b.to_bits()), "{what} {m}×{n}: row {r} changed");
        }
    }
}

/// The norms and GEMM with a NaN in one row of the input.
fn nan_propagation(dev: &Device) {
    let bf = |v: Vec<f32>| -> Vec<bf16> { v.into_iter().map(bf16::from_f32).collect() };
    for n in [1000, 5000] {
        let m = 5;
        let x = bf(random(m * n, -2.0, 2.0));
        let w = Tensor::from_host(dev, &bf(random(n, 0.5, 1.5)), &[n]).unwrap();
        let b = Tensor::from_host(dev, &bf(random(n, -1.0, 1.0)), &[n]).unwrap();
        let nan_at = 2 * n + n / 3;
        let (w, b) = (&w, &b);
        let run = |layer: bool| {
            move |x: &[bf16]| {
                let xt = Tensor::from_host(dev, x, &[m, n]).unwrap();
                let mut y = Tensor::full(dev, &[m, n], bf16::from_f32(-7.0)).unwrap();
                if layer {
                    tessera_kernels::layer_norm(dev, &xt, Some(w), Some(b), 1e-5, &mut y).unwrap();
                } else {
                    tessera_kernels::rms_norm(dev, &xt, Some(w), 1e-5, &mut y).unwrap();
                }
                y.to_host().unwrap()
            }
        };
        nan_stays_in_its_row("rms_norm", m, n, &x, nan_at, run(false));
        nan_stays_in_its_row("layer_norm", m, n, &x, nan_at, run(true));
    }
    // GEMM: a NaN in A's row i makes C's row i NaN, no other.
    let (m, n, k) = (40, 48, 64);
    let a = bf(random(m * k, -1.0, 1.0));
    let b = Tensor::from_host(dev, &bf(random(n * k, -1.0, 1.0)), &[n, k]).unwrap();
    let gemm = |a: &[bf16]| {
        let at = Tensor::from_host(dev, a, &[m, k]).unwrap();
        let mut c = Tensor::full(dev, &[m, n], bf16::from_f32(-7.0)).unwrap();
        tessera_kernels::gemm(&at, &b).run(dev, &mut c).unwrap();
        c.to_host().unwrap()
    };
    nan_stays_in_its_row("gemm", m, k, &a, 17 * k + 5, gemm);
}

#[test]
fn gpu_numerics_nan_stays_in_its_row() {
    if let Some(dev) = gpu_or_skip("gpu_numerics_nan_stays_in_its_row") {
        nan_propagation(&dev);
    }
}

#[test]
fn interp_numerics_nan_stays_in_its_row() {
    nan_propagation(&Device::cpu());
}

/// The element types the overflow test runs in.
trait Half: tessera_kernels::GemmElement + Copy {
    fn from_f64(v: f64) -> Self;
    fn to_f64(self) -> f64;
}
impl Half for f16 {
    fn from_f64(v: f64) -> f16 {
        f16::from_f64(v)
    }
    fn to_f64(self) -> f64 {
        f16::to_f64(self)
    }
}
impl Half for bf16 {
    fn from_f64(v: f64) -> bf16 {
        bf16::from_f64(v)
    }
    fn to_f64(self) -> f64 {
        bf16::to_f64(self)
    }
}

/// GEMM with every epilogue where half the rows overflow the output type: rows of A are
/// `±big` (alternating sign) or small, B positive, so a row's products are all past the range
/// or all well inside it. Past it the output is ±∞ — or what the activation makes of the
/// f32 value: ≈ x above, −0 below (f16, whose overflow is finite in f32); for bf16 the f32
/// accumulator itself is ±∞, and GELU and SiLU of −∞ are NaN (0·∞ in their formulas).
fn overflow_through_epilogues<T: Half>(dev: &Device, big: f64, small_tol: f64) {
    let (m, n, k) = (32, 40, 64);
    let to = |v: f64| T::from_f64(v);
    let a: Vec<T> = (0..m * k)
        .map(|i| match (i / k) % 4 {
            0 => to(big),
            1 => to(-big),
            _ => to(random(1, -0.5, 0.5)[0] as f64),
        })
        .collect();
    let b: Vec<T> = random(n * k, 1.0, 2.0).into_iter().map(|v| to(f64::from(v))).collect();
    let side: Vec<T> = random(m * n, -100.0, 100.0).into_iter().map(|v| to(f64::from(v))).collect();
    let bias: Vec<T> = random(n, -100.0, 100.0).into_iter().map(|v| to(f64::from(v))).collect();
    let (at, bt) = (Tensor::from_host(dev, &a, &[m, k]).unwrap(), Tensor::from_host(dev, &b, &[n, k]).unwrap());
    let (st, biast) = (Tensor::from_host(dev, &side, &[m, n]).unwrap(), Tensor::from_host(dev, &bias, &[n]).unwrap());
    let gelu_erf = |x: f64| 0.5 * x * (1.0 + erf(x / std::f64::consts::SQRT_2));
    let silu = |x: f64| x / (1.0 + (-x).exp());
    let epilogues: [(&str, Activation, bool, bool, bool); 7] = [
        ("plain", Activation::None, false, false, false),
        ("bias", Activation::None, true, false, false),
        ("gelu tanh", Activation::GeluTanh, true, false, false),
        ("gelu erf", Activation::GeluErf, false, false, false),
        ("silu", Activation::Silu, false, false, false),
        ("residual", Activation::None, false, true, false),
        ("alpha beta", Activation::None, false, false, true),
    ];
    for (name, act, with_bias, with_res, with_beta) in epilogues {
        let mut g = tessera_kernels::gemm(&at, &bt).activation(act);
        if with_bias {
            g = g.bias(Bias::PerColumn(&biast));
        }
        if with_res {
            g = g.residual(&st);
        }
        if with_beta {
            g = g.alpha(0.75).beta(0.5, &st);
        }
        let mut c = Tensor::full(dev, &[m, n], T::from_f64(-7.0)).unwrap();
        g.run(dev, &mut c).unwrap();
        let c = c.to_host().unwrap();
        for i in 0..m {
            for j in 0..n {
                // The f32 accumulator, as the kernel holds it: past f32's range, ±∞.
                let acc: f64 = (0..k).map(|x| a[i * k + x].to_f64() * b[j * k + x].to_f64()).sum();
                let acc = if acc.abs() > f64::from(f32::MAX) { acc.signum() * f64::INFINITY } else { acc };
                let mut v = if with_beta { 0.75 * acc + 0.5 * side[i * n + j].to_f64() } else { acc };
                if with_bias {
                    v += bias[j].to_f64();
                }
                v = match act {
                    Activation::GeluTanh => gelu_tanh(v),
                    Activation::GeluErf => gelu_erf(v),
                    Activation::Silu => silu(v),
                    Activation::None => v,
                };
                if with_res {
                    v += side[i * n + j].to_f64();
                }
                let got = c[i * n + j].to_f64();
                let want = T::from_f64(v).to_f64();
                let what = format!("{} {name}: c[{i}, {j}] = {got}, expected {want} (from {v})", std::any::type_name::<T>());
                if want.is_nan() {
                    assert!(got.is_nan(), "{what}");
                } else if want.is_infinite() || (i % 4 < 2 && want == 0.0) {
                    // Past the range: ±∞ exactly; a large negative through an activation: 0.
                    assert_eq!(got, want, "{what}");
                } else {
                    assert!((got - want).abs() <= small_tol * want.abs().max(1.0), "{what}");
                }
            }
        }
    }
}

fn overflow(dev: &Device) {
    // f16: products of ±2000 by 1..2, 64 deep: ~±192000, past 65504 and finite in f32.
    overflow_through_epilogues::<f16>(dev, 2000.0, 2e-2);
    // bf16: products of ±1e37 by 1..2, 64 deep: past f32's range, the accumulator is ±∞.
    overflow_through_epilogues::<bf16>(dev, 1e37, 3e-2);
}

#[test]
fn gpu_numerics_gemm_epilogues_overflow() {
    if let Some(dev) = gpu_or_skip("gpu_numerics_gemm_epilogues_overflow") {
        overflow(&dev);
    }
}

#[test]
fn interp_numerics_gemm_epilogues_overflow() {
    overflow(&Device::cpu());
}

/// Values where a conversion to fp8 can go wrong: zeros, the ends of both formats' ranges and
/// of their subnormals, ties between codes, beyond the range, infinities and NaNs.
const FP8_EDGES: &[f32] = &[
    0.0,
    -0.0,
    1.0,
    -1.5,
    0.1,
    1.0625,
    1.1875,
    1.125,
    1.375,
    0.015625,
    0.001953125,
    0.0009765625,
    0.0029296875,
    1e-10,
    -1e-10,
    447.0,
    448.0,
    449.0,
    463.9,
    464.0,
    465.0,
    480.0,
    500.0,
    1e6,
    -448.0,
    -449.0,
    -464.0,
    -465.0,
    -500.0,
    -1e6,
    57344.0,
    60000.0,
    61440.0,
    61441.0,
    65536.0,
    -61440.0,
    1.5258789e-5,
    7.6293945e-6,
    2.2888184e-5,
    3e38,
    f32::MAX,
    f32::MIN_POSITIVE,
    f32::INFINITY,
    f32::NEG_INFINITY,
    f32::NAN,
    -f32::NAN,
];

/// The inputs of the fp8 test: [`FP8_EDGES`]; every value of both formats and each midpoint
/// between neighbouring codes (the ties, exact in f32), of both signs; random magnitudes
/// from 2⁻²⁴ to 2²⁰, of both signs. Shuffled into an odd shape.
fn fp8_inputs() -> Vec<f32> {
    use tessera::{F8E4M3, F8E5M2};
    let mut v: Vec<f32> = FP8_EDGES.to_vec();
    for decode in [|c: u8| F8E4M3::from_bits(c).to_f32(), |c: u8| F8E5M2::from_bits(c).to_f32()] {
        let pos: Vec<f32> = (0..0x7Fu8).map(decode).filter(|x| x.is_finite()).collect();
        for w in pos.windows(2) {
            for x in [w[0], (w[0] + w[1]) / 2.0] {
                v.extend([x, -x]);
            }
        }
    }
    let exps = random(4000, -24.0, 20.0);
    let signs = random(4000, -1.0, 1.0);
    v.extend(exps.iter().zip(&signs).map(|(&e, &s)| e.exp2().copysign(s)));
    v
}

/// `quantize_fp8` from f32 (scale 1) and from bf16 (scale 0.37) to both formats, against the
/// host's conversion byte for byte — on the GPU that is the hardware's `cvt.rn.satfinite`
/// (round to nearest even, ±448 / ±57344 for anything beyond, ∞ included; NaN 0x7F);
/// `dequantize_fp8` of every code to f32 (exact) and to bf16 with a scale. Outputs poisoned.
fn fp8_conversions_match_the_hardware(dev: &Device) {
    use tessera::{F8E4M3, F8E5M2};
    let x = fp8_inputs();
    let n = 333;
    let m = x.len().div_ceil(n);
    let mut x = x;
    x.extend(random(m * n - x.len(), -500.0, 500.0));
    let xt = Tensor::from_host(dev, &x, &[m, n]).unwrap();
    let xb: Vec<bf16> = x.iter().map(|&v| bf16::from_f32(v)).collect();
    let xbt = Tensor::from_host(dev, &xb, &[m, n]).unwrap();
    fn check<Q: tessera_kernels::Fp8Element + Copy>(
        dev: &Device, xt: &Tensor<impl tessera_kernels::Fp8Source>, want: &[f32], scale: f32, host: impl Fn(f32) -> Q, poison: Q,
        what: &str,
    ) {
        let bits = |q: Q| -> u8 { bytemuck::cast(q) };
        let mut y = Tensor::full(dev, xt.shape(), poison).unwrap();
        tessera_kernels::quantize_fp8(dev, xt, scale, &mut y).unwrap();
        let got = y.to_host().unwrap();
        let bad: Vec<String> = want
            .iter()
            .zip(&got)
            .filter(|(&x, &g)| bits(g) != bits(host(x * scale)))
            .take(8)
            .map(|(&x, &g)| format!("{x:e}·{scale} → 0x{:02x}, host 0x{:02x}", bits(g), bits(host(x * scale))))
            .collect();
        assert!(bad.is_empty(), "{what}: {} of {} differ, first: {bad:?}", bad.len(), want.len());
    }
    let widened: Vec<f32> = xb.iter().map(|v| v.to_f32()).collect();
    check(dev, &xt, &x, 1.0, F8E4M3::from_f32, F8E4M3::from_bits(0x55), "f32 → e4m3");
    check(dev, &xt, &x, 1.0, F8E5M2::from_f32, F8E5M2::from_bits(0x55), "f32 → e5m2");
    check(dev, &xbt, &widened, 0.37, F8E4M3::from_f32, F8E4M3::from_bits(0x55), "bf16·0.37 → e4m3");
    check(dev, &xbt, &widened, 0.37, F8E5M2::from_f32, F8E5M2::from_bits(0x55), "bf16·0.37 → e5m2");

    // Every code (twice over, in a 4×130 matrix with a ragged last tile) back to f32 and bf16.
    let codes: Vec<u8> = (0..520).map(|i| (i % 256) as u8).collect();
    fn back<Q: tessera_kernels::Fp8Element>(dev: &Device, codes: &[u8]) -> (Vec<f32>, Vec<bf16>) {
        let q: Vec<Q> = codes.iter().map(|&c| bytemuck::cast(c)).collect();
        let q = Tensor::from_host(dev, &q, &[4, 130]).unwrap();
        let mut f = Tensor::full(dev, &[4, 130], -7.0f32).unwrap();
        let mut b = Tensor::full(dev, &[4, 130], bf16::from_f32(-7.0)).unwrap();
        tessera_kernels::dequantize_fp8(dev, &q, 1.0, &mut f).unwrap();
        tessera_kernels::dequantize_fp8(dev, &q, 3.0, &mut b).unwrap();
        (f.to_host().unwrap(), b.to_host().unwrap())
    }
    for (name, decode) in [("e4m3", 0), ("e5m2", 1)] {
        let (f32s, bf16s) = if decode == 0 { back::<F8E4M3>(dev, &codes) } else { back::<F8E5M2>(dev, &codes) };
        for (i, &c) in codes.iter().enumerate() {
            let v = if decode == 0 { F8E4M3::from_bits(c).to_f32() } else { F8E5M2::from_bits(c).to_f32() };
            let same = |a: f32, b: f32| a.to_bits() == b.to_bits() || (a.is_nan() && b.is_nan());
            assert!(same(f32s[i], v), "{name} 0x{c:02x} → f32 {}, want {v}", f32s[i]);
            let w = bf16::from_f32(v * 3.0).to_f32();
            assert!(same(bf16s[i].to_f32(), w), "{name} 0x{c:02x}·3 → bf16 {}, want {w}", bf16s[i]);
        }
    }
}

#[test]
fn gpu_numerics_fp8_conversions_match_the_hardware() {
    if let Some(dev) = gpu_or_skip("gpu_numerics_fp8_conversions_match_the_hardware") {
        fp8_conversions_match_the_hardware(&dev);
    }
}

#[test]
fn interp_numerics_fp8_conversions_match_the_hardware() {
    fp8_conversions_match_the_hardware(&Device::cpu());
}

/// `sin`, `cos`, `sin_reduced` and `cos_reduced` of a tile, side by side in `y` `[4, rows, 64]`.
#[kernel]
fn trig(x: Global<f32, 2>, y: Global<f32, 3>) {
    let r = block::id_x() * 16;
    let t = x.load::<Tile<f32, 16, 64>>([r, 0]);
    y.store([0, r, 0], sin(t));
    y.store([1, r, 0], t.cos());
    y.store([2, r, 0], sin_reduced(t));
    y.store([3, r, 0], t.cos_reduced());
}

/// The four sines against f64 on arguments that `sin_reduced` takes (random in [−π, π], its
/// ends and neighbours of 0 and ±π/2; absolute error under 4·10⁻⁶ on the GPU) and, `sin`/`cos`
/// alone, on arguments to ±1000 (under 10⁻⁴ there: the reduction's f32 rounding of k·2π).
fn reduced_trig(dev: &Device) {
    let pi = std::f32::consts::PI;
    let rows = 37;
    let mut x = random(rows * 64, -pi, pi);
    x[..8].copy_from_slice(&[pi, -pi, 0.0, -0.0, 1e-30, std::f32::consts::FRAC_PI_2, -std::f32::consts::FRAC_PI_2, 3.1415925]);
    let xt = Tensor::from_host(dev, &x, &[rows, 64]).unwrap();
    let mut y = Tensor::full(dev, &[4, rows, 64], f32::NAN).unwrap();
    trig::launch(dev, Grid::tiles(rows, 16), &xt, &mut y).unwrap();
    let y = y.to_host().unwrap();
    let n = rows * 64;
    for (k, name) in ["sin", "cos", "sin_reduced", "cos_reduced"].into_iter().enumerate() {
        let worst = x
            .iter()
            .zip(&y[k * n..(k + 1) * n])
            .map(|(&a, &g)| {
                let want = if k % 2 == 0 { f64::from(a).sin() } else { f64::from(a).cos() };
                ((f64::from(g) - want).abs(), a)
            })
            .fold((0.0, 0.0), |w, e| if e.0 > w.0 || e.0.is_nan() { e } else { w });
        assert!(worst.0 < 4e-6, "{name}: error {:e} at {}", worst.0, worst.1);
    }
    // The range-reduced pair far from 0; the reduced pair is refused there (the interpreter
    // checks its arguments; the GPU computes garbage).
    let far = random(rows * 64, -1000.0, 1000.0);
    let ft = Tensor::from_host(dev, &far, &[rows, 64]).unwrap();
    let mut y = Tensor::full(dev, &[4, rows, 64], f32::NAN).unwrap();
    let done = trig::launch(dev, Grid::tiles(rows, 16), &ft, &mut y);
    if dev.is_cpu() {
        let e = done.unwrap_err().to_string();
        assert!(e.contains("`sin_reduced` takes arguments in [−π, π]") && e.contains("sin_reduced(t)"), "{e}");
        return;
    }
    done.unwrap();
    let y = y.to_host().unwrap();
    for k in 0..2 {
        for (&a, &g) in far.iter().zip(&y[k * n..(k + 1) * n]) {
            let want = if k == 0 { f64::from(a).sin() } else { f64::from(a).cos() };
            assert!((f64::from(g) - want).abs() < 1e-4, "{}({a}) = {g}, want {want}", ["sin", "cos"][k]);
        }
    }
}

#[test]
fn gpu_numerics_reduced_trig() {
    if let Some(dev) = gpu_or_skip("gpu_numerics_reduced_trig") {
        reduced_trig(&dev);
    }
}

#[test]
fn interp_numerics_reduced_trig() {
    reduced_trig(&Device::cpu());
}
