//! Mamba-2's state-space duality (SSD), chunked: per batch `b` and head `h`,
//!
//! ```text
//! Δ_t = softplus(dt_t + bias_h)  (or dt_t + bias_h)
//! H_t = exp(A_h·Δ_t)·H_{t−1} + Δ_t·B_tᵀ·x_t      (H: [d_state, headdim], f32)
//! y_t = C_t·H_t + D_h·x_t
//! ```
//!
//! with B and C shared by the heads of a group. It is the causal linear attention of
//! [`crate::LinearAttention`] with `q = C`, `k = B`, `v = x`, the decay `g = A·Δ`, the weight
//! `β = Δ` and scale 1, run by the same kernels — MMAs inside 64-step chunks, the state carried
//! across them — with `D·x` added in their output epilogue. A small kernel first turns `dt`
//! into `Δ` and `g` (one f32 a step and head); the backward runs the linear attention's and
//! then one that takes `dΔ = dβ + A·dg` back through the softplus and sums `dA`, `dD` and the
//! bias's gradient.

use crate::linear_attention::{AttentionLayout, LinearAttention, LinearAttentionElement};
use crate::prelude::softplus;
use tessera::{device, kernel, Device, Element, Error, Grid, Optional, OptionalMut, Result, Tensor};

/// This block's (batch, head) — its index `bh`, `b` and `h` — with `A_h` and the dt bias (0
/// without one).
#[device]
pub fn block_head(a: Global<f32, 1>, bias: Global<f32, 1>, heads: i32, has_bias: i32) -> (i32, i32, i32, f32, f32) {
    let bh = block::id_x();
    let b = bh / heads;
    let h = bh - b * heads;
    let mut bias_h = 0.0;
    if has_bias == 1 {
        bias_h = bias.get([h]);
    }
    (bh, b, h, a.get([h]), bias_h)
}

/// `Δ` and `g = A_h·Δ` for one (batch, head) a block: `dt` as `[batch, L, heads]`, `delta`
/// and `g` as `[batch·heads, L, 1]`, `a` and `bias` `[heads]`.
#[kernel(dtypes(T = [bf16, f16]), targets(sm_90a))]
pub fn ssd_steps(
    dt: Global<T, 3>, a: Global<f32, 1>, bias: Global<f32, 1>, delta: Global<f32, 3>, g: Global<f32, 3>, heads: i32, has_bias: i32,
    softplus_on: i32,
) {
    let (bh, b, h, ah, bias_h) = block_head(a, bias, heads, has_bias);
    for t0 in (0..dt.dim(1)).step_by(256) {
        let x = dt.load::<Tile<T, 256, 1>>([b, t0, h]).cast::<f32>() + bias_h;
        let mut d = x;
        if softplus_on == 1 {
            d = softplus(x);
        }
        delta.store([bh, t0, 0], d);
        g.store([bh, t0, 0], d * ah);
    }
}

/// The SSD backward's last step for one (batch, head) a block, headdim `P`: `dΔ = dβ + A_h·dg`
/// taken back through the softplus into `ddt` (`[batch, L, heads]`), `dA_h = Σ dg·Δ`, the
/// bias's `Σ ddt`, and with `D`, `dx += D_h·dy` (in place, `[batch, L, heads·P]`) and
/// `dD_h = Σ dy·x`; the sums added into `[heads, 1]` f32 tensors.
#[kernel(dtypes(T = [bf16, f16]), tune(P = [64, 128]), targets(sm_90a))]
pub fn ssd_steps_backward(
    dt: Global<T, 3>, a: Global<f32, 1>, bias: Global<f32, 1>, delta: Global<f32, 3>, dg: Global<f32, 3>, dbeta: Global<f32, 3>,
    x: Global<T, 3>, dy: Global<T, 3>, dskip: Global<f32, 1>, dx: Global<T, 3>, ddt: Global<T, 3>, da: Global<f32, 2>,
    dbias: Global<f32, 2>, dd: Global<f32, 2>, heads: i32, has_bias: i32, softplus_on: i32, has_d: i32,
) {
    let (bh, b, h, ah, bias_h) = block_head(a, bias, heads, has_bias);
    let mut d_h = 0.0;
    if has_d == 1 {
        d_h = dskip.get([h]);
    }
    let mut sum_a = Tile::<f32, 1, 1>::zeros();
    let mut sum_bias = Tile::<f32, 1, 1>::zeros();
    let mut sum_d = Tile::<f32, 1, 1>::zeros();
    for t0 in (0..dt.dim(1)).step_by(64) {
        let dgt = dg.load::<Tile<f32, 64, 1>>([bh, t0, 0]);
        let dl = dbeta.load::<Tile<f32, 64, 1>>([bh, t0, 0]) + dgt * ah;
        sum_a = sum_a + (dgt * delta.load::<Tile<f32, 64, 1>>([bh, t0, 0])).sum(0);
        let mut dr = dl;
        if softplus_on == 1 {
            // softplus′(x) = sigmoid(x)
            let xr = dt.load::<Tile<T, 64, 1>>([b, t0, h]).cast::<f32>() + bias_h;
            dr = dl / (1.0 + exp2(xr * -f32::consts::LOG2_E));
        }
        ddt.store([b, t0, h], dr.cast::<T>());
        sum_bias = sum_bias + dr.sum(0);
        if has_d == 1 {
            let dyt = dy.load::<Tile<T, 64, P>>([b, t0, h * P]).cast::<f32>();
            let xt = x.load::<Tile<T, 64, P>>([b, t0, h * P]).cast::<f32>();
            dx.store([b, t0, h * P], (dx.load::<Tile<T, 64, P>>([b, t0, h * P]).cast::<f32>() + dyt * d_h).cast::<T>());
            sum_d = sum_d + (dyt * xt).sum(0).sum(1);
        }
    }
    da.atomic_add([h, 0], sum_a);
    if has_bias == 1 {
        dbias.atomic_add([h, 0], sum_bias);
    }
    if has_d == 1 {
        dd.atomic_add([h, 0], sum_d);
    }
}

/// Element types [`Ssd`] runs on: bf16 and f16.
pub trait SsdElement: LinearAttentionElement + sealed::Sealed {
    #[doc(hidden)]
    fn steps_launch(s: &Ssd<'_, Self>, delta: &mut Tensor<f32>, g: &mut Tensor<f32>) -> Result<()>;
    #[doc(hidden)]
    fn steps_backward_launch(s: &Ssd<'_, Self>, sums: StepSums<'_, Self>) -> Result<()>;
}

mod sealed {
    pub trait Sealed {}
    impl Sealed for tessera::bf16 {}
    impl Sealed for tessera::f16 {}
}

/// The backward's per-step tensors, as [`ssd_steps_backward`] takes them.
#[doc(hidden)]
pub struct StepSums<'t, T: Element> {
    delta: &'t Tensor<f32>,
    dg: &'t Tensor<f32>,
    dbeta: &'t Tensor<f32>,
    dy: &'t Tensor<T>,
    dx: &'t mut Tensor<T>,
    ddt: &'t mut Tensor<T>,
    da: &'t mut Tensor<f32>,
    dbias: Option<&'t mut Tensor<f32>>,
    dd: Option<&'t mut Tensor<f32>>,
}

/// A `[batch, heads, L]` f32 tensor as the kernels' `[batch·heads, L, 1]`.
fn steps_view(t: &Tensor<f32>, rows: usize, len: usize) -> Result<tessera::TensorView<'_, f32>> {
    t.view(&[rows, len, 1], &[len, 1, 1])
}

macro_rules! ssd_element {
    ($t:ty, $steps:ident, $back:ident) => {
        impl SsdElement for $t {
            fn steps_launch(s: &Ssd<'_, Self>, delta: &mut Tensor<f32>, g: &mut Tensor<f32>) -> Result<()> {
                let [batch, len, heads] = *s.dt.shape() else { unreachable!("checked by Ssd::dims") };
                let rows = batch * heads;
                let mut dv = delta.view_mut(&[rows, len, 1], &[len, 1, 1])?;
                let mut gv = g.view_mut(&[rows, len, 1], &[len, 1, 1])?;
                $steps::launch(
                    s.device,
                    Grid::from(rows as u32),
                    s.dt,
                    s.a,
                    &Optional(s.dt_bias, 1),
                    &mut dv,
                    &mut gv,
                    heads as i32,
                    i32::from(s.dt_bias.is_some()),
                    i32::from(s.dt_softplus),
                )
            }

            fn steps_backward_launch(s: &Ssd<'_, Self>, m: StepSums<'_, Self>) -> Result<()> {
                let [batch, len, heads, p] = *s.x.shape() else { unreachable!("checked by Ssd::dims") };
                let rows = batch * heads;
                let i = crate::knob_variant($back::VARIANTS, "P", p, "ssd", "x", "a head dim of 64 or 128", format!("{p}"))?;
                let (delta, dg, dbeta) = (steps_view(m.delta, rows, len)?, steps_view(m.dg, rows, len)?, steps_view(m.dbeta, rows, len)?);
                let wide = [batch, len, heads * p];
                let wide_strides = [len * heads * p, heads * p, 1];
                let x = s.x.view(&wide, &wide_strides)?;
                let dy = m.dy.view(&wide, &wide_strides)?;
                let mut dx = m.dx.view_mut(&wide, &wide_strides)?;
                let mut da = m.da.view_mut(&[heads, 1], &[1, 1])?;
                let mut dbias = m.dbias.map(|t| t.view_mut(&[heads, 1], &[1, 1])).transpose()?;
                let mut dd = m.dd.map(|t| t.view_mut(&[heads, 1], &[1, 1])).transpose()?;
                $back::launch_variant(
                    i,
                    s.device,
                    Grid::from(rows as u32),
                    s.dt,
                    s.a,
                    &Optional(s.dt_bias, 1),
                    &delta,
                    &dg,
                    &dbeta,
                    &x,
                    &dy,
                    &Optional(s.d, 1),
                    &mut dx,
                    m.ddt,
                    &mut da,
                    &mut OptionalMut(dbias.as_mut(), 2),
                    &mut OptionalMut(dd.as_mut(), 2),
                    heads as i32,
                    i32::from(s.dt_bias.is_some()),
                    i32::from(s.dt_softplus),
                    i32::from(s.d.is_some()),
                )
            }
        }
    };
}
ssd_element!(tessera::bf16, ssd_steps_bf16, ssd_steps_backward_bf16);
ssd_element!(tessera::f16, ssd_steps_f16, ssd_steps_backward_f16);

/// The gradients [`Ssd::backward`] returns.
pub struct SsdGrads<T: Element> {
    /// ∂L/∂x.
    pub dx: Tensor<T>,
    /// ∂L/∂dt (before the bias and softplus).
    pub ddt: Tensor<T>,
    /// ∂L/∂A (`[heads]`, f32).
    pub da: Tensor<f32>,
    /// ∂L/∂B (summed over each group's heads).
    pub db: Tensor<T>,
    /// ∂L/∂C (likewise).
    pub dc: Tensor<T>,
    /// ∂L/∂D, with a D.
    pub dd: Option<Tensor<f32>>,
    /// ∂L/∂(dt bias), with one.
    pub d_dt_bias: Option<Tensor<f32>>,
    /// ∂L/∂(initial state), with one.
    pub dh0: Option<Tensor<f32>>,
}

/// Mamba-2's SSD to run (see the module's notes): `x` `[batch, L, heads, headdim]`, `dt`
/// `[batch, L, heads]`, `a` `[heads]` (f32, negative), `b` and `c` `[batch, L, groups, d_state]`;
/// headdim and d_state 64 or 128. The state is `[batch, heads, d_state, headdim]` (f32; mamba-ssm
/// keeps it as `[.., headdim, d_state]`).
///
/// ```ignore
/// let ssd = Ssd::new(&dev, &x, &dt, &a, &b, &c).d(&d).dt_bias(&bias).dt_softplus(true);
/// ssd.run(&mut y, Some(&mut h_last))?;
/// let grads = ssd.backward(&dy, None)?;
/// ```
pub struct Ssd<'a, T: Element> {
    device: &'a Device,
    x: &'a Tensor<T>,
    dt: &'a Tensor<T>,
    a: &'a Tensor<f32>,
    b: &'a Tensor<T>,
    c: &'a Tensor<T>,
    d: Option<&'a Tensor<f32>>,
    dt_bias: Option<&'a Tensor<f32>>,
    dt_softplus: bool,
    h0: Option<&'a Tensor<f32>>,
}

impl<'a, T: SsdElement> Ssd<'a, T> {
    /// The SSD of `x` with step sizes `dt`, decay rates `a` and the time-varying `b`, `c`.
    pub fn new(device: &'a Device, x: &'a Tensor<T>, dt: &'a Tensor<T>, a: &'a Tensor<f32>, b: &'a Tensor<T>, c: &'a Tensor<T>) -> Self {
        Ssd { device, x, dt, a, b, c, d: None, dt_bias: None, dt_softplus: false, h0: None }
    }

    /// The skip connection `D·x` (`d` `[heads]`, f32).
    pub fn d(mut self, d: &'a Tensor<f32>) -> Self {
        self.d = Some(d);
        self
    }

    /// A bias added to `dt` (`[heads]`, f32).
    pub fn dt_bias(mut self, bias: &'a Tensor<f32>) -> Self {
        self.dt_bias = Some(bias);
        self
    }

    /// Whether `Δ = softplus(dt + bias)` (Mamba-2's default) rather than `dt + bias`.
    pub fn dt_softplus(mut self, on: bool) -> Self {
        self.dt_softplus = on;
        self
    }

    /// The state to start from (`[batch, heads, d_state, headdim]`, f32).
    pub fn initial_state(mut self, h0: &'a Tensor<f32>) -> Self {
        self.h0 = Some(h0);
        self
    }

    /// Runs it into `y` (as `x`) and, if given, the last state.
    ///
    /// # Errors
    /// [`Error::Argument`] naming the tensor whose shape or layout does not fit; a launch
    /// error (the kernels need sm_90a).
    pub fn run(&self, y: &mut Tensor<T>, h_last: Option<&mut Tensor<f32>>) -> Result<()> {
        let (delta, g) = self.steps()?;
        self.attention(&delta, &g).run(y, h_last)
    }

    /// The gradients of the inputs from `dy` (the gradient of `y`) and, if given, `dh_last`
    /// (of the last state); nothing of the forward saved.
    ///
    /// # Errors
    /// As [`Ssd::run`], and [`Error::Argument`] naming `dy` or `dh_last` where its shape does
    /// not fit.
    pub fn backward(&self, dy: &Tensor<T>, dh_last: Option<&Tensor<f32>>) -> Result<SsdGrads<T>> {
        let (delta, g) = self.steps()?;
        let grads = self.attention(&delta, &g).backward(dy, dh_last)?;
        let dev = self.device;
        let heads = self.a.shape()[0];
        let mut dx = grads.dv;
        let mut ddt = Tensor::<T>::zeros(dev, self.dt.shape())?;
        let mut da = Tensor::<f32>::zeros(dev, &[heads])?;
        let mut dbias = self.dt_bias.map(|_| Tensor::<f32>::zeros(dev, &[heads])).transpose()?;
        let mut dd = self.d.map(|_| Tensor::<f32>::zeros(dev, &[heads])).transpose()?;
        let (Some(dg), Some(dbeta)) = (grads.dg, grads.dbeta) else { unreachable!("the SSD's attention has a decay and a β") };
        if self.x.shape().iter().all(|&n| n > 0) {
            T::steps_backward_launch(
                self,
                StepSums {
                    delta: &delta,
                    dg: &dg,
                    dbeta: &dbeta,
                    dy,
                    dx: &mut dx,
                    ddt: &mut ddt,
                    da: &mut da,
                    dbias: dbias.as_mut(),
                    dd: dd.as_mut(),
                },
            )?;
        }
        Ok(SsdGrads { dx, ddt, da, db: grads.dk, dc: grads.dq, dd, d_dt_bias: dbias, dh0: grads.dh0 })
    }

    fn arg(&self, arg: &str, expected: String, found: String) -> Error {
        Error::Argument { kernel: "ssd", arg: arg.into(), expected, found }
    }

    /// `Δ` and `g = A·Δ` (`[batch, heads, L]`, f32), after checking the SSD's own inputs (the
    /// linear attention checks the rest).
    fn steps(&self) -> Result<(Tensor<f32>, Tensor<f32>)> {
        let arg = |a: &str, e: String, f: String| self.arg(a, e, f);
        let [batch, len, heads, p] = *self.x.shape() else {
            return Err(arg("x", "[batch, L, heads, headdim]".into(), format!("shape {:?}", self.x.shape())));
        };
        if !matches!(p, 64 | 128) || !self.x.is_contiguous() {
            return Err(arg("x", "a contiguous tensor with headdim 64 or 128".into(), format!("shape {:?}", self.x.shape())));
        }
        // B and C by their own names (the linear attention would call them k and q).
        for (name, t) in [("b", self.b), ("c", self.c)] {
            let ok = match *t.shape() {
                [tb, tl, g, n] => tb == batch && tl == len && g > 0 && heads % g == 0 && matches!(n, 64 | 128) && t.is_contiguous(),
                _ => false,
            };
            if !ok {
                return Err(arg(
                    name,
                    format!("a contiguous [{batch}, {len}, groups, d_state] with groups dividing {heads} heads and d_state 64 or 128"),
                    format!("shape {:?}", t.shape()),
                ));
            }
        }
        if self.b.shape() != self.c.shape() {
            return Err(arg("c", format!("shape {:?}, as b", self.b.shape()), format!("shape {:?}", self.c.shape())));
        }
        if self.dt.shape() != [batch, len, heads] || !self.dt.is_contiguous() {
            return Err(arg(
                "dt",
                format!("a contiguous tensor of shape {:?}", [batch, len, heads]),
                format!("shape {:?}", self.dt.shape()),
            ));
        }
        for (name, t) in [("a", Some(self.a)), ("d", self.d), ("dt_bias", self.dt_bias)] {
            if let Some(t) = t {
                if t.shape() != [heads] {
                    return Err(arg(name, format!("shape [{heads}]"), format!("shape {:?}", t.shape())));
                }
            }
        }
        let mut delta = Tensor::<f32>::zeros(self.device, &[batch, heads, len])?;
        let mut g = Tensor::<f32>::zeros(self.device, &[batch, heads, len])?;
        if batch * heads * len > 0 {
            T::steps_launch(self, &mut delta, &mut g)?;
        }
        Ok((delta, g))
    }

    /// The linear attention it is.
    fn attention<'s>(&'s self, delta: &'s Tensor<f32>, g: &'s Tensor<f32>) -> LinearAttention<'s, T> {
        let mut la =
            LinearAttention::new(self.device, self.c, self.b, self.x).layout(AttentionLayout::Bshd).decay(g).beta(delta).scale(1.0);
        if let Some(h0) = self.h0 {
            la = la.initial_state(h0);
        }
        la.skip = self.d;
        la
    }
}
