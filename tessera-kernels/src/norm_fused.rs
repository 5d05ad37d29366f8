//! Fused RMSNorm and LayerNorm, forward and backward: dropout of the input (Philox, from a
//! seed and an offset), a residual added after it (the sum returned as the new residual),
//! weight and bias, and a per-group scale and shift (`y · (1 + scale) + shift`, as adaLN).
//!
//! Rows up to [`FUSED_ROW_IN_REGISTERS`] wide (backward: [`FUSED_BACKWARD_ROW_HALVES`]) are
//! read once, a row per block in registers (the backward's sums for `dweight` and `dbias` in
//! shared memory above 2048 columns; past [`FUSED_BACKWARD_ROW_IN_REGISTERS`] half a row in
//! each of two warpgroups);
//! wider rows take kernels that pass over 2048-column chunks (recomputing the dropout and the
//! residual sum in each pass rather than storing them). The backward kernels stride over
//! rows, summing `dy · x̂` and `dy` into one row of f32 partials per block, which a last
//! kernel adds down the columns into `dweight` and `dbias`.

use crate::norm::NormElement;
use crate::prelude::*;
use tessera::{kernel, Device, Element, Error, GlobalArgMut, Grid, Launch, Optional, OptionalMut, Result, ScalarArg, Tensor};

/// The fused kernels of element type `dtype` (bf16, f16 or f32: every [`NormElement`]).
fn fused_specs(dtype: tessera::DType) -> FusedSpecs {
    macro_rules! specs {
        ($rows4:ident, $row:ident, $wide:ident, $brows4:ident, $brow:ident, $brows:ident, $bhalves:ident, $bstaged:ident, $bwide:ident, $sum:ident) => {
            FusedSpecs {
                rows4: $rows4::VARIANTS,
                row: $row::VARIANTS,
                wide: &$wide::SPEC,
                backward_rows4: $brows4::VARIANTS,
                backward_row: $brow::VARIANTS,
                backward_rows: $brows::VARIANTS,
                backward_halves: $bhalves::VARIANTS,
                backward_staged: $bstaged::VARIANTS,
                backward_wide: &$bwide::SPEC,
                sum_partials: &$sum::SPEC,
            }
        };
    }
    match dtype {
        tessera::DType::BF16 => specs!(
            norm_fused_rows4_bf16,
            norm_fused_row_bf16,
            norm_fused_wide_bf16,
            norm_backward_rows4_bf16,
            norm_backward_row_bf16,
            norm_backward_rows_bf16,
            norm_backward_halves_bf16,
            norm_backward_staged_bf16,
            norm_backward_wide_bf16,
            sum_partials_bf16
        ),
        tessera::DType::F16 => specs!(
            norm_fused_rows4_f16,
            norm_fused_row_f16,
            norm_fused_wide_f16,
            norm_backward_rows4_f16,
            norm_backward_row_f16,
            norm_backward_rows_f16,
            norm_backward_halves_f16,
            norm_backward_staged_f16,
            norm_backward_wide_f16,
            sum_partials_f16
        ),
        _ => specs!(
            norm_fused_rows4_f32,
            norm_fused_row_f32,
            norm_fused_wide_f32,
            norm_backward_rows4_f32,
            norm_backward_row_f32,
            norm_backward_rows_f32,
            norm_backward_halves_f32,
            norm_backward_staged_f32,
            norm_backward_wide_f32,
            sum_partials_f32
        ),
    }
}

/// The widest row the fused forward kernel holds in registers (a block per row).
pub const FUSED_ROW_IN_REGISTERS: usize = 12288;

/// The widest row the fused backward's one-warpgroup kernels hold in registers (one row a
/// block; to 4096, with the weight gradient's sums in registers too, wider in shared memory).
/// Wider rows (to [`FUSED_BACKWARD_ROW_HALVES`]) take two warpgroups: the one-warpgroup tiles
/// past 8192 columns spill (0.55–0.63× copy at 11008–12288, run 208), and at 8192 (233
/// registers, two blocks an SM) they trail two warpgroups of 4096 (0.60 against 0.65× copy,
/// H200, run 355).
pub const FUSED_BACKWARD_ROW_IN_REGISTERS: usize = 7168;

/// The widest row the fused backward's staged kernel takes on Hopper (`norm_backward_staged`,
/// 16-bit; f32 to 6144): the ring of two rows of `h`, `dy` and `dres`, the weight and the
/// block's sums take 176 KiB of shared memory there.
pub const FUSED_BACKWARD_STAGED_MAX: usize = 8192;

/// The widest row the fused backward's two-warpgroup kernel takes (half a row each, in
/// registers); wider rows pass over 2048-column chunks.
pub const FUSED_BACKWARD_ROW_HALVES: usize = 16384;

/// The widest row the fused backward's four-rows-a-block kernel takes (its widest tile).
pub const FUSED_BACKWARD_ROWS4_MAX: usize = 1024;

/// The widest row the fused backward's row kernel takes in 16 bits (its widest tile: the
/// weight's sums in registers), without a residual gradient or dropout; with them 4096, f32
/// rows to 3072.
const FUSED_BACKWARD_ROW_NARROW: usize = 5120;

/// The widest row the fused four-rows-per-block forward takes (its widest tile).
const FUSED_ROWS4_MAX: usize = 2048;

/// The fused forward of `R` rows from row `r`, `W` columns: `h = dropout(x) + res` (each
/// optional), stored to `h_out`; `y = norm(h) · w + b`, then `· (1 + scale[g]) + shift[g]` for
/// the rows' group `g`. `norm_fused_row` (`R` 1) and `norm_fused_rows4` (`R` 4) are this.
#[tessera::device]
#[allow(clippy::too_many_arguments)]
fn fused_rows<const R: usize, const W: usize, T>(
    x: Global<T, 2>, res: Global<T, 2>, w: Global<T, 1>, b: Global<T, 1>, scale: Global<T, 2>, shift: Global<T, 2>, y: Global<T, 2>,
    h_out: Global<T, 2>, eps: f32, r: i32, layer: i32, has_w: i32, has_b: i32, has_res: i32, drop_p: f32, drop_scale: f32, seed_lo: i32,
    seed_hi: i32, offset: i32, group_rows: i32, ahead: i32,
) {
    let n = x.dim(1);
    let inv_n = 1.0 / n as f32;
    x.prefetch::<Tile<T, R, W>>([r + ahead, 0]);
    if has_res == 1 {
        res.prefetch::<Tile<T, R, W>>([r + ahead, 0]);
    }
    let mut h = x.load::<Tile<T, R, W>>([r, 0]).cast::<f32>();
    if drop_p > 0.0 {
        h = dropout(h, drop_p, drop_scale, seed_lo, seed_hi, offset, r, 0);
    }
    if has_res == 1 {
        h = h + res.load::<Tile<T, R, W>>([r, 0]).cast::<f32>();
    }
    h_out.store([r, 0], h.cast::<T>());
    let mut d = h;
    if layer == 1 {
        d = (h - row_sum(h) * inv_n).mask_cols(n, 0.0);
    }
    let mut o = d * rsqrt(row_sum(d * d) * inv_n + eps);
    scale_columns(&mut o, w, 0, has_w);
    shift_columns(&mut o, b, 0, has_b);
    if group_rows > 0 {
        let g = r / group_rows;
        o = o * (scale.load::<Tile<T, 1, W>>([g, 0]).cast::<f32>() + 1.0) + shift.load::<Tile<T, 1, W>>([g, 0]).cast::<f32>();
    }
    y.store([r, 0], o.cast::<T>());
}

/// `h = dropout(x) + res` (each optional), stored to `h_out` if asked; `y = norm(h) · w + b`,
/// then `y · (1 + scale[g]) + shift[g]` for the row's group `g`; rows of at most
/// [`FUSED_ROW_IN_REGISTERS`], one per block, read once; a variant per tile width `W`, the
/// narrowest that holds the row launched (as the plain norms'; 11264 and 12288 take 248–255
/// registers, two blocks per SM, no spills — capped to three blocks they spill 208–260 bytes
/// and gain nothing, run 112; 9216 and 10240 are capped, 4–12 bytes of spills).
#[kernel(dtypes(T = [bf16, f16, f32]), tune(W = [8192, 7168, 6144, 5120, 4096, 3072, 2048, 1024, 9216, 10240, 11264, 12288]), blocks_per_sm(W >= 9216, W <= 10240, T != f32) = 3)]
pub fn norm_fused_row(
    x: Global<T, 2>, res: Global<T, 2>, w: Global<T, 1>, b: Global<T, 1>, scale: Global<T, 2>, shift: Global<T, 2>, y: Global<T, 2>,
    h_out: Global<T, 2>, eps: f32, layer: i32, has_w: i32, has_b: i32, has_res: i32, drop_p: f32, drop_scale: f32, seed_lo: i32,
    seed_hi: i32, offset: i32, group_rows: i32, ahead: i32,
) {
    fused_rows::<1, W>(
        x,
        res,
        w,
        b,
        scale,
        shift,
        y,
        h_out,
        eps,
        block::id_x(),
        layer,
        has_w,
        has_b,
        has_res,
        drop_p,
        drop_scale,
        seed_lo,
        seed_hi,
        offset,
        group_rows,
        ahead,
    );
}

/// `norm_fused_row` for rows of at most 2048, four per block (one per warp, so the
/// reductions stay within a warp); the four rows share one scale and shift row, so the
/// launcher takes it only when groups are multiples of 4 rows. Tile widths `W` as the plain
/// norms'.
#[kernel(dtypes(T = [bf16, f16, f32]), tune(W = [2048, 1792, 1536, 1280, 1024, 768, 512]))]
pub fn norm_fused_rows4(
    x: Global<T, 2>, res: Global<T, 2>, w: Global<T, 1>, b: Global<T, 1>, scale: Global<T, 2>, shift: Global<T, 2>, y: Global<T, 2>,
    h_out: Global<T, 2>, eps: f32, layer: i32, has_w: i32, has_b: i32, has_res: i32, drop_p: f32, drop_scale: f32, seed_lo: i32,
    seed_hi: i32, offset: i32, group_rows: i32, ahead: i32,
) {
    fused_rows::<4, W>(
        x,
        res,
        w,
        b,
        scale,
        shift,
        y,
        h_out,
        eps,
        block::id_x() * 4,
        layer,
        has_w,
        has_b,
        has_res,
        drop_p,
        drop_scale,
        seed_lo,
        seed_hi,
        offset,
        group_rows,
        ahead,
    );
}

/// `norm_fused_row` for any width: a row per block in 2048-column chunks, one pass for the
/// mean (LayerNorm), one for the variance, one for the output; each recomputes `h`.
#[kernel(dtypes(T = [bf16, f16, f32]))]
pub fn norm_fused_wide(
    x: Global<T, 2>, res: Global<T, 2>, w: Global<T, 1>, b: Global<T, 1>, scale: Global<T, 2>, shift: Global<T, 2>, y: Global<T, 2>,
    h_out: Global<T, 2>, eps: f32, layer: i32, has_w: i32, has_b: i32, has_res: i32, drop_p: f32, drop_scale: f32, seed_lo: i32,
    seed_hi: i32, offset: i32, group_rows: i32, ahead: i32,
) {
    let r = block::id_x();
    let n = x.dim(1);
    let inv_n = 1.0 / n as f32;
    let mut s = Tile::<f32, 1, 2048>::zeros();
    if layer == 1 {
        for c in (0..n).step_by(2048) {
            x.prefetch::<Tile<T, 1, 2048>>([r + ahead, c]);
            let mut h = x.load::<Tile<T, 1, 2048>>([r, c]).cast::<f32>();
            if drop_p > 0.0 {
                h = dropout(h, drop_p, drop_scale, seed_lo, seed_hi, offset, r, c);
            }
            if has_res == 1 {
                h = h + res.load::<Tile<T, 1, 2048>>([r, c]).cast::<f32>();
            }
            s = s + h;
        }
    }
    let mean = row_sum(s) * inv_n;
    let mut ss = Tile::<f32, 1, 2048>::zeros();
    for c in (0..n).step_by(2048) {
        let mut h = x.load::<Tile<T, 1, 2048>>([r, c]).cast::<f32>();
        if drop_p > 0.0 {
            h = dropout(h, drop_p, drop_scale, seed_lo, seed_hi, offset, r, c);
        }
        if has_res == 1 {
            h = h + res.load::<Tile<T, 1, 2048>>([r, c]).cast::<f32>();
        }
        let d = (h - mean).mask_cols(n - c, 0.0);
        ss = ss + d * d;
    }
    let rstd = rsqrt(row_sum(ss) * inv_n + eps);
    for c in (0..n).step_by(2048) {
        let mut h = x.load::<Tile<T, 1, 2048>>([r, c]).cast::<f32>();
        if drop_p > 0.0 {
            h = dropout(h, drop_p, drop_scale, seed_lo, seed_hi, offset, r, c);
        }
        if has_res == 1 {
            h = h + res.load::<Tile<T, 1, 2048>>([r, c]).cast::<f32>();
        }
        h_out.store([r, c], h.cast::<T>());
        let mut o = (h - mean) * rstd;
        scale_columns(&mut o, w, c, has_w);
        shift_columns(&mut o, b, c, has_b);
        if group_rows > 0 {
            let g = r / group_rows;
            o = o * (scale.load::<Tile<T, 1, 2048>>([g, c]).cast::<f32>() + 1.0) + shift.load::<Tile<T, 1, 2048>>([g, c]).cast::<f32>();
        }
        y.store([r, c], o.cast::<T>());
    }
}

/// `R` rows' `x̂ = (x − mean) · rstd` (no mean for RMSNorm) and `rstd`, from their input `x`
/// (f32, `valid` columns of `W` — the rows' `n`, or the part of them this tile holds): `total(s,
/// kind)` makes a tile's row sums the rows' (`|s, _| s` where the tile is the whole row; the
/// sums' kinds 0 and 1 — the mean's and the variance's — as [`store_row_grad`]'s 2 and 3).
#[tessera::device]
fn normalized<const R: usize, const W: usize>(
    x: Tile<f32, R, W>, n: i32, valid: i32, eps: f32, layer: i32, total: impl Fn(Tile<f32, R, 1>, i32) -> Tile<f32, R, 1>,
) -> (Tile<f32, R, W>, Tile<f32, R, 1>) {
    let inv_n = 1.0 / n as f32;
    let mut d = x;
    if layer == 1 {
        d = (x - total(row_sum(x), 0) * inv_n).mask_cols(valid, 0.0);
    }
    let rstd = rsqrt(total(row_sum(d * d), 1) * inv_n + eps);
    (d * rstd, rstd)
}

/// Rows `r..r + R`'s input gradient (their columns `c0..c0 + W`) from the output gradient `g`, `x̂` and
/// `rstd` ([`normalized`], its `total`) and the weight `w` (read again each row: L1 hits; held
/// across rows it would spill the widest tiles): `dh = rstd · (g·w − mean(g·w) − x̂ ·
/// mean(g·w·x̂))` (no mean term for RMSNorm) plus `dres` if given, stored, and `dx = dh · mask
/// / (1 − p)` under dropout.
#[tessera::device]
#[allow(clippy::too_many_arguments)]
fn store_row_grad<const R: usize, const W: usize, T>(
    g: Tile<f32, R, W>, xhat: Tile<f32, R, W>, rstd: Tile<f32, R, 1>, w: Global<T, 1>, dres: Global<T, 2>, dh: Global<T, 2>,
    dx: Global<T, 2>, r: i32, c0: i32, layer: i32, has_w: i32, has_dres: i32, drop_p: f32, drop_scale: f32, seed_lo: i32, seed_hi: i32,
    offset: i32, total: impl Fn(Tile<f32, R, 1>, i32) -> Tile<f32, R, 1>,
) {
    let inv_n = 1.0 / dh.dim(1) as f32;
    let mut gw = g;
    if has_w == 1 {
        gw = g * w.load::<Tile<T, 1, W>>([c0]).cast::<f32>();
    }
    let mut t = gw - xhat * (total(row_sum(gw * xhat), 2) * inv_n);
    if layer == 1 {
        t = t - total(row_sum(gw), 3) * inv_n;
    }
    let mut o = t * rstd;
    if has_dres == 1 {
        o = o + dres.load::<Tile<T, R, W>>([r, c0]).cast::<f32>();
    }
    dh.store([r, c0], o.cast::<T>());
    if drop_p > 0.0 {
        dx.store([r, c0], dropout(o, drop_p, drop_scale, seed_lo, seed_hi, offset, r, c0).cast::<T>());
    }
}

/// The backward pass for rows of at most [`FUSED_BACKWARD_ROW_NARROW`] (four rows of state per
/// thread: the row, `dy` and the two sums; a variant per tile width `W`, the narrowest that
/// holds the row), striding over rows: each row's `dh` (and `dx`) from the norm's input `h` and
/// `dy` (`normalized`, `store_row_grad`); each block's sums of `dy · x̂` and `dy` go to its row
/// of `dw_part` and `db_part`. The sums in registers beat [`norm_backward_rows`]' in shared
/// memory to 4096 columns in 16 bits (H200, runs 358–359, plain RMS: 2304 columns 0.54 → 0.76×
/// copy, 3072 0.74 → 0.83×, 4096 0.74 → 0.87×; fused 0.59 → 0.66×, 0.74 → 0.79×, 0.75 → 0.79×).
#[kernel(dtypes(T = [bf16, f16, f32]), tune(W = [2048, 2304, 3072, 4096, 4608, 5120], only(T != f32 || W <= 3072)))]
pub fn norm_backward_row(
    h: Global<T, 2>, dy: Global<T, 2>, dres: Global<T, 2>, w: Global<T, 1>, dh: Global<T, 2>, dx: Global<T, 2>, dw_part: Global<f32, 2>,
    db_part: Global<f32, 2>, eps: f32, layer: i32, has_w: i32, has_dres: i32, drop_p: f32, drop_scale: f32, seed_lo: i32, seed_hi: i32,
    offset: i32,
) {
    let mut dw = Tile::<f32, 1, W>::zeros();
    let mut db = Tile::<f32, 1, W>::zeros();
    let step = grid::dim_x();
    for r in (block::id_x()..h.dim(0)).step_by(step) {
        // The next row asked of L2 (runs 248–249: 1536 columns 0.68 → 0.82× copy, 2048 0.83 →
        // 0.90×); its residual gradient too below 2048 columns (there it lost: 0.90 → 0.80×).
        h.prefetch::<Tile<T, 1, W>>([r + step, 0]);
        dy.prefetch::<Tile<T, 1, W>>([r + step, 0]);
        if has_dres == 1 && h.dim(1) < 2048 {
            dres.prefetch::<Tile<T, 1, W>>([r + step, 0]);
        }
        let x = h.load::<Tile<T, 1, W>>([r, 0]).cast::<f32>();
        let g = dy.load::<Tile<T, 1, W>>([r, 0]).cast::<f32>();
        let (xhat, rstd) = normalized(x, h.dim(1), h.dim(1), eps, layer, |s, _| s);
        dw = dw + g * xhat;
        db = db + g;
        #[rustfmt::skip]
        store_row_grad(g, xhat, rstd, w, dres, dh, dx, r, 0, layer, has_w, has_dres, drop_p, drop_scale, seed_lo, seed_hi, offset, |s, _| s);
    }
    dw_part.store([block::id_x(), 0], dw);
    db_part.store([block::id_x(), 0], db);
}

/// `norm_backward_row` for rows of at most [`FUSED_BACKWARD_ROWS4_MAX`] columns, four a block
/// (one a warp: their sums stay within it), a variant per tile width `W` (the narrowest that
/// holds the row): each thread's sums of `dy · x̂` and `dy` in registers for its four rows'
/// columns, stored to the block's four rows of `dw_part` and `db_part`.
#[kernel(dtypes(T = [bf16, f16, f32]), tune(W = [1024, 768, 512]))]
pub fn norm_backward_rows4(
    h: Global<T, 2>, dy: Global<T, 2>, dres: Global<T, 2>, w: Global<T, 1>, dh: Global<T, 2>, dx: Global<T, 2>, dw_part: Global<f32, 2>,
    db_part: Global<f32, 2>, eps: f32, layer: i32, has_w: i32, has_dres: i32, drop_p: f32, drop_scale: f32, seed_lo: i32, seed_hi: i32,
    offset: i32,
) {
    let mut dw = Tile::<f32, 4, W>::zeros();
    let mut db = Tile::<f32, 4, W>::zeros();
    let step = grid::dim_x() * 4;
    for r in (block::id_x() * 4..h.dim(0)).step_by(step) {
        h.prefetch::<Tile<T, 4, W>>([r + step, 0]);
        dy.prefetch::<Tile<T, 4, W>>([r + step, 0]);
        if has_dres == 1 {
            dres.prefetch::<Tile<T, 4, W>>([r + step, 0]);
        }
        let x = h.load::<Tile<T, 4, W>>([r, 0]).cast::<f32>();
        let g = dy.load::<Tile<T, 4, W>>([r, 0]).cast::<f32>();
        let (xhat, rstd) = normalized(x, h.dim(1), h.dim(1), eps, layer, |s, _| s);
        dw = dw + g * xhat;
        db = db + g;
        #[rustfmt::skip]
        store_row_grad(g, xhat, rstd, w, dres, dh, dx, r, 0, layer, has_w, has_dres, drop_p, drop_scale, seed_lo, seed_hi, offset, |s, _| s);
    }
    dw_part.store([block::id_x() * 4, 0], dw);
    db_part.store([block::id_x() * 4, 0], db);
}

/// `norm_backward_row` for rows past the row kernel's (f32: 3072; 16 bits: 4096, or 5120 without a
/// residual gradient or dropout) to [`FUSED_BACKWARD_ROW_IN_REGISTERS`] columns, a
/// variant per tile width `W` (the narrowest that holds the row launched): `h` and `dy` read
/// once a row into registers; the block's sums of `dy · x̂` and `dy` kept in shared memory,
/// each thread adding into the columns its tiles hold (no barrier: no thread reads another's),
/// and stored to its rows of `dw_part` and `db_part` at the end.
#[kernel(dtypes(T = [bf16, f16, f32]), tune(W = [4096, 4608, 5120, 6144, 7168]))]
pub fn norm_backward_rows(
    h: Global<T, 2>, dy: Global<T, 2>, dres: Global<T, 2>, w: Global<T, 1>, dh: Global<T, 2>, dx: Global<T, 2>, dw_part: Global<f32, 2>,
    db_part: Global<f32, 2>, eps: f32, layer: i32, has_w: i32, has_dres: i32, drop_p: f32, drop_scale: f32, seed_lo: i32, seed_hi: i32,
    offset: i32,
) {
    let sdw = Smem::<f32, 1, W>::ring_swizzled(1, 0);
    let sdb = Smem::<f32, 1, W>::ring_swizzled(1, 0);
    sdw.at(0).store(Tile::<f32, 1, W>::zeros());
    sdb.at(0).store(Tile::<f32, 1, W>::zeros());
    let step = grid::dim_x();
    for r in (block::id_x()..h.dim(0)).step_by(step) {
        h.prefetch::<Tile<T, 1, W>>([r + step, 0]);
        dy.prefetch::<Tile<T, 1, W>>([r + step, 0]);
        let x = h.load::<Tile<T, 1, W>>([r, 0]).cast::<f32>();
        let g = dy.load::<Tile<T, 1, W>>([r, 0]).cast::<f32>();
        let (xhat, rstd) = normalized(x, h.dim(1), h.dim(1), eps, layer, |s, _| s);
        sdw.at(0).store(sdw.at(0).load() + g * xhat);
        sdb.at(0).store(sdb.at(0).load() + g);
        #[rustfmt::skip]
        store_row_grad(g, xhat, rstd, w, dres, dh, dx, r, 0, layer, has_w, has_dres, drop_p, drop_scale, seed_lo, seed_hi, offset, |s, _| s);
    }
    dw_part.store([block::id_x(), 0], sdw.at(0).load());
    db_part.store([block::id_x(), 0], sdb.at(0).load());
}

/// Warpgroup `me`'s half of a row sum of kind `kind` (0–3) made the row's, through the slot
/// pair `2·kind` of `sums` and named barrier 1.
#[tessera::device]
fn both_halves(sums: Smem<f32, 1, 1>, s: Tile<f32, 1, 1>, kind: i32, me: i32) -> Tile<f32, 1, 1> {
    sums.at(kind * 2 + me).store(s);
    barrier::sync(1, 2);
    sums.at(kind * 2).load() + sums.at(kind * 2 + 1).load()
}

/// `norm_backward_rows` for rows of 7169 to [`FUSED_BACKWARD_ROW_HALVES`] columns: two
/// warpgroups, each holding half of a row (`W` columns, a variant per width: the narrowest
/// that holds half the row launched) in registers and its half of the block's sums for
/// `dweight` and `dbias` in shared memory; the row's four sums (mean,
/// variance, `Σ g·w·x̂`, `Σ g·w`) added across the halves through shared memory, one slot
/// pair and a named barrier each (a slot is written again only two sums later, after the
/// other warpgroup has passed the barrier between, so it has read it).
#[kernel(warpgroups = 2, dtypes(T = [bf16, f16, f32]), tune(W = [8192, 7168, 6144, 5120, 4096]))]
pub fn norm_backward_halves(
    h: Global<T, 2>, dy: Global<T, 2>, dres: Global<T, 2>, w: Global<T, 1>, dh: Global<T, 2>, dx: Global<T, 2>, dw_part: Global<f32, 2>,
    db_part: Global<f32, 2>, eps: f32, layer: i32, has_w: i32, has_dres: i32, drop_p: f32, drop_scale: f32, seed_lo: i32, seed_hi: i32,
    offset: i32,
) {
    let me = warpgroup::id();
    let c0 = me * W;
    let sdw = Smem::<f32, 1, W>::ring_swizzled(2, 0);
    let sdb = Smem::<f32, 1, W>::ring_swizzled(2, 0);
    let sums = Smem::<f32, 1, 1>::ring_swizzled(8, 0);
    sdw.at(me).store(Tile::<f32, 1, W>::zeros());
    sdb.at(me).store(Tile::<f32, 1, W>::zeros());
    let n = h.dim(1);
    let step = grid::dim_x();
    for r in (block::id_x()..h.dim(0)).step_by(step) {
        h.prefetch::<Tile<T, 1, W>>([r + step, c0]);
        dy.prefetch::<Tile<T, 1, W>>([r + step, c0]);
        let x = h.load::<Tile<T, 1, W>>([r, c0]).cast::<f32>();
        let g = dy.load::<Tile<T, 1, W>>([r, c0]).cast::<f32>();
        let (xhat, rstd) = normalized(x, n, n - c0, eps, layer, |s, kind| both_halves(sums, s, kind, me));
        sdw.at(me).store(sdw.at(me).load() + g * xhat);
        sdb.at(me).store(sdb.at(me).load() + g);
        #[rustfmt::skip]
        store_row_grad(
            g, xhat, rstd, w, dres, dh, dx, r, c0, layer, has_w, has_dres, drop_p, drop_scale, seed_lo, seed_hi, offset,
            |s, kind| both_halves(sums, s, kind, me),
        );
    }
    dw_part.store([block::id_x(), c0], sdw.at(me).load());
    db_part.store([block::id_x(), c0], sdb.at(me).load());
}

/// The fused backward for rows of 2049 to [`FUSED_BACKWARD_STAGED_MAX`] columns on Hopper
/// (f32 to 6144), every tensor seen as `[2·rows, n/2]` (a row's halves as two rows): a
/// producer warpgroup brings each row's `h`, `dy` (and `dres`) by TMA into a two-stage ring
/// (boxes of 256 columns), so the next row is on its way while this one is computed; two
/// consumer warpgroups take half a row each, in 1024-column slices (8 elements a thread) read from shared memory
/// (three sweeps: the mean for LayerNorm, the sums, the output), their row sums added across
/// the halves through shared memory (`both_halves`), `dweight`'s and `dbias`'s sums in shared
/// memory. A variant per width `W` (the narrowest holding the row).
#[kernel(warpgroups = 3, dtypes(T = [bf16, f16, f32]), tune(W = [4096, 6144, 8192], only(T != f32 || W <= 6144)))]
pub fn norm_backward_staged(
    h: Global<T, 2>, dy: Global<T, 2>, dres: Global<T, 2>, w: Global<T, 2>, dh: Global<T, 2>, dx: Global<T, 2>, dw_part: Global<f32, 2>,
    db_part: Global<f32, 2>, eps: f32, layer: i32, has_w: i32, has_dres: i32, drop_p: f32, drop_scale: f32, seed_lo: i32, seed_hi: i32,
    offset: i32,
) {
    let hn = h.dim(1);
    let inv_n = 1.0 / (hn * 2) as f32;
    let step = grid::dim_x();
    let count = (h.dim(0) / 2 - block::id_x() + step - 1) / step;
    let sh = Smem::<T, 2, { W / 2 }>::ring_swizzled(2, 0);
    let sg = Smem::<T, 2, { W / 2 }>::ring_swizzled(2, 0);
    let sr = Smem::<T, 2, { W / 2 }>::ring_swizzled(2, 0);
    let sw = Smem::<T, 2, { W / 2 }>::ring_swizzled(1, 0);
    let sdw = Smem::<f32, 2, { W / 2 }>::ring_swizzled(1, 0);
    let sdb = Smem::<f32, 2, { W / 2 }>::ring_swizzled(1, 0);
    let sums = Smem::<f32, 1, 1>::ring_swizzled(8, 0);
    let pipe = Pipeline::<2>::new(2);
    if warpgroup::id() == 0 {
        setmaxnreg(40);
        fill_stages(pipe, count, |s, i| {
            let r2 = (block::id_x() + i * step) * 2;
            tma::load(sh.at(s), h, [r2, 0], pipe);
            tma::load(sg.at(s), dy, [r2, 0], pipe);
            if has_dres == 1 {
                tma::load(sr.at(s), dres, [r2, 0], pipe);
            }
        });
    } else {
        setmaxnreg(232);
        let me = warpgroup::id() - 1;
        // Each slice's weight, zeros and sums in one layout: a thread reads only what it wrote.
        #[unroll]
        for q in 0..W / 2048 {
            sw.at(0).rows(me, 1).cols(q * 1024, 1024).store(w.load::<Tile<T, 1, 1024>>([me, q * 1024]));
            sdw.at(0).rows(me, 1).cols(q * 1024, 1024).store(Tile::<f32, 1, 1024>::zeros());
            sdb.at(0).rows(me, 1).cols(q * 1024, 1024).store(Tile::<f32, 1, 1024>::zeros());
        }
        drain_stages(pipe, count, |s, i| {
            let r = block::id_x() + i * step;
            let zero = Tile::<f32, 1, 1>::zeros();
            let mut mean = zero;
            if layer == 1 {
                let mut a = Tile::<f32, 1, 1024>::zeros();
                #[unroll]
                for q in 0..W / 2048 {
                    a = a + sh.at(s).rows(me, 1).cols(q * 1024, 1024).load().cast::<f32>().mask_cols(hn - q * 1024, 0.0);
                }
                mean = both_halves(sums, row_sum(a), 0, me) * inv_n;
            }
            let mut ss = Tile::<f32, 1, 1024>::zeros();
            let mut sgx = Tile::<f32, 1, 1024>::zeros();
            let mut sgw = Tile::<f32, 1, 1024>::zeros();
            #[unroll]
            for q in 0..W / 2048 {
                let d = (sh.at(s).rows(me, 1).cols(q * 1024, 1024).load().cast::<f32>() - mean).mask_cols(hn - q * 1024, 0.0);
                let mut gw = sg.at(s).rows(me, 1).cols(q * 1024, 1024).load().cast::<f32>().mask_cols(hn - q * 1024, 0.0);
                if has_w == 1 {
                    gw = gw * sw.at(0).rows(me, 1).cols(q * 1024, 1024).load().cast::<f32>();
                }
                ss = ss + d * d;
                sgx = sgx + gw * d;
                sgw = sgw + gw;
            }
            let rstd = rsqrt(both_halves(sums, row_sum(ss), 1, me) * inv_n + eps);
            // mean(g·w·x̂), and mean(g·w) for LayerNorm.
            let a = both_halves(sums, row_sum(sgx), 2, me) * rstd * inv_n;
            let mut b = zero;
            if layer == 1 {
                b = both_halves(sums, row_sum(sgw), 3, me) * inv_n;
            }
            #[unroll]
            for q in 0..W / 2048 {
                let c = q * 1024;
                let d = (sh.at(s).rows(me, 1).cols(q * 1024, 1024).load().cast::<f32>() - mean).mask_cols(hn - c, 0.0);
                let g = sg.at(s).rows(me, 1).cols(q * 1024, 1024).load().cast::<f32>().mask_cols(hn - c, 0.0);
                let mut gw = g;
                if has_w == 1 {
                    gw = g * sw.at(0).rows(me, 1).cols(q * 1024, 1024).load().cast::<f32>();
                }
                let xhat = d * rstd;
                let mut o = (gw - xhat * a - b) * rstd;
                if has_dres == 1 {
                    o = o + sr.at(s).rows(me, 1).cols(q * 1024, 1024).load().cast::<f32>();
                }
                dh.store([r * 2 + me, c], o.cast::<T>());
                if drop_p > 0.0 {
                    dx.store([r * 2 + me, c], dropout(o, drop_p, drop_scale, seed_lo, seed_hi, offset, r, me * hn + c).cast::<T>());
                }
                sdw.at(0).rows(me, 1).cols(q * 1024, 1024).store(sdw.at(0).rows(me, 1).cols(q * 1024, 1024).load() + g * xhat);
                sdb.at(0).rows(me, 1).cols(q * 1024, 1024).store(sdb.at(0).rows(me, 1).cols(q * 1024, 1024).load() + g);
            }
        });
        #[unroll]
        for q in 0..W / 2048 {
            dw_part.store([block::id_x() * 2 + me, q * 1024], sdw.at(0).rows(me, 1).cols(q * 1024, 1024).load());
            db_part.store([block::id_x() * 2 + me, q * 1024], sdb.at(0).rows(me, 1).cols(q * 1024, 1024).load());
        }
    }
}

/// `norm_backward_row` for any width, in 2048-column chunks: passes for the mean
/// (LayerNorm), the variance, the two sums the gradient needs, then the output; the block's
/// partial sums of `dy · x̂` and `dy` are added into its rows of `dw_part` and `db_part` in
/// place (each element by the thread that holds it, in one layout throughout).
#[kernel(dtypes(T = [bf16, f16, f32]))]
pub fn norm_backward_wide(
    h: Global<T, 2>, dy: Global<T, 2>, dres: Global<T, 2>, w: Global<T, 1>, dh: Global<T, 2>, dx: Global<T, 2>, dw_part: Global<f32, 2>,
    db_part: Global<f32, 2>, eps: f32, layer: i32, has_w: i32, has_dres: i32, drop_p: f32, drop_scale: f32, seed_lo: i32, seed_hi: i32,
    offset: i32,
) {
    let n = h.dim(1);
    let inv_n = 1.0 / n as f32;
    let bid = block::id_x();
    for c in (0..n).step_by(2048) {
        dw_part.store([bid, c], Tile::<f32, 1, 2048>::zeros());
        db_part.store([bid, c], Tile::<f32, 1, 2048>::zeros());
    }
    for r in (bid..h.dim(0)).step_by(grid::dim_x()) {
        let mut s = Tile::<f32, 1, 2048>::zeros();
        if layer == 1 {
            for c in (0..n).step_by(2048) {
                s = s + h.load::<Tile<T, 1, 2048>>([r, c]).cast::<f32>();
            }
        }
        let mean = row_sum(s) * inv_n;
        let mut ss = Tile::<f32, 1, 2048>::zeros();
        for c in (0..n).step_by(2048) {
            let d = (h.load::<Tile<T, 1, 2048>>([r, c]).cast::<f32>() - mean).mask_cols(n - c, 0.0);
            ss = ss + d * d;
        }
        let rstd = rsqrt(row_sum(ss) * inv_n + eps);
        let mut a = Tile::<f32, 1, 2048>::zeros();
        let mut bsum = Tile::<f32, 1, 2048>::zeros();
        for c in (0..n).step_by(2048) {
            let xhat = (h.load::<Tile<T, 1, 2048>>([r, c]).cast::<f32>() - mean) * rstd;
            let mut gw = dy.load::<Tile<T, 1, 2048>>([r, c]).cast::<f32>();
            if has_w == 1 {
                gw = gw * w.load::<Tile<T, 1, 2048>>([c]).cast::<f32>();
            }
            a = a + gw * xhat;
            bsum = bsum + gw;
        }
        let ma = row_sum(a) * inv_n;
        let mut mb = row_sum(bsum) * inv_n;
        if layer == 0 {
            mb = mb * 0.0;
        }
        for c in (0..n).step_by(2048) {
            let xhat = (h.load::<Tile<T, 1, 2048>>([r, c]).cast::<f32>() - mean) * rstd;
            let g = dy.load::<Tile<T, 1, 2048>>([r, c]).cast::<f32>();
            let mut gw = g;
            if has_w == 1 {
                gw = g * w.load::<Tile<T, 1, 2048>>([c]).cast::<f32>();
            }
            let mut o = (gw - mb - xhat * ma) * rstd;
            if has_dres == 1 {
                o = o + dres.load::<Tile<T, 1, 2048>>([r, c]).cast::<f32>();
            }
            dh.store([r, c], o.cast::<T>());
            if drop_p > 0.0 {
                dx.store([r, c], dropout(o, drop_p, drop_scale, seed_lo, seed_hi, offset, r, c).cast::<T>());
            }
            dw_part.store([bid, c], dw_part.load::<Tile<f32, 1, 2048>>([bid, c]) + g * xhat);
            db_part.store([bid, c], db_part.load::<Tile<f32, 1, 2048>>([bid, c]) + g);
        }
    }
}

/// `out[c] = Σ_r part[r, c]`, rounded to `T`: the last step of `dweight` and `dbias`.
#[kernel(dtypes(T = [bf16, f16, f32]))]
pub fn sum_partials(part: Global<f32, 2>, out: Global<T, 1>) {
    let c = block::id_x() * 256;
    let mut s = Tile::<f32, 16, 256>::zeros();
    for r in (0..part.dim(0)).step_by(16) {
        s = s + part.load::<Tile<f32, 16, 256>>([r, c]);
    }
    out.store([c], col_sum(s).cast::<T>());
}

/// Which normalization a [`Norm`] computes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum NormKind {
    /// `x / sqrt(mean(x²) + eps)`.
    Rms,
    /// `(x − mean) / sqrt(var + eps)` (the biased variance).
    Layer,
}

/// Dropout of a norm's input: element `[i, j]` is kept when Philox4x32-10's uniform number
/// for it ([`tessera::random::uniform`]`(seed, offset, i, j)`) is at least `p`, and scaled by
/// `1 / (1 − p)`. The same seed and offset give the same mask on the GPU, in the interpreter
/// and in the backward pass; advance `offset` (or change the seed) between steps.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Dropout {
    /// The probability of dropping an element, in `[0, 1)`.
    pub p: f32,
    /// Philox's key.
    pub seed: u64,
    /// Philox's third counter word.
    pub offset: u32,
}

impl Dropout {
    /// Drops with probability `p` under `seed` and `offset`.
    pub fn new(p: f32, seed: u64, offset: u32) -> Dropout {
        Dropout { p, seed, offset }
    }

    /// Whether element `[row, col]` is kept: the mask the kernels apply, on the host.
    pub fn keeps(&self, row: usize, col: usize) -> bool {
        tessera::random::uniform(self.seed, self.offset, row, col) >= self.p
    }
}

/// A fused RMSNorm or LayerNorm over the last dimension of a 2-D `x` (`rows × hidden`, any
/// sizes), with f32 statistics:
///
/// ```text
/// h = dropout(x) + residual          (each optional; h is returned if asked)
/// y = norm(h) · weight + bias        (each optional)
/// y = y · (1 + scale[g]) + shift[g]  (optional; g = row / (rows / groups))
/// ```
///
/// ```no_run
/// # use tessera::{Device, Tensor, bf16};
/// # use tessera_kernels::{Dropout, Norm};
/// let dev = Device::gpu_or_cpu();
/// let x = Tensor::from_host(&dev, &vec![bf16::ONE; 8 * 1024], &[8, 1024])?;
/// let res = Tensor::from_host(&dev, &vec![bf16::ONE; 8 * 1024], &[8, 1024])?;
/// let w = Tensor::from_host(&dev, &vec![bf16::ONE; 1024], &[1024])?;
/// let (mut y, mut h) = (Tensor::<bf16>::zeros(&dev, &[8, 1024])?, Tensor::<bf16>::zeros(&dev, &[8, 1024])?);
/// let norm = Norm::rms(1e-6).weight(&w).residual(&res).dropout(Dropout::new(0.1, 1234, 0));
/// norm.forward(&dev, &x, &mut y, Some(&mut h))?;
/// # Ok::<(), tessera::Error>(())
/// ```
#[derive(Clone, Copy, Debug)]
pub struct Norm<'a, T: Element> {
    kind: NormKind,
    eps: f32,
    weight: Option<&'a Tensor<T>>,
    bias: Option<&'a Tensor<T>>,
    residual: Option<&'a Tensor<T>>,
    dropout: Option<Dropout>,
    modulation: Option<(&'a Tensor<T>, &'a Tensor<T>)>,
}

/// The outputs of [`Norm::backward`].
#[derive(Debug)]
pub struct NormGrads<'g, T: Element> {
    /// The gradient of the norm's input `h` (the residual's gradient), `rows × hidden`.
    pub dh: &'g mut Tensor<T>,
    /// The gradient of `x` through the dropout, `rows × hidden`: needed with dropout (without
    /// it, `dx` is `dh`).
    pub dx: Option<&'g mut Tensor<T>>,
    /// The gradient of the weight, `[hidden]` (needs a weight).
    pub dweight: Option<&'g mut Tensor<T>>,
    /// The gradient of the bias, `[hidden]` (needs a bias).
    pub dbias: Option<&'g mut Tensor<T>>,
}

/// Element types the fused norms take: their kernels' specs.
#[doc(hidden)]
pub struct FusedSpecs {
    pub rows4: &'static [&'static tessera::KernelSpec],
    pub row: &'static [&'static tessera::KernelSpec],
    pub wide: &'static tessera::KernelSpec,
    pub backward_rows4: &'static [&'static tessera::KernelSpec],
    pub backward_row: &'static [&'static tessera::KernelSpec],
    pub backward_rows: &'static [&'static tessera::KernelSpec],
    pub backward_halves: &'static [&'static tessera::KernelSpec],
    pub backward_staged: &'static [&'static tessera::KernelSpec],
    pub backward_wide: &'static tessera::KernelSpec,
    pub sum_partials: &'static tessera::KernelSpec,
}

impl<'a, T: NormElement> Norm<'a, T> {
    /// RMSNorm with `eps` added to the mean square.
    pub fn rms(eps: f32) -> Self {
        Norm { kind: NormKind::Rms, eps, weight: None, bias: None, residual: None, dropout: None, modulation: None }
    }

    /// LayerNorm with `eps` added to the variance.
    pub fn layer(eps: f32) -> Self {
        Norm { kind: NormKind::Layer, ..Norm::rms(eps) }
    }

    /// Multiplies by `weight` (`[hidden]`).
    pub fn weight(self, weight: &'a Tensor<T>) -> Self {
        Norm { weight: Some(weight), ..self }
    }

    /// Adds `bias` (`[hidden]`).
    pub fn bias(self, bias: &'a Tensor<T>) -> Self {
        Norm { bias: Some(bias), ..self }
    }

    /// Adds `residual` (`rows × hidden`) to the (dropped-out) input before normalizing.
    pub fn residual(self, residual: &'a Tensor<T>) -> Self {
        Norm { residual: Some(residual), ..self }
    }

    /// Drops elements of the input (before the residual is added).
    pub fn dropout(self, dropout: Dropout) -> Self {
        Norm { dropout: Some(dropout), ..self }
    }

    /// Then `y · (1 + scale[g]) + shift[g]`: `scale` and `shift` are `groups × hidden`, the
    /// rows split into `groups` runs of equal length (a batch of sequences, say).
    pub fn modulate(self, scale: &'a Tensor<T>, shift: &'a Tensor<T>) -> Self {
        Norm { modulation: Some((scale, shift)), ..self }
    }

    fn op(&self) -> &'static str {
        match self.kind {
            NormKind::Rms => "Norm::rms",
            NormKind::Layer => "Norm::layer",
        }
    }

    /// The dropout's kernel arguments: `(p, 1 / (1 − p), seed_lo, seed_hi, offset)`.
    fn dropout_args(&self) -> Result<(f32, f32, i32, i32, i32)> {
        let Some(d) = self.dropout else { return Ok((0.0, 1.0, 0, 0, 0)) };
        if !(0.0..1.0).contains(&d.p) {
            return Err(Error::Argument {
                kernel: self.op(),
                arg: "dropout.p".into(),
                expected: "a probability in [0, 1)".into(),
                found: format!("{}", d.p),
            });
        }
        Ok((d.p, 1.0 / (1.0 - d.p), d.seed as u32 as i32, (d.seed >> 32) as u32 as i32, d.offset as i32))
    }

    /// Checks the parameters against `rows × hidden`; gives the rows per modulation group (0
    /// for none).
    fn check(&self, m: usize, n: usize) -> Result<i32> {
        let op = self.op();
        for (name, p) in [("weight", self.weight), ("bias", self.bias)] {
            if let Some(p) = p {
                crate::check_shape(op, name, p, &[n])?;
            }
        }
        if let Some(r) = self.residual {
            crate::check_shape(op, "residual", r, &[m, n])?;
        }
        let Some((scale, shift)) = self.modulation else { return Ok(0) };
        let (g, _) = crate::check_2d(op, "scale", scale)?;
        if g == 0 || !m.is_multiple_of(g) {
            return Err(Error::Argument {
                kernel: op,
                arg: "scale".into(),
                expected: format!("a number of groups that divides the {m} rows"),
                found: format!("shape {:?}", scale.shape()),
            });
        }
        crate::check_shape(op, "scale", scale, &[g, n])?;
        crate::check_shape(op, "shift", shift, &[g, n])?;
        Ok(i32::try_from(m / g).unwrap_or(i32::MAX))
    }

    /// Normalizes `x` into `y`; `h` (if given) receives `dropout(x) + residual`, the input the
    /// norm saw (the next residual, and what [`Norm::backward`] takes).
    ///
    /// # Errors
    /// [`tessera::Error::Argument`] naming the tensor whose shape does not fit (`x`, `y`, `h`,
    /// `weight`, `bias`, `residual`, `scale`, `shift`) or a dropout probability outside
    /// `[0, 1)`; a launch error.
    pub fn forward(&self, device: &Device, x: &Tensor<T>, y: &mut Tensor<T>, h: Option<&mut Tensor<T>>) -> Result<()> {
        let op = self.op();
        let (m, n) = crate::check_2d(op, "x", x)?;
        crate::check_shape(op, "y", y, &[m, n])?;
        if let Some(h) = &h {
            crate::check_shape(op, "h", h, &[m, n])?;
        }
        self.launch_forward(device, x, (m, n), y, &mut OptionalMut(h, 2))
    }

    /// As [`Norm::forward`] with `y` and `h` the two halves of one tensor `yh`, `[2, rows,
    /// hidden]` (`yh[0]` the output, `yh[1]` the input the norm saw): one buffer for a caller
    /// that hands back a single tensor (a candle op, say), written in the same one pass.
    ///
    /// # Errors
    /// As [`Norm::forward`]'s, `yh` named for a shape that is not `[2, rows, hidden]`.
    pub fn forward_stacked(&self, device: &Device, x: &Tensor<T>, yh: &mut Tensor<T>) -> Result<()> {
        let op = self.op();
        let (m, n) = crate::check_2d(op, "x", x)?;
        crate::check_shape(op, "yh", yh, &[2, m, n])?;
        let (mut parts, _guard) = tessera::split_outer(yh, device)?;
        let (y, h) = parts.split_at_mut(1);
        self.launch_forward(device, x, (m, n), &mut y[0], &mut h[0])
    }

    /// [`Norm::forward`]'s launch: `x` checked to be `[m, n]`, `y` and `h` checked to be its shape.
    fn launch_forward(
        &self, device: &Device, x: &Tensor<T>, (m, n): (usize, usize), y: &mut impl GlobalArgMut<T>, h: &mut impl GlobalArgMut<T>,
    ) -> Result<()> {
        let op = self.op();
        crate::check_row_width(op, "x", x, n)?;
        let group_rows = self.check(m, n)?;
        let (p, keep_scale, seed_lo, seed_hi, offset) = self.dropout_args()?;
        if m == 0 || n == 0 {
            return Ok(());
        }
        let specs = fused_specs(T::DTYPE);
        // Four rows per block where they fit (and share their scale and shift row).
        let rows4 = n <= FUSED_ROWS4_MAX && m >= 4 * device.sm_count() as usize && group_rows % 4 == 0;
        let (spec, rows_per_block) = match () {
            _ if rows4 => (specs.rows4[crate::norm::narrowest(specs.rows4, n)], 4),
            _ if n <= FUSED_ROW_IN_REGISTERS => (specs.row[crate::norm::narrowest(specs.row, n)], 1),
            _ => (specs.wide, 1),
        };
        let mut l = Launch::new(spec, device)?;
        let (scale, shift) = (self.modulation.map(|(s, _)| s), self.modulation.map(|(_, s)| s));
        let ins = [Optional(self.residual, 2), Optional(self.weight, 1), Optional(self.bias, 1), Optional(scale, 2), Optional(shift, 2)];
        let _g0 = l.global(0, x)?;
        let _g = ins.iter().enumerate().map(|(i, t)| l.global(1 + i, t)).collect::<Result<Vec<_>>>()?;
        let _g6 = l.global_mut(6, y)?;
        let _g7 = l.global_mut(7, h)?;
        let ahead = crate::norm::prefetch_ahead(device, rows_per_block);
        let scalars: [ScalarArg; 12] = [
            self.eps.into(),
            i32::from(self.kind == NormKind::Layer).into(),
            i32::from(self.weight.is_some()).into(),
            i32::from(self.bias.is_some()).into(),
            i32::from(self.residual.is_some()).into(),
            p.into(),
            keep_scale.into(),
            seed_lo.into(),
            seed_hi.into(),
            offset.into(),
            group_rows.into(),
            ahead.into(),
        ];
        for (i, s) in scalars.into_iter().enumerate() {
            l.scalar(8 + i, s)?;
        }
        l.launch(Grid::from(Grid::tiles(m, rows_per_block)))
    }

    /// The backward pass from the norm's input `h` (`x` itself without dropout or residual,
    /// else the `h` the forward pass returned) and the output's gradient `dy`; `dresidual`
    /// (optional) is the gradient reaching `h` by another path (the residual stream's), added
    /// into `grads.dh`. The dropout mask is the forward pass's (same seed and offset).
    ///
    /// # Errors
    /// [`tessera::Error::Argument`] naming a tensor whose shape does not fit; `grads.dx`
    /// missing under dropout; `grads.dweight` (`dbias`) without a weight (bias); a scale and
    /// shift (their backward pass is not implemented). A launch error.
    pub fn backward(
        &self, device: &Device, h: &Tensor<T>, dy: &Tensor<T>, dresidual: Option<&Tensor<T>>, grads: NormGrads<'_, T>,
    ) -> Result<()> {
        let op = self.op();
        let (m, n) = crate::check_2d(op, "h", h)?;
        crate::check_row_width(op, "h", h, n)?;
        let missing = |arg: &str, expected: &str, found: &str| Error::Argument {
            kernel: op,
            arg: arg.into(),
            expected: expected.into(),
            found: found.into(),
        };
        if self.modulation.is_some() {
            return Err(missing("scale", "no scale and shift: their backward pass is not implemented", "a scale and shift"));
        }
        crate::check_shape(op, "dy", dy, &[m, n])?;
        if let Some(d) = dresidual {
            crate::check_shape(op, "dresidual", d, &[m, n])?;
        }
        self.check(m, n)?;
        crate::check_shape(op, "dh", grads.dh, &[m, n])?;
        match (&grads.dx, self.dropout) {
            (Some(dx), _) => crate::check_shape(op, "dx", dx, &[m, n])?,
            (None, Some(_)) => return Err(missing("dx", "a gradient for `x` under dropout", "none")),
            (None, None) => {}
        }
        for (name, g, p) in [("dweight", &grads.dweight, self.weight), ("dbias", &grads.dbias, self.bias)] {
            match (g, p) {
                (Some(g), Some(_)) => crate::check_shape(op, name, g, &[n])?,
                (Some(_), None) => return Err(missing(name, "a norm with that parameter", "a norm without it")),
                (None, _) => {}
            }
        }
        let (p, keep_scale, seed_lo, seed_hi, offset) = self.dropout_args()?;
        if m == 0 || n == 0 {
            return Ok(());
        }
        let specs = fused_specs(T::DTYPE);
        if let Some(spec) = self.staged_backward(device, &specs, h, dy, dresidual, &grads) {
            return self.backward_staged(device, spec, specs.sum_partials, h, dy, dresidual, grads);
        }
        // Blocks stride over the rows: as many as fit on the GPU at once (ptxas: 96–200
        // registers for the four-row kernel, 96 for the row kernel; 96–128 for the wider rows' tiles to 4096, 154–168 to 6144, 208–255
        // above; 250 for the chunked one), each summing into its own row of partials.
        let rows4 = n <= FUSED_BACKWARD_ROWS4_MAX;
        // The row kernel's widest rows: f32 to 3072 (its 4096 would take 200 registers, two
        // blocks an SM); 16 bits to 4096, and to 5120 (234 registers, two blocks) where no
        // residual gradient or dropout adds loads and stores to a row: with them two blocks an
        // SM lost to the shared-memory sums' three (H200, run 360: plain 5120 0.73 → 0.80× copy,
        // fused 0.72 → 0.69×).
        let wide_elements = T::DTYPE.size() == 4;
        let plain = dresidual.is_none() && p == 0.0;
        let narrow = match () {
            _ if wide_elements => 3072,
            _ if plain => FUSED_BACKWARD_ROW_NARROW,
            _ => 4096,
        };
        let spec = if rows4 {
            specs.backward_rows4[crate::norm::narrowest(specs.backward_rows4, n)]
        } else if n <= narrow {
            // (Tiles of 2304 — runs of 2 columns a thread — only in the plain backward: H200,
            // run 363, plain 0.76 → 0.83× copy, fused 0.65 → 0.46×; the fused takes 3072's.)
            let fit = if plain || n <= 2048 { n } else { n.max(2305) };
            specs.backward_row[crate::norm::narrowest(specs.backward_row, fit)]
        } else if n <= FUSED_BACKWARD_ROW_IN_REGISTERS {
            specs.backward_rows[crate::norm::narrowest(specs.backward_rows, n)]
        } else if n <= FUSED_BACKWARD_ROW_HALVES {
            specs.backward_halves[crate::norm::narrowest(specs.backward_halves, n.div_ceil(2))]
        } else {
            specs.backward_wide
        };
        let per_sm = match n {
            // (Four rows a block: 96–200 registers a thread, three blocks an SM at 1024.)
            _ if rows4 => 3,
            // (The row kernel: 96–128 registers a thread to 3072 columns in 16 bits, four
            // blocks an SM; 158 in f32 past 2048 and 168 at 4096 in 16 bits, three; 234 at
            // 5120, two.)
            _ if n <= 2048 || (n <= 3072 && !wide_elements) => 4,
            _ if n <= narrow && n <= 4096 => 3,
            _ if n <= narrow => 2,
            // (The shared-memory sums' kernel: 128 registers to 4608, four blocks.)
            _ if n <= 4608 => 4,
            _ if n <= 6144 => 3,
            _ if n <= FUSED_BACKWARD_ROW_IN_REGISTERS => 2,
            // (Two warpgroups of half rows to 4096, their sums in 64 KiB: two.)
            _ if n <= 8192 => 2,
            // (Two warpgroups a block, their registers and 128 KiB of sums: one.)
            _ if n <= FUSED_BACKWARD_ROW_HALVES => 1,
            _ => 2,
        };
        // (Four rows a block and four rows of partials for the narrowest rows.)
        let per_block = if rows4 { 4 } else { 1 };
        let blocks = m.div_ceil(per_block).min(per_sm * device.sm_count().max(1) as usize);
        // (Every block writes its whole rows of partials: no clearing.)
        let mut dw_part = Tensor::<f32>::scratch(device, &[blocks * per_block, n])?;
        let mut db_part = Tensor::<f32>::scratch(device, &[blocks * per_block, n])?;
        {
            let mut l = Launch::new(spec, device)?;
            let _g0 = l.global(0, h)?;
            let _g1 = l.global(1, dy)?;
            let ins = [Optional(dresidual, 2), Optional(self.weight, 1)];
            let _g = ins.iter().enumerate().map(|(i, t)| l.global(2 + i, t)).collect::<Result<Vec<_>>>()?;
            let _g4 = l.global_mut(4, grads.dh)?;
            let mut dx = OptionalMut(grads.dx, 2);
            let _g5 = l.global_mut(5, &mut dx)?;
            let _g6 = l.global_mut(6, &mut dw_part)?;
            let _g7 = l.global_mut(7, &mut db_part)?;
            let scalars: [ScalarArg; 9] = [
                self.eps.into(),
                i32::from(self.kind == NormKind::Layer).into(),
                i32::from(self.weight.is_some()).into(),
                i32::from(dresidual.is_some()).into(),
                p.into(),
                keep_scale.into(),
                seed_lo.into(),
                seed_hi.into(),
                offset.into(),
            ];
            for (i, s) in scalars.into_iter().enumerate() {
                l.scalar(8 + i, s)?;
            }
            l.launch(Grid::from(blocks as u32))?;
        }
        sum_partials_into(device, specs.sum_partials, [(&dw_part, grads.dweight), (&db_part, grads.dbias)], n)
    }

    /// The staged backward's variant for these tensors, if it takes them: rows of 2049 to
    /// [`FUSED_BACKWARD_STAGED_MAX`] columns (f32 to 6144), whose halves start on 16 bytes,
    /// contiguous tensors, and a device (or the interpreter) running Hopper's code.
    /// Opt-in for now (`TESSERA_NORM_BACKWARD=staged`) until timed and checked on the GPU.
    fn staged_backward(
        &self, device: &Device, specs: &FusedSpecs, h: &Tensor<T>, dy: &Tensor<T>, dres: Option<&Tensor<T>>, grads: &NormGrads<'_, T>,
    ) -> Option<&'static tessera::KernelSpec> {
        let n = h.shape()[1];
        let es = T::DTYPE.size() as usize;
        let max = if es == 4 { 6144 } else { FUSED_BACKWARD_STAGED_MAX };
        let aligned = |t: &Tensor<T>| t.is_contiguous() && (t.offset() * es).is_multiple_of(16);
        let fits = n > 2048
            && n <= max
            && n.is_multiple_of(2)
            && (n / 2 * es).is_multiple_of(16)
            && [h, dy].into_iter().chain(dres).all(aligned)
            && grads.dh.is_contiguous()
            && grads.dx.as_ref().is_none_or(|d| d.is_contiguous())
            && self.weight.is_none_or(|w| w.is_contiguous())
            && staged_opt_in();
        let spec = specs.backward_staged[crate::norm::narrowest(specs.backward_staged, n)];
        (fits && device.target_for(spec) == Some(tessera::Target::Sm90a)).then_some(spec)
    }

    /// [`Norm::backward`] by `norm_backward_staged` (`spec`), every tensor seen as `[2·rows,
    /// n/2]`, a block an SM; then `sum_partials` for `dweight` and `dbias`.
    #[allow(clippy::too_many_arguments)]
    fn backward_staged(
        &self, device: &Device, spec: &'static tessera::KernelSpec, sum_partials: &'static tessera::KernelSpec, h: &Tensor<T>,
        dy: &Tensor<T>, dres: Option<&Tensor<T>>, grads: NormGrads<'_, T>,
    ) -> Result<()> {
        let (m, n) = (h.shape()[0], h.shape()[1]);
        let halves = [2 * m, n / 2];
        let strides = [n / 2, 1];
        let blocks = m.min(device.sm_count().max(1) as usize);
        let mut dw_part = Tensor::<f32>::scratch(device, &[blocks, n])?;
        let mut db_part = Tensor::<f32>::scratch(device, &[blocks, n])?;
        let (p, keep_scale, seed_lo, seed_hi, offset) = self.dropout_args()?;
        {
            let mut l = Launch::new(spec, device)?;
            let hv = h.view(&halves, &strides)?;
            let dyv = dy.view(&halves, &strides)?;
            // (An absent residual gradient: `dy` stands in, never read — TMA needs a tensor.)
            let dresv = dres.unwrap_or(dy).view(&halves, &strides)?;
            let _g0 = l.global(0, &hv)?;
            let _g1 = l.global(1, &dyv)?;
            let _g2 = l.global(2, &dresv)?;
            let wv = self.weight.map(|w| w.view(&[2, n / 2], &strides)).transpose()?;
            let wo = Optional(wv.as_ref(), 2);
            let _g3 = l.global(3, &wo)?;
            let mut dhv = grads.dh.view_mut(&halves, &strides)?;
            let _g4 = l.global_mut(4, &mut dhv)?;
            let mut dxv = grads.dx.map(|d| d.view_mut(&halves, &strides)).transpose()?;
            let mut dxo = OptionalMut(dxv.as_mut(), 2);
            let _g5 = l.global_mut(5, &mut dxo)?;
            let mut dwv = dw_part.view_mut(&[2 * blocks, n / 2], &strides)?;
            let _g6 = l.global_mut(6, &mut dwv)?;
            let mut dbv = db_part.view_mut(&[2 * blocks, n / 2], &strides)?;
            let _g7 = l.global_mut(7, &mut dbv)?;
            let scalars: [ScalarArg; 9] = [
                self.eps.into(),
                i32::from(self.kind == NormKind::Layer).into(),
                i32::from(self.weight.is_some()).into(),
                i32::from(dres.is_some()).into(),
                p.into(),
                keep_scale.into(),
                seed_lo.into(),
                seed_hi.into(),
                offset.into(),
            ];
            for (i, s) in scalars.into_iter().enumerate() {
                l.scalar(8 + i, s)?;
            }
            l.launch(Grid::from(blocks as u32))?;
        }
        sum_partials_into(device, sum_partials, [(&dw_part, grads.dweight), (&db_part, grads.dbias)], n)
    }
}

/// `dweight` and `dbias` (each if asked) from their blocks' rows of partial sums.
fn sum_partials_into<T: Element>(
    device: &Device, spec: &'static tessera::KernelSpec, parts: [(&Tensor<f32>, Option<&mut Tensor<T>>); 2], n: usize,
) -> Result<()> {
    for (part, out) in parts {
        if let Some(out) = out {
            let mut l = Launch::new(spec, device)?;
            let _g0 = l.global(0, part)?;
            let _g1 = l.global_mut(1, out)?;
            l.launch(Grid::from(Grid::tiles(n, 256)))?;
        }
    }
    Ok(())
}

/// Whether `TESSERA_NORM_BACKWARD=staged` asks for the staged norm backward (read once).
fn staged_opt_in() -> bool {
    static STAGED: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *STAGED.get_or_init(|| std::env::var("TESSERA_NORM_BACKWARD").as_deref() == Ok("staged"))
}
