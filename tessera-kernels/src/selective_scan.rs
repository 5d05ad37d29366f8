//! The selective scan of Mamba-1, forward: per batch `b`, channel `d` and state `n`,
//!
//! ```text
//! Δ_t = softplus(δ_t + bias_d)  (or δ_t + bias_d)
//! h_t = exp(Δ_t·A_{d,n})·h_{t−1} + Δ_t·B_{b,g,n,t}·u_t
//! y_t = Σ_n C_{b,g,n,t}·h_t + D_d·u_t,   then y_t · silu(z_t) with a gate
//! ```
//!
//! with `g = d / (channels / groups)`. A block takes one (b, d): its `N` states are the rows of
//! `N×(4096/N)` tiles along time (32 elements a thread, each row in one warp's lanes), each
//! chunk run by the prelude's `linear_recurrence_chunk` (a `tile_scan` of `(a, b)` pairs) from
//! the state the chunk before left, so a block walks its sequence once and the grid's
//! parallelism is `batch × channels`. The state is f32; the last
//! one is stored for the next call (chunked prefill) and may start from one given.

use crate::prelude::{drain_stages, fill_stages, linear_recurrence_chunk, scan_linear, sigmoid, silu, softplus};
use tessera::{device, kernel, Device, Element, Error, Grid, Optional, OptionalMut, Result, Tensor};

/// `selective_scan` for `N` states (`d_state`): `u`, `delta`, `z`, `y` as `[batch·channels, L]`
/// rows; `bm`, `cm` as `[batch·groups·N, L]`; `a` as `[channels·N, 1]`; `h0`, `h_last` as
/// `[batch·channels·N, 1]`; `dskip`, `bias` `[channels]`. Flags 1/0: `has_d`, `has_z`,
/// `softplus`, `has_h0`, `has_bias`.
#[kernel(dtypes(T = [bf16, f32]), tune(N = [16, 32, 64]))]
pub fn selective_scan_fwd(
    u: Global<T, 2>, delta: Global<T, 2>, a: Global<f32, 2>, bm: Global<T, 2>, cm: Global<T, 2>, dskip: Global<f32, 1>, z: Global<T, 2>,
    bias: Global<f32, 1>, h0: Global<f32, 2>, y: Global<T, 2>, h_last: Global<f32, 2>, channels: i32, groups: i32, has_d: i32, has_z: i32,
    softplus: i32, has_h0: i32, has_bias: i32,
) {
    let row = block::id_x();
    let b = row / channels;
    let d = row - b * channels;
    let g = d / (channels / groups);
    let srow = (b * groups + g) * N;
    let len = u.dim(1);
    // A's row for this channel, in log₂ units so that exp(Δ·A) = exp2(Δ·A·log₂e).
    let a2 = a.load::<Tile<f32, N, 1>>([d * N, 0]) * f32::consts::LOG2_E;
    let mut h = Tile::<f32, N, 1>::zeros();
    if has_h0 == 1 {
        h = h0.load::<Tile<f32, N, 1>>([row * N, 0]);
    }
    let mut bias_d = 0.0;
    if has_bias == 1 {
        bias_d = bias.get([d]);
    }
    let mut skip = 0.0;
    if has_d == 1 {
        skip = dskip.get([d]);
    }
    // 4096 / N steps a chunk: 32 elements a thread in each N×L tile, every row in one warp.
    for t in (0..len).step_by(4096 / N) {
        // The next chunk into L2 while this one computes (past the end: no request).
        let next = t + 4096 / N;
        delta.prefetch::<Tile<T, 1, { 4096 / N }>>([row, next]);
        u.prefetch::<Tile<T, 1, { 4096 / N }>>([row, next]);
        bm.prefetch::<Tile<T, N, { 4096 / N }>>([srow, next]);
        cm.prefetch::<Tile<T, N, { 4096 / N }>>([srow, next]);
        if has_z == 1 {
            z.prefetch::<Tile<T, 1, { 4096 / N }>>([row, next]);
        }
        // Steps past the end carry the state through: Δ = 0 gives a = 1, b = 0.
        let (_, dt) = step_sizes::<T, { 4096 / N }>(delta, row, t, len, bias_d, softplus);
        let ut = u.load_or::<Tile<T, 1, { 4096 / N }>>([row, t], 0.0).cast::<f32>();
        let bt = bm.load_or::<Tile<T, N, { 4096 / N }>>([srow, t], 0.0).cast::<f32>();
        let ct = cm.load_or::<Tile<T, N, { 4096 / N }>>([srow, t], 0.0).cast::<f32>();
        let dtn = Tile::<f32, N, { 4096 / N }>::zeros() + dt;
        let states = linear_recurrence_chunk(exp2(dtn * a2), bt * (dt * ut), &mut h);
        let mut out = col_sum(ct * states) + ut * skip;
        if has_z == 1 {
            let zt = z.load_or::<Tile<T, 1, { 4096 / N }>>([row, t], 0.0).cast::<f32>();
            out = out * silu(zt);
        }
        y.store([row, t], out.cast::<T>());
    }
    h_last.store([row * N, 0], h);
}

/// How many f32 states the thread-a-channel backward keeps: each 8-step chunk's starting
/// states.
fn saved_states(Dims { batch, channels, states, len, .. }: Dims) -> usize {
    len.div_ceil(8) * batch * channels * states
}

/// Whether the backward runs a thread a channel: as `rows_fit`, the saved states' offsets in
/// `i32` (the kernels' indices).
fn rows_save_fits<T>(dims: Dims) -> bool {
    rows_fit::<T>(dims) && i32::try_from(saved_states(dims)).is_ok()
}

/// Channels a block of `selective_scan_fwd_rows` takes: one a thread.
const ROWS_CHANNELS: usize = 128;

/// Whether the scan runs a thread a channel (`selective_scan_fwd_rows`, `selective_scan_bwd_rows`):
/// a group's channels come in blocks of 128, and rows of Δ, u, z start on 16 bytes for TMA.
/// How many segments a thread-a-channel forward splits each sequence into: one where its
/// blocks (one per 128 channels of a batch entry) already fill the GPU; else as many as fill it,
/// each at least 64 chunks (512 steps) long, and never 2 (a split runs the recurrence twice:
/// two segments would gain nothing).
fn sequence_segments(dev: &Device, blocks: usize, chunks: usize) -> usize {
    let sms = dev.sm_count().max(1) as usize;
    let segs = (sms / blocks.max(1)).min(chunks / 64);
    if segs >= 3 {
        segs
    } else {
        1
    }
}

/// The segments of a thread-a-channel kernel's sequence ([`sequence_segments`]) and the
/// chunks each takes (the kernels' `seg_chunks`).
fn split(dev: &Device, blocks: usize, len: usize) -> (usize, i32) {
    let chunks = len.div_ceil(8);
    let seg_chunks = chunks.div_ceil(sequence_segments(dev, blocks, chunks)).max(1);
    (chunks.div_ceil(seg_chunks).max(1), i32::try_from(seg_chunks).unwrap_or(i32::MAX))
}

fn rows_fit<T>(Dims { channels, groups, len, .. }: Dims) -> bool {
    (channels / groups).is_multiple_of(ROWS_CHANNELS) && (len * std::mem::size_of::<T>()).is_multiple_of(16)
}

/// `selective_scan_fwd` with a thread a channel, for 128 channels of one (batch, group) a block
/// (`channels / groups` a multiple of 128, rows of Δ, u, z a multiple of 16 bytes), three
/// warpgroups. A producer brings each 8-step chunk of Δ, u, z (128×8 boxes), B and C (N×8, f32)
/// into a ring of shared memory by TMA. Two consumers take half of the states each: a
/// `Tile<_, 128, 8>` holds one row a thread, so a chunk's recurrence is serial in registers (no
/// lane exchanges), and a consumer's states go one after another (an unrolled loop; their
/// carries and `A·log₂e` in shared memory, a row a thread), so that `y`'s sum over them stays in
/// the thread; the second consumer's half of `y` meets the first's in shared memory. Per state
/// and step: one `ex2`, the scan's multiply-adds and `C·h`. Arguments as `selective_scan_fwd`,
/// but `bm`, `cm` f32, `a` `[channels, N]`, `h0` and `h_last` `[batch·channels, N]`, `dskip` and
/// `bias` `[channels, 1]`. With `save` 1 (the backward's first pass) or 2 (a forward kept for
/// the backward, `SelectiveScan::run_saving`) each chunk's starting states go to `hsave`
/// (`[chunks·batch·channels·N, 1]`, a state's 128 channels of a block together so that its
/// store is one contiguous row: chunk k's state n of channel row `row0 + i` at
/// `(k·batch·channels + row0)·N + n·128 + i`); with `save` 1, `y` is not stored.
///
/// A long sequence over few blocks is split into segments of `seg_chunks` chunks, one a
/// `block::id_y()`: `pass` 1 runs each from zeros (the first from `h0`) and stores its end state
/// at `h_last[segment·rows + row, n]` and its sum of Δ at `dseg[segment·rows + row, 0]`, storing
/// no y; [`selective_scan_seg_carry`] turns those into each segment's true starting state;
/// `pass` 2 runs each again from it (`h0` `[segments·rows, N]`), storing y, and the last segment
/// its end state. `pass` 0 is one segment, the whole sequence.
#[kernel(dtypes(T = [bf16, f32]), tune(N = [16, 32, 64]), warpgroups = 3)]
pub fn selective_scan_fwd_rows(
    u: Global<T, 2>, delta: Global<T, 2>, a: Global<f32, 2>, bm: Global<f32, 2>, cm: Global<f32, 2>, dskip: Global<f32, 2>,
    z: Global<T, 2>, bias: Global<f32, 2>, h0: Global<f32, 2>, y: Global<T, 2>, h_last: Global<f32, 2>, hsave: Global<f32, 2>,
    dseg: Global<f32, 2>, channels: i32, groups: i32, has_d: i32, has_z: i32, softplus: i32, has_h0: i32, has_bias: i32, save: i32,
    seg_chunks: i32, pass: i32,
) {
    let (d0, row0, srow) = channel_block::<N>(channels, groups);
    let rows = u.dim(0);
    let len = u.dim(1);
    // This block's segment of the sequence (`block::id_y()`, `seg_chunks` chunks each), and
    // where its start and end states sit in `h0` and `h_last` (`[segments·rows, N]`).
    let seg = block::id_y();
    let first = seg * seg_chunks;
    let count = min(seg_chunks, (len + 7) / 8 - first);
    let hrow = seg * rows + row0;
    let sx = Smem::<T, 128, 8>::ring_swizzled(8, 0);
    let su = Smem::<T, 128, 8>::ring_swizzled(8, 0);
    let sz = Smem::<T, 128, 8>::ring_swizzled(8, 0);
    let sb = Smem::<f32, N, 8>::ring_swizzled(8, 0);
    let sc = Smem::<f32, N, 8>::ring_swizzled(8, 0);
    // State n's carry and A·log₂e for the block's channels: row i is a consumer's thread i's.
    let hs = Smem::<f32, 128, 1>::ring(N);
    let a2 = Smem::<f32, 128, 1>::ring(N);
    // The second consumer's part of y, by chunk parity.
    let sy = Smem::<f32, 128, 8>::ring_swizzled(2, 0);
    let pipe = Pipeline::<8>::new(2);
    if warpgroup::id() == 0 {
        setmaxnreg(40);
        fill_stages(pipe, count, |s, i| {
            let c = first + i;
            tma::load(sx.at(s), delta, [row0, c * 8], pipe);
            tma::load(su.at(s), u, [row0, c * 8], pipe);
            if has_z == 1 {
                tma::load(sz.at(s), z, [row0, c * 8], pipe);
            }
            tma::load(sb.at(s), bm, [srow, c * 8], pipe);
            tma::load(sc.at(s), cm, [srow, c * 8], pipe);
        });
    } else {
        setmaxnreg(232);
        let me = warpgroup::id() - 1;
        let n0 = me * (N / 2);
        #[unroll]
        for n in 0..N / 2 {
            a2.at(n0 + n).store(a.load::<Tile<f32, 128, 1>>([d0, n0 + n]) * f32::consts::LOG2_E);
            // Pass 1 starts every segment but the first from zeros.
            if has_h0 == 1 && (pass != 1 || seg == 0) {
                hs.at(n0 + n).store(h0.load::<Tile<f32, 128, 1>>([hrow, n0 + n]));
            } else {
                hs.at(n0 + n).store(Tile::<f32, 128, 1>::zeros());
            }
        }
        let (bias_d, skip) = channel_columns(bias, dskip, d0, has_bias, has_d);
        // The segment's sum of Δ a channel (its decay is 2^(A·log₂e·ΣΔ)), stored by pass 1
        // (added in every pass: cheaper than a branch in the loop).
        let mut dsum = Tile::<f32, 128, 8>::zeros();
        drain_stages(pipe, count, |s, i| {
            let c = first + i;
            let t = c * 8;
            if save >= 1 {
                #[unroll]
                for n in 0..N / 2 {
                    hsave.store([(c * rows + row0) * N + (n0 + n) * 128, 0], hs.at(n0 + n).load());
                }
            }
            let dt = deltas::<128, 8>(sx.at(s).load().cast::<f32>() + bias_d, softplus, len - t);
            dsum = dsum + dt;
            let ut = su.at(s).load().cast::<f32>();
            let du = dt * ut;
            let mut out = Tile::<f32, 128, 8>::zeros();
            // Eight states unrolled at a time (more outrun the 168 registers of three
            // warpgroups); at d_state 16 the loop after the first eight runs no times.
            #[unroll]
            for n in 0..8 {
                state_chunk::<N>(hs, a2, sb, sc, s, n0 + n, dt, du, &mut out);
            }
            for q in 1..N / 16 {
                #[unroll]
                for n in 0..8 {
                    state_chunk::<N>(hs, a2, sb, sc, s, n0 + q * 8 + n, dt, du, &mut out);
                }
            }
            if me == 1 {
                sy.at(c % 2).store(out);
            }
            barrier::sync(1, 2);
            if me == 0 {
                out = out + sy.at(c % 2).load() + ut * skip;
                if has_z == 1 {
                    let zt = sz.at(s).load().cast::<f32>();
                    out = out * silu(zt);
                }
                if save != 1 && pass != 1 {
                    y.store([row0, t], out.cast::<T>());
                }
            }
        });
        // Pass 1: each segment's end state and ΣΔ; else the last segment's end state alone.
        let mut last = row0;
        if pass == 1 {
            last = hrow;
        }
        if pass == 1 || seg == grid::dim_y() - 1 {
            #[unroll]
            for n in 0..N / 2 {
                h_last.store([last, n0 + n], hs.at(n0 + n).load());
            }
        }
        if pass == 1 && me == 0 {
            dseg.store([hrow, 0], row_sum(dsum));
        }
    }
}

/// The states each segment of a split `selective_scan_fwd_rows` starts from: segment 0 from
/// `h0` (or zeros), segment k from segment k − 1's, carried through its decay and plus its end
/// state from zeros: `h_in[k] = 2^(A·log₂e·ΣΔ[k−1])·h_in[k−1] + h_end[k−1]`. `hseg` (the end
/// states) and `hin` `[segments·rows, N]`, `dseg` (ΣΔ) `[segments·rows, 1]`, `a` `[channels, N]`;
/// 128 rows a block.
#[kernel(tune(N = [16, 32, 64]))]
pub fn selective_scan_seg_carry(
    a: Global<f32, 2>, hseg: Global<f32, 2>, dseg: Global<f32, 2>, h0: Global<f32, 2>, hin: Global<f32, 2>, channels: i32, rows: i32,
    has_h0: i32,
) {
    let row0 = block::id_x() * 128;
    let a2 = a.load::<Tile<f32, 128, N>>([row0 % channels, 0]) * f32::consts::LOG2_E;
    let mut h = Tile::<f32, 128, N>::zeros();
    if has_h0 == 1 {
        h = h0.load([row0, 0]);
    }
    for k in 0..hseg.dim(0) / rows {
        hin.store([k * rows + row0, 0], h);
        h = exp2(a2 * dseg.load::<Tile<f32, 128, 1>>([k * rows + row0, 0])) * h + hseg.load::<Tile<f32, 128, N>>([k * rows + row0, 0]);
    }
}

/// Where a block of a thread-a-channel kernel (`selective_scan_fwd_rows`, `_bwd_rows`; 128
/// channels of one batch and group a block) starts: its first channel `d0`, its first row of
/// `u`, `delta`, `z` (`row0`) and of B and C (`srow`).
#[device]
fn channel_block<const N: usize>(channels: i32, groups: i32) -> (i32, i32, i32) {
    let blocks = channels / 128;
    let b = block::id_x() / blocks;
    let d0 = (block::id_x() - b * blocks) * 128;
    (d0, b * channels + d0, (b * groups + d0 / (channels / groups)) * N)
}

/// The block's channels' delta bias and `D` (`[channels, 1]` columns, a row a thread), zeros
/// where absent.
#[device]
fn channel_columns(
    bias: Global<f32, 2>, dskip: Global<f32, 2>, d0: i32, has_bias: i32, has_d: i32,
) -> (Tile<f32, 128, 1>, Tile<f32, 128, 1>) {
    let mut bias_d = Tile::<f32, 128, 1>::zeros();
    if has_bias == 1 {
        bias_d = bias.load::<Tile<f32, 128, 1>>([d0, 0]);
    }
    let mut skip = Tile::<f32, 128, 1>::zeros();
    if has_d == 1 {
        skip = dskip.load::<Tile<f32, 128, 1>>([d0, 0]);
    }
    (bias_d, skip)
}

/// State `j`'s 8-step chunk in `selective_scan_fwd_rows`, a thread a channel: its carry (`hs`)
/// through the chunk's recurrence (`a = 2^(Δ·A·log₂e)` with `a2` holding `A·log₂e`,
/// `b = Δ·u·B`), and `C·h` added into `out`. `sb`, `sc` hold the chunk's B and C (stage `s`,
/// row `j`).
#[device]
#[allow(clippy::too_many_arguments)]
fn state_chunk<const N: usize>(
    hs: Smem<f32, 128, 1>, a2: Smem<f32, 128, 1>, sb: Smem<f32, N, 8>, sc: Smem<f32, N, 8>, s: i32, j: i32, dt: Tile<f32, 128, 8>,
    du: Tile<f32, 128, 8>, out: &mut Tile<f32, 128, 8>,
) {
    let mut h = hs.at(j).load();
    let states = linear_recurrence_chunk(exp2(dt * a2.at(j).load()), du * sb.at(s).rows(j, 1).load(), &mut h);
    hs.at(j).store(h);
    *out = *out + sc.at(s).rows(j, 1).load() * states;
}

/// State `j`'s part of an 8-step chunk of `selective_scan_bwd_rows`, a thread a channel, from
/// its starting state `h`: the states again (`a·h_{t−1} = h_t − Δ·B·u`), the state gradient
/// `g_t = C_t·dy_t + a_{t+1}·g_{t+1}` as a reverse scan from the carry the chunk after left in
/// `gs`, the state's terms of y (`yp`), of `du` (`gb`, `g·B`) and of `ddelta` (`gx`), dA summed
/// into `das`, and dB and dC added into row `srow + j` at step `t` (each warp's column totals by
/// a reduce-scatter, no exchange across warps). `dt`, `dtu`, `dy`, `ut`: the chunk's Δ, Δ·u, the
/// gradient reaching y before the gate, u; `sb`, `sc` its B and C (stage `s`).
#[device]
#[allow(clippy::too_many_arguments)]
fn state_grads<const N: usize>(
    h: Tile<f32, 128, 1>, j: i32, s: i32, t: i32, dt: Tile<f32, 128, 8>, dtu: Tile<f32, 128, 8>, dy: Tile<f32, 128, 8>,
    ut: Tile<f32, 128, 8>, a2: Smem<f32, 128, 1>, gs: Smem<f32, 128, 1>, das: Smem<f32, 128, 1>, sb: Smem<f32, N, 8>, sc: Smem<f32, N, 8>,
    db: Global<f32, 2>, dc: Global<f32, 2>, srow: i32, yp: &mut Tile<f32, 128, 8>, gb: &mut Tile<f32, 128, 8>, gx: &mut Tile<f32, 128, 8>,
) {
    let an = a2.at(j).load();
    let at = exp2(dt * an);
    let bn = sb.at(s).rows(j, 1).load();
    let cn = sc.at(s).rows(j, 1).load();
    let bb = dtu * bn;
    let mut h = h;
    let ht = linear_recurrence_chunk(at, bb, &mut h);
    // a_t·h_{t−1}.
    let ap = ht - bb;
    *yp = *yp + cn * ht;
    let mut gt = Tile::<f32, 128, 8>::zeros();
    g_chunk(at, cn * dy, gs, j, &mut gt);
    *gb = *gb + gt * bn;
    let gap = gt * ap;
    *gx = *gx + gt * bn * ut + gap * (an * f32::consts::LN_2);
    das.at(j).store(das.at(j).load() + row_sum(gap * dt));
    db.atomic_add([srow + j, t], col_sum(gt * dtu));
    dc.atomic_add([srow + j, t], col_sum(dy * ht));
}

/// State `j`'s gradient over an 8-step chunk, `g_t = C_t·dy_t + a_{t+1}·g_{t+1}` (`cdy` =
/// `C·dy`), into `gt`: a reverse scan from the carry the chunk after left in `gs` (`a·g` at its
/// first step), which it replaces with this chunk's.
#[device]
fn g_chunk(at: Tile<f32, 128, 8>, cdy: Tile<f32, 128, 8>, gs: Smem<f32, 128, 1>, j: i32, gt: &mut Tile<f32, 128, 8>) {
    let (ra, rb) = tile_scan_reverse_exclusive::<scan_linear>((at, at * cdy), 1, (1.0, 0.0));
    *gt = cdy + ra * gs.at(j).load() + rb;
    gs.at(j).store((at * *gt).first_col());
}

/// The selective scan's backward for 128 channels of one (batch, group) a block, as
/// `selective_scan_fwd_rows` (three warpgroups: a producer bringing Δ, u, z, dy and the f32 B
/// and C by TMA, now from the last chunk back; two consumers splitting the states, a thread a
/// channel). Each chunk's states come again from its starting states (`hsave`, which the
/// forward kernel's `save` pass stored), `a·h_{t−1}` as `h_t − Δ·B·u`; the state gradient
/// `g_t = C_t·dy_t + a_{t+1}·g_{t+1}` is a reverse scan from the carry the chunk after left (in
/// shared memory, a row a thread). `du`, `ddelta` and `dz` are stored (the second consumer's
/// sums over its states meet the first's in shared memory), dA summed in shared memory and
/// added once at the end, dB and dC summed over the block's channels and added each chunk,
/// dD and d(delta_bias) summed in registers and added once. Gradients as `selective_scan_bwd`
/// takes them, `da` `[channels, N]`, `dd` and `dbias` `[channels, 1]`.
#[kernel(dtypes(T = [bf16, f32]), tune(N = [16, 32, 64]), warpgroups = 3)]
pub fn selective_scan_bwd_rows(
    u: Global<T, 2>, delta: Global<T, 2>, a: Global<f32, 2>, bm: Global<f32, 2>, cm: Global<f32, 2>, dskip: Global<f32, 2>,
    z: Global<T, 2>, bias: Global<f32, 2>, dout: Global<T, 2>, hsave: Global<f32, 2>, du: Global<T, 2>, ddelta: Global<T, 2>,
    dz: Global<T, 2>, da: Global<f32, 2>, db: Global<f32, 2>, dc: Global<f32, 2>, dd: Global<f32, 2>, dbias: Global<f32, 2>,
    gseg: Global<f32, 2>, dseg: Global<f32, 2>, channels: i32, groups: i32, has_d: i32, has_z: i32, softplus: i32, has_bias: i32,
    seg_chunks: i32, pass: i32,
) {
    let (d0, row0, srow) = channel_block::<N>(channels, groups);
    let rows = u.dim(0);
    let len = u.dim(1);
    // This block's segment (`block::id_y()`, `seg_chunks` chunks each) and its row in `gseg`
    // and `dseg`, the segments counted from the sequence's end.
    let seg = block::id_y();
    let first = seg * seg_chunks;
    let count = min(seg_chunks, (len + 7) / 8 - first);
    let crow = (grid::dim_y() - 1 - seg) * rows + row0;
    let sx = Smem::<T, 128, 8>::ring_swizzled(4, 0);
    let su = Smem::<T, 128, 8>::ring_swizzled(4, 0);
    let sz = Smem::<T, 128, 8>::ring_swizzled(4, 0);
    let sdo = Smem::<T, 128, 8>::ring_swizzled(4, 0);
    let sb = Smem::<f32, N, 8>::ring_swizzled(4, 0);
    let sc = Smem::<f32, N, 8>::ring_swizzled(4, 0);
    // Per state: A·log₂e, the carry of g, the sum for dA; a row a consumer thread.
    let a2 = Smem::<f32, 128, 1>::ring(N);
    let gs = Smem::<f32, 128, 1>::ring(N);
    let das = Smem::<f32, 128, 1>::ring(N);
    // The second consumer's sums over its states (y, g·B, ∂/∂Δ), by chunk parity.
    let sp = Smem::<f32, 128, 8>::ring_swizzled(6, 0);
    let pipe = Pipeline::<4>::new(2);
    if warpgroup::id() == 0 {
        setmaxnreg(40);
        fill_stages(pipe, count, |s, i| {
            let t = (first + count - 1 - i) * 8;
            tma::load(sx.at(s), delta, [row0, t], pipe);
            tma::load(su.at(s), u, [row0, t], pipe);
            tma::load(sdo.at(s), dout, [row0, t], pipe);
            if has_z == 1 {
                tma::load(sz.at(s), z, [row0, t], pipe);
            }
            tma::load(sb.at(s), bm, [srow, t], pipe);
            tma::load(sc.at(s), cm, [srow, t], pipe);
        });
    } else {
        setmaxnreg(232);
        let me = warpgroup::id() - 1;
        let n0 = me * (N / 2);
        #[unroll]
        for n in 0..N / 2 {
            a2.at(n0 + n).store(a.load::<Tile<f32, 128, 1>>([d0, n0 + n]) * f32::consts::LOG2_E);
            // Pass 2 starts each segment from the carry the segments after it leave.
            if pass == 2 {
                gs.at(n0 + n).store(gseg.load::<Tile<f32, 128, 1>>([crow, n0 + n]));
            } else {
                gs.at(n0 + n).store(Tile::<f32, 128, 1>::zeros());
            }
            das.at(n0 + n).store(Tile::<f32, 128, 1>::zeros());
        }
        let (bias_d, skip) = channel_columns(bias, dskip, d0, has_bias, has_d);
        let mut dd_sum = Tile::<f32, 128, 1>::zeros();
        let mut dbias_sum = Tile::<f32, 128, 1>::zeros();
        // The segment's ΣΔ a channel, stored by pass 1 (added in every pass: no branch).
        let mut dsum = Tile::<f32, 128, 8>::zeros();
        drain_stages(pipe, count, |s, i| {
            let k = first + count - 1 - i;
            let t = k * 8;
            let x = sx.at(s).load().cast::<f32>() + bias_d;
            let dt = deltas::<128, 8>(x, softplus, len - t);
            dsum = dsum + dt;
            let ut = su.at(s).load().cast::<f32>();
            let go = sdo.at(s).load().cast::<f32>();
            let dtu = dt * ut;
            // The gradient reaching y before the gate.
            let mut dy = go;
            if has_z == 1 {
                let zt = sz.at(s).load().cast::<f32>();
                dy = go * silu(zt);
            }
            if pass == 1 {
                // The carry of g alone.
                #[unroll]
                for q in 0..N / 16 {
                    #[unroll]
                    for n in 0..8 {
                        let j = n0 + q * 8 + n;
                        let mut gt = Tile::<f32, 128, 8>::zeros();
                        g_chunk(exp2(dt * a2.at(j).load()), sc.at(s).rows(j, 1).load() * dy, gs, j, &mut gt);
                    }
                }
            } else {
                let mut yp = Tile::<f32, 128, 8>::zeros();
                let mut gb = Tile::<f32, 128, 8>::zeros();
                let mut gx = Tile::<f32, 128, 8>::zeros();
                // The chunk's starting states, eight at a time, loaded before any is needed.
                #[unroll]
                for q in 0..N / 16 {
                    let j = n0 + q * 8;
                    let at = (k * rows + row0) * N + j * 128;
                    let h0 = hsave.load::<Tile<f32, 128, 1>>([at, 0]);
                    let h1 = hsave.load::<Tile<f32, 128, 1>>([at + 128, 0]);
                    let h2 = hsave.load::<Tile<f32, 128, 1>>([at + 256, 0]);
                    let h3 = hsave.load::<Tile<f32, 128, 1>>([at + 384, 0]);
                    let h4 = hsave.load::<Tile<f32, 128, 1>>([at + 512, 0]);
                    let h5 = hsave.load::<Tile<f32, 128, 1>>([at + 640, 0]);
                    let h6 = hsave.load::<Tile<f32, 128, 1>>([at + 768, 0]);
                    let h7 = hsave.load::<Tile<f32, 128, 1>>([at + 896, 0]);
                    state_grads::<N>(h0, j, s, t, dt, dtu, dy, ut, a2, gs, das, sb, sc, db, dc, srow, &mut yp, &mut gb, &mut gx);
                    state_grads::<N>(h1, j + 1, s, t, dt, dtu, dy, ut, a2, gs, das, sb, sc, db, dc, srow, &mut yp, &mut gb, &mut gx);
                    state_grads::<N>(h2, j + 2, s, t, dt, dtu, dy, ut, a2, gs, das, sb, sc, db, dc, srow, &mut yp, &mut gb, &mut gx);
                    state_grads::<N>(h3, j + 3, s, t, dt, dtu, dy, ut, a2, gs, das, sb, sc, db, dc, srow, &mut yp, &mut gb, &mut gx);
                    state_grads::<N>(h4, j + 4, s, t, dt, dtu, dy, ut, a2, gs, das, sb, sc, db, dc, srow, &mut yp, &mut gb, &mut gx);
                    state_grads::<N>(h5, j + 5, s, t, dt, dtu, dy, ut, a2, gs, das, sb, sc, db, dc, srow, &mut yp, &mut gb, &mut gx);
                    state_grads::<N>(h6, j + 6, s, t, dt, dtu, dy, ut, a2, gs, das, sb, sc, db, dc, srow, &mut yp, &mut gb, &mut gx);
                    state_grads::<N>(h7, j + 7, s, t, dt, dtu, dy, ut, a2, gs, das, sb, sc, db, dc, srow, &mut yp, &mut gb, &mut gx);
                }
                let p = (i % 2) * 3;
                if me == 1 {
                    sp.at(p).store(yp);
                    sp.at(p + 1).store(gb);
                    sp.at(p + 2).store(gx);
                }
                barrier::sync(1, 2);
                if me == 0 {
                    let y = yp + sp.at(p).load() + ut * skip;
                    du.store([row0, t], ((gb + sp.at(p + 1).load()) * dt + dy * skip).cast::<T>());
                    let mut dx = gx + sp.at(p + 2).load();
                    if softplus == 1 {
                        dx = dx * sigmoid(x);
                    }
                    dx = dx.mask_cols(len - t, 0.0);
                    ddelta.store([row0, t], dx.cast::<T>());
                    if has_z == 1 {
                        let zt = sz.at(s).load().cast::<f32>();
                        let sig = sigmoid(zt);
                        dz.store([row0, t], (go * y * sig * (1.0 + zt * (1.0 - sig))).cast::<T>());
                    }
                    dd_sum = dd_sum + row_sum(dy * ut);
                    dbias_sum = dbias_sum + row_sum(dx);
                }
            }
        });
        if pass == 1 {
            #[unroll]
            for n in 0..N / 2 {
                gseg.store([crow, n0 + n], gs.at(n0 + n).load());
            }
            if me == 0 {
                dseg.store([crow, 0], row_sum(dsum));
            }
        } else {
            #[unroll]
            for n in 0..N / 2 {
                da.atomic_add([d0, n0 + n], das.at(n0 + n).load());
            }
            if me == 0 {
                if has_d == 1 {
                    dd.atomic_add([d0, 0], dd_sum);
                }
                if has_bias == 1 {
                    dbias.atomic_add([d0, 0], dbias_sum);
                }
            }
        }
    }
}

/// Channels a block of `selective_scan_bwd` takes, of one (batch, group): their dB and dC
/// summed in registers before one atomic add a chunk.
const BWD_CHANNELS: usize = 8;

/// The selective scan's backward for 8 channels of one (batch, group) a block (rows as in
/// `selective_scan_fwd`; `dout` as `y`; consecutive blocks take consecutive batches, so that
/// the blocks running at once add into different rows of dB and dC). A first walk recomputes
/// each channel's recurrence and stores each chunk's starting state in `hs` (`[batch·channels·N,
/// chunks]` scratch). A second walks the chunks from the last, and in each, channel by
/// channel (chunks of 2048/N steps, 16 elements a thread in a tile, so that the block's sums
/// of dB and dC fit beside one channel's work): the states again from the chunk's start (an exclusive scan gives `h_{t−1}`), the
/// state gradient `g_t = C_t·dy_t + a_{t+1}·g_{t+1}` as a reverse scan of `(a, a·C·dy)` from
/// the channel's carry (`a·g` at the next chunk's first step, kept in `qs`), `du`, `ddelta`,
/// `dz` stored, `dA`, `dD`, `d(delta_bias)` added; then the chunk's dB and dC, summed over the
/// block's channels, added with one `atomic_add` each into zeroed f32 tensors.
#[kernel(dtypes(T = [bf16, f32]), tune(N = [16, 32, 64]))]
pub fn selective_scan_bwd(
    u: Global<T, 2>, delta: Global<T, 2>, a: Global<f32, 2>, bm: Global<T, 2>, cm: Global<T, 2>, dskip: Global<f32, 1>, z: Global<T, 2>,
    bias: Global<f32, 1>, h0: Global<f32, 2>, dout: Global<T, 2>, hs: Global<f32, 2>, qs: Global<f32, 2>, du: Global<T, 2>,
    ddelta: Global<T, 2>, dz: Global<T, 2>, da: Global<f32, 2>, db: Global<f32, 2>, dc: Global<f32, 2>, dd: Global<f32, 2>,
    dbias: Global<f32, 2>, batch: i32, channels: i32, groups: i32, has_d: i32, has_z: i32, softplus: i32, has_h0: i32, has_bias: i32,
) {
    let per_group = channels / groups;
    let b = block::id_x() - (block::id_x() / batch) * batch;
    let rest = block::id_x() / batch;
    let g = rest - (rest / groups) * groups;
    let first = (rest / groups) * 8;
    let d0 = g * per_group + first;
    let count = min(8, per_group - first);
    let srow = (b * groups + g) * N;
    let len = u.dim(1);
    let chunks = (len + 2048 / N - 1) / (2048 / N);
    // Each channel's chunk-start states, and its reverse carry zeroed.
    for c in 0..count {
        let d = d0 + c;
        let row = b * channels + d;
        let a2 = a.load::<Tile<f32, N, 1>>([d * N, 0]) * f32::consts::LOG2_E;
        let mut bias_d = 0.0;
        if has_bias == 1 {
            bias_d = bias.get([d]);
        }
        let mut h = Tile::<f32, N, 1>::zeros();
        if has_h0 == 1 {
            h = h0.load::<Tile<f32, N, 1>>([row * N, 0]);
        }
        qs.store([row * N, 0], Tile::<f32, N, 1>::zeros());
        for i in 0..chunks {
            let t = i * (2048 / N);
            hs.store([row * N, i], h);
            let (_, dt) = step_sizes::<T, { 2048 / N }>(delta, row, t, len, bias_d, softplus);
            let ut = u.load_or::<Tile<T, 1, { 2048 / N }>>([row, t], 0.0).cast::<f32>();
            let bt = bm.load_or::<Tile<T, N, { 2048 / N }>>([srow, t], 0.0).cast::<f32>();
            let dtn = Tile::<f32, N, { 2048 / N }>::zeros() + dt;
            linear_recurrence_chunk(exp2(dtn * a2), bt * (dt * ut), &mut h);
        }
    }
    barrier::sync(0, 1);
    for i in 0..chunks {
        let k = chunks - 1 - i;
        let t = k * (2048 / N);
        let mut sum_db = Tile::<f32, N, { 2048 / N }>::zeros();
        let mut sum_dc = Tile::<f32, N, { 2048 / N }>::zeros();
        for c in 0..count {
            let d = d0 + c;
            let row = b * channels + d;
            let a_nat = a.load::<Tile<f32, N, 1>>([d * N, 0]);
            let mut bias_d = 0.0;
            if has_bias == 1 {
                bias_d = bias.get([d]);
            }
            let mut skip = 0.0;
            if has_d == 1 {
                skip = dskip.get([d]);
            }
            let start = hs.load::<Tile<f32, N, 1>>([row * N, k]);
            let carry = qs.load::<Tile<f32, N, 1>>([row * N, 0]);
            let (x, dt) = step_sizes::<T, { 2048 / N }>(delta, row, t, len, bias_d, softplus);
            let ut = u.load_or::<Tile<T, 1, { 2048 / N }>>([row, t], 0.0).cast::<f32>();
            let go = dout.load_or::<Tile<T, 1, { 2048 / N }>>([row, t], 0.0).cast::<f32>();
            // B and C again for each channel (from L1/L2): registers for the sums instead.
            let bt = bm.load_or::<Tile<T, N, { 2048 / N }>>([srow, t], 0.0).cast::<f32>();
            let ct = cm.load_or::<Tile<T, N, { 2048 / N }>>([srow, t], 0.0).cast::<f32>();
            let at = exp2((Tile::<f32, N, { 2048 / N }>::zeros() + dt) * (a_nat * f32::consts::LOG2_E));
            let bb = bt * (dt * ut);
            let (pa, pb) = tile_scan_exclusive::<scan_linear>((at, bb), 1, (1.0, 0.0));
            // a_t·h_{t−1}, then h_t.
            let ap = at * (pa * start + pb);
            let ht = ap + bb;
            let mut dy = go;
            if has_z == 1 {
                let zt = z.load_or::<Tile<T, 1, { 2048 / N }>>([row, t], 0.0).cast::<f32>();
                let sig = sigmoid(zt);
                let y = col_sum(ct * ht) + ut * skip;
                dz.store([row, t], (go * y * sig * (1.0 + zt * (1.0 - sig))).cast::<T>());
                dy = go * zt * sig;
            }
            let cdy = ct * dy;
            let (ra, rb) = tile_scan_reverse_exclusive::<scan_linear>((at, at * cdy), 1, (1.0, 0.0));
            let gt = cdy + ra * carry + rb;
            qs.store([row * N, 0], (at * gt).first_col());
            sum_dc = sum_dc + ht * dy;
            sum_db = sum_db + gt * (dt * ut);
            du.store([row, t], (col_sum(gt * bt * dt) + dy * skip).cast::<T>());
            let gh = gt * ap;
            da.atomic_add([d * N, 0], row_sum(gh * dt));
            let mut dx = col_sum(gt * bt * ut + gh * a_nat);
            if softplus == 1 {
                dx = dx * sigmoid(x);
            }
            ddelta.store([row, t], dx.cast::<T>());
            if has_d == 1 {
                dd.atomic_add([d, 0], row_sum(dy * ut));
            }
            if has_bias == 1 {
                dbias.atomic_add([d, 0], row_sum(dx));
            }
        }
        dc.atomic_add([srow, t], sum_dc);
        db.atomic_add([srow, t], sum_db);
        // The carries stored in this chunk are read in the next.
        barrier::sync(0, 1);
    }
}

/// A chunk's `delta + bias` (`x`) and step sizes `Δ` ([`deltas`]).
#[device]
fn step_sizes<T, const W: usize>(
    delta: Global<T, 2>, row: i32, t: i32, len: i32, bias_d: f32, softplus: i32,
) -> (Tile<f32, 1, W>, Tile<f32, 1, W>) {
    let x = delta.load_or::<Tile<T, 1, W>>([row, t], 0.0).cast::<f32>() + bias_d;
    (x, deltas::<1, W>(x, softplus, len - t))
}

/// Step sizes `Δ` from `x = δ + bias` (its softplus with `softplus` 1), 0 past the sequence's
/// end (`left` steps remain), so that those steps carry the state through (a = 1, b = 0).
#[device]
fn deltas<const R: usize, const W: usize>(x: Tile<f32, R, W>, softplus: i32, left: i32) -> Tile<f32, R, W> {
    let mut dt = x;
    if softplus == 1 {
        dt = softplus(x);
    }
    dt.mask_cols(left, 0.0)
}

/// One step of the selective scan, the decode path: for 64 channels of one (batch, group) a
/// block, `state` (`[batch·channels, N]`, f32) becomes `exp(Δ·A)·state + Δ·B·u` in place and
/// `y = C·state (+ D·u) (· silu(z))`. `u`, `delta`, `z`, `y` as `[batch·channels, 1]`; `bm`, `cm`
/// as `[batch·groups, N]` (one row a block, broadcast over its channels); `a` `[channels, N]`;
/// `dskip`, `bias` `[channels, 1]`. Flags as in `selective_scan_fwd`.
#[kernel(dtypes(T = [bf16, f32]), tune(N = [16, 32, 64]))]
pub fn selective_scan_step(
    state: Global<f32, 2>, u: Global<T, 2>, delta: Global<T, 2>, a: Global<f32, 2>, bm: Global<T, 2>, cm: Global<T, 2>,
    dskip: Global<f32, 2>, z: Global<T, 2>, bias: Global<f32, 2>, y: Global<T, 2>, channels: i32, groups: i32, has_d: i32, has_z: i32,
    softplus: i32, has_bias: i32,
) {
    let per_group = channels / groups;
    let blocks = (per_group + 63) / 64;
    let bg = block::id_x() / blocks;
    let g = bg - (bg / groups) * groups;
    let first = block::id_x() - bg * blocks;
    // This block's channels: 64 of group g from `d0`; rows past the group's end are not stored.
    let d0 = g * per_group + first * 64;
    let row0 = (bg / groups) * channels + d0;
    let end = row0 + per_group - first * 64;
    let h = state.load_or::<Tile<f32, 64, N>>([row0, 0], 0.0);
    let av = a.load_or::<Tile<f32, 64, N>>([d0, 0], 0.0);
    // A channel's values once a row, in the layout of the state's rows (a row maximum of the
    // value broadcast over them: exact, one shuffle), so that they meet the state in registers.
    let ut = row_max(Tile::<f32, 64, N>::zeros() + u.load_or::<Tile<T, 64, 1>>([row0, 0], 0.0).cast::<f32>());
    let mut x = row_max(Tile::<f32, 64, N>::zeros() + delta.load_or::<Tile<T, 64, 1>>([row0, 0], 0.0).cast::<f32>());
    if has_bias == 1 {
        x = x + bias.load_or::<Tile<f32, 64, 1>>([d0, 0], 0.0);
    }
    let mut dt = x;
    if softplus == 1 {
        dt = max(x, 0.0) + log2(1.0 + exp2(abs(x) * -f32::consts::LOG2_E)) * f32::consts::LN_2;
    }
    let bt = bm.load::<Tile<T, 1, N>>([bg, 0]).cast::<f32>();
    let hn = exp2(av * (dt * f32::consts::LOG2_E)) * h + (Tile::<f32, 64, N>::zeros() + bt) * (dt * ut);
    state.store_within([row0, 0], hn, [end, N]);
    let mut out = row_sum(hn * cm.load::<Tile<T, 1, N>>([bg, 0]).cast::<f32>());
    if has_d == 1 {
        out = out + ut * dskip.load_or::<Tile<f32, 64, 1>>([d0, 0], 0.0);
    }
    if has_z == 1 {
        let zt = row_max(Tile::<f32, 64, N>::zeros() + z.load_or::<Tile<T, 64, 1>>([row0, 0], 0.0).cast::<f32>());
        out = out * silu(zt);
    }
    y.store_within([row0, 0], out.cast::<T>(), [end, 1]);
}

/// The element types the selective scan takes for `u`, `delta`, `B`, `C`, `z` and `y`: bf16 and
/// f32.
pub trait SelectiveScanElement: Element + sealed::Sealed {
    #[doc(hidden)]
    fn selective_scan_launch(
        s: &SelectiveScan<'_, Self>, dims: Dims, y: &mut Tensor<Self>, h_last: Option<&mut Tensor<f32>>, hsave: Option<&mut Tensor<f32>>,
    ) -> Result<()>;
    #[doc(hidden)]
    fn selective_scan_step_launch(s: &SelectiveScan<'_, Self>, dims: Dims, y: &mut Tensor<Self>, state: &mut Tensor<f32>) -> Result<()>;
    #[doc(hidden)]
    fn selective_scan_bwd_launch(
        s: &SelectiveScan<'_, Self>, dims: Dims, dout: &Tensor<Self>, grads: &mut SelectiveScanGrads<Self>, saved: Option<&Tensor<f32>>,
    ) -> Result<()>;
    #[doc(hidden)]
    fn selective_scan_rows_launch(
        s: &SelectiveScan<'_, Self>, dims: Dims, y: &mut OptionalMut<'_, tessera::TensorViewMut<'_, Self>>,
        h_last: &mut OptionalMut<'_, tessera::TensorViewMut<'_, f32>>, hsave: Option<&mut Tensor<f32>>,
    ) -> Result<()>;
}

/// The gradients of a selective scan ([`SelectiveScan::backward`]): `du`, `ddelta`, `dz` in the
/// inputs' type and shape; `da` `[channels, d_state]`, `db`, `dc` `[batch, groups, d_state, L]`,
/// `dd` and `d_delta_bias` `[channels]` in f32 (summed over the batch, and `db`, `dc` over a
/// group's channels, by atomic adds: their last bits vary from run to run). `dz`, `dd` and
/// `d_delta_bias` exist where the scan has a gate, a `D` and a delta bias.
pub struct SelectiveScanGrads<T: Element> {
    /// ∂L/∂u.
    pub du: Tensor<T>,
    /// ∂L/∂delta (through the bias and softplus).
    pub ddelta: Tensor<T>,
    /// ∂L/∂A.
    pub da: Tensor<f32>,
    /// ∂L/∂B.
    pub db: Tensor<f32>,
    /// ∂L/∂C.
    pub dc: Tensor<f32>,
    /// ∂L/∂D.
    pub dd: Option<Tensor<f32>>,
    /// ∂L/∂z.
    pub dz: Option<Tensor<T>>,
    /// ∂L/∂delta_bias.
    pub d_delta_bias: Option<Tensor<f32>>,
}

mod sealed {
    pub trait Sealed {}
    impl Sealed for tessera::bf16 {}
    impl Sealed for f32 {}
}

/// What [`SelectiveScan::run_saving`] keeps for [`SelectiveScan::backward_saved`]: each 8-step
/// chunk's starting states (none where the scan does not run a thread a channel).
pub struct SavedScan {
    states: Option<Tensor<f32>>,
    /// How many states a scan of these sizes keeps (checked against the backward's).
    len: usize,
}

/// The problem's sizes: batch, channels, groups, states, length.
#[doc(hidden)]
#[derive(Clone, Copy, Debug)]
pub struct Dims {
    batch: usize,
    channels: usize,
    groups: usize,
    states: usize,
    len: usize,
}

/// `t` as `rows` rows of `len`.
fn rows_of<T: Element>(t: &Tensor<T>, rows: usize, len: usize) -> Result<tessera::TensorView<'_, T>> {
    t.view(&[rows, len], &[len, 1])
}

/// The variant of a `tune(N = [16, 32, 64])` kernel for `states`, or the error naming `a`.
fn state_variant(variants: &[&tessera::KernelSpec], states: usize) -> Result<usize> {
    crate::knob_variant(variants, "N", states, "selective_scan", "a", "d_state 16, 32 or 64", format!("d_state {states}"))
}

/// The scan's inputs as the forward and backward kernels take them: `u`, `delta`, `z` as
/// `[batch·channels, L]` rows, `b`, `c` as `[batch·groups·N, L]`, `a` and the initial state as
/// columns.
struct Rows<'a, T: Element> {
    u: tessera::TensorView<'a, T>,
    delta: tessera::TensorView<'a, T>,
    bm: tessera::TensorView<'a, T>,
    cm: tessera::TensorView<'a, T>,
    a: tessera::TensorView<'a, f32>,
    z: Option<tessera::TensorView<'a, T>>,
    h0: Option<tessera::TensorView<'a, f32>>,
}

impl<'a, T: Element> Rows<'a, T> {
    fn of(s: &SelectiveScan<'a, T>, Dims { batch, channels, groups, states, len }: Dims) -> Result<Self> {
        let rows = batch * channels;
        Ok(Rows {
            u: rows_of(s.u, rows, len)?,
            delta: rows_of(s.delta, rows, len)?,
            bm: s.b.view(&[batch * groups * states, len], &[len, 1])?,
            cm: s.c.view(&[batch * groups * states, len], &[len, 1])?,
            a: s.a.view(&[channels * states, 1], &[1, 1])?,
            z: s.z.map(|z| rows_of(z, rows, len)).transpose()?,
            h0: s.h0.map(|h| h.view(&[rows * states, 1], &[1, 1])).transpose()?,
        })
    }
}

macro_rules! selective_scan_element {
    ($t:ty, $k:ident, $rows:ident, $f32rows:path, $step:ident, $bwd:ident, $bwdrows:ident) => {
        impl SelectiveScanElement for $t {
            fn selective_scan_bwd_launch(
                s: &SelectiveScan<'_, Self>, dims @ Dims { batch, channels, groups, states, len }: Dims, dout: &Tensor<Self>,
                gr: &mut SelectiveScanGrads<Self>, saved: Option<&Tensor<f32>>,
            ) -> Result<()> {
                let dev = s.device;
                let rows = batch * channels;
                let flag = |b: bool| i32::from(b);
                if rows_save_fits::<Self>(dims) {
                    // A thread a channel: each 8-step chunk's starting states (kept by
                    // `run_saving`, or stored now by the forward kernel), then the reverse walk.
                    let mut kept = None;
                    let hsave = match saved {
                        Some(h) => h,
                        None => {
                            let mut h = Tensor::<f32>::scratch(dev, &[saved_states(dims), 1])?;
                            Self::selective_scan_rows_launch(
                                s,
                                dims,
                                &mut OptionalMut::<tessera::TensorViewMut<'_, Self>>(None, 2),
                                &mut OptionalMut::<tessera::TensorViewMut<'_, f32>>(None, 2),
                                Some(&mut h),
                            )?;
                            &*kept.insert(h)
                        }
                    };
                    let i = state_variant($bwdrows::VARIANTS, states)?;
                    let Rows { u, delta, bm, cm, z, .. } = Rows::of(s, dims)?;
                    let (bm, cm) = ($f32rows(dev, bm)?, $f32rows(dev, cm)?);
                    let (a, dskip, bias) = s.per_channel(channels, states)?;
                    let go = rows_of(dout, rows, len)?;
                    let mut du = gr.du.view_mut(&[rows, len], &[len, 1])?;
                    let mut ddelta = gr.ddelta.view_mut(&[rows, len], &[len, 1])?;
                    let mut dz = gr.dz.as_mut().map(|t| t.view_mut(&[rows, len], &[len, 1])).transpose()?;
                    let mut da = gr.da.view_mut(&[channels, states], &[states, 1])?;
                    let mut db = gr.db.view_mut(&[batch * groups * states, len], &[len, 1])?;
                    let mut dc = gr.dc.view_mut(&[batch * groups * states, len], &[len, 1])?;
                    let mut dd = gr.dd.as_mut().map(|t| t.view_mut(&[channels, 1], &[1, 1])).transpose()?;
                    let mut dbias = gr.d_delta_bias.as_mut().map(|t| t.view_mut(&[channels, 1], &[1, 1])).transpose()?;
                    let blocks = (rows / ROWS_CHANNELS) as u32;
                    let (segs, seg_chunks) = split(dev, blocks as usize, len);
                    macro_rules! launch {
                        ($segs:expr, $gseg:expr, $dseg:expr, $pass:expr) => {
                            $bwdrows::launch_variant(
                                i,
                                dev,
                                Grid::from((blocks, $segs as u32)),
                                &u,
                                &delta,
                                &a,
                                &bm,
                                &cm,
                                &Optional(dskip.as_ref(), 2),
                                z.as_ref().unwrap_or(&u),
                                &Optional(bias.as_ref(), 2),
                                &go,
                                hsave,
                                &mut du,
                                &mut ddelta,
                                &mut OptionalMut(dz.as_mut(), 2),
                                &mut da,
                                &mut db,
                                &mut dc,
                                &mut OptionalMut(dd.as_mut(), 2),
                                &mut OptionalMut(dbias.as_mut(), 2),
                                $gseg,
                                $dseg,
                                channels as i32,
                                groups as i32,
                                flag(s.d.is_some()),
                                flag(s.z.is_some()),
                                flag(s.delta_softplus),
                                flag(s.delta_bias.is_some()),
                                seg_chunks,
                                $pass,
                            )
                        };
                    }
                    let none = || OptionalMut(None::<&mut Tensor<f32>>, 2);
                    if segs == 1 {
                        return launch!(1, &mut none(), &mut none(), 0);
                    }
                    // A long sequence over few blocks, as the forward splits it: each segment's
                    // carry of g from a zero start and its ΣΔ (pass 1, the segments stored from
                    // the sequence's end), the carry each segment starts from, the walk (pass 2).
                    let mut cseg = Tensor::<f32>::scratch(dev, &[segs * rows, states])?;
                    let mut dseg = Tensor::<f32>::scratch(dev, &[segs * rows, 1])?;
                    let mut cin = Tensor::<f32>::scratch(dev, &[segs * rows, states])?;
                    launch!(segs, &mut cseg, &mut dseg, 1)?;
                    let c = state_variant(selective_scan_seg_carry::VARIANTS, states)?;
                    selective_scan_seg_carry::launch_variant(
                        c,
                        dev,
                        Grid::from(blocks),
                        &a,
                        &cseg,
                        &dseg,
                        &Optional(None::<&Tensor<f32>>, 2),
                        &mut cin,
                        channels as i32,
                        i32::try_from(rows).unwrap_or(i32::MAX),
                        0,
                    )?;
                    return launch!(segs, &mut cin, &mut none(), 2);
                }
                let i = state_variant($bwd::VARIANTS, states)?;
                let chunks = len.div_ceil(2048 / states);
                let mut hs = Tensor::<f32>::scratch(dev, &[rows * states, chunks])?;
                let mut qs = Tensor::<f32>::scratch(dev, &[rows * states, 1])?;
                let blocks = batch * groups * (channels / groups).div_ceil(BWD_CHANNELS);
                let Rows { u, delta, bm, cm, a, z, h0 } = Rows::of(s, dims)?;
                let go = rows_of(dout, rows, len)?;
                let mut du = gr.du.view_mut(&[rows, len], &[len, 1])?;
                let mut ddelta = gr.ddelta.view_mut(&[rows, len], &[len, 1])?;
                let mut dz = gr.dz.as_mut().map(|t| t.view_mut(&[rows, len], &[len, 1])).transpose()?;
                let mut da = gr.da.view_mut(&[channels * states, 1], &[1, 1])?;
                let mut db = gr.db.view_mut(&[batch * groups * states, len], &[len, 1])?;
                let mut dc = gr.dc.view_mut(&[batch * groups * states, len], &[len, 1])?;
                let mut dd = gr.dd.as_mut().map(|t| t.view_mut(&[channels, 1], &[1, 1])).transpose()?;
                let mut dbias = gr.d_delta_bias.as_mut().map(|t| t.view_mut(&[channels, 1], &[1, 1])).transpose()?;
                $bwd::launch_variant(
                    i,
                    dev,
                    Grid::from(blocks as u32),
                    &u,
                    &delta,
                    &a,
                    &bm,
                    &cm,
                    &Optional(s.d, 1),
                    &Optional(z.as_ref(), 2),
                    &Optional(s.delta_bias, 1),
                    &Optional(h0.as_ref(), 2),
                    &go,
                    &mut hs,
                    &mut qs,
                    &mut du,
                    &mut ddelta,
                    &mut OptionalMut(dz.as_mut(), 2),
                    &mut da,
                    &mut db,
                    &mut dc,
                    &mut OptionalMut(dd.as_mut(), 2),
                    &mut OptionalMut(dbias.as_mut(), 2),
                    batch as i32,
                    channels as i32,
                    groups as i32,
                    flag(s.d.is_some()),
                    flag(s.z.is_some()),
                    flag(s.delta_softplus),
                    flag(s.h0.is_some()),
                    flag(s.delta_bias.is_some()),
                )
            }

            fn selective_scan_step_launch(
                s: &SelectiveScan<'_, Self>, Dims { batch, channels, groups, states, .. }: Dims, y: &mut Tensor<Self>,
                state: &mut Tensor<f32>,
            ) -> Result<()> {
                let rows = batch * channels;
                let i = state_variant($step::VARIANTS, states)?;
                let (u, delta) = (rows_of(s.u, rows, 1)?, rows_of(s.delta, rows, 1)?);
                let bm = s.b.view(&[batch * groups, states], &[states, 1])?;
                let cm = s.c.view(&[batch * groups, states], &[states, 1])?;
                let z = s.z.map(|z| rows_of(z, rows, 1)).transpose()?;
                let (a, dskip, bias) = s.per_channel(channels, states)?;
                let mut yv = y.view_mut(&[rows, 1], &[1, 1])?;
                let mut hv = state.view_mut(&[rows, states], &[states, 1])?;
                let blocks = batch * groups * (channels / groups).div_ceil(64);
                let flag = |b: bool| i32::from(b);
                $step::launch_variant(
                    i,
                    s.device,
                    Grid::from(blocks as u32),
                    &mut hv,
                    &u,
                    &delta,
                    &a,
                    &bm,
                    &cm,
                    &Optional(dskip.as_ref(), 2),
                    &Optional(z.as_ref(), 2),
                    &Optional(bias.as_ref(), 2),
                    &mut yv,
                    channels as i32,
                    groups as i32,
                    flag(s.d.is_some()),
                    flag(s.z.is_some()),
                    flag(s.delta_softplus),
                    flag(s.delta_bias.is_some()),
                )
            }

            fn selective_scan_launch(
                s: &SelectiveScan<'_, Self>, dims @ Dims { batch, channels, groups, states, len }: Dims, y: &mut Tensor<Self>,
                h_last: Option<&mut Tensor<f32>>, hsave: Option<&mut Tensor<f32>>,
            ) -> Result<()> {
                let dev = s.device;
                let rows = batch * channels;
                let flag = |b: bool| i32::from(b);
                // States are kept (`hsave`) only where the scan runs a thread a channel.
                if rows_fit::<Self>(dims) {
                    // A thread a channel, 128 channels of one group a block.
                    let mut yv = y.view_mut(&[rows, len], &[len, 1])?;
                    let mut hv = h_last.map(|h| h.view_mut(&[rows, states], &[states, 1])).transpose()?;
                    return Self::selective_scan_rows_launch(
                        s,
                        dims,
                        &mut OptionalMut(Some(&mut yv), 2),
                        &mut OptionalMut(hv.as_mut(), 2),
                        hsave,
                    );
                }
                let i = state_variant($k::VARIANTS, states)?;
                let Rows { u, delta, bm, cm, a, z, h0 } = Rows::of(s, dims)?;
                let mut yv = y.view_mut(&[rows, len], &[len, 1])?;
                let mut hv = h_last.map(|h| h.view_mut(&[rows * states, 1], &[1, 1])).transpose()?;
                $k::launch_variant(
                    i,
                    dev,
                    Grid::from(rows as u32),
                    &u,
                    &delta,
                    &a,
                    &bm,
                    &cm,
                    &Optional(s.d, 1),
                    &Optional(z.as_ref(), 2),
                    &Optional(s.delta_bias, 1),
                    &Optional(h0.as_ref(), 2),
                    &mut yv,
                    &mut OptionalMut(hv.as_mut(), 2),
                    channels as i32,
                    groups as i32,
                    flag(s.d.is_some()),
                    flag(s.z.is_some()),
                    flag(s.delta_softplus),
                    flag(s.h0.is_some()),
                    flag(s.delta_bias.is_some()),
                )
            }

            fn selective_scan_rows_launch(
                s: &SelectiveScan<'_, Self>, dims @ Dims { batch, channels, groups, states, .. }: Dims,
                y: &mut OptionalMut<'_, tessera::TensorViewMut<'_, Self>>, h_last: &mut OptionalMut<'_, tessera::TensorViewMut<'_, f32>>,
                hsave: Option<&mut Tensor<f32>>,
            ) -> Result<()> {
                let dev = s.device;
                let rows = batch * channels;
                let flag = |b: bool| i32::from(b);
                let i = state_variant($rows::VARIANTS, states)?;
                let Rows { u, delta, bm, cm, z, .. } = Rows::of(s, dims)?;
                // B and C in f32: each is read by every thread of a block.
                let (bm, cm) = ($f32rows(dev, bm)?, $f32rows(dev, cm)?);
                let (a, dskip, bias) = s.per_channel(channels, states)?;
                let h0 = s.h0.map(|h| h.view(&[rows, states], &[states, 1])).transpose()?;
                // 0: no states kept; 1: the backward's pass, states and no y; 2: both.
                let save = match (hsave.is_some(), y.0.is_some()) {
                    (false, _) => 0,
                    (true, false) => 1,
                    (true, true) => 2,
                };
                let blocks = (rows / ROWS_CHANNELS) as u32;
                let (segs, seg_chunks) = split(dev, blocks as usize, dims.len);
                macro_rules! launch {
                    ($segs:expr, $h0:expr, $has_h0:expr, $y:expr, $h_last:expr, $hsave:expr, $dseg:expr, $save:expr, $pass:expr) => {
                        $rows::launch_variant(
                            i,
                            dev,
                            Grid::from((blocks, $segs as u32)),
                            &u,
                            &delta,
                            &a,
                            &bm,
                            &cm,
                            &Optional(dskip.as_ref(), 2),
                            // Without a gate, `u` stands in for it (TMA needs a tensor; it is not read).
                            z.as_ref().unwrap_or(&u),
                            &Optional(bias.as_ref(), 2),
                            $h0,
                            $y,
                            $h_last,
                            $hsave,
                            $dseg,
                            channels as i32,
                            groups as i32,
                            flag(s.d.is_some()),
                            flag(s.z.is_some()),
                            flag(s.delta_softplus),
                            $has_h0,
                            flag(s.delta_bias.is_some()),
                            $save,
                            seg_chunks,
                            $pass,
                        )
                    };
                }
                let no_dseg = &mut OptionalMut(None::<&mut Tensor<f32>>, 2);
                if segs == 1 {
                    return launch!(
                        1,
                        &Optional(h0.as_ref(), 2),
                        flag(s.h0.is_some()),
                        y,
                        h_last,
                        &mut OptionalMut(hsave, 2),
                        no_dseg,
                        save,
                        0
                    );
                }
                // A long sequence over few blocks: each segment's end state from zeros and its
                // ΣΔ (pass 1), the states each segment starts from (`selective_scan_seg_carry`),
                // then every segment again from its true start (pass 2).
                let mut hseg = Tensor::<f32>::scratch(dev, &[segs * rows, states])?;
                let mut dseg = Tensor::<f32>::scratch(dev, &[segs * rows, 1])?;
                let mut hin = Tensor::<f32>::scratch(dev, &[segs * rows, states])?;
                launch!(
                    segs,
                    &Optional(h0.as_ref(), 2),
                    flag(s.h0.is_some()),
                    &mut OptionalMut(None::<&mut Tensor<Self>>, 2),
                    &mut hseg,
                    &mut OptionalMut(None::<&mut Tensor<f32>>, 2),
                    &mut dseg,
                    0,
                    1
                )?;
                let c = state_variant(selective_scan_seg_carry::VARIANTS, states)?;
                selective_scan_seg_carry::launch_variant(
                    c,
                    dev,
                    Grid::from(blocks),
                    &a,
                    &hseg,
                    &dseg,
                    &Optional(h0.as_ref(), 2),
                    &mut hin,
                    channels as i32,
                    i32::try_from(rows).unwrap_or(i32::MAX),
                    flag(s.h0.is_some()),
                )?;
                launch!(segs, &hin, 1, y, h_last, &mut OptionalMut(hsave, 2), no_dseg, save, 2)
            }
        }
    };
}
selective_scan_element!(
    tessera::bf16,
    selective_scan_fwd_bf16,
    selective_scan_fwd_rows_bf16,
    crate::elementwise::widened_bf16,
    selective_scan_step_bf16,
    selective_scan_bwd_bf16,
    selective_scan_bwd_rows_bf16
);
selective_scan_element!(
    f32,
    selective_scan_fwd_f32,
    selective_scan_fwd_rows_f32,
    f32_as_is,
    selective_scan_step_f32,
    selective_scan_bwd_f32,
    selective_scan_bwd_rows_f32
);

/// An f32 view as the kernels take it (the f32 scan's B and C need no widening).
fn f32_as_is<'a>(_: &Device, v: tessera::TensorView<'a, f32>) -> Result<tessera::TensorView<'a, f32>> {
    Ok(v)
}

/// A selective scan (Mamba-1) to run: the required inputs, then builder calls for the
/// optional ones. `u`, `delta` `[batch, channels, L]`; `a` `[channels, d_state]` (f32,
/// negative for a decaying state); `b`, `c` `[batch, groups, d_state, L]` (each group shared by
/// `channels / groups` channels); d_state 16, 32 or 64.
///
/// ```ignore
/// let s = SelectiveScan::new(&dev, &u, &delta, &a, &b, &c).d(&d).z(&z).delta_bias(&bias).delta_softplus(true);
/// s.run(&mut y, &mut h_last)?; // y [batch, channels, L], h_last [batch, channels, d_state] (f32)
/// ```
pub struct SelectiveScan<'a, T: Element> {
    device: &'a Device,
    u: &'a Tensor<T>,
    delta: &'a Tensor<T>,
    a: &'a Tensor<f32>,
    b: &'a Tensor<T>,
    c: &'a Tensor<T>,
    d: Option<&'a Tensor<f32>>,
    z: Option<&'a Tensor<T>>,
    delta_bias: Option<&'a Tensor<f32>>,
    delta_softplus: bool,
    h0: Option<&'a Tensor<f32>>,
}

impl<'a, T: SelectiveScanElement> SelectiveScan<'a, T> {
    /// The scan of `u` with step sizes `delta`, state matrix `a` and the time-varying `b`, `c`.
    pub fn new(device: &'a Device, u: &'a Tensor<T>, delta: &'a Tensor<T>, a: &'a Tensor<f32>, b: &'a Tensor<T>, c: &'a Tensor<T>) -> Self {
        SelectiveScan { device, u, delta, a, b, c, d: None, z: None, delta_bias: None, delta_softplus: false, h0: None }
    }

    /// The skip connection `D·u` (`d` `[channels]`, f32).
    pub fn d(mut self, d: &'a Tensor<f32>) -> Self {
        self.d = Some(d);
        self
    }

    /// The gate: `y · silu(z)` (`z` as `u`).
    pub fn z(mut self, z: &'a Tensor<T>) -> Self {
        self.z = Some(z);
        self
    }

    /// A bias added to `delta` (`[channels]`, f32).
    pub fn delta_bias(mut self, bias: &'a Tensor<f32>) -> Self {
        self.delta_bias = Some(bias);
        self
    }

    /// Whether `Δ = softplus(delta + bias)` (Mamba's default) rather than `delta + bias`.
    pub fn delta_softplus(mut self, on: bool) -> Self {
        self.delta_softplus = on;
        self
    }

    /// The state to start from (`[batch, channels, d_state]`, f32; zeros without it): the
    /// `h_last` of the call before, for a sequence run in pieces.
    pub fn initial_state(mut self, h0: &'a Tensor<f32>) -> Self {
        self.h0 = Some(h0);
        self
    }

    /// Runs the scan into `y` (as `u`) and the last state `h_last` (`[batch, channels,
    /// d_state]`, f32).
    ///
    /// # Errors
    /// [`Error::Argument`] naming the tensor whose rank, shape or contiguity does not fit, or a
    /// d_state without a kernel; a launch error.
    pub fn run(&self, y: &mut Tensor<T>, h_last: &mut Tensor<f32>) -> Result<()> {
        self.run_keeping(y, Some(h_last), None)
    }

    /// [`SelectiveScan::run`] without the last state: `y` alone, no state written (nor a
    /// buffer for it needed) — the forward of a whole sequence that is not continued.
    ///
    /// # Errors
    /// As [`SelectiveScan::run`].
    pub fn run_y(&self, y: &mut Tensor<T>) -> Result<()> {
        self.run_keeping(y, None, None)
    }

    /// [`SelectiveScan::run`], each 8-step chunk's starting states stored into `hsave` where it
    /// is given (only where the scan runs a thread a channel: `rows_save_fits`).
    fn run_keeping(&self, y: &mut Tensor<T>, h_last: Option<&mut Tensor<f32>>, hsave: Option<&mut Tensor<f32>>) -> Result<()> {
        let dims = self.dims(y, h_last.as_deref().map(|h| ("h_last", h)))?;
        if i32::try_from(dims.batch * dims.channels * dims.states.max(dims.len)).is_err() {
            return Err(self.arg("u", "fewer than 2³¹ rows".into(), format!("batch {}, channels {}", dims.batch, dims.channels)));
        }
        if dims.batch == 0 || dims.channels == 0 {
            return Ok(());
        }
        if dims.len == 0 {
            // No steps: the last state is the first.
            let Some(h_last) = h_last else { return Ok(()) };
            let h = match self.h0 {
                Some(h0) => h0.to_host()?,
                None => vec![0.0; dims.batch * dims.channels * dims.states],
            };
            return h_last.copy_from_host(&h);
        }
        T::selective_scan_launch(self, dims, y, h_last, hsave)
    }

    /// One step of the recurrence in place, the decode path: `state` (`[batch, channels,
    /// d_state]`, f32) is the state before the step and becomes the state after it; `y`
    /// `[batch, channels, 1]`. The inputs are those of a scan of length 1 (`u`, `delta`,
    /// `z` `[batch, channels, 1]`, `b`, `c` `[batch, groups, d_state, 1]`); a block updates 64
    /// channels of one (batch, group), reading the state once and writing it once.
    ///
    /// ```ignore
    /// for token in 0..n {
    ///     SelectiveScan::new(&dev, &u_t, &delta_t, &a, &b_t, &c_t).d(&d).z(&z_t).run_step(&mut state, &mut y_t)?;
    /// }
    /// ```
    ///
    /// # Errors
    /// As [`SelectiveScan::run`], and [`Error::Argument`] where the inputs are longer than one
    /// step or an `initial_state` is given (`state` is the initial state).
    pub fn run_step(&self, state: &mut Tensor<f32>, y: &mut Tensor<T>) -> Result<()> {
        if self.h0.is_some() {
            return Err(self.arg("initial_state", "none: `state` is the state the step starts from".into(), "a tensor".into()));
        }
        let dims = self.dims(y, Some(("state", state)))?;
        if dims.len != 1 {
            return Err(self.arg("u", "one step: [batch, channels, 1]".into(), format!("shape {:?}", self.u.shape())));
        }
        if i32::try_from(dims.batch * dims.channels * dims.states).is_err() {
            return Err(self.arg("u", "fewer than 2³¹ states".into(), format!("batch {}, channels {}", dims.batch, dims.channels)));
        }
        if dims.batch == 0 || dims.channels == 0 {
            return Ok(());
        }
        T::selective_scan_step_launch(self, dims, y, state)
    }

    /// The gradients of the scan's inputs from `dout`, the gradient of its output `y` (as
    /// `u`); the gradient reaching the last state is taken as zero, and none is given for an
    /// initial state. The forward is recomputed, nothing of it saved: one pass storing each
    /// chunk's starting state, one from the last chunk back ([`SelectiveScan::run_saving`]
    /// keeps the states of a forward instead).
    ///
    /// ```ignore
    /// let grads = SelectiveScan::new(&dev, &u, &delta, &a, &b, &c).d(&d).z(&z).backward(&dout)?;
    /// ```
    ///
    /// # Errors
    /// As [`SelectiveScan::run`], and [`Error::Argument`] naming `dout` where its shape is not
    /// `u`'s or it is not contiguous.
    pub fn backward(&self, dout: &Tensor<T>) -> Result<SelectiveScanGrads<T>> {
        self.backward_from(dout, None)
    }

    /// [`SelectiveScan::run`] for training: the forward, keeping what the backward would
    /// otherwise recompute (each 8-step chunk's starting states, f32: 8 bytes a step, channel and
    /// 16 states — four times a bf16 `u` at d_state 16) for [`SelectiveScan::backward_saved`],
    /// which then skips its first pass. Where the scan does not run a thread a channel (a
    /// group's channels not a multiple of 128, rows of `u` not a multiple of 16 bytes) nothing is
    /// kept and the backward recomputes.
    ///
    /// ```ignore
    /// let s = SelectiveScan::new(&dev, &u, &delta, &a, &b, &c).d(&d).z(&z).delta_softplus(true);
    /// let saved = s.run_saving(&mut y, &mut h_last)?;
    /// // … the loss, dout …
    /// let grads = s.backward_saved(&saved, &dout)?;
    /// ```
    ///
    /// # Errors
    /// As [`SelectiveScan::run`].
    pub fn run_saving(&self, y: &mut Tensor<T>, h_last: &mut Tensor<f32>) -> Result<SavedScan> {
        let dims = self.dims(y, Some(("h_last", h_last)))?;
        let len = saved_states(dims);
        if len == 0 || !rows_save_fits::<T>(dims) {
            self.run(y, h_last)?;
            return Ok(SavedScan { states: None, len });
        }
        let mut states = Tensor::<f32>::scratch(self.device, &[len, 1])?;
        self.run_keeping(y, Some(h_last), Some(&mut states))?;
        Ok(SavedScan { states: Some(states), len })
    }

    /// [`SelectiveScan::backward`] from what [`SelectiveScan::run_saving`] kept, with the same
    /// inputs.
    ///
    /// # Errors
    /// As [`SelectiveScan::backward`], and [`Error::Argument`] naming `saved` where it was kept
    /// for a scan of other sizes.
    pub fn backward_saved(&self, saved: &SavedScan, dout: &Tensor<T>) -> Result<SelectiveScanGrads<T>> {
        let dims = self.dims(dout, None)?;
        if saved.len != saved_states(dims) {
            let Dims { batch, channels, states, len, .. } = dims;
            return Err(self.arg(
                "saved",
                format!("the {} states of a scan of batch {batch}, channels {channels}, d_state {states}, L {len}", saved_states(dims)),
                format!("{} states, kept for other sizes", saved.len),
            ));
        }
        self.backward_from(dout, saved.states.as_ref())
    }

    fn backward_from(&self, dout: &Tensor<T>, saved: Option<&Tensor<f32>>) -> Result<SelectiveScanGrads<T>> {
        let dev = self.device;
        let [batch, channels, len] = *self.u.shape() else {
            return Err(self.arg("u", "[batch, channels, L]".into(), format!("shape {:?}", self.u.shape())));
        };
        if dout.shape() != self.u.shape() || !dout.is_contiguous() {
            return Err(self.arg(
                "dout",
                format!("a contiguous tensor of shape {:?}, as u", self.u.shape()),
                format!("shape {:?}", dout.shape()),
            ));
        }
        let states = self.a.shape().get(1).copied().unwrap_or(0);
        // The shapes as the forward checks them (`dout` stands in for y).
        let dims = self.dims(dout, None)?;
        // The thread-a-channel walk writes every element of du, ddelta and dz.
        let walk = rows_save_fits::<T>(dims);
        let written = |t: &Tensor<T>| {
            if walk {
                Tensor::<T>::scratch(dev, t.shape())
            } else {
                Tensor::<T>::zeros(dev, t.shape())
            }
        };
        let mut grads = SelectiveScanGrads {
            du: written(self.u)?,
            ddelta: written(self.delta)?,
            da: Tensor::zeros(dev, self.a.shape())?,
            db: Tensor::zeros(dev, self.b.shape())?,
            dc: Tensor::zeros(dev, self.c.shape())?,
            dd: self.d.map(|d| Tensor::zeros(dev, d.shape())).transpose()?,
            dz: self.z.map(written).transpose()?,
            d_delta_bias: self.delta_bias.map(|d| Tensor::zeros(dev, d.shape())).transpose()?,
        };
        if i32::try_from(batch * channels * states.max(len)).is_err() {
            return Err(self.arg("u", "fewer than 2³¹ rows".into(), format!("batch {batch}, channels {channels}")));
        }
        if batch == 0 || channels == 0 || len == 0 {
            return Ok(grads);
        }
        T::selective_scan_bwd_launch(self, dims, dout, &mut grads, saved)?;
        Ok(grads)
    }

    /// `a` as `[channels, d_state]` and the optional `D` and delta bias as `[channels, 1]`
    /// columns, as the step and the thread-a-channel kernels read them.
    #[allow(clippy::type_complexity)]
    fn per_channel(
        &self, channels: usize, states: usize,
    ) -> Result<(tessera::TensorView<'a, f32>, Option<tessera::TensorView<'a, f32>>, Option<tessera::TensorView<'a, f32>>)> {
        let column = |t: Option<&'a Tensor<f32>>| t.map(|d| d.view(&[channels, 1], &[1, 1])).transpose();
        Ok((self.a.view(&[channels, states], &[states, 1])?, column(self.d)?, column(self.delta_bias)?))
    }

    fn arg(&self, arg: &str, expected: String, found: String) -> Error {
        Error::Argument { kernel: "selective_scan", arg: arg.into(), expected, found }
    }

    /// The problem's sizes from the inputs, after checking every shape and layout against
    /// them (`state`: `h_last` or the step's state, with its name).
    fn dims(&self, y: &Tensor<T>, state: Option<(&str, &Tensor<f32>)>) -> Result<Dims> {
        let arg = |a: &str, e: String, f: String| self.arg(a, e, f);
        let [batch, channels, len] = *self.u.shape() else {
            return Err(arg("u", "[batch, channels, L]".into(), format!("shape {:?}", self.u.shape())));
        };
        let [ac, states] = *self.a.shape() else {
            return Err(arg("a", "[channels, d_state]".into(), format!("shape {:?}", self.a.shape())));
        };
        let [bb, groups, bn, bl] = *self.b.shape() else {
            return Err(arg("b", "[batch, groups, d_state, L]".into(), format!("shape {:?}", self.b.shape())));
        };
        let want = |name: &str, t: &[usize], w: &[usize]| {
            if t == w {
                Ok(())
            } else {
                Err(arg(name, format!("shape {w:?}"), format!("shape {t:?}")))
            }
        };
        want("delta", self.delta.shape(), &[batch, channels, len])?;
        want("a", &[ac], &[channels])?;
        if groups == 0 || channels % groups != 0 {
            return Err(arg("b", format!("a number of groups dividing {channels} channels"), format!("{groups} groups")));
        }
        want("b", &[bb, groups, bn, bl], &[batch, groups, states, len])?;
        want("c", self.c.shape(), &[batch, groups, states, len])?;
        if let Some(d) = self.d {
            want("d", d.shape(), &[channels])?;
        }
        if let Some(z) = self.z {
            want("z", z.shape(), &[batch, channels, len])?;
        }
        if let Some(bias) = self.delta_bias {
            want("delta_bias", bias.shape(), &[channels])?;
        }
        if let Some(h0) = self.h0 {
            want("initial_state", h0.shape(), &[batch, channels, states])?;
        }
        want("y", y.shape(), &[batch, channels, len])?;
        if let Some((name, st)) = state {
            want(name, st.shape(), &[batch, channels, states])?;
        }
        let named: [(&str, bool); 9] = [
            ("u", self.u.is_contiguous()),
            ("delta", self.delta.is_contiguous()),
            ("a", self.a.is_contiguous()),
            ("b", self.b.is_contiguous()),
            ("c", self.c.is_contiguous()),
            ("z", self.z.is_none_or(|t| t.is_contiguous())),
            ("initial_state", self.h0.is_none_or(|t| t.is_contiguous())),
            ("y", y.is_contiguous()),
            (state.map_or("state", |s| s.0), state.is_none_or(|s| s.1.is_contiguous())),
        ];
        if let Some((name, _)) = named.iter().find(|(_, ok)| !ok) {
            return Err(arg(name, "a contiguous tensor".into(), "strides that are not".into()));
        }
        Ok(Dims { batch, channels, groups, states, len })
    }
}
