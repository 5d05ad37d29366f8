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

/// `y ← x` widened to f32, one 16×256 tile a block (edges masked): a kernel's 16-bit input
/// that its threads would otherwise each unpack many times (the selective scan's B and C).
#[kernel(dtypes(T = [bf16, f16]))]
pub fn to_f32(x: Global<T, 2>, y: Global<f32, 2>) {
    let r = block::id_y() * 16;
    let c = block::id_x() * 256;
    y.store([r, c], x.load::<Tile<T, 16, 256>>([r, c]).cast::<f32>());
}

/// A 2-D bf16 view widened to a fresh f32 tensor of its shape.
pub(crate) fn widened_bf16(device: &Device, x: tessera::TensorView<'_, tessera::bf16>) -> Result<Tensor<f32>> {
    let (m, n) = (x.shape()[0], x.shape()[1]);
    let mut y = Tensor::<f32>::scratch(device, &[m, n])?;
    if m > 0 && n > 0 {
        to_f32_bf16::launch(device, (Grid::tiles(n, 256), Grid::tiles(m, 16)), &x, &mut y)?;
    }
    Ok(y)
}
