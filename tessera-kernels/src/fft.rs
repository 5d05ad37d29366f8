//! A tensor-core FFT in the language: lengths `N = N1·N2` (`N1 = 64·P` with `P` warpgroups to a
//! row, `N2` 32 or 64: 2048 to 8192) as Cooley–Tukey's two steps of small DFT matrices applied
//! by `mma_sync`, a row in its warpgroups' registers — FlashFFTConv's Monarch decomposition.
//!
//! A row `x[n]`, `n = N2·n1 + n2`, is the `N1 × N2` matrix `X[n1][n2]` (the row as it lies in
//! memory). Its spectrum `x̂[k1 + N1·k2]` is
//!
//! `D = ((F_N1 · X) ∘ W) · F_N2`, `W[k1][n2] = ω_N^(k1·n2)`,
//!
//! with `F_n[j][k] = ω_n^(j·k)`, `ω_n = e^(−2πi/n)`: two real MMAs (`X` is real), the twiddles
//! elementwise on the accumulators, four MMAs with the twiddled matrix as a register operand.
//! Each of the `P` warpgroups computes 64 rows `k1` (the second step works on rows alone). The
//! inverse runs the same steps backwards with the conjugates and keeps the real part (two
//! MMAs, over every warpgroup's rows: a named barrier among them first). The DFT matrices are
//! scaled by `1/√n` (unitary), so magnitudes stay within f16's range where the row is scaled
//! to at most 1 first; operands are f16, sums f32. The matrices and the twiddles come from
//! tables made once a device on the host ([`FftTables`]): the matrices copied into shared
//! memory once a block with the twiddles (f16).
//!
//! Longer rows, `N = q·M` (`M = 4096`, `q` 4 to 32), are folded first ([`fft_fold`]): with `n =
//! m + M·j` and `k = q·k′ + r`, `x̂[q·k′ + r]` is the `M`-point transform of `u_r[m] = ω_N^(m·r)·
//! Σ_j x[m + M·j]·ω_q^(j·r)`, a complex row that [`fft_forward_complex`] takes (four MMAs in the
//! first step, `f1`'s third stage the imaginary part negated); [`fft_inverse_complex`] keeps
//! the imaginary part on the way back. A real row needs the residues `0..=q/2` only.
//! [`crate::ConvPath::TensorCore`] is built from these pieces.

use tessera::device;

/// The DFT matrices and the twiddles copied into shared memory from [`FftTables`] (`tf1` `[3,
/// N1, N1]`, its first two parts, `tf2` `[3, N2, N2]`, `tw` `[2, N1, N2]` into `tws`): `f1` stages 0 and 1 the real and imaginary parts of `F_N1 / √N1` (`N1 =
/// 64·P`), `f2` stages 0, 1 and 2 those of `F_N2 / √N2` and the imaginary part negated (so that
/// no operand is negated in registers). Warpgroup `me < P` copies `f1`'s and `tws`' rows `64·me..`,
/// warpgroup 3 `f2` (a block of four warpgroups); the caller syncs the block before any MMA
/// reads them.
#[device]
#[allow(clippy::too_many_arguments)]
pub fn dft_tables<const N2: usize, const P: usize>(
    f1: Smem<f16, { 64 * P }, { 64 * P }>, f2: Smem<f16, N2, N2>, tws: Smem<f16, { 64 * P }, N2>, tf1: Global<f16, 3>, tf2: Global<f16, 3>,
    tw: Global<f16, 3>, me: i32,
) {
    if me < P {
        f1.at(0).rows(me * 64, 64).store(tf1.load::<Tile<f16, 64, { 64 * P }>>([0, me * 64, 0]));
        f1.at(1).rows(me * 64, 64).store(tf1.load::<Tile<f16, 64, { 64 * P }>>([1, me * 64, 0]));
        tws.at(0).rows(me * 64, 64).store(tw.load::<Tile<f16, 64, N2>>([0, me * 64, 0]));
        tws.at(1).rows(me * 64, 64).store(tw.load::<Tile<f16, 64, N2>>([1, me * 64, 0]));
    }
    if me == 3 {
        #[unroll]
        for i in 0..3 {
            f2.at(i).store(tf2.load::<Tile<f16, N2, N2>>([i, 0, 0]));
        }
    }
}

/// Rows `r0..r0 + 64` (`k1`) of the spectrum `(re, im)` of the real row held in `sx` stage `s`
/// (f16, `[n1][n2]`, all `N1` rows), scaled by `1/√N`, laid out `[k1][k2]` (index `k1 +
/// N1·k2`), in the accumulators' layout.
#[device]
pub fn fft_forward<const N2: usize, const P: usize>(
    sx: Smem<f16, { 64 * P }, N2>, s: i32, f1: Smem<f16, { 64 * P }, { 64 * P }>, f2: Smem<f16, N2, N2>, tws: Smem<f16, { 64 * P }, N2>,
    r0: i32,
) -> (Tile<f32, 64, N2>, Tile<f32, 64, N2>) {
    let mut br = Tile::<f32, 64, N2>::zeros();
    let mut bi = Tile::<f32, 64, N2>::zeros();
    mma_sync_kn(br, f1.at(0).rows(r0, 64), sx.at(s));
    mma_sync_kn(bi, f1.at(1).rows(r0, 64), sx.at(s));
    // The twiddles `ω_N^(k1·n2)` of these rows.
    let c = tws.at(0).rows(r0, 64).load().cast::<f32>();
    let sn = tws.at(1).rows(r0, 64).load().cast::<f32>();
    mma_wait(0);
    fft_forward_last::<N2>(br, bi, c, sn, f2)
}

/// [`fft_forward`] of a complex row: real part in `sx` stage `s`, imaginary in `s + 1` (f16,
/// `[n1][n2]`); `f1`'s stage 2 holds `F_N1`'s imaginary part negated.
#[device]
pub fn fft_forward_complex<const N2: usize, const P: usize>(
    sx: Smem<f16, { 64 * P }, N2>, s: i32, f1: Smem<f16, { 64 * P }, { 64 * P }>, f2: Smem<f16, N2, N2>, tws: Smem<f16, { 64 * P }, N2>,
    r0: i32,
) -> (Tile<f32, 64, N2>, Tile<f32, 64, N2>) {
    let mut br = Tile::<f32, 64, N2>::zeros();
    let mut bi = Tile::<f32, 64, N2>::zeros();
    mma_sync_kn(br, f1.at(0).rows(r0, 64), sx.at(s));
    mma_sync_kn(br, f1.at(2).rows(r0, 64), sx.at(s + 1));
    mma_sync_kn(bi, f1.at(1).rows(r0, 64), sx.at(s));
    mma_sync_kn(bi, f1.at(0).rows(r0, 64), sx.at(s + 1));
    let c = tws.at(0).rows(r0, 64).load().cast::<f32>();
    let sn = tws.at(1).rows(r0, 64).load().cast::<f32>();
    mma_wait(0);
    fft_forward_last::<N2>(br, bi, c, sn, f2)
}

/// The forward's second step from the first's rows `(br, bi)`: the twiddles `(c, sn)`, then
/// `· F_N2`.
#[device]
fn fft_forward_last<const N2: usize>(
    br: Tile<f32, 64, N2>, bi: Tile<f32, 64, N2>, c: Tile<f32, 64, N2>, sn: Tile<f32, 64, N2>, f2: Smem<f16, N2, N2>,
) -> (Tile<f32, 64, N2>, Tile<f32, 64, N2>) {
    let cr = (br * c - bi * sn).cast::<f16>();
    let ci = (br * sn + bi * c).cast::<f16>();
    let mut dr = Tile::<f32, 64, N2>::zeros();
    let mut di = Tile::<f32, 64, N2>::zeros();
    mma_sync_kn(dr, cr, f2.at(0));
    mma_sync_kn(dr, ci, f2.at(2));
    mma_sync_kn(di, cr, f2.at(1));
    mma_sync_kn(di, ci, f2.at(0));
    mma_wait(0);
    (dr, di)
}

/// Rows `r0..r0 + 64` (`n1`) of the real part of the inverse of the spectrum whose rows
/// `r0..r0 + 64` are `(er, ei)` (laid out as [`fft_forward`] gives them), scaled by `1/√N` (so
/// forward then inverse is the identity), in the accumulators' layout. Stages `s` and `s + 1` of
/// `sc` hold the last step's operand, every warpgroup of the row its rows (before and after the
/// stores, [`row_sync`] with `bar`: stage `s` may be the row's input).
#[device]
#[allow(clippy::too_many_arguments)]
pub fn fft_inverse_real<const N2: usize, const P: usize>(
    er: Tile<f32, 64, N2>, ei: Tile<f32, 64, N2>, sc: Smem<f16, { 64 * P }, N2>, s: i32, f1: Smem<f16, { 64 * P }, { 64 * P }>,
    f2: Smem<f16, N2, N2>, tws: Smem<f16, { 64 * P }, N2>, r0: i32, bar: i32,
) -> Tile<f32, 64, N2> {
    fft_inverse_first::<N2, P>(er, ei, sc, s, f2, tws, r0, bar);
    let mut y = Tile::<f32, 64, N2>::zeros();
    mma_sync_kn(y, f1.at(0).rows(r0, 64), sc.at(s));
    mma_sync_kn(y, f1.at(1).rows(r0, 64), sc.at(s + 1));
    mma_wait(0);
    y
}

/// [`fft_inverse_real`] keeping the imaginary part too: `(real, imaginary)`; `f1`'s stage 2
/// holds `F_N1`'s imaginary part negated.
#[device]
#[allow(clippy::too_many_arguments)]
pub fn fft_inverse_complex<const N2: usize, const P: usize>(
    er: Tile<f32, 64, N2>, ei: Tile<f32, 64, N2>, sc: Smem<f16, { 64 * P }, N2>, s: i32, f1: Smem<f16, { 64 * P }, { 64 * P }>,
    f2: Smem<f16, N2, N2>, tws: Smem<f16, { 64 * P }, N2>, r0: i32, bar: i32,
) -> (Tile<f32, 64, N2>, Tile<f32, 64, N2>) {
    fft_inverse_first::<N2, P>(er, ei, sc, s, f2, tws, r0, bar);
    let mut yr = Tile::<f32, 64, N2>::zeros();
    let mut yi = Tile::<f32, 64, N2>::zeros();
    mma_sync_kn(yr, f1.at(0).rows(r0, 64), sc.at(s));
    mma_sync_kn(yr, f1.at(1).rows(r0, 64), sc.at(s + 1));
    mma_sync_kn(yi, f1.at(0).rows(r0, 64), sc.at(s + 1));
    mma_sync_kn(yi, f1.at(2).rows(r0, 64), sc.at(s));
    mma_wait(0);
    (yr, yi)
}

/// The inverse's first step, `· conj(F_N2)` and the conjugate twiddles, its result stored into
/// `sc` stages `s` (real) and `s + 1` (imaginary) for the last step, the row's warpgroups
/// synced after.
#[device]
#[allow(clippy::too_many_arguments)]
fn fft_inverse_first<const N2: usize, const P: usize>(
    er: Tile<f32, 64, N2>, ei: Tile<f32, 64, N2>, sc: Smem<f16, { 64 * P }, N2>, s: i32, f2: Smem<f16, N2, N2>,
    tws: Smem<f16, { 64 * P }, N2>, r0: i32, bar: i32,
) {
    let ar = er.cast::<f16>();
    let ai = ei.cast::<f16>();
    let mut pr = Tile::<f32, 64, N2>::zeros();
    let mut pi = Tile::<f32, 64, N2>::zeros();
    mma_sync_kn(pr, ar, f2.at(0));
    mma_sync_kn(pr, ai, f2.at(1));
    mma_sync_kn(pi, ai, f2.at(0));
    mma_sync_kn(pi, ar, f2.at(2));
    let c = tws.at(0).rows(r0, 64).load().cast::<f32>();
    let sn = tws.at(1).rows(r0, 64).load().cast::<f32>();
    mma_wait(0);
    let qr = (pr * c + pi * sn).cast::<f16>();
    let qi = (pi * c - pr * sn).cast::<f16>();
    // Stage `s` may be the row's input, which the row's other warpgroups' forward MMAs read.
    row_sync::<P>(bar);
    sc.at(s).rows(r0, 64).store(qr);
    sc.at(s + 1).rows(r0, 64).store(qi);
    row_sync::<P>(bar);
}

/// The first step of a transform of `N = Q·M` steps past one block's reach (`M = 4096`, a row
/// of `64 × 64` in one warpgroup): of the row `x[n]` (`x` `[rows, N/64, 64]`, lines of 64
/// steps; block `j` is `x[m + M·j]`, lines `64·j..`), `u_r[m] = ω_N^(m·r)·Σ_(j < qn) x[m +
/// M·j]·ω_Q^(j·r)`, whose `M`-point transform at `k` is `x̂[Q·k + r]` (the spectrum's residue
/// `r`). Blocks `qn..Q` are taken as zeros. `(real, imaginary)`.
#[device]
pub fn fft_fold<T>(x: Global<T, 3>, row: i32, r: i32, q: i32, qn: i32) -> (Tile<f32, 64, 64>, Tile<f32, 64, 64>) {
    let mut sr = Tile::<f32, 64, 64>::zeros();
    let mut si = Tile::<f32, 64, 64>::zeros();
    for j in 0..qn {
        let xt = x.load::<Tile<T, 64, 64>>([row, j * 64, 0]).cast::<f32>();
        let a = root_angle(j * r, q, -1.0);
        sr = sr + xt * cos_reduced(a);
        si = si + xt * sin_reduced(a);
    }
    let (c, sn) = fold_twiddle(r, q);
    (sr * c - si * sn, sr * sn + si * c)
}

/// `ω_N^(m·r)` (`N = 4096·q`, `0 ≤ r ≤ q/2`) at each `m = 64·row + column` of a `64 × 64` row:
/// `(cos, sin)`. The angles `−2π·m·r/N` lie in (−π, 0], so the sines need no range reduction
/// (five instructions an element less: 16K–64K 8–11% faster, session 44). (Read from a table
/// instead, the loads' layout made the fold's reduction go through 64 KiB of shared memory and
/// spill 1.4 KB: session 44.)
#[device]
pub fn fold_twiddle(r: i32, q: i32) -> (Tile<f32, 64, 64>, Tile<f32, 64, 64>) {
    let m = Tile::<f32, 64, 64>::row_index() * 64.0 + Tile::<f32, 64, 64>::col_index();
    let a = m * (r as f32 * (-f32::consts::TAU / (4096 * q) as f32));
    (cos_reduced(a), sin_reduced(a))
}

/// The angle of `ω_q^k = e^(sign·2πi·k/q)` (`k ≥ 0`, `sign` ±1) in [−π, π], where
/// `sin_reduced`/`cos_reduced` take it: `k` taken modulo `q`, to `k − q` past `q/2`.
#[device]
pub fn root_angle(k: i32, q: i32, sign: f32) -> f32 {
    let mut k = k % q;
    if 2 * k > q {
        k -= q;
    }
    k as f32 * (sign * f32::consts::TAU / q as f32)
}

/// Named barrier `bar` (2 or 3: the block's two rows) among the `P` warpgroups sharing a row;
/// nothing where a warpgroup has its row alone.
#[device]
pub fn row_sync<const P: usize>(bar: i32) {
    if P > 1 {
        if bar == 2 {
            barrier::sync(2, P);
        } else {
            barrier::sync(3, P);
        }
    }
}

/// The largest magnitude of a tile's elements, at least `floor` (a 1×1 tile).
#[device]
pub fn tile_amax<const R: usize, const N: usize>(t: Tile<f32, R, N>, floor: f32) -> Tile<f32, 1, 1> {
    max(col_max(row_max(abs(t))), floor)
}

/// The tables the transforms read for `N = 64·P·N2`, made on the host in f64 and rounded to
/// f16 once a device (kept with it: [`FftTables::get`]): `f1` `[3, N1, N1]` and `f2` `[3, N2,
/// N2]` the unitary DFT matrices (real, imaginary, and the imaginary negated), `tw`
/// `[2, N1, N2]` the twiddles `ω_N^(k1·n2)` (real, imaginary).
pub struct FftTables {
    /// `F_N1 / √N1` and its imaginary part negated, `[3, N1, N1]`.
    pub f1: tessera::Tensor<tessera::f16>,
    /// `F_N2 / √N2` and its imaginary part negated, `[3, N2, N2]`.
    pub f2: tessera::Tensor<tessera::f16>,
    /// The twiddles, `[2, N1, N2]`.
    pub tw: tessera::Tensor<tessera::f16>,
}

impl FftTables {
    /// The device's tables for `N = 64·p·n2`, made on first use.
    ///
    /// # Errors
    /// An upload's.
    pub fn get(device: &tessera::Device, p: usize, n2: usize) -> tessera::Result<std::sync::Arc<FftTables>> {
        const KEY: u64 = 0x0ff7_7ab1_e000_0000;
        device.local(KEY + (p * 1024 + n2) as u64, || {
            let n1 = 64 * p;
            let h = |v: f64| tessera::f16::from_f64(v);
            // `ω_m^(j·k)` scaled by `scale`: (re, im).
            let w = |m: usize, j: usize, k: usize, scale: f64| {
                let a = -std::f64::consts::TAU * ((j * k) % m) as f64 / m as f64;
                (a.cos() * scale, a.sin() * scale)
            };
            // The `rows × cols` matrix `ω_m^(j·k)·scale`: real part, imaginary, and (`parts` 3)
            // the imaginary negated.
            let table = |m: usize, rows: usize, cols: usize, scale: f64, parts: usize| {
                let mut out = vec![tessera::f16::ZERO; parts * rows * cols];
                for j in 0..rows {
                    for k in 0..cols {
                        let (re, im) = w(m, j, k, scale);
                        out[j * cols + k] = h(re);
                        out[rows * cols + j * cols + k] = h(im);
                        if parts == 3 {
                            out[2 * rows * cols + j * cols + k] = h(-im);
                        }
                    }
                }
                out
            };
            let unit = |m: usize| 1.0 / (m as f64).sqrt();
            Ok(FftTables {
                f1: tessera::Tensor::from_host(device, &table(n1, n1, n1, unit(n1), 3), &[3, n1, n1])?,
                f2: tessera::Tensor::from_host(device, &table(n2, n2, n2, unit(n2), 3), &[3, n2, n2])?,
                tw: tessera::Tensor::from_host(device, &table(n1 * n2, n1, n2, 1.0, 2), &[2, n1, n2])?,
            })
        })
    }
}

/// [`tile_amax`] of each warpgroup's own `t` where `P` is 1, else over the whole block (a row
/// spread over `P` warpgroups: the block's rows then share the largest, a scale that keeps each
/// within f16's range; every warpgroup must reach it).
#[device]
pub fn row_amax<const R: usize, const N: usize, const P: usize>(t: Tile<f32, R, N>) -> Tile<f32, 1, 1> {
    let mut m = tile_amax(t, 1e-30);
    if P > 1 {
        let all = block_max(m);
        m = all;
    }
    m
}
