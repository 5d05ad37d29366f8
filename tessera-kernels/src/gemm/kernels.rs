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

/// `gemm_tn_*` over the tiles of C that meet its lower (`upper` 0) or upper (`upper` 1)
/// triangle only (`triangle_tile`, row by row): `A·Aᵀ` (SYRK) or a causal product in about half
/// the work. Tiles across the diagonal are written whole (every element its product); C's
/// tiles wholly on the other side are not written.
#[kernel(warpgroups = 3, dtypes(T = [bf16, f16]), tune(BN = [256, 128], STAGES = [4]), targets(sm_90a))]
pub fn gemm_tn_triangle(
    a: Global<T, 3>, b: Global<T, 3>, c: Global<T, 3>, bias: Global<T, 1>, counter: Global<i32, 1>, alpha: f32, bias_kind: i32, act: i32,
    upper: i32,
) {
    let sa = Smem::<T, 128, 64>::ring(STAGES);
    let sb = Smem::<T, BN, 64>::ring(STAGES);
    let sc = Smem::<T, 64, 64>::ring(4);
    let pipe = Pipeline::<STAGES>::new(2);
    let tiles_m = (c.dim(1) + 127) / 128;
    let tiles_n = (c.dim(2) + BN - 1) / BN;
    let per_batch = triangle_tiles(tiles_m, tiles_n, BN, upper);
    #[rustfmt::skip]
    gemm_persistent_mapped::<0, BN, 0>(
        a, b, c, counter, sa, sb, sc, pipe, per_batch * c.dim(0),
        |tile| triangle_tile(tile, per_batch, tiles_m, tiles_n, BN, upper),
        |_bt, _m0, _n0, _k| Tile::<f32, 64, 1>::zeros(),
        |acc, _bt, m0, n| bias_act(acc * alpha, bias, bias_kind, act, m0, n),
    );
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

/// Small M (decode and small batches): `Cᵀ = W·Xᵀ` for 128-row slabs of the weights W
/// `[batch, N, K]` (B's "TN" layout) against `MN`-row chunks of X `[batch, M, K]` (A), K cut in
/// `splits`: a persistent grid walks the units (slab, chunk, split) — a split the fastest, so
/// that the units of one slab run side by side and read its weights from DRAM once — the
/// producer streaming the next unit's weights while the consumers finish one. The stages
/// (`196608 / (16384 + 128·MN)`: 10 at `MN` 16, 4 at 256) go through
/// [`gemm_load_from`](crate::prelude::gemm_load_from); each consumer multiplies its 64 weight
/// rows by the chunk's X rows (wgmma m64n`MN`, [`gemm_mma`](crate::prelude::gemm_mma)).
/// Unsplit, it stores `act(alpha·acc + bias)` at once; split, it adds the partial product into
/// the zeroed f32 sums `sum_t` `[batch, N, M]` (rows 16-byte aligned) by TMA reduce-adds and
/// takes a ticket from its (unit, consumer) counter (`fetch_inc`, which puts it back to 0 at
/// the last): the split that arrives last reads the finished sums, stores C and clears the sums
/// (both the device's kept-zeroed buffers). C is written through its transposed view `c_t`
/// (`[batch, N, M]`, strides `[M·N, 1, N]`); `bias_kind` is the tile's (2: per weight row, 1:
/// per X row).
#[kernel(warpgroups = 3, dtypes(T = [bf16, f16]), tune(MN = [16, 32, 64, 128, 256]), targets(sm_90a))]
#[allow(clippy::too_many_arguments)]
pub fn gemm_small_m(
    x: Global<T, 3>, w: Global<T, 3>, c_t: Global<T, 3>, bias: Global<T, 1>, sum_t: Global<f32, 3>, count: Global<i32, 1>, splits: i32,
    alpha: f32, bias_kind: i32, act: i32,
) {
    let sa = Smem::<T, 128, 64>::ring({ 196608 / (16384 + 128 * MN) });
    let sb = Smem::<T, MN, 64>::ring({ 196608 / (16384 + 128 * MN) });
    let pipe = Pipeline::<{ 196608 / (16384 + 128 * MN) }>::new(2);
    // Two staging panels a consumer for the split partial products (32 columns, fewer at `MN` 16).
    let sp = Smem::<f32, 64, { MN / ((MN + 31) / 32) }>::ring(4);
    let k_all = (x.dim(2) + 63) / 64;
    let tiles_n = (w.dim(1) + 127) / 128;
    let chunks = (x.dim(1) + MN - 1) / MN;
    let units = w.dim(0) * tiles_n * chunks * splits;
    if warpgroup::id() == 0 {
        setmaxnreg(40);
        for u in (block::id_x()..units).step_by(grid::dim_x()) {
            let (bt, n0, m0, k0, k_steps) = small_m_unit(u, splits, chunks, tiles_n, k_all, MN);
            gemm_load_from::<0>(w, x, sa, sb, pipe, bt, bt, n0, m0, k0, k_steps);
        }
    } else {
        setmaxnreg(232);
        let me = warpgroup::id() - 1;
        let row = me * 64;
        let mut acc = Tile::<f32, 64, MN>::zeros();
        for u in (block::id_x()..units).step_by(grid::dim_x()) {
            let (bt, n0, m0, _, k_steps) = small_m_unit(u, splits, chunks, tiles_n, k_all, MN);
            gemm_mma::<0>(&mut acc, sa, sb, pipe, row, 0, k_steps);
            // The epilogue 64 columns at a time (at most): a whole 64×256 tile's would spill.
            let n = n0 + row;
            if splits == 1 {
                #[unroll]
                for j in 0..(MN + 63) / 64 {
                    small_m_store(c_t, bias, acc.cols(j * 64, MN / ((MN + 63) / 64)), alpha, bias_kind, act, bt, n, m0 + j * 64);
                }
            } else {
                // The partial product leaves by TMA reduce-adds of its panels, through the
                // consumer's two staging panels; the ticket's draw waits for them to complete.
                #[unroll]
                for p in 0..(MN + 31) / 32 {
                    if p >= 2 {
                        tma::store_wait(1);
                    }
                    sp.at(me * 2 + p % 2).store(acc.cols(p * 32, MN / ((MN + 31) / 32)));
                    tma::reduce_add(sum_t, [bt, n, m0 + p * 32], sp.at(me * 2 + p % 2));
                }
                let slot = (u / splits) * 2 + me;
                let ticket = count.fetch_inc([slot], splits - 1);
                if ticket == splits - 1 {
                    #[unroll]
                    for j in 0..(MN + 63) / 64 {
                        let m = m0 + j * 64;
                        let part = sum_t.load::<Tile<f32, 64, { MN / ((MN + 63) / 64) }>>([bt, n, m]);
                        small_m_store(c_t, bias, part, alpha, bias_kind, act, bt, n, m);
                        sum_t.store([bt, n, m], Tile::<f32, 64, { MN / ((MN + 63) / 64) }>::zeros());
                    }
                }
            }
        }
    }
}

/// The small-M GEMM's epilogue on `W` columns of its transposed tile at `[bt, n, m]`.
#[tessera::device]
#[allow(clippy::too_many_arguments)]
fn small_m_store<T, const W: usize>(
    c_t: Global<T, 3>, bias: Global<T, 1>, part: Tile<f32, 64, W>, alpha: f32, bias_kind: i32, act: i32, bt: i32, n: i32, m: i32,
) {
    c_t.store([bt, n, m], bias_act(part * alpha, bias, bias_kind, act, n, m).cast::<T>());
}

/// Unit `u` of the small-M GEMM: `(batch, first weight row, first X row, first K step, K
/// steps)` — split `u % splits` of the `k_all` steps, then chunk (of `chunks`, `mn` X rows
/// each), then slab (of `tiles_n` a batch entry).
#[tessera::device]
fn small_m_unit(u: i32, splits: i32, chunks: i32, tiles_n: i32, k_all: i32, mn: i32) -> (i32, i32, i32, i32, i32) {
    let tile = u / splits;
    let split = u - tile * splits;
    let slab = tile / chunks;
    let bt = slab / tiles_n;
    let k0 = split * k_all / splits;
    (bt, (slab - bt * tiles_n) * 128, (tile - slab * chunks) * mn, k0, (split + 1) * k_all / splits - k0)
}

/// The built-in portable epilogue on a chunk at `[bt, m0, n]`: `act(alpha·acc + beta·C_in +
/// bias)`, each term where asked, then with `residual_op` 1 `+ residual`, with 2 `· residual`
/// (a gate: SwiGLU's `silu(x·W_gᵀ) ⊙ (x·W_uᵀ)` with the second product given).
#[tessera::device]
#[allow(clippy::too_many_arguments)]
fn full_epilogue<T, const W: usize>(
    acc: Tile<f32, 64, W>, c_in: Global<T, 3>, bias: Global<T, 1>, residual: Global<T, 3>, alpha: f32, beta: f32, bias_kind: i32, act: i32,
    residual_op: i32, bt: i32, m0: i32, n: i32,
) -> Tile<f32, 64, W> {
    let mut out = acc * alpha;
    if beta != 0.0 {
        out = out + c_in.load::<Tile<T, 64, W>>([bt, m0, n]).cast::<f32>() * beta;
    }
    add_bias(&mut out, bias, bias_kind, n, m0);
    activate(&mut out, act);
    if residual_op != 0 {
        let r = residual.load::<Tile<T, 64, W>>([bt, m0, n]).cast::<f32>();
        if residual_op == 1 {
            out = out + r;
        } else {
            out = out * r;
        }
    }
    out
}

/// `gemm_tn_*` with the whole epilogue, `act(alpha·acc + beta·C_in + bias)` plus or times a
/// residual, on
/// 128×128 tiles: the two extra M×N operands need the registers a 64×256 accumulator takes.
/// Built for sm_90a and sm_80 (ldmatrix + mma.sync, cp.async): the portable GEMM.
#[kernel(warpgroups = 3, dtypes(T = [bf16, f16]))]
pub fn gemm_tn_full(
    a: Global<T, 3>, b: Global<T, 3>, c: Global<T, 3>, c_in: Global<T, 3>, bias: Global<T, 1>, residual: Global<T, 3>, alpha: f32,
    beta: f32, bias_kind: i32, act: i32, residual_op: i32,
) {
    let sa = Smem::<T, 128, 64>::ring(4);
    let sb = Smem::<T, 128, 64>::ring(4);
    let pipe = Pipeline::<4>::new(2);
    gemm_portable::<0>(a, b, c, sa, sb, pipe, |acc, bt, m0, n| {
        full_epilogue(acc, c_in, bias, residual, alpha, beta, bias_kind, act, residual_op, bt, m0, n)
    });
}

/// `gemm_tn_full_*` with B stored `[batch, K, N]`.
#[kernel(warpgroups = 3, dtypes(T = [bf16, f16]))]
pub fn gemm_nn_full(
    a: Global<T, 3>, b: Global<T, 3>, c: Global<T, 3>, c_in: Global<T, 3>, bias: Global<T, 1>, residual: Global<T, 3>, alpha: f32,
    beta: f32, bias_kind: i32, act: i32, residual_op: i32,
) {
    let sa = Smem::<T, 128, 64>::ring(4);
    let sb = Smem::<T, 64, 128>::ring(4);
    let pipe = Pipeline::<4>::new(2);
    gemm_portable::<1>(a, b, c, sa, sb, pipe, |acc, bt, m0, n| {
        full_epilogue(acc, c_in, bias, residual, alpha, beta, bias_kind, act, residual_op, bt, m0, n)
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
