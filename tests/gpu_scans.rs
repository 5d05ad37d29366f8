//! Prefix scans along the last axis (`cumsum`, `cumprod`, `logcumsumexp` and their backwards)
//! against float64 sequential recurrences (the backwards: their definitions) on the host: fresh random inputs, odd lengths
//! (1, 7, 1000, 4099), one row and many, bf16/f16/f32, outputs poisoned before each launch. On
//! the GPU and, at small sizes, in the interpreter.

mod common;

use common::random;
use tessera::testing::{gpu_or_skip, rel_error};
use tessera::{bf16, f16, Device, Tensor};
use tessera_kernels::ScanElement;

#[derive(Clone, Copy, Debug)]
enum Op {
    Sum,
    SumBackward,
    Prod,
    LogSumExp,
}

/// The float64 sequential scan of one row.
fn reference(op: Op, row: &[f64]) -> Vec<f64> {
    let mut acc = match op {
        Op::Sum | Op::SumBackward => 0.0,
        Op::Prod => 1.0,
        Op::LogSumExp => f64::NEG_INFINITY,
    };
    let step = |acc: f64, x: f64| match op {
        Op::Sum | Op::SumBackward => acc + x,
        Op::Prod => acc * x,
        Op::LogSumExp => {
            let m = acc.max(x);
            if m == f64::NEG_INFINITY {
                m
            } else {
                m + ((acc - m).exp() + (x - m).exp()).ln()
            }
        }
    };
    if let Op::SumBackward = op {
        let mut out: Vec<f64> = row
            .iter()
            .rev()
            .map(|&x| {
                acc = step(acc, x);
                acc
            })
            .collect();
        out.reverse();
        out
    } else {
        row.iter()
            .map(|&x| {
                acc = step(acc, x);
                acc
            })
            .collect()
    }
}

/// Inputs where each scan stays finite and well-scaled: products of factors near 1.
fn inputs(op: Op, n: usize) -> Vec<f32> {
    match op {
        Op::Prod => random(n, 0.99, 1.01),
        Op::LogSumExp => random(n, -6.0, 6.0),
        Op::Sum | Op::SumBackward => random(n, -1.0, 1.0),
    }
}

fn run<T: ScanElement>(op: Op, dev: &Device, x: &Tensor<T>, y: &mut Tensor<T>) {
    let r = match op {
        Op::Sum => tessera_kernels::cumsum(dev, x, y),
        Op::SumBackward => tessera_kernels::cumsum_backward(dev, x, y),
        Op::Prod => tessera_kernels::cumprod(dev, x, y),
        Op::LogSumExp => tessera_kernels::logcumsumexp(dev, x, y),
    };
    r.unwrap_or_else(|e| panic!("{op:?}: {e}"));
}

fn check<T: ScanElement>(dev: &Device, op: Op, shape: &[usize], to: fn(f32) -> T, from: fn(T) -> f64, tol: f64) {
    let n = *shape.last().expect("rank ≥ 1");
    let len: usize = shape.iter().product();
    let host: Vec<T> = inputs(op, len).into_iter().map(to).collect();
    let x = Tensor::from_host(dev, &host, shape).unwrap();
    let mut y = Tensor::full(dev, shape, to(f32::NAN)).unwrap();
    run(op, dev, &x, &mut y);
    let wide: Vec<f64> = host.iter().map(|&v| from(v)).collect();
    let want: Vec<f64> = wide.chunks(n).flat_map(|row| reference(op, row)).collect();
    let got: Vec<f64> = y.to_host().unwrap().into_iter().map(from).collect();
    // f32 rounding in a running sum or product grows as √n: rows past 64K get that much room.
    let tol = tol * (n as f64 / 65536.0).sqrt().max(1.0);
    let err = rel_error(&got, &want);
    assert!(err < tol, "{op:?} {shape:?} {}: relative error {err}", std::any::type_name::<T>());
}

fn scans_match_f64(dev: &Device, shapes: &[&[usize]]) {
    for &op in &[Op::Sum, Op::SumBackward, Op::Prod, Op::LogSumExp] {
        for shape in shapes {
            check::<f32>(dev, op, shape, |v| v, f64::from, 1e-5);
            check::<bf16>(dev, op, shape, bf16::from_f32, |v| v.to_f64(), 1e-2);
            check::<f16>(dev, op, shape, f16::from_f32, |v| v.to_f64(), 2e-3);
        }
    }
}

#[test]
fn gpu_scans_match_f64_reference() {
    if let Some(dev) = gpu_or_skip("gpu_scans_match_f64_reference") {
        // The last four split rows into segments (few rows, long): L up to 8M.
        scans_match_f64(
            &dev,
            &[&[1], &[7], &[1000], &[4099], &[33, 4099], &[3, 5, 1000], &[100, 7], &[2, 65537], &[5, 300001], &[1_000_003], &[3, 1 << 23]],
        );
    }
}

#[test]
fn interp_scans_match_f64_reference() {
    // [1, 9000] and [3, 17000]: rows split into segments (the interpreter has few "SMs"); on
    // 8 threads too.
    scans_match_f64(&Device::cpu(), &[&[1], &[7], &[300], &[17, 7], &[2, 3, 513], &[1, 9000], &[3, 17000]]);
    scans_match_f64(&Device::cpu_with_threads(8), &[&[2, 20000]]);
}

/// Rows longer than this take the backwards' references in O(n) rather than from their
/// definitions (O(n²)).
const DEFINITION_UP_TO: usize = 5000;

/// `cumprod`'s backward, `dx[j] = Σ_{k ≥ j} dy[k]·Π_{i ≤ k, i ≠ j} x[i]`, in f64: from the
/// definition (O(n²) a row), or for long rows as `dx[j] = P[j−1]·T[j]` with `P` the running
/// product and `T[j] = Σ_{k ≥ j} dy[k]·Π_{j < i ≤ k} x[i]` summed from the row's end.
fn cumprod_backward_reference(x: &[f64], dy: &[f64]) -> Vec<f64> {
    if x.len() > DEFINITION_UP_TO {
        let mut t = vec![0.0; x.len()];
        for j in (0..x.len()).rev() {
            t[j] = dy[j] + if j + 1 < x.len() { x[j + 1] * t[j + 1] } else { 0.0 };
        }
        let mut p = 1.0;
        return t
            .iter()
            .zip(x)
            .map(|(&t, &x)| {
                let d = p * t;
                p *= x;
                d
            })
            .collect();
    }
    (0..x.len())
        .map(|j| {
            let mut p: f64 = x[..j].iter().product();
            let mut sum = dy[j] * p;
            for k in j + 1..x.len() {
                p *= x[k];
                sum += dy[k] * p;
            }
            sum
        })
        .collect()
}

/// `logcumsumexp`'s backward, `dx[j] = Σ_{k ≥ j} dy[k]·exp(x[j] − y[k])` with `y` the f64
/// log-sum-exps: from the definition (O(n²) a row), or for long rows as `exp(x[j])` times the
/// sum of `dy[k]·exp(−y[k])` from the row's end (in range for these inputs).
fn logcumsumexp_backward_reference(x: &[f64], y: &[f64], dy: &[f64]) -> Vec<f64> {
    if x.len() > DEFINITION_UP_TO {
        let mut sum = 0.0;
        let mut dx: Vec<f64> = (0..x.len())
            .rev()
            .map(|j| {
                sum += dy[j] * (-y[j]).exp();
                x[j].exp() * sum
            })
            .collect();
        dx.reverse();
        return dx;
    }
    (0..x.len()).map(|j| (j..x.len()).map(|k| dy[k] * (x[j] - y[k]).exp()).sum()).collect()
}

/// The backwards of `cumprod` (with exact zeros among the factors: every 37th, or in long rows,
/// where that would leave nothing but zeros, one at three quarters of each row) and
/// `logcumsumexp` against their f64 references; each is given its f64 forward rounded to `T`. Tolerances grow as √n past 16K columns: a chain of n f32 products
/// or sums drifts by about √n·ε/√3 (9e-6 at 64K, where an f32 run of 4×1024 chunks measured
/// 1.09e-5 against the 1e-5 the knee at 64K allowed).
fn check_backward<T: ScanElement>(dev: &Device, shape: &[usize], to: fn(f32) -> T, from: fn(T) -> f64, tol: f64) {
    let n = *shape.last().expect("rank ≥ 1");
    let len: usize = shape.iter().product();
    let name = std::any::type_name::<T>();
    let quantize = |v: Vec<f32>| -> (Vec<T>, Vec<f64>) {
        let t: Vec<T> = v.into_iter().map(to).collect();
        let w = t.iter().map(|&x| from(x)).collect();
        (t, w)
    };
    let (dy, dyw) = quantize(random(len, -1.0, 1.0));
    let dyt = Tensor::from_host(dev, &dy, shape).unwrap();
    // cumprod: factors near 1, every 37th one exactly 0.
    let zero = |i: usize| if n > DEFINITION_UP_TO { i % n == 3 * n / 4 } else { i % 37 == 5 };
    let (x, xw) = quantize(random(len, 0.99, 1.01).into_iter().enumerate().map(|(i, v)| if zero(i) { 0.0 } else { v }).collect());
    let tol = tol * (n as f64 / 16384.0).sqrt().max(1.0);
    let xt = Tensor::from_host(dev, &x, shape).unwrap();
    let yw: Vec<f64> = xw.chunks(n).flat_map(|row| reference(Op::Prod, row)).collect();
    let (y, _) = quantize(yw.iter().map(|&v| v as f32).collect());
    let yt = Tensor::from_host(dev, &y, shape).unwrap();
    let mut dx = Tensor::full(dev, shape, to(f32::NAN)).unwrap();
    tessera_kernels::cumprod_backward(dev, &xt, &yt, &dyt, &mut dx).unwrap_or_else(|e| panic!("cumprod_backward {shape:?}: {e}"));
    let want: Vec<f64> = xw.chunks(n).zip(dyw.chunks(n)).flat_map(|(x, g)| cumprod_backward_reference(x, g)).collect();
    let got: Vec<f64> = dx.to_host().unwrap().into_iter().map(from).collect();
    let err = rel_error(&got, &want);
    assert!(err < tol, "cumprod_backward {shape:?} {name}: relative error {err}");
    // logcumsumexp.
    let (x, xw) = quantize(random(len, -6.0, 6.0));
    let yw: Vec<f64> = xw.chunks(n).flat_map(|row| reference(Op::LogSumExp, row)).collect();
    let (y, yw) = quantize(yw.iter().map(|&v| v as f32).collect());
    let (xt, yt) = (Tensor::from_host(dev, &x, shape).unwrap(), Tensor::from_host(dev, &y, shape).unwrap());
    let mut dx = Tensor::full(dev, shape, to(f32::NAN)).unwrap();
    tessera_kernels::logcumsumexp_backward(dev, &xt, &yt, &dyt, &mut dx).unwrap_or_else(|e| panic!("logcumsumexp_backward {shape:?}: {e}"));
    let want: Vec<f64> =
        (0..len / n).flat_map(|r| logcumsumexp_backward_reference(&xw[r * n..][..n], &yw[r * n..][..n], &dyw[r * n..][..n])).collect();
    let got: Vec<f64> = dx.to_host().unwrap().into_iter().map(from).collect();
    let err = rel_error(&got, &want);
    assert!(err < tol, "logcumsumexp_backward {shape:?} {name}: relative error {err}");
}

fn backwards_match_f64(dev: &Device, shapes: &[&[usize]]) {
    for shape in shapes {
        check_backward::<f32>(dev, shape, |v| v, f64::from, 1e-5);
        check_backward::<bf16>(dev, shape, bf16::from_f32, |v| v.to_f64(), 2e-2);
        check_backward::<f16>(dev, shape, f16::from_f32, |v| v.to_f64(), 4e-3);
    }
}

#[test]
fn gpu_scan_backwards_match_f64_reference() {
    if let Some(dev) = gpu_or_skip("gpu_scan_backwards_match_f64_reference") {
        // The last four split rows into segments (few rows, long; the last into more than 256).
        backwards_match_f64(
            &dev,
            &[&[1], &[7], &[1000], &[4099], &[3, 5, 300], &[17, 1000], &[2, 65537], &[5, 300001], &[1_000_003], &[1, 1_200_000]],
        );
    }
}

#[test]
fn interp_scan_backwards_match_f64_reference() {
    // [1, 9000] and [3, 17000]: rows split into segments.
    backwards_match_f64(&Device::cpu(), &[&[1], &[7], &[300], &[3, 2, 513], &[1, 9000], &[3, 17000]]);
}

/// More than 256 segments a row (their totals read 256 at a time): an interpreter of 40 "SMs"
/// splits a row of 1.1M into 320 (70 s on two cores: `cargo test -- --ignored`; the GPU test's
/// row of 1.2M has 292 on an H200).
#[test]
#[ignore = "70 s in the interpreter; the GPU test covers it"]
fn interp_scan_backwards_many_segments() {
    check_backward::<f32>(&Device::cpu_with_threads(40), &[1, 1_100_000], |v| v, f64::from, 1e-5);
}

/// −∞ contributes nothing to a log-sum-exp: a row of −∞ stays −∞, and −∞ among finite values
/// leaves the finite running value.
fn logcumsumexp_of_minus_infinity(dev: &Device) {
    let inf = f32::NEG_INFINITY;
    let host = [inf, inf, 0.0, inf, 1.0, inf, inf, inf, inf, inf];
    let x = Tensor::from_host(dev, &host, &[2, 5]).unwrap();
    let mut y = Tensor::full(dev, &[2, 5], f32::NAN).unwrap();
    tessera_kernels::logcumsumexp(dev, &x, &mut y).unwrap();
    let got = y.to_host().unwrap();
    let want = [inf, inf, 0.0, 0.0, 1.0f32.exp().ln_1p(), inf, inf, inf, inf, inf];
    for (i, (g, w)) in got.iter().zip(want).enumerate() {
        assert!(if w.is_infinite() { *g == w } else { (g - w).abs() < 1e-6 }, "element {i}: {g}, expected {w}");
    }
}

/// The backward where `x` (and so `y`) has −∞: `dx` is 0 there (no NaN from −∞ − (−∞)), a
/// row of −∞ gives zeros, and the finite elements get the definition's value.
fn logcumsumexp_backward_of_minus_infinity(dev: &Device) {
    let inf = f32::NEG_INFINITY;
    let host = [inf, inf, 0.0, inf, 1.0, inf, inf, inf, inf, inf];
    let y4 = 1.0f32.exp().ln_1p();
    let lse = [inf, inf, 0.0, 0.0, y4, inf, inf, inf, inf, inf];
    let g = random(10, 0.5, 1.5);
    let (x, y, dy) = (
        Tensor::from_host(dev, &host, &[2, 5]).unwrap(),
        Tensor::from_host(dev, &lse, &[2, 5]).unwrap(),
        Tensor::from_host(dev, &g, &[2, 5]).unwrap(),
    );
    let mut dx = Tensor::full(dev, &[2, 5], f32::NAN).unwrap();
    tessera_kernels::logcumsumexp_backward(dev, &x, &y, &dy, &mut dx).unwrap();
    let got = dx.to_host().unwrap();
    let mut want = [0.0f32; 10];
    want[2] = g[2] + g[3] + g[4] * (-y4).exp();
    want[4] = g[4] * (1.0 - y4).exp();
    for (i, (a, w)) in got.iter().zip(want).enumerate() {
        assert!((a - w).abs() < 1e-5, "element {i}: {a}, expected {w}");
    }
}

#[test]
fn gpu_logcumsumexp_backward_of_minus_infinity() {
    if let Some(dev) = gpu_or_skip("gpu_logcumsumexp_backward_of_minus_infinity") {
        logcumsumexp_backward_of_minus_infinity(&dev);
    }
}

#[test]
fn interp_logcumsumexp_backward_of_minus_infinity() {
    logcumsumexp_backward_of_minus_infinity(&Device::cpu());
}

#[test]
fn gpu_logcumsumexp_of_minus_infinity() {
    if let Some(dev) = gpu_or_skip("gpu_logcumsumexp_of_minus_infinity") {
        logcumsumexp_of_minus_infinity(&dev);
    }
}

#[test]
fn interp_logcumsumexp_of_minus_infinity() {
    logcumsumexp_of_minus_infinity(&Device::cpu());
}

/// Inputs whose running log-sum-exp jumps by hundreds (far past f32's 2^±126 within one chunk):
/// a row that climbs in steps of 40–400 with noise, one that falls, one that alternates, −∞ among
/// them. Nothing underflows or overflows: each output within 1e-4 + 1e-6·|y| of the f64 scan
/// (the values reach thousands, where an f32 step is 2.4e-4).
fn logcumsumexp_wide_range(dev: &Device) {
    let n = 1500;
    let noise = random(4 * n, -1.0, 1.0);
    let jumps = random(4 * n, 40.0, 400.0);
    let mut host = vec![0.0f32; 4 * n];
    for (r, mut level) in [-3000.0f32, 3000.0, 0.0, 0.0].into_iter().enumerate() {
        for j in 0..n {
            let i = r * n + j;
            if j % 97 == 0 {
                level += match r {
                    0 => jumps[i],
                    1 => -jumps[i],
                    _ if j % 2 == 0 => jumps[i],
                    _ => -jumps[i],
                };
            }
            host[i] = if r == 3 && j % 5 == 0 { f32::NEG_INFINITY } else { level + noise[i] };
        }
    }
    forward_and_backward(dev, &host, 4, n);
}

/// `logcumsumexp` of `rows` rows of `n` (f32) against the f64 scan, each output within
/// 1e-4 + 1e-6·|y|; then its backward, given the f64 forward rounded to f32, within 1e-3.
fn forward_and_backward(dev: &Device, host: &[f32], rows: usize, n: usize) {
    let x = Tensor::from_host(dev, host, &[rows, n]).unwrap();
    let mut y = Tensor::full(dev, &[rows, n], f32::NAN).unwrap();
    tessera_kernels::logcumsumexp(dev, &x, &mut y).unwrap();
    let got = y.to_host().unwrap();
    let wide: Vec<f64> = host.iter().map(|&v| f64::from(v)).collect();
    let want: Vec<f64> = wide.chunks(n).flat_map(|row| reference(Op::LogSumExp, row)).collect();
    for (i, (g, w)) in got.iter().zip(&want).enumerate() {
        let ok = if w.is_infinite() { f64::from(*g) == *w } else { (f64::from(*g) - w).abs() < 1e-6 * w.abs() + 1e-4 };
        assert!(ok, "row {} element {}: {g}, expected {w}", i / n, i % n);
    }
    // The backward on the same rows, given the f64 forward rounded to f32.
    let lse: Vec<f32> = want.iter().map(|&v| v as f32).collect();
    let g = random(rows * n, -1.0, 1.0);
    let (yt, dyt) = (Tensor::from_host(dev, &lse, &[rows, n]).unwrap(), Tensor::from_host(dev, &g, &[rows, n]).unwrap());
    let mut dx = Tensor::full(dev, &[rows, n], f32::NAN).unwrap();
    tessera_kernels::logcumsumexp_backward(dev, &x, &yt, &dyt, &mut dx).unwrap();
    let (yw, gw): (Vec<f64>, Vec<f64>) = (lse.iter().map(|&v| f64::from(v)).collect(), g.iter().map(|&v| f64::from(v)).collect());
    let want: Vec<f64> = (0..rows)
        .flat_map(|r| logcumsumexp_backward_reference(&wide[r * n..][..n], &yw[r * n..][..n], &gw[r * n..][..n]))
        .map(|v| if v.is_nan() { 0.0 } else { v })
        .collect();
    let got: Vec<f64> = dx.to_host().unwrap().into_iter().map(f64::from).collect();
    let err = rel_error(&got, &want);
    // x·log₂e and y·log₂e round by up to 2.4e-4 at magnitudes in the thousands: exp's
    // relative error is that much.
    assert!(err < 1e-3, "logcumsumexp_backward: relative error {err}");
}

#[test]
fn gpu_logcumsumexp_wide_range() {
    if let Some(dev) = gpu_or_skip("gpu_logcumsumexp_wide_range") {
        logcumsumexp_wide_range(&dev);
    }
}

#[test]
fn interp_logcumsumexp_wide_range() {
    logcumsumexp_wide_range(&Device::cpu());
}

/// Rows that switch between the kernels' two ways from chunk to chunk (one reference a row
/// where every row's chunk stays within 40 of its largest value, the running maximum
/// elsewhere), forward and backward: a step of +100 (a slow chunk, then fast ones far above the
/// start), a step of −100 (the rest flushed against the carry), a run of −∞ and then −∞ every
/// 7th element, ramps of ±0.15 a step (about 38 across a 256-column chunk: the fast way near its
/// limit).
fn logcumsumexp_both_ways(dev: &Device) {
    let (rows, n) = (6, 3001);
    let noise = random(rows * n, -6.0, 6.0);
    let host: Vec<f32> = (0..rows * n)
        .map(|i| {
            let (r, j) = (i / n, (i % n) as f32);
            match r {
                0 if j >= 1000.0 => noise[i] + 100.0,
                1 if j >= 1000.0 => noise[i] - 100.0,
                2 if j < 600.0 || i % 7 == 0 => f32::NEG_INFINITY,
                3 => 0.15 * j + noise[i] * 0.01,
                4 => -0.15 * j + noise[i] * 0.01,
                _ => noise[i],
            }
        })
        .collect();
    forward_and_backward(dev, &host, rows, n);
}

#[test]
fn gpu_logcumsumexp_both_ways() {
    if let Some(dev) = gpu_or_skip("gpu_logcumsumexp_both_ways") {
        logcumsumexp_both_ways(&dev);
    }
}

#[test]
fn interp_logcumsumexp_both_ways() {
    logcumsumexp_both_ways(&Device::cpu());
}

#[test]
fn scans_refuse_bad_input() {
    let dev = Device::cpu();
    let x = Tensor::from_host(&dev, &[1.0f32; 12], &[3, 4]).unwrap();
    let mut y = Tensor::full(&dev, &[4, 3], 0.0f32).unwrap();
    let e = tessera_kernels::cumsum(&dev, &x, &mut y).expect_err("shapes differ").to_string();
    assert!(e.contains("y") && e.contains("[3, 4]") && e.contains("[4, 3]"), "{e}");
    let s = Tensor::from_host(&dev, &[1.0f32], &[]).unwrap();
    let mut t = Tensor::full(&dev, &[], 0.0f32).unwrap();
    let e = tessera_kernels::cumprod(&dev, &s, &mut t).expect_err("a scalar").to_string();
    assert!(e.contains("rank 1 or more"), "{e}");
}
