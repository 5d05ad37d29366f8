//! Prefix scans along the last axis: `cumsum`, `cumprod`, `logcumsumexp`, and `cumsum`'s
//! backward (the sum from each element to the row's end).
//!
//! One body, [`scan_rows`], runs every one: a block walks chunks of `R` rows × `C` columns in
//! order (or in reverse), each chunk scanned in registers by `tile_scan` and joined to the
//! chunks before by a carried `R×1` value; the kernels differ only in the closure that does one
//! chunk's step. Elements load in their dtype and scan in f32. The chunk's shape is the kernel's
//! knob `C` (`R = 4096 / C` rows): 4 × 1024 — a row a warp, a run of 8 columns a lane in each
//! of four 256-column segments, 4 KiB of f32 a row (notes/MEASUREMENTS.md, run 306) — except
//! `logcumsumexp`, bound by its instructions rather than memory (two scans, a max and a linear
//! recurrence), which takes 16 × 256 in every dtype (run 315). Few long rows are split into
//! segments of blocks, joined by a scan of the segments' totals.
//!
//! The backwards of `cumprod` and `logcumsumexp` walk 16 × 256 chunks of their own from the
//! row's end (two recurrences, or two inputs beside `dy`; each takes the forward's output),
//! split likewise for few long rows: a first pass stores each segment's totals, and each
//! segment of the second combines those it needs, read a chunk's width at a time
//! ([`segment`]).
//!
//! Fewer than 16 rows take 4 × 1024 chunks in the kernels of 16 × 256 (their second variant,
//! `C` 1024): 4 rows in 16-row blocks did 4× the work.

use crate::prelude::{scan_add, scan_linear, scan_max, scan_mul};
use tessera::{device, kernel, Device, Element, Error, Grid, KernelSpec, OptionalMut, Result, Tensor};

/// This block's part of a scan split into segments of `seg_chunks` chunks of `cols`
/// columns, `rows` rows a block (the blocks of a row band consecutive): `(first row, segment
/// k, its first chunk, its chunks, the row's chunks)`, segments and chunks counted in scan
/// order (a scan from the last column takes chunk `i` at column `(chunks − 1 − i)·cols`).
#[device]
fn segment(n: i32, cols: i32, rows: i32, seg_chunks: i32) -> (i32, i32, i32, i32, i32) {
    let chunks = (n + (cols - 1)) / cols;
    let segs = (chunks + seg_chunks - 1) / seg_chunks;
    let k = block::id_x() - (block::id_x() / segs) * segs;
    let first = k * seg_chunks;
    ((block::id_x() / segs) * rows, k, first, min(seg_chunks, chunks - first), chunks)
}

/// The scan of rows `R·block..` of `x` into `y` in `C`-column chunks from the first (or, with
/// `reverse` 1, from the last), elements past the row's end read as `fill`: `step(chunk,
/// carry)` gives the chunk's output and the carry into the next chunk, the carry starting at
/// `fill` (the scan's identity); `total(chunk, carry)` gives that carry alone (a reduction
/// where the scan has one: a pass that needs no output need not scan).
///
/// Few long rows split into segments of `seg_chunks` chunks, one block each: `pass` 0 stores
/// each segment's carry (its total, by `total`) at `totals[row, k]` (`k` counts segments in scan order);
/// the host scans those totals along `k` (the same scan, in f32); then `pass` 1 starts each
/// segment `k > 0` from `totals[row, k − 1]`. With one segment, `pass` 1 alone scans whole
/// rows.
#[device]
fn scan_rows<T, const R: usize, const C: usize>(
    x: Global<T, 2>, y: Global<T, 2>, totals: Global<f32, 2>, seg_chunks: i32, pass: i32, fill: f32, reverse: i32,
    step: impl Fn(Tile<f32, R, C>, Tile<f32, R, 1>) -> (Tile<f32, R, C>, Tile<f32, R, 1>),
    total: impl Fn(Tile<f32, R, C>, Tile<f32, R, 1>) -> Tile<f32, R, 1>,
) {
    let (r, k, first, count, chunks) = segment(x.dim(1), C, R, seg_chunks);
    // Carried in the layout of a chunk's last column (what `step` gives back), so that no
    // chunk converts it.
    let mut carry = Tile::<f32, R, C>::full(fill).last_col();
    if pass == 1 && k > 0 {
        carry = totals.load_or([r, k - 1], fill);
    }
    for i in first..first + count {
        let mut c = i * C;
        if reverse == 1 {
            c = (chunks - 1 - i) * C;
        }
        let t = x.load_or::<Tile<T, R, C>>([r, c], fill).cast::<f32>();
        if pass == 1 {
            let (out, next) = step(t, carry);
            carry = next;
            y.store([r, c], out.cast::<T>());
        } else {
            carry = total(t, carry);
        }
    }
    if pass == 0 {
        totals.store([r, k], carry);
    }
}

/// A chunk's row sums added to the carry: the total of `cumsum` and of its reverse.
#[device]
fn sum_total<const R: usize, const C: usize>(t: Tile<f32, R, C>, carry: Tile<f32, R, 1>) -> Tile<f32, R, 1> {
    carry + row_sum(t)
}

/// `log2(2^a + 2^b)` elementwise, `b` broadcast along the rows where it is one column wide;
/// for any values (−∞ too: the difference of two −∞ is NaN, which the `max` with −1e30 drops).
#[device]
fn log2_add<const M: usize, const N: usize, const K: usize>(a: Tile<f32, M, N>, b: Tile<f32, M, K>) -> Tile<f32, M, N> {
    let m = max(a, b);
    m + log2(1.0 + exp2(max(min(a, b) - m, -1.0e30)))
}

/// The combine of a running log-sum-exp in base 2, `log2(2^a + 2^b)`, identity −∞:
/// `tile_scan::<scan_logaddexp2>(x, 1, f32::NEG_INFINITY)`.
#[device]
pub fn scan_logaddexp2<const M: usize, const N: usize>(a: Tile<f32, M, N>, b: Tile<f32, M, N>) -> Tile<f32, M, N> {
    log2_add(a, b)
}

/// `y[i, j] = Σ_{k ≤ j} x[i, k]`.
#[kernel(dtypes(T = [bf16, f16, f32]), tune(C = [1024]), blocks_per_sm = 8)]
pub fn cumsum(x: Global<T, 2>, y: Global<T, 2>, totals: Global<f32, 2>, seg_chunks: i32, pass: i32) {
    scan_rows::<T, { 4096 / C }, C>(
        x,
        y,
        totals,
        seg_chunks,
        pass,
        0.0,
        0,
        |t, carry| {
            let s = tile_scan::<scan_add>(t, 1, 0.0) + carry;
            (s, s.last_col())
        },
        |t, carry| sum_total(t, carry),
    );
}

/// `y[i, j] = Σ_{k ≥ j} x[i, k]`: `cumsum`'s backward (its `dx` from `dy`).
#[kernel(dtypes(T = [bf16, f16, f32]), tune(C = [1024]), blocks_per_sm = 8)]
pub fn cumsum_reverse(x: Global<T, 2>, y: Global<T, 2>, totals: Global<f32, 2>, seg_chunks: i32, pass: i32) {
    scan_rows::<T, { 4096 / C }, C>(
        x,
        y,
        totals,
        seg_chunks,
        pass,
        0.0,
        1,
        |t, carry| {
            let total = row_sum(t);
            (carry + total - tile_scan::<scan_add>(t, 1, 0.0) + t, carry + total)
        },
        |t, carry| sum_total(t, carry),
    );
}

/// `y[i, j] = Π_{k ≤ j} x[i, k]`.
#[kernel(dtypes(T = [bf16, f16, f32]), tune(C = [1024]), blocks_per_sm = 8)]
pub fn cumprod(x: Global<T, 2>, y: Global<T, 2>, totals: Global<f32, 2>, seg_chunks: i32, pass: i32) {
    scan_rows::<T, { 4096 / C }, C>(
        x,
        y,
        totals,
        seg_chunks,
        pass,
        1.0,
        0,
        |t, carry| {
            let s = tile_scan::<scan_mul>(t, 1, 1.0) * carry;
            (s, s.last_col())
        },
        |t, carry| (tile_scan::<scan_mul>(t, 1, 1.0) * carry).last_col(),
    );
}

/// `y[i, j] = ln Σ_{k ≤ j} exp(x[i, k])`, in base 2 inside (the carry, like the output and a
/// segment's total, a natural log).
///
/// Two ways to a chunk. The 16-bit kernels (knob `F` 1) choose for the whole block by its
/// inputs; the f32 one (`F` 0) takes the second always: with twice the bytes an element it is
/// nearly bound by memory, and the first way's test (a barrier a chunk, which keeps the four
/// warps in step) cost it more than its fewer instructions save (H200: 0.85× copy → 0.77×,
/// against 0.66× → 0.70× in bf16; notes/MEASUREMENTS.md, run 319). Four blocks an SM, not
/// eight: 128 registers hold either way unspilled, and fewer blocks walking at once ran faster
/// (H200: f32 0.85 → 0.90× copy, bf16 0.70 → 0.75×; run 321).
/// - **Against one reference a row** (most inputs): `r` = the row's largest value in the chunk
///   or its carry; `y_j = r + ln(2^((c − r)·log₂e) + Σ_{k ≤ j} 2^((x_k − r)·log₂e))`, a plain
///   `add` scan of one `ex2` an element, one `lg2` an element. Exact to f32 only where no
///   prefix of the row is far below `r`: terms under 2^−126 flush to zero, so a prefix whose
///   largest term is that small would lose its sum. A prefix's largest term is the row's
///   carry or first element at least, so the block takes this way where every row has
///   `r − max(carry, x_first) < 40` (natural units: its terms stay above 2^−58, the flushed
///   ones below 2^−68 of them).
/// - **Against the running maximum** (any finite inputs): `σ_j = Σ_{k ≤ j} 2^(x_k − r_j)` with
///   `r_j` a `max` scan is the linear recurrence `σ_j = a_j·σ_{j−1} + b_j` with
///   `(a_j, b_j) = (2^(r_{j−1} − x_j), 1)` where `x_j` raises the maximum and `(1, 2^(x_j − r_j))`
///   where it does not, and `y_j = r_j + log2 σ_j`. `σ_j ≥ 1` wherever `r_j` is finite, so no
///   range of inputs underflows it; it costs two scans (~29 instructions an element against
///   ~12).
///
/// Inputs of −∞ add nothing (a row of −∞ so far gives −∞); +∞ and NaN are not supported.
#[kernel(dtypes(T = [bf16, f16, f32]), tune(C = [256, 1024], F = [1, 0], only(T != f32 && F == 1 || T == f32 && F == 0)), blocks_per_sm = 4)]
pub fn logcumsumexp(x: Global<T, 2>, y: Global<T, 2>, totals: Global<f32, 2>, seg_chunks: i32, pass: i32) {
    scan_rows::<T, { 4096 / C }, C>(
        x,
        y,
        totals,
        seg_chunks,
        pass,
        f32::NEG_INFINITY,
        0,
        |t, carry| {
            let r = max(row_max(t), carry);
            let mut out = t;
            // A row of −∞ so far (rows past the tensor's end too) passes the test and takes this
            // way with every term 0 against the clamped reference: its output −∞.
            if F == 1 && tile_all(40.0 - (r - max(max(t.first_col(), carry), -f32::MAX))) {
                let rc = max(r, -1.0e30);
                let rz = rc * f32::consts::LOG2_E;
                let s = tile_scan::<scan_add>(exp2(t * f32::consts::LOG2_E - rz), 1, 0.0) + exp2(carry * f32::consts::LOG2_E - rz);
                out = rc + log2(s) * f32::consts::LN_2;
            } else {
                // The maximum before each element, the carry's among it (a maximum is the same in
                // either base), and −f32::MAX at least, so that `t − before` is never −∞ − (−∞): an
                // element of −∞ gives `(a, b) = (1, 0)`, and a carry of −∞ its σ = 0. (The floor is
                // its own `max`: the scan's identity is combined in only where a step has no
                // partner, so a run of −∞ across the chunk's 256-column segments gave −∞.)
                let before = max(max(tile_scan_exclusive::<scan_max>(t, 1, -f32::MAX), carry), -f32::MAX);
                let diff = t - before;
                // 2^−|x − before| in base 2; where `x` raises the maximum `(a, b) = (d, 1)`, else `(1, d)`.
                let d = exp2(-abs(diff) * f32::consts::LOG2_E);
                let raises = step(diff);
                let (pa, pb) = tile_scan::<scan_linear>((1.0 + raises * (d - 1.0), d - raises * (d - 1.0)), 1, (1.0, 0.0));
                // σ continues from the carry's own: 1 against itself, 0 for −∞.
                out = max(t, before) + log2(pa * step(carry + f32::MAX) + pb) * f32::consts::LN_2;
            }
            (out, out.last_col())
        },
        |t, carry| {
            // ln(Σ e^x + e^carry) against the largest term (clamped: a row of −∞ gives −∞).
            let m = max(max(row_max(t), carry), -1.0e30);
            let sum = row_sum(exp2((t - m) * f32::consts::LOG2_E)) + exp2((carry - m) * f32::consts::LOG2_E);
            m + log2(sum) * f32::consts::LN_2
        },
    );
}

/// `cumprod`'s backward, exact where `x` has zeros (no division by `x`): `dx[j] = P[j−1]·R[j]`
/// with `P` the exclusive running product of `x` and `R[j] = dy[j] + x[j+1]·R[j+1]` (`R[j]` =
/// `dy[j] + S[j+1]` where `S[j] = x[j]·(dy[j] + S[j+1])` is the reverse recurrence of
/// `(x, x·dy)` pairs). One walk over each row from its end in `C`-column chunks: `R` from the
/// chunk's own recurrence and the carried `S`, `P` from the chunk's own exclusive product and
/// the forward's output `y` (`cumprod(x)`) at the column before the chunk — one element a row
/// and chunk, so that the walk reads `x` and `dy` once and stores `dx` once.
///
/// Few long rows split into segments of `seg_chunks` chunks ([`segment`], counted from the
/// row's end): `pass` 0 stores each segment's product and `S` from a zero start at
/// `prods[row, k]` and `sums[row, k]` (reading `x` and `dy`; nothing to `dx`), and `pass` 1
/// starts each segment from the `S` of those nearer the row's end; with one segment, `pass` 1
/// alone.
#[kernel(dtypes(T = [bf16, f16, f32]), tune(C = [256, 1024]), blocks_per_sm = 4)]
pub fn cumprod_backward(
    x: Global<T, 2>, y: Global<T, 2>, dy: Global<T, 2>, dx: Global<T, 2>, prods: Global<f32, 2>, sums: Global<f32, 2>, seg_chunks: i32,
    pass: i32,
) {
    let (r, k, first, count, chunks) = segment(x.dim(1), C, 4096 / C, seg_chunks);
    // Carries in the layout of a chunk's edge column, so that no chunk converts them.
    let mut s_after = Tile::<f32, { 4096 / C }, C>::zeros().first_col();
    if pass == 0 {
        let mut p = Tile::<f32, { 4096 / C }, C>::full(1.0).last_col();
        for i in 0..count {
            let c = chunks - first - count + i;
            let xt = x.load_or::<Tile<T, { 4096 / C }, C>>([r, c * C], 1.0).cast::<f32>();
            let prefix = tile_scan::<scan_mul>(xt, 1, 1.0);
            // The segment's S so far from a zero start: this chunk's own, Σ_k dy_k·Π_{i ≤ k}
            // x_i over the chunk (a sum, from the products this pass scans anyway), continued
            // by what the chunks before it take of it (their product).
            let g = dy.load_or::<Tile<T, { 4096 / C }, C>>([r, c * C], 0.0).cast::<f32>();
            s_after = s_after + p * row_sum(prefix * g);
            p = (prefix * p).last_col();
        }
        prods.store([r, k], p);
        sums.store([r, k], s_after);
    } else {
        if seg_chunks < chunks {
            // The totals of the segments nearer the row's end (before this one in scan order),
            // one a column, `C` at a time, composed as pairs `(product, S)`, the nearest
            // outermost.
            for t in 0..(k + C - 1) / C {
                let before = (k - 1 - t * C) as f32 - Tile::<f32, { 4096 / C }, C>::col_index();
                let (sa, sb) = tile_scan::<scan_linear>(
                    (
                        prods.load_or::<Tile<f32, { 4096 / C }, C>>([r, t * C], 1.0).keep_where(before, 1.0),
                        sums.load_or::<Tile<f32, { 4096 / C }, C>>([r, t * C], 0.0).keep_where(before, 0.0),
                    ),
                    1,
                    (1.0, 0.0),
                );
                s_after = sa.last_col() * s_after + sb.last_col();
            }
        }
        for i in first..first + count {
            let c = chunks - 1 - i;
            let xt = x.load_or::<Tile<T, { 4096 / C }, C>>([r, c * C], 1.0).cast::<f32>();
            let g = dy.load_or::<Tile<T, { 4096 / C }, C>>([r, c * C], 0.0).cast::<f32>();
            let (pa, pb) = tile_scan_reverse_exclusive::<scan_linear>((xt, xt * g), 1, (1.0, 0.0));
            let rt = g + pa * s_after + pb;
            s_after = (xt * rt).first_col();
            let mut dxt = rt * tile_scan_exclusive::<scan_mul>(xt, 1, 1.0);
            if c > 0 {
                // Times the product of the row before the chunk: the forward's output at the
                // column before it.
                dxt = dxt * y.load_or::<Tile<T, { 4096 / C }, 1>>([r, c * C - 1], 1.0).cast::<f32>();
            }
            dx.store([r, c * C], dxt.cast::<T>());
        }
    }
}

/// `(2^a·v + 2^b·w)` kept as a scale and a value, `(max(a, b), v·2^(a−m) + w·2^(b−m))`: a sum
/// of terms whose magnitudes span any range. Identity `(−∞, 0)`; a difference of two infinities
/// (NaN) counts as −∞ (the `max` with −1e30 drops it).
#[device]
pub fn scan_scaled_add<const M: usize, const N: usize, const K: usize>(
    a: Tile<f32, M, K>, v: Tile<f32, M, K>, b: Tile<f32, M, N>, w: Tile<f32, M, N>,
) -> (Tile<f32, M, N>, Tile<f32, M, N>) {
    let m = max(a, b);
    (m, v * exp2(max(a - m, -1.0e30)) + w * exp2(max(b - m, -1.0e30)))
}

/// `logcumsumexp`'s backward: `dx[j] = Σ_{k ≥ j} dy[k]·exp(x[j] − y[k])` from `x`, the forward's
/// `y` and `dy`, as a reverse sum of `dy[k]·2^(s_k)`, `s = −y·log₂e`, carried between chunks as
/// a scale and a value (`2^scale·value`), so that no exponential overflows; `dx` is 0 where `x`
/// is −∞. Two ways to a chunk, as the forward's:
/// - **Against one reference a row**, `m` = the chunk's largest `s` or the carry's scale: a
///   plain `add` scan of `dy·2^(s − m)`, one `ex2` an element. A sum from `j` on weighs its
///   terms against `2^(s_j − m)`; flushed terms (under 2^−126) are negligible beside it while
///   `s_j ≥ m − 60`, so the warpgroup takes this way where every element's `s` (past the row's
///   end: −∞, no term) is within 60 of its row's `m`.
/// - **As scales and values all along** ([`scan_scaled_add`]): any finite inputs, −∞ in `y`.
///
/// As in the forward, the f32 kernel (knob `F` 0) takes the second way always (H200: 0.95×
/// copy against 0.93× with the test; bf16 0.65× → 0.75× with it); four blocks an SM rather
/// than the three of 168 registers (bf16 0.75 → 0.87×, f32 unchanged at 0.96×; run 321).
///
/// Few long rows split into segments of `seg_chunks` chunks ([`segment`], counted from the
/// row's end): `pass` 0 stores each segment's sum from a zero start at `scales[row, k]` and
/// `values[row, k]` (a reduction of `y` and `dy`: nothing to `dx`, `x` unread), and `pass` 1 starts each segment from the sums of those
/// nearer the row's end.
#[kernel(dtypes(T = [bf16, f16, f32]), tune(C = [256, 1024], F = [1, 0], only(T != f32 && F == 1 || T == f32 && F == 0)), blocks_per_sm = 4)]
pub fn logcumsumexp_backward(
    x: Global<T, 2>, y: Global<T, 2>, dy: Global<T, 2>, dx: Global<T, 2>, scales: Global<f32, 2>, values: Global<f32, 2>, seg_chunks: i32,
    pass: i32,
) {
    let (r, k, first, count, chunks) = segment(x.dim(1), C, 4096 / C, seg_chunks);
    // Carried in the layout of a chunk's first column, so that no chunk converts them.
    let mut scale = Tile::<f32, { 4096 / C }, C>::full(f32::NEG_INFINITY).first_col();
    let mut value = Tile::<f32, { 4096 / C }, C>::zeros().first_col();
    if pass == 1 {
        // The sums of the segments nearer the row's end (before this one in scan order), `C`
        // at a time.
        for t in 0..(k + C - 1) / C {
            let later = (k - 1 - t * C) as f32 - Tile::<f32, { 4096 / C }, C>::col_index();
            let ts = scales.load_or::<Tile<f32, { 4096 / C }, C>>([r, t * C], f32::NEG_INFINITY).keep_where(later, f32::NEG_INFINITY);
            let top = max(max(row_max(ts), scale), -1.0e30);
            value = value * exp2(scale - top)
                + row_sum(values.load_or::<Tile<f32, { 4096 / C }, C>>([r, t * C], 0.0).keep_where(later, 0.0) * exp2(ts - top));
            scale = top;
        }
    }
    for i in first..first + count {
        let c = (chunks - 1 - i) * C;
        let s = y.load_or::<Tile<T, { 4096 / C }, C>>([r, c], f32::INFINITY).cast::<f32>() * -f32::consts::LOG2_E;
        let g = dy.load_or::<Tile<T, { 4096 / C }, C>>([r, c], 0.0).cast::<f32>();
        // Clamped: rows past the tensor's end (all −∞) get terms of 0, not NaN.
        let top = max(max(row_max(s), scale), -1.0e30);
        if pass == 0 {
            // The segment's sum alone: a reduction, no `x` (a difference of infinities, from
            // −∞ in `y`, counts as no term, as in `scan_scaled_add`).
            value = value * exp2(max(scale - top, -1.0e30)) + row_sum(g * exp2(max(s - top, -1.0e30)));
            scale = top;
        } else {
            let xt = x.load_or::<Tile<T, { 4096 / C }, C>>([r, c], f32::NEG_INFINITY).cast::<f32>();
            let mut out = g;
            if F == 1 && tile_all((60.0 - (top - s)).keep_where(s + 1.0e30, 1.0)) {
                let v = tile_scan_reverse::<scan_add>(g * exp2(s - top), 1, 0.0) + value * exp2(scale - top);
                scale = top;
                value = v.first_col();
                out = v * exp2(max(top + xt * f32::consts::LOG2_E, -1.0e30));
            } else {
                let (ps, pv) = tile_scan_reverse::<scan_scaled_add>((s, g), 1, (f32::NEG_INFINITY, 0.0));
                let (m, v) = scan_scaled_add(scale, value, ps, pv);
                scale = m.first_col();
                value = v.first_col();
                out = v * exp2(max(m + xt * f32::consts::LOG2_E, -1.0e30));
            }
            dx.store([r, c], out.cast::<T>());
        }
    }
    if pass == 0 {
        // The block's place again rather than held through the walk (168 registers).
        let (r0, k0, _, _, _) = segment(x.dim(1), C, 4096 / C, seg_chunks);
        scales.store([r0, k0], scale);
        values.store([r0, k0], value);
    }
}

/// The element types the scans take (`bf16`, `f16`, `f32`), and their kernels.
pub trait ScanElement: Element + sealed::Sealed {
    #[doc(hidden)]
    fn scan_launch(op: ScanOp, device: &Device, inputs: &[&Tensor<Self>], y: &mut Tensor<Self>, shape: [usize; 2]) -> Result<()>;
}

mod sealed {
    pub trait Sealed {}
    impl Sealed for tessera::bf16 {}
    impl Sealed for tessera::f16 {}
    impl Sealed for f32 {}
}

/// Which scan.
#[doc(hidden)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ScanOp {
    Sum,
    SumReverse,
    Prod,
    LogSumExp,
    /// Inputs `x`, `y`, `dy`.
    ProdBackward,
    /// Inputs `x`, `y`, `dy`.
    LogSumExpBackward,
}

/// A forward scan's launch (or two): whole rows a block, or, for few long rows, segments of
/// them after a pass that stores each segment's total ([`segments`]).
macro_rules! scan_forward {
    ($k:ident, $totals:ident, $device:expr, $x:expr, $yv:expr, $m:expr, $n:expr) => {{
        let variant = fewest_padded_rows($k::VARIANTS, $m);
        let (rows, cols) = chunk(&$k::VARIANTS[variant..]);
        let (segs, seg_chunks) = segments($device, $m, $n, rows, cols);
        let grid = Grid::from(Grid::tiles($m, rows) * segs as u32);
        if segs == 1 {
            $k::launch_variant(variant, $device, grid, $x, &mut $yv, &mut OptionalMut(None::<&mut Tensor<f32>>, 2), seg_chunks, 1)
        } else {
            // The segments' totals, their running combination (one short row each), the scan.
            let mut totals = Tensor::<f32>::scratch($device, &[$m, segs])?;
            let mut carries = Tensor::<f32>::scratch($device, &[$m, segs])?;
            $k::launch_variant(variant, $device, grid, $x, &mut $yv, &mut totals, seg_chunks, 0)?;
            let (tv, mut cv) = (totals.view(&[$m, segs], &[segs, 1])?, carries.view_mut(&[$m, segs], &[segs, 1])?);
            let (total_rows, total_cols) = chunk($totals::VARIANTS);
            let whole = i32::try_from(segs.div_ceil(total_cols)).unwrap_or(i32::MAX);
            $totals::launch(
                $device,
                Grid::from(Grid::tiles($m, total_rows)),
                &tv,
                &mut cv,
                &mut OptionalMut(None::<&mut Tensor<f32>>, 2),
                whole,
                1,
            )?;
            drop((tv, cv));
            $k::launch_variant(variant, $device, grid, $x, &mut $yv, &mut carries, seg_chunks, 1)
        }
    }};
}

/// A backward's launch: inputs `x`, `y`, `dy`; for few long rows a first pass (`pass` 0)
/// storing each segment's two totals ([`totals`]), then the walk (`pass` 1).
macro_rules! scan_backward {
    ($k:ident, $device:expr, $x:expr, $views:expr, $yv:expr, $m:expr, $n:expr) => {{
        let (variant, grid, segs, seg_chunks) = backward_split($device, $k::VARIANTS, $m, $n);
        let (mut first, mut second) = totals($device, $m, segs)?;
        for pass in if segs == 1 { 1 } else { 0 }..2 {
            let (a, b) = (&mut first.opt(), &mut second.opt());
            $k::launch_variant(variant, $device, grid, $x, &$views[1], &$views[2], &mut $yv, a, b, seg_chunks, pass)?;
        }
        Ok(())
    }};
}

macro_rules! scan_element {
    ($t:ty, $sum:ident, $rev:ident, $prod:ident, $lse:ident, $prod_bwd:ident, $lse_bwd:ident) => {
        impl ScanElement for $t {
            fn scan_launch(op: ScanOp, device: &Device, inputs: &[&Tensor<Self>], y: &mut Tensor<Self>, [m, n]: [usize; 2]) -> Result<()> {
                let views = inputs.iter().map(|t| t.view(&[m, n], &[n, 1])).collect::<Result<Vec<_>>>()?;
                let mut yv = y.view_mut(&[m, n], &[n, 1])?;
                let [x, ..] = views.as_slice() else { unreachable!("every scan has an input") };
                match op {
                    ScanOp::Sum => scan_forward!($sum, cumsum_f32, device, x, yv, m, n),
                    ScanOp::SumReverse => scan_forward!($rev, cumsum_f32, device, x, yv, m, n),
                    ScanOp::Prod => scan_forward!($prod, cumprod_f32, device, x, yv, m, n),
                    ScanOp::LogSumExp => scan_forward!($lse, logcumsumexp_f32, device, x, yv, m, n),
                    // With segments, each segment's totals from a zero start: (product, reverse
                    // sum), or (scale, value) of a log-sum.
                    ScanOp::ProdBackward => scan_backward!($prod_bwd, device, x, views, yv, m, n),
                    ScanOp::LogSumExpBackward => scan_backward!($lse_bwd, device, x, views, yv, m, n),
                }
            }
        }
    };
}
scan_element!(
    tessera::bf16,
    cumsum_bf16,
    cumsum_reverse_bf16,
    cumprod_bf16,
    logcumsumexp_bf16,
    cumprod_backward_bf16,
    logcumsumexp_backward_bf16
);
scan_element!(tessera::f16, cumsum_f16, cumsum_reverse_f16, cumprod_f16, logcumsumexp_f16, cumprod_backward_f16, logcumsumexp_backward_f16);
scan_element!(f32, cumsum_f32, cumsum_reverse_f32, cumprod_f32, logcumsumexp_f32, cumprod_backward_f32, logcumsumexp_backward_f32);

/// A forward scan kernel's chunk, `(rows, columns)`, from its knob `C` (`rows = 4096 / C`).
fn chunk(variants: &[&KernelSpec]) -> (usize, usize) {
    let c = variants.first().and_then(|v| v.knob("C")).and_then(|c| usize::try_from(c).ok()).filter(|&c| c > 0);
    let c = c.expect("every forward scan kernel has its chunk's columns as knob `C`");
    (4096 / c, c)
}

/// The forward variant for `m` rows: the first (chosen for many rows), unless `m` is fewer than
/// its chunk's rows; then the one that pads `m` to the fewest rows (the first of those).
fn fewest_padded_rows(variants: &[&KernelSpec], m: usize) -> usize {
    let padded = |i: usize| {
        let (rows, _) = chunk(&variants[i..]);
        m.div_ceil(rows) * rows
    };
    if variants.is_empty() || m >= chunk(variants).0 {
        return 0;
    }
    (0..variants.len()).min_by_key(|&i| (padded(i), i)).unwrap_or(0)
}

/// How a forward scan splits rows of `n` columns, `m` of them, over blocks of `rows` rows that
/// walk `cols`-column chunks: `(segments a row, chunks a segment)`. One segment where the row
/// blocks fill the GPU twice over (or a row is short); else segments of at least 4096 columns,
/// enough for 8 blocks an SM.
fn segments(device: &Device, m: usize, n: usize, rows: usize, cols: usize) -> (usize, i32) {
    let chunks = n.div_ceil(cols);
    let (blocks, sms) = (m.div_ceil(rows), device.sm_count().max(1) as usize);
    let segs = if blocks >= 2 * sms { 1 } else { (8 * sms).div_ceil(blocks).min(n / 4096).max(1) };
    let seg_chunks = chunks.div_ceil(segs);
    (chunks.div_ceil(seg_chunks), i32::try_from(seg_chunks).unwrap_or(i32::MAX))
}

/// A backward's variant for `m` rows ([`fewest_padded_rows`]), its grid, segments a row and
/// chunks a segment.
fn backward_split(device: &Device, variants: &[&KernelSpec], m: usize, n: usize) -> (usize, Grid, usize, i32) {
    let variant = fewest_padded_rows(variants, m);
    let (rows, cols) = chunk(&variants[variant..]);
    let (segs, seg_chunks) = segments(device, m, n, rows, cols);
    (variant, Grid::from(Grid::tiles(m, rows) * segs as u32), segs, seg_chunks)
}

/// Two `[m, segs]` f32 scratches for the segments' totals, none where there is one segment.
fn totals(device: &Device, m: usize, segs: usize) -> Result<(Totals, Totals)> {
    let one = || -> Result<Totals> { Ok(Totals((segs > 1).then(|| Tensor::<f32>::scratch(device, &[m, segs])).transpose()?)) };
    Ok((one()?, one()?))
}

/// A segments' totals scratch, or none.
struct Totals(Option<Tensor<f32>>);

impl Totals {
    /// The kernel argument: the tensor, or an absent one of rank 2.
    fn opt(&mut self) -> OptionalMut<'_, Tensor<f32>> {
        OptionalMut(self.0.as_mut(), 2)
    }
}

/// Checks the inputs (named `names`, the first `x`) and the output `y` (named `out`): all
/// contiguous, of one shape, rank ≥ 1; then runs `op` over the rows.
fn run<T: ScanElement>(
    name: &'static str, op: ScanOp, device: &Device, inputs: &[(&str, &Tensor<T>)], (out, y): (&str, &mut Tensor<T>),
) -> Result<()> {
    let arg = |arg: &str, expected: String, found: String| Error::Argument { kernel: name, arg: arg.into(), expected, found };
    let (x0, x) = inputs[0];
    let Some(&n) = x.shape().last() else {
        return Err(arg(x0, "a tensor of rank 1 or more".into(), "a scalar (rank 0)".into()));
    };
    let all = inputs.iter().map(|&(w, t)| (w, t.shape(), t.strides(), t.is_contiguous()));
    for (what, shape, strides, contiguous) in all.chain([(out, y.shape(), y.strides(), y.is_contiguous())]) {
        if shape != x.shape() {
            return Err(arg(what, format!("shape {:?}, as {x0}", x.shape()), format!("shape {shape:?}")));
        }
        if !contiguous {
            return Err(arg(what, "a contiguous tensor".into(), format!("strides {strides:?}")));
        }
    }
    let m: usize = x.shape()[..x.shape().len() - 1].iter().product();
    if m == 0 || n == 0 {
        return Ok(());
    }
    if i32::try_from(m).is_err() || i32::try_from(n).is_err() {
        return Err(arg("x", "fewer than 2³¹ rows and columns".into(), format!("{m} rows of {n}")));
    }
    let tensors: Vec<&Tensor<T>> = inputs.iter().map(|&(_, t)| t).collect();
    T::scan_launch(op, device, &tensors, y, [m, n])
}

/// `y = cumsum(x)` along the last axis (`y[…, j] = Σ_{k ≤ j} x[…, k]`): bf16, f16 or f32 in
/// and out, the sums in f32. `x` and `y` contiguous, of one shape, any rank ≥ 1.
///
/// # Errors
/// [`Error::Argument`] naming `x` or `y` (a scalar, a non-contiguous tensor, shapes that
/// differ); a launch error.
pub fn cumsum<T: ScanElement>(device: &Device, x: &Tensor<T>, y: &mut Tensor<T>) -> Result<()> {
    run("cumsum", ScanOp::Sum, device, &[("x", x)], ("y", y))
}

/// The backward of [`cumsum`]: `dx[…, j] = Σ_{k ≥ j} dy[…, k]`.
///
/// # Errors
/// As [`cumsum`], naming `dy` and `dx`.
pub fn cumsum_backward<T: ScanElement>(device: &Device, dy: &Tensor<T>, dx: &mut Tensor<T>) -> Result<()> {
    run("cumsum_backward", ScanOp::SumReverse, device, &[("dy", dy)], ("dx", dx))
}

/// `y = cumprod(x)` along the last axis (`y[…, j] = Π_{k ≤ j} x[…, k]`), as [`cumsum`].
///
/// # Errors
/// As [`cumsum`].
pub fn cumprod<T: ScanElement>(device: &Device, x: &Tensor<T>, y: &mut Tensor<T>) -> Result<()> {
    run("cumprod", ScanOp::Prod, device, &[("x", x)], ("y", y))
}

/// The backward of [`cumprod`]: `dx[…, j] = Σ_{k ≥ j} dy[…, k]·Π_{i ≤ k, i ≠ j} x[…, i]` from
/// `x`, the forward's output `y` and `dy`, exact where `x` has zeros (no division: the
/// exclusive products before `j` times a reverse recurrence after it). `y` is read at one
/// column a row every 256 or 1024 (the product of the row before each chunk of the walk), so
/// `x` and `dy` are read once and `dx` stored once; a `y` other than `cumprod(x)` gives
/// gradients of no meaning.
///
/// # Errors
/// As [`cumsum`], naming `x`, `y`, `dy` or `dx`.
pub fn cumprod_backward<T: ScanElement>(device: &Device, x: &Tensor<T>, y: &Tensor<T>, dy: &Tensor<T>, dx: &mut Tensor<T>) -> Result<()> {
    run("cumprod_backward", ScanOp::ProdBackward, device, &[("x", x), ("y", y), ("dy", dy)], ("dx", dx))
}

/// `y = logcumsumexp(x)` along the last axis (`y[…, j] = ln Σ_{k ≤ j} exp(x[…, k])`), as
/// [`cumsum`]; −∞ elements contribute nothing (a row of −∞ gives −∞), any finite magnitude is
/// exact to f32 (the running value is a log, never an exponential).
///
/// # Errors
/// As [`cumsum`].
pub fn logcumsumexp<T: ScanElement>(device: &Device, x: &Tensor<T>, y: &mut Tensor<T>) -> Result<()> {
    run("logcumsumexp", ScanOp::LogSumExp, device, &[("x", x)], ("y", y))
}

/// The backward of [`logcumsumexp`]: `dx[…, j] = Σ_{k ≥ j} dy[…, k]·exp(x[…, j] − y[…, k])`
/// from `x`, the forward's output `y` and `dy`, without overflow for any finite inputs (the
/// sum runs as a scale and a value); `dx` is 0 where `x` is −∞.
///
/// # Errors
/// As [`cumsum`], naming `x`, `y`, `dy` or `dx`.
pub fn logcumsumexp_backward<T: ScanElement>(
    device: &Device, x: &Tensor<T>, y: &Tensor<T>, dy: &Tensor<T>, dx: &mut Tensor<T>,
) -> Result<()> {
    run("logcumsumexp_backward", ScanOp::LogSumExpBackward, device, &[("x", x), ("y", y), ("dy", dy)], ("dx", dx))
}
