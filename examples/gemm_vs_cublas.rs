//! One GEMM shape, Tessera beside cuBLAS (through cudarc) in the same process: TFLOP/s of
//! each, timed with CUDA events after warm-up. Handy under a profiler, where the whole
//! criterion bench would be too long:
//!
//! `cargo run --release --example gemm_vs_cublas -- 8192 14336 4096`
//!
//! C = A·Bᵀ with A M×K and B N×K row-major, bf16 (the LLM-weight layout).

#[path = "../benches/common/mod.rs"]
mod common;

use tessera::cudarc::cublas::{CudaBlas, Gemm};
use tessera::testing::{time_pair_ms, Uniform};
use tessera::{bf16, Device, Tensor};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<usize> = std::env::args().skip(1).map(|s| s.parse()).collect::<Result<_, _>>()?;
    let (m, n, k, iters) = match args[..] {
        [m, n, k] => (m, n, k, 20),
        [m, n, k, iters] => (m, n, k, iters),
        _ => return Err("usage: gemm_vs_cublas M N K [ITERS]".into()),
    };
    let dev = Device::new(0)?;
    let blas = CudaBlas::new(dev.stream()?.clone())?;
    let mut rng = Uniform::new();
    let a_host = rng.vec(m * k, bf16::from_f32);
    let b_host = rng.vec(n * k, bf16::from_f32);
    let a = Tensor::from_host(&dev, &a_host, &[m, k])?;
    let b = Tensor::from_host(&dev, &b_host, &[n, k])?;
    let mut c = Tensor::<bf16>::zeros(&dev, &[m, n])?;
    let a_raw = dev.stream()?.clone_htod(&a_host)?;
    let b_raw = dev.stream()?.clone_htod(&b_host)?;
    let mut c_raw = dev.stream()?.alloc_zeros::<bf16>(m * n)?;
    let cfg = common::cublas_tn(m, n, k);
    let (mut theirs_failed, mut ours_failed) = (None, None);
    // Alternating rounds (medians), so that clock drift falls on both.
    let (t_cublas, t_ours) = time_pair_ms(
        &dev,
        1,
        iters,
        5,
        || {
            if let Err(e) = unsafe { blas.gemm(cfg, &b_raw, &a_raw, &mut c_raw) } {
                theirs_failed = Some(e.to_string());
            }
        },
        || {
            if let Err(e) = tessera_kernels::gemm_tn(&dev, &a, &b, &mut c) {
                ours_failed = Some(e.to_string());
            }
        },
    )?;
    if let Some(e) = theirs_failed.or(ours_failed) {
        return Err(e.into());
    }
    let flop = 2.0 * (m * n * k) as f64;
    let (ours, theirs) = (flop / t_ours * 1e-9, flop / t_cublas * 1e-9);
    println!("{m}x{n}x{k} on {}: cuBLAS {theirs:.0} TFLOP/s, tessera {ours:.0} TFLOP/s, ratio {:.2}", dev.name(), ours / theirs);
    Ok(())
}
