//! Tessera: GPU kernels written as annotated Rust functions.
//!
//! `#[tessera::kernel]` compiles a function written in a tile language to PTX while
//! `cargo build` runs (no CUDA toolkit needed), and generates a module with a typed
//! launcher. This crate is the runtime the launcher runs on: [`Device`], [`Tensor`],
//! argument checks, a module cache, launch — on a GPU, or on the CPU interpreter of the
//! kernel's TIR-H ([`Device::cpu`]), which takes the same calls and reports deadlocks and
//! reads of unwritten shared memory as [`Error::Kernel`] at the DSL line.
//!
//! ```ignore
//! use tessera::{kernel, Device, Grid, Tensor};
//!
//! #[kernel]
//! pub fn scale(a: f32, x: Global<f32, 2>, y: Global<f32, 2>) {
//!     let (r, c) = (block::id_y() * 16, block::id_x() * 256);
//!     let t: Tile<f32, 16, 256> = x.load([r, c]);
//!     y.store([r, c], t * a);
//! }
//!
//! let dev = Device::new(0)?;
//! let x = Tensor::from_host(&dev, &vec![1.0f32; 100 * 300], &[100, 300])?;
//! let mut y = Tensor::<f32>::zeros(&dev, &[100, 300])?;
//! scale::launch(&dev, (Grid::tiles(300, 256), Grid::tiles(100, 16)), 2.0, &x, &mut y)?;
//! ```
//!
//! # CUDA ↔ Tessera
//!
//! | CUDA | Tessera |
//! |---|---|
//! | `__global__ void k(float* x, int n)` | `#[kernel] fn k(x: Global<f32, 1>)` (dims travel with the tensor) |
//! | `blockIdx.x` | `block::id_x()` |
//! | `threadIdx.x` | none: a kernel speaks of tiles held by a warpgroup (128 threads) |
//! | `warp specialization` | `warpgroup::id()` |
//! | registers | `Tile<T, M, N>` |
//! | bounds checks `if (i < n)` | implicit: `load` fills, `store` skips, out of bounds |
//! | `expf` | `exp2` with the `log2(e)` scale folded in |
//! | `__shfl_xor_sync` reductions | `row_sum`, `row_max`, `t.sum(axis)` |
//! | `cudaLaunchKernel` | `kernel::launch(&device, grid, args…)` |
//!
//! # The language
//!
//! A kernel describes one thread block of `warpgroups × 128` threads (default one
//! warpgroup; `#[kernel(warpgroups = 2)]` for more).
//!
//! - Parameters: `Global<T, R>` tensors (`T` = `f32`, `bf16`, `f16`, or `i32` for counters
//!   and indices; `R` = 1 to 5) and scalars `f32`, `i32`.
//! - Statements: `let`, `let mut`, assignment (`=`, `+=`, …), `for i in (a..b).step_by(k)`,
//!   `while cond { … }` (a condition alike in every thread: a scalar), `if … else`, `tensor.store([i, j], tile)`, `tensor.atomic_add([i, j], tile)` (f32 into an
//!   f32 tensor, each element once, in no fixed order across blocks), `tensor.atomic_max([i, j],
//!   tile)` (the larger kept: an amax over blocks),
//!   `let old = counter.fetch_add([i], v)` (one atomic addition to an `i32` element per
//!   warpgroup, its old value given to every thread: it releases the warpgroup's earlier
//!   writes — TMA stores and reduce-adds completed first — and acquires those of the
//!   warpgroups whose additions it sees, at GPU scope; the warpgroup that draws the last of `n`
//!   tickets reads what the others wrote: split-K's fixup, a grid-wide count);
//!   `counter.fetch_add([i], v);` without the `let` raises a flag (the same release, nothing
//!   waits for it), and `let flag = flags.wait_nonzero([i])` waits until an `i32` element is
//!   not 0 and acquires what its raiser released — with `while`, a block's look-back over the
//!   flags of the blocks before it (a block may wait only on blocks of lower index, which the
//!   GPU starts first).
//! - Scalars: literals, `block::id_x()`/`_y`/`_z`, `grid::dim_x()`, `warpgroup::id()`,
//!   `tensor.dim(axis)`, `tensor.get([i, j])` (one element, 16-bit floats widened to `f32`; 0 out of bounds),
//!   arithmetic, comparisons, `as f32`/`as i32`.
//! - Tiles (`M` a power of two, `N` a power of two or a multiple of 8 such as 176, 2304 or 5120;
//!   `Tile` or `tile`): `Tile::<T, M, N>::zeros()`,
//!   `::full(v)`, `let t: Tile<T, M, N> = x.load([i, j])`, `x.load_or([i, j], fill)`,
//!   `+ - * /`, `max`, `min`, `exp2`, `abs`, `sqrt`, `rsqrt`, `tanh`, `erf`, `sin`, `cos`,
//!   `sin_reduced`/`cos_reduced` (no range reduction: arguments in [−π, π], checked by the
//!   interpreter), `floor`, `step` (1.0 where `x ≥ 0`, else 0.0), `.cast::<bf16>()`, `row_sum`, `row_max`,
//!   `col_sum`, `t.sum(axis)`,
//!   `Tile::<f32, M, N>::col_index()` / `row_index()` (each element's column or row),
//!   `Tile::<f32, M, N>::uniform(seed_lo, seed_hi, offset, [row, col])` (Philox4x32-10 numbers
//!   in [0, 1): see [`random`] for the exact definition and the host's copy),
//!   `Tile::<f32, M, N>::uniform8(seed_lo, seed_hi, offset, stream, [row, col])` and
//!   `uniform8_t(…)` (its transpose's: element `(i, j)` drawn at `[row + j, col + i]`) —
//!   multiples of 1/256, a Philox call per 4×4 block, origins multiples of 16: dropout masks
//!   drawn alike by a kernel that walks `Q·Kᵀ` and one that walks `K·Qᵀ`
//!   ([`random::uniform8`]),
//!   `t.swap_pairs()` (columns 2k and 2k+1 exchanged, in registers),
//!   `t.shift_cols(k, fill)` and `shift_rows` (f32 tiles; element `j` takes element `j − k`,
//!   the first `k` take `fill`; `k` a constant, negative the other way) — with a tile of `t`'s
//!   type as the fill, a funnel shift: the window `k` back along `[fill | t]` (`|k|` ahead
//!   along `[t | fill]`), the neighbouring tiles of a sliding window (a short convolution's
//!   taps: `tessera_kernels::prelude::depthwise_conv_short`) — in shuffles where a row lies in
//!   one warp's lanes, else through shared memory, `t.last_col()` (the last
//!   column, `M×1`: a chunked scan's carry), `t.mask_cols(limit, fill)`
//!   (columns from `limit` on replaced; `limit` an `i32`, or a `Tile<f32, M, 1>` of one per
//!   row), `t.keep_where(cond, fill)` (elements whose `cond`, an f32 tile of `t`'s shape or
//!   one broadcast to it, is below 0 — or NaN — replaced by `fill`; a condition computed from
//!   `row_index()`, `col_index()` and scalars, even through `let`s and device-function
//!   parameters, is evaluated element by element in `t`'s own layout, a sum of them as a row's
//!   part plus a column's immediate). `M×1` and `1×N` tiles broadcast.
//! - Across warpgroups: `let s = block_sum(t);` (`block_max`, `block_min`) combines each
//!   warpgroup's own `t` (same type in all) elementwise through shared memory between two
//!   barriers of the whole block, in warpgroup order, so every warpgroup gets the same bits:
//!   `block_sum(row_sum(x))` sums rows spread over the warpgroups (`tessera_kernels::rms_norm_wide`).
//!   Every warpgroup must reach it, and it is the whole value of a `let`.
//! - `tile_all(t)`: `true` where every element of this warpgroup's float tile `t` is `≥ 0`
//!   (NaN is not), the same in all of its threads (one barrier of the warpgroup, which each of
//!   its threads must reach): an `if` for the whole warpgroup on its data, such as a fast path
//!   taken where the inputs allow it (`tessera_kernels::logcumsumexp`).
//! - Scheduling: consecutive `let`s of tile loads (each maybe `.cast`) whose indices do not use
//!   each other issue as one group, every vector in flight before any is used; consecutive
//!   `let`s of independent reductions (`let a = row_sum(x); let b = row_sum(x * x);`) share
//!   one exchange across warps.
//!
//! - `x.prefetch::<Tile<T, M, N>>([i, j])`: asks L2 for the lines the same `load` would read
//!   (`prefetch.global.L2`, in-bounds elements only) and goes on: no registers, no wait. A
//!   block that prefetches the rows a later block will read keeps HBM busy while it reduces
//!   (the norm kernels: LayerNorm 0.79 → 0.90 of copy bandwidth).
//! - `#[unroll] for j in 0..4 { … }` repeats a body with `j` a constant; `acc.cols(j * 64, 64)`
//!   is a constant column slice of an MMA accumulator (no data moves).
//! - Attributes: `#[kernel(warpgroups = 3)]`, `#[kernel(dtypes(T = [bf16, f16]))]` (one
//!   kernel per type, named `<fn>_bf16`, `<fn>_f16`, with `T` replaced),
//!   `#[kernel(blocks_per_sm = 6)]` (ptxas caps the registers so that six blocks fit an SM),
//!   `#[kernel(tune(BN = [256, 128], STAGES = [4, 3]))]` (one variant per combination, each
//!   name replaced by its value anywhere in the body — tile shapes, ring depths, loop bounds;
//!   the module's `VARIANTS` hold them with their `knobs`, the first the default, and
//!   `launch_variant(i, …)` runs one; combinations that do not compile, such as those over the
//!   target's shared memory, are dropped, and none left is an error at `tune`;
//!   `tune(D = [64, 256], BN = [128, 64], only(D < 256 || BN == 64))` builds only the
//!   combinations where the condition on the knobs holds; it may compare a `dtypes`
//!   parameter, `only(T == f32 && C == 128 || T != f32 && C == 1024)`, so that each type's
//!   kernel has its own variants). The
//!   [`Tuner`] picks among variants at run time ([`tune`]).
//!
//! ## Hopper (sm_90a)
//!
//! - `Smem::<T, M, N>::ring(stages)` (`M` a power of two or a multiple of 8, `N` a power of
//!   two or whole panels of one swizzle span — 192 16-bit columns are three 128-byte panels,
//!   96 three 64-byte ones (head dim 96) —; an unswizzled ring's any multiple of 8; 1 to 64
//!   stages): a ring of shared tiles, swizzled by the row width (128, 64 or 32 bytes; wider
//!   rows in panels of the widest span dividing them; `ring_swizzled(stages, bytes)` to
//!   choose), placed 1024-aligned in dynamic
//!   shared memory (the launcher raises the limit above 48 KiB). Rows narrower than 16 bytes
//!   are fine where no TMA copies them: `Smem::<f32, 128, 1>::ring(16)` holds sixteen values a
//!   thread for the 128 threads of a warpgroup, each `ring.at(n).load()` a `Tile<f32, 128, 1>`
//!   (`tessera_kernels::kernels::selective_scan_fwd_rows_bf16` keeps its per-state carries so).
//! - `Pipeline::<STAGES>::new(consumers)`: full/empty mbarriers per stage. The producer
//!   `let s = pipe.acquire();` … `pipe.commit(s);`, each consumer `let s = pipe.wait();` …
//!   `pipe.release(s);`.
//! - `tma::load(ring.at(s), tensor, [i, j], pipe)`: a TMA box copy completing on the stage's
//!   barrier; the runtime builds and caches the tensor map. Out-of-bounds elements land as 0.
//!   A box's first column must lie a multiple of 16 bytes into its row (column × element
//!   size): elsewhere the GPU stops on an illegal instruction, and the interpreter refuses it.
//! - `mma_sync(acc, a, b)`: `acc += a·bᵀ` with `wgmma.mma_async` m64nNk16 from shared
//!   views `a` (M×K) and `b` (N×K); `view.rows(r, 64)` selects rows (whole 8-row atoms of a
//!   swizzled ring, any number of an unswizzled one: `view.rows(n, 1).load()` is row `n`), and
//!   `view.cols(c, n)` whole column panels of a swizzled ring (64 bf16 columns each under
//!   128 bytes; `c` constant; or the whole view): two warpgroups can each take half of a
//!   stage's columns as B, or of a transposed A's; `mma_wait(n)` leaves
//!   at most `n` groups in flight. `mma_sync_kn(acc, a, b)` takes `b` stored K×N (N-major);
//!   `ring.at(s).t()` as `a` takes A stored K×M (M-major, 16-bit): `mma_sync_kn(h,
//!   sk.at(s).t(), sv.at(s))` is `h += Kᵀ·V` with K and V as they arrived, time along rows.
//! - `setmaxnreg(n)` in each role's branch of `if warpgroup::id() == 0 { … } else { … }`.
//! - `view.store(tile)` writes a register tile into a shared view (swizzled; a 16-bit
//!   accumulator-layout tile 64 columns wide by `stmatrix`, four 8×8 fragments at a time;
//!   into a ring that an `mma_sync` reads, the stores are fenced for the async proxy and the
//!   warpgroup synced, so that its next MMA sees them); `view.load()` reads a shared view back
//!   into registers (what TMA put there, or another warpgroup's `store` behind a
//!   `barrier::sync`): consumers exchange partial sums this way;
//!   `tma::store(tensor, [i, j], view)` stores it with a TMA bulk copy (out-of-bounds elements
//!   skipped), `tma::store_wait(n)` waits until at most `n` such stores still read shared memory;
//!   `tma::reduce_add(tensor, [i, j], view)` adds the view into an f32 tensor instead (a bulk
//!   reduce the L2 performs, atomic per element: partial sums of many blocks into one tensor,
//!   as the attention backward's dQ), waited for the same way.
//! - Fragment order, for f32 accumulators that only travel between MMAs and memory:
//!   `view.store_fragments(acc)` writes each thread's registers four at a time (an
//!   `st.shared.v4`, a warp's 512 bytes contiguous: no bank conflicts) into an unswizzled view
//!   of the accumulator's shape, at `((i / 4)·128 + t)·4 + i % 4` for thread `t`'s register
//!   `i` (`tessera_ptx::layout::fragment_offset` says where element `(r, c)` lands);
//!   `tma::reduce_add_flat(tensor, [i, j], view)` adds a contiguous view (a stage, or rows
//!   of one) into the f32 tensor's consecutive elements from `[i, j]` by one 1-D bulk reduce
//!   (no tensor map; 16-byte aligned), `tma::store_flat` copies it; and
//!   `tensor.load_fragments::<Tile<f32, 64, N>>([i, j])` reads such a block back as an
//!   accumulator (one `ld.global.v4` a quad). The attention backward sums its dQ so.
//!
//! The same statements lower to `sm_80` too: TMA loads to `cp.async` by the producer
//! warpgroup, the pipeline's waits to `mbarrier.test_wait`, `mma_sync` to `ldmatrix` +
//! `mma.sync.m16n8k16` (whose accumulator fragment matches wgmma's, so epilogues are shared),
//! `setmaxnreg` and `mma_wait` to nothing. `#[kernel(targets(sm_90a))]` builds one target only.
//! See `tessera_kernels::kernels::gemm_tn_bf16` for a whole warp-specialized GEMM.
//!
//! A misuse is a compile error at the offending token.
#![warn(missing_docs)]

mod device;
pub mod dist;
mod error;
mod fp8;
mod interp;
mod launch;
pub mod nvtx;
pub mod report;
mod tensor;
pub mod testing;
mod tma;
pub mod tune;

pub use device::{driver_present, library_present, Device};
pub use error::{Error, Result};
pub use fp8::{F8E4M3, F8E5M2};
pub use half::{bf16, f16};
pub use launch::{variant_of, Grid, Launch, ScalarArg};
pub use tensor::{
    contiguous_strides, global, global_mut, in_place, split_outer, Absent, ArgGuard, BorrowedTensor, Counters, CudaGlobal, Element,
    GlobalArg, GlobalArgMut, GlobalDesc, HostBuffer, InPlace, Optional, OptionalMut, Part, Tensor, TensorView, TensorViewMut, Workspace,
    WorkspaceView,
};
#[doc(hidden)]
pub use tessera_macros::__resume;
pub use tessera_macros::{device, kernel};

/// What a `#[device]` function's host-side name asks of its arguments, which nothing meets: a
/// device function runs only inlined into a kernel, so calling it from host code is a compile
/// error at the call.
#[diagnostic::on_unimplemented(
    message = "a `#[tessera::device]` function is called from host code",
    label = "device functions run inside kernels",
    note = "call it from a `#[tessera::kernel]` or another `#[tessera::device]` function, where it is inlined"
)]
pub trait DeviceFunction: sealed::Sealed {}

mod sealed {
    pub trait Sealed {}
}
pub use tessera_ptx::random;
pub use tessera_ptx::{DType, KernelSpec, Packed, ParamInfo, ParamKind, PtxVariant, Target, TmaBox};
pub use tma::{tma_unfit, TensorMap, TmaDescriptorCache};
pub use tune::{TuneKey, TuneMode, Tuner};

/// cudarc, as Tessera uses it, for sharing streams and buffers.
pub use cudarc;
