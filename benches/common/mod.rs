//! What the benches and the `gemm_vs_cublas` example share: the cuBLAS baseline's call, the
//! tuner's temporary cache.

use tessera::bf16;
use tessera::cudarc::cublas::{sys::cublasOperation_t, GemmConfig};

/// cuBLAS's column-major form of the row-major `C (M×N) = A (M×K) · B (N×K)ᵀ`: `Cᵀ = B·Aᵀ`
/// (pass B, then A).
#[allow(dead_code)]
pub fn cublas_tn(m: usize, n: usize, k: usize) -> GemmConfig<bf16> {
    GemmConfig {
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
    }
}

/// Points the tuner's cache at a temporary folder unless `TESSERA_CACHE_DIR` is set, so that a
/// bench's searches never change what the user's processes replay. Call before any launch.
#[allow(dead_code)]
pub fn temporary_tune_cache() {
    if std::env::var_os("TESSERA_CACHE_DIR").is_none() {
        std::env::set_var("TESSERA_CACHE_DIR", std::env::temp_dir().join(format!("tessera-bench-{}", std::process::id())));
    }
}
