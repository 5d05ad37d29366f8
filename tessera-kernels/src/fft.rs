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
//! to at most 1 first; operands are f16, sums f32.

use tessera::device;

/// The DFT matrices in shared memory, f16, unitary: `f1` stages 0 and 1 the real and imaginary
/// parts of `F_N1 / √N1` (`N1 = 64·P`), `f2` stages 0, 1 and 2 those of `F_N2 / √N2` and the
/// imaginary part negated (so that no operand is negated in registers). Warpgroup `me < P`
/// writes `f1`'s rows `64·me..`, warpgroup 3 writes `f2` (a block of four warpgroups); the
/// caller syncs the block before any MMA reads them.
#[device]
pub fn dft_tables<const N2: usize, const P: usize>(f1: Smem<f16, { 64 * P }, { 64 * P }>, f2: Smem<f16, N2, N2>, me: i32) {
    if me < P {
        let (c, s) = dft_block::<64, { 64 * P }>(me * 64);
        let scale = rsqrt(Tile::<f32, 1, 1>::full((64 * P) as f32));
        f1.at(0).rows(me * 64, 64).store((c * scale).cast::<f16>());
        f1.at(1).rows(me * 64, 64).store((s * scale).cast::<f16>());
    }
    if me == 3 {
        let (c, s) = dft_block::<N2, N2>(0);
        let scale = rsqrt(Tile::<f32, 1, 1>::full(N2 as f32));
        f2.at(0).store((c * scale).cast::<f16>());
        f2.at(1).store((s * scale).cast::<f16>());
        f2.at(2).store((s * -scale).cast::<f16>());
    }
}

/// Rows `r0..r0 + R` of the `N`-point DFT matrix: `(cos, sin)` of `−2π·(j·k mod N)/N`.
#[device]
pub fn dft_block<const R: usize, const N: usize>(r0: i32) -> (Tile<f32, R, N>, Tile<f32, R, N>) {
    let m = (Tile::<f32, R, N>::row_index() + r0 as f32) * Tile::<f32, R, N>::col_index();
    let turns = m * (1.0 / N as f32);
    let angle = (turns - floor(turns)) * -f32::consts::TAU;
    (cos(angle), sin(angle))
}

/// The twiddles between the two steps for rows `r0..r0 + 64`: `ω_N^(k1·n2)` for `N =
/// 64·P·N2`, as `(cos, sin)`.
#[device]
pub fn twiddles<const N2: usize, const P: usize>(r0: i32) -> (Tile<f32, 64, N2>, Tile<f32, 64, N2>) {
    let m = (Tile::<f32, 64, N2>::row_index() + r0 as f32) * Tile::<f32, 64, N2>::col_index();
    let angle = m * (-f32::consts::TAU / (64 * P * N2) as f32);
    (cos(angle), sin(angle))
}

/// Rows `r0..r0 + 64` (`k1`) of the spectrum `(re, im)` of the real row held in `sx` stage `s`
/// (f16, `[n1][n2]`, all `N1` rows), scaled by `1/√N`, laid out `[k1][k2]` (index `k1 +
/// N1·k2`), in the accumulators' layout.
#[device]
pub fn fft_forward<const N2: usize, const P: usize>(
    sx: Smem<f16, { 64 * P }, N2>, s: i32, f1: Smem<f16, { 64 * P }, { 64 * P }>, f2: Smem<f16, N2, N2>, r0: i32,
) -> (Tile<f32, 64, N2>, Tile<f32, 64, N2>) {
    let mut br = Tile::<f32, 64, N2>::zeros();
    let mut bi = Tile::<f32, 64, N2>::zeros();
    mma_sync_kn(br, f1.at(0).rows(r0, 64), sx.at(s));
    mma_sync_kn(bi, f1.at(1).rows(r0, 64), sx.at(s));
    mma_wait(0);
    let (c, sn) = twiddles::<N2, P>(r0);
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
/// `sc` hold the last step's operand, every warpgroup of the row its rows (between, [`row_sync`]
/// with `bar`).
#[device]
#[allow(clippy::too_many_arguments)]
pub fn fft_inverse_real<const N2: usize, const P: usize>(
    er: Tile<f32, 64, N2>, ei: Tile<f32, 64, N2>, sc: Smem<f16, { 64 * P }, N2>, s: i32, f1: Smem<f16, { 64 * P }, { 64 * P }>,
    f2: Smem<f16, N2, N2>, r0: i32, bar: i32,
) -> Tile<f32, 64, N2> {
    let ar = er.cast::<f16>();
    let ai = ei.cast::<f16>();
    let mut pr = Tile::<f32, 64, N2>::zeros();
    let mut pi = Tile::<f32, 64, N2>::zeros();
    mma_sync_kn(pr, ar, f2.at(0));
    mma_sync_kn(pr, ai, f2.at(1));
    mma_sync_kn(pi, ai, f2.at(0));
    mma_sync_kn(pi, ar, f2.at(2));
    mma_wait(0);
    let (c, sn) = twiddles::<N2, P>(r0);
    sc.at(s).rows(r0, 64).store((pr * c + pi * sn).cast::<f16>());
    sc.at(s + 1).rows(r0, 64).store((pi * c - pr * sn).cast::<f16>());
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
