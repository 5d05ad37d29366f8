//! Rotary position embedding (RoPE) on query and key heads.
//!
//! Each block rotates the heads of a token, 32 heads at a time, so that the token's angles
//! are computed (or read from the cache) once and broadcast over its heads, then moves on to
//! the token a grid's width further (a persistent grid of about 60 blocks per SM); the
//! tiles a step needs load together (run 41: two tokens per block cost more registers than
//! they won in flight). Both layouts go through one kernel per convention: the host passes the tensor as a
//! view whose axes are `[batch, seq, heads, dim]` whatever the order in memory, and for the
//! half-split convention splits `dim` into its two halves, `[batch, seq, 2, heads, dim/2]`.

use tessera::{in_place, kernel, Absent, Device, Element, GlobalArg, GlobalArgMut, Grid, Result, Tensor};

/// Heads each block rotates at a time.
const HEADS: usize = 32;

/// Blocks per SM in a RoPE grid (each loops over tokens): see `launch`.
const BLOCKS_PER_SM: usize = 60;

/// RoPE with the half-split (GPT-NeoX) convention: column `j` of the first half pairs with
/// column `j` of the second, `y₁ = x₁·cos θ − x₂·sin θ`, `y₂ = x₂·cos θ + x₁·sin θ`, with
/// `θ_j = p·exp2(j·freq_exp)` (`freq_exp = −2·log2(base)/dim`) or `cos_cache[p, j]`,
/// `sin_cache[p, j]`. `sign` −1 rotates back (the backward pass). The two halves' tiles load
/// together (consecutive `let`s of loads issue as one group). Capped at 88 registers, five
/// blocks an SM (no spill; 118 uncapped, four).
#[kernel(dtypes(T = [bf16, f16, f32]), blocks_per_sm = 5)]
pub fn rope_half(
    x: Global<T, 5>, y: Global<T, 5>, cos_cache: Global<f32, 2>, sin_cache: Global<f32, 2>, positions: Global<i32, 2>, offset: i32,
    has_positions: i32, has_cache: i32, freq_exp: f32, sign: f32, stride: i32,
) {
    let b = block::id_y();
    let h = block::id_z() * 32;
    for s in (block::id_x()..x.dim(1)).step_by(stride) {
        let mut p = s + offset;
        if has_positions == 1 {
            p = positions.get([b, s]);
        }
        for c in (0..x.dim(4)).step_by(64) {
            let x1 = x.load::<Tile<T, 32, 64>>([b, s, 0, h, c]).cast::<f32>();
            let x2 = x.load::<Tile<T, 32, 64>>([b, s, 1, h, c]).cast::<f32>();
            let mut cs = Tile::<f32, 1, 64>::zeros();
            let mut sn = Tile::<f32, 1, 64>::zeros();
            if has_cache == 1 {
                let cc = cos_cache.load::<Tile<f32, 1, 64>>([p, c]);
                let sc = sin_cache.load::<Tile<f32, 1, 64>>([p, c]);
                cs = cc;
                sn = sc * sign;
            } else {
                let theta = exp2((Tile::<f32, 1, 64>::col_index() + c as f32) * freq_exp) * p as f32;
                cs = cos(theta);
                sn = sin(theta) * sign;
            }
            y.store([b, s, 0, h, c], (x1 * cs - x2 * sn).cast::<T>());
            y.store([b, s, 1, h, c], (x2 * cs + x1 * sn).cast::<T>());
        }
    }
}

/// RoPE with the interleaved (GPT-J) convention: columns `2i` and `2i + 1` form a pair,
/// `y₂ᵢ = x₂ᵢ·cos θᵢ − x₂ᵢ₊₁·sin θᵢ`, `y₂ᵢ₊₁ = x₂ᵢ₊₁·cos θᵢ + x₂ᵢ·sin θᵢ`; the partner of each
/// column is in the same thread's registers (`swap_pairs`). The cache holds each angle twice,
/// at `2i` and `2i + 1`. 128 columns at a time: one load per head row in flight, where 64
/// columns a step took two round trips for a 128-wide head (run 40: 0.78× copy).
/// Capped at 80 registers, six blocks an SM (no spill).
#[kernel(dtypes(T = [bf16, f16, f32]), blocks_per_sm = 6)]
pub fn rope_pairs(
    x: Global<T, 4>, y: Global<T, 4>, cos_cache: Global<f32, 2>, sin_cache: Global<f32, 2>, positions: Global<i32, 2>, offset: i32,
    has_positions: i32, has_cache: i32, freq_exp: f32, sign: f32, stride: i32,
) {
    let b = block::id_y();
    let h = block::id_z() * 32;
    for s in (block::id_x()..x.dim(1)).step_by(stride) {
        let mut p = s + offset;
        if has_positions == 1 {
            p = positions.get([b, s]);
        }
        for c in (0..x.dim(3)).step_by(128) {
            let t = x.load::<Tile<T, 32, 128>>([b, s, h, c]).cast::<f32>();
            let j = Tile::<f32, 1, 128>::col_index() + c as f32;
            let pair = floor(j * 0.5);
            // −1 on the even column of each pair, +1 on the odd one.
            let alt = (j - pair * 2.0) * 2.0 - 1.0;
            let mut cs = Tile::<f32, 1, 128>::zeros();
            let mut sn = Tile::<f32, 1, 128>::zeros();
            if has_cache == 1 {
                let cc = cos_cache.load::<Tile<f32, 1, 128>>([p, c]);
                let sc = sin_cache.load::<Tile<f32, 1, 128>>([p, c]);
                cs = cc;
                sn = sc * alt * sign;
            } else {
                let theta = exp2(pair * freq_exp) * p as f32;
                cs = cos(theta);
                sn = sin(theta) * alt * sign;
            }
            y.store([b, s, h, c], (t * cs + t.swap_pairs() * sn).cast::<T>());
        }
    }
}

/// How the two elements of each rotated pair sit in a head.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RopeStyle {
    /// Column `j` pairs with column `j + dim/2` (GPT-NeoX, Llama in Hugging Face).
    HalfSplit,
    /// Columns `2i` and `2i + 1` form a pair (GPT-J, the original RoPE paper).
    Interleaved,
}

/// The order of a query or key tensor's axes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum HeadLayout {
    /// `[batch, seq, heads, dim]`.
    Bshd,
    /// `[batch, heads, seq, dim]`.
    Bhsd,
}

/// Where each token's position comes from.
#[derive(Clone, Copy, Debug)]
pub enum Positions<'a> {
    /// Token `s` of every sequence is at position `offset + s` (e.g. the cache length during
    /// decoding).
    Offset(usize),
    /// An `i32` tensor of shape `[batch, seq]`.
    Tensor(&'a Tensor<i32>),
}

/// A RoPE configuration: convention, layout, base frequency, positions and an optional
/// cos/sin cache. `Rope::new(style, layout)` starts from base 10000, positions `0..seq` and
/// angles computed in the kernel.
///
/// ```no_run
/// # use tessera::{Device, Tensor, bf16};
/// use tessera_kernels::{HeadLayout, Rope, RopeStyle};
/// let dev = Device::gpu_or_cpu();
/// let mut q = Tensor::from_host(&dev, &vec![bf16::ONE; 2 * 16 * 8 * 128], &[2, 16, 8, 128])?;
/// let rope = Rope::new(RopeStyle::HalfSplit, HeadLayout::Bshd).base(500_000.0);
/// tessera_kernels::rope_in_place(&dev, &rope, &mut q)?;
/// # Ok::<(), tessera::Error>(())
/// ```
#[derive(Clone, Copy, Debug)]
pub struct Rope<'a> {
    /// The pairing convention.
    pub style: RopeStyle,
    /// The order of the tensor's axes.
    pub layout: HeadLayout,
    /// The base of the frequencies `base^(−2i/dim)`.
    pub base: f32,
    /// The tokens' positions.
    pub positions: Positions<'a>,
    /// `(cos, sin)` tables of shape `[max_positions, dim]` (f32), as [`rope_cache`] makes
    /// them; `None` computes the angles in the kernel.
    pub cache: Option<(&'a Tensor<f32>, &'a Tensor<f32>)>,
}

impl<'a> Rope<'a> {
    /// `style` on tensors laid out as `layout`, base 10000, positions `0..seq`, angles
    /// computed in the kernel.
    pub fn new(style: RopeStyle, layout: HeadLayout) -> Rope<'a> {
        Rope { style, layout, base: 10_000.0, positions: Positions::Offset(0), cache: None }
    }

    /// The base frequency.
    #[must_use]
    pub fn base(self, base: f32) -> Rope<'a> {
        Rope { base, ..self }
    }

    /// Where positions come from.
    #[must_use]
    pub fn positions(self, positions: Positions<'a>) -> Rope<'a> {
        Rope { positions, ..self }
    }

    /// Reads the angles' cosines and sines from `[max_positions, dim]` tables.
    #[must_use]
    pub fn cache(self, cos: &'a Tensor<f32>, sin: &'a Tensor<f32>) -> Rope<'a> {
        Rope { cache: Some((cos, sin)), ..self }
    }
}

/// Cos and sin tables of shape `[max_positions, dim]` for `style`, in the layout of Hugging
/// Face's rotary embeddings: angle `θ_i = p·base^(−2i/dim)` at columns `i` and `i + dim/2`
/// (half-split) or `2i` and `2i + 1` (interleaved). Computed in f64, rounded to f32.
///
/// # Errors
/// [`tessera::Error::Argument`] if `dim` is odd or zero; an allocation error.
pub fn rope_cache(device: &Device, style: RopeStyle, max_positions: usize, dim: usize, base: f32) -> Result<(Tensor<f32>, Tensor<f32>)> {
    check_dim("rope_cache", "dim", dim)?;
    let half = dim / 2;
    let (mut cos, mut sin) = (Vec::with_capacity(max_positions * dim), Vec::with_capacity(max_positions * dim));
    for p in 0..max_positions {
        for c in 0..dim {
            let i = match style {
                RopeStyle::HalfSplit => c % half,
                RopeStyle::Interleaved => c / 2,
            };
            let theta = p as f64 * f64::from(base).powf(-2.0 * i as f64 / dim as f64);
            cos.push(theta.cos() as f32);
            sin.push(theta.sin() as f32);
        }
    }
    Ok((Tensor::from_host(device, &cos, &[max_positions, dim])?, Tensor::from_host(device, &sin, &[max_positions, dim])?))
}

fn check_dim(op: &'static str, arg: &str, dim: usize) -> Result<()> {
    if dim == 0 || dim % 2 == 1 {
        return Err(tessera::Error::Argument {
            kernel: op,
            arg: arg.into(),
            expected: "an even head dimension".into(),
            found: dim.to_string(),
        });
    }
    Ok(())
}

/// Element types RoPE takes: bf16, f16, f32 (angles and products in f32).
pub trait RopeElement: Element {
    #[doc(hidden)]
    #[allow(clippy::too_many_arguments)]
    fn rope_launch(
        dev: &Device, style: RopeStyle, grid: Grid, x: &impl GlobalArg<Self>, y: &mut impl GlobalArgMut<Self>,
        cache: (&impl GlobalArg<f32>, &impl GlobalArg<f32>), positions: &impl GlobalArg<i32>, scalars: (i32, i32, i32, f32, f32, i32),
    ) -> Result<()>;
}

macro_rules! rope_element {
    ($t:ty, $half:ident, $pairs:ident) => {
        impl RopeElement for $t {
            fn rope_launch(
                dev: &Device, style: RopeStyle, grid: Grid, x: &impl GlobalArg<Self>, y: &mut impl GlobalArgMut<Self>,
                (cos, sin): (&impl GlobalArg<f32>, &impl GlobalArg<f32>), positions: &impl GlobalArg<i32>,
                (offset, has_p, has_c, freq, sign, stride): (i32, i32, i32, f32, f32, i32),
            ) -> Result<()> {
                match style {
                    RopeStyle::HalfSplit => $half::launch(dev, grid, x, y, cos, sin, positions, offset, has_p, has_c, freq, sign, stride),
                    RopeStyle::Interleaved => {
                        $pairs::launch(dev, grid, x, y, cos, sin, positions, offset, has_p, has_c, freq, sign, stride)
                    }
                }
            }
        }
    };
}
rope_element!(tessera::bf16, rope_half_bf16, rope_pairs_bf16);
rope_element!(tessera::f16, rope_half_f16, rope_pairs_f16);
rope_element!(f32, rope_half_f32, rope_pairs_f32);

/// The kernel's view of a `[b, s, h, d]` or `[b, h, s, d]` tensor: axes `[b, s, h, d]`, and
/// for the half-split convention `[b, s, 2, h, d/2]`.
fn kernel_view(style: RopeStyle, layout: HeadLayout, shape: &[usize], strides: &[usize]) -> (Vec<usize>, Vec<usize>) {
    let (b, s, h, d) = match layout {
        HeadLayout::Bshd => (0, 1, 2, 3),
        HeadLayout::Bhsd => (0, 2, 1, 3),
    };
    match style {
        RopeStyle::Interleaved => (vec![shape[b], shape[s], shape[h], shape[d]], vec![strides[b], strides[s], strides[h], strides[d]]),
        RopeStyle::HalfSplit => (
            vec![shape[b], shape[s], 2, shape[h], shape[d] / 2],
            vec![strides[b], strides[s], shape[d] / 2 * strides[d], strides[h], strides[d]],
        ),
    }
}

/// Checks a RoPE call; gives `(batch, seq, heads, dim)`.
fn check_rope<T: Element>(op: &'static str, rope: &Rope, x: &Tensor<T>, y_shape: &[usize]) -> Result<(usize, usize, usize, usize)> {
    let arg = |arg: &str, expected: String, found: String| tessera::Error::Argument { kernel: op, arg: arg.into(), expected, found };
    let [d0, d1, d2, dim] = *x.shape() else {
        return Err(arg("x", format!("a 4-D tensor laid out {:?}", rope.layout), format!("shape {:?}", x.shape())));
    };
    if y_shape != x.shape() {
        return Err(arg("y", format!("shape {:?}, as x", x.shape()), format!("shape {y_shape:?}")));
    }
    check_dim(op, "x", dim)?;
    let (batch, seq, heads) = match rope.layout {
        HeadLayout::Bshd => (d0, d1, d2),
        HeadLayout::Bhsd => (d0, d2, d1),
    };
    if batch > 65535 {
        return Err(arg("x", "at most 65535 sequences".into(), format!("batch {batch}")));
    }
    if let Positions::Tensor(p) = rope.positions {
        if p.shape() != [batch, seq] {
            return Err(arg("positions", format!("shape [{batch}, {seq}] ([batch, seq])"), format!("shape {:?}", p.shape())));
        }
    }
    if let Some((cos, sin)) = rope.cache {
        for (name, t) in [("cos", cos), ("sin", sin)] {
            if t.shape().len() != 2 || t.shape()[1] != dim || t.shape() != cos.shape() {
                return Err(arg(name, format!("a [max_positions, {dim}] table, cos and sin alike"), format!("shape {:?}", t.shape())));
            }
        }
    }
    Ok((batch, seq, heads, dim))
}

#[allow(clippy::too_many_arguments)]
fn launch<T: RopeElement>(
    device: &Device, rope: &Rope, sign: f32, dims: (usize, usize, usize, usize), x: &impl GlobalArg<T>, y: &mut impl GlobalArgMut<T>,
) -> Result<()> {
    let (batch, seq, heads, dim) = dims;
    if batch * seq * heads == 0 {
        return Ok(());
    }
    // Blocks loop over tokens, about 60 per SM (twelve waves of the five half-split blocks that
    // fit, ten of the six interleaved): a block's setup and its cos/sin lines are paid once per
    // several tokens (run 65: the cache variants 0.71 → 0.78–0.83 of copy, computed angles
    // 0.87 → 0.89; runs 72 and 79: 16 / 20 / 24 / 30 / 40 / 60 per SM gave half-split 0.85 /
    // 0.88 / 0.89 / 0.90 / 0.91 / 0.92).
    let hz = heads.div_ceil(HEADS);
    // (An L2 prefetch of the next token changed nothing, run 67: the loop already streams.)
    let gx = (device.sm_count() as usize * BLOCKS_PER_SM).div_ceil(batch * hz).clamp(1, seq);
    let grid = Grid::from((gx as u32, batch as u32, hz as u32));
    let freq_exp = -2.0 * f64::from(rope.base).log2() / dim as f64;
    let (offset, has_p) = match rope.positions {
        Positions::Offset(o) => (
            i32::try_from(o).map_err(|_| tessera::Error::Argument {
                kernel: "rope",
                arg: "positions".into(),
                expected: "an offset below 2³¹".into(),
                found: o.to_string(),
            })?,
            0,
        ),
        Positions::Tensor(_) => (0, 1),
    };
    let scalars = (offset, has_p, i32::from(rope.cache.is_some()), freq_exp as f32, sign, gx as i32);
    let none = Absent(2);
    match (rope.cache, rope.positions) {
        (Some((c, s)), Positions::Tensor(p)) => T::rope_launch(device, rope.style, grid, x, y, (c, s), p, scalars),
        (Some((c, s)), Positions::Offset(_)) => T::rope_launch(device, rope.style, grid, x, y, (c, s), &none, scalars),
        (None, Positions::Tensor(p)) => T::rope_launch(device, rope.style, grid, x, y, (&none, &none), p, scalars),
        (None, Positions::Offset(_)) => T::rope_launch(device, rope.style, grid, x, y, (&none, &none), &none, scalars),
    }
}

fn rope_out_of_place<T: RopeElement>(
    op: &'static str, device: &Device, rope: &Rope, sign: f32, x: &Tensor<T>, y: &mut Tensor<T>,
) -> Result<()> {
    let dims = check_rope(op, rope, x, y.shape())?;
    let (xs, xst) = kernel_view(rope.style, rope.layout, x.shape(), x.strides());
    let (ys, yst) = kernel_view(rope.style, rope.layout, y.shape(), y.strides());
    let xv = x.view(&xs, &xst)?;
    let mut yv = y.view_mut(&ys, &yst)?;
    launch(device, rope, sign, dims, &xv, &mut yv)
}

fn rope_inplace<T: RopeElement>(op: &'static str, device: &Device, rope: &Rope, sign: f32, x: &mut Tensor<T>) -> Result<()> {
    let dims = check_rope(op, rope, x, x.shape())?;
    let (xs, xst) = kernel_view(rope.style, rope.layout, x.shape(), x.strides());
    let mut view = x.view_mut(&xs, &xst)?;
    let (mut both, _guard) = in_place(&mut view, device)?;
    let read = both.clone();
    launch::<T>(device, rope, sign, dims, &read, &mut both)
}

/// `y = rope(x)`: rotates each head of the query or key tensor `x` (`[batch, seq, heads,
/// dim]` or `[batch, heads, seq, dim]`, as `rope.layout` says; `dim` even) by its token's
/// angles. Any head count and even head dimension; 64, 128 and 256 are the tuned ones.
///
/// # Errors
/// [`tessera::Error::Argument`] naming `x`, `y`, `positions`, `cos` or `sin` when a shape does
/// not fit; a launch error.
pub fn rope<T: RopeElement>(device: &Device, rope: &Rope, x: &Tensor<T>, y: &mut Tensor<T>) -> Result<()> {
    rope_out_of_place("rope", device, rope, 1.0, x, y)
}

/// [`rope`] in place: `x ← rope(x)`.
///
/// # Errors
/// As [`rope`].
pub fn rope_in_place<T: RopeElement>(device: &Device, rope: &Rope, x: &mut Tensor<T>) -> Result<()> {
    rope_inplace("rope_in_place", device, rope, 1.0, x)
}

/// The backward pass of [`rope`]: `dx = rope⁻¹(dy)`, the rotation by the opposite angles.
///
/// # Errors
/// As [`rope`], naming `x` for `dy` and `y` for `dx`.
pub fn rope_backward<T: RopeElement>(device: &Device, rope: &Rope, dy: &Tensor<T>, dx: &mut Tensor<T>) -> Result<()> {
    rope_out_of_place("rope_backward", device, rope, -1.0, dy, dx)
}

/// [`rope_backward`] in place: `dy ← rope⁻¹(dy)`.
///
/// # Errors
/// As [`rope`].
pub fn rope_backward_in_place<T: RopeElement>(device: &Device, rope: &Rope, dy: &mut Tensor<T>) -> Result<()> {
    rope_inplace("rope_backward_in_place", device, rope, -1.0, dy)
}
