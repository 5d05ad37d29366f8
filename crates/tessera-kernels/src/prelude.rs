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
    x: Tile<f32, R, W>,
    p: f32,
    keep_scale: f32,
    seed_lo: i32,
    seed_hi: i32,
    offset: i32,
    row: i32,
    col: i32,
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
    s: Tile<f32, M, N>,
    m: Tile<f32, M, 1>,
    l: &mut Tile<f32, M, 1>,
) -> (Tile<f32, M, N>, Tile<f32, M, 1>) {
    let m_new = max(m, row_max(s));
    let p = exp2(s - m_new);
    *l = *l * exp2(m - m_new) + row_sum(p);
    (p, m_new)
}
