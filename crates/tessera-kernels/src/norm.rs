//! RMSNorm over the last dimension.

use tessera::{kernel, Device, Element, GlobalArg, Grid, Result, Tensor};

/// Rows each block normalizes.
const BM: usize = 16;

/// `y = x / sqrt(mean(x²) + eps) · w`, per row, with f32 statistics.
///
/// Pass 1 accumulates `x²` in a 16×256 f32 tile over the columns and reduces it once per row;
/// pass 2 reads the rows again (from L2: a block's 16 rows are at most 512 KiB) and scales
/// them. `has_weight` 0 skips `w` (then any rank-1 tensor).
#[kernel(dtypes(T = [bf16, f16, f32]))]
pub fn rms_norm(x: Global<T, 2>, w: Global<T, 1>, y: Global<T, 2>, eps: f32, has_weight: i32) {
    let r = block::id_x() * 16;
    let n = x.dim(1);
    let mut ss = Tile::<f32, 16, 256>::zeros();
    for c in (0..n).step_by(256) {
        let t = x.load::<Tile<T, 16, 256>>([r, c]).cast::<f32>();
        ss = ss + t * t;
    }
    let inv = rsqrt(row_sum(ss) * (1.0 / n as f32) + eps);
    for c in (0..n).step_by(256) {
        let mut o = x.load::<Tile<T, 16, 256>>([r, c]).cast::<f32>() * inv;
        if has_weight == 1 {
            o = o * w.load::<Tile<T, 1, 256>>([c]).cast::<f32>();
        }
        y.store([r, c], o.cast::<T>());
    }
}

/// Element types RMSNorm takes: bf16, f16, f32 (statistics in f32 for all).
pub trait NormElement: Element {
    #[doc(hidden)]
    fn rms_norm_launch(
        dev: &Device,
        grid: Grid,
        x: &Tensor<Self>,
        w: &impl GlobalArg<Self>,
        y: &mut Tensor<Self>,
        eps: f32,
        has_w: i32,
    ) -> Result<()>;
}

macro_rules! norm_element {
    ($t:ty, $k:ident) => {
        impl NormElement for $t {
            fn rms_norm_launch(
                dev: &Device,
                grid: Grid,
                x: &Tensor<Self>,
                w: &impl GlobalArg<Self>,
                y: &mut Tensor<Self>,
                eps: f32,
                has_w: i32,
            ) -> Result<()> {
                $k::launch(dev, grid, x, w, y, eps, has_w)
            }
        }
    };
}
norm_element!(tessera::bf16, rms_norm_bf16);
norm_element!(tessera::f16, rms_norm_f16);
norm_element!(f32, rms_norm_f32);

/// `y[i, :] = x[i, :] / sqrt(mean(x[i, :]²) + eps) · weight` for a 2-D `x` (any rows, any
/// hidden size), with f32 statistics; `weight` of shape `[hidden]`, or `None` for none.
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
    let (m, n) = crate::check_2d("rms_norm", "x", x)?;
    crate::check_shape("rms_norm", "y", y, &[m, n])?;
    if let Some(w) = weight {
        crate::check_shape("rms_norm", "weight", w, &[n])?;
    }
    if m == 0 || n == 0 {
        return Ok(());
    }
    let grid = Grid::from(Grid::tiles(m, BM));
    match weight {
        Some(w) => T::rms_norm_launch(device, grid, x, w, y, eps, 1),
        // Without a weight the kernel never reads `w`: pass `x` itself as a stand-in.
        None => T::rms_norm_launch(device, grid, x, &x.view(&[1], &[1])?, y, eps, 0),
    }
}
