//! GEMM on the GPU against a float64 reference: fresh random inputs, odd shapes, C poisoned
//! with NaN before the launch. Large shapes are checked on a random sample of entries.

mod common;

use rand::Rng;
use tessera::testing::{gpu_or_skip, rel_error};
use tessera::{bf16, Device, Tensor};

fn random_bf16(n: usize) -> Vec<bf16> {
    common::random(n, -1.0, 1.0).into_iter().map(bf16::from_f32).collect()
}

/// C = A·Bᵀ entry (i, j) in f64.
fn dot(a: &[bf16], b: &[bf16], k: usize, i: usize, j: usize) -> f64 {
    (0..k).map(|p| a[i * k + p].to_f64() * b[j * k + p].to_f64()).sum()
}

fn check(dev: &Device, m: usize, n: usize, k: usize, samples: Option<usize>) {
    let (a, b) = (random_bf16(m * k), random_bf16(n * k));
    let at = Tensor::from_host(dev, &a, &[m, k]).unwrap();
    let bt = Tensor::from_host(dev, &b, &[n, k]).unwrap();
    let mut c = Tensor::full(dev, &[m, n], bf16::NAN).unwrap();
    tessera_kernels::gemm_tn(dev, &at, &bt, &mut c).unwrap();
    let got = c.to_host().unwrap();
    let idx: Vec<(usize, usize)> = match samples {
        None => (0..m * n).map(|x| (x / n, x % n)).collect(),
        Some(s) => {
            let mut rng = rand::rng();
            let mut v: Vec<(usize, usize)> = (0..s).map(|_| (rng.random_range(0..m), rng.random_range(0..n))).collect();
            v.extend([(0, 0), (m - 1, n - 1), (m - 1, 0), (0, n - 1)]);
            v
        }
    };
    let want: Vec<f64> = idx.iter().map(|&(i, j)| dot(&a, &b, k, i, j)).collect();
    let have: Vec<f64> = idx.iter().map(|&(i, j)| got[i * n + j].to_f64()).collect();
    let err = rel_error(&have, &want);
    assert!(err < 1e-2, "gemm {m}x{n}x{k}: relative error {err}");
    println!("gemm {m}x{n}x{k}: relative error {err:.2e}");
}

#[test]
fn gpu_gemm_odd_shapes_match_f64_reference() {
    let Some(dev) = gpu_or_skip("gpu_gemm_odd_shapes") else { return };
    for &(m, n, k) in &[(1, 1, 1), (17, 33, 65), (127, 129, 255), (128, 256, 64), (200, 300, 1000), (1, 4096, 4096), (4095, 4097, 31)] {
        let samples = if m * n * k > 50_000_000 { Some(4000) } else { None };
        check(&dev, m, n, k, samples);
    }
}

#[test]
fn gpu_gemm_large_shapes_match_f64_reference() {
    let Some(dev) = gpu_or_skip("gpu_gemm_large_shapes") else { return };
    for &(m, n, k) in &[(2048, 2048, 2048), (4096, 4096, 4096), (8192, 4096, 4096), (1000, 14336, 4096)] {
        check(&dev, m, n, k, Some(3000));
    }
}

#[test]
fn gpu_gemm_rejects_mismatched_shapes() {
    let Some(dev) = gpu_or_skip("gpu_gemm_rejects_mismatched_shapes") else { return };
    let a = Tensor::from_host(&dev, &random_bf16(6), &[2, 3]).unwrap();
    let b = Tensor::from_host(&dev, &random_bf16(8), &[2, 4]).unwrap();
    let mut c = Tensor::<bf16>::zeros(&dev, &[2, 2]).unwrap();
    let e = tessera_kernels::gemm_tn(&dev, &a, &b, &mut c).unwrap_err().to_string();
    assert!(e.contains("`b`") && e.contains("K = 3"), "{e}");
}
