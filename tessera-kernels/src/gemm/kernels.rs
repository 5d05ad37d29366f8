//! The GEMM kernels, in the DSL. Each is compiled for bf16 and f16 (`dtypes`).
//!
//! All take rank-3 tensors `[batch, rows, cols]` (a plain matrix is a batch of one) and run a
//! persistent grid over `batch × tiles`, tiles in groups of 8 tile-rows so that neighbouring
//! blocks share B's columns in L2. The Hopper kernels claim tiles from a `TileQueue` (a global
//! counter) so that SMs that run ahead take more; the portable ones take every grid-th tile. Warpgroup 0 produces: for each 64-wide K step it waits for
//! a free stage, copies A's and B's boxes there by TMA (edges zero-filled) and commits.
//! Warpgroups 1 and 2 consume: each waits for a full stage and multiplies its 64 rows of A by B
//! into an f32 accumulator, keeping one MMA group in flight and releasing the stage before it.
//! The epilogue runs on the accumulator in registers, a few columns at a time, and stores C
//! while the producer already fills the next tile's stages.
//!
//! The four kernels are written with the device functions of [`crate::prelude`]: the Hopper
//! ones are each its rings and one call of [`gemm_persistent`](crate::prelude::gemm_persistent)
//! with the built-in epilogue (`alpha`, bias, activation) as a closure; the portable ones share
//! `gemm_portable`.

use crate::prelude::*;
use tessera::kernel;

/// `C = act(alpha·A·Bᵀ + bias)`: A `[batch, M, K]`, B `[batch, N, K]` (the "TN" layout of
/// LLM weights), C `[batch, M, N]`; 128×256 tiles; C leaves through shared memory and TMA
/// stores (its rows must be 16-byte aligned). Hopper only: without `setmaxnreg` the
/// 64×256 accumulators do not fit sm_80's 168 registers; `gemm_tn_full_*` runs there. `bias_kind` 1: per column, 2: per row;
/// `act` 1: GELU tanh, 2: GELU erf, 3: SiLU.
#[kernel(warpgroups = 3, dtypes(T = [bf16, f16]), tune(BN = [256, 128], STAGES = [4, 3, 5, 6]), targets(sm_90a))]
pub fn gemm_tn(
    a: Global<T, 3>, b: Global<T, 3>, c: Global<T, 3>, bias: Global<T, 1>, counter: Global<i32, 1>, alpha: f32, bias_kind: i32, act: i32,
) {
    let sa = Smem::<T, 128, 64>::ring(STAGES);
    let sb = Smem::<T, BN, 64>::ring(STAGES);
    // C's staging: two 64×64 buffers per consumer warpgroup, stored by TMA.
    let sc = Smem::<T, 64, 64>::ring(4);
    let pipe = Pipeline::<STAGES>::new(2);
    gemm_persistent::<0, BN>(a, b, c, counter, sa, sb, sc, pipe, |acc, _bt, m0, n| bias_act(acc * alpha, bias, bias_kind, act, m0, n));
}

/// `gemm_tn_*` with B stored `[batch, K, N]` (row-major K×N): B's stage is a 64×256 tile in
/// four 128-byte panels (one TMA box each) that wgmma reads N-major.
#[kernel(warpgroups = 3, dtypes(T = [bf16, f16]), tune(BN = [256, 128], STAGES = [4, 3, 5, 6]), targets(sm_90a))]
pub fn gemm_nn(
    a: Global<T, 3>, b: Global<T, 3>, c: Global<T, 3>, bias: Global<T, 1>, counter: Global<i32, 1>, alpha: f32, bias_kind: i32, act: i32,
) {
    let sa = Smem::<T, 128, 64>::ring(STAGES);
    let sb = Smem::<T, 64, BN>::ring(STAGES);
    let sc = Smem::<T, 64, 64>::ring(4);
    let pipe = Pipeline::<STAGES>::new(2);
    gemm_persistent::<1, BN>(a, b, c, counter, sa, sb, sc, pipe, |acc, _bt, m0, n| bias_act(acc * alpha, bias, bias_kind, act, m0, n));
}

/// The built-in portable epilogue on a chunk at `[bt, m0, n]`: `act(alpha·acc + beta·C_in +
/// bias) + residual`, each term where asked.
#[tessera::device]
#[allow(clippy::too_many_arguments)]
fn full_epilogue<T, const W: usize>(
    acc: Tile<f32, 64, W>, c_in: Global<T, 3>, bias: Global<T, 1>, residual: Global<T, 3>, alpha: f32, beta: f32, bias_kind: i32, act: i32,
    add_residual: i32, bt: i32, m0: i32, n: i32,
) -> Tile<f32, 64, W> {
    let mut out = acc * alpha;
    if beta != 0.0 {
        out = out + c_in.load::<Tile<T, 64, W>>([bt, m0, n]).cast::<f32>() * beta;
    }
    add_bias(&mut out, bias, bias_kind, n, m0);
    activate(&mut out, act);
    if add_residual == 1 {
        out = out + residual.load::<Tile<T, 64, W>>([bt, m0, n]).cast::<f32>();
    }
    out
}

/// `gemm_tn_*` with the whole epilogue, `act(alpha·acc + beta·C_in + bias) + residual`, on
/// 128×128 tiles: the two extra M×N operands need the registers a 64×256 accumulator takes.
/// Built for sm_90a and sm_80 (ldmatrix + mma.sync, cp.async): the portable GEMM.
#[kernel(warpgroups = 3, dtypes(T = [bf16, f16]))]
pub fn gemm_tn_full(
    a: Global<T, 3>, b: Global<T, 3>, c: Global<T, 3>, c_in: Global<T, 3>, bias: Global<T, 1>, residual: Global<T, 3>, alpha: f32,
    beta: f32, bias_kind: i32, act: i32, add_residual: i32,
) {
    let sa = Smem::<T, 128, 64>::ring(4);
    let sb = Smem::<T, 128, 64>::ring(4);
    let pipe = Pipeline::<4>::new(2);
    gemm_portable::<0>(a, b, c, sa, sb, pipe, |acc, bt, m0, n| {
        full_epilogue(acc, c_in, bias, residual, alpha, beta, bias_kind, act, add_residual, bt, m0, n)
    });
}

/// `gemm_tn_full_*` with B stored `[batch, K, N]`.
#[kernel(warpgroups = 3, dtypes(T = [bf16, f16]))]
pub fn gemm_nn_full(
    a: Global<T, 3>, b: Global<T, 3>, c: Global<T, 3>, c_in: Global<T, 3>, bias: Global<T, 1>, residual: Global<T, 3>, alpha: f32,
    beta: f32, bias_kind: i32, act: i32, add_residual: i32,
) {
    let sa = Smem::<T, 128, 64>::ring(4);
    let sb = Smem::<T, 64, 128>::ring(4);
    let pipe = Pipeline::<4>::new(2);
    gemm_portable::<1>(a, b, c, sa, sb, pipe, |acc, bt, m0, n| {
        full_epilogue(acc, c_in, bias, residual, alpha, beta, bias_kind, act, add_residual, bt, m0, n)
    });
}

/// `y = gelu_tanh(x + bias)` with a bias per column: the unfused epilogue that the GEMM
/// bench compares the fused one against.
#[kernel]
pub fn bias_gelu_bf16(x: Global<bf16, 2>, bias: Global<bf16, 1>, y: Global<bf16, 2>) {
    let r = block::id_y() * 16;
    let c = block::id_x() * 256;
    let t: Tile<bf16, 16, 256> = x.load([r, c]);
    let v = t.cast::<f32>() + bias.load::<Tile<bf16, 1, 256>>([c]).cast::<f32>();
    let g = 0.5 * v * (1.0 + tanh(0.7978845608 * (v + 0.044715 * v * v * v)));
    y.store([r, c], g.cast::<bf16>());
}

/// Copies `x` into the top-left of `y`; the rest of `y` (the padding) gets zeros.
#[kernel(dtypes(T = [bf16, f16]))]
pub fn pad_copy(x: Global<T, 2>, y: Global<T, 2>) {
    let r = block::id_y() * 16;
    let c = block::id_x() * 128;
    let t: Tile<T, 16, 128> = x.load([r, c]);
    y.store([r, c], t);
}
