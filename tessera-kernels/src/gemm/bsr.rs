//! Block-sparse × dense GEMM: `C = act(alpha · A · Bᵀ)` with A in block-CSR (128×128 or 64×64
//! blocks) and B dense `[N, K]`, tiles scheduled over A's block rows and each tile's K loop over
//! the nonzero blocks of its row only: work and A's bytes in proportion to the nonzeros.
//!
//! The kernels are the library's persistent GEMM with a producer of their own — each K step
//! loads half of one nonzero 128-block of A (its `values` entry, by TMA), or one 64-block, and
//! the 64 columns of B that block's column index names — and the shared consumer
//! ([`gemm_consume`](crate::prelude::gemm_consume): MMAs, epilogue, TMA stores), or for
//! 64-blocks two consumers splitting a 64-row tile's columns
//! ([`gemm_mma`](crate::prelude::gemm_mma) from their half of B's stage,
//! [`gemm_epilogue_store`](crate::prelude::gemm_epilogue_store)).

use crate::gemm::{check_hopper, pick_variant, tma_output, tma_ready, unpad, Activation, GemmElement};
use crate::prelude::*;
use tessera::{kernel, Device, Error, Grid, Result, Tensor};

fn arg(name: &str, expected: String, found: String) -> Error {
    Error::Argument { kernel: "gemm_bsr", arg: name.into(), expected, found }
}

/// The side of A's larger blocks (the first kernel's).
pub const BSR_BLOCK: usize = 128;

/// The sides A's blocks may have: 64×64 or 128×128 (each block-sparse matrix one of them).
pub const BSR_BLOCKS: [usize; 2] = [64, 128];

/// Tile `tile` of the block-sparse GEMM's raster: `(block row, tile column, first nonzero
/// block, K steps)` — `steps` 64-wide steps a nonzero block of the row (2 for 128-blocks, 1
/// for 64-blocks).
#[tessera::device]
fn bsr_tile(tile: i32, row_ptr: Global<i32, 1>, per_batch: i32, tiles_m: i32, group: i32, steps: i32) -> (i32, i32, i32, i32) {
    let (_bt, tm, tn) = grouped_tile(tile, per_batch, tiles_m, group);
    let first = row_ptr.get([tm]);
    (tm, tn, first, (row_ptr.get([tm + 1]) - first) * steps)
}

/// `C = act(alpha · A · Bᵀ)`: A block-sparse — `values` `[nnz, 128, 128]` its nonzero blocks,
/// `row_ptr` `[M/128 + 1]` each block row's first block, `col_idx` `[nnz]` each block's block
/// column — B `[1, N, K]`, C `[1, M, N]`; 128×`BN` tiles, a block row's K steps over its
/// nonzero blocks only (a row without blocks stores `act(0)`).
#[kernel(warpgroups = 3, dtypes(T = [bf16, f16]), tune(BN = [256, 128], STAGES = [4]), targets(sm_90a))]
pub fn gemm_bsr(
    values: Global<T, 3>, row_ptr: Global<i32, 1>, col_idx: Global<i32, 1>, b: Global<T, 3>, c: Global<T, 3>, counter: Global<i32, 1>,
    alpha: f32, act: i32,
) {
    let sa = Smem::<T, 128, 64>::ring(STAGES);
    let sb = Smem::<T, BN, 64>::ring(STAGES);
    let sc = Smem::<T, 64, 64>::ring(4);
    let pipe = Pipeline::<STAGES>::new(2);
    let (per_batch, tiles_m, group) = gemm_raster::<BN>(c);
    let queue = TileQueue::<2>::new(counter, 2);
    if warpgroup::id() == 0 {
        setmaxnreg(40);
        for tile in queue.fetch(per_batch) {
            let (_tm, tn, first, k_steps) = bsr_tile(tile, row_ptr, per_batch, tiles_m, group, 2);
            fill_stages(pipe, k_steps, |s, k| {
                let block = first + k / 2;
                let half = (k % 2) * 64;
                tma::load(sa.at(s), values, [block, 0, half], pipe);
                tma::load(sb.at(s), b, [0, tn * BN, col_idx.get([block]) * 128 + half], pipe);
            });
        }
    } else {
        setmaxnreg(232);
        let row = (warpgroup::id() - 1) * 64;
        for tile in queue.take() {
            let (tm, tn, _first, k_steps) = bsr_tile(tile, row_ptr, per_batch, tiles_m, group, 2);
            #[rustfmt::skip]
            gemm_consume::<0, BN, 0, 0>(
                sa, sb, sc, c, pipe, row, k_steps, 0, 0, tm * 128 + row, tn * BN, 0,
                |_bt, _m0, _n0, _k| Tile::<f32, 64, 1>::zeros(),
                |acc, _bt, _m0, _n| scaled_act(acc, alpha, act),
            );
        }
        tma::store_wait(0);
    }
}

/// [`gemm_bsr`] for 64×64 blocks: a tile is one block row (64 rows) × `BN` columns, its K steps
/// one a nonzero block, the two consumers taking `BN / 2` columns each (B's stage split between
/// them, A's shared).
#[kernel(warpgroups = 3, dtypes(T = [bf16, f16]), tune(BN = [256, 128], STAGES = [4]), targets(sm_90a))]
pub fn gemm_bsr64(
    values: Global<T, 3>, row_ptr: Global<i32, 1>, col_idx: Global<i32, 1>, b: Global<T, 3>, c: Global<T, 3>, counter: Global<i32, 1>,
    alpha: f32, act: i32,
) {
    let sa = Smem::<T, 64, 64>::ring(STAGES);
    let sb = Smem::<T, BN, 64>::ring(STAGES);
    let sc = Smem::<T, 64, 64>::ring(4);
    let pipe = Pipeline::<STAGES>::new(2);
    let tiles_m = (c.dim(1) + 63) / 64;
    let tiles_n = (c.dim(2) + BN - 1) / BN;
    let per_batch = tiles_m * tiles_n;
    let group = 8 * tiles_n;
    let queue = TileQueue::<2>::new(counter, 2);
    if warpgroup::id() == 0 {
        setmaxnreg(40);
        for tile in queue.fetch(per_batch) {
            let (_tm, tn, first, k_steps) = bsr_tile(tile, row_ptr, per_batch, tiles_m, group, 1);
            fill_stages(pipe, k_steps, |s, k| {
                let block = first + k;
                tma::load(sa.at(s), values, [block, 0, 0], pipe);
                tma::load(sb.at(s), b, [0, tn * BN, col_idx.get([block]) * 64], pipe);
            });
        }
    } else {
        setmaxnreg(232);
        let half = (warpgroup::id() - 1) * (BN / 2);
        for tile in queue.take() {
            let (tm, tn, _first, k_steps) = bsr_tile(tile, row_ptr, per_batch, tiles_m, group, 1);
            let mut acc = Tile::<f32, 64, { BN / 2 }>::zeros();
            gemm_mma::<0>(&mut acc, sa, sb, pipe, 0, half, k_steps);
            gemm_epilogue_store::<0>(acc, c, sc, 0, 0, tm * 64, tn * BN + half, 0, |acc, _bt, _m0, _n| scaled_act(acc, alpha, act));
        }
        tma::store_wait(0);
    }
}

/// `act(alpha · acc)`: the block-sparse GEMM's epilogue.
#[tessera::device]
fn scaled_act(acc: Tile<f32, 64, 64>, alpha: f32, act: i32) -> Tile<f32, 64, 64> {
    let mut out = acc * alpha;
    activate(&mut out, act);
    out
}

/// A block-sparse matrix in block-CSR with `B`×`B` blocks, `B` 128 or 64 (from `values`' shape),
/// checked: `values` `[nnz, B, B]` (each nonzero block, row-major), `row_ptr` `[⌈rows/B⌉ + 1]`
/// (i32: block row `i`'s blocks are `row_ptr[i]..row_ptr[i + 1]`, from 0, non-decreasing, ending
/// at `nnz`), `col_idx` `[nnz]` (i32: each block's block column, below `⌈cols/B⌉`). Blocks on
/// the matrix's last row or column reach past `rows` or `cols`; those elements are ignored.
#[derive(Clone, Copy, Debug)]
pub struct Bsr<'t, T: GemmElement> {
    values: &'t Tensor<T>,
    row_ptr: &'t Tensor<i32>,
    col_idx: &'t Tensor<i32>,
    rows: usize,
    cols: usize,
    block: usize,
}

impl<'t, T: GemmElement> Bsr<'t, T> {
    /// A `rows` × `cols` block-sparse matrix, its structure checked on the host once (one copy
    /// of `row_ptr` and `col_idx` back: build it once and reuse it, the GEMM itself reads them
    /// only on the device).
    ///
    /// # Errors
    /// [`Error::Argument`] naming `values`, `row_ptr` or `col_idx` when a shape does not match,
    /// the row pointer does not start at 0, decreases or does not end at `nnz`, or a column index
    /// is out of range.
    pub fn new(values: &'t Tensor<T>, row_ptr: &'t Tensor<i32>, col_idx: &'t Tensor<i32>, rows: usize, cols: usize) -> Result<Bsr<'t, T>> {
        let (nnz, block) = match *values.shape() {
            [nnz, r, c] if r == c && BSR_BLOCKS.contains(&r) => (nnz, r),
            _ => return Err(arg("values", "[nnz, 128, 128] or [nnz, 64, 64] blocks".into(), format!("shape {:?}", values.shape()))),
        };
        let (block_rows, block_cols) = (rows.div_ceil(block), cols.div_ceil(block));
        if rows == 0 || cols == 0 {
            return Err(arg("values", "a matrix of at least one row and column".into(), format!("{rows}×{cols}")));
        }
        crate::check_shape("gemm_bsr", "row_ptr", row_ptr, &[block_rows + 1])?;
        crate::check_shape("gemm_bsr", "col_idx", col_idx, &[nnz])?;
        let ptr = row_ptr.to_host()?;
        if ptr[0] != 0 || ptr[block_rows] as usize != nnz || ptr.windows(2).any(|w| w[1] < w[0]) {
            let bad = ptr.windows(2).position(|w| w[1] < w[0]);
            return Err(arg(
                "row_ptr",
                format!("non-decreasing block offsets from 0 to nnz = {nnz}"),
                match bad {
                    Some(i) => format!("row_ptr[{}] = {} after row_ptr[{i}] = {}", i + 1, ptr[i + 1], ptr[i]),
                    None => format!("first {}, last {}", ptr[0], ptr[block_rows]),
                },
            ));
        }
        let idx = col_idx.to_host()?;
        if let Some(i) = idx.iter().position(|&c| c < 0 || c as usize >= block_cols) {
            return Err(arg("col_idx", format!("block columns in 0..{block_cols}"), format!("col_idx[{i}] = {}", idx[i])));
        }
        Ok(Bsr { values, row_ptr, col_idx, rows, cols, block })
    }

    /// The side of its blocks: 128 or 64.
    pub fn block(&self) -> usize {
        self.block
    }

    /// `(rows, cols)`.
    pub fn shape(&self) -> (usize, usize) {
        (self.rows, self.cols)
    }

    /// The nonzero blocks.
    pub fn nnz_blocks(&self) -> usize {
        self.values.shape()[0]
    }
}

/// A block-sparse GEMM, built with [`gemm_bsr`] and run with [`BsrGemmBuilder::run`].
#[derive(Clone, Copy, Debug)]
pub struct BsrGemmBuilder<'t, T: GemmElement> {
    a: Bsr<'t, T>,
    b: &'t Tensor<T>,
    alpha: f32,
    activation: Activation,
    variant: Option<&'t str>,
}

/// Starts `C = A·Bᵀ` with A block-sparse ([`Bsr`], M×K, 128×128 or 64×64 blocks) and B dense
/// (N×K): C `[M, N]`.
///
/// ```no_run
/// use tessera::{bf16, Device, Tensor};
/// use tessera_kernels::{gemm_bsr, Bsr};
/// let dev = Device::new(0)?;
/// // A 256×512 matrix with two nonzero 128×128 blocks: (0, 1) and (1, 3).
/// let values = Tensor::<bf16>::zeros(&dev, &[2, 128, 128])?;
/// let row_ptr = Tensor::from_host(&dev, &[0i32, 1, 2], &[3])?;
/// let col_idx = Tensor::from_host(&dev, &[1i32, 3], &[2])?;
/// let a = Bsr::new(&values, &row_ptr, &col_idx, 256, 512)?;
/// let b = Tensor::<bf16>::zeros(&dev, &[1024, 512])?;
/// let mut c = Tensor::<bf16>::zeros(&dev, &[256, 1024])?;
/// gemm_bsr(a, &b).run(&dev, &mut c)?;
/// # Ok::<(), tessera::Error>(())
/// ```
pub fn gemm_bsr<'t, T: GemmElement>(a: Bsr<'t, T>, b: &'t Tensor<T>) -> BsrGemmBuilder<'t, T> {
    BsrGemmBuilder { a, b, alpha: 1.0, activation: Activation::None, variant: None }
}

/// The variants of the block-sparse kernel for `T` and blocks of side `block` (64 or 128;
/// `tune(BN)`: 256, then 128); none for another side.
pub fn gemm_bsr_variants<T: GemmElement>(block: usize) -> Vec<&'static str> {
    if !BSR_BLOCKS.contains(&block) {
        return Vec::new();
    }
    T::bsr_variants(block == 64).iter().map(|s| s.name).collect()
}

impl<'t, T: GemmElement> BsrGemmBuilder<'t, T> {
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

    /// Runs the variant named `name` (one of [`gemm_bsr_variants`] for A's block side) instead
    /// of asking the tuner.
    pub fn variant(mut self, name: &'t str) -> Self {
        self.variant = Some(name);
        self
    }

    /// Runs it into `c` (`[M, N]`, contiguous; where its rows are not 16-byte multiples the kernel
    /// writes a padded C, copied into `c` after). B whose
    /// rows TMA cannot address (K not a multiple of 8) is first copied into a zero-padded buffer.
    /// Hopper (and the interpreter).
    ///
    /// # Errors
    /// [`Error::Argument`] naming the tensor when B is not `[N, K]` with A's K, C is not `[M, N]`
    /// or is not contiguous, or the device is not a Hopper GPU; and the launch's own checks.
    pub fn run(self, device: &Device, c: &mut Tensor<T>) -> Result<()> {
        let (m, k) = self.a.shape();
        let n = match *self.b.shape() {
            [n, kb] if kb == k => n,
            _ => return Err(arg("b", format!("N×{k} (K = {k} to match a)"), format!("shape {:?}", self.b.shape()))),
        };
        crate::check_shape("gemm_bsr", "c", c, &[m, n])?;
        if n == 0 {
            return Err(arg("b", "N ≥ 1 rows".into(), format!("shape {:?}", self.b.shape())));
        }
        let blk = self.a.block;
        let variants = T::bsr_variants(blk == 64);
        check_hopper("gemm_bsr", device, variants[0])?;
        let (mut pb, mut pv) = (None, None);
        let b = tma_ready(device, "b", self.b, [1, n, k], &mut pb)?;
        let values = tma_ready(device, "values", self.a.values, [self.a.nnz_blocks(), blk, blk], &mut pv)?;
        let row_ptr = self.a.row_ptr.view(self.a.row_ptr.shape(), self.a.row_ptr.strides())?;
        let col_idx = self.a.col_idx.view(self.a.col_idx.shape(), self.a.col_idx.strides())?;
        let mut padded = tma_output("gemm_bsr", device, c, m, n, false)?;
        let n8 = padded.as_ref().map_or(n, |p| p.shape()[1]);
        let names: Vec<&str> = variants.iter().map(|v| v.name).collect();
        let epi = (self.alpha, self.activation.code());
        let run = |i: usize, c: &mut Tensor<T>| {
            let bn = variants[i].knob("BN").unwrap_or(256) as usize;
            // A tile a block row: 128 rows, or 64 (the consumers splitting the columns).
            let tiles = Grid::tiles(n8, bn).saturating_mul(Grid::tiles(m, blk));
            let g = Grid::from(tiles.min(device.sm_count()));
            T::gemm_bsr(device, g, blk == 64, i, (&values, &row_ptr, &col_idx), &b, c, [1, m, n8], epi)
        };
        let (dtype, shape, act) = (T::DTYPE, [m, n, k, self.a.nnz_blocks(), blk], self.activation);
        let key = tessera::TuneKey::new("gemm_bsr", device).field("dtype", &dtype).field("shape", &shape).field("activation", &act);
        let choice = pick_variant(device, "gemm_bsr", &key, &names, 0, self.variant, &[m, n8], &run)?;
        run(choice, padded.as_mut().unwrap_or(c))?;
        unpad(device, padded, c, m, n)
    }
}
