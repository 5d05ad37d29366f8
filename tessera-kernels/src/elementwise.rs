//! Elementwise kernels.

use tessera::{kernel, Device, Grid, Result, Tensor};

/// Rows and columns of the tile each block updates.
const BM: usize = 16;
const BN: usize = 256;

/// `y ← a·x + y` on one 16×256 tile per block; edges are masked.
#[kernel]
pub fn axpy_f32(a: f32, x: Global<f32, 2>, y: Global<f32, 2>) {
    let r = block::id_y() * 16;
    let c = block::id_x() * 256;
    let xt: Tile<f32, 16, 256> = x.load([r, c]);
    let yt: Tile<f32, 16, 256> = y.load([r, c]);
    y.store([r, c], a * xt + yt);
}

/// `y ← a·x + y` for 2-D f32 tensors of the same shape.
///
/// # Errors
/// [`tessera::Error::Argument`] if the tensors are not 2-D or their shapes differ; the
/// launch's own checks (device, alignment).
pub fn axpy(device: &Device, a: f32, x: &Tensor<f32>, y: &mut Tensor<f32>) -> Result<()> {
    let (m, n) = crate::check_2d("axpy", "x", x)?;
    crate::check_shape("axpy", "y", y, &[m, n])?;
    if m == 0 || n == 0 {
        return Ok(());
    }
    axpy_f32::launch(device, (Grid::tiles(n, BN), Grid::tiles(m, BM)), a, x, y)
}
