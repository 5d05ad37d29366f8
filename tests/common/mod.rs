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
