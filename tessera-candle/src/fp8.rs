//! fp8 quantization as candle ops: candle's `DType::F8E4M3` (the `float8` crate's `F8E4M3`,
//! the OCP E4M3 format: ±448 at most, no infinities, NaN `0x7F`/`0xFF`) is Tessera's
//! [`tessera::F8E4M3`] bit for bit, so its buffers are read and written in place as Tessera's
//! type (CPU storage cast as a slice, CUDA storage borrowed as the other type). candle has no
//! E5M2 dtype; Tessera's `F8E5M2` stays on Tessera tensors.

#[cfg(feature = "cuda")]
use crate::Cuda;
use crate::{contiguous, Cpu, Elem, Input, Side};
use candle_core::backend::BackendStorage;
use candle_core::{bail, CpuStorage, CustomOp1, DType, Layout, Shape, Tensor};
use tessera_kernels::Fp8Source;

/// `y = x · scale` rounded to fp8 E4M3 (candle's `DType::F8E4M3`): to the nearest code, ties
/// to even, saturating at ±448 (NaN gives `0x7F`), as the GPU's `cvt.rn.satfinite`; the scale
/// multiplies in f32 before the one rounding. `x` bf16, f16 or f32, contiguous, any rank ≥ 1
/// ([`tessera_kernels::quantize_fp8`]). For inference (no gradient). On the GPU, sm_89 and
/// later.
///
/// ```
/// use candle_core::{DType, Device, Tensor};
/// let x = Tensor::new(&[0.5f32, 1000.0, -3.0], &Device::Cpu)?;
/// let q = tessera_candle::quantize_fp8(&x, 1.0)?;
/// assert_eq!(q.dtype(), DType::F8E4M3);
/// let back = tessera_candle::dequantize_fp8(&q, 1.0, DType::F32)?;
/// assert_eq!(back.to_vec1::<f32>()?, [0.5, 448.0, -3.0]); // 1000 saturates to 448
/// # Ok::<(), candle_core::Error>(())
/// ```
///
/// # Errors
/// A candle error for `x` of another dtype or not contiguous, a scale that is not finite, a
/// CUDA tensor without the `cuda` feature, or when the kernel fails.
pub fn quantize_fp8(x: &Tensor, scale: f32) -> candle_core::Result<Tensor> {
    x.apply_op1_no_bwd(&QuantizeFp8 { scale })
}

/// `y = x · scale` from fp8 E4M3 (`x` of `DType::F8E4M3`, contiguous, any rank ≥ 1), rounded
/// once to `dtype` (bf16, f16 or f32): the inverse of [`quantize_fp8`] up to its rounding
/// ([`tessera_kernels::dequantize_fp8`]). For inference.
///
/// # Errors
/// As [`quantize_fp8`]'s (`x` not F8E4M3, or `dtype` not bf16/f16/f32).
pub fn dequantize_fp8(x: &Tensor, scale: f32, dtype: DType) -> candle_core::Result<Tensor> {
    x.apply_op1_no_bwd(&DequantizeFp8 { scale, dtype })
}

/// [`quantize_fp8`] as a candle op.
#[derive(Clone, Copy, Debug)]
pub struct QuantizeFp8 {
    /// The factor on `x` before rounding.
    pub scale: f32,
}

/// [`dequantize_fp8`] as a candle op.
#[derive(Clone, Copy, Debug)]
pub struct DequantizeFp8 {
    /// The factor on the widened codes.
    pub scale: f32,
    /// The output's dtype: bf16, f16 or f32.
    pub dtype: DType,
}

/// The sides' fp8 storage: candle's `float8::F8E4M3` buffers as Tessera's [`tessera::F8E4M3`].
pub(crate) trait Fp8Side: Side {
    /// As [`Side::input`] for storage of `DType::F8E4M3`.
    fn fp8_input<'a>(
        &self, op: &str, name: &str, s: &'a Self::Storage, l: &Layout, shape: &[usize],
    ) -> candle_core::Result<Input<'a, tessera::F8E4M3>>;

    /// As [`Side::output`] for a kernel writing fp8: the result is candle storage of
    /// `DType::F8E4M3`.
    fn fp8_output(
        &self, dims: &[usize], shape: Shape, run: impl FnOnce(&mut tessera::Tensor<tessera::F8E4M3>) -> tessera::Result<()>,
    ) -> candle_core::Result<(Self::Storage, Shape)>;
}

impl Fp8Side for Cpu {
    fn fp8_input<'a>(
        &self, op: &str, name: &str, s: &'a CpuStorage, l: &Layout, shape: &[usize],
    ) -> candle_core::Result<Input<'a, tessera::F8E4M3>> {
        let (start, end) = contiguous(op, name, l)?;
        let codes: &[tessera::F8E4M3] = bytemuck::cast_slice(&s.as_slice::<float8::F8E4M3>()?[start..end]);
        Ok(Input::Host(tessera::Tensor::from_host(self.device(), codes, shape).map_err(candle_core::Error::wrap)?))
    }

    fn fp8_output(
        &self, dims: &[usize], shape: Shape, run: impl FnOnce(&mut tessera::Tensor<tessera::F8E4M3>) -> tessera::Result<()>,
    ) -> candle_core::Result<(CpuStorage, Shape)> {
        let mut y = tessera::Tensor::scratch(self.device(), dims).map_err(candle_core::Error::wrap)?;
        run(&mut y).map_err(candle_core::Error::wrap)?;
        let codes = y.to_host().map_err(candle_core::Error::wrap)?;
        Ok((CpuStorage::F8E4M3(codes.iter().map(|q| float8::F8E4M3::from_bits(q.to_bits())).collect()), shape))
    }
}

#[cfg(feature = "cuda")]
impl Fp8Side for Cuda {
    fn fp8_input<'a>(
        &self, op: &str, name: &str, s: &'a candle_core::CudaStorage, l: &Layout, shape: &[usize],
    ) -> candle_core::Result<Input<'a, tessera::F8E4M3>> {
        let (start, _) = contiguous(op, name, l)?;
        let slice = s.as_cuda_slice::<float8::F8E4M3>()?;
        let t = tessera::Tensor::borrow_cudarc_as(self.device(), slice, start, shape).map_err(candle_core::Error::wrap)?;
        Ok(Input::Borrowed(t))
    }

    fn fp8_output(
        &self, dims: &[usize], shape: Shape, run: impl FnOnce(&mut tessera::Tensor<tessera::F8E4M3>) -> tessera::Result<()>,
    ) -> candle_core::Result<(candle_core::CudaStorage, Shape)> {
        let mut y = tessera::Tensor::scratch(self.device(), dims).map_err(candle_core::Error::wrap)?;
        run(&mut y).map_err(candle_core::Error::wrap)?;
        let slice = y.into_cudarc_as::<float8::F8E4M3>().map_err(candle_core::Error::wrap)?;
        Ok((candle_core::CudaStorage::wrap_cuda_slice(slice, self.candle().clone()), shape))
    }
}

/// The matrix the kernels see `x` as (contiguous, so any split of its elements): rows of 256
/// where they divide it (the kernels' tiles are 16 × 256), else the rows of its last axis.
fn matrix(op: &str, l: &Layout) -> candle_core::Result<[usize; 2]> {
    let Some(&last) = l.dims().last() else { bail!("{op}: `x` must have at least one axis, found a scalar") };
    let n = l.shape().elem_count();
    Ok(if n.is_multiple_of(256) { [n / 256, 256] } else { [n / last.max(1), last] })
}

fn quantize_run<T: Elem + Fp8Source, S: Fp8Side>(
    side: &S, scale: f32, s: &S::Storage, l: &Layout,
) -> candle_core::Result<(S::Storage, Shape)> {
    let dims = matrix("quantize_fp8", l)?;
    let x = side.input::<T>("quantize_fp8", "x", s, l, &dims)?;
    side.fp8_output(&dims, l.shape().clone(), |y| tessera_kernels::quantize_fp8(side.device(), &x, scale, y))
}

fn dequantize_run<T: Elem + Fp8Source, S: Fp8Side>(
    side: &S, scale: f32, s: &S::Storage, l: &Layout,
) -> candle_core::Result<(S::Storage, Shape)> {
    let dims = matrix("dequantize_fp8", l)?;
    let x = side.fp8_input("dequantize_fp8", "x", s, l, &dims)?;
    side.output::<T>(&dims, l.shape().clone(), |y| tessera_kernels::dequantize_fp8(side.device(), &x, scale, y))
}

forwards!(QuantizeFp8: CustomOp1 "tessera-quantize-fp8", |op, side, s, l| {
    by_dtype!("quantize_fp8", s.dtype(), quantize_run(side, op.scale, s, l))
});

forwards!(DequantizeFp8: CustomOp1 "tessera-dequantize-fp8", |op, side, s, l| {
    if s.dtype() != DType::F8E4M3 {
        bail!("dequantize_fp8: `x` must be F8E4M3, found {:?}", s.dtype())
    }
    match op.dtype {
        DType::BF16 => dequantize_run::<half::bf16, _>(side, op.scale, s, l),
        DType::F16 => dequantize_run::<half::f16, _>(side, op.scale, s, l),
        DType::F32 => dequantize_run::<f32, _>(side, op.scale, s, l),
        other => bail!("dequantize_fp8: `dtype` must be bf16, f16 or f32, found {other:?}"),
    }
});
