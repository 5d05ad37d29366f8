//! Tessera's kernels inside [candle](https://github.com/huggingface/candle): candle custom ops
//! (`CustomOp2`, `CustomOp3`) that run Tessera's library kernels on candle tensors, so that a
//! model written in candle calls them as it calls its own ops.
//!
//! So far the CPU path: a candle CPU tensor runs through Tessera's interpreter — the same
//! kernels, the same f32 statistics, no GPU — so that a model's tests run anywhere. The CUDA
//! path (the kernels launched on candle's own stream and buffers, no copy, no sync) needs
//! candle's `cuda` feature, which builds candle's own kernels with nvcc: it comes once that
//! build runs without a hand-installed toolkit (issue 30). A CUDA tensor is refused with a
//! candle error until then, never a panic.
//!
//! ```
//! use candle_core::{DType, Device, Tensor};
//! let x = Tensor::randn(0f32, 1.0, (2, 7, 96), &Device::Cpu)?.to_dtype(DType::BF16)?;
//! let w = Tensor::ones(96, DType::BF16, &Device::Cpu)?;
//! let y = tessera_candle::rms_norm(&x, &w, 1e-6)?;
//! assert_eq!(y.dims(), &[2, 7, 96]);
//! # Ok::<(), candle_core::Error>(())
//! ```

use candle_core::backend::BackendStorage;
use candle_core::{bail, CpuStorage, CustomOp1, CustomOp2, CustomOp3, DType, Layout, Shape, Tensor, WithDType};
use std::sync::OnceLock;
pub use tessera_kernels::{Activation, HeadLayout, RopeStyle};
use tessera_kernels::{GemmElement, NormElement, RopeElement, SoftmaxElement};

/// `y = x / sqrt(mean(x²) + eps) · weight` over the last axis of `x` (any rank ≥ 1, bf16, f16
/// or f32, contiguous), `weight` `[hidden]` of `x`'s dtype; f32 statistics
/// ([`tessera_kernels::rms_norm`]). No gradient: the op is for inference (`apply_op2_no_bwd`).
///
/// # Errors
/// A candle error when a dtype, shape or layout does not fit (saying which tensor and what was
/// expected), for a CUDA tensor (not yet), or when the kernel fails.
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

/// The interpreter's device, made once.
fn interpreter() -> &'static tessera::Device {
    static DEVICE: OnceLock<tessera::Device> = OnceLock::new();
    DEVICE.get_or_init(tessera::Device::cpu)
}

/// A candle CPU tensor's elements as a Tessera tensor of `shape` on the interpreter: contiguous
/// layouts only (`op` and `name` say whose in the error).
fn host_tensor<T: WithDType + tessera::Element>(
    op: &str, name: &str, s: &CpuStorage, l: &Layout, shape: &[usize],
) -> candle_core::Result<tessera::Tensor<T>> {
    let Some((start, end)) = l.contiguous_offsets() else {
        bail!("{op}: `{name}` must be contiguous (call `.contiguous()`), found strides {:?}", l.stride())
    };
    let data = &s.as_slice::<T>()?[start..end];
    tessera::Tensor::from_host(interpreter(), data, shape).map_err(candle_core::Error::wrap)
}

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
            DType::BF16 => $f::<half::bf16>($($arg),*),
            DType::F16 => $f::<half::f16>($($arg),*),
            DType::F32 => $f::<f32>($($arg),*),
            other => bail!("{}: `x` must be bf16, f16 or f32, found {other:?}", $op),
        }
    };
    (16bit $op:expr, $dt:expr, $f:ident ( $($arg:expr),* )) => {
        match $dt {
            DType::BF16 => $f::<half::bf16>($($arg),*),
            DType::F16 => $f::<half::f16>($($arg),*),
            other => bail!("{}: `x` must be bf16 or f16, found {other:?}", $op),
        }
    };
}

/// A kernel's output of `dims` on the interpreter, handed back as candle storage of `shape`
/// after `run` writes it.
fn output<T: WithDType + tessera::Element>(
    dims: &[usize], shape: Shape, run: impl FnOnce(&mut tessera::Tensor<T>) -> tessera::Result<()>,
) -> candle_core::Result<(CpuStorage, Shape)> {
    let mut y = tessera::Tensor::<T>::zeros(interpreter(), dims).map_err(candle_core::Error::wrap)?;
    run(&mut y).map_err(candle_core::Error::wrap)?;
    Ok((T::to_cpu_storage_owned(y.to_host().map_err(candle_core::Error::wrap)?), shape))
}

fn softmax_cpu<T: WithDType + SoftmaxElement>(
    s: &CpuStorage, l: &Layout, rows: usize, n: usize,
) -> candle_core::Result<(CpuStorage, Shape)> {
    let x = host_tensor::<T>("softmax_last_dim", "x", s, l, &[rows, n])?;
    output(&[rows, n], l.shape().clone(), |y| tessera_kernels::softmax(interpreter(), &x, y))
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

fn linear_cpu<T: WithDType + GemmElement>(
    act: Activation, (sx, lx): (&CpuStorage, &Layout), (sw, lw): (&CpuStorage, &Layout), bias: Option<(&CpuStorage, &Layout)>,
    (m, k, n, shape): (usize, usize, usize, Shape),
) -> candle_core::Result<(CpuStorage, Shape)> {
    let x = host_tensor::<T>("linear", "x", sx, lx, &[m, k])?;
    let w = host_tensor::<T>("linear", "w", sw, lw, &[n, k])?;
    let b = bias.map(|(sb, lb)| host_tensor::<T>("linear", "bias", sb, lb, &[n])).transpose()?;
    output(&[m, n], shape, |y| {
        let mut g = tessera_kernels::gemm(&x, &w).activation(act);
        if let Some(b) = &b {
            g = g.bias(tessera_kernels::Bias::PerColumn(b));
        }
        g.run(interpreter(), y)
    })
}

fn rope_cpu<T: WithDType + RopeElement>(op: &Rope, s: &CpuStorage, l: &Layout) -> candle_core::Result<(CpuStorage, Shape)> {
    let dims = l.dims();
    if dims.len() != 4 {
        bail!("rope: `x` must be 4-D ([batch, seq, heads, dim] or [batch, heads, seq, dim]), found {dims:?}")
    }
    let x = host_tensor::<T>("rope", "x", s, l, dims)?;
    let cfg = tessera_kernels::Rope::new(op.style, op.layout).base(op.base).positions(tessera_kernels::Positions::Offset(op.offset));
    output(dims, l.shape().clone(), |y| tessera_kernels::rope(interpreter(), &cfg, &x, y))
}

impl CustomOp1 for Rope {
    fn name(&self) -> &'static str {
        "tessera-rope"
    }

    fn cpu_fwd(&self, s: &CpuStorage, l: &Layout) -> candle_core::Result<(CpuStorage, Shape)> {
        by_dtype!("rope", s.dtype(), rope_cpu(self, s, l))
    }
}

impl CustomOp1 for SoftmaxLastDim {
    fn name(&self) -> &'static str {
        "tessera-softmax-last-dim"
    }

    fn cpu_fwd(&self, s: &CpuStorage, l: &Layout) -> candle_core::Result<(CpuStorage, Shape)> {
        let (rows, n) = rows_and_hidden("softmax_last_dim", (l, s.dtype()), &[])?;
        by_dtype!("softmax_last_dim", s.dtype(), softmax_cpu(s, l, rows, n))
    }
}

impl CustomOp2 for Linear {
    fn name(&self) -> &'static str {
        "tessera-linear"
    }

    fn cpu_fwd(&self, s1: &CpuStorage, l1: &Layout, s2: &CpuStorage, l2: &Layout) -> candle_core::Result<(CpuStorage, Shape)> {
        let shapes = linear_shapes((l1, s1.dtype()), (l2, s2.dtype()))?;
        by_dtype!(16bit "linear", s1.dtype(), linear_cpu(self.activation, (s1, l1), (s2, l2), None, shapes))
    }
}

impl CustomOp3 for Linear {
    fn name(&self) -> &'static str {
        "tessera-linear-bias"
    }

    fn cpu_fwd(
        &self, s1: &CpuStorage, l1: &Layout, s2: &CpuStorage, l2: &Layout, s3: &CpuStorage, l3: &Layout,
    ) -> candle_core::Result<(CpuStorage, Shape)> {
        let shapes = linear_shapes((l1, s1.dtype()), (l2, s2.dtype()))?;
        let n = shapes.2;
        if l3.dims() != [n] || s3.dtype() != s1.dtype() {
            bail!("linear: `bias` must be [{n}] of {:?}, found {:?} of {:?}", s1.dtype(), l3.dims(), s3.dtype())
        }
        by_dtype!(16bit "linear", s1.dtype(), linear_cpu(self.activation, (s1, l1), (s2, l2), Some((s3, l3)), shapes))
    }
}

fn rms_norm_cpu<T: WithDType + NormElement>(
    eps: f32, (s1, l1): (&CpuStorage, &Layout), (s2, l2): (&CpuStorage, &Layout), rows: usize, hidden: usize,
) -> candle_core::Result<(CpuStorage, Shape)> {
    let x = host_tensor::<T>("rms_norm", "x", s1, l1, &[rows, hidden])?;
    let w = host_tensor::<T>("rms_norm", "weight", s2, l2, &[hidden])?;
    output(&[rows, hidden], l1.shape().clone(), |y| tessera_kernels::rms_norm(interpreter(), &x, Some(&w), eps, y))
}

fn layer_norm_cpu<T: WithDType + NormElement>(
    eps: f32, (s1, l1): (&CpuStorage, &Layout), (s2, l2): (&CpuStorage, &Layout), (s3, l3): (&CpuStorage, &Layout), rows: usize,
    hidden: usize,
) -> candle_core::Result<(CpuStorage, Shape)> {
    let x = host_tensor::<T>("layer_norm", "x", s1, l1, &[rows, hidden])?;
    let w = host_tensor::<T>("layer_norm", "weight", s2, l2, &[hidden])?;
    let b = host_tensor::<T>("layer_norm", "bias", s3, l3, &[hidden])?;
    output(&[rows, hidden], l1.shape().clone(), |y| tessera_kernels::layer_norm(interpreter(), &x, Some(&w), Some(&b), eps, y))
}

impl CustomOp2 for RmsNorm {
    fn name(&self) -> &'static str {
        "tessera-rms-norm"
    }

    fn cpu_fwd(&self, s1: &CpuStorage, l1: &Layout, s2: &CpuStorage, l2: &Layout) -> candle_core::Result<(CpuStorage, Shape)> {
        let (rows, hidden) = rows_and_hidden("rms_norm", (l1, s1.dtype()), &[("weight", l2, s2.dtype())])?;
        by_dtype!("rms_norm", s1.dtype(), rms_norm_cpu(self.eps, (s1, l1), (s2, l2), rows, hidden))
    }
}

impl CustomOp3 for LayerNorm {
    fn name(&self) -> &'static str {
        "tessera-layer-norm"
    }

    fn cpu_fwd(
        &self, s1: &CpuStorage, l1: &Layout, s2: &CpuStorage, l2: &Layout, s3: &CpuStorage, l3: &Layout,
    ) -> candle_core::Result<(CpuStorage, Shape)> {
        let params = [("weight", l2, s2.dtype()), ("bias", l3, s3.dtype())];
        let (rows, hidden) = rows_and_hidden("layer_norm", (l1, s1.dtype()), &params)?;
        by_dtype!("layer_norm", s1.dtype(), layer_norm_cpu(self.eps, (s1, l1), (s2, l2), (s3, l3), rows, hidden))
    }
}
