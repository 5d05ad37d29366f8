//! Shared helpers of the cross-crate tests.
#![allow(dead_code)]

use rand::Rng;

/// Fresh uniform random values in `[lo, hi)`.
pub fn random(n: usize, lo: f32, hi: f32) -> Vec<f32> {
    let mut rng = rand::rng();
    (0..n).map(|_| rng.random_range(lo..hi)).collect()
}

/// Widens to f64 for references.
pub fn wide(v: &[f32]) -> Vec<f64> {
    v.iter().map(|&x| f64::from(x)).collect()
}

/// The odd shapes every kernel is tested on.
pub const SHAPES: &[(usize, usize)] = &[(1, 1), (3, 1000), (1000, 3), (4097, 513), (17, 256), (64, 4096), (5, 7)];

/// GELU, tanh form, in f64 (the GEMM epilogues' references).
pub fn gelu_tanh(x: f64) -> f64 {
    0.5 * x * (1.0 + ((2.0 / std::f64::consts::PI).sqrt() * (x + 0.044715 * x * x * x)).tanh())
}

/// erf in f64: Simpson's rule on [0, |x|] (2000 intervals); ±1 past |x| = 6, where erf is 1
/// to f64's precision (and the rule's step would outgrow the integrand; ±∞ gives ±1).
pub fn erf(x: f64) -> f64 {
    if x.abs() > 6.0 {
        return x.signum();
    }
    let n = 2000;
    let h = x.abs() / n as f64;
    let f = |t: f64| (-t * t).exp();
    let mut s = f(0.0) + f(x.abs());
    for i in 1..n {
        s += f(i as f64 * h) * if i % 2 == 1 { 4.0 } else { 2.0 };
    }
    (s * h / 3.0 * 2.0 / std::f64::consts::PI.sqrt()).copysign(x)
}
