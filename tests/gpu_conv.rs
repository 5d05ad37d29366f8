//! The depthwise 1-D convolution ([`Conv1d`]) against float64 references of its definition on
//! the host: `full[t] = Σ_j k[j]·x[t − j]` cut by the mode (or PyTorch's cross-correlation for
//! `causal_conv1d`), then `act(· + bias + skip·x)·gate`; the backward's `dx`, `dk`, `dbias`,
//! `dskip` and `dgate` from the chain rule on that definition (not from the kernels'
//! reversed-filter form). Fresh random inputs, odd lengths and channel counts, outputs
//! poisoned, bf16/f16/f32. On the GPU and, at small sizes, in the interpreter.

mod common;

use common::random;
use tessera::testing::{gpu_or_skip, rel_error};
use tessera::{bf16, f16, Device, Element, Tensor};
use tessera_kernels::{Conv1d, ConvElement, ConvMode, ConvPath};

/// One case: sizes, mode (`None`: PyTorch's causal `conv1d` weights), and the epilogue's terms.
#[derive(Clone, Copy, Debug)]
struct Case {
    batch: usize,
    channels: usize,
    len: usize,
    taps: usize,
    mode: Option<ConvMode>,
    bias: bool,
    skip: bool,
    silu: bool,
    gate: bool,
}

/// The host's inputs, in f64, after rounding to the element type.
struct Inputs {
    x: Vec<f64>,
    k: Vec<f64>,
    bias: Vec<f64>,
    skip: Vec<f64>,
    gate: Vec<f64>,
}

impl Case {
    fn out_len(&self) -> usize {
        match self.mode {
            Some(ConvMode::Full) => self.len + self.taps - 1,
            _ => self.len,
        }
    }

    /// `(x index, filter tap)` pairs feeding output step `t`: `full[t + first]` sums
    /// `k[j]·x[t + first − j]`; PyTorch's form `w[j]·x[t − (K − 1) + j]`.
    fn taps_of(&self, t: usize) -> Vec<(usize, usize)> {
        let (len, kk) = (self.len as i64, self.taps as i64);
        (0..kk)
            .filter_map(|j| {
                let i = match self.mode {
                    None => t as i64 - (kk - 1) + j,
                    Some(m) => {
                        let first = if m == ConvMode::Same { (kk - 1) / 2 } else { 0 };
                        t as i64 + first - j
                    }
                };
                (0..len).contains(&i).then_some((i as usize, j as usize))
            })
            .collect()
    }

    /// The pre-activation value, output and activation's derivative at every output step, and
    /// the size of the convolution's own term there (`|Σ k·x|`, times `|gate|`).
    fn forward(&self, v: &Inputs) -> (Vec<f64>, Vec<f64>, Vec<f64>, Vec<f64>) {
        let (lo, n) = (self.out_len(), self.batch * self.channels * self.out_len());
        let (mut pre, mut y, mut dact) = (vec![0.0; n], vec![0.0; n], vec![0.0; n]);
        let mut conv = vec![0.0; n];
        for r in 0..self.batch * self.channels {
            let h = r % self.channels;
            for t in 0..lo {
                let mut p: f64 = self.taps_of(t).iter().map(|&(i, j)| v.k[h * self.taps + j] * v.x[r * self.len + i]).sum();
                let o = r * lo + t;
                conv[o] = if self.gate { (p * v.gate[o]).abs() } else { p.abs() };
                if self.bias {
                    p += v.bias[h];
                }
                if self.skip && t < self.len {
                    p += v.skip[h] * v.x[r * self.len + t];
                }
                let s = 1.0 / (1.0 + (-p).exp());
                let (a, da) = if self.silu { (p * s, s * (1.0 + p * (1.0 - s))) } else { (p, 1.0) };
                pre[o] = p;
                y[o] = if self.gate { a * v.gate[o] } else { a };
                dact[o] = da;
            }
        }
        (pre, y, dact, conv)
    }
}

fn inputs<T: Element>(c: &Case, to: fn(f32) -> T, from: fn(T) -> f64) -> (Vec<T>, Vec<T>, Inputs) {
    let round = |v: &[T]| v.iter().map(|&x| from(x)).collect::<Vec<f64>>();
    let x: Vec<T> = random(c.batch * c.channels * c.len, -1.0, 1.0).into_iter().map(to).collect();
    let gate: Vec<T> = random(c.batch * c.channels * c.out_len(), -1.5, 1.5).into_iter().map(to).collect();
    let scale = 1.0 / (c.taps as f32).sqrt();
    let v = Inputs {
        x: round(&x),
        k: random(c.channels * c.taps, -scale, scale).into_iter().map(f64::from).collect(),
        bias: random(c.channels, -0.5, 0.5).into_iter().map(f64::from).collect(),
        skip: random(c.channels, -1.0, 1.0).into_iter().map(f64::from).collect(),
        gate: round(&gate),
    };
    (x, gate, v)
}

fn narrow(v: &[f64]) -> Vec<f32> {
    v.iter().map(|&x| x as f32).collect()
}

/// Forward and backward of one case against the references; `tol` for the forward, `gtol` for
/// the gradients.
fn check<T: ConvElement>(dev: &Device, c: Case, to: fn(f32) -> T, from: fn(T) -> f64, tol: f64, gtol: f64) {
    check_paths(dev, c, to, from, tol, gtol, None);
}

/// [`check`], or where `only` names a path, that path's forward alone.
fn check_paths<T: ConvElement>(dev: &Device, c: Case, to: fn(f32) -> T, from: fn(T) -> f64, tol: f64, gtol: f64, only: Option<ConvPath>) {
    let (xh, gh, v) = inputs(&c, to, from);
    let x = Tensor::from_host(dev, &xh, &[c.batch, c.channels, c.len]).unwrap();
    let k = Tensor::from_host(dev, &narrow(&v.k), &[c.channels, c.taps]).unwrap();
    let bias = Tensor::from_host(dev, &narrow(&v.bias), &[c.channels]).unwrap();
    let skip = Tensor::from_host(dev, &narrow(&v.skip), &[c.channels]).unwrap();
    let lo = c.out_len();
    let gate = Tensor::from_host(dev, &gh, &[c.batch, c.channels, lo]).unwrap();
    let builder = |path: ConvPath| {
        let mut conv = match c.mode {
            Some(m) => Conv1d::new(dev, &x, &k, m),
            None => Conv1d::causal_conv1d(dev, &x, &k),
        };
        if c.bias {
            conv = conv.bias(&bias);
        }
        if c.skip {
            conv = conv.skip(&skip);
        }
        if c.silu {
            conv = conv.silu();
        }
        if c.gate {
            conv = conv.gate(&gate);
        }
        conv.path(path)
    };
    let conv = builder(ConvPath::Direct);
    assert_eq!(conv.out_shape(), [c.batch, c.channels, lo], "{c:?}");
    let (pre, want, dact, conv_term) = c.forward(&v);
    // The error is measured against the larger of the output and the convolution's own term: an
    // FFT's error is relative to the convolution it computes, and where the skip term cancels
    // that (one step, `k ≈ −skip`) the output alone would magnify it without bound.
    let norm = |v: &[f64]| v.iter().map(|x| x * x).sum::<f64>().sqrt();
    let size = norm(&want).max(norm(&conv_term));
    let name = std::any::type_name::<T>();
    // The FFT path (cuFFT) where there is a GPU: the same forward. The tensor-core FFT for 16-bit
    // types where the padded length fits (in the interpreter for a few rows only: its MMAs are
    // slow there), its transforms in f16 (measured 4·10⁻⁴ in f16, 1.7·10⁻³ in bf16).
    let mut paths = vec![(ConvPath::Direct, tol)];
    if !dev.is_cpu() {
        paths.push((ConvPath::Fft, tol));
    }
    let tc_fits = c.len + c.taps - 1 <= tessera_kernels::CONV_TENSOR_CORE_MAX && (!dev.is_cpu() || c.batch * c.channels <= 6);
    if std::mem::size_of::<T>() == 2 && tc_fits {
        paths.push((ConvPath::TensorCore, tol.max(2e-3)));
    }
    if let Some(p) = only {
        paths = vec![(p, tol.max(2e-3))];
    }
    for (path, tol) in paths {
        let mut y = Tensor::full(dev, &[c.batch, c.channels, lo], to(f32::NAN)).unwrap();
        builder(path).run(&mut y).unwrap_or_else(|e| panic!("{c:?} {path:?}: {e}"));
        let got: Vec<f64> = y.to_host().unwrap().into_iter().map(from).collect();
        let diff: Vec<f64> = got.iter().zip(&want).map(|(g, w)| if g.is_nan() { f64::INFINITY } else { g - w }).collect();
        let err = norm(&diff) / size;
        assert!(err < tol, "{c:?} {name} {path:?}: forward relative error {err}");
        if path != ConvPath::Direct {
            // The filters' spectrum made once and reused: the same output.
            let conv = builder(path);
            let spectrum = conv.spectrum().unwrap_or_else(|e| panic!("{c:?} {path:?} spectrum: {e}"));
            let mut again = Tensor::full(dev, &[c.batch, c.channels, lo], to(f32::NAN)).unwrap();
            conv.with_spectrum(&spectrum).run(&mut again).unwrap_or_else(|e| panic!("{c:?} {path:?} with spectrum: {e}"));
            let again: Vec<f64> = again.to_host().unwrap().into_iter().map(from).collect();
            assert!(again == got, "{c:?} {name} {path:?}: the output with a made spectrum differs");
        }
    }

    if only.is_some() {
        return;
    }
    // The backward from the chain rule on the definition.
    let dyh: Vec<T> = random(c.batch * c.channels * lo, -1.0, 1.0).into_iter().map(to).collect();
    let dy = Tensor::from_host(dev, &dyh, &[c.batch, c.channels, lo]).unwrap();
    let grads = conv.backward(&dy).unwrap_or_else(|e| panic!("{c:?}: {e}"));
    let (n, kk) = (c.batch * c.channels, c.taps);
    let (mut dx, mut dk) = (vec![0.0; n * c.len], vec![0.0; c.channels * kk]);
    let (mut dbias, mut dskip, mut dgate) = (vec![0.0; c.channels], vec![0.0; c.channels], vec![0.0; n * lo]);
    for r in 0..n {
        let h = r % c.channels;
        for t in 0..lo {
            let o = r * lo + t;
            let mut g = from(dyh[o]);
            if c.gate {
                dgate[o] = g * (if c.silu { pre[o] / (1.0 + (-pre[o]).exp()) } else { pre[o] });
                g *= v.gate[o];
            }
            g *= dact[o];
            for (i, j) in c.taps_of(t) {
                dx[r * c.len + i] += g * v.k[h * kk + j];
                dk[h * kk + j] += g * v.x[r * c.len + i];
            }
            dbias[h] += g;
            if t < c.len {
                dskip[h] += g * v.x[r * c.len + t];
                if c.skip {
                    dx[r * c.len + t] += g * v.skip[h];
                }
            }
        }
    }
    let host = |t: &Tensor<f32>| t.to_host().unwrap().into_iter().map(f64::from).collect::<Vec<f64>>();
    let dx_got: Vec<f64> = grads.dx.to_host().unwrap().into_iter().map(from).collect();
    let mut checks = vec![("dx", rel_error(&dx_got, &dx)), ("dk", rel_error(&host(&grads.dk), &dk))];
    assert_eq!(grads.dbias.is_some(), c.bias, "{c:?}");
    assert_eq!(grads.dskip.is_some(), c.skip, "{c:?}");
    assert_eq!(grads.dgate.is_some(), c.gate, "{c:?}");
    if let Some(t) = &grads.dbias {
        checks.push(("dbias", rel_error(&host(t), &dbias)));
    }
    if let Some(t) = &grads.dskip {
        checks.push(("dskip", rel_error(&host(t), &dskip)));
    }
    if let Some(t) = &grads.dgate {
        let got: Vec<f64> = t.to_host().unwrap().into_iter().map(from).collect();
        checks.push(("dgate", rel_error(&got, &dgate)));
    }
    for (what, err) in checks {
        assert!(err < gtol, "{c:?} {name}: {what} relative error {err}");
    }
}

/// Every mode and epilogue over `sizes` `(batch, channels, L, Lk)`, in the three element types.
fn conv_matches_f64(dev: &Device, sizes: &[(usize, usize, usize, usize)]) {
    let terms = [(false, false, false, false), (true, false, true, false), (false, true, false, true), (true, true, true, true)];
    let modes = [Some(ConvMode::Causal), Some(ConvMode::Full), Some(ConvMode::Same), None];
    for (n, &(batch, channels, len, taps)) in sizes.iter().enumerate() {
        for (m, &mode) in modes.iter().enumerate() {
            if mode == Some(ConvMode::Same) && taps > len {
                continue;
            }
            // Each size and mode with one set of terms, turn about (all four over the modes).
            let (bias, skip, silu, gate) = terms[(n + m) % terms.len()];
            let c = Case { batch, channels, len, taps, mode, bias, skip, silu, gate };
            check::<f32>(dev, c, |v| v, f64::from, 1e-5, 1e-4);
            check::<bf16>(dev, c, bf16::from_f32, |v| v.to_f64(), 1e-2, 2e-2);
            check::<f16>(dev, c, f16::from_f32, |v| v.to_f64(), 2e-3, 4e-3);
        }
    }
}

#[test]
fn gpu_conv1d_matches_f64_reference() {
    if let Some(dev) = gpu_or_skip("gpu_conv1d_matches_f64_reference") {
        conv_matches_f64(
            &dev,
            &[
                (1, 1, 1, 1),
                (2, 3, 3, 4),
                (1, 5, 1000, 3),
                (2, 48, 4097, 4),
                (1, 9, 2050, 9),
                (2, 5, 1500, 10),
                (3, 20, 1000, 64),
                (1, 17, 4099, 257),
                (2, 7, 300, 301),
                // The tensor-core path past 8192 steps: N 16384 and 65536.
                (1, 3, 9000, 6000),
                (1, 1, 17000, 16001),
            ],
        );
    }
}

#[test]
fn interp_conv1d_matches_f64_reference() {
    // Lk 7 over 3 steps: a filter longer than the signal (full and causal only). Lk up to 9
    // takes the short path in every mode; Lk 10 in `same` only (its taps at −5..=4); Lk 33 the
    // general one. The tensor-core FFT's three lengths: 2048 (the first five that take it), 4096
    // (L 3001) and 8192 (L 4500, two warpgroups a row).
    conv_matches_f64(
        &Device::cpu(),
        &[
            (1, 1, 1, 1),
            (2, 3, 3, 7),
            (1, 17, 300, 4),
            (2, 5, 1000, 3),
            (1, 3, 1100, 9),
            (2, 2, 333, 10),
            (1, 2, 513, 33),
            (1, 2, 3001, 40),
            (1, 2, 4500, 7),
        ],
    );
}

#[test]
fn interp_conv1d_long_tensor_core_matches_f64_reference() {
    // The tensor-core path past 8192 steps (N 16384: four parts of 4096, residues 0..=2), in the
    // interpreter for a few rows: a convolution with every term, a correlation, `same` mode.
    let dev = Device::cpu();
    let case = |batch, channels, len, taps, mode, terms: bool| Case {
        batch,
        channels,
        len,
        taps,
        mode,
        bias: terms,
        skip: terms,
        silu: terms,
        gate: terms,
    };
    let tc = Some(ConvPath::TensorCore);
    check_paths::<bf16>(&dev, case(1, 2, 6000, 4000, Some(ConvMode::Causal), true), bf16::from_f32, |v| v.to_f64(), 1e-2, 0.0, tc);
    check_paths::<f16>(&dev, case(1, 1, 7001, 2000, None, false), f16::from_f32, |v| v.to_f64(), 2e-3, 0.0, tc);
    check_paths::<f16>(&dev, case(2, 1, 5000, 3999, Some(ConvMode::Same), true), f16::from_f32, |v| v.to_f64(), 2e-3, 0.0, tc);
}

#[test]
fn conv1d_refuses_bad_input() {
    let dev = Device::cpu();
    let z = |s: &[usize]| Tensor::<f32>::zeros(&dev, s).unwrap();
    let (x, k) = (z(&[2, 4, 8]), z(&[4, 3]));
    let msg = |r: tessera::Result<()>| r.expect_err("refused").to_string();
    let mut y = z(&[2, 4, 8]);
    // A filter longer than the signal in `same` mode.
    let long = z(&[4, 9]);
    let e = msg(Conv1d::new(&dev, &x, &long, ConvMode::Same).run(&mut y));
    assert!(e.contains("`k`") && e.contains("same") && e.contains("9 taps"), "{e}");
    // Channels that do not match.
    let k5 = z(&[5, 3]);
    let e = msg(Conv1d::new(&dev, &x, &k5, ConvMode::Causal).run(&mut y));
    assert!(e.contains("`k`") && e.contains("[4, Lk]") && e.contains("[5, 3]"), "{e}");
    let e = msg(Conv1d::causal_conv1d(&dev, &x, &k5).run(&mut y));
    assert!(e.contains("`w`"), "{e}");
    // Not 3-D.
    let x2 = z(&[4, 8]);
    let e = msg(Conv1d::new(&dev, &x2, &k, ConvMode::Causal).run(&mut y));
    assert!(e.contains("`x`") && e.contains("3-D"), "{e}");
    // The output's length in `full` mode, a bias of the wrong length, a gate of the wrong shape.
    let e = msg(Conv1d::new(&dev, &x, &k, ConvMode::Full).run(&mut y));
    assert!(e.contains("`y`") && e.contains("[2, 4, 10]"), "{e}");
    let b3 = z(&[3]);
    let e = msg(Conv1d::new(&dev, &x, &k, ConvMode::Causal).bias(&b3).run(&mut y));
    assert!(e.contains("`bias`") && e.contains("[4]"), "{e}");
    let g = z(&[2, 4, 9]);
    let e = msg(Conv1d::new(&dev, &x, &k, ConvMode::Causal).gate(&g).run(&mut y));
    assert!(e.contains("`gate`") && e.contains("[2, 4, 8]"), "{e}");
    let dy = z(&[2, 4, 7]);
    let e = Conv1d::new(&dev, &x, &k, ConvMode::Causal).backward(&dy).err().expect("dy's shape").to_string();
    assert!(e.contains("`dy`") && e.contains("[2, 4, 8]"), "{e}");
}

#[test]
fn conv1d_spectrum_refuses_a_misfit() {
    // In the interpreter: the tensor-core path's filter kernel runs there (four filters).
    let dev = Device::cpu();
    let (b, h, l, lk) = (2, 4, 40, 3);
    let x = Tensor::from_host(&dev, &random(b * h * l, -1.0, 1.0).into_iter().map(bf16::from_f32).collect::<Vec<_>>(), &[b, h, l]).unwrap();
    let xf = Tensor::from_host(&dev, &random(b * h * l, -1.0, 1.0), &[b, h, l]).unwrap();
    let k = Tensor::from_host(&dev, &random(h * lk, -1.0, 1.0), &[h, lk]).unwrap();
    let mut y = Tensor::<bf16>::zeros(&dev, &[b, h, l]).unwrap();
    let msg = |r: tessera::Result<()>| r.expect_err("refused").to_string();
    let causal = Conv1d::new(&dev, &x, &k, ConvMode::Causal).path(ConvPath::TensorCore);
    let spectrum = causal.spectrum().unwrap();
    // The direct path makes none and takes none; `Auto` (the default) takes the direct one in
    // the interpreter, and a kept spectrum's path where it is given one.
    let direct = || Conv1d::new(&dev, &x, &k, ConvMode::Causal).path(ConvPath::Direct);
    let e = direct().spectrum().map(drop).expect_err("direct").to_string();
    assert!(e.contains("`path`") && e.contains("ConvPath::Direct"), "{e}");
    let e = Conv1d::new(&dev, &x, &k, ConvMode::Causal).spectrum().map(drop).expect_err("auto").to_string();
    assert!(e.contains("`path`") && e.contains("ConvPath::Auto, which takes the direct path"), "{e}");
    let e = msg(direct().with_spectrum(&spectrum).run(&mut y));
    assert!(e.contains("`spectrum`") && e.contains("direct path"), "{e}");
    assert_eq!(Conv1d::new(&dev, &x, &k, ConvMode::Causal).chosen_path().unwrap(), ConvPath::Direct);
    assert_eq!(Conv1d::new(&dev, &x, &k, ConvMode::Causal).with_spectrum(&spectrum).chosen_path().unwrap(), ConvPath::TensorCore);
    // f32 has no tensor-core path.
    let e = Conv1d::new(&dev, &xf, &k, ConvMode::Causal).path(ConvPath::TensorCore).spectrum().map(drop).expect_err("f32").to_string();
    assert!(e.contains("bf16 or f16"), "{e}");
    // Another mode places another tap first; a correlation conjugates; another path.
    let e = msg(Conv1d::new(&dev, &x, &k, ConvMode::Same).path(ConvPath::TensorCore).with_spectrum(&spectrum).run(&mut y));
    assert!(e.contains("`spectrum`") && e.contains("tap 1 first") && e.contains("tap 0 first"), "{e}");
    let e = msg(Conv1d::causal_conv1d(&dev, &x, &k).path(ConvPath::TensorCore).with_spectrum(&spectrum).run(&mut y));
    assert!(e.contains("a correlation") && e.contains("a convolution"), "{e}");
    let e = msg(Conv1d::new(&dev, &x, &k, ConvMode::Causal).path(ConvPath::Fft).with_spectrum(&spectrum).run(&mut y));
    assert!(e.contains("`spectrum`") && e.contains("on Fft") && e.contains("on TensorCore"), "{e}");
    // Filters of another length.
    let k5 = Tensor::from_host(&dev, &random(h * 5, -1.0, 1.0), &[h, 5]).unwrap();
    let e = msg(Conv1d::new(&dev, &x, &k5, ConvMode::Causal).path(ConvPath::TensorCore).with_spectrum(&spectrum).run(&mut y));
    assert!(e.contains("of 5 taps") && e.contains("of 3 taps"), "{e}");
    // The one it fits runs.
    causal.with_spectrum(&spectrum).run(&mut y).unwrap();
}

/// `ConvPath::Auto` on the GPU: short filters direct, long ones on the tensor cores (bf16 on
/// Hopper) or through cuFFT (f32); its output is the chosen path's, bit for bit.
#[test]
fn gpu_conv1d_auto_path_follows_the_cost_model() {
    let Some(dev) = gpu_or_skip("gpu_conv1d_auto_path_follows_the_cost_model") else { return };
    let (b, h) = (2, 64);
    for (l, lk, bf16_path, f32_path) in [
        (2048, 4, ConvPath::Direct, ConvPath::Direct),
        (2048, 16, ConvPath::Direct, ConvPath::Direct),
        (2048, 512, ConvPath::TensorCore, ConvPath::Fft),
        (8192, 16, ConvPath::Direct, ConvPath::Direct),
        (8192, 300, ConvPath::TensorCore, ConvPath::Fft),
    ] {
        let xh = random(b * h * l, -1.0, 1.0);
        let x = Tensor::from_host(&dev, &xh.iter().copied().map(bf16::from_f32).collect::<Vec<_>>(), &[b, h, l]).unwrap();
        let xf = Tensor::from_host(&dev, &xh, &[b, h, l]).unwrap();
        let k = Tensor::from_host(&dev, &random(h * lk, -1.0, 1.0), &[h, lk]).unwrap();
        let bias = Tensor::from_host(&dev, &random(h, -1.0, 1.0), &[h]).unwrap();
        let tc = dev.compute_capability().0 == 9;
        let want = if tc || bf16_path == ConvPath::Direct { bf16_path } else { ConvPath::Direct };
        assert_eq!(Conv1d::new(&dev, &x, &k, ConvMode::Causal).chosen_path().unwrap(), want, "bf16 L {l} Lk {lk}");
        assert_eq!(Conv1d::new(&dev, &xf, &k, ConvMode::Causal).chosen_path().unwrap(), f32_path, "f32 L {l} Lk {lk}");
        let run = |path: ConvPath| {
            let mut y = Tensor::full(&dev, &[b, h, l], bf16::NAN).unwrap();
            Conv1d::new(&dev, &x, &k, ConvMode::Causal).path(path).bias(&bias).run(&mut y).unwrap();
            y.to_host().unwrap()
        };
        let (auto, chosen) = (run(ConvPath::Auto), run(want));
        assert!(auto.iter().zip(&chosen).all(|(a, c)| a.to_bits() == c.to_bits()), "L {l} Lk {lk}: Auto differs from {want:?}");
    }
}

#[path = "../examples/hyena_block.rs"]
#[allow(dead_code)]
mod hyena_block;

/// The Hyena operator of `examples/hyena_block.rs` (projections → short convolutions → two long
/// convolutions with their skip and gate fused → output projection) against its float64
/// reference: bf16 activations between the kernels keep the error near 4e-3, so 2e-2 fails
/// on a wrong tap, a lost skip or gate.
fn hyena_block_matches_f64(dev: &Device, sizes: &[hyena_block::Sizes]) {
    for &s in sizes {
        let err = hyena_block::check(dev, s).unwrap_or_else(|e| panic!("{s:?}: {e}"));
        assert!(err < 2e-2, "{s:?}: relative error {err:.3e}");
    }
}

#[test]
fn gpu_hyena_block_matches_f64_reference() {
    if let Some(dev) = gpu_or_skip("gpu_hyena_block_matches_f64_reference") {
        let s = |batch, len, model, inner| hyena_block::Sizes { batch, len, model, inner, taps: 3 };
        hyena_block_matches_f64(&dev, &[s(2, 1000, 128, 256), s(1, 4099, 64, 48), s(3, 1, 64, 64)]);
    }
}

#[test]
fn interp_hyena_block_matches_f64_reference() {
    let s = |batch, len, model, inner| hyena_block::Sizes { batch, len, model, inner, taps: 3 };
    hyena_block_matches_f64(&Device::cpu(), &[s(2, 45, 32, 48), s(1, 7, 16, 20)]);
}

/// The FFT path's own kernels against host math, in the interpreter (cuFFT, between them,
/// runs on a GPU only): the padded input, the filter's two factors, the spectra's product
/// (a complex product, conjugated for a correlation) and the epilogue read at an offset.
#[test]
fn interp_fft_path_kernels_match_host_math() {
    use tessera::Grid;
    use tessera_kernels::kernels::{conv_fft_filter, conv_fft_finish_bf16, conv_fft_pad_bf16, conv_fft_product};
    let dev = Device::cpu();
    let (b, h, l, n) = (2, 3, 300, 512);
    let m2 = 2 * (n / 2 + 1);
    let grid = |cols: usize, rows: usize, z: usize| Grid::from((cols.div_ceil(256) as u32, rows.div_ceil(16) as u32, z as u32));
    // The padded input: x[r, j − lead], zeros elsewhere.
    let xh: Vec<bf16> = random(b * h * l, -1.0, 1.0).into_iter().map(bf16::from_f32).collect();
    let x2 = Tensor::from_host(&dev, &xh, &[b * h, l]).unwrap();
    let mut xp = Tensor::full(&dev, &[b * h, n], f32::NAN).unwrap();
    conv_fft_pad_bf16::launch(&dev, grid(n, b * h, 1), &x2, &mut xp, 3).unwrap();
    let want: Vec<f64> = (0..b * h * n)
        .map(|i| (i / n, (i % n) as i64 - 3))
        .map(|(r, j)| if (0..l as i64).contains(&j) { xh[r * l + j as usize].to_f64() } else { 0.0 })
        .collect();
    let got: Vec<f64> = xp.to_host().unwrap().into_iter().map(f64::from).collect();
    assert_eq!(rel_error(&got, &want), 0.0, "the padded input");
    // The filter's factors and the product, against a complex product on the host.
    let ks = random(h * m2, -1.0, 1.0);
    let xs = random(b * h * m2, -1.0, 1.0);
    for conj in [1.0f32, -1.0] {
        let kt = Tensor::from_host(&dev, &ks, &[h, m2]).unwrap();
        let (mut kc, mut kd) = (Tensor::full(&dev, &[h, m2], f32::NAN).unwrap(), Tensor::full(&dev, &[h, m2], f32::NAN).unwrap());
        conv_fft_filter::launch(&dev, grid(m2, h, 1), &kt, &mut kc, &mut kd, 0.25, conj).unwrap();
        let xt = Tensor::from_host(&dev, &xs, &[b, h, m2]).unwrap();
        let mut out = Tensor::full(&dev, &[b, h, m2], f32::NAN).unwrap();
        conv_fft_product::launch(&dev, grid(m2, h, b), &xt, &kc, &kd, &mut out).unwrap();
        let mut want = vec![0.0f64; b * h * m2];
        for r in 0..b * h {
            for f in 0..m2 / 2 {
                let (xr, xi) = (f64::from(xs[r * m2 + 2 * f]), f64::from(xs[r * m2 + 2 * f + 1]));
                let c = (r % h) * m2 + 2 * f;
                let (kr, ki) = (f64::from(ks[c]) * 0.25, f64::from(ks[c + 1]) * 0.25 * f64::from(conj));
                want[r * m2 + 2 * f] = xr * kr - xi * ki;
                want[r * m2 + 2 * f + 1] = xr * ki + xi * kr;
            }
        }
        let got: Vec<f64> = out.to_host().unwrap().into_iter().map(f64::from).collect();
        let err = rel_error(&got, &want);
        assert!(err < 1e-6, "the spectra's product (conj {conj}): relative error {err}");
    }
    // The epilogue on the inverse transform's steps from `first` on: silu(full + bias + skip·x)·gate.
    let full = random(b * h * n, -2.0, 2.0);
    let (bias, skip) = (random(h, -0.5, 0.5), random(h, -1.0, 1.0));
    let gate: Vec<bf16> = random(b * h * l, -1.0, 1.0).into_iter().map(bf16::from_f32).collect();
    let ft = Tensor::from_host(&dev, &full, &[b, h, n]).unwrap();
    let x3 = Tensor::from_host(&dev, &xh, &[b, h, l]).unwrap();
    let (bt, st) = (Tensor::from_host(&dev, &bias, &[h, 1]).unwrap(), Tensor::from_host(&dev, &skip, &[h, 1]).unwrap());
    let gt = Tensor::from_host(&dev, &gate, &[b, h, l]).unwrap();
    let mut y = Tensor::full(&dev, &[b, h, l], bf16::NAN).unwrap();
    conv_fft_finish_bf16::launch(&dev, grid(l, h, b), &ft, &x3, &bt, &st, &gt, &mut y, 5, 1, 1, 1, 1).unwrap();
    let want: Vec<f64> = (0..b * h * l)
        .map(|i| {
            let (r, t) = (i / l, i % l);
            let p = f64::from(full[r * n + t + 5]) + f64::from(bias[r % h]) + f64::from(skip[r % h]) * xh[i].to_f64();
            p / (1.0 + (-p).exp()) * gate[i].to_f64()
        })
        .collect();
    let got: Vec<f64> = y.to_host().unwrap().into_iter().map(|v| v.to_f64()).collect();
    let err = rel_error(&got, &want);
    assert!(err < 1e-2, "the FFT path's epilogue: relative error {err}");
    // The whole path needs cuFFT: the interpreter says so.
    let k = Tensor::from_host(&dev, &random(h * 4, -1.0, 1.0), &[h, 4]).unwrap();
    let mut y = Tensor::<bf16>::zeros(&dev, &[b, h, l]).unwrap();
    let e = Conv1d::new(&dev, &x3, &k, ConvMode::Causal).path(ConvPath::Fft).run(&mut y).expect_err("no cuFFT").to_string();
    assert!(e.contains("FFT path") && e.contains("CUDA"), "{e}");
}
