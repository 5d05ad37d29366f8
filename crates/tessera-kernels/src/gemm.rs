//! GEMM on Hopper: TMA into a 4-stage shared ring, one producer and two consumer warpgroups,
//! wgmma m64n256k16 accumulating in f32, masked stores of C.

use tessera::{bf16, kernel, tma_unfit, Device, Error, Grid, Result, Tensor};

/// Rows and columns of C per block, and the K step.
const BM: usize = 128;
const BN: usize = 256;

/// `C = A·Bᵀ`: A is M×K, B is N×K (the "TN" layout of LLM weights), both bf16 row-major;
/// C is M×N bf16. A persistent grid walks 128×256 tiles of C in groups of 8 tile-rows, so
/// that neighbouring blocks share B's columns in L2.
///
/// Warpgroup 0 produces: for each 64-wide K step it waits for a free stage, copies A's
/// 128×64 and B's 256×64 boxes there by TMA (edges zero-filled) and commits. Warpgroups 1
/// and 2 consume: each waits for a full stage and multiplies its 64 rows of A by B into a
/// 64×256 f32 accumulator, keeping one MMA group in flight and releasing the stage before it.
/// Then each stores its rows of C, while the producer already fills the next tile's stages.
#[kernel(warpgroups = 3)]
pub fn gemm_tn_bf16(a: Global<bf16, 2>, b: Global<bf16, 2>, c: Global<bf16, 2>) {
    let sa = Smem::<bf16, 128, 64>::ring(4);
    let sb = Smem::<bf16, 256, 64>::ring(4);
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
            let m0 = (first + (tile % group) % height) * 128;
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
            c.store([m0 + row, n0], acc.cast::<bf16>());
        }
    }
}

/// Copies `x` into the top-left of `y`; the rest of `y` (the padding) gets zeros.
#[kernel]
pub fn pad_copy_bf16(x: Global<bf16, 2>, y: Global<bf16, 2>) {
    let r = block::id_y() * 16;
    let c = block::id_x() * 128;
    let t: Tile<bf16, 16, 128> = x.load([r, c]);
    y.store([r, c], t);
}

/// `x` as a tensor TMA can copy: itself, or a copy whose rows are padded with zeros to a
/// multiple of 8 elements (16 bytes).
fn tma_ready<'t>(device: &Device, x: &'t Tensor<bf16>, scratch: &'t mut Option<Tensor<bf16>>) -> Result<&'t Tensor<bf16>> {
    let (r, k) = (x.shape()[0], x.shape()[1]);
    let ptr_ok = (x.offset() * 2).is_multiple_of(16);
    if ptr_ok && x.strides()[1] == 1 && (x.strides()[0] * 2).is_multiple_of(16) {
        return Ok(x);
    }
    let mut padded = Tensor::<bf16>::zeros(device, &[r, k.next_multiple_of(8)])?;
    pad_copy_bf16::launch(device, (Grid::tiles(k.next_multiple_of(8), 128), Grid::tiles(r, 16)), x, &mut padded)?;
    Ok(scratch.insert(padded))
}

/// `C = A·Bᵀ` for bf16 A (M×K), B (N×K) and C (M×N), accumulating in f32.
///
/// Any M, N, K ≥ 1: edges are handled by TMA's zero fill and masked stores; operands whose
/// rows TMA cannot address (K not a multiple of 8, odd strides, a misaligned view) are first
/// copied into zero-padded buffers. Runs on compute capability 9.0 (H100, H200).
///
/// # Errors
/// [`Error::Argument`] naming the tensor when a shape does not match or is empty, and the
/// launch's own checks.
pub fn gemm_tn(device: &Device, a: &Tensor<bf16>, b: &Tensor<bf16>, c: &mut Tensor<bf16>) -> Result<()> {
    let (m, k) = crate::check_2d("gemm", "a", a)?;
    let (n, kb) = crate::check_2d("gemm", "b", b)?;
    if kb != k {
        return Err(Error::Argument {
            kernel: "gemm",
            arg: "b".into(),
            expected: format!("N×K with K = {k} (a is {m}×{k})"),
            found: format!("shape {:?}", b.shape()),
        });
    }
    crate::check_shape("gemm", "c", c, &[m, n])?;
    if m == 0 || n == 0 || k == 0 {
        return Err(Error::Argument {
            kernel: "gemm",
            arg: "a".into(),
            expected: "M, N, K ≥ 1".into(),
            found: format!("M={m}, N={n}, K={k}"),
        });
    }
    let (mut sa, mut sb) = (None, None);
    let a = tma_ready(device, a, &mut sa)?;
    let b = tma_ready(device, b, &mut sb)?;
    debug_assert!(tma_unfit(0, tessera::DType::BF16, a.shape(), a.strides()).is_none());
    let tiles = Grid::tiles(m, BM).saturating_mul(Grid::tiles(n, BN));
    gemm_tn_bf16::launch(device, tiles.min(device.sm_count()), a, b, c)
}
