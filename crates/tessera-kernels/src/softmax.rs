//! Row softmax.

use tessera::{kernel, Device, Grid, Result, Tensor};

/// Rows each block normalizes.
const BM: usize = 16;

/// Stable softmax of each row, in three passes over the columns: the maximum, the sum of
/// `exp(x − max)`, then the normalized output. `exp(x)` is `exp2(x·log2(e))`.
#[kernel]
pub fn softmax_f32(x: Global<f32, 2>, y: Global<f32, 2>) {
    let r = block::id_x() * 16;
    let n = x.dim(1);
    let mut m = Tile::<f32, 16, 256>::full(f32::NEG_INFINITY);
    for c in (0..n).step_by(256) {
        let t: Tile<f32, 16, 256> = x.load_or([r, c], f32::NEG_INFINITY);
        m = max(m, t);
    }
    let row_m = row_max(m) * f32::consts::LOG2_E;
    let mut s = Tile::<f32, 16, 256>::zeros();
    for c in (0..n).step_by(256) {
        let t: Tile<f32, 16, 256> = x.load_or([r, c], f32::NEG_INFINITY);
        s += exp2(t * f32::consts::LOG2_E - row_m);
    }
    let inv = 1.0 / row_sum(s);
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
