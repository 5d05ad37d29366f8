//! Grouped GEMM (mixture-of-experts): one launch over `E` experts, `C[rows of e] = act(alpha ·
//! A[rows of e] · B[e]ᵀ)`, A's rows packed by expert and the experts' row counts given on the
//! device (`group_ends`, cumulative, as `torch._grouped_mm`'s `offs`): no host sync, so a
//! router's counts feed it straight from the GPU.
//!
//! The kernel is the library's persistent GEMM with its tiles placed by rows
//! ([`gemm_persistent_rows`](crate::prelude::gemm_persistent_rows)): tile rows are *slots*
//! ([`group_slot`](crate::prelude::group_slot)) — expert `e` owns slots from `e + ⌊start_e /
//! BM⌋`, which leaves room for its `BM`-row tiles (at most one spare, an empty tile skipped at
//! no cost but its claim) without a prefix sum over the experts; a tile finds its expert by a
//! binary search over `group_ends`. The producer loads A's `BM` rows from the expert's first
//! row on and B's expert; a consumer's 64-row block that runs past the expert's last row is
//! stored element by element within it, the rest by TMA, and one whose rows all lie past it
//! only releases the stages.
//!
//! Many small experts make the GEMM memory-bound: their weights, `E·N·K` elements, are read
//! once per tile row of each expert (run 263: the L2 does not catch the second read), so the
//! 256-row tiles (B read once for 256 rows) are the default where experts average fewer than
//! 1024 rows.

use crate::gemm::{check_hopper, pick_variant, tma_output, tma_ready, unpad, Activation, BLayout, Fp8GroupedGemm, GemmElement};
use crate::prelude::*;
use crate::Fp8Element;
use tessera::{kernel, Device, Error, Grid, KernelSpec, Result, Tensor, F8E4M3};

/// `C[ends[e-1]..ends[e]] = act(alpha · A[ends[e-1]..ends[e]] · B[e]ᵀ)` for each expert `e`: A
/// `[1, M, K]` (rows packed by expert), B `[E, N, K]`, C `[1, M, N]` (rows 16-byte aligned),
/// `ends` `[E]` cumulative row ends; `BM`×`BN` tiles over `E + ⌊M/BM⌋` slots of rows (a
/// 256-row tile: each consumer warpgroup multiplies 128 rows, two accumulators).
#[kernel(warpgroups = 3, dtypes(T = [bf16, f16]), tune(BN = [256, 128], BM = [128, 256], STAGES = [4]), targets(sm_90a))]
pub fn gemm_grouped(
    a: Global<T, 3>, b: Global<T, 3>, c: Global<T, 3>, ends: Global<i32, 1>, counter: Global<i32, 1>, alpha: f32, act: i32,
) {
    let sa = Smem::<T, BM, 64>::ring(STAGES);
    let sb = Smem::<T, BN, 64>::ring(STAGES);
    let sc = Smem::<T, 64, 64>::ring(4);
    let pipe = Pipeline::<STAGES>::new(2);
    grouped_rows::<0, BN, 0>(a, b, c, ends, counter, sa, sb, sc, pipe, |acc, _e, _m0, _n| {
        let mut out = acc * alpha;
        activate(&mut out, act);
        out
    });
}

/// `gemm_grouped_*` with each expert's B stored `[K, N]` (B `[E, K, N]`: `C = A·B[e]`).
#[kernel(warpgroups = 3, dtypes(T = [bf16, f16]), tune(BN = [256, 128], BM = [128, 256], STAGES = [4]), targets(sm_90a))]
pub fn gemm_grouped_nn(
    a: Global<T, 3>, b: Global<T, 3>, c: Global<T, 3>, ends: Global<i32, 1>, counter: Global<i32, 1>, alpha: f32, act: i32,
) {
    let sa = Smem::<T, BM, 64>::ring(STAGES);
    let sb = Smem::<T, 64, BN>::ring(STAGES);
    let sc = Smem::<T, 64, 64>::ring(4);
    let pipe = Pipeline::<STAGES>::new(2);
    grouped_rows::<1, BN, 0>(a, b, c, ends, counter, sa, sb, sc, pipe, |acc, _e, _m0, _n| {
        let mut out = acc * alpha;
        activate(&mut out, act);
        out
    });
}

/// The grouped GEMM's persistent loop over its slots (`E + ⌊M/BM⌋` of them, `BM` the rows of
/// `sa`'s stages), shared by the bf16 and fp8 kernels: a tile's slot found by [`group_slot`],
/// its expert's B (`KN` its layout, as [`gemm_load`](crate::prelude::gemm_load)'s),
/// `epilogue(acc, expert, row, col)`; `PROMOTE` 1 ends fp8's wgmma sums every K step.
#[tessera::device]
#[allow(clippy::too_many_arguments)]
fn grouped_rows<
    const KN: usize,
    const BN: usize,
    const PROMOTE: usize,
    T,
    TB,
    U,
    const BM: usize,
    const BK: usize,
    const S: usize,
    const SR: usize,
    const SC: usize,
>(
    a: Global<T, 3>, b: Global<TB, 3>, c: Global<U, 3>, ends: Global<i32, 1>, counter: Global<i32, 1>, sa: Smem<T, BM, BK>,
    sb: Smem<TB, SR, SC>, sc: Smem<U, 64, 64>, pipe: Pipeline<S>, epilogue: impl Fn(Tile<f32, 64, 64>, i32, i32, i32) -> Tile<f32, 64, 64>,
) {
    let rows = c.dim(1);
    let slots = ends.dim(0) + rows / BM;
    let tiles_n = (c.dim(2) + BN - 1) / BN;
    #[rustfmt::skip]
    gemm_persistent_rows::<KN, BN, PROMOTE, 1>(
        a, b, c, counter, sa, sb, sc, pipe, slots * tiles_n,
        // Row by row: a slot's tiles one after another (they share A's rows; measured a little
        // faster than rasters grouped by 2, 3 or 8 slots — run 264).
        |tile| {
            let (expert, m0, end) = group_slot(ends, tile / tiles_n, rows, BM);
            (0, m0, (tile % tiles_n) * BN, expert, end)
        },
        // Promotion only (the scales are the epilogue's): a factor of one.
        |_e, _m0, _n0, _k| Tile::<f32, 64, 1>::full(1.0),
        epilogue,
    );
}

/// The fp8 grouped GEMM: `C[rows of e] = act(A[rows of e] · B[e]ᵀ · scale_a[row] ·
/// scale_b[e, col])`, A `[1, M, K]` in e4m3 or e5m2, B `[E, N, K]` in e4m3, C in bf16 or f16;
/// wgmma's own fp8 sums over all of K (fast accumulation), the scales in the epilogue.
#[kernel(warpgroups = 3, dtypes(A = [f8e4m3, f8e5m2], U = [bf16, f16]), tune(BN = [256, 128], BM = [128, 256], STAGES = [4]), targets(sm_90a))]
pub fn gemm_fp8_grouped(
    a: Global<A, 3>, b: Global<f8e4m3, 3>, c: Global<U, 3>, ends: Global<i32, 1>, scale_a: Global<f32, 1>, scale_b: Global<f32, 2>,
    counter: Global<i32, 1>, act: i32,
) {
    let sa = Smem::<A, BM, 128>::ring(STAGES);
    let sb = Smem::<f8e4m3, BN, 128>::ring(STAGES);
    let sc = Smem::<U, 64, 64>::ring(4);
    let pipe = Pipeline::<STAGES>::new(2);
    grouped_rows::<0, BN, 0>(a, b, c, ends, counter, sa, sb, sc, pipe, |acc, e, m0, n| {
        let mut out = acc * scale_a.load::<Tile<f32, 64, 1>>([m0]) * scale_b.load::<Tile<f32, 1, 64>>([e, n]);
        activate(&mut out, act);
        out
    });
}

/// `gemm_fp8_grouped` with fp8's wgmma sums ended every 128 columns of K and added into f32
/// registers (promoted, [`gemm_mma_promoted`](crate::prelude::gemm_mma_promoted)); 128×128
/// tiles.
#[kernel(warpgroups = 3, dtypes(A = [f8e4m3, f8e5m2], U = [bf16, f16]), tune(STAGES = [6]), targets(sm_90a))]
pub fn gemm_fp8_grouped_promoted(
    a: Global<A, 3>, b: Global<f8e4m3, 3>, c: Global<U, 3>, ends: Global<i32, 1>, scale_a: Global<f32, 1>, scale_b: Global<f32, 2>,
    counter: Global<i32, 1>, act: i32,
) {
    let sa = Smem::<A, 128, 128>::ring(STAGES);
    let sb = Smem::<f8e4m3, 128, 128>::ring(STAGES);
    let sc = Smem::<U, 64, 64>::ring(4);
    let pipe = Pipeline::<STAGES>::new(2);
    grouped_rows::<0, 128, 1>(a, b, c, ends, counter, sa, sb, sc, pipe, |acc, e, m0, n| {
        let mut out = acc * scale_a.load::<Tile<f32, 64, 1>>([m0]) * scale_b.load::<Tile<f32, 1, 64>>([e, n]);
        activate(&mut out, act);
        out
    });
}

/// A grouped GEMM (mixture-of-experts), built with [`gemm_grouped`] and run with
/// [`GroupedGemmBuilder::run`].
#[derive(Clone, Copy, Debug)]
pub struct GroupedGemmBuilder<'t, T: GemmElement> {
    a: &'t Tensor<T>,
    b: &'t Tensor<T>,
    b_layout: BLayout,
    ends: &'t Tensor<i32>,
    alpha: f32,
    activation: Activation,
    variant: Option<&'t str>,
}

/// Starts a grouped GEMM over `E` experts: A `[M, K]` holds the experts' rows one expert after
/// another, B `[E, N, K]` each expert's weights (the "TN" layout of `nn.Linear`), and
/// `group_ends` `[E]` (i32, on the device) the cumulative row ends — expert `e` owns A's rows
/// `group_ends[e − 1]..group_ends[e]` (from 0 for the first), as `torch._grouped_mm`'s `offs`.
/// C `[M, N]` gets `A[rows of e] · B[e]ᵀ` in each expert's rows; rows past `group_ends[E − 1]`
/// are not written.
///
/// ```no_run
/// use tessera::{bf16, Device, Tensor};
/// use tessera_kernels::{gemm_grouped, Activation};
/// let dev = Device::new(0)?;
/// let x = Tensor::<bf16>::zeros(&dev, &[4096, 1024])?; // tokens sorted by expert
/// let w = Tensor::<bf16>::zeros(&dev, &[8, 2048, 1024])?; // 8 experts' weights, N×K each
/// let ends = Tensor::from_host(&dev, &[512i32, 1024, 1536, 2048, 2560, 3072, 3584, 4096], &[8])?;
/// let mut y = Tensor::<bf16>::zeros(&dev, &[4096, 2048])?;
/// gemm_grouped(&x, &w, &ends).activation(Activation::Silu).run(&dev, &mut y)?;
/// # Ok::<(), tessera::Error>(())
/// ```
pub fn gemm_grouped<'t, T: GemmElement>(a: &'t Tensor<T>, b: &'t Tensor<T>, group_ends: &'t Tensor<i32>) -> GroupedGemmBuilder<'t, T> {
    GroupedGemmBuilder { a, b, b_layout: BLayout::NxK, ends: group_ends, alpha: 1.0, activation: Activation::None, variant: None }
}

/// The variants of the grouped GEMM kernel for `T` and B's layout (`tune(BN, BM)`: 128×256
/// tiles, 128×128, 256×128); by default 256×128 where the experts average fewer than 1024
/// rows, else 128×256; the tuner (`TESSERA_TUNE=search`) times them per shape,
/// [`GroupedGemmBuilder::variant`] forces one.
pub fn gemm_grouped_variants<T: GemmElement>(b_layout: BLayout) -> Vec<&'static str> {
    T::grouped_variants(b_layout == BLayout::KxN).iter().map(|s| s.name).collect()
}

/// The most experts a grouped GEMM takes ([`group_slot`](crate::prelude::group_slot)'s
/// binary search has 16 steps).
pub const GROUPED_GEMM_MAX_EXPERTS: usize = 1 << 16;

impl<'t, T: GemmElement> GroupedGemmBuilder<'t, T> {
    /// How each expert's B is stored: [`BLayout::NxK`] (the default, B `[E, N, K]`, `C =
    /// A·B[e]ᵀ`) or [`BLayout::KxN`] (B `[E, K, N]`, `C = A·B[e]`).
    pub fn b_layout(mut self, layout: BLayout) -> Self {
        self.b_layout = layout;
        self
    }

    /// Scales the product: `alpha·A·Bᵀ`.
    pub fn alpha(mut self, alpha: f32) -> Self {
        self.alpha = alpha;
        self
    }

    /// Applies an activation to the product.
    pub fn activation(mut self, activation: Activation) -> Self {
        self.activation = activation;
        self
    }

    /// Runs the variant named `name` (one of [`gemm_grouped_variants`]) instead of asking the
    /// tuner.
    pub fn variant(mut self, name: &'t str) -> Self {
        self.variant = Some(name);
        self
    }

    /// Runs it into `c` (`[M, N]`, contiguous). Where C's rows are not 16-byte multiples (N not a
    /// multiple of 8), the kernel writes a padded copy of C (TMA stores whole rows), copied back
    /// after.
    ///
    /// `group_ends` is read on the device only: it should be non-decreasing and end at most at
    /// M. That is not checked (it would need a host sync); other values never read or write
    /// outside the tensors — each end is clamped into `0..=M` — but give rows no defined value.
    /// A or B whose rows TMA cannot address (K not a multiple of 8) are first copied into
    /// zero-padded buffers. Hopper (and the interpreter).
    ///
    /// # Errors
    /// [`tessera::Error::Argument`] naming the tensor when a shape does not match (A not 2-D, B
    /// not `[E, N, K]`, `group_ends` not `[E]`, C not `[M, N]`), a size is 0, there are more than
    /// [`GROUPED_GEMM_MAX_EXPERTS`] experts, C is not contiguous, or the device is not a
    /// Hopper GPU; and the launch's own checks.
    pub fn run(self, device: &Device, c: &mut Tensor<T>) -> Result<()> {
        let kn = self.b_layout == BLayout::KxN;
        let (m, k, e, n) = grouped_shapes("gemm_grouped", self.a, self.b, kn, self.ends, c)?;
        let variants = T::grouped_variants(kn);
        check_hopper("gemm_grouped", device, variants[0])?;
        let (mut pa, mut pb) = (None, None);
        let a = tma_ready(device, "a", self.a, [1, m, k], &mut pa)?;
        let b = tma_ready(device, "b", self.b, if kn { [e, k, n] } else { [e, n, k] }, &mut pb)?;
        let ends = self.ends.view(&[e], &[self.ends.strides()[0]])?;
        let mut padded = tma_output("gemm_grouped", device, c, m, n, true)?;
        let n8 = padded.as_ref().map_or(n, |p| p.shape()[1]);
        let names: Vec<&str> = variants.iter().map(|v| v.name).collect();
        let epi = (self.alpha, self.activation.code());
        let run = |i: usize, c: &mut Tensor<T>| {
            let g = grouped_grid(device, variants[i], m, n8, e);
            T::gemm_grouped(device, g, kn, i, &a, &b, &ends, c, [1, m, n8], epi)
        };
        let (dtype, shape, act) = (T::DTYPE, [e, m, n, k], self.activation);
        let key = tessera::TuneKey::new("gemm_grouped", device)
            .field("dtype", &dtype)
            .field("b_layout", &self.b_layout)
            .field("shape", &shape)
            .field("activation", &act);
        // The default: 256-row tiles (B read once for twice the rows: the weights of many
        // small experts are what the time goes to) where an expert has fewer than 1024 rows
        // on average, else 128×256.
        let default = default_grouped_variant(variants, m, e);
        let choice = pick_variant(device, "gemm_grouped", &key, &names, default, self.variant, &[m, n8], &run)?;
        run(choice, padded.as_mut().unwrap_or(c))?;
        unpad(device, padded, c, m, n)
    }
}

/// The grouped GEMMs' shapes, checked: A `[M, K]`, B `[E, N, K]` (or with `kn` `[E, K, N]`),
/// `ends` `[E]`, C `[M, N]`, each size ≥ 1 and at most [`GROUPED_GEMM_MAX_EXPERTS`] experts:
/// `(M, K, E, N)`, else an error of `kernel` naming the tensor.
fn grouped_shapes<TA: tessera::Element, TB: tessera::Element, TC: tessera::Element>(
    kernel: &'static str, a: &Tensor<TA>, b: &Tensor<TB>, kn: bool, ends: &Tensor<i32>, c: &Tensor<TC>,
) -> Result<(usize, usize, usize, usize)> {
    let arg = |name: &str, expected: String, found: String| Error::Argument { kernel, arg: name.into(), expected, found };
    let (m, k) = match *a.shape() {
        [m, k] => (m, k),
        _ => return Err(arg("a", "a 2-D [M, K] matrix of all experts' rows".into(), format!("shape {:?}", a.shape()))),
    };
    let (e, n) = match (b.shape(), kn) {
        (&[e, n, kb], false) if kb == k => (e, n),
        (&[e, kb, n], true) if kb == k => (e, n),
        _ => {
            let want = if kn { format!("[E, {k}, N]") } else { format!("[E, N, {k}]") };
            return Err(arg("b", format!("{want} (K = {k} to match a)"), format!("shape {:?}", b.shape())));
        }
    };
    crate::check_shape(kernel, "group_ends", ends, &[e])?;
    crate::check_shape(kernel, "c", c, &[m, n])?;
    if m == 0 || n == 0 || k == 0 || e == 0 {
        return Err(arg("a", "M, N, K and the experts ≥ 1".into(), format!("M={m}, N={n}, K={k}, E={e}")));
    }
    if e > GROUPED_GEMM_MAX_EXPERTS {
        return Err(arg("b", format!("at most {GROUPED_GEMM_MAX_EXPERTS} experts"), format!("{e}")));
    }
    Ok((m, k, e, n))
}

/// The persistent grid of a grouped kernel variant (`BN`, `BM` from its knobs, else 128×128):
/// at most one block an SM, no more than its `(E + ⌊M/BM⌋) × ⌈N/BN⌉` tiles.
fn grouped_grid(device: &Device, spec: &KernelSpec, m: usize, n: usize, e: usize) -> Grid {
    let (bn, bm) = (spec.knob("BN").unwrap_or(128) as usize, spec.knob("BM").unwrap_or(128) as usize);
    Grid::from(Grid::tiles(n, bn).saturating_mul((e + m / bm) as u32).min(device.sm_count()))
}

/// How the operands of an fp8 grouped GEMM are scaled: `C[rows of e] = (A ∘ scale_a)·(B[e] ∘
/// scale_b[e])ᵀ`, the scales f32 on the device.
#[derive(Clone, Copy, Debug)]
pub enum Fp8GroupedScaling<'t> {
    /// One scale for all of A (`[1]`) and one for each expert's B (`[E]`).
    Tensorwise {
        /// `[1]`.
        a: &'t Tensor<f32>,
        /// `[E]`.
        b: &'t Tensor<f32>,
    },
    /// A scale per row of A (`[M]`: per token) and per row of each expert's B (`[E, N]`: per
    /// output column).
    Rowwise {
        /// `[M]`.
        a: &'t Tensor<f32>,
        /// `[E, N]`.
        b: &'t Tensor<f32>,
    },
}

/// An fp8 grouped GEMM, built with [`gemm_fp8_grouped`] and run with
/// [`Fp8GroupedGemmBuilder::run`].
#[derive(Clone, Copy, Debug)]
pub struct Fp8GroupedGemmBuilder<'t, A: Fp8Element> {
    a: &'t Tensor<A>,
    b: &'t Tensor<F8E4M3>,
    ends: &'t Tensor<i32>,
    scaling: Fp8GroupedScaling<'t>,
    activation: Activation,
    fast: bool,
    variant: Option<&'t str>,
}

/// Starts an fp8 grouped GEMM ([`gemm_grouped`]'s experts and `group_ends`): A `[M, K]` in e4m3
/// or e5m2, each expert's weights B `[E, N, K]` in e4m3, scaled as `scaling` says; C `[M, N]`
/// in bf16 or f16.
///
/// ```no_run
/// use tessera::{bf16, Device, Tensor, F8E4M3};
/// use tessera_kernels::{gemm_fp8_grouped, Fp8GroupedScaling};
/// let dev = Device::new(0)?;
/// let x = Tensor::<F8E4M3>::zeros(&dev, &[4096, 1024])?; // tokens sorted by expert
/// let w = Tensor::<F8E4M3>::zeros(&dev, &[8, 2048, 1024])?;
/// let ends = Tensor::from_host(&dev, &[512i32, 1024, 1536, 2048, 2560, 3072, 3584, 4096], &[8])?;
/// let (sx, sw) = (Tensor::from_host(&dev, &[0.5f32; 4096], &[4096])?, Tensor::from_host(&dev, &[0.01f32; 8 * 2048], &[8, 2048])?);
/// let mut y = Tensor::<bf16>::zeros(&dev, &[4096, 2048])?;
/// gemm_fp8_grouped(&x, &w, &ends, Fp8GroupedScaling::Rowwise { a: &sx, b: &sw }).run(&dev, &mut y)?;
/// # Ok::<(), tessera::Error>(())
/// ```
pub fn gemm_fp8_grouped<'t, A: Fp8Element>(
    a: &'t Tensor<A>, b: &'t Tensor<F8E4M3>, group_ends: &'t Tensor<i32>, scaling: Fp8GroupedScaling<'t>,
) -> Fp8GroupedGemmBuilder<'t, A> {
    Fp8GroupedGemmBuilder { a, b, ends: group_ends, scaling, activation: Activation::None, fast: false, variant: None }
}

/// The variants of the fp8 grouped GEMM's fast-accumulation kernel for A in `A`, C in `U`.
pub fn gemm_fp8_grouped_variants<A: Fp8GroupedGemm<U>, U: tessera::Element>() -> Vec<&'static str> {
    A::grouped_variants().iter().map(|s| s.name).collect()
}

/// The variant among `variants` with 256-row tiles where the `e` experts average fewer than
/// 1024 of the `m` rows, else the one with 128×256 tiles (run 265).
fn default_grouped_variant(variants: &[&KernelSpec], m: usize, e: usize) -> usize {
    let want = if m / e < 1024 { (Some(128), Some(256)) } else { (Some(256), Some(128)) };
    (0..variants.len()).find(|&i| (variants[i].knob("BN"), variants[i].knob("BM")) == want).unwrap_or(0)
}

impl<'t, A: Fp8Element> Fp8GroupedGemmBuilder<'t, A> {
    /// Applies an activation after the scales.
    pub fn activation(mut self, activation: Activation) -> Self {
        self.activation = activation;
        self
    }

    /// `true` keeps wgmma's own fp8 sums over all of K (faster; those sums keep fewer bits
    /// than f32); `false` (the default) ends them every 128 columns of K and adds them into
    /// f32 registers (128×128 tiles), as [`Fp8GemmBuilder::fast_accumulation`](crate::Fp8GemmBuilder::fast_accumulation).
    pub fn fast_accumulation(mut self, fast: bool) -> Self {
        self.fast = fast;
        self
    }

    /// Runs the fast-accumulation kernel's variant named `name` (one of
    /// [`gemm_fp8_grouped_variants`]); an error without `fast_accumulation(true)`.
    pub fn variant(mut self, name: &'t str) -> Self {
        self.variant = Some(name);
        self
    }

    /// Runs it into `c` (`[M, N]`, contiguous; any N, as [`GroupedGemmBuilder::run`]). K must be a multiple of 16
    /// (TMA copies fp8 rows of 16-byte multiples); `group_ends` as [`GroupedGemmBuilder::run`]'s.
    ///
    /// # Errors
    /// [`Error::Argument`] naming the tensor when a shape, a scale's shape or an alignment does
    /// not match, on a device other than Hopper, or for a variant that does not exist; and the
    /// launch's own checks.
    pub fn run<U: GemmElement>(self, device: &Device, c: &mut Tensor<U>) -> Result<()>
    where
        A: Fp8GroupedGemm<U>,
    {
        let arg =
            |name: &str, expected: String, found: String| Error::Argument { kernel: "gemm_fp8_grouped", arg: name.into(), expected, found };
        let (m, k, e, n) = grouped_shapes("gemm_fp8_grouped", self.a, self.b, false, self.ends, c)?;
        super::fp8::check_fp8_k("gemm_fp8_grouped", k)?;
        for (name, contiguous, offset) in [("a", self.a.is_contiguous(), self.a.offset()), ("b", self.b.is_contiguous(), self.b.offset())] {
            if !contiguous || !offset.is_multiple_of(16) {
                return Err(arg(name, "a contiguous tensor at a 16-byte aligned offset".into(), format!("offset {offset}")));
            }
        }
        let variants = A::grouped_variants();
        check_hopper("gemm_fp8_grouped", device, variants[0])?;
        let (sa, sb, want_a, want_b, s) = match self.scaling {
            Fp8GroupedScaling::Tensorwise { a, b } => (a, b, vec![1], vec![e], 0),
            Fp8GroupedScaling::Rowwise { a, b } => (a, b, vec![m], vec![e, n], 1),
        };
        for (name, t, want) in [("scale_a", sa, &want_a), ("scale_b", sb, &want_b)] {
            if t.shape() != want.as_slice() || !t.is_contiguous() {
                return Err(arg(name, format!("a contiguous f32 tensor of shape {want:?}"), format!("shape {:?}", t.shape())));
            }
        }
        // Per tensor: stride-0 views; per row: strides along M and N.
        let sa = sa.view(&[m], &[s])?;
        let sb = sb.view(&[e, n], &[if s == 1 { n } else { 1 }, s])?;
        let a = self.a.view(&[1, m, k], &[(m * k).next_multiple_of(16), k, 1])?;
        let b = self.b.view(&[e, n, k], &[n * k, k, 1])?;
        let ends = self.ends.view(&[e], &[self.ends.strides()[0]])?;
        let act = self.activation.code();
        let mut padded = tma_output("gemm_fp8_grouped", device, c, m, n, true)?;
        let n8 = padded.as_ref().map_or(n, |p| p.shape()[1]);
        if !self.fast {
            if let Some(v) = self.variant {
                return Err(arg("variant", "fast_accumulation(true) to name a variant".into(), format!("`{v}` without it")));
            }
            let g = grouped_grid(device, A::grouped_promoted_spec(), m, n8, e);
            A::grouped(device, g, None, &a, &b, &ends, padded.as_mut().unwrap_or(c), [1, m, n8], &sa, &sb, act)?;
            return unpad(device, padded, c, m, n);
        }
        let names: Vec<&str> = variants.iter().map(|v| v.name).collect();
        let run = |i: usize, c: &mut Tensor<U>| {
            let g = grouped_grid(device, variants[i], m, n8, e);
            A::grouped(device, g, Some(i), &a, &b, &ends, c, [1, m, n8], &sa, &sb, act)
        };
        let (dtypes, shape, activation) = ((A::DTYPE, U::DTYPE), [e, m, n, k], self.activation);
        let key = tessera::TuneKey::new("gemm_fp8_grouped", device)
            .field("dtypes", &dtypes)
            .field("shape", &shape)
            .field("activation", &activation);
        let default = default_grouped_variant(variants, m, e);
        let choice = pick_variant(device, "gemm_fp8_grouped", &key, &names, default, self.variant, &[m, n8], &run)?;
        run(choice, padded.as_mut().unwrap_or(c))?;
        unpad(device, padded, c, m, n)
    }
}
