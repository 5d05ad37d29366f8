//! Prefix scans along the last axis: `cumsum`, `cumprod`, `logcumsumexp`, and `cumsum`'s
//! backward (the sum from each element to the row's end).
//!
//! One body, [`scan_rows`], runs every one: 16 rows per block, 256-column chunks in order (or
//! in reverse), each chunk scanned in registers by `tile_scan` and joined to the chunks before
//! by a carried `16×1` value; the kernels differ only in the closure that does one chunk's
//! step. Elements load in their dtype and scan in f32. The rows are the blocks' parallelism:
//! a tensor of few long rows runs on few SMs (splitting a row across blocks is the next step,
//! notes/ISSUE-27.md).

use crate::prelude::{scan_add, scan_mul};
use tessera::{device, kernel, Device, Element, Error, Grid, Result, Tensor};

/// Rows a block scans.
const ROWS: usize = 16;

/// The scan of rows `16·block..` of `x` into `y`, 256-column chunks from the first (or, with
/// `reverse` 1, from the last), elements past the row's end read as `fill`: `step(chunk,
/// carry)` gives the chunk's output and the carry into the next chunk, the carry starting at
/// `fill` (the scan's identity).
#[device]
fn scan_rows<T>(
    x: Global<T, 2>, y: Global<T, 2>, fill: f32, reverse: i32,
    step: impl Fn(Tile<f32, 16, 256>, Tile<f32, 16, 1>) -> (Tile<f32, 16, 256>, Tile<f32, 16, 1>),
) {
    let r = block::id_x() * 16;
    let chunks = (x.dim(1) + 255) / 256;
    let mut carry = Tile::<f32, 16, 1>::full(fill);
    for i in 0..chunks {
        let mut c = i * 256;
        if reverse == 1 {
            c = (chunks - 1 - i) * 256;
        }
        let t: Tile<T, 16, 256> = x.load_or([r, c], fill);
        let (out, next) = step(t.cast::<f32>(), carry);
        carry = next;
        y.store([r, c], out.cast::<T>());
    }
}

/// `log2(2^a + 2^b)` elementwise, `b` broadcast along the rows where it is one column wide;
/// for any values (−∞ too: the difference of two −∞ is NaN, which the `max` with −1e30 drops).
#[device]
fn log2_add<const M: usize, const N: usize, const K: usize>(a: Tile<f32, M, N>, b: Tile<f32, M, K>) -> Tile<f32, M, N> {
    let m = max(a, b);
    m + log2(1.0 + exp2(max(min(a, b) - m, -1.0e30)))
}

/// The combine of a running log-sum-exp in base 2, `log2(2^a + 2^b)`, identity −∞:
/// `tile_scan::<scan_logaddexp2>(x, 1, f32::NEG_INFINITY)`.
#[device]
pub fn scan_logaddexp2<const M: usize, const N: usize>(a: Tile<f32, M, N>, b: Tile<f32, M, N>) -> Tile<f32, M, N> {
    log2_add(a, b)
}

/// `y[i, j] = Σ_{k ≤ j} x[i, k]`.
#[kernel(dtypes(T = [bf16, f16, f32]))]
pub fn cumsum(x: Global<T, 2>, y: Global<T, 2>) {
    scan_rows(x, y, 0.0, 0, |t, carry| {
        let s = tile_scan::<scan_add>(t, 1, 0.0) + carry;
        (s, s.last_col())
    });
}

/// `y[i, j] = Σ_{k ≥ j} x[i, k]`: `cumsum`'s backward (its `dx` from `dy`).
#[kernel(dtypes(T = [bf16, f16, f32]))]
pub fn cumsum_reverse(x: Global<T, 2>, y: Global<T, 2>) {
    scan_rows(x, y, 0.0, 1, |t, carry| {
        let total = row_sum(t);
        (carry + total - tile_scan::<scan_add>(t, 1, 0.0) + t, carry + total)
    });
}

/// `y[i, j] = Π_{k ≤ j} x[i, k]`.
#[kernel(dtypes(T = [bf16, f16, f32]))]
pub fn cumprod(x: Global<T, 2>, y: Global<T, 2>) {
    scan_rows(x, y, 1.0, 0, |t, carry| {
        let s = tile_scan::<scan_mul>(t, 1, 1.0) * carry;
        (s, s.last_col())
    });
}

/// `y[i, j] = ln Σ_{k ≤ j} exp(x[i, k])`, in base 2 inside (the carry a base-2 log).
#[kernel(dtypes(T = [bf16, f16, f32]))]
pub fn logcumsumexp(x: Global<T, 2>, y: Global<T, 2>) {
    scan_rows(x, y, f32::NEG_INFINITY, 0, |t, carry| {
        let s = log2_add(tile_scan::<scan_logaddexp2>(t * f32::consts::LOG2_E, 1, f32::NEG_INFINITY), carry);
        (s * f32::consts::LN_2, s.last_col())
    });
}

/// The element types the scans take (`bf16`, `f16`, `f32`), and their kernels.
pub trait ScanElement: Element + sealed::Sealed {
    #[doc(hidden)]
    fn scan_launch(op: ScanOp, device: &Device, grid: Grid, x: &Tensor<Self>, y: &mut Tensor<Self>, shape: [usize; 2]) -> Result<()>;
}

mod sealed {
    pub trait Sealed {}
    impl Sealed for tessera::bf16 {}
    impl Sealed for tessera::f16 {}
    impl Sealed for f32 {}
}

/// Which scan.
#[doc(hidden)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ScanOp {
    Sum,
    SumReverse,
    Prod,
    LogSumExp,
}

macro_rules! scan_element {
    ($t:ty, $sum:ident, $rev:ident, $prod:ident, $lse:ident) => {
        impl ScanElement for $t {
            fn scan_launch(
                op: ScanOp, device: &Device, grid: Grid, x: &Tensor<Self>, y: &mut Tensor<Self>, [m, n]: [usize; 2],
            ) -> Result<()> {
                let xv = x.view(&[m, n], &[n, 1])?;
                let mut yv = y.view_mut(&[m, n], &[n, 1])?;
                match op {
                    ScanOp::Sum => $sum::launch(device, grid, &xv, &mut yv),
                    ScanOp::SumReverse => $rev::launch(device, grid, &xv, &mut yv),
                    ScanOp::Prod => $prod::launch(device, grid, &xv, &mut yv),
                    ScanOp::LogSumExp => $lse::launch(device, grid, &xv, &mut yv),
                }
            }
        }
    };
}
scan_element!(tessera::bf16, cumsum_bf16, cumsum_reverse_bf16, cumprod_bf16, logcumsumexp_bf16);
scan_element!(tessera::f16, cumsum_f16, cumsum_reverse_f16, cumprod_f16, logcumsumexp_f16);
scan_element!(f32, cumsum_f32, cumsum_reverse_f32, cumprod_f32, logcumsumexp_f32);

/// Checks `x` and `y` (contiguous, the same shape, rank ≥ 1) and runs `op` over `x`'s rows.
fn run<T: ScanElement>(name: &'static str, op: ScanOp, device: &Device, x: &Tensor<T>, y: &mut Tensor<T>) -> Result<()> {
    let arg = |arg: &str, expected: String, found: String| Error::Argument { kernel: name, arg: arg.into(), expected, found };
    let Some(&n) = x.shape().last() else {
        return Err(arg("x", "a tensor of rank 1 or more".into(), "a scalar (rank 0)".into()));
    };
    if !x.is_contiguous() {
        return Err(arg("x", "a contiguous tensor".into(), format!("strides {:?}", x.strides())));
    }
    if y.shape() != x.shape() {
        return Err(arg("y", format!("shape {:?}, as x", x.shape()), format!("shape {:?}", y.shape())));
    }
    if !y.is_contiguous() {
        return Err(arg("y", "a contiguous tensor".into(), format!("strides {:?}", y.strides())));
    }
    let m: usize = x.shape()[..x.shape().len() - 1].iter().product();
    if m == 0 || n == 0 {
        return Ok(());
    }
    if i32::try_from(m).is_err() || i32::try_from(n).is_err() {
        return Err(arg("x", "fewer than 2³¹ rows and columns".into(), format!("{m} rows of {n}")));
    }
    T::scan_launch(op, device, Grid::from(Grid::tiles(m, ROWS)), x, y, [m, n])
}

/// `y = cumsum(x)` along the last axis (`y[…, j] = Σ_{k ≤ j} x[…, k]`): bf16, f16 or f32 in
/// and out, the sums in f32. `x` and `y` contiguous, of one shape, any rank ≥ 1.
///
/// # Errors
/// [`Error::Argument`] naming `x` or `y` (a scalar, a non-contiguous tensor, shapes that
/// differ); a launch error.
pub fn cumsum<T: ScanElement>(device: &Device, x: &Tensor<T>, y: &mut Tensor<T>) -> Result<()> {
    run("cumsum", ScanOp::Sum, device, x, y)
}

/// The backward of [`cumsum`]: `dx[…, j] = Σ_{k ≥ j} dy[…, k]`.
///
/// # Errors
/// As [`cumsum`], naming `x` for `dy` and `y` for `dx`.
pub fn cumsum_backward<T: ScanElement>(device: &Device, dy: &Tensor<T>, dx: &mut Tensor<T>) -> Result<()> {
    run("cumsum_backward", ScanOp::SumReverse, device, dy, dx)
}

/// `y = cumprod(x)` along the last axis (`y[…, j] = Π_{k ≤ j} x[…, k]`), as [`cumsum`].
///
/// # Errors
/// As [`cumsum`].
pub fn cumprod<T: ScanElement>(device: &Device, x: &Tensor<T>, y: &mut Tensor<T>) -> Result<()> {
    run("cumprod", ScanOp::Prod, device, x, y)
}

/// `y = logcumsumexp(x)` along the last axis (`y[…, j] = ln Σ_{k ≤ j} exp(x[…, k])`), as
/// [`cumsum`]; −∞ elements contribute nothing (a row of −∞ gives −∞), any finite magnitude is
/// exact to f32 (the running value is a log, never an exponential).
///
/// # Errors
/// As [`cumsum`].
pub fn logcumsumexp<T: ScanElement>(device: &Device, x: &Tensor<T>, y: &mut Tensor<T>) -> Result<()> {
    run("logcumsumexp", ScanOp::LogSumExp, device, x, y)
}
