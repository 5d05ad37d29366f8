//! FlashAttention forward on Hopper: `O = softmax(Q·Kᵀ·scale)·V` without materializing the
//! score matrix, plus the per-row log-sum-exp a backward pass needs. The kernels are in
//! [`kernels`](self) (DSL source: `attention/kernels.rs`); this is the host side: layouts,
//! grouped-query heads, causal alignment, checks.

mod backward;
pub(crate) mod kernels;

pub use backward::{
    attention_backward, attention_bwd_dkv_bf16, attention_bwd_dkv_f16, attention_bwd_dkv_mods_bf16, attention_bwd_dkv_mods_f16,
    attention_bwd_dkv_wide_bf16, attention_bwd_dkv_wide_f16, attention_bwd_dkv_wide_mods_bf16, attention_bwd_dkv_wide_mods_f16,
    attention_bwd_dot_bf16, attention_bwd_dot_f16, attention_bwd_dq_bf16, attention_bwd_dq_f16, attention_bwd_dq_mods_bf16,
    attention_bwd_dq_mods_f16, attention_bwd_dq_out_bf16, attention_bwd_dq_out_f16, attention_varlen_backward, AttentionGrads,
};
pub use backward::{attention_dkv_tile, attention_dkv_wide_tile, attention_dq_tile};

pub use kernels::{
    attention_combine_bf16, attention_combine_f16, flash_attention_bf16, flash_attention_f16, flash_attention_mods_bf16,
    flash_attention_mods_f16, flash_attention_varlen_bf16, flash_attention_varlen_f16, flash_attention_varlen_mods_bf16,
    flash_attention_varlen_mods_f16,
};

use tessera::{bf16, f16, Device, Element, Error, Grid, KernelSpec, Optional, OptionalMut, Result, Tensor, TensorView, TensorViewMut};

/// How Q, K, V and O are laid out.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum AttentionLayout {
    /// `[batch, seq, heads, head_dim]` (the projection's output as it comes).
    #[default]
    Bshd,
    /// `[batch, heads, seq, head_dim]`.
    Bhsd,
}

/// Options of [`attention`]: layout, causal mask, softmax scale, key splits.
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
    variant: Option<&'static str>,
    kv_splits: Option<usize>,
    check_offsets: Option<bool>,
    /// `deterministic(true)`: dQ by a walk of its own, no reduce-adds.
    deterministic: bool,
    /// The library's modifiers (`flash_attention_mods`).
    softcap: Option<f32>,
    alibi: Option<f32>,
    window: Option<usize>,
    prefix: Option<usize>,
    /// Dropout of the probabilities: `(p, seed, offset)`.
    dropout: Option<(f32, u64, u32)>,
    /// A caller's kernel in place of the library's.
    kernel: Option<AttentionKernel>,
}

/// A kernel of yours that [`attention`] runs in place of the library's forward (see
/// [`Attention::kernel`]): its `VARIANTS`. Its parameters must be `flash_attention`'s, in
/// order; it is compared by address.
#[derive(Clone, Copy)]
pub struct AttentionKernel(pub &'static [&'static KernelSpec]);

impl std::fmt::Debug for AttentionKernel {
    /// The kernel's name, not its specs (their PTX).
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "AttentionKernel({})", self.0.first().map_or("no variants", |k| k.name))
    }
}

impl PartialEq for AttentionKernel {
    fn eq(&self, other: &Self) -> bool {
        std::ptr::eq(self.0, other.0)
    }
}

/// The parameters a kernel given to [`Attention::kernel`] takes, in order: those of
/// `flash_attention` (and of [`kernels::attention_persistent`] before its functions).
pub const ATTENTION_KERNEL_PARAMS: [&str; 20] = [
    "q",
    "k",
    "v",
    "o",
    "lse",
    "counter",
    "opart",
    "lpart",
    "full",
    "parts",
    "heads",
    "group",
    "q_bm",
    "k_bm",
    "hm",
    "cm",
    "causal",
    "hg",
    "keep_lse",
    "scale_log2",
];

/// The library's modifiers as their kernels take them.
#[doc(hidden)]
#[derive(Clone, Copy, Debug)]
pub struct LibraryMods {
    /// The variant, knob `M`: the modifiers' bits, 1 soft-capping, 2 ALiBi, 4 window or
    /// prefix; 7 all of them switched at run time, 15 those and dropout.
    m: i64,
    /// `[cap, max_bias, alibi_scale]` (raw units, see `kernels::softcap`).
    scores: [f32; 3],
    /// `[window, prefix]`.
    masks: [i32; 2],
    /// Dropout's `[seed_lo, seed_hi, offset]` (the seed's words and the offset as `i32` bits).
    drop: [i32; 3],
    /// Dropout's probability (a multiple of 1/256; 0: none).
    drop_p: f32,
}

impl LibraryMods {
    /// Soft-capping alone returns `tanh(s / cap)`: the cap's factor, which goes with the scale
    /// (1 otherwise).
    fn cap_factor(&self) -> f32 {
        if self.m == 1 {
            self.scores[0]
        } else {
            1.0
        }
    }
}

/// Which forward kernel a call runs.
#[derive(Clone, Copy)]
enum Flavor {
    /// `flash_attention` / `flash_attention_varlen`.
    Plain,
    /// `flash_attention_mods`'s variants of knob `M`.
    Mods(LibraryMods),
    /// The caller's.
    Custom(&'static [&'static KernelSpec]),
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

    /// The layout (for the layers built on the forward, such as ring attention).
    pub(crate) fn layout_of(&self) -> AttentionLayout {
        self.layout
    }

    /// Whether the mask is causal.
    pub(crate) fn is_causal(&self) -> bool {
        self.causal
    }

    /// The factor on `Q·Kᵀ` before the softmax (default `1/√head_dim`).
    pub fn scale(self, scale: f32) -> Attention {
        Attention { scale: Some(scale), ..self }
    }

    /// Runs the kernel variant named `name` (one of [`attention_variants`]) instead of asking
    /// the [`Tuner`](tessera::Tuner): for benchmarks and tests of one schedule.
    pub fn variant(self, name: &'static str) -> Attention {
        Attention { variant: Some(name), ..self }
    }

    /// Splits every tile of 128 query rows into `n` ranges of keys, each run as a tile of its
    /// own, and combines their outputs after (a second, small kernel): more blocks than tiles,
    /// for a few long sequences (decoding). `1` never splits. Unset, [`attention`] splits the
    /// tiles of a non-causal grid's last, partly filled wave when the model of the wave says
    /// that ends sooner. Not for [`attention_varlen`].
    pub fn kv_splits(self, n: usize) -> Attention {
        Attention { kv_splits: Some(n), ..self }
    }

    /// Whether [`attention_varlen`] reads `cu_seqlens_q` and `cu_seqlens_k` back from the device
    /// and checks them ([`check_cu_seqlens`]) before the launch: a synchronizing copy of
    /// `2·(batch + 1)` integers. On by default in debug builds, off in release ones (the
    /// kernels then clamp each sequence to the packed rows: nothing outside the tensors is
    /// touched, but bad offsets give wrong rows).
    pub fn check_offsets(self, on: bool) -> Attention {
        Attention { check_offsets: Some(on), ..self }
    }

    /// Whether [`attention_backward`] gives the same bits every run (off by default). Off, the
    /// dK/dV walk also forms each key block's part of dQ (the two consumer warpgroups one half
    /// each) and sums it by TMA reduce-adds into an f32 buffer — five MMAs a block pair, the
    /// faster mode (0.86–0.97× cuDNN on the H100, `notes/ISSUE-28.md`), but the sums' order,
    /// and so dQ's last bits, vary from run to run. On, dQ comes from a walk of its own over the
    /// key blocks with S and dP recomputed (seven MMAs, 0.80–0.94×): no float atomics.
    pub fn deterministic(self, on: bool) -> Attention {
        Attention { deterministic: on, ..self }
    }

    /// Caps the scaled scores softly before the softmax: `s ↦ cap·tanh(s / cap)` (Gemma 2's
    /// logit soft-capping), `s` = `q·k·scale`. [`attention_backward`] takes it back through
    /// `1 − tanh²(s / cap)`.
    pub fn softcap(self, cap: f32) -> Attention {
        Attention { softcap: Some(cap), ..self }
    }

    /// Adds ALiBi's linear bias to the scaled scores: `−slope_h·|i − j|` between query `i` and
    /// key `j` (the diagonal aligned at the end when the lengths differ), head `h`'s slope
    /// `2^(−max_bias·(h + 1)/heads)` (the paper's slopes for a power-of-two number of heads
    /// with `max_bias` 8). After [`Attention::softcap`], where both are set. Forward and
    /// backward.
    pub fn alibi(self, max_bias: f32) -> Attention {
        Attention { alibi: Some(max_bias), ..self }
    }

    /// A sliding window, with [`Attention::causal`]: each query sees its last `keys` keys, the
    /// diagonal's included (Mistral's and Gemma's local layers). Key blocks wholly before a
    /// tile's window are skipped, not masked: the work grows with `keys`, not the sequence.
    /// Forward and backward (whose walks skip the blocks outside the window likewise).
    pub fn sliding_window(self, keys: usize) -> Attention {
        Attention { window: Some(keys), ..self }
    }

    /// A prefix every query sees, with [`Attention::causal`]: keys `0..keys` are visible to all
    /// queries, the rest causally (a prefix LM). Forward and backward.
    pub fn prefix(self, keys: usize) -> Attention {
        Attention { prefix: Some(keys), ..self }
    }

    /// Drops each attention probability (an element of `P` after the softmax) with probability
    /// `p` and scales the kept ones by `1 / (1 − p)`, as in training (FlashAttention's dropout):
    /// `O = (P ∘ Z / (1 − p))·V`, the log-sum-exp the undropped softmax's. The mask `Z` is
    /// Philox's: element `(q, k)` of (batch·head) `bh` is kept when
    /// [`attention_dropout_keep`]`(seed, offset, bh, q, k, p)` — the same bits in the forward and
    /// in [`attention_backward`] given the same options, on any GPU, in any layout. Use a new
    /// `offset` (or seed) for each step. `p` is rounded to a multiple of 1/256 (the mask
    /// compares a byte); 0 turns dropout off; it must be below 1. Runs the modifiers' kernel
    /// with every modifier switched at run time (variant `M` 15), beside any other modifier;
    /// not with a kernel of yours.
    pub fn dropout(self, p: f32, seed: u64, offset: u32) -> Attention {
        Attention { dropout: Some((p, seed, offset)), ..self }
    }

    /// Runs `kernel` — a kernel of yours whose body calls [`kernels::attention_persistent`]
    /// with your own `score_mod`, `mask_mod` and `key_range` (or epilogue) — in place of the
    /// library's forward: pass its module's `VARIANTS`. Its parameters must be
    /// [`ATTENTION_KERNEL_PARAMS`], its tune knob `D` the head dim (a variant per head dim it
    /// serves). Its tiles are never split into key ranges. Dense layouts only, forward only
    /// ([`attention_backward`] refuses it).
    ///
    /// ```ignore
    /// #[tessera::kernel(warpgroups = 3, dtypes(T = [bf16]), tune(D = [128]), targets(sm_90a))]
    /// pub fn banded(q: Global<T, 3>, /* … flash_attention's parameters … */ scale_log2: f32) {
    ///     let seq_k = k.dim(1);
    ///     let shift = seq_k - q.dim(1);
    ///     attention_persistent::<T, D, 128, 2>(q, k, v, o, lse, counter, opart, lpart, full, parts,
    ///         heads, group, q_bm, k_bm, hm, cm, hg, keep_lse, scale_log2,
    ///         |x, _, _, _| x,
    ///         |s, qi, kj, _bh| s - abs(qi - kj) * 0.01,           // score_mod
    ///         |qi, kj, _bh| causal_visible(qi, kj, shift),        // mask_mod
    ///         |_bh, q0, rows| causal_keys(q0, rows, seq_k, shift, causal), // key_range
    ///         |p, _bh, _q0, _k0| p);                                 // dropout (none)
    /// }
    /// attention(&dev, &Attention::new().causal(true).kernel(banded_bf16::VARIANTS), &q, &k, &v, &mut o)?;
    /// ```
    pub fn kernel(self, variants: &'static [&'static KernelSpec]) -> Attention {
        Attention { kernel: Some(AttentionKernel(variants)), ..self }
    }

    /// The factor on `Q·Kᵀ` at `head_dim`: the one given, else `1/√head_dim`.
    fn scale_for(&self, head_dim: usize) -> f32 {
        self.scale.unwrap_or(1.0 / (head_dim as f32).sqrt())
    }

    /// Whether any modifier or a kernel of the caller's is set.
    pub(crate) fn modified(&self) -> bool {
        self.library_mods() || self.kernel.is_some()
    }

    /// Whether any of the library's modifiers (dropout among them) is set.
    fn library_mods(&self) -> bool {
        self.softcap.is_some() || self.alibi.is_some() || self.window.is_some() || self.prefix.is_some() || self.dropout.is_some()
    }

    /// The forward kernel this call runs at `head_dim`, its modifiers checked.
    fn flavor(&self, head_dim: usize, varlen: bool) -> Result<Flavor> {
        if !self.modified() {
            return Ok(Flavor::Plain);
        }
        if let Some(AttentionKernel(k)) = self.kernel {
            if varlen {
                return Err(arg("kernel", "no kernel of yours with packed sequences (dense layouts only)".into(), format!("{self:?}")));
            }
            if self.library_mods() {
                return Err(arg(
                    "kernel",
                    "a kernel of yours alone (its own modifiers), or the library's modifiers".into(),
                    format!("{self:?}"),
                ));
            }
            return Ok(Flavor::Custom(k));
        }
        let scale = self.scale_for(head_dim);
        let cap = match self.softcap {
            Some(c) if !(c.is_finite() && c > 0.0) => return Err(arg("softcap", "a finite cap > 0".into(), format!("{c}"))),
            Some(c) => c / scale,
            None => 0.0,
        };
        let alibi = match self.alibi {
            Some(b) if !(b.is_finite() && b > 0.0) => return Err(arg("alibi", "a finite max_bias > 0".into(), format!("{b}"))),
            Some(b) => b,
            None => 0.0,
        };
        if !self.causal && (self.window.is_some() || self.prefix.is_some()) {
            let which = if self.window.is_some() { "sliding_window" } else { "prefix" };
            return Err(arg(which, "a causal attention (Attention::causal(true))".into(), "causal false".into()));
        }
        let window = match self.window {
            Some(0) => return Err(arg("sliding_window", "at least 1 key".into(), "0".into())),
            Some(w) => i32::try_from(w).unwrap_or(i32::MAX).min(1 << 30),
            None => 1 << 30,
        };
        let prefix = i32::try_from(self.prefix.unwrap_or(0)).unwrap_or(i32::MAX);
        let (drop_p, drop) = match self.dropout {
            Some((p, seed, offset)) => (dropout_threshold(p)?, [seed as u32 as i32, (seed >> 32) as u32 as i32, offset as i32]),
            None => (0.0, [0; 3]),
        };
        // The variant of just these modifiers, where there is one; else the one of all (the
        // only one with dropout).
        let bits = i64::from(cap > 0.0) | i64::from(alibi > 0.0) << 1 | i64::from(self.window.is_some() || self.prefix.is_some()) << 2;
        let m = if drop_p > 0.0 {
            15
        } else if [1, 4].contains(&bits) {
            bits
        } else {
            7
        };
        Ok(Flavor::Mods(LibraryMods { m, scores: [cap, alibi, 1.0 / scale], masks: [window, prefix], drop, drop_p }))
    }
}

/// Dropout's `p` as the kernels compare it: rounded to a multiple of 1/256.
fn rounded_dropout(p: f32) -> f32 {
    (p * 256.0).round() / 256.0
}

/// [`rounded_dropout`], checked: below 1 (NaN refused).
fn dropout_threshold(p: f32) -> Result<f32> {
    let t = rounded_dropout(p);
    if !(0.0..1.0).contains(&t) {
        return Err(arg(
            "dropout",
            "a probability p with 0 ≤ p < 1 (rounded to a multiple of 1/256, below 255.5/256)".into(),
            format!("{p}"),
        ));
    }
    Ok(t)
}

/// Whether [`Attention::dropout`]`(p, seed, offset)` keeps the probability of query `q` and key
/// `k` of (batch·head) `bh` (`bh = batch · heads + head`; `q` and `k` counted within the
/// sequence, packed sequences included): [`tessera::random::uniform8`]`(seed, offset, bh, q, k)`
/// at least `p` rounded to a multiple of 1/256. The host's copy of the mask, for references
/// and for reproducing a step outside the kernels.
pub fn attention_dropout_keep(seed: u64, offset: u32, bh: usize, q: usize, k: usize, p: f32) -> bool {
    tessera::random::uniform8(seed, offset, bh as u32, q as u32, k as u32) >= rounded_dropout(p)
}

/// Checks packed-sequence offsets as [`attention_varlen`] reads them: each of `cu_seqlens_q`
/// and `cu_seqlens_k` starts at 0, never decreases and ends at most at its total (`total_q`
/// query rows, `total_k` key rows), and no sequence has more than `max_seqlen_q` query rows.
/// For offsets the caller still holds on the host; [`Attention::check_offsets`] runs it on
/// device offsets.
///
/// # Errors
/// [`Error::Argument`] naming the offsets and the first entry that breaks a rule.
pub fn check_cu_seqlens(cu_seqlens_q: &[i32], cu_seqlens_k: &[i32], total_q: usize, total_k: usize, max_seqlen_q: usize) -> Result<()> {
    for (name, cu, total) in [("cu_seqlens_q", cu_seqlens_q, total_q), ("cu_seqlens_k", cu_seqlens_k, total_k)] {
        if cu.first() != Some(&0) {
            return Err(arg(name, "offsets starting at 0".into(), format!("{:?}", cu.first())));
        }
        for (i, w) in cu.windows(2).enumerate() {
            if w[1] < w[0] {
                return Err(arg(name, "non-decreasing offsets".into(), format!("offset {} = {} after {}", i + 1, w[1], w[0])));
            }
            if name == "cu_seqlens_q" && (w[1] - w[0]) as usize > max_seqlen_q {
                return Err(arg(
                    name,
                    format!("sequences of at most max_seqlen_q = {max_seqlen_q} query rows"),
                    format!("sequence {i}: {} rows", w[1] - w[0]),
                ));
            }
        }
        if let Some(&last) = cu.last() {
            if last as usize > total {
                return Err(arg(name, format!("offsets within the {total} packed rows"), format!("last offset {last}")));
            }
        }
    }
    Ok(())
}

/// The kernel variants attention chooses among for `head_dim` (K/V pipeline depths and key
/// blocks; by default the first of the key block that suits the key length best), of the dense
/// kernel or, with `packed`, of [`attention_varlen`]'s. Empty for a head_dim without kernels.
pub fn attention_variants<T: AttentionElement>(head_dim: usize, packed: bool) -> Vec<&'static str> {
    T::variants(packed).iter().filter(|s| of_head_dim(s, head_dim)).map(|s| s.name).collect()
}

/// The error for a head dim `d` that none of the variants `all` serves, naming the head dims
/// they do serve (their knobs `D`) and whose they are (`what`: "the forward's").
fn head_dim_error(all: &[&KernelSpec], d: usize, what: &str) -> Error {
    let mut dims: Vec<i64> = all.iter().filter_map(|s| s.knob("D")).collect();
    dims.sort_unstable();
    dims.dedup();
    let list: Vec<String> = dims.iter().map(|d| d.to_string()).collect();
    let list = match list.split_last() {
        Some((last, rest)) if !rest.is_empty() => format!("{} or {last}", rest.join(", ")),
        _ => list.join(""),
    };
    arg("q", format!("head_dim {list} ({what})"), format!("head_dim {d}"))
}

/// Whether a kernel variant (attention's or the combine's) is the one of `head_dim` (knob `D`).
fn of_head_dim(spec: &KernelSpec, head_dim: usize) -> bool {
    spec.knob("D") == Some(head_dim as i64)
}

/// An element type attention takes: `bf16` or `f16`.
pub trait AttentionElement: Element + sealed::Sealed {
    /// The variants of the dense (`varlen` false) or packed kernel, each with its knobs `D`
    /// (head dim), `STAGES` (K/V pipeline depth) and `BN` (keys a block).
    #[doc(hidden)]
    fn variants(varlen: bool) -> &'static [&'static KernelSpec];
    /// The variants of `flash_attention_mods` (`varlen` false) or `flash_attention_varlen_mods`.
    #[doc(hidden)]
    fn mods_variants(varlen: bool) -> &'static [&'static KernelSpec];
    #[doc(hidden)]
    #[allow(clippy::too_many_arguments)]
    fn forward(
        d: &Device, g: Grid, variant: usize, t: [&TensorView<Self>; 3], o: &mut TensorViewMut<Self>, lse: &mut TensorViewMut<f32>,
        cu: [&Optional<Tensor<i32>>; 2], split: Split<'_>, ints: [i32; 12], scale_log2: f32,
    ) -> Result<()>;
    /// The backward's kernels ([`attention_backward`]: three, or with `dq_acc` the dot, the
    /// dK/dV walk summing dQ, and its scaling), their variant of head dim `d`; with `mods`
    /// (`Mods`' `M`, parameters and masks) the walks of the library's modifiers.
    #[doc(hidden)]
    #[allow(clippy::too_many_arguments)]
    fn backward(
        d: &Device, head_dim: usize, grids: [usize; 4], qkv_do_o: [&TensorView<Self>; 5], lse: &TensorView<f32>,
        stats: [&mut Tensor<f32>; 2], cols: usize, dq_acc: Option<&mut Tensor<f32>>, grads: [&mut TensorViewMut<Self>; 3],
        cu: [&Optional<Tensor<i32>>; 2], ints: [i32; 10], scales: [f32; 2], mods: Option<LibraryMods>,
    ) -> Result<()>;
    /// The dense forward with the library's modifiers (`flash_attention_mods`, variant `i`):
    /// `ints` as [`AttentionElement::forward`]'s.
    #[doc(hidden)]
    #[allow(clippy::too_many_arguments)]
    fn forward_mods(
        d: &Device, g: Grid, variant: usize, t: [&TensorView<Self>; 3], o: &mut TensorViewMut<Self>, lse: &mut TensorViewMut<f32>,
        cu: [&Optional<Tensor<i32>>; 2], split: Split<'_>, ints: [i32; 12], scale_log2: f32, mods: LibraryMods,
    ) -> Result<()>;
    /// Puts the split tiles back together: `attention_combine`, its variant of head dim `d`.
    #[doc(hidden)]
    fn combine(
        d: &Device, head_dim: usize, parts: [&Tensor<f32>; 2], o: &mut TensorViewMut<Self>, lse: &mut TensorViewMut<f32>, ints: [i32; 7],
    ) -> Result<()>;
}

/// The split of a dense launch's tiles: tiles from `full` on run in `parts` ranges of keys,
/// each writing its output and log₂-sum-exp to `out` (absent when nothing is split).
#[doc(hidden)]
pub struct Split<'t> {
    full: i32,
    parts: i32,
    out: [OptionalMut<'t, Tensor<f32>>; 2],
}

mod sealed {
    pub trait Sealed {}
    impl Sealed for tessera::bf16 {}
    impl Sealed for tessera::f16 {}
}

macro_rules! attention_element {
    ($t:ty, $dense:ident, $varlen:ident, $mods:ident, $varlen_mods:ident, $combine:ident, $dot:ident, $dq:ident, $dkv:ident, $dq_out:ident, $dq_mods:ident, $dkv_mods:ident, $dkv_wide:ident, $dkv_wide_mods:ident) => {
        impl AttentionElement for $t {
            fn backward(
                d: &Device, head_dim: usize, [bd, bq, bk, bk64]: [usize; 4], [q, k, v, dout, o]: [&TensorView<Self>; 5], lse: &TensorView<f32>,
                [dsum, lse_log2]: [&mut Tensor<f32>; 2], cols: usize, dq_acc: Option<&mut Tensor<f32>>,
                [dq, dk, dv]: [&mut TensorViewMut<Self>; 3], [cu_q, cu_k]: [&Optional<Tensor<i32>>; 2],
                [heads, group, q_bm, k_bm, hm, cm, causal, max_q, max_k, varlen]: [i32; 10], [scale_log2, scale]: [f32; 2],
                mods: Option<LibraryMods>,
            ) -> Result<()> {
                let pick = |all: &[&KernelSpec]| {
                    (0..all.len())
                        .find(|&i| of_head_dim(all[i], head_dim))
                        .ok_or_else(|| head_dim_error(all, head_dim, "the backward's"))
                };
                // The dK/dV walk's query blocks: 128 at head_dim 64 (a block's fixed costs over
                // twice the work), 64 at 128 (what fits in shared memory).
                let q_block = if head_dim == 64 { 128 } else { 64 };
                // The dQ walk's key blocks likewise (past head dim 128, the one variant that fits).
                let pick_dq = |all: &[&KernelSpec]| {
                    (0..all.len())
                        .find(|&i| of_head_dim(all[i], head_dim) && (head_dim > 128 || all[i].knob("BN") == Some(q_block)))
                        .ok_or_else(|| head_dim_error(all, head_dim, "the backward's"))
                };
                let pick_dkv = |all: &[&KernelSpec]| {
                    (0..all.len())
                        .find(|&i| of_head_dim(all[i], head_dim) && all[i].knob("BQ") == Some(q_block))
                        .ok_or_else(|| head_dim_error(all, head_dim, "the backward's"))
                };
                // D and the log-sum-exp in log₂ units, rows padded for TMA.
                let (n, sq, pitch) = (dsum.shape()[0], cols, dsum.shape()[1]);
                let (s3, s2) = ([n, sq, 1], [n, sq]);
                let (st3, st2) = ([pitch, 1, 1], [pitch, 1]);
                let (mut dsum3, mut lse3) = (dsum.view_mut(&s3, &st3)?, lse_log2.view_mut(&s3, &st3)?);
                #[rustfmt::skip]
                        $dot::launch_variant(
                            pick($dot::VARIANTS)?, d, Grid::from(bd as u32), o, dout, lse, &mut dsum3, &mut lse3, heads, q_bm, hm, cm,
                        )?;
                drop((dsum3, lse3));
                let (dsum3, lse3) = (dsum.view(&s3, &st3)?, lse_log2.view(&s3, &st3)?);
                let (dsum2, lse2) = (dsum.view(&s2, &st2)?, lse_log2.view(&s2, &st2)?);
                // The modifiers' walks: their variant of `M` (dQ's key blocks of 64, dK/dV's query
                // blocks of 8192 / D).
                let pick_mods = |all: &[&KernelSpec], m: i64| {
                    (0..all.len())
                        .find(|&i| of_head_dim(all[i], head_dim) && all[i].knob("M") == Some(m) && all[i].knob("V") == Some(varlen.into()))
                        .ok_or_else(|| head_dim_error(all, head_dim, "the backward's"))
                };
                // Deterministic: dQ's own walk, and a stand-in for the sums the dK/dV walk
                // then leaves alone.
                let fused = i32::from(dq_acc.is_some());
                let mut stand_in;
                let acc = match dq_acc {
                    Some(acc) => acc,
                    None => {
                        match mods {
                            None => $dq::launch_variant(
                                pick_dq($dq::VARIANTS)?, d, Grid::from(bq as u32), q, k, v, dout, &lse3, &dsum3, dq, cu_q, cu_k, max_q,
                                varlen, heads, group, q_bm, k_bm, hm, cm, causal, scale_log2, scale,
                            )?,
                            Some(LibraryMods { m, scores: [cap, max_bias, alibi_scale], masks: [window, prefix], drop: [s0, s1, off], drop_p }) => {
                                $dq_mods::launch_variant(
                                    pick_mods($dq_mods::VARIANTS, m)?, d, Grid::from(bq as u32), q, k, v, dout, &lse3, &dsum3, dq, cu_q,
                                    cu_k, max_q, heads, group, q_bm, k_bm, hm, cm, causal, scale_log2, scale, cap, max_bias, alibi_scale,
                                    window, prefix, s0, s1, off, drop_p,
                                )?
                            }
                        }
                        stand_in = Tensor::<f32>::scratch(d, &[1, 64, head_dim])?;
                        &mut stand_in
                    }
                };
                match mods {
                    // Past head dim 128 a walk of 64-key tiles, the consumers split by gradient.
                    None if head_dim > 128 => $dkv_wide::launch_variant(
                        pick($dkv_wide::VARIANTS)?, d, Grid::from(bk64 as u32), q, k, v, dout, &lse2, &dsum2, dk, dv, cu_q, cu_k, max_k,
                        varlen, heads, group, q_bm, k_bm, hm, cm, causal, scale_log2, scale,
                    )?,
                    None => $dkv::launch_variant(
                        pick_dkv($dkv::VARIANTS)?, d, Grid::from(bk as u32), q, k, v, dout, &lse2, &dsum2, dk, dv, acc, cu_q, cu_k, max_k,
                        varlen, heads, group, q_bm, k_bm, hm, cm, causal, fused, scale_log2, scale,
                    )?,
                    Some(LibraryMods { m, scores: [cap, max_bias, alibi_scale], masks: [window, prefix], drop: [s0, s1, off], drop_p })
                        if head_dim > 128 =>
                    {
                        $dkv_wide_mods::launch_variant(
                            pick_mods($dkv_wide_mods::VARIANTS, m)?, d, Grid::from(bk64 as u32), q, k, v, dout, &lse2, &dsum2, dk, dv, cu_q,
                            cu_k, max_k, heads, group, q_bm, k_bm, hm, cm, causal, scale_log2, scale, cap, max_bias, alibi_scale, window,
                            prefix, s0, s1, off, drop_p,
                        )?
                    }
                    Some(LibraryMods { m, scores: [cap, max_bias, alibi_scale], masks: [window, prefix], drop: [s0, s1, off], drop_p }) => {
                        $dkv_mods::launch_variant(
                            pick_mods($dkv_mods::VARIANTS, m)?, d, Grid::from(bk as u32), q, k, v, dout, &lse2, &dsum2, dk, dv, acc, cu_q,
                            cu_k, max_k, heads, group, q_bm, k_bm, hm, cm, causal, fused, scale_log2, scale, cap, max_bias, alibi_scale,
                            window, prefix, s0, s1, off, drop_p,
                        )?
                    }
                }
                if fused == 1 {
                    $dq_out::launch_variant(pick($dq_out::VARIANTS)?, d, Grid::from(bd as u32), acc, dq, heads, q_bm, hm, cm, scale)?;
                }
                Ok(())
            }
            fn variants(varlen: bool) -> &'static [&'static KernelSpec] {
                if varlen {
                    $varlen::VARIANTS
                } else {
                    $dense::VARIANTS
                }
            }
            fn forward(
                d: &Device, g: Grid, i: usize, [q, k, v]: [&TensorView<Self>; 3], o: &mut TensorViewMut<Self>,
                lse: &mut TensorViewMut<f32>, [cu_q, cu_k]: [&Optional<Tensor<i32>>; 2],
                Split { full, parts, out: [mut op, mut lp] }: Split<'_>,
                [batch, max_q, varlen, heads, group, q_bm, k_bm, hm, cm, causal, hg, keep_lse]: [i32; 12], scale_log2: f32,
            ) -> Result<()> {
                let mut c = d.tile_counter()?;
                let (o, l) = (o, lse);
                // The padded layouts take the dense kernel; packed sequences the varlen one.
                if varlen == 0 {
                    $dense::launch_variant(
                        i, d, g, q, k, v, o, l, &mut c, &mut op, &mut lp, full, parts, heads, group, q_bm, k_bm, hm, cm, causal, hg,
                        keep_lse, scale_log2,
                    )
                } else {
                    $varlen::launch_variant(
                        i, d, g, q, k, v, o, l, &mut c, cu_q, cu_k, batch, max_q, varlen, heads, group, q_bm, k_bm, hm, cm, causal, hg,
                        scale_log2,
                    )
                }
            }
            fn mods_variants(varlen: bool) -> &'static [&'static KernelSpec] {
                if varlen {
                    $varlen_mods::VARIANTS
                } else {
                    $mods::VARIANTS
                }
            }
            fn forward_mods(
                d: &Device, g: Grid, i: usize, [q, k, v]: [&TensorView<Self>; 3], o: &mut TensorViewMut<Self>,
                lse: &mut TensorViewMut<f32>, [cu_q, cu_k]: [&Optional<Tensor<i32>>; 2],
                Split { full, parts, out: [mut op, mut lp] }: Split<'_>,
                [batch, max_q, varlen, heads, group, q_bm, k_bm, hm, cm, causal, hg, keep_lse]: [i32; 12], scale_log2: f32,
                LibraryMods { scores: [cap, max_bias, alibi_scale], masks: [window, prefix], drop: [s0, s1, off], drop_p, .. }: LibraryMods,
            ) -> Result<()> {
                let mut c = d.tile_counter()?;
                if varlen != 0 {
                    return $varlen_mods::launch_variant(
                        i, d, g, q, k, v, o, lse, &mut c, cu_q, cu_k, batch, max_q, varlen, heads, group, q_bm, k_bm, hm, cm, causal, hg,
                        scale_log2, cap, max_bias, alibi_scale, window, prefix, s0, s1, off, drop_p,
                    );
                }
                $mods::launch_variant(
                    i, d, g, q, k, v, o, lse, &mut c, &mut op, &mut lp, full, parts, heads, group, q_bm, k_bm, hm, cm, causal, hg,
                    keep_lse, scale_log2, cap, max_bias, alibi_scale, window, prefix, s0, s1, off, drop_p,
                )
            }
            fn combine(
                d: &Device, head_dim: usize, [op, lp]: [&Tensor<f32>; 2], o: &mut TensorViewMut<Self>, lse: &mut TensorViewMut<f32>,
                [full, parts, heads, q_bm, hm, cm, hg]: [i32; 7],
            ) -> Result<()> {
                let all = $combine::VARIANTS;
                let Some(i) = (0..all.len()).find(|&i| of_head_dim(all[i], head_dim)) else {
                    return Err(head_dim_error(all, head_dim, "the combine's"));
                };
                // A block per 16 rows of each split tile.
                let grid = Grid::tiles(op.shape()[0] / parts.max(1) as usize * 128, 16);
                $combine::launch_variant(i, d, grid, op, lp, o, lse, full, parts, heads, q_bm, hm, cm, hg)
            }
        }
    };
}
attention_element!(
    bf16,
    flash_attention_bf16,
    flash_attention_varlen_bf16,
    flash_attention_mods_bf16,
    flash_attention_varlen_mods_bf16,
    attention_combine_bf16,
    attention_bwd_dot_bf16,
    attention_bwd_dq_bf16,
    attention_bwd_dkv_bf16,
    attention_bwd_dq_out_bf16,
    attention_bwd_dq_mods_bf16,
    attention_bwd_dkv_mods_bf16,
    attention_bwd_dkv_wide_bf16,
    attention_bwd_dkv_wide_mods_bf16
);
attention_element!(
    f16,
    flash_attention_f16,
    flash_attention_varlen_f16,
    flash_attention_mods_f16,
    flash_attention_varlen_mods_f16,
    attention_combine_f16,
    attention_bwd_dot_f16,
    attention_bwd_dq_f16,
    attention_bwd_dkv_f16,
    attention_bwd_dq_out_f16,
    attention_bwd_dq_mods_f16,
    attention_bwd_dkv_mods_f16,
    attention_bwd_dkv_wide_f16,
    attention_bwd_dkv_wide_mods_f16
);

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

/// The checks both forms share once q's and k's heads and head_dim are known: a head_dim with
/// a kernel, k's heads dividing q's, v shaped as k and o as q (each in the form `form`
/// accepts), and a contiguous `lse` of `lse_shape`.
fn check_rest<T: AttentionElement>(
    form: impl Fn(&str, &Tensor<T>) -> Result<()>, (h, d): (usize, usize), (hk, dk): (usize, usize), [q, k, v, o]: [&Tensor<T>; 4],
    lse: &Tensor<f32>, lse_shape: &[usize],
) -> Result<()> {
    if !T::variants(false).iter().any(|s| of_head_dim(s, d)) {
        return Err(head_dim_error(T::variants(false), d, "the forward's"));
    }
    if dk != d || hk == 0 || h % hk != 0 {
        return Err(arg("k", format!("head_dim {d} and a number of heads dividing {h}"), format!("head_dim {dk}, {hk} heads")));
    }
    if v.shape() != k.shape() {
        return Err(arg("v", format!("k's shape {:?}", k.shape()), format!("shape {:?}", v.shape())));
    }
    form("v", v)?;
    if o.shape() != q.shape() {
        return Err(arg("o", format!("q's shape {:?}", q.shape()), format!("shape {:?}", o.shape())));
    }
    form("o", o)?;
    crate::check_shape("attention", "lse", lse, lse_shape)?;
    if !lse.is_contiguous() {
        return Err(arg("lse", "a contiguous tensor".into(), format!("strides {:?}", lse.strides())));
    }
    Ok(())
}

/// How the kernels find head `h` of batch entry `b` in the rank-3 views ([`view3`]): its plane
/// is `b·q_bm + h·hm` (`k_bm` for k and v) and its first column `h·cm`.
fn head_origins(layout: AttentionLayout, heads: usize, kv_heads: usize, d: usize) -> (usize, usize, usize, usize) {
    match layout {
        AttentionLayout::Bshd => (1, 1, 0, d),
        AttentionLayout::Bhsd => (heads, kv_heads, 1, 0),
    }
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
/// `h / (heads / kv_heads)`). Any sequence lengths ≥ 1; head_dim 64, 96, 128, 192 or 256 (forward and backward, with or without modifiers). Hopper (sm_90) only.
///
/// # Errors
/// [`Error::Argument`] naming the tensor whose rank, shape, contiguity or head count does not
/// fit, or a head_dim without kernels (other than 64, 96, 128, 192, 256); the launch's own
/// checks (device, target).
pub fn attention_with_lse<T: AttentionElement>(
    device: &Device, opts: &Attention, q: &Tensor<T>, k: &Tensor<T>, v: &Tensor<T>, o: &mut Tensor<T>, lse: &mut Tensor<f32>,
) -> Result<()> {
    dense(device, opts, [q, k, v], o, lse, true)
}

/// The sizes of a padded-layout call, `([batch, seq_q, heads, dim], [seq_k, kv_heads])`, after
/// every check of its tensors that the forward and the backward share.
fn dense_sizes<T: AttentionElement>(
    opts: &Attention, [q, k, v, o]: [&Tensor<T>; 4], lse: &Tensor<f32>,
) -> Result<([usize; 4], [usize; 2])> {
    let layout = opts.layout;
    let [b, sq, h, d] = dims("q", q, layout)?;
    let [bk, sk, hk, dk] = dims("k", k, layout)?;
    if bk != b {
        return Err(arg("k", format!("batch {b}"), format!("batch {bk}")));
    }
    let form = |name: &str, t: &Tensor<T>| dims(name, t, layout).map(|_| ());
    check_rest(form, (h, d), (hk, dk), [q, k, v, o], lse, &[b, h, sq])?;
    if b == 0 || sq == 0 || sk == 0 || h == 0 {
        return Err(arg("q", "batch, heads and both sequence lengths ≥ 1".into(), format!("batch {b}, seq_q {sq}, seq_k {sk}, {h} heads")));
    }
    let too_big = |x: usize| i32::try_from(x).is_err();
    if too_big(b * h * sq) || too_big(b * hk * sk) || too_big(h * d) {
        return Err(arg("q", "fewer than 2³¹ rows".into(), format!("batch {b}, seq_q {sq}, seq_k {sk}, {h} heads")));
    }
    Ok(([b, sq, h, d], [sk, hk]))
}

/// The dense forward: [`attention_with_lse`], writing `lse` only with `keep_lse`.
fn dense<T: AttentionElement>(
    device: &Device, opts: &Attention, [q, k, v]: [&Tensor<T>; 3], o: &mut Tensor<T>, lse: &mut Tensor<f32>, keep_lse: bool,
) -> Result<()> {
    let layout = opts.layout;
    let ([b, sq, h, d], [sk, hk]) = dense_sizes(opts, [q, k, v, o], lse)?;
    let (qs, qst) = view3(layout, [b, sq, h, d]);
    let (ks, kst) = view3(layout, [b, sk, hk, d]);
    let (qv, kv, vv) = (q.view(&qs, &qst)?, k.view(&ks, &kst)?, v.view(&ks, &kst)?);
    let mut ov = o.view_mut(&qs, &qst)?;
    let mut lv = lse.view_mut(&[b * h, sq, 1], &[sq, 1, 1])?;
    let (q_bm, k_bm, hm, cm) = head_origins(layout, h, hk, d);
    let ints = [b, sq, 0, h, h / hk, q_bm, k_bm, hm, cm, usize::from(opts.causal), 0, usize::from(keep_lse)].map(|x| x as i32);
    let none = Optional(None, 1);
    launch(device, opts, d, [&qv, &kv, &vv], &mut ov, &mut lv, [&none, &none], ints)
}

/// How many heads' query tiles the blocks take interleaved, heaviest first: causally the tiles
/// of a head shrink from the last to the first, and taken head by head the grid ended on a
/// late head's heaviest tile while the other SMs idled (a model of the queue: 7% over the
/// ideal at seq 4096, 3% at 8192); a group of heads ends on light tiles. The group's K and V
/// (`seq_k × d` each, 16-bit) stay within 16 MiB of L2. Without a mask every tile weighs the
/// same: one head at a time.
fn heads_per_group(causal: bool, seq_k: usize, d: usize) -> i32 {
    if !causal {
        return 1;
    }
    let per_head = (seq_k * d * 4).max(1);
    ((16 << 20) / per_head).clamp(1, 8) as i32
}

/// The keys a block's fixed costs are worth — its softmax's row reductions, O's rescaling,
/// the turn's barriers and waits: with it, where no key is padded, 160-key blocks cost 3.5%
/// less than 128-key ones and 192-key ones (head dim 64) 6% less; measured 2–4% and 4–8% (runs
/// 139 and 141).
const BLOCK_COST_KEYS: usize = 32;

/// The key block, of `blocks`, that costs `seq_k` keys the least: `⌈seq_k / bn⌉` blocks of
/// `bn + BLOCK_COST_KEYS` keys each, the last one's padding counted (1024 keys: 128 beats 160,
/// whose seven blocks pad 96 keys; 4096: 160). The first of equals; `None` for no blocks.
fn key_block(blocks: impl Iterator<Item = usize>, seq_k: usize) -> Option<usize> {
    let cost = |bn: usize| seq_k.div_ceil(bn) * (bn + BLOCK_COST_KEYS);
    blocks.fold(None, |best, bn| match best {
        Some(b) if cost(b) <= cost(bn) => Some(b),
        _ => Some(bn),
    })
}

/// How a dense launch splits its tiles: `(full, parts)`, the tiles from `full` on run in
/// `parts` ranges of their `kv_blocks` key blocks. Without a mask every tile costs the same,
/// and a grid of `tiles` on `sms` blocks ends with a partly filled wave while the other SMs
/// idle; split, the last tiles' parts spread over them. The model: a tile costs 1, a part
/// `1/parts` plus two blocks' worth (its pipeline's fill and its f32 output), the split tiles'
/// parts run in whole waves after the unsplit tiles' whole waves. Splitting this wave's
/// remainder, or it and one wave more, with 2..=16 parts (at most one per key block): the
/// cheapest, if cheaper than no split by half a tile at least (run 88: the model's 0.2 of a tile at seq 4096 did not show).
fn split_tail(tiles: usize, sms: usize, kv_blocks: usize) -> (usize, usize) {
    let (sms, kb) = (sms.max(1), kv_blocks.max(1) as f64);
    let (waves, rest) = (tiles / sms, tiles % sms);
    let mut best = (tiles.div_ceil(sms) as f64 - 0.5, tiles, 1);
    for extra in 0..=1 {
        if rest == 0 || extra > waves {
            break;
        }
        let split = rest + extra * sms;
        for parts in 2..=kv_blocks.min(16) {
            let part_waves = (split * parts).div_ceil(sms) as f64;
            let cost = (waves - extra) as f64 + part_waves * (1.0 / parts as f64 + 2.0 / kb);
            if cost < best.0 {
                best = (cost, tiles - split, parts);
            }
        }
    }
    (best.1, best.2)
}

/// The persistent launch shared by the padded and the packed forms: one block per SM at most,
/// over `batch × heads × ⌈max_q / 128⌉` tiles (dense ones split by [`split_tail`] or the
/// caller's `kv_splits`, then combined).
#[allow(clippy::too_many_arguments)]
fn launch<T: AttentionElement>(
    device: &Device, opts: &Attention, d: usize, qkv: [&TensorView<T>; 3], o: &mut TensorViewMut<T>, lse: &mut TensorViewMut<f32>,
    cu: [&Optional<Tensor<i32>>; 2], mut ints: [i32; 12],
) -> Result<()> {
    let scale = opts.scale_for(d);
    let [batch, max_q, varlen, heads, group, q_bm, _, hm, cm, ..] = ints;
    let seq_k = qkv[1].shape()[1];
    ints[10] = heads_per_group(opts.causal, seq_k, d);
    let tiles = (max_q as usize).div_ceil(128) * batch as usize * heads as usize;
    let sms = device.sm_count() as usize;
    let flavor = opts.flavor(d, varlen != 0)?;
    // The variants of this head dimension (pipeline depths, key blocks).
    let all = match flavor {
        Flavor::Plain => T::variants(varlen != 0),
        Flavor::Mods(..) => T::mods_variants(varlen != 0),
        Flavor::Custom(k) => k,
    };
    let ids: Vec<usize> = (0..all.len())
        .filter(|&i| of_head_dim(all[i], d))
        .filter(|&i| match flavor {
            Flavor::Mods(LibraryMods { m, .. }) => all[i].knob("M") == Some(m),
            _ => true,
        })
        .collect();
    let block_of = |i: usize| all[i].knob("BN").map_or(128, |b| b as usize);
    let Some(bn) = key_block(ids.iter().map(|&i| block_of(i)), seq_k) else {
        if let Flavor::Custom(k) = flavor {
            let name = k.first().map_or("", |s| s.name);
            return Err(arg("kernel", format!("a variant of `{name}` with the tune knob D = {d}"), format!("head_dim {d}")));
        }
        return Err(head_dim_error(all, d, "the forward's"));
    };
    // The default: the first variant with the cheapest key block for this length.
    let default = ids.iter().position(|&i| block_of(i) == bn).unwrap_or(0);
    let kv_blocks = seq_k.div_ceil(bn);
    let (full, parts) = match opts.kv_splits {
        Some(0) => return Err(arg("kv_splits", "at least 1".into(), "0".into())),
        Some(n) if varlen != 0 && n > 1 => {
            return Err(arg("kv_splits", "1 or unset for packed sequences".into(), format!("{n}")));
        }
        Some(n) if n > 1 && matches!(flavor, Flavor::Custom(_)) => {
            return Err(arg("kv_splits", "1 or unset with a kernel of yours (its epilogue is not the combine's)".into(), format!("{n}")));
        }
        // A part may come out empty under a variant of larger blocks: it adds nothing.
        Some(n) => (0, n.min(kv_blocks)),
        None if varlen == 0 && !opts.causal && !matches!(flavor, Flavor::Custom(_)) => split_tail(tiles, sms, kv_blocks),
        None => (tiles, 1),
    };
    let (full, parts) = if parts <= 1 { (tiles, 1) } else { (full, parts) };
    let queued = full + (tiles - full) * parts;
    let grid = u32::try_from(queued.min(sms).max(1)).unwrap_or(1);
    if i32::try_from(queued).is_err() {
        return Err(arg("q", "fewer than 2³¹ tiles".into(), format!("{queued} tiles in {parts} parts")));
    }
    // The parts' outputs, `[part tiles, 128, d]`, and their log₂-sum-exps.
    let part_outputs = || -> Result<Option<[Tensor<f32>; 2]>> {
        Ok(match parts {
            1 => None,
            // Every part writes all its rows before the combine reads them: no clearing.
            _ => Some([Tensor::scratch(device, &[queued - full, 128, d])?, Tensor::scratch(device, &[queued - full, 128, 1])?]),
        })
    };
    let scale_log2 = scale * std::f32::consts::LOG2_E;
    let combine = [full as i32, parts as i32, heads, q_bm, hm, cm, ints[10]];
    let run = |i: usize, o: &mut TensorViewMut<T>, lse: &mut TensorViewMut<f32>, out: &mut Option<[Tensor<f32>; 2]>| {
        let split_out = match out {
            Some([op, lp]) => [OptionalMut(Some(op), 3), OptionalMut(Some(lp), 3)],
            None => [OptionalMut(None, 3), OptionalMut(None, 3)],
        };
        let split = Split { full: full as i32, parts: parts as i32, out: split_out };
        match flavor {
            Flavor::Plain => T::forward(device, grid.into(), ids[i], qkv, o, lse, cu, split, ints, scale_log2)?,
            Flavor::Mods(mods) => {
                T::forward_mods(device, grid.into(), ids[i], qkv, o, lse, cu, split, ints, scale_log2 * mods.cap_factor(), mods)?
            }
            Flavor::Custom(k) => launch_custom(k[ids[i]], device, grid.into(), qkv, o, lse, ints, scale_log2)?,
        }
        match out {
            Some([op, lp]) => T::combine(device, d, [op, lp], o, lse, combine),
            None => Ok(()),
        }
    };
    let names: Vec<&str> = ids.iter().map(|&i| all[i].name).collect();
    if let Some(v) = opts.variant {
        return match names.iter().position(|n| *n == v) {
            Some(i) => run(i, o, lse, &mut part_outputs()?),
            None => Err(arg("variant", format!("one of {names:?} (head_dim {d})"), format!("`{v}`"))),
        };
    }
    let (dtype, shape, split_key) = (T::DTYPE, (batch, heads, group, max_q, seq_k, d), (full, parts));
    let kernel_name = all.first().map_or("", |k| k.name);
    let key = tessera::TuneKey::new("attention", device)
        .field("dtype", &dtype)
        .field("varlen", &varlen)
        .field("shape", &shape)
        .field("causal", &opts.causal)
        .field("layout", &opts.layout)
        .field("split", &split_key)
        .field("kernel", &kernel_name);
    let choice = tessera::Tuner::global().choose(&key, &names, default, || {
        // Timing writes scratch outputs, never the caller's.
        // The views the host built are contiguous over their shapes, so plain tensors of the
        // same shapes take their place.
        let mut so = Tensor::<T>::zeros(device, o.shape())?;
        let mut sl = Tensor::<f32>::zeros(device, lse.shape())?;
        let mut sp = part_outputs()?;
        Ok(tessera::tune::launch_timer(device, move |i| {
            let (os, ls) = (so.shape().to_vec(), sl.shape().to_vec());
            let (ost, lst) = (so.strides().to_vec(), sl.strides().to_vec());
            run(i, &mut so.view_mut(&os, &ost)?, &mut sl.view_mut(&ls, &lst)?, &mut sp)
        }))
    })?;
    run(choice, o, lse, &mut part_outputs()?)
}

/// Launches a caller's attention kernel ([`Attention::kernel`]) with `flash_attention`'s
/// arguments, every tile whole: its parameters checked by name first.
#[allow(clippy::too_many_arguments)]
fn launch_custom<T: AttentionElement>(
    spec: &'static KernelSpec, device: &Device, grid: Grid, [q, k, v]: [&TensorView<T>; 3], o: &mut TensorViewMut<T>,
    lse: &mut TensorViewMut<f32>, ints: [i32; 12], scale_log2: f32,
) -> Result<()> {
    let names: Vec<&str> = spec.params.iter().map(|p| p.name).collect();
    if names != ATTENTION_KERNEL_PARAMS {
        return Err(arg(
            "kernel",
            format!("a kernel with the parameters {ATTENTION_KERNEL_PARAMS:?}"),
            format!("`{}` with {names:?}", spec.name),
        ));
    }
    let [b, sq, _, heads, group, q_bm, k_bm, hm, cm, causal, hg, keep_lse] = ints;
    let tiles = (sq as usize).div_ceil(128) * b as usize * heads as usize;
    let mut counter = device.tile_counter()?;
    // Unused without parts, any f32 tensors of rank 3.
    let (mut op, mut lp) = (Tensor::<f32>::scratch(device, &[1, 128, 1])?, Tensor::<f32>::scratch(device, &[1, 128, 1])?);
    let mut l = tessera::Launch::new(spec, device)?;
    let _g = (l.global(0, q)?, l.global(1, k)?, l.global(2, v)?);
    let _o = l.global_mut(3, o)?;
    let _l = l.global_mut(4, lse)?;
    let _c = l.global_mut(5, &mut counter)?;
    let _p = (l.global_mut(6, &mut op)?, l.global_mut(7, &mut lp)?);
    let scalars = [tiles as i32, 1, heads, group, q_bm, k_bm, hm, cm, causal, hg, keep_lse];
    for (i, x) in scalars.into_iter().enumerate() {
        l.scalar(8 + i, tessera::ScalarArg::from(x))?;
    }
    l.scalar(19, tessera::ScalarArg::from(scale_log2))?;
    l.launch(grid)
}

/// FlashAttention forward over a batch of sequences of different lengths packed end to end
/// (no padding): sequence `b` holds query rows `cu_seqlens_q[b]..cu_seqlens_q[b + 1]` of `q`
/// and key rows `cu_seqlens_k[b]..cu_seqlens_k[b + 1]` of `k` and `v`.
///
/// `q` and `o` are `[total_q, heads, dim]`, `k` and `v` `[total_k, kv_heads, dim]`, `lse`
/// `[heads, total_q]` (f32); `cu_seqlens_q` and `cu_seqlens_k` are `[batch + 1]` i32 tensors of
/// non-decreasing offsets starting at 0, on the device; `max_seqlen_q` is at least every
/// sequence's query length (rows past it are not computed). Causal masks align each
/// sequence's diagonal at its end. Only [`AttentionLayout::Bshd`] applies (the packed layout).
///
/// # Errors
/// [`Error::Argument`] naming the tensor whose rank, shape or contiguity does not fit, a
/// head_dim without kernels (other than 64, 96, 128, 192, 256), offsets of another length than each other, or
/// `max_seqlen_q` of 0; the launch's own checks. Offsets are device data: with
/// [`Attention::check_offsets`] (on by default in debug builds) they are read back and
/// checked ([`check_cu_seqlens`]), else out-of-range ones give wrong rows, never a write
/// outside `o` and `lse`.
#[allow(clippy::too_many_arguments)]
pub fn attention_varlen<T: AttentionElement>(
    device: &Device, opts: &Attention, q: &Tensor<T>, k: &Tensor<T>, v: &Tensor<T>, o: &mut Tensor<T>, lse: &mut Tensor<f32>,
    cu_seqlens_q: &Tensor<i32>, cu_seqlens_k: &Tensor<i32>, max_seqlen_q: usize,
) -> Result<()> {
    let ([tq, h, d], [tk, hk], b) = varlen_sizes(opts, [q, k, v, o], lse, [cu_seqlens_q, cu_seqlens_k], max_seqlen_q)?;
    let (qv, kv, vv) = (
        q.view(&[1, tq, h * d], &[tq * h * d, h * d, 1])?,
        k.view(&[1, tk, hk * d], &[tk * hk * d, hk * d, 1])?,
        v.view(&[1, tk, hk * d], &[tk * hk * d, hk * d, 1])?,
    );
    let mut ov = o.view_mut(&[1, tq, h * d], &[tq * h * d, h * d, 1])?;
    let mut lv = lse.view_mut(&[h, tq, 1], &[tq, 1, 1])?;
    let ints = [b, max_seqlen_q, 1, h, h / hk, 0, 0, 0, d, usize::from(opts.causal), 0, 1].map(|x| x as i32);
    let (cq, ck) = (Optional(Some(cu_seqlens_q), 1), Optional(Some(cu_seqlens_k), 1));
    launch(device, opts, d, [&qv, &kv, &vv], &mut ov, &mut lv, [&cq, &ck], ints)
}

/// The sizes of a packed call, `([total_q, heads, dim], [total_k, kv_heads], batch)`, after
/// every check of its tensors and offsets that [`attention_varlen`] and
/// [`attention_varlen_backward`] share (the offsets read back with
/// [`Attention::check_offsets`]).
fn varlen_sizes<T: AttentionElement>(
    opts: &Attention, [q, k, v, o]: [&Tensor<T>; 4], lse: &Tensor<f32>, [cu_seqlens_q, cu_seqlens_k]: [&Tensor<i32>; 2],
    max_seqlen_q: usize,
) -> Result<([usize; 3], [usize; 2], usize)> {
    let packed = |name: &str, t: &Tensor<T>| -> Result<[usize; 3]> {
        match *t.shape() {
            [n, h, d] if t.is_contiguous() => Ok([n, h, d]),
            [_, _, _] => Err(arg(name, "a contiguous tensor".into(), format!("strides {:?}", t.strides()))),
            _ => Err(arg(name, "a rank-3 tensor [total, heads, dim]".into(), format!("shape {:?}", t.shape()))),
        }
    };
    if opts.layout != AttentionLayout::Bshd {
        return Err(arg("q", "the packed layout [total, heads, dim] (AttentionLayout::Bshd)".into(), format!("{:?}", opts.layout)));
    }
    let [tq, h, d] = packed("q", q)?;
    let [tk, hk, dk] = packed("k", k)?;
    check_rest(|name, t| packed(name, t).map(|_| ()), (h, d), (hk, dk), [q, k, v, o], lse, &[h, tq])?;
    let b = match (cu_seqlens_q.shape(), cu_seqlens_k.shape()) {
        (&[nq], &[nk]) if nq == nk && nq >= 2 => nq - 1,
        _ => {
            return Err(arg(
                "cu_seqlens_k",
                format!("a rank-1 tensor of batch + 1 ≥ 2 offsets, like cu_seqlens_q {:?}", cu_seqlens_q.shape()),
                format!("shape {:?}", cu_seqlens_k.shape()),
            ))
        }
    };
    if max_seqlen_q == 0 || tq == 0 || tk == 0 || h == 0 {
        return Err(arg(
            "q",
            "max_seqlen_q, heads and both totals ≥ 1".into(),
            format!("max_seqlen_q {max_seqlen_q}, total_q {tq}, total_k {tk}, {h} heads"),
        ));
    }
    let too_big = |x: usize| i32::try_from(x).is_err();
    if too_big(tq * h) || too_big(tk * hk) || too_big(b * h * max_seqlen_q.div_ceil(128)) || too_big(h * d) {
        return Err(arg("q", "fewer than 2³¹ rows".into(), format!("total_q {tq}, total_k {tk}, {h} heads")));
    }
    if opts.check_offsets.unwrap_or(cfg!(debug_assertions)) {
        check_cu_seqlens(&cu_seqlens_q.to_host()?, &cu_seqlens_k.to_host()?, tq, tk, max_seqlen_q)?;
    }
    Ok(([tq, h, d], [tk, hk], b))
}

/// [`attention_with_lse`] without keeping the log-sum-exp (for inference).
///
/// # Errors
/// As [`attention_with_lse`].
pub fn attention<T: AttentionElement>(
    device: &Device, opts: &Attention, q: &Tensor<T>, k: &Tensor<T>, v: &Tensor<T>, o: &mut Tensor<T>,
) -> Result<()> {
    let [b, sq, h, _] = dims("q", q, opts.layout)?;
    // The kernel's argument, never written (but by the split tiles' combine): not cleared (a
    // pass over b·h·sq floats, 6% of a seq-1024 launch), and the kernel skips its stores (4% of
    // an 8-block tile, run 130b).
    let mut lse = Tensor::<f32>::scratch(device, &[b, h, sq])?;
    dense(device, opts, [q, k, v], o, &mut lse, false)
}

#[cfg(test)]
mod tests {
    use super::{key_block, split_tail};

    /// The split leaves whole waves of whole tiles and splits only when the model gains.
    #[test]
    fn split_tail_splits_the_last_wave() {
        for (tiles, kv_blocks) in [(2048, 32), (4096, 64), (8192, 128), (8, 8), (512, 8), (134, 16), (264, 64), (100, 1)] {
            let (full, parts) = split_tail(tiles, 132, kv_blocks);
            assert!(full <= tiles && full % 132 == 0 || parts == 1, "{tiles} tiles: {full} whole");
            assert!((1..=16.min(kv_blocks)).contains(&parts), "{tiles} tiles: {parts} parts");
            println!("{tiles} tiles of {kv_blocks} blocks: {full} whole, the rest in {parts}");
        }
        assert_eq!(split_tail(264, 132, 64), (264, 1), "whole waves stay whole");
        assert_eq!(split_tail(100, 132, 1), (100, 1), "one key block cannot split");
        assert_eq!(split_tail(8, 132, 8).1, 8, "a few long tiles (decoding) split as far as their blocks go");
    }

    /// Long sequences take the largest block; short ones the block that pads the fewest keys.
    #[test]
    fn key_block_weighs_padding_against_fixed_costs() {
        let d128 = [160, 128];
        let d64 = [192, 160, 128];
        let pick = |b: &[usize], s| key_block(b.iter().copied(), s);
        assert_eq!(pick(&d128, 4096), Some(160), "26 blocks with 64 keys padded beat 32");
        assert_eq!(pick(&d128, 16384), Some(160));
        assert_eq!(pick(&d128, 1024), Some(128), "7 blocks of 160 pad 96 keys: 8 of 128 cost less");
        assert_eq!(pick(&d128, 128), Some(128), "one block: the smaller");
        assert_eq!(pick(&d128, 160), Some(160));
        assert_eq!(pick(&d64, 8192), Some(192));
        assert_eq!(pick(&d64, 1024), Some(128));
        assert_eq!(pick(&d64, 1), Some(128), "decoding one key: the smallest block");
        assert_eq!(pick(&[], 4096), None);
    }
}
