//! Causal linear attention, chunked, with an optional scalar decay a step (RetNet's constant
//! one, or a data-dependent gate as in simple GLA and Mamba-2's SSD): per (batch, head),
//!
//! ```text
//! H_t = exp(g_t)·H_{t−1} + β_t·k_tᵀ·v_t          (H: [DK, DV], f32)
//! o_t = scale · q_t·H_t
//! ```
//!
//! from `H_{−1}` zero or given, the last `H` kept on request. A block takes one (batch, head)
//! and walks its sequence once in chunks of 64 steps. A producer warpgroup streams each
//! chunk's Q, K, V by TMA through a two-stage ring; `DV / 64` consumer warpgroups each own 64
//! of V's columns, and so 64 columns of `H` (in registers, f32) and of the output. With `G`
//! the chunk's running sum of `g` (so `G_i − G_j` is the decay from step `j` to `i`):
//!
//! - `S = Q·Kᵀ` and `Q·H` (H of the chunks before, held in shared memory in 16 bits) by wgmma;
//! - `P = S ∘ exp(G_i − G_j) ∘ β_j` on `j ≤ i`, zero above the diagonal (registers);
//! - `O = exp(G_i)·Q·H + P·V` (P from registers as wgmma's A);
//! - `H ← exp(G_last)·H + Kᵀ·(w ∘ V)`, `w_j = exp(G_last − G_j)·β_j`: K enters the MMA
//!   transposed as it arrived (`sk.at(s).t()`), `w ∘ V` is written to shared memory first
//!   (V itself where there is neither decay nor β);
//! - `O·scale` through `epilogue(chunk, plane, row, col)` (the SSD's `D·x` skip, say) and out
//!   by TMA.
//!
//! Tensors are rank-3 views `[planes, T, cols]`: `[batch·heads, T, d]` (`bhtd` 1) or
//! `[batch, T, heads·d]` (`bhtd` 0); query head `h / q_group` and key head `h / k_group` serve
//! value head `h` (Mamba-2's groups of B and C). `g` and `β` are f32 `[batch·heads, T]`, given
//! twice: as rows (`[.., T]`) and as columns (`[.., T, 1]`), as the two sides of `G_i − G_j`
//! read them.

use crate::prelude::{drain_stages, fill_stages, scan_add, stage_store};
use tessera::{device, kernel};

/// Where head `h` of batch `b` lies in a rank-3 view: its plane and first column.
#[device]
pub fn head_origin(b: i32, h: i32, heads: i32, width: i32, bhtd: i32) -> (i32, i32) {
    let mut plane = b;
    let mut col = h * width;
    if bhtd == 1 {
        plane = b * heads + h;
        col = 0;
    }
    (plane, col)
}

/// The chunked causal linear attention of one (batch, head) per block (see the module's
/// notes), with `epilogue(chunk, plane, row, col)` on each 64×64 piece of the output before it
/// is stored. Launched with `1 + DV / 64` warpgroups, a block per (batch, head).
#[device]
#[allow(clippy::too_many_arguments)]
pub fn linear_attention_blocks<T, const DK: usize, const DV: usize>(
    q: Global<T, 3>, k: Global<T, 3>, v: Global<T, 3>, g: Global<f32, 2>, gc: Global<f32, 3>, beta: Global<f32, 2>, betac: Global<f32, 3>,
    h0: Global<f32, 3>, o: Global<T, 3>, h_last: Global<f32, 3>, heads: i32, q_group: i32, k_group: i32, bhtd: i32, has_g: i32,
    has_beta: i32, has_h0: i32, keep_h: i32, scale: f32, epilogue: impl Fn(Tile<f32, 64, 64>, i32, i32, i32) -> Tile<f32, 64, 64>,
) {
    let sq = Smem::<T, 64, DK>::ring(2);
    let sk = Smem::<T, 64, DK>::ring(2);
    let sv = Smem::<T, DV, 64>::ring(2);
    let sw = Smem::<T, DV, 64>::ring(1);
    let sh = Smem::<T, { DK * (DV / 64) }, 64>::ring(1);
    let so = Smem::<T, 64, 64>::ring({ 2 * (DV / 64) });
    let pipe = Pipeline::<2>::new({ DV / 64 });
    let bh = block::id_x();
    let b = bh / heads;
    let h = bh - b * heads;
    let len = q.dim(1);
    let chunks = (len + 63) / 64;
    let (qp, qc) = head_origin(b, h / q_group, heads / q_group, DK, bhtd);
    let (kp, kc) = head_origin(b, h / k_group, heads / k_group, DK, bhtd);
    let (vp, vc) = head_origin(b, h, heads, DV, bhtd);
    if warpgroup::id() == 0 {
        setmaxnreg(40);
        fill_stages(pipe, chunks, |s, c| {
            tma::load(sq.at(s), q, [qp, c * 64, qc], pipe);
            tma::load(sk.at(s), k, [kp, c * 64, kc], pipe);
            #[unroll]
            for j in 0..DV / 64 {
                tma::load(sv.at(s).rows(j * 64, 64), v, [vp, c * 64, vc + j * 64], pipe);
            }
        });
    } else {
        setmaxnreg(232);
        let me = warpgroup::id() - 1;
        let col = me * 64;
        let mut hs = Tile::<f32, DK, 64>::zeros();
        if has_h0 == 1 {
            // Loaded straight into the accumulator's layout.
            hs = hs + h0.load::<Tile<f32, DK, 64>>([bh, 0, col]);
        }
        sh.at(0).rows(me * DK, DK).store(hs.cast::<T>());
        let gated = has_g + has_beta;
        drain_stages(pipe, chunks, |s, c| {
            let t0 = c * 64;
            // The chunk's scores and its queries against the state of the chunks before.
            let mut sc = Tile::<f32, 64, 64>::zeros();
            mma_sync(sc, sq.at(s), sk.at(s));
            let mut out = Tile::<f32, 64, 64>::zeros();
            mma_sync_kn(out, sq.at(s), sh.at(0).rows(me * DK, DK));
            // The decay from step j to step i, exp(G_i − G_j) (G: the chunk's running sum of
            // g, in log₂ units), and the weight of each step's k·v into the state,
            // exp(G_last − G_j)·β_j; computed while the MMAs run.
            let mut gr = Tile::<f32, 1, 64>::zeros();
            let mut gcol = Tile::<f32, 64, 1>::zeros();
            let mut ws = Tile::<f32, 64, 1>::full(1.0);
            let mut last = Tile::<f32, 1, 1>::full(1.0);
            if has_g == 1 {
                gr = tile_scan::<scan_add>(g.load::<Tile<f32, 1, 64>>([bh, t0]), 1, 0.0) * f32::consts::LOG2_E;
                gcol = tile_scan::<scan_add>(gc.load::<Tile<f32, 64, 1>>([bh, t0, 0]), 0, 0.0) * f32::consts::LOG2_E;
                let gl = gr.last_col();
                ws = exp2(gl - gcol);
                last = exp2(gl);
            }
            if has_beta == 1 {
                ws = ws * betac.load::<Tile<f32, 64, 1>>([bh, t0, 0]);
            }
            mma_wait(0);
            // P in the scores' registers: the decay's broadcast takes their layout.
            let mut p = sc;
            if has_g == 1 {
                p = p * exp2(min(gcol - (Tile::<f32, 64, 64>::zeros() + gr), 0.0));
                out = out * exp2(gcol);
            }
            if has_beta == 1 {
                p = p * beta.load::<Tile<f32, 1, 64>>([bh, t0]);
            }
            p = p.mask_cols(Tile::<f32, 64, 1>::row_index() + 1.0, 0.0);
            mma_sync_kn(out, p.cast::<T>(), sv.at(s).rows(col, 64));
            // The state: decayed, plus Kᵀ·(w ∘ V) of this chunk.
            if has_g == 1 {
                hs = hs * last;
            }
            if gated > 0 {
                let vt: Tile<T, 64, 64> = v.load([vp, t0, vc + col]);
                sw.at(0).rows(col, 64).store((vt.cast::<f32>() * ws).cast::<T>());
                mma_sync_kn(hs, sk.at(s).t(), sw.at(0).rows(col, 64));
            } else {
                mma_sync_kn(hs, sk.at(s).t(), sv.at(s).rows(col, 64));
            }
            mma_wait(0);
            sh.at(0).rows(me * DK, DK).store(hs.cast::<T>());
            stage_store(o, so, epilogue(out * scale, vp, t0, vc + col), me * 2 + c % 2, vp, t0, vc + col);
        });
        if keep_h == 1 {
            h_last.store([bh, 0, col], hs);
        }
        tma::store_wait(0);
    }
}

/// Causal linear attention with value head dim 128 (two consumer warpgroups), key head dim
/// `DK` 128 or 64: [`linear_attention_blocks`] with no epilogue.
#[kernel(warpgroups = 3, dtypes(T = [bf16, f16]), tune(DK = [128, 64]), targets(sm_90a))]
pub fn linear_attention_fwd(
    q: Global<T, 3>, k: Global<T, 3>, v: Global<T, 3>, g: Global<f32, 2>, gc: Global<f32, 3>, beta: Global<f32, 2>, betac: Global<f32, 3>,
    h0: Global<f32, 3>, o: Global<T, 3>, h_last: Global<f32, 3>, heads: i32, q_group: i32, k_group: i32, bhtd: i32, has_g: i32,
    has_beta: i32, has_h0: i32, keep_h: i32, scale: f32,
) {
    linear_attention_blocks::<T, DK, 128>(
        q, k, v, g, gc, beta, betac, h0, o, h_last, heads, q_group, k_group, bhtd, has_g, has_beta, has_h0, keep_h, scale,
        |x, _, _, _| x,
    );
}

/// As [`linear_attention_fwd`] with value head dim 64 (one consumer warpgroup).
#[kernel(warpgroups = 2, dtypes(T = [bf16, f16]), tune(DK = [128, 64]), targets(sm_90a))]
pub fn linear_attention_fwd_v64(
    q: Global<T, 3>, k: Global<T, 3>, v: Global<T, 3>, g: Global<f32, 2>, gc: Global<f32, 3>, beta: Global<f32, 2>, betac: Global<f32, 3>,
    h0: Global<f32, 3>, o: Global<T, 3>, h_last: Global<f32, 3>, heads: i32, q_group: i32, k_group: i32, bhtd: i32, has_g: i32,
    has_beta: i32, has_h0: i32, keep_h: i32, scale: f32,
) {
    linear_attention_blocks::<T, DK, 64>(
        q, k, v, g, gc, beta, betac, h0, o, h_last, heads, q_group, k_group, bhtd, has_g, has_beta, has_h0, keep_h, scale,
        |x, _, _, _| x,
    );
}

pub use crate::attention::AttentionLayout;
use tessera::{Device, Element, Error, Grid, Optional, OptionalMut, Result, Tensor, TensorView};

/// Element types [`LinearAttention`] runs on: bf16 and f16.
pub trait LinearAttentionElement: Element + sealed::Sealed {
    #[doc(hidden)]
    fn linear_attention_launch(a: &LinearAttention<'_, Self>, d: Dims, o: &mut Tensor<Self>, h_last: Option<&mut Tensor<f32>>) -> Result<()>;
}

mod sealed {
    pub trait Sealed {}
    impl Sealed for tessera::bf16 {}
    impl Sealed for tessera::f16 {}
}

/// The problem's sizes.
#[doc(hidden)]
#[derive(Clone, Copy, Debug)]
pub struct Dims {
    batch: usize,
    heads: usize,
    q_heads: usize,
    k_heads: usize,
    len: usize,
    dk: usize,
    dv: usize,
}

/// The kernel's rank-3 view (shape, strides) of a `[batch, seq, heads, d]` or `[batch, heads,
/// seq, d]` tensor.
fn heads_dims(layout: AttentionLayout, batch: usize, heads: usize, len: usize, d: usize) -> ([usize; 3], [usize; 3]) {
    match layout {
        AttentionLayout::Bshd => ([batch, len, heads * d], [len * heads * d, heads * d, 1]),
        AttentionLayout::Bhsd => ([batch * heads, len, d], [len * d, d, 1]),
    }
}

fn heads_view<T: Element>(t: &Tensor<T>, layout: AttentionLayout, batch: usize, heads: usize, len: usize, d: usize) -> Result<TensorView<'_, T>> {
    let (shape, strides) = heads_dims(layout, batch, heads, len, d);
    t.view(&shape, &strides)
}

/// A `[rows, len]` f32 tensor as rows and as columns (the two sides of the decay read it).
type RowsCols<'t> = (Option<TensorView<'t, f32>>, Option<TensorView<'t, f32>>);
fn rows_cols(t: Option<&Tensor<f32>>, rows: usize, len: usize) -> Result<RowsCols<'_>> {
    Ok(match t {
        Some(t) => (Some(t.view(&[rows, len], &[len, 1])?), Some(t.view(&[rows, len, 1], &[len, 1, 1])?)),
        None => (None, None),
    })
}

macro_rules! linear_attention_element {
    ($t:ty, $k128:ident, $k64:ident) => {
        impl LinearAttentionElement for $t {
            fn linear_attention_launch(
                a: &LinearAttention<'_, Self>, d: Dims, o: &mut Tensor<Self>, h_last: Option<&mut Tensor<f32>>,
            ) -> Result<()> {
                let Dims { batch, heads, q_heads, k_heads, len, dk, dv } = d;
                let variants = if dv == 128 { $k128::VARIANTS } else { $k64::VARIANTS };
                let i = variants.iter().position(|v| v.knob("DK") == Some(dk as i64)).ok_or_else(|| Error::Argument {
                    kernel: "linear_attention",
                    arg: "k".into(),
                    expected: "a key head dim of 64 or 128".into(),
                    found: format!("{dk}"),
                })?;
                let q = heads_view(a.q, a.layout, batch, q_heads, len, dk)?;
                let k = heads_view(a.k, a.layout, batch, k_heads, len, dk)?;
                let v = heads_view(a.v, a.layout, batch, heads, len, dv)?;
                let rows = batch * heads;
                let ((g, gc), (b, bc)) = (rows_cols(a.g, rows, len)?, rows_cols(a.beta, rows, len)?);
                let h0 = a.h0.map(|t| t.view(&[rows, dk, dv], &[dk * dv, dv, 1])).transpose()?;
                let (shape, strides) = heads_dims(a.layout, batch, heads, len, dv);
                let mut ov = o.view_mut(&shape, &strides)?;
                let keep = h_last.is_some();
                let mut hl = h_last.map(|t| t.view_mut(&[rows, dk, dv], &[dk * dv, dv, 1])).transpose()?;
                let flag = |b: bool| i32::from(b);
                let scale = a.scale.unwrap_or(1.0 / (dk as f32).sqrt());
                macro_rules! go {
                    ($k:ident) => {
                        $k::launch_variant(
                            i,
                            a.device,
                            Grid::from(rows as u32),
                            &q,
                            &k,
                            &v,
                            &Optional(g.as_ref(), 2),
                            &Optional(gc.as_ref(), 3),
                            &Optional(b.as_ref(), 2),
                            &Optional(bc.as_ref(), 3),
                            &Optional(h0.as_ref(), 3),
                            &mut ov,
                            &mut OptionalMut(hl.as_mut(), 3),
                            heads as i32,
                            (heads / q_heads) as i32,
                            (heads / k_heads) as i32,
                            flag(a.layout == AttentionLayout::Bhsd),
                            flag(a.g.is_some()),
                            flag(a.beta.is_some()),
                            flag(a.h0.is_some()),
                            flag(keep),
                            scale,
                        )
                    };
                }
                if dv == 128 {
                    go!($k128)
                } else {
                    go!($k64)
                }
            }
        }
    };
}
linear_attention_element!(tessera::bf16, linear_attention_fwd_bf16, linear_attention_fwd_v64_bf16);
linear_attention_element!(tessera::f16, linear_attention_fwd_f16, linear_attention_fwd_v64_f16);

/// A causal linear attention to run (see the module's notes for the recurrence): q, k `[batch,
/// seq, heads, dk]`, v `[batch, seq, heads, dv]` (or all `[batch, heads, seq, d]` with
/// [`AttentionLayout::Bhsd`]), dk 64 or 128, dv 64 or 128; q and k may have fewer heads,
/// dividing v's (each serving consecutive value heads, as Mamba-2's groups of C and B). The
/// builder adds a decay `g` (log units, ≤ 0: `exp(g_t)` multiplies the state at step t), a
/// weight `β` on each step's `kᵀv`, an initial state, and the scale (1/√dk unless given).
///
/// ```ignore
/// let la = LinearAttention::new(&dev, &q, &k, &v).decay(&g); // g [batch, heads, seq] (f32)
/// la.run(&mut o, Some(&mut h_last))?; // h_last [batch, heads, dk, dv] (f32)
/// ```
pub struct LinearAttention<'a, T: Element> {
    device: &'a Device,
    q: &'a Tensor<T>,
    k: &'a Tensor<T>,
    v: &'a Tensor<T>,
    g: Option<&'a Tensor<f32>>,
    beta: Option<&'a Tensor<f32>>,
    h0: Option<&'a Tensor<f32>>,
    scale: Option<f32>,
    layout: AttentionLayout,
}

impl<'a, T: LinearAttentionElement> LinearAttention<'a, T> {
    /// Plain causal linear attention of `q`, `k`, `v` (`[batch, seq, heads, d]`).
    pub fn new(device: &'a Device, q: &'a Tensor<T>, k: &'a Tensor<T>, v: &'a Tensor<T>) -> Self {
        LinearAttention { device, q, k, v, g: None, beta: None, h0: None, scale: None, layout: AttentionLayout::Bshd }
    }

    /// The tensors' layout (`[batch, seq, heads, d]` unless told).
    pub fn layout(mut self, layout: AttentionLayout) -> Self {
        self.layout = layout;
        self
    }

    /// A decay a step, `g` `[batch, heads, seq]` (f32, natural-log units): the state is
    /// multiplied by `exp(g_t)` before step t adds to it. RetNet's constant decay is
    /// `g = ln γ_h` at every step; a gate (GLA, Mamba-2) computes g from the input.
    pub fn decay(mut self, g: &'a Tensor<f32>) -> Self {
        self.g = Some(g);
        self
    }

    /// A weight on each step's contribution, `β` `[batch, heads, seq]` (f32): the state adds
    /// `β_t·k_tᵀv_t` (Mamba-2's Δ).
    pub fn beta(mut self, beta: &'a Tensor<f32>) -> Self {
        self.beta = Some(beta);
        self
    }

    /// The state before the first step (`[batch, heads, dk, dv]`, f32; zeros without it).
    pub fn initial_state(mut self, h0: &'a Tensor<f32>) -> Self {
        self.h0 = Some(h0);
        self
    }

    /// The output's scale (`1/√dk` unless given).
    pub fn scale(mut self, scale: f32) -> Self {
        self.scale = Some(scale);
        self
    }

    /// Runs it into `o` (as `v`) and, if given, the last state `h_last` (`[batch, heads, dk,
    /// dv]`, f32).
    ///
    /// # Errors
    /// [`Error::Argument`] naming the tensor whose rank, shape or contiguity does not fit, or a
    /// head dim without a kernel; a launch error (the kernels need sm_90a).
    pub fn run(&self, o: &mut Tensor<T>, h_last: Option<&mut Tensor<f32>>) -> Result<()> {
        let d = self.dims(o, h_last.as_deref())?;
        if d.batch == 0 || d.heads == 0 {
            return Ok(());
        }
        if d.len == 0 {
            if let Some(hl) = h_last {
                let h = match self.h0 {
                    Some(h0) => h0.to_host()?,
                    None => vec![0.0; d.batch * d.heads * d.dk * d.dv],
                };
                hl.copy_from_host(&h)?;
            }
            return Ok(());
        }
        T::linear_attention_launch(self, d, o, h_last)
    }

    fn arg(&self, arg: &str, expected: String, found: String) -> Error {
        Error::Argument { kernel: "linear_attention", arg: arg.into(), expected, found }
    }

    fn dims(&self, o: &Tensor<T>, h_last: Option<&Tensor<f32>>) -> Result<Dims> {
        let arg = |a: &str, e: String, f: String| self.arg(a, e, f);
        let four = |name: &str, t: &[usize]| -> Result<[usize; 4]> {
            let [b, x, y, d] = *t else {
                return Err(arg(name, "rank 4: [batch, seq, heads, d] or [batch, heads, seq, d]".into(), format!("shape {t:?}")));
            };
            Ok(match self.layout {
                AttentionLayout::Bshd => [b, y, x, d],
                AttentionLayout::Bhsd => [b, x, y, d],
            })
        };
        let [batch, heads, len, dv] = four("v", self.v.shape())?;
        let [qb, q_heads, ql, dk] = four("q", self.q.shape())?;
        let [kb, k_heads, kl, kd] = four("k", self.k.shape())?;
        if (qb, ql) != (batch, len) {
            return Err(arg("q", format!("batch {batch} and seq {len}, as v"), format!("batch {qb}, seq {ql}")));
        }
        if (kb, kl, kd) != (batch, len, dk) {
            return Err(arg("k", format!("batch {batch}, seq {len}, head dim {dk}, as q and v"), format!("batch {kb}, seq {kl}, head dim {kd}")));
        }
        for (name, n) in [("q", q_heads), ("k", k_heads)] {
            if n == 0 || heads % n != 0 {
                return Err(arg(name, format!("a number of heads dividing v's {heads}"), format!("{n} heads")));
            }
        }
        if !matches!(dk, 64 | 128) {
            return Err(arg("q", "a head dim of 64 or 128".into(), format!("{dk}")));
        }
        if !matches!(dv, 64 | 128) {
            return Err(arg("v", "a head dim of 64 or 128".into(), format!("{dv}")));
        }
        if o.shape() != self.v.shape() {
            return Err(arg("o", format!("shape {:?}, as v", self.v.shape()), format!("shape {:?}", o.shape())));
        }
        for (name, t) in [("decay", self.g), ("beta", self.beta)] {
            if let Some(t) = t {
                if t.shape() != [batch, heads, len] {
                    return Err(arg(name, format!("shape {:?}", [batch, heads, len]), format!("shape {:?}", t.shape())));
                }
            }
        }
        for (name, t) in [("initial_state", self.h0), ("h_last", h_last)] {
            if let Some(t) = t {
                if t.shape() != [batch, heads, dk, dv] {
                    return Err(arg(name, format!("shape {:?}", [batch, heads, dk, dv]), format!("shape {:?}", t.shape())));
                }
            }
        }
        let named: [(&str, bool); 8] = [
            ("q", self.q.is_contiguous()),
            ("k", self.k.is_contiguous()),
            ("v", self.v.is_contiguous()),
            ("o", o.is_contiguous()),
            ("decay", self.g.is_none_or(|t| t.is_contiguous())),
            ("beta", self.beta.is_none_or(|t| t.is_contiguous())),
            ("initial_state", self.h0.is_none_or(|t| t.is_contiguous())),
            ("h_last", h_last.is_none_or(|t| t.is_contiguous())),
        ];
        if let Some((name, _)) = named.iter().find(|(_, ok)| !ok) {
            return Err(arg(name, "a contiguous tensor".into(), "strides that are not".into()));
        }
        if i32::try_from(batch * heads * len.max(dk * dv)).is_err() {
            return Err(arg("v", "fewer than 2³¹ rows".into(), format!("batch {batch}, heads {heads}, seq {len}")));
        }
        Ok(Dims { batch, heads, q_heads, k_heads, len, dk, dv })
    }
}
