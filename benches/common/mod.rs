//! What the GEMM bench and the `gemm_vs_cublas` example share: the cuBLAS baseline's call.

use tessera::bf16;
use tessera::cudarc::cublas::{sys::cublasOperation_t, GemmConfig};

/// cuBLAS's column-major form of the row-major `C (M×N) = A (M×K) · B (N×K)ᵀ`: `Cᵀ = B·Aᵀ`
/// (pass B, then A).
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
