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
//! [`crate::ConvPath::TensorCore`] is built from these pieces.

use tessera::device;

/// The DFT matrices and the twiddles copied into shared memory from [`FftTables`] (`tf1` `[2,
/// N1, N1]`, `tf2` `[3, N2, N2]`, `tw` `[2, N1, N2]` into `tws`): `f1` stages 0 and 1 the real and imaginary parts of `F_N1 / √N1` (`N1 =
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
    let mut y = Tile::<f32, 64, N2>::zeros();
    mma_sync_kn(y, f1.at(0).rows(r0, 64), sc.at(s));
    mma_sync_kn(y, f1.at(1).rows(r0, 64), sc.at(s + 1));
    mma_wait(0);
    y
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
/// f16 once a device (kept with it: [`FftTables::get`]): `f1` `[2, N1, N1]` and `f2` `[3, N2,
/// N2]` the unitary DFT matrices (real, imaginary, and for `f2` the imaginary negated), `tw`
/// `[2, N1, N2]` the twiddles `ω_N^(k1·n2)` (real, imaginary).
pub struct FftTables {
    /// `F_N1 / √N1`, `[2, N1, N1]`.
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
                f1: tessera::Tensor::from_host(device, &table(n1, n1, n1, unit(n1), 2), &[2, n1, n1])?,
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
