//! Causal linear attention, chunked, with an optional scalar decay a step (RetNet's constant
//! one, or a data-dependent gate as in simple GLA and Mamba-2's SSD): per (batch, head),
//!
//! ```text
//! H_t = exp(g_t)·H_{t−1} + β_t·k_tᵀ·v_t          (H: [DK, DV], f32)
//! o_t = scale · q_t·H_t
//! ```
//!
//! from `H_{−1}` zero or given, the last `H` kept on request. A block takes one (batch, head)
//! — or two value heads of 64 columns that share their q and k heads, a consumer each
//! ([`block_heads`]) — and walks its sequence once in chunks of 64 steps. A producer warpgroup streams each
//! chunk's Q, K, V by TMA through a two-stage ring; `DV / 64` consumer warpgroups each own 64
//! of V's columns, and so 64 columns of `H` (in registers, f32) and of the output. With `G`
//! the chunk's running sum of `g` (from `chunk_decay_sums`, a pass before; so `G_i − G_j` is the decay from step `j` to `i`):
//!
//! - `S = Q·Kᵀ` and `Q·H` (H of the chunks before, held in shared memory in 16 bits) by wgmma;
//! - `P = S ∘ exp(G_i − G_j) ∘ β_j` on `j ≤ i`, zero above the diagonal (registers);
//! - `O = exp(G_i)·Q·H + P·V` (P from registers as wgmma's A);
//! - `H ← exp(G_last)·H + Kᵀ·(w ∘ V)`, `w_j = exp(G_last − G_j)·β_j`: K enters the MMA
//!   transposed as it arrived (`sk.at(s).t()`), `w ∘ V` is written to shared memory first
//!   (V itself where there is neither decay nor β);
//! - `O·scale` through `epilogue(chunk, plane, row, col)` (the SSD's `D·x` skip, say) and out
//!   by TMA.
//!
//! Tensors are rank-3 views `[planes, T, cols]`: `[batch·heads, T, d]` (`bhtd` 1) or
//! `[batch, T, heads·d]` (`bhtd` 0); query head `h / q_group` and key head `h / k_group` serve
//! value head `h` (Mamba-2's groups of B and C). `g` and `β` are f32 `[batch·heads, T]`, given
//! twice: as rows (`[.., T]`) and as columns (`[.., T, 1]`), as the two sides of `G_i − G_j`
//! read them.

use crate::prelude::{drain_stages, fill_stages, scan_add, stage_store};
use tessera::{device, kernel};

/// Where head `h` of batch `b` lies in a rank-3 view: its plane and first column.
#[device]
pub fn head_origin(b: i32, h: i32, heads: i32, width: i32, bhtd: i32) -> (i32, i32) {
    let mut plane = b;
    let mut col = h * width;
    if bhtd == 1 {
        plane = b * heads + h;
        col = 0;
    }
    (plane, col)
}

/// A block's heads and the first of them, as its (batch·head) index `first`, batch `b` and
/// head `h`: one head a block, or with `pair` 1 two consecutive value heads of 64 columns each
/// (one a consumer warpgroup, both served by the same q and k heads).
#[device]
pub fn block_heads(heads: i32, pair: i32) -> (i32, i32, i32) {
    let first = block::id_x() * (1 + pair);
    let b = first / heads;
    (first, b, first - b * heads)
}

/// Where a block's q, k and v start, as planes and first columns: those of head `h`, v's
/// `DV` columns being the one head's or a pair's two 64-column heads side by side.
#[device]
#[allow(clippy::too_many_arguments)]
pub fn block_origins<const DK: usize, const DV: usize>(
    b: i32, h: i32, heads: i32, q_group: i32, k_group: i32, bhtd: i32, pair: i32,
) -> (i32, i32, i32, i32, i32, i32) {
    let (qp, qc) = head_origin(b, h / q_group, heads / q_group, DK, bhtd);
    let (kp, kc) = head_origin(b, h / k_group, heads / k_group, DK, bhtd);
    let (vp, vc) = head_origin(b, h, heads, DV / (1 + pair), bhtd);
    (qp, qc, kp, kc, vp, vc)
}

/// Consumer `me`'s own head, from its block's first (`first`, head `h`): its (batch·head)
/// index, head, and first column in the per-head state tensors (`[batch·heads, DK, d]`). One
/// head a block: the block's, columns `me·64` on. A pair: head `me` of the two, whole.
#[device]
pub fn consumer_head(first: i32, h: i32, me: i32, pair: i32) -> (i32, i32, i32) {
    (first + me * pair, h + me * pair, me * 64 * (1 - pair))
}

/// A producer's walk over the chunks of one (batch, head): chunk `c` (or `chunks − 1 − c` with
/// `reverse`) of Q and K into `sq`, `sk`, of V into `sv` (its 64-column halves one above the
/// other), and whatever `more(stage, chunk)` loads (a backward's dO) into the same stage.
#[device]
#[allow(clippy::too_many_arguments)]
pub fn load_chunks<T, const DK: usize, const DV: usize>(
    pipe: Pipeline<2>, sq: Smem<T, 64, DK>, sk: Smem<T, 64, DK>, sv: Smem<T, DV, 64>, q: Global<T, 3>, k: Global<T, 3>, v: Global<T, 3>,
    qp: i32, qc: i32, kp: i32, kc: i32, vp: i32, vc: i32, chunks: i32, reverse: i32, more: impl Fn(i32, i32),
) {
    setmaxnreg(40);
    fill_stages(pipe, chunks, |s, i| {
        let mut c = i;
        if reverse == 1 {
            c = chunks - 1 - i;
        }
        tma::load(sq.at(s), q, [qp, c * 64, qc], pipe);
        tma::load(sk.at(s), k, [kp, c * 64, kc], pipe);
        #[unroll]
        for j in 0..DV / 64 {
            tma::load(sv.at(s).rows(j * 64, 64), v, [vp, c * 64, vc + j * 64], pipe);
        }
        more(s, c);
    });
}

/// The decay's running sums over each 64-step chunk, in log₂ units, for the kernels below:
/// `gs[r, c·64 + i] = log₂e · Σ_{j ≤ i} g[r, c·64 + j]` (`g` `[rows, T]`, `gs` `[rows, chunks·64]`),
/// the last chunk's tail past `T` holding its last sum. A block scans one chunk of 16 rows.
#[kernel]
pub fn chunk_decay_sums(g: Global<f32, 2>, gs: Global<f32, 2>) {
    let t0 = block::id_x() * 64;
    let r0 = block::id_y() * 16;
    gs.store([r0, t0], tile_scan::<scan_add>(g.load::<Tile<f32, 16, 64>>([r0, t0]), 1, 0.0) * f32::consts::LOG2_E);
}

/// A chunk's decay from step `t0` on, in log₂ units, from [`chunk_decay_sums`]' `gs` (read as
/// rows, `g`, and as columns, `gc`): `G` along a row (`gr`, one per column) and down a column
/// (`gcol`, one per row), the decay from each step to the chunk's end `exp(G_last − G_j)`
/// (`wl`, per row) and over the whole chunk `exp(G_last)`. Without a decay (`has_g` 0): zeros
/// and ones.
#[device]
pub fn chunk_decay(
    g: Global<f32, 2>, gc: Global<f32, 3>, bh: i32, t0: i32, has_g: i32,
) -> (Tile<f32, 1, 64>, Tile<f32, 64, 1>, Tile<f32, 64, 1>, Tile<f32, 1, 1>) {
    let mut gr = Tile::<f32, 1, 64>::zeros();
    let mut gcol = Tile::<f32, 64, 1>::zeros();
    let mut wl = Tile::<f32, 64, 1>::full(1.0);
    let mut last = Tile::<f32, 1, 1>::full(1.0);
    if has_g == 1 {
        gr = g.load::<Tile<f32, 1, 64>>([bh, t0]);
        gcol = gc.load::<Tile<f32, 64, 1>>([bh, t0, 0]);
        let gl = g.load::<Tile<f32, 1, 1>>([bh, t0 + 63]);
        wl = exp2(gl - gcol);
        last = exp2(gl);
    }
    (gr, gcol, wl, last)
}

/// Scores `[i, j]` (query step i, key step j) of a chunk weighted as the recurrence weighs
/// them: `exp(G_i − G_j)` with a decay, `β_j` with a β, zero where `j > i`. The broadcasts
/// take the scores' own layout (an accumulator's, for the MMA that reads the result).
#[device]
#[allow(clippy::too_many_arguments)]
pub fn causal_weights(
    x: Tile<f32, 64, 64>, gr: Tile<f32, 1, 64>, gcol: Tile<f32, 64, 1>, beta: Global<f32, 2>, bh: i32, t0: i32, has_g: i32, has_beta: i32,
) -> Tile<f32, 64, 64> {
    let mut p = x;
    if has_g == 1 {
        p = p * exp2(min(gcol - (Tile::<f32, 64, 64>::zeros() + gr), 0.0));
    }
    if has_beta == 1 {
        p = p * beta.load::<Tile<f32, 1, 64>>([bh, t0]);
    }
    p.mask_cols(Tile::<f32, 64, 1>::row_index() + 1.0, 0.0)
}

/// The transposed form of [`causal_weights`] without β: `[j, i]` weighted by `exp(G_i −
/// G_j)`, zero where `i < j`.
#[device]
pub fn causal_weights_t(x: Tile<f32, 64, 64>, gr: Tile<f32, 1, 64>, gcol: Tile<f32, 64, 1>, has_g: i32) -> Tile<f32, 64, 64> {
    let mut p = x;
    if has_g == 1 {
        p = p * exp2(min((Tile::<f32, 64, 64>::zeros() + gr) - gcol, 0.0));
    }
    p * step(Tile::<f32, 64, 64>::col_index() - Tile::<f32, 64, 1>::row_index())
}

/// `a ← exp(G_last)·a + Xᵀ·(w ∘ Y)` for a chunk: `x` (K×M, the chunk's steps down its rows,
/// taken transposed by the MMA) against 64 columns of the chunk in shared memory (rows `row..
/// row + 64` of stage `stage` of `y`), or against `w ∘ Y` written to the same rows of `sw`
/// first when `scaled` is not 0 (Y read back from its stage). The forward's state update (X =
/// K, Y = V, w = β·exp(G_last − G_j)) and the backward's (X = Q, Y = dO, w = scale·exp(G_j)).
/// Issues the MMA; the caller waits.
#[device]
#[allow(clippy::too_many_arguments)]
pub fn add_outer<T, const M: usize, const YR: usize>(
    a: &mut Tile<f32, M, 64>, x: Smem<T, 64, M>, y: Smem<T, YR, 64>, sw: Smem<T, YR, 64>, stage: i32, row: i32, w: Tile<f32, 64, 1>,
    last: Tile<f32, 1, 1>, has_g: i32, scaled: i32,
) {
    if has_g == 1 {
        *a = *a * last;
    }
    if scaled > 0 {
        sw.at(0).rows(row, 64).store((y.at(stage).rows(row, 64).load().cast::<f32>() * w).cast::<T>());
        mma_sync_kn(a, x.at(stage).t(), sw.at(0).rows(row, 64));
    } else {
        mma_sync_kn(a, x.at(stage).t(), y.at(stage).rows(row, 64));
    }
}

/// The chunked causal linear attention of one (batch, head) per block (see the module's
/// notes), with Mamba-2's skip `D_h·v` added where `has_d` is 1 (`dskip` one f32 a head; v's
/// chunk read back from shared memory) and then `epilogue(chunk, plane, row, col)` on each
/// 64×64 piece of the output before it is stored. Launched with `1 + DV / 64` warpgroups, a
/// block per (batch, head) or pair of heads ([`block_heads`]).
#[device]
#[allow(clippy::too_many_arguments)]
pub fn linear_attention_blocks<T, const DK: usize, const DV: usize>(
    q: Global<T, 3>, k: Global<T, 3>, v: Global<T, 3>, g: Global<f32, 2>, gc: Global<f32, 3>, beta: Global<f32, 2>, betac: Global<f32, 3>,
    h0: Global<f32, 3>, o: Global<T, 3>, h_last: Global<f32, 3>, dskip: Global<f32, 1>, heads: i32, q_group: i32, k_group: i32, bhtd: i32,
    has_g: i32, has_beta: i32, has_h0: i32, keep_h: i32, has_d: i32, gv: Global<f32, 2>, has_gv: i32, pair: i32, scale: f32,
    epilogue: impl Fn(Tile<f32, 64, 64>, i32, i32, i32) -> Tile<f32, 64, 64>,
) {
    let sq = Smem::<T, 64, DK>::ring(2);
    let sk = Smem::<T, 64, DK>::ring(2);
    let sv = Smem::<T, DV, 64>::ring(2);
    let sw = Smem::<T, DV, 64>::ring(1);
    let sh = Smem::<T, { DK * (DV / 64) }, 64>::ring(1);
    let so = Smem::<T, 64, 64>::ring({ 2 * (DV / 64) });
    let pipe = Pipeline::<2>::new({ DV / 64 });
    let (first, b, h) = block_heads(heads, pair);
    let chunks = (q.dim(1) + 63) / 64;
    let (qp, qc, kp, kc, vp, vc) = block_origins::<DK, DV>(b, h, heads, q_group, k_group, bhtd, pair);
    if warpgroup::id() == 0 {
        load_chunks::<T, DK, DV>(pipe, sq, sk, sv, q, k, v, qp, qc, kp, kc, vp, vc, chunks, 0, |_, _| {});
    } else {
        setmaxnreg(232);
        let me = warpgroup::id() - 1;
        let col = me * 64;
        let (bh, h, scol) = consumer_head(first, h, me, pair);
        let mut d_h = 0.0;
        if has_d == 1 {
            d_h = dskip.get([h]);
        }
        // This consumer's 64 columns of the state, f32 in registers (loaded straight into the
        // accumulator's layout), and its 16-bit copy for the next chunk's queries.
        let mut hs = Tile::<f32, DK, 64>::zeros();
        if has_h0 == 1 {
            hs = hs + h0.load::<Tile<f32, DK, 64>>([bh, 0, scol]);
        }
        sh.at(0).rows(me * DK, DK).store(hs.cast::<T>());
        drain_stages(pipe, chunks, |s, c| {
            let t0 = c * 64;
            // The chunk's scores and its queries against the state of the chunks before.
            let mut sc = Tile::<f32, 64, 64>::zeros();
            mma_sync(sc, sq.at(s), sk.at(s));
            let mut out = Tile::<f32, 64, 64>::zeros();
            mma_sync_kn(out, sq.at(s), sh.at(0).rows(me * DK, DK));
            let (gr, gcol, wl, last) = chunk_decay(g, gc, bh, t0, has_g);
            let mut ws = wl;
            if has_beta == 1 {
                ws = ws * betac.load::<Tile<f32, 64, 1>>([bh, t0, 0]);
            }
            mma_wait(0);
            let p = causal_weights(sc, gr, gcol, beta, bh, t0, has_g, has_beta);
            if has_g == 1 {
                out = out * exp2(gcol);
            }
            mma_sync_kn(out, p.cast::<T>(), sv.at(s).rows(col, 64));
            // The state: decayed, plus Kᵀ·(w ∘ V) of this chunk.
            add_outer(&mut hs, sk, sv, sw, s, col, ws, last, has_g, has_g + has_beta);
            mma_wait(0);
            if has_gv == 1 {
                // Per-channel gates (q and k prepared by `gla_prepare`): each key channel's
                // decay over the chunk, exp(G_last), on its row of the state.
                hs = hs * gv.load::<Tile<f32, DK, 1>>([((b * (heads / k_group) + h / k_group) * chunks + c) * DK, 0]);
            }
            sh.at(0).rows(me * DK, DK).store(hs.cast::<T>());
            let mut y = out * scale;
            if has_d == 1 {
                y = y + sv.at(s).rows(col, 64).load().cast::<f32>() * d_h;
            }
            stage_store(o, so, epilogue(y, vp, t0, vc + col), me * 2 + c % 2, vp, t0, vc + col);
        });
        if keep_h == 1 {
            h_last.store([bh, 0, scol], hs);
        }
        tma::store_wait(0);
    }
}
/// The sum of the `DV / 64` consumers' partial tiles (their shares of a sum over V's columns),
/// valid in consumer 0: consumer 1's share crosses through `sx` between named barriers 0 (it is
/// stored) and 1 (consumer 0 has read it; consumer 0 arrives there once before its first chunk,
/// consumer 1 waits there once after its last).
#[device]
pub fn sum_consumers<const DK: usize, const DV: usize>(x: Tile<f32, 64, DK>, sx: Smem<f32, 64, DK>, me: i32) -> Tile<f32, 64, DK> {
    let mut total = x;
    if DV == 128 {
        if me == 1 {
            barrier::sync(1, 2);
            sx.at(0).store(x);
            barrier::arrive(0, 2);
        } else {
            barrier::sync(0, 2);
            total = x + sx.at(0).load();
            barrier::arrive(1, 2);
        }
    }
    total
}

/// Where a key or query gradient goes once summed over the consumers: straight into the 16-bit
/// tensor `direct`, or, where a head serves several (`grouped`), added into the f32 `acc`.
#[device]
pub fn put_gradient<T, const DK: usize>(
    total: Tile<f32, 64, DK>, direct: Global<T, 3>, acc: Global<f32, 3>, plane: i32, t0: i32, col: i32, grouped: i32,
) {
    if grouped == 1 {
        acc.atomic_add([plane, t0, col], total);
    } else {
        direct.store([plane, t0, col], total.cast::<T>());
    }
}

/// The backward's first walk, forward over the chunks of one (batch, head) per block: the
/// state `H` rebuilt as the forward builds it, and with it the queries' gradient
/// `dQ = scale·[(dO·Vᵀ ∘ weights)·K + exp(G_i)·dO·H_prevᵀ]`, the consumers' parts (their 64
/// of V's columns each) summed in shared memory and stored once ([`put_gradient`]); with a
/// decay, its share of `dg` added in (the chunk's own pairs of steps and its queries against
/// the state before it) and each chunk's starting state kept in `hsave` (16-bit).
#[device]
#[allow(clippy::too_many_arguments)]
pub fn linear_attention_dq_blocks<T, const DK: usize, const DV: usize>(
    q: Global<T, 3>, k: Global<T, 3>, v: Global<T, 3>, dout: Global<T, 3>, g: Global<f32, 2>, gc: Global<f32, 3>, beta: Global<f32, 2>,
    betac: Global<f32, 3>, h0: Global<f32, 3>, dq: Global<T, 3>, dq32: Global<f32, 3>, dg: Global<f32, 2>, hsave: Global<T, 3>, heads: i32,
    q_group: i32, k_group: i32, bhtd: i32, has_g: i32, has_beta: i32, has_h0: i32, gv: Global<f32, 2>, has_gv: i32, pair: i32, scale: f32,
) {
    let sx = Smem::<f32, 64, DK>::ring(1);
    let su = Smem::<T, 64, 64>::ring(1);
    let sq = Smem::<T, 64, DK>::ring(2);
    let sk = Smem::<T, 64, DK>::ring(2);
    let sv = Smem::<T, DV, 64>::ring(2);
    let sdo = Smem::<T, DV, 64>::ring(2);
    let sw = Smem::<T, DV, 64>::ring(1);
    let sh = Smem::<T, { DK * (DV / 64) }, 64>::ring(1);
    let pipe = Pipeline::<2>::new({ DV / 64 });
    let (first, b, h) = block_heads(heads, pair);
    let chunks = (q.dim(1) + 63) / 64;
    let (qp, qc, kp, kc, vp, vc) = block_origins::<DK, DV>(b, h, heads, q_group, k_group, bhtd, pair);
    if warpgroup::id() == 0 {
        load_chunks::<T, DK, DV>(pipe, sq, sk, sv, q, k, v, qp, qc, kp, kc, vp, vc, chunks, 0, |s, c| {
            #[unroll]
            for j in 0..DV / 64 {
                tma::load(sdo.at(s).rows(j * 64, 64), dout, [vp, c * 64, vc + j * 64], pipe);
            }
        });
    } else {
        setmaxnreg(232);
        let me = warpgroup::id() - 1;
        let col = me * 64;
        let (bh, h, scol) = consumer_head(first, h, me, pair);
        let mut hs = Tile::<f32, DK, 64>::zeros();
        if has_h0 == 1 {
            hs = hs + h0.load::<Tile<f32, DK, 64>>([bh, 0, scol]);
        }
        sh.at(0).rows(me * DK, DK).store(hs.cast::<T>());
        // U_jt = [j < t], 16-bit, for dg's row sums: consumer 0 writes it, both wait.
        if me == 0 {
            su.at(0).store(step(Tile::<f32, 64, 64>::col_index() - Tile::<f32, 64, 1>::row_index() - 1.0).cast::<T>());
        }
        if DV == 128 {
            barrier::sync(2, 2);
        }
        if me == 0 {
            barrier::arrive(1, 2);
        }
        drain_stages(pipe, chunks, |s, c| {
            let t0 = c * 64;
            if has_g == 1 {
                // The state before the chunk, for the reverse walk's share of dg.
                hsave.store([bh * chunks + c, 0, scol], hs.cast::<T>());
            }
            let mut dp = Tile::<f32, 64, 64>::zeros();
            mma_sync(dp, sdo.at(s).rows(col, 64), sv.at(s).rows(col, 64));
            let mut dqa = Tile::<f32, 64, DK>::zeros();
            mma_sync(dqa, sdo.at(s).rows(col, 64), sh.at(0).rows(me * DK, DK));
            let mut sc = Tile::<f32, 64, 64>::zeros();
            if has_g == 1 {
                mma_sync(sc, sq.at(s), sk.at(s));
            }
            let (gr, gcol, wl, last) = chunk_decay(g, gc, bh, t0, has_g);
            let mut ws = wl;
            if has_beta == 1 {
                ws = ws * betac.load::<Tile<f32, 64, 1>>([bh, t0, 0]);
            }
            mma_wait(0);
            let p = causal_weights(dp, gr, gcol, beta, bh, t0, has_g, has_beta);
            if has_g == 1 {
                dqa = dqa * exp2(gcol);
                // dg_t, this walk's share: the pairs (i ≥ t > j) of the chunk, each its score
                // times its gradient, and the queries i ≥ t against the state before it (q·dq
                // of that part), each term with its own decay (no difference of near terms).
                // Σ_{j<t} of each row by an MMA with the strictly upper unit triangle.
                let mut pairs = Tile::<f32, 64, 64>::zeros();
                mma_sync_kn(pairs, (sc * p * scale).cast::<T>(), su.at(0));
                let before = row_sum(q.load::<Tile<T, 64, DK>>([qp, t0, qc]).cast::<f32>() * dqa) * scale;
                mma_wait(0);
                // (the mask inside the expression, so that it takes the scores' layout)
                dg.atomic_add(
                    [bh, t0],
                    col_sum((pairs + before) * step(Tile::<f32, 64, 1>::row_index() - Tile::<f32, 64, 64>::col_index())),
                );
            }
            mma_sync_kn(dqa, p.cast::<T>(), sk.at(s));
            add_outer(&mut hs, sk, sv, sw, s, col, ws, last, has_g, has_g + has_beta);
            mma_wait(0);
            if has_gv == 1 {
                // Per-channel gates: the chunk's decay on the state's rows, as the forward; the
                // state after the chunk kept for the gates' gradient.
                hs = hs * gv.load::<Tile<f32, DK, 1>>([((b * (heads / k_group) + h / k_group) * chunks + c) * DK, 0]);
                hsave.store([bh * chunks + c, 0, scol], hs.cast::<T>());
            }
            sh.at(0).rows(me * DK, DK).store(hs.cast::<T>());
            let total = sum_consumers::<DK, DV>(dqa * scale, sx, me);
            if me == 0 {
                put_gradient(total, dq, dq32, qp, t0, qc, min(q_group - 1, 1));
            }
        });
        if DV == 128 {
            if me == 1 {
                barrier::sync(1, 2);
            }
        }
    }
}

/// The backward's second walk, from the last chunk back: the state's gradient `dH` (from
/// `dh_last`, or zero) carried back as `dH ← exp(G_last)·dH + scale·Qᵀ·(exp(G_i) ∘ dO)`, and
/// with it each chunk's `dV = β ∘ [scale·(S ∘ weights)ᵀ·dO + w·K·dH]` (stored), `dK = β ∘
/// [scale·(dP ∘ weights)ᵀ·Q + w·V·dHᵀ]` (the consumers' parts summed, as dQ's), `dβ`
/// (added into `dbeta`), the initial state's gradient at the end; with a decay, its share of
/// `dg` (the chunk's keys against later queries, and the state before the chunk, from the
/// first walk's `hsave`, against them).
#[device]
#[allow(clippy::too_many_arguments)]
pub fn linear_attention_dkv_blocks<T, const DK: usize, const DV: usize>(
    q: Global<T, 3>, k: Global<T, 3>, v: Global<T, 3>, dout: Global<T, 3>, g: Global<f32, 2>, gc: Global<f32, 3>, betac: Global<f32, 3>,
    dh_last: Global<f32, 3>, hsave: Global<T, 3>, dk: Global<T, 3>, dk32: Global<f32, 3>, dv: Global<T, 3>, dbc: Global<f32, 3>,
    dg: Global<f32, 2>, dh0: Global<f32, 3>, heads: i32, q_group: i32, k_group: i32, bhtd: i32, has_g: i32, has_beta: i32, has_dh: i32,
    keep_dh0: i32, gv: Global<f32, 2>, dgl: Global<f32, 2>, has_gv: i32, pair: i32, scale: f32,
) {
    let sx = Smem::<f32, 64, DK>::ring(1);
    let sq = Smem::<T, 64, DK>::ring(2);
    let sk = Smem::<T, 64, DK>::ring(2);
    let sv = Smem::<T, DV, 64>::ring(2);
    let sdo = Smem::<T, DV, 64>::ring(2);
    let sw = Smem::<T, DV, 64>::ring(1);
    let sdh = Smem::<T, { DK * (DV / 64) }, 64>::ring(1);
    let pipe = Pipeline::<2>::new({ DV / 64 });
    let (first, b, h) = block_heads(heads, pair);
    let chunks = (q.dim(1) + 63) / 64;
    let (qp, qc, kp, kc, vp, vc) = block_origins::<DK, DV>(b, h, heads, q_group, k_group, bhtd, pair);
    if warpgroup::id() == 0 {
        load_chunks::<T, DK, DV>(pipe, sq, sk, sv, q, k, v, qp, qc, kp, kc, vp, vc, chunks, 1, |s, c| {
            #[unroll]
            for j in 0..DV / 64 {
                tma::load(sdo.at(s).rows(j * 64, 64), dout, [vp, c * 64, vc + j * 64], pipe);
            }
        });
    } else {
        setmaxnreg(232);
        let me = warpgroup::id() - 1;
        let col = me * 64;
        let (bh, h, scol) = consumer_head(first, h, me, pair);
        // The state's gradient is carried divided by `scale`, so that a chunk adds Qᵀ·dO as
        // the MMA gives it (no scaled copy of dO without a decay); its uses multiply it back.
        let mut dh = Tile::<f32, DK, 64>::zeros();
        if has_dh == 1 {
            dh = dh + dh_last.load::<Tile<f32, DK, 64>>([bh, 0, scol]) * (1.0 / scale);
        }
        sdh.at(0).rows(me * DK, DK).store(dh.cast::<T>());
        if me == 0 {
            barrier::arrive(1, 2);
        }
        drain_stages(pipe, chunks, |s, i| {
            let c = chunks - 1 - i;
            let t0 = c * 64;
            if has_gv == 1 {
                // Per-channel gates: dH is the gradient of the state after the chunk, H_c =
                // D·(H_prev + Kᵀ·V) with D the chunk's decay a row: D ∘ ∂L/∂D = rowsum(dH ∘ H_c)
                // goes to the gates' gradient (at the chunk's last step), and D·dH serves the
                // chunk's keys and the state before it.
                let row = ((b * (heads / k_group) + h / k_group) * chunks + c) * DK;
                // (the load inside the expression, so that it takes dH's layout)
                dgl.atomic_add([row, 0], (dh * hsave.load::<Tile<T, DK, 64>>([bh * chunks + c, 0, scol]).cast::<f32>()).sum(1) * scale);
                dh = dh * gv.load::<Tile<f32, DK, 1>>([row, 0]);
                sdh.at(0).rows(me * DK, DK).store(dh.cast::<T>());
            }
            // dV before β: scale·(S ∘ weights)ᵀ·dO + exp(G_last − G_j)·K·dH (S transposed as
            // K·Qᵀ, so that its rows are the key steps).
            let mut st = Tile::<f32, 64, 64>::zeros();
            mma_sync(st, sk.at(s), sq.at(s));
            let mut dvu = Tile::<f32, 64, 64>::zeros();
            mma_sync_kn(dvu, sk.at(s), sdh.at(0).rows(me * DK, DK));
            let (gr, gcol, wl, last) = chunk_decay(g, gc, bh, t0, has_g);
            mma_wait(0);
            let pt = causal_weights_t(st, gr, gcol, has_g) * scale;
            dvu = dvu * (wl * scale);
            if has_g == 1 {
                // dg_t, this walk's share: the keys j < t against the later queries (through
                // dH) and the state before the chunk against them, each with its own decay.
                let mut kj = row_sum(dvu * sv.at(s).rows(col, 64).load().cast::<f32>());
                if has_beta == 1 {
                    kj = kj * betac.load::<Tile<f32, 64, 1>>([bh, t0, 0]);
                }
                let prior = (dh * hsave.load::<Tile<T, DK, 64>>([bh * chunks + c, 0, scol]).cast::<f32>()).sum(0).sum(1) * scale * last;
                dg.atomic_add(
                    [bh, t0],
                    col_sum(kj * step(Tile::<f32, 64, 64>::col_index() - Tile::<f32, 64, 1>::row_index() - 1.0)) + prior,
                );
            }
            mma_sync_kn(dvu, pt.cast::<T>(), sdo.at(s).rows(col, 64));
            // dK before β, this consumer's part: scale·(dP ∘ weights)ᵀ·Q + w·V·dHᵀ.
            let mut dpt = Tile::<f32, 64, 64>::zeros();
            mma_sync(dpt, sv.at(s).rows(col, 64), sdo.at(s).rows(col, 64));
            let mut dka = Tile::<f32, 64, DK>::zeros();
            mma_sync(dka, sv.at(s).rows(col, 64), sdh.at(0).rows(me * DK, DK));
            mma_wait(0);
            dka = dka * (wl * scale);
            let pk = causal_weights_t(dpt, gr, gcol, has_g) * scale;
            mma_sync_kn(dka, pk.cast::<T>(), sq.at(s));
            // dβ = rowsum(dV ∘ V) and dV (β ∘ it) out, while that MMA runs.
            let mut bc = Tile::<f32, 64, 1>::full(1.0);
            if has_beta == 1 {
                bc = betac.load::<Tile<f32, 64, 1>>([bh, t0, 0]);
                dbc.atomic_add([bh, t0, 0], row_sum(dvu * sv.at(s).rows(col, 64).load().cast::<f32>()));
                dvu = dvu * bc;
            }
            dv.store([vp, t0, vc + col], dvu.cast::<T>());
            mma_wait(0);
            if has_beta == 1 {
                dka = dka * bc;
            }
            let total = sum_consumers::<DK, DV>(dka, sx, me);
            if me == 0 {
                put_gradient(total, dk, dk32, kp, t0, kc, min(k_group - 1, 1));
            }
            // The state's gradient before the chunk (over `scale`): exp(G_last)·dH + Qᵀ·(exp(G_i) ∘ dO).
            add_outer(&mut dh, sq, sdo, sw, s, col, exp2(gcol), last, has_g, has_g);
            mma_wait(0);
            sdh.at(0).rows(me * DK, DK).store(dh.cast::<T>());
        });
        if DV == 128 {
            if me == 1 {
                barrier::sync(1, 2);
            }
        }
        if keep_dh0 == 1 {
            dh0.store([bh, 0, scol], dh * scale);
        }
    }
}

/// Causal linear attention with value head dim 128 (two consumer warpgroups), key head dim
/// `DK` 128 or 64: `linear_attention_blocks` with the identity as its epilogue. With `pair` 1,
/// a block takes two value heads of 64 that share their q and k heads, a consumer each
/// (`[batch, T, heads·64]` views only).
#[kernel(warpgroups = 3, dtypes(T = [bf16, f16]), tune(DK = [128, 64]), targets(sm_90a))]
pub fn linear_attention_fwd(
    q: Global<T, 3>, k: Global<T, 3>, v: Global<T, 3>, g: Global<f32, 2>, gc: Global<f32, 3>, beta: Global<f32, 2>, betac: Global<f32, 3>,
    h0: Global<f32, 3>, o: Global<T, 3>, h_last: Global<f32, 3>, dskip: Global<f32, 1>, gv: Global<f32, 2>, heads: i32, q_group: i32,
    k_group: i32, bhtd: i32, has_g: i32, has_beta: i32, has_h0: i32, keep_h: i32, has_d: i32, has_gv: i32, pair: i32, scale: f32,
) {
    linear_attention_blocks::<T, DK, 128>(
        q,
        k,
        v,
        g,
        gc,
        beta,
        betac,
        h0,
        o,
        h_last,
        dskip,
        heads,
        q_group,
        k_group,
        bhtd,
        has_g,
        has_beta,
        has_h0,
        keep_h,
        has_d,
        gv,
        has_gv,
        pair,
        scale,
        |y, _, _, _| y,
    );
}

/// As `linear_attention_fwd` with value head dim 64 (one consumer warpgroup; `pair` is unused:
/// pairs of 64-column heads run on `linear_attention_fwd`).
#[kernel(warpgroups = 2, dtypes(T = [bf16, f16]), tune(DK = [128, 64]), targets(sm_90a))]
pub fn linear_attention_fwd_v64(
    q: Global<T, 3>, k: Global<T, 3>, v: Global<T, 3>, g: Global<f32, 2>, gc: Global<f32, 3>, beta: Global<f32, 2>, betac: Global<f32, 3>,
    h0: Global<f32, 3>, o: Global<T, 3>, h_last: Global<f32, 3>, dskip: Global<f32, 1>, gv: Global<f32, 2>, heads: i32, q_group: i32,
    k_group: i32, bhtd: i32, has_g: i32, has_beta: i32, has_h0: i32, keep_h: i32, has_d: i32, has_gv: i32, pair: i32, scale: f32,
) {
    linear_attention_blocks::<T, DK, 64>(
        q,
        k,
        v,
        g,
        gc,
        beta,
        betac,
        h0,
        o,
        h_last,
        dskip,
        heads,
        q_group,
        k_group,
        bhtd,
        has_g,
        has_beta,
        has_h0,
        keep_h,
        has_d,
        gv,
        has_gv,
        0,
        scale,
        |y, _, _, _| y,
    );
}

/// The backward's forward walk (`linear_attention_dq_blocks`), value head dim 128 (or, with
/// `pair`, two heads of 64 a block, as `linear_attention_fwd`).
#[kernel(warpgroups = 3, dtypes(T = [bf16, f16]), tune(DK = [128, 64]), targets(sm_90a))]
pub fn linear_attention_bwd_dq(
    q: Global<T, 3>, k: Global<T, 3>, v: Global<T, 3>, dout: Global<T, 3>, g: Global<f32, 2>, gc: Global<f32, 3>, beta: Global<f32, 2>,
    betac: Global<f32, 3>, h0: Global<f32, 3>, dq: Global<T, 3>, dq32: Global<f32, 3>, dg: Global<f32, 2>, hsave: Global<T, 3>, heads: i32,
    q_group: i32, k_group: i32, bhtd: i32, has_g: i32, has_beta: i32, has_h0: i32, gv: Global<f32, 2>, has_gv: i32, pair: i32, scale: f32,
) {
    linear_attention_dq_blocks::<T, DK, 128>(
        q, k, v, dout, g, gc, beta, betac, h0, dq, dq32, dg, hsave, heads, q_group, k_group, bhtd, has_g, has_beta, has_h0, gv, has_gv,
        pair, scale,
    );
}

/// As `linear_attention_bwd_dq`, value head dim 64 (`pair` unused, as `linear_attention_fwd_v64`).
#[kernel(warpgroups = 2, dtypes(T = [bf16, f16]), tune(DK = [128, 64]), targets(sm_90a))]
pub fn linear_attention_bwd_dq_v64(
    q: Global<T, 3>, k: Global<T, 3>, v: Global<T, 3>, dout: Global<T, 3>, g: Global<f32, 2>, gc: Global<f32, 3>, beta: Global<f32, 2>,
    betac: Global<f32, 3>, h0: Global<f32, 3>, dq: Global<T, 3>, dq32: Global<f32, 3>, dg: Global<f32, 2>, hsave: Global<T, 3>, heads: i32,
    q_group: i32, k_group: i32, bhtd: i32, has_g: i32, has_beta: i32, has_h0: i32, gv: Global<f32, 2>, has_gv: i32, pair: i32, scale: f32,
) {
    linear_attention_dq_blocks::<T, DK, 64>(
        q, k, v, dout, g, gc, beta, betac, h0, dq, dq32, dg, hsave, heads, q_group, k_group, bhtd, has_g, has_beta, has_h0, gv, has_gv, 0,
        scale,
    );
}

/// The backward's reverse walk (`linear_attention_dkv_blocks`), value head dim 128 (or, with
/// `pair`, two heads of 64 a block, as `linear_attention_fwd`).
#[kernel(warpgroups = 3, dtypes(T = [bf16, f16]), tune(DK = [128, 64]), targets(sm_90a))]
pub fn linear_attention_bwd_dkv(
    q: Global<T, 3>, k: Global<T, 3>, v: Global<T, 3>, dout: Global<T, 3>, g: Global<f32, 2>, gc: Global<f32, 3>, betac: Global<f32, 3>,
    dh_last: Global<f32, 3>, hsave: Global<T, 3>, dk: Global<T, 3>, dk32: Global<f32, 3>, dv: Global<T, 3>, dbc: Global<f32, 3>,
    dg: Global<f32, 2>, dh0: Global<f32, 3>, heads: i32, q_group: i32, k_group: i32, bhtd: i32, has_g: i32, has_beta: i32, has_dh: i32,
    keep_dh0: i32, gv: Global<f32, 2>, dgl: Global<f32, 2>, has_gv: i32, pair: i32, scale: f32,
) {
    linear_attention_dkv_blocks::<T, DK, 128>(
        q, k, v, dout, g, gc, betac, dh_last, hsave, dk, dk32, dv, dbc, dg, dh0, heads, q_group, k_group, bhtd, has_g, has_beta, has_dh,
        keep_dh0, gv, dgl, has_gv, pair, scale,
    );
}

/// As `linear_attention_bwd_dkv`, value head dim 64 (`pair` unused, as `linear_attention_fwd_v64`).
#[kernel(warpgroups = 2, dtypes(T = [bf16, f16]), tune(DK = [128, 64]), targets(sm_90a))]
pub fn linear_attention_bwd_dkv_v64(
    q: Global<T, 3>, k: Global<T, 3>, v: Global<T, 3>, dout: Global<T, 3>, g: Global<f32, 2>, gc: Global<f32, 3>, betac: Global<f32, 3>,
    dh_last: Global<f32, 3>, hsave: Global<T, 3>, dk: Global<T, 3>, dk32: Global<f32, 3>, dv: Global<T, 3>, dbc: Global<f32, 3>,
    dg: Global<f32, 2>, dh0: Global<f32, 3>, heads: i32, q_group: i32, k_group: i32, bhtd: i32, has_g: i32, has_beta: i32, has_dh: i32,
    keep_dh0: i32, gv: Global<f32, 2>, dgl: Global<f32, 2>, has_gv: i32, pair: i32, scale: f32,
) {
    linear_attention_dkv_blocks::<T, DK, 64>(
        q, k, v, dout, g, gc, betac, dh_last, hsave, dk, dk32, dv, dbc, dg, dh0, heads, q_group, k_group, bhtd, has_g, has_beta, has_dh,
        keep_dh0, gv, dgl, has_gv, 0, scale,
    );
}

/// One step of the recurrence in place, the decode path: for (batch, head) `bh` and 64 of
/// V's columns a block, `state` (`[batch·heads, DK, DV]`, f32) becomes `exp(g)·state + β·kᵀv`
/// and `o = scale·q·state`. `q`, `k` as `[batch·heads', DK, 1]` (one column a head), `v`, `o` as
/// `[batch·heads, 1, DV]`, `g`, `β` as `[batch·heads, 1]`, per-channel gates `gv` as k.
#[kernel(dtypes(T = [bf16, f16]), tune(DK = [128, 64]))]
pub fn linear_attention_step(
    state: Global<f32, 3>, q: Global<T, 3>, k: Global<T, 3>, v: Global<T, 3>, g: Global<f32, 2>, beta: Global<f32, 2>, gv: Global<f32, 3>,
    o: Global<T, 3>, heads: i32, q_group: i32, k_group: i32, has_g: i32, has_beta: i32, has_gv: i32, scale: f32,
) {
    let slices = v.dim(2) / 64;
    let bh = block::id_x() / slices;
    let col = (block::id_x() - bh * slices) * 64;
    let b = bh / heads;
    let h = bh - b * heads;
    let kp = b * (heads / k_group) + h / k_group;
    let mut s = state.load::<Tile<f32, DK, 64>>([bh, 0, col]);
    if has_g == 1 {
        s = s * exp2(g.load::<Tile<f32, 1, 1>>([bh, 0]) * f32::consts::LOG2_E);
    }
    if has_gv == 1 {
        s = s * exp2(gv.load::<Tile<f32, DK, 1>>([kp, 0, 0]) * f32::consts::LOG2_E);
    }
    let mut w = v.load::<Tile<T, 1, 64>>([bh, 0, col]).cast::<f32>();
    if has_beta == 1 {
        w = w * beta.load::<Tile<f32, 1, 1>>([bh, 0]);
    }
    s = s + (Tile::<f32, DK, 64>::zeros() + w) * k.load::<Tile<T, DK, 1>>([kp, 0, 0]).cast::<f32>();
    state.store([bh, 0, col], s);
    let qp = b * (heads / q_group) + h / q_group;
    o.store([bh, 0, col], ((s * q.load::<Tile<T, DK, 1>>([qp, 0, 0]).cast::<f32>()).sum(0) * scale).cast::<T>());
}

/// The chunk of `gla_prepare`'s and `gla_finish`'s block: chunk `block::id_y()` of q/k head
/// `block::id_x()` of a sequence of `len` — its plane and first column in the rank-3 views, its
/// first step, and its row of the per-chunk decays (`head·chunks + chunk`).
#[device]
pub fn gla_chunk<const DK: usize>(heads: i32, bhtd: i32, len: i32) -> (i32, i32, i32, i32) {
    let bh = block::id_x();
    let c = block::id_y();
    let b = bh / heads;
    let (plane, col) = head_origin(b, bh - b * heads, heads, DK, bhtd);
    (plane, col, c * 64, bh * ((len + 63) / 64) + c)
}

/// Per-channel gates (GLA): for chunk `block::id_y()` of q/k head `block::id_x()` (rank-3
/// views as the attention's, `g` as k), with `G` the chunk's running sum of `g` down its steps,
/// `qh = q ∘ exp(G)`, `kh = k ∘ exp(−G)` and each channel's decay over the chunk `exp(G_last)`
/// into `gv` (`[heads·chunks, DK]`). The attention of `qh`, `kh` whose state rows are scaled
/// by `gv` after each chunk is then the gated one (`H_t = diag(exp(g_t))·H_{t−1} + k_tᵀv_t`).
#[kernel(dtypes(T = [bf16, f16]), tune(DK = [128, 64]))]
pub fn gla_prepare(
    q: Global<T, 3>, k: Global<T, 3>, g: Global<f32, 3>, qh: Global<T, 3>, kh: Global<T, 3>, gv: Global<f32, 2>, heads: i32, bhtd: i32,
) {
    let (plane, col, t0, row) = gla_chunk::<DK>(heads, bhtd, q.dim(1));
    // 64 channels at a time (a 64×DK tile of each would not fit in registers).
    for j in (0..DK).step_by(64) {
        let gt = g.load_or::<Tile<f32, 64, 64>>([plane, t0, col + j], 0.0) * f32::consts::LOG2_E;
        let cum = tile_scan::<scan_add>(gt, 0, 0.0);
        qh.store([plane, t0, col + j], (q.load::<Tile<T, 64, 64>>([plane, t0, col + j]).cast::<f32>() * exp2(cum)).cast::<T>());
        kh.store([plane, t0, col + j], (k.load::<Tile<T, 64, 64>>([plane, t0, col + j]).cast::<f32>() * exp2(cum * -1.0)).cast::<T>());
        gv.store([row, j], exp2(col_sum(gt)));
    }
}

/// The gates' backward after the two walks on `gla_prepare`'s q̂, k̂ (views as there): with
/// `G` each chunk's running sum of `g`, `dq = dq̂ ∘ exp(G)`, `dk = dk̂ ∘ exp(−G)`, and `dg_s =
/// Σ_{t ≥ s in the chunk} (q̂ ∘ dq̂ − k̂ ∘ dk̂)_t + dgl` (`dgl` `[heads·chunks, DK]`: the chunk
/// decay's share, `rowsum(dH ∘ H)` from the reverse walk).
#[kernel(dtypes(T = [bf16, f16]), tune(DK = [128, 64]))]
pub fn gla_finish(
    q: Global<T, 3>, k: Global<T, 3>, g: Global<f32, 3>, dqh: Global<T, 3>, dkh: Global<T, 3>, dgl: Global<f32, 2>, dq: Global<T, 3>,
    dk: Global<T, 3>, dg: Global<f32, 3>, heads: i32, bhtd: i32,
) {
    let (plane, col, t0, row) = gla_chunk::<DK>(heads, bhtd, q.dim(1));
    // 32 channels at a time: nine 64-row tiles of them live at once.
    for j in (0..DK).step_by(32) {
        let cum = tile_scan::<scan_add>(g.load_or::<Tile<f32, 64, 32>>([plane, t0, col + j], 0.0) * f32::consts::LOG2_E, 0, 0.0);
        let eq = exp2(cum);
        let ek = exp2(cum * -1.0);
        let dq_hat = dqh.load::<Tile<T, 64, 32>>([plane, t0, col + j]).cast::<f32>();
        let dk_hat = dkh.load::<Tile<T, 64, 32>>([plane, t0, col + j]).cast::<f32>();
        let qt = q.load::<Tile<T, 64, 32>>([plane, t0, col + j]).cast::<f32>();
        let kt = k.load::<Tile<T, 64, 32>>([plane, t0, col + j]).cast::<f32>();
        dq.store([plane, t0, col + j], (dq_hat * eq).cast::<T>());
        dk.store([plane, t0, col + j], (dk_hat * ek).cast::<T>());
        let dgt = qt * eq * dq_hat - kt * ek * dk_hat;
        let after = col_sum(dgt) - tile_scan_exclusive::<scan_add>(dgt, 0, 0.0);
        dg.store([plane, t0, col + j], after + dgl.load::<Tile<f32, 1, 32>>([row, j]));
    }
}

/// A feature map `φ` on a tile ([`FeatureMap`]'s codes): 0 the identity, 1 `elu(x) + 1`
/// (`x + 1` above zero, `eˣ` at or below), 2 `relu(x)`.
#[device]
pub fn feature_map<const R: usize, const W: usize>(x: Tile<f32, R, W>, kind: i32) -> Tile<f32, R, W> {
    let mut y = x;
    if kind == 1 {
        y = max(x, 0.0) + exp2(min(x, 0.0) * f32::consts::LOG2_E);
    }
    if kind == 2 {
        y = max(x, 0.0);
    }
    y
}

/// `dy·φ′(x)` for [`feature_map`]'s `kind` (relu's derivative 0 at 0, as torch takes it).
#[device]
pub fn feature_map_grad<const R: usize, const W: usize>(dy: Tile<f32, R, W>, x: Tile<f32, R, W>, kind: i32) -> Tile<f32, R, W> {
    let mut dx = dy;
    if kind == 1 {
        dx = dy * exp2(min(x, 0.0) * f32::consts::LOG2_E);
    }
    if kind == 2 {
        dx = dy * (1.0 - step(x * -1.0));
    }
    dx
}

/// `y = φ(x)`, or with `backward` 1 `y = dy·φ′(x)`, over `[n, 64]` views, 64 rows a block.
#[kernel(dtypes(T = [bf16, f16]))]
pub fn feature_map_rows(x: Global<T, 2>, dy: Global<T, 2>, y: Global<T, 2>, kind: i32, backward: i32) {
    let r = block::id_x() * 64;
    let xt = x.load::<Tile<T, 64, 64>>([r, 0]).cast::<f32>();
    if backward == 1 {
        y.store([r, 0], feature_map_grad(dy.load::<Tile<T, 64, 64>>([r, 0]).cast::<f32>(), xt, kind).cast::<T>());
    } else {
        y.store([r, 0], feature_map(xt, kind).cast::<T>());
    }
}

/// `y = x` cast to `T`, 4096 elements a block, `[1, n]` views.
#[kernel(dtypes(T = [bf16, f16]))]
pub fn cast_from_f32(x: Global<f32, 2>, y: Global<T, 2>) {
    let c = block::id_x() * 4096;
    y.store([0, c], x.load::<Tile<f32, 1, 4096>>([0, c]).cast::<T>());
}

pub use crate::attention::AttentionLayout;
use tessera::{Device, Element, Error, Grid, Optional, OptionalMut, Result, Tensor, TensorView};

/// Element types [`LinearAttention`] runs on: bf16 and f16.
pub trait LinearAttentionElement: Element + sealed::Sealed {
    #[doc(hidden)]
    fn linear_attention_launch(
        a: &LinearAttention<'_, Self>, d: Dims, o: &mut Tensor<Self>, h_last: Option<&mut Tensor<f32>>,
    ) -> Result<()>;
    #[doc(hidden)]
    fn linear_attention_bwd_launch(a: &LinearAttention<'_, Self>, d: Dims, b: Backward<'_, Self>) -> Result<()>;
    #[doc(hidden)]
    fn cast_launch(device: &Device, x: &Tensor<f32>, y: &mut Tensor<Self>) -> Result<()>;
    #[doc(hidden)]
    fn gla_prepare_launch(
        a: &LinearAttention<'_, Self>, d: Dims, qh: &mut Tensor<Self>, kh: &mut Tensor<Self>, gv: &mut Tensor<f32>,
    ) -> Result<()>;
    #[doc(hidden)]
    fn gla_finish_launch(
        a: &LinearAttention<'_, Self>, d: Dims, dqh: &Tensor<Self>, dkh: &Tensor<Self>, dgl: &Tensor<f32>, out: GlaGrads<'_, Self>,
    ) -> Result<()>;
    #[doc(hidden)]
    fn feature_launch(device: &Device, x: &Tensor<Self>, dy: Option<&Tensor<Self>>, y: &mut Tensor<Self>, kind: i32) -> Result<()>;
    #[doc(hidden)]
    fn step_launch(a: &LinearAttention<'_, Self>, d: Dims, state: &mut Tensor<f32>, o: &mut Tensor<Self>) -> Result<()>;
}

/// The backward's tensors, as its launches take them.
#[doc(hidden)]
pub struct Backward<'t, T: Element> {
    dout: &'t Tensor<T>,
    dh_last: Option<&'t Tensor<f32>>,
    dq: &'t mut Tensor<T>,
    dk: &'t mut Tensor<T>,
    dq32: Option<&'t mut Tensor<f32>>,
    dk32: Option<&'t mut Tensor<f32>>,
    dv: &'t mut Tensor<T>,
    dg: Option<&'t mut Tensor<f32>>,
    dbeta: Option<&'t mut Tensor<f32>>,
    dh0: Option<&'t mut Tensor<f32>>,
    hsave: Option<&'t mut Tensor<T>>,
    /// With per-channel gates: each chunk's `rowsum(dH ∘ H)` a key channel (f32, zeroed).
    dgl: Option<&'t mut Tensor<f32>>,
}

/// The gates' backward's outputs.
#[doc(hidden)]
pub struct GlaGrads<'t, T: Element> {
    dq: &'t mut Tensor<T>,
    dk: &'t mut Tensor<T>,
    dg: &'t mut Tensor<f32>,
}

/// The gradients [`LinearAttention::backward`] returns.
pub struct LinearAttentionGrads<T: Element> {
    /// ∂L/∂q (as q).
    pub dq: Tensor<T>,
    /// ∂L/∂k (as k; summed over the value heads a grouped key head serves).
    pub dk: Tensor<T>,
    /// ∂L/∂v (as v).
    pub dv: Tensor<T>,
    /// ∂L/∂g, with a decay (`[batch, heads, seq]`, f32), or with per-channel gates (as them).
    pub dg: Option<Tensor<f32>>,
    /// ∂L/∂β, with a β (`[batch, heads, seq]`, f32).
    pub dbeta: Option<Tensor<f32>>,
    /// ∂L/∂(initial state), with one (`[batch, heads, dk, dv]`, f32).
    pub dh0: Option<Tensor<f32>>,
}

mod sealed {
    pub trait Sealed {}
    impl Sealed for tessera::bf16 {}
    impl Sealed for tessera::f16 {}
}

/// The problem's sizes.
#[doc(hidden)]
#[derive(Clone, Copy, Debug)]
pub struct Dims {
    batch: usize,
    heads: usize,
    q_heads: usize,
    k_heads: usize,
    len: usize,
    dk: usize,
    dv: usize,
}

impl Dims {
    /// Whether a block takes two value heads (the 128-column kernels with `pair`): heads of 64
    /// columns side by side (`Bshd`), each consecutive two served by the same q and k heads
    /// (Mamba-2's groups). Half the blocks, each with two consumers where it had one, and the
    /// pair's q and k gradients summed in the block before they are added into the group's.
    fn paired(&self, layout: AttentionLayout) -> bool {
        self.dv == 64
            && layout == AttentionLayout::Bshd
            && (self.heads / self.q_heads).is_multiple_of(2)
            && (self.heads / self.k_heads).is_multiple_of(2)
    }

    /// The launch's blocks: one a (batch, head), or a pair of heads.
    fn blocks(&self, layout: AttentionLayout) -> Grid {
        Grid::from((self.batch * self.heads / (1 + usize::from(self.paired(layout)))) as u32)
    }
}

/// The kernel's rank-3 view (shape, strides) of a `[batch, seq, heads, d]` or `[batch, heads,
/// seq, d]` tensor.
fn heads_dims(layout: AttentionLayout, batch: usize, heads: usize, len: usize, d: usize) -> ([usize; 3], [usize; 3]) {
    match layout {
        AttentionLayout::Bshd => ([batch, len, heads * d], [len * heads * d, heads * d, 1]),
        AttentionLayout::Bhsd => ([batch * heads, len, d], [len * d, d, 1]),
    }
}

fn heads_view<T: Element>(
    t: &Tensor<T>, layout: AttentionLayout, batch: usize, heads: usize, len: usize, d: usize,
) -> Result<TensorView<'_, T>> {
    let (shape, strides) = heads_dims(layout, batch, heads, len, d);
    t.view(&shape, &strides)
}

/// A state tensor `[batch, heads, dk, dv]` as the kernels' `[batch·heads, dk, dv]`.
fn state_view<T: Element>(t: &Tensor<T>, rows: usize, dk: usize, dv: usize) -> Result<TensorView<'_, T>> {
    t.view(&[rows, dk, dv], &[dk * dv, dv, 1])
}

/// A `[rows, len]` f32 tensor as rows and as columns (the two sides of the decay read it).
type RowsCols<'t> = (Option<TensorView<'t, f32>>, Option<TensorView<'t, f32>>);
fn rows_cols(t: Option<&Tensor<f32>>, rows: usize, len: usize) -> Result<RowsCols<'_>> {
    Ok(match t {
        Some(t) => (Some(t.view(&[rows, len], &[len, 1])?), Some(t.view(&[rows, len, 1], &[len, 1, 1])?)),
        None => (None, None),
    })
}

/// The decay's running sums over each chunk ([`chunk_decay_sums`]), `[rows, chunks·64]` as
/// rows and as columns.
fn decay_sums(device: &Device, g: &Tensor<f32>, rows: usize, len: usize) -> Result<Tensor<f32>> {
    let mut gs = Tensor::<f32>::scratch(device, &[rows, len.div_ceil(64) * 64])?;
    chunk_decay_sums::launch(device, (Grid::tiles(len, 64), Grid::tiles(rows, 16)), &g.view(&[rows, len], &[len, 1])?, &mut gs)?;
    Ok(gs)
}

/// The variant of a `tune(DK = [..])` kernel for key head dim `dk`, or the error naming `k`.
fn dk_variant(variants: &[&tessera::KernelSpec], dk: usize) -> Result<usize> {
    crate::knob_variant(variants, "DK", dk, "linear_attention", "k", "a key head dim of 64 or 128", format!("{dk}"))
}

macro_rules! linear_attention_element {
    ($t:ty, $k128:ident, $k64:ident, $dq128:ident, $dq64:ident, $dkv128:ident, $dkv64:ident, $cast:ident, $step:ident, $feature:ident, $prep:ident, $fin:ident) => {
        impl LinearAttentionElement for $t {
            fn linear_attention_launch(
                a: &LinearAttention<'_, Self>, d: Dims, o: &mut Tensor<Self>, h_last: Option<&mut Tensor<f32>>,
            ) -> Result<()> {
                let Dims { batch, heads, q_heads, k_heads, len, dk, dv } = d;
                let pair = d.paired(a.layout);
                let wide = dv == 128 || pair;
                let variants = if wide { $k128::VARIANTS } else { $k64::VARIANTS };
                let i = dk_variant(variants, dk)?;
                let q = heads_view(a.q, a.layout, batch, q_heads, len, dk)?;
                let k = heads_view(a.k, a.layout, batch, k_heads, len, dk)?;
                let v = heads_view(a.v, a.layout, batch, heads, len, dv)?;
                let rows = batch * heads;
                let sums = a.g.map(|g| decay_sums(a.device, g, rows, len)).transpose()?;
                let ((g, gc), (b, bc)) = (rows_cols(sums.as_ref(), rows, len.div_ceil(64) * 64)?, rows_cols(a.beta, rows, len)?);
                let h0 = a.h0.map(|t| t.view(&[rows, dk, dv], &[dk * dv, dv, 1])).transpose()?;
                let (shape, strides) = heads_dims(a.layout, batch, heads, len, dv);
                let mut ov = o.view_mut(&shape, &strides)?;
                let keep = h_last.is_some();
                let mut hl = h_last.map(|t| t.view_mut(&[rows, dk, dv], &[dk * dv, dv, 1])).transpose()?;
                let gv = a.gate_decays.map(|t| t.view(&[t.numel(), 1], &[1, 1])).transpose()?;
                let flag = |b: bool| i32::from(b);
                let scale = a.scale.unwrap_or(1.0 / (dk as f32).sqrt());
                macro_rules! go {
                    ($k:ident) => {
                        $k::launch_variant(
                            i,
                            a.device,
                            d.blocks(a.layout),
                            &q,
                            &k,
                            &v,
                            &Optional(g.as_ref(), 2),
                            &Optional(gc.as_ref(), 3),
                            &Optional(b.as_ref(), 2),
                            &Optional(bc.as_ref(), 3),
                            &Optional(h0.as_ref(), 3),
                            &mut ov,
                            &mut OptionalMut(hl.as_mut(), 3),
                            &Optional(a.skip, 1),
                            &Optional(gv.as_ref(), 2),
                            heads as i32,
                            (heads / q_heads) as i32,
                            (heads / k_heads) as i32,
                            flag(a.layout == AttentionLayout::Bhsd),
                            flag(a.g.is_some()),
                            flag(a.beta.is_some()),
                            flag(a.h0.is_some()),
                            flag(keep),
                            flag(a.skip.is_some()),
                            flag(gv.is_some()),
                            flag(pair),
                            scale,
                        )
                    };
                }
                if wide {
                    go!($k128)
                } else {
                    go!($k64)
                }
            }

            fn linear_attention_bwd_launch(a: &LinearAttention<'_, Self>, d: Dims, mut bw: Backward<'_, Self>) -> Result<()> {
                let Dims { batch, heads, q_heads, k_heads, len, dk, dv } = d;
                let pair = d.paired(a.layout);
                let wide = dv == 128 || pair;
                let variants = if wide { $dq128::VARIANTS } else { $dq64::VARIANTS };
                let i = dk_variant(variants, dk)?;
                let q = heads_view(a.q, a.layout, batch, q_heads, len, dk)?;
                let k = heads_view(a.k, a.layout, batch, k_heads, len, dk)?;
                let v = heads_view(a.v, a.layout, batch, heads, len, dv)?;
                let dout = heads_view(bw.dout, a.layout, batch, heads, len, dv)?;
                let rows = batch * heads;
                let sums = a.g.map(|g| decay_sums(a.device, g, rows, len)).transpose()?;
                let ((g, gc), (b, bc)) = (rows_cols(sums.as_ref(), rows, len.div_ceil(64) * 64)?, rows_cols(a.beta, rows, len)?);
                let h0 = a.h0.map(|t| state_view(t, rows, dk, dv)).transpose()?;
                let dh_last = bw.dh_last.map(|t| state_view(t, rows, dk, dv)).transpose()?;
                let (shape, strides) = heads_dims(a.layout, batch, q_heads, len, dk);
                let mut dqv = bw.dq.view_mut(&shape, &strides)?;
                let mut dq32 = bw.dq32.as_deref_mut().map(|t| t.view_mut(&shape, &strides)).transpose()?;
                let (shape, strides) = heads_dims(a.layout, batch, k_heads, len, dk);
                let mut dkv = bw.dk.view_mut(&shape, &strides)?;
                let mut dk32 = bw.dk32.as_deref_mut().map(|t| t.view_mut(&shape, &strides)).transpose()?;
                let (shape, strides) = heads_dims(a.layout, batch, heads, len, dv);
                let mut dvv = bw.dv.view_mut(&shape, &strides)?;
                let mut dgv = bw.dg.map(|t| t.view_mut(&[rows, len], &[len, 1])).transpose()?;
                let chunks = len.div_ceil(64);
                let mut hsave = bw.hsave.as_deref_mut().map(|t| t.view_mut(&[rows * chunks, dk, dv], &[dk * dv, dv, 1])).transpose()?;
                let mut dbc = bw.dbeta.map(|t| t.view_mut(&[rows, len, 1], &[len, 1, 1])).transpose()?;
                let keep_dh0 = bw.dh0.is_some();
                let mut dh0 = bw.dh0.map(|t| t.view_mut(&[rows, dk, dv], &[dk * dv, dv, 1])).transpose()?;
                let gv = a.gate_decays.map(|t| t.view(&[t.numel(), 1], &[1, 1])).transpose()?;
                let mut dgl = bw.dgl.map(|t| t.view_mut(&[t.numel(), 1], &[1, 1])).transpose()?;
                let flag = |b: bool| i32::from(b);
                let scale = a.scale.unwrap_or(1.0 / (dk as f32).sqrt());
                let (bhtd, has_g, has_beta) = (flag(a.layout == AttentionLayout::Bhsd), flag(a.g.is_some()), flag(a.beta.is_some()));
                let (qg, kg) = ((heads / q_heads) as i32, (heads / k_heads) as i32);
                macro_rules! walks {
                    ($dq:ident, $dkv:ident) => {{
                        $dq::launch_variant(
                            i,
                            a.device,
                            d.blocks(a.layout),
                            &q,
                            &k,
                            &v,
                            &dout,
                            &Optional(g.as_ref(), 2),
                            &Optional(gc.as_ref(), 3),
                            &Optional(b.as_ref(), 2),
                            &Optional(bc.as_ref(), 3),
                            &Optional(h0.as_ref(), 3),
                            &mut dqv,
                            &mut OptionalMut(dq32.as_mut(), 3),
                            &mut OptionalMut(dgv.as_mut(), 2),
                            &mut OptionalMut(hsave.as_mut(), 3),
                            heads as i32,
                            qg,
                            kg,
                            bhtd,
                            has_g,
                            has_beta,
                            flag(a.h0.is_some()),
                            &Optional(gv.as_ref(), 2),
                            flag(gv.is_some()),
                            flag(pair),
                            scale,
                        )?;
                        drop(hsave);
                        let hsave = bw.hsave.as_deref().map(|t| state_view(t, rows * chunks, dk, dv)).transpose()?;
                        // The reverse walk's own variant: its list need not be the first's (a
                        // variant over the shared memory is dropped from one kernel alone).
                        $dkv::launch_variant(
                            dk_variant($dkv::VARIANTS, dk)?,
                            a.device,
                            d.blocks(a.layout),
                            &q,
                            &k,
                            &v,
                            &dout,
                            &Optional(g.as_ref(), 2),
                            &Optional(gc.as_ref(), 3),
                            &Optional(bc.as_ref(), 3),
                            &Optional(dh_last.as_ref(), 3),
                            &Optional(hsave.as_ref(), 3),
                            &mut dkv,
                            &mut OptionalMut(dk32.as_mut(), 3),
                            &mut dvv,
                            &mut OptionalMut(dbc.as_mut(), 3),
                            &mut OptionalMut(dgv.as_mut(), 2),
                            &mut OptionalMut(dh0.as_mut(), 3),
                            heads as i32,
                            qg,
                            kg,
                            bhtd,
                            has_g,
                            has_beta,
                            flag(bw.dh_last.is_some()),
                            flag(keep_dh0),
                            &Optional(gv.as_ref(), 2),
                            &mut OptionalMut(dgl.as_mut(), 2),
                            flag(gv.is_some()),
                            flag(pair),
                            scale,
                        )
                    }};
                }
                if wide {
                    walks!($dq128, $dkv128)
                } else {
                    walks!($dq64, $dkv64)
                }
            }

            fn step_launch(a: &LinearAttention<'_, Self>, d: Dims, state: &mut Tensor<f32>, o: &mut Tensor<Self>) -> Result<()> {
                let Dims { batch, heads, q_heads, k_heads, dk, dv, .. } = d;
                let i = dk_variant($step::VARIANTS, dk)?;
                // One step: [batch, 1, heads, d] and [batch, heads, 1, d] lie alike in memory.
                let rows = batch * heads;
                let q = a.q.view(&[batch * q_heads, dk, 1], &[dk, 1, 1])?;
                let k = a.k.view(&[batch * k_heads, dk, 1], &[dk, 1, 1])?;
                let v = a.v.view(&[rows, 1, dv], &[dv, dv, 1])?;
                let mut ov = o.view_mut(&[rows, 1, dv], &[dv, dv, 1])?;
                let mut sv = state.view_mut(&[rows, dk, dv], &[dk * dv, dv, 1])?;
                let g = a.g.map(|t| t.view(&[rows, 1], &[1, 1])).transpose()?;
                let b = a.beta.map(|t| t.view(&[rows, 1], &[1, 1])).transpose()?;
                let gv = a.gates.map(|t| t.view(&[batch * k_heads, dk, 1], &[dk, 1, 1])).transpose()?;
                $step::launch_variant(
                    i,
                    a.device,
                    Grid::from((rows * (dv / 64)) as u32),
                    &mut sv,
                    &q,
                    &k,
                    &v,
                    &Optional(g.as_ref(), 2),
                    &Optional(b.as_ref(), 2),
                    &Optional(gv.as_ref(), 3),
                    &mut ov,
                    heads as i32,
                    (heads / q_heads) as i32,
                    (heads / k_heads) as i32,
                    i32::from(a.g.is_some()),
                    i32::from(a.beta.is_some()),
                    i32::from(a.gates.is_some()),
                    a.scale.unwrap_or(1.0 / (dk as f32).sqrt()),
                )
            }

            fn cast_launch(device: &Device, x: &Tensor<f32>, y: &mut Tensor<Self>) -> Result<()> {
                let n = x.shape().iter().product::<usize>();
                let xv = x.view(&[1, n], &[n, 1])?;
                let mut yv = y.view_mut(&[1, n], &[n, 1])?;
                $cast::launch(device, Grid::from(n.div_ceil(4096) as u32), &xv, &mut yv)
            }

            fn gla_prepare_launch(
                a: &LinearAttention<'_, Self>, d: Dims, qh: &mut Tensor<Self>, kh: &mut Tensor<Self>, gv: &mut Tensor<f32>,
            ) -> Result<()> {
                let Dims { batch, k_heads, len, dk, .. } = d;
                let i = dk_variant($prep::VARIANTS, dk)?;
                let (shape, strides) = heads_dims(a.layout, batch, k_heads, len, dk);
                let (q, k) = (a.q.view(&shape, &strides)?, a.k.view(&shape, &strides)?);
                let g = a.gates.map(|t| t.view(&shape, &strides)).transpose()?;
                let mut qv = qh.view_mut(&shape, &strides)?;
                let mut kv = kh.view_mut(&shape, &strides)?;
                let n = gv.numel();
                let mut gvv = gv.view_mut(&[n / dk, dk], &[dk, 1])?;
                let grid = ((batch * k_heads) as u32, Grid::tiles(len, 64));
                $prep::launch_variant(
                    i,
                    a.device,
                    grid,
                    &q,
                    &k,
                    &Optional(g.as_ref(), 3),
                    &mut qv,
                    &mut kv,
                    &mut gvv,
                    k_heads as i32,
                    i32::from(a.layout == AttentionLayout::Bhsd),
                )
            }

            fn gla_finish_launch(
                a: &LinearAttention<'_, Self>, d: Dims, dqh: &Tensor<Self>, dkh: &Tensor<Self>, dgl: &Tensor<f32>, out: GlaGrads<'_, Self>,
            ) -> Result<()> {
                let Dims { batch, k_heads, len, dk, .. } = d;
                let i = dk_variant($fin::VARIANTS, dk)?;
                let (shape, strides) = heads_dims(a.layout, batch, k_heads, len, dk);
                let (q, k) = (a.q.view(&shape, &strides)?, a.k.view(&shape, &strides)?);
                let (dqv, dkv) = (dqh.view(&shape, &strides)?, dkh.view(&shape, &strides)?);
                let g = a.gates.map(|t| t.view(&shape, &strides)).transpose()?;
                let n = dgl.numel();
                let dglv = dgl.view(&[n / dk, dk], &[dk, 1])?;
                let GlaGrads { dq, dk: dkt, dg } = out;
                let (mut dqo, mut dko, mut dgo) =
                    (dq.view_mut(&shape, &strides)?, dkt.view_mut(&shape, &strides)?, dg.view_mut(&shape, &strides)?);
                $fin::launch_variant(
                    i,
                    a.device,
                    ((batch * k_heads) as u32, Grid::tiles(len, 64)),
                    &q,
                    &k,
                    &Optional(g.as_ref(), 3),
                    &dqv,
                    &dkv,
                    &dglv,
                    &mut dqo,
                    &mut dko,
                    &mut dgo,
                    k_heads as i32,
                    i32::from(a.layout == AttentionLayout::Bhsd),
                )
            }

            fn feature_launch(device: &Device, x: &Tensor<Self>, dy: Option<&Tensor<Self>>, y: &mut Tensor<Self>, kind: i32) -> Result<()> {
                let rows = x.shape().iter().product::<usize>() / 64;
                let xv = x.view(&[rows, 64], &[64, 1])?;
                let dv = dy.unwrap_or(x).view(&[rows, 64], &[64, 1])?;
                let mut yv = y.view_mut(&[rows, 64], &[64, 1])?;
                let backward = i32::from(dy.is_some());
                if rows == 0 {
                    return Ok(());
                }
                $feature::launch(device, Grid::tiles(rows, 64), &xv, &dv, &mut yv, kind, backward)
            }
        }
    };
}
linear_attention_element!(
    tessera::bf16,
    linear_attention_fwd_bf16,
    linear_attention_fwd_v64_bf16,
    linear_attention_bwd_dq_bf16,
    linear_attention_bwd_dq_v64_bf16,
    linear_attention_bwd_dkv_bf16,
    linear_attention_bwd_dkv_v64_bf16,
    cast_from_f32_bf16,
    linear_attention_step_bf16,
    feature_map_rows_bf16,
    gla_prepare_bf16,
    gla_finish_bf16
);
linear_attention_element!(
    tessera::f16,
    linear_attention_fwd_f16,
    linear_attention_fwd_v64_f16,
    linear_attention_bwd_dq_f16,
    linear_attention_bwd_dq_v64_f16,
    linear_attention_bwd_dkv_f16,
    linear_attention_bwd_dkv_v64_f16,
    cast_from_f32_f16,
    linear_attention_step_f16,
    feature_map_rows_f16,
    gla_prepare_f16,
    gla_finish_f16
);

/// The feature map `φ` a [`LinearAttention`] applies to q and k: `o_t = scale·φ(q_t)·H_t`,
/// `H_t = exp(g_t)·H_{t−1} + β_t·φ(k_t)ᵀv_t`. A pass before the attention maps q and k (and
/// one after its backward takes their gradients through `φ′`), as
/// [`feature_map_rows`](crate::kernels::feature_map_rows_bf16) does with [`feature_map`]. A map
/// of your own is a `#[tessera::device]` function in such a kernel of yours, its output given to
/// `LinearAttention::new` as q and k (`FeatureMap::Identity`), and the gradients `dq`, `dk` it
/// returns taken through your map's derivative the same way.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum FeatureMap {
    /// `φ(x) = x`.
    #[default]
    Identity,
    /// `φ(x) = elu(x) + 1` (x + 1 above zero, eˣ at or below): positive features, as in
    /// Katharopoulos et al.'s linear transformer.
    EluPlusOne,
    /// `φ(x) = max(x, 0)`.
    Relu,
}

impl FeatureMap {
    fn code(self) -> i32 {
        match self {
            FeatureMap::Identity => 0,
            FeatureMap::EluPlusOne => 1,
            FeatureMap::Relu => 2,
        }
    }
}

/// A causal linear attention to run (see the module's notes for the recurrence): q, k `[batch,
/// seq, heads, dk]`, v `[batch, seq, heads, dv]` (or all `[batch, heads, seq, d]` with
/// [`AttentionLayout::Bhsd`]), dk 64 or 128, dv 64 or 128; q and k may have fewer heads,
/// dividing v's (each serving consecutive value heads, as Mamba-2's groups of C and B). The
/// builder adds a decay `g` (log units, ≤ 0: `exp(g_t)` multiplies the state at step t), a
/// weight `β` on each step's `kᵀv`, an initial state, and the scale (1/√dk unless given).
///
/// ```ignore
/// let la = LinearAttention::new(&dev, &q, &k, &v).decay(&g); // g [batch, heads, seq] (f32)
/// la.run(&mut o, Some(&mut h_last))?; // h_last [batch, heads, dk, dv] (f32)
/// ```
pub struct LinearAttention<'a, T: Element> {
    device: &'a Device,
    q: &'a Tensor<T>,
    k: &'a Tensor<T>,
    v: &'a Tensor<T>,
    g: Option<&'a Tensor<f32>>,
    beta: Option<&'a Tensor<f32>>,
    h0: Option<&'a Tensor<f32>>,
    scale: Option<f32>,
    layout: AttentionLayout,
    /// `D` a head (`[heads]`, f32): `y + D_h·v` (the SSD's skip).
    pub(crate) skip: Option<&'a Tensor<f32>>,
    feature: FeatureMap,
    gates: Option<&'a Tensor<f32>>,
    /// With gates, once q and k are prepared: each chunk's decay of each key channel.
    gate_decays: Option<&'a Tensor<f32>>,
}

impl<'a, T: LinearAttentionElement> LinearAttention<'a, T> {
    /// Plain causal linear attention of `q`, `k`, `v` (`[batch, seq, heads, d]`).
    pub fn new(device: &'a Device, q: &'a Tensor<T>, k: &'a Tensor<T>, v: &'a Tensor<T>) -> Self {
        LinearAttention {
            device,
            q,
            k,
            v,
            g: None,
            beta: None,
            h0: None,
            scale: None,
            layout: AttentionLayout::Bshd,
            skip: None,
            feature: FeatureMap::Identity,
            gates: None,
            gate_decays: None,
        }
    }

    /// The tensors' layout (`[batch, seq, heads, d]` unless told).
    pub fn layout(mut self, layout: AttentionLayout) -> Self {
        self.layout = layout;
        self
    }

    /// A decay a step, `g` `[batch, heads, seq]` (f32, natural-log units): the state is
    /// multiplied by `exp(g_t)` before step t adds to it. RetNet's constant decay is
    /// `g = ln γ_h` at every step; a gate (GLA, Mamba-2) computes g from the input.
    pub fn decay(mut self, g: &'a Tensor<f32>) -> Self {
        self.g = Some(g);
        self
    }

    /// Per-channel gates, GLA's data-dependent decay: `g` as k (`[batch, seq, heads, dk]` or
    /// `[batch, heads, seq, dk]`, f32, natural-log units, ≤ 0): row `i` of the state is
    /// multiplied by `exp(g_t[i])` before step t adds to it, `H_t = diag(exp(g_t))·H_{t−1} +
    /// β_t·k_tᵀv_t`. q and k need the same number of heads; not with [`decay`](Self::decay).
    /// A pass scales q and k by each 64-step chunk's running gates first
    /// ([`gla_prepare`](crate::kernels::gla_prepare_bf16)), so a chunk's total gate on a
    /// channel, `Σ g`, must stay above about −80 (f32's range; GLA's `logsigmoid(x)/16` gates
    /// stay far inside it). Forward, backward (the gates' gradient as
    /// the difference `q̂·dq̂ − k̂·dk̂` of the walks' 16-bit gradients, as flash-linear-attention's
    /// `chunk_gla` takes it, plus each chunk decay's share `rowsum(dH ∘ H)`: about 1e-2
    /// relative for gates near −0.1 a step, 1.7e-2 at −0.6) and decode step.
    pub fn gates(mut self, g: &'a Tensor<f32>) -> Self {
        self.gates = Some(g);
        self
    }

    /// A weight on each step's contribution, `β` `[batch, heads, seq]` (f32): the state adds
    /// `β_t·k_tᵀv_t` (Mamba-2's Δ).
    pub fn beta(mut self, beta: &'a Tensor<f32>) -> Self {
        self.beta = Some(beta);
        self
    }

    /// The state before the first step (`[batch, heads, dk, dv]`, f32; zeros without it).
    pub fn initial_state(mut self, h0: &'a Tensor<f32>) -> Self {
        self.h0 = Some(h0);
        self
    }

    /// The feature map applied to q and k ([`FeatureMap::Identity`] unless told).
    pub fn feature_map(mut self, feature: FeatureMap) -> Self {
        self.feature = feature;
        self
    }

    /// This attention on other q and k (the mapped ones), without a map.
    fn with_qk<'b>(&'b self, q: &'b Tensor<T>, k: &'b Tensor<T>) -> LinearAttention<'b, T> {
        LinearAttention { q, k, feature: FeatureMap::Identity, ..*self }
    }

    /// `φ(q)` and `φ(k)`.
    fn mapped(&self) -> Result<(Tensor<T>, Tensor<T>)> {
        let map = |x: &Tensor<T>| -> Result<Tensor<T>> {
            let mut y = Tensor::<T>::scratch(self.device, x.shape())?;
            T::feature_launch(self.device, x, None, &mut y, self.feature.code())?;
            Ok(y)
        };
        Ok((map(self.q)?, map(self.k)?))
    }

    /// With gates: q̂, k̂ and each chunk's decay a key channel (`gla_prepare`), what the
    /// kernels take in their place.
    fn gates_prepared(&self, d: Dims) -> Result<(Tensor<T>, Tensor<T>, Tensor<f32>)> {
        let mut qh = Tensor::<T>::scratch(self.device, self.q.shape())?;
        let mut kh = Tensor::<T>::scratch(self.device, self.k.shape())?;
        let mut gv = Tensor::<f32>::scratch(self.device, &[d.batch * d.k_heads * d.len.div_ceil(64), d.dk])?;
        T::gla_prepare_launch(self, d, &mut qh, &mut kh, &mut gv)?;
        Ok((qh, kh, gv))
    }

    /// The output's scale (`1/√dk` unless given).
    pub fn scale(mut self, scale: f32) -> Self {
        self.scale = Some(scale);
        self
    }

    /// Runs it into `o` (as `v`) and, if given, the last state `h_last` (`[batch, heads, dk,
    /// dv]`, f32).
    ///
    /// # Errors
    /// [`Error::Argument`] naming the tensor whose rank, shape or contiguity does not fit, or a
    /// head dim without a kernel; a launch error (the kernels need sm_90a).
    pub fn run(&self, o: &mut Tensor<T>, h_last: Option<&mut Tensor<f32>>) -> Result<()> {
        let d = self.dims(o, h_last.as_deref(), false)?;
        if self.feature != FeatureMap::Identity {
            let (q, k) = self.mapped()?;
            return self.with_qk(&q, &k).run(o, h_last);
        }
        if self.gates.is_some() && d.batch * d.heads * d.len > 0 {
            let (qh, kh, gv) = self.gates_prepared(d)?;
            let prepared = LinearAttention { q: &qh, k: &kh, gates: None, gate_decays: Some(&gv), ..*self };
            return T::linear_attention_launch(&prepared, d, o, h_last);
        }
        if d.batch == 0 || d.heads == 0 {
            return Ok(());
        }
        if d.len == 0 {
            if let Some(hl) = h_last {
                let h = match self.h0 {
                    Some(h0) => h0.to_host()?,
                    None => vec![0.0; d.batch * d.heads * d.dk * d.dv],
                };
                hl.copy_from_host(&h)?;
            }
            return Ok(());
        }
        T::linear_attention_launch(self, d, o, h_last)
    }

    /// The gradients of the inputs from `dout` (the gradient of the output, as `v`) and, if
    /// given, `dh_last` (of the last state, `[batch, heads, dk, dv]`, f32): two walks over the
    /// sequence, nothing of the forward saved — one forward (the state rebuilt; dq), one back
    /// (the state's gradient; dk, dv, dβ, the initial state's). The decay's gradient `dg_t` sums,
    /// over every pair of steps `i ≥ t > j` (and the initial state, and the last state's
    /// gradient), that pair's term with its own decay — each walk adds its share — rather than
    /// the difference `q·dq − k·dk` of near terms, which loses the small ones a strong decay
    /// leaves.
    ///
    /// ```ignore
    /// let grads = LinearAttention::new(&dev, &q, &k, &v).decay(&g).backward(&dout, None)?;
    /// ```
    ///
    /// # Errors
    /// As [`LinearAttention::run`], and [`Error::Argument`] naming `dout` or `dh_last` where its
    /// shape is not v's (the state's) or it is not contiguous.
    pub fn backward(&self, dout: &Tensor<T>, dh_last: Option<&Tensor<f32>>) -> Result<LinearAttentionGrads<T>> {
        let d = self.dims(dout, dh_last, true)?;
        let dev = self.device;
        if self.gates.is_some() && d.batch * d.heads * d.len > 0 {
            // The walks on q̂, k̂ with the chunks' decays on the state's rows, then the gates'
            // own gradient and dq, dk back through the scaling (`gla_finish`).
            let (qh, kh, gv) = self.gates_prepared(d)?;
            let mut dgl = Tensor::<f32>::zeros(dev, gv.shape())?;
            let prepared = LinearAttention { q: &qh, k: &kh, gates: None, gate_decays: Some(&gv), ..*self };
            let mut grads = prepared.walk_back(d, dout, dh_last, Some(&mut dgl))?;
            let mut dq = Tensor::<T>::scratch(dev, self.q.shape())?;
            let mut dk = Tensor::<T>::scratch(dev, self.k.shape())?;
            let mut dg = Tensor::<f32>::scratch(dev, self.k.shape())?;
            T::gla_finish_launch(self, d, &grads.dq, &grads.dk, &dgl, GlaGrads { dq: &mut dq, dk: &mut dk, dg: &mut dg })?;
            (grads.dq, grads.dk, grads.dg) = (dq, dk, Some(dg));
            return Ok(grads);
        }
        self.walk_back(d, dout, dh_last, None)
    }

    /// The two walks of [`backward`](Self::backward) (with `dgl` where the state's rows carry
    /// per-channel decays).
    fn walk_back(
        &self, d: Dims, dout: &Tensor<T>, dh_last: Option<&Tensor<f32>>, dgl: Option<&mut Tensor<f32>>,
    ) -> Result<LinearAttentionGrads<T>> {
        let dev = self.device;
        if self.feature != FeatureMap::Identity {
            // The gradients of φ(q) and φ(k), then through φ′.
            let (q, k) = self.mapped()?;
            let mut grads = self.with_qk(&q, &k).backward(dout, dh_last)?;
            for (x, g) in [(self.q, &mut grads.dq), (self.k, &mut grads.dk)] {
                let mut dx = Tensor::<T>::scratch(dev, x.shape())?;
                T::feature_launch(dev, x, Some(g), &mut dx, self.feature.code())?;
                *g = dx;
            }
            return Ok(grads);
        }
        let steps = [d.batch, d.heads, d.len];
        // q and k gradients go straight out in T; a grouped head's are summed in f32 first
        // (zeroed for the atomic adds) and cast. dq, dk, dv: every element written, no clearing.
        let mut dq = Tensor::<T>::scratch(dev, self.q.shape())?;
        let mut dk = Tensor::<T>::scratch(dev, self.k.shape())?;
        let mut dq32 = (d.q_heads < d.heads).then(|| Tensor::<f32>::zeros(dev, self.q.shape())).transpose()?;
        let mut dk32 = (d.k_heads < d.heads).then(|| Tensor::<f32>::zeros(dev, self.k.shape())).transpose()?;
        let mut dv = Tensor::<T>::scratch(dev, self.v.shape())?;
        let mut dg = self.g.map(|_| Tensor::<f32>::zeros(dev, &steps)).transpose()?;
        let mut dbeta = self.beta.map(|_| Tensor::<f32>::zeros(dev, &steps)).transpose()?;
        let mut dh0 = self.h0.map(|h| Tensor::<f32>::zeros(dev, h.shape())).transpose()?;
        // With a decay: each chunk's starting state (16-bit), for the decay's gradient.
        let (rows, chunks) = (d.batch * d.heads, d.len.div_ceil(64));
        let saves = self.g.is_some() || self.gate_decays.is_some();
        let mut hsave = saves.then(|| Tensor::<T>::scratch(dev, &[rows * chunks, d.dk, d.dv])).transpose()?;
        let empty = d.batch == 0 || d.heads == 0 || d.len == 0;
        if !empty {
            let bw = Backward {
                dout,
                dh_last,
                dq: &mut dq,
                dk: &mut dk,
                dq32: dq32.as_mut(),
                dk32: dk32.as_mut(),
                dv: &mut dv,
                dg: dg.as_mut(),
                dbeta: dbeta.as_mut(),
                dh0: dh0.as_mut(),
                hsave: hsave.as_mut(),
                dgl,
            };
            T::linear_attention_bwd_launch(self, d, bw)?;
        } else if let (Some(d0), Some(dl)) = (dh0.as_mut(), dh_last) {
            // No steps: the last state is the first.
            d0.copy_from_host(&dl.to_host()?)?;
        }
        for (sum, out) in [(&dq32, &mut dq), (&dk32, &mut dk)] {
            if let Some(x) = sum {
                if x.shape().iter().product::<usize>() > 0 {
                    T::cast_launch(dev, x, out)?;
                }
            }
        }
        Ok(LinearAttentionGrads { dq, dk, dv, dg, dbeta, dh0 })
    }

    /// One step of the recurrence in place, the decode path: `state` (`[batch, heads, dk,
    /// dv]`, f32) is the state before the step and becomes the state after it; `o` the step's
    /// output. q, k, v (and the decay and β, `[batch, heads, 1]`) are those of a sequence of
    /// length 1; a block updates 64 of the state's columns of one (batch, head), reading the
    /// state once and writing it once.
    ///
    /// ```ignore
    /// for token in 0..n {
    ///     LinearAttention::new(&dev, &q_t, &k_t, &v_t).decay(&g_t).run_step(&mut state, &mut o_t)?;
    /// }
    /// ```
    ///
    /// # Errors
    /// As [`LinearAttention::run`], and [`Error::Argument`] where the inputs are longer than one
    /// step or an `initial_state` is given (`state` is the state the step starts from).
    pub fn run_step(&self, state: &mut Tensor<f32>, o: &mut Tensor<T>) -> Result<()> {
        if self.h0.is_some() {
            return Err(self.arg("initial_state", "none: `state` is the state the step starts from".into(), "a tensor".into()));
        }
        let d = self.dims(o, Some(state), false)?;
        if d.len != 1 {
            return Err(self.arg("q", "one step: a sequence of length 1".into(), format!("length {}", d.len)));
        }
        if self.skip.is_some() {
            return Err(self.arg("d", "no skip in a step (add D·x after it)".into(), "a D".into()));
        }
        if self.feature != FeatureMap::Identity {
            let (q, k) = self.mapped()?;
            return self.with_qk(&q, &k).run_step(state, o);
        }
        if d.batch == 0 || d.heads == 0 {
            return Ok(());
        }
        T::step_launch(self, d, state, o)
    }

    fn arg(&self, arg: &str, expected: String, found: String) -> Error {
        Error::Argument { kernel: "linear_attention", arg: arg.into(), expected, found }
    }

    /// The sizes, after checking every shape and layout: `o` is the output (or, named `dout`, its
    /// gradient), `h_last` the last state (or its gradient `dh_last`).
    fn dims(&self, o: &Tensor<T>, h_last: Option<&Tensor<f32>>, backward: bool) -> Result<Dims> {
        let (o_name, h_name) = if backward { ("dout", "dh_last") } else { ("o", "h_last") };
        let arg = |a: &str, e: String, f: String| self.arg(a, e, f);
        let four = |name: &str, t: &[usize]| -> Result<[usize; 4]> {
            let [b, x, y, d] = *t else {
                return Err(arg(name, "rank 4: [batch, seq, heads, d] or [batch, heads, seq, d]".into(), format!("shape {t:?}")));
            };
            Ok(match self.layout {
                AttentionLayout::Bshd => [b, y, x, d],
                AttentionLayout::Bhsd => [b, x, y, d],
            })
        };
        let [batch, heads, len, dv] = four("v", self.v.shape())?;
        let [qb, q_heads, ql, dk] = four("q", self.q.shape())?;
        let [kb, k_heads, kl, kd] = four("k", self.k.shape())?;
        if (qb, ql) != (batch, len) {
            return Err(arg("q", format!("batch {batch} and seq {len}, as v"), format!("batch {qb}, seq {ql}")));
        }
        if (kb, kl, kd) != (batch, len, dk) {
            return Err(arg(
                "k",
                format!("batch {batch}, seq {len}, head dim {dk}, as q and v"),
                format!("batch {kb}, seq {kl}, head dim {kd}"),
            ));
        }
        for (name, n) in [("q", q_heads), ("k", k_heads)] {
            if n == 0 || heads % n != 0 {
                return Err(arg(name, format!("a number of heads dividing v's {heads}"), format!("{n} heads")));
            }
        }
        if !matches!(dk, 64 | 128) {
            return Err(arg("q", "a head dim of 64 or 128".into(), format!("{dk}")));
        }
        if !matches!(dv, 64 | 128) {
            return Err(arg("v", "a head dim of 64 or 128".into(), format!("{dv}")));
        }
        if o.shape() != self.v.shape() {
            return Err(arg(o_name, format!("shape {:?}, as v", self.v.shape()), format!("shape {:?}", o.shape())));
        }
        if let Some(gt) = self.gates {
            if gt.shape() != self.k.shape() {
                return Err(arg("gates", format!("k's shape {:?}", self.k.shape()), format!("shape {:?}", gt.shape())));
            }
            if q_heads != k_heads {
                return Err(arg("gates", format!("q and k with as many heads ({k_heads})"), format!("q with {q_heads}")));
            }
            if self.g.is_some() {
                return Err(arg("gates", "gates or a decay, not both".into(), "both".into()));
            }
            if !gt.is_contiguous() {
                return Err(arg("gates", "a contiguous tensor".into(), "strides that are not".into()));
            }
        }
        for (name, t) in [("decay", self.g), ("beta", self.beta)] {
            if let Some(t) = t {
                if t.shape() != [batch, heads, len] {
                    return Err(arg(name, format!("shape {:?}", [batch, heads, len]), format!("shape {:?}", t.shape())));
                }
            }
        }
        for (name, t) in [("initial_state", self.h0), (h_name, h_last)] {
            if let Some(t) = t {
                if t.shape() != [batch, heads, dk, dv] {
                    return Err(arg(name, format!("shape {:?}", [batch, heads, dk, dv]), format!("shape {:?}", t.shape())));
                }
            }
        }
        let named: [(&str, bool); 8] = [
            ("q", self.q.is_contiguous()),
            ("k", self.k.is_contiguous()),
            ("v", self.v.is_contiguous()),
            (o_name, o.is_contiguous()),
            ("decay", self.g.is_none_or(|t| t.is_contiguous())),
            ("beta", self.beta.is_none_or(|t| t.is_contiguous())),
            ("initial_state", self.h0.is_none_or(|t| t.is_contiguous())),
            (h_name, h_last.is_none_or(|t| t.is_contiguous())),
        ];
        if let Some((name, _)) = named.iter().find(|(_, ok)| !ok) {
            return Err(arg(name, "a contiguous tensor".into(), "strides that are not".into()));
        }
        if i32::try_from(batch * heads * len.max(dk * dv)).is_err() {
            return Err(arg("v", "fewer than 2³¹ rows".into(), format!("batch {batch}, heads {heads}, seq {len}")));
        }
        Ok(Dims { batch, heads, q_heads, k_heads, len, dk, dv })
    }
}
