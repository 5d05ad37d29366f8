//! fp8 quantization: `y = x · scale` rounded to [`F8E4M3`] or [`F8E5M2`], and back.
//!
//! The rounding is the GPU's `cvt.rn.satfinite`: to the nearest code (ties to the even one),
//! a value beyond the format's largest finite one (±448 for E4M3, ±57344 for E5M2), an
//! infinity included, saturating to it, and a NaN of either sign giving the code 0x7F (a NaN in
//! both formats). The host's [`F8E4M3::from_f32`] and the interpreter round the same way,
//! byte for byte. Widening back is exact; `dequantize_fp8` multiplies by its scale in f32
//! and rounds once to the output type. sm_89 and later (the fp8 `cvt`); on Hopper only, in
//! this crate (no sm_80 build of these kernels).

use tessera::{bf16, f16, kernel, Device, Element, GlobalArg, GlobalArgMut, Grid, Result, Tensor, F8E4M3, F8E5M2};

/// Rows and columns of the tile each block converts.
const BM: usize = 16;
const BN: usize = 256;

/// `y = x · scale` rounded to fp8 `Q` (saturating), one 16×256 tile per block.
#[kernel(dtypes(T = [bf16, f16, f32], Q = [f8e4m3, f8e5m2]))]
pub fn quantize(x: Global<T, 2>, y: Global<Q, 2>, scale: f32) {
    let r = block::id_y() * 16;
    let c = block::id_x() * 256;
    let t = x.load::<Tile<T, 16, 256>>([r, c]).cast::<f32>();
    y.store([r, c], (t * scale).cast::<Q>());
}

/// `y = x · scale` from fp8 `Q`, rounded once to `T`, one 16×256 tile per block.
#[kernel(dtypes(Q = [f8e4m3, f8e5m2], T = [bf16, f16, f32]))]
pub fn dequantize(x: Global<Q, 2>, y: Global<T, 2>, scale: f32) {
    let r = block::id_y() * 16;
    let c = block::id_x() * 256;
    let t = x.load::<Tile<Q, 16, 256>>([r, c]).cast::<f32>();
    y.store([r, c], (t * scale).cast::<T>());
}

/// The types [`quantize_fp8`] reads and [`dequantize_fp8`] writes: bf16, f16, f32.
pub trait Fp8Source: Element {
    #[doc(hidden)]
    fn to_e4m3(dev: &Device, g: Grid, x: &impl GlobalArg<Self>, y: &mut impl GlobalArgMut<F8E4M3>, scale: f32) -> Result<()>;
    #[doc(hidden)]
    fn to_e5m2(dev: &Device, g: Grid, x: &impl GlobalArg<Self>, y: &mut impl GlobalArgMut<F8E5M2>, scale: f32) -> Result<()>;
    #[doc(hidden)]
    fn from_e4m3(dev: &Device, g: Grid, x: &impl GlobalArg<F8E4M3>, y: &mut impl GlobalArgMut<Self>, scale: f32) -> Result<()>;
    #[doc(hidden)]
    fn from_e5m2(dev: &Device, g: Grid, x: &impl GlobalArg<F8E5M2>, y: &mut impl GlobalArgMut<Self>, scale: f32) -> Result<()>;
}

macro_rules! fp8_source {
    ($t:ty, $to4:ident, $to5:ident, $from4:ident, $from5:ident) => {
        impl Fp8Source for $t {
            fn to_e4m3(dev: &Device, g: Grid, x: &impl GlobalArg<Self>, y: &mut impl GlobalArgMut<F8E4M3>, scale: f32) -> Result<()> {
                $to4::launch(dev, g, x, y, scale)
            }
            fn to_e5m2(dev: &Device, g: Grid, x: &impl GlobalArg<Self>, y: &mut impl GlobalArgMut<F8E5M2>, scale: f32) -> Result<()> {
                $to5::launch(dev, g, x, y, scale)
            }
            fn from_e4m3(dev: &Device, g: Grid, x: &impl GlobalArg<F8E4M3>, y: &mut impl GlobalArgMut<Self>, scale: f32) -> Result<()> {
                $from4::launch(dev, g, x, y, scale)
            }
            fn from_e5m2(dev: &Device, g: Grid, x: &impl GlobalArg<F8E5M2>, y: &mut impl GlobalArgMut<Self>, scale: f32) -> Result<()> {
                $from5::launch(dev, g, x, y, scale)
            }
        }
    };
}

fp8_source!(bf16, quantize_bf16_f8e4m3, quantize_bf16_f8e5m2, dequantize_f8e4m3_bf16, dequantize_f8e5m2_bf16);
fp8_source!(f16, quantize_f16_f8e4m3, quantize_f16_f8e5m2, dequantize_f8e4m3_f16, dequantize_f8e5m2_f16);
fp8_source!(f32, quantize_f32_f8e4m3, quantize_f32_f8e5m2, dequantize_f8e4m3_f32, dequantize_f8e5m2_f32);

/// The fp8 types: [`F8E4M3`] and [`F8E5M2`].
pub trait Fp8Element: Element {
    #[doc(hidden)]
    fn quantize<T: Fp8Source>(dev: &Device, g: Grid, x: &impl GlobalArg<T>, y: &mut impl GlobalArgMut<Self>, scale: f32) -> Result<()>;
    #[doc(hidden)]
    fn dequantize<T: Fp8Source>(dev: &Device, g: Grid, x: &impl GlobalArg<Self>, y: &mut impl GlobalArgMut<T>, scale: f32) -> Result<()>;
}

impl Fp8Element for F8E4M3 {
    fn quantize<T: Fp8Source>(dev: &Device, g: Grid, x: &impl GlobalArg<T>, y: &mut impl GlobalArgMut<Self>, scale: f32) -> Result<()> {
        T::to_e4m3(dev, g, x, y, scale)
    }
    fn dequantize<T: Fp8Source>(dev: &Device, g: Grid, x: &impl GlobalArg<Self>, y: &mut impl GlobalArgMut<T>, scale: f32) -> Result<()> {
        T::from_e4m3(dev, g, x, y, scale)
    }
}

impl Fp8Element for F8E5M2 {
    fn quantize<T: Fp8Source>(dev: &Device, g: Grid, x: &impl GlobalArg<T>, y: &mut impl GlobalArgMut<Self>, scale: f32) -> Result<()> {
        T::to_e5m2(dev, g, x, y, scale)
    }
    fn dequantize<T: Fp8Source>(dev: &Device, g: Grid, x: &impl GlobalArg<Self>, y: &mut impl GlobalArgMut<T>, scale: f32) -> Result<()> {
        T::from_e5m2(dev, g, x, y, scale)
    }
}

/// A tensor as the matrix the kernels take: a 2-D tensor as it is (any strides), a contiguous
/// tensor of any other rank as its rows of the last axis.
fn as_matrix<T: Element>(op: &'static str, arg: &str, t: &Tensor<T>) -> Result<([usize; 2], [usize; 2])> {
    match (t.shape(), t.strides()) {
        (&[m, n], &[s0, s1]) => Ok(([m, n], [s0, s1])),
        (&[.., n], _) if t.is_contiguous() => Ok(([t.shape().iter().product::<usize>() / n.max(1), n], [n, 1])),
        _ => Err(tessera::Error::Argument {
            kernel: op,
            arg: arg.into(),
            expected: "a 2-D tensor, or a contiguous tensor of another rank (1 or more)".into(),
            found: format!("shape {:?} (strides {:?})", t.shape(), t.strides()),
        }),
    }
}

/// A conversion's matrix: its shape, and `x`'s and `y`'s strides.
type Matrix = ([usize; 2], [usize; 2], [usize; 2]);

/// The checks both directions share: shapes equal, the scale finite. Returns the matrix, or
/// `None` when there is nothing to convert.
fn check<A: Element, B: Element>(op: &'static str, x: &Tensor<A>, scale: f32, y: &Tensor<B>) -> Result<Option<Matrix>> {
    let (shape, xs) = as_matrix(op, "x", x)?;
    if y.shape() != x.shape() {
        return Err(tessera::Error::Argument {
            kernel: op,
            arg: "y".into(),
            expected: format!("shape {:?}, as x", x.shape()),
            found: format!("shape {:?}", y.shape()),
        });
    }
    let (_, ys) = as_matrix(op, "y", y)?;
    if !scale.is_finite() {
        return Err(tessera::Error::Argument {
            kernel: op,
            arg: "scale".into(),
            expected: "a finite scale".into(),
            found: scale.to_string(),
        });
    }
    Ok((shape[0] > 0 && shape[1] > 0).then_some((shape, xs, ys)))
}

/// `y = x · scale` rounded to fp8: to the nearest code, ties to even, saturating at the
/// format's largest finite value (NaN gives the code 0x7F). `x` bf16, f16 or f32; `y`
/// [`F8E4M3`] or [`F8E5M2`] of `x`'s shape; 2-D tensors of any strides, or contiguous ones of
/// any rank. The scale multiplies in f32 before the one rounding.
///
/// ```no_run
/// use tessera::{Device, Tensor, F8E4M3};
/// let dev = Device::new(0)?;
/// let x = Tensor::from_host(&dev, &[0.5f32, 1000.0, -3.0], &[1, 3])?;
/// let mut y = Tensor::<F8E4M3>::zeros(&dev, &[1, 3])?;
/// tessera_kernels::quantize_fp8(&dev, &x, 1.0, &mut y)?;
/// let bytes: Vec<u8> = y.to_host()?.iter().map(|q| q.to_bits()).collect();
/// assert_eq!(bytes, [0x30, 0x7E, 0xC4]); // 1000 saturates to 448
/// # Ok::<(), tessera::Error>(())
/// ```
///
/// # Errors
/// [`tessera::Error::Argument`] naming `x` or `y` (shapes, layout) or `scale` (not finite); a
/// launch error (a device without fp8 conversions: before sm_89).
pub fn quantize_fp8<T: Fp8Source, Q: Fp8Element>(device: &Device, x: &Tensor<T>, scale: f32, y: &mut Tensor<Q>) -> Result<()> {
    let Some(([m, n], xs, ys)) = check("quantize_fp8", x, scale, y)? else { return Ok(()) };
    let grid = (Grid::tiles(n, BN), Grid::tiles(m, BM));
    let xv = x.view(&[m, n], &xs)?;
    let mut yv = y.view_mut(&[m, n], &ys)?;
    Q::quantize(device, grid.into(), &xv, &mut yv, scale)
}

/// `y = x · scale` from fp8, rounded once to `y`'s type (bf16, f16 or f32): the inverse of
/// [`quantize_fp8`] up to its rounding. Shapes and layouts as there.
///
/// # Errors
/// As [`quantize_fp8`].
pub fn dequantize_fp8<Q: Fp8Element, T: Fp8Source>(device: &Device, x: &Tensor<Q>, scale: f32, y: &mut Tensor<T>) -> Result<()> {
    let Some(([m, n], xs, ys)) = check("dequantize_fp8", x, scale, y)? else { return Ok(()) };
    let grid = (Grid::tiles(n, BN), Grid::tiles(m, BM));
    let xv = x.view(&[m, n], &xs)?;
    let mut yv = y.view_mut(&[m, n], &ys)?;
    Q::dequantize(device, grid.into(), &xv, &mut yv, scale)
}
