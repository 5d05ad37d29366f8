//! GEMM on Hopper: TMA into a 4-stage shared ring, one producer and two consumer warpgroups,
//! wgmma m64n256k16 accumulating in f32, the epilogue fused in registers. The kernels are in
//! [`kernels`](self) (DSL source: `gemm/kernels.rs`); this is the host side: shapes, batches,
//! B's layout, padding for TMA, the epilogue's options.

mod bsr;
mod fp8;
mod grouped;
mod kernels;

pub use kernels::{
    bias_gelu_bf16, gemm_nn_bf16, gemm_nn_f16, gemm_nn_full_bf16, gemm_nn_full_f16, gemm_small_m_bf16, gemm_small_m_f16, gemm_tn_bf16,
    gemm_tn_f16, gemm_tn_full_bf16, gemm_tn_full_f16, gemm_tn_triangle_bf16, gemm_tn_triangle_f16, pad_copy_bf16, pad_copy_f16,
};

pub use bsr::{
    gemm_bsr, gemm_bsr64_bf16, gemm_bsr64_f16, gemm_bsr_bf16, gemm_bsr_f16, gemm_bsr_variants, Bsr, BsrGemmBuilder, BSR_BLOCK, BSR_BLOCKS,
};
pub use fp8::{
    gemm_fp8, gemm_fp8_f32_f8e4m3, gemm_fp8_f32_f8e5m2, gemm_fp8_f8e4m3_bf16, gemm_fp8_f8e4m3_f16, gemm_fp8_f8e5m2_bf16,
    gemm_fp8_f8e5m2_f16, gemm_fp8_promoted_f32_f8e4m3, gemm_fp8_promoted_f32_f8e5m2, gemm_fp8_promoted_f8e4m3_bf16,
    gemm_fp8_promoted_f8e4m3_f16, gemm_fp8_promoted_f8e5m2_bf16, gemm_fp8_promoted_f8e5m2_f16, gemm_fp8_promoted_q_f8e4m3_f8e4m3,
    gemm_fp8_promoted_q_f8e4m3_f8e5m2, gemm_fp8_promoted_q_f8e5m2_f8e4m3, gemm_fp8_promoted_q_f8e5m2_f8e5m2, gemm_fp8_q_f8e4m3_f8e4m3,
    gemm_fp8_q_f8e4m3_f8e5m2, gemm_fp8_q_f8e5m2_f8e4m3, gemm_fp8_q_f8e5m2_f8e5m2, gemm_fp8_variants, Fp8Gemm, Fp8GemmBuilder,
    Fp8GroupedGemm, Fp8QuantizedGemm, Fp8Scaling,
};
pub use grouped::{
    gemm_fp8_grouped, gemm_fp8_grouped_f8e4m3_bf16, gemm_fp8_grouped_f8e4m3_f16, gemm_fp8_grouped_f8e5m2_bf16, gemm_fp8_grouped_f8e5m2_f16,
    gemm_fp8_grouped_promoted_f8e4m3_bf16, gemm_fp8_grouped_promoted_f8e4m3_f16, gemm_fp8_grouped_promoted_f8e5m2_bf16,
    gemm_fp8_grouped_promoted_f8e5m2_f16, gemm_fp8_grouped_variants, gemm_grouped, gemm_grouped_bf16, gemm_grouped_f16,
    gemm_grouped_nn_bf16, gemm_grouped_nn_f16, gemm_grouped_variants, Fp8GroupedGemmBuilder, Fp8GroupedScaling, GroupedGemmBuilder,
    GROUPED_GEMM_MAX_EXPERTS,
};
use tessera::{bf16, f16, Device, Element, Error, Grid, KernelSpec, Result, Target, Tensor, TensorView};

/// The activation of a GEMM's epilogue.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum Activation {
    /// None.
    #[default]
    None,
    /// `0.5·x·(1 + tanh(√(2/π)·(x + 0.044715·x³)))`.
    GeluTanh,
    /// `0.5·x·(1 + erf(x/√2))`.
    GeluErf,
    /// `x·σ(x)`.
    Silu,
}

impl Activation {
    pub(crate) fn code(self) -> i32 {
        match self {
            Activation::None => 0,
            Activation::GeluTanh => 1,
            Activation::GeluErf => 2,
            Activation::Silu => 3,
        }
    }
}

/// A bias added in a GEMM's epilogue.
#[derive(Clone, Copy, Debug)]
pub enum Bias<'t, T: Element = bf16> {
    /// One value per column of C (length N): the usual linear-layer bias.
    PerColumn(&'t Tensor<T>),
    /// One value per row of C (length M).
    PerRow(&'t Tensor<T>),
}

/// The triangle of C that [`GemmBuilder::triangular_only`] computes.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Triangle {
    /// Elements with column ≤ row.
    Lower,
    /// Elements with column ≥ row.
    Upper,
}

/// How B is stored.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum BLayout {
    /// N×K row-major, `C = A·Bᵀ` (the "TN" layout of LLM weights).
    #[default]
    NxK,
    /// K×N row-major, `C = A·B`.
    KxN,
}

type View<'a, T> = TensorView<'a, T>;

/// An element type the GEMM takes: `bf16` or `f16` (each has its compiled kernels).
pub trait GemmElement: Element + sealed::Sealed {
    #[doc(hidden)]
    fn fast_kernel(kn: bool) -> &'static KernelSpec;
    /// The fast kernel's variants (`tune(BN, STAGES)`), the default first.
    #[doc(hidden)]
    fn fast_variants(kn: bool) -> &'static [&'static KernelSpec];
    #[doc(hidden)]
    fn full_kernel(kn: bool) -> &'static KernelSpec;
    #[doc(hidden)]
    #[allow(clippy::too_many_arguments)]
    fn gemm(
        d: &Device, g: Grid, kn: bool, variant: usize, a: &View<Self>, b: &View<Self>, c: &mut Tensor<Self>, c_shape: [usize; 3],
        bias: &View<Self>, epi: (f32, i32, i32),
    ) -> Result<()>;
    #[doc(hidden)]
    #[allow(clippy::too_many_arguments)]
    fn gemm_full(
        d: &Device, g: Grid, kn: bool, a: &View<Self>, b: &View<Self>, c: &mut Tensor<Self>, c_shape: [usize; 3], c_in: &View<Self>,
        bias: &View<Self>, residual: &View<Self>, scalars: (f32, f32, i32, i32, i32),
    ) -> Result<()>;
    #[doc(hidden)]
    fn pad_copy(d: &Device, g: Grid, x: &View<Self>, y: &mut Tensor<Self>) -> Result<()>;
    /// The triangle kernel's variants (`tune(BN)`), the default first.
    #[doc(hidden)]
    fn triangle_variants() -> &'static [&'static KernelSpec];
    #[doc(hidden)]
    #[allow(clippy::too_many_arguments)]
    fn gemm_triangle(
        d: &Device, g: Grid, variant: usize, a: &View<Self>, b: &View<Self>, c: &mut Tensor<Self>, c_shape: [usize; 3], bias: &View<Self>,
        epi: (f32, i32, i32), upper: bool,
    ) -> Result<()>;
    /// The grouped kernel's variants (`tune(BN, BM)`) for B `[E, N, K]` or (`kn`) `[E, K, N]`.
    #[doc(hidden)]
    fn grouped_variants(kn: bool) -> &'static [&'static KernelSpec];
    #[doc(hidden)]
    #[allow(clippy::too_many_arguments)]
    fn gemm_grouped(
        d: &Device, g: Grid, kn: bool, variant: usize, a: &View<Self>, b: &View<Self>, ends: &View<i32>, c: &mut Tensor<Self>,
        c_shape: [usize; 3], epi: (f32, i32),
    ) -> Result<()>;
    /// The block-sparse kernel's variants (`tune(BN)`), the default first: for 64×64 blocks
    /// where `block64`, else 128×128.
    #[doc(hidden)]
    fn bsr_variants(block64: bool) -> &'static [&'static KernelSpec];
    #[doc(hidden)]
    fn small_m_variants() -> &'static [&'static KernelSpec];
    #[doc(hidden)]
    #[allow(clippy::too_many_arguments)]
    fn gemm_bsr(
        d: &Device, g: Grid, block64: bool, variant: usize, a: (&View<Self>, &View<i32>, &View<i32>), b: &View<Self>, c: &mut Tensor<Self>,
        c_shape: [usize; 3], epi: (f32, i32),
    ) -> Result<()>;
    /// The small-M path (`gemm_small_m`, X in chunks of `MN` rows, K in `splits`).
    #[doc(hidden)]
    #[allow(clippy::too_many_arguments)]
    fn gemm_small_m(
        d: &Device, a: &View<Self>, b: &View<Self>, c: &mut Tensor<Self>, c_shape: [usize; 3], bias: &View<Self>, epi: (f32, i32, i32),
        mn_splits: (usize, usize),
    ) -> Result<()>;
}

mod sealed {
    pub trait Sealed {}
    impl Sealed for tessera::bf16 {}
    impl Sealed for tessera::f16 {}
}

/// `[batch, rows, cols]` row-major strides.
fn strides3(s: [usize; 3]) -> [usize; 3] {
    [s[1] * s[2], s[2], 1]
}

macro_rules! gemm_element {
    ($t:ty, $tn:ident, $nn:ident, $full:ident, $nn_full:ident, $pad:ident, $small:ident, $tri:ident, $grouped:ident, $grouped_nn:ident, $bsr:ident, $bsr64:ident) => {
        impl GemmElement for $t {
            fn fast_kernel(kn: bool) -> &'static KernelSpec {
                if kn {
                    &$nn::SPEC
                } else {
                    &$tn::SPEC
                }
            }
            fn fast_variants(kn: bool) -> &'static [&'static KernelSpec] {
                if kn {
                    $nn::VARIANTS
                } else {
                    $tn::VARIANTS
                }
            }
            fn full_kernel(kn: bool) -> &'static KernelSpec {
                if kn {
                    &$nn_full::SPEC
                } else {
                    &$full::SPEC
                }
            }
            fn gemm(
                d: &Device, g: Grid, kn: bool, variant: usize, a: &View<Self>, b: &View<Self>, c: &mut Tensor<Self>, c_shape: [usize; 3],
                bias: &View<Self>, epi: (f32, i32, i32),
            ) -> Result<()> {
                let mut c = c.view_mut(&c_shape, &strides3(c_shape))?;
                let (alpha, bias_kind, act) = epi;
                let mut counter = d.tile_counter()?;
                if kn {
                    $nn::launch_variant(variant, d, g, a, b, &mut c, bias, &mut counter, alpha, bias_kind, act)
                } else {
                    $tn::launch_variant(variant, d, g, a, b, &mut c, bias, &mut counter, alpha, bias_kind, act)
                }
            }
            fn gemm_full(
                d: &Device, g: Grid, kn: bool, a: &View<Self>, b: &View<Self>, c: &mut Tensor<Self>, c_shape: [usize; 3],
                c_in: &View<Self>, bias: &View<Self>, residual: &View<Self>,
                (alpha, beta, bias_kind, act, residual_op): (f32, f32, i32, i32, i32),
            ) -> Result<()> {
                let mut c = c.view_mut(&c_shape, &strides3(c_shape))?;
                if kn {
                    $nn_full::launch(d, g, a, b, &mut c, c_in, bias, residual, alpha, beta, bias_kind, act, residual_op)
                } else {
                    $full::launch(d, g, a, b, &mut c, c_in, bias, residual, alpha, beta, bias_kind, act, residual_op)
                }
            }
            fn pad_copy(d: &Device, g: Grid, x: &View<Self>, y: &mut Tensor<Self>) -> Result<()> {
                $pad::launch(d, g, x, y)
            }
            fn triangle_variants() -> &'static [&'static KernelSpec] {
                $tri::VARIANTS
            }
            fn gemm_triangle(
                d: &Device, g: Grid, variant: usize, a: &View<Self>, b: &View<Self>, c: &mut Tensor<Self>, c_shape: [usize; 3],
                bias: &View<Self>, (alpha, bias_kind, act): (f32, i32, i32), upper: bool,
            ) -> Result<()> {
                let mut c = c.view_mut(&c_shape, &strides3(c_shape))?;
                let mut counter = d.tile_counter()?;
                $tri::launch_variant(variant, d, g, a, b, &mut c, bias, &mut counter, alpha, bias_kind, act, i32::from(upper))
            }
            fn grouped_variants(kn: bool) -> &'static [&'static KernelSpec] {
                if kn {
                    $grouped_nn::VARIANTS
                } else {
                    $grouped::VARIANTS
                }
            }
            fn gemm_grouped(
                d: &Device, g: Grid, kn: bool, variant: usize, a: &View<Self>, b: &View<Self>, ends: &View<i32>, c: &mut Tensor<Self>,
                c_shape: [usize; 3], (alpha, act): (f32, i32),
            ) -> Result<()> {
                let mut c = c.view_mut(&c_shape, &strides3(c_shape))?;
                let mut counter = d.tile_counter()?;
                if kn {
                    $grouped_nn::launch_variant(variant, d, g, a, b, &mut c, ends, &mut counter, alpha, act)
                } else {
                    $grouped::launch_variant(variant, d, g, a, b, &mut c, ends, &mut counter, alpha, act)
                }
            }
            fn small_m_variants() -> &'static [&'static KernelSpec] {
                $small::VARIANTS
            }
            fn bsr_variants(block64: bool) -> &'static [&'static KernelSpec] {
                if block64 {
                    $bsr64::VARIANTS
                } else {
                    $bsr::VARIANTS
                }
            }
            fn gemm_bsr(
                d: &Device, g: Grid, block64: bool, variant: usize, (values, row_ptr, col_idx): (&View<Self>, &View<i32>, &View<i32>),
                b: &View<Self>, c: &mut Tensor<Self>, c_shape: [usize; 3], (alpha, act): (f32, i32),
            ) -> Result<()> {
                let mut c = c.view_mut(&c_shape, &strides3(c_shape))?;
                let mut counter = d.tile_counter()?;
                if block64 {
                    $bsr64::launch_variant(variant, d, g, values, row_ptr, col_idx, b, &mut c, &mut counter, alpha, act)
                } else {
                    $bsr::launch_variant(variant, d, g, values, row_ptr, col_idx, b, &mut c, &mut counter, alpha, act)
                }
            }
            fn gemm_small_m(
                d: &Device, a: &View<Self>, b: &View<Self>, c: &mut Tensor<Self>, c_shape: [usize; 3], bias: &View<Self>,
                (alpha, bias_kind, act): (f32, i32, i32), (mn, splits): (usize, usize),
            ) -> Result<()> {
                let [batch, m, n] = c_shape;
                let all = Self::small_m_variants();
                let variant = (0..all.len())
                    .find(|&i| all[i].knob("MN") == Some(mn as i64))
                    .ok_or_else(|| arg("variant", "a small-M width of 16, 32, 64, 128 or 256".into(), format!("{mn}")))?;
                let units = batch * n.div_ceil(128) * m.div_ceil(mn);
                let blocks = (units * splits).min(d.sm_count() as usize);
                // Split, the sums and the arrival counters are the device's kept-zeroed
                // buffers (no allocation, no clearing pass: the last arrival clears them).
                // (The sums' rows padded to 16 bytes, as TMA asks.)
                let mp = m.next_multiple_of(4);
                let mut ws = d.zeroed_workspace(if splits > 1 { batch * n * mp } else { 4 })?;
                let mut count = d.zeroed_counters(if splits > 1 { units * 2 } else { 1 })?;
                let mut sum_t = if splits > 1 { ws.view(&[batch, n, m], &[n * mp, mp, 1])? } else { ws.view(&[1, 1, 1], &[4, 4, 1])? };
                // C and the bias as the kernel's transposed tiles see them.
                let mut c_t = c.view_mut(&[batch, n, m], &[m * n, 1, n])?;
                let kind_t = [0, 2, 1].get(bias_kind as usize).copied().unwrap_or(0);
                let g = Grid::from(blocks as u32);
                $small::launch_variant(variant, d, g, a, b, &mut c_t, bias, &mut sum_t, &mut count, splits as i32, alpha, kind_t, act)
            }
        }
    };
}
gemm_element!(
    bf16,
    gemm_tn_bf16,
    gemm_nn_bf16,
    gemm_tn_full_bf16,
    gemm_nn_full_bf16,
    pad_copy_bf16,
    gemm_small_m_bf16,
    gemm_tn_triangle_bf16,
    gemm_grouped_bf16,
    gemm_grouped_nn_bf16,
    gemm_bsr_bf16,
    gemm_bsr64_bf16
);
gemm_element!(
    f16,
    gemm_tn_f16,
    gemm_nn_f16,
    gemm_tn_full_f16,
    gemm_nn_full_f16,
    pad_copy_f16,
    gemm_small_m_f16,
    gemm_tn_triangle_f16,
    gemm_grouped_f16,
    gemm_grouped_nn_f16,
    gemm_bsr_f16,
    gemm_bsr64_f16
);

/// A GEMM `C = act(alpha·A·Bᵀ + beta·C_in + bias) + residual` (or `A·B` with
/// [`BLayout::KxN`]; or `· gate` in place of `+ residual`), built with [`gemm`] and run with
/// [`GemmBuilder::run`]. Every epilogue step is fused on the accumulator in registers.
///
/// Matrices are 2-D; 3-D tensors `[batch, rows, cols]` make a strided batch (each of A, B, C,
/// C_in and the residual with the same batch).
///
/// ```no_run
/// use tessera::{bf16, Device, Tensor};
/// use tessera_kernels::{gemm, Activation, Bias};
/// let dev = Device::new(0)?;
/// let x = Tensor::<bf16>::zeros(&dev, &[512, 1024])?; // activations, M×K
/// let w = Tensor::<bf16>::zeros(&dev, &[4096, 1024])?; // weights, N×K
/// let b = Tensor::<bf16>::zeros(&dev, &[4096])?;
/// let mut y = Tensor::<bf16>::zeros(&dev, &[512, 4096])?;
/// gemm(&x, &w).bias(Bias::PerColumn(&b)).activation(Activation::GeluTanh).run(&dev, &mut y)?;
/// # Ok::<(), tessera::Error>(())
/// ```
#[derive(Clone, Copy, Debug)]
pub struct GemmBuilder<'t, T: GemmElement = bf16> {
    a: &'t Tensor<T>,
    b: &'t Tensor<T>,
    b_layout: BLayout,
    alpha: f32,
    beta: f32,
    c_in: Option<&'t Tensor<T>>,
    bias: Option<Bias<'t, T>>,
    activation: Activation,
    residual: Option<&'t Tensor<T>>,
    gate: Option<&'t Tensor<T>>,
    variant: Option<&'t str>,
    triangle: Option<Triangle>,
}

/// Starts a GEMM `C = A·Bᵀ` with A (M×K) and B (N×K), bf16 or f16, accumulating in f32.
pub fn gemm<'t, T: GemmElement>(a: &'t Tensor<T>, b: &'t Tensor<T>) -> GemmBuilder<'t, T> {
    GemmBuilder {
        a,
        b,
        b_layout: BLayout::NxK,
        alpha: 1.0,
        beta: 0.0,
        c_in: None,
        bias: None,
        activation: Activation::None,
        residual: None,
        gate: None,
        variant: None,
        triangle: None,
    }
}

/// The kernels a plain GEMM (no `beta`, no residual) chooses among on Hopper for `T` and
/// `b_layout`: each variant of the 128×BN kernel (knobs `BN`, `STAGES`; the first is the
/// default), then the 128×128 kernel. The tuner picks one per shape; [`GemmBuilder::variant`]
/// forces one.
pub fn gemm_variants<T: GemmElement>(b_layout: BLayout) -> Vec<&'static str> {
    let kn = b_layout == BLayout::KxN;
    T::fast_variants(kn).iter().map(|s| s.name).chain([T::full_kernel(kn).name]).collect()
}

/// The variants of the triangle kernel ([`GemmBuilder::triangular_only`]) for `T`: `BN` 256,
/// then 128.
pub fn gemm_triangle_variants<T: GemmElement>() -> Vec<&'static str> {
    T::triangle_variants().iter().map(|s| s.name).collect()
}

/// The variant to run among `names`: the one `forced` names, else the tuner's choice for `key`
/// (`default` until a search; the search times `run` on a zeroed scratch C of `shape`, never
/// the caller's).
#[allow(clippy::too_many_arguments)]
pub(crate) fn pick_variant<T: Element>(
    device: &Device, kernel: &'static str, key: &tessera::TuneKey<'_>, names: &[&str], default: usize, forced: Option<&str>,
    shape: &[usize], run: &dyn Fn(usize, &mut Tensor<T>) -> Result<()>,
) -> Result<usize> {
    if let Some(v) = forced {
        return names.iter().position(|n| *n == v).ok_or_else(|| Error::Argument {
            kernel,
            arg: "variant".into(),
            expected: format!("one of {names:?}"),
            found: format!("`{v}`"),
        });
    }
    tessera::Tuner::global().choose(key, names, default, || {
        let mut scratch = Tensor::<T>::zeros(device, shape)?;
        Ok(tessera::tune::launch_timer(device, move |i| run(i, &mut scratch)))
    })
}

fn arg(name: &str, expected: String, found: String) -> Error {
    Error::Argument { kernel: "gemm", arg: name.into(), expected, found }
}

/// C as the persistent kernels store it, by TMA (rows and start 16-byte aligned): `None` where
/// `c` is so, else a `[m, n8]` buffer (N rounded up to a multiple of 8) for the kernel to write,
/// which [`unpad`] copies into `c` after — zeroed, or holding `c` (its padding zero) where `keep`
/// (a kernel that leaves some of C unwritten). An error of `kernel` naming `c` where `c` is not
/// contiguous.
pub(crate) fn tma_output<T: GemmElement>(
    kernel: &'static str, device: &Device, c: &Tensor<T>, m: usize, n: usize, keep: bool,
) -> Result<Option<Tensor<T>>> {
    let es = std::mem::size_of::<T>();
    if !c.is_contiguous() {
        return Err(Error::Argument {
            kernel,
            arg: "c".into(),
            expected: "a contiguous output".into(),
            found: format!("shape {:?}, strides {:?}", c.shape(), c.strides()),
        });
    }
    if (n * es).is_multiple_of(16) && (c.offset() * es).is_multiple_of(16) {
        return Ok(None);
    }
    let n8 = n.next_multiple_of(8);
    let mut p = Tensor::<T>::zeros(device, &[m, n8])?;
    if keep {
        let view = c.view(&[m, n], &[n, 1])?;
        T::pad_copy(device, (Grid::tiles(n8, 128), Grid::tiles(m, 16)).into(), &view, &mut p)?;
    }
    Ok(Some(p))
}

/// Copies the first `n` columns of a padded C (`[m, n8]`, from [`tma_output`]) into `c`
/// (`[m, n]`), if there is one.
pub(crate) fn unpad<U: GemmElement>(device: &Device, padded: Option<Tensor<U>>, c: &mut Tensor<U>, m: usize, n: usize) -> Result<()> {
    let Some(p) = padded else { return Ok(()) };
    let view = p.view(&[m, n], &[p.shape()[1], 1])?;
    U::pad_copy(device, (Grid::tiles(n, 128), Grid::tiles(m, 16)).into(), &view, c)
}

/// An error of `kernel` unless `device` runs `spec` as sm_90a (a Hopper GPU, or the
/// interpreter): the kernels with no sm_80 form.
pub(crate) fn check_hopper(kernel: &'static str, device: &Device, spec: &KernelSpec) -> Result<()> {
    if device.target_for(spec) == Some(Target::Sm90a) {
        return Ok(());
    }
    Err(Error::Argument {
        kernel,
        arg: "device".into(),
        expected: "a Hopper GPU (compute capability 9.0) or the interpreter".into(),
        found: device.name().to_string(),
    })
}

/// A 2-D or 3-D tensor as `[batch, rows, cols]`.
fn dims3<T: Element>(name: &str, t: &Tensor<T>) -> Result<[usize; 3]> {
    match *t.shape() {
        [r, c] => Ok([1, r, c]),
        [b, r, c] => Ok([b, r, c]),
        _ => Err(arg(name, "a 2-D matrix or a 3-D batch".into(), format!("shape {:?}", t.shape()))),
    }
}

/// `t` as a rank-3 view `[batch, rows, cols]` with its own strides.
fn view3<'t, T: Element>(t: &'t Tensor<T>, s: [usize; 3]) -> Result<View<'t, T>> {
    let st = t.strides();
    // A batch of one never moves along its first axis; any 16-byte multiple keeps TMA happy.
    let batch_stride = if st.len() == 3 { st[0] } else { (s[1] * st[0]).next_multiple_of(8).max(8) };
    let row_stride = st[st.len() - 2];
    t.view(&s, &[batch_stride, row_stride, st[st.len() - 1]])
}

/// `x` as a rank-3 view TMA can copy: itself, or a contiguous copy whose rows are padded with
/// zeros to a multiple of 8 elements (16 bytes).
pub(crate) fn tma_ready<'t, T: GemmElement>(
    device: &Device, name: &str, x: &'t Tensor<T>, s: [usize; 3], scratch: &'t mut Option<Tensor<T>>,
) -> Result<View<'t, T>> {
    let v = view3(x, s)?;
    let es = std::mem::size_of::<T>();
    let aligned = (x.offset() * es).is_multiple_of(16)
        && v.strides()[2] == 1
        && (v.strides()[1] * es).is_multiple_of(16)
        && (v.strides()[0] * es).is_multiple_of(16);
    if aligned {
        return Ok(v);
    }
    if !x.is_contiguous() {
        return Err(arg(
            name,
            "a tensor TMA can copy: 16-byte aligned rows (or a contiguous one, which is padded)".into(),
            format!("strides {:?} at offset {}", x.strides(), x.offset()),
        ));
    }
    let [b, r, c] = s;
    let c8 = c.next_multiple_of(8);
    let flat = x.view(&[b * r, c], &[c, 1])?;
    let mut padded = Tensor::<T>::zeros(device, &[b * r, c8])?;
    T::pad_copy(device, (Grid::tiles(c8, 128), Grid::tiles(b * r, 16)).into(), &flat, &mut padded)?;
    let p = scratch.insert(padded);
    p.view(&[b, r, c8], &[r * c8, c8, 1])
}

impl<'t, T: GemmElement> GemmBuilder<'t, T> {
    /// How B is stored (default [`BLayout::NxK`]).
    pub fn b_layout(mut self, layout: BLayout) -> Self {
        self.b_layout = layout;
        self
    }

    /// Scales the product: `alpha·A·Bᵀ`.
    pub fn alpha(mut self, alpha: f32) -> Self {
        self.alpha = alpha;
        self
    }

    /// Adds `beta·c_in` (shaped as C, not the output itself).
    pub fn beta(mut self, beta: f32, c_in: &'t Tensor<T>) -> Self {
        self.beta = beta;
        self.c_in = Some(c_in);
        self
    }

    /// Adds a bias per column or per row (shared by every batch).
    pub fn bias(mut self, bias: Bias<'t, T>) -> Self {
        self.bias = Some(bias);
        self
    }

    /// Applies an activation after the bias.
    pub fn activation(mut self, activation: Activation) -> Self {
        self.activation = activation;
        self
    }

    /// Adds a residual (shaped as C) after the activation.
    pub fn residual(mut self, residual: &'t Tensor<T>) -> Self {
        self.residual = Some(residual);
        self
    }

    /// Multiplies the activation's result by `gate` (shaped as C): a gated linear unit in one
    /// pass, SwiGLU's `silu(x·W_gᵀ) ⊙ (x·W_uᵀ)` as `gemm(&x, &w_g).activation(Activation::Silu)
    /// .gate(&up)` with `up = x·W_uᵀ`. Not beside a residual (both are the epilogue's one extra
    /// operand of C's shape); the 128×128 kernel runs it, as it runs a residual.
    pub fn gate(mut self, gate: &'t Tensor<T>) -> Self {
        self.gate = Some(gate);
        self
    }

    /// Computes only the tiles of C that meet one triangle (SYRK's `A·Aᵀ`, a causal product):
    /// about half the work of the square. Tiles across the diagonal are written whole (every
    /// element its product, on both sides of it); tiles wholly on the other side are not
    /// written. Hopper, B N×K, no `beta` or residual, C's rows 16-byte aligned; the variant
    /// ([`GemmBuilder::variant`], one of [`gemm_triangle_variants`]) is chosen by the tuner.
    pub fn triangular_only(mut self, triangle: Triangle) -> Self {
        self.triangle = Some(triangle);
        self
    }

    /// Runs the kernel variant named `name` (one of [`gemm_variants`], or for M ≤ 512 with B
    /// N×K on Hopper the small-M kernel as `gemm_small_m/mnW/splitsS`: X in chunks of `W` rows
    /// — 16, 32, 64, 128 or 256 — and K in `S` splits — 1, 2, 4, 8 or 16, at least 4 of K's
    /// 64-wide steps each) instead of asking the [`Tuner`](tessera::Tuner): for benchmarks and
    /// tests of one schedule. A name that is not one of these for the shape is an
    /// [`Error::Argument`] listing them.
    pub fn variant(mut self, name: &'t str) -> Self {
        self.variant = Some(name);
        self
    }

    /// Runs it into `c` (M×N, or `[batch, M, N]`).
    ///
    /// Any M, N, K ≥ 1: edges are handled by TMA's zero fill and masked loads and stores;
    /// operands whose rows TMA cannot address (a row of A or B not a multiple of 16 bytes, a
    /// misaligned view) are first copied into zero-padded buffers. Runs on compute capability
    /// 9.0 (H100, H200: TMA and wgmma) and on 8.0 and later (cp.async and mma.sync, 128×128
    /// tiles; correct, not tuned).
    ///
    /// # Errors
    /// [`Error::Argument`] naming the tensor when a shape does not match or is empty, or when a
    /// strided operand cannot be padded; and the launch's own checks.
    pub fn run(self, device: &Device, c: &mut Tensor<T>) -> Result<()> {
        let [batch, m, k] = dims3("a", self.a)?;
        let sb = dims3("b", self.b)?;
        let kn = self.b_layout == BLayout::KxN;
        let (n, kb) = if kn { (sb[2], sb[1]) } else { (sb[1], sb[2]) };
        let rank = self.a.shape().len();
        if self.b.shape().len() != rank || c.shape().len() != rank {
            return Err(arg("b", format!("the rank of a ({rank})"), format!("shapes {:?} and {:?}", self.b.shape(), c.shape())));
        }
        if sb[0] != batch || kb != k {
            let want = match (rank, kn) {
                (2, false) => format!("N×{k}"),
                (2, true) => format!("{k}×N"),
                (_, false) => format!("[{batch}, N, {k}]"),
                (_, true) => format!("[{batch}, {k}, N]"),
            };
            return Err(arg("b", format!("{want} (K = {k}) to match a {:?}", self.a.shape()), format!("shape {:?}", self.b.shape())));
        }
        let c_shape = [batch, m, n];
        let c_dims = if rank == 2 { vec![m, n] } else { c_shape.to_vec() };
        crate::check_shape("gemm", "c", c, &c_dims)?;
        if m == 0 || n == 0 || k == 0 || batch == 0 {
            return Err(arg("a", "M, N, K and batch ≥ 1".into(), format!("M={m}, N={n}, K={k}, batch={batch}")));
        }
        if !c.is_contiguous() {
            return Err(arg("c", "a contiguous output".into(), format!("strides {:?}", c.strides())));
        }
        let (bias, bias_kind) = match self.bias {
            None => (None, 0),
            Some(Bias::PerColumn(t)) => {
                crate::check_shape("gemm", "bias", t, &[n])?;
                (Some(t), 1)
            }
            Some(Bias::PerRow(t)) => {
                crate::check_shape("gemm", "bias", t, &[m])?;
                (Some(t), 2)
            }
        };
        for (name, t) in [("c_in", self.c_in), ("residual", self.residual), ("gate", self.gate)] {
            if let Some(t) = t {
                crate::check_shape("gemm", name, t, &c_dims)?;
            }
        }
        if self.residual.is_some() && self.gate.is_some() {
            return Err(arg("gate", "no residual beside it (the epilogue takes one of the two)".into(), "a residual too".into()));
        }
        let (mut pa, mut pb) = (None, None);
        let a = tma_ready(device, "a", self.a, [batch, m, k], &mut pa)?;
        let b = tma_ready(device, "b", self.b, sb, &mut pb)?;
        // Operands the epilogue does not read get a one-element view of `a` (never read, so
        // no allocation on every call).
        let bias = match bias {
            Some(t) => t.view(t.shape(), t.strides())?,
            None => self.a.view(&[1], &[1])?,
        };
        let bias = &bias;
        // The 128×BN kernels run on Hopper when the epilogue needs no extra M×N operand; the
        // 128×128 ones take everything else, and every sm_80 device.
        let extra = self.residual.or(self.gate);
        let full = self.c_in.is_some() || extra.is_some();
        let hopper = device.target_for(T::fast_kernel(kn)) == Some(Target::Sm90a);
        let tiles =
            |bn: usize| (Grid::tiles(m, 128).saturating_mul(Grid::tiles(n, bn)).saturating_mul(batch as u32)).min(device.sm_count());
        // The 128×BN kernels store C by TMA: its rows must be 16-byte aligned.
        let es = std::mem::size_of::<T>();
        let c_tma = (n * es).is_multiple_of(16) && (c.offset() * es).is_multiple_of(16);
        let c_in = match self.c_in {
            Some(t) => view3(t, c_shape)?,
            None => self.a.view(&[1, 1, 1], &[1, 1, 1])?,
        };
        let residual = match extra {
            Some(t) => view3(t, c_shape)?,
            None => self.a.view(&[1, 1, 1], &[1, 1, 1])?,
        };
        let scalars = (
            self.alpha,
            if self.c_in.is_some() { self.beta } else { 0.0 },
            bias_kind,
            self.activation.code(),
            // 1: add the residual, 2: multiply by the gate.
            i32::from(self.residual.is_some()) + 2 * i32::from(self.gate.is_some()),
        );
        let epi = (self.alpha, bias_kind, self.activation.code());
        if let Some(triangle) = self.triangle {
            if full || !hopper || kn || !c_tma {
                return Err(arg(
                    "triangular_only",
                    "a Hopper GPU, B N×K, no beta, residual or gate, C's rows 16-byte aligned".into(),
                    format!("hopper={hopper}, B {:?}, beta/residual/gate={full}, C aligned={c_tma}", self.b_layout),
                ));
            }
            let variants = T::triangle_variants();
            let names: Vec<&str> = variants.iter().map(|v| v.name).collect();
            let upper = triangle == Triangle::Upper;
            let run = |i: usize, c: &mut Tensor<T>| {
                let bn = variants[i].knob("BN").unwrap_or(256) as usize;
                T::gemm_triangle(device, tiles(bn).into(), i, &a, &b, c, c_shape, bias, epi, upper)
            };
            let (dtype, shape, epilogue) = (T::DTYPE, [batch, m, n, k], (bias_kind, self.activation));
            let key = tessera::TuneKey::new("gemm_triangle", device)
                .field("dtype", &dtype)
                .field("shape", &shape)
                .field("triangle", &triangle)
                .field("epilogue", &epilogue);
            let choice = pick_variant(device, "gemm", &key, &names, 0, self.variant, c.shape(), &run)?;
            return run(choice, c);
        }
        // Small M (up to 512 rows, weights N×K): X's rows are the MMA's N, every SM streams
        // the weights, X in chunks and K in splits so that the units fill one wave — the
        // default where some choice does (`small_m_options`), else the tiled kernels. The
        // tuner also times its other choices beside the tiled kernels, and
        // `variant("gemm_small_m/mn64/splits4")` forces one.
        let small = !full && hopper && !kn && m <= SMALL_M_ROWS;
        let sms = device.sm_count() as usize;
        let (options, one_wave) = if small { small_m_options(T::small_m_variants(), batch, m, n, k, sms) } else { (Vec::new(), false) };
        let (default_mn, splits) = options.first().copied().unwrap_or((1, 1));
        let small_default = small && self.variant.is_none() && one_wave;
        let fast_ok = !full && hopper && c_tma;
        let small_names: Vec<&str> = options.iter().map(|&o| small_m_name(o)).collect();
        let forced_small = self.variant.and_then(|v| small_names.iter().position(|n| *n == v));
        if let Some(i) = forced_small {
            return T::gemm_small_m(device, &a, &b, c, c_shape, bias, epi, options[i]);
        }
        if small_default && !fast_ok {
            return T::gemm_small_m(device, &a, &b, c, c_shape, bias, epi, (default_mn, splits));
        }
        let run_full = |c: &mut Tensor<T>| T::gemm_full(device, tiles(128).into(), kn, &a, &b, c, c_shape, &c_in, bias, &residual, scalars);
        let names = gemm_variants::<T>(self.b_layout);
        let forced = match self.variant {
            None => None,
            Some(v) => match names.iter().position(|n| *n == v) {
                Some(i) if fast_ok || i == names.len() - 1 => Some(i),
                known => {
                    let why = if known.is_none() {
                        "the variants for this shape"
                    } else if !hopper {
                        "this device runs only the 128×128 kernel"
                    } else if full {
                        "with beta, a residual or a gate only the 128×128 kernel runs"
                    } else {
                        "with C's rows not 16-byte aligned only the 128×128 kernel runs"
                    };
                    let all: Vec<&str> = names.iter().chain(&small_names).copied().collect();
                    return Err(arg("variant", format!("one of {all:?} ({why})"), format!("`{v}`")));
                }
            },
        };
        if !fast_ok {
            return run_full(c);
        }
        // Candidates: each variant of the fast kernel (`tune(BN, STAGES)`), then the 128×128
        // kernel. The default heuristic: 128×256 tiles with 4 stages, unless too few of them
        // fill the GPU (M = 128 decode shapes), where the 128×128 kernel gives twice the blocks.
        let variants = T::fast_variants(kn);
        let few = (tiles(256) as usize) * 4 < device.sm_count() as usize;
        let names: Vec<&str> = names.iter().chain(&small_names).copied().collect();
        let default = match () {
            () if small_default => variants.len() + 1,
            () if few => variants.len(),
            () => 0,
        };
        let run = |i: usize, c: &mut Tensor<T>| match variants.get(i) {
            Some(v) => {
                let bn = v.knob("BN").unwrap_or(256) as usize;
                T::gemm(device, tiles(bn).into(), kn, i, &a, &b, c, c_shape, bias, epi)
            }
            None if i == variants.len() => run_full(c),
            None => T::gemm_small_m(device, &a, &b, c, c_shape, bias, epi, options[i - variants.len() - 1]),
        };
        if let Some(i) = forced {
            return run(i, c);
        }
        let (dtype, strides, epilogue) = (T::DTYPE, (a.strides(), b.strides()), (bias_kind, self.activation));
        let key = tessera::TuneKey::new("gemm", device)
            .field("dtype", &dtype)
            .field("b_layout", &self.b_layout)
            .field("shape", &c_shape)
            .field("k", &k)
            .field("strides", &strides)
            .field("epilogue", &epilogue);
        let choice = tessera::Tuner::global().choose(&key, &names, default, || {
            // Timing writes a scratch C, never the caller's.
            let mut scratch = Tensor::<T>::zeros(device, c.shape())?;
            Ok(tessera::tune::launch_timer(device, move |i| run(i, &mut scratch)))
        })?;
        run(choice, c)
    }
}

/// The most rows of A the small-M path takes.
const SMALL_M_ROWS: usize = 512;

/// The splits of K the small-M path offers.
const SMALL_M_SPLITS: [usize; 5] = [1, 2, 4, 8, 16];

/// The name of the small-M choice `(MN, splits)` (`gemm_small_m/mnW/splitsS`), made once for
/// every width of the kernel and split (not on every call of a decode step).
fn small_m_name((mn, splits): (usize, usize)) -> &'static str {
    static NAMES: std::sync::OnceLock<Vec<((usize, usize), String)>> = std::sync::OnceLock::new();
    let names = NAMES.get_or_init(|| {
        let widths = kernels::gemm_small_m_bf16::VARIANTS.iter().filter_map(|v| v.knob("MN")).map(|w| w as usize);
        widths.flat_map(|w| SMALL_M_SPLITS.map(|s| ((w, s), format!("gemm_small_m/mn{w}/splits{s}")))).collect()
    });
    names.iter().find(|(o, _)| *o == (mn, splits)).map_or("gemm_small_m", |(_, n)| n.as_str())
}

/// The small-M kernel's candidates `(MN, splits)` for `batch` GEMMs of `m` rows of X, `n`
/// weight rows, `k` columns on `sms` SMs — X in chunks of `MN` rows (the narrowest holding
/// them; past 64 rows also 64, 128, 256), K in 1, 2, 4, 8, 16 splits (at least 4 of its 64-wide
/// steps each) — and whether the first is a good default. The default: the narrowest chunks
/// whose units (slab, chunk, split) fit one wave, in the fewest splits that keep at least a
/// fifth of the SMs busy with at most 128 K steps a unit (else the most splits that still fit
/// the wave), and not at `MN` 256 (4 stages: the tiled kernels do as well). With the weights
/// read from DRAM (run 279, H100) a split costs more than an idle SM saves until a unit's K is
/// long: 64 × 4096² unsplit on 32 SMs 17.8 µs, in 4 splits 20.0; 64 × 4096 × 14336 in 2 splits
/// 49.0, unsplit 54.3; and a second wave costs a whole unit (512 × 4096²: 64-row chunks 34.2
/// µs, 128-row ones 25.4 — H200, run 276).
fn small_m_options(all: &[&KernelSpec], batch: usize, m: usize, n: usize, k: usize, sms: usize) -> (Vec<(usize, usize)>, bool) {
    let mut widths: Vec<usize> = all.iter().filter_map(|v| v.knob("MN")).map(|w| w as usize).collect();
    widths.sort_unstable();
    let Some(&widest) = widths.last() else { return (Vec::new(), false) };
    let narrowest = widths.iter().copied().find(|&w| w >= m).unwrap_or(widest);
    let mns: Vec<usize> = widths.iter().copied().filter(|&w| w == narrowest || (64..narrowest).contains(&w)).collect();
    let steps = k.div_ceil(64);
    let most = (steps / 4).clamp(1, 16);
    let mut out: Vec<(usize, usize)> = Vec::new();
    for &mn in &mns {
        out.extend(SMALL_M_SPLITS.into_iter().filter(|&s| s <= most).map(|s| (mn, s)));
    }
    let units = |(mn, s): (usize, usize)| batch * n.div_ceil(128) * m.div_ceil(mn) * s;
    let fits = |o: (usize, usize)| units(o) <= sms && units(o) * 5 >= sms;
    let pick = mns.iter().filter(|&&mn| mn < 256).find_map(|&mn| {
        let mine: Vec<(usize, usize)> = out.iter().copied().filter(|&(w, _)| w == mn).collect();
        mine.iter().copied().find(|&(w, s)| fits((w, s)) && steps.div_ceil(s) <= 128).or_else(|| mine.iter().copied().rfind(|&o| fits(o)))
    });
    if let Some(best) = pick {
        out.retain(|&o| o != best);
        out.insert(0, best);
    }
    (out, pick.is_some())
}

/// `y = gelu_tanh(x + bias)` with `bias` per column: the unfused form of the GEMM epilogue.
///
/// # Errors
/// [`Error::Argument`] if shapes do not match.
pub fn bias_gelu(device: &Device, x: &Tensor<bf16>, bias: &Tensor<bf16>, y: &mut Tensor<bf16>) -> Result<()> {
    let (m, n) = crate::check_2d("bias_gelu", "x", x)?;
    crate::check_shape("bias_gelu", "bias", bias, &[n])?;
    crate::check_shape("bias_gelu", "y", y, &[m, n])?;
    if m == 0 || n == 0 {
        return Ok(());
    }
    bias_gelu_bf16::launch(device, (Grid::tiles(n, 256), Grid::tiles(m, 16)), x, bias, y)
}

/// `C = A·Bᵀ` for bf16 or f16 A (M×K), B (N×K) and C (M×N), accumulating in f32: [`gemm`]
/// with no epilogue.
///
/// # Errors
/// As [`GemmBuilder::run`].
pub fn gemm_tn<T: GemmElement>(device: &Device, a: &Tensor<T>, b: &Tensor<T>, c: &mut Tensor<T>) -> Result<()> {
    gemm(a, b).run(device, c)
}

#[cfg(test)]
mod tests {
    use super::small_m_options;

    /// The small-M default on an H100's 132 SMs for the shapes it was measured on (runs
    /// 276–279): `(MN, splits)`, or `None` where the tiled kernels are the default.
    #[test]
    fn small_m_default_follows_the_measurements() {
        let all = super::kernels::gemm_small_m_bf16::VARIANTS;
        let default = |m: usize, n: usize, k: usize| {
            let (options, ok) = small_m_options(all, 1, m, n, k, 132);
            ok.then(|| options[0])
        };
        assert_eq!(default(1, 4096, 4096), Some((16, 1)));
        assert_eq!(default(64, 4096, 4096), Some((64, 1)));
        assert_eq!(default(128, 4096, 4096), Some((64, 1)));
        assert_eq!(default(256, 4096, 4096), Some((64, 1)));
        assert_eq!(default(512, 4096, 4096), Some((128, 1)));
        assert_eq!(default(64, 4096, 14336), Some((64, 2)));
        assert_eq!(default(1, 14336, 4096), Some((16, 1)));
        assert_eq!(default(16, 14336, 14336), Some((16, 1)));
        assert_eq!(default(256, 14336, 4096), None);
        assert_eq!(default(512, 14336, 4096), None);
        // A GEMM too small to keep a fifth of the SMs busy stays on the tiled kernels.
        assert_eq!(default(1, 128, 64), None);
    }
}
