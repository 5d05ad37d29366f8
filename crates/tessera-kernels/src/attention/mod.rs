//! FlashAttention forward on Hopper: `O = softmax(Q·Kᵀ·scale)·V` without materializing the
//! score matrix, plus the per-row log-sum-exp a backward pass needs. The kernels are in
//! [`kernels`](self) (DSL source: `attention/kernels.rs`); this is the host side: layouts,
//! grouped-query heads, causal alignment, checks.

mod kernels;

pub use kernels::{attention_d128_bf16, attention_d128_f16, attention_d64_bf16, attention_d64_f16};

use tessera::{bf16, f16, Device, Element, Error, Grid, KernelSpec, Result, Tensor, TensorView, TensorViewMut};

/// How Q, K, V and O are laid out.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum AttentionLayout {
    /// `[batch, seq, heads, head_dim]` (the projection's output as it comes).
    #[default]
    Bshd,
    /// `[batch, heads, seq, head_dim]`.
    Bhsd,
}

/// Options of [`attention`]: layout, causal mask, softmax scale.
///
/// ```no_run
/// use tessera::{bf16, Device, Tensor};
/// use tessera_kernels::{attention, Attention};
/// let dev = Device::new(0)?;
/// let q = Tensor::<bf16>::zeros(&dev, &[2, 1024, 16, 128])?; // [batch, seq, heads, dim]
/// let k = Tensor::<bf16>::zeros(&dev, &[2, 1024, 4, 128])?; // 4 key/value heads (GQA)
/// let v = Tensor::<bf16>::zeros(&dev, &[2, 1024, 4, 128])?;
/// let mut o = Tensor::<bf16>::zeros(&dev, &[2, 1024, 16, 128])?;
/// attention(&dev, &Attention::new().causal(true), &q, &k, &v, &mut o)?;
/// # Ok::<(), tessera::Error>(())
/// ```
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Attention {
    layout: AttentionLayout,
    causal: bool,
    scale: Option<f32>,
}

impl Attention {
    /// Non-causal, `[batch, seq, heads, dim]`, scale `1/√dim`.
    pub fn new() -> Attention {
        Attention::default()
    }

    /// The tensors' layout.
    pub fn layout(self, layout: AttentionLayout) -> Attention {
        Attention { layout, ..self }
    }

    /// Masks key `j` from query `i` when `j > i + seq_k − seq_q` (the diagonal aligned at the
    /// end, as for decoding with a KV cache).
    pub fn causal(self, causal: bool) -> Attention {
        Attention { causal, ..self }
    }

    /// The factor on `Q·Kᵀ` before the softmax (default `1/√head_dim`).
    pub fn scale(self, scale: f32) -> Attention {
        Attention { scale: Some(scale), ..self }
    }
}

/// An element type attention takes: `bf16` or `f16`.
pub trait AttentionElement: Element + sealed::Sealed {
    #[doc(hidden)]
    fn spec(dim: usize) -> Option<&'static KernelSpec>;
    #[doc(hidden)]
    #[allow(clippy::too_many_arguments)]
    fn forward(
        d: &Device,
        g: Grid,
        dim: usize,
        t: [&TensorView<Self>; 3],
        o: &mut TensorViewMut<Self>,
        lse: &mut TensorViewMut<f32>,
        ints: [i32; 7],
        scale_log2: f32,
    ) -> Result<()>;
}

mod sealed {
    pub trait Sealed {}
    impl Sealed for tessera::bf16 {}
    impl Sealed for tessera::f16 {}
}

macro_rules! attention_element {
    ($t:ty, $d64:ident, $d128:ident) => {
        impl AttentionElement for $t {
            fn spec(dim: usize) -> Option<&'static KernelSpec> {
                match dim {
                    64 => Some(&$d64::SPEC),
                    128 => Some(&$d128::SPEC),
                    _ => None,
                }
            }
            fn forward(
                d: &Device,
                g: Grid,
                dim: usize,
                [q, k, v]: [&TensorView<Self>; 3],
                o: &mut TensorViewMut<Self>,
                lse: &mut TensorViewMut<f32>,
                [heads, group, q_bm, k_bm, hm, cm, causal]: [i32; 7],
                scale_log2: f32,
            ) -> Result<()> {
                let mut counter = d.tile_counter()?;
                match dim {
                    64 => $d64::launch(d, g, q, k, v, o, lse, &mut counter, heads, group, q_bm, k_bm, hm, cm, causal, scale_log2),
                    128 => $d128::launch(d, g, q, k, v, o, lse, &mut counter, heads, group, q_bm, k_bm, hm, cm, causal, scale_log2),
                    _ => Err(arg("q", "head_dim 64 or 128".into(), format!("head_dim {dim}"))),
                }
            }
        }
    };
}
attention_element!(bf16, attention_d64_bf16, attention_d128_bf16);
attention_element!(f16, attention_d64_f16, attention_d128_f16);

fn arg(name: &str, expected: String, found: String) -> Error {
    Error::Argument { kernel: "attention", arg: name.into(), expected, found }
}

/// `[batch, seq, heads, dim]` of a rank-4 tensor in `layout`.
fn dims(name: &str, t: &Tensor<impl Element>, layout: AttentionLayout) -> Result<[usize; 4]> {
    let [a, b, c, d] = *t.shape() else {
        return Err(arg(name, "a rank-4 tensor".into(), format!("shape {:?}", t.shape())));
    };
    if !t.is_contiguous() {
        return Err(arg(name, "a contiguous tensor".into(), format!("strides {:?}", t.strides())));
    }
    Ok(match layout {
        AttentionLayout::Bshd => [a, b, c, d],
        AttentionLayout::Bhsd => [a, c, b, d],
    })
}

/// The rank-3 view the kernel reads: `[batch, seq, heads·dim]` or `[batch·heads, seq, dim]`.
fn view3(layout: AttentionLayout, [b, s, h, d]: [usize; 4]) -> ([usize; 3], [usize; 3]) {
    match layout {
        AttentionLayout::Bshd => ([b, s, h * d], [s * h * d, h * d, 1]),
        AttentionLayout::Bhsd => ([b * h, s, d], [s * d, d, 1]),
    }
}

/// FlashAttention forward: `o = softmax(q·kᵀ·scale [+ causal mask])·v` per (batch, head), and
/// the natural-log log-sum-exp of each row of scaled scores into `lse` (`[batch, heads,
/// seq_q]`, f32; −∞ for a row whose keys are all masked, whose output is 0).
///
/// `q` and `o` are `[batch, seq_q, heads, dim]` (or `[batch, heads, seq_q, dim]` with
/// [`AttentionLayout::Bhsd`]); `k` and `v` the same with `seq_k` and `kv_heads`, where
/// `kv_heads` divides `heads` (grouped-query attention; query head `h` reads key/value head
/// `h / (heads / kv_heads)`). Any sequence lengths ≥ 1; head_dim 64 or 128. Hopper (sm_90) only.
///
/// # Errors
/// [`Error::Argument`] naming the tensor whose rank, shape, contiguity or head count does not
/// fit, or a head_dim other than 64 or 128; the launch's own checks (device, target).
pub fn attention_with_lse<T: AttentionElement>(
    device: &Device,
    opts: &Attention,
    q: &Tensor<T>,
    k: &Tensor<T>,
    v: &Tensor<T>,
    o: &mut Tensor<T>,
    lse: &mut Tensor<f32>,
) -> Result<()> {
    let layout = opts.layout;
    let [b, sq, h, d] = dims("q", q, layout)?;
    let [bk, sk, hk, dk] = dims("k", k, layout)?;
    if T::spec(d).is_none() {
        return Err(arg("q", "head_dim 64 or 128".into(), format!("head_dim {d}")));
    }
    if bk != b || dk != d || hk == 0 || h % hk != 0 {
        return Err(arg(
            "k",
            format!("batch {b}, head_dim {d} and a number of heads dividing {h}"),
            format!("batch {bk}, head_dim {dk}, {hk} heads"),
        ));
    }
    if v.shape() != k.shape() {
        return Err(arg("v", format!("k's shape {:?}", k.shape()), format!("shape {:?}", v.shape())));
    }
    dims("v", v, layout)?;
    if o.shape() != q.shape() {
        return Err(arg("o", format!("q's shape {:?}", q.shape()), format!("shape {:?}", o.shape())));
    }
    dims("o", o, layout)?;
    crate::check_shape("attention", "lse", lse, &[b, h, sq])?;
    if !lse.is_contiguous() {
        return Err(arg("lse", "a contiguous tensor".into(), format!("strides {:?}", lse.strides())));
    }
    if b == 0 || sq == 0 || sk == 0 || h == 0 {
        return Err(arg("q", "batch, heads and both sequence lengths ≥ 1".into(), format!("batch {b}, seq_q {sq}, seq_k {sk}, {h} heads")));
    }
    let too_big = |x: usize| i32::try_from(x).is_err();
    if too_big(b * h * sq) || too_big(b * hk * sk) || too_big(h * d) {
        return Err(arg("q", "fewer than 2³¹ rows".into(), format!("batch {b}, seq_q {sq}, seq_k {sk}, {h} heads")));
    }
    let (qs, qst) = view3(layout, [b, sq, h, d]);
    let (ks, kst) = view3(layout, [b, sk, hk, d]);
    let (qv, kv, vv) = (q.view(&qs, &qst)?, k.view(&ks, &kst)?, v.view(&ks, &kst)?);
    let mut ov = o.view_mut(&qs, &qst)?;
    let mut lv = lse.view_mut(&[b * h, sq, 1], &[sq, 1, 1])?;
    let (q_bm, k_bm, hm, cm) = match layout {
        AttentionLayout::Bshd => (1, 1, 0, d),
        AttentionLayout::Bhsd => (h, hk, 1, 0),
    };
    let scale = opts.scale.unwrap_or(1.0 / (d as f32).sqrt());
    let ints = [h, h / hk, q_bm, k_bm, hm, cm, usize::from(opts.causal)].map(|x| x as i32);
    // A persistent grid: one block per SM at most.
    let grid = Grid::tiles(sq, 128).saturating_mul((b * h) as u32).min(device.sm_count());
    T::forward(device, grid.into(), d, [&qv, &kv, &vv], &mut ov, &mut lv, ints, scale * std::f32::consts::LOG2_E)
}

/// [`attention_with_lse`] without keeping the log-sum-exp (for inference).
///
/// # Errors
/// As [`attention_with_lse`].
pub fn attention<T: AttentionElement>(
    device: &Device,
    opts: &Attention,
    q: &Tensor<T>,
    k: &Tensor<T>,
    v: &Tensor<T>,
    o: &mut Tensor<T>,
) -> Result<()> {
    let [b, sq, h, _] = dims("q", q, opts.layout)?;
    let mut lse = Tensor::<f32>::zeros(device, &[b, h, sq])?;
    attention_with_lse(device, opts, q, k, v, o, &mut lse)
}
