//! Context-parallel (ring) attention over a [`tessera::dist::Communicator`]: the sequence
//! split across the ranks of a group, each rank's queries attending to every rank's keys as
//! the key/value blocks travel round the ring.
//!
//! Causal attention splits the sequence into `2·world` chunks and gives rank `r` chunks `r` and
//! `2·world − 1 − r` (zig-zag), so that every rank does the same work: at step 0 a rank attends
//! causally over its own two chunks (their order is the sequence's, so the causal mask of the
//! two side by side is the right one); at step `s` it holds the blocks of rank `j = r − s`
//! (mod `world`), and either all its queries attend to chunk `j` alone (`j < r`: chunk
//! `2·world − 1 − j` lies after both of its chunks) or its second chunk's queries attend to
//! both of `j`'s chunks (`j > r`: both lie between its own), unmasked — half the diagonal's
//! work either way. Each step's output and log-sum-exp are merged into f32 running sums
//! (`attention_merge`); the next block is exchanged (a send to `r + 1`, a receive from
//! `r − 1`, one group) before the step's attention runs, on the communicator's stream — on a
//! stream of its own ([`Communicator::with_stream`]) it overlaps the attention. The backward
//! ([`ring_attention_backward`]) runs the same block pairs through `attention_backward`, the
//! key/value blocks travelling with the f32 sums of their gradients, which reach their owner
//! after the last step.

use crate::attention::{attention_backward, attention_with_lse, Attention, AttentionElement, AttentionGrads, AttentionLayout};
use tessera::dist::{group, Communicator};
use tessera::{bf16, device, f16, kernel, Device, Error, Grid, Result, Tensor};

/// A merge block's `(batch entry, head, first row)`: the grid's second axis counts the (batch
/// entry, head) pairs of `heads` heads, its first the 64-row tiles.
#[device]
fn merge_block(heads: i32) -> (i32, i32, i32) {
    let bh = block::id_y();
    let b = bh / heads;
    (b, bh - b * heads, block::id_x() * 64)
}

/// A rows block's `(batch entry, first row, first column)` over `rows` rows: the grid's second
/// axis counts the batch entries' 16-row tiles, its first the 256-column tiles.
#[device]
fn rows_block(rows: i32) -> (i32, i32, i32) {
    let tiles = (rows + 15) / 16;
    let bt = block::id_y();
    let b = bt / tiles;
    (b, (bt - b * tiles) * 16, block::id_x() * 256)
}

/// `acc[b, h, row0 + i, :] ← acc·e^(L₁ − L) + part·e^(L₂ − L)` and `acc_lse ← L`, with `L`
/// the log-sum-exp of the two (natural logs; a row masked in both stays 0 and −∞), the sum
/// starting from `part` where `first`. Tensors as `[b, h, s, d]` views (`lse` as `[b, h, s,
/// 1]`); 64 rows a block over `part`'s rows, the head dim in 64-column panels.
#[kernel(dtypes(T = [bf16, f16]))]
pub fn attention_merge(acc: Global<f32, 4>, acc_lse: Global<f32, 4>, part: Global<T, 4>, part_lse: Global<f32, 4>, row0: i32, first: i32) {
    let (b, h, s0) = merge_block(acc.dim(1));
    let r0 = row0 + s0;
    let l2 = part_lse.load_or::<Tile<f32, 64, 1>>([b, h, s0, 0], f32::NEG_INFINITY);
    let mut l1 = Tile::<f32, 64, 1>::full(f32::NEG_INFINITY);
    if first == 0 {
        l1 = acc_lse.load_or::<Tile<f32, 64, 1>>([b, h, r0, 0], f32::NEG_INFINITY);
    }
    let m = max(max(l1, l2), -1.0e30);
    let w1 = exp2((l1 - m) * f32::consts::LOG2_E);
    let w2 = exp2((l2 - m) * f32::consts::LOG2_E);
    let sum = w1 + w2;
    let a1 = w1 * (1.0 / max(sum, 1.0e-30));
    let a2 = w2 * (1.0 / max(sum, 1.0e-30));
    acc_lse.store([b, h, r0, 0], m + log2(sum) * f32::consts::LN_2);
    for c in 0..(acc.dim(3) + 63) / 64 {
        let o2 = part.load_or::<Tile<T, 64, 64>>([b, h, s0, c * 64], 0.0).cast::<f32>();
        let mut o1 = Tile::<f32, 64, 64>::zeros();
        if first == 0 {
            o1 = acc.load_or::<Tile<f32, 64, 64>>([b, h, r0, c * 64], 0.0);
        }
        acc.store([b, h, r0, c * 64], o1 * a1 + o2 * a2);
    }
}

/// The merged sums out: `out = acc` in `T`, `out_lse = acc_lse`; views as
/// [`attention_merge`]'s, 64 rows a block.
#[kernel(dtypes(T = [bf16, f16]))]
pub fn attention_merge_finish(acc: Global<f32, 4>, acc_lse: Global<f32, 4>, out: Global<T, 4>, out_lse: Global<f32, 4>) {
    let (b, h, s0) = merge_block(acc.dim(1));
    out_lse.store([b, h, s0, 0], acc_lse.load::<Tile<f32, 64, 1>>([b, h, s0, 0]));
    for c in 0..(acc.dim(3) + 63) / 64 {
        out.store([b, h, s0, c * 64], acc.load::<Tile<f32, 64, 64>>([b, h, s0, c * 64]).cast::<T>());
    }
}

/// `out[b, i, j] = x[b, row0 + i, j]` over `out`'s extent: 16 rows × 256 columns a block, the
/// batch entries along the grid's second axis with the row tiles.
#[kernel(dtypes(T = [bf16, f16, f32]))]
pub fn ring_copy_rows(x: Global<T, 3>, out: Global<T, 3>, row0: i32) {
    let (b, r, j) = rows_block(out.dim(1));
    out.store([b, r, j], x.load::<Tile<T, 16, 256>>([b, row0 + r, j]));
}

type View<'a, T> = tessera::TensorView<'a, T>;
type ViewMut<'a, T> = tessera::TensorViewMut<'a, T>;

/// `acc[b, row0 + i, j] += x[b, i, j]` over `x`'s extent (f32 sums of 16-bit gradients),
/// blocks as [`ring_copy_rows`]'s.
#[kernel(dtypes(T = [bf16, f16]))]
pub fn ring_accumulate(acc: Global<f32, 3>, x: Global<T, 3>, row0: i32) {
    let (b, r, j) = rows_block(x.dim(1));
    let sum = acc.load::<Tile<f32, 16, 256>>([b, row0 + r, j]) + x.load::<Tile<T, 16, 256>>([b, r, j]).cast::<f32>();
    acc.store([b, row0 + r, j], sum);
}

/// `y = x` in `T`, blocks as [`ring_copy_rows`]'s over `y`.
#[kernel(dtypes(T = [bf16, f16]))]
pub fn ring_cast(x: Global<f32, 3>, y: Global<T, 3>) {
    let (b, r, j) = rows_block(y.dim(1));
    y.store([b, r, j], x.load::<Tile<f32, 16, 256>>([b, r, j]).cast::<T>());
}

/// An element type of ring attention: bf16 or f16.
pub trait RingElement: AttentionElement {
    #[doc(hidden)]
    #[allow(clippy::too_many_arguments)]
    fn merge(
        device: &Device, grid: Grid, acc: &mut ViewMut<'_, f32>, acc_lse: &mut ViewMut<'_, f32>, part: &View<'_, Self>,
        part_lse: &View<'_, f32>, row0: i32, first: i32,
    ) -> Result<()>;
    #[doc(hidden)]
    fn finish(
        device: &Device, grid: Grid, acc: &View<'_, f32>, acc_lse: &View<'_, f32>, out: &mut ViewMut<'_, Self>,
        out_lse: &mut ViewMut<'_, f32>,
    ) -> Result<()>;
    #[doc(hidden)]
    fn copy_rows(device: &Device, grid: Grid, x: &View<'_, Self>, out: &mut ViewMut<'_, Self>, row0: i32) -> Result<()>;
    #[doc(hidden)]
    fn accumulate(device: &Device, grid: Grid, acc: &mut ViewMut<'_, f32>, x: &View<'_, Self>, row0: i32) -> Result<()>;
    #[doc(hidden)]
    fn cast(device: &Device, grid: Grid, x: &View<'_, f32>, y: &mut ViewMut<'_, Self>) -> Result<()>;
}

macro_rules! ring_element {
    ($t:ty, $merge:ident, $finish:ident, $copy:ident, $acc:ident, $cast:ident) => {
        impl RingElement for $t {
            fn merge(
                device: &Device, grid: Grid, acc: &mut ViewMut<'_, f32>, acc_lse: &mut ViewMut<'_, f32>, part: &View<'_, Self>,
                part_lse: &View<'_, f32>, row0: i32, first: i32,
            ) -> Result<()> {
                $merge::launch(device, grid, acc, acc_lse, part, part_lse, row0, first)
            }
            fn finish(
                device: &Device, grid: Grid, acc: &View<'_, f32>, acc_lse: &View<'_, f32>, out: &mut ViewMut<'_, Self>,
                out_lse: &mut ViewMut<'_, f32>,
            ) -> Result<()> {
                $finish::launch(device, grid, acc, acc_lse, out, out_lse)
            }
            fn copy_rows(device: &Device, grid: Grid, x: &View<'_, Self>, out: &mut ViewMut<'_, Self>, row0: i32) -> Result<()> {
                $copy::launch(device, grid, x, out, row0)
            }
            fn accumulate(device: &Device, grid: Grid, acc: &mut ViewMut<'_, f32>, x: &View<'_, Self>, row0: i32) -> Result<()> {
                $acc::launch(device, grid, acc, x, row0)
            }
            fn cast(device: &Device, grid: Grid, x: &View<'_, f32>, y: &mut ViewMut<'_, Self>) -> Result<()> {
                $cast::launch(device, grid, x, y)
            }
        }
    };
}
ring_element!(bf16, attention_merge_bf16, attention_merge_finish_bf16, ring_copy_rows_bf16, ring_accumulate_bf16, ring_cast_bf16);
ring_element!(f16, attention_merge_f16, attention_merge_finish_f16, ring_copy_rows_f16, ring_accumulate_f16, ring_cast_f16);

fn arg(name: &str, expected: String, found: String) -> Error {
    Error::Argument { kernel: "ring_attention", arg: name.into(), expected, found }
}

/// `[b, s, h, d]` of a 4-D tensor.
fn dims4<T: tessera::Element>(name: &str, t: &Tensor<T>) -> Result<[usize; 4]> {
    match *t.shape() {
        [b, s, h, d] if t.is_contiguous() => Ok([b, s, h, d]),
        _ => Err(arg(name, "a contiguous [batch, seq, heads, head_dim] tensor".into(), format!("shape {:?}", t.shape()))),
    }
}

/// The grid of [`ring_copy_rows`]-shaped kernels over `[b, rows, cols]`.
fn rows_grid(b: usize, rows: usize, cols: usize) -> Grid {
    Grid::from((Grid::tiles(cols, 256), Grid::tiles(rows, 16).saturating_mul(b as u32)))
}

/// `[b, s, h, d]` (any element) as the 3-D `[b, s, h·d]` the row kernels take.
fn rows3(t: &[usize]) -> ([usize; 3], [usize; 3]) {
    let (b, s, w) = (t[0], t[1], t[2..].iter().product::<usize>());
    ([b, s, w], [s * w, w, 1])
}

/// Rows `row0..row0 + rows` of `x` (`[b, s, heads, d]`) as a tensor of their own.
fn rows_of<T: RingElement>(device: &Device, x: &Tensor<T>, row0: usize, rows: usize) -> Result<Tensor<T>> {
    let [b, _, h, d] = dims4("q", x)?;
    let mut out = Tensor::<T>::scratch(device, &[b, rows, h, d])?;
    let ((sx, tx), (so, to)) = (rows3(x.shape()), rows3(out.shape()));
    T::copy_rows(device, rows_grid(b, rows, h * d), &x.view(&sx, &tx)?, &mut out.view_mut(&so, &to)?, row0 as i32)?;
    Ok(out)
}

/// `acc[:, row0.., :] += x` (`acc` f32 `[b, s, h, d]`, `x` `[b, rows, h, d]`).
fn accumulate<T: RingElement>(device: &Device, acc: &mut Tensor<f32>, x: &Tensor<T>, row0: usize) -> Result<()> {
    let ((sa, ta), (sx, tx)) = (rows3(acc.shape()), rows3(x.shape()));
    T::accumulate(device, rows_grid(sx[0], sx[1], sx[2]), &mut acc.view_mut(&sa, &ta)?, &x.view(&sx, &tx)?, row0 as i32)
}

/// `acc` in `T`.
fn cast<T: RingElement>(device: &Device, acc: &Tensor<f32>) -> Result<Tensor<T>> {
    let mut y = Tensor::<T>::scratch(device, acc.shape())?;
    let (sa, ta) = rows3(acc.shape());
    T::cast(device, rows_grid(sa[0], sa[1], sa[2]), &acc.view(&sa, &ta)?, &mut y.view_mut(&sa, &ta)?)?;
    Ok(y)
}

/// Rows `row0..row0 + rows` of a log-sum-exp `[b, h, s]`.
fn lse_rows(device: &Device, lse: &Tensor<f32>, row0: usize, rows: usize) -> Result<Tensor<f32>> {
    let [b, h, s] = [lse.shape()[0], lse.shape()[1], lse.shape()[2]];
    let mut out = Tensor::<f32>::scratch(device, &[b, h, rows])?;
    let (x, mut o) = (lse.view(&[b * h, s, 1], &[s, 1, 1])?, out.view_mut(&[b * h, rows, 1], &[rows, 1, 1])?);
    ring_copy_rows_f32::launch(device, rows_grid(b * h, rows, 1), &x, &mut o, row0 as i32)?;
    drop(o);
    Ok(out)
}

/// `[b, s, h, d]` seen as `[b, h, s, d]`, and `[b, h, s]` as `[b, h, s, 1]`.
fn bhsd(b: usize, s: usize, h: usize, d: usize) -> ([usize; 4], [usize; 4]) {
    ([b, h, s, d], [s * h * d, d, h * d, 1])
}

fn lse4(b: usize, s: usize, h: usize) -> ([usize; 4], [usize; 4]) {
    ([b, h, s, 1], [h * s, s, 1, 1])
}

/// The running sums of one rank's output, f32, `[b, s, h, d]` and `[b, h, s]`.
struct Running {
    acc: Tensor<f32>,
    lse: Tensor<f32>,
    steps: usize,
    dims: [usize; 4],
}

impl Running {
    /// Merges `part` (rows `row0..` of the rank's queries) and its log-sum-exp into the sums.
    fn merge<T: RingElement>(&mut self, device: &Device, part: &Tensor<T>, part_lse: &Tensor<f32>, row0: usize) -> Result<()> {
        let [b, s, h, d] = self.dims;
        let rows = part.shape()[1];
        let ((sa, ta), (sl, tl), (sp, tp), (spl, tpl)) = (bhsd(b, s, h, d), lse4(b, s, h), bhsd(b, rows, h, d), lse4(b, rows, h));
        let mut acc = self.acc.view_mut(&sa, &ta)?;
        let mut acc_lse = self.lse.view_mut(&sl, &tl)?;
        let grid = Grid::from((Grid::tiles(rows, 64), (b * h) as u32));
        T::merge(
            device,
            grid,
            &mut acc,
            &mut acc_lse,
            &part.view(&sp, &tp)?,
            &part_lse.view(&spl, &tpl)?,
            row0 as i32,
            i32::from(self.steps == 0),
        )?;
        self.steps += 1;
        Ok(())
    }

    /// The sums into the caller's `o` and `lse`.
    fn finish<T: RingElement>(&self, device: &Device, o: &mut Tensor<T>, lse: &mut Tensor<f32>) -> Result<()> {
        let [b, s, h, d] = self.dims;
        let ((sa, ta), (sl, tl)) = (bhsd(b, s, h, d), lse4(b, s, h));
        let grid = Grid::from((Grid::tiles(s, 64), (b * h) as u32));
        T::finish(
            device,
            grid,
            &self.acc.view(&sa, &ta)?,
            &self.lse.view(&sl, &tl)?,
            &mut o.view_mut(&sa, &ta)?,
            &mut lse.view_mut(&sl, &tl)?,
        )
    }
}

/// The checks the forward and the backward share: `[b, s, h, d]` of q.
fn check<T: RingElement>(
    opts: &Attention, q: &Tensor<T>, k: &Tensor<T>, v: &Tensor<T>, o: &Tensor<T>, lse: &Tensor<f32>,
) -> Result<[usize; 4]> {
    if opts.layout_of() != AttentionLayout::Bshd {
        return Err(arg("opts", "AttentionLayout::Bshd".into(), "another layout".into()));
    }
    let [b, s, h, d] = dims4("q", q)?;
    let [bk, sk, hk, dk] = dims4("k", k)?;
    if dims4("v", v)? != [bk, sk, hk, dk] {
        return Err(arg("v", format!("k's shape {:?}", k.shape()), format!("{:?}", v.shape())));
    }
    if dims4("o", o)? != [b, s, h, d] {
        return Err(arg("o", format!("q's shape {:?}", q.shape()), format!("{:?}", o.shape())));
    }
    if lse.shape() != [b, h, s] {
        return Err(arg("lse", format!("[{b}, {h}, {s}]"), format!("{:?}", lse.shape())));
    }
    if opts.is_causal() && (s % 2 != 0 || sk != s) {
        return Err(arg("q", "causal: an even local length (two zig-zag chunks), the same for k".into(), format!("q {s} rows, k {sk}")));
    }
    Ok([b, s, h, d])
}

/// Which block pair a step runs (the zig-zag schedule, see the module's notes): the second
/// chunk's queries only (`q_second`), the held block's first chunk of keys only
/// (`k_first`), and whether causally (step 0 of causal attention: the rank's own block).
struct Pair {
    q_second: bool,
    k_first: bool,
    causal: bool,
}

impl Pair {
    fn of(causal: bool, step: usize, rank: usize, world: usize) -> Pair {
        let from = (rank + world - step) % world;
        let split = causal && step > 0;
        Pair { q_second: split && from > rank, k_first: split && from < rank, causal: causal && step == 0 }
    }
}

/// Ring attention forward for one rank of `comm`'s group: `q`, `k`, `v` `[batch, s, heads,
/// head_dim]` are this rank's part of the sequence — for causal attention its zig-zag chunks
/// `r` and `2·world − 1 − r` one after the other (`s` even), otherwise any equal split in rank
/// order — and `o`, `lse` (`[batch, heads, s]`, natural log) its rows of the whole sequence's
/// attention. `opts`: [`AttentionLayout::Bshd`], causal or not, a scale; grouped-query heads as
/// [`attention_with_lse`]. The attention runs on `device`'s stream, the exchange on the
/// communicator's.
///
/// # Errors
/// [`Error::Argument`] for tensors that do not fit (an odd local length with `causal`, shapes
/// that differ between q and o or k and v, another layout); the attention's and the
/// collectives' own errors (every rank must call with the same shapes).
#[allow(clippy::too_many_arguments)]
pub fn ring_attention<T: RingElement>(
    device: &Device, comm: &Communicator, opts: &Attention, q: &Tensor<T>, k: &Tensor<T>, v: &Tensor<T>, o: &mut Tensor<T>,
    lse: &mut Tensor<f32>,
) -> Result<()> {
    let [b, s, h, d] = check(opts, q, k, v, o, lse)?;
    let causal = opts.is_causal();
    let (world, rank) = (comm.world_size(), comm.rank());
    let c = s / 2;
    let mut run =
        Running { acc: Tensor::scratch(device, &[b, s, h, d])?, lse: Tensor::scratch(device, &[b, h, s])?, steps: 0, dims: [b, s, h, d] };
    // The block received last (none yet: the rank's own, the caller's k and v).
    let mut held: Option<(Tensor<T>, Tensor<T>)> = None;
    for step in 0..world {
        let (kc, vc) = held.as_ref().map_or((k, v), |(a, b)| (a, b));
        // The next block, while this one's attention runs.
        let next = if step + 1 == world {
            None
        } else {
            let (mut kn, mut vn) = (Tensor::<T>::scratch(device, k.shape())?, Tensor::<T>::scratch(device, v.shape())?);
            group(|| {
                comm.send(kc, (rank + 1) % world)?;
                comm.send(vc, (rank + 1) % world)?;
                comm.recv(&mut kn, (rank + world - 1) % world)?;
                comm.recv(&mut vn, (rank + world - 1) % world)
            })?;
            Some((kn, vn))
        };
        let pair = Pair::of(causal, step, rank, world);
        let (q1, k0, v0);
        let qs = if pair.q_second {
            q1 = rows_of(device, q, c, c)?;
            &q1
        } else {
            q
        };
        let (ks, vs) = if pair.k_first {
            (k0, v0) = (rows_of(device, kc, 0, c)?, rows_of(device, vc, 0, c)?);
            (&k0, &v0)
        } else {
            (kc, vc)
        };
        let rows = qs.shape()[1];
        let mut po = Tensor::<T>::scratch(device, &[b, rows, h, d])?;
        let mut pl = Tensor::<f32>::scratch(device, &[b, h, rows])?;
        attention_with_lse(device, &opts.causal(pair.causal), qs, ks, vs, &mut po, &mut pl)?;
        run.merge(device, &po, &pl, s - rows)?;
        if next.is_some() {
            held = next;
        }
    }
    run.finish(device, o, lse)
}

/// Ring attention backward for one rank (the forward's tensors and split, with `o` and `lse`
/// what [`ring_attention`] gave, `dout` the gradient of `o`): this rank's `dq`, `dk`, `dv`.
/// Each step runs [`attention_backward`] on the block pairs the forward's step ran — with the
/// final `o` and the whole sequence's `lse`, each block's gradients are exact parts of the
/// whole — and sums them in f32: `dq` here, `dk` and `dv` in sums that travel with the key/value
/// block round the ring and reach its owner after the last step.
///
/// # Errors
/// As [`ring_attention`]'s, and `dout` not o's shape.
#[allow(clippy::too_many_arguments)]
pub fn ring_attention_backward<T: RingElement>(
    device: &Device, comm: &Communicator, opts: &Attention, q: &Tensor<T>, k: &Tensor<T>, v: &Tensor<T>, o: &Tensor<T>, lse: &Tensor<f32>,
    dout: &Tensor<T>,
) -> Result<AttentionGrads<T>> {
    let [b, s, h, d] = check(opts, q, k, v, o, lse)?;
    if dims4("dout", dout)? != [b, s, h, d] {
        return Err(arg("dout", format!("o's shape {:?}", o.shape()), format!("{:?}", dout.shape())));
    }
    let causal = opts.is_causal();
    let (world, rank) = (comm.world_size(), comm.rank());
    let c = s / 2;
    let mut dq = Tensor::<f32>::zeros(device, &[b, s, h, d])?;
    let mut held: Option<(Tensor<T>, Tensor<T>)> = None;
    let mut dk = Tensor::<f32>::zeros(device, k.shape())?;
    let mut dv = Tensor::<f32>::zeros(device, v.shape())?;
    for step in 0..world {
        let (kc, vc) = held.as_ref().map_or((k, v), |(a, b)| (a, b));
        let pair = Pair::of(causal, step, rank, world);
        let (q1, o1, d1, l1, k0, v0);
        let (qs, os, ds, ls) = if pair.q_second {
            (q1, o1, d1, l1) =
                (rows_of(device, q, c, c)?, rows_of(device, o, c, c)?, rows_of(device, dout, c, c)?, lse_rows(device, lse, c, c)?);
            (&q1, &o1, &d1, &l1)
        } else {
            (q, o, dout, lse)
        };
        let (ks, vs) = if pair.k_first {
            (k0, v0) = (rows_of(device, kc, 0, c)?, rows_of(device, vc, 0, c)?);
            (&k0, &v0)
        } else {
            (kc, vc)
        };
        let g = attention_backward(device, &opts.causal(pair.causal), qs, ks, vs, os, ls, ds)?;
        accumulate(device, &mut dq, &g.dq, s - qs.shape()[1])?;
        accumulate(device, &mut dk, &g.dk, 0)?;
        accumulate(device, &mut dv, &g.dv, 0)?;
        // The block on to the next rank, its gradients' sums with it (after the last step
        // those alone, home to their owner).
        let (to, from_rank) = ((rank + 1) % world, (rank + world - 1) % world);
        let more = step + 1 < world;
        let (mut kn, mut vn) = (Tensor::<T>::scratch(device, k.shape())?, Tensor::<T>::scratch(device, v.shape())?);
        let (mut dkn, mut dvn) = (Tensor::<f32>::scratch(device, k.shape())?, Tensor::<f32>::scratch(device, v.shape())?);
        group(|| {
            if more {
                comm.send(kc, to)?;
                comm.send(vc, to)?;
            }
            comm.send(&dk, to)?;
            comm.send(&dv, to)?;
            if more {
                comm.recv(&mut kn, from_rank)?;
                comm.recv(&mut vn, from_rank)?;
            }
            comm.recv(&mut dkn, from_rank)?;
            comm.recv(&mut dvn, from_rank)
        })?;
        if more {
            held = Some((kn, vn));
        }
        (dk, dv) = (dkn, dvn);
    }
    Ok(AttentionGrads { dq: cast(device, &dq)?, dk: cast(device, &dk)?, dv: cast(device, &dv)? })
}
