//! Tessera's kernels inside [candle](https://github.com/huggingface/candle): candle custom ops
//! (`CustomOp1/2/3`) that run Tessera's library kernels on candle tensors, so that a model
//! written in candle calls them as it calls its own ops.
//!
//! With the `cuda` feature, a CUDA tensor's op launches on candle's own stream and reads
//! candle's buffers in place (`tessera::Tensor::borrow_cudarc`: no copy, no sync); its output is
//! candle storage on the same device. A CPU tensor runs through Tessera's interpreter — the
//! same kernels, the same f32 statistics, no GPU — so that a model's tests run anywhere.
//! [`attention`], [`scan`], [`selective_scan`], [`ssd`] and [`linear_attention`] are
//! registered with candle's autograd (their backwards run Tessera's); the other ops are for
//! inference, among them the decode steps [`selective_scan_step`] and [`linear_attention_step`]
//! (candle in-place ops on the carried state). candle's `cuda` feature builds candle's own kernels with nvcc: `scripts/cuda-toolkit.sh` provides one from NVIDIA's wheels where no
//! toolkit is installed. Without the feature a CUDA tensor is a candle error, never a panic.
//!
//! ```
//! use candle_core::{DType, Device, Tensor};
//! let x = Tensor::randn(0f32, 1.0, (2, 7, 96), &Device::Cpu)?.to_dtype(DType::BF16)?;
//! let w = Tensor::ones(96, DType::BF16, &Device::Cpu)?;
//! let y = tessera_candle::rms_norm(&x, &w, 1e-6)?;
//! assert_eq!(y.dims(), &[2, 7, 96]);
//! # Ok::<(), candle_core::Error>(())
//! ```

use candle_core::backend::{BackendDevice, BackendStorage};
use candle_core::{bail, CpuStorage, CustomOp1, CustomOp2, CustomOp3, DType, Layout, Shape, Tensor, WithDType};
use std::sync::OnceLock;
pub use tessera_kernels::{Activation, HeadLayout, RopeStyle};
use tessera_kernels::{AttentionElement, GemmElement, NormElement, RopeElement, ScanElement, SoftmaxElement};

/// `y = x / sqrt(mean(x²) + eps) · weight` over the last axis of `x` (any rank ≥ 1, bf16, f16
/// or f32, contiguous), `weight` `[hidden]` of `x`'s dtype; f32 statistics
/// ([`tessera_kernels::rms_norm`]). No gradient: the op is for inference (`apply_op2_no_bwd`).
///
/// # Errors
/// A candle error when a dtype, shape or layout does not fit (saying which tensor and what was
/// expected), for a CUDA tensor without the `cuda` feature, or when the kernel fails.
pub fn rms_norm(x: &Tensor, weight: &Tensor, eps: f32) -> candle_core::Result<Tensor> {
    x.apply_op2_no_bwd(weight, &RmsNorm { eps })
}

/// `y = (x − mean) / sqrt(var + eps) · weight + bias` over the last axis of `x` (the biased
/// variance, as PyTorch's `layer_norm`), `weight` and `bias` `[hidden]`; otherwise as
/// [`rms_norm`] ([`tessera_kernels::layer_norm`]).
///
/// # Errors
/// As [`rms_norm`]'s.
pub fn layer_norm(x: &Tensor, weight: &Tensor, bias: &Tensor, eps: f32) -> candle_core::Result<Tensor> {
    x.apply_op3_no_bwd(weight, bias, &LayerNorm { eps })
}

/// The pre-norm residual step in one pass: `h = x + residual` (the new residual stream) and
/// `y = rms_norm(h) · weight`, returned as `(y, h)`, both shaped as `x`. `x` and `residual` of
/// one shape and dtype (bf16, f16 or f32), `weight` `[hidden]`; the sum is normalized in f32
/// as it is (`h` is rounded to the dtype only where it is stored)
/// ([`tessera_kernels::Norm::forward_stacked`]). The two results are the halves of one
/// `[2, …]` buffer (`y` and `h` are views of it, contiguous each). For inference.
///
/// ```
/// use candle_core::{DType, Device, Tensor};
/// let x = Tensor::randn(0f32, 1.0, (3, 64), &Device::Cpu)?;
/// let r = Tensor::randn(0f32, 1.0, (3, 64), &Device::Cpu)?;
/// let w = Tensor::ones(64, DType::F32, &Device::Cpu)?;
/// let (y, h) = tessera_candle::add_rms_norm(&x, &r, &w, 1e-6)?;
/// assert_eq!((y.dims(), h.dims()), (&[3, 64][..], &[3, 64][..]));
/// # Ok::<(), candle_core::Error>(())
/// ```
///
/// # Errors
/// As [`rms_norm`]'s (`residual` of another shape or dtype than `x`, named).
pub fn add_rms_norm(x: &Tensor, residual: &Tensor, weight: &Tensor, eps: f32) -> candle_core::Result<(Tensor, Tensor)> {
    let yh = x.apply_op3_no_bwd(residual, weight, &AddRmsNorm { eps })?;
    Ok((yh.get(0)?, yh.get(1)?))
}

/// [`add_rms_norm`] for LayerNorm: `h = x + residual`, `y = layer_norm(h) · weight + bias`,
/// returned as `(y, h)`.
///
/// # Errors
/// As [`add_rms_norm`]'s (`bias` named).
pub fn add_layer_norm(x: &Tensor, residual: &Tensor, weight: &Tensor, bias: &Tensor, eps: f32) -> candle_core::Result<(Tensor, Tensor)> {
    let yh = x.apply_op3_no_bwd(residual, weight, &AddLayerNorm { eps, bias: bias.clone() })?;
    Ok((yh.get(0)?, yh.get(1)?))
}

/// The softmax of each row along the last axis of `x` (any rank ≥ 1, bf16, f16 or f32,
/// contiguous), f32 inside ([`tessera_kernels::softmax`]).
///
/// # Errors
/// As [`rms_norm`]'s.
pub fn softmax_last_dim(x: &Tensor) -> candle_core::Result<Tensor> {
    x.apply_op1_no_bwd(&SoftmaxLastDim)
}

/// A linear layer `y = act(x·wᵀ + bias)`: `x` `[…, K]` (any rank ≥ 1), `w` `[N, K]` (PyTorch's and
/// candle-nn's layout), `bias` `[N]` or none, bf16 or f16, all contiguous; `y` `[…, N]`, f32
/// accumulation, the bias and activation in the GEMM's epilogue ([`tessera_kernels::gemm`]).
///
/// # Errors
/// As [`rms_norm`]'s (`w` of another K, or a dtype other than bf16/f16, named).
pub fn linear(x: &Tensor, w: &Tensor, bias: Option<&Tensor>, activation: Activation) -> candle_core::Result<Tensor> {
    let op = Linear { activation };
    match bias {
        Some(b) => x.apply_op3_no_bwd(w, b, &op),
        None => x.apply_op2_no_bwd(w, &op),
    }
}

/// `y = x·wᵀ + residual` (`residual` shaped as `y`): [`linear`] with the residual added in the
/// GEMM's epilogue — a projection back into the residual stream in one pass.
///
/// # Errors
/// As [`linear`]'s (`residual` of another shape or dtype, named).
pub fn linear_residual(x: &Tensor, w: &Tensor, residual: &Tensor) -> candle_core::Result<Tensor> {
    x.apply_op3_no_bwd(w, residual, &LinearResidual)
}

/// A SwiGLU feed-forward's gated product, `silu(x·w_gateᵀ) ⊙ (x·w_upᵀ)`: `x` `[…, K]`,
/// `w_gate` and `w_up` `[N, K]`, bf16 or f16, contiguous; two GEMMs, the second (`w_gate`'s)
/// with the SiLU and the product by the first's result in its epilogue
/// ([`GemmBuilder::gate`](tessera_kernels::GemmBuilder::gate)), so no elementwise pass follows.
/// For inference (no gradient).
///
/// # Errors
/// As [`linear`]'s (`w_up` of another shape than `w_gate`, named).
pub fn swiglu(x: &Tensor, w_gate: &Tensor, w_up: &Tensor) -> candle_core::Result<Tensor> {
    x.apply_op3_no_bwd(w_gate, w_up, &SwiGlu)
}

/// FlashAttention forward, `o = softmax(q·kᵀ·scale [+ causal mask])·v` per (batch, head): `q`
/// `[batch, seq_q, heads, dim]`, `k` and `v` `[batch, seq_k, kv_heads, dim]` (the projections'
/// layout; `kv_heads` dividing `heads`: grouped-query attention), bf16 or f16, contiguous; head
/// dims 64, 96, 128, 192, 256; `scale` `1/√dim` unless given. The causal mask aligns the last
/// query with the last key, as decoding against a KV cache wants. Hopper GPUs and the
/// interpreter ([`tessera_kernels::attention`]).
///
/// The op is registered with candle's autograd: where `q`, `k` or `v` is a `Var`, `backward()`
/// gives their gradients through Tessera's FlashAttention backward
/// ([`tessera_kernels::attention_backward`]), which first runs the forward again for the rows'
/// log-sum-exp (a candle op keeps one output).
///
/// # Errors
/// As [`rms_norm`]'s (shapes that do not fit, named by the kernel's argument check).
pub fn attention(q: &Tensor, k: &Tensor, v: &Tensor, causal: bool, scale: Option<f32>) -> candle_core::Result<Tensor> {
    q.apply_op3(k, v, Attention { causal, scale })
}

/// Rotary position embedding of a query or key tensor `x` (`[batch, seq, heads, dim]` or
/// `[batch, heads, seq, dim]` as `layout` says; bf16, f16 or f32, contiguous): each pair of
/// `style` rotated by `p·base^(−2i/dim)`, token `s` at position `offset + s`
/// ([`tessera_kernels::rope`], angles computed in the kernel).
///
/// # Errors
/// As [`rms_norm`]'s (`x` not 4-D or `dim` odd, named).
pub fn rope(x: &Tensor, style: RopeStyle, layout: HeadLayout, base: f32, offset: usize) -> candle_core::Result<Tensor> {
    x.apply_op1_no_bwd(&Rope { style, layout, base, offset })
}

/// A prefix scan along the last axis of `x` (any rank ≥ 1, bf16, f16 or f32, contiguous), f32
/// inside: `Cumsum` `y[…, j] = Σ_{k ≤ j} x[…, k]`, `Cumprod` the running product, `LogCumSumExp`
/// `ln Σ_{k ≤ j} exp(x[…, k])` ([`tessera_kernels::cumsum`] & co., at about the copy's speed).
/// Registered with candle's autograd: the gradient runs Tessera's scan backwards
/// ([`tessera_kernels::cumsum_backward`], `cumprod_backward` — exact where `x` has zeros —,
/// `logcumsumexp_backward`).
///
/// # Errors
/// As [`rms_norm`]'s.
pub fn scan(x: &Tensor, kind: ScanKind) -> candle_core::Result<Tensor> {
    x.apply_op1(Scan { kind })
}

/// Which prefix scan [`scan`] runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ScanKind {
    /// The running sum.
    Cumsum,
    /// The running product.
    Cumprod,
    /// The running log-sum-exp.
    LogCumSumExp,
}

/// [`scan`] as a candle op.
#[derive(Clone, Copy, Debug)]
pub struct Scan {
    /// Which scan.
    pub kind: ScanKind,
}

/// [`scan`]'s backward as a candle op over the output's gradient `dy`, with the forward's
/// input `x` and output `y` beside (those the scan's backward reads).
struct ScanBackward {
    kind: ScanKind,
    x: Tensor,
    y: Tensor,
}

/// [`rope`] as a candle op.
#[derive(Clone, Copy, Debug)]
pub struct Rope {
    /// The pairing convention.
    pub style: RopeStyle,
    /// The order of `x`'s axes.
    pub layout: HeadLayout,
    /// The base of the frequencies.
    pub base: f32,
    /// The first token's position.
    pub offset: usize,
}

/// [`softmax_last_dim`] as a candle op.
#[derive(Clone, Copy, Debug)]
pub struct SoftmaxLastDim;

/// [`linear`] as a candle op: `CustomOp2` without a bias, `CustomOp3` with one.
#[derive(Clone, Copy, Debug)]
pub struct Linear {
    /// Applied after the bias.
    pub activation: Activation,
}

/// [`linear_residual`] as a candle op.
#[derive(Clone, Copy, Debug)]
pub struct LinearResidual;

/// [`swiglu`] as a candle op.
#[derive(Clone, Copy, Debug)]
pub struct SwiGlu;

/// [`attention`] as a candle op.
#[derive(Clone, Copy, Debug)]
pub struct Attention {
    /// Whether key `j` is masked from query `i` when `j > i + seq_k − seq_q`.
    pub causal: bool,
    /// The factor on `q·kᵀ` (`1/√dim` when `None`).
    pub scale: Option<f32>,
}

/// [`rms_norm`] as a candle op.
#[derive(Clone, Copy, Debug)]
pub struct RmsNorm {
    /// Added to the mean of squares.
    pub eps: f32,
}

/// [`layer_norm`] as a candle op.
#[derive(Clone, Copy, Debug)]
pub struct LayerNorm {
    /// Added to the variance.
    pub eps: f32,
}

/// [`add_rms_norm`] as a candle op over `(x, residual, weight)`: its result is `[2, …x's
/// shape]`, `y` then `h`.
#[derive(Clone, Copy, Debug)]
pub struct AddRmsNorm {
    /// Added to the mean of squares.
    pub eps: f32,
}

/// [`add_layer_norm`] as a candle op over `(x, residual, weight)`, the bias held (a candle op
/// takes three tensors) and read in place; its result as [`AddRmsNorm`]'s.
#[derive(Clone, Debug)]
pub struct AddLayerNorm {
    /// Added to the variance.
    pub eps: f32,
    /// Added after the weight, `[hidden]`.
    pub bias: Tensor,
}

/// The interpreter's device, made once.
fn interpreter() -> &'static tessera::Device {
    static DEVICE: OnceLock<tessera::Device> = OnceLock::new();
    DEVICE.get_or_init(tessera::Device::cpu)
}

/// An element type both candle and Tessera know (bf16, f16, f32); with the `cuda` feature,
/// one candle keeps in CUDA storage too.
#[cfg(not(feature = "cuda"))]
pub trait Elem: WithDType + tessera::Element {}
#[cfg(not(feature = "cuda"))]
impl<T: WithDType + tessera::Element> Elem for T {}
/// An element type both candle and Tessera know (bf16, f16, f32); with the `cuda` feature,
/// one candle keeps in CUDA storage too.
#[cfg(feature = "cuda")]
pub trait Elem: WithDType + tessera::Element + candle_core::cuda::CudaDType {}
#[cfg(feature = "cuda")]
impl<T: WithDType + tessera::Element + candle_core::cuda::CudaDType> Elem for T {}

/// A kernel's input: a copy on the interpreter, or candle's own CUDA buffer, borrowed.
enum Input<'a, T: tessera::Element> {
    Host(tessera::Tensor<T>),
    #[cfg_attr(not(feature = "cuda"), allow(dead_code))]
    Borrowed(tessera::BorrowedTensor<'a, T>),
}

impl<T: tessera::Element> std::ops::Deref for Input<'_, T> {
    type Target = tessera::Tensor<T>;

    fn deref(&self) -> &tessera::Tensor<T> {
        match self {
            Input::Host(t) => t,
            Input::Borrowed(t) => t,
        }
    }
}

/// Where an op runs: the interpreter on candle CPU storage ([`Cpu`]) or the GPU on candle's
/// CUDA storage and stream (`Cuda`, with the `cuda` feature). An op is written once against it.
trait Side {
    /// candle's storage on this side.
    type Storage: BackendStorage;

    /// The Tessera device the kernels launch on.
    fn device(&self) -> &tessera::Device;

    /// Storage `s` seen through layout `l` as a tensor of `shape` (contiguous layouts only;
    /// `op` and `name` say whose in the error).
    fn input<'a, T: Elem>(
        &self, op: &str, name: &str, s: &'a Self::Storage, l: &Layout, shape: &[usize],
    ) -> candle_core::Result<Input<'a, T>>;

    /// candle's storage of this side inside `s` (another tensor an op reads beside its
    /// arguments), or a candle error naming `name`.
    fn storage_of<'s>(&self, name: &str, s: &'s candle_core::Storage) -> candle_core::Result<&'s Self::Storage>;

    /// A kernel's result as candle storage (flat), and its length.
    fn wrap<T: Elem>(&self, t: tessera::Tensor<T>) -> candle_core::Result<(Self::Storage, usize)>;

    /// Storage of `shape` and `dtype` on this side's device, its elements not set.
    ///
    /// # Safety
    /// Every element must be written before the storage is read or handed to candle.
    unsafe fn alloc(&self, shape: &Shape, dtype: DType) -> candle_core::Result<Self::Storage>;

    /// A kernel's output of `dims`, handed back as candle storage of `shape` after `run`
    /// writes all of it.
    fn output<T: Elem>(
        &self, dims: &[usize], shape: Shape, run: impl FnOnce(&mut tessera::Tensor<T>) -> tessera::Result<()>,
    ) -> candle_core::Result<(Self::Storage, Shape)>;

    /// `run` over the f32 storage `s` (laid out by `l`, contiguous) seen as a tensor of its
    /// shape, which `run` changes in place (an op's destination, as candle's `InplaceOp1` hands
    /// it; `op` and `name` say whose in the error).
    fn in_place<R>(
        &self, op: &str, name: &str, s: &mut Self::Storage, l: &Layout,
        run: impl FnOnce(&mut tessera::Tensor<f32>) -> candle_core::Result<R>,
    ) -> candle_core::Result<R>;

    /// This side's storage as candle's storage of any device (to make a tensor of).
    fn storage(s: Self::Storage) -> candle_core::Storage;
}

/// The interpreter's side.
struct Cpu;

/// The range of storage elements `l` covers, or a candle error asking for `.contiguous()`.
fn contiguous(op: &str, name: &str, l: &Layout) -> candle_core::Result<(usize, usize)> {
    match l.contiguous_offsets() {
        Some(range) => Ok(range),
        None => bail!("{op}: `{name}` must be contiguous (call `.contiguous()`), found strides {:?}", l.stride()),
    }
}

impl Side for Cpu {
    type Storage = CpuStorage;

    fn device(&self) -> &tessera::Device {
        interpreter()
    }

    fn storage_of<'s>(&self, name: &str, s: &'s candle_core::Storage) -> candle_core::Result<&'s CpuStorage> {
        match s {
            candle_core::Storage::Cpu(c) => Ok(c),
            _ => bail!("`{name}` must be on the CPU as the op's other tensors are"),
        }
    }

    unsafe fn alloc(&self, shape: &Shape, dtype: DType) -> candle_core::Result<CpuStorage> {
        // SAFETY: the caller writes every element first.
        unsafe { candle_core::cpu_backend::CpuDevice.alloc_uninit(shape, dtype) }
    }

    fn wrap<T: Elem>(&self, t: tessera::Tensor<T>) -> candle_core::Result<(CpuStorage, usize)> {
        let n = t.numel();
        Ok((T::to_cpu_storage_owned(t.to_host().map_err(candle_core::Error::wrap)?), n))
    }

    fn input<'a, T: Elem>(
        &self, op: &str, name: &str, s: &'a CpuStorage, l: &Layout, shape: &[usize],
    ) -> candle_core::Result<Input<'a, T>> {
        let (start, end) = contiguous(op, name, l)?;
        let data = &s.as_slice::<T>()?[start..end];
        Ok(Input::Host(tessera::Tensor::from_host(interpreter(), data, shape).map_err(candle_core::Error::wrap)?))
    }

    fn output<T: Elem>(
        &self, dims: &[usize], shape: Shape, run: impl FnOnce(&mut tessera::Tensor<T>) -> tessera::Result<()>,
    ) -> candle_core::Result<(CpuStorage, Shape)> {
        let mut y = tessera::Tensor::<T>::scratch(interpreter(), dims).map_err(candle_core::Error::wrap)?;
        run(&mut y).map_err(candle_core::Error::wrap)?;
        Ok((T::to_cpu_storage_owned(y.to_host().map_err(candle_core::Error::wrap)?), shape))
    }

    fn in_place<R>(
        &self, op: &str, name: &str, s: &mut CpuStorage, l: &Layout, run: impl FnOnce(&mut tessera::Tensor<f32>) -> candle_core::Result<R>,
    ) -> candle_core::Result<R> {
        let (start, end) = contiguous(op, name, l)?;
        let CpuStorage::F32(data) = s else { bail!("{op}: `{name}` must be F32, found {:?}", s.dtype()) };
        let wrap = candle_core::Error::wrap;
        let mut t = tessera::Tensor::from_host(interpreter(), &data[start..end], l.dims()).map_err(wrap)?;
        let r = run(&mut t)?;
        data[start..end].copy_from_slice(&t.to_host().map_err(wrap)?);
        Ok(r)
    }

    fn storage(s: CpuStorage) -> candle_core::Storage {
        candle_core::Storage::Cpu(s)
    }
}

#[cfg(feature = "cuda")]
mod cuda;
#[cfg(feature = "cuda")]
use cuda::Cuda;

/// `x`'s rows and hidden size, with each of `params` (`(name, layout, dtype)`) checked to be
/// `[hidden]` of `x`'s dtype.
fn rows_and_hidden(op: &str, x: (&Layout, DType), params: &[(&str, &Layout, DType)]) -> candle_core::Result<(usize, usize)> {
    let dims = x.0.dims();
    let Some(&hidden) = dims.last() else { bail!("{op}: `x` must have at least one axis, found a scalar") };
    for &(name, l, dt) in params {
        if l.dims() != [hidden] {
            bail!("{op}: `{name}` must be [{hidden}] (x's last axis), found {:?}", l.dims())
        }
        if dt != x.1 {
            bail!("{op}: `{name}` must be {:?} as `x` is, found {dt:?}", x.1)
        }
    }
    Ok((dims.iter().product::<usize>() / hidden.max(1), hidden))
}

/// Runs `f` for `x`'s dtype (bf16, f16 or f32; `16bit` bf16 or f16 only), a candle error for
/// another.
macro_rules! by_dtype {
    ($op:expr, $dt:expr, $f:ident ( $($arg:expr),* )) => {
        match $dt {
            DType::BF16 => $f::<half::bf16, _>($($arg),*),
            DType::F16 => $f::<half::f16, _>($($arg),*),
            DType::F32 => $f::<f32, _>($($arg),*),
            other => bail!("{}: `x` must be bf16, f16 or f32, found {other:?}", $op),
        }
    };
    (16bit $op:expr, $dt:expr, $f:ident ( $($arg:expr),* )) => {
        match $dt {
            DType::BF16 => $f::<half::bf16, _>($($arg),*),
            DType::F16 => $f::<half::f16, _>($($arg),*),
            other => bail!("{}: `x` must be bf16 or f16, found {other:?}", $op),
        }
    };
}

/// Implements a candle custom op's `cpu_fwd` and, with the `cuda` feature, `cuda_fwd`, both
/// through one function generic over the [`Side`].
macro_rules! forwards {
    ($op:ident: CustomOp1 $name:literal, |$this:ident, $side:ident, $s:ident, $l:ident| $body:expr $(; $extra:item)*) => {
        impl CustomOp1 for $op {
            fn name(&self) -> &'static str {
                $name
            }

            $($extra)*

            fn cpu_fwd(&self, $s: &CpuStorage, $l: &Layout) -> candle_core::Result<(CpuStorage, Shape)> {
                let ($this, $side) = (self, &Cpu);
                $body
            }

            #[cfg(feature = "cuda")]
            fn cuda_fwd(&self, $s: &candle_core::CudaStorage, $l: &Layout) -> candle_core::Result<(candle_core::CudaStorage, Shape)> {
                let ($this, $side) = (self, &Cuda::of($s)?);
                $body
            }
        }
    };
    ($op:ident: InplaceOp1 $name:literal, |$this:ident, $side:ident, $s:ident, $l:ident| $body:expr) => {
        impl candle_core::InplaceOp1 for $op {
            fn name(&self) -> &'static str {
                $name
            }

            fn cpu_fwd(&self, $s: &mut CpuStorage, $l: &Layout) -> candle_core::Result<()> {
                let ($this, $side) = (self, &Cpu);
                $body
            }

            #[cfg(feature = "cuda")]
            fn cuda_fwd(&self, $s: &mut candle_core::CudaStorage, $l: &Layout) -> candle_core::Result<()> {
                let ($this, $side) = (self, &Cuda::of($s)?);
                $body
            }
        }
    };
    ($op:ident: CustomOp2 $name:literal, |$this:ident, $side:ident, $s1:ident, $l1:ident, $s2:ident, $l2:ident| $body:expr $(; $extra:item)*) => {
        impl CustomOp2 for $op {
            fn name(&self) -> &'static str {
                $name
            }

            $($extra)*

            fn cpu_fwd(&self, $s1: &CpuStorage, $l1: &Layout, $s2: &CpuStorage, $l2: &Layout) -> candle_core::Result<(CpuStorage, Shape)> {
                let ($this, $side) = (self, &Cpu);
                $body
            }

            #[cfg(feature = "cuda")]
            fn cuda_fwd(
                &self, $s1: &candle_core::CudaStorage, $l1: &Layout, $s2: &candle_core::CudaStorage, $l2: &Layout,
            ) -> candle_core::Result<(candle_core::CudaStorage, Shape)> {
                let ($this, $side) = (self, &Cuda::of($s1)?);
                $body
            }
        }
    };
    ($op:ident: CustomOp3 $name:literal, |$this:ident, $side:ident, $s1:ident, $l1:ident, $s2:ident, $l2:ident, $s3:ident, $l3:ident| $body:expr $(; $extra:item)*) => {
        impl CustomOp3 for $op {
            fn name(&self) -> &'static str {
                $name
            }

            $($extra)*

            fn cpu_fwd(
                &self, $s1: &CpuStorage, $l1: &Layout, $s2: &CpuStorage, $l2: &Layout, $s3: &CpuStorage, $l3: &Layout,
            ) -> candle_core::Result<(CpuStorage, Shape)> {
                let ($this, $side) = (self, &Cpu);
                $body
            }

            #[cfg(feature = "cuda")]
            fn cuda_fwd(
                &self, $s1: &candle_core::CudaStorage, $l1: &Layout, $s2: &candle_core::CudaStorage, $l2: &Layout,
                $s3: &candle_core::CudaStorage, $l3: &Layout,
            ) -> candle_core::Result<(candle_core::CudaStorage, Shape)> {
                let ($this, $side) = (self, &Cuda::of($s1)?);
                $body
            }
        }
    };
}

fn softmax_run<T: Elem + SoftmaxElement, S: Side>(
    side: &S, s: &S::Storage, l: &Layout, rows: usize, n: usize,
) -> candle_core::Result<(S::Storage, Shape)> {
    let x = side.input::<T>("softmax_last_dim", "x", s, l, &[rows, n])?;
    side.output(&[rows, n], l.shape().clone(), |y| tessera_kernels::softmax(side.device(), &x, y))
}

/// `x` `[…, K]` and `w` `[N, K]` as `(M, K, N)`, `x`'s shape with `N` last.
fn linear_shapes(x: (&Layout, DType), w: (&Layout, DType)) -> candle_core::Result<(usize, usize, usize, Shape)> {
    let (xd, wd) = (x.0.dims(), w.0.dims());
    let Some(&k) = xd.last() else { bail!("linear: `x` must have at least one axis, found a scalar") };
    let [n, kw] = *wd else { bail!("linear: `w` must be [N, {k}] (N×K, K as x's last axis), found {wd:?}") };
    if kw != k {
        bail!("linear: `w` must be [N, {k}] (N×K, K as x's last axis), found {wd:?}")
    }
    if w.1 != x.1 {
        bail!("linear: `w` must be {:?} as `x` is, found {:?}", x.1, w.1)
    }
    let mut out = xd.to_vec();
    if let Some(last) = out.last_mut() {
        *last = n;
    }
    Ok((xd.iter().product::<usize>() / k.max(1), k, n, Shape::from(out)))
}

/// [`Linear`]'s checks of its bias, `[N]` of `x`'s dtype.
fn check_bias(l: &Layout, dtype: DType, x: DType, n: usize) -> candle_core::Result<()> {
    if l.dims() != [n] || dtype != x {
        bail!("linear: `bias` must be [{n}] of {x:?}, found {:?} of {dtype:?}", l.dims())
    }
    Ok(())
}

fn linear_run<T: Elem + GemmElement, S: Side>(
    side: &S, act: Activation, (sx, lx): (&S::Storage, &Layout), (sw, lw): (&S::Storage, &Layout), bias: Option<(&S::Storage, &Layout)>,
    (m, k, n, shape): (usize, usize, usize, Shape),
) -> candle_core::Result<(S::Storage, Shape)> {
    let x = side.input::<T>("linear", "x", sx, lx, &[m, k])?;
    let w = side.input::<T>("linear", "w", sw, lw, &[n, k])?;
    let b = bias.map(|(sb, lb)| side.input::<T>("linear", "bias", sb, lb, &[n])).transpose()?;
    side.output(&[m, n], shape, |y| {
        let mut g = tessera_kernels::gemm(&x, &w).activation(act);
        if let Some(b) = &b {
            g = g.bias(tessera_kernels::Bias::PerColumn(b));
        }
        g.run(side.device(), y)
    })
}

fn linear_residual_run<T: Elem + GemmElement, S: Side>(
    side: &S, (sx, lx): (&S::Storage, &Layout), (sw, lw): (&S::Storage, &Layout), (sr, lr): (&S::Storage, &Layout),
    (m, k, n, shape): (usize, usize, usize, Shape),
) -> candle_core::Result<(S::Storage, Shape)> {
    let x = side.input::<T>("linear_residual", "x", sx, lx, &[m, k])?;
    let w = side.input::<T>("linear_residual", "w", sw, lw, &[n, k])?;
    let r = side.input::<T>("linear_residual", "residual", sr, lr, &[m, n])?;
    side.output(&[m, n], shape, |y| tessera_kernels::gemm(&x, &w).residual(&r).run(side.device(), y))
}

fn swiglu_run<T: Elem + GemmElement, S: Side>(
    side: &S, (sx, lx): (&S::Storage, &Layout), (sg, lg): (&S::Storage, &Layout), (su, lu): (&S::Storage, &Layout),
    (m, k, n, shape): (usize, usize, usize, Shape),
) -> candle_core::Result<(S::Storage, Shape)> {
    let x = side.input::<T>("swiglu", "x", sx, lx, &[m, k])?;
    let wg = side.input::<T>("swiglu", "w_gate", sg, lg, &[n, k])?;
    let wu = side.input::<T>("swiglu", "w_up", su, lu, &[n, k])?;
    let dev = side.device();
    side.output(&[m, n], shape, |y| {
        let mut up = tessera::Tensor::<T>::scratch(dev, &[m, n])?;
        tessera_kernels::gemm(&x, &wu).run(dev, &mut up)?;
        tessera_kernels::gemm(&x, &wg).activation(Activation::Silu).gate(&up).run(dev, y)
    })
}

fn attention_run<T: Elem + AttentionElement, S: Side>(
    op: &Attention, side: &S, (sq, lq): (&S::Storage, &Layout), (sk, lk): (&S::Storage, &Layout), (sv, lv): (&S::Storage, &Layout),
) -> candle_core::Result<(S::Storage, Shape)> {
    for (name, l) in [("q", lq), ("k", lk), ("v", lv)] {
        if l.dims().len() != 4 {
            bail!("attention: `{name}` must be 4-D ([batch, seq, heads, dim]), found {:?}", l.dims())
        }
    }
    let q = side.input::<T>("attention", "q", sq, lq, lq.dims())?;
    let k = side.input::<T>("attention", "k", sk, lk, lk.dims())?;
    let v = side.input::<T>("attention", "v", sv, lv, lv.dims())?;
    let cfg = op.config();
    side.output(lq.dims(), lq.shape().clone(), |o| tessera_kernels::attention(side.device(), &cfg, &q, &k, &v, o))
}

impl Attention {
    /// The kernels' options.
    fn config(&self) -> tessera_kernels::Attention {
        let cfg = tessera_kernels::Attention::new().causal(self.causal);
        match self.scale {
            Some(scale) => cfg.scale(scale),
            None => cfg,
        }
    }
}

/// [`attention`]'s backward over `(q, k, v)` with the output's gradient `dout` beside: `dq`,
/// `dk`, `dv` flattened one after another (a candle op keeps one output).
struct AttentionBackward {
    forward: Attention,
    dout: Tensor,
}

fn attention_backward_run<T: Elem + AttentionElement, S: Side>(
    op: &AttentionBackward, side: &S, (sq, lq): (&S::Storage, &Layout), (sk, lk): (&S::Storage, &Layout), (sv, lv): (&S::Storage, &Layout),
) -> candle_core::Result<(S::Storage, Shape)> {
    let name = "attention backward";
    let q = side.input::<T>(name, "q", sq, lq, lq.dims())?;
    let k = side.input::<T>(name, "k", sk, lk, lk.dims())?;
    let v = side.input::<T>(name, "v", sv, lv, lv.dims())?;
    let (ds, dl) = op.dout.storage_and_layout();
    if dl.dims() != lq.dims() {
        bail!("{name}: `dout` must be q's shape {:?}, found {:?}", lq.dims(), dl.dims())
    }
    let dout = side.input::<T>(name, "dout", side.storage_of("dout", &ds)?, dl, dl.dims())?;
    let (dev, cfg) = (side.device(), op.forward.config());
    let [b, s, h, _] = *lq.dims() else { bail!("{name}: `q` must be 4-D, found {:?}", lq.dims()) };
    let wrap = candle_core::Error::wrap;
    let mut o = tessera::Tensor::<T>::scratch(dev, lq.dims()).map_err(wrap)?;
    let mut lse = tessera::Tensor::<f32>::scratch(dev, &[b, h, s]).map_err(wrap)?;
    tessera_kernels::attention_with_lse(dev, &cfg, &q, &k, &v, &mut o, &mut lse).map_err(wrap)?;
    let g = tessera_kernels::attention_backward(dev, &cfg, &q, &k, &v, &o, &lse, &dout).map_err(wrap)?;
    mixers::concat_as(side, vec![side.wrap(g.dq)?, side.wrap(g.dk)?, side.wrap(g.dv)?], <T as WithDType>::DTYPE)
}

fn scan_run<T: Elem + ScanElement, S: Side>(op: &Scan, side: &S, s: &S::Storage, l: &Layout) -> candle_core::Result<(S::Storage, Shape)> {
    if l.dims().is_empty() {
        bail!("scan: `x` must have at least one axis, found a scalar")
    }
    let x = side.input::<T>("scan", "x", s, l, l.dims())?;
    let dev = side.device();
    side.output(l.dims(), l.shape().clone(), |y| match op.kind {
        ScanKind::Cumsum => tessera_kernels::cumsum(dev, &x, y),
        ScanKind::Cumprod => tessera_kernels::cumprod(dev, &x, y),
        ScanKind::LogCumSumExp => tessera_kernels::logcumsumexp(dev, &x, y),
    })
}

fn scan_backward_run<T: Elem + ScanElement, S: Side>(
    op: &ScanBackward, side: &S, s: &S::Storage, l: &Layout,
) -> candle_core::Result<(S::Storage, Shape)> {
    let name = "scan backward";
    let dy = side.input::<T>(name, "dy", s, l, l.dims())?;
    let (xs, xl) = op.x.storage_and_layout();
    let (ys, yl) = op.y.storage_and_layout();
    let x = side.input::<T>(name, "x", side.storage_of("x", &xs)?, xl, l.dims())?;
    let y = side.input::<T>(name, "y", side.storage_of("y", &ys)?, yl, l.dims())?;
    let dev = side.device();
    side.output(l.dims(), l.shape().clone(), |dx| match op.kind {
        ScanKind::Cumsum => tessera_kernels::cumsum_backward(dev, &dy, dx),
        ScanKind::Cumprod => tessera_kernels::cumprod_backward(dev, &x, &y, &dy, dx),
        ScanKind::LogCumSumExp => tessera_kernels::logcumsumexp_backward(dev, &x, &y, &dy, dx),
    })
}

fn rope_run<T: Elem + RopeElement, S: Side>(op: &Rope, side: &S, s: &S::Storage, l: &Layout) -> candle_core::Result<(S::Storage, Shape)> {
    let dims = l.dims();
    if dims.len() != 4 {
        bail!("rope: `x` must be 4-D ([batch, seq, heads, dim] or [batch, heads, seq, dim]), found {dims:?}")
    }
    let x = side.input::<T>("rope", "x", s, l, dims)?;
    let cfg = tessera_kernels::Rope::new(op.style, op.layout).base(op.base).positions(tessera_kernels::Positions::Offset(op.offset));
    side.output(dims, l.shape().clone(), |y| tessera_kernels::rope(side.device(), &cfg, &x, y))
}

fn rms_norm_run<T: Elem + NormElement, S: Side>(
    eps: f32, side: &S, (s1, l1): (&S::Storage, &Layout), (s2, l2): (&S::Storage, &Layout), rows: usize, hidden: usize,
) -> candle_core::Result<(S::Storage, Shape)> {
    let x = side.input::<T>("rms_norm", "x", s1, l1, &[rows, hidden])?;
    let w = side.input::<T>("rms_norm", "weight", s2, l2, &[hidden])?;
    side.output(&[rows, hidden], l1.shape().clone(), |y| tessera_kernels::rms_norm(side.device(), &x, Some(&w), eps, y))
}

#[allow(clippy::too_many_arguments)]
fn layer_norm_run<T: Elem + NormElement, S: Side>(
    eps: f32, side: &S, (s1, l1): (&S::Storage, &Layout), (s2, l2): (&S::Storage, &Layout), (s3, l3): (&S::Storage, &Layout), rows: usize,
    hidden: usize,
) -> candle_core::Result<(S::Storage, Shape)> {
    let x = side.input::<T>("layer_norm", "x", s1, l1, &[rows, hidden])?;
    let w = side.input::<T>("layer_norm", "weight", s2, l2, &[hidden])?;
    let b = side.input::<T>("layer_norm", "bias", s3, l3, &[hidden])?;
    side.output(&[rows, hidden], l1.shape().clone(), |y| tessera_kernels::layer_norm(side.device(), &x, Some(&w), Some(&b), eps, y))
}

/// Which fused norm an `add_*_norm` op runs.
#[derive(Clone, Copy)]
struct NormSpec {
    layer: bool,
    eps: f32,
}

/// [`rows_and_hidden`] for an `add_*_norm` op: `residual` checked to be `x`'s shape and dtype.
fn residual_and_hidden(
    op: &str, x: (&Layout, DType), residual: (&Layout, DType), params: &[(&str, &Layout, DType)],
) -> candle_core::Result<(usize, usize)> {
    if residual.0.dims() != x.0.dims() || residual.1 != x.1 {
        bail!("{op}: `residual` must be {:?} {:?} as `x` is, found {:?} {:?}", x.0.dims(), x.1, residual.0.dims(), residual.1)
    }
    rows_and_hidden(op, x, params)
}

/// The `add_*_norm` ops: `[2, …]` storage holding `y` then `h = x + residual`, from one launch
/// of the fused norm ([`tessera_kernels::Norm::forward_stacked`]).
fn add_norm_run<T: Elem + NormElement, S: Side>(
    norm: NormSpec, side: &S, [(s1, l1), (s2, l2), (s3, l3)]: [(&S::Storage, &Layout); 3], bias: Option<(&S::Storage, &Layout)>,
    rows: usize, hidden: usize,
) -> candle_core::Result<(S::Storage, Shape)> {
    let op = if norm.layer { "add_layer_norm" } else { "add_rms_norm" };
    let x = side.input::<T>(op, "x", s1, l1, &[rows, hidden])?;
    let r = side.input::<T>(op, "residual", s2, l2, &[rows, hidden])?;
    let w = side.input::<T>(op, "weight", s3, l3, &[hidden])?;
    let b = bias.map(|(s, l)| side.input::<T>(op, "bias", s, l, &[hidden])).transpose()?;
    let mut dims = vec![2];
    dims.extend_from_slice(l1.dims());
    side.output(&[2, rows, hidden], Shape::from(dims), |yh| {
        let base = if norm.layer { tessera_kernels::Norm::layer(norm.eps) } else { tessera_kernels::Norm::rms(norm.eps) };
        let mut n = base.weight(&w).residual(&r);
        if let Some(b) = &b {
            n = n.bias(b);
        }
        n.forward_stacked(side.device(), &x, yh)
    })
}

mod mixers;
pub use mixers::{
    linear_attention, linear_attention_step, selective_scan, selective_scan_step, ssd, FeatureMap, LinearAttentionOptions,
    SelectiveScanOptions, SsdOptions,
};
mod fp8;
pub use fp8::{dequantize_fp8, quantize_fp8, DequantizeFp8, QuantizeFp8};

forwards!(Rope: CustomOp1 "tessera-rope", |op, side, s, l| by_dtype!("rope", s.dtype(), rope_run(op, side, s, l)));

forwards!(Scan: CustomOp1 "tessera-scan", |op, side, s, l| by_dtype!("scan", s.dtype(), scan_run(op, side, s, l));
    fn bwd(&self, x: &Tensor, y: &Tensor, dy: &Tensor) -> candle_core::Result<Option<Tensor>> {
        let op = ScanBackward { kind: self.kind, x: x.contiguous()?, y: y.contiguous()? };
        Ok(Some(dy.contiguous()?.apply_op1_no_bwd(&op)?))
    }
);

forwards!(ScanBackward: CustomOp1 "tessera-scan-backward", |op, side, s, l| by_dtype!("scan backward", s.dtype(), scan_backward_run(op, side, s, l)));

forwards!(SoftmaxLastDim: CustomOp1 "tessera-softmax-last-dim", |_op, side, s, l| {
    let (rows, n) = rows_and_hidden("softmax_last_dim", (l, s.dtype()), &[])?;
    by_dtype!("softmax_last_dim", s.dtype(), softmax_run(side, s, l, rows, n))
});

forwards!(Linear: CustomOp2 "tessera-linear", |op, side, s1, l1, s2, l2| {
    let shapes = linear_shapes((l1, s1.dtype()), (l2, s2.dtype()))?;
    by_dtype!(16bit "linear", s1.dtype(), linear_run(side, op.activation, (s1, l1), (s2, l2), None, shapes))
});

forwards!(Linear: CustomOp3 "tessera-linear-bias", |op, side, s1, l1, s2, l2, s3, l3| {
    let shapes = linear_shapes((l1, s1.dtype()), (l2, s2.dtype()))?;
    check_bias(l3, s3.dtype(), s1.dtype(), shapes.2)?;
    by_dtype!(16bit "linear", s1.dtype(), linear_run(side, op.activation, (s1, l1), (s2, l2), Some((s3, l3)), shapes))
});

forwards!(LinearResidual: CustomOp3 "tessera-linear-residual", |_op, side, s1, l1, s2, l2, s3, l3| {
    let shapes = linear_shapes((l1, s1.dtype()), (l2, s2.dtype()))?;
    if l3.shape() != &shapes.3 || s3.dtype() != s1.dtype() {
        bail!("linear_residual: `residual` must be {:?} of {:?}, found {:?} of {:?}", shapes.3.dims(), s1.dtype(), l3.dims(), s3.dtype())
    }
    by_dtype!(16bit "linear_residual", s1.dtype(), linear_residual_run(side, (s1, l1), (s2, l2), (s3, l3), shapes))
});

forwards!(SwiGlu: CustomOp3 "tessera-swiglu", |_op, side, s1, l1, s2, l2, s3, l3| {
    let shapes = linear_shapes((l1, s1.dtype()), (l2, s2.dtype()))?;
    if l3.dims() != l2.dims() || s3.dtype() != s2.dtype() {
        bail!("swiglu: `w_up` must be {:?} of {:?} as `w_gate` is, found {:?} of {:?}", l2.dims(), s2.dtype(), l3.dims(), s3.dtype())
    }
    by_dtype!(16bit "swiglu", s1.dtype(), swiglu_run(side, (s1, l1), (s2, l2), (s3, l3), shapes))
});

/// `k` and `v` of `q`'s dtype.
fn check_attention_dtypes(q: DType, k: DType, v: DType) -> candle_core::Result<()> {
    for (name, dt) in [("k", k), ("v", v)] {
        if dt != q {
            bail!("attention: `{name}` must be {q:?} as `q` is, found {dt:?}")
        }
    }
    Ok(())
}

forwards!(Attention: CustomOp3 "tessera-attention", |op, side, s1, l1, s2, l2, s3, l3| {
    check_attention_dtypes(s1.dtype(), s2.dtype(), s3.dtype())?;
    by_dtype!(16bit "attention", s1.dtype(), attention_run(op, side, (s1, l1), (s2, l2), (s3, l3)))
};
    fn bwd(&self, q: &Tensor, k: &Tensor, v: &Tensor, _o: &Tensor, dout: &Tensor) -> candle_core::Result<(Option<Tensor>, Option<Tensor>, Option<Tensor>)> {
        let grads = q.apply_op3_no_bwd(k, v, &AttentionBackward { forward: *self, dout: dout.contiguous()? })?;
        let (nq, nk) = (q.elem_count(), k.elem_count());
        let dq = grads.narrow(0, 0, nq)?.reshape(q.shape())?;
        let dk = grads.narrow(0, nq, nk)?.reshape(k.shape())?;
        let dv = grads.narrow(0, nq + nk, nk)?.reshape(v.shape())?;
        Ok((Some(dq), Some(dk), Some(dv)))
    }
);

forwards!(AttentionBackward: CustomOp3 "tessera-attention-backward", |op, side, s1, l1, s2, l2, s3, l3| {
    check_attention_dtypes(s1.dtype(), s2.dtype(), s3.dtype())?;
    by_dtype!(16bit "attention backward", s1.dtype(), attention_backward_run(op, side, (s1, l1), (s2, l2), (s3, l3)))
});

forwards!(RmsNorm: CustomOp2 "tessera-rms-norm", |op, side, s1, l1, s2, l2| {
    let (rows, hidden) = rows_and_hidden("rms_norm", (l1, s1.dtype()), &[("weight", l2, s2.dtype())])?;
    by_dtype!("rms_norm", s1.dtype(), rms_norm_run(op.eps, side, (s1, l1), (s2, l2), rows, hidden))
});

forwards!(AddRmsNorm: CustomOp3 "tessera-add-rms-norm", |op, side, s1, l1, s2, l2, s3, l3| {
    let (rows, hidden) = residual_and_hidden("add_rms_norm", (l1, s1.dtype()), (l2, s2.dtype()), &[("weight", l3, s3.dtype())])?;
    let norm = NormSpec { layer: false, eps: op.eps };
    by_dtype!("add_rms_norm", s1.dtype(), add_norm_run(norm, side, [(s1, l1), (s2, l2), (s3, l3)], None, rows, hidden))
});

forwards!(AddLayerNorm: CustomOp3 "tessera-add-layer-norm", |op, side, s1, l1, s2, l2, s3, l3| {
    let (bs, bl) = op.bias.storage_and_layout();
    let params = [("weight", l3, s3.dtype()), ("bias", bl, op.bias.dtype())];
    let (rows, hidden) = residual_and_hidden("add_layer_norm", (l1, s1.dtype()), (l2, s2.dtype()), &params)?;
    let bias = (side.storage_of("bias", &bs)?, bl);
    let norm = NormSpec { layer: true, eps: op.eps };
    by_dtype!("add_layer_norm", s1.dtype(), add_norm_run(norm, side, [(s1, l1), (s2, l2), (s3, l3)], Some(bias), rows, hidden))
});

forwards!(LayerNorm: CustomOp3 "tessera-layer-norm", |op, side, s1, l1, s2, l2, s3, l3| {
    let params = [("weight", l2, s2.dtype()), ("bias", l3, s3.dtype())];
    let (rows, hidden) = rows_and_hidden("layer_norm", (l1, s1.dtype()), &params)?;
    by_dtype!("layer_norm", s1.dtype(), layer_norm_run(op.eps, side, (s1, l1), (s2, l2), (s3, l3), rows, hidden))
});
