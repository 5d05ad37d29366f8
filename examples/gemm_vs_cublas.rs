//! One GEMM shape, Tessera beside cuBLAS (through cudarc) in the same process: TFLOP/s of
//! each, timed with CUDA events after warm-up. Handy under a profiler, where the whole
//! criterion bench would be too long:
//!
//! `cargo run --release --example gemm_vs_cublas -- 8192 14336 4096`
//!
//! C = A·Bᵀ with A M×K and B N×K row-major, bf16 (the LLM-weight layout).

use tessera::cudarc::cublas::{sys::cublasOperation_t, CudaBlas, Gemm, GemmConfig};
use tessera::testing::{time_ms, Uniform};
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
    // cuBLAS is column-major: the row-major C (M×N) = A·Bᵀ is Cᵀ (N×M) = B·Aᵀ there.
    let cfg = GemmConfig {
        transa: cublasOperation_t::CUBLAS_OP_T,
        transb: cublasOperation_t::CUBLAS_OP_N,
        m: n as i32,
        n: m as i32,
        k: k as i32,
        alpha: bf16::ONE,
        lda: k as i32,
        ldb: k as i32,
        beta: bf16::ZERO,
        ldc: n as i32,
    };
    let mut failure = None;
    let t_cublas = time_ms(&dev, 1, iters, || {
        if let Err(e) = unsafe { blas.gemm(cfg, &b_raw, &a_raw, &mut c_raw) } {
            failure = Some(e.to_string());
        }
    })?;
    let t_ours = time_ms(&dev, 1, iters, || {
        if let Err(e) = tessera_kernels::gemm_tn(&dev, &a, &b, &mut c) {
            failure = Some(e.to_string());
        }
    })?;
    if let Some(e) = failure {
        return Err(e.into());
    }
    let flop = 2.0 * (m * n * k) as f64;
    let (ours, theirs) = (flop / t_ours * 1e-9, flop / t_cublas * 1e-9);
    println!("{m}x{n}x{k} on {}: cuBLAS {theirs:.0} TFLOP/s, tessera {ours:.0} TFLOP/s, ratio {:.2}", dev.name(), ours / theirs);
    Ok(())
}
