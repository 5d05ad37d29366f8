//! Depthwise 1-D convolution along the last axis: `x` `[batch, channels, L]` with one filter a
//! channel, `k` `[channels, Lk]`, in the modes `full`, `same` and `causal`, with an epilogue
//! chain (a bias, a skip term `D·x`, SiLU, a gate) — Mamba's and Hyena's short convolutions,
//! and long ones.
//!
//! Two paths ([`ConvPath`]). The direct one, for taps within 8 steps either side (`Lk ≤ 9`):
//! `conv1d_short`, each block walking tiles of 8 channels × 256 steps with the window of three
//! tiles in registers, a tap a funnel shift ([`crate::prelude::depthwise_conv_short`]); else
//! `conv1d_direct`, `Lk` shifted loads ([`crate::prelude::depthwise_conv`]), its cost growing
//! with `Lk`; both with the epilogue in registers. The FFT one (GPU only): the signal and the filters zero-padded to `N ≥ L + Lk − 1`,
//! cuFFT's R2C, the spectra's complex product (`swap_pairs`, the filter's factors arranged
//! once as `[re, re]` and `[−im, im]`), cuFFT's C2R, then the same epilogue; plans kept with the
//! device ([`Device::local`]). The tensor-core one (Hopper, 16-bit): `conv_fft_tc`, each row
//! transformed by small DFT matrices on the tensor cores ([`crate::fft`]), multiplied, transformed
//! back and through the epilogue in one kernel. On both transform paths the filters' spectrum
//! can be made once and reused across calls ([`ConvSpectrum`]).
//!
//! The backward takes two launches: one recomputes the epilogue's input where the epilogue
//! needs it, stores the gradient reaching the convolution (`dpre`, in the element type, where
//! SiLU or the gate make it differ from `dy`) and
//! the gate's, and adds the filter's, the bias's and the skip's gradients (sums over the batch
//! and the steps) by atomics; the other is the forward kernel again on `dpre`, the filter
//! reversed and shifted, which gives `dx` (the transpose of a correlation is the correlation
//! with the reversed filter).

use crate::fft::{
    dft_tables, fft_fold, fft_forward, fft_forward_complex, fft_inverse_complex, fft_inverse_real, fold_twiddle, root_angle, row_amax,
    row_sync, tile_amax,
};
use crate::prelude::{depthwise_conv, depthwise_conv_short, sigmoid, silu};
use tessera::{device, kernel, Device, Element, Error, Grid, KernelSpec, Optional, OptionalMut, Result, Tensor};

/// Channels a block takes.
const ROWS: usize = 16;
/// Steps a block takes.
const COLS: usize = 256;

/// `acc` plus the bias and the skip term `skip·xt` (`xt` the block's tile of `x` in f32): the
/// epilogue's input.
#[device]
#[allow(clippy::too_many_arguments)]
fn add_terms<const R: usize, const W: usize>(
    acc: Tile<f32, R, W>, xt: Tile<f32, R, W>, bias: Global<f32, 2>, skip: Global<f32, 2>, h0: i32, has_bias: i32, has_skip: i32,
) -> Tile<f32, R, W> {
    let mut pre = acc;
    if has_bias == 1 {
        pre = pre + bias.load::<Tile<f32, R, 1>>([h0, 0]);
    }
    if has_skip == 1 {
        pre = pre + xt * skip.load::<Tile<f32, R, 1>>([h0, 0]);
    }
    pre
}

/// The block's tile of `x` in f32 where the skip term needs it (`has_skip` 1), else zeros.
#[device]
fn skip_input<T, const R: usize, const W: usize>(x: Global<T, 3>, b: i32, h0: i32, t0: i32, has_skip: i32) -> Tile<f32, R, W> {
    let mut xt = Tile::<f32, R, W>::zeros();
    if has_skip == 1 {
        xt = x.load::<Tile<T, R, W>>([b, h0, t0]).cast::<f32>();
    }
    xt
}

/// The convolution of the block's tile plus the bias and the skip term: the epilogue's input.
#[device]
#[allow(clippy::too_many_arguments)]
fn conv_pre<T, const R: usize, const W: usize>(
    x: Global<T, 3>, w: Global<f32, 2>, bias: Global<f32, 2>, skip: Global<f32, 2>, b: i32, h0: i32, t0: i32, shift: i32, reverse: i32,
    has_bias: i32, has_skip: i32,
) -> Tile<f32, R, W> {
    let xt = skip_input::<T, R, W>(x, b, h0, t0, has_skip);
    add_terms(depthwise_conv::<T, R, W>(x, w, b, h0, t0 + shift, reverse), xt, bias, skip, h0, has_bias, has_skip)
}

/// The epilogue's end: the activation (`act` 1 SiLU) and the gate on `pre`, stored into the
/// block's tile of `y`.
#[device]
#[allow(clippy::too_many_arguments)]
fn activate_gate_store<T, const R: usize, const W: usize>(
    pre: Tile<f32, R, W>, gate: Global<T, 3>, y: Global<T, 3>, b: i32, h0: i32, t0: i32, has_gate: i32, act: i32,
) {
    let mut out = pre;
    if act == 1 {
        out = silu(out);
    }
    if has_gate == 1 {
        out = out * gate.load::<Tile<T, R, W>>([b, h0, t0]).cast::<f32>();
    }
    y.store([b, h0, t0], out.cast::<T>());
}

/// `y[b, h, t] = act(Σ_k w[h, k′]·x[b, h, t + shift + k] + bias[h] + skip[h]·x[b, h, t]) ·
/// gate[b, h, t]` (`k′` as [`depthwise_conv`]; `act` 1 SiLU, 0 none; each term where its flag
/// is 1), 16 channels × 256 steps a block (grid: steps, channels, batch). `bias`, `skip`
/// `[channels, 1]`.
#[kernel(dtypes(T = [bf16, f16, f32]))]
#[allow(clippy::too_many_arguments)]
pub fn conv1d_direct(
    x: Global<T, 3>, w: Global<f32, 2>, bias: Global<f32, 2>, skip: Global<f32, 2>, gate: Global<T, 3>, y: Global<T, 3>, shift: i32,
    reverse: i32, has_bias: i32, has_skip: i32, has_gate: i32, act: i32,
) {
    let b = block::id_z();
    let h0 = block::id_y() * 16;
    let t0 = block::id_x() * 256;
    let pre = conv_pre::<T, 16, 256>(x, w, bias, skip, b, h0, t0, shift, reverse, has_bias, has_skip);
    activate_gate_store(pre, gate, y, b, h0, t0, has_gate, act);
}

/// The FFT path's input: `out[r, j] = x[r, j − lead]` in f32 for the `N` columns of `out`
/// (zeros outside `x`: the padding that keeps the circular convolution linear, and `lead`
/// zeros first for a correlation), 16 rows × 256 columns a block.
#[kernel(dtypes(T = [bf16, f16, f32]))]
pub fn conv_fft_pad(x: Global<T, 2>, out: Global<f32, 2>, lead: i32) {
    let r = block::id_y() * 16;
    let j = block::id_x() * 256;
    out.store([r, j], x.load::<Tile<T, 16, 256>>([r, j - lead]).cast::<f32>());
}

/// The filters' spectra `k` `[channels, 2M]` (cuFFT's pairs: re, im) as the product's two
/// factors, scaled by `scale` (cuFFT's inverse leaves a factor N): `kc = [re, re]`, `kd =
/// [−im, im]`, or `[im, −im]` with `conj` −1 (the conjugate: a correlation).
#[kernel]
pub fn conv_fft_filter(k: Global<f32, 2>, kc: Global<f32, 2>, kd: Global<f32, 2>, scale: f32, conj: f32) {
    let r = block::id_y() * 16;
    let j = block::id_x() * 256;
    let t = k.load::<Tile<f32, 16, 256>>([r, j]);
    let swapped = t.swap_pairs();
    // 1 at an imaginary part (an odd column; the tile starts on an even one), else 0.
    let col = Tile::<f32, 16, 256>::col_index();
    let odd = col - 2.0 * floor(col * 0.5);
    kc.store([r, j], (t + odd * (swapped - t)) * scale);
    kd.store([r, j], (odd * t - (1.0 - odd) * swapped) * (scale * conj));
}

/// The spectra's product: `out[b, h] = x[b, h]·kc[h] + swap_pairs(x[b, h])·kd[h]`, the complex
/// product of each row of `x` `[batch, channels, 2M]` (pairs) with its channel's filter, the
/// factors as [`conv_fft_filter`] makes them.
#[kernel]
pub fn conv_fft_product(x: Global<f32, 3>, kc: Global<f32, 2>, kd: Global<f32, 2>, out: Global<f32, 3>) {
    let b = block::id_z();
    let h0 = block::id_y() * 16;
    let j = block::id_x() * 256;
    let t = x.load::<Tile<f32, 16, 256>>([b, h0, j]);
    out.store([b, h0, j], t * kc.load::<Tile<f32, 16, 256>>([h0, j]) + t.swap_pairs() * kd.load::<Tile<f32, 16, 256>>([h0, j]));
}

/// The FFT path's output: `y[b, h, t]` as `conv1d_direct`'s, the convolution's sum read from
/// the inverse transform `full` `[batch, channels, N]` at step `t + first`.
#[kernel(dtypes(T = [bf16, f16, f32]))]
#[allow(clippy::too_many_arguments)]
pub fn conv_fft_finish(
    full: Global<f32, 3>, x: Global<T, 3>, bias: Global<f32, 2>, skip: Global<f32, 2>, gate: Global<T, 3>, y: Global<T, 3>, first: i32,
    has_bias: i32, has_skip: i32, has_gate: i32, act: i32,
) {
    let b = block::id_z();
    let h0 = block::id_y() * 16;
    let t0 = block::id_x() * 256;
    let acc = full.load::<Tile<f32, 16, 256>>([b, h0, t0 + first]);
    let xt = skip_input::<T, 16, 256>(x, b, h0, t0, has_skip);
    activate_gate_store(add_terms(acc, xt, bias, skip, h0, has_bias, has_skip), gate, y, b, h0, t0, has_gate, act);
}

/// `out[r, j] = x[r, j]`, zeros past `x`'s columns, `out`'s past its own dropped: a row-wise
/// copy that pads (the tensor-core path's input, to whole `N2`-step rows) or crops (its output),
/// 16 rows × 256 columns a block over `out`.
#[kernel(dtypes(T = [bf16, f16]))]
pub fn conv_copy_rows(x: Global<T, 2>, out: Global<T, 2>) {
    let r = block::id_y() * 16;
    let j = block::id_x() * 256;
    out.store([r, j], x.load::<Tile<T, 16, 256>>([r, j]));
}

/// The filters `k` `[channels, Lk]` placed on the circle of `N` steps (`out` `[channels, N]`)
/// from step `−c`: `out[r, j] = k[r, j + c] + k[r, j + c − N]` (`0 ≤ c < N`, `Lk ≤ N`: one of
/// the two is in the filter), 16 rows × 256 columns a block.
#[kernel]
pub fn conv_fft_wrap(k: Global<f32, 2>, out: Global<f32, 2>, c: i32) {
    let r = block::id_y() * 16;
    let j = block::id_x() * 256;
    let n = out.dim(1);
    out.store([r, j], k.load::<Tile<f32, 16, 256>>([r, j + c]) + k.load::<Tile<f32, 16, 256>>([r, j + c - n]));
}

/// The tensor-core path's filters: `g` `[channels, N1, N2]` (each filter placed on the circle
/// of `N = N1·N2` steps as the product needs it, f32; `N1 = 64·P`) to their spectra `kf`
/// `[channels, 2, N1, N2]` (real, imaginary; f16, divided by the largest magnitude of the
/// channel's, conjugated where `conj` is −1: a correlation) and the factor `ks` `[channels, 1]`
/// that undoes both scalings and the transforms' `1/√N`. `P` warpgroups a channel, four
/// warpgroups a block.
#[kernel(warpgroups = 4, targets(sm_90a), tune(P = [1, 2], N2 = [64, 32], only(P == 1 || N2 == 64)))]
#[allow(clippy::too_many_arguments)]
pub fn conv_fft_tc_filter(
    g: Global<f32, 3>, kf: Global<f16, 4>, ks: Global<f32, 2>, tf1: Global<f16, 3>, tf2: Global<f16, 3>, tw: Global<f16, 3>, conj: f32,
) {
    let f1 = Smem::<f16, { 64 * P }, { 64 * P }>::ring(2);
    let f2 = Smem::<f16, N2, N2>::ring(3);
    let tws = Smem::<f16, { 64 * P }, N2>::ring(2);
    let sx = Smem::<f16, { 64 * P }, N2>::ring({ 4 / P });
    let me = warpgroup::id();
    dft_tables::<N2, P>(f1, f2, tws, tf1, tf2, tw, me);
    barrier::sync(1, 4);
    let group = me / P;
    let r0 = (me - group * P) * 64;
    // Past the last channel the loads read zeros and the stores drop: every warpgroup reaches
    // the block's reductions.
    let h = block::id_x() * (4 / P) + group;
    let gt = g.load::<Tile<f32, 64, N2>>([h, r0, 0]);
    let gm = row_amax::<64, N2, P>(gt);
    sx.at(group).rows(r0, 64).store((gt * (1.0 / gm)).cast::<f16>());
    row_sync::<P>(2 + group);
    let (dr, di) = fft_forward::<N2, P>(sx, group, f1, f2, tws, r0);
    let dm = row_amax::<64, N2, P>(max(abs(dr), abs(di)));
    let inv = 1.0 / dm;
    kf.store([h, 0, r0, 0], (dr * inv).cast::<f16>());
    kf.store([h, 1, r0, 0], (di * (inv * conj)).cast::<f16>());
    if r0 == 0 {
        ks.store([h, 0], dm * gm * sqrt(Tile::<f32, 1, 1>::full((64 * P * N2) as f32)));
    }
}

/// The tensor-core path's convolution: each row `x[b, h]` (`x` `[batch·channels, L/N2, N2]`,
/// the row's steps as `N2`-step lines, zeros past `L`), scaled to at most 1 in magnitude,
/// transformed by [`fft_forward`], multiplied by its channel's spectrum (as
/// [`conv_fft_tc_filter`] makes it), transformed back, then the epilogue of `conv1d_direct`
/// into `y` (`[batch·channels, Lout/N2, N2]`, of `gate`'s shape): the circular convolution of
/// `N = 64·P·N2` steps, the output's first `Lout` steps. A block per channel and `rows`
/// sequences (grid: channels, ⌈batch / rows⌉), `P` warpgroups a sequence (four in a block);
/// the channel's spectrum is copied into shared memory once a block (read from there, not from
/// L2, by each sequence: 10% of the time at N 4096).
#[kernel(warpgroups = 4, targets(sm_90a), dtypes(T = [bf16, f16]), tune(P = [1, 2], N2 = [64, 32], only(P == 1 || N2 == 64)))]
#[allow(clippy::too_many_arguments)]
pub fn conv_fft_tc(
    x: Global<T, 3>, kf: Global<f16, 4>, ks: Global<f32, 2>, bias: Global<f32, 2>, skip: Global<f32, 2>, gate: Global<T, 3>,
    y: Global<T, 3>, tf1: Global<f16, 3>, tf2: Global<f16, 3>, tw: Global<f16, 3>, rows: i32, has_bias: i32, has_skip: i32, has_gate: i32,
    act: i32,
) {
    let f1 = Smem::<f16, { 64 * P }, { 64 * P }>::ring(2);
    let f2 = Smem::<f16, N2, N2>::ring(3);
    let tws = Smem::<f16, { 64 * P }, N2>::ring(2);
    // A sequence's input, then (its stage again, and the next) the inverse's last operand (real,
    // imaginary).
    let sx = Smem::<f16, { 64 * P }, N2>::ring({ 8 / P });
    // The block's channel's spectrum (real, imaginary), read by every sequence.
    let kfs = Smem::<f16, { 64 * P }, N2>::ring(2);
    let me = warpgroup::id();
    let group = me / P;
    let r0 = (me - group * P) * 64;
    let channels = kf.dim(0);
    let h = block::id_x();
    let b0 = block::id_y() * rows;
    dft_tables::<N2, P>(f1, f2, tws, tf1, tf2, tw, me);
    // Warpgroups 2.. copy it (0.. copy `f1`, 3 `f2`).
    if me >= 2 && me < 2 + P {
        let k0 = (me - 2) * 64;
        kfs.at(0).rows(k0, 64).store(kf.load::<Tile<f16, 64, N2>>([h, 0, k0, 0]));
        kfs.at(1).rows(k0, 64).store(kf.load::<Tile<f16, 64, N2>>([h, 1, k0, 0]));
    }
    barrier::sync(1, 4);
    let s = group * 2;
    let scale = ks.get([h, 0]);
    // `rows` a multiple of the block's `4 / P` sequences: each warpgroup takes as many, and
    // past the last sequence the loads read zeros and the stores drop, so that every
    // warpgroup reaches the block's reductions (`P` 2) each time.
    for i in (group..rows).step_by(4 / P) {
        let row = (b0 + i) * channels + h;
        let xt = x.load::<Tile<T, 64, N2>>([row, r0, 0]).cast::<f32>();
        let xm = row_amax::<64, N2, P>(xt);
        sx.at(s).rows(r0, 64).store((xt * (1.0 / xm)).cast::<f16>());
        row_sync::<P>(2 + group);
        let (dr, di) = fft_forward::<N2, P>(sx, s, f1, f2, tws, r0);
        let kr = kfs.at(0).rows(r0, 64).load().cast::<f32>();
        let ki = kfs.at(1).rows(r0, 64).load().cast::<f32>();
        let yt = fft_inverse_real::<N2, P>(dr * kr - di * ki, dr * ki + di * kr, sx, s, f1, f2, tws, r0, 2 + group);
        let mut pre = yt * (xm * scale);
        if has_bias == 1 {
            pre = pre + bias.get([h, 0]);
        }
        if has_skip == 1 {
            pre = pre + x.load::<Tile<T, 64, N2>>([row, r0, 0]).cast::<f32>() * skip.get([h, 0]);
        }
        activate_gate_store(pre, gate, y, row, r0, 0, has_gate, act);
    }
}

/// The long tensor-core path's tables in shared memory: [`dft_tables`] for `M = 4096` (`P` 1,
/// `N2` 64) and `f1`'s stage 2 (`F_64`'s imaginary part negated, for the complex transforms),
/// copied by warpgroup 1. The caller syncs the block.
#[device]
#[allow(clippy::too_many_arguments)]
fn long_tables(
    f1: Smem<f16, 64, 64>, f2: Smem<f16, 64, 64>, tws: Smem<f16, 64, 64>, tf1: Global<f16, 3>, tf2: Global<f16, 3>, tw: Global<f16, 3>,
    me: i32,
) {
    dft_tables::<64, 1>(f1, f2, tws, tf1, tf2, tw, me);
    if me == 1 {
        f1.at(2).store(tf1.load::<Tile<f16, 64, 64>>([2, 0, 0]));
    }
}

/// The long tensor-core path's filters (`N = 4096·q`, `q` 4 to 32): `g` `[channels, N/64, 64]`
/// (each filter on the circle, as [`conv_fft_tc_filter`]'s) to the spectrum's residues `r =
/// 0..=q/2` (`x̂[q·k + r]`, [`fft_fold`] then [`fft_forward_complex`]): `kf` `[channels·(q/2 +
/// 1), 2, 64, 64]` (f16, row `h·(q/2 + 1) + r`, divided by its largest magnitude, conjugated
/// where `conj` is −1) and `ks` `[channels·(q/2 + 1), 1]`, the factor undoing the scalings and
/// the transforms' (`√M/q`). The filters' first `qn` blocks of 4096 steps are read (the others
/// zeros). Item `i` is channel `i / (q/2 + 1)` and residue `i % (q/2 + 1)` (the row of `kf`
/// and `ks` it makes); a block takes `per` consecutive items (a multiple of 4), its
/// warpgroups in turn.
#[kernel(warpgroups = 4, targets(sm_90a))]
#[allow(clippy::too_many_arguments)]
pub fn conv_fft_tc_long_filter(
    g: Global<f32, 3>, kf: Global<f16, 4>, ks: Global<f32, 2>, tf1: Global<f16, 3>, tf2: Global<f16, 3>, tw: Global<f16, 3>, conj: f32,
    per: i32, q: i32, qn: i32,
) {
    let f1 = Smem::<f16, 64, 64>::ring(3);
    let f2 = Smem::<f16, 64, 64>::ring(3);
    let tws = Smem::<f16, 64, 64>::ring(2);
    let sx = Smem::<f16, 64, 64>::ring(8);
    let me = warpgroup::id();
    long_tables(f1, f2, tws, tf1, tf2, tw, me);
    barrier::sync(1, 4);
    let res = q / 2 + 1;
    let s = me * 2;
    // Past the last item the loads read zeros and the stores drop.
    for i in (me..per).step_by(4) {
        let at = block::id_x() * per + i;
        let h = at / res;
        let (ur, ui) = fft_fold::<f32>(g, h, at - h * res, q, qn);
        let um = tile_amax(max(abs(ur), abs(ui)), 1e-30);
        sx.at(s).store((ur * (1.0 / um)).cast::<f16>());
        sx.at(s + 1).store((ui * (1.0 / um)).cast::<f16>());
        let (dr, di) = fft_forward_complex::<64, 1>(sx, s, f1, f2, tws, 0);
        let dm = tile_amax(max(abs(dr), abs(di)), 1e-30);
        let inv = 1.0 / dm;
        kf.store([at, 0, 0, 0], (dr * inv).cast::<f16>());
        kf.store([at, 1, 0, 0], (di * (inv * conj)).cast::<f16>());
        ks.store([at, 0], dm * um * (64.0 / q as f32));
    }
}

/// The long tensor-core path's convolution by residue: item `i` is row `i / (q/2 + 1)` of `x`
/// (`[batch·channels, L/64, 64]`, zeros past `L`; its first `qn` blocks of 4096 steps) and
/// residue `r = i % (q/2 + 1)` of the spectrum: the row folded ([`fft_fold`]), transformed
/// ([`fft_forward_complex`]), multiplied by its channel's residue `r` of
/// [`conv_fft_tc_long_filter`]'s spectrum, transformed back ([`fft_inverse_complex`]) and turned
/// by `ω_N^(−m·r)`: `w_r[m]`, from which `y[m + 4096·j] = Σ_r Re(ω_q^(−j·r)·w_r[m])` (the
/// conjugate residues `q − r` twice over). Into `w` `[q, rows, 64, 64]` (f16, residue `r`'s
/// real part at slot `r`, its imaginary part at slot `q − r` where `0 < r < q/2`) with each
/// slot's factor in `ws` `[q, rows, 1]`; then [`conv_fft_tc_combine`]. A block takes `per`
/// consecutive items (a multiple of 4), its warpgroups in turn (a row's residues one after
/// another, so that the row's folds after the first read it from L2).
#[kernel(warpgroups = 4, targets(sm_90a), dtypes(T = [bf16, f16]))]
#[allow(clippy::too_many_arguments)]
pub fn conv_fft_tc_long(
    x: Global<T, 3>, kf: Global<f16, 4>, ks: Global<f32, 2>, w: Global<f16, 4>, ws: Global<f32, 3>, tf1: Global<f16, 3>,
    tf2: Global<f16, 3>, tw: Global<f16, 3>, per: i32, q: i32, qn: i32,
) {
    let f1 = Smem::<f16, 64, 64>::ring(3);
    let f2 = Smem::<f16, 64, 64>::ring(3);
    let tws = Smem::<f16, 64, 64>::ring(2);
    // A row's folded input (real, imaginary), then the inverse's last operand.
    let sx = Smem::<f16, 64, 64>::ring(8);
    let me = warpgroup::id();
    let res = q / 2 + 1;
    let channels = kf.dim(0) / res;
    long_tables(f1, f2, tws, tf1, tf2, tw, me);
    barrier::sync(1, 4);
    let s = me * 2;
    // Past the last item the loads read rows past `x` (zeros) and the stores drop.
    for i in (me..per).step_by(4) {
        let item = block::id_x() * per + i;
        let row = item / res;
        let r = item - row * res;
        let at = (row - (row / channels) * channels) * res + r;
        let (ur, ui) = fft_fold::<T>(x, row, r, q, qn);
        let um = tile_amax(max(abs(ur), abs(ui)), 1e-30);
        sx.at(s).store((ur * (1.0 / um)).cast::<f16>());
        sx.at(s + 1).store((ui * (1.0 / um)).cast::<f16>());
        let (dr, di) = fft_forward_complex::<64, 1>(sx, s, f1, f2, tws, 0);
        let kr = kf.load::<Tile<f16, 64, 64>>([at, 0, 0, 0]).cast::<f32>();
        let ki = kf.load::<Tile<f16, 64, 64>>([at, 1, 0, 0]).cast::<f32>();
        let (zr, zi) = fft_inverse_complex::<64, 1>(dr * kr - di * ki, dr * ki + di * kr, sx, s, f1, f2, tws, 0, 2);
        let (tc, ts) = fold_twiddle(r, q);
        let f = um * ks.get([at, 0]);
        w.store([r, row, 0, 0], (zr * tc + zi * ts).cast::<f16>());
        ws.store([r, row, 0], f);
        if 0 < r && 2 * r < q {
            w.store([q - r, row, 0, 0], (zi * tc - zr * ts).cast::<f16>());
            ws.store([q - r, row, 0], f);
        }
    }
}

/// The long tensor-core path's output: `y[m + 4096·j] = act(Σ_slots c(j, slot)·ws·w + bias +
/// skip·x)·gate` from [`conv_fft_tc_long`]'s slots (`w` `[q, batch, channels, 4096]`, `ws` `[q,
/// batch, channels, 1]`): slot 0 and `q/2` with `cos(2π·j·r/q)`, slot `0 < r < q/2` with
/// `2·cos`, slot `q − r` with `−2·sin` — the inverse over the residues, the conjugate ones
/// included. The epilogue as `conv1d_direct`'s; blocks as [`conv_fft_finish`]'s.
#[kernel(dtypes(T = [bf16, f16]))]
#[allow(clippy::too_many_arguments)]
pub fn conv_fft_tc_combine(
    w: Global<f16, 4>, ws: Global<f32, 4>, x: Global<T, 3>, bias: Global<f32, 2>, skip: Global<f32, 2>, gate: Global<T, 3>,
    y: Global<T, 3>, q: i32, has_bias: i32, has_skip: i32, has_gate: i32, act: i32,
) {
    let b = block::id_z();
    let h0 = block::id_y() * 16;
    let t0 = block::id_x() * 256;
    let j = t0 / 4096;
    let m0 = t0 - j * 4096;
    let mut acc = Tile::<f32, 16, 256>::zeros();
    for slot in 0..q {
        let mut r = slot;
        if 2 * slot > q {
            r = q - slot;
        }
        let a = root_angle(j * r, q, 1.0);
        let mut c = cos_reduced(a);
        if 2 * slot > q {
            c = -2.0 * sin_reduced(a);
        } else if 0 < slot && 2 * slot < q {
            c = 2.0 * c;
        }
        let wt = w.load::<Tile<f16, 16, 256>>([slot, b, h0, m0]).cast::<f32>();
        acc = acc + wt * (ws.load::<Tile<f32, 16, 1>>([slot, b, h0, 0]) * c);
    }
    let xt = skip_input::<T, 16, 256>(x, b, h0, t0, has_skip);
    activate_gate_store(add_terms(acc, xt, bias, skip, h0, has_bias, has_skip), gate, y, b, h0, t0, has_gate, act);
}

/// The gradient reaching the convolution from `g` (`dy`'s tile) through the epilogue, given
/// its input `pre`: the gate's gradient stored into `dgate` (with a gate) and the result into
/// `dpre` (the `dx` launch's input), both where an activation or a gate makes it differ from
/// `dy` — the caller skips this otherwise.
#[device]
#[allow(clippy::too_many_arguments)]
fn epilogue_grads<T, const R: usize, const W: usize>(
    pre: Tile<f32, R, W>, g: Tile<f32, R, W>, gate: Global<T, 3>, dpre: Global<T, 3>, dgate: Global<T, 3>, b: i32, h0: i32, t0: i32,
    has_gate: i32, act: i32,
) -> Tile<f32, R, W> {
    let mut out = pre;
    let mut grad = g;
    let mut sig = Tile::<f32, R, W>::zeros();
    if act == 1 {
        sig = sigmoid(pre);
        out = pre * sig;
    }
    if has_gate == 1 {
        dgate.store([b, h0, t0], (grad * out).cast::<T>());
        grad = grad * gate.load::<Tile<T, R, W>>([b, h0, t0]).cast::<f32>();
    }
    if act == 1 {
        grad = grad * sig * (1.0 + pre * (1.0 - sig));
    }
    dpre.store([b, h0, t0], grad.cast::<T>());
    grad
}

/// `conv1d_direct`'s gradients but `dx`: from `dy`, the gradient reaching the convolution
/// (`dpre`, stored in `T` for the launch that makes `dx` where SiLU or the gate makes it differ
/// from `dy`), the gate's (`dgate`), and the sums
/// over the batch and the steps of the filters' (`dw`, at each tap's own index), the bias's and
/// the skip's, added into the `[channels, ·]` f32 sums by atomics. Blocks as `conv1d_direct`'s.
#[kernel(dtypes(T = [bf16, f16, f32]))]
#[allow(clippy::too_many_arguments)]
pub fn conv1d_direct_grads(
    x: Global<T, 3>, w: Global<f32, 2>, bias: Global<f32, 2>, skip: Global<f32, 2>, gate: Global<T, 3>, dy: Global<T, 3>,
    dpre: Global<T, 3>, dgate: Global<T, 3>, dw: Global<f32, 2>, dbias: Global<f32, 2>, dskip: Global<f32, 2>, shift: i32, reverse: i32,
    has_bias: i32, has_skip: i32, has_gate: i32, act: i32,
) {
    let b = block::id_z();
    let h0 = block::id_y() * 16;
    let t0 = block::id_x() * 256;
    // Zero past the output's end (dy reads zeros there), so no sum takes those steps.
    let mut g = dy.load::<Tile<T, 16, 256>>([b, h0, t0]).cast::<f32>();
    if has_gate == 1 || act == 1 {
        let pre = conv_pre::<T, 16, 256>(x, w, bias, skip, b, h0, t0, shift, reverse, has_bias, has_skip);
        g = epilogue_grads(pre, g, gate, dpre, dgate, b, h0, t0, has_gate, act);
    }
    if has_bias == 1 {
        dbias.atomic_add([h0, 0], row_sum(g));
    }
    if has_skip == 1 {
        dskip.atomic_add([h0, 0], row_sum(g * x.load::<Tile<T, 16, 256>>([b, h0, t0]).cast::<f32>()));
    }
    let taps = w.dim(1);
    for k in 0..taps {
        let tap = k + reverse * (taps - 1 - 2 * k);
        let xs: Tile<T, 16, 256> = x.load([b, h0, t0 + shift + k]);
        dw.atomic_add([h0, tap], row_sum(g * xs.cast::<f32>()));
    }
}

/// Tiles of 256 steps a short-path block walks ([`conv1d_short`]).
const WALK: usize = 4;

/// [`conv1d_direct`] for short filters (taps at offsets `shift..shift + Lk` within `−8..=8`):
/// each block walks `WALK` tiles of 8 channels × 256 steps along the sequence, carrying the
/// window of three tiles of `x` in registers (one load a tile, aligned) and making every tap a
/// funnel shift of it ([`depthwise_conv_short`]). Variants by the knobs `K` and `P` fix the
/// filter's length and first offset (`shift = P − 8`) for the common short filters — Mamba's
/// 4 taps, Hyena's 3, causal (`P = 9 − K`) and its transpose in the backward's `dx` (`P = 8`) —
/// and `K = 0` takes any within reach (see [`depthwise_conv_short`]).
#[kernel(
    dtypes(T = [bf16, f16, f32]),
    tune(K = [0, 4, 3], P = [0, 5, 6, 8], only(K == 0 && P == 0 || K == 4 && (P == 5 || P == 8) || K == 3 && (P == 6 || P == 8)))
)]
#[allow(clippy::too_many_arguments)]
pub fn conv1d_short(
    x: Global<T, 3>, w: Global<f32, 2>, bias: Global<f32, 2>, skip: Global<f32, 2>, gate: Global<T, 3>, y: Global<T, 3>, shift: i32,
    reverse: i32, has_bias: i32, has_skip: i32, has_gate: i32, act: i32,
) {
    let b = block::id_z();
    let h0 = block::id_y() * 8;
    let t0 = block::id_x() * 1024;
    let (mut prev, mut cur) = window_start::<T, 8, 256>(x, b, h0, t0, shift);
    let ahead = shift + w.dim(1) > 1;
    for i in 0..4 {
        let t = t0 + i * 256;
        let mut next = Tile::<f32, 8, 256>::zeros();
        if i < 3 || ahead {
            next = x.load::<Tile<T, 8, 256>>([b, h0, t + 256]).cast::<f32>();
        }
        let acc = depthwise_conv_short::<8, 256, K, P>(prev, cur, next, w, h0, shift, reverse);
        activate_gate_store(add_terms(acc, cur, bias, skip, h0, has_bias, has_skip), gate, y, b, h0, t, has_gate, act);
        prev = cur;
        cur = next;
    }
}

/// A short-path block's first window: the tile before `t0` (where a tap reaches back:
/// `shift < 0`; else zeros) and the tile at `t0`, in f32.
#[device]
fn window_start<T, const R: usize, const W: usize>(
    x: Global<T, 3>, b: i32, h0: i32, t0: i32, shift: i32,
) -> (Tile<f32, R, W>, Tile<f32, R, W>) {
    let mut prev = Tile::<f32, R, W>::zeros();
    if shift < 0 {
        prev = x.load::<Tile<T, R, W>>([b, h0, t0 - W]).cast::<f32>();
    }
    (prev, x.load::<Tile<T, R, W>>([b, h0, t0]).cast::<f32>())
}

/// The filters' gradients of one tile, `dw[h, k′] += Σ_t g[t]·x[t + shift + k]`, from the
/// window as [`depthwise_conv_short`] takes it (`K`, `P` as there): an atomic add a tap.
#[device]
#[allow(clippy::too_many_arguments)]
fn filter_grads_short<const R: usize, const W: usize, const K: usize, const P: usize>(
    prev: Tile<f32, R, W>, cur: Tile<f32, R, W>, next: Tile<f32, R, W>, g: Tile<f32, R, W>, dw: Global<f32, 2>, h0: i32, shift: i32,
    reverse: i32,
) {
    let taps = dw.dim(1);
    #[unroll]
    for e in 1..9 {
        let k = -e - shift;
        if K == 0 && k >= 0 && k < taps || K > 0 && 8 - e >= P && 8 - e < P + K {
            dw.atomic_add([h0, k + reverse * (taps - 1 - 2 * k)], row_sum(g * cur.shift_cols(e, prev)));
        }
    }
    #[unroll]
    for e in 0..9 {
        let k = e - shift;
        if K == 0 && k >= 0 && k < taps || K > 0 && e + 8 >= P && e + 8 < P + K {
            dw.atomic_add([h0, k + reverse * (taps - 1 - 2 * k)], row_sum(g * cur.shift_cols(-e, next)));
        }
    }
}

/// [`conv1d_direct_grads`] for short filters, walking as [`conv1d_short`] but 8 channels a
/// block (registers: the window, `dy`'s tile and the epilogue's): the bias's and the skip's
/// sums kept in registers over the walk (one atomic each a block), the filters' an atomic a
/// tap and tile. Variants as [`conv1d_short`]'s, causal only.
#[kernel(dtypes(T = [bf16, f16, f32]), tune(K = [0, 4, 3], P = [0, 5, 6], only(K == 0 && P == 0 || K == 4 && P == 5 || K == 3 && P == 6)))]
#[allow(clippy::too_many_arguments)]
pub fn conv1d_short_grads(
    x: Global<T, 3>, w: Global<f32, 2>, bias: Global<f32, 2>, skip: Global<f32, 2>, gate: Global<T, 3>, dy: Global<T, 3>,
    dpre: Global<T, 3>, dgate: Global<T, 3>, dw: Global<f32, 2>, dbias: Global<f32, 2>, dskip: Global<f32, 2>, shift: i32, reverse: i32,
    has_bias: i32, has_skip: i32, has_gate: i32, act: i32,
) {
    let b = block::id_z();
    let h0 = block::id_y() * 8;
    let t0 = block::id_x() * 1024;
    let (mut prev, mut cur) = window_start::<T, 8, 256>(x, b, h0, t0, shift);
    let ahead = shift + w.dim(1) > 1;
    let mut gb = Tile::<f32, 8, 256>::zeros().last_col();
    let mut gs = Tile::<f32, 8, 256>::zeros().last_col();
    for i in 0..4 {
        let t = t0 + i * 256;
        let mut next = Tile::<f32, 8, 256>::zeros();
        if i < 3 || ahead {
            next = x.load::<Tile<T, 8, 256>>([b, h0, t + 256]).cast::<f32>();
        }
        // Zero past the output's end (dy reads zeros there), so no sum takes those steps.
        let mut g = dy.load::<Tile<T, 8, 256>>([b, h0, t]).cast::<f32>();
        if has_gate == 1 || act == 1 {
            let pre = add_terms(
                depthwise_conv_short::<8, 256, K, P>(prev, cur, next, w, h0, shift, reverse),
                cur,
                bias,
                skip,
                h0,
                has_bias,
                has_skip,
            );
            g = epilogue_grads(pre, g, gate, dpre, dgate, b, h0, t, has_gate, act);
        }
        gb = gb + row_sum(g);
        gs = gs + row_sum(g * cur);
        filter_grads_short::<8, 256, K, P>(prev, cur, next, g, dw, h0, shift, reverse);
        prev = cur;
        cur = next;
    }
    if has_bias == 1 {
        dbias.atomic_add([h0, 0], gb);
    }
    if has_skip == 1 {
        dskip.atomic_add([h0, 0], gs);
    }
}

/// Which part of the full convolution (`L + Lk − 1` steps) comes out, as NumPy's `convolve`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ConvMode {
    /// Every step where the filter meets the signal: `L + Lk − 1` steps.
    Full,
    /// The middle `L` steps of the full output, from step `(Lk − 1) / 2` (the filter must not
    /// be longer than the signal).
    Same,
    /// The first `L` steps: step `t` sees `x` up to `t` only.
    Causal,
}

/// A depthwise 1-D convolution along the last axis, and its backward.
///
/// `x` `[batch, channels, L]` (bf16, f16 or f32, contiguous), filters `k` `[channels, Lk]`
/// (f32): `full[b, h, t] = Σ_j k[h, j]·x[b, h, t − j]` (a convolution: the filter reversed
/// against the signal), cut by [`ConvMode`], then the epilogue chain in this order, each part
/// optional:
///
/// `y = act(conv + bias[h] + skip[h]·x[t]) · gate[t]`
///
/// — Mamba's short convolution is `causal` with a bias and SiLU ([`Conv1d::causal_conv1d`]
/// takes its weights as PyTorch's `conv1d` does), Hyena's long one is `causal` with the skip
/// term `D·x` and the gate. Sums and the epilogue run in f32.
///
/// ```no_run
/// # use tessera::{Device, Tensor, bf16};
/// # use tessera_kernels::{Conv1d, ConvMode};
/// # fn main() -> tessera::Result<()> {
/// let dev = Device::cpu();
/// let x = Tensor::<bf16>::zeros(&dev, &[2, 64, 1000])?;
/// let k = Tensor::<f32>::zeros(&dev, &[64, 4])?;
/// let conv = Conv1d::new(&dev, &x, &k, ConvMode::Causal).silu();
/// let mut y = Tensor::<bf16>::zeros(&dev, &conv.out_shape())?;
/// conv.run(&mut y)?;
/// let grads = conv.backward(&y)?; // dx, dk (and dbias, dskip, dgate where given)
/// # Ok(()) }
/// ```
pub struct Conv1d<'a, T: Element> {
    device: &'a Device,
    x: &'a Tensor<T>,
    k: &'a Tensor<f32>,
    mode: ConvMode,
    /// Taps in correlation order (PyTorch's `conv1d`): `k[h, j]` meets `x[t − (Lk − 1) + j]`.
    correlate: bool,
    bias: Option<&'a Tensor<f32>>,
    skip: Option<&'a Tensor<f32>>,
    gate: Option<&'a Tensor<T>>,
    silu: bool,
    path: ConvPath,
    spectrum: Option<&'a ConvSpectrum>,
}

/// The filters' spectrum for a transform path ([`ConvPath::Fft`], [`ConvPath::TensorCore`]), a
/// transform length and a mode, made once by [`Conv1d::spectrum`] and reused by
/// [`Conv1d::with_spectrum`]. A long convolution applies the same filters to every batch, and
/// without one each call transforms them again (on the tensor-core path `conv_fft_wrap` and
/// `conv_fft_tc_filter`; through cuFFT the filters' pad, R2C and `conv_fft_filter`). It holds
/// the filters' values as they were when it was made: make it again after they change.
///
/// ```no_run
/// # use tessera::{Device, Tensor, bf16};
/// # use tessera_kernels::{Conv1d, ConvMode, ConvPath};
/// # fn main() -> tessera::Result<()> {
/// let dev = Device::new(0)?;
/// let k = Tensor::<f32>::zeros(&dev, &[768, 4096])?;
/// let xs = (0..4).map(|_| Tensor::<bf16>::zeros(&dev, &[8, 768, 4096])).collect::<tessera::Result<Vec<_>>>()?;
/// let conv = |x| Conv1d::new(&dev, x, &k, ConvMode::Causal).path(ConvPath::TensorCore);
/// let spectrum = conv(&xs[0]).spectrum()?;
/// let mut y = Tensor::<bf16>::zeros(&dev, &[8, 768, 4096])?;
/// for x in &xs {
///     // Another `x` each time, the same filters: their transform is not made again.
///     conv(x).with_spectrum(&spectrum).run(&mut y)?;
/// }
/// # Ok(()) }
/// ```
pub struct ConvSpectrum {
    key: SpectrumKey,
    data: SpectrumData,
}

/// What a spectrum fits: the path, the filters' count and length, the transform's length, the
/// tap placed at step 0 and whether the spectrum is conjugated (a correlation).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct SpectrumKey {
    path: ConvPath,
    channels: usize,
    taps: usize,
    n: usize,
    first: usize,
    conj: bool,
}

impl SpectrumKey {
    fn describe(&self) -> String {
        let order = if self.conj { "a correlation" } else { "a convolution" };
        format!("{} filters of {} taps on {:?}, N = {}, tap {} first ({order})", self.channels, self.taps, self.path, self.n, self.first)
    }
}

enum SpectrumData {
    /// `conv_fft_filter`'s factors `[re, re]` and `[−im, im]`, `[channels, 2·(N/2 + 1)]`.
    Fft { kc: Tensor<f32>, kd: Tensor<f32> },
    /// The tensor-core path's spectra and the shape they were made for.
    TensorCore(TcSpectrum),
}

/// The tensor-core path's filter spectrum: `conv_fft_tc_filter`'s spectra `[channels, 2, N1,
/// N2]` and factors `[channels, 1]` (`conv_fft_tc_long_filter`'s `[channels·(q/2 + 1), 2, 64,
/// 64]` and `[channels·(q/2 + 1), 1]`), the transform's shape, and the DFT tables that shape
/// reads.
#[doc(hidden)]
pub struct TcSpectrum {
    kf: Tensor<tessera::f16>,
    ks: Tensor<f32>,
    shape: TcShape,
    tables: std::sync::Arc<crate::fft::FftTables>,
}

/// How [`Conv1d::run`] computes the convolution.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum ConvPath {
    /// The default: the path a cost model measured on the H200 favours for these lengths and
    /// this element type ([`Conv1d::chosen_path`] says which). Direct where the filters are
    /// short (always within 9 taps, and in the interpreter); the tensor cores for bf16/f16 on
    /// Hopper, else cuFFT where it loads, once the direct path's cost (`out·Lk` steps a row)
    /// passes the transform's (by `N`). Measured crossovers (session 45, 8×768 and 2×768
    /// rows): bf16 at Lk ≈ 24 for L 2048 and ≈ 56 for L 8192; f32 (cuFFT) at Lk ≈ 26 and ≈ 32.
    /// A kept spectrum ([`Conv1d::with_spectrum`]) decides by its own path.
    #[default]
    Auto,
    /// In registers (GPU and interpreter): `conv1d_short`'s funnel shifts where every tap lies
    /// within 8 steps either side, else `conv1d_direct`'s shifted load a tap, whose cost grows
    /// with the filter's length.
    Direct,
    /// Through cuFFT (GPU only): the signal and the filters zero-padded to a length `N ≥ L +
    /// Lk − 1` with small prime factors, transformed, multiplied, transformed back, then the
    /// epilogue (`conv_fft_pad`, `_filter`, `_product`, `_finish` around cuFFT's R2C and
    /// C2R). Its cost grows as `N log N`, not with the filter. Forward only: the backward
    /// takes the direct path.
    Fft,
    /// Through a tensor-core FFT in the language (Hopper, bf16 and f16): each row and filter
    /// padded to `N ≥ L + Lk − 1`, transformed by small DFT matrices on the tensor cores
    /// ([`crate::fft`]), multiplied by the filter's spectrum, transformed back and through the
    /// epilogue. `N` 2048, 4096 or 8192: one kernel, a row in one or two warpgroups' registers.
    /// `N` a power of two from 16384 to [`CONV_TENSOR_CORE_MAX`]: `N = q·4096`, each row folded
    /// into its spectrum's `q/2 + 1` residues (`x̂[q·k + r]`, a complex transform of 4096 steps
    /// each; the other residues are their conjugates), each transformed, multiplied and
    /// transformed back in a warpgroup, then summed over the residues with the epilogue in a
    /// second kernel (`conv_fft_tc_long`, `conv_fft_tc_combine`; `N/2` f16 values a row in
    /// between). The transforms' operands are f16 (each row and filter spectrum scaled to at
    /// most 1 first): about 10⁻³ relative error. Forward only.
    TensorCore,
}

/// The gradients of a [`Conv1d`]: `dx` as `x`, `dk` as the filters (in the order they were
/// given), and those of the optional terms that were given.
pub struct Conv1dGrads<T: Element> {
    /// The signal's, `[batch, channels, L]`.
    pub dx: Tensor<T>,
    /// The filters', `[channels, Lk]`, summed over the batch.
    pub dk: Tensor<f32>,
    /// The bias's, `[channels]`.
    pub dbias: Option<Tensor<f32>>,
    /// The skip term's, `[channels]`.
    pub dskip: Option<Tensor<f32>>,
    /// The gate's, as the output.
    pub dgate: Option<Tensor<T>>,
}

impl<'a, T: ConvElement> Conv1d<'a, T> {
    /// The convolution of `x` `[batch, channels, L]` with the filters `k` `[channels, Lk]`.
    pub fn new(device: &'a Device, x: &'a Tensor<T>, k: &'a Tensor<f32>, mode: ConvMode) -> Self {
        Conv1d {
            device,
            x,
            k,
            mode,
            correlate: false,
            bias: None,
            skip: None,
            gate: None,
            silu: false,
            path: ConvPath::Auto,
            spectrum: None,
        }
    }

    /// Takes the filters' spectrum from `spectrum` (made by [`Conv1d::spectrum`] for the same
    /// filters, path, lengths and mode) instead of transforming them again; [`Conv1d::run`]
    /// refuses one that does not fit. The backward does not use it.
    pub fn with_spectrum(mut self, spectrum: &'a ConvSpectrum) -> Self {
        self.spectrum = Some(spectrum);
        self
    }

    /// The filters' spectrum as [`Conv1d::run`] makes it on this path, for these lengths and
    /// this mode, to reuse across calls ([`Conv1d::with_spectrum`]).
    ///
    /// # Errors
    /// As [`Conv1d::run`]'s checks of `x` and `k`; [`ConvPath::Direct`] (no transform); the
    /// tensor-core path's limits (16-bit `x`, `L + Lk − 1 ≤` [`CONV_TENSOR_CORE_MAX`]); a
    /// launch's or cuFFT's error.
    pub fn spectrum(&self) -> Result<ConvSpectrum> {
        let d = self.dims("conv1d")?;
        let key = self.spectrum_key(d, self.resolve(d))?;
        self.make_spectrum(d, key)
    }

    /// Computes the forward by `path` (by default [`ConvPath::Auto`]: the one a measured cost
    /// model favours).
    pub fn path(mut self, path: ConvPath) -> Self {
        self.path = path;
        self
    }

    /// The path [`Conv1d::run`] takes: the one asked for, or for [`ConvPath::Auto`] a kept
    /// spectrum's, else the cheapest by the cost model (never `Auto`).
    ///
    /// # Errors
    /// As [`Conv1d::run`]'s for the shapes of `x` and `k`.
    pub fn chosen_path(&self) -> Result<ConvPath> {
        Ok(self.resolve(self.dims("conv1d")?))
    }

    /// [`Conv1d::chosen_path`] for the checked dims `d`.
    fn resolve(&self, d: Dims) -> ConvPath {
        match (self.path, self.spectrum) {
            (ConvPath::Auto, Some(s)) => s.key.path,
            (ConvPath::Auto, None) => auto_path(self.device, std::mem::size_of::<T>(), d),
            (path, _) => path,
        }
    }

    /// A causal convolution with the weights `w` `[channels, K]` as PyTorch's `conv1d` (and the
    /// `causal-conv1d` package) take them, a cross-correlation padded `K − 1` steps on the left:
    /// `y[t] = Σ_j w[h, j]·x[t − (K − 1) + j]`. Add `.bias(b)` and `.silu()` for Mamba's.
    pub fn causal_conv1d(device: &'a Device, x: &'a Tensor<T>, w: &'a Tensor<f32>) -> Self {
        Conv1d { correlate: true, ..Conv1d::new(device, x, w, ConvMode::Causal) }
    }

    /// Adds `bias[h]` (`[channels]`, f32) before the activation.
    pub fn bias(mut self, bias: &'a Tensor<f32>) -> Self {
        self.bias = Some(bias);
        self
    }

    /// Adds the skip term `skip[h]·x[b, h, t]` (`[channels]`, f32; Hyena's and S4's `D`) before
    /// the activation.
    pub fn skip(mut self, skip: &'a Tensor<f32>) -> Self {
        self.skip = Some(skip);
        self
    }

    /// Applies SiLU after the bias and the skip term.
    pub fn silu(mut self) -> Self {
        self.silu = true;
        self
    }

    /// Multiplies the result by `gate` (of the output's shape), last.
    pub fn gate(mut self, gate: &'a Tensor<T>) -> Self {
        self.gate = Some(gate);
        self
    }

    /// The output's shape: `[batch, channels, L + Lk − 1]` in `full` mode, else `x`'s (the
    /// input's shape as given where it is not 3-D, for the error [`Conv1d::run`] gives).
    pub fn out_shape(&self) -> Vec<usize> {
        match (self.x.shape(), self.k.shape()) {
            (&[b, h, l], &[_, lk]) if self.mode == ConvMode::Full && l > 0 && lk > 0 => vec![b, h, l + lk - 1],
            (s, _) => s.to_vec(),
        }
    }

    /// The sizes after the checks: `(batch, channels, L, Lk, out L)`.
    fn dims(&self, name: &'static str) -> Result<Dims> {
        let arg = |arg: &str, expected: String, found: String| Error::Argument { kernel: name, arg: arg.into(), expected, found };
        let &[batch, channels, len] = self.x.shape() else {
            return Err(arg("x", "a 3-D tensor [batch, channels, L]".into(), format!("shape {:?}", self.x.shape())));
        };
        let taps = match *self.k.shape() {
            [h, lk] if h == channels && lk > 0 => lk,
            _ => {
                let what = if self.correlate { "w" } else { "k" };
                return Err(arg(
                    what,
                    format!("shape [{channels}, Lk] with Lk ≥ 1 (a filter a channel of x)"),
                    format!("shape {:?}", self.k.shape()),
                ));
            }
        };
        if self.mode == ConvMode::Same && taps > len {
            return Err(arg("k", format!("a filter no longer than the signal ({len} steps) in `same` mode"), format!("{taps} taps")));
        }
        for (what, t) in [("x", self.x.is_contiguous()), ("k", self.k.is_contiguous())] {
            if !t {
                return Err(arg(what, "a contiguous tensor".into(), "a strided one".into()));
            }
        }
        for (what, t) in [("bias", self.bias), ("skip", self.skip)] {
            if let Some(t) = t {
                if t.shape() != [channels] || !t.is_contiguous() {
                    return Err(arg(what, format!("a contiguous tensor of shape [{channels}]"), format!("shape {:?}", t.shape())));
                }
            }
        }
        let out = self.out_shape();
        if let Some(g) = self.gate {
            if g.shape() != out.as_slice() || !g.is_contiguous() {
                return Err(arg("gate", format!("a contiguous tensor of the output's shape {out:?}"), format!("shape {:?}", g.shape())));
            }
        }
        // The grid: steps along x, channels along y (≤ 65535 blocks), sequences along z.
        if batch > 65535 || channels.div_ceil(ROWS) > 65535 || i32::try_from(out[2] + taps).is_err() {
            let most = format!("at most 65535 sequences, {} channels and 2³¹ steps", 65535 * ROWS);
            return Err(arg("x", most, format!("shape {:?} (filters of {taps})", self.x.shape())));
        }
        // `y[t] = Σ_k w[k′]·x[t + shift + k]`: a convolution reverses the taps (k′ = Lk − 1 − k).
        let first = match self.mode {
            ConvMode::Same => (taps - 1) / 2,
            ConvMode::Full | ConvMode::Causal => 0,
        };
        Ok(Dims { batch, channels, len, taps, out: out[2], shift: first as i32 - (taps as i32 - 1), reverse: !self.correlate })
    }

    /// The epilogue's parts in use.
    fn flags(&self) -> Flags {
        Flags { bias: self.bias.is_some(), skip: self.skip.is_some(), gate: self.gate.is_some(), silu: self.silu }
    }

    /// Runs the convolution into `y` (of [`Conv1d::out_shape`], contiguous).
    ///
    /// # Errors
    /// [`Error::Argument`] naming the argument: `x` not 3-D or strided, `k` not `[channels, Lk]`
    /// or longer than the signal in `same` mode, `bias`/`skip` not `[channels]`, `gate` or `y`
    /// not of the output's shape; a launch error.
    pub fn run(&self, y: &mut Tensor<T>) -> Result<()> {
        let d = self.dims("conv1d")?;
        check_out("conv1d", "y", y, &self.out_shape())?;
        if d.batch * d.channels * d.out == 0 {
            return Ok(());
        }
        let (bias, skip) = (column(self.bias, d.channels)?, column(self.skip, d.channels)?);
        let terms = (bias.as_ref(), skip.as_ref());
        let flags = self.flags();
        let path = self.resolve(d);
        if path == ConvPath::Direct {
            if let Some(s) = self.spectrum {
                let found = format!("the spectrum of {}", s.key.describe());
                return Err(Error::Argument {
                    kernel: "conv1d",
                    arg: "spectrum".into(),
                    expected: "none on the direct path".into(),
                    found,
                });
            }
            return T::conv_launch(self.device, d, d.shift, d.reverse, self.x, self.k, terms, self.gate, y, flags);
        }
        let key = self.spectrum_key(d, path)?;
        let made;
        let spectrum = match self.spectrum {
            Some(s) if s.key == key => s,
            Some(s) => {
                return Err(Error::Argument {
                    kernel: "conv1d",
                    arg: "spectrum".into(),
                    expected: format!("the spectrum of {}", key.describe()),
                    found: format!("that of {}", s.key.describe()),
                })
            }
            None => {
                made = self.make_spectrum(d, key)?;
                &made
            }
        };
        match &spectrum.data {
            SpectrumData::Fft { kc, kd } => self.run_fft(d, key.n, (kc, kd), terms, y, flags),
            SpectrumData::TensorCore(tc) => T::tc_launch(self, d, tc, terms, y, flags),
        }
    }

    /// What a spectrum for this convolution (checked as `d`) on its path must fit.
    fn spectrum_key(&self, d: Dims, path: ConvPath) -> Result<SpectrumKey> {
        let arg = |arg: &str, expected: String, found: String| Error::Argument { kernel: "conv1d", arg: arg.into(), expected, found };
        let need = d.len + d.taps - 1;
        let key = |n: usize, first: usize| SpectrumKey { path, channels: d.channels, taps: d.taps, n, first, conj: !d.reverse };
        match path {
            ConvPath::Direct | ConvPath::Auto => {
                let expected = "a transform path (`ConvPath::Fft` or `ConvPath::TensorCore`) for a spectrum".into();
                let found = if self.path == ConvPath::Auto {
                    "ConvPath::Auto, which takes the direct path for these lengths".into()
                } else {
                    "ConvPath::Direct".into()
                };
                Err(arg("path", expected, found))
            }
            // The signal is padded to place the output; the filters start at step 0.
            ConvPath::Fft => Ok(key(fft_len(need), 0)),
            ConvPath::TensorCore => {
                if std::mem::size_of::<T>() != 2 {
                    return Err(tensor_core_f32());
                }
                let Some(shape) = TcShape::for_len(need) else {
                    let most = CONV_TENSOR_CORE_MAX;
                    return Err(arg("x", format!("L + Lk − 1 ≤ {most} on the tensor-core path"), format!("L {} and Lk {}", d.len, d.taps)));
                };
                if d.channels > 65535 {
                    return Err(arg("x", "at most 65535 channels on the tensor-core path".into(), format!("{} channels", d.channels)));
                }
                // The output read from step 0 of the circle: a convolution's tap `first` there,
                // a correlation's (conjugated spectrum) tap `Lk − 1 − first`.
                let first = (d.shift + d.taps as i32 - 1) as usize;
                Ok(key(shape.n(), if d.reverse { first } else { d.taps - 1 - first }))
            }
        }
    }

    /// The filters' spectrum fitting `key`.
    fn make_spectrum(&self, d: Dims, key: SpectrumKey) -> Result<ConvSpectrum> {
        let data = match key.path {
            ConvPath::TensorCore => tensor_core_spectrum(self.device, self.k, key)?,
            _ => self.fft_spectrum(d, key)?,
        };
        Ok(ConvSpectrum { key, data })
    }

    /// [`ConvPath::Fft`]'s filter spectrum: the filters padded to `N`, cuFFT's R2C, then
    /// `conv_fft_filter`'s factors (scaled by `1/N`, conjugated for a correlation).
    fn fft_spectrum(&self, d: Dims, key: SpectrumKey) -> Result<SpectrumData> {
        let dev = self.device;
        let stream = cufft_stream(dev)?;
        let (n, m2) = (key.n, 2 * (key.n / 2 + 1));
        let int =
            |v: usize| i32::try_from(v).map_err(|_| Error::Library { library: "libcufft", message: format!("a size of {v} past i32") });
        let pad_grid = Grid::from((n.div_ceil(COLS) as u32, d.channels.div_ceil(ROWS) as u32));
        let mut kp = written(&stream, d.channels * n)?;
        let kv = self.k.view(&[d.channels, d.taps], &[d.taps, 1])?;
        conv_fft_pad_f32::launch(dev, pad_grid, &kv, &mut tessera::global_mut(&mut kp, &[d.channels, n]), 0)?;
        let plans = dev.local(FFT_PLANS, || Ok(FftPlans::default()))?;
        let mut ks = written(&stream, d.channels * m2)?;
        plans.exec_r2c(&stream, int(n)?, int(d.channels)?, &kp, &mut ks)?;
        drop(kp);
        let (mut kc, mut kd) = (Tensor::<f32>::scratch(dev, &[d.channels, m2])?, Tensor::<f32>::scratch(dev, &[d.channels, m2])?);
        let grid = Grid::from((m2.div_ceil(COLS) as u32, d.channels.div_ceil(ROWS) as u32));
        let conj = if key.conj { -1.0 } else { 1.0 };
        conv_fft_filter::launch(dev, grid, &tessera::global(&ks, &[d.channels, m2]), &mut kc, &mut kd, 1.0 / n as f32, conj)?;
        Ok(SpectrumData::Fft { kc, kd })
    }

    /// [`ConvPath::Fft`]'s forward with the filters' factors `kc`, `kd` for length `n`.
    fn run_fft(
        &self, d: Dims, n: usize, (kc, kd): (&Tensor<f32>, &Tensor<f32>), terms: Columns<'_>, y: &mut Tensor<T>, flags: Flags,
    ) -> Result<()> {
        let dev = self.device;
        let stream = cufft_stream(dev)?;
        let (rows, m2) = (d.batch * d.channels, 2 * (n / 2 + 1));
        if rows.div_ceil(ROWS) > 65535 {
            let most = format!("at most {} sequences × channels on the FFT path", 65535 * ROWS);
            return Err(Error::Argument {
                kernel: "conv1d",
                arg: "x".into(),
                expected: most,
                found: format!("shape {:?}", self.x.shape()),
            });
        }
        let int =
            |v: usize| i32::try_from(v).map_err(|_| Error::Library { library: "libcufft", message: format!("a size of {v} past i32") });
        let (ni, rows_i) = (int(n)?, int(rows)?);
        // The signal, padded (a correlation's `Lk − 1` zeros first).
        let lead = if d.reverse { 0 } else { d.taps as i32 - 1 };
        let pad_grid = Grid::from((n.div_ceil(COLS) as u32, rows.div_ceil(ROWS) as u32));
        let mut xp = written(&stream, rows * n)?;
        let xv = self.x.view(&[rows, d.len], &[d.len, 1])?;
        T::fft_pad_launch(dev, pad_grid, &xv, &mut tessera::global_mut(&mut xp, &[rows, n]), lead)?;
        // The forward transform (batched over the rows), the product, the inverse.
        let plans = dev.local(FFT_PLANS, || Ok(FftPlans::default()))?;
        let mut xs = written(&stream, rows * m2)?;
        plans.exec_r2c(&stream, ni, rows_i, &xp, &mut xs)?;
        drop(xp);
        let mut prod = written(&stream, rows * m2)?;
        let grid3 = Grid::from((m2.div_ceil(COLS) as u32, d.channels.div_ceil(ROWS) as u32, d.batch as u32));
        conv_fft_product::launch(
            dev,
            grid3,
            &tessera::global(&xs, &[d.batch, d.channels, m2]),
            kc,
            kd,
            &mut tessera::global_mut(&mut prod, &[d.batch, d.channels, m2]),
        )?;
        drop(xs);
        let mut full = written(&stream, rows * n)?;
        plans.exec_c2r(&stream, ni, rows_i, &mut prod, &mut full)?;
        // The output's first step in the full convolution (`shift = first − (Lk − 1)`).
        let first = d.shift + d.taps as i32 - 1;
        T::fft_finish_launch(dev, d, &tessera::global(&full, &[d.batch, d.channels, n]), self.x, terms, self.gate, y, first, flags)
    }

    /// The gradients from `dy` (of the output's shape): `dx`, `dk`, and those of the bias, the
    /// skip term and the gate where they were given. Recomputes the forward where the
    /// activation or the gate needs it; sums in f32.
    ///
    /// # Errors
    /// As [`Conv1d::run`], and `dy` not of the output's shape.
    pub fn backward(&self, dy: &Tensor<T>) -> Result<Conv1dGrads<T>> {
        let d = self.dims("conv1d_backward")?;
        check_out("conv1d_backward", "dy", dy, &self.out_shape())?;
        let dev = self.device;
        // dx and dgate are written whole by the launches (where there are any): no zeroing.
        let empty = d.batch * d.channels * d.out == 0;
        let written = |shape: &[usize]| if empty { Tensor::zeros(dev, shape) } else { Tensor::scratch(dev, shape) };
        let mut grads = Conv1dGrads {
            dx: written(self.x.shape())?,
            dk: Tensor::zeros(dev, &[d.channels, d.taps])?,
            dbias: self.bias.map(|_| Tensor::zeros(dev, &[d.channels])).transpose()?,
            dskip: self.skip.map(|_| Tensor::zeros(dev, &[d.channels])).transpose()?,
            dgate: self.gate.map(|_| written(&self.out_shape())).transpose()?,
        };
        if empty {
            return Ok(grads);
        }
        let (bias, skip) = (column(self.bias, d.channels)?, column(self.skip, d.channels)?);
        let flags = self.flags();
        // The gradient reaching the convolution: `dy` itself without an activation or a gate.
        let mut dpre = if flags.silu || flags.gate { Some(Tensor::<T>::scratch(dev, &self.out_shape())?) } else { None };
        {
            let mut dbias = grads.dbias.as_mut().map(|t| t.view_mut(&[d.channels, 1], &[1, 1])).transpose()?;
            let mut dskip = grads.dskip.as_mut().map(|t| t.view_mut(&[d.channels, 1], &[1, 1])).transpose()?;
            T::conv_grads_launch(
                dev,
                d,
                ConvGradArgs {
                    x: self.x,
                    k: self.k,
                    bias: bias.as_ref(),
                    skip: skip.as_ref(),
                    gate: self.gate,
                    dy,
                    dpre: dpre.as_mut(),
                    dgate: grads.dgate.as_mut(),
                    dk: &mut grads.dk,
                    dbias: dbias.as_mut(),
                    dskip: dskip.as_mut(),
                },
                flags,
            )?;
        }
        // dx[i] = Σ_k w[k′]·dpre[i − shift − k]: the same kernel, the taps the other way round,
        // plus skip·dpre[i] (the skip term's own step), over L steps.
        let back = Dims { out: d.len, ..d };
        let only_skip = Flags { bias: false, skip: flags.skip, gate: false, silu: false };
        let shift = -d.shift - (d.taps as i32 - 1);
        T::conv_launch(
            dev,
            back,
            shift,
            !d.reverse,
            dpre.as_ref().unwrap_or(dy),
            self.k,
            (None, skip.as_ref()),
            None,
            &mut grads.dx,
            only_skip,
        )?;
        Ok(grads)
    }
}

/// A `[channels]` tensor as the `[channels, 1]` column the kernels take.
fn column(t: Option<&Tensor<f32>>, channels: usize) -> Result<Option<tessera::TensorView<'_, f32>>> {
    t.map(|t| t.view(&[channels, 1], &[1, 1])).transpose()
}

/// Checks an output (or `dy`) of shape `want`, contiguous.
fn check_out<T: Element>(kernel: &'static str, what: &str, t: &Tensor<T>, want: &[usize]) -> Result<()> {
    if t.shape() == want && t.is_contiguous() {
        return Ok(());
    }
    Err(Error::Argument {
        kernel,
        arg: what.into(),
        expected: format!("a contiguous tensor of shape {want:?}"),
        found: format!("shape {:?}, strides {:?}", t.shape(), t.strides()),
    })
}

/// A checked convolution's sizes and its kernel's `shift` and tap order.
#[doc(hidden)]
#[derive(Clone, Copy, Debug)]
pub struct Dims {
    batch: usize,
    channels: usize,
    len: usize,
    taps: usize,
    out: usize,
    shift: i32,
    reverse: bool,
}

impl Dims {
    fn grid(&self) -> Grid {
        Grid::from((self.out.div_ceil(COLS) as u32, self.channels.div_ceil(ROWS) as u32, self.batch as u32))
    }

    /// The short path's grid: a block walks `WALK` tiles along the steps, `rows` channels each.
    fn short_grid(&self, rows: usize) -> Grid {
        Grid::from((self.out.div_ceil(COLS * WALK) as u32, self.channels.div_ceil(rows) as u32, self.batch as u32))
    }

    /// Whether a launch at `shift` takes the short path: every tap's offset within `−8..=8`.
    fn short(&self, shift: i32) -> bool {
        shift >= -8 && shift + self.taps as i32 - 1 <= 8
    }

    /// The short kernel's variant for a launch at `shift`: the one whose knobs fix this
    /// filter's length and first offset (`K`, `P = shift + 8`), else the one that takes any.
    fn short_variant(&self, all: &[&KernelSpec], shift: i32) -> usize {
        let fixed = |s: &&KernelSpec| s.knob("K") == Some(self.taps as i64) && s.knob("P") == Some(i64::from(shift) + 8);
        all.iter().position(fixed).or_else(|| all.iter().position(|s| s.knob("K") == Some(0))).unwrap_or(0)
    }
}

/// The epilogue's parts in use.
#[doc(hidden)]
#[derive(Clone, Copy, Debug)]
pub struct Flags {
    bias: bool,
    skip: bool,
    gate: bool,
    silu: bool,
}

/// The backward's first launch's tensors.
#[doc(hidden)]
pub struct ConvGradArgs<'t, 'v, T: Element> {
    x: &'t Tensor<T>,
    k: &'t Tensor<f32>,
    bias: Option<&'t tessera::TensorView<'v, f32>>,
    skip: Option<&'t tessera::TensorView<'v, f32>>,
    gate: Option<&'t Tensor<T>>,
    dy: &'t Tensor<T>,
    dpre: Option<&'t mut Tensor<T>>,
    dgate: Option<&'t mut Tensor<T>>,
    dk: &'t mut Tensor<f32>,
    dbias: Option<&'t mut tessera::TensorViewMut<'v, f32>>,
    dskip: Option<&'t mut tessera::TensorViewMut<'v, f32>>,
}

/// The element types [`Conv1d`] takes: bf16, f16, f32.
pub trait ConvElement: Element + TensorCoreConv + sealed::Sealed {
    #[doc(hidden)]
    #[allow(clippy::too_many_arguments)]
    fn conv_launch(
        device: &Device, d: Dims, shift: i32, reverse: bool, x: &Tensor<Self>, k: &Tensor<f32>,
        terms: (Option<&tessera::TensorView<'_, f32>>, Option<&tessera::TensorView<'_, f32>>), gate: Option<&Tensor<Self>>,
        y: &mut Tensor<Self>, flags: Flags,
    ) -> Result<()>;
    #[doc(hidden)]
    fn conv_grads_launch(device: &Device, d: Dims, a: ConvGradArgs<'_, '_, Self>, flags: Flags) -> Result<()>;
    #[doc(hidden)]
    fn fft_pad_launch(
        device: &Device, grid: Grid, x: &tessera::TensorView<'_, Self>, out: &mut tessera::CudaGlobal<&mut cudarc::driver::CudaSlice<f32>>,
        lead: i32,
    ) -> Result<()>;
    #[doc(hidden)]
    #[allow(clippy::too_many_arguments)]
    fn fft_finish_launch(
        device: &Device, d: Dims, full: &tessera::CudaGlobal<&cudarc::driver::CudaSlice<f32>>, x: &Tensor<Self>, terms: Columns<'_>,
        gate: Option<&Tensor<Self>>, y: &mut Tensor<Self>, first: i32, flags: Flags,
    ) -> Result<()>;
}

/// The tensor-core path's forward (bf16 and f16; f32 has none).
#[doc(hidden)]
pub trait TensorCoreConv: Element + Sized {
    #[doc(hidden)]
    #[allow(clippy::too_many_arguments)]
    fn tc_launch(
        conv: &Conv1d<'_, Self>, d: Dims, spectrum: &TcSpectrum, terms: Columns<'_>, y: &mut Tensor<Self>, flags: Flags,
    ) -> Result<()>
    where
        Self: ConvElement;
}

impl TensorCoreConv for f32 {
    fn tc_launch(_: &Conv1d<'_, Self>, _: Dims, _: &TcSpectrum, _: Columns<'_>, _: &mut Tensor<Self>, _: Flags) -> Result<()> {
        Err(tensor_core_f32())
    }
}

/// The tensor-core path's refusal of f32 signals.
fn tensor_core_f32() -> Error {
    Error::Argument {
        kernel: "conv1d",
        arg: "x".into(),
        expected: "bf16 or f16 on the tensor-core path (f32 takes `ConvPath::Fft` or `Direct`)".into(),
        found: "f32".into(),
    }
}

/// Whether cuFFT's library loads here (looked for once a process: each look opens it).
fn cufft_present() -> bool {
    static PRESENT: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *PRESENT.get_or_init(|| {
        let names = if cfg!(windows) {
            &["cufft64_12.dll", "cufft64_11.dll"][..]
        } else {
            &["libcufft.so.12", "libcufft.so.11", "libcufft.so"][..]
        };
        tessera::library_present(names)
    })
}

/// [`ConvPath::Auto`]'s choice for `bytes`-byte elements: the cheapest path by time a row
/// (nanoseconds, a full H200; session 45's `TESSERA_BENCH_SCANS=convpaths` and the long rows).
/// The direct path costs `out·Lk` steps a row, its short kernel (`Lk ≤ 9`) always wins; the
/// transforms cost by their length `N` alone.
fn auto_path(dev: &Device, bytes: usize, d: Dims) -> ConvPath {
    if dev.is_cpu() || d.taps <= 9 {
        return ConvPath::Direct;
    }
    // 0.438 ms (bf16) and 0.71 ms (f32) for 6144 rows of 2048 steps at Lk 64.
    let direct = (d.out * d.taps) as f64 * if bytes == 2 { 5.4e-4 } else { 8.8e-4 };
    let need = d.len + d.taps - 1;
    // By `N` from 4096 doubling; past the table, ×2.3 a doubling.
    let by_n = |n: usize, table: &[f64]| {
        let i = n.next_power_of_two().max(4096).trailing_zeros() as usize - 12;
        table.get(i).copied().unwrap_or_else(|| table[table.len() - 1] * 2.3f64.powi((i + 1 - table.len()) as i32))
    };
    let tc = (bytes == 2 && dev.compute_capability().0 == 9)
        .then(|| TcShape::for_len(need))
        .flatten()
        .map(|s| by_n(s.n(), &[28.0, 61.0, 250.0, 320.0, 874.0, 2900.0]));
    if let Some(tc) = tc {
        return if tc < direct { ConvPath::TensorCore } else { ConvPath::Direct };
    }
    let fft = by_n(fft_len(need), &[47.0, 180.0, 250.0, 611.0, 1640.0, 4960.0]);
    if fft < direct && cufft_present() {
        ConvPath::Fft
    } else {
        ConvPath::Direct
    }
}

/// The device's stream where cuFFT can be loaded, else an error naming what is missing.
fn cufft_stream(dev: &Device) -> Result<std::sync::Arc<cudarc::driver::CudaStream>> {
    let stream = dev.stream().map_err(|_| Error::NotCuda { what: "conv1d's FFT path (cuFFT)" })?.clone();
    if !cufft_present() {
        return Err(Error::Library { library: "libcufft", message: "could not be loaded: conv1d's FFT path needs cuFFT".into() });
    }
    Ok(stream)
}

/// A buffer of `len` f32 for the FFT path, not cleared: each is written whole before it is read
/// (by `conv_fft_pad`, which writes every column of its rows, zeros included; by cuFFT's
/// transforms; by `conv_fft_product`), so clearing would only add a pass over memory.
fn written(stream: &std::sync::Arc<cudarc::driver::CudaStream>, len: usize) -> Result<cudarc::driver::CudaSlice<f32>> {
    // SAFETY: f32 is plain data, so any bits a read could find are a value; and no read comes
    // before the write that covers it (above).
    Ok(unsafe { stream.alloc::<f32>(len.max(1)) }?)
}

/// The variant of a tensor-core kernel for the shape `(P, N2)`.
fn tensor_core_variant(all: &[&KernelSpec], (p, n2): (usize, usize)) -> usize {
    let shape = |s: &&KernelSpec| s.knob("P") == Some(p as i64) && s.knob("N2") == Some(n2 as i64);
    all.iter().position(shape).unwrap_or(0)
}

/// [`ConvPath::TensorCore`]'s filter spectrum for `key`: the filters placed on the circle
/// (`conv_fft_wrap`: tap `key.first` at step 0), then `conv_fft_tc_filter`.
fn tensor_core_spectrum(dev: &Device, k: &Tensor<f32>, key: SpectrumKey) -> Result<SpectrumData> {
    let (n, channels) = (key.n, key.channels);
    let shape = TcShape::for_len(n).filter(|s| s.n() == n).ok_or_else(|| Error::Argument {
        kernel: "conv1d",
        arg: "x".into(),
        expected: "a tensor-core transform length".into(),
        found: format!("N = {n}"),
    })?;
    let mut g = Tensor::<f32>::scratch(dev, &[channels, n])?;
    let grid = Grid::from((n.div_ceil(COLS) as u32, channels.div_ceil(ROWS) as u32));
    conv_fft_wrap::launch(dev, grid, k, &mut g, key.first as i32)?;
    let conj = if key.conj { -1.0 } else { 1.0 };
    let tables = crate::fft::FftTables::get(dev, shape.tables().0, shape.tables().1)?;
    let (p, n2) = match shape {
        TcShape::Short { p, n2 } => (p, n2),
        TcShape::Long { q } => {
            // Residues 0..=q/2 of the spectrum, each an `M`-point transform.
            let res = q / 2 + 1;
            let mut kf = Tensor::<tessera::f16>::scratch(dev, &[channels * res, 2, TC_LONG_M / 64, 64])?;
            let mut ks = Tensor::<f32>::scratch(dev, &[channels * res, 1])?;
            conv_fft_tc_long_filter::launch(
                dev,
                Grid::from((channels * res).div_ceil(TC_LONG_ITEMS) as u32),
                &g.view(&[channels, n / 64, 64], &[n, 64, 1])?,
                &mut kf,
                &mut ks,
                &tables.f1,
                &tables.f2,
                &tables.tw,
                conj,
                TC_LONG_ITEMS as i32,
                q as i32,
                // Where no tap wraps to the circle's end, only the blocks the filters reach.
                if key.first == 0 { key.taps.div_ceil(TC_LONG_M) as i32 } else { q as i32 },
            )?;
            return Ok(SpectrumData::TensorCore(TcSpectrum { kf, ks, shape, tables }));
        }
    };
    let n1 = 64 * p;
    let mut kf = Tensor::<tessera::f16>::scratch(dev, &[channels, 2, n1, n2])?;
    let mut ks = Tensor::<f32>::scratch(dev, &[channels, 1])?;
    conv_fft_tc_filter::launch_variant(
        tensor_core_variant(conv_fft_tc_filter::VARIANTS, (p, n2)),
        dev,
        Grid::from(channels.div_ceil(4 / p) as u32),
        &g.view(&[channels, n1, n2], &[n, n2, 1])?,
        &mut kf,
        &mut ks,
        &tables.f1,
        &tables.f2,
        &tables.tw,
        conj,
    )?;
    Ok(SpectrumData::TensorCore(TcSpectrum { kf, ks, shape, tables }))
}

/// The tensor-core path's shapes `(P, N2)` (`N = 64·P·N2`: warpgroups a row, steps a line),
/// shortest first.
const TC_SHAPES: [(usize, usize); 3] = [(1, 32), (1, 64), (2, 64)];

/// The part a longer transform (`N = q·M`, `q` 4 to 32) splits into: `M = 4096` steps, a row of
/// `64 × 64` in one warpgroup (`conv_fft_tc_long`).
const TC_LONG_M: usize = 4096;

/// Rows × residues a `conv_fft_tc_long` block takes (four turns of its four warpgroups).
const TC_LONG_ITEMS: usize = 16;

/// The longest full convolution (`L + Lk − 1`) [`ConvPath::TensorCore`] takes: 32 parts of
/// [`TC_LONG_M`].
pub const CONV_TENSOR_CORE_MAX: usize = 32 * TC_LONG_M;

/// The tensor-core path's transform: one block a row (`N = 64·P·N2`, one of [`TC_SHAPES`]), or
/// `q` parts of [`TC_LONG_M`] (`q` a power of two, 4 to 32).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum TcShape {
    /// `conv_fft_tc`: `P` warpgroups a row, `N2` steps a line.
    Short { p: usize, n2: usize },
    /// `conv_fft_tc_long` and `conv_fft_tc_combine`.
    Long { q: usize },
}

impl TcShape {
    /// The transform for a full convolution of `need` steps: the shortest of [`TC_SHAPES`] that
    /// holds it, else the power of two `q·M`; none past [`CONV_TENSOR_CORE_MAX`].
    fn for_len(need: usize) -> Option<TcShape> {
        let short = TC_SHAPES.into_iter().find(|&(p, n2)| 64 * p * n2 >= need).map(|(p, n2)| TcShape::Short { p, n2 });
        short.or_else(|| {
            let n = need.next_power_of_two();
            (n <= CONV_TENSOR_CORE_MAX).then_some(TcShape::Long { q: n / TC_LONG_M })
        })
    }

    /// The transform's length `N`.
    fn n(self) -> usize {
        match self {
            TcShape::Short { p, n2 } => 64 * p * n2,
            TcShape::Long { q } => q * TC_LONG_M,
        }
    }

    /// The `(P, N2)` of the DFT tables it reads ([`crate::fft::FftTables::get`]).
    fn tables(self) -> (usize, usize) {
        match self {
            TcShape::Short { p, n2 } => (p, n2),
            TcShape::Long { .. } => (1, 64),
        }
    }
}

/// Sequences a tensor-core block takes at most (its four warpgroups, `P` to a sequence, taking
/// turns).
const TC_ROWS: usize = 8;

macro_rules! tensor_core_conv {
    ($t:ty, $tc:ident, $long:ident, $combine:ident, $copy:ident) => {
        impl TensorCoreConv for $t {
            fn tc_launch(
                conv: &Conv1d<'_, Self>, d: Dims, spectrum: &TcSpectrum, (bias, skip): Columns<'_>, y: &mut Tensor<Self>, flags: Flags,
            ) -> Result<()> {
                let dev = conv.device;
                let TcSpectrum { kf, ks, shape, tables } = spectrum;
                let rows = d.batch * d.channels;
                let grid = |r: usize, cols: usize| Grid::from((cols.div_ceil(COLS) as u32, r.div_ceil(ROWS) as u32));
                let padded = |t: &Tensor<Self>, len: usize, to: usize| -> Result<Option<Tensor<Self>>> {
                    if len == to {
                        return Ok(None);
                    }
                    let mut p = Tensor::<Self>::scratch(dev, &[rows, to])?;
                    $copy::launch(dev, grid(rows, to), &t.view(&[rows, len], &[len, 1])?, &mut p)?;
                    Ok(Some(p))
                };
                let (p, n2) = match *shape {
                    TcShape::Short { p, n2 } => (p, n2),
                    TcShape::Long { q } => {
                        // Each residue's part of the output into `w`, then their sum and the epilogue.
                        let m = TC_LONG_M;
                        let lp = d.len.next_multiple_of(64);
                        let xp = padded(conv.x, d.len, lp)?;
                        let xv = xp.as_ref().unwrap_or(conv.x).view(&[rows, lp / 64, 64], &[lp, 64, 1])?;
                        let mut w = Tensor::<tessera::f16>::scratch(dev, &[q, rows, m / 64, 64])?;
                        let mut ws = Tensor::<f32>::scratch(dev, &[q, rows, 1])?;
                        let items = rows * (q / 2 + 1);
                        $long::launch(
                            dev,
                            Grid::from(items.div_ceil(TC_LONG_ITEMS) as u32),
                            &xv,
                            kf,
                            ks,
                            &mut w,
                            &mut ws,
                            &tables.f1,
                            &tables.f2,
                            &tables.tw,
                            TC_LONG_ITEMS as i32,
                            q as i32,
                            lp.div_ceil(m) as i32,
                        )?;
                        return $combine::launch(
                            dev,
                            d.grid(),
                            &w.view(&[q, d.batch, d.channels, m], &[rows * m, d.channels * m, m, 1])?,
                            &ws.view(&[q, d.batch, d.channels, 1], &[rows, d.channels, 1, 1])?,
                            conv.x,
                            &Optional(bias, 2),
                            &Optional(skip, 2),
                            &Optional(conv.gate, 3),
                            y,
                            q as i32,
                            flag(flags.bias),
                            flag(flags.skip),
                            flag(flags.gate),
                            flag(flags.silu),
                        );
                    }
                };
                // A whole number of the block's turns (4 sequences).
                let tc_rows = d.batch.next_multiple_of(4).min(TC_ROWS);
                // Rows of whole `N2`-step lines: padded copies where the lengths are not.
                let (lp, lop) = (d.len.next_multiple_of(n2), d.out.next_multiple_of(n2));
                let xp = padded(conv.x, d.len, lp)?;
                let gp = match conv.gate {
                    Some(gt) => padded(gt, d.out, lop)?,
                    None => None,
                };
                let mut yp = if lop == d.out { None } else { Some(Tensor::<Self>::scratch(dev, &[rows, lop])?) };
                let xs = xp.as_ref().unwrap_or(conv.x);
                let gate = gp.as_ref().or(conv.gate);
                {
                    let xv = xs.view(&[rows, lp / n2, n2], &[lp, n2, 1])?;
                    let gv = gate.map(|t| t.view(&[rows, lop / n2, n2], &[lop, n2, 1])).transpose()?;
                    let yt = yp.as_mut().unwrap_or(y);
                    let mut yv = yt.view_mut(&[rows, lop / n2, n2], &[lop, n2, 1])?;
                    $tc::launch_variant(
                        tensor_core_variant($tc::VARIANTS, (p, n2)),
                        dev,
                        Grid::from((d.channels as u32, d.batch.div_ceil(tc_rows) as u32)),
                        &xv,
                        kf,
                        ks,
                        &Optional(bias, 2),
                        &Optional(skip, 2),
                        &Optional(gv.as_ref(), 3),
                        &mut yv,
                        &tables.f1,
                        &tables.f2,
                        &tables.tw,
                        tc_rows as i32,
                        flag(flags.bias),
                        flag(flags.skip),
                        flag(flags.gate),
                        flag(flags.silu),
                    )?;
                }
                if let Some(p) = yp {
                    let out = d.out;
                    $copy::launch(dev, grid(rows, out), &p, &mut y.view_mut(&[rows, out], &[out, 1])?)?;
                }
                Ok(())
            }
        }
    };
}
tensor_core_conv!(tessera::bf16, conv_fft_tc_bf16, conv_fft_tc_long_bf16, conv_fft_tc_combine_bf16, conv_copy_rows_bf16);
tensor_core_conv!(tessera::f16, conv_fft_tc_f16, conv_fft_tc_long_f16, conv_fft_tc_combine_f16, conv_copy_rows_f16);

/// The bias and skip columns (`[channels, 1]` views) where given.
#[doc(hidden)]
pub type Columns<'v> = (Option<&'v tessera::TensorView<'v, f32>>, Option<&'v tessera::TensorView<'v, f32>>);

mod sealed {
    pub trait Sealed {}
    impl Sealed for tessera::bf16 {}
    impl Sealed for tessera::f16 {}
    impl Sealed for f32 {}
}

fn flag(b: bool) -> i32 {
    i32::from(b)
}

macro_rules! conv_element {
    ($t:ty, $fwd:ident, $grads:ident, $short:ident, $short_grads:ident, $pad:ident, $finish:ident) => {
        impl ConvElement for $t {
            fn fft_pad_launch(
                device: &Device, grid: Grid, x: &tessera::TensorView<'_, Self>,
                out: &mut tessera::CudaGlobal<&mut cudarc::driver::CudaSlice<f32>>, lead: i32,
            ) -> Result<()> {
                $pad::launch(device, grid, x, out, lead)
            }

            fn fft_finish_launch(
                device: &Device, d: Dims, full: &tessera::CudaGlobal<&cudarc::driver::CudaSlice<f32>>, x: &Tensor<Self>,
                (bias, skip): Columns<'_>, gate: Option<&Tensor<Self>>, y: &mut Tensor<Self>, first: i32, flags: Flags,
            ) -> Result<()> {
                $finish::launch(
                    device,
                    d.grid(),
                    full,
                    x,
                    &Optional(bias, 2),
                    &Optional(skip, 2),
                    &Optional(gate, 3),
                    y,
                    first,
                    flag(flags.bias),
                    flag(flags.skip),
                    flag(flags.gate),
                    flag(flags.silu),
                )
            }

            fn conv_launch(
                device: &Device, d: Dims, shift: i32, reverse: bool, x: &Tensor<Self>, k: &Tensor<f32>,
                (bias, skip): (Option<&tessera::TensorView<'_, f32>>, Option<&tessera::TensorView<'_, f32>>), gate: Option<&Tensor<Self>>,
                y: &mut Tensor<Self>, flags: Flags,
            ) -> Result<()> {
                let short = d.short(shift);
                let variant = if short { d.short_variant($short::VARIANTS, shift) } else { 0 };
                let launch = if short { $short::launch_variant } else { $fwd::launch_variant };
                let grid = if short { d.short_grid(ROWS / 2) } else { d.grid() };
                launch(
                    variant,
                    device,
                    grid,
                    x,
                    k,
                    &Optional(bias, 2),
                    &Optional(skip, 2),
                    &Optional(gate, 3),
                    y,
                    shift,
                    flag(reverse),
                    flag(flags.bias),
                    flag(flags.skip),
                    flag(flags.gate),
                    flag(flags.silu),
                )
            }

            fn conv_grads_launch(device: &Device, d: Dims, a: ConvGradArgs<'_, '_, Self>, flags: Flags) -> Result<()> {
                let short = d.short(d.shift);
                let variant = if short { d.short_variant($short_grads::VARIANTS, d.shift) } else { 0 };
                let launch = if short { $short_grads::launch_variant } else { $grads::launch_variant };
                let grid = if short { d.short_grid(ROWS / 2) } else { d.grid() };
                launch(
                    variant,
                    device,
                    grid,
                    a.x,
                    a.k,
                    &Optional(a.bias, 2),
                    &Optional(a.skip, 2),
                    &Optional(a.gate, 3),
                    a.dy,
                    &mut OptionalMut(a.dpre, 3),
                    &mut OptionalMut(a.dgate, 3),
                    a.dk,
                    &mut OptionalMut(a.dbias, 2),
                    &mut OptionalMut(a.dskip, 2),
                    d.shift,
                    flag(d.reverse),
                    flag(flags.bias),
                    flag(flags.skip),
                    flag(flags.gate),
                    flag(flags.silu),
                )
            }
        }
    };
}
conv_element!(
    tessera::bf16,
    conv1d_direct_bf16,
    conv1d_direct_grads_bf16,
    conv1d_short_bf16,
    conv1d_short_grads_bf16,
    conv_fft_pad_bf16,
    conv_fft_finish_bf16
);
conv_element!(
    tessera::f16,
    conv1d_direct_f16,
    conv1d_direct_grads_f16,
    conv1d_short_f16,
    conv1d_short_grads_f16,
    conv_fft_pad_f16,
    conv_fft_finish_f16
);
conv_element!(
    f32,
    conv1d_direct_f32,
    conv1d_direct_grads_f32,
    conv1d_short_f32,
    conv1d_short_grads_f32,
    conv_fft_pad_f32,
    conv_fft_finish_f32
);

/// The smallest length ≥ `n` whose only prime factors are 2, 3, 5 and 7 (cuFFT's fast sizes).
pub(crate) fn fft_len(n: usize) -> usize {
    (n.max(1)..)
        .find(|&v| {
            let mut r = v;
            for p in [2, 3, 5, 7] {
                while r % p == 0 {
                    r /= p;
                }
            }
            r == 1
        })
        .unwrap_or(n)
}

/// The key of the FFT path's plans among a device's [`Device::local`] values.
const FFT_PLANS: u64 = 0x000c_0ff7;

/// cuFFT plans by (length, batch, direction), kept with their device (made on its stream).
#[derive(Default)]
struct FftPlans(std::sync::Mutex<std::collections::HashMap<(i32, i32, bool), std::sync::Arc<cudarc::cufft::CudaFft>>>);

fn cufft_error(e: cudarc::cufft::result::CufftError) -> Error {
    Error::Library { library: "libcufft", message: format!("{e:?}") }
}

impl FftPlans {
    /// The plan for `batch` real transforms of length `n` (`inverse`: C2R), made on first use.
    fn plan(
        &self, stream: &std::sync::Arc<cudarc::driver::CudaStream>, n: i32, batch: i32, inverse: bool,
    ) -> Result<std::sync::Arc<cudarc::cufft::CudaFft>> {
        use cudarc::cufft::sys::cufftType;
        let mut plans = self.0.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(p) = plans.get(&(n, batch, inverse)) {
            return Ok(p.clone());
        }
        let kind = if inverse { cufftType::CUFFT_C2R } else { cufftType::CUFFT_R2C };
        let plan = std::sync::Arc::new(cudarc::cufft::CudaFft::plan_1d(n, kind, batch, stream.clone()).map_err(cufft_error)?);
        plans.insert((n, batch, inverse), plan.clone());
        Ok(plan)
    }

    /// `batch` R2C transforms of length `n`: `input` `[batch, n]` → `out` `[batch, n/2 + 1]` pairs.
    fn exec_r2c(
        &self, stream: &std::sync::Arc<cudarc::driver::CudaStream>, n: i32, batch: i32, input: &cudarc::driver::CudaSlice<f32>,
        out: &mut cudarc::driver::CudaSlice<f32>,
    ) -> Result<()> {
        let plan = self.plan(stream, n, batch, false)?;
        plan.exec_r2c(input, &mut pairs(out)?).map_err(cufft_error)
    }

    /// `batch` C2R transforms of length `n`: `input` `[batch, n/2 + 1]` pairs (overwritten) →
    /// `out` `[batch, n]`.
    fn exec_c2r(
        &self, stream: &std::sync::Arc<cudarc::driver::CudaStream>, n: i32, batch: i32, input: &mut cudarc::driver::CudaSlice<f32>,
        out: &mut cudarc::driver::CudaSlice<f32>,
    ) -> Result<()> {
        let plan = self.plan(stream, n, batch, true)?;
        plan.exec_c2r(&mut pairs(input)?, out).map_err(cufft_error)
    }
}

/// A spectrum's f32 buffer as cuFFT's complex pairs.
fn pairs(buf: &mut cudarc::driver::CudaSlice<f32>) -> Result<cudarc::driver::CudaViewMut<'_, cudarc::cufft::sys::float2>> {
    let len = buf.len() / 2;
    // SAFETY: an f32 pair has float2's layout, and the buffer holds `len` of them.
    unsafe { buf.transmute_mut::<cudarc::cufft::sys::float2>(len) }
        .ok_or_else(|| Error::Library { library: "libcufft", message: "an odd spectrum buffer".into() })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn dims(taps: usize) -> Dims {
        Dims { batch: 1, channels: 8, len: 4096, taps, out: 4096, shift: 1 - taps as i32, reverse: false }
    }

    /// The short path's fixed variants are built and picked for the filters they fix — the
    /// causal forward and its transpose (`dx`) at 4 and 3 taps — and the any-filter one for
    /// the rest; a variant dropped at build time would fall back silently without this.
    #[test]
    fn short_variants_fix_the_common_filters() {
        let knobs = |all: &[&KernelSpec], i: usize| (all[i].knob("K"), all[i].knob("P"));
        for all in [conv1d_short_bf16::VARIANTS, conv1d_short_f16::VARIANTS, conv1d_short_f32::VARIANTS] {
            for taps in [3_usize, 4] {
                let d = dims(taps);
                let k = Some(taps as i64);
                assert_eq!(knobs(all, d.short_variant(all, d.shift)), (k, Some(9 - taps as i64)));
                assert_eq!(knobs(all, d.short_variant(all, 0)), (k, Some(8)));
                assert_eq!(knobs(all, d.short_variant(all, -1)), (Some(0), Some(0)));
            }
            assert_eq!(knobs(all, dims(2).short_variant(all, -1)), (Some(0), Some(0)));
        }
        for all in [conv1d_short_grads_bf16::VARIANTS, conv1d_short_grads_f16::VARIANTS, conv1d_short_grads_f32::VARIANTS] {
            let d = dims(4);
            assert_eq!(knobs(all, d.short_variant(all, d.shift)), (Some(4), Some(5)));
            assert_eq!(knobs(all, d.short_variant(all, 0)), (Some(0), Some(0)));
        }
    }
}
