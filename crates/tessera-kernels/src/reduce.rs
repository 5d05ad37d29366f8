//! Row reductions.

use tessera::{kernel, Device, Grid, Result, Tensor};

/// Rows each block reduces.
const BM: usize = 16;

/// Sums each row: a 16×256 running tile over the columns, then one reduction.
#[kernel]
pub fn row_sum_f32(x: Global<f32, 2>, out: Global<f32, 1>) {
    let r = block::id_x() * 16;
    let mut acc = Tile::<f32, 16, 256>::zeros();
    for c in (0..x.dim(1)).step_by(256) {
        let t: Tile<f32, 16, 256> = x.load([r, c]);
        acc += t;
    }
    out.store([r], row_sum(acc));
}

/// The maximum of each row; masked elements read as −∞.
#[kernel]
pub fn row_max_f32(x: Global<f32, 2>, out: Global<f32, 1>) {
    let r = block::id_x() * 16;
    let mut acc = Tile::<f32, 16, 256>::full(f32::NEG_INFINITY);
    for c in (0..x.dim(1)).step_by(256) {
        let t: Tile<f32, 16, 256> = x.load_or([r, c], f32::NEG_INFINITY);
        acc = max(acc, t);
    }
    out.store([r], row_max(acc));
}

fn launch_rows(
    name: &'static str,
    device: &Device,
    x: &Tensor<f32>,
    out: &mut Tensor<f32>,
    spec: fn(&Device, Grid, &Tensor<f32>, &mut Tensor<f32>) -> Result<()>,
) -> Result<()> {
    let (m, _) = crate::check_2d(name, "x", x)?;
    crate::check_shape(name, "out", out, &[m])?;
    if m == 0 {
        return Ok(());
    }
    spec(device, Grid::from(Grid::tiles(m, BM)), x, out)
}

/// `out[i] = Σ_j x[i, j]` for a 2-D f32 tensor `x` and `out` of shape `[rows]`.
///
/// # Errors
/// [`tessera::Error::Argument`] if `x` is not 2-D or `out` is not `[rows]`.
pub fn row_sum(device: &Device, x: &Tensor<f32>, out: &mut Tensor<f32>) -> Result<()> {
    launch_rows("row_sum", device, x, out, row_sum_f32::launch)
}

/// `out[i] = max_j x[i, j]` (−∞ for an empty row).
///
/// # Errors
/// As [`row_sum`].
pub fn row_max(device: &Device, x: &Tensor<f32>, out: &mut Tensor<f32>) -> Result<()> {
    launch_rows("row_max", device, x, out, row_max_f32::launch)
}
