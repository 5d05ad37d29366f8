//! Row softmax.

use tessera::{kernel, Device, Grid, Result, Tensor};

/// Rows each block normalizes.
const BM: usize = 16;

/// Stable softmax of each row in two passes over the columns.
///
/// Pass 1 keeps, per element of a 16×256 tile, a running maximum `m` and a running sum `s` of
/// `exp2(u − m)` with `u = x·log2(e)`, rescaling `s` when `m` grows (online softmax); then one
/// reduction gives each row's maximum and sum. Pass 2 writes `exp2(u − max) / sum`.
/// `m` starts at `f32::MIN`, not −∞, so that a column no row reaches gives `exp2(0)·0`, never
/// `exp2(−∞ + ∞)`.
#[kernel]
pub fn softmax_f32(x: Global<f32, 2>, y: Global<f32, 2>) {
    let r = block::id_x() * 16;
    let n = x.dim(1);
    let mut m = Tile::<f32, 16, 256>::full(f32::MIN);
    let mut s = Tile::<f32, 16, 256>::zeros();
    for c in (0..n).step_by(256) {
        let t: Tile<f32, 16, 256> = x.load_or([r, c], f32::NEG_INFINITY);
        let u = t * f32::consts::LOG2_E;
        let m_new = max(m, u);
        s = s * exp2(m - m_new) + exp2(u - m_new);
        m = m_new;
    }
    let row_m = row_max(m);
    let inv = 1.0 / row_sum(s * exp2(m - row_m));
    for c in (0..n).step_by(256) {
        let t: Tile<f32, 16, 256> = x.load([r, c]);
        y.store([r, c], exp2(t * f32::consts::LOG2_E - row_m) * inv);
    }
}

/// `y[i, :] = softmax(x[i, :])` for 2-D f32 tensors of the same shape.
///
/// # Errors
/// [`tessera::Error::Argument`] if the tensors are not 2-D or their shapes differ.
pub fn softmax(device: &Device, x: &Tensor<f32>, y: &mut Tensor<f32>) -> Result<()> {
    let (m, n) = crate::check_2d("softmax", "x", x)?;
    crate::check_shape("softmax", "y", y, &[m, n])?;
    if m == 0 || n == 0 {
        return Ok(());
    }
    softmax_f32::launch(device, Grid::tiles(m, BM), x, y)
}
