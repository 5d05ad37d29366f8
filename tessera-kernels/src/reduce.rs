//! Row and column reductions of 2-D f32 tensors: sum, maximum, mean.

use tessera::{device, kernel, Device, Grid, Result, Tensor};

/// Rows each block reduces.
const BM: usize = 16;

/// A 16×256 running tile over a 2-D tensor: from `[r, c]`, stepping down the rows (`down`
/// 1, a constant) or along the columns (0) to the tensor's end, each tile read with `fill` past the edges
/// and folded in by `combine`, the running tile starting at `fill`.
#[device]
fn fold_tiles<const DOWN: usize>(
    x: Global<f32, 2>, r: i32, c: i32, fill: f32, combine: impl Fn(Tile<f32, 16, 256>, Tile<f32, 16, 256>) -> Tile<f32, 16, 256>,
) -> Tile<f32, 16, 256> {
    let mut acc = Tile::<f32, 16, 256>::full(fill);
    if DOWN == 1 {
        for i in (r..x.dim(0)).step_by(16) {
            let t: Tile<f32, 16, 256> = x.load_or([i, c], fill);
            acc = combine(acc, t);
        }
    } else {
        for j in (c..x.dim(1)).step_by(256) {
            let t: Tile<f32, 16, 256> = x.load_or([r, j], fill);
            acc = combine(acc, t);
        }
    }
    acc
}

/// Sums each row: a 16×256 running tile over the columns, then one reduction.
#[kernel]
pub fn row_sum_f32(x: Global<f32, 2>, out: Global<f32, 1>) {
    let r = block::id_x() * 16;
    out.store([r], row_sum(fold_tiles::<0>(x, r, 0, 0.0, |a, t| a + t)));
}

/// The maximum of each row; masked elements read as −∞.
#[kernel]
pub fn row_max_f32(x: Global<f32, 2>, out: Global<f32, 1>) {
    let r = block::id_x() * 16;
    out.store([r], row_max(fold_tiles::<0>(x, r, 0, f32::NEG_INFINITY, |a, t| max(a, t))));
}

/// Sums each column: 16×256 tiles down the rows, then one reduction down the tile.
#[kernel]
pub fn col_sum_f32(x: Global<f32, 2>, out: Global<f32, 1>) {
    let c = block::id_x() * 256;
    out.store([c], col_sum(fold_tiles::<1>(x, 0, c, 0.0, |a, t| a + t)));
}

/// The maximum of each column; masked elements read as −∞.
#[kernel]
pub fn col_max_f32(x: Global<f32, 2>, out: Global<f32, 1>) {
    let c = block::id_x() * 256;
    out.store([c], col_max(fold_tiles::<1>(x, 0, c, f32::NEG_INFINITY, |a, t| max(a, t))));
}

/// Scales a vector in place: `v ← a·v` (the means divide the sums).
#[kernel]
pub fn scale_f32(v: Global<f32, 1>, a: f32) {
    let i = block::id_x() * 256;
    let t: Tile<f32, 1, 256> = v.load([i]);
    v.store([i], t * a);
}

/// `out ← out / count` after a sum: the mean (NaN for an empty axis, as 0/0).
fn divide(device: &Device, out: &mut Tensor<f32>, count: usize) -> Result<()> {
    let len = out.shape()[0];
    if len == 0 {
        return Ok(());
    }
    scale_f32::launch(device, Grid::from(Grid::tiles(len, 256)), out, if count == 0 { f32::NAN } else { 1.0 / count as f32 })
}

/// Checks `x` (2-D) and `out` (one element per row, or per column when `cols`) and launches
/// `spec` over the rows in blocks of 16 or the columns in blocks of 256.
fn launch_reduce(
    name: &'static str, cols: bool, device: &Device, x: &Tensor<f32>, out: &mut Tensor<f32>,
    spec: fn(&Device, Grid, &Tensor<f32>, &mut Tensor<f32>) -> Result<()>,
) -> Result<()> {
    let (m, n) = crate::check_2d(name, "x", x)?;
    let (len, per_block) = if cols { (n, 256) } else { (m, BM) };
    crate::check_shape(name, "out", out, &[len])?;
    if len == 0 {
        return Ok(());
    }
    spec(device, Grid::from(Grid::tiles(len, per_block)), x, out)
}

/// `out[i] = mean_j x[i, j]`.
///
/// # Errors
/// As [`row_sum`].
pub fn row_mean(device: &Device, x: &Tensor<f32>, out: &mut Tensor<f32>) -> Result<()> {
    row_sum(device, x, out)?;
    divide(device, out, x.shape()[1])
}

/// `out[j] = Σ_i x[i, j]` for a 2-D f32 tensor `x` and `out` of shape `[cols]`.
///
/// # Errors
/// [`tessera::Error::Argument`] if `x` is not 2-D or `out` is not `[cols]`.
pub fn col_sum(device: &Device, x: &Tensor<f32>, out: &mut Tensor<f32>) -> Result<()> {
    launch_reduce("col_sum", true, device, x, out, col_sum_f32::launch)
}

/// `out[j] = max_i x[i, j]` (−∞ for an empty column).
///
/// # Errors
/// As [`col_sum`].
pub fn col_max(device: &Device, x: &Tensor<f32>, out: &mut Tensor<f32>) -> Result<()> {
    launch_reduce("col_max", true, device, x, out, col_max_f32::launch)
}

/// `out[j] = mean_i x[i, j]`.
///
/// # Errors
/// As [`col_sum`].
pub fn col_mean(device: &Device, x: &Tensor<f32>, out: &mut Tensor<f32>) -> Result<()> {
    col_sum(device, x, out)?;
    divide(device, out, x.shape()[0])
}

/// `out[i] = Σ_j x[i, j]` for a 2-D f32 tensor `x` and `out` of shape `[rows]`.
///
/// # Errors
/// [`tessera::Error::Argument`] if `x` is not 2-D or `out` is not `[rows]`.
pub fn row_sum(device: &Device, x: &Tensor<f32>, out: &mut Tensor<f32>) -> Result<()> {
    launch_reduce("row_sum", false, device, x, out, row_sum_f32::launch)
}

/// `out[i] = max_j x[i, j]` (−∞ for an empty row).
///
/// # Errors
/// As [`row_sum`].
pub fn row_max(device: &Device, x: &Tensor<f32>, out: &mut Tensor<f32>) -> Result<()> {
    launch_reduce("row_max", false, device, x, out, row_max_f32::launch)
}
