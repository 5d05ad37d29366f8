//! The scan family's sequence mixers as candle ops: Mamba's selective scan, Mamba-2's SSD and
//! causal linear attention, registered with candle's autograd (their backwards run Tessera's).
//!
//! A candle op takes three tensors at most, and a selective scan takes up to eight. So an op
//! here takes two packed tensors: those of the input's dtype flattened one after another into
//! one, the f32 ones into another ([`Packed`]; `Tensor::cat`, one copy of the inputs, which
//! candle's autograd differentiates back to each). The op reads its parts in place; its backward
//! hands every gradient back in one f32 tensor, cut apart and cast to each packed tensor's
//! dtype. Where no input needs a gradient (inference: no input is a `Var` or computed from one)
//! nothing is packed: the op is applied to its first tensor and reads the others' storages
//! where they lie (a copy only of those not contiguous).

#[cfg(feature = "cuda")]
use crate::Cuda;
use crate::{contiguous, Cpu, Elem, Input, Side};
use candle_core::backend::BackendStorage;
use candle_core::{bail, CpuStorage, CustomOp1, CustomOp2, CustomOp3, DType, Layout, Shape, Tensor};
pub use tessera_kernels::FeatureMap;
use tessera_kernels::{LinearAttentionElement, SelectiveScanElement, SsdElement};

/// Tensors of one dtype flattened one after another into one (a candle op takes three tensors
/// at most): the packed tensor, and each part's name and shape.
#[derive(Clone)]
struct Packed {
    tensor: Tensor,
    parts: Vec<(&'static str, Vec<usize>)>,
}

impl Packed {
    /// `parts` (each `(name, tensor)`, every one of `dtype` and on `device`) packed; `op` names
    /// the op in the error where a part's dtype or device is not that.
    fn new(op: &str, dtype: DType, device: &candle_core::Device, parts: &[(&'static str, &Tensor)]) -> candle_core::Result<Packed> {
        check_parts(op, dtype, device, parts)?;
        let tensor = padded_cat(parts.iter().map(|(_, t)| t.flatten_all()), dtype, device)?;
        Ok(Packed { tensor, parts: parts.iter().map(|(name, t)| (*name, t.dims().to_vec())).collect() })
    }

    /// Every part of the packed storage `s` (laid out by `l`) as a kernel input of its shape,
    /// by name.
    fn read<'a, T: Elem, S: Side>(
        &self, side: &S, op: &str, s: &'a S::Storage, l: &Layout,
    ) -> candle_core::Result<Vec<(&'static str, Input<'a, T>)>> {
        let (mut at, _) = contiguous(op, "the packed inputs", l)?;
        let mut out = Vec::with_capacity(self.parts.len());
        for (name, shape) in &self.parts {
            let part = Layout::contiguous_with_offset(shape.clone(), at);
            out.push((*name, side.input::<T>(op, name, s, &part, shape)?));
            at += aligned(self.tensor.dtype(), shape.iter().product::<usize>());
        }
        Ok(out)
    }
}

/// A candle error naming the first of `parts` not of `dtype` or not on `device` (`op` names the
/// op).
fn check_parts(op: &str, dtype: DType, device: &candle_core::Device, parts: &[(&'static str, &Tensor)]) -> candle_core::Result<()> {
    for (name, t) in parts {
        if t.dtype() != dtype {
            bail!("{op}: `{name}` must be {dtype:?}, found {:?}", t.dtype())
        }
        if !t.device().same_device(device) {
            bail!(
                "{op}: `{name}` must be on the device of the op's first tensor ({:?}), found {:?}",
                device.location(),
                t.device().location()
            )
        }
    }
    Ok(())
}

/// Flat tensors of `dtype` one after another, each starting 16 bytes aligned as TMA copies
/// need (zeros pad the one before): how a [`Packed`] tensor, and its gradient, lie.
fn padded_cat(
    flat: impl Iterator<Item = candle_core::Result<Tensor>>, dtype: DType, device: &candle_core::Device,
) -> candle_core::Result<Tensor> {
    let mut pieces = Vec::new();
    for t in flat {
        let t = t?;
        let pad = aligned(dtype, t.elem_count()) - t.elem_count();
        pieces.push(t);
        if pad > 0 {
            pieces.push(Tensor::zeros(pad, dtype, device)?);
        }
    }
    if pieces.is_empty() {
        Tensor::zeros(0, dtype, device)
    } else {
        Tensor::cat(&pieces, 0)
    }
}

/// `n` elements of `dtype` rounded up to a whole number of 16 bytes.
fn aligned(dtype: DType, n: usize) -> usize {
    let per = (16 / dtype.size_in_bytes()).max(1);
    n.div_ceil(per) * per
}

/// An op's inputs: packed into two tensors, those of the op's dtype and the f32 ones, where some
/// input needs a gradient; else each as given.
#[derive(Clone)]
enum Inputs {
    Packed {
        own: Packed,
        f32s: Packed,
    },
    /// No input needs a gradient: the op is applied to the first of `own` and reads every other
    /// one's storage (each contiguous: a copy made only of those that were not).
    Given {
        own: Vec<(&'static str, Tensor)>,
        f32s: Vec<(&'static str, Tensor)>,
    },
}

/// What candle hands an op's forward: the two packed tensors' storages, or (inputs taken as
/// given) the first input's.
enum Handed<'a, S: Side> {
    Packed((&'a S::Storage, &'a Layout), (&'a S::Storage, &'a Layout)),
    First(&'a S::Storage, &'a Layout),
    /// Nothing (inputs taken as given, the op applied in place to another tensor): every input
    /// is read from its own storage.
    Held,
}

/// A mixer's op over two packed tensors, and the same op over its inputs as given.
trait Unpack {
    type Given: CustomOp1 + Send + Sync + 'static;
    fn given(self) -> Self::Given;
}

impl Inputs {
    /// `own` (of `first`'s dtype, `first` among them, first) and `f32s`: packed where one of
    /// them needs a gradient.
    fn new(op: &str, first: &Tensor, own: &[(&'static str, &Tensor)], f32s: &[(&'static str, &Tensor)]) -> candle_core::Result<Inputs> {
        if own.iter().chain(f32s).any(|(_, t)| t.track_op()) {
            return Ok(Inputs::Packed {
                own: Packed::new(op, first.dtype(), first.device(), own)?,
                f32s: Packed::new(op, DType::F32, first.device(), f32s)?,
            });
        }
        Inputs::given(op, first, own, f32s)
    }

    /// `own` (of `first`'s dtype, `first` among them, first) and `f32s` as given, each made
    /// contiguous (a copy only of those that are not); none is differentiated.
    fn given(op: &str, first: &Tensor, own: &[(&'static str, &Tensor)], f32s: &[(&'static str, &Tensor)]) -> candle_core::Result<Inputs> {
        check_parts(op, first.dtype(), first.device(), own)?;
        check_parts(op, DType::F32, first.device(), f32s)?;
        let given = |parts: &[(&'static str, &Tensor)]| -> candle_core::Result<Vec<(&'static str, Tensor)>> {
            parts.iter().map(|&(name, t)| Ok((name, t.contiguous()?))).collect()
        };
        Ok(Inputs::Given { own: given(own)?, f32s: given(f32s)? })
    }

    /// The dtype of the inputs other than the f32 ones (f32 where there are none).
    fn dtype(&self) -> DType {
        match self {
            Inputs::Packed { own, .. } => own.tensor.dtype(),
            Inputs::Given { own, .. } => own.first().map_or(DType::F32, |(_, t)| t.dtype()),
        }
    }

    /// `op` (holding these inputs) applied: to the two packed tensors (with its backward), or
    /// to the first input (none needs a gradient).
    fn apply<C: CustomOp2 + Unpack + Send + Sync + 'static>(&self, op: C) -> candle_core::Result<Tensor> {
        match self {
            Inputs::Packed { own, f32s } => own.tensor.apply_op2(&f32s.tensor, op),
            Inputs::Given { own, .. } => match own.first() {
                Some((_, first)) => first.apply_op1_no_bwd(&op.given()),
                None => bail!("{}: no inputs", op.name()),
            },
        }
    }

    /// `f` of the inputs, read from what candle handed the op (and, for inputs as given, from
    /// the other inputs' storages, read-locked while `f` runs).
    fn with_parts<T: Elem, S: Side, R>(
        &self, side: &S, op: &'static str, handed: Handed<'_, S>, f: impl FnOnce(&Parts<'_, T>) -> candle_core::Result<R>,
    ) -> candle_core::Result<R> {
        match (self, handed) {
            (Inputs::Packed { own, f32s }, Handed::Packed((so, lo), (sf, lf))) => {
                f(&Parts { op, own: own.read(side, op, so, lo)?, f32s: f32s.read(side, op, sf, lf)? })
            }
            (Inputs::Given { own, f32s }, handed @ (Handed::First(..) | Handed::Held)) => {
                let (first, rest) = match handed {
                    Handed::First(s, l) => (Some((s, l)), own.get(1..).unwrap_or_default()),
                    _ => (None, &own[..]),
                };
                let (own_locks, f32_locks) = (lock(rest), lock(f32s));
                let mut own_parts = Vec::with_capacity(own.len());
                if let (Some((s, l)), Some((name, _))) = (first, own.first()) {
                    own_parts.push((*name, side.input::<T>(op, name, s, l, l.dims())?));
                }
                own_parts.extend(read_locked::<T, S>(side, op, &own_locks)?);
                let parts = Parts { op, own: own_parts, f32s: read_locked::<f32, S>(side, op, &f32_locks)? };
                f(&parts)
            }
            _ => bail!("{op}: the op was handed tensors other than its inputs"),
        }
    }
}

/// Each of `inputs` by name, its storage read-locked, and its layout.
fn lock<'t>(inputs: &'t [(&'static str, Tensor)]) -> Vec<(&'static str, (candle_core::StorageRef<'t>, &'t Layout))> {
    inputs.iter().map(|(name, t)| (*name, t.storage_and_layout())).collect()
}

/// Inputs taken as given, each read from its read-locked storage ([`lock`]) as a kernel input
/// of its shape.
fn read_locked<'a, T: Elem, S: Side>(
    side: &S, op: &str, locks: &'a [(&'static str, (candle_core::StorageRef<'_>, &Layout))],
) -> candle_core::Result<Vec<(&'static str, Input<'a, T>)>>
where
    S::Storage: 'a,
{
    locks.iter().map(|(name, (st, lt))| Ok((*name, side.input::<T>(op, name, side.storage_of(name, st)?, lt, lt.dims())?))).collect()
}

/// An op's inputs read from its packed storages, by name.
struct Parts<'a, T: Elem> {
    op: &'static str,
    own: Vec<(&'static str, Input<'a, T>)>,
    f32s: Vec<(&'static str, Input<'a, f32>)>,
}

impl<T: Elem> Parts<'_, T> {
    /// Input `name` of the op's dtype, if it was given.
    fn maybe(&self, name: &str) -> Option<&tessera::Tensor<T>> {
        find(&self.own, name)
    }

    /// Input `name` of the op's dtype.
    fn get(&self, name: &str) -> candle_core::Result<&tessera::Tensor<T>> {
        self.maybe(name).ok_or_else(|| self.missing(name))
    }

    /// f32 input `name`, if it was given.
    fn maybe_f32(&self, name: &str) -> Option<&tessera::Tensor<f32>> {
        find(&self.f32s, name)
    }

    /// f32 input `name`.
    fn get_f32(&self, name: &str) -> candle_core::Result<&tessera::Tensor<f32>> {
        self.maybe_f32(name).ok_or_else(|| self.missing(name))
    }

    fn missing(&self, name: &str) -> candle_core::Error {
        candle_core::Error::Msg(format!("{}: `{name}` is missing from the packed inputs", self.op))
    }
}

/// The input named `name` among `parts`.
fn find<'p, U: tessera::Element>(parts: &'p [(&'static str, Input<'_, U>)], name: &str) -> Option<&'p tessera::Tensor<U>> {
    parts.iter().find(|(n, _)| *n == name).map(|(_, t)| &**t)
}

/// `parts` (each a flat storage and its length) converted to `dtype`, one after another as one
/// flat storage of `side`.
pub(crate) fn concat_as<S: Side>(side: &S, parts: Vec<(S::Storage, usize)>, dtype: DType) -> candle_core::Result<(S::Storage, Shape)> {
    let shape = Shape::from(parts.iter().map(|p| p.1).sum::<usize>());
    // SAFETY: the parts cover every element, each copied in below.
    let mut all = unsafe { side.alloc(&shape, dtype)? };
    let mut at = 0;
    for (p, n) in parts {
        let l = Layout::contiguous(n);
        let p = if p.dtype() == dtype { p } else { p.to_dtype(&l, dtype)? };
        p.copy_strided_src(&mut all, at, &l)?;
        at += n;
    }
    Ok((all, shape))
}

/// The options of [`selective_scan`]: Mamba's skip `D`, gate `z`, delta bias and softplus.
#[derive(Clone, Copy, Debug, Default)]
pub struct SelectiveScanOptions<'a> {
    /// The skip connection `D·u`, `[channels]` f32.
    pub d: Option<&'a Tensor>,
    /// The gate: `y · silu(z)`, `z` as `u`.
    pub z: Option<&'a Tensor>,
    /// Added to `delta`, `[channels]` f32.
    pub delta_bias: Option<&'a Tensor>,
    /// `Δ = softplus(delta + bias)` (Mamba's default) rather than `delta + bias`.
    pub delta_softplus: bool,
}

/// Mamba's selective scan ([`tessera_kernels::SelectiveScan`]): `h_t = exp(Δ_t·A)·h_{t−1} +
/// Δ_t·B_t·u_t`, `y_t = C_t·h_t (+ D·u_t) (· silu(z_t))` per (batch, channel), the state
/// starting at zero. `u`, `delta` `[batch, channels, L]` and `b`, `c` `[batch, groups, d_state,
/// L]` of one dtype (bf16 or f32), `a` `[channels, d_state]` f32 (negative: a decaying state),
/// d_state 16, 32 or 64; `y` as `u`. The options add `D`, `z`, the delta bias and softplus.
///
/// Registered with candle's autograd: `backward()` gives the gradients of every input
/// (Tessera's [`SelectiveScan::backward`](tessera_kernels::SelectiveScan::backward); `db`,
/// `dc`, `da`, `dD` and the delta bias's are summed with float atomics on the GPU, so their
/// last bits vary from run to run). Where an input needs a gradient the inputs are packed into
/// two tensors first (see the module's notes), one copy of them; where none does (inference)
/// each is read where it lies.
///
/// ```
/// use candle_core::{DType, Device, Tensor};
/// let dev = Device::Cpu;
/// let (batch, channels, states, len) = (1, 2, 16, 5);
/// let u = Tensor::randn(0f32, 1.0, (batch, channels, len), &dev)?;
/// let delta = (Tensor::rand(0f32, 1.0, (batch, channels, len), &dev)? * 0.1)?;
/// let a = Tensor::rand(-1f32, -0.1, (channels, states), &dev)?;
/// let b = Tensor::randn(0f32, 1.0, (batch, 1, states, len), &dev)?;
/// let c = Tensor::randn(0f32, 1.0, (batch, 1, states, len), &dev)?;
/// let y = tessera_candle::selective_scan(&u, &delta, &a, &b, &c, &Default::default())?;
/// assert_eq!(y.dims(), &[batch, channels, len]);
/// # Ok::<(), candle_core::Error>(())
/// ```
///
/// # Errors
/// A candle error when a dtype, device or shape does not fit (saying which tensor and what was
/// expected: the kernel's argument check), for a CUDA tensor without the `cuda` feature, or when
/// the kernel fails.
pub fn selective_scan(
    u: &Tensor, delta: &Tensor, a: &Tensor, b: &Tensor, c: &Tensor, options: &SelectiveScanOptions<'_>,
) -> candle_core::Result<Tensor> {
    let mut own = vec![("u", u), ("delta", delta), ("b", b), ("c", c)];
    own.extend(options.z.map(|z| ("z", z)));
    let mut f32s = vec![("a", a)];
    f32s.extend(options.d.map(|d| ("d", d)));
    f32s.extend(options.delta_bias.map(|bias| ("delta_bias", bias)));
    let inputs = Inputs::new("selective_scan", u, &own, &f32s)?;
    inputs.apply(SelectiveScanOp { inputs: inputs.clone(), softplus: options.delta_softplus })
}

/// [`selective_scan`] as a candle op over its two packed tensors.
#[derive(Clone)]
struct SelectiveScanOp {
    inputs: Inputs,
    softplus: bool,
}

impl SelectiveScanOp {
    /// The scan of `p` on `device`.
    fn scan<'s, T: Elem + SelectiveScanElement>(
        &self, p: &'s Parts<'_, T>, device: &'s tessera::Device,
    ) -> candle_core::Result<tessera_kernels::SelectiveScan<'s, T>> {
        let mut s = tessera_kernels::SelectiveScan::new(device, p.get("u")?, p.get("delta")?, p.get_f32("a")?, p.get("b")?, p.get("c")?)
            .delta_softplus(self.softplus);
        if let Some(d) = p.maybe_f32("d") {
            s = s.d(d);
        }
        if let Some(z) = p.maybe("z") {
            s = s.z(z);
        }
        if let Some(bias) = p.maybe_f32("delta_bias") {
            s = s.delta_bias(bias);
        }
        Ok(s)
    }
}

fn selective_scan_run<T: Elem + SelectiveScanElement, S: Side>(
    op: &SelectiveScanOp, side: &S, handed: Handed<'_, S>,
) -> candle_core::Result<(S::Storage, Shape)> {
    op.inputs.with_parts::<T, S, _>(side, "selective_scan", handed, |p| {
        let (dev, dims) = (side.device(), p.get("u")?.shape().to_vec());
        let scan = op.scan(p, dev)?;
        side.output(&dims, Shape::from(dims.clone()), |y| scan.run_y(y))
    })
}

/// [`selective_scan`]'s backward: the packed inputs and the output's gradient in, every
/// gradient out as one f32 tensor in the packed order (`du`, `ddelta`, `db`, `dc`, `dz`, then
/// `da`, `dD`, the delta bias's).
struct SelectiveScanBackward {
    forward: SelectiveScanOp,
}

fn selective_scan_backward_run<T: Elem + SelectiveScanElement, S: Side>(
    op: &SelectiveScanBackward, side: &S, own: (&S::Storage, &Layout), f32s: (&S::Storage, &Layout), (sd, ld): (&S::Storage, &Layout),
) -> candle_core::Result<(S::Storage, Shape)> {
    let name = "selective_scan backward";
    op.forward.inputs.with_parts::<T, S, _>(side, name, Handed::Packed(own, f32s), |p| {
        let dy = side.input::<T>(name, "dy", sd, ld, p.get("u")?.shape())?;
        let g = op.forward.scan(p, side.device())?.backward(&dy).map_err(candle_core::Error::wrap)?;
        let mut parts = vec![side.wrap(g.du)?, side.wrap(g.ddelta)?, side.wrap(g.db)?, side.wrap(g.dc)?];
        if let Some(dz) = g.dz {
            parts.push(side.wrap(dz)?);
        }
        parts.push(side.wrap(g.da)?);
        for t in [g.dd, g.d_delta_bias].into_iter().flatten() {
            parts.push(side.wrap(t)?);
        }
        concat_as(side, parts, DType::F32)
    })
}

/// The options of [`linear_attention`].
#[derive(Clone, Copy, Debug, Default)]
pub struct LinearAttentionOptions<'a> {
    /// The factor on the output (`1/√dk` unless given).
    pub scale: Option<f32>,
    /// The feature map applied to q and k.
    pub feature_map: FeatureMap,
    /// A decay a step, `[batch, heads, seq]` f32 in natural-log units (≤ 0): the state is
    /// multiplied by `exp(g_t)` before step t adds to it (RetNet's `ln γ`, or a gate's output).
    pub decay: Option<&'a Tensor>,
}

/// Causal linear attention, chunked ([`tessera_kernels::LinearAttention`]): `o_t =
/// scale·φ(q_t)·H_t`, `H_t = exp(g_t)·H_{t−1} + φ(k_t)ᵀv_t` from a zero state. `q`, `k` `[batch,
/// seq, heads, dk]`, `v` `[batch, seq, heads, dv]` (q and k may have fewer heads, dividing v's),
/// bf16 or f16, dk and dv 64 or 128; `o` as `v`. Hopper GPUs and the interpreter.
///
/// Registered with candle's autograd: `backward()` gives the gradients of q, k, v and the decay
/// (Tessera's [`LinearAttention::backward`](tessera_kernels::LinearAttention::backward)). The
/// inputs are packed first, as [`selective_scan`]'s.
///
/// # Errors
/// As [`selective_scan`]'s.
pub fn linear_attention(q: &Tensor, k: &Tensor, v: &Tensor, options: &LinearAttentionOptions<'_>) -> candle_core::Result<Tensor> {
    let f32s: Vec<_> = options.decay.map(|g| ("decay", g)).into_iter().collect();
    let inputs = Inputs::new("linear_attention", q, &[("q", q), ("k", k), ("v", v)], &f32s)?;
    inputs.apply(LinearAttentionOp { inputs: inputs.clone(), scale: options.scale, feature: options.feature_map })
}

/// [`linear_attention`] as a candle op over its two packed tensors.
#[derive(Clone)]
struct LinearAttentionOp {
    inputs: Inputs,
    scale: Option<f32>,
    feature: FeatureMap,
}

impl LinearAttentionOp {
    /// The attention of `p` on `device`.
    fn attention<'s, T: Elem + LinearAttentionElement>(
        &self, p: &'s Parts<'_, T>, device: &'s tessera::Device,
    ) -> candle_core::Result<tessera_kernels::LinearAttention<'s, T>> {
        let mut la = tessera_kernels::LinearAttention::new(device, p.get("q")?, p.get("k")?, p.get("v")?).feature_map(self.feature);
        if let Some(scale) = self.scale {
            la = la.scale(scale);
        }
        if let Some(g) = p.maybe_f32("decay") {
            la = la.decay(g);
        }
        Ok(la)
    }
}

fn linear_attention_run<T: Elem + LinearAttentionElement, S: Side>(
    op: &LinearAttentionOp, side: &S, handed: Handed<'_, S>,
) -> candle_core::Result<(S::Storage, Shape)> {
    op.inputs.with_parts::<T, S, _>(side, "linear_attention", handed, |p| {
        let dims = p.get("v")?.shape().to_vec();
        let la = op.attention(p, side.device())?;
        side.output(&dims, Shape::from(dims.clone()), |o| la.run(o, None))
    })
}

/// [`linear_attention`]'s backward: every gradient out as one f32 tensor in the packed order
/// (`dq`, `dk`, `dv`, then the decay's).
struct LinearAttentionBackward {
    forward: LinearAttentionOp,
}

fn linear_attention_backward_run<T: Elem + LinearAttentionElement, S: Side>(
    op: &LinearAttentionBackward, side: &S, own: (&S::Storage, &Layout), f32s: (&S::Storage, &Layout), (sd, ld): (&S::Storage, &Layout),
) -> candle_core::Result<(S::Storage, Shape)> {
    let name = "linear_attention backward";
    op.forward.inputs.with_parts::<T, S, _>(side, name, Handed::Packed(own, f32s), |p| {
        let dout = side.input::<T>(name, "dout", sd, ld, p.get("v")?.shape())?;
        let g = op.forward.attention(p, side.device())?.backward(&dout, None).map_err(candle_core::Error::wrap)?;
        let mut parts = vec![side.wrap(g.dq)?, side.wrap(g.dk)?, side.wrap(g.dv)?];
        if p.maybe_f32("decay").is_some() {
            match g.dg {
                Some(dg) => parts.push(side.wrap(dg)?),
                None => bail!("{name}: the kernel gave no gradient for the decay"),
            }
        }
        concat_as(side, parts, DType::F32)
    })
}

/// The options of [`ssd`]: Mamba-2's skip `D`, dt bias and softplus.
#[derive(Clone, Copy, Debug, Default)]
pub struct SsdOptions<'a> {
    /// The skip connection `D_h·x`, `[heads]` f32.
    pub d: Option<&'a Tensor>,
    /// Added to `dt`, `[heads]` f32.
    pub dt_bias: Option<&'a Tensor>,
    /// `Δ = softplus(dt + bias)` (Mamba-2's default) rather than `dt + bias`.
    pub dt_softplus: bool,
}

/// Mamba-2's state-space duality, chunked ([`tessera_kernels::Ssd`]): per (batch, head), `h_t =
/// exp(Δ_t·A_h)·h_{t−1} + Δ_t·B_tᵀx_t`, `y_t = C_t·h_t (+ D_h·x_t)` from a zero state. `x`
/// `[batch, L, heads, headdim]`, `dt` `[batch, L, heads]`, `b`, `c` `[batch, L, groups, d_state]`
/// of one dtype (bf16 or f16), `a` `[heads]` f32 (negative); headdim and d_state 64 or 128; `y`
/// as `x`. Hopper GPUs and the interpreter.
///
/// Registered with candle's autograd: `backward()` gives the gradients of every input
/// (Tessera's [`Ssd::backward`](tessera_kernels::Ssd::backward)). The inputs are packed first,
/// as [`selective_scan`]'s.
///
/// # Errors
/// As [`selective_scan`]'s.
pub fn ssd(x: &Tensor, dt: &Tensor, a: &Tensor, b: &Tensor, c: &Tensor, options: &SsdOptions<'_>) -> candle_core::Result<Tensor> {
    let mut f32s = vec![("a", a)];
    f32s.extend(options.d.map(|d| ("d", d)));
    f32s.extend(options.dt_bias.map(|bias| ("dt_bias", bias)));
    let inputs = Inputs::new("ssd", x, &[("x", x), ("dt", dt), ("b", b), ("c", c)], &f32s)?;
    inputs.apply(SsdOp { inputs: inputs.clone(), softplus: options.dt_softplus })
}

/// [`ssd`] as a candle op over its two packed tensors.
#[derive(Clone)]
struct SsdOp {
    inputs: Inputs,
    softplus: bool,
}

impl SsdOp {
    /// The SSD of `p` on `device`.
    fn ssd<'s, T: Elem + SsdElement>(
        &self, p: &'s Parts<'_, T>, device: &'s tessera::Device,
    ) -> candle_core::Result<tessera_kernels::Ssd<'s, T>> {
        let mut s = tessera_kernels::Ssd::new(device, p.get("x")?, p.get("dt")?, p.get_f32("a")?, p.get("b")?, p.get("c")?)
            .dt_softplus(self.softplus);
        if let Some(d) = p.maybe_f32("d") {
            s = s.d(d);
        }
        if let Some(bias) = p.maybe_f32("dt_bias") {
            s = s.dt_bias(bias);
        }
        Ok(s)
    }
}

fn ssd_run<T: Elem + SsdElement, S: Side>(op: &SsdOp, side: &S, handed: Handed<'_, S>) -> candle_core::Result<(S::Storage, Shape)> {
    op.inputs.with_parts::<T, S, _>(side, "ssd", handed, |p| {
        let dims = p.get("x")?.shape().to_vec();
        let ssd = op.ssd(p, side.device())?;
        side.output(&dims, Shape::from(dims.clone()), |y| ssd.run(y, None))
    })
}

/// [`ssd`]'s backward: every gradient out as one f32 tensor in the packed order (`dx`, `ddt`,
/// `db`, `dc`, then `da`, `dD`, the dt bias's).
struct SsdBackward {
    forward: SsdOp,
}

fn ssd_backward_run<T: Elem + SsdElement, S: Side>(
    op: &SsdBackward, side: &S, own: (&S::Storage, &Layout), f32s: (&S::Storage, &Layout), (sd, ld): (&S::Storage, &Layout),
) -> candle_core::Result<(S::Storage, Shape)> {
    let name = "ssd backward";
    op.forward.inputs.with_parts::<T, S, _>(side, name, Handed::Packed(own, f32s), |p| {
        let dy = side.input::<T>(name, "dy", sd, ld, p.get("x")?.shape())?;
        let g = op.forward.ssd(p, side.device())?.backward(&dy, None).map_err(candle_core::Error::wrap)?;
        let mut parts = vec![side.wrap(g.dx)?, side.wrap(g.ddt)?, side.wrap(g.db)?, side.wrap(g.dc)?, side.wrap(g.da)?];
        for t in [g.dd, g.d_dt_bias].into_iter().flatten() {
            parts.push(side.wrap(t)?);
        }
        concat_as(side, parts, DType::F32)
    })
}

/// The gradients of an op over two packed tensors, from its backward's one f32 tensor (each
/// part's gradient in turn, unpadded): each packed tensor's laid out as the tensor is (its
/// parts' padding zero), the first cast back to its dtype.
fn split_grads(all: &Tensor, inputs: &Inputs) -> candle_core::Result<(Option<Tensor>, Option<Tensor>)> {
    let Inputs::Packed { own, f32s } = inputs else { bail!("a backward of inputs taken as given (none needs a gradient)") };
    let mut at = 0;
    let mut grad = |p: &Packed| -> candle_core::Result<Tensor> {
        let dtype = p.tensor.dtype();
        let parts = p.parts.iter().map(|(_, shape)| {
            let n = shape.iter().product::<usize>();
            at += n;
            all.narrow(0, at - n, n)?.to_dtype(dtype)
        });
        padded_cat(parts, dtype, all.device())
    };
    let d_own = grad(own)?;
    Ok((Some(d_own), Some(grad(f32s)?)))
}

/// Runs `f` for the op's dtype among `$T` (each `DType` variant and its element type), a candle
/// error naming the op and the dtypes it takes for another.
macro_rules! among {
    ($op:expr, $dt:expr, [$($d:ident => $t:ty),*], $f:ident $args:tt) => {
        match $dt {
            $(DType::$d => $f::<$t, _> $args,)*
            other => bail!("{}: the inputs must be {}, found {other:?}", $op, [$(stringify!($d)),*].join(" or ")),
        }
    };
}

/// The candle ops of a mixer over two packed tensors: `$op`'s forward (`CustomOp2` over the
/// packed tensors, `run`) registered with autograd through `$backward` (`CustomOp3` over the
/// packed tensors and the output's gradient, `backward_run`, every gradient out in one f32
/// tensor), for the element types `$T`.
macro_rules! packed_ops {
    ($op:ident, $name:literal, $given:ident, $backward:ident, $backward_name:literal, [$($T:tt)*], $run:ident, $backward_run:ident) => {
        forwards!($op: CustomOp2 $name, |op, side, s1, l1, s2, l2| {
            among!($name, s1.dtype(), [$($T)*], $run(op, side, Handed::Packed((s1, l1), (s2, l2))))
        };
            fn bwd(&self, own: &Tensor, f32s: &Tensor, _y: &Tensor, dy: &Tensor) -> candle_core::Result<(Option<Tensor>, Option<Tensor>)> {
                let all = own.apply_op3_no_bwd(f32s, &dy.contiguous()?, &$backward { forward: self.clone() })?;
                split_grads(&all, &self.inputs)
            }
        );

        forwards!($backward: CustomOp3 $backward_name, |op, side, s1, l1, s2, l2, s3, l3| {
            among!($backward_name, s1.dtype(), [$($T)*], $backward_run(op, side, (s1, l1), (s2, l2), (s3, l3)))
        });

        /// The op over its inputs as given (none needs a gradient), applied to the first.
        struct $given($op);

        impl Unpack for $op {
            type Given = $given;
            fn given(self) -> $given {
                $given(self)
            }
        }

        forwards!($given: CustomOp1 $name, |op, side, s, l| {
            among!($name, s.dtype(), [$($T)*], $run(&op.0, side, Handed::First(s, l)))
        });
    };
}

packed_ops!(
    SelectiveScanOp,
    "tessera-selective-scan",
    SelectiveScanGiven,
    SelectiveScanBackward,
    "tessera-selective-scan-backward",
    [BF16 => half::bf16, F32 => f32],
    selective_scan_run,
    selective_scan_backward_run
);

packed_ops!(
    LinearAttentionOp,
    "tessera-linear-attention",
    LinearAttentionGiven,
    LinearAttentionBackward,
    "tessera-linear-attention-backward",
    [BF16 => half::bf16, F16 => half::f16],
    linear_attention_run,
    linear_attention_backward_run
);

packed_ops!(SsdOp, "tessera-ssd", SsdGiven, SsdBackward, "tessera-ssd-backward", [BF16 => half::bf16, F16 => half::f16], ssd_run, ssd_backward_run);

/// One decode step of [`selective_scan`], the state carried: `state` (`[batch, channels,
/// d_state]` f32, contiguous) is the state before the step and is updated in place to the state
/// after it; the result is the step's `y` `[batch, channels, 1]`. The inputs are those of a scan
/// of length 1 (`u`, `delta` and the gate `[batch, channels, 1]`, `b`, `c` `[batch, groups,
/// d_state, 1]`) with the same options ([`SelectiveScan::run_step`](tessera_kernels::SelectiveScan::run_step):
/// one launch reading and writing the state once).
///
/// No gradient: the step is for inference (candle's in-place ops are not differentiated); the
/// inputs are read as given.
///
/// ```
/// use candle_core::{Device, Tensor};
/// let dev = Device::Cpu;
/// let (batch, channels, states) = (1, 2, 16);
/// let state = Tensor::zeros((batch, channels, states), candle_core::DType::F32, &dev)?;
/// let a = Tensor::rand(-1f32, -0.1, (channels, states), &dev)?;
/// for _token in 0..3 {
///     let u = Tensor::randn(0f32, 1.0, (batch, channels, 1), &dev)?;
///     let delta = (Tensor::rand(0f32, 1.0, (batch, channels, 1), &dev)? * 0.1)?;
///     let b = Tensor::randn(0f32, 1.0, (batch, 1, states, 1), &dev)?;
///     let c = Tensor::randn(0f32, 1.0, (batch, 1, states, 1), &dev)?;
///     let y = tessera_candle::selective_scan_step(&state, &u, &delta, &a, &b, &c, &Default::default())?;
///     assert_eq!(y.dims(), &[batch, channels, 1]);
/// }
/// # Ok::<(), candle_core::Error>(())
/// ```
///
/// # Errors
/// As [`selective_scan`]'s, and a candle error where `state` is not f32, not contiguous, on
/// another device than `u`, or shares its storage with an input.
pub fn selective_scan_step(
    state: &Tensor, u: &Tensor, delta: &Tensor, a: &Tensor, b: &Tensor, c: &Tensor, options: &SelectiveScanOptions<'_>,
) -> candle_core::Result<Tensor> {
    let mut own = vec![("u", u), ("delta", delta), ("b", b), ("c", c)];
    own.extend(options.z.map(|z| ("z", z)));
    let mut f32s = vec![("a", a)];
    f32s.extend(options.d.map(|d| ("d", d)));
    f32s.extend(options.delta_bias.map(|bias| ("delta_bias", bias)));
    let inputs = Inputs::given("selective_scan_step", u, &own, &f32s)?;
    let op = SelectiveScanStep { forward: SelectiveScanOp { inputs, softplus: options.delta_softplus }, y: StepOutput::new() };
    op.y.step(state, &op.forward.inputs, &op)
}

/// One decode step of [`linear_attention`], the state carried: `state` (`[batch, heads, dk,
/// dv]` f32, contiguous) is the state before the step and is updated in place to the state after
/// it; the result is the step's `o`, shaped as `v`. q, k, v (and the decay, `[batch, heads, 1]`)
/// are those of a sequence of length 1, with the same options
/// ([`LinearAttention::run_step`](tessera_kernels::LinearAttention::run_step): one launch reading
/// and writing the state once).
///
/// No gradient: the step is for inference; the inputs are read as given.
///
/// # Errors
/// As [`selective_scan_step`]'s.
pub fn linear_attention_step(
    state: &Tensor, q: &Tensor, k: &Tensor, v: &Tensor, options: &LinearAttentionOptions<'_>,
) -> candle_core::Result<Tensor> {
    let f32s: Vec<_> = options.decay.map(|g| ("decay", g)).into_iter().collect();
    let inputs = Inputs::given("linear_attention_step", q, &[("q", q), ("k", k), ("v", v)], &f32s)?;
    let op = LinearAttentionStep {
        forward: LinearAttentionOp { inputs, scale: options.scale, feature: options.feature_map },
        y: StepOutput::new(),
    };
    op.y.step(state, &op.forward.inputs, &op)
}

/// What a step op leaves beside the state it updates: its output, made by the op (candle's
/// in-place op has no result).
struct StepOutput {
    made: std::sync::Mutex<Option<(candle_core::Storage, Vec<usize>)>>,
}

impl StepOutput {
    fn new() -> StepOutput {
        StepOutput { made: std::sync::Mutex::new(None) }
    }

    /// `op` applied in place to `state` (after checking it against `inputs`, those `op` reads),
    /// and the output it made.
    fn step(&self, state: &Tensor, inputs: &Inputs, op: &impl candle_core::InplaceOp1) -> candle_core::Result<Tensor> {
        let name = op.name();
        let Inputs::Given { own, f32s } = inputs else { bail!("{name}: a step's inputs are read as given") };
        let Some((_, first)) = own.first() else { bail!("{name}: no inputs") };
        check_parts(name, DType::F32, first.device(), &[("state", state)])?;
        // The inputs are read-locked while the state is write-locked: one storage for both would
        // wait on itself.
        let at = storage_address(state);
        if let Some((input, _)) = own.iter().chain(f32s).find(|(_, t)| storage_address(t) == at) {
            bail!("{name}: `state` shares its storage with `{input}`; give the step a state of its own")
        }
        state.inplace_op1(op)?;
        let made = self.made.lock().unwrap_or_else(|p| p.into_inner()).take();
        let Some((storage, dims)) = made else { bail!("{name}: the step made no output") };
        Ok(Tensor::from_storage(storage, dims, candle_core::op::BackpropOp::none(), false))
    }

    /// The op's body on `side`: `step(parts, state, out)` over `inputs` (read from their
    /// storages) with the state candle hands the op, `out` made shaped as input `like` and kept.
    fn run<T: Elem, S: Side>(
        &self, side: &S, name: &'static str, inputs: &Inputs, like: &str, (state, l): (&mut S::Storage, &Layout),
        step: impl FnOnce(&Parts<'_, T>, &mut tessera::Tensor<f32>, &mut tessera::Tensor<T>) -> candle_core::Result<()>,
    ) -> candle_core::Result<()> {
        inputs.with_parts::<T, S, _>(side, name, Handed::Held, |p| {
            let dims = p.get(like)?.shape().to_vec();
            let out = side.in_place(name, "state", state, l, |h| {
                let mut out = tessera::Tensor::<T>::scratch(side.device(), &dims).map_err(candle_core::Error::wrap)?;
                step(p, h, &mut out)?;
                Ok(out)
            })?;
            *self.made.lock().unwrap_or_else(|p| p.into_inner()) = Some((S::storage(side.wrap(out)?.0), dims));
            Ok(())
        })
    }
}

/// Where `t`'s storage lies (one address for tensors sharing a storage).
fn storage_address(t: &Tensor) -> usize {
    let (storage, _) = t.storage_and_layout();
    std::ptr::from_ref::<candle_core::Storage>(&storage).addr()
}

/// The candle in-place op `$step` (over the state) of a mixer's decode step: `$forward` (the
/// mixer's forward op, holding the inputs) and the output it makes, shaped as input `$like`, for
/// the element types `$T`; `$run` runs the step (`$f` the forward op, `$p` its inputs' parts,
/// `$device`, `$state` the state to update, `$out` the output to write).
macro_rules! step_op {
    (
        $step:ident, $forward:ident, $name:literal, $fn_name:literal, $like:literal, $bound:path, [$($T:tt)*],
        |$f:ident, $p:ident, $device:ident, $state:ident, $out:ident| $run:expr
    ) => {
        #[doc = concat!("[`", $fn_name, "`] as a candle in-place op over the state.")]
        struct $step {
            forward: $forward,
            y: StepOutput,
        }

        forwards!($step: InplaceOp1 $name, |op, side, s, l| {
            fn run<T: Elem + $bound, S: Side>(op: &$step, side: &S, state: &mut S::Storage, l: &Layout) -> candle_core::Result<()> {
                op.y.run::<T, S>(side, $fn_name, &op.forward.inputs, $like, (state, l), |$p, $state, $out| {
                    let ($f, $device) = (&op.forward, side.device());
                    $run.map_err(candle_core::Error::wrap)
                })
            }
            among!($fn_name, op.forward.inputs.dtype(), [$($T)*], run(op, side, s, l))
        });
    };
}

step_op!(
    SelectiveScanStep,
    SelectiveScanOp,
    "tessera-selective-scan-step",
    "selective_scan_step",
    "u",
    SelectiveScanElement,
    [BF16 => half::bf16, F32 => f32],
    |f, p, device, h, y| f.scan(p, device)?.run_step(h, y)
);

step_op!(
    LinearAttentionStep,
    LinearAttentionOp,
    "tessera-linear-attention-step",
    "linear_attention_step",
    "v",
    LinearAttentionElement,
    [BF16 => half::bf16, F16 => half::f16],
    |f, p, device, h, o| f.attention(p, device)?.run_step(h, o)
);
