//! Device functions for kernel authors: `use tessera_kernels::prelude::*;` in a crate of
//! yours, then call them from your `#[tessera::kernel]` and `#[tessera::device]` functions,
//! where they are inlined. The library's own kernels are written with them.
//!
//! ```ignore
//! use tessera::kernel;
//! use tessera_kernels::prelude::*;
//!
//! /// RMSNorm of 4-row blocks of 1024-wide rows, with an optional weight.
//! #[kernel]
//! fn my_rms_norm(x: Global<f32, 2>, w: Global<f32, 1>, y: Global<f32, 2>, eps: f32, has_w: i32) {
//!     let r = block::id_x() * 4;
//!     let t: Tile<f32, 4, 1024> = x.load([r, 0]);
//!     let mut o = rms_scale(t, x.dim(1), eps);
//!     scale_columns(&mut o, w, 0, has_w);
//!     y.store([r, 0], o);
//! }
//! ```

use tessera::device;

pub use crate::attention::kernels::{
    alibi, attend_blocks, attention_persistent, attention_varlen_persistent, causal_keys, causal_visible, key_blocks, library_dropout,
    library_score_grad, library_scores, masked_scores, modified_scores, softcap, window_prefix_keys, window_prefix_queries,
    window_prefix_visible,
};
pub use crate::attention::{attention_dkv_tile, attention_dkv_wide_tile, attention_dq_tile};
pub use crate::linear_attention::{feature_map, feature_map_grad};

/// `t / sqrt(mean(t²) + eps)` per row, the mean over `n` columns (the tile's columns from `n`
/// on must hold zeros, as a load past a row's end gives).
#[device]
pub fn rms_scale<const R: usize, const W: usize>(t: Tile<f32, R, W>, n: i32, eps: f32) -> Tile<f32, R, W> {
    t * rsqrt(row_sum(t * t) * (1.0 / n as f32) + eps)
}

/// `(t − mean) / sqrt(var + eps)` per row over `n` columns: the variance is the mean of the
/// centred squares, the columns from `n` on masked out of both, so it is never negative and
/// a row of equal values gives zeros.
#[device]
pub fn layer_scale<const R: usize, const W: usize>(t: Tile<f32, R, W>, n: i32, eps: f32) -> Tile<f32, R, W> {
    let mean = row_sum(t) * (1.0 / n as f32);
    let d = (t - mean).mask_cols(n, 0.0);
    d * rsqrt(row_sum(d * d) * (1.0 / n as f32) + eps)
}

/// `o ← o · w[col..col + W]` (one row of `w`, read as `T`, down every row of `o`) where
/// `on == 1`: a norm's weight.
#[device]
pub fn scale_columns<T, const R: usize, const W: usize>(o: &mut Tile<f32, R, W>, w: Global<T, 1>, col: i32, on: i32) {
    if on == 1 {
        *o = *o * w.load::<Tile<T, 1, W>>([col]).cast::<f32>();
    }
}

/// `o ← o + b[col..col + W]` where `on == 1`: a norm's bias.
#[device]
pub fn shift_columns<T, const R: usize, const W: usize>(o: &mut Tile<f32, R, W>, b: Global<T, 1>, col: i32, on: i32) {
    if on == 1 {
        *o = *o + b.load::<Tile<T, 1, W>>([col]).cast::<f32>();
    }
}

/// Inverted dropout of the tile at `[row, col]` of a tensor: an element is kept where its
/// Philox number (`Tile::uniform` of `seed`, `offset` and its own index, so the mask does not
/// depend on the tiling) is at least `p`, and scaled by `keep_scale` (`1 / (1 − p)`).
#[device]
pub fn dropout<const R: usize, const W: usize>(
    x: Tile<f32, R, W>, p: f32, keep_scale: f32, seed_lo: i32, seed_hi: i32, offset: i32, row: i32, col: i32,
) -> Tile<f32, R, W> {
    x * step(Tile::<f32, R, W>::uniform(seed_lo, seed_hi, offset, [row, col]) - p) * keep_scale
}

/// One step of an online softmax (base 2) over a block `s` of a row's scores: returns the
/// block's unnormalized probabilities `exp2(s − m_new)` and the new running maximum `m_new`,
/// and rescales the running sum `l` to it and adds the block's row sums. Start with `m` at
/// `f32::NEG_INFINITY` and `l` at zero; a row whose scores so far are all −∞ gives NaN (mask
/// such rows to a finite value first).
#[device]
pub fn online_softmax<const M: usize, const N: usize>(
    s: Tile<f32, M, N>, m: Tile<f32, M, 1>, l: &mut Tile<f32, M, 1>,
) -> (Tile<f32, M, N>, Tile<f32, M, 1>) {
    let m_new = max(m, row_max(s));
    let p = exp2(s - m_new);
    *l = *l * exp2(m - m_new) + row_sum(p);
    (p, m_new)
}

// ---------------------------------------------------------------------------------------
// Pipeline loops: a ring's stages filled and drained without the acquire/commit and
// wait/release pairs spelled out. `Pipeline<S>` keeps each side's slot and phase itself
// (`acquire()` and `wait()` advance it); the type checker rejects a stage read after its
// release, a stage handed back to another pipeline, and a ring guarded by a pipeline of
// another depth.

/// A producer's loop over `n` stages of `pipe`: for each, waits for a free stage `s`, runs
/// `body(s, k)` (`k` counting from 0: its copies into the stage, `tma::load(ring.at(s), …,
/// pipe)`) and commits the stage, which the copies' bytes then complete.
#[device]
pub fn fill_stages<const S: usize>(pipe: Pipeline<S>, n: i32, body: impl Fn(i32, i32)) {
    for k in 0..n {
        let s = pipe.acquire();
        body(s, k);
        pipe.commit(s);
    }
}

/// A consumer's loop over `n` stages of `pipe`: for each, waits for the next full stage `s`,
/// runs `body(s, k)` and releases the stage to the producer. `body` must be done reading the
/// stage when it returns (an asynchronous MMA on it waited for: `mma_wait(0)`); a loop that
/// keeps an MMA in flight across stages releases each one a step later, as `gemm_mma` does.
#[device]
pub fn drain_stages<const S: usize>(pipe: Pipeline<S>, n: i32, body: impl Fn(i32, i32)) {
    for k in 0..n {
        let s = pipe.wait();
        body(s, k);
        pipe.release(s);
    }
}

// ---------------------------------------------------------------------------------------
// GEMM building blocks: the library's warp-specialized GEMMs are written with these, and a
// kernel of yours that runs the same mainloop with its own epilogue is too
// (`examples/custom_epilogue.rs`).

/// The coordinates of tile `tile` of a persistent GEMM grid: its batch, and its tile row and
/// column in a raster of `tiles_m` tile rows whose tiles go in groups of 8 tile rows (`group`
/// = 8 × tile columns), so that neighbouring blocks share B's columns in L2.
#[device]
pub fn grouped_tile(tile: i32, per_batch: i32, tiles_m: i32, group: i32) -> (i32, i32, i32) {
    let t = tile % per_batch;
    let first = (t / group) * 8;
    let height = min(tiles_m - first, 8);
    (tile / per_batch, first + (t % group) % height, (t % group) / height)
}

/// A producer warpgroup's K loop for one 128-row tile at `[bt, m0, n0]`: each `BK`-wide step
/// (`sa`'s columns: 64 of a 16-bit type, 128 of fp8 — a 128-byte row) waits for a free stage,
/// loads A's 128×`BK` box and B's box there by TMA and commits it. `KN` is B's layout, named
/// at the call: 0 for `[batch, N, K]` (`sb` a `BN`×`BK` ring), 1 for `[batch, K, N]` (`sb`
/// `BK`×`BN`): `gemm_load::<0>(a, b, sa, sb, pipe, bt, m0, n0, k_steps)`. A and B may hold
/// different types (fp8's e5m2 × e4m3).
#[device]
#[allow(clippy::too_many_arguments)]
pub fn gemm_load<const KN: usize, T, TB, const BK: usize, const SR: usize, const SC: usize, const S: usize, const BM: usize>(
    a: Global<T, 3>, b: Global<TB, 3>, sa: Smem<T, BM, BK>, sb: Smem<TB, SR, SC>, pipe: Pipeline<S>, bt: i32, m0: i32, n0: i32,
    k_steps: i32,
) {
    gemm_load_from::<KN>(a, b, sa, sb, pipe, bt, bt, m0, n0, 0, k_steps);
}

/// [`gemm_load`] with B's batch `bb` of its own (a grouped GEMM's expert: A's rows are all in
/// batch `bt`), over the K steps `k0..k0 + k_steps` only (a split of K).
#[device]
#[allow(clippy::too_many_arguments)]
pub fn gemm_load_from<const KN: usize, T, TB, const BK: usize, const SR: usize, const SC: usize, const S: usize, const BM: usize>(
    a: Global<T, 3>, b: Global<TB, 3>, sa: Smem<T, BM, BK>, sb: Smem<TB, SR, SC>, pipe: Pipeline<S>, bt: i32, bb: i32, m0: i32, n0: i32,
    k0: i32, k_steps: i32,
) {
    fill_stages(pipe, k_steps, |s, k| {
        tma::load(sa.at(s), a, [bt, m0, (k0 + k) * BK], pipe);
        if KN == 1 {
            tma::load(sb.at(s), b, [bb, (k0 + k) * BK, n0], pipe);
        } else {
            tma::load(sb.at(s), b, [bb, n0, (k0 + k) * BK], pipe);
        }
    });
}

/// A consumer warpgroup's K loop: `acc` ← its 64 rows of A (from row `row` of the stage)
/// times B (`KN` as [`gemm_load`]'s), one MMA group kept in flight, each stage released once
/// the MMA after it is issued; returns with every MMA done and every stage released (`acc`
/// zero where `k_steps` is 0). Where B's stages (`[N, K]`, `KN` 0) hold more rows than `acc`
/// has columns, `acc` takes `BN` of them from row `b_row` (consumers splitting a tile's
/// columns, as the 64-block sparse GEMM's do); else `b_row` is unused.
#[device]
#[allow(clippy::too_many_arguments)]
pub fn gemm_mma<
    const KN: usize,
    T,
    TB,
    const BN: usize,
    const BK: usize,
    const SR: usize,
    const SC: usize,
    const S: usize,
    const BM: usize,
>(
    acc: &mut Tile<f32, 64, BN>, sa: Smem<T, BM, BK>, sb: Smem<TB, SR, SC>, pipe: Pipeline<S>, row: i32, b_row: i32, k_steps: i32,
) {
    *acc = Tile::<f32, 64, BN>::zeros();
    let mut prev = 0;
    for k in 0..k_steps {
        let s = pipe.wait();
        if KN == 1 {
            mma_sync_kn(acc, sa.at(s).rows(row, 64), sb.at(s));
        } else if SR == BN {
            mma_sync(acc, sa.at(s).rows(row, 64), sb.at(s));
        } else {
            mma_sync(acc, sa.at(s).rows(row, 64), sb.at(s).rows(b_row, BN));
        }
        mma_wait(1);
        if k > 0 {
            pipe.release(prev);
        }
        prev = s;
    }
    mma_wait(0);
    // (No step, no stage: a block-sparse row with no blocks leaves `acc` zero.)
    if k_steps > 0 {
        pipe.release(prev);
    }
}

/// [`gemm_mma`] for 128 rows of A (from row `row` of the stage): `acc0` ← the first 64 rows
/// times B, `acc1` ← the next 64, the two MMAs of a stage kept in flight while the next stage's
/// are issued. A warpgroup's share of a 256-row tile: B read once for twice the rows.
#[device]
#[allow(clippy::too_many_arguments)]
pub fn gemm_mma_pair<
    const KN: usize,
    T,
    TB,
    const BN: usize,
    const BK: usize,
    const SR: usize,
    const SC: usize,
    const S: usize,
    const BM: usize,
>(
    acc0: &mut Tile<f32, 64, BN>, acc1: &mut Tile<f32, 64, BN>, sa: Smem<T, BM, BK>, sb: Smem<TB, SR, SC>, pipe: Pipeline<S>, row: i32,
    k_steps: i32,
) {
    *acc0 = Tile::<f32, 64, BN>::zeros();
    *acc1 = Tile::<f32, 64, BN>::zeros();
    let mut prev = 0;
    for k in 0..k_steps {
        let s = pipe.wait();
        if KN == 1 {
            mma_sync_kn(acc0, sa.at(s).rows(row, 64), sb.at(s));
            mma_sync_kn(acc1, sa.at(s).rows(row + 64, 64), sb.at(s));
        } else {
            mma_sync(acc0, sa.at(s).rows(row, 64), sb.at(s));
            mma_sync(acc1, sa.at(s).rows(row + 64, 64), sb.at(s));
        }
        mma_wait(2);
        if k > 0 {
            pipe.release(prev);
        }
        prev = s;
    }
    mma_wait(0);
    if k_steps > 0 {
        pipe.release(prev);
    }
}

/// [`gemm_mma`] (B `[batch, N, K]`: fp8 is K-major only) with the accumulator promoted every
/// stage: each stage's product goes into a fresh accumulator, and is added into `acc` times
/// `scale(k)` (`k` the stage's K step, counting from 0; a factor per row) while the next
/// stage's MMA runs into a second one — the scales of a block-scaled fp8 GEMM applied per K
/// block, and fp8's wgmma sums (which keep fewer bits than f32) ended every `BK` columns.
/// Returns with every MMA done and every stage released.
#[device]
#[allow(clippy::too_many_arguments)]
pub fn gemm_mma_promoted<T, TB, const BN: usize, const BK: usize, const SR: usize, const SC: usize, const S: usize>(
    acc: &mut Tile<f32, 64, BN>, sa: Smem<T, 128, BK>, sb: Smem<TB, SR, SC>, pipe: Pipeline<S>, row: i32, k_steps: i32,
    scale: impl Fn(i32) -> Tile<f32, 64, 1>,
) {
    *acc = Tile::<f32, 64, BN>::zeros();
    // Even steps multiply into `even`, odd ones into `odd`: a step's sums are promoted while
    // the next one's MMA is in flight (`mma_wait(1)`), unrolled by two so that neither moves.
    let mut prev = pipe.wait();
    let mut even = Tile::<f32, 64, BN>::zeros();
    mma_sync(even, sa.at(prev).rows(row, 64), sb.at(prev));
    let mut odd = Tile::<f32, 64, BN>::zeros();
    for p in 0..(k_steps - 1) / 2 {
        let s = pipe.wait();
        odd = Tile::<f32, 64, BN>::zeros();
        mma_sync(odd, sa.at(s).rows(row, 64), sb.at(s));
        let f = scale(2 * p);
        mma_wait(1);
        pipe.release(prev);
        *acc = *acc + even * f;
        let s2 = pipe.wait();
        even = Tile::<f32, 64, BN>::zeros();
        mma_sync(even, sa.at(s2).rows(row, 64), sb.at(s2));
        let f2 = scale(2 * p + 1);
        mma_wait(1);
        pipe.release(s);
        *acc = *acc + odd * f2;
        prev = s2;
    }
    // Step 2·⌊(k_steps − 1)/2⌋ is in flight; an even count leaves one more.
    if k_steps % 2 == 0 {
        let s = pipe.wait();
        odd = Tile::<f32, 64, BN>::zeros();
        mma_sync(odd, sa.at(s).rows(row, 64), sb.at(s));
        let f = scale(k_steps - 2);
        mma_wait(1);
        pipe.release(prev);
        *acc = *acc + even * f;
        let f2 = scale(k_steps - 1);
        mma_wait(0);
        pipe.release(s);
        *acc = *acc + odd * f2;
    } else {
        let f = scale(k_steps - 1);
        mma_wait(0);
        pipe.release(prev);
        *acc = *acc + even * f;
    }
}

/// The library's warp-specialized Hopper GEMM, `C = epilogue(A·B)`, as one device function
/// that a kernel calls with its rings and its epilogue: A `[batch, M, K]`, B `[batch, N, K]`
/// (`KN` 0: `sb` a `BN`×`BK` ring) or `[batch, K, N]` (`KN` 1: `sb` `BK`×`BN`), K in steps of
/// `BK` (`sa` 128×`BK`: 64 of a 16-bit type, 128 of fp8), C `[batch, M, N]` in a type of its own
/// (rows 16-byte aligned, for the TMA stores); 128×`BN` tiles claimed from the tile queue on
/// `counter` (a zeroed `Device::tile_counter()`) by a persistent grid of at most one block per
/// SM, launched with three warpgroups. Warpgroup 0 loads the K steps by TMA; warpgroups 1 and
/// 2 multiply their 64 rows by wgmma, then hand the accumulator to `epilogue` 64 columns at a
/// time — `epilogue(acc, batch, row, col)` with the chunk's origin in C — and store what it
/// returns (cast to C's type) through `sc` (four 64×64 buffers) by TMA, while the producer
/// fills the next tile's stages. The epilogue runs on registers in the store loop: it adds no
/// pass over C (`tests/epilogue.rs`).
#[device]
#[allow(clippy::too_many_arguments)]
pub fn gemm_persistent<const KN: usize, const BN: usize, T, TB, U, const BK: usize, const S: usize, const SR: usize, const SC: usize>(
    a: Global<T, 3>, b: Global<TB, 3>, c: Global<U, 3>, counter: Global<i32, 1>, sa: Smem<T, 128, BK>, sb: Smem<TB, SR, SC>,
    sc: Smem<U, 64, 64>, pipe: Pipeline<S>, epilogue: impl Fn(Tile<f32, 64, 64>, i32, i32, i32) -> Tile<f32, 64, 64>,
) {
    let (per_batch, tiles_m, group) = gemm_raster::<BN>(c);
    // (`scale` unused where `PROMOTE` is 0.)
    #[rustfmt::skip]
    gemm_persistent_mapped::<KN, BN, 0>(
        a, b, c, counter, sa, sb, sc, pipe, per_batch * c.dim(0), |tile| grouped_tile(tile, per_batch, tiles_m, group),
        |_bt, _m0, _n0, _k| Tile::<f32, 64, 1>::zeros(), epilogue,
    );
}

/// The persistent GEMM's raster of 128×`BN` tiles over C `[batch, M, N]`, for
/// [`grouped_tile`]: `(tiles a batch entry, tile rows, tiles a group of 8 tile rows)`.
#[device]
pub fn gemm_raster<const BN: usize, U>(c: Global<U, 3>) -> (i32, i32, i32) {
    let tiles_m = (c.dim(1) + 127) / 128;
    let tiles_n = (c.dim(2) + BN - 1) / BN;
    (tiles_m * tiles_n, tiles_m, 8 * tiles_n)
}

/// [`gemm_persistent`] over the `tiles` tiles (all batches) that `map` names: `map(tile)` gives
/// tile `tile`'s batch, tile row and tile column (128×`BN` tiles) — a raster grouped for L2
/// ([`gemm_raster`], [`grouped_tile`]), or the tiles that meet one triangle of C
/// ([`triangle_tile`]); C's other tiles are not written. Where `PROMOTE` is 1 (`KN` 0 only),
/// the consumers multiply each K step into a fresh accumulator and add it into the running one
/// times `scale(batch, row, col, k)` — the step's factor for each of the 64 rows of the block at
/// `[batch, row, col]` ([`gemm_mma_promoted`]): fp8 with per-block scales, and fp8's short wgmma
/// sums promoted to f32 every step; where it is 0, `scale` is unused.
#[device]
#[allow(clippy::too_many_arguments)]
pub fn gemm_persistent_mapped<
    const KN: usize,
    const BN: usize,
    const PROMOTE: usize,
    T,
    TB,
    U,
    const BK: usize,
    const S: usize,
    const SR: usize,
    const SC: usize,
>(
    a: Global<T, 3>, b: Global<TB, 3>, c: Global<U, 3>, counter: Global<i32, 1>, sa: Smem<T, 128, BK>, sb: Smem<TB, SR, SC>,
    sc: Smem<U, 64, 64>, pipe: Pipeline<S>, tiles: i32, map: impl Fn(i32) -> (i32, i32, i32),
    scale: impl Fn(i32, i32, i32, i32) -> Tile<f32, 64, 1>, epilogue: impl Fn(Tile<f32, 64, 64>, i32, i32, i32) -> Tile<f32, 64, 64>,
) {
    // (Every tile is whole: the row end is unused where `BOUNDED` is 0.)
    #[rustfmt::skip]
    gemm_persistent_rows::<KN, BN, PROMOTE, 0>(
        a, b, c, counter, sa, sb, sc, pipe, tiles,
        |tile| {
            let (bt, tm, tn) = map(tile);
            (bt, tm * 128, tn * BN, bt, 0)
        },
        scale, epilogue,
    );
}

/// [`gemm_persistent_mapped`] with tiles placed by rows: `map(tile)` gives `(batch, row, col,
/// b_batch, row_end)` — the tile's origin in A and C (`[batch, row, …]`, any row), its first
/// column, B's batch (handed to `scale` and `epilogue` as their batch: see [`gemm_consume`]),
/// and where `BOUNDED` is 1 the row its rows of C end at. A bounded tile
/// whose first row is at or past its end is skipped (no loads, no MMAs), and a 64-row block that
/// crosses its end is stored element by element within it ([`store_within`]) instead of by TMA:
/// the rows past an expert's end in a grouped GEMM belong to the next expert's tiles
/// (`gemm_grouped` in `gemm/grouped.rs`). Where `BOUNDED` is 0, `row_end` is unused.
#[device]
#[allow(clippy::too_many_arguments)]
pub fn gemm_persistent_rows<
    const KN: usize,
    const BN: usize,
    const PROMOTE: usize,
    const BOUNDED: usize,
    T,
    TB,
    U,
    const BK: usize,
    const S: usize,
    const SR: usize,
    const SC: usize,
    const BM: usize,
>(
    a: Global<T, 3>, b: Global<TB, 3>, c: Global<U, 3>, counter: Global<i32, 1>, sa: Smem<T, BM, BK>, sb: Smem<TB, SR, SC>,
    sc: Smem<U, 64, 64>, pipe: Pipeline<S>, tiles: i32, map: impl Fn(i32) -> (i32, i32, i32, i32, i32),
    scale: impl Fn(i32, i32, i32, i32) -> Tile<f32, 64, 1>, epilogue: impl Fn(Tile<f32, 64, 64>, i32, i32, i32) -> Tile<f32, 64, 64>,
) {
    let k_steps = (a.dim(2) + (BK - 1)) / BK;
    // Tiles are claimed at run time, so that blocks that finish early take more of the last
    // wave; the producer hands each tile's index to both consumers.
    let queue = TileQueue::<2>::new(counter, 2);
    if warpgroup::id() == 0 {
        setmaxnreg(40);
        for tile in queue.fetch(tiles) {
            let (bt, m0, n0, bb, row_end) = map(tile);
            if BOUNDED == 1 && m0 >= row_end {
                // An empty tile: nothing to load.
            } else {
                gemm_load_from::<KN>(a, b, sa, sb, pipe, bt, bb, m0, n0, 0, k_steps);
            }
        }
    } else {
        setmaxnreg(232);
        // Each consumer's rows of the tile: 64 of a 128-row tile, 128 of a 256-row one.
        let row = (warpgroup::id() - 1) * (BM / 2);
        for tile in queue.take() {
            let (bt, m_tile, n0, bb, row_end) = map(tile);
            if BOUNDED == 1 && m_tile >= row_end {
                // An empty tile: nothing to compute.
            } else if BM == 256 {
                gemm_consume_pair::<KN, BN, BOUNDED>(sa, sb, sc, c, pipe, row, k_steps, bt, bb, m_tile + row, n0, row_end, epilogue);
            } else {
                #[rustfmt::skip]
                gemm_consume::<KN, BN, PROMOTE, BOUNDED>(
                    sa, sb, sc, c, pipe, row, k_steps, bt, bb, m_tile + row, n0, row_end, scale, epilogue,
                );
            }
        }
        tma::store_wait(0);
    }
}

/// A consumer warpgroup's share of one tile of the persistent GEMM: its 64 rows of A (row `row`
/// of the stages) times B over `k_steps` stages into an f32 accumulator ([`gemm_mma`], or
/// [`gemm_mma_promoted`] with `scale(bb, m0, n0, k)` where `PROMOTE` is 1), then the epilogue
/// 64 columns at a time — `epilogue(acc, bb, m0, n)` with B's batch (C's `bt` but in a grouped
/// GEMM, where it is the expert) and the chunk's origin `[bt, m0, n]` in C — each chunk staged in
/// shared memory and stored by TMA (asynchronously, whole lines; the buffer written two chunks
/// ago read first), or where `BOUNDED` is 1 and the 64 rows cross `row_end`, stored directly,
/// rows from `row_end` on skipped; a bounded warpgroup whose rows all lie past `row_end` only
/// releases the stages. End the kernel with `tma::store_wait(0)`.
#[device]
#[allow(clippy::too_many_arguments)]
pub fn gemm_consume<
    const KN: usize,
    const BN: usize,
    const PROMOTE: usize,
    const BOUNDED: usize,
    T,
    TB,
    U,
    const BK: usize,
    const S: usize,
    const SR: usize,
    const SC: usize,
    const BM: usize,
>(
    sa: Smem<T, BM, BK>, sb: Smem<TB, SR, SC>, sc: Smem<U, 64, 64>, c: Global<U, 3>, pipe: Pipeline<S>, row: i32, k_steps: i32, bt: i32,
    bb: i32, m0: i32, n0: i32, row_end: i32, scale: impl Fn(i32, i32, i32, i32) -> Tile<f32, 64, 1>,
    epilogue: impl Fn(Tile<f32, 64, 64>, i32, i32, i32) -> Tile<f32, 64, 64>,
) {
    if BOUNDED == 1 && m0 >= row_end {
        // All 64 rows past the end (the last tile of an expert, 64 rows or fewer): the stages
        // are only released, so that the other consumer's MMAs run alone, at twice the rate.
        drain_stages(pipe, k_steps, |_s, _k| {});
    } else {
        let mut acc = Tile::<f32, 64, BN>::zeros();
        if PROMOTE == 1 {
            gemm_mma_promoted(&mut acc, sa, sb, pipe, row, k_steps, |k| scale(bb, m0, n0, k));
        } else {
            gemm_mma::<KN>(&mut acc, sa, sb, pipe, row, 0, k_steps);
        }
        gemm_epilogue_store::<BOUNDED>(acc, c, sc, bt, bb, m0, n0, row_end, epilogue);
    }
}

/// The persistent GEMM's epilogue for a warpgroup's 64×`BN` block at `[bt, m0, n0]` of C: 64
/// columns at a time (so that loaded operands fit in registers), `epilogue(chunk, bb, m0, n)`
/// stored through the warpgroup's two buffers of `sc` by TMA ([`stage_store`]), or where
/// `BOUNDED` is 1 and the rows cross `row_end`, stored directly, rows from `row_end` on skipped.
#[device]
#[allow(clippy::too_many_arguments)]
pub fn gemm_epilogue_store<const BOUNDED: usize, U, const BN: usize>(
    acc: Tile<f32, 64, BN>, c: Global<U, 3>, sc: Smem<U, 64, 64>, bt: i32, bb: i32, m0: i32, n0: i32, row_end: i32,
    epilogue: impl Fn(Tile<f32, 64, 64>, i32, i32, i32) -> Tile<f32, 64, 64>,
) {
    #[unroll]
    for j in 0..BN / 64 {
        let n = n0 + j * 64;
        let out = epilogue(acc.cols(j * 64, 64), bb, m0, n);
        if BOUNDED == 1 && m0 + 64 > row_end {
            c.store_within([bt, m0, n], out.cast::<U>(), [c.dim(0), row_end, c.dim(2)]);
        } else {
            if BN == 64 {
                // One chunk a block: its buffer is the last block's, whose store must have read it
                // (issued a K loop ago: no wait in practice).
                tma::store_wait(0);
            }
            stage_store(c, sc, out, (warpgroup::id() - 1) * 2 + j % 2, bt, m0, n);
        }
    }
}

/// [`gemm_consume`] for a warpgroup's 128 rows of a 256-row tile (no promotion): two 64-row
/// accumulators ([`gemm_mma_pair`]), each through the epilogue; a bounded warpgroup whose rows
/// all lie past `row_end` only releases the stages.
#[device]
#[allow(clippy::too_many_arguments)]
pub fn gemm_consume_pair<
    const KN: usize,
    const BN: usize,
    const BOUNDED: usize,
    T,
    TB,
    U,
    const BK: usize,
    const S: usize,
    const SR: usize,
    const SC: usize,
    const BM: usize,
>(
    sa: Smem<T, BM, BK>, sb: Smem<TB, SR, SC>, sc: Smem<U, 64, 64>, c: Global<U, 3>, pipe: Pipeline<S>, row: i32, k_steps: i32, bt: i32,
    bb: i32, m0: i32, n0: i32, row_end: i32, epilogue: impl Fn(Tile<f32, 64, 64>, i32, i32, i32) -> Tile<f32, 64, 64>,
) {
    if BOUNDED == 1 && m0 >= row_end {
        drain_stages(pipe, k_steps, |_s, _k| {});
    } else {
        let mut acc0 = Tile::<f32, 64, BN>::zeros();
        let mut acc1 = Tile::<f32, 64, BN>::zeros();
        gemm_mma_pair::<KN>(&mut acc0, &mut acc1, sa, sb, pipe, row, k_steps);
        gemm_epilogue_store::<BOUNDED>(acc0, c, sc, bt, bb, m0, n0, row_end, epilogue);
        gemm_epilogue_store::<BOUNDED>(acc1, c, sc, bt, bb, m0 + 64, n0, row_end, epilogue);
    }
}

/// Slot `slot` of a grouped GEMM's rows, in tiles of `bm` rows: `(group, first row, row end)`.
/// Group `g` owns the rows `ends[g − 1]..ends[g]` (`ends[−1]` = 0; each clamped into
/// `0..=rows`, so that no input makes a tile outside C) and the slots from `g + ⌊ends[g − 1] /
/// bm⌋` up to the next group's first — at least as many as its tiles (one spare at most), so
/// slots need no prefix sum and number `groups + ⌊rows / bm⌋` in all; a slot past its group's
/// tiles has its first row at or past the end (an empty tile). The group is found by a binary
/// search over `ends` (⌈log₂ groups⌉ loads; at most 2¹⁶ groups).
#[device]
pub fn group_slot(ends: Global<i32, 1>, slot: i32, rows: i32, bm: i32) -> (i32, i32, i32) {
    let mut lo = 0;
    let mut hi = ends.dim(0);
    for _step in 0..16 {
        if hi - lo > 1 {
            let mid = (lo + hi) / 2;
            let start = min(max(ends.get([mid - 1]), 0), rows);
            if mid + start / bm <= slot {
                lo = mid;
            } else {
                hi = mid;
            }
        }
    }
    let mut start = 0;
    if lo > 0 {
        start = min(max(ends.get([lo - 1]), 0), rows);
    }
    let end = min(max(ends.get([lo]), start), rows);
    (lo, start + (slot - lo - start / bm) * bm, end)
}

/// The tile columns of tile row `tm` (128 rows) that meet C's lower triangle (`upper` 0: some
/// element with column ≤ row) or upper one (1: column ≥ row), among `tiles_n` columns of `bn`:
/// `(first, count)`.
#[device]
pub fn triangle_row(tm: i32, tiles_n: i32, bn: i32, upper: i32) -> (i32, i32) {
    let mut first = 0;
    let mut count = min((tm * 128 + 127) / bn + 1, tiles_n);
    if upper == 1 {
        first = min((tm * 128) / bn, tiles_n);
        count = tiles_n - first;
    }
    (first, count)
}

/// How many 128×`bn` tiles of a `tiles_m` × `tiles_n` grid meet one triangle of C
/// ([`triangle_row`]'s, summed).
#[device]
pub fn triangle_tiles(tiles_m: i32, tiles_n: i32, bn: i32, upper: i32) -> i32 {
    let mut total = 0;
    for r in 0..tiles_m {
        let (_first, count) = triangle_row(r, tiles_n, bn, upper);
        total = total + count;
    }
    total
}

/// Tile `tile` of the tiles that meet one triangle of C, row by row, `per_batch`
/// ([`triangle_tiles`]) a batch entry: its batch, tile row and tile column.
#[device]
pub fn triangle_tile(tile: i32, per_batch: i32, tiles_m: i32, tiles_n: i32, bn: i32, upper: i32) -> (i32, i32, i32) {
    let mut left = tile % per_batch;
    let mut tm = 0;
    let mut tn = 0;
    for r in 0..tiles_m {
        let (first, count) = triangle_row(r, tiles_n, bn, upper);
        if left >= 0 && left < count {
            tm = r;
            tn = first + left;
        }
        left = left - count;
    }
    (tile / per_batch, tm, tn)
}

/// The library's portable GEMM (sm_90a and sm_80: TMA or cp.async, wgmma or mma.sync),
/// `C = epilogue(A·B)`: A `[batch, M, K]`, B `[batch, N, K]` (`KN` 0: `sb` a 128×64 ring) or
/// `[batch, K, N]` (`KN` 1: `sb` 64×128), C `[batch, M, N]` in a dtype `U` of its own (an fp8
/// type too, where the target casts to it); 128×128 tiles over a grid-stride loop of any grid,
/// launched with three warpgroups. The consumers hand `epilogue(acc, batch, row, col)` each
/// 64×16 chunk of the accumulator with its origin in C and store what it returns, cast to `U`,
/// directly (no staging: every element once).
#[device]
#[allow(clippy::too_many_arguments)]
pub fn gemm_portable<const KN: usize, T, U, const SR: usize, const SC: usize>(
    a: Global<T, 3>, b: Global<T, 3>, c: Global<U, 3>, sa: Smem<T, 128, 64>, sb: Smem<T, SR, SC>, pipe: Pipeline<4>,
    epilogue: impl Fn(Tile<f32, 64, 16>, i32, i32, i32) -> Tile<f32, 64, 16>,
) {
    let k_steps = (a.dim(2) + 63) / 64;
    let tiles_m = (c.dim(1) + 127) / 128;
    let tiles_n = (c.dim(2) + 127) / 128;
    let per_batch = tiles_m * tiles_n;
    let group = 8 * tiles_n;
    if warpgroup::id() == 0 {
        setmaxnreg(40);
        for tile in (block::id_x()..per_batch * c.dim(0)).step_by(grid::dim_x()) {
            let (bt, tm, tn) = grouped_tile(tile, per_batch, tiles_m, group);
            gemm_load::<KN>(a, b, sa, sb, pipe, bt, tm * 128, tn * 128, k_steps);
        }
    } else {
        setmaxnreg(232);
        let row = (warpgroup::id() - 1) * 64;
        let mut acc = Tile::<f32, 64, 128>::zeros();
        for tile in (block::id_x()..per_batch * c.dim(0)).step_by(grid::dim_x()) {
            let (bt, tm, tn) = grouped_tile(tile, per_batch, tiles_m, group);
            let m0 = tm * 128 + row;
            let n0 = tn * 128;
            gemm_mma::<KN>(&mut acc, sa, sb, pipe, row, 0, k_steps);
            #[unroll]
            for j in 0..8 {
                let n = n0 + j * 16;
                c.store([bt, m0, n], epilogue(acc.cols(j * 16, 16), bt, m0, n).cast::<U>());
            }
        }
    }
}

/// The built-in GEMM epilogue: `act(x + bias)`, the bias and activation as [`add_bias`] and
/// [`activate`] take them, for the chunk at row `m0`, column `n`.
#[device]
pub fn bias_act<T, const R: usize, const W: usize>(
    x: Tile<f32, R, W>, bias: Global<T, 1>, kind: i32, act: i32, m0: i32, n: i32,
) -> Tile<f32, R, W> {
    let mut out = x;
    add_bias(&mut out, bias, kind, n, m0);
    activate(&mut out, act);
    out
}

/// `x · Φ(x)` with GELU's tanh approximation.
#[device]
pub fn gelu_tanh<const R: usize, const W: usize>(x: Tile<f32, R, W>) -> Tile<f32, R, W> {
    0.5 * x * (1.0 + tanh(0.7978845608 * (x + 0.044715 * x * x * x)))
}

/// `x · Φ(x)`, Φ through `erf`.
#[device]
pub fn gelu_erf<const R: usize, const W: usize>(x: Tile<f32, R, W>) -> Tile<f32, R, W> {
    0.5 * x * (1.0 + erf(x * 0.70710678118))
}

/// `log(1 + eˣ)` without overflow: `max(x, 0) + log(1 + e^−|x|)`.
#[device]
pub fn softplus<const R: usize, const W: usize>(x: Tile<f32, R, W>) -> Tile<f32, R, W> {
    max(x, 0.0) + log2(1.0 + exp2(abs(x) * -f32::consts::LOG2_E)) * f32::consts::LN_2
}

/// `1 / (1 + e^−x)`, the reciprocal as `rsqrt(·)²`: two MUFU operations, not a division's
/// range check and slow path (an f32 `/` is IEEE-rounded); within a few ulp, 0 where `e^−x`
/// overflows.
#[device]
pub fn sigmoid<const R: usize, const W: usize>(x: Tile<f32, R, W>) -> Tile<f32, R, W> {
    let r = rsqrt(1.0 + exp2(x * -1.4426950408889634));
    r * r
}

/// `x · sigmoid(x)`.
#[device]
pub fn silu<const R: usize, const W: usize>(x: Tile<f32, R, W>) -> Tile<f32, R, W> {
    x * sigmoid(x)
}

/// The GEMM epilogue's bias: `kind` 1 adds `bias[n..n + W]` to every row, 2 adds
/// `bias[m0..m0 + R]` to every column, 0 nothing.
#[device]
pub fn add_bias<T, const R: usize, const W: usize>(out: &mut Tile<f32, R, W>, bias: Global<T, 1>, kind: i32, n: i32, m0: i32) {
    if kind == 1 {
        *out = *out + bias.load::<Tile<T, 1, W>>([n]).cast::<f32>();
    }
    if kind == 2 {
        *out = *out + bias.load::<Tile<T, R, 1>>([m0]).cast::<f32>();
    }
}

/// The GEMM epilogue's activation: `act` 1 GELU (tanh), 2 GELU (erf), 3 SiLU, 0 none.
#[device]
pub fn activate<const R: usize, const W: usize>(out: &mut Tile<f32, R, W>, act: i32) {
    if act == 1 {
        *out = gelu_tanh(*out);
    }
    if act == 2 {
        *out = gelu_erf(*out);
    }
    if act == 3 {
        *out = silu(*out);
    }
}

/// Stores a 64×64 chunk of C at `[bt, m0, n]` through shared memory: waits until the TMA store
/// that last read buffer `buf` of `sc` has (one store may stay in flight), writes the chunk
/// there in `T`, and stores it by TMA. End the kernel's stores with `tma::store_wait(0)`.
#[device]
pub fn stage_store<T>(c: Global<T, 3>, sc: Smem<T, 64, 64>, out: Tile<f32, 64, 64>, buf: i32, bt: i32, m0: i32, n: i32) {
    tma::store_wait(1);
    sc.at(buf).store(out.cast::<T>());
    tma::store(c, [bt, m0, n], sc.at(buf));
}

// ---------------------------------------------------------------------------------------
// Scans: combines for `tile_scan::<F>(x, axis, identity)` (and `tile_scan_exclusive`), and
// scans built on them.

/// `a + b`: a running sum, `tile_scan::<scan_add>(x, 1, 0.0)`.
#[device]
pub fn scan_add<const M: usize, const N: usize>(a: Tile<f32, M, N>, b: Tile<f32, M, N>) -> Tile<f32, M, N> {
    a + b
}

/// `a · b`: a running product, identity 1.
#[device]
pub fn scan_mul<const M: usize, const N: usize>(a: Tile<f32, M, N>, b: Tile<f32, M, N>) -> Tile<f32, M, N> {
    a * b
}

/// `max(a, b)`: a running maximum, identity `f32::NEG_INFINITY`.
#[device]
pub fn scan_max<const M: usize, const N: usize>(a: Tile<f32, M, N>, b: Tile<f32, M, N>) -> Tile<f32, M, N> {
    max(a, b)
}

/// `min(a, b)`: a running minimum, identity `f32::INFINITY`.
#[device]
pub fn scan_min<const M: usize, const N: usize>(a: Tile<f32, M, N>, b: Tile<f32, M, N>) -> Tile<f32, M, N> {
    min(a, b)
}

/// The combine of the linear recurrence `h_t = a_t · h_{t−1} + b_t`, on pairs `(a, b)`: the
/// earlier pair `(a1, b1)` then the later `(a2, b2)` give `(a1 · a2, a2 · b1 + b2)`, identity
/// `(1, 0)`. `tile_scan::<scan_linear>((a, b), 1, (1.0, 0.0))` gives, for each `t`, the
/// product of `a` up to `t` and `h_t` from `h_{-1} = 0`.
#[device]
pub fn scan_linear<const M: usize, const N: usize>(
    a1: Tile<f32, M, N>, b1: Tile<f32, M, N>, a2: Tile<f32, M, N>, b2: Tile<f32, M, N>,
) -> (Tile<f32, M, N>, Tile<f32, M, N>) {
    (a1 * a2, a2 * b1 + b2)
}

/// One chunk of a running sum along each row: the chunk's cumulative sums plus `carry` (the
/// sum of the chunks before, `M×1`), which then grows by the chunk's total. Start the carry as
/// `Tile::<f32, M, N>::zeros().last_col()` (the layout this gives back), not as an `M×1` tile
/// of its own, which each call would move between layouts through shared memory.
#[device]
pub fn cumsum_chunk<const M: usize, const N: usize>(x: Tile<f32, M, N>, carry: &mut Tile<f32, M, 1>) -> Tile<f32, M, N> {
    let s = tile_scan::<scan_add>(x, 1, 0.0) + *carry;
    *carry = s.last_col();
    s
}

/// One chunk of the linear recurrence `h_t = a_t · h_{t−1} + b_t` along each row (a selective
/// scan's inner loop): every `h_t` of the chunk from `h`, the chunks before's last state
/// (`M×1`), which then becomes the chunk's last. Out-of-range columns should hold `a = 1`,
/// `b = 0` so that they carry the state through. Start `h` in a chunk's layout, as
/// [`cumsum_chunk`]'s carry.
#[device]
pub fn linear_recurrence_chunk<const M: usize, const N: usize>(
    a: Tile<f32, M, N>, b: Tile<f32, M, N>, h: &mut Tile<f32, M, 1>,
) -> Tile<f32, M, N> {
    let (pa, pb) = tile_scan::<scan_linear>((a, b), 1, (1.0, 0.0));
    let out = pa * *h + pb;
    *h = out.last_col();
    out
}

/// A depthwise (per-channel) correlation along the steps of `x` `[batch, channels, steps]`:
/// `Σ_k w[h, k′]·x[b, h, t + k]` for the tile of channels `h0..h0 + R` and steps `t0..t0 + W`,
/// over the taps `k < K = w.dim(1)` of `w` `[channels, K]` (`k′ = k`, or `K − 1 − k` with
/// `reverse` 1, which makes it a convolution). Steps and channels outside `x` read zeros, so a
/// causal convolution starts its tile `K − 1` steps back. `conv1d_direct` is this plus its
/// epilogue; a kernel of yours can add its own.
#[device]
pub fn depthwise_conv<T, const R: usize, const W: usize>(
    x: Global<T, 3>, w: Global<f32, 2>, b: i32, h0: i32, t0: i32, reverse: i32,
) -> Tile<f32, R, W> {
    let taps = w.dim(1);
    let mut acc = Tile::<f32, R, W>::zeros();
    for k in 0..taps {
        let tap = k + reverse * (taps - 1 - 2 * k);
        let xs: Tile<T, R, W> = x.load([b, h0, t0 + k]);
        acc = acc + xs.cast::<f32>() * w.load::<Tile<f32, R, 1>>([h0, tap]);
    }
    acc
}

/// [`depthwise_conv`] for short filters, in registers: `Σ_k w[h, k′]·x[t + shift + k]` for the
/// tile `cur` (`x`'s steps `t0..t0 + W` in f32) from it and its neighbours `prev` (the `W`
/// steps before) and `next` (after), each tap a funnel shift of that window (`cur.shift_cols(e,
/// prev)`: shuffles where a row lies in one warp's lanes, no memory). The taps' offsets
/// `shift..shift + Lk` must lie within `−8..=8` (others add nothing). A block walking along the
/// steps carries the window from tile to tile (`conv1d_short`).
///
/// `K` and `P`, where `K > 0`, fix the filter's length (`Lk = K`) and its first offset (`shift =
/// P − 8`) at compile time: the taps outside fold away, no branch is left a tile (a kernel's
/// `tune` knob, the host picking the variant that matches); `K = 0` takes both from `w` and
/// `shift` at run time.
#[device]
#[allow(clippy::too_many_arguments)]
pub fn depthwise_conv_short<const R: usize, const W: usize, const K: usize, const P: usize>(
    prev: Tile<f32, R, W>, cur: Tile<f32, R, W>, next: Tile<f32, R, W>, w: Global<f32, 2>, h0: i32, shift: i32, reverse: i32,
) -> Tile<f32, R, W> {
    let taps = w.dim(1);
    let mut acc = Tile::<f32, R, W>::zeros();
    // Offsets −8..−1: the window reaches into `prev`.
    #[unroll]
    for e in 1..9 {
        let k = -e - shift;
        if K == 0 && k >= 0 && k < taps || K > 0 && 8 - e >= P && 8 - e < P + K {
            acc = acc + cur.shift_cols(e, prev) * w.load::<Tile<f32, R, 1>>([h0, k + reverse * (taps - 1 - 2 * k)]);
        }
    }
    // Offsets 0..8: into `next`.
    #[unroll]
    for e in 0..9 {
        let k = e - shift;
        if K == 0 && k >= 0 && k < taps || K > 0 && e + 8 >= P && e + 8 < P + K {
            acc = acc + cur.shift_cols(-e, next) * w.load::<Tile<f32, R, 1>>([h0, k + reverse * (taps - 1 - 2 * k)]);
        }
    }
    acc
}
