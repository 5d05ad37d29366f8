//! fp8 GEMM on Hopper: `C = act((A ∘ scale_a)·(B ∘ scale_b)ᵀ + bias)` with A `[M, K]` in e4m3
//! or e5m2, B `[N, K]` in e4m3 (fp8 wgmma reads both K-major), C in bf16 or f16. Both kernels
//! are the library's persistent GEMM ([`gemm_persistent`](crate::prelude::gemm_persistent),
//! [`gemm_persistent_mapped`](crate::prelude::gemm_persistent_mapped)) with 128-wide K steps
//! (128 bytes of fp8, one swizzle span) and wgmma k32:
//!
//! - `gemm_fp8` (fast accumulation, on request) applies the scales in the epilogue — one per
//!   row of A times one per column of C (a scale per tensor is a stride-0 view of one element)
//!   — on wgmma's own sums;
//! - `gemm_fp8_promoted` (the default) ends each 128-wide K step's sums in a fresh accumulator
//!   and adds them, times the step's scales, into the f32 one
//!   ([`gemm_mma_promoted`](crate::prelude::gemm_mma_promoted)): scales per 1×128 block of A
//!   and 128×128 block of B, and fp8's short wgmma sums (which keep fewer bits than f32, an
//!   error that grows with K) promoted every 128 columns.

use crate::gemm::{tma_output, unpad, Activation, Bias, GemmElement};
use crate::prelude::*;
use crate::Fp8Element;
use tessera::{
    bf16, device, f16, kernel, Absent, Device, Error, GlobalArg, GlobalArgMut, Grid, KernelSpec, Optional, OptionalMut, Result, Tensor,
    TensorView, F8E4M3,
};

/// `C = act(A·Bᵀ · scale_a[row] · scale_b[col] + bias)`, 128×`BN` tiles, the scales (and bias,
/// `bias_kind` 1 per column, 2 per row) applied in the epilogue.
#[kernel(warpgroups = 3, dtypes(A = [f8e4m3, f8e5m2], U = [bf16, f16]), tune(BN = [256, 128], STAGES = [4]), targets(sm_90a))]
pub fn gemm_fp8(
    a: Global<A, 3>, b: Global<f8e4m3, 3>, c: Global<U, 3>, scale_a: Global<f32, 1>, scale_b: Global<f32, 1>, bias: Global<U, 1>,
    counter: Global<i32, 1>, bias_kind: i32, act: i32,
) {
    let sa = Smem::<A, 128, 128>::ring(STAGES);
    let sb = Smem::<f8e4m3, BN, 128>::ring(STAGES);
    let sc = Smem::<U, 64, 64>::ring(4);
    let pipe = Pipeline::<STAGES>::new(2);
    fp8_fast_gemm(a, b, c, scale_a, scale_b, bias, counter, bias_kind, act, sa, sb, sc, pipe);
}

/// [`gemm_fp8`] into f32 C: its 64×64 staging buffers unswizzled (256-byte rows, one TMA box
/// each), 128×128 tiles (128×256 ones and the buffers do not fit in shared memory).
#[kernel(warpgroups = 3, dtypes(A = [f8e4m3, f8e5m2]), tune(BN = [128], STAGES = [4]), targets(sm_90a))]
pub fn gemm_fp8_f32(
    a: Global<A, 3>, b: Global<f8e4m3, 3>, c: Global<f32, 3>, scale_a: Global<f32, 1>, scale_b: Global<f32, 1>, bias: Global<f32, 1>,
    counter: Global<i32, 1>, bias_kind: i32, act: i32,
) {
    let sa = Smem::<A, 128, 128>::ring(STAGES);
    let sb = Smem::<f8e4m3, BN, 128>::ring(STAGES);
    let sc = Smem::<f32, 64, 64>::ring_swizzled(4, 0);
    let pipe = Pipeline::<STAGES>::new(2);
    fp8_fast_gemm(a, b, c, scale_a, scale_b, bias, counter, bias_kind, act, sa, sb, sc, pipe);
}

/// The epilogue-scaled fp8 GEMM over a kernel's rings ([`gemm_fp8`], `gemm_fp8_f32`).
#[device]
#[allow(clippy::too_many_arguments)]
pub fn fp8_fast_gemm<A, U, const BN: usize, const S: usize>(
    a: Global<A, 3>, b: Global<f8e4m3, 3>, c: Global<U, 3>, scale_a: Global<f32, 1>, scale_b: Global<f32, 1>, bias: Global<U, 1>,
    counter: Global<i32, 1>, bias_kind: i32, act: i32, sa: Smem<A, 128, 128>, sb: Smem<f8e4m3, BN, 128>, sc: Smem<U, 64, 64>,
    pipe: Pipeline<S>,
) {
    gemm_persistent::<0, BN>(a, b, c, counter, sa, sb, sc, pipe, |acc, _bt, m0, n| {
        let scaled = acc * scale_a.load::<Tile<f32, 64, 1>>([m0]) * scale_b.load::<Tile<f32, 1, 64>>([n]);
        bias_act(scaled, bias, bias_kind, act, m0, n)
    });
}

/// `gemm_fp8` promoted every 128-wide K step `k`: the step's product of the 64 rows at `m0` and
/// the columns at `n0` is scaled by `scale_a[m0.., k]` (64×1) and, where `per_block` is 1, by
/// `scale_b[n0 / 128, k]`, and added into the f32 accumulator; where `per_block` is 0,
/// `scale_b[0, col]` scales C's columns in the epilogue instead. 128×128 tiles.
#[kernel(warpgroups = 3, dtypes(A = [f8e4m3, f8e5m2], U = [bf16, f16]), tune(STAGES = [6]), targets(sm_90a))]
pub fn gemm_fp8_promoted(
    a: Global<A, 3>, b: Global<f8e4m3, 3>, c: Global<U, 3>, scale_a: Global<f32, 2>, scale_b: Global<f32, 2>, bias: Global<U, 1>,
    counter: Global<i32, 1>, per_block: i32, bias_kind: i32, act: i32,
) {
    let sa = Smem::<A, 128, 128>::ring(STAGES);
    let sb = Smem::<f8e4m3, 128, 128>::ring(STAGES);
    let sc = Smem::<U, 64, 64>::ring(4);
    let pipe = Pipeline::<STAGES>::new(2);
    fp8_promoted_gemm(a, b, c, scale_a, scale_b, bias, counter, per_block, bias_kind, act, sa, sb, sc, pipe);
}

/// `gemm_fp8_promoted` into f32 C, its staging buffers unswizzled as `gemm_fp8_f32`'s, in
/// 4 stages (6 and the buffers do not fit).
#[kernel(warpgroups = 3, dtypes(A = [f8e4m3, f8e5m2]), tune(STAGES = [4]), targets(sm_90a))]
pub fn gemm_fp8_promoted_f32(
    a: Global<A, 3>, b: Global<f8e4m3, 3>, c: Global<f32, 3>, scale_a: Global<f32, 2>, scale_b: Global<f32, 2>, bias: Global<f32, 1>,
    counter: Global<i32, 1>, per_block: i32, bias_kind: i32, act: i32,
) {
    let sa = Smem::<A, 128, 128>::ring(STAGES);
    let sb = Smem::<f8e4m3, 128, 128>::ring(STAGES);
    let sc = Smem::<f32, 64, 64>::ring_swizzled(4, 0);
    let pipe = Pipeline::<STAGES>::new(2);
    fp8_promoted_gemm(a, b, c, scale_a, scale_b, bias, counter, per_block, bias_kind, act, sa, sb, sc, pipe);
}

/// The promoted fp8 GEMM over a kernel's rings (`gemm_fp8_promoted`, `gemm_fp8_promoted_f32`).
#[device]
#[allow(clippy::too_many_arguments)]
pub fn fp8_promoted_gemm<A, U, const S: usize>(
    a: Global<A, 3>, b: Global<f8e4m3, 3>, c: Global<U, 3>, scale_a: Global<f32, 2>, scale_b: Global<f32, 2>, bias: Global<U, 1>,
    counter: Global<i32, 1>, per_block: i32, bias_kind: i32, act: i32, sa: Smem<A, 128, 128>, sb: Smem<f8e4m3, 128, 128>,
    sc: Smem<U, 64, 64>, pipe: Pipeline<S>,
) {
    let (per_batch, tiles_m, group) = gemm_raster::<128>(c);
    #[rustfmt::skip]
    gemm_persistent_mapped::<0, 128, 1>(
        a, b, c, counter, sa, sb, sc, pipe, per_batch * c.dim(0), |tile| grouped_tile(tile, per_batch, tiles_m, group),
        |_bt, m0, n0, k| fp8_step_scale(scale_a, scale_b, per_block, m0, n0, k),
        |acc, _bt, m0, n| promoted_epilogue(acc, scale_b, per_block, bias, bias_kind, act, m0, n),
    );
}

/// [`gemm_fp8`] with C in fp8 `Q` (the bias in bf16): `C = Q(act(A·Bᵀ·scale_a·scale_b + bias) ·
/// scale_c[0])`, and where `amax_on` is 1 the largest |value| before `scale_c` kept in `amax`
/// (`fp8_quantized`). `cols` is N.
#[kernel(warpgroups = 3, dtypes(A = [f8e4m3, f8e5m2], Q = [f8e4m3, f8e5m2]), tune(BN = [256, 128], STAGES = [4]), targets(sm_90a))]
pub fn gemm_fp8_q(
    a: Global<A, 3>, b: Global<f8e4m3, 3>, c: Global<Q, 3>, scale_a: Global<f32, 1>, scale_b: Global<f32, 1>, bias: Global<bf16, 1>,
    scale_c: Global<f32, 1>, amax: Global<f32, 2>, counter: Global<i32, 1>, bias_kind: i32, act: i32, cols: i32, amax_on: i32,
) {
    let sa = Smem::<A, 128, 128>::ring(STAGES);
    let sb = Smem::<f8e4m3, BN, 128>::ring(STAGES);
    let sc = Smem::<Q, 64, 64>::ring(4);
    let pipe = Pipeline::<STAGES>::new(2);
    gemm_persistent::<0, BN>(a, b, c, counter, sa, sb, sc, pipe, |acc, _bt, m0, n| {
        let scaled = acc * scale_a.load::<Tile<f32, 64, 1>>([m0]) * scale_b.load::<Tile<f32, 1, 64>>([n]);
        fp8_quantized(bias_act(scaled, bias, bias_kind, act, m0, n), c, scale_c, amax, cols, amax_on, m0, n)
    });
}

/// `gemm_fp8_promoted` with C in fp8 `Q`, as `gemm_fp8_q`.
#[kernel(warpgroups = 3, dtypes(A = [f8e4m3, f8e5m2], Q = [f8e4m3, f8e5m2]), tune(STAGES = [6]), targets(sm_90a))]
pub fn gemm_fp8_promoted_q(
    a: Global<A, 3>, b: Global<f8e4m3, 3>, c: Global<Q, 3>, scale_a: Global<f32, 2>, scale_b: Global<f32, 2>, bias: Global<bf16, 1>,
    scale_c: Global<f32, 1>, amax: Global<f32, 2>, counter: Global<i32, 1>, per_block: i32, bias_kind: i32, act: i32, cols: i32,
    amax_on: i32,
) {
    let sa = Smem::<A, 128, 128>::ring(STAGES);
    let sb = Smem::<f8e4m3, 128, 128>::ring(STAGES);
    let sc = Smem::<Q, 64, 64>::ring(4);
    let pipe = Pipeline::<STAGES>::new(2);
    let (per_batch, tiles_m, group) = gemm_raster::<128>(c);
    #[rustfmt::skip]
    gemm_persistent_mapped::<0, 128, 1>(
        a, b, c, counter, sa, sb, sc, pipe, per_batch * c.dim(0), |tile| grouped_tile(tile, per_batch, tiles_m, group),
        |_bt, m0, n0, k| fp8_step_scale(scale_a, scale_b, per_block, m0, n0, k),
        |acc, _bt, m0, n| {
            let out = promoted_epilogue(acc, scale_b, per_block, bias, bias_kind, act, m0, n);
            fp8_quantized(out, c, scale_c, amax, cols, amax_on, m0, n)
        },
    );
}

/// The promoted kernels' factor for K step `k` of the 64 rows at `m0`, columns at `n0`: A's
/// 64×1 scales times, where `per_block` is 1, B's block scale (else 1: `scale_b[0, 0]` times 0).
/// One expression of loads, so that it loads straight into the accumulator's row layout.
#[device]
pub fn fp8_step_scale(scale_a: Global<f32, 2>, scale_b: Global<f32, 2>, per_block: i32, m0: i32, n0: i32, k: i32) -> Tile<f32, 64, 1> {
    let pb = per_block as f32;
    scale_a.load::<Tile<f32, 64, 1>>([m0, k]) * (scale_b.load::<Tile<f32, 1, 1>>([(n0 / 128) * per_block, k * per_block]) * pb + (1.0 - pb))
}

/// The promoted kernels' epilogue: B's per-column scales where `per_block` is 0, then bias and
/// activation.
#[device]
#[allow(clippy::too_many_arguments)]
pub fn promoted_epilogue<T>(
    acc: Tile<f32, 64, 64>, scale_b: Global<f32, 2>, per_block: i32, bias: Global<T, 1>, bias_kind: i32, act: i32, m0: i32, n: i32,
) -> Tile<f32, 64, 64> {
    let mut out = acc;
    if per_block == 0 {
        out = out * scale_b.load::<Tile<f32, 1, 64>>([0, n]);
    }
    bias_act(out, bias, bias_kind, act, m0, n)
}

/// An fp8 output's last step for the 64×64 chunk at `[_, m0, n]` of C: `out · scale_c[0]`, and
/// where `amax_on` is 1 the largest |out| of its elements inside C (rows below `c.dim(1)`,
/// columns below `cols`: a tile's padding holds `act(bias)`, not C) kept in `amax[0, 0]` by an
/// `atomic_max` — the GEMM's amax once every block is done.
#[device]
#[allow(clippy::too_many_arguments)]
pub fn fp8_quantized<Q>(
    out: Tile<f32, 64, 64>, c: Global<Q, 3>, scale_c: Global<f32, 1>, amax: Global<f32, 2>, cols: i32, amax_on: i32, m0: i32, n: i32,
) -> Tile<f32, 64, 64> {
    if amax_on == 1 {
        let mut mag = abs(out);
        if m0 + 64 > c.dim(1) || n + 64 > cols {
            // A chunk at C's edge: the elements past it left out.
            let rows_left = (c.dim(1) - m0) as f32 - 0.5;
            let cols_left = (cols - n) as f32 - 0.5;
            mag = mag * (rows_left - Tile::<f32, 64, 64>::row_index()).step() * (cols_left - Tile::<f32, 64, 64>::col_index()).step();
        }
        amax.atomic_max([0, 0], col_max(row_max(mag)));
    }
    out * scale_c.get([0])
}

/// How the operands of an fp8 GEMM are scaled: `C = (A ∘ scale_a)·(B ∘ scale_b)ᵀ`, each scale
/// (f32, on the device: no host sync) covering a block of its operand's elements.
#[derive(Clone, Copy, Debug)]
pub enum Fp8Scaling<'t> {
    /// One scale for all of A and one for all of B (tensors of one element).
    Tensorwise {
        /// `[1]`.
        a: &'t Tensor<f32>,
        /// `[1]`.
        b: &'t Tensor<f32>,
    },
    /// A scale per row of A and per row of B (a column of C).
    Rowwise {
        /// `[M]`.
        a: &'t Tensor<f32>,
        /// `[N]`.
        b: &'t Tensor<f32>,
    },
    /// A scale per 1×128 block of A and per 128×128 block of B (DeepSeek-V3's training
    /// recipe), applied every 128 columns of K on the promoted path.
    Blockwise {
        /// `[M, ⌈K/128⌉]`.
        a: &'t Tensor<f32>,
        /// `[⌈N/128⌉, ⌈K/128⌉]`.
        b: &'t Tensor<f32>,
    },
}

type View<'a, T> = TensorView<'a, T>;

/// The fp8 GEMM's kernels for A in `Self` and C in `U` (bf16, f16 or f32).
pub trait Fp8Gemm<U: tessera::Element>: Fp8Element {
    #[doc(hidden)]
    fn fast_variants() -> &'static [&'static KernelSpec];
    #[doc(hidden)]
    #[allow(clippy::too_many_arguments)]
    fn fast(
        d: &Device, g: Grid, variant: usize, a: &View<Self>, b: &View<F8E4M3>, c: &mut Tensor<U>, c_shape: [usize; 3], sa: &View<f32>,
        sb: &View<f32>, bias: &impl GlobalArg<U>, epi: (i32, i32),
    ) -> Result<()>;
    #[doc(hidden)]
    #[allow(clippy::too_many_arguments)]
    fn promoted(
        d: &Device, g: Grid, a: &View<Self>, b: &View<F8E4M3>, c: &mut Tensor<U>, c_shape: [usize; 3], sa: &View<f32>, sb: &View<f32>,
        bias: &impl GlobalArg<U>, epi: (i32, i32, i32),
    ) -> Result<()>;
    /// C as the kernels store it (by TMA): `None` where `c` is so, else a padded buffer that
    /// [`Self::unpad_output`] copies into `c` (16-bit C), or an error (f32 C: N a multiple of 4).
    #[doc(hidden)]
    fn padded_output(d: &Device, c: &Tensor<U>, m: usize, n: usize) -> Result<Option<Tensor<U>>>;
    #[doc(hidden)]
    fn unpad_output(d: &Device, padded: Option<Tensor<U>>, c: &mut Tensor<U>, m: usize, n: usize) -> Result<()>;
}

/// The fp8 grouped GEMM's kernels for A in `Self` and C in `U` (bf16 or f16).
pub trait Fp8GroupedGemm<U: tessera::Element>: Fp8Element {
    /// The fast grouped kernel's variants (`tune(BN, BM)`).
    #[doc(hidden)]
    fn grouped_variants() -> &'static [&'static KernelSpec];
    /// The promoted grouped kernel.
    #[doc(hidden)]
    fn grouped_promoted_spec() -> &'static KernelSpec;
    /// The grouped kernels: `variant` of the fast one, or the promoted one where it is `None`.
    #[doc(hidden)]
    #[allow(clippy::too_many_arguments)]
    fn grouped(
        d: &Device, g: Grid, variant: Option<usize>, a: &View<Self>, b: &View<F8E4M3>, ends: &View<i32>, c: &mut Tensor<U>,
        c_shape: [usize; 3], sa: &View<f32>, sb: &View<f32>, act: i32,
    ) -> Result<()>;
}

macro_rules! fp8_gemm {
    ($a:ty, $u:ty, $fast:ident, $promoted:ident, $padded:expr, $unpad:expr) => {
        impl Fp8Gemm<$u> for $a {
            fn fast_variants() -> &'static [&'static KernelSpec] {
                $fast::VARIANTS
            }
            fn fast(
                d: &Device, g: Grid, variant: usize, a: &View<Self>, b: &View<F8E4M3>, c: &mut Tensor<$u>, c_shape: [usize; 3],
                sa: &View<f32>, sb: &View<f32>, bias: &impl GlobalArg<$u>, (bias_kind, act): (i32, i32),
            ) -> Result<()> {
                let mut c = c.view_mut(&c_shape, &[c_shape[1] * c_shape[2], c_shape[2], 1])?;
                let mut counter = d.tile_counter()?;
                $fast::launch_variant(variant, d, g, a, b, &mut c, sa, sb, bias, &mut counter, bias_kind, act)
            }
            fn promoted(
                d: &Device, g: Grid, a: &View<Self>, b: &View<F8E4M3>, c: &mut Tensor<$u>, c_shape: [usize; 3], sa: &View<f32>,
                sb: &View<f32>, bias: &impl GlobalArg<$u>, (per_block, bias_kind, act): (i32, i32, i32),
            ) -> Result<()> {
                let mut c = c.view_mut(&c_shape, &[c_shape[1] * c_shape[2], c_shape[2], 1])?;
                let mut counter = d.tile_counter()?;
                $promoted::launch(d, g, a, b, &mut c, sa, sb, bias, &mut counter, per_block, bias_kind, act)
            }
            fn padded_output(d: &Device, c: &Tensor<$u>, m: usize, n: usize) -> Result<Option<Tensor<$u>>> {
                $padded(d, c, m, n)
            }
            fn unpad_output(d: &Device, padded: Option<Tensor<$u>>, c: &mut Tensor<$u>, m: usize, n: usize) -> Result<()> {
                $unpad(d, padded, c, m, n)
            }
        }
    };
}

macro_rules! fp8_grouped_gemm {
    ($a:ty, $u:ty, $grouped:ident, $grouped_promoted:ident) => {
        impl Fp8GroupedGemm<$u> for $a {
            fn grouped_variants() -> &'static [&'static KernelSpec] {
                $grouped::VARIANTS
            }
            fn grouped_promoted_spec() -> &'static KernelSpec {
                &$grouped_promoted::SPEC
            }
            fn grouped(
                d: &Device, g: Grid, variant: Option<usize>, a: &View<Self>, b: &View<F8E4M3>, ends: &View<i32>, c: &mut Tensor<$u>,
                c_shape: [usize; 3], sa: &View<f32>, sb: &View<f32>, act: i32,
            ) -> Result<()> {
                let mut c = c.view_mut(&c_shape, &[c_shape[1] * c_shape[2], c_shape[2], 1])?;
                let mut counter = d.tile_counter()?;
                match variant {
                    Some(v) => $grouped::launch_variant(v, d, g, a, b, &mut c, ends, sa, sb, &mut counter, act),
                    None => $grouped_promoted::launch(d, g, a, b, &mut c, ends, sa, sb, &mut counter, act),
                }
            }
        }
    };
}
use super::grouped::{
    gemm_fp8_grouped_f8e4m3_bf16, gemm_fp8_grouped_f8e4m3_f16, gemm_fp8_grouped_f8e5m2_bf16, gemm_fp8_grouped_f8e5m2_f16,
    gemm_fp8_grouped_promoted_f8e4m3_bf16, gemm_fp8_grouped_promoted_f8e4m3_f16, gemm_fp8_grouped_promoted_f8e5m2_bf16,
    gemm_fp8_grouped_promoted_f8e5m2_f16,
};
fp8_gemm!(F8E4M3, bf16, gemm_fp8_f8e4m3_bf16, gemm_fp8_promoted_f8e4m3_bf16, padded_16bit, unpad_16bit);
fp8_gemm!(F8E4M3, f16, gemm_fp8_f8e4m3_f16, gemm_fp8_promoted_f8e4m3_f16, padded_16bit, unpad_16bit);
fp8_gemm!(F8E4M3, f32, gemm_fp8_f32_f8e4m3, gemm_fp8_promoted_f32_f8e4m3, aligned_f32, unpad_f32);
fp8_gemm!(tessera::F8E5M2, bf16, gemm_fp8_f8e5m2_bf16, gemm_fp8_promoted_f8e5m2_bf16, padded_16bit, unpad_16bit);
fp8_gemm!(tessera::F8E5M2, f16, gemm_fp8_f8e5m2_f16, gemm_fp8_promoted_f8e5m2_f16, padded_16bit, unpad_16bit);
fp8_gemm!(tessera::F8E5M2, f32, gemm_fp8_f32_f8e5m2, gemm_fp8_promoted_f32_f8e5m2, aligned_f32, unpad_f32);
fp8_grouped_gemm!(F8E4M3, bf16, gemm_fp8_grouped_f8e4m3_bf16, gemm_fp8_grouped_promoted_f8e4m3_bf16);
fp8_grouped_gemm!(F8E4M3, f16, gemm_fp8_grouped_f8e4m3_f16, gemm_fp8_grouped_promoted_f8e4m3_f16);
fp8_grouped_gemm!(tessera::F8E5M2, bf16, gemm_fp8_grouped_f8e5m2_bf16, gemm_fp8_grouped_promoted_f8e5m2_bf16);
fp8_grouped_gemm!(tessera::F8E5M2, f16, gemm_fp8_grouped_f8e5m2_f16, gemm_fp8_grouped_promoted_f8e5m2_f16);

/// A 16-bit C as the kernels store it: [`tma_output`].
fn padded_16bit<U: GemmElement>(d: &Device, c: &Tensor<U>, m: usize, n: usize) -> Result<Option<Tensor<U>>> {
    tma_output("gemm_fp8", d, c, m, n, false)
}

/// A padded 16-bit C copied back: [`unpad`].
fn unpad_16bit<U: GemmElement>(d: &Device, padded: Option<Tensor<U>>, c: &mut Tensor<U>, m: usize, n: usize) -> Result<()> {
    unpad(d, padded, c, m, n)
}

/// An f32 C stored as it is: contiguous, its rows and start 16-byte aligned (N a multiple of 4).
fn aligned_f32(_d: &Device, c: &Tensor<f32>, _m: usize, n: usize) -> Result<Option<Tensor<f32>>> {
    if c.is_contiguous() && n.is_multiple_of(4) && c.offset().is_multiple_of(4) {
        return Ok(None);
    }
    Err(arg(
        "c",
        "a contiguous f32 C with N a multiple of 4 from a 16-byte aligned offset (its rows leave by TMA stores)".into(),
        format!("shape {:?}, strides {:?}, offset {}", c.shape(), c.strides(), c.offset()),
    ))
}

/// Nothing to copy back: an f32 C is never padded.
fn unpad_f32(_d: &Device, _padded: Option<Tensor<f32>>, _c: &mut Tensor<f32>, _m: usize, _n: usize) -> Result<()> {
    Ok(())
}

/// The fp8 GEMM's kernels for A in `Self` and C in fp8 `Q` ([`Fp8GemmBuilder::run_fp8`]).
pub trait Fp8QuantizedGemm<Q: Fp8Element>: Fp8Element {
    #[doc(hidden)]
    fn quantized_variants() -> &'static [&'static KernelSpec];
    #[doc(hidden)]
    #[allow(clippy::too_many_arguments)]
    fn fast_q(
        d: &Device, g: Grid, variant: usize, a: &View<Self>, b: &View<F8E4M3>, c: &mut Tensor<Q>, sa: &View<f32>, sb: &View<f32>,
        bias: &impl GlobalArg<bf16>, scale_c: &View<f32>, amax: &mut impl GlobalArgMut<f32>, epi: (i32, i32, i32, i32),
    ) -> Result<()>;
    #[doc(hidden)]
    #[allow(clippy::too_many_arguments)]
    fn promoted_q(
        d: &Device, g: Grid, a: &View<Self>, b: &View<F8E4M3>, c: &mut Tensor<Q>, sa: &View<f32>, sb: &View<f32>,
        bias: &impl GlobalArg<bf16>, scale_c: &View<f32>, amax: &mut impl GlobalArgMut<f32>, epi: (i32, i32, i32, i32, i32),
    ) -> Result<()>;
}

macro_rules! fp8_quantized_gemm {
    ($a:ty, $q:ty, $fast:ident, $promoted:ident) => {
        impl Fp8QuantizedGemm<$q> for $a {
            fn quantized_variants() -> &'static [&'static KernelSpec] {
                $fast::VARIANTS
            }
            fn fast_q(
                d: &Device, g: Grid, variant: usize, a: &View<Self>, b: &View<F8E4M3>, c: &mut Tensor<$q>, sa: &View<f32>, sb: &View<f32>,
                bias: &impl GlobalArg<bf16>, scale_c: &View<f32>, amax: &mut impl GlobalArgMut<f32>,
                (bias_kind, act, cols, amax_on): (i32, i32, i32, i32),
            ) -> Result<()> {
                let [m, n] = [c.shape()[0], c.shape()[1]];
                let mut c = c.view_mut(&[1, m, n], &[m * n, n, 1])?;
                let mut counter = d.tile_counter()?;
                let epi = (bias_kind, act, cols, amax_on);
                $fast::launch_variant(variant, d, g, a, b, &mut c, sa, sb, bias, scale_c, amax, &mut counter, epi.0, epi.1, epi.2, epi.3)
            }
            fn promoted_q(
                d: &Device, g: Grid, a: &View<Self>, b: &View<F8E4M3>, c: &mut Tensor<$q>, sa: &View<f32>, sb: &View<f32>,
                bias: &impl GlobalArg<bf16>, scale_c: &View<f32>, amax: &mut impl GlobalArgMut<f32>,
                (per_block, bias_kind, act, cols, amax_on): (i32, i32, i32, i32, i32),
            ) -> Result<()> {
                let [m, n] = [c.shape()[0], c.shape()[1]];
                let mut c = c.view_mut(&[1, m, n], &[m * n, n, 1])?;
                let mut counter = d.tile_counter()?;
                let epi = (per_block, bias_kind, act, cols, amax_on);
                $promoted::launch(d, g, a, b, &mut c, sa, sb, bias, scale_c, amax, &mut counter, epi.0, epi.1, epi.2, epi.3, epi.4)
            }
        }
    };
}
fp8_quantized_gemm!(F8E4M3, F8E4M3, gemm_fp8_q_f8e4m3_f8e4m3, gemm_fp8_promoted_q_f8e4m3_f8e4m3);
fp8_quantized_gemm!(F8E4M3, tessera::F8E5M2, gemm_fp8_q_f8e4m3_f8e5m2, gemm_fp8_promoted_q_f8e4m3_f8e5m2);
fp8_quantized_gemm!(tessera::F8E5M2, F8E4M3, gemm_fp8_q_f8e5m2_f8e4m3, gemm_fp8_promoted_q_f8e5m2_f8e4m3);
fp8_quantized_gemm!(tessera::F8E5M2, tessera::F8E5M2, gemm_fp8_q_f8e5m2_f8e5m2, gemm_fp8_promoted_q_f8e5m2_f8e5m2);

/// An fp8 GEMM `C = act((A ∘ scale_a)·(B ∘ scale_b)ᵀ + bias)`, built with [`gemm_fp8`] and run
/// with [`Fp8GemmBuilder::run`]: A `[M, K]` in e4m3 (activations, weights) or e5m2
/// (gradients), B `[N, K]` in e4m3, C `[M, N]` in bf16 or f16, accumulating in f32.
///
/// ```no_run
/// use tessera::{bf16, Device, Tensor, F8E4M3};
/// use tessera_kernels::{gemm_fp8, Fp8Scaling};
/// let dev = Device::new(0)?;
/// let x = Tensor::<F8E4M3>::zeros(&dev, &[512, 4096])?; // activations, M×K
/// let w = Tensor::<F8E4M3>::zeros(&dev, &[4096, 4096])?; // weights, N×K
/// let (sx, sw) = (Tensor::from_host(&dev, &[0.5f32; 512], &[512])?, Tensor::from_host(&dev, &[0.01f32; 4096], &[4096])?);
/// let mut y = Tensor::<bf16>::zeros(&dev, &[512, 4096])?;
/// gemm_fp8(&x, &w, Fp8Scaling::Rowwise { a: &sx, b: &sw }).run(&dev, &mut y)?;
/// # Ok::<(), tessera::Error>(())
/// ```
#[derive(Clone, Copy, Debug)]
pub struct Fp8GemmBuilder<'t, A: Fp8Element, U: tessera::Element> {
    a: &'t Tensor<A>,
    b: &'t Tensor<F8E4M3>,
    scaling: Fp8Scaling<'t>,
    bias: Option<Bias<'t, U>>,
    activation: Activation,
    fast: bool,
    variant: Option<&'t str>,
}

/// Starts an fp8 GEMM `C = (A ∘ scale_a)·(B ∘ scale_b)ᵀ` with A (M×K, e4m3 or e5m2) and B
/// (N×K, e4m3) scaled as `scaling` says.
pub fn gemm_fp8<'t, A: Fp8Element, U: tessera::Element>(
    a: &'t Tensor<A>, b: &'t Tensor<F8E4M3>, scaling: Fp8Scaling<'t>,
) -> Fp8GemmBuilder<'t, A, U> {
    Fp8GemmBuilder { a, b, scaling, bias: None, activation: Activation::None, fast: false, variant: None }
}

/// The variants of the fp8 GEMM's epilogue-scaled kernel for A in `A`, C in `U` (`BN` 256,
/// then 128): [`Fp8GemmBuilder::variant`] forces one, the tuner picks among them otherwise.
pub fn gemm_fp8_variants<A: Fp8Gemm<U>, U: tessera::Element>() -> Vec<&'static str> {
    A::fast_variants().iter().map(|s| s.name).collect()
}

fn arg(name: &str, expected: String, found: String) -> Error {
    Error::Argument { kernel: "gemm_fp8", arg: name.into(), expected, found }
}

/// K of an fp8 GEMM: a multiple of 16, so that A's and B's rows are whole 16-byte units TMA
/// copies (`kernel` names the caller in the error).
pub(crate) fn check_fp8_k(kernel: &'static str, k: usize) -> Result<()> {
    if k.is_multiple_of(16) {
        return Ok(());
    }
    Err(Error::Argument {
        kernel,
        arg: "a".into(),
        expected: "K a multiple of 16 (rows of 16-byte multiples, for TMA)".into(),
        found: format!("K = {k}"),
    })
}

/// `x` (`[rows, cols]`, fp8) as the rank-3 view TMA copies: rows 16-byte aligned.
fn operand<'t, T: tessera::Element>(name: &str, x: &'t Tensor<T>, rows: usize, cols: usize) -> Result<View<'t, T>> {
    let st = x.strides();
    if st[1] != 1 || !st[0].is_multiple_of(16) || !x.offset().is_multiple_of(16) {
        return Err(arg(
            name,
            "rows TMA can copy: unit column stride, a row stride and offset of a multiple of 16 fp8 elements".into(),
            format!("strides {st:?} at offset {}", x.offset()),
        ));
    }
    x.view(&[1, rows, cols], &[(rows * st[0]).max(16), st[0], 1])
}

/// The scales as the kernels read them: `scale_a` 2-D `[M, ⌈K/128⌉]` for the promoted kernel
/// (else 1-D `[M]`), `scale_b` `[⌈N/128⌉, ⌈K/128⌉]` per block or `[1, N]` (else `[N]`).
fn scale_view<'t>(name: &str, t: &'t Tensor<f32>, want: &[usize], view: &[usize], strides: &[usize]) -> Result<View<'t, f32>> {
    if t.shape() != want {
        return Err(arg(name, format!("an f32 tensor of shape {want:?}"), format!("shape {:?}", t.shape())));
    }
    if !t.is_contiguous() {
        return Err(arg(name, "a contiguous tensor".into(), format!("strides {:?}", t.strides())));
    }
    t.view(view, strides)
}

impl<'t, A: Fp8Element, U: tessera::Element> Fp8GemmBuilder<'t, A, U> {
    /// Adds a bias per column (`[N]`) or per row (`[M]`) of C, after the scales.
    pub fn bias(mut self, bias: Bias<'t, U>) -> Self {
        self.bias = Some(bias);
        self
    }

    /// Applies an activation after the bias.
    pub fn activation(mut self, activation: Activation) -> Self {
        self.activation = activation;
        self
    }

    /// Tensorwise and rowwise scaling: `true` keeps wgmma's own fp8 sums over all of K (as
    /// cuBLASLt's fast accumulation, torch's `use_fast_accum=True`: faster, but those sums keep
    /// fewer bits than f32 — 25% off at K = 16384 where the products share a sign, 0.3% on
    /// random signs); `false` (the default) ends them every 128 columns of K and adds them into
    /// f32 registers (the promoted kernel, 128×128 tiles). Blockwise scaling always promotes:
    /// `true` is an error there.
    pub fn fast_accumulation(mut self, fast: bool) -> Self {
        self.fast = fast;
        self
    }

    /// Runs the fast-accumulation kernel's variant named `name` (one of
    /// [`gemm_fp8_variants`]), for benchmarks and tests of one schedule; an error without
    /// `fast_accumulation(true)`.
    pub fn variant(mut self, name: &'t str) -> Self {
        self.variant = Some(name);
        self
    }

    /// Runs it into `c` (`[M, N]`, contiguous; bf16, f16 or f32 — an f32 C's bias is f32).
    ///
    /// Any M, N ≥ 1; K a multiple of 16 (TMA copies A's and B's fp8 rows, 16-byte multiples).
    /// Where a 16-bit C's rows are not 16-byte multiples (N not a multiple of 8), the kernel
    /// writes a padded C that is then copied into `c`; an f32 C takes N a multiple of 4 (and
    /// 128×128 tiles, and 4 stages where promoted: its staging buffers are twice as large).
    /// Hopper (sm_90a) only.
    ///
    /// # Errors
    /// [`Error::Argument`] naming the tensor when a shape, a scale's shape or an alignment does
    /// not match, on a device other than Hopper, or for a variant that does not exist; and the
    /// launch's own checks.
    pub fn run(self, device: &Device, c: &mut Tensor<U>) -> Result<()>
    where
        A: Fp8Gemm<U>,
    {
        let p = self.prepare(device, A::fast_variants()[0], c.shape())?;
        // C's rows leave by TMA stores: where they are not 16-byte multiples (N not a multiple
        // of 8) or C starts off 16 bytes, the kernels write a padded C, copied into `c` after.
        let mut padded = A::padded_output(device, c, p.m, p.n)?;
        let n8 = padded.as_ref().map_or(p.n, |t| t.shape()[1]);
        let c_shape = [1, p.m, n8];
        let bias = Optional(p.bias.as_ref(), 1);
        let (bias_kind, act) = (p.bias_kind, self.activation.code());
        match &p.scales {
            &Scales::Promoted { ref sa, ref sb, per_block } => {
                let out = padded.as_mut().unwrap_or(c);
                A::promoted(device, p.tiles(device, n8, 128), &p.a, &p.b, out, c_shape, sa, sb, &bias, (per_block, bias_kind, act))?;
            }
            Scales::Fast { sa, sb } => {
                let variants = A::fast_variants();
                let run = |i: usize, c: &mut Tensor<U>| {
                    let g = p.tiles(device, n8, variants[i].knob("BN").unwrap_or(256) as usize);
                    A::fast(device, g, i, &p.a, &p.b, c, c_shape, sa, sb, &bias, (bias_kind, act))
                };
                let choice = self.fast_variant(device, "gemm_fp8", (A::DTYPE, U::DTYPE), variants, &p, n8, &run)?;
                run(choice, padded.as_mut().unwrap_or(c))?;
            }
        }
        A::unpad_output(device, padded, c, p.m, p.n)
    }

    /// Checks the operands against each other and C's shape `c_shape`, and views them as the
    /// kernels read them.
    fn prepare(&self, device: &Device, spec: &KernelSpec, c_shape: &[usize]) -> Result<Prepared<'t, A, U>> {
        let (m, k) = crate::check_2d("gemm_fp8", "a", self.a)?;
        let (n, kb) = crate::check_2d("gemm_fp8", "b", self.b)?;
        if kb != k {
            return Err(arg("b", format!("N×{k} (K = {k}, as a's)"), format!("shape {:?}", self.b.shape())));
        }
        if c_shape != [m, n] {
            return Err(arg("c", format!("shape [{m}, {n}] (M×N)"), format!("shape {c_shape:?}")));
        }
        if m == 0 || n == 0 || k == 0 {
            return Err(arg("a", "M, N and K ≥ 1".into(), format!("M={m}, N={n}, K={k}")));
        }
        check_fp8_k("gemm_fp8", k)?;
        super::check_hopper("gemm_fp8", device, spec)?;
        let a = operand("a", self.a, m, k)?;
        let b = operand("b", self.b, n, k)?;
        let (bias_kind, bias) = match self.bias {
            None => (0, None),
            Some(Bias::PerColumn(t)) => {
                crate::check_shape("gemm_fp8", "bias", t, &[n])?;
                (1, Some(t.view(t.shape(), t.strides())?))
            }
            Some(Bias::PerRow(t)) => {
                crate::check_shape("gemm_fp8", "bias", t, &[m])?;
                (2, Some(t.view(t.shape(), t.strides())?))
            }
        };
        let (kb, nb) = (k.div_ceil(128), n.div_ceil(128));
        let (sa, sb, want_a, want_b) = match self.scaling {
            Fp8Scaling::Tensorwise { a, b } => (a, b, vec![1], vec![1]),
            Fp8Scaling::Rowwise { a, b } => (a, b, vec![m], vec![n]),
            Fp8Scaling::Blockwise { a, b } => (a, b, vec![m, kb], vec![nb, kb]),
        };
        // Per tensor: stride-0 views of the one element; per row: a stride along M (and N).
        let s = usize::from(matches!(self.scaling, Fp8Scaling::Rowwise { .. }));
        let blockwise = matches!(self.scaling, Fp8Scaling::Blockwise { .. });
        if blockwise && self.fast {
            return Err(arg("scaling", "tensorwise or rowwise scales with fast accumulation".into(), "blockwise".into()));
        }
        if let (Some(v), false) = (self.variant, self.fast) {
            return Err(arg("variant", "fast_accumulation(true) to name a variant".into(), format!("`{v}` without it")));
        }
        let scales = if !self.fast {
            let (sa, sb, per_block) = if blockwise {
                (scale_view("scale_a", sa, &want_a, &[m, kb], &[kb, 1])?, scale_view("scale_b", sb, &want_b, &[nb, kb], &[kb, 1])?, 1)
            } else {
                (scale_view("scale_a", sa, &want_a, &[m, kb], &[s, 0])?, scale_view("scale_b", sb, &want_b, &[1, n], &[0, s])?, 0)
            };
            Scales::Promoted { sa, sb, per_block }
        } else {
            Scales::Fast { sa: scale_view("scale_a", sa, &want_a, &[m], &[s])?, sb: scale_view("scale_b", sb, &want_b, &[n], &[s])? }
        };
        Ok(Prepared { m, n, k, a, b, bias, bias_kind, scales })
    }

    /// The fast kernel `kernel`'s variant to run for A and C of `dtypes`: the one forced, or the
    /// tuner's choice (128×256 tiles unless too few of them fill the GPU).
    #[allow(clippy::too_many_arguments)]
    fn fast_variant<C: tessera::Element>(
        &self, device: &Device, kernel: &'static str, dtypes: (tessera::DType, tessera::DType), variants: &[&KernelSpec],
        p: &Prepared<'t, A, U>, n8: usize, run: &dyn Fn(usize, &mut Tensor<C>) -> Result<()>,
    ) -> Result<usize> {
        let (shape, epilogue) = ([p.m, p.n, p.k], (p.bias_kind, self.activation));
        let key = tessera::TuneKey::new(kernel, device).field("dtypes", &dtypes).field("shape", &shape).field("epilogue", &epilogue);
        let names: Vec<&str> = variants.iter().map(|v| v.name).collect();
        let few = Grid::tiles(p.m, 128).saturating_mul(Grid::tiles(n8, 256)) as usize * 4 < device.sm_count() as usize;
        let default = if few { names.len() - 1 } else { 0 };
        crate::gemm::pick_variant(device, kernel, &key, &names, default, self.variant, &[p.m, n8], run)
    }
}

impl<'t, A: Fp8Element> Fp8GemmBuilder<'t, A, bf16> {
    /// Runs it into an fp8 `c` (`[M, N]`, e4m3 or e5m2, contiguous): `C = Q(act(A·Bᵀ · scales +
    /// bias) · scale[0])`, rounded to nearest and saturating as [`quantize_fp8`](crate::quantize_fp8)
    /// does, the bias in bf16; and where `amax` is given, `amax[0]` ← the largest |value| of C
    /// before `scale` (overwritten, not combined with what it held: the delayed-scaling recipes'
    /// amax of this output, from which a later `scale` is made). `scale` and `amax` are
    /// one-element f32 tensors on the device: no host sync.
    ///
    /// Any M ≥ 1; N a multiple of 16 and `c` 16-byte aligned (C's fp8 rows leave by TMA stores);
    /// K a multiple of 16. Hopper (sm_90a) only.
    ///
    /// # Errors
    /// As [`Fp8GemmBuilder::run`]; and [`Error::Argument`] naming `c`, `scale` or `amax` when
    /// their shape or alignment does not match.
    pub fn run_fp8<Q: Fp8Element>(
        self, device: &Device, c: &mut Tensor<Q>, scale: &Tensor<f32>, amax: Option<&mut Tensor<f32>>,
    ) -> Result<()>
    where
        A: Fp8QuantizedGemm<Q>,
    {
        let p = self.prepare(device, A::quantized_variants()[0], c.shape())?;
        if !p.n.is_multiple_of(16) || !c.offset().is_multiple_of(16) || !c.is_contiguous() {
            return Err(arg(
                "c",
                "a contiguous fp8 C with N a multiple of 16 from a 16-byte aligned offset (its rows leave by TMA stores)".into(),
                format!("shape {:?}, strides {:?}, offset {}", c.shape(), c.strides(), c.offset()),
            ));
        }
        let scale_c = scale_view("scale", scale, &[1], &[1], &[1])?;
        let mut amax = match amax {
            Some(t) => {
                if t.shape() != [1] {
                    return Err(arg("amax", "an f32 tensor of shape [1]".into(), format!("shape {:?}", t.shape())));
                }
                // Overwritten: cleared here, then every block keeps its chunks' maxima.
                t.fill_zeros()?;
                Some(t.view_mut(&[1, 1], &[1, 1])?)
            }
            None => None,
        };
        let amax_on = i32::from(amax.is_some());
        let mut amax = OptionalMut(amax.as_mut(), 2);
        let bias = Optional(p.bias.as_ref(), 1);
        let (bias_kind, act, cols) = (p.bias_kind, self.activation.code(), p.n as i32);
        match &p.scales {
            &Scales::Promoted { ref sa, ref sb, per_block } => {
                let epi = (per_block, bias_kind, act, cols, amax_on);
                A::promoted_q(device, p.tiles(device, p.n, 128), &p.a, &p.b, c, sa, sb, &bias, &scale_c, &mut amax, epi)
            }
            Scales::Fast { sa, sb } => {
                let variants = A::quantized_variants();
                let grid = |i: usize| p.tiles(device, p.n, variants[i].knob("BN").unwrap_or(256) as usize);
                // (The tuner's trials write scratch, not `amax`.)
                let trial = |i: usize, c: &mut Tensor<Q>| {
                    A::fast_q(device, grid(i), i, &p.a, &p.b, c, sa, sb, &bias, &scale_c, &mut Absent(2), (bias_kind, act, cols, 0))
                };
                let choice = self.fast_variant(device, "gemm_fp8_q", (A::DTYPE, Q::DTYPE), variants, &p, p.n, &trial)?;
                A::fast_q(device, grid(choice), choice, &p.a, &p.b, c, sa, sb, &bias, &scale_c, &mut amax, (bias_kind, act, cols, amax_on))
            }
        }
    }
}

/// How the kernels read an fp8 GEMM's scales.
enum Scales<'t> {
    /// The promoted kernel's: `scale_a` `[M, ⌈K/128⌉]`, `scale_b` per 128×128 block (`per_block`
    /// 1) or `[1, N]` (0).
    Promoted { sa: View<'t, f32>, sb: View<'t, f32>, per_block: i32 },
    /// The fast kernel's: `scale_a` `[M]`, `scale_b` `[N]` (stride 0 for one per tensor).
    Fast { sa: View<'t, f32>, sb: View<'t, f32> },
}

/// An fp8 GEMM's operands, checked and viewed as the kernels read them.
struct Prepared<'t, A: tessera::Element, U: tessera::Element> {
    m: usize,
    n: usize,
    k: usize,
    a: View<'t, A>,
    b: View<'t, F8E4M3>,
    bias: Option<View<'t, U>>,
    bias_kind: i32,
    scales: Scales<'t>,
}

impl<A: tessera::Element, U: tessera::Element> Prepared<'_, A, U> {
    /// The persistent grid over C's 128×`bn` tiles (`n8` columns): at most one block an SM.
    fn tiles(&self, device: &Device, n8: usize, bn: usize) -> Grid {
        Grid::tiles(self.m, 128).saturating_mul(Grid::tiles(n8, bn)).min(device.sm_count()).into()
    }
}
