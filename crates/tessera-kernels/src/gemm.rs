//! GEMM on Hopper: TMA into a 4-stage shared ring, one producer and two consumer warpgroups,
//! wgmma m64n256k16 accumulating in f32, masked stores of C.

use tessera::{bf16, f16, kernel, Device, Element, Error, Grid, Result, Tensor};

/// Rows and columns of C per block, and the K step.
const BM: usize = 128;
const BN: usize = 256;

/// `C = epilogue(A·Bᵀ)`: A is M×K, B is N×K (the "TN" layout of LLM weights), both bf16 (or
/// f16) row-major; C is M×N of the same type. Compiled as `gemm_tn_bf16` and `gemm_tn_f16`. A persistent grid walks 128×256 tiles of C in groups of 8
/// tile-rows, so that neighbouring blocks share B's columns in L2.
///
/// Warpgroup 0 produces: for each 64-wide K step it waits for a free stage, copies A's
/// 128×64 and B's 256×64 boxes there by TMA (edges zero-filled) and commits. Warpgroups 1
/// and 2 consume: each waits for a full stage and multiplies its 64 rows of A by B into a
/// 64×256 f32 accumulator, keeping one MMA group in flight and releasing the stage before it.
/// The epilogue runs on the accumulator in registers, 64 columns at a time — `alpha·acc`, a
/// bias per column (`bias_kind` 1) or per row (2), an activation (`act` 1: GELU tanh, 2: GELU
/// erf, 3: SiLU) — and stores its rows of C, while the producer already fills the next tile's
/// stages. [`gemm_tn_full_bf16`] adds `beta·C_in` and a residual.
#[kernel(warpgroups = 3, dtypes(T = [bf16, f16]))]
pub fn gemm_tn(a: Global<T, 2>, b: Global<T, 2>, c: Global<T, 2>, bias: Global<T, 1>, alpha: f32, bias_kind: i32, act: i32) {
    let sa = Smem::<T, 128, 64>::ring(4);
    let sb = Smem::<T, 256, 64>::ring(4);
    let pipe = Pipeline::<4>::new(2);
    let k_steps = (a.dim(1) + 63) / 64;
    let tiles_m = (c.dim(0) + 127) / 128;
    let tiles_n = (c.dim(1) + 255) / 256;
    let group = 8 * tiles_n;
    if warpgroup::id() == 0 {
        setmaxnreg(40);
        for tile in (block::id_x()..tiles_m * tiles_n).step_by(grid::dim_x()) {
            let first = (tile / group) * 8;
            let height = min(tiles_m - first, 8);
            let m0 = (first + (tile % group) % height) * 128;
            let n0 = ((tile % group) / height) * 256;
            for k in 0..k_steps {
                let s = pipe.acquire();
                tma::load(sa.at(s), a, [m0, k * 64], pipe);
                tma::load(sb.at(s), b, [n0, k * 64], pipe);
                pipe.commit(s);
            }
        }
    } else {
        setmaxnreg(232);
        let row = (warpgroup::id() - 1) * 64;
        let mut acc = Tile::<f32, 64, 256>::zeros();
        for tile in (block::id_x()..tiles_m * tiles_n).step_by(grid::dim_x()) {
            let first = (tile / group) * 8;
            let height = min(tiles_m - first, 8);
            let m0 = (first + (tile % group) % height) * 128 + row;
            let n0 = ((tile % group) / height) * 256;
            acc = Tile::<f32, 64, 256>::zeros();
            let mut prev = 0;
            for k in 0..k_steps {
                let s = pipe.wait();
                mma_sync(acc, sa.at(s).rows(row, 64), sb.at(s));
                mma_wait(1);
                if k > 0 {
                    pipe.release(prev);
                }
                prev = s;
            }
            mma_wait(0);
            pipe.release(prev);
            // The epilogue, 64 columns at a time so that loaded operands fit in registers.
            #[unroll]
            for j in 0..4 {
                let n = n0 + j * 64;
                let mut out = acc.cols(j * 64, 64) * alpha;
                if bias_kind == 1 {
                    out = out + bias.load::<Tile<T, 1, 64>>([n]).cast::<f32>();
                }
                if bias_kind == 2 {
                    out = out + bias.load::<Tile<T, 64, 1>>([m0]).cast::<f32>();
                }
                if act == 1 {
                    out = 0.5 * out * (1.0 + tanh(0.7978845608 * (out + 0.044715 * out * out * out)));
                }
                if act == 2 {
                    out = 0.5 * out * (1.0 + erf(out * 0.70710678118));
                }
                if act == 3 {
                    out = out / (1.0 + exp2(out * -1.4426950408889634));
                }
                c.store([m0, n], out.cast::<T>());
            }
        }
    }
}

/// [`gemm_tn_bf16`] (and `_f16`) with the whole epilogue, `alpha·acc + beta·C_in + bias`, activation,
/// residual, on 128×128 tiles: the two extra M×N operands need the registers that a 64×256
/// accumulator would take.
///
/// `C = epilogue(A·Bᵀ)`: A is M×K, B is N×K (the "TN" layout of LLM weights), both bf16 (or
/// f16) row-major; C is M×N of the same type. Compiled as `gemm_tn_bf16` and `gemm_tn_f16`. A persistent grid walks 128×128 tiles of C in groups of 8
/// tile-rows, so that neighbouring blocks share B's columns in L2.
///
/// Warpgroup 0 produces: for each 64-wide K step it waits for a free stage, copies A's
/// 128×64 and B's 256×64 boxes there by TMA (edges zero-filled) and commits. Warpgroups 1
/// and 2 consume: each waits for a full stage and multiplies its 64 rows of A by B into a
/// 64×256 f32 accumulator, keeping one MMA group in flight and releasing the stage before it.
/// The epilogue runs on the accumulator in registers — `alpha·acc + beta·C_in`, a bias per
/// column (`bias_kind` 1) or per row (2), an activation (`act` 1: GELU tanh, 2: GELU erf,
/// 3: SiLU), a residual — and stores its rows of C, while the producer already fills the next
/// tile's stages. Operands it does not use are not read.
#[kernel(warpgroups = 3, dtypes(T = [bf16, f16]))]
pub fn gemm_tn_full(
    a: Global<T, 2>,
    b: Global<T, 2>,
    c: Global<T, 2>,
    c_in: Global<T, 2>,
    bias: Global<T, 1>,
    residual: Global<T, 2>,
    alpha: f32,
    beta: f32,
    bias_kind: i32,
    act: i32,
    add_residual: i32,
) {
    let sa = Smem::<T, 128, 64>::ring(4);
    let sb = Smem::<T, 128, 64>::ring(4);
    let pipe = Pipeline::<4>::new(2);
    let k_steps = (a.dim(1) + 63) / 64;
    let tiles_m = (c.dim(0) + 127) / 128;
    let tiles_n = (c.dim(1) + 127) / 128;
    let group = 8 * tiles_n;
    if warpgroup::id() == 0 {
        setmaxnreg(40);
        for tile in (block::id_x()..tiles_m * tiles_n).step_by(grid::dim_x()) {
            let first = (tile / group) * 8;
            let height = min(tiles_m - first, 8);
            let m0 = (first + (tile % group) % height) * 128;
            let n0 = ((tile % group) / height) * 128;
            for k in 0..k_steps {
                let s = pipe.acquire();
                tma::load(sa.at(s), a, [m0, k * 64], pipe);
                tma::load(sb.at(s), b, [n0, k * 64], pipe);
                pipe.commit(s);
            }
        }
    } else {
        setmaxnreg(232);
        let row = (warpgroup::id() - 1) * 64;
        let mut acc = Tile::<f32, 64, 128>::zeros();
        for tile in (block::id_x()..tiles_m * tiles_n).step_by(grid::dim_x()) {
            let first = (tile / group) * 8;
            let height = min(tiles_m - first, 8);
            let m0 = (first + (tile % group) % height) * 128 + row;
            let n0 = ((tile % group) / height) * 128;
            acc = Tile::<f32, 64, 128>::zeros();
            let mut prev = 0;
            for k in 0..k_steps {
                let s = pipe.wait();
                mma_sync(acc, sa.at(s).rows(row, 64), sb.at(s));
                mma_wait(1);
                if k > 0 {
                    pipe.release(prev);
                }
                prev = s;
            }
            mma_wait(0);
            pipe.release(prev);
            // The epilogue, 32 columns at a time.
            #[unroll]
            for j in 0..4 {
                let n = n0 + j * 32;
                let mut out = acc.cols(j * 32, 32) * alpha;
                if beta != 0.0 {
                    out = out + c_in.load::<Tile<T, 64, 32>>([m0, n]).cast::<f32>() * beta;
                }
                if bias_kind == 1 {
                    out = out + bias.load::<Tile<T, 1, 32>>([n]).cast::<f32>();
                }
                if bias_kind == 2 {
                    out = out + bias.load::<Tile<T, 64, 1>>([m0]).cast::<f32>();
                }
                if act == 1 {
                    out = 0.5 * out * (1.0 + tanh(0.7978845608 * (out + 0.044715 * out * out * out)));
                }
                if act == 2 {
                    out = 0.5 * out * (1.0 + erf(out * 0.70710678118));
                }
                if act == 3 {
                    out = out / (1.0 + exp2(out * -1.4426950408889634));
                }
                if add_residual == 1 {
                    out = out + residual.load::<Tile<T, 64, 32>>([m0, n]).cast::<f32>();
                }
                c.store([m0, n], out.cast::<T>());
            }
        }
    }
}

/// `y = gelu_tanh(x + bias)` with a bias per column: the unfused epilogue that the GEMM
/// bench compares the fused one against.
#[kernel]
pub fn bias_gelu_bf16(x: Global<bf16, 2>, bias: Global<bf16, 1>, y: Global<bf16, 2>) {
    let r = block::id_y() * 16;
    let c = block::id_x() * 256;
    let t: Tile<bf16, 16, 256> = x.load([r, c]);
    let v = t.cast::<f32>() + bias.load::<Tile<bf16, 1, 256>>([c]).cast::<f32>();
    let g = 0.5 * v * (1.0 + tanh(0.7978845608 * (v + 0.044715 * v * v * v)));
    y.store([r, c], g.cast::<bf16>());
}

/// Copies `x` into the top-left of `y`; the rest of `y` (the padding) gets zeros.
#[kernel(dtypes(T = [bf16, f16]))]
pub fn pad_copy(x: Global<T, 2>, y: Global<T, 2>) {
    let r = block::id_y() * 16;
    let c = block::id_x() * 128;
    let t: Tile<T, 16, 128> = x.load([r, c]);
    y.store([r, c], t);
}

/// `x` as a tensor TMA can copy: itself, or a copy whose rows are padded with zeros to a
/// multiple of 8 elements (16 bytes).
fn tma_ready<'t, T: GemmElement>(device: &Device, x: &'t Tensor<T>, scratch: &'t mut Option<Tensor<T>>) -> Result<&'t Tensor<T>> {
    let (r, k) = (x.shape()[0], x.shape()[1]);
    let ptr_ok = (x.offset() * 2).is_multiple_of(16);
    if ptr_ok && x.strides()[1] == 1 && (x.strides()[0] * 2).is_multiple_of(16) {
        return Ok(x);
    }
    let mut padded = Tensor::<T>::zeros(device, &[r, k.next_multiple_of(8)])?;
    T::pad_copy(device, (Grid::tiles(k.next_multiple_of(8), 128), Grid::tiles(r, 16)).into(), x, &mut padded)?;
    Ok(scratch.insert(padded))
}

/// The activation of a GEMM's epilogue.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
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

/// A bias added in a GEMM's epilogue.
#[derive(Clone, Copy, Debug)]
pub enum Bias<'t, T: Element = bf16> {
    /// One value per column of C (length N): the usual linear-layer bias.
    PerColumn(&'t Tensor<T>),
    /// One value per row of C (length M).
    PerRow(&'t Tensor<T>),
}

/// An element type the GEMM takes: `bf16` or `f16` (each has its compiled kernels).
pub trait GemmElement: Element + sealed::Sealed {
    #[doc(hidden)]
    #[allow(clippy::too_many_arguments)]
    fn gemm(
        d: &Device,
        g: Grid,
        a: &Tensor<Self>,
        b: &Tensor<Self>,
        c: &mut Tensor<Self>,
        bias: &Tensor<Self>,
        alpha: f32,
        bias_kind: i32,
        act: i32,
    ) -> Result<()>;
    #[doc(hidden)]
    #[allow(clippy::too_many_arguments)]
    fn gemm_full(
        d: &Device,
        g: Grid,
        a: &Tensor<Self>,
        b: &Tensor<Self>,
        c: &mut Tensor<Self>,
        c_in: &Tensor<Self>,
        bias: &Tensor<Self>,
        residual: &Tensor<Self>,
        scalars: (f32, f32, i32, i32, i32),
    ) -> Result<()>;
    #[doc(hidden)]
    fn pad_copy(d: &Device, g: Grid, x: &Tensor<Self>, y: &mut Tensor<Self>) -> Result<()>;
}

mod sealed {
    pub trait Sealed {}
    impl Sealed for tessera::bf16 {}
    impl Sealed for tessera::f16 {}
}

macro_rules! gemm_element {
    ($t:ty, $main:ident, $full:ident, $pad:ident) => {
        impl GemmElement for $t {
            fn gemm(
                d: &Device,
                g: Grid,
                a: &Tensor<Self>,
                b: &Tensor<Self>,
                c: &mut Tensor<Self>,
                bias: &Tensor<Self>,
                alpha: f32,
                bias_kind: i32,
                act: i32,
            ) -> Result<()> {
                $main::launch(d, g, a, b, c, bias, alpha, bias_kind, act)
            }
            fn gemm_full(
                d: &Device,
                g: Grid,
                a: &Tensor<Self>,
                b: &Tensor<Self>,
                c: &mut Tensor<Self>,
                c_in: &Tensor<Self>,
                bias: &Tensor<Self>,
                residual: &Tensor<Self>,
                (alpha, beta, bias_kind, act, add_residual): (f32, f32, i32, i32, i32),
            ) -> Result<()> {
                $full::launch(d, g, a, b, c, c_in, bias, residual, alpha, beta, bias_kind, act, add_residual)
            }
            fn pad_copy(d: &Device, g: Grid, x: &Tensor<Self>, y: &mut Tensor<Self>) -> Result<()> {
                $pad::launch(d, g, x, y)
            }
        }
    };
}
gemm_element!(bf16, gemm_tn_bf16, gemm_tn_full_bf16, pad_copy_bf16);
gemm_element!(f16, gemm_tn_f16, gemm_tn_full_f16, pad_copy_f16);

/// A GEMM `C = act(alpha·A·Bᵀ + beta·C_in + bias) + residual`, built with [`gemm`] and run
/// with [`GemmBuilder::run`]. Every epilogue step is fused on the accumulator in registers.
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
    alpha: f32,
    beta: f32,
    c_in: Option<&'t Tensor<T>>,
    bias: Option<Bias<'t, T>>,
    activation: Activation,
    residual: Option<&'t Tensor<T>>,
}

/// Starts a GEMM `C = A·Bᵀ` with A (M×K) and B (N×K), bf16 or f16, accumulating in f32.
pub fn gemm<'t, T: GemmElement>(a: &'t Tensor<T>, b: &'t Tensor<T>) -> GemmBuilder<'t, T> {
    GemmBuilder { a, b, alpha: 1.0, beta: 0.0, c_in: None, bias: None, activation: Activation::None, residual: None }
}

impl<'t, T: GemmElement> GemmBuilder<'t, T> {
    /// Scales the product: `alpha·A·Bᵀ`.
    pub fn alpha(mut self, alpha: f32) -> Self {
        self.alpha = alpha;
        self
    }

    /// Adds `beta·c_in` (an M×N tensor, not the output).
    pub fn beta(mut self, beta: f32, c_in: &'t Tensor<T>) -> Self {
        self.beta = beta;
        self.c_in = Some(c_in);
        self
    }

    /// Adds a bias per column or per row.
    pub fn bias(mut self, bias: Bias<'t, T>) -> Self {
        self.bias = Some(bias);
        self
    }

    /// Applies an activation after the bias.
    pub fn activation(mut self, activation: Activation) -> Self {
        self.activation = activation;
        self
    }

    /// Adds an M×N residual after the activation.
    pub fn residual(mut self, residual: &'t Tensor<T>) -> Self {
        self.residual = Some(residual);
        self
    }

    /// Runs it into `c` (M×N).
    ///
    /// Any M, N, K ≥ 1: edges are handled by TMA's zero fill and masked loads and stores;
    /// operands whose rows TMA cannot address (K not a multiple of 8, odd strides, a
    /// misaligned view) are first copied into zero-padded buffers. Runs on compute
    /// capability 9.0 (H100, H200).
    ///
    /// # Errors
    /// [`Error::Argument`] naming the tensor when a shape does not match or is empty, and the
    /// launch's own checks.
    pub fn run(self, device: &Device, c: &mut Tensor<T>) -> Result<()> {
        let arg = |arg: &str, expected: String, found: String| Error::Argument { kernel: "gemm", arg: arg.into(), expected, found };
        let (m, k) = crate::check_2d("gemm", "a", self.a)?;
        let (n, kb) = crate::check_2d("gemm", "b", self.b)?;
        if kb != k {
            return Err(arg("b", format!("N×K with K = {k} (a is {m}×{k})"), format!("shape {:?}", self.b.shape())));
        }
        crate::check_shape("gemm", "c", c, &[m, n])?;
        if m == 0 || n == 0 || k == 0 {
            return Err(arg("a", "M, N, K ≥ 1".into(), format!("M={m}, N={n}, K={k}")));
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
        if let Some(t) = self.c_in {
            crate::check_shape("gemm", "c_in", t, &[m, n])?;
        }
        if let Some(t) = self.residual {
            crate::check_shape("gemm", "residual", t, &[m, n])?;
        }
        let (mut sa, mut sb) = (None, None);
        let a = tma_ready(device, self.a, &mut sa)?;
        let b = tma_ready(device, self.b, &mut sb)?;
        // Operands the epilogue does not read: a one-element stand-in.
        let unused = Tensor::<T>::zeros(device, &[1, 1])?;
        let unused1 = Tensor::<T>::zeros(device, &[1])?;
        let act = match self.activation {
            Activation::None => 0,
            Activation::GeluTanh => 1,
            Activation::GeluErf => 2,
            Activation::Silu => 3,
        };
        let tiles = Grid::tiles(m, BM).saturating_mul(Grid::tiles(n, BN));
        let grid = tiles.min(device.sm_count());
        let bias = bias.unwrap_or(&unused1);
        if self.c_in.is_none() && self.residual.is_none() {
            return T::gemm(device, grid.into(), a, b, c, bias, self.alpha, bias_kind, act);
        }
        let full_grid = Grid::tiles(m, BM).saturating_mul(Grid::tiles(n, 128)).min(device.sm_count());
        let scalars = (self.alpha, if self.c_in.is_some() { self.beta } else { 0.0 }, bias_kind, act, i32::from(self.residual.is_some()));
        T::gemm_full(device, full_grid.into(), a, b, c, self.c_in.unwrap_or(&unused), bias, self.residual.unwrap_or(&unused), scalars)
    }
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
