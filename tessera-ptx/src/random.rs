//! Philox4x32-10, the counter-based generator behind `Tile::<f32, M, N>::uniform`: the host,
//! the interpreter and the lowered PTX compute the same bits.
//!
//! Element `(i, j)` of a tile at origin `[row, col]` is word `j % 4` of
//! `philox4x32_10([(col >> 2) + (j >> 2), row + i, offset, 0], [seed_lo, seed_hi])`, its top 24
//! bits scaled by 2⁻²⁴ into `[0, 1)`. With `col` a multiple of 4, an element's value depends
//! on its place in the tensor (row `row + i`, column `col + j`) and not on the tile that
//! produced it, so kernels that tile a tensor differently draw the same numbers.

/// Philox's multipliers.
pub const PHILOX_M: [u32; 2] = [0xD251_1F53, 0xCD9E_8D57];
/// Philox's key increments (the golden ratio and √3 − 1, in 32 bits).
pub const PHILOX_W: [u32; 2] = [0x9E37_79B9, 0xBB67_AE85];
/// Philox4x32-10's rounds.
pub const PHILOX_ROUNDS: u32 = 10;

/// One Philox4x32 round.
fn round(c: [u32; 4], k: [u32; 2]) -> [u32; 4] {
    let p0 = u64::from(PHILOX_M[0]) * u64::from(c[0]);
    let p1 = u64::from(PHILOX_M[1]) * u64::from(c[2]);
    [(p1 >> 32) as u32 ^ c[1] ^ k[0], p1 as u32, (p0 >> 32) as u32 ^ c[3] ^ k[1], p0 as u32]
}

/// Philox4x32-10 of `counter` under `key` (Salmon et al., SC'11; Random123's known answers).
pub fn philox4x32_10(counter: [u32; 4], key: [u32; 2]) -> [u32; 4] {
    let (mut c, mut k) = (counter, key);
    for r in 0..PHILOX_ROUNDS {
        if r > 0 {
            k = [k[0].wrapping_add(PHILOX_W[0]), k[1].wrapping_add(PHILOX_W[1])];
        }
        c = round(c, k);
    }
    c
}

/// A Philox word as an f32 in `[0, 1)`: its top 24 bits times 2⁻²⁴ (exact in f32).
pub fn word_to_unit(w: u32) -> f32 {
    (w >> 8) as f32 * (1.0 / 16_777_216.0)
}

/// The value `Tile::<f32, M, N>::uniform(seed_lo, seed_hi, offset, [row, col])` gives the
/// element of tile row `i` and tile column `j` (seeds and offset as the kernel's `i32` bits).
pub fn uniform_at(seed: [u32; 2], offset: u32, row: i32, col: i32, i: u32, j: u32) -> f32 {
    let c0 = ((col as u32) >> 2).wrapping_add(j >> 2);
    let c1 = (row as u32).wrapping_add(i);
    word_to_unit(philox4x32_10([c0, c1, offset, 0], seed)[(j & 3) as usize])
}

/// The uniform number of element `[row, col]` of a tensor drawn with `uniform` at origins
/// whose columns are multiples of 4 (every library kernel's): the host's view of a dropout
/// mask, for references and for reproducing it outside a kernel.
pub fn uniform(seed: u64, offset: u32, row: usize, col: usize) -> f32 {
    let (r, c) = (row as u32, col as u32);
    word_to_unit(philox4x32_10([c >> 2, r, offset, 0], [seed as u32, (seed >> 32) as u32])[(c & 3) as usize])
}

/// A coordinate's place in [`uniform8`]'s 4×4 blocks: the block (the coordinate without its
/// bits 0 and 3) and the index in it (bit 0, then bit 3).
pub fn quad(x: u32) -> (u32, u32) {
    (((x >> 4) << 2) | ((x >> 1) & 3), (x & 1) | ((x >> 2) & 2))
}

/// `Tile::<f32, M, N>::uniform8`'s number at `[row, col]` of stream `stream` (both tile
/// orientations draw it; see `uniform8_t`): byte `ci` of word `ri` of
/// `philox4x32_10([cb, rb, offset, stream], seed)` over 256, where `(rb, ri)` = [`quad`]`(row)`
/// and `(cb, ci)` = `quad(col)` — rows `{r, r+1, r+8, r+9}` by columns `{c, c+1, c+8, c+9}`
/// (`r`, `c` ≡ 0 mod 16 less those bits) share one Philox call, which is what one thread holds
/// of a wgmma accumulator and of its transpose. Multiples of 1/256 in `[0, 1)`: for dropout,
/// where a keep probability of a byte's resolution is enough and a call per 16 numbers
/// matters (attention draws one an element of `Q·Kᵀ`).
pub fn uniform8(seed: u64, offset: u32, stream: u32, row: u32, col: u32) -> f32 {
    let ((rb, ri), (cb, ci)) = (quad(row), quad(col));
    let w = philox4x32_10([cb, rb, offset, stream], [seed as u32, (seed >> 32) as u32])[ri as usize];
    ((w >> (8 * ci)) & 0xff) as f32 * (1.0 / 256.0)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Random123's `tests/kat_vectors`, the three `philox4x32 10` lines.
    #[test]
    fn known_answers() {
        assert_eq!(philox4x32_10([0; 4], [0; 2]), [0x6627_e8d5, 0xe169_c58d, 0xbc57_ac4c, 0x9b00_dbd8]);
        assert_eq!(philox4x32_10([u32::MAX; 4], [u32::MAX; 2]), [0x408f_276d, 0x41c8_3b0e, 0xa20b_c7c6, 0x6d54_51fd]);
        assert_eq!(
            philox4x32_10([0x243f_6a88, 0x85a3_08d3, 0x1319_8a2e, 0x0370_7344], [0xa409_3822, 0x299f_31d0]),
            [0xd16c_fe09, 0x94fd_cceb, 0x5001_e420, 0x2412_6ea1]
        );
    }

    /// The 16 numbers of one Philox call are the 16 elements of one 4×4 block, each once.
    #[test]
    fn uniform8_blocks() {
        let seed = 0x0bad_cafe_1234_5678u64;
        let (r0, c0) = (32 + 2, 48 + 4);
        let words = philox4x32_10([quad(c0).0, quad(r0).0, 7, 3], [seed as u32, (seed >> 32) as u32]);
        let mut bytes: Vec<f32> = words.iter().flat_map(|w| (0..4).map(move |b| ((w >> (8 * b)) & 0xff) as f32 / 256.0)).collect();
        let mut got = Vec::new();
        for dr in [0, 1, 8, 9] {
            for dc in [0, 1, 8, 9] {
                got.push(uniform8(seed, 7, 3, r0 + dr, c0 + dc));
            }
        }
        assert_eq!(got, bytes);
        bytes.sort_by(f32::total_cmp);
        assert!(bytes.windows(2).any(|w| w[0] != w[1]), "a draw of 16 equal bytes");
        assert_ne!(uniform8(seed, 7, 3, 5, 9), uniform8(seed, 7, 4, 5, 9), "streams must differ");
        assert!((0..64).all(|i| (0.0..1.0).contains(&uniform8(seed, 1, 2, i, 3 * i))));
    }

    #[test]
    fn tile_and_tensor_views_agree() {
        let seed = 0x1234_5678_9abc_def0u64;
        let s = [seed as u32, (seed >> 32) as u32];
        for (row, col, i, j) in [(0, 0, 0, 0), (3, 256, 5, 7), (100, 4, 0, 255), (7, 1024, 15, 3)] {
            let t = uniform_at(s, 9, row, col, i, j);
            assert_eq!(t, uniform(seed, 9, (row as u32 + i) as usize, (col as u32 + j) as usize));
            assert!((0.0..1.0).contains(&t));
        }
    }
}
