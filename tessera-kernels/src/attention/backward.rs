//! FlashAttention backward (FA2's algorithm). `attention_bwd_dot` forms `D = rowsum(dO ∘ O)`
//! per query; `attention_bwd_dkv` walks a 128-key tile's query blocks, of every query head of
//! its group (`Sᵀ = K·Qᵀ`, `Pᵀ = exp(Sᵀ·scale − LSE)` from the forward's log-sum-exp, `dV +=
//! Pᵀ·dO`, `dPᵀ = V·dOᵀ`, `dSᵀ = Pᵀ ∘ (dPᵀ − D)`, `dK += dSᵀ·Q`), so that grouped heads' dK
//! and dV are summed in registers. By default (the fast mode, `fused` 1) the same walk forms
//! each block's `dQ = dS·K` too, the two consumers one half each, and adds it into an f32
//! buffer by TMA reduce-adds, `attention_bwd_dq_out` scaling it into dq after: five MMAs a
//! block pair, but the sums' order varies from run to run. `Attention::deterministic(true)`
//! uses no float atomics: `attention_bwd_dq` walks a 128-query tile's key blocks for dQ, S and
//! dP recomputed (seven MMAs). Past head dim 128 one warpgroup cannot hold both dK and dV:
//! `attention_bwd_dkv_wide` walks 64-key tiles with its consumers split by gradient, and dQ
//! takes its own walk in both modes. Tensors as the forward's rank-3 views; `lse` (in log₂ units, as
//! `attention_bwd_dot` leaves it) and `dsum` `[batch·heads, seq_q, 1]` (or `[batch·heads,
//! seq_q]` where rows of queries are read).

use super::kernels::{
    causal_keys, causal_visible, key_blocks, library_dropout, library_score_grad, library_scores, masked_scores, sequence,
    window_prefix_keys, window_prefix_queries, window_prefix_visible,
};
use super::{arg, dense_sizes, dims, head_origins, varlen_sizes, view3, Attention, AttentionElement, Flavor};
use crate::prelude::{drain_stages, fill_stages};
use tessera::{device, kernel, Device, Element, Optional, Result, Tensor};

/// `D = rowsum(dO ∘ O)` (f32) for 64 query rows of one (batch, head) a block, into `dsum`, and
/// the log-sum-exp in log₂ units into `lse_log2` (a row with every key masked has −∞: kept
/// finite, its scores are all masked anyway), both with rows TMA can copy.
#[kernel(dtypes(T = [bf16, f16]), tune(D = [128, 64, 192, 256, 96]))]
#[allow(clippy::too_many_arguments)]
pub fn attention_bwd_dot(
    o: Global<T, 3>, dout: Global<T, 3>, lse: Global<f32, 3>, dsum: Global<f32, 3>, lse_log2: Global<f32, 3>, heads: i32, q_bm: i32,
    hm: i32, cm: i32,
) {
    let (bh, q0, plane, col) = query_rows(o.dim(1), heads, q_bm, hm, cm);
    // 64 columns at a time (whole rows of 256 would not fit in registers), 32 at head dim 96.
    let mut dot = Tile::<f32, 64, 1>::zeros();
    #[unroll]
    for c in 0..D / (64 - D % 64) {
        let c0 = col + c * (64 - D % 64);
        dot = dot
            + row_sum(
                o.load::<Tile<T, 64, { 64 - D % 64 }>>([plane, q0, c0]).cast::<f32>()
                    * dout.load::<Tile<T, 64, { 64 - D % 64 }>>([plane, q0, c0]).cast::<f32>(),
            );
    }
    dsum.store([bh, q0, 0], dot);
    lse_log2.store([bh, q0, 0], max(lse.load::<Tile<f32, 64, 1>>([bh, q0, 0]), -1e30) * f32::consts::LOG2_E);
}

/// The fast mode's dQ from its f32 sums: `dq = dq_acc × scale` in `T`, for the rows
/// `attention_bwd_dot` takes.
#[kernel(dtypes(T = [bf16, f16]), tune(D = [128, 64, 96]))]
pub fn attention_bwd_dq_out(dq_acc: Global<f32, 3>, dq: Global<T, 3>, heads: i32, q_bm: i32, hm: i32, cm: i32, scale: f32) {
    let (bh, q0, plane, col) = query_rows(dq.dim(1), heads, q_bm, hm, cm);
    dq.store([plane, q0, col], (dq_acc.load::<Tile<f32, 64, D>>([bh, q0, 0]) * scale).cast::<T>());
}

/// A block's 64 query rows (of `seq` a head) in the per-query kernels: `(bh, q0, plane, col)`,
/// its (batch·head) row of the log-sum-exp, first query and origin in the rank-3 views (packed
/// sequences: one plane, `bh` the head).
#[device]
fn query_rows(seq: i32, heads: i32, q_bm: i32, hm: i32, cm: i32) -> (i32, i32, i32, i32) {
    let tiles = (seq + 63) / 64;
    let bh = block::id_x() / tiles;
    let q0 = (block::id_x() - bh * tiles) * 64;
    let b = bh / heads;
    let h = bh - b * heads;
    (bh, q0, b * q_bm + h * hm, h * cm)
}

/// A backward block's tile: `(b, h, r0)` — its batch entry, head (of `heads` a batch entry)
/// and first row — for tiles of `rows` rows over `max_len` rows a head.
#[device]
fn backward_tile(max_len: i32, heads: i32, rows: i32) -> (i32, i32, i32) {
    let tiles = (max_len + rows - 1) / rows;
    let bh = block::id_x() / tiles;
    let b = bh / heads;
    (b, bh - b * heads, (block::id_x() - bh * tiles) * rows)
}

/// dQ for the 128 query rows `q0..` of query head `h` of batch entry `b` (its sequence
/// `q_start..`/`k_start..` of `seq_q`/`seq_k` rows, log-sum-exp row `lrow`): a producer brings
/// Q and dO once and K, V block by block (`BN` keys) over `key_range(bh, q0, 128)`'s keys; two
/// consumers, 64 rows each, share the blocks (each skips those outside its own range),
/// recompute P from the log-sum-exp (the forward's `score_mod`, then [`masked_scores`](crate::prelude::masked_scores) with
/// its `mask_mod`), take `dS = P∘(dP − D)` back to the raw scores through
/// `score_grad(g, s, x, qi, kj, bh)` (raw scores `s`, modified `x`: `g·∂x/∂s`, linear in `g` as
/// an elementwise modifier's chain rule is, so it is applied to P before dP is there) and add
/// `dS·K` into dQ in registers, stored once (`× scale`). With the forward's dropout,
/// `dropout(dp, bh, q0, k0)` masks and scales dP as the forward did P (`|p, _, _, _| p` for
/// none). `attention_bwd_dq` is it with the causal mask.
#[device]
#[allow(clippy::too_many_arguments)]
pub fn attention_dq_tile<T, const D: usize, const BN: usize>(
    q: Global<T, 3>, k: Global<T, 3>, v: Global<T, 3>, dout: Global<T, 3>, lse: Global<f32, 3>, dsum: Global<f32, 3>, dq: Global<T, 3>,
    b: i32, h: i32, q0: i32, q_start: i32, seq_q: i32, k_start: i32, seq_k: i32, lrow: i32, heads: i32, group: i32, q_bm: i32, k_bm: i32,
    hm: i32, cm: i32, scale_log2: f32, scale: f32,
    score_mod: impl Fn(Tile<f32, 64, BN>, Tile<f32, 64, BN>, Tile<f32, 64, BN>, i32) -> Tile<f32, 64, BN>,
    score_grad: impl Fn(Tile<f32, 64, BN>, Tile<f32, 64, BN>, Tile<f32, 64, BN>, Tile<f32, 64, BN>, Tile<f32, 64, BN>, i32) -> Tile<f32, 64, BN>,
    mask_mod: impl Fn(Tile<f32, 64, BN>, Tile<f32, 64, BN>, i32) -> Tile<f32, 64, BN>,
    key_range: impl Fn(i32, i32, i32) -> (i32, i32, i32, i32), dropout: impl Fn(Tile<f32, 64, BN>, i32, i32, i32) -> Tile<f32, 64, BN>,
) {
    let bh = b * heads + h;
    let kvh = h / group;
    let (lo, hi, _, _) = key_range(bh, q0, 128);
    let (j0, j1) = key_blocks(lo, hi, seq_k, BN, 0, 1);
    // A tile past its sequence's rows (packed: shorter than the longest) has nothing to do.
    let live = q0 < seq_q;
    let mut nb = j1 - j0;
    if !live {
        nb = 0;
    }
    let sq = Smem::<T, 128, D>::ring(1);
    let sdo = Smem::<T, 128, D>::ring(1);
    let sk = Smem::<T, BN, D>::ring(2);
    let sv = Smem::<T, BN, D>::ring(2);
    let qpipe = Pipeline::<1>::new(2);
    let kvpipe = Pipeline::<2>::new(2);
    if warpgroup::id() == 0 {
        setmaxnreg(24);
        if live {
            let s = qpipe.acquire();
            tma::load(sq.at(s), q, [b * q_bm + h * hm, q_start + q0, h * cm], qpipe);
            tma::load(sdo.at(s), dout, [b * q_bm + h * hm, q_start + q0, h * cm], qpipe);
            qpipe.commit(s);
        }
        fill_stages(kvpipe, nb, |s, j| {
            tma::load(sk.at(s), k, [b * k_bm + kvh * hm, k_start + (j0 + j) * BN, kvh * cm], kvpipe);
            tma::load(sv.at(s), v, [b * k_bm + kvh * hm, k_start + (j0 + j) * BN, kvh * cm], kvpipe);
        });
    } else if live {
        setmaxnreg(240);
        let row = (warpgroup::id() - 1) * 64;
        let qr = q0 + row;
        // The log-sum-exp in log₂ units.
        let lse2 = lse.load_or::<Tile<f32, 64, 1>>([lrow, q_start + qr, 0], 0.0);
        let d = dsum.load_or::<Tile<f32, 64, 1>>([lrow, q_start + qr, 0], 0.0);
        // This consumer's blocks, and the keys all its rows see (no mask there).
        let (clo, chi, full_lo, full_hi) = key_range(bh, qr, 64);
        let (c0, c1) = key_blocks(clo, chi, seq_k, BN, 0, 1);
        let mut dqa = Tile::<f32, 64, D>::zeros();
        let qs = qpipe.wait();
        drain_stages(kvpipe, nb, |s, jj| {
            let j = j0 + jj;
            if j >= c0 && j < c1 {
                let k0 = j * BN;
                let mut sc = Tile::<f32, 64, BN>::zeros();
                mma_sync(sc, sq.at(qs).rows(row, 64), sk.at(s));
                let mut dp = Tile::<f32, 64, BN>::zeros();
                mma_sync(dp, sdo.at(qs).rows(row, 64), sv.at(s));
                // S is done; dP's MMA runs under the softmax.
                mma_wait(1);
                let qi = Tile::<f32, 64, BN>::row_index() + qr as f32;
                let kj = Tile::<f32, 64, BN>::col_index() + k0 as f32;
                let x = score_mod(sc, qi, kj, bh);
                // P with the modifier's derivative taken in (`score_grad` is linear in what it
                // takes back): S's and x's registers free before dP's.
                let pg = score_grad(
                    exp2(masked_scores(x, bh, qr, k0, seq_k, full_lo, full_hi, mask_mod) * scale_log2 - lse2),
                    sc,
                    x,
                    qi,
                    kj,
                    bh,
                );
                mma_wait(0);
                mma_sync_kn(dqa, (pg * (dropout(dp, bh, qr, k0) - d)).cast::<T>(), sk.at(s));
                mma_wait(0);
            }
        });
        qpipe.release(qs);
        // Rows past the sequence are not stored (packed: they are the next sequence's).
        dq.store_within([b * q_bm + h * hm, q_start + qr, h * cm], (dqa * scale).cast::<T>(), [dq.dim(0), q_start + seq_q, dq.dim(2)]);
    }
}

/// dQ for 128 query rows of one (batch, head) a block: [`attention_dq_tile`](crate::prelude::attention_dq_tile) with the causal
/// mask (`causal` 1, the diagonal aligned at the end) or none, packed sequences (`varlen` 1)
/// or padded. Causally, the first consumer skips the last block, past its diagonal.
#[kernel(
    warpgroups = 3,
    dtypes(T = [bf16, f16]),
    tune(
        D = [128, 64, 192, 256, 96], BN = [64, 128, 48],
        only(D <= 128 && D != 96 && BN != 48 || D == 96 && BN == 64 || D == 192 && BN == 64 || D == 256 && BN == 48)
    ),
    targets(sm_90a)
)]
pub fn attention_bwd_dq(
    q: Global<T, 3>, k: Global<T, 3>, v: Global<T, 3>, dout: Global<T, 3>, lse: Global<f32, 3>, dsum: Global<f32, 3>, dq: Global<T, 3>,
    cu_q: Global<i32, 1>, cu_k: Global<i32, 1>, max_q: i32, varlen: i32, heads: i32, group: i32, q_bm: i32, k_bm: i32, hm: i32, cm: i32,
    causal: i32, scale_log2: f32, scale: f32,
) {
    let (b, h, q0) = backward_tile(max_q, heads, 128);
    let (q_start, seq_q, k_start, seq_k, lrow) = sequence(q, k, cu_q, cu_k, varlen, b, b * heads + h, h);
    let shift = seq_k - seq_q;
    #[rustfmt::skip]
    attention_dq_tile::<T, D, BN>(
        q, k, v, dout, lse, dsum, dq, b, h, q0, q_start, seq_q, k_start, seq_k, lrow, heads, group, q_bm, k_bm, hm, cm, scale_log2, scale,
        |s, _qi, _kj, _bh| s,
        |ds, _s, _x, _qi, _kj, _bh| ds,
        |qi, kj, _bh| causal_visible(qi, kj, shift),
        |_bh, q0, rows| causal_keys(q0, rows, seq_k, shift, causal),
        |p, _bh, _q0, _k0| p,
    );
}

/// `attention_bwd_dq` with the library's modifiers (`flash_attention_mods`' knob `M` and
/// parameters; padded layouts, `V` 0, or packed sequences, `V` 1): [`library_scores`](crate::prelude::library_scores), [`library_score_grad`](crate::prelude::library_score_grad) and
/// [`window_prefix_visible`](crate::prelude::window_prefix_visible) over [`window_prefix_keys`](crate::prelude::window_prefix_keys). Key blocks of 64 (at head dim 64,
/// 128 spill: the modified scores live beside P, dP and dQ), 48 at head dim 256 (what fits).
#[kernel(
    warpgroups = 3,
    dtypes(T = [bf16, f16]),
    tune(D = [128, 64, 192, 256, 96], BN = [64, 48], M = [1, 4, 7, 15], V = [0, 1], only(D <= 192 && BN == 64 || D == 256 && BN == 48)),
    targets(sm_90a)
)]
pub fn attention_bwd_dq_mods(
    q: Global<T, 3>, k: Global<T, 3>, v: Global<T, 3>, dout: Global<T, 3>, lse: Global<f32, 3>, dsum: Global<f32, 3>, dq: Global<T, 3>,
    cu_q: Global<i32, 1>, cu_k: Global<i32, 1>, max_q: i32, heads: i32, group: i32, q_bm: i32, k_bm: i32, hm: i32, cm: i32, causal: i32,
    scale_log2: f32, scale: f32, cap: f32, max_bias: f32, alibi_scale: f32, window: i32, prefix: i32, drop_seed_lo: i32, drop_seed_hi: i32,
    drop_offset: i32, drop_p: f32,
) {
    let (b, h, q0) = backward_tile(max_q, heads, 128);
    let (q_start, seq_q, k_start, seq_k, lrow) = mods_sequence::<T, V>(q, k, cu_q, cu_k, b, b * heads + h, h);
    let shift = seq_k - seq_q;
    #[rustfmt::skip]
    attention_dq_tile::<T, D, BN>(
        q, k, v, dout, lse, dsum, dq, b, h, q0, q_start, seq_q, k_start, seq_k, lrow, heads, group, q_bm, k_bm, hm, cm, scale_log2, scale,
        |s, qi, kj, bh| library_scores::<M, BN>(s, qi, kj, bh, heads, cap, max_bias, alibi_scale, shift),
        |ds, s, x, _qi, _kj, _bh| library_score_grad::<M, BN>(ds, s, x, cap),
        |qi, kj, _bh| window_prefix_visible(qi, kj, shift, window, prefix),
        |_bh, q0, rows| window_prefix_keys(q0, rows, seq_k, shift, causal, window, prefix),
        |p, bh, q0, k0| library_dropout::<M, BN, 0>(p, bh, q0, k0, drop_seed_lo, drop_seed_hi, drop_offset, drop_p),
    );
}

/// [`sequence`]'s rows for the modifiers' backward kernels, packed (`V` 1) or padded (`V` 0: a
/// variant of its own, whose lengths stay the tensors' — at head dim 64 the offsets' registers
/// spill the dK/dV walk's 128-query blocks).
#[device]
#[allow(clippy::too_many_arguments)]
fn mods_sequence<T, const V: usize>(
    q: Global<T, 3>, k: Global<T, 3>, cu_q: Global<i32, 1>, cu_k: Global<i32, 1>, b: i32, bh: i32, h: i32,
) -> (i32, i32, i32, i32, i32) {
    let mut q_start = 0;
    let mut seq_q = q.dim(1);
    let mut k_start = 0;
    let mut seq_k = k.dim(1);
    let mut row = bh;
    if V == 1 {
        let (qs, lq, ks, lk, r) = sequence(q, k, cu_q, cu_k, 1, b, bh, h);
        q_start = qs;
        seq_q = lq;
        k_start = ks;
        seq_k = lk;
        row = r;
    }
    (q_start, seq_q, k_start, seq_k, row)
}

/// dK and dV for the 128 keys `k0..` of key/value head `kvh` of batch entry `b` (its sequence
/// as [`attention_dq_tile`](crate::prelude::attention_dq_tile)'s): a producer brings K and V once and Q, dO block by block (`BQ`
/// queries) over `query_range(k0, 128)`'s queries, for every query head of the group; two
/// consumers, 64 keys each, share the blocks, recompute Pᵀ from the log-sum-exp (the same
/// `score_mod` and `mask_mod` on `Sᵀ = K·Qᵀ`, `qi` along its columns, `kj` along its rows;
/// masks applied in blocks outside `query_range(kr, 64)`'s full range), take `dSᵀ` back
/// through `score_grad` and add `Pᵀ·dO` into dV and `dSᵀ·Q` into dK in registers, stored once
/// (dK `× scale`). `lse`, `dsum` as `[batch·heads, seq_q]`. With `fused` 1 (the fast mode)
/// the consumers also form the block's dQ, `dS·K` over the tile's 128 keys (both consumers'
/// dSᵀ through shared memory, read transposed), each one half — 64 queries by `D·BQ/128`
/// columns (at head dim 96 64 and 32 columns, the consumers swapping by block parity) — and
/// add it into the f32 `dq_acc` (`[lse's rows, seq, D]`) by TMA reduce-adds of 32-column
/// panels: no dQ walk, but the sums' order varies from run to run. With the forward's dropout, `dropout_t(x, bh, q0, k0)` (the dQ walk's `dropout` arguments) masks Pᵀ
/// (into dV) and dPᵀ as the forward did P, transposed (`|pt, _, _, _| pt` for none).
#[device]
#[allow(clippy::too_many_arguments)]
pub fn attention_dkv_tile<T, const D: usize, const BQ: usize>(
    q: Global<T, 3>, k: Global<T, 3>, v: Global<T, 3>, dout: Global<T, 3>, lse: Global<f32, 2>, dsum: Global<f32, 2>, dk: Global<T, 3>,
    dv: Global<T, 3>, dq_acc: Global<f32, 3>, b: i32, kvh: i32, k0: i32, q_start: i32, seq_q: i32, k_start: i32, seq_k: i32, varlen: i32,
    heads: i32, group: i32, q_bm: i32, k_bm: i32, hm: i32, cm: i32, fused: i32, scale_log2: f32, scale: f32,
    score_mod: impl Fn(Tile<f32, 64, BQ>, Tile<f32, 64, BQ>, Tile<f32, 64, BQ>, i32) -> Tile<f32, 64, BQ>,
    score_grad: impl Fn(Tile<f32, 64, BQ>, Tile<f32, 64, BQ>, Tile<f32, 64, BQ>, Tile<f32, 64, BQ>, Tile<f32, 64, BQ>, i32) -> Tile<f32, 64, BQ>,
    mask_mod: impl Fn(Tile<f32, 64, BQ>, Tile<f32, 64, BQ>, i32) -> Tile<f32, 64, BQ>,
    query_range: impl Fn(i32, i32) -> (i32, i32, i32, i32), dropout_t: impl Fn(Tile<f32, 64, BQ>, i32, i32, i32) -> Tile<f32, 64, BQ>,
) {
    let (lo, hi, _, _) = query_range(k0, 128);
    let (i0, per_head, total) = dkv_blocks(lo, hi, k0, seq_q, seq_k, group, BQ);
    let live = k0 < seq_k;
    let sk = Smem::<T, 128, D>::ring(1);
    let sv = Smem::<T, 128, D>::ring(1);
    let sq = Smem::<T, BQ, D>::ring(2);
    let sdo = Smem::<T, BQ, D>::ring(2);
    // The fused dQ's staging: both consumers' dSᵀ (a block's 128 keys, two blocks in turn),
    // and each consumer's half of the block's dQ, f32, in 32-column panels.
    let sds = Smem::<T, 128, BQ>::ring(2);
    // (Two blocks' worth at head_dim 128, so that a block's reduce-adds are not waited for by
    // the next; at 64 that would pass the shared-memory limit by 48 bytes; 96 as 128.)
    let sdq = Smem::<f32, 64, 32>::ring({ (D + D % 64) * BQ / 2048 * ((D + 32) / 64) });
    // Each block's log-sum-exp and D rows, brought with its Q and dO (dense layouts: TMA needs
    // a box's first column 16-byte aligned, which a packed sequence's start is not).
    let slse = Smem::<f32, 1, BQ>::ring_swizzled(2, 0);
    let sdsum = Smem::<f32, 1, BQ>::ring_swizzled(2, 0);
    let kpipe = Pipeline::<1>::new(2);
    let qpipe = Pipeline::<2>::new(2);
    if warpgroup::id() == 0 {
        setmaxnreg(24);
        #[rustfmt::skip]
        load_dkv_blocks(
            q, k, v, dout, lse, dsum, sk, sv, sq, sdo, slse, sdsum, kpipe, qpipe, k0, seq_k, total, per_head, i0, kvh, group, b, heads,
            varlen, q_start, k_start, q_bm, k_bm, hm, cm,
        );
    } else if live {
        setmaxnreg(240);
        let me = warpgroup::id() - 1;
        let row = me * 64;
        let kr = k0 + row;
        // The queries that see all this consumer's keys: no mask there.
        let (_, _, full_lo, full_hi) = query_range(kr, 64);
        let mut dka = Tile::<f32, 64, D>::zeros();
        let mut dva = Tile::<f32, 64, D>::zeros();
        let ks = kpipe.wait();
        drain_stages(qpipe, total, |s, n| {
            let (h, q0, lrow) = query_block(n, per_head, i0, kvh, group, b, heads, varlen, BQ);
            let bh = b * heads + h;
            let mut st = Tile::<f32, 64, BQ>::zeros();
            mma_sync(st, sk.at(ks).rows(row, 64), sq.at(s));
            // (dPᵀ's MMA issued here too, to run under the softmax, serializes the MMAs: its
            // registers beside S's, dK's and dV's do not fit.)
            mma_wait(0);
            // Each element's query (along Sᵀ's columns) and key (along its rows).
            let qi = Tile::<f32, 64, BQ>::col_index() + q0 as f32;
            let kj = Tile::<f32, 64, BQ>::row_index() + kr as f32;
            let xm = score_mod(st, qi, kj, bh);
            // Fused, keys past the sequence (packed: the next one's) must not reach dQ.
            let mut keys = 64;
            if fused == 1 {
                keys = seq_k - kr;
            }
            #[rustfmt::skip]
            let pt = exp2(transposed_logits(
                xm, lse, slse, s, varlen, lrow, q_start, q0, kr, keys, seq_q, full_lo, full_hi, bh, scale_log2, mask_mod,
            ));
            // dV's MMA and dPᵀ's run together.
            mma_sync_kn(dva, dropout_t(pt, bh, q0, kr).cast::<T>(), sdo.at(s));
            // Pᵀ with the modifier's derivative taken in (`score_grad` is linear in what it
            // takes back): Sᵀ's and the modified scores' registers free before dPᵀ's.
            let pg = score_grad(pt, st, xm, qi, kj, bh);
            let mut dpt = Tile::<f32, 64, BQ>::zeros();
            mma_sync(dpt, sv.at(ks).rows(row, 64), sdo.at(s));
            mma_wait(0);
            let ds = (pg * less_block_rows(dropout_t(dpt, bh, q0, kr), dsum, sdsum, s, varlen, lrow, q_start, q0)).cast::<T>();
            mma_sync_kn(dka, ds, sq.at(s));
            if D % 64 == 0 && fused == 1 {
                // The block's dQ = dS·K over all 128 keys: each consumer puts its keys' dSᵀ
                // rows in, and once both are there forms half of dQ, 64 queries by
                // `D·BQ/128` columns: by queries at 128 queries a block (A's panels: dSᵀ's
                // columns), by K's columns at 64 (B's panels).
                let b2 = n % 2;
                sds.at(b2).rows(row, 64).store(ds);
                barrier::sync(0, 2);
                let mut dqp = Tile::<f32, 64, { D * BQ / 128 }>::zeros();
                if me == 0 {
                    mma_sync_kn(dqp, sds.at(b2).cols(0, 64).t(), sk.at(ks).cols(0, D * BQ / 128));
                } else {
                    mma_sync_kn(dqp, sds.at(b2).cols(BQ - 64, 64).t(), sk.at(ks).cols(D - D * BQ / 128, D * BQ / 128));
                }
                mma_wait(0);
                // The reduce-adds of the block that last used these panels have read them (at
                // head_dim 128 the previous block's, D·BQ/4096 of them, may still run).
                tma::store_wait(D * BQ / 4096 * (D / 64 - 1));
                let panel = (n % (D / 64)) * (D * BQ / 2048) + me * (D * BQ / 4096);
                let qh = me * (BQ - 64);
                let ch = me * (D - D * BQ / 128);
                #[unroll]
                for p in 0..D * BQ / 4096 {
                    sdq.at(panel + p).store(dqp.cols(p * 32, 32));
                }
                #[unroll]
                for p in 0..D * BQ / 4096 {
                    tma::reduce_add(dq_acc, [lrow, q_start + q0 + qh, ch + p * 32], sdq.at(panel + p));
                }
            }
            if D == 96 && fused == 1 {
                // Head dim 96 (64 queries a block): K's 96 columns are three 64-byte panels, so
                // dQ splits 64 + 32, the consumers taking the wide part in turn (block parity),
                // each's panels two blocks' worth.
                let b2 = n % 2;
                sds.at(b2).rows(row, 64).store(ds);
                barrier::sync(0, 2);
                let panel = b2 * 4 + me * 2;
                if (n + me) % 2 == 0 {
                    let mut dqw = Tile::<f32, 64, 64>::zeros();
                    mma_sync_kn(dqw, sds.at(b2).cols(0, 64).t(), sk.at(ks).cols(0, 64));
                    mma_wait(0);
                    // The previous block's one reduce-add may still run, not the one before.
                    tma::store_wait(1);
                    sdq.at(panel).store(dqw.cols(0, 32));
                    sdq.at(panel + 1).store(dqw.cols(32, 32));
                    tma::reduce_add(dq_acc, [lrow, q_start + q0, 0], sdq.at(panel));
                    tma::reduce_add(dq_acc, [lrow, q_start + q0, 32], sdq.at(panel + 1));
                } else {
                    let mut dqn = Tile::<f32, 64, 32>::zeros();
                    mma_sync_kn(dqn, sds.at(b2).cols(0, 64).t(), sk.at(ks).cols(64, 32));
                    mma_wait(0);
                    // (The previous block's two.)
                    tma::store_wait(2);
                    sdq.at(panel).store(dqn);
                    tma::reduce_add(dq_acc, [lrow, q_start + q0, 64], sdq.at(panel));
                }
            }
            mma_wait(0);
        });
        tma::store_wait(0);
        kpipe.release(ks);
        // Rows past the sequence are not stored (packed: they are the next sequence's).
        let plane = b * k_bm + kvh * hm;
        let end = k_start + seq_k;
        dk.store_within([plane, k_start + kr, kvh * cm], (dka * scale).cast::<T>(), [dk.dim(0), end, dk.dim(2)]);
        dv.store_within([plane, k_start + kr, kvh * cm], dva.cast::<T>(), [dv.dim(0), end, dv.dim(2)]);
    }
}

/// `x` less a dK/dV block's per-query row (the log-sum-exp in log₂ units, or D): from the stage
/// `s` of `ring` its producer brought (padded layouts), or read from `t`'s row `lrow` (packed:
/// TMA boxes cannot start at a sequence's first query), queries `q0..` of the sequence at
/// `q_start` — read in `x`'s layout.
#[device]
#[allow(clippy::too_many_arguments)]
fn less_block_rows<const BQ: usize>(
    x: Tile<f32, 64, BQ>, t: Global<f32, 2>, ring: Smem<f32, 1, BQ>, s: i32, varlen: i32, lrow: i32, q_start: i32, q0: i32,
) -> Tile<f32, 64, BQ> {
    let mut y = x;
    if varlen == 1 {
        y = x - t.load_or::<Tile<f32, 1, BQ>>([lrow, q_start + q0], 0.0);
    } else {
        y = x - ring.at(s).load();
    }
    y
}

/// The modified scores `xm` of a dK/dV block (`Sᵀ`: keys `kr..` down, queries `q0..` across) as
/// Pᵀ's exponent: `xm·scale_log2` less each query's log-sum-exp (as [`less_block_rows`] reads
/// `lse`), −∞ for queries past the sequence (the tensor's: TMA's zeros; packed: the next one's)
/// and — in blocks outside `full_lo..full_hi` — where `mask_mod` is below 0 (a row with no key
/// at all has exponents up to 1.5·10³⁰ from its clamped log-sum-exp: selected away, not added
/// to); rows from `keys` on (below 64: keys past the sequence) pushed below −10³⁸.
#[device]
#[allow(clippy::too_many_arguments)]
fn transposed_logits<const BQ: usize>(
    xm: Tile<f32, 64, BQ>, lse: Global<f32, 2>, slse: Smem<f32, 1, BQ>, s: i32, varlen: i32, lrow: i32, q_start: i32, q0: i32, kr: i32,
    keys: i32, seq_q: i32, full_lo: i32, full_hi: i32, bh: i32, scale_log2: f32,
    mask_mod: impl Fn(Tile<f32, 64, BQ>, Tile<f32, 64, BQ>, i32) -> Tile<f32, 64, BQ>,
) -> Tile<f32, 64, BQ> {
    // (The scaled scores less the row in place, not through `less_block_rows`: its copy of the
    // scores moved the fast dK/dV walk's register allocation, 2–4% slower, runs 235–237.)
    let mut x = xm * scale_log2;
    if varlen == 1 {
        x = x - lse.load_or::<Tile<f32, 1, BQ>>([lrow, q_start + q0], 0.0);
    } else {
        x = x - slse.at(s).load();
    }
    if q0 + BQ > seq_q {
        x = x.mask_cols(seq_q - q0, f32::NEG_INFINITY);
    }
    if q0 < full_lo || q0 + BQ > full_hi {
        x = x.keep_where(
            mask_mod(Tile::<f32, 64, BQ>::col_index() + q0 as f32, Tile::<f32, 64, BQ>::row_index() + kr as f32, bh),
            f32::NEG_INFINITY,
        );
    }
    if keys < 64 {
        x = x - (Tile::<f32, 64, BQ>::row_index() - keys as f32).step() * 1e38;
    }
    x
}

/// dK and dV for the 64 keys `k0..` of key/value head `kvh` at head dims past 128, where one
/// warpgroup cannot hold both (64 keys × 256 columns each are 128 registers a thread): the
/// consumers split the walk by gradient. The first forms `Sᵀ = K·Qᵀ`, Pᵀ and `dV += Pᵀ·dO`,
/// and hands Pᵀ (through `score_grad`, f32) to the second through shared memory, two blocks
/// in turn (named barriers 1–2 full, 3–4 free); the second forms `dPᵀ = V·dOᵀ`, `dSᵀ` and
/// `dK += dSᵀ·Q`. Two MMAs a block each. Otherwise as [`attention_dkv_tile`](crate::prelude::attention_dkv_tile)
/// (its closures, its query blocks `query_range(k0, 64)` of every query head of the group, `S`
/// stages of `BQ` queries, its `dropout_t`), without the fused dQ: dQ takes its own walk.
#[device]
#[allow(clippy::too_many_arguments)]
pub fn attention_dkv_wide_tile<T, const D: usize, const BQ: usize, const S: usize>(
    q: Global<T, 3>, k: Global<T, 3>, v: Global<T, 3>, dout: Global<T, 3>, lse: Global<f32, 2>, dsum: Global<f32, 2>, dk: Global<T, 3>,
    dv: Global<T, 3>, b: i32, kvh: i32, k0: i32, q_start: i32, seq_q: i32, k_start: i32, seq_k: i32, varlen: i32, heads: i32, group: i32,
    q_bm: i32, k_bm: i32, hm: i32, cm: i32, scale_log2: f32, scale: f32,
    score_mod: impl Fn(Tile<f32, 64, BQ>, Tile<f32, 64, BQ>, Tile<f32, 64, BQ>, i32) -> Tile<f32, 64, BQ>,
    score_grad: impl Fn(Tile<f32, 64, BQ>, Tile<f32, 64, BQ>, Tile<f32, 64, BQ>, Tile<f32, 64, BQ>, Tile<f32, 64, BQ>, i32) -> Tile<f32, 64, BQ>,
    mask_mod: impl Fn(Tile<f32, 64, BQ>, Tile<f32, 64, BQ>, i32) -> Tile<f32, 64, BQ>,
    query_range: impl Fn(i32, i32) -> (i32, i32, i32, i32), dropout_t: impl Fn(Tile<f32, 64, BQ>, i32, i32, i32) -> Tile<f32, 64, BQ>,
) {
    let (lo, hi, full_lo, full_hi) = query_range(k0, 64);
    let (i0, per_head, total) = dkv_blocks(lo, hi, k0, seq_q, seq_k, group, BQ);
    let live = k0 < seq_k;
    let sk = Smem::<T, 64, D>::ring(1);
    let sv = Smem::<T, 64, D>::ring(1);
    let sq = Smem::<T, BQ, D>::ring(S);
    let sdo = Smem::<T, BQ, D>::ring(S);
    let spg = Smem::<f32, 64, BQ>::ring(2);
    let slse = Smem::<f32, 1, BQ>::ring_swizzled(S, 0);
    let sdsum = Smem::<f32, 1, BQ>::ring_swizzled(S, 0);
    let kpipe = Pipeline::<1>::new(2);
    let qpipe = Pipeline::<S>::new(2);
    if warpgroup::id() == 0 {
        setmaxnreg(24);
        #[rustfmt::skip]
        load_dkv_blocks(
            q, k, v, dout, lse, dsum, sk, sv, sq, sdo, slse, sdsum, kpipe, qpipe, k0, seq_k, total, per_head, i0, kvh, group, b, heads,
            varlen, q_start, k_start, q_bm, k_bm, hm, cm,
        );
    } else if live {
        setmaxnreg(240);
        let plane = b * k_bm + kvh * hm;
        let end = k_start + seq_k;
        let ks = kpipe.wait();
        if warpgroup::id() == 1 {
            let mut dva = Tile::<f32, 64, D>::zeros();
            drain_stages(qpipe, total, |s, n| {
                let (h, q0, lrow) = query_block(n, per_head, i0, kvh, group, b, heads, varlen, BQ);
                let bh = b * heads + h;
                let mut st = Tile::<f32, 64, BQ>::zeros();
                mma_sync(st, sk.at(ks), sq.at(s));
                mma_wait(0);
                let qi = Tile::<f32, 64, BQ>::col_index() + q0 as f32;
                let kj = Tile::<f32, 64, BQ>::row_index() + k0 as f32;
                let xm = score_mod(st, qi, kj, bh);
                let pt = exp2(transposed_logits(
                    xm, lse, slse, s, varlen, lrow, q_start, q0, k0, 64, seq_q, full_lo, full_hi, bh, scale_log2, mask_mod,
                ));
                mma_sync_kn(dva, dropout_t(pt, bh, q0, k0).cast::<T>(), sdo.at(s));
                // Pᵀ to the dK consumer, once it has read what this buffer held two blocks ago.
                if n % 2 == 0 {
                    barrier::sync(3, 2);
                    spg.at(0).store(score_grad(pt, st, xm, qi, kj, bh));
                    barrier::arrive(1, 2);
                } else {
                    barrier::sync(4, 2);
                    spg.at(1).store(score_grad(pt, st, xm, qi, kj, bh));
                    barrier::arrive(2, 2);
                }
                mma_wait(0);
            });
            // The dK consumer's last arrivals, matched.
            barrier::sync(3, 2);
            barrier::sync(4, 2);
            dv.store_within([plane, k_start + k0, kvh * cm], dva.cast::<T>(), [dv.dim(0), end, dv.dim(2)]);
        } else {
            // Both buffers start free.
            barrier::arrive(3, 2);
            barrier::arrive(4, 2);
            let mut dka = Tile::<f32, 64, D>::zeros();
            drain_stages(qpipe, total, |s, n| {
                let (h, q0, lrow) = query_block(n, per_head, i0, kvh, group, b, heads, varlen, BQ);
                let mut dpt = Tile::<f32, 64, BQ>::zeros();
                mma_sync(dpt, sv.at(ks), sdo.at(s));
                mma_wait(0);
                let dp = less_block_rows(dropout_t(dpt, b * heads + h, q0, k0), dsum, sdsum, s, varlen, lrow, q_start, q0);
                if n % 2 == 0 {
                    barrier::sync(1, 2);
                } else {
                    barrier::sync(2, 2);
                }
                // (Read in dPᵀ's layout, the accumulator's: no conversion.)
                let ds = (dp * spg.at(n % 2).load()).cast::<T>();
                if n % 2 == 0 {
                    barrier::arrive(3, 2);
                } else {
                    barrier::arrive(4, 2);
                }
                mma_sync_kn(dka, ds, sq.at(s));
                mma_wait(0);
            });
            dk.store_within([plane, k_start + k0, kvh * cm], (dka * scale).cast::<T>(), [dk.dim(0), end, dk.dim(2)]);
        }
        kpipe.release(ks);
    }
}

/// dK and dV for 64 keys of one (batch, key/value head) a block at head dims 192 and 256:
/// [`attention_dkv_wide_tile`](crate::prelude::attention_dkv_wide_tile) with the causal mask
/// or none, as `attention_bwd_dkv`.
#[kernel(warpgroups = 3, dtypes(T = [bf16, f16]), tune(D = [192, 256], BQ = [64]), targets(sm_90a))]
pub fn attention_bwd_dkv_wide(
    q: Global<T, 3>, k: Global<T, 3>, v: Global<T, 3>, dout: Global<T, 3>, lse: Global<f32, 2>, dsum: Global<f32, 2>, dk: Global<T, 3>,
    dv: Global<T, 3>, cu_q: Global<i32, 1>, cu_k: Global<i32, 1>, max_k: i32, varlen: i32, heads: i32, group: i32, q_bm: i32, k_bm: i32,
    hm: i32, cm: i32, causal: i32, scale_log2: f32, scale: f32,
) {
    let (b, kvh, k0) = backward_tile(max_k, heads / group, 64);
    let (q_start, seq_q, k_start, seq_k, _) = sequence(q, k, cu_q, cu_k, varlen, b, 0, 0);
    let shift = seq_k - seq_q;
    #[rustfmt::skip]
    attention_dkv_wide_tile::<T, D, BQ, 2>(
        q, k, v, dout, lse, dsum, dk, dv, b, kvh, k0, q_start, seq_q, k_start, seq_k, varlen, heads, group, q_bm, k_bm, hm, cm,
        scale_log2, scale,
        |s, _qi, _kj, _bh| s,
        |ds, _s, _x, _qi, _kj, _bh| ds,
        |qi, kj, _bh| causal_visible(qi, kj, shift),
        |k0, rows| window_prefix_queries(k0, rows, seq_q, shift, causal, 1073741824, 0),
        |pt, _bh, _q0, _k0| pt,
    );
}

/// dK and dV for 128 keys of one (batch, key/value head) a block: [`attention_dkv_tile`](crate::prelude::attention_dkv_tile) with
/// the causal mask (`causal` 1; the walk starts at the query block of the tile's first key) or
/// none, packed sequences (`varlen` 1) or padded.
#[kernel(warpgroups = 3, dtypes(T = [bf16, f16]), tune(D = [128, 64, 96], BQ = [64, 128], only(D != 96 || BQ == 64)), targets(sm_90a))]
pub fn attention_bwd_dkv(
    q: Global<T, 3>, k: Global<T, 3>, v: Global<T, 3>, dout: Global<T, 3>, lse: Global<f32, 2>, dsum: Global<f32, 2>, dk: Global<T, 3>,
    dv: Global<T, 3>, dq_acc: Global<f32, 3>, cu_q: Global<i32, 1>, cu_k: Global<i32, 1>, max_k: i32, varlen: i32, heads: i32, group: i32,
    q_bm: i32, k_bm: i32, hm: i32, cm: i32, causal: i32, fused: i32, scale_log2: f32, scale: f32,
) {
    let (b, kvh, k0) = backward_tile(max_k, heads / group, 128);
    let (q_start, seq_q, k_start, seq_k, _) = sequence(q, k, cu_q, cu_k, varlen, b, 0, 0);
    let shift = seq_k - seq_q;
    #[rustfmt::skip]
    attention_dkv_tile::<T, D, BQ>(
        q, k, v, dout, lse, dsum, dk, dv, dq_acc, b, kvh, k0, q_start, seq_q, k_start, seq_k, varlen, heads, group, q_bm, k_bm, hm, cm,
        fused, scale_log2, scale,
        |s, _qi, _kj, _bh| s,
        |ds, _s, _x, _qi, _kj, _bh| ds,
        |qi, kj, _bh| causal_visible(qi, kj, shift),
        |k0, rows| window_prefix_queries(k0, rows, seq_q, shift, causal, 1073741824, 0),
        |pt, _bh, _q0, _k0| pt,
    );
}

/// `attention_bwd_dkv` with the library's modifiers, as `attention_bwd_dq_mods`: query
/// blocks of `8192 / D`, the walk over [`window_prefix_queries`](crate::prelude::window_prefix_queries)' range.
#[kernel(
    warpgroups = 3,
    dtypes(T = [bf16, f16]),
    tune(D = [128, 64, 96], M = [1, 4, 7, 15], V = [0, 1], BQ = [64, 128], only(BQ * D == 8192 || D == 96 && BQ == 64)),
    targets(sm_90a)
)]
pub fn attention_bwd_dkv_mods(
    q: Global<T, 3>, k: Global<T, 3>, v: Global<T, 3>, dout: Global<T, 3>, lse: Global<f32, 2>, dsum: Global<f32, 2>, dk: Global<T, 3>,
    dv: Global<T, 3>, dq_acc: Global<f32, 3>, cu_q: Global<i32, 1>, cu_k: Global<i32, 1>, max_k: i32, heads: i32, group: i32, q_bm: i32,
    k_bm: i32, hm: i32, cm: i32, causal: i32, fused: i32, scale_log2: f32, scale: f32, cap: f32, max_bias: f32, alibi_scale: f32,
    window: i32, prefix: i32, drop_seed_lo: i32, drop_seed_hi: i32, drop_offset: i32, drop_p: f32,
) {
    let (b, kvh, k0) = backward_tile(max_k, heads / group, 128);
    let (q_start, seq_q, k_start, seq_k, _) = mods_sequence::<T, V>(q, k, cu_q, cu_k, b, 0, 0);
    let shift = seq_k - seq_q;
    #[rustfmt::skip]
    attention_dkv_tile::<T, D, BQ>(
        q, k, v, dout, lse, dsum, dk, dv, dq_acc, b, kvh, k0, q_start, seq_q, k_start, seq_k, V, heads, group, q_bm, k_bm, hm, cm,
        fused, scale_log2, scale,
        |s, qi, kj, bh| library_scores::<M, BQ>(s, qi, kj, bh, heads, cap, max_bias, alibi_scale, shift),
        |ds, s, x, _qi, _kj, _bh| library_score_grad::<M, BQ>(ds, s, x, cap),
        |qi, kj, _bh| window_prefix_visible(qi, kj, shift, window, prefix),
        |k0, rows| window_prefix_queries(k0, rows, seq_q, shift, causal, window, prefix),
        |pt, bh, q0, k0| library_dropout::<M, BQ, 1>(pt, bh, q0, k0, drop_seed_lo, drop_seed_hi, drop_offset, drop_p),
    );
}

/// `attention_bwd_dkv_wide` with the library's modifiers, as `attention_bwd_dkv_mods`: head
/// dims 192 and 256, [`attention_dkv_wide_tile`](crate::prelude::attention_dkv_wide_tile)'s
/// 64-key tiles and 64-query blocks.
#[kernel(warpgroups = 3, dtypes(T = [bf16, f16]), tune(D = [192, 256], M = [1, 4, 7, 15], V = [0, 1]), targets(sm_90a))]
pub fn attention_bwd_dkv_wide_mods(
    q: Global<T, 3>, k: Global<T, 3>, v: Global<T, 3>, dout: Global<T, 3>, lse: Global<f32, 2>, dsum: Global<f32, 2>, dk: Global<T, 3>,
    dv: Global<T, 3>, cu_q: Global<i32, 1>, cu_k: Global<i32, 1>, max_k: i32, heads: i32, group: i32, q_bm: i32, k_bm: i32, hm: i32,
    cm: i32, causal: i32, scale_log2: f32, scale: f32, cap: f32, max_bias: f32, alibi_scale: f32, window: i32, prefix: i32,
    drop_seed_lo: i32, drop_seed_hi: i32, drop_offset: i32, drop_p: f32,
) {
    let (b, kvh, k0) = backward_tile(max_k, heads / group, 64);
    let (q_start, seq_q, k_start, seq_k, _) = mods_sequence::<T, V>(q, k, cu_q, cu_k, b, 0, 0);
    let shift = seq_k - seq_q;
    #[rustfmt::skip]
    attention_dkv_wide_tile::<T, D, 64, 2>(
        q, k, v, dout, lse, dsum, dk, dv, b, kvh, k0, q_start, seq_q, k_start, seq_k, V, heads, group, q_bm, k_bm, hm, cm,
        scale_log2, scale,
        |s, qi, kj, bh| library_scores::<M, 64>(s, qi, kj, bh, heads, cap, max_bias, alibi_scale, shift),
        |ds, s, x, _qi, _kj, _bh| library_score_grad::<M, 64>(ds, s, x, cap),
        |qi, kj, _bh| window_prefix_visible(qi, kj, shift, window, prefix),
        |k0, rows| window_prefix_queries(k0, rows, seq_q, shift, causal, window, prefix),
        |pt, bh, q0, k0| library_dropout::<M, 64, 1>(pt, bh, q0, k0, drop_seed_lo, drop_seed_hi, drop_offset, drop_p),
    );
}

/// A dK/dV tile's query blocks of `bq` (the tile's keys `k0..` seen by queries `lo..hi`):
/// `(i0, per_head, total)` — the first, how many a query head, and over the `group` heads (none
/// for a tile past its sequence's `seq_k` keys).
#[device]
fn dkv_blocks(lo: i32, hi: i32, k0: i32, seq_q: i32, seq_k: i32, group: i32, bq: i32) -> (i32, i32, i32) {
    let (i0, i1) = key_blocks(lo, hi, seq_q, bq, 0, 1);
    let mut per_head = i1 - i0;
    if k0 >= seq_k {
        per_head = 0;
    }
    (i0, per_head, group * per_head)
}

/// A dK/dV walk's producer: the tile's keys `k0..` of K and V once (when `k0 < seq_k`), then,
/// stage by stage, the `total` query blocks of [`query_block`]'s order — Q and dO, and on padded
/// layouts the blocks' log-sum-exp and D rows.
#[device]
#[allow(clippy::too_many_arguments)]
fn load_dkv_blocks<T, const R: usize, const D: usize, const BQ: usize, const S: usize>(
    q: Global<T, 3>, k: Global<T, 3>, v: Global<T, 3>, dout: Global<T, 3>, lse: Global<f32, 2>, dsum: Global<f32, 2>, sk: Smem<T, R, D>,
    sv: Smem<T, R, D>, sq: Smem<T, BQ, D>, sdo: Smem<T, BQ, D>, slse: Smem<f32, 1, BQ>, sdsum: Smem<f32, 1, BQ>, kpipe: Pipeline<1>,
    qpipe: Pipeline<S>, k0: i32, seq_k: i32, total: i32, per_head: i32, i0: i32, kvh: i32, group: i32, b: i32, heads: i32, varlen: i32,
    q_start: i32, k_start: i32, q_bm: i32, k_bm: i32, hm: i32, cm: i32,
) {
    if k0 < seq_k {
        let s = kpipe.acquire();
        tma::load(sk.at(s), k, [b * k_bm + kvh * hm, k_start + k0, kvh * cm], kpipe);
        tma::load(sv.at(s), v, [b * k_bm + kvh * hm, k_start + k0, kvh * cm], kpipe);
        kpipe.commit(s);
    }
    fill_stages(qpipe, total, |s, n| {
        let (h, q0, lrow) = query_block(n, per_head, i0, kvh, group, b, heads, varlen, BQ);
        tma::load(sq.at(s), q, [b * q_bm + h * hm, q_start + q0, h * cm], qpipe);
        tma::load(sdo.at(s), dout, [b * q_bm + h * hm, q_start + q0, h * cm], qpipe);
        if varlen == 0 {
            tma::load(slse.at(s), lse, [lrow, q0], qpipe);
            tma::load(sdsum.at(s), dsum, [lrow, q0], qpipe);
        }
    });
}

/// The dK/dV walk's block `n` (of `per_head` a query head, from query tile `i0`) for key/value
/// head `kvh`: `(h, q0, lrow)`, its query head, first query and row of the log-sum-exp and D
/// (`(batch·head, query)`, or packed `(head, row)`).
#[device]
#[allow(clippy::too_many_arguments)]
fn query_block(n: i32, per_head: i32, i0: i32, kvh: i32, group: i32, b: i32, heads: i32, varlen: i32, bq: i32) -> (i32, i32, i32) {
    let hh = n / per_head;
    let h = kvh * group + hh;
    let mut lrow = b * heads + h;
    if varlen == 1 {
        lrow = h;
    }
    (h, (i0 + n - hh * per_head) * bq, lrow)
}

/// The gradients of attention ([`attention_backward`]), each in the layout and shape of what
/// it differentiates: `dq` as q, `dk` as k, `dv` as v (summed over a group's query heads).
pub struct AttentionGrads<T: Element> {
    /// ∂L/∂q.
    pub dq: Tensor<T>,
    /// ∂L/∂k.
    pub dk: Tensor<T>,
    /// ∂L/∂v.
    pub dv: Tensor<T>,
}

/// FlashAttention backward: from the forward's inputs `q`, `k`, `v`, its output `o` and
/// log-sum-exp `lse` ([`attention_with_lse`](super::attention_with_lse), same `opts`) and the
/// gradient `dout` reaching `o`, the gradients of `q`, `k` and `v`. P is recomputed from the
/// log-sum-exp, never stored; dQ is summed by reduce-adds into f32, whose order varies from
/// run to run: [`Attention::deterministic`]`(true)` gives the same bits every run, a little
/// slower (past head dim 128 both modes are deterministic: dQ takes its own walk).
/// Layouts, grouped-query heads, causal alignment and head dims (64, 96, 128, 192, 256) as the forward's,
/// and the library's modifiers ([`Attention::softcap`], [`Attention::alibi`],
/// [`Attention::sliding_window`], [`Attention::prefix`], [`Attention::dropout`]; every head dim) taken back
/// through (not a kernel of yours: [`Attention::kernel`] is refused).
///
/// ```no_run
/// use tessera::{bf16, Device, Tensor};
/// use tessera_kernels::{attention_backward, attention_with_lse, Attention};
/// let dev = Device::new(0)?;
/// let q = Tensor::<bf16>::zeros(&dev, &[2, 1024, 16, 128])?; // [batch, seq, heads, dim]
/// let k = Tensor::<bf16>::zeros(&dev, &[2, 1024, 4, 128])?; // 4 key/value heads
/// let v = Tensor::<bf16>::zeros(&dev, &[2, 1024, 4, 128])?;
/// let opts = Attention::new().causal(true);
/// let mut o = Tensor::<bf16>::zeros(&dev, &[2, 1024, 16, 128])?;
/// let mut lse = Tensor::<f32>::zeros(&dev, &[2, 16, 1024])?;
/// attention_with_lse(&dev, &opts, &q, &k, &v, &mut o, &mut lse)?;
/// let dout = Tensor::<bf16>::zeros(&dev, &[2, 1024, 16, 128])?;
/// let grads = attention_backward(&dev, &opts, &q, &k, &v, &o, &lse, &dout)?;
/// assert_eq!(grads.dk.shape(), k.shape());
/// # Ok::<(), tessera::Error>(())
/// ```
///
/// # Errors
/// As the forward's, and [`Error::Argument`](tessera::Error::Argument) naming `dout` when it is not o's shape or is not
/// contiguous, or `kernel` when `opts` holds a kernel of yours.
#[allow(clippy::too_many_arguments)]
pub fn attention_backward<T: AttentionElement>(
    device: &Device, opts: &Attention, q: &Tensor<T>, k: &Tensor<T>, v: &Tensor<T>, o: &Tensor<T>, lse: &Tensor<f32>, dout: &Tensor<T>,
) -> Result<AttentionGrads<T>> {
    let layout = opts.layout;
    let ([b, sq, h, d], [sk, hk]) = dense_sizes(opts, [q, k, v, o], lse)?;
    if dout.shape() != o.shape() {
        return Err(arg("dout", format!("o's shape {:?}", o.shape()), format!("shape {:?}", dout.shape())));
    }
    dims("dout", dout, layout)?;
    let (qs, qst) = view3(layout, [b, sq, h, d]);
    let (ks, kst) = view3(layout, [b, sk, hk, d]);
    let (q_bm, k_bm, hm, cm) = head_origins(layout, h, hk, d);
    let ints = [h, h / hk, q_bm, k_bm, hm, cm, usize::from(opts.causal), sq, sk, 0].map(|x| x as i32);
    let none = Optional(None, 1);
    let (bd, bq) = (b * h * sq.div_ceil(64), b * h * sq.div_ceil(128));
    let (bk, bk64) = (b * hk * sk.div_ceil(128), b * hk * sk.div_ceil(64));
    run(device, opts, d, [q, k, v, o, dout], lse, [b * h, sq], [(qs, qst), (ks, kst)], [bd, bq, bk, bk64], [&none, &none], ints)
}

/// [`attention_backward`] for sequences packed end to end, as [`attention_varlen`](super::attention_varlen)
/// takes them: `q`, `o`, `dout` `[total_q, heads, dim]`, `k`, `v` `[total_k, kv_heads, dim]`,
/// `lse` `[heads, total_q]`, the offsets on the device, `max_seqlen_q` and `max_seqlen_k` at
/// least every sequence's query and key length (tiles past them are not computed). The
/// gradients come in the inputs' packed shapes.
///
/// # Errors
/// As [`attention_varlen`](super::attention_varlen)'s (offsets read back and checked with
/// [`Attention::check_offsets`]), and [`Error::Argument`](tessera::Error::Argument) naming
/// `dout` when it is not o's shape, or `max_seqlen_k` of 0.
#[allow(clippy::too_many_arguments)]
pub fn attention_varlen_backward<T: AttentionElement>(
    device: &Device, opts: &Attention, q: &Tensor<T>, k: &Tensor<T>, v: &Tensor<T>, o: &Tensor<T>, lse: &Tensor<f32>, dout: &Tensor<T>,
    cu_seqlens_q: &Tensor<i32>, cu_seqlens_k: &Tensor<i32>, max_seqlen_q: usize, max_seqlen_k: usize,
) -> Result<AttentionGrads<T>> {
    let ([tq, h, d], [tk, hk], b) = varlen_sizes(opts, [q, k, v, o], lse, [cu_seqlens_q, cu_seqlens_k], max_seqlen_q)?;
    if dout.shape() != o.shape() || !dout.is_contiguous() {
        return Err(arg("dout", format!("a contiguous tensor of o's shape {:?}", o.shape()), format!("shape {:?}", dout.shape())));
    }
    if max_seqlen_k == 0 || i32::try_from(b * hk * max_seqlen_k.div_ceil(64)).is_err() {
        return Err(arg("max_seqlen_k", "1 or more, and fewer than 2³¹ tiles".into(), format!("{max_seqlen_k}")));
    }
    let (qs, qst) = ([1, tq, h * d], [tq * h * d, h * d, 1]);
    let (ks, kst) = ([1, tk, hk * d], [tk * hk * d, hk * d, 1]);
    let ints = [h, h / hk, 0, 0, 0, d, usize::from(opts.causal), max_seqlen_q, max_seqlen_k, 1].map(|x| x as i32);
    let (cq, ck) = (Optional(Some(cu_seqlens_q), 1), Optional(Some(cu_seqlens_k), 1));
    // D = rowsum(dO∘O) needs no offsets: the packed rows as one plane, a row of D a head.
    let grids =
        [h * tq.div_ceil(64), b * h * max_seqlen_q.div_ceil(128), b * hk * max_seqlen_k.div_ceil(128), b * hk * max_seqlen_k.div_ceil(64)];
    run(device, opts, d, [q, k, v, o, dout], lse, [h, tq], [(qs, qst), (ks, kst)], grids, [&cq, &ck], ints)
}

/// What both forms share once their views' shapes are known (head dim `d`): the gradients
/// allocated, the rank-3 views (q/o/dout and k/v), the log-sum-exp as `rows × cols` queries,
/// the padded scratch for D and the log-sum-exp in log₂ units, the fast mode's f32 dQ sums,
/// and the launches.
#[allow(clippy::too_many_arguments)]
fn run<T: AttentionElement>(
    device: &Device, opts: &Attention, d: usize, [q, k, v, o, dout]: [&Tensor<T>; 5], lse: &Tensor<f32>, [rows, cols]: [usize; 2],
    [(qs, qst), (ks, kst)]: [([usize; 3], [usize; 3]); 2], grids: [usize; 4], cu: [&Optional<Tensor<i32>>; 2], ints: [i32; 10],
) -> Result<AttentionGrads<T>> {
    // The library's modifiers have their walks; a kernel of the caller's has no backward.
    let mods = match opts.flavor(d, ints[9] != 0)? {
        Flavor::Plain => None,
        Flavor::Mods(mods) => Some(mods),
        Flavor::Custom(_) => {
            return Err(arg(
                "kernel",
                "no kernel of yours (its backward is not built: the library's modifiers have one)".into(),
                format!("{opts:?}"),
            ))
        }
    };
    let mut grads = AttentionGrads {
        dq: Tensor::scratch(device, q.shape())?,
        dk: Tensor::scratch(device, k.shape())?,
        dv: Tensor::scratch(device, v.shape())?,
    };
    // D and the log-sum-exp in log₂ units, rows padded to 16 bytes for TMA.
    let pitch = cols.next_multiple_of(4);
    let (mut dsum, mut lse_log2) = (Tensor::<f32>::scratch(device, &[rows, pitch])?, Tensor::<f32>::scratch(device, &[rows, pitch])?);
    let (qv, kv, vv) = (q.view(&qs, &qst)?, k.view(&ks, &kst)?, v.view(&ks, &kst)?);
    let (ov, dov) = (o.view(&qs, &qst)?, dout.view(&qs, &qst)?);
    let lse3 = lse.view(&[rows, cols, 1], &[cols, 1, 1])?;
    let scale = opts.scale_for(d);
    // The fast mode's dQ sums, f32, a row a query as the log-sum-exp's. Past head dim 128 dQ
    // always takes its own walk (the dK/dV walk's registers hold no dQ there).
    let mut dq_acc = if opts.deterministic || d > 128 { None } else { Some(Tensor::<f32>::zeros(device, &[rows, cols, d])?) };
    let AttentionGrads { dq, dk, dv } = &mut grads;
    let (mut dqv, mut dkv, mut dvv) = (dq.view_mut(&qs, &qst)?, dk.view_mut(&ks, &kst)?, dv.view_mut(&ks, &kst)?);
    T::backward(
        device,
        d,
        grids,
        [&qv, &kv, &vv, &dov, &ov],
        &lse3,
        [&mut dsum, &mut lse_log2],
        cols,
        dq_acc.as_mut(),
        [&mut dqv, &mut dkv, &mut dvv],
        cu,
        ints,
        // Soft-capping alone returns `tanh(s / cap)`: the cap's factor goes with the scale (the
        // scores' factor, not dQ's and dK's).
        [scale * std::f32::consts::LOG2_E * mods.map_or(1.0, |m| m.cap_factor()), scale],
        mods,
    )?;
    drop((dqv, dkv, dvv));
    Ok(grads)
}
