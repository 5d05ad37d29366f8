//! RMSNorm and LayerNorm over the last dimension.
//!
//! Rows up to [`ROW_PER_BLOCK_MAX`] wide are read once, held in registers: four rows per block
//! (a warp each) up to [`ROW_IN_REGISTERS`], two up to 4096, one past that and wherever the
//! rows are fewer than the blocks the GPU runs at once (see [`NormPath::choose`]); columns past
//! the row's end are loaded as zeros and masked out of the statistics. Each of these kernels
//! has a variant per tile width (`tune(W = [...])`, widths such as 2304 or 5120 that are not
//! powers of two among them), and the host launches the narrowest that holds the row: a
//! tile the row fills leaves no registers idle, so more rows are in flight per SM. Rows up to
//! [`NORM_WIDE_MAX`] are read once too, a row per block of two warpgroups that combine their
//! halves' statistics with `block_sum`. Wider rows take the tiled kernels, which read each row
//! once per pass (from L2 where it is still there).

use crate::prelude::*;
use tessera::{kernel, Device, Element, GlobalArg, Grid, KernelSpec, Optional, Result, Tensor};

/// Rows each block of the tiled kernels normalizes.
const BM: usize = 16;

/// The widest row the four-rows-per-block kernels hold in registers (a warp's row of 2304:
/// 168 registers a thread, three blocks an SM).
pub const ROW_IN_REGISTERS: usize = 2304;

/// The widest row the one-row-per-block kernels hold in registers (a 1×12288 tile: 168
/// registers a thread in bf16, three blocks an SM); wider rows take the two-warpgroup kernels
/// up to [`NORM_WIDE_MAX`], then the tiled ones.
pub const ROW_PER_BLOCK_MAX: usize = 12288;

/// The widest row the norms read once, a row per block of two warpgroups
/// (`rms_norm_wide`, `layer_norm_wide`); wider rows take the tiled kernels.
pub const NORM_WIDE_MAX: usize = 16384;

/// `rms_norm_*` for rows of at most [`ROW_PER_BLOCK_MAX`] elements, one row per block, read
/// once; a variant per tile width `W` (multiples of 1024), the host taking the narrowest that
/// holds the row. The 16-bit tiles from 10240 wide are capped at 168 registers, three blocks
/// an SM (174–188 registers uncapped, two blocks; run 111: 10240 and 11008 wide 0.95 / 0.97 →
/// 0.98 of the copy, with at most 36 bytes of spills).
#[kernel(dtypes(T = [bf16, f16, f32]), tune(W = [8192, 7168, 6144, 5120, 4096, 3072, 2048, 1024, 9216, 10240, 11264, 12288]), blocks_per_sm(W >= 10240, T != f32) = 3)]
pub fn rms_norm_row(x: Global<T, 2>, w: Global<T, 1>, y: Global<T, 2>, eps: f32, has_weight: i32, ahead: i32) {
    let r = block::id_x();
    x.prefetch::<Tile<T, 1, W>>([r + ahead, 0]);
    let t = x.load::<Tile<T, 1, W>>([r, 0]).cast::<f32>();
    let mut o = rms_scale(t, x.dim(1), eps);
    scale_columns(&mut o, w, 0, has_weight);
    y.store([r, 0], o.cast::<T>());
}

/// `rms_norm_*` for rows of at most [`ROW_IN_REGISTERS`] elements: four rows per block, one
/// per warp, so the reductions stay within a warp; a variant per tile width `W` (multiples of
/// 256).
#[kernel(dtypes(T = [bf16, f16, f32]), tune(W = [2048, 1792, 1536, 1280, 1024, 768, 512, 2304]))]
pub fn rms_norm_rows4(x: Global<T, 2>, w: Global<T, 1>, y: Global<T, 2>, eps: f32, has_weight: i32, ahead: i32) {
    let r = block::id_x() * 4;
    x.prefetch::<Tile<T, 4, W>>([r + ahead, 0]);
    let t = x.load::<Tile<T, 4, W>>([r, 0]);
    let f = t.cast::<f32>();
    let inv = rsqrt(row_sum(f * f) * (1.0 / x.dim(1) as f32) + eps);
    let mut o = t.cast::<f32>() * inv;
    scale_columns(&mut o, w, 0, has_weight);
    y.store([r, 0], o.cast::<T>());
}

/// `y = (x − mean) / sqrt(var + eps) · w + b` for rows of at most [`ROW_PER_BLOCK_MAX`]
/// elements, one row per block, read once. The statistics come from one exchange across warps: the sums of
/// `x − k` and of its squares, `k` the row's first element — shifted so that a row far from
/// zero keeps its variance (rows of equal values give exactly 0), clamped at 0. Widths as
/// `rms_norm_row`'s; the 16-bit tiles from 11264 wide are capped at 168 registers, three
/// blocks an SM (the 11264 tile takes 195 uncapped, two blocks; run 110: 11008 wide 0.89 →
/// 0.94 of the copy with 72 bytes of spills). At 10240 no cap: it fits 168 without spills,
/// where the cap's 24 bytes of spills cost 7% (runs 111–112).
#[kernel(dtypes(T = [bf16, f16, f32]), tune(W = [8192, 7168, 6144, 5120, 4096, 3072, 2048, 1024, 9216, 10240, 11264, 12288]), blocks_per_sm(W >= 11264, T != f32) = 3)]
pub fn layer_norm_row(
    x: Global<T, 2>, w: Global<T, 1>, b: Global<T, 1>, y: Global<T, 2>, eps: f32, has_weight: i32, has_bias: i32, ahead: i32,
) {
    let r = block::id_x();
    let n = x.dim(1);
    x.prefetch::<Tile<T, 1, W>>([r + ahead, 0]);
    let t = x.load::<Tile<T, 1, W>>([r, 0]).cast::<f32>();
    let k = x.get([r, 0]);
    let d = (t - k).mask_cols(n, 0.0);
    let s1 = row_sum(d);
    let s2 = row_sum(d * d);
    let dm = s1 * (1.0 / n as f32);
    let var = max(s2 * (1.0 / n as f32) - dm * dm, 0.0);
    // From `d`, not `t`: `t` then dies at the reduction (both live across it held 64 more
    // registers at 8192 wide).
    let mut o = (d - dm) * rsqrt(var + eps);
    // One parameter row at a time: both in flight at once cost 60 registers, a block per SM
    // (run 42: 0.61× copy against 0.79).
    scale_columns(&mut o, w, 0, has_weight);
    shift_columns(&mut o, b, 0, has_bias);
    y.store([r, 0], o.cast::<T>());
}

/// `y = (x − mean) / sqrt(var + eps) · w + b` for rows of at most 2304 elements, four rows
/// per block (one per warp), read once; the variance is the mean of the centred squares
/// (columns past the row masked out), so it is never negative and rows of equal values give
/// the bias. Widths as `rms_norm_rows4`'s.
#[kernel(dtypes(T = [bf16, f16, f32]), tune(W = [2048, 1792, 1536, 1280, 1024, 768, 512, 2304]))]
pub fn layer_norm_rows4(
    x: Global<T, 2>, w: Global<T, 1>, b: Global<T, 1>, y: Global<T, 2>, eps: f32, has_weight: i32, has_bias: i32, ahead: i32,
) {
    let r = block::id_x() * 4;
    let n = x.dim(1);
    x.prefetch::<Tile<T, 4, W>>([r + ahead, 0]);
    let t = x.load::<Tile<T, 4, W>>([r, 0]);
    let mean = row_sum(t.cast::<f32>()) * (1.0 / n as f32);
    let d = (t.cast::<f32>() - mean).mask_cols(n, 0.0);
    let mut o = d * rsqrt(row_sum(d * d) * (1.0 / n as f32) + eps);
    scale_columns(&mut o, w, 0, has_weight);
    shift_columns(&mut o, b, 0, has_bias);
    y.store([r, 0], o.cast::<T>());
}

/// `rms_norm_*` for rows of 2305..=2560 and 3073..=3584 elements: two rows per block, two
/// warps per row, in a tile of 2560 or 3584 columns — fuller than a row per block's (a
/// multiple of 1024), which takes the other widths up to 4096.
#[kernel(dtypes(T = [bf16, f16, f32]), tune(W = [3584, 2560]))]
pub fn rms_norm_rows2(x: Global<T, 2>, w: Global<T, 1>, y: Global<T, 2>, eps: f32, has_weight: i32, ahead: i32) {
    let r = block::id_x() * 2;
    x.prefetch::<Tile<T, 2, W>>([r + ahead, 0]);
    let t = x.load::<Tile<T, 2, W>>([r, 0]).cast::<f32>();
    let mut o = rms_scale(t, x.dim(1), eps);
    scale_columns(&mut o, w, 0, has_weight);
    y.store([r, 0], o.cast::<T>());
}

/// `layer_norm_*` for the widths of `rms_norm_rows2`: two rows per block, two warps per row;
/// the variance is the mean of the centred squares (columns past the row masked out).
#[kernel(dtypes(T = [bf16, f16, f32]), tune(W = [3584, 2560]))]
pub fn layer_norm_rows2(
    x: Global<T, 2>, w: Global<T, 1>, b: Global<T, 1>, y: Global<T, 2>, eps: f32, has_weight: i32, has_bias: i32, ahead: i32,
) {
    let r = block::id_x() * 2;
    let n = x.dim(1);
    x.prefetch::<Tile<T, 2, W>>([r + ahead, 0]);
    let t = x.load::<Tile<T, 2, W>>([r, 0]).cast::<f32>();
    let mut o = layer_scale(t, n, eps);
    scale_columns(&mut o, w, 0, has_weight);
    shift_columns(&mut o, b, 0, has_bias);
    y.store([r, 0], o.cast::<T>());
}

/// `rms_norm_*` for rows of 12289..=[`NORM_WIDE_MAX`] elements, read once: a row per block
/// of two warpgroups, each holding half of it (a 1×8192 tile each: one 1×16384 tile takes 255
/// registers and spills), the sum of squares combined across them with `block_sum`.
#[kernel(dtypes(T = [bf16, f16, f32]), warpgroups = 2)]
pub fn rms_norm_wide(x: Global<T, 2>, w: Global<T, 1>, y: Global<T, 2>, eps: f32, has_weight: i32, ahead: i32) {
    let r = block::id_x();
    let c = warpgroup::id() * 8192;
    x.prefetch::<Tile<T, 1, 8192>>([r + ahead, c]);
    let t = x.load::<Tile<T, 1, 8192>>([r, c]).cast::<f32>();
    let ss = block_sum(row_sum(t * t));
    let mut o = t * rsqrt(ss * (1.0 / x.dim(1) as f32) + eps);
    scale_columns(&mut o, w, c, has_weight);
    y.store([r, c], o.cast::<T>());
}

/// `layer_norm_*` for the widths of `rms_norm_wide`: a row per block of two warpgroups, the
/// shifted sums of `layer_norm_row` each combined across them with `block_sum`.
#[kernel(dtypes(T = [bf16, f16, f32]), warpgroups = 2)]
pub fn layer_norm_wide(
    x: Global<T, 2>, w: Global<T, 1>, b: Global<T, 1>, y: Global<T, 2>, eps: f32, has_weight: i32, has_bias: i32, ahead: i32,
) {
    let r = block::id_x();
    let c = warpgroup::id() * 8192;
    let n = x.dim(1);
    x.prefetch::<Tile<T, 1, 8192>>([r + ahead, c]);
    let t = x.load::<Tile<T, 1, 8192>>([r, c]).cast::<f32>();
    let k = x.get([r, 0]);
    let d = (t - k).mask_cols(n - c, 0.0);
    let p1 = row_sum(d);
    let p2 = row_sum(d * d);
    let s1 = block_sum(p1);
    let s2 = block_sum(p2);
    let dm = s1 * (1.0 / n as f32);
    let var = max(s2 * (1.0 / n as f32) - dm * dm, 0.0);
    let mut o = (d - dm) * rsqrt(var + eps);
    scale_columns(&mut o, w, c, has_weight);
    shift_columns(&mut o, b, c, has_bias);
    y.store([r, c], o.cast::<T>());
}

/// LayerNorm for any row width in three passes over 16-row blocks: the mean, the centred
/// squares (masked past the row), then the output.
#[kernel(dtypes(T = [bf16, f16, f32]))]
pub fn layer_norm(
    x: Global<T, 2>, w: Global<T, 1>, b: Global<T, 1>, y: Global<T, 2>, eps: f32, has_weight: i32, has_bias: i32, ahead: i32,
) {
    let r = block::id_x() * 16;
    let n = x.dim(1);
    let mut s = Tile::<f32, 16, 256>::zeros();
    for c in (0..n).step_by(256) {
        x.prefetch::<Tile<T, 16, 256>>([r + ahead, c]);
        s = s + x.load::<Tile<T, 16, 256>>([r, c]).cast::<f32>();
    }
    let mean = row_sum(s) * (1.0 / n as f32);
    let mut ss = Tile::<f32, 16, 256>::zeros();
    for c in (0..n).step_by(256) {
        let d = (x.load::<Tile<T, 16, 256>>([r, c]).cast::<f32>() - mean).mask_cols(n - c, 0.0);
        ss = ss + d * d;
    }
    let rstd = rsqrt(row_sum(ss) * (1.0 / n as f32) + eps);
    for c in (0..n).step_by(256) {
        let mut o = (x.load::<Tile<T, 16, 256>>([r, c]).cast::<f32>() - mean) * rstd;
        scale_columns(&mut o, w, c, has_weight);
        shift_columns(&mut o, b, c, has_bias);
        y.store([r, c], o.cast::<T>());
    }
}

/// `y = x / sqrt(mean(x²) + eps) · w`, per row, with f32 statistics.
///
/// Any row width. Pass 1 accumulates `x²` in a 16×256 f32 tile over the columns and reduces
/// it once per row; pass 2 reads the rows again and scales them. `has_weight` 0 skips `w`
/// (then any rank-1 tensor).
#[kernel(dtypes(T = [bf16, f16, f32]))]
pub fn rms_norm(x: Global<T, 2>, w: Global<T, 1>, y: Global<T, 2>, eps: f32, has_weight: i32, ahead: i32) {
    let r = block::id_x() * 16;
    let n = x.dim(1);
    let mut ss = Tile::<f32, 16, 256>::zeros();
    for c in (0..n).step_by(256) {
        x.prefetch::<Tile<T, 16, 256>>([r + ahead, c]);
        let t = x.load::<Tile<T, 16, 256>>([r, c]).cast::<f32>();
        ss = ss + t * t;
    }
    let inv = rsqrt(row_sum(ss) * (1.0 / n as f32) + eps);
    for c in (0..n).step_by(256) {
        let mut o = x.load::<Tile<T, 16, 256>>([r, c]).cast::<f32>() * inv;
        scale_columns(&mut o, w, c, has_weight);
        y.store([r, c], o.cast::<T>());
    }
}

/// Element types the norms take: bf16, f16, f32 (statistics in f32 for all).
pub trait NormElement: Element {
    #[doc(hidden)]
    fn rms_norm_launch(
        dev: &Device, path: NormPath, x: &Tensor<Self>, w: &impl GlobalArg<Self>, y: &mut Tensor<Self>, eps: f32, has_w: i32,
    ) -> Result<()>;
    #[doc(hidden)]
    #[allow(clippy::too_many_arguments)]
    fn layer_norm_launch(
        dev: &Device, path: NormPath, x: &Tensor<Self>, w: &impl GlobalArg<Self>, b: &impl GlobalArg<Self>, y: &mut Tensor<Self>, eps: f32,
        flags: (i32, i32),
    ) -> Result<()>;
}

/// Which kernel normalizes rows of a given width.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[doc(hidden)]
pub enum NormPath {
    /// Four rows per block, read once (hidden 257..=[`ROW_IN_REGISTERS`]).
    Rows4,
    /// Two rows per block, read once (hidden 2305..=2560 and 3073..=3584; softmax takes `Row`
    /// here).
    Rows2,
    /// One row per block, read once (hidden ≤ [`ROW_PER_BLOCK_MAX`]): for few rows, and rows
    /// wider than 4096.
    Row,
    /// One row per block of two warpgroups, read once (hidden
    /// [`ROW_PER_BLOCK_MAX`]+1..=[`NORM_WIDE_MAX`]; softmax takes `Row` forward, `Tiled`
    /// backward).
    Wide,
    /// 16 rows per block, a pass over the columns per statistic (any width).
    Tiled,
}

impl NormPath {
    /// The path for `m` rows of `n` elements on a device of `sms` SMs (runs 36, 42, 70): a
    /// block per row for fewer rows than blocks the GPU runs at once, and for rows of
    /// 4097..=[`ROW_PER_BLOCK_MAX`]; four rows per block for 257..=[`ROW_IN_REGISTERS`]; two
    /// for the rest up to 4096 (one where a row's tile is as full as two rows'); else the
    /// tiled kernels. `TESSERA_NORM_PATH=rows4|rows2|row|tiled` overrides it where the kernel can
    /// take the width (for benchmarking the alternatives; `wide` takes any width to
    /// [`NORM_WIDE_MAX`]).
    pub fn choose(m: usize, n: usize, sms: usize) -> NormPath {
        let forced = match std::env::var("TESSERA_NORM_PATH").as_deref() {
            Ok("rows4") if n <= ROW_IN_REGISTERS => Some(NormPath::Rows4),
            Ok("rows2") if n <= 3584 => Some(NormPath::Rows2),
            Ok("row") if n <= ROW_PER_BLOCK_MAX => Some(NormPath::Row),
            Ok("wide") if n <= NORM_WIDE_MAX => Some(NormPath::Wide),
            Ok("tiled") => Some(NormPath::Tiled),
            _ => None,
        };
        // 2049..=4096 wide: a row per block where its tile (a multiple of 1024) is as full as
        // two rows' (multiples of 512): run 70, LayerNorm 0.95 against 0.90–0.92 at 3072 and
        // 4096; two rows where theirs is fuller (0.87 against 0.70 at 2304).
        let row_full = n.div_ceil(1024) * 1024 == n.div_ceil(512) * 512;
        forced.unwrap_or(if n <= ROW_PER_BLOCK_MAX && (m <= 4 * sms || n > 4096 || (n > ROW_IN_REGISTERS && row_full)) {
            NormPath::Row
        } else if n <= 4096 && n > ROW_IN_REGISTERS {
            NormPath::Rows2
        } else if n <= ROW_IN_REGISTERS && n > 256 {
            NormPath::Rows4
        } else if n > ROW_PER_BLOCK_MAX && n <= NORM_WIDE_MAX {
            NormPath::Wide
        } else {
            NormPath::Tiled
        })
    }

    /// Rows each block of this path normalizes.
    pub(crate) fn rows_per_block(self) -> usize {
        match self {
            NormPath::Rows4 => 4,
            NormPath::Rows2 => 2,
            NormPath::Row | NormPath::Wide => 1,
            NormPath::Tiled => BM,
        }
    }

    pub(crate) fn grid(self, rows: usize) -> Grid {
        Grid::from(Grid::tiles(rows, self.rows_per_block()))
    }

    /// How far ahead this path's blocks prefetch: see [`prefetch_ahead`].
    pub(crate) fn ahead(self, dev: &Device) -> i32 {
        prefetch_ahead(dev, self.rows_per_block())
    }
}

/// How many rows ahead a norm kernel prefetches into L2: the rows the block one per SM further
/// will read (run 66: row-per-block LayerNorm 0.79 → 0.90 of copy at 16384×8192; three times as
/// far gave the same, six times lost).
pub(crate) fn prefetch_ahead(dev: &Device, rows_per_block: usize) -> i32 {
    i32::try_from(dev.sm_count() as usize * rows_per_block).unwrap_or(i32::MAX)
}

/// The index in `variants` (a kernel's `tune(W = [...])` variants) of the narrowest whose tile
/// width `W` holds `n` columns, else of the widest. A row that fills its tile keeps more rows
/// in flight per SM: at 32768×4096, a half-empty 8192-wide tile read 0.61× a copy's bandwidth
/// where a full 4096-wide one read 0.92× (run 43).
pub(crate) fn narrowest(variants: &[&KernelSpec], n: usize) -> usize {
    let width = |i: usize| variants[i].knob("W").and_then(|w| usize::try_from(w).ok()).unwrap_or(usize::MAX);
    let fits = (0..variants.len()).filter(|&i| width(i) >= n);
    fits.min_by_key(|&i| width(i)).unwrap_or_else(|| (0..variants.len()).max_by_key(|&i| width(i)).unwrap_or(0))
}

macro_rules! norm_element {
    ($t:ty, $rms4:ident, $rms2:ident, $rms_row:ident, $rms:ident, $rms_wide:ident, $ln4:ident, $ln2:ident, $ln_row:ident, $ln:ident, $ln_wide:ident) => {
        impl NormElement for $t {
            fn rms_norm_launch(
                dev: &Device, path: NormPath, x: &Tensor<Self>, w: &impl GlobalArg<Self>, y: &mut Tensor<Self>, eps: f32, has_w: i32,
            ) -> Result<()> {
                let (g, ahead, n) = (path.grid(x.shape()[0]), path.ahead(dev), x.shape()[1]);
                match path {
                    NormPath::Rows4 => $rms4::launch_variant(narrowest($rms4::VARIANTS, n), dev, g, x, w, y, eps, has_w, ahead),
                    NormPath::Rows2 => $rms2::launch_variant(narrowest($rms2::VARIANTS, n), dev, g, x, w, y, eps, has_w, ahead),
                    NormPath::Row => $rms_row::launch_variant(narrowest($rms_row::VARIANTS, n), dev, g, x, w, y, eps, has_w, ahead),
                    NormPath::Wide => $rms_wide::launch(dev, g, x, w, y, eps, has_w, ahead),
                    NormPath::Tiled => $rms::launch(dev, g, x, w, y, eps, has_w, ahead),
                }
            }
            fn layer_norm_launch(
                dev: &Device, path: NormPath, x: &Tensor<Self>, w: &impl GlobalArg<Self>, b: &impl GlobalArg<Self>, y: &mut Tensor<Self>,
                eps: f32, (has_w, has_b): (i32, i32),
            ) -> Result<()> {
                let (g, ahead, n) = (path.grid(x.shape()[0]), path.ahead(dev), x.shape()[1]);
                match path {
                    NormPath::Rows4 => $ln4::launch_variant(narrowest($ln4::VARIANTS, n), dev, g, x, w, b, y, eps, has_w, has_b, ahead),
                    NormPath::Rows2 => $ln2::launch_variant(narrowest($ln2::VARIANTS, n), dev, g, x, w, b, y, eps, has_w, has_b, ahead),
                    NormPath::Row => $ln_row::launch_variant(narrowest($ln_row::VARIANTS, n), dev, g, x, w, b, y, eps, has_w, has_b, ahead),
                    NormPath::Wide => $ln_wide::launch(dev, g, x, w, b, y, eps, has_w, has_b, ahead),
                    NormPath::Tiled => $ln::launch(dev, g, x, w, b, y, eps, has_w, has_b, ahead),
                }
            }
        }
    };
}
norm_element!(
    tessera::bf16,
    rms_norm_rows4_bf16,
    rms_norm_rows2_bf16,
    rms_norm_row_bf16,
    rms_norm_bf16,
    rms_norm_wide_bf16,
    layer_norm_rows4_bf16,
    layer_norm_rows2_bf16,
    layer_norm_row_bf16,
    layer_norm_bf16,
    layer_norm_wide_bf16
);
norm_element!(
    tessera::f16,
    rms_norm_rows4_f16,
    rms_norm_rows2_f16,
    rms_norm_row_f16,
    rms_norm_f16,
    rms_norm_wide_f16,
    layer_norm_rows4_f16,
    layer_norm_rows2_f16,
    layer_norm_row_f16,
    layer_norm_f16,
    layer_norm_wide_f16
);
norm_element!(
    f32,
    rms_norm_rows4_f32,
    rms_norm_rows2_f32,
    rms_norm_row_f32,
    rms_norm_f32,
    rms_norm_wide_f32,
    layer_norm_rows4_f32,
    layer_norm_rows2_f32,
    layer_norm_row_f32,
    layer_norm_f32,
    layer_norm_wide_f32
);

/// Checks `x`, `y` and the optional `[hidden]` parameters; gives `(rows, hidden)`.
fn check_norm<T: Element>(
    op: &'static str, x: &Tensor<T>, y: &Tensor<T>, params: [(&'static str, Option<&Tensor<T>>); 2],
) -> Result<(usize, usize)> {
    let (m, n) = crate::check_2d(op, "x", x)?;
    crate::check_shape(op, "y", y, &[m, n])?;
    for (name, p) in params {
        if let Some(p) = p {
            crate::check_shape(op, name, p, &[n])?;
        }
    }
    Ok((m, n))
}

/// `y[i, :] = x[i, :] / sqrt(mean(x[i, :]²) + eps) · weight` for a 2-D `x` (any rows, any
/// hidden size), with f32 statistics; `weight` of shape `[hidden]`, or `None` for none.
/// Rows of up to [`ROW_PER_BLOCK_MAX`] elements are read from memory once.
///
/// ```no_run
/// # use tessera::{Device, Tensor, bf16};
/// let dev = Device::gpu_or_cpu();
/// let x = Tensor::from_host(&dev, &vec![bf16::ONE; 4 * 4096], &[4, 4096])?;
/// let w = Tensor::from_host(&dev, &vec![bf16::ONE; 4096], &[4096])?;
/// let mut y = Tensor::<bf16>::zeros(&dev, &[4, 4096])?;
/// tessera_kernels::rms_norm(&dev, &x, Some(&w), 1e-6, &mut y)?;
/// # Ok::<(), tessera::Error>(())
/// ```
///
/// # Errors
/// [`tessera::Error::Argument`] naming `x`, `weight` or `y` if a shape does not fit, or a
/// launch error.
pub fn rms_norm<T: NormElement>(device: &Device, x: &Tensor<T>, weight: Option<&Tensor<T>>, eps: f32, y: &mut Tensor<T>) -> Result<()> {
    let (m, n) = check_norm("rms_norm", x, y, [("weight", weight), ("weight", None)])?;
    crate::check_row_width("rms_norm", "x", x, n)?;
    if m == 0 {
        return Ok(());
    }
    let row = NormPath::choose(m, n, device.sm_count() as usize);
    T::rms_norm_launch(device, row, x, &Optional(weight, 1), y, eps, i32::from(weight.is_some()))
}

/// `y[i, :] = (x[i, :] − mean) / sqrt(var + eps) · weight + bias` per row of a 2-D `x` (any
/// rows, any hidden size), with f32 statistics (the biased variance, as PyTorch's
/// `layer_norm`); `weight` and `bias` of shape `[hidden]`, each optional. Rows of up to
/// [`ROW_PER_BLOCK_MAX`] elements are read from memory once.
///
/// # Errors
/// [`tessera::Error::Argument`] naming `x`, `weight`, `bias` or `y` if a shape does not fit,
/// or a launch error.
pub fn layer_norm<T: NormElement>(
    device: &Device, x: &Tensor<T>, weight: Option<&Tensor<T>>, bias: Option<&Tensor<T>>, eps: f32, y: &mut Tensor<T>,
) -> Result<()> {
    let (m, n) = check_norm("layer_norm", x, y, [("weight", weight), ("bias", bias)])?;
    crate::check_row_width("layer_norm", "x", x, n)?;
    if m == 0 {
        return Ok(());
    }
    let row = NormPath::choose(m, n, device.sm_count() as usize);
    let flags = (i32::from(weight.is_some()), i32::from(bias.is_some()));
    T::layer_norm_launch(device, row, x, &Optional(weight, 1), &Optional(bias, 1), y, eps, flags)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_narrowest_tile_that_holds_the_row() {
        let width = |n| rms_norm_row_bf16::VARIANTS[narrowest(rms_norm_row_bf16::VARIANTS, n)].knob("W");
        assert_eq!(width(1), Some(1024));
        assert_eq!(width(1024), Some(1024));
        assert_eq!(width(1025), Some(2048));
        assert_eq!(width(5000), Some(5120));
        assert_eq!(width(8192), Some(8192));
        assert_eq!(width(9000), Some(9216));
        assert_eq!(width(10000), Some(10240));
        assert_eq!(width(11008), Some(11264));
        // Wider than every tile (never asked by the host): the widest.
        assert_eq!(width(20000), Some(12288));
        let width = |n| layer_norm_rows2_f32::VARIANTS[narrowest(layer_norm_rows2_f32::VARIANTS, n)].knob("W");
        assert_eq!((width(2304), width(3001)), (Some(2560), Some(3584)));
    }
}
