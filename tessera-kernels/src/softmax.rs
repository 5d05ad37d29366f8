//! Row softmax, forward and backward, with a scale and a causal mask.
//!
//! The same three shapes of kernel as the norms (see [`crate::NormPath`]): a block per row of
//! up to [`crate::ROW_PER_BLOCK_MAX`] elements ([`SOFTMAX_ROW_MAX`] forward) and four rows per block of up to 2048 read each
//! row once and keep it in registers (a variant per tile width, the narrowest that holds the
//! row launched); the tiled kernels take any width in two passes (an online maximum and sum,
//! then the output). Each row's maximum is taken of `x` itself and subtracted before the
//! scale (`exp2((x − max)·scale·log2 e)`): the difference is exact for logits near the
//! maximum, however large (±1e4), where scaling first would round them.
//!
//! The causal mask keeps column `j` of row `i` where `j ≤ i mod period`: `period` is the rows
//! of one matrix (a 3-D input's middle axis), so a batch of attention-score matrices masks
//! each from its own first row.

use crate::norm::{narrowest, NormPath};
use tessera::{kernel, Device, Element, GlobalArg, GlobalArgMut, Result, Tensor};

/// The widest row softmax's four-rows-per-block kernels take (a 4×2304 f32 tile spills on
/// sm_80): rows of 2049..=2304, which the norms take four at a time, take a block each here.
const ROWS4_MAX: usize = 2048;

/// The widest row softmax's forward reads once, a block per row: 16384, past the norms'
/// [`crate::ROW_PER_BLOCK_MAX`] (softmax holds one tile, not a tile and its parameters: a
/// 1×16384 bf16 tile takes 164 registers, no spills).
pub const SOFTMAX_ROW_MAX: usize = 16384;

/// `softmax_*` for rows of at most [`crate::ROW_PER_BLOCK_MAX`] elements: one row per block,
/// read once; a variant per tile width `W`, the host taking the narrowest that holds the row
/// (as the norms').
#[kernel(dtypes(T = [bf16, f16, f32]), tune(W = [8192, 7168, 6144, 5120, 4096, 3072, 2048, 1024, 11264, 12288, 16384]))]
pub fn softmax_row(x: Global<T, 2>, y: Global<T, 2>, scale: f32, causal: i32, period: i32, ahead: i32) {
    let r = block::id_x();
    x.prefetch::<Tile<T, 1, W>>([r + ahead, 0]);
    let mut limit = x.dim(1);
    if causal == 1 {
        limit = min(limit, r % period + 1);
    }
    let t = x.load::<Tile<T, 1, W>>([r, 0]).cast::<f32>().mask_cols(limit, f32::NEG_INFINITY);
    // A row of −∞ only (every element masked) has no maximum to subtract: `f32::MIN` in its
    // place gives exp2(−∞) = 0 throughout, and 1e-30 added to the sum (nothing to a sum ≥ 1)
    // keeps 0 · (1/0) from making NaN of it: such a row's softmax is 0. Added, not a `max`,
    // which would drop a NaN sum and leave the NaN's row finite.
    let e = exp2((t - max(row_max(t), f32::MIN)) * (scale * f32::consts::LOG2_E));
    y.store([r, 0], (e * (1.0 / (row_sum(e) + 1e-30))).cast::<T>());
}

/// `softmax_*` for rows of at most 2048 elements: four rows per block, one per warp. Each
/// row's limit is `min(n, i mod period + 1 + open)`, `open` 0 when causal and 2²⁴ when not
/// (rows below 2²⁴, so the f32 arithmetic is exact). Tile widths `W` as the norms'.
#[kernel(dtypes(T = [bf16, f16, f32]), tune(W = [2048, 1792, 1536, 1280, 1024, 768, 512]))]
pub fn softmax_rows4(x: Global<T, 2>, y: Global<T, 2>, scale: f32, causal: i32, period: i32, ahead: i32) {
    let r = block::id_x() * 4;
    x.prefetch::<Tile<T, 4, W>>([r + ahead, 0]);
    let n = x.dim(1) as f32;
    let p = period as f32;
    let open = (1 - causal) as f32 * 16777216.0;
    // Each row's index mod `period`, exactly and without a division (an IEEE division is a
    // subroutine call on some targets, which saves the live registers: sm_80 spilled the
    // loaded rows around it): `r mod period` plus 0..3, less `period` while it reaches it
    // (three times at most, as the rows sit below `period + 3 ≤ 4·period`).
    let mut i = Tile::<f32, 4, 1>::row_index() + (r % period) as f32;
    i = i - step(i - p) * p;
    i = i - step(i - p) * p;
    i = i - step(i - p) * p;
    let t = x.load::<Tile<T, 4, W>>([r, 0]).cast::<f32>().mask_cols(min(i + (1.0 + open), n), f32::NEG_INFINITY);
    // A row of −∞ only (every element masked) has no maximum to subtract: `f32::MIN` in its
    // place gives exp2(−∞) = 0 throughout, and 1e-30 added to the sum (nothing to a sum ≥ 1)
    // keeps 0 · (1/0) from making NaN of it: such a row's softmax is 0. Added, not a `max`,
    // which would drop a NaN sum and leave the NaN's row finite.
    let e = exp2((t - max(row_max(t), f32::MIN)) * (scale * f32::consts::LOG2_E));
    y.store([r, 0], (e * (1.0 / (row_sum(e) + 1e-30))).cast::<T>());
}

/// Softmax of any width, 16 rows per block in two passes over 256-column tiles: an online
/// maximum `m` and sum `s` per element (rescaling `s` when `m` grows), then the output. `m`
/// starts at `f32::MIN`, not −∞, so that a column no row reaches gives `exp2(0)·0`.
#[kernel(dtypes(T = [bf16, f16, f32]))]
pub fn softmax(x: Global<T, 2>, y: Global<T, 2>, scale: f32, causal: i32, period: i32, ahead: i32) {
    let r = block::id_x() * 16;
    let n = x.dim(1);
    let k = scale * f32::consts::LOG2_E;
    let p = period as f32;
    let open = (1 - causal) as f32 * 16777216.0;
    let mut m = Tile::<f32, 16, 256>::full(f32::MIN);
    let mut s = Tile::<f32, 16, 256>::zeros();
    for c in (0..n).step_by(256) {
        let i = Tile::<f32, 16, 1>::row_index() + r as f32;
        let t = x
            .load::<Tile<T, 16, 256>>([r, c])
            .cast::<f32>()
            .mask_cols(min(i - floor(i / p) * p + (1.0 + open), n as f32) - c as f32, f32::NEG_INFINITY);
        let m_new = max(m, t);
        s = s * exp2((m - m_new) * k) + exp2((t - m_new) * k);
        m = m_new;
    }
    let row_m = row_max(m);
    // A row of −∞ only sums 0 (`m` stays `f32::MIN`): its softmax is 0, not 0 · (1/0).
    let inv = 1.0 / (row_sum(s * exp2((m - row_m) * k)) + 1e-30);
    // The later block's rows are prefetched in the second pass, where registers are free (in
    // the first, its addresses cost sm_80 a spill).
    for c in (0..n).step_by(256) {
        x.prefetch::<Tile<T, 16, 256>>([r + ahead, c]);
        let i = Tile::<f32, 16, 1>::row_index() + r as f32;
        let t = x
            .load::<Tile<T, 16, 256>>([r, c])
            .cast::<f32>()
            .mask_cols(min(i - floor(i / p) * p + (1.0 + open), n as f32) - c as f32, f32::NEG_INFINITY);
        y.store([r, c], (exp2((t - row_m) * k) * inv).cast::<T>());
    }
}

/// The backward pass for rows of at most [`crate::ROW_PER_BLOCK_MAX`] elements, a row per block:
/// `dx = scale · y ⊙ (dy − Σ dy ⊙ y)`. Tile widths `W` as the forward's.
#[kernel(dtypes(T = [bf16, f16, f32]), tune(W = [8192, 7168, 6144, 5120, 4096, 3072, 2048, 1024, 11264, 12288]))]
pub fn softmax_backward_row(y: Global<T, 2>, dy: Global<T, 2>, dx: Global<T, 2>, scale: f32) {
    let r = block::id_x();
    let yt = y.load::<Tile<T, 1, W>>([r, 0]).cast::<f32>();
    let g = dy.load::<Tile<T, 1, W>>([r, 0]).cast::<f32>();
    let dot = row_sum(yt * g);
    dx.store([r, 0], ((g - dot) * yt * scale).cast::<T>());
}

/// The backward pass for rows of at most 2048 elements, four rows per block (one per warp).
/// Tile widths `W` as the forward's.
#[kernel(dtypes(T = [bf16, f16, f32]), tune(W = [2048, 1792, 1536, 1280, 1024, 768, 512]))]
pub fn softmax_backward_rows4(y: Global<T, 2>, dy: Global<T, 2>, dx: Global<T, 2>, scale: f32) {
    let r = block::id_x() * 4;
    let yt = y.load::<Tile<T, 4, W>>([r, 0]).cast::<f32>();
    let g = dy.load::<Tile<T, 4, W>>([r, 0]).cast::<f32>();
    let dot = row_sum(yt * g);
    dx.store([r, 0], ((g - dot) * yt * scale).cast::<T>());
}

/// The backward pass for any width, 16 rows per block: `Σ dy ⊙ y` in one pass, `dx` in a
/// second.
#[kernel(dtypes(T = [bf16, f16, f32]))]
pub fn softmax_backward(y: Global<T, 2>, dy: Global<T, 2>, dx: Global<T, 2>, scale: f32) {
    let r = block::id_x() * 16;
    let n = y.dim(1);
    let mut acc = Tile::<f32, 16, 256>::zeros();
    for c in (0..n).step_by(256) {
        acc = acc + y.load::<Tile<T, 16, 256>>([r, c]).cast::<f32>() * dy.load::<Tile<T, 16, 256>>([r, c]).cast::<f32>();
    }
    let dot = row_sum(acc);
    for c in (0..n).step_by(256) {
        let g = dy.load::<Tile<T, 16, 256>>([r, c]).cast::<f32>();
        dx.store([r, c], ((g - dot) * y.load::<Tile<T, 16, 256>>([r, c]).cast::<f32>() * scale).cast::<T>());
    }
}

/// Options of [`softmax_with`]: `y = softmax(scale · x)` (`scale` positive), with columns past
/// the diagonal masked out when `causal`.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct SoftmaxOptions {
    /// Multiplies the logits before the exponential.
    pub scale: f32,
    /// Keeps column `j` of row `i` of each matrix only where `j ≤ i` (masked entries give 0).
    pub causal: bool,
}

impl Default for SoftmaxOptions {
    fn default() -> Self {
        SoftmaxOptions { scale: 1.0, causal: false }
    }
}

/// Element types softmax takes: bf16, f16, f32 (arithmetic in f32).
pub trait SoftmaxElement: Element {
    #[doc(hidden)]
    #[allow(clippy::too_many_arguments)]
    fn softmax_launch(
        dev: &Device, path: NormPath, rows: (usize, usize), x: &impl GlobalArg<Self>, y: &mut impl GlobalArgMut<Self>, o: SoftmaxOptions,
        period: i32,
    ) -> Result<()>;
    #[doc(hidden)]
    #[allow(clippy::too_many_arguments)]
    fn softmax_backward_launch(
        dev: &Device, path: NormPath, rows: (usize, usize), y: &impl GlobalArg<Self>, dy: &impl GlobalArg<Self>,
        dx: &mut impl GlobalArgMut<Self>, scale: f32,
    ) -> Result<()>;
}

macro_rules! softmax_element {
    ($t:ty, $row:ident, $rows4:ident, $tiled:ident, $bwd_row:ident, $bwd4:ident, $bwd:ident) => {
        impl SoftmaxElement for $t {
            fn softmax_launch(
                dev: &Device, path: NormPath, (m, n): (usize, usize), x: &impl GlobalArg<Self>, y: &mut impl GlobalArgMut<Self>,
                o: SoftmaxOptions, period: i32,
            ) -> Result<()> {
                let (g, causal) = (path.grid(m), i32::from(o.causal));
                match path {
                    NormPath::Rows4 if n <= ROWS4_MAX => {
                        let w = narrowest($rows4::VARIANTS, n);
                        $rows4::launch_variant(w, dev, g, x, y, o.scale, causal, period, path.ahead(dev))
                    }
                    NormPath::Tiled => $tiled::launch(dev, g, x, y, o.scale, causal, period, path.ahead(dev)),
                    NormPath::Row | NormPath::Rows2 | NormPath::Rows4 | NormPath::Wide => {
                        let ahead = NormPath::Row.ahead(dev);
                        let w = narrowest($row::VARIANTS, n);
                        $row::launch_variant(w, dev, NormPath::Row.grid(m), x, y, o.scale, causal, period, ahead)
                    }
                }
            }
            fn softmax_backward_launch(
                dev: &Device, path: NormPath, (m, n): (usize, usize), y: &impl GlobalArg<Self>, dy: &impl GlobalArg<Self>,
                dx: &mut impl GlobalArgMut<Self>, scale: f32,
            ) -> Result<()> {
                match path {
                    NormPath::Rows4 if n <= ROWS4_MAX => {
                        $bwd4::launch_variant(narrowest($bwd4::VARIANTS, n), dev, path.grid(m), y, dy, dx, scale)
                    }
                    NormPath::Tiled => $bwd::launch(dev, path.grid(m), y, dy, dx, scale),
                    NormPath::Row | NormPath::Rows2 | NormPath::Rows4 | NormPath::Wide => {
                        $bwd_row::launch_variant(narrowest($bwd_row::VARIANTS, n), dev, NormPath::Row.grid(m), y, dy, dx, scale)
                    }
                }
            }
        }
    };
}
softmax_element!(
    tessera::bf16,
    softmax_row_bf16,
    softmax_rows4_bf16,
    softmax_bf16,
    softmax_backward_row_bf16,
    softmax_backward_rows4_bf16,
    softmax_backward_bf16
);
softmax_element!(
    tessera::f16,
    softmax_row_f16,
    softmax_rows4_f16,
    softmax_f16,
    softmax_backward_row_f16,
    softmax_backward_rows4_f16,
    softmax_backward_f16
);
softmax_element!(
    f32,
    softmax_row_f32,
    softmax_rows4_f32,
    softmax_f32,
    softmax_backward_row_f32,
    softmax_backward_rows4_f32,
    softmax_backward_f32
);

/// The rows of a 2-D or 3-D tensor seen as a matrix of rows: `(shape, strides, period)`.
fn as_rows<T: Element>(op: &'static str, arg: &str, t: &Tensor<T>) -> Result<([usize; 2], [usize; 2], usize)> {
    match (t.shape(), t.strides()) {
        (&[m, n], &[s0, s1]) => Ok(([m, n], [s0, s1], m)),
        (&[b, m, n], _) if t.is_contiguous() => Ok(([b * m, n], [n, 1], m)),
        _ => Err(tessera::Error::Argument {
            kernel: op,
            arg: arg.into(),
            expected: "a 2-D tensor, or a contiguous 3-D batch of matrices".into(),
            found: format!("shape {:?} (strides {:?})", t.shape(), t.strides()),
        }),
    }
}

/// `y = softmax(x)` along the last axis of a 2-D tensor, or of each matrix of a contiguous
/// 3-D batch; bf16, f16 or f32 in and out, arithmetic in f32.
///
/// A row of −∞ only (every element masked by the caller) gives a row of 0, not NaN; a NaN in
/// a row makes that row NaN and no other; logits of any finite size (±1e4 and beyond) are
/// exact, the maximum being subtracted before the scale.
///
/// # Errors
/// [`tessera::Error::Argument`] naming `x` or `y` if a shape does not fit; a launch error.
pub fn softmax<T: SoftmaxElement>(device: &Device, x: &Tensor<T>, y: &mut Tensor<T>) -> Result<()> {
    softmax_with(device, x, y, SoftmaxOptions::default())
}

/// `y = softmax(scale · x)` along the last axis, with the causal mask if asked: see
/// [`SoftmaxOptions`] and [`softmax`].
///
/// # Errors
/// As [`softmax`]; a causal softmax over 2²⁴ rows or more.
pub fn softmax_with<T: SoftmaxElement>(device: &Device, x: &Tensor<T>, y: &mut Tensor<T>, options: SoftmaxOptions) -> Result<()> {
    let ([m, n], xs, period) = as_rows("softmax", "x", x)?;
    crate::check_row_width("softmax", "x", x, n)?;
    if y.shape() != x.shape() {
        return Err(tessera::Error::Argument {
            kernel: "softmax",
            arg: "y".into(),
            expected: format!("shape {:?}, as x", x.shape()),
            found: format!("shape {:?}", y.shape()),
        });
    }
    if m == 0 || n == 0 {
        return Ok(());
    }
    if !(options.scale > 0.0 && options.scale.is_finite()) {
        return Err(tessera::Error::Argument {
            kernel: "softmax",
            arg: "scale".into(),
            expected: "a positive finite scale".into(),
            found: options.scale.to_string(),
        });
    }
    if options.causal && m >= 1 << 24 {
        return Err(tessera::Error::Argument {
            kernel: "softmax",
            arg: "x".into(),
            expected: "fewer than 2^24 rows for a causal mask".into(),
            found: format!("{m} rows"),
        });
    }
    // Rows the norms take two warpgroups for, softmax reads in one (its tile goes to 16384).
    let path = match NormPath::choose(m, n, device.sm_count() as usize) {
        NormPath::Wide if n <= SOFTMAX_ROW_MAX => NormPath::Row,
        NormPath::Wide => NormPath::Tiled,
        path => path,
    };
    let ys = as_rows("softmax", "y", y)?.1;
    let xv = x.view(&[m, n], &xs)?;
    let mut yv = y.view_mut(&[m, n], &ys)?;
    T::softmax_launch(device, path, (m, n), &xv, &mut yv, options, period as i32)
}

/// The backward pass of [`softmax_with`]: `dx = scale · y ⊙ (dy − Σ_j dy ⊙ y)` per row, from
/// the forward's output `y` (masked entries are 0 there, so the mask needs no repeating).
///
/// # Errors
/// [`tessera::Error::Argument`] naming `y`, `dy` or `dx` if a shape does not fit; a launch
/// error.
pub fn softmax_backward<T: SoftmaxElement>(device: &Device, y: &Tensor<T>, dy: &Tensor<T>, dx: &mut Tensor<T>, scale: f32) -> Result<()> {
    let ([m, n], ys, _) = as_rows("softmax_backward", "y", y)?;
    crate::check_row_width("softmax_backward", "y", y, n)?;
    for (name, t) in [("dy", dy), ("dx", &*dx)] {
        if t.shape() != y.shape() {
            return Err(tessera::Error::Argument {
                kernel: "softmax_backward",
                arg: name.into(),
                expected: format!("shape {:?}, as y", y.shape()),
                found: format!("shape {:?}", t.shape()),
            });
        }
    }
    if m == 0 || n == 0 {
        return Ok(());
    }
    let (dys, dxs) = (as_rows("softmax_backward", "dy", dy)?.1, as_rows("softmax_backward", "dx", dx)?.1);
    let (yv, dyv) = (y.view(&[m, n], &ys)?, dy.view(&[m, n], &dys)?);
    let mut dxv = dx.view_mut(&[m, n], &dxs)?;
    // The forward's paths (a block per row: run 37, 1.01× copy at 16384×8192, 0.19× at 768
    // wide; four rows per block up to 2048), the tiled kernel past the widest row tile.
    let path = match NormPath::choose(m, n, device.sm_count() as usize) {
        NormPath::Wide => NormPath::Tiled,
        path => path,
    };
    T::softmax_backward_launch(device, path, (m, n), &yv, &dyv, &mut dxv, scale)
}
