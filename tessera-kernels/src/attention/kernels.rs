//! The FlashAttention forward kernels, in the DSL: one schedule, with the head dimension `D`
//! (64, 96, 128, 192 or 256; 96's rows in 64-byte swizzle panels), the K/V pipeline depth `STAGES` and the key block `BN` (192, 160 or
//! 128 keys; 96 or 64 past head dim 128, where wider blocks do not fit in shared memory)
//! as `tune(...)` knobs — the host picks the variants of the head dimension and, among them, the
//! key block that costs the fewest padded keys plus a fixed cost a block (see `key_block` in
//! `mod.rs`); the tuner may pick another. A variant that does not fit in shared memory is not
//! built: head dim 128 holds two stages of 160- or 128-key blocks, 64 up to four of 160 or three
//! of 192, 192 two of 96 or three of 64, 256 two of 64. Larger blocks pay a block's fixed costs over more keys: 160 against 128 keys +2–4%
//! at seq ≥ 4096 (head dim 128), 192 +4–8% (64) (run 141). A persistent
//! grid claims tiles of 128 query rows of one (batch, head) from a tile queue. Warpgroup 0
//! produces: per tile it copies Q (one buffer, freed as soon as the tile's last `S` is done, so
//! that the next tile's Q arrives while its last P·V and the epilogue run), then streams K and V
//! blocks through TMA pipelines. Warpgroups 1 and 2 consume, each owning 64 query rows
//! (taking turns to issue their MMAs — ping-pong through two named barriers, so that one's
//! softmax runs while the other's MMAs do — and issuing block j's `S` with block j − 1's
//! `P·V`, so that the softmax of `S` runs beside that `P·V`):
//!
//! - `S = Q·Kᵀ` by wgmma from shared memory into an f32 accumulator;
//! - keys past the sequence (and, causally, past each row's diagonal) masked to −∞ on the
//!   accumulator's fragments, only in the blocks that reach them;
//! - the online softmax on the fragments: running row maxima `m` (in log₂ units, the scale
//!   folded in) and sums `l`, `P = exp2(S·scale·log₂e − m)`, the output rescaled by
//!   `exp2(m_old − m_new)`;
//! - `O += P·V` with P from registers (the accumulator's layout is wgmma's A fragment) and V
//!   N-major from shared memory; P is rounded to 16 bits as its softmax ends, so that the turn
//!   issuing its P·V holds no conversions (2–3% at seq 4096, run 123);
//! - at the end `O / l` leaves through shared memory and TMA stores, and the natural-log
//!   `LSE = (m + log₂ l)·ln 2` per row for a backward pass.
//!
//! Tensors are rank-3 views the host builds: `[batch, seq, heads·dim]` (heads side by side in
//! a row) or `[batch·heads, seq, dim]`. A head's tile starts at `[b·bm + h·hm, s, h·cm]` — the
//! multipliers `(bm, hm, cm)` are `(1, 0, dim)` for the first layout and `(heads, 1, 0)` for
//! the second. With grouped-query attention query head `h` reads key/value head `h / group`.
//! Sequences packed end to end take the `flash_attention_varlen_*` kernels: the same schedule, each
//! (batch, head)'s rows found from offsets, its last rows stored with bounds.

use tessera::kernel;

/// The producer's K and V blocks `j0..j1` of one (batch, head): block `j`'s keys from row
/// `k0 + j·BN` of plane `plane`, column `col`, into the next stages of `sk` and `sv`.
#[tessera::device]
pub fn load_kv<T, const BN: usize, const D: usize, const S: usize>(
    k: Global<T, 3>, v: Global<T, 3>, sk: Smem<T, BN, D>, sv: Smem<T, BN, D>, kpipe: Pipeline<S>, vpipe: Pipeline<S>, plane: i32, k0: i32,
    col: i32, j0: i32, j1: i32,
) {
    for j in j0..j1 {
        let s = kpipe.acquire();
        tma::load(sk.at(s), k, [plane, k0 + j * BN, col], kpipe);
        kpipe.commit(s);
        let s = vpipe.acquire();
        tma::load(sv.at(s), v, [plane, k0 + j * BN, col], vpipe);
        vpipe.commit(s);
    }
}

/// Sequence `b`'s rows in a packed tensor of `total` rows, from its offsets `cu`:
/// `(start, len)`, clamped to the tensor, so that offsets that decrease or run past it (unchecked:
/// `Attention::check_offsets(false)`) give an empty or shortened sequence, never rows outside.
#[tessera::device]
pub fn packed_span(cu: Global<i32, 1>, b: i32, total: i32) -> (i32, i32) {
    let start = min(max(cu.get([b]), 0), total);
    let end = min(max(cu.get([b + 1]), start), total);
    (start, end - start)
}

/// Where batch entry `b`'s rows lie: `(q_start, seq_q, k_start, seq_k, lse_row)` — from the
/// offsets `cu_q`, `cu_k` when sequences are packed (`varlen` 1: [`packed_span`]'s, the
/// log-sum-exp's row the head `h`, its columns the packed rows), else whole planes of `q`, `k`
/// (the log-sum-exp's row `bh`).
#[tessera::device]
#[allow(clippy::too_many_arguments)]
pub fn sequence<T>(
    q: Global<T, 3>, k: Global<T, 3>, cu_q: Global<i32, 1>, cu_k: Global<i32, 1>, varlen: i32, b: i32, bh: i32, h: i32,
) -> (i32, i32, i32, i32, i32) {
    let mut q_start = 0;
    let mut seq_q = q.dim(1);
    let mut k_start = 0;
    let mut seq_k = k.dim(1);
    let mut row = bh;
    if varlen == 1 {
        let (qs, lq) = packed_span(cu_q, b, q.dim(1));
        let (ks, lk) = packed_span(cu_k, b, k.dim(1));
        q_start = qs;
        seq_q = lq;
        k_start = ks;
        seq_k = lk;
        row = h;
    }
    (q_start, seq_q, k_start, seq_k, row)
}

/// A consumer warpgroup's start: its index `me` (0 or 1) and its zeroed running state — the
/// output `acc`, P, the row maxima `m` (finite, so that a row with every key masked keeps a
/// scale of exp2(0) = 1 and sums 0) and sums `l`. The consumers take turns issuing their MMAs
/// (named barriers 0 and 1: each waits at its own, then lets the other go), so that one's
/// softmax runs beside the other's MMAs; the second lets the first begin.
#[tessera::device]
pub fn consumer_begin<T, const D: usize, const BN: usize>() -> (i32, Tile<f32, 64, D>, Tile<T, 64, BN>, Tile<f32, 64, 1>, Tile<f32, 64, 1>)
{
    setmaxnreg(240);
    let me = warpgroup::id() - 1;
    if me == 1 {
        barrier::arrive(0, 2);
    }
    (me, Tile::<f32, 64, D>::zeros(), Tile::<T, 64, BN>::zeros(), Tile::<f32, 64, 1>::full(f32::MIN), Tile::<f32, 64, 1>::zeros())
}

/// Where tile `tile` of the dense forward's queue lies: its part and number of parts (tiles
/// from `full` on come in `parts` parts, each a range of the key blocks), its (batch·head)
/// `bh` of `bhs` and its first query row `q0`. Heads go in groups of `hg`, each group's tiles
/// heaviest (causal: last) first across its heads; `m_tiles` query tiles a head.
#[tessera::device]
pub fn dense_tile(tile: i32, full: i32, parts: i32, m_tiles: i32, hg: i32, bhs: i32) -> (i32, i32, i32, i32) {
    let mut t = tile;
    let mut part = 0;
    let mut np = 1;
    if tile >= full {
        t = full + (tile - full) / parts;
        part = (tile - full) % parts;
        np = parts;
    }
    let g0 = t / (m_tiles * hg);
    let r = t - g0 * (m_tiles * hg);
    let gs = min(hg, bhs - g0 * hg);
    let rq = r / gs;
    (part, np, g0 * hg + r - rq * gs, (m_tiles - 1 - rq) * 128)
}

/// One block's scores as the softmax takes them: `score_mod(s, qi, kj, bh)` on the raw
/// `Q·Kᵀ` block `s` of keys `k0..` for the warpgroup's 64 queries from `q` (`qi`, `kj`: each
/// element's query and key index, f32), then [`masked_scores`].
#[tessera::device]
#[allow(clippy::too_many_arguments)]
pub fn modified_scores<const BN: usize>(
    s: Tile<f32, 64, BN>, bh: i32, q: i32, k0: i32, seq_k: i32, full_lo: i32, full_hi: i32,
    score_mod: impl Fn(Tile<f32, 64, BN>, Tile<f32, 64, BN>, Tile<f32, 64, BN>, i32) -> Tile<f32, 64, BN>,
    mask_mod: impl Fn(Tile<f32, 64, BN>, Tile<f32, 64, BN>, i32) -> Tile<f32, 64, BN>,
) -> Tile<f32, 64, BN> {
    let qi = Tile::<f32, 64, BN>::row_index() + q as f32;
    let kj = Tile::<f32, 64, BN>::col_index() + k0 as f32;
    masked_scores(score_mod(s, qi, kj, bh), bh, q, k0, seq_k, full_lo, full_hi, mask_mod)
}

/// Modified scores `x` of keys `k0..` for 64 queries from `q` with their masks: keys past
/// `seq_k` to −∞ and — only in a block that reaches outside `full_lo..full_hi`, the keys
/// every one of the 64 queries sees — those where `mask_mod(qi, kj, bh)` is below 0.
#[tessera::device]
#[allow(clippy::too_many_arguments)]
pub fn masked_scores<const BN: usize>(
    x: Tile<f32, 64, BN>, bh: i32, q: i32, k0: i32, seq_k: i32, full_lo: i32, full_hi: i32,
    mask_mod: impl Fn(Tile<f32, 64, BN>, Tile<f32, 64, BN>, i32) -> Tile<f32, 64, BN>,
) -> Tile<f32, 64, BN> {
    let mut x = x;
    if k0 + BN > seq_k {
        x = x.mask_cols(seq_k - k0, f32::NEG_INFINITY);
    }
    if k0 < full_lo || k0 + BN > full_hi {
        x = x.keep_where(
            mask_mod(Tile::<f32, 64, BN>::row_index() + q as f32, Tile::<f32, 64, BN>::col_index() + k0 as f32, bh),
            f32::NEG_INFINITY,
        );
    }
    x
}

/// One query tile's key blocks `j0..n` (`n > j0`) in a consumer warpgroup: the online
/// softmax (base 2, running max `m` and sum `l`) of `S = Q·Kᵀ` over each block, through
/// [`modified_scores`] (the warpgroup's first query `q` of (batch·head) `bh`; keys
/// `full_lo..full_hi` seen by all its rows), and `O += P·V` into `acc`. The two consumers take
/// turns issuing their MMAs (named barriers 0 and 1), so that one's softmax runs beside the
/// other's MMAs: block j's turn issues its S and block j − 1's P·V. Q's stage `qs` is released
/// with the last S. P goes into `P·V` through `dropout(p, bh, row0, k0)` (the warpgroup's
/// first query `row0` of its sequence, the block's first key `k0`: `|p, _, _, _| p` for none),
/// after its row sums are taken — the softmax's sum stays the undropped one. `flash_attention`
/// and `flash_attention_varlen` share it.
#[tessera::device]
#[allow(clippy::too_many_arguments)]
pub fn attend_blocks<T, const D: usize, const BN: usize, const S: usize>(
    acc: &mut Tile<f32, 64, D>, m: &mut Tile<f32, 64, 1>, l: &mut Tile<f32, 64, 1>, p: &mut Tile<T, 64, BN>, sq: Smem<T, 128, D>,
    sk: Smem<T, BN, D>, sv: Smem<T, BN, D>, qpipe: Pipeline<1>, kpipe: Pipeline<S>, vpipe: Pipeline<S>, qs: i32, me: i32, row: i32,
    j0: i32, n: i32, seq_k: i32, bh: i32, q: i32, row0: i32, full_lo: i32, full_hi: i32, scale_log2: f32,
    score_mod: impl Fn(Tile<f32, 64, BN>, Tile<f32, 64, BN>, Tile<f32, 64, BN>, i32) -> Tile<f32, 64, BN>,
    mask_mod: impl Fn(Tile<f32, 64, BN>, Tile<f32, 64, BN>, i32) -> Tile<f32, 64, BN>,
    dropout: impl Fn(Tile<f32, 64, BN>, i32, i32, i32) -> Tile<f32, 64, BN>,
) {
    // The first block: S alone.
    let ks = kpipe.wait();
    if me == 0 {
        barrier::sync(0, 2);
    } else {
        barrier::sync(1, 2);
    }
    let mut s = Tile::<f32, 64, BN>::zeros();
    mma_sync(s, sq.at(qs).rows(row, 64), sk.at(ks));
    if me == 0 {
        barrier::arrive(1, 2);
    } else {
        barrier::arrive(0, 2);
    }
    mma_wait(0);
    kpipe.release(ks);
    if n == j0 + 1 {
        qpipe.release(qs);
    }
    s = modified_scores(s, bh, q, j0 * BN, seq_k, full_lo, full_hi, score_mod, mask_mod);
    *m = max(*m, row_max(s) * scale_log2);
    let pf = exp2(s * scale_log2 - *m);
    *l = row_sum(pf);
    *p = dropout(pf, bh, row0, j0 * BN).cast::<T>();
    // Block j's turn issues its S = Q·Kᵀ and block j − 1's P·V; the softmax of S
    // runs outside the turn, beside that P·V.
    for j in j0 + 1..n {
        let ks = kpipe.wait();
        let vs = vpipe.wait();
        if me == 0 {
            barrier::sync(0, 2);
        } else {
            barrier::sync(1, 2);
        }
        let mut s = Tile::<f32, 64, BN>::zeros();
        mma_sync(s, sq.at(qs).rows(row, 64), sk.at(ks));
        mma_sync_kn(acc, *p, sv.at(vs));
        if me == 0 {
            barrier::arrive(1, 2);
        } else {
            barrier::arrive(0, 2);
        }
        // S is done when at most the P·V behind it still runs.
        mma_wait(1);
        kpipe.release(ks);
        if j + 1 == n {
            qpipe.release(qs);
        }
        s = modified_scores(s, bh, q, j * BN, seq_k, full_lo, full_hi, score_mod, mask_mod);
        let m_new = max(*m, row_max(s) * scale_log2);
        let pf = exp2(s * scale_log2 - m_new);
        let c = exp2(*m - m_new);
        *l = *l * c + row_sum(pf);
        *p = dropout(pf, bh, row0, j * BN).cast::<T>();
        // The P·V must be done before O is rescaled.
        mma_wait(0);
        vpipe.release(vs);
        *acc = *acc * c;
        *m = m_new;
    }
    // The last block's P·V.
    let vs = vpipe.wait();
    if me == 0 {
        barrier::sync(0, 2);
    } else {
        barrier::sync(1, 2);
    }
    mma_sync_kn(acc, *p, sv.at(vs));
    if me == 0 {
        barrier::arrive(1, 2);
    } else {
        barrier::arrive(0, 2);
    }
    mma_wait(0);
    vpipe.release(vs);
}

/// The key blocks `(j0, j1)` of part `part` of `np` of a query tile whose queries see keys
/// `lo..hi` (clamped to `0..seq_k`) in blocks of `bn`: empty when they see none.
#[tessera::device]
pub fn key_blocks(lo: i32, hi: i32, seq_k: i32, bn: i32, part: i32, np: i32) -> (i32, i32) {
    let jl = max(lo, 0) / bn;
    let jh = max((min(hi, seq_k) + bn - 1) / bn, jl);
    (jl + part * (jh - jl) / np, jl + (part + 1) * (jh - jl) / np)
}

/// The causal mask as [`modified_scores`]' `mask_mod` takes it: ≥ 0 where key `kj` is
/// visible to query `qi`, `kj ≤ qi + shift` (the diagonal aligned at the end: `shift` =
/// `seq_k − seq_q`).
#[tessera::device]
pub fn causal_visible<const BN: usize>(qi: Tile<f32, 64, BN>, kj: Tile<f32, 64, BN>, shift: i32) -> Tile<f32, 64, BN> {
    qi - kj + shift as f32
}

/// The key range of queries `q..q + rows` without a mask (`causal` 0: all `seq_k` keys, none
/// masked) or under [`causal_visible`]: `(lo, hi, full_lo, full_hi)` — keys `lo..hi` are
/// seen by some of them, `full_lo..full_hi` by all — as `attention_persistent`'s `key_range`.
#[tessera::device]
pub fn causal_keys(q: i32, rows: i32, seq_k: i32, shift: i32, causal: i32) -> (i32, i32, i32, i32) {
    let mut hi = seq_k;
    // (Past every key: the bound keys past `seq_k` are masked by.)
    let mut full_hi = 1073741824;
    if causal == 1 {
        hi = min(seq_k, q + rows + shift);
        full_hi = q + 1 + shift;
    }
    (0, hi, 0, full_hi)
}

/// The FlashAttention forward's persistent body (see the module's notes), with an epilogue on
/// the output: `flash_attention` is its rings and one call with `|x, _, _, _| x`, and a kernel
/// of yours gets the same schedule with its own epilogue. Each 64×64 chunk of a finished tile's
/// normalized output `O / l` goes through `epilogue(chunk, plane, row, col)` (its origin in `o`'s
/// rank-3 view) in registers, and what it returns is stored in `T` by TMA: no extra pass over
/// `o`. Tiles run in parts (`parts` > 1, from `full` on) leave unnormalized f32 partials in
/// `opart`/`lpart` for `attention_combine`, which applies no epilogue: a kernel with an epilogue
/// is launched with `full` = every tile and `parts` = 1. It makes its own rings: one stage of
/// 128 query rows, `S` stages of `BN` keys for K and for V, four 64×64 staging buffers; name
/// its generics at the call, `attention_persistent::<bf16, 128, 128, 2>(…)` (dtype, head dim,
/// key block, stages).
#[tessera::device]
#[allow(clippy::too_many_arguments)]
pub fn attention_persistent<T, const D: usize, const BN: usize, const S: usize>(
    q: Global<T, 3>, k: Global<T, 3>, v: Global<T, 3>, o: Global<T, 3>, lse: Global<f32, 3>, counter: Global<i32, 1>,
    opart: Global<f32, 3>, lpart: Global<f32, 3>, full: i32, parts: i32, heads: i32, group: i32, q_bm: i32, k_bm: i32, hm: i32, cm: i32,
    hg: i32, keep_lse: i32, scale_log2: f32,
    epilogue: impl Fn(Tile<f32, 64, { 64 - D % 64 }>, i32, i32, i32) -> Tile<f32, 64, { 64 - D % 64 }>,
    score_mod: impl Fn(Tile<f32, 64, BN>, Tile<f32, 64, BN>, Tile<f32, 64, BN>, i32) -> Tile<f32, 64, BN>,
    mask_mod: impl Fn(Tile<f32, 64, BN>, Tile<f32, 64, BN>, i32) -> Tile<f32, 64, BN>,
    key_range: impl Fn(i32, i32, i32) -> (i32, i32, i32, i32), dropout: impl Fn(Tile<f32, 64, BN>, i32, i32, i32) -> Tile<f32, 64, BN>,
) {
    let sq = Smem::<T, 128, D>::ring(1);
    let sk = Smem::<T, BN, D>::ring(S);
    let sv = Smem::<T, BN, D>::ring(S);
    let so = Smem::<T, 64, { 64 - D % 64 }>::ring(4);
    let qpipe = Pipeline::<1>::new(2);
    let kpipe = Pipeline::<S>::new(2);
    let vpipe = Pipeline::<S>::new(2);
    let seq_q = q.dim(1);
    let seq_k = k.dim(1);
    let m_tiles = (seq_q + 127) / 128;
    // Tiles are claimed at run time, `hg` heads at a time, the group's heaviest (causal: last)
    // query tiles first — so that the grid ends on light tiles — and its K and V kept in L2;
    // K and V stream on across tiles, so the pipelines never drain.
    let queue = TileQueue::<2>::new(counter, 2);
    if warpgroup::id() == 0 {
        setmaxnreg(24);
        for tile in queue.fetch(full + (m_tiles * lse.dim(0) - full) * parts) {
            let (part, np, bh, q0) = dense_tile(tile, full, parts, m_tiles, hg, lse.dim(0));
            let b = bh / heads;
            let h = bh - b * heads;
            let kvh = h / group;
            let (lo, hi, _, _) = key_range(bh, q0, 128);
            let (j0, j1) = key_blocks(lo, hi, seq_k, BN, part, np);
            let s = qpipe.acquire();
            tma::load(sq.at(s), q, [b * q_bm + h * hm, q0, h * cm], qpipe);
            qpipe.commit(s);
            load_kv(k, v, sk, sv, kpipe, vpipe, b * k_bm + kvh * hm, 0, kvh * cm, j0, j1);
        }
    } else {
        let (me, mut acc, mut p, mut m, mut l) = consumer_begin::<T, D, BN>();
        let row = me * 64;
        let mut nt = 0;
        for tile in queue.take() {
            let (part, np, bh, q0) = dense_tile(tile, full, parts, m_tiles, hg, lse.dim(0));
            let b = bh / heads;
            let h = bh - b * heads;
            let (lo, hi, _, _) = key_range(bh, q0, 128);
            let (j0, n) = key_blocks(lo, hi, seq_k, BN, part, np);
            // The keys every query of the warpgroup sees: no mask there.
            let (_, _, full_lo, full_hi) = key_range(bh, q0 + row, 64);
            acc = Tile::<f32, 64, D>::zeros();
            m = Tile::<f32, 64, 1>::full(f32::MIN);
            l = Tile::<f32, 64, 1>::zeros();
            let qs = qpipe.wait();
            if n > j0 {
                #[rustfmt::skip]
                attend_blocks(
                    &mut acc, &mut m, &mut l, &mut p, sq, sk, sv, qpipe, kpipe, vpipe, qs, me, row, j0, n, seq_k, bh, q0 + row,
                    q0 + row, full_lo, full_hi, scale_log2, score_mod, mask_mod, dropout,
                );
            }
            if n <= j0 {
                qpipe.release(qs);
            }
            let inv = 1.0 / max(l, 1e-30);
            if tile >= full {
                // A part: O over its keys and their log₂-sum-exp, for `attention_combine`.
                opart.store([tile - full, row, 0], acc * inv);
                lpart.store([tile - full, row, 0], m + log2(l));
            } else {
                // The log-sum-exp only when the caller keeps it (`attention()` does not: 4% of
                // an 8-block tile, run 130b).
                if keep_lse == 1 {
                    lse.store([bh, q0 + row, 0], (m + log2(l)) * 0.6931471805599453);
                }
                // O leaves by TMA, 64 columns at a time (32 at head dim 96: `64 − D % 64`), through
                // two staging buffers per warpgroup used in turn; the one written two chunks ago
                // must have been read first.
                #[unroll]
                for jj in 0..D / (64 - D % 64) {
                    let buf = me * 2 + (nt * (D / (64 - D % 64)) + jj) % 2;
                    tma::store_wait(1);
                    let plane = b * q_bm + h * hm;
                    let orow = q0 + row;
                    let ocol = h * cm + jj * (64 - D % 64);
                    so.at(buf).store(epilogue(acc.cols(jj * (64 - D % 64), 64 - D % 64) * inv, plane, orow, ocol).cast::<T>());
                    tma::store(o, [plane, orow, ocol], so.at(buf));
                }
                nt = nt + 1;
            }
        }
        tma::store_wait(0);
    }
}

/// FlashAttention forward, head dim `D`, K and V in blocks of `BN` keys through `STAGES`-deep
/// pipelines.
#[kernel(
    warpgroups = 3,
    dtypes(T = [bf16, f16]),
    tune(
        D = [128, 64, 192, 256, 96], STAGES = [4, 2, 3], BN = [192, 160, 128, 96, 64],
        only(D <= 128 && D != 96 && BN >= 128 || D == 96 && BN >= 128 && BN <= 160 || D > 128 && BN <= 96)
    ),
    targets(sm_90a)
)]
pub fn flash_attention(
    q: Global<T, 3>, k: Global<T, 3>, v: Global<T, 3>, o: Global<T, 3>, lse: Global<f32, 3>, counter: Global<i32, 1>,
    opart: Global<f32, 3>, lpart: Global<f32, 3>, full: i32, parts: i32, heads: i32, group: i32, q_bm: i32, k_bm: i32, hm: i32, cm: i32,
    causal: i32, hg: i32, keep_lse: i32, scale_log2: f32,
) {
    let seq_k = k.dim(1);
    // Causally, key j is visible to query i when j ≤ i + seq_k − seq_q (aligned at the end).
    let shift = seq_k - q.dim(1);
    #[rustfmt::skip]
    attention_persistent::<T, D, BN, STAGES>(
        q, k, v, o, lse, counter, opart, lpart, full, parts, heads, group, q_bm, k_bm, hm, cm, hg, keep_lse, scale_log2,
        |x, _plane, _row, _col| x,
        |s, _qi, _kj, _bh| s,
        |qi, kj, _bh| causal_visible(qi, kj, shift),
        |_bh, q0, rows| causal_keys(q0, rows, seq_k, shift, causal),
        |p, _bh, _q, _k0| p,
    );
}

/// Soft-capping as a `score_mod` step: `s ↦ cap·tanh(s / cap)` on raw scores (the kernel's
/// `scale_log2` multiplies what the modifiers return: `cap` is the caller's divided by the
/// softmax scale).
#[tessera::device]
pub fn softcap<const BN: usize>(s: Tile<f32, 64, BN>, cap: f32) -> Tile<f32, 64, BN> {
    tanh(s * (1.0 / cap)) * cap
}

/// ALiBi as a `score_mod` step: `s − slope_h·|qi − kj + shift|`, head `h` (of `bh`, `heads` a
/// batch entry) with the slope `2^(−max_bias·(h + 1)/heads)` times `alibi_scale` (1 / the
/// softmax scale: raw units).
#[tessera::device]
#[allow(clippy::too_many_arguments)]
pub fn alibi<const BN: usize>(
    s: Tile<f32, 64, BN>, qi: Tile<f32, 64, BN>, kj: Tile<f32, 64, BN>, bh: i32, heads: i32, max_bias: f32, alibi_scale: f32, shift: i32,
) -> Tile<f32, 64, BN> {
    let slope = exp2(-max_bias * ((bh % heads + 1) as f32) / heads as f32) * alibi_scale;
    s - abs(qi - kj + shift as f32) * slope
}

/// The library's masks beside the causal one, as `mask_mod` takes them (≥ 0: visible): key
/// `kj` is visible to query `qi` when `kj ≤ qi + shift` and within the last `window` keys
/// (`kj > qi + shift − window`), or when `kj < prefix` (a prefix every query sees, as in a
/// prefix LM). No window: one past every key (2³⁰); no prefix: 0.
#[tessera::device]
pub fn window_prefix_visible<const BN: usize>(
    qi: Tile<f32, 64, BN>, kj: Tile<f32, 64, BN>, shift: i32, window: i32, prefix: i32,
) -> Tile<f32, 64, BN> {
    min(max(qi - kj + shift as f32, (prefix - 1) as f32 - kj), kj - qi + (window - 1 - shift) as f32)
}

/// The key range of queries `q..q + rows` under [`window_prefix_visible`] (`causal` 1) or no
/// mask (`causal` 0, where `window` and `prefix` do not apply): `(lo, hi, full_lo, full_hi)`
/// as `attention_persistent`'s `key_range` — key blocks before the window are skipped, unless
/// a prefix keeps them.
#[tessera::device]
pub fn window_prefix_keys(q: i32, rows: i32, seq_k: i32, shift: i32, causal: i32, window: i32, prefix: i32) -> (i32, i32, i32, i32) {
    let mut lo = 0;
    let mut hi = seq_k;
    let mut full_lo = 0;
    let mut full_hi = 1073741824;
    if causal == 1 {
        hi = min(seq_k, max(q + rows + shift, prefix));
        full_hi = max(q + 1 + shift, prefix);
        full_lo = q + rows + shift - window;
        if prefix == 0 {
            lo = max(q + shift - window + 1, 0);
        }
    }
    (lo, hi, full_lo, full_hi)
}

/// The query range of keys `k..k + rows` under [`window_prefix_visible`] (`causal` 1) or no
/// mask (`causal` 0): `(lo, hi, full_lo, full_hi)` — queries `lo..hi` see some of the keys,
/// `full_lo..full_hi` all of them — as the backward's dK/dV walk takes it. Key `j` is seen by
/// queries `j − shift ..= j − shift + window − 1`, a prefix key by all.
#[tessera::device]
pub fn window_prefix_queries(k: i32, rows: i32, seq_q: i32, shift: i32, causal: i32, window: i32, prefix: i32) -> (i32, i32, i32, i32) {
    let mut lo = 0;
    let mut hi = seq_q;
    let mut full_lo = 0;
    let mut full_hi = 1073741824;
    if causal == 1 && k + rows > prefix {
        full_lo = k + rows - 1 - shift;
        full_hi = max(k, prefix) - shift + window;
        if k >= prefix {
            lo = k - shift;
            hi = min(seq_q, k + rows - 1 - shift + window);
        }
    }
    (lo, hi, full_lo, full_hi)
}

/// The library's score modifiers of variant `M` (knob bits: 1 soft-capping, 2 ALiBi — with
/// `M` 7 and 15, 7 with dropout, each where its parameter is above 0, switched at run time): [`softcap`] then
/// [`alibi`] on raw scores `s`. `M` 1 (soft-capping alone) returns `tanh(s / cap)`, the cap's
/// factor folded into the kernel's `scale_log2` by the host. (Conditions of literals alone are
/// compiled one way: a variant holds no code of the others.)
#[tessera::device]
#[allow(clippy::too_many_arguments)]
pub fn library_scores<const M: usize, const BN: usize>(
    s: Tile<f32, 64, BN>, qi: Tile<f32, 64, BN>, kj: Tile<f32, 64, BN>, bh: i32, heads: i32, cap: f32, max_bias: f32, alibi_scale: f32,
    shift: i32,
) -> Tile<f32, 64, BN> {
    let mut x = s;
    if M == 1 {
        x = tanh(x * (1.0 / cap));
    }
    if M >= 7 {
        if cap > 0.0 {
            x = softcap(x, cap);
        }
        if max_bias > 0.0 {
            x = alibi(x, qi, kj, bh, heads, max_bias, alibi_scale, shift);
        }
    }
    x
}

/// [`library_scores`]' chain rule for the backward: the gradient `ds` reaching the modified
/// scores `x` (of raw scores `s`) taken back to `s` — soft-capping's `1 − tanh²(s / cap)`
/// (from `x` itself with `M` 1, recomputed with `M` 7 and 15); ALiBi and masks pass it on.
#[tessera::device]
pub fn library_score_grad<const M: usize, const BN: usize>(
    ds: Tile<f32, 64, BN>, s: Tile<f32, 64, BN>, x: Tile<f32, 64, BN>, cap: f32,
) -> Tile<f32, 64, BN> {
    let mut g = ds;
    if M == 1 {
        g = g * (1.0 - x * x);
    }
    if M >= 7 {
        if cap > 0.0 {
            let t = tanh(s * (1.0 / cap));
            g = g * (1.0 - t * t);
        }
    }
    g
}

/// Dropout of attention probabilities `p` (64 queries from `q0` of (batch·head) `bh` by the
/// keys from `k0`; with `TR` 1 the transposed block, 64 keys from `k0` down by the queries from
/// `q0` across, as the backward's dK/dV walks hold `Pᵀ` and `dPᵀ`), variant `M` 15 with
/// `drop_p` > 0: element (query `i`, key `j`) kept — and scaled by `1 / (1 − drop_p)` — where
/// [`tessera::random::uniform8`]`(seed, offset, bh, i, j)` is at least `drop_p` (a multiple of
/// 1/256), else 0: the same mask either way round.
#[tessera::device]
#[allow(clippy::too_many_arguments)]
pub fn library_dropout<const M: usize, const N: usize, const TR: usize>(
    p: Tile<f32, 64, N>, bh: i32, q0: i32, k0: i32, seed_lo: i32, seed_hi: i32, offset: i32, drop_p: f32,
) -> Tile<f32, 64, N> {
    let mut x = p;
    if M == 15 {
        if drop_p > 0.0 {
            if TR == 1 {
                x = (p * (1.0 / (1.0 - drop_p)))
                    .keep_where(Tile::<f32, 64, N>::uniform8_t(seed_lo, seed_hi, offset, bh, [q0, k0]) - drop_p, 0.0);
            } else {
                x = (p * (1.0 / (1.0 - drop_p)))
                    .keep_where(Tile::<f32, 64, N>::uniform8(seed_lo, seed_hi, offset, bh, [q0, k0]) - drop_p, 0.0);
            }
        }
    }
    x
}

/// FlashAttention forward with the library's modifiers: `flash_attention` with [`softcap`]
/// (knob `M` bit 1, `cap` > 0; with `M` 1 alone, `scale_log2` carries the cap's factor) then
/// [`alibi`] (bit 2, `alibi` > 0) on the scores and, with
/// bit 4, causally, [`window_prefix_visible`]'s sliding window and prefix, whose key blocks
/// outside the window are never loaded. A variant per set of modifiers (1, 4, and all of
/// them, 7, switched at run time: ALiBi's alone spills at 160-key blocks): the others' code is
/// not in it. Two stages of 192- (head dim 64), 160- or 128-key blocks; at head dims 192 and 256 of 96 and 64.
#[kernel(
    warpgroups = 3,
    dtypes(T = [bf16, f16]),
    tune(
        D = [128, 64, 192, 256, 96], STAGES = [2], BN = [192, 160, 128, 96, 64], M = [1, 4, 7, 15],
        only((D <= 128 && D != 96 && BN >= 128 || D == 96 && BN == 128 || D == 192 && BN == 96 || D == 256 && BN == 64) && (M != 15 || BN <= 128))
    ),
    targets(sm_90a)
)]
pub fn flash_attention_mods(
    q: Global<T, 3>, k: Global<T, 3>, v: Global<T, 3>, o: Global<T, 3>, lse: Global<f32, 3>, counter: Global<i32, 1>,
    opart: Global<f32, 3>, lpart: Global<f32, 3>, full: i32, parts: i32, heads: i32, group: i32, q_bm: i32, k_bm: i32, hm: i32, cm: i32,
    causal: i32, hg: i32, keep_lse: i32, scale_log2: f32, cap: f32, max_bias: f32, alibi_scale: f32, window: i32, prefix: i32,
    drop_seed_lo: i32, drop_seed_hi: i32, drop_offset: i32, drop_p: f32,
) {
    let seq_k = k.dim(1);
    let shift = seq_k - q.dim(1);
    #[rustfmt::skip]
    attention_persistent::<T, D, BN, STAGES>(
        q, k, v, o, lse, counter, opart, lpart, full, parts, heads, group, q_bm, k_bm, hm, cm, hg, keep_lse, scale_log2,
        |x, _plane, _row, _col| x,
        |s, qi, kj, bh| library_scores::<M, BN>(s, qi, kj, bh, heads, cap, max_bias, alibi_scale, shift),
        |qi, kj, _bh| window_prefix_visible(qi, kj, shift, window, prefix),
        |_bh, q0, rows| window_prefix_keys(q0, rows, seq_k, shift, causal, window, prefix),
        |p, bh, q0, k0| library_dropout::<M, BN, 0>(p, bh, q0, k0, drop_seed_lo, drop_seed_hi, drop_offset, drop_p),
    );
}

/// The tiles `flash_attention` split into `parts` ranges of keys, put back together: per row,
/// `O = Σ 2^(L_p − L)·O_p` and `L = log₂ Σ 2^L_p` over the parts' outputs `O_p` (each
/// normalised over its own keys) and log₂-sum-exps `L_p`; `o` and `lse` as the attention's.
/// A block per 16 rows of a split tile: block `8·i + c` takes rows `16·c..` of tile `full + i`.
#[kernel(dtypes(T = [bf16, f16]), tune(D = [128, 64, 192, 256, 96]), targets(sm_90a))]
pub fn attention_combine(
    opart: Global<f32, 3>, lpart: Global<f32, 3>, o: Global<T, 3>, lse: Global<f32, 3>, full: i32, parts: i32, heads: i32, q_bm: i32,
    hm: i32, cm: i32, hg: i32,
) {
    let i = block::id_x() / 8;
    let r = (block::id_x() % 8) * 16;
    let m_tiles = (o.dim(1) + 127) / 128;
    let mut top = Tile::<f32, 16, 1>::full(f32::MIN);
    for p in 0..parts {
        top = max(top, lpart.load::<Tile<f32, 16, 1>>([i * parts + p, r, 0]));
    }
    let mut acc = Tile::<f32, 16, D>::zeros();
    let mut sum = Tile::<f32, 16, 1>::zeros();
    for p in 0..parts {
        let w = exp2(lpart.load::<Tile<f32, 16, 1>>([i * parts + p, r, 0]) - top);
        acc = acc + opart.load::<Tile<f32, 16, D>>([i * parts + p, r, 0]) * w;
        sum = sum + w;
    }
    // The tile's place, as `flash_attention` decodes it.
    let t = full + i;
    let g0 = t / (m_tiles * hg);
    let rg = t - g0 * (m_tiles * hg);
    let gs = min(hg, lse.dim(0) - g0 * hg);
    let bh = g0 * hg + rg % gs;
    let q0 = (m_tiles - 1 - rg / gs) * 128;
    let b = bh / heads;
    let h = bh % heads;
    // A row every part masked throughout sums 0: its output 0 and its lse −∞, as unsplit.
    o.store([b * q_bm + h * hm, q0 + r, h * cm], (acc * (1.0 / max(sum, 1e-30))).cast::<T>());
    lse.store([bh, q0 + r, 0], (top + log2(sum)) * 0.6931471805599453);
}

/// The packed (varlen) FlashAttention forward's body, with an epilogue on the output and the
/// modifiers as [`attention_persistent`] takes them: `flash_attention_varlen` is its rings and
/// one call with `|x, _, _, _| x` and the causal closures. A sequence's last rows, stored with
/// bounds rather than by TMA, go through the epilogue too (their plane 0 of the packed `[1,
/// total, heads·dim]` view). As sequences differ in length, the modifiers see each query on
/// the key axis — query `i` of a sequence of `len_q` queries and `len_k` keys as
/// `i + len_k − len_q` (the causal diagonal aligned at the end: `kj ≤ qi`) — in `score_mod`'s
/// and `mask_mod`'s `qi` and `key_range`'s first query; `key_range`'s key bounds may pass the
/// sequence's keys (they are clamped).
#[tessera::device]
#[allow(clippy::too_many_arguments)]
pub fn attention_varlen_persistent<T, const D: usize, const BN: usize, const S: usize>(
    q: Global<T, 3>, k: Global<T, 3>, v: Global<T, 3>, o: Global<T, 3>, lse: Global<f32, 3>, counter: Global<i32, 1>, cu_q: Global<i32, 1>,
    cu_k: Global<i32, 1>, batch: i32, max_q: i32, varlen: i32, heads: i32, group: i32, q_bm: i32, k_bm: i32, hm: i32, cm: i32, hg: i32,
    scale_log2: f32, epilogue: impl Fn(Tile<f32, 64, { 64 - D % 64 }>, i32, i32, i32) -> Tile<f32, 64, { 64 - D % 64 }>,
    score_mod: impl Fn(Tile<f32, 64, BN>, Tile<f32, 64, BN>, Tile<f32, 64, BN>, i32) -> Tile<f32, 64, BN>,
    mask_mod: impl Fn(Tile<f32, 64, BN>, Tile<f32, 64, BN>, i32) -> Tile<f32, 64, BN>,
    key_range: impl Fn(i32, i32, i32) -> (i32, i32, i32, i32), dropout: impl Fn(Tile<f32, 64, BN>, i32, i32, i32) -> Tile<f32, 64, BN>,
) {
    let sq = Smem::<T, 128, D>::ring(1);
    let sk = Smem::<T, BN, D>::ring(S);
    let sv = Smem::<T, BN, D>::ring(S);
    let so = Smem::<T, 64, { 64 - D % 64 }>::ring(4);
    let qpipe = Pipeline::<1>::new(2);
    let kpipe = Pipeline::<S>::new(2);
    let vpipe = Pipeline::<S>::new(2);
    // Query tiles per (batch, head): of the longest sequence when they are packed.
    let m_tiles = (max_q + 127) / 128;
    // Tiles are claimed at run time, `hg` heads at a time, the group's heaviest (causal: last)
    // query tiles first — so that the grid ends on light tiles — and its K and V kept in L2;
    // K and V stream on across tiles, so the pipelines never drain.
    let queue = TileQueue::<2>::new(counter, 2);
    if warpgroup::id() == 0 {
        setmaxnreg(24);
        for tile in queue.fetch(m_tiles * batch * heads) {
            // Heads go in groups of `hg`, each group's tiles heaviest first across its heads.
            let g0 = tile / (m_tiles * hg);
            let r = tile - g0 * (m_tiles * hg);
            let gs = min(hg, batch * heads - g0 * hg);
            let rq = r / gs;
            let bh = g0 * hg + r - rq * gs;
            let q0 = (m_tiles - 1 - rq) * 128;
            let b = bh / heads;
            let h = bh - b * heads;
            let kvh = h / group;
            let (q_start, len_q, k_start, len_k, _) = sequence(q, k, cu_q, cu_k, varlen, b, bh, h);
            if q0 < len_q {
                // (Queries on the key axis: the diagonal aligned at the end of each sequence.)
                let (lo, hi, _, _) = key_range(bh, q0 + len_k - len_q, 128);
                let (j0, j1) = key_blocks(lo, hi, len_k, BN, 0, 1);
                let s = qpipe.acquire();
                tma::load(sq.at(s), q, [b * q_bm + h * hm, q_start + q0, h * cm], qpipe);
                qpipe.commit(s);
                load_kv(k, v, sk, sv, kpipe, vpipe, b * k_bm + kvh * hm, k_start, kvh * cm, j0, j1);
            }
        }
    } else {
        let (me, mut acc, mut p, mut m, mut l) = consumer_begin::<T, D, BN>();
        let row = me * 64;
        let mut nt = 0;
        for tile in queue.take() {
            // Heads go in groups of `hg`, each group's tiles heaviest first across its heads.
            let g0 = tile / (m_tiles * hg);
            let r = tile - g0 * (m_tiles * hg);
            let gs = min(hg, batch * heads - g0 * hg);
            let rq = r / gs;
            let bh = g0 * hg + r - rq * gs;
            let q0 = (m_tiles - 1 - rq) * 128;
            let b = bh / heads;
            let h = bh - b * heads;
            let (q_start, len_q, _, len_k, lse_row) = sequence(q, k, cu_q, cu_k, varlen, b, bh, h);
            if q0 < len_q {
                // Queries on the key axis: query i of the sequence is `i + len_k − len_q`.
                let qa = q0 + len_k - len_q;
                let (lo, hi, _, _) = key_range(bh, qa, 128);
                let (j0, n) = key_blocks(lo, hi, len_k, BN, 0, 1);
                let (_, _, full_lo, full_hi) = key_range(bh, qa + row, 64);
                acc = Tile::<f32, 64, D>::zeros();
                m = Tile::<f32, 64, 1>::full(f32::MIN);
                l = Tile::<f32, 64, 1>::zeros();
                let qs = qpipe.wait();
                if n > j0 {
                    #[rustfmt::skip]
                    attend_blocks(
                        &mut acc, &mut m, &mut l, &mut p, sq, sk, sv, qpipe, kpipe, vpipe, qs, me, row, j0, n, len_k, bh, qa + row,
                        q0 + row, full_lo, full_hi, scale_log2, score_mod, mask_mod, dropout,
                    );
                }
                if n <= j0 {
                    qpipe.release(qs);
                }
                let inv = 1.0 / max(l, 1e-30);
                // Rows past the sequence are not stored (packed: they are the next sequence's).
                let q_end = q_start + len_q;
                lse.store_within([lse_row, q_start + q0 + row, 0], (m + log2(l)) * 0.6931471805599453, [lse.dim(0), q_end, 1]);
                if varlen == 0 || q0 + row + 64 <= len_q {
                    // O leaves by TMA, 64 columns at a time (32 at head dim 96), through two
                    // staging buffers per warpgroup used in turn; the one written two chunks ago
                    // must have been read.
                    #[unroll]
                    for jj in 0..D / (64 - D % 64) {
                        let buf = me * 2 + (nt * (D / (64 - D % 64)) + jj) % 2;
                        let plane = b * q_bm + h * hm;
                        let orow = q_start + q0 + row;
                        let ocol = h * cm + jj * (64 - D % 64);
                        tma::store_wait(1);
                        so.at(buf).store(epilogue(acc.cols(jj * (64 - D % 64), 64 - D % 64) * inv, plane, orow, ocol).cast::<T>());
                        tma::store(o, [plane, orow, ocol], so.at(buf));
                    }
                    nt = nt + 1;
                } else {
                    // A packed sequence's last rows: a TMA box would write the next sequence's.
                    #[unroll]
                    for jj in 0..D / (64 - D % 64) {
                        let ocol = h * cm + jj * (64 - D % 64);
                        let out = epilogue(acc.cols(jj * (64 - D % 64), 64 - D % 64) * inv, 0, q_start + q0 + row, ocol).cast::<T>();
                        o.store_within([0, q_start + q0 + row, ocol], out, [1, q_end, o.dim(2)]);
                    }
                }
            }
        }
        tma::store_wait(0);
    }
}

/// FlashAttention forward over sequences packed end to end: `flash_attention` with each (batch, head)'s rows found from the offsets `cu_q`/`cu_k` (`varlen` 1; with 0 it
/// reads `[batch, seq, …]` views as `flash_attention` does), P kept in 16 bits between blocks,
/// and a sequence's last rows stored with bounds (a TMA box would write the next sequence's).
/// Key blocks of 160 or 128 (192, with the offsets' registers beside, spills at head dim 64).
#[kernel(
    warpgroups = 3,
    dtypes(T = [bf16, f16]),
    tune(
        D = [128, 64, 192, 256, 96], STAGES = [4, 2, 3], BN = [160, 128, 96, 64],
        only(D <= 128 && D != 96 && BN >= 128 || D == 96 && BN == 128 || D > 128 && BN <= 96)
    ),
    targets(sm_90a)
)]
pub fn flash_attention_varlen(
    q: Global<T, 3>, k: Global<T, 3>, v: Global<T, 3>, o: Global<T, 3>, lse: Global<f32, 3>, counter: Global<i32, 1>, cu_q: Global<i32, 1>,
    cu_k: Global<i32, 1>, batch: i32, max_q: i32, varlen: i32, heads: i32, group: i32, q_bm: i32, k_bm: i32, hm: i32, cm: i32, causal: i32,
    hg: i32, scale_log2: f32,
) {
    attention_varlen_persistent::<T, D, BN, STAGES>(
        q,
        k,
        v,
        o,
        lse,
        counter,
        cu_q,
        cu_k,
        batch,
        max_q,
        varlen,
        heads,
        group,
        q_bm,
        k_bm,
        hm,
        cm,
        hg,
        scale_log2,
        |x, _plane, _row, _col| x,
        |s, _qi, _kj, _bh| s,
        |qi, kj, _bh| causal_visible(qi, kj, 0),
        |_bh, q0, rows| causal_keys(q0, rows, 1073741824, 0, causal),
        |p, _bh, _q, _k0| p,
    );
}

/// [`flash_attention_varlen`] with the library's modifiers (`flash_attention_mods`' knob `M`
/// and parameters), each sequence's queries on its key axis (see
/// [`attention_varlen_persistent`]): two stages of 128-key blocks.
#[kernel(
    warpgroups = 3,
    dtypes(T = [bf16, f16]),
    tune(
        D = [128, 64, 192, 256, 96], STAGES = [2], BN = [128, 96, 64], M = [1, 4, 7, 15],
        only(D <= 128 && BN == 128 || D == 192 && BN == 96 || D == 256 && BN == 64)
    ),
    targets(sm_90a)
)]
pub fn flash_attention_varlen_mods(
    q: Global<T, 3>, k: Global<T, 3>, v: Global<T, 3>, o: Global<T, 3>, lse: Global<f32, 3>, counter: Global<i32, 1>, cu_q: Global<i32, 1>,
    cu_k: Global<i32, 1>, batch: i32, max_q: i32, varlen: i32, heads: i32, group: i32, q_bm: i32, k_bm: i32, hm: i32, cm: i32, causal: i32,
    hg: i32, scale_log2: f32, cap: f32, max_bias: f32, alibi_scale: f32, window: i32, prefix: i32, drop_seed_lo: i32, drop_seed_hi: i32,
    drop_offset: i32, drop_p: f32,
) {
    #[rustfmt::skip]
    attention_varlen_persistent::<T, D, BN, STAGES>(
        q, k, v, o, lse, counter, cu_q, cu_k, batch, max_q, varlen, heads, group, q_bm, k_bm, hm, cm, hg, scale_log2,
        |x, _plane, _row, _col| x,
        |s, qi, kj, bh| library_scores::<M, BN>(s, qi, kj, bh, heads, cap, max_bias, alibi_scale, 0),
        |qi, kj, _bh| window_prefix_visible(qi, kj, 0, window, prefix),
        |_bh, q0, rows| window_prefix_keys(q0, rows, 1073741824, 0, causal, window, prefix),
        |p, bh, q0, k0| library_dropout::<M, BN, 0>(p, bh, q0, k0, drop_seed_lo, drop_seed_hi, drop_offset, drop_p),
    );
}
