//! Language features on the GPU, each through a small kernel: casts between f32, bf16 and
//! f16; reductions down the columns; broadcasts; layout conversions; several warpgroups;
//! uniform `if`; tiles smaller than a warpgroup's footprint.

mod common;

use common::{random, wide};
use tessera::testing::{gpu_or_skip, rel_error};
use tessera::{bf16, f16, kernel, Device, Grid, Tensor};

/// `y = 2·x` through bf16 → f32, and `z = bf16(x)·0.5` back to bf16.
#[kernel]
fn bf16_roundtrip(x: Global<bf16, 2>, y: Global<f32, 2>, z: Global<bf16, 2>) {
    let r = block::id_y() * 32;
    let c = block::id_x() * 64;
    let t: Tile<bf16, 32, 64> = x.load([r, c]);
    let w = t.cast::<f32>();
    y.store([r, c], w * 2.0);
    z.store([r, c], (w * 0.5).cast::<bf16>());
}

/// `y = f32(x) + 1` from f16.
#[kernel]
fn f16_to_f32(x: Global<f16, 2>, y: Global<f32, 2>) {
    let r = block::id_y() * 16;
    let c = block::id_x() * 128;
    let t: tile<f16, 16, 128> = x.load([r, c]);
    y.store([r, c], t.cast::<f32>() + 1);
}

/// Column sums of a 64×N slab per block, then `y = x − column mean` (a 1×N broadcast).
#[kernel]
fn col_center(x: Global<f32, 2>, sums: Global<f32, 1>, y: Global<f32, 2>) {
    let c = block::id_x() * 32;
    let t: Tile<f32, 64, 32> = x.load([0, c]);
    let s = col_sum(t);
    sums.store([c], s);
    let mean = s * (1.0 / x.dim(0) as f32);
    y.store([0, c], t - mean);
}

/// Adds a per-row bias loaded as its own `M×1` tile: its layout is not the row-slice of `t`'s,
/// so the broadcast converts it through shared memory.
#[kernel]
fn add_row_bias(x: Global<f32, 2>, b: Global<f32, 1>, y: Global<f32, 2>) {
    let r = block::id_x() * 16;
    let bias: Tile<f32, 16, 1> = b.load([r]);
    for c in (0..x.dim(1)).step_by(64) {
        let t: Tile<f32, 16, 64> = x.load([r, c]);
        y.store([r, c], t + bias);
    }
}

/// Two warpgroups per block, each on its own 16 rows; negates odd blocks with a uniform `if`.
#[kernel(warpgroups = 2)]
fn two_warpgroups(x: Global<f32, 2>, y: Global<f32, 2>) {
    let r = block::id_x() * 32 + warpgroup::id() * 16;
    let t: Tile<f32, 16, 32> = x.load([r, 0]);
    let m = row_max(t);
    if block::id_x() % 2 == 1 {
        y.store([r, 0], -(t - m));
    } else {
        y.store([r, 0], t - m);
    }
}

/// Rows spread over three warpgroups (256 columns each): the row's sum and maximum combined
/// across them with `block_sum` / `block_max`, twice in a row (the exchange reused), in bf16
/// for the second (the parts widened, the result rounded).
#[kernel(warpgroups = 3)]
fn block_rows(x: Global<f32, 2>, y: Global<f32, 2>, z: Global<bf16, 2>) {
    let r = block::id_x() * 4;
    let c = warpgroup::id() * 256;
    let t = x.load::<Tile<f32, 4, 256>>([r, c]);
    let s = block_sum(row_sum(t));
    let m = block_max(row_max(t));
    y.store([r, c], t - m + s);
    let h = t.cast::<bf16>();
    let hs = block_sum(row_sum(h));
    z.store([r, c], h + hs);
}

/// A hand-off through a named barrier: warpgroup 0 writes its rows and arrives; warpgroup 1
/// waits there, then reads them back.
#[kernel(warpgroups = 2)]
fn handoff(x: Global<f32, 2>, y: Global<f32, 2>) {
    let r = block::id_x() * 16;
    if warpgroup::id() == 1 {
        barrier::sync(0, 2);
        let t: Tile<f32, 16, 32> = y.load([r, 0]);
        y.store([r, 32], t * 2.0);
    } else {
        let t: Tile<f32, 16, 32> = x.load([r, 0]);
        y.store([r, 0], t + 1.0);
        barrier::arrive(0, 2);
    }
}

/// Work claimed at run time: warpgroup 0 draws 16-row slabs from a `TileQueue`; the two
/// consumers each scale their 8 rows of every slab handed to them.
#[kernel(warpgroups = 3)]
fn queue_rows(x: Global<f32, 2>, y: Global<f32, 2>, counter: Global<i32, 1>) {
    let queue = TileQueue::<2>::new(counter, 2);
    let slabs = (x.dim(0) + 15) / 16;
    if warpgroup::id() == 0 {
        for s in queue.fetch(slabs) {}
    } else {
        let r = (warpgroup::id() - 1) * 8;
        for s in queue.take() {
            let t: Tile<f32, 8, 64> = x.load([s * 16 + r, 0]);
            y.store([s * 16 + r, 0], t * 2.0);
        }
    }
}

/// Tiles smaller than the footprint (threads hold replicas): 4×4 sums both ways.
/// Philox draws in a blocked layout of 8-column runs (one call per 4 registers), the mask
/// `step(u − p)` of them, and draws in 2-column runs at origins that are not multiples of 4
/// (a call per register).
#[kernel]
fn philox_draws(y: Global<f32, 2>, keep: Global<f32, 2>, narrow: Global<f32, 2>, seed_lo: i32, seed_hi: i32, offset: i32, p: f32) {
    let r = block::id_y() * 16;
    let c = block::id_x() * 64;
    let u = Tile::<f32, 16, 64>::uniform(seed_lo, seed_hi, offset, [r, c]);
    y.store([r, c], u);
    keep.store([r, c], step(u - p));
    let n = Tile::<f32, 16, 2>::uniform(seed_lo, seed_hi, offset, [r, block::id_x() * 2]);
    narrow.store([r, block::id_x() * 2], n);
}

#[kernel]
fn tiny_tiles(x: Global<f32, 2>, rows: Global<f32, 1>, cols: Global<f32, 1>) {
    let t: Tile<f32, 4, 4> = x.load([0, 0]);
    rows.store([0], t.sum(1));
    cols.store([0], t.sum(0));
}

#[kernel]
fn log2_exp2(x: Global<f32, 2>, y: Global<f32, 2>) {
    let t: Tile<f32, 32, 64> = x.load([block::id_y() * 32, block::id_x() * 64]);
    y.store([block::id_y() * 32, block::id_x() * 64], exp2(log2(t) * 0.5));
}

/// `exp2(log2(x) / 2)` is `√x` to a few ulps; `log2(0)` is −∞, so 0 comes back as 0.
fn log2_and_exp2(dev: &Device) {
    let (m, n) = (40, 70);
    let mut x = random(m * n, 1e-3, 1e3);
    x[5] = 0.0;
    let xt = Tensor::from_host(dev, &x, &[m, n]).unwrap();
    let mut y = Tensor::full(dev, &[m, n], f32::NAN).unwrap();
    log2_exp2::launch(dev, (Grid::tiles(n, 64), Grid::tiles(m, 32)), &xt, &mut y).unwrap();
    for (i, (&a, b)) in x.iter().zip(y.to_host().unwrap()).enumerate() {
        let want = f64::from(a).sqrt();
        assert!((f64::from(b) - want).abs() <= 1e-5 * want, "√{a} at {i}: got {b}");
    }
}

#[test]
fn gpu_log2_and_exp2() {
    if let Some(dev) = gpu_or_skip("gpu_log2_and_exp2") {
        log2_and_exp2(&dev);
    }
}

#[test]
fn interp_log2_and_exp2() {
    log2_and_exp2(&Device::cpu());
}

fn bf16_and_f16_casts_round_to_nearest_even(dev: &Device) {
    let (m, n) = (70, 130);
    let x: Vec<bf16> = random(m * n, -3.0, 3.0).into_iter().map(bf16::from_f32).collect();
    let xt = Tensor::from_host(dev, &x, &[m, n]).unwrap();
    let mut y = Tensor::full(dev, &[m, n], f32::NAN).unwrap();
    let mut z = Tensor::full(dev, &[m, n], bf16::NAN).unwrap();
    bf16_roundtrip::launch(dev, (Grid::tiles(n, 64), Grid::tiles(m, 32)), &xt, &mut y, &mut z).unwrap();
    let y = y.to_host().unwrap();
    let z = z.to_host().unwrap();
    for i in 0..m * n {
        assert_eq!(y[i], 2.0 * x[i].to_f32(), "bf16→f32 at {i}");
        assert_eq!(z[i], bf16::from_f32(x[i].to_f32() * 0.5), "f32→bf16 at {i}");
    }
    let h: Vec<f16> = random(m * n, -3.0, 3.0).into_iter().map(f16::from_f32).collect();
    let ht = Tensor::from_host(dev, &h, &[m, n]).unwrap();
    let mut y = Tensor::full(dev, &[m, n], f32::NAN).unwrap();
    f16_to_f32::launch(dev, (Grid::tiles(n, 128), Grid::tiles(m, 16)), &ht, &mut y).unwrap();
    let y = y.to_host().unwrap();
    assert!(h.iter().zip(&y).all(|(a, b)| a.to_f32() + 1.0 == *b));
}

#[test]
fn gpu_bf16_and_f16_casts_round_to_nearest_even() {
    if let Some(dev) = gpu_or_skip("gpu_bf16_and_f16_casts") {
        bf16_and_f16_casts_round_to_nearest_even(&dev);
    }
}

#[test]
fn interp_bf16_and_f16_casts_round_to_nearest_even() {
    bf16_and_f16_casts_round_to_nearest_even(&Device::cpu());
}

fn column_reduction_and_row_broadcast(dev: &Device) {
    let (m, n) = (64, 100);
    let x = random(m * n, -1.0, 1.0);
    let xt = Tensor::from_host(dev, &x, &[m, n]).unwrap();
    let mut sums = Tensor::full(dev, &[n], f32::NAN).unwrap();
    let mut y = Tensor::full(dev, &[m, n], f32::NAN).unwrap();
    col_center::launch(dev, Grid::tiles(n, 32), &xt, &mut sums, &mut y).unwrap();
    let xs = wide(&x);
    let want_sums: Vec<f64> = (0..n).map(|j| (0..m).map(|i| xs[i * n + j]).sum()).collect();
    assert!(rel_error(&wide(&sums.to_host().unwrap()), &want_sums) < 1e-5);
    let want_y: Vec<f64> = (0..m * n).map(|k| xs[k] - want_sums[k % n] / m as f64).collect();
    assert!(rel_error(&wide(&y.to_host().unwrap()), &want_y) < 1e-5);
}

#[test]
fn gpu_column_reduction_and_row_broadcast() {
    if let Some(dev) = gpu_or_skip("gpu_column_reduction_and_row_broadcast") {
        column_reduction_and_row_broadcast(&dev);
    }
}

#[test]
fn interp_column_reduction_and_row_broadcast() {
    column_reduction_and_row_broadcast(&Device::cpu());
}

fn broadcast_converts_layouts(dev: &Device) {
    let (m, n) = (45, 150);
    let (x, b) = (random(m * n, -1.0, 1.0), random(m, -1.0, 1.0));
    let xt = Tensor::from_host(dev, &x, &[m, n]).unwrap();
    let bt = Tensor::from_host(dev, &b, &[m]).unwrap();
    let mut y = Tensor::full(dev, &[m, n], f32::NAN).unwrap();
    add_row_bias::launch(dev, Grid::tiles(m, 16), &xt, &bt, &mut y).unwrap();
    let want: Vec<f64> = (0..m * n).map(|k| f64::from(x[k]) + f64::from(b[k / n])).collect();
    assert!(rel_error(&wide(&y.to_host().unwrap()), &want) < 1e-6);
}

#[test]
fn gpu_broadcast_converts_layouts() {
    if let Some(dev) = gpu_or_skip("gpu_broadcast_converts_layouts") {
        broadcast_converts_layouts(&dev);
    }
}

#[test]
fn interp_broadcast_converts_layouts() {
    broadcast_converts_layouts(&Device::cpu());
}

fn block_reductions_span_warpgroups(dev: &Device) {
    let (m, n) = (37, 700);
    let x = random(m * n, -1.0, 1.0);
    let xt = Tensor::from_host(dev, &x, &[m, n]).unwrap();
    let mut y = Tensor::full(dev, &[m, n], f32::NAN).unwrap();
    let mut z = Tensor::full(dev, &[m, n], bf16::from_f32(f32::NAN)).unwrap();
    block_rows::launch(dev, Grid::tiles(m, 4), &xt, &mut y, &mut z).unwrap();
    let rows: Vec<&[f32]> = x.chunks(n).collect();
    let want: Vec<f64> = (0..m * n)
        .map(|k| {
            let row = rows[k / n];
            let s: f64 = row.iter().map(|&v| f64::from(v)).sum();
            // Columns past the row (700..768) load as 0.
            let mx = row.iter().cloned().fold(0.0, f32::max);
            f64::from(x[k]) - f64::from(mx) + s
        })
        .collect();
    let err = rel_error(&wide(&y.to_host().unwrap()), &want);
    assert!(err < 1e-5, "block_sum / block_max: relative error {err}");
    let want: Vec<f64> = (0..m * n)
        .map(|k| {
            let h = |v: f32| f64::from(bf16::from_f32(v).to_f32());
            h(x[k]) + rows[k / n].iter().map(|&v| h(v)).sum::<f64>()
        })
        .collect();
    let got: Vec<f64> = z.to_host().unwrap().into_iter().map(|v| v.to_f64()).collect();
    let err = rel_error(&got, &want);
    assert!(err < 2e-2, "block_sum in bf16: relative error {err}");
}

#[test]
fn gpu_block_reductions_span_warpgroups() {
    if let Some(dev) = gpu_or_skip("gpu_block_reductions_span_warpgroups") {
        block_reductions_span_warpgroups(&dev);
    }
}

#[test]
fn interp_block_reductions_span_warpgroups() {
    block_reductions_span_warpgroups(&Device::cpu());
}

fn named_barrier_hands_off(dev: &Device) {
    let m = 80;
    let x = random(m * 32, -1.0, 1.0);
    let xt = Tensor::from_host(dev, &x, &[m, 32]).unwrap();
    let mut y = Tensor::full(dev, &[m, 64], f32::NAN).unwrap();
    handoff::launch(dev, Grid::tiles(m, 16), &xt, &mut y).unwrap();
    let y = y.to_host().unwrap();
    for (k, &v) in x.iter().enumerate() {
        let (i, j) = (k / 32, k % 32);
        assert_eq!(y[i * 64 + j], v + 1.0, "written at ({i}, {j})");
        assert_eq!(y[i * 64 + 32 + j], (v + 1.0) * 2.0, "read back at ({i}, {j})");
    }
}

#[test]
fn gpu_named_barrier_hands_off() {
    if let Some(dev) = gpu_or_skip("gpu_named_barrier_hands_off") {
        named_barrier_hands_off(&dev);
    }
}

#[test]
fn interp_named_barrier_hands_off() {
    named_barrier_hands_off(&Device::cpu());
}

fn two_warpgroups_and_uniform_if(dev: &Device) {
    let (m, n) = (100, 32);
    let x = random(m * n, -1.0, 1.0);
    let xt = Tensor::from_host(dev, &x, &[m, n]).unwrap();
    let mut y = Tensor::full(dev, &[m, n], f32::NAN).unwrap();
    two_warpgroups::launch(dev, Grid::tiles(m, 32), &xt, &mut y).unwrap();
    let want: Vec<f64> = (0..m * n)
        .map(|k| {
            let row = &x[(k / n) * n..(k / n + 1) * n];
            let mx = row.iter().cloned().fold(f32::NEG_INFINITY, f32::max);
            let v = f64::from(x[k]) - f64::from(mx);
            if (k / n / 32) % 2 == 1 {
                -v
            } else {
                v
            }
        })
        .collect();
    assert!(rel_error(&wide(&y.to_host().unwrap()), &want) < 1e-6);
}

#[test]
fn gpu_two_warpgroups_and_uniform_if() {
    if let Some(dev) = gpu_or_skip("gpu_two_warpgroups_and_uniform_if") {
        two_warpgroups_and_uniform_if(&dev);
    }
}

#[test]
fn interp_two_warpgroups_and_uniform_if() {
    two_warpgroups_and_uniform_if(&Device::cpu());
}

fn tiles_smaller_than_the_footprint(dev: &Device) {
    let x = random(16, -1.0, 1.0);
    let xt = Tensor::from_host(dev, &x, &[4, 4]).unwrap();
    let mut rows = Tensor::full(dev, &[4], f32::NAN).unwrap();
    let mut cols = Tensor::full(dev, &[4], f32::NAN).unwrap();
    tiny_tiles::launch(dev, 1, &xt, &mut rows, &mut cols).unwrap();
    let xs = wide(&x);
    let want_rows: Vec<f64> = (0..4).map(|i| xs[i * 4..i * 4 + 4].iter().sum()).collect();
    let want_cols: Vec<f64> = (0..4).map(|j| (0..4).map(|i| xs[i * 4 + j]).sum()).collect();
    assert!(rel_error(&wide(&rows.to_host().unwrap()), &want_rows) < 1e-6, "rows");
    assert!(rel_error(&wide(&cols.to_host().unwrap()), &want_cols) < 1e-6, "cols");
}

#[test]
fn gpu_tiles_smaller_than_the_footprint() {
    if let Some(dev) = gpu_or_skip("gpu_tiles_smaller_than_the_footprint") {
        tiles_smaller_than_the_footprint(&dev);
    }
}

#[test]
fn interp_tiles_smaller_than_the_footprint() {
    tiles_smaller_than_the_footprint(&Device::cpu());
}

fn philox_matches_the_host(dev: &Device) {
    use tessera::random::{uniform, uniform_at};
    let (m, n) = (80usize, 1000usize);
    let seed: u64 = rand::random();
    let offset: u32 = rand::random();
    let p = 0.3f32;
    let grid = (Grid::tiles(n, 64), Grid::tiles(m, 16));
    let mut y = Tensor::full(dev, &[m, n], f32::NAN).unwrap();
    let mut keep = Tensor::full(dev, &[m, n], f32::NAN).unwrap();
    let nc = n.div_ceil(64) * 2;
    let mut narrow = Tensor::full(dev, &[m, nc], f32::NAN).unwrap();
    let (lo, hi) = (seed as u32 as i32, (seed >> 32) as u32 as i32);
    philox_draws::launch(dev, grid, &mut y, &mut keep, &mut narrow, lo, hi, offset as i32, p).unwrap();
    let (y, keep, narrow) = (y.to_host().unwrap(), keep.to_host().unwrap(), narrow.to_host().unwrap());
    for (i, (&u, &k)) in y.iter().zip(&keep).enumerate() {
        let want = uniform(seed, offset, i / n, i % n);
        assert_eq!(u.to_bits(), want.to_bits(), "element {i}: seed {seed:#x}, offset {offset}");
        assert_eq!(k, if want >= p { 1.0 } else { 0.0 }, "mask element {i}");
    }
    let s = [seed as u32, (seed >> 32) as u32];
    for (i, &u) in narrow.iter().enumerate() {
        let (r, c) = (i / nc, i % nc);
        let want = uniform_at(s, offset, (r / 16 * 16) as i32, (c / 2 * 2) as i32, (r % 16) as u32, (c % 2) as u32);
        assert_eq!(u.to_bits(), want.to_bits(), "narrow element {i}");
    }
    // Uniform in [0, 1): the mean and the keep rate within 6 standard deviations.
    let count = (m * n) as f64;
    let mean = y.iter().map(|&u| f64::from(u)).sum::<f64>() / count;
    assert!((mean - 0.5).abs() < 6.0 * (1.0 / 12.0 / count).sqrt(), "mean {mean}");
    let rate = keep.iter().map(|&k| f64::from(k)).sum::<f64>() / count;
    assert!((rate - 0.7).abs() < 6.0 * (0.21 / count).sqrt(), "keep rate {rate}");
}

#[test]
fn gpu_philox_matches_the_host() {
    if let Some(dev) = gpu_or_skip("gpu_philox_matches_the_host") {
        philox_matches_the_host(&dev);
    }
}

#[test]
fn interp_philox_matches_the_host() {
    philox_matches_the_host(&Device::cpu());
}

/// Byte draws (`uniform8`, `uniform8_t`) in a wgmma accumulator's layout — the product of a
/// 64×64 bf16 tile with itself, times 0, plus the draws: one Philox call a thread's 8
/// registers — and in a blocked layout (a call a register). Block `x` draws at rows
/// `64x + 16..`; the transposed tile's origin is `[48, 64x + 16]`.
#[kernel(warpgroups = 2, targets(sm_90a))]
fn byte_draws(
    a: Global<bf16, 2>, u: Global<f32, 2>, ut: Global<f32, 2>, ub: Global<f32, 2>, seed_lo: i32, seed_hi: i32, offset: i32, stream: i32,
) {
    let sa = Smem::<bf16, 64, 64>::ring(1);
    let pipe = Pipeline::<1>::new(1);
    let r = block::id_x() * 64;
    if warpgroup::id() == 0 {
        tessera_kernels::prelude::fill_stages(pipe, 1, |s, _k| {
            tma::load(sa.at(s), a, [0, 0], pipe);
        });
    } else {
        let mut acc = Tile::<f32, 64, 64>::zeros();
        tessera_kernels::prelude::drain_stages(pipe, 1, |s, _k| {
            mma_sync(acc, sa.at(s), sa.at(s));
            mma_wait(0);
        });
        u.store([r, 0], acc * 0.0 + Tile::<f32, 64, 64>::uniform8(seed_lo, seed_hi, offset, stream, [r + 16, 32]));
        ut.store([r, 0], acc * 0.0 + Tile::<f32, 64, 64>::uniform8_t(seed_lo, seed_hi, offset, stream, [48, r + 16]));
        ub.store([r / 4, 0], Tile::<f32, 16, 64>::uniform8(seed_lo, seed_hi, offset, stream, [r + 16, 32]));
    }
}

fn byte_draws_match_the_host(dev: &Device) {
    use tessera::random::uniform8;
    let blocks = 3;
    let seed: u64 = rand::random();
    let (offset, stream): (u32, u32) = (rand::random(), rand::random());
    let ha: Vec<bf16> = random(64 * 64, -1.0, 1.0).into_iter().map(bf16::from_f32).collect();
    let a = Tensor::from_host(dev, &ha, &[64, 64]).unwrap();
    let mut u = Tensor::full(dev, &[64 * blocks, 64], f32::NAN).unwrap();
    let mut ut = Tensor::full(dev, &[64 * blocks, 64], f32::NAN).unwrap();
    let mut ub = Tensor::full(dev, &[16 * blocks, 64], f32::NAN).unwrap();
    let (lo, hi) = (seed as u32 as i32, (seed >> 32) as u32 as i32);
    byte_draws::launch(dev, blocks as u32, &a, &mut u, &mut ut, &mut ub, lo, hi, offset as i32, stream as i32).unwrap();
    let (u, ut, ub) = (u.to_host().unwrap(), ut.to_host().unwrap(), ub.to_host().unwrap());
    let mut counts = [0usize; 256];
    for i in 0..64 * blocks {
        let (b, r) = (i / 64, i % 64);
        for c in 0..64 {
            let want = uniform8(seed, offset, stream, (64 * b + 16 + r) as u32, (32 + c) as u32);
            assert_eq!(u[i * 64 + c].to_bits(), want.to_bits(), "uniform8 [{i}, {c}]");
            counts[(want * 256.0) as usize] += 1;
            let want_t = uniform8(seed, offset, stream, (48 + c) as u32, (64 * b + 16 + r) as u32);
            assert_eq!(ut[i * 64 + c].to_bits(), want_t.to_bits(), "uniform8_t [{i}, {c}]");
            if r < 16 {
                assert_eq!(ub[(16 * b + r) * 64 + c].to_bits(), want.to_bits(), "blocked uniform8 [{i}, {c}]");
            }
        }
    }
    // Every byte value about equally often: chi-square over 256 bins (255 degrees of freedom,
    // mean 255, sd ~22.6) below 400.
    let n = (64 * 64 * blocks) as f64;
    let chi2: f64 = counts.iter().map(|&k| (k as f64 - n / 256.0).powi(2) / (n / 256.0)).sum();
    assert!(chi2 < 400.0, "chi-square {chi2} of the byte counts");
}

#[test]
fn gpu_byte_draws_match_the_host() {
    if let Some(dev) = gpu_or_skip("gpu_byte_draws_match_the_host") {
        byte_draws_match_the_host(&dev);
    }
}

#[test]
fn interp_byte_draws_match_the_host() {
    byte_draws_match_the_host(&Device::cpu());
}

fn tile_queue_hands_out_every_slab(dev: &Device) {
    // 7 slabs over 3 blocks, and 1 slab over 4 blocks (three find the queue empty at once).
    for (m, blocks) in [(100usize, 3u32), (9, 4), (300, 19)] {
        let x = random(m * 64, -1.0, 1.0);
        let xt = Tensor::from_host(dev, &x, &[m, 64]).unwrap();
        let want: Vec<f64> = x.iter().map(|&v| 2.0 * f64::from(v)).collect();
        let mut counter = Tensor::<i32>::zeros(dev, &[1]).unwrap();
        // Twice on the same counter: the first launch must leave it at 0.
        for launch in 0..2 {
            let mut y = Tensor::full(dev, &[m, 64], f32::NAN).unwrap();
            queue_rows::launch(dev, blocks, &xt, &mut y, &mut counter).unwrap();
            assert!(rel_error(&wide(&y.to_host().unwrap()), &want) < 1e-7, "m {m}, {blocks} blocks, launch {launch}");
            assert_eq!(counter.to_host().unwrap(), vec![0], "the counter after launch {launch}");
        }
        // The device's own counter.
        let mut y = Tensor::full(dev, &[m, 64], f32::NAN).unwrap();
        queue_rows::launch(dev, blocks, &xt, &mut y, &mut dev.tile_counter().unwrap()).unwrap();
        assert!(rel_error(&wide(&y.to_host().unwrap()), &want) < 1e-7, "m {m}, device counter");
    }
}

#[test]
fn gpu_tile_queue_hands_out_every_slab() {
    if let Some(dev) = gpu_or_skip("gpu_tile_queue_hands_out_every_slab") {
        tile_queue_hands_out_every_slab(&dev);
    }
}

#[test]
fn interp_tile_queue_hands_out_every_slab() {
    tile_queue_hands_out_every_slab(&Device::cpu());
}

/// Rows scaled by their RMS and a column weight, in tiles whose width is not a power of two:
/// `R` rows of `W` columns per block (`W` = 2304 splits the warps along rows, 3072 two ways
/// along columns at `R` = 2, 5120 four ways at `R` = 1; 48 and 176, multiples of 8 only, take
/// 2 lanes along the columns and 16 along the rows).
#[kernel(tune(R = [1, 2, 4], W = [2304, 3072, 5120, 48, 176]))]
fn odd_width_rows(x: Global<f32, 2>, w: Global<bf16, 1>, y: Global<f32, 2>) {
    let r = block::id_x() * R;
    let t: Tile<f32, R, W> = x.load([r, 0]);
    let ms = row_sum(t * t) * (1.0 / x.dim(1) as f32);
    let wt = w.load::<Tile<bf16, 1, W>>([0]).cast::<f32>();
    y.store([r, 0], t * rsqrt(ms) * wt + row_max(t));
}

/// Every variant of `odd_width_rows`, on rows narrower than its tile (the tail masked) and
/// exactly its width, against a float64 reference.
fn tiles_of_odd_widths(dev: &Device) {
    // 4×5120 is over a warpgroup's 16384 elements: dropped.
    assert_eq!(odd_width_rows::VARIANTS.len(), 14);
    for (i, spec) in odd_width_rows::VARIANTS.iter().enumerate() {
        let (rows, width) = (spec.knob("R").unwrap() as usize, spec.knob("W").unwrap() as usize);
        for n in [width, width - width.min(200) / 3 - 1] {
            let m = 4 * rows + 1;
            let x = random(m * n, -2.0, 2.0);
            let wv: Vec<bf16> = random(n, 0.5, 1.5).into_iter().map(bf16::from_f32).collect();
            let xt = Tensor::from_host(dev, &x, &[m, n]).unwrap();
            let wt = Tensor::from_host(dev, &wv, &[n]).unwrap();
            let mut y = Tensor::full(dev, &[m, n], f32::NAN).unwrap();
            odd_width_rows::launch_variant(i, dev, Grid::tiles(m, rows), &xt, &wt, &mut y).unwrap();
            let xs = wide(&x);
            let mut want = vec![0.0; m * n];
            for (row, out) in xs.chunks(n).zip(want.chunks_mut(n)) {
                let rms = (row.iter().map(|v| v * v).sum::<f64>() / n as f64).sqrt();
                let max = row.iter().copied().fold(f64::MIN, f64::max);
                for ((o, &v), &g) in out.iter_mut().zip(row).zip(&wv) {
                    *o = v / rms * f64::from(g.to_f32()) + max;
                }
            }
            let err = rel_error(&wide(&y.to_host().unwrap()), &want);
            assert!(err < 1e-5, "{} at {m}×{n}: error {err}", spec.name);
        }
    }
}

#[test]
fn gpu_tiles_of_odd_widths() {
    if let Some(dev) = gpu_or_skip("gpu_tiles_of_odd_widths") {
        tiles_of_odd_widths(&dev);
    }
}

#[test]
fn interp_tiles_of_odd_widths() {
    tiles_of_odd_widths(&Device::cpu());
}

use tessera_kernels::prelude::online_softmax;

/// A user's device function, calling the library's (`tessera_kernels::prelude`) by its path:
/// RMSNorm of a row block, times a weight row.
#[tessera::device]
fn rms_weighted<const R: usize, const W: usize>(t: Tile<f32, R, W>, w: Global<f32, 1>, n: i32, eps: f32) -> Tile<f32, R, W> {
    let mut o = tessera_kernels::prelude::rms_scale(t, n, eps);
    tessera_kernels::prelude::scale_columns(&mut o, w, 0, 1);
    o
}

/// Row softmax of 16-row blocks in 64-column steps through the library's `online_softmax`
/// (a tuple result, `&mut` running sum), then a user device function on the same rows.
#[kernel]
fn softmax_through_calls(x: Global<f32, 2>, w: Global<f32, 1>, y: Global<f32, 2>, z: Global<f32, 2>) {
    let r = block::id_x() * 16;
    let mut m = Tile::<f32, 16, 1>::full(-1.0e30);
    let mut l = Tile::<f32, 16, 1>::zeros();
    for c in (0..x.dim(1)).step_by(64) {
        let s: Tile<f32, 16, 64> = x.load_or([r, c], f32::NEG_INFINITY);
        let (_p, m_new) = online_softmax(s, m, &mut l);
        m = m_new;
    }
    for c in (0..x.dim(1)).step_by(64) {
        let s: Tile<f32, 16, 64> = x.load_or([r, c], f32::NEG_INFINITY);
        y.store([r, c], exp2(s - m) / l);
    }
    let t: Tile<f32, 16, 256> = x.load([r, 0]);
    z.store([r, 0], rms_weighted(t, w, x.dim(1), 1.0e-5));
}

fn device_functions(dev: &Device) {
    for (m, n) in [(37, 200), (5, 7), (16, 256), (70, 129)] {
        let x = random(m * n, -4.0, 4.0);
        let w = random(256, 0.5, 1.5);
        let xd = Tensor::from_host(dev, &x, &[m, n]).expect("x");
        let wd = Tensor::from_host(dev, &w, &[256]).expect("w");
        let mut y = Tensor::from_host(dev, &vec![f32::NAN; m * n], &[m, n]).expect("y");
        let mut z = Tensor::from_host(dev, &vec![f32::NAN; m * n], &[m, n]).expect("z");
        softmax_through_calls::launch(dev, m.div_ceil(16) as u32, &xd, &wd, &mut y, &mut z).expect("launch");
        let (mut want_y, mut want_z) = (vec![0.0f64; m * n], vec![0.0f64; m * n]);
        for i in 0..m {
            let row = &wide(&x[i * n..(i + 1) * n]);
            let mx = row.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
            let sum: f64 = row.iter().map(|v| (v - mx).exp2()).sum();
            let ms = row.iter().map(|v| v * v).sum::<f64>() / n as f64;
            for j in 0..n {
                want_y[i * n + j] = (row[j] - mx).exp2() / sum;
                want_z[i * n + j] = if j < 256 { row[j] / (ms + 1e-5).sqrt() * f64::from(w[j]) } else { f64::NAN };
            }
        }
        let got_y = wide(&y.to_host().expect("y"));
        assert!(rel_error(&got_y, &want_y) < 1e-5, "softmax {m}×{n}: {}", rel_error(&got_y, &want_y));
        // Columns from 256 on are not stored: they keep the poison.
        let got_z = wide(&z.to_host().expect("z"));
        let keep: Vec<usize> = (0..m * n).filter(|k| k % n < 256).collect();
        let pick = |v: &[f64]| keep.iter().map(|&k| v[k]).collect::<Vec<f64>>();
        if n <= 256 {
            assert!(rel_error(&pick(&got_z), &pick(&want_z)) < 1e-5, "rms {m}×{n}: {}", rel_error(&pick(&got_z), &pick(&want_z)));
        }
        assert!(got_z.iter().enumerate().all(|(k, v)| k % n < 256 || v.is_nan()), "stored past the tile");
    }
}

#[test]
fn gpu_device_functions() {
    if let Some(dev) = gpu_or_skip("gpu_device_functions") {
        device_functions(&dev);
    }
}

#[test]
fn interp_device_functions() {
    device_functions(&Device::cpu());
}

use tessera_kernels::prelude::{cumsum_chunk, linear_recurrence_chunk, scan_max};

/// Scans along rows in 64-column chunks, carrying the running value across the loop: a
/// cumulative sum, the linear recurrence `h = a·h + b`, and (within each chunk) an inclusive
/// running max and an exclusive one; then a scan down the columns of a 32×16 tile.
#[kernel]
fn scans(
    x: Global<f32, 2>, a: Global<f32, 2>, sum: Global<f32, 2>, rec: Global<f32, 2>, cmax: Global<f32, 2>, xmax: Global<f32, 2>,
    down: Global<f32, 2>,
) {
    let r = block::id_x() * 16;
    let mut carry = Tile::<f32, 16, 1>::zeros();
    let mut h = Tile::<f32, 16, 1>::zeros();
    for c in (0..x.dim(1)).step_by(64) {
        let t: Tile<f32, 16, 64> = x.load([r, c]);
        let at: Tile<f32, 16, 64> = a.load_or([r, c], 1.0);
        sum.store([r, c], cumsum_chunk(t, &mut carry));
        rec.store([r, c], linear_recurrence_chunk(at, t, &mut h));
        cmax.store([r, c], tile_scan::<scan_max>(t, 1, f32::NEG_INFINITY));
        xmax.store([r, c], tile_scan_exclusive::<scan_max>(t, 1, f32::NEG_INFINITY));
    }
    let d: Tile<f32, 32, 16> = x.load([block::id_x() * 32, 0]);
    down.store([block::id_x() * 32, 0], tile_scan::<tessera_kernels::prelude::scan_add>(d, 0, 0.0));
}

fn scans_match_sequential(dev: &Device) {
    for (m, n) in [(37, 200), (16, 64), (5, 7), (70, 129)] {
        let x = random(m * n, -2.0, 2.0);
        let a = random(m * n, 0.5, 1.0);
        let xd = Tensor::from_host(dev, &x, &[m, n]).expect("x");
        let ad = Tensor::from_host(dev, &a, &[m, n]).expect("a");
        let poison = || Tensor::from_host(dev, &vec![f32::NAN; m * n], &[m, n]).expect("out");
        let (mut sum, mut rec, mut cmax, mut xmax, mut down) = (poison(), poison(), poison(), poison(), poison());
        scans::launch(dev, m.div_ceil(16) as u32, &xd, &ad, &mut sum, &mut rec, &mut cmax, &mut xmax, &mut down).expect("launch");
        let (mut w_sum, mut w_rec, mut w_cmax, mut w_xmax) = (vec![0.0; m * n], vec![0.0; m * n], vec![0.0; m * n], vec![0.0; m * n]);
        for i in 0..m {
            let (mut s, mut h) = (0.0f64, 0.0f64);
            for j in 0..n {
                let k = i * n + j;
                s += f64::from(x[k]);
                h = f64::from(a[k]) * h + f64::from(x[k]);
                w_sum[k] = s;
                w_rec[k] = h;
                let chunk = j - j % 64;
                w_cmax[k] = (chunk..=j).map(|q| f64::from(x[i * n + q])).fold(f64::NEG_INFINITY, f64::max);
                w_xmax[k] = (chunk..j).map(|q| f64::from(x[i * n + q])).fold(f64::NEG_INFINITY, f64::max);
            }
        }
        let got = |t: &Tensor<f32>| wide(&t.to_host().expect("out"));
        assert!(rel_error(&got(&sum), &w_sum) < 1e-5, "cumsum {m}×{n}: {}", rel_error(&got(&sum), &w_sum));
        assert!(rel_error(&got(&rec), &w_rec) < 1e-5, "recurrence {m}×{n}: {}", rel_error(&got(&rec), &w_rec));
        assert_eq!(got(&cmax), w_cmax, "running max {m}×{n}");
        assert_eq!(got(&xmax), w_xmax, "exclusive running max {m}×{n}");
        // Down the columns: the first 32 rows' first 16 columns of each block of 32 rows.
        let d = got(&down);
        for i in 0..m {
            for j in 0..n.min(16) {
                let top = i - i % 32;
                let want: f64 = (top..=i).map(|q| f64::from(x[q * n + j])).sum();
                let k = i * n + j;
                assert!((d[k] - want).abs() <= 1e-5 * (1.0 + want.abs()), "down {m}×{n} at ({i}, {j}): {} vs {want}", d[k]);
            }
        }
    }
}

#[test]
fn gpu_scans_match_sequential() {
    if let Some(dev) = gpu_or_skip("gpu_scans_match_sequential") {
        scans_match_sequential(&dev);
    }
}

#[test]
fn interp_scans_match_sequential() {
    scans_match_sequential(&Device::cpu());
}

/// Reverse scans within 64-column chunks (each element combines the elements from it to the
/// chunk's end): a sum, the recurrence `r = a·r_next + b` run backward, an exclusive running
/// max; the sum again on the chunk's first 4 rows (a 4×64 tile spreads a row over the warps:
/// the shift-and-combine steps), and down the columns of a 32×16 tile.
#[kernel]
fn reverse_scans(
    x: Global<f32, 2>, a: Global<f32, 2>, sum: Global<f32, 2>, rec: Global<f32, 2>, xmax: Global<f32, 2>, sum4: Global<f32, 2>,
    down: Global<f32, 2>,
) {
    let r = block::id_x() * 16;
    for c in (0..x.dim(1)).step_by(64) {
        let t: Tile<f32, 16, 64> = x.load([r, c]);
        let at: Tile<f32, 16, 64> = a.load_or([r, c], 1.0);
        let tm: Tile<f32, 16, 64> = x.load_or([r, c], f32::NEG_INFINITY);
        sum.store([r, c], tile_scan_reverse::<tessera_kernels::prelude::scan_add>(t, 1, 0.0));
        let (_, h) = tile_scan_reverse::<tessera_kernels::prelude::scan_linear>((at, t), 1, (1.0, 0.0));
        rec.store([r, c], h);
        xmax.store([r, c], tile_scan_reverse_exclusive::<scan_max>(tm, 1, f32::NEG_INFINITY));
        let t4: Tile<f32, 4, 64> = x.load([r, c]);
        sum4.store([r, c], tile_scan_reverse::<tessera_kernels::prelude::scan_add>(t4, 1, 0.0));
    }
    let d: Tile<f32, 32, 16> = x.load([block::id_x() * 32, 0]);
    down.store([block::id_x() * 32, 0], tile_scan_reverse::<tessera_kernels::prelude::scan_add>(d, 0, 0.0));
}

fn reverse_scans_match_sequential(dev: &Device) {
    for (m, n) in [(37, 200), (16, 64), (5, 7), (70, 129)] {
        let x = random(m * n, -2.0, 2.0);
        let a = random(m * n, 0.5, 1.0);
        let xd = Tensor::from_host(dev, &x, &[m, n]).expect("x");
        let ad = Tensor::from_host(dev, &a, &[m, n]).expect("a");
        let poison = || Tensor::from_host(dev, &vec![f32::NAN; m * n], &[m, n]).expect("out");
        let (mut sum, mut rec, mut xmax, mut sum4, mut down) = (poison(), poison(), poison(), poison(), poison());
        reverse_scans::launch(dev, m.div_ceil(16) as u32, &xd, &ad, &mut sum, &mut rec, &mut xmax, &mut sum4, &mut down).expect("launch");
        let (mut w_sum, mut w_rec, mut w_xmax) = (vec![0.0; m * n], vec![0.0; m * n], vec![0.0; m * n]);
        for i in 0..m {
            for j in 0..n {
                let (k, end) = (i * n + j, (j - j % 64 + 64).min(n));
                w_sum[k] = (j..end).map(|q| f64::from(x[i * n + q])).sum();
                w_rec[k] = (j..end).rev().fold(0.0, |h, q| f64::from(a[i * n + q]) * h + f64::from(x[i * n + q]));
                w_xmax[k] = (j + 1..end).map(|q| f64::from(x[i * n + q])).fold(f64::NEG_INFINITY, f64::max);
            }
        }
        let got = |t: &Tensor<f32>| wide(&t.to_host().expect("out"));
        assert!(rel_error(&got(&sum), &w_sum) < 1e-5, "reverse sum {m}×{n}: {}", rel_error(&got(&sum), &w_sum));
        assert!(rel_error(&got(&rec), &w_rec) < 1e-5, "reverse recurrence {m}×{n}: {}", rel_error(&got(&rec), &w_rec));
        assert_eq!(got(&xmax), w_xmax, "reverse exclusive running max {m}×{n}");
        // The 4-row tiles: the first 4 rows of each block of 16.
        let s4 = got(&sum4);
        let d = got(&down);
        for i in 0..m {
            for j in 0..n {
                let k = i * n + j;
                if i % 16 < 4 {
                    assert!((s4[k] - w_sum[k]).abs() <= 1e-5 * (1.0 + w_sum[k].abs()), "4-row reverse sum {m}×{n} at ({i}, {j})");
                }
                if j < 16 {
                    let bottom = (i - i % 32 + 32).min(m);
                    let want: f64 = (i..bottom).map(|q| f64::from(x[q * n + j])).sum();
                    assert!((d[k] - want).abs() <= 1e-5 * (1.0 + want.abs()), "reverse down {m}×{n} at ({i}, {j}): {} vs {want}", d[k]);
                }
            }
        }
    }
}

#[test]
fn gpu_reverse_scans_match_sequential() {
    if let Some(dev) = gpu_or_skip("gpu_reverse_scans_match_sequential") {
        reverse_scans_match_sequential(&dev);
    }
}

#[test]
fn interp_reverse_scans_match_sequential() {
    reverse_scans_match_sequential(&Device::cpu());
}

/// Scans of rows wider than one run a lane (a thread holds a run in each 256-column segment of
/// the row, which the scan joins one after another): in `R×C` chunks, a forward sum, a forward
/// exclusive max, the reverse linear recurrence `h = a·h_next + x` (a tuple) and a reverse
/// exclusive sum, each chunk alone.
#[tessera::device]
fn segment_scan_chunks<const R: usize, const C: usize>(
    x: Global<f32, 2>, a: Global<f32, 2>, sum: Global<f32, 2>, xmax: Global<f32, 2>, rec: Global<f32, 2>, rsum: Global<f32, 2>,
) {
    let r = block::id_x() * R;
    for c in (0..x.dim(1)).step_by(C) {
        let t: Tile<f32, R, C> = x.load_or([r, c], 0.0);
        let at: Tile<f32, R, C> = a.load_or([r, c], 1.0);
        let tm: Tile<f32, R, C> = x.load_or([r, c], f32::NEG_INFINITY);
        sum.store([r, c], tile_scan::<tessera_kernels::prelude::scan_add>(t, 1, 0.0));
        xmax.store([r, c], tile_scan_exclusive::<scan_max>(tm, 1, f32::NEG_INFINITY));
        let (_, h) = tile_scan_reverse::<tessera_kernels::prelude::scan_linear>((at, t), 1, (1.0, 0.0));
        rec.store([r, c], h);
        rsum.store([r, c], tile_scan_reverse_exclusive::<tessera_kernels::prelude::scan_add>(t, 1, 0.0));
    }
}

/// Four 256-column segments a row.
#[kernel]
fn segment_scans_4x1024(
    x: Global<f32, 2>, a: Global<f32, 2>, sum: Global<f32, 2>, xmax: Global<f32, 2>, rec: Global<f32, 2>, rsum: Global<f32, 2>,
) {
    segment_scan_chunks::<4, 1024>(x, a, sum, xmax, rec, rsum);
}

/// Two segments a row, two rows a thread.
#[kernel]
fn segment_scans_8x512(
    x: Global<f32, 2>, a: Global<f32, 2>, sum: Global<f32, 2>, xmax: Global<f32, 2>, rec: Global<f32, 2>, rsum: Global<f32, 2>,
) {
    segment_scan_chunks::<8, 512>(x, a, sum, xmax, rec, rsum);
}

fn segment_scans_match_sequential(dev: &Device) {
    for (rows, chunk) in [(4, 1024), (8, 512)] {
        for (m, n) in [(5, 1030), (9, 700), (rows, chunk), (3, 7)] {
            let x = random(m * n, -2.0, 2.0);
            let a = random(m * n, 0.5, 1.0);
            let xd = Tensor::from_host(dev, &x, &[m, n]).expect("x");
            let ad = Tensor::from_host(dev, &a, &[m, n]).expect("a");
            let poison = || Tensor::from_host(dev, &vec![f32::NAN; m * n], &[m, n]).expect("out");
            let (mut sum, mut xmax, mut rec, mut rsum) = (poison(), poison(), poison(), poison());
            let grid = m.div_ceil(rows) as u32;
            let launched = if rows == 4 {
                segment_scans_4x1024::launch(dev, grid, &xd, &ad, &mut sum, &mut xmax, &mut rec, &mut rsum)
            } else {
                segment_scans_8x512::launch(dev, grid, &xd, &ad, &mut sum, &mut xmax, &mut rec, &mut rsum)
            };
            launched.expect("launch");
            let (mut w_sum, mut w_xmax, mut w_rec, mut w_rsum) = (vec![0.0; m * n], vec![0.0; m * n], vec![0.0; m * n], vec![0.0; m * n]);
            let at = |i: usize, q: usize| f64::from(x[i * n + q]);
            for i in 0..m {
                for j in 0..n {
                    let (k, start) = (i * n + j, j - j % chunk);
                    let end = (start + chunk).min(n);
                    w_sum[k] = (start..=j).map(|q| at(i, q)).sum();
                    w_xmax[k] = (start..j).map(|q| at(i, q)).fold(f64::NEG_INFINITY, f64::max);
                    w_rec[k] = (j..end).rev().fold(0.0, |h, q| f64::from(a[i * n + q]) * h + at(i, q));
                    w_rsum[k] = (j + 1..end).map(|q| at(i, q)).sum();
                }
            }
            let got = |t: &Tensor<f32>| wide(&t.to_host().expect("out"));
            let what = format!("{rows}×{chunk} chunks, {m}×{n}");
            assert!(rel_error(&got(&sum), &w_sum) < 1e-5, "sum, {what}: {}", rel_error(&got(&sum), &w_sum));
            assert_eq!(got(&xmax), w_xmax, "exclusive max, {what}");
            assert!(rel_error(&got(&rec), &w_rec) < 1e-5, "reverse recurrence, {what}: {}", rel_error(&got(&rec), &w_rec));
            assert!(rel_error(&got(&rsum), &w_rsum) < 1e-5, "reverse exclusive sum, {what}: {}", rel_error(&got(&rsum), &w_rsum));
        }
    }
}

#[test]
fn gpu_segment_scans_match_sequential() {
    if let Some(dev) = gpu_or_skip("gpu_segment_scans_match_sequential") {
        segment_scans_match_sequential(&dev);
    }
}

#[test]
fn interp_segment_scans_match_sequential() {
    segment_scans_match_sequential(&Device::cpu());
}

/// Every block adds its 16×64 tile of `x` into the one tile of `sum` and its rows' sums into
/// `rows` (a reduced tile: each sum added once, by its owner) with `atomic_add`.
#[kernel]
fn atomic_sums(x: Global<f32, 2>, sum: Global<f32, 2>, rows: Global<f32, 2>) {
    let r = block::id_x() * 16;
    let t: Tile<f32, 16, 64> = x.load([r, 0]);
    sum.atomic_add([0, 0], t);
    rows.atomic_add([0, 0], row_sum(t));
}

fn atomic_adds_sum_over_blocks(dev: &Device) {
    for (m, n) in [(16, 64), (37, 50), (300, 64)] {
        let x = random(m * n, -1.0, 1.0);
        let xd = Tensor::from_host(dev, &x, &[m, n]).expect("x");
        // Added into: start from values already there.
        let (s0, r0) = (random(16 * n, -1.0, 1.0), random(16, -1.0, 1.0));
        let mut sum = Tensor::from_host(dev, &s0, &[16, n]).expect("sum");
        let mut rows = Tensor::from_host(dev, &r0, &[16, 1]).expect("rows");
        atomic_sums::launch(dev, m.div_ceil(16) as u32, &xd, &mut sum, &mut rows).expect("launch");
        let mut want_s: Vec<f64> = s0.iter().map(|&v| f64::from(v)).collect();
        let mut want_r: Vec<f64> = r0.iter().map(|&v| f64::from(v)).collect();
        for i in 0..m {
            for j in 0..n {
                want_s[(i % 16) * n + j] += f64::from(x[i * n + j]);
                want_r[i % 16] += f64::from(x[i * n + j]);
            }
        }
        let (got_s, got_r) = (wide(&sum.to_host().expect("sum")), wide(&rows.to_host().expect("rows")));
        assert!(rel_error(&got_s, &want_s) < 1e-5, "tile sums {m}×{n}: {}", rel_error(&got_s, &want_s));
        assert!(rel_error(&got_r, &want_r) < 1e-5, "row sums {m}×{n}: {}", rel_error(&got_r, &want_r));
    }
}

#[test]
fn gpu_atomic_adds_sum_over_blocks() {
    if let Some(dev) = gpu_or_skip("gpu_atomic_adds_sum_over_blocks") {
        atomic_adds_sum_over_blocks(&dev);
    }
}

#[test]
fn interp_atomic_adds_sum_over_blocks() {
    atomic_adds_sum_over_blocks(&Device::cpu());
}

/// Every block keeps the larger of its 16×64 tile of `x` and the one tile of `peak` there, and
/// of its rows' maxima and `rows` (`atomic_max`; rows past `x` filled far below any value).
#[kernel]
fn atomic_maxima(x: Global<f32, 2>, peak: Global<f32, 2>, rows: Global<f32, 2>) {
    let r = block::id_x() * 16;
    let t: Tile<f32, 16, 64> = x.load_or([r, 0], -3.0e38);
    peak.atomic_max([0, 0], t);
    rows.atomic_max([0, 0], row_max(t));
}

fn atomic_maxima_over_blocks(dev: &Device) {
    // Values and starting maxima of both signs (the two bit orders), all-negative inputs,
    // and ±0 (+0 is the larger).
    for (m, n, lo, hi) in [(16, 64, -1.0, 1.0), (300, 50, -3.0, -1.0), (37, 64, -1.0, 1.0)] {
        let mut x = random(m * n, lo, hi);
        x[0] = -0.0;
        let xd = Tensor::from_host(dev, &x, &[m, n]).expect("x");
        let (p0, r0) = (random(16 * n, -2.0, 0.5), random(16, -2.0, 0.5));
        let mut peak = Tensor::from_host(dev, &p0, &[16, n]).expect("peak");
        let mut rows = Tensor::from_host(dev, &r0, &[16, 1]).expect("rows");
        atomic_maxima::launch(dev, m.div_ceil(16) as u32, &xd, &mut peak, &mut rows).expect("launch");
        let (mut want_p, mut want_r) = (p0, r0);
        for i in 0..m {
            for j in 0..n {
                want_p[(i % 16) * n + j] = want_p[(i % 16) * n + j].max(x[i * n + j]);
                want_r[i % 16] = want_r[i % 16].max(x[i * n + j]);
            }
        }
        assert_eq!(peak.to_host().expect("peak"), want_p, "tile maxima {m}×{n} in [{lo}, {hi})");
        assert_eq!(rows.to_host().expect("rows"), want_r, "row maxima {m}×{n} in [{lo}, {hi})");
    }
}

#[test]
fn gpu_atomic_maxima_over_blocks() {
    if let Some(dev) = gpu_or_skip("gpu_atomic_maxima_over_blocks") {
        atomic_maxima_over_blocks(&dev);
    }
}

#[test]
fn interp_atomic_maxima_over_blocks() {
    atomic_maxima_over_blocks(&Device::cpu());
}

/// Column maxima and sums of each block's 64 rows of `x` kept by atomics: `maxima[0, j]` ←
/// max over blocks of `col_max`, `sums[0, j]` += `col_sum` — the rows span the warpgroup's four
/// warps, so each warp's partial goes to the atomic without an exchange across warps.
#[kernel]
fn column_atomics(x: Global<f32, 2>, maxima: Global<f32, 2>, sums: Global<f32, 2>) {
    let r = block::id_x() * 64;
    maxima.atomic_max([0, 0], col_max(x.load_or::<Tile<f32, 64, 48>>([r, 0], -3.0e38)));
    sums.atomic_add([0, 0], col_sum(x.load_or::<Tile<f32, 64, 48>>([r, 0], 0.0)));
}

fn column_atomics_over_blocks(dev: &Device) {
    for (m, n, lo, hi) in [(64, 48, -1.0, 1.0), (300, 40, -3.0, -1.0), (130, 48, 0.5, 2.0)] {
        let x = random(m * n, lo, hi);
        let xd = Tensor::from_host(dev, &x, &[m, n]).expect("x");
        let (p0, s0) = (random(n, -2.0, 0.5), random(n, -1.0, 1.0));
        let mut maxima = Tensor::from_host(dev, &p0, &[1, n]).expect("maxima");
        let mut sums = Tensor::from_host(dev, &s0, &[1, n]).expect("sums");
        column_atomics::launch(dev, m.div_ceil(64) as u32, &xd, &mut maxima, &mut sums).expect("launch");
        let mut want_max = p0;
        let mut want_sum: Vec<f64> = s0.iter().map(|&v| f64::from(v)).collect();
        for i in 0..m {
            for j in 0..n {
                want_max[j] = want_max[j].max(x[i * n + j]);
                want_sum[j] += f64::from(x[i * n + j]);
            }
        }
        assert_eq!(maxima.to_host().expect("maxima"), want_max, "column maxima {m}×{n} in [{lo}, {hi})");
        let got = wide(&sums.to_host().expect("sums"));
        assert!(rel_error(&got, &want_sum) < 1e-5, "column sums {m}×{n}: {}", rel_error(&got, &want_sum));
    }
}

#[test]
fn gpu_column_atomics_over_blocks() {
    if let Some(dev) = gpu_or_skip("gpu_column_atomics_over_blocks") {
        column_atomics_over_blocks(&dev);
    }
}

#[test]
fn interp_column_atomics_over_blocks() {
    column_atomics_over_blocks(&Device::cpu());
}

/// As `column_atomics` in the shapes whose warps reduce by a reduce-scatter (each lane ends
/// with some of the columns' totals and adds those itself): 128 rows of 8 columns (a row a
/// thread, 32 lanes down the rows) along `x`'s width, then 64×64 tiles (8 columns a thread,
/// 4 lanes down the rows), so every column's sum is added twice.
#[kernel]
fn column_atomics_scattered(x: Global<f32, 2>, maxima: Global<f32, 2>, sums: Global<f32, 2>) {
    let r = block::id_x() * 128;
    for c in (0..x.dim(1)).step_by(8) {
        maxima.atomic_max([0, c], col_max(x.load_or::<Tile<f32, 128, 8>>([r, c], -3.0e38)));
        sums.atomic_add([0, c], col_sum(x.load_or::<Tile<f32, 128, 8>>([r, c], 0.0)));
    }
    for q in 0..2 {
        maxima.atomic_max([0, 0], col_max(x.load_or::<Tile<f32, 64, 64>>([r + q * 64, 0], -3.0e38)));
        sums.atomic_add([0, 0], col_sum(x.load_or::<Tile<f32, 64, 64>>([r + q * 64, 0], 0.0)));
    }
}

fn column_atomics_scattered_over_blocks(dev: &Device) {
    for (m, n, lo, hi) in [(128, 8, -1.0, 1.0), (300, 61, -3.0, -1.0), (129, 40, 0.5, 2.0), (7, 3, -1.0, 1.0)] {
        let x = random(m * n, lo, hi);
        let xd = Tensor::from_host(dev, &x, &[m, n]).expect("x");
        let (p0, s0) = (random(n, -2.0, 0.5), random(n, -1.0, 1.0));
        let mut maxima = Tensor::from_host(dev, &p0, &[1, n]).expect("maxima");
        let mut sums = Tensor::from_host(dev, &s0, &[1, n]).expect("sums");
        column_atomics_scattered::launch(dev, m.div_ceil(128) as u32, &xd, &mut maxima, &mut sums).expect("launch");
        let mut want_max = p0;
        let mut want_sum: Vec<f64> = s0.iter().map(|&v| f64::from(v)).collect();
        for i in 0..m {
            for j in 0..n {
                want_max[j] = want_max[j].max(x[i * n + j]);
                want_sum[j] += 2.0 * f64::from(x[i * n + j]);
            }
        }
        assert_eq!(maxima.to_host().expect("maxima"), want_max, "column maxima {m}×{n} in [{lo}, {hi})");
        let got = wide(&sums.to_host().expect("sums"));
        assert!(rel_error(&got, &want_sum) < 1e-5, "column sums {m}×{n}: {}", rel_error(&got, &want_sum));
    }
}

#[test]
fn gpu_column_atomics_scattered_over_blocks() {
    if let Some(dev) = gpu_or_skip("gpu_column_atomics_scattered_over_blocks") {
        column_atomics_scattered_over_blocks(&dev);
    }
}

#[test]
fn interp_column_atomics_scattered_over_blocks() {
    column_atomics_scattered_over_blocks(&Device::cpu());
}

/// Every block adds its 64×64 tile of `x` into the one tile of `sum` by two TMA reduce-adds
/// of 32-column panels from shared memory (`sum` narrower than 64: the second panel's columns
/// past it are skipped).
#[kernel(targets(sm_90a))]
fn tma_reduce_sums(x: Global<f32, 2>, sum: Global<f32, 2>) {
    let r = block::id_x() * 64;
    let ring = Smem::<f32, 64, 32>::ring(2);
    #[unroll]
    for p in 0..2 {
        ring.at(p).store(x.load_or::<Tile<f32, 64, 32>>([r, p * 32], 0.0));
        tma::reduce_add(sum, [0, p * 32], ring.at(p));
    }
    tma::store_wait(0);
}

fn tma_reduce_adds_sum_over_blocks(dev: &Device) {
    for (m, n) in [(64, 64), (300, 48)] {
        let x = random(m * 64, -1.0, 1.0);
        let xd = Tensor::from_host(dev, &x, &[m, 64]).expect("x");
        let s0 = random(64 * n, -1.0, 1.0);
        let mut sum = Tensor::from_host(dev, &s0, &[64, n]).expect("sum");
        tma_reduce_sums::launch(dev, m.div_ceil(64) as u32, &xd, &mut sum).expect("launch");
        let mut want: Vec<f64> = s0.iter().map(|&v| f64::from(v)).collect();
        for i in 0..m {
            for j in 0..n {
                want[(i % 64) * n + j] += f64::from(x[i * 64 + j]);
            }
        }
        let got = wide(&sum.to_host().expect("sum"));
        assert!(rel_error(&got, &want) < 1e-5, "reduce-add sums {m}×{n}: {}", rel_error(&got, &want));
    }
}

#[test]
fn gpu_tma_reduce_adds_sum_over_blocks() {
    if let Some(dev) = gpu_or_skip("gpu_tma_reduce_adds_sum_over_blocks") {
        tma_reduce_adds_sum_over_blocks(&dev);
    }
}

#[test]
fn interp_tma_reduce_adds_sum_over_blocks() {
    tma_reduce_adds_sum_over_blocks(&Device::cpu());
}

/// Split sums finished by the last arrival: block `(p, g)`'s two warpgroups each add 64 rows
/// of group `g`'s part `p` of `x` into `sums[g]` (`atomic_add`), then take a ticket from
/// `count[g]` (`fetch_add`), mark it in `seen`, and the warpgroup that draws the last ticket
/// copies the finished sums to `out[g]`, clears them and puts the count back to 0 (adding
/// minus the arrivals).
#[kernel(warpgroups = 2)]
fn last_arrival_sums(x: Global<f32, 2>, sums: Global<f32, 2>, count: Global<i32, 1>, seen: Global<f32, 2>, out: Global<f32, 2>) {
    let p = block::id_x();
    let g = block::id_y();
    let arrivals = grid::dim_x() * 2;
    let r = (g * grid::dim_x() + p) * 128 + warpgroup::id() * 64;
    sums.atomic_add([g * 64, 0], x.load::<Tile<f32, 64, 64>>([r, 0]));
    let ticket = count.fetch_add([g], 1);
    arrival_finish(sums, count, seen, out, ticket, arrivals, g, 1);
}

/// [`last_arrival_sums`] with the partial sums added by TMA reduce-adds from shared memory
/// (completed and made visible by the ticket's draw), the tickets drawn by `fetch_inc` (the
/// last puts the count back to 0).
#[kernel(warpgroups = 2, targets(sm_90a))]
fn last_arrival_tma_sums(x: Global<f32, 2>, sums: Global<f32, 2>, count: Global<i32, 1>, seen: Global<f32, 2>, out: Global<f32, 2>) {
    let p = block::id_x();
    let g = block::id_y();
    let arrivals = grid::dim_x() * 2;
    let r = (g * grid::dim_x() + p) * 128 + warpgroup::id() * 64;
    let ring = Smem::<f32, 64, 32>::ring(4);
    #[unroll]
    for c in 0..2 {
        let panel = warpgroup::id() * 2 + c;
        ring.at(panel).store(x.load::<Tile<f32, 64, 32>>([r, c * 32]));
        tma::reduce_add(sums, [g * 64, c * 32], ring.at(panel));
    }
    let ticket = count.fetch_inc([g], arrivals - 1);
    arrival_finish(sums, count, seen, out, ticket, arrivals, g, 0);
}

/// What both kernels do with a ticket (`reset` 1: the count put back to 0 by adding).
#[tessera::device]
#[allow(clippy::too_many_arguments)]
fn arrival_finish(
    sums: Global<f32, 2>, count: Global<i32, 1>, seen: Global<f32, 2>, out: Global<f32, 2>, ticket: i32, arrivals: i32, g: i32, reset: i32,
) {
    seen.store([g, ticket], Tile::<f32, 1, 1>::full(1.0));
    if ticket == arrivals - 1 {
        out.store([g * 64, 0], sums.load::<Tile<f32, 64, 64>>([g * 64, 0]));
        sums.store([g * 64, 0], Tile::<f32, 64, 64>::zeros());
        if reset == 1 {
            count.fetch_add([g], -arrivals);
        }
    }
}

fn last_arrival_finishes_sums(dev: &Device, tma: bool) {
    for (parts, groups) in [(1, 1), (7, 3), (40, 5)] {
        let rows = groups * parts * 128;
        let x = random(rows * 64, -1.0, 1.0);
        let xd = Tensor::from_host(dev, &x, &[rows, 64]).expect("x");
        let mut sums = Tensor::<f32>::zeros(dev, &[groups * 64, 64]).expect("sums");
        let mut count = Tensor::<i32>::zeros(dev, &[groups]).expect("count");
        let mut seen = Tensor::from_host(dev, &vec![f32::NAN; groups * 2 * parts], &[groups, 2 * parts]).expect("seen");
        let mut out = Tensor::from_host(dev, &vec![f32::NAN; groups * 64 * 64], &[groups * 64, 64]).expect("out");
        let grid = Grid::from((parts as u32, groups as u32));
        if tma {
            last_arrival_tma_sums::launch(dev, grid, &xd, &mut sums, &mut count, &mut seen, &mut out).expect("launch");
        } else {
            last_arrival_sums::launch(dev, grid, &xd, &mut sums, &mut count, &mut seen, &mut out).expect("launch");
        }
        let mut want = vec![0.0f64; groups * 64 * 64];
        for g in 0..groups {
            for i in 0..parts * 128 {
                for j in 0..64 {
                    want[(g * 64 + i % 64) * 64 + j] += f64::from(x[((g * parts * 128) + i) * 64 + j]);
                }
            }
        }
        let got = wide(&out.to_host().expect("out"));
        assert!(rel_error(&got, &want) < 1e-5, "sums {parts}×{groups} (tma {tma}): {}", rel_error(&got, &want));
        assert!(seen.to_host().expect("seen").iter().all(|&v| v == 1.0), "each ticket drawn once ({parts}×{groups})");
        assert!(sums.to_host().expect("sums").iter().all(|&v| v == 0.0), "the sums cleared ({parts}×{groups})");
        assert!(count.to_host().expect("count").iter().all(|&v| v == 0), "the counts back to 0 ({parts}×{groups})");
    }
}

#[test]
fn gpu_last_arrival_finishes_sums() {
    if let Some(dev) = gpu_or_skip("gpu_last_arrival_finishes_sums") {
        last_arrival_finishes_sums(&dev, false);
        last_arrival_finishes_sums(&dev, true);
    }
}

#[test]
fn interp_last_arrival_finishes_sums() {
    last_arrival_finishes_sums(&Device::cpu(), false);
    last_arrival_finishes_sums(&Device::cpu(), true);
}

/// Running sums over blocks by a decoupled look-back: block `b` sums its 64×64 part of `x`
/// (64 row sums), publishes them (`totals`, flag 1), walks back over the flags of the blocks
/// before it (`while` and `wait_nonzero`), adding their totals until a block whose running
/// sums are out (flag 2, `inclusive`), then publishes its own running sums (flag 2) and stores
/// them, and how many blocks it looked at, in `out` and `steps`.
#[kernel]
fn look_back_sums(
    x: Global<f32, 2>, totals: Global<f32, 2>, inclusive: Global<f32, 2>, flags: Global<i32, 1>, out: Global<f32, 2>, steps: Global<f32, 2>,
) {
    let b = block::id_x();
    let own = row_sum(x.load::<Tile<f32, 64, 64>>([b * 64, 0]));
    totals.store([b * 64, 0], own);
    flags.fetch_add([b], 1);
    let mut carry = Tile::<f32, 64, 64>::zeros().last_col();
    let mut looked = Tile::<f32, 1, 1>::zeros();
    let mut j = b - 1;
    while j >= 0 {
        let flag = flags.wait_nonzero([j]);
        looked = looked + 1.0;
        if flag == 2 {
            carry = carry + inclusive.load::<Tile<f32, 64, 1>>([j * 64, 0]);
            j = -1;
        } else {
            carry = carry + totals.load::<Tile<f32, 64, 1>>([j * 64, 0]);
            j = j - 1;
        }
    }
    inclusive.store([b * 64, 0], carry + own);
    flags.fetch_add([b], 1);
    out.store([b * 64, 0], carry + own);
    steps.store([b, 0], looked);
}

fn look_back_sums_match(dev: &Device) {
    for blocks in [1, 5, 300] {
        let x = random(blocks * 64 * 64, -1.0, 1.0);
        let xd = Tensor::from_host(dev, &x, &[blocks * 64, 64]).expect("x");
        let poison = |n: usize, cols: usize| Tensor::from_host(dev, &vec![f32::NAN; n * cols], &[n, cols]).expect("poisoned");
        let (mut totals, mut inclusive, mut out) = (poison(blocks * 64, 1), poison(blocks * 64, 1), poison(blocks * 64, 1));
        let mut steps = poison(blocks, 1);
        let mut flags = Tensor::<i32>::zeros(dev, &[blocks]).expect("flags");
        look_back_sums::launch(dev, Grid::from(blocks as u32), &xd, &mut totals, &mut inclusive, &mut flags, &mut out, &mut steps)
            .expect("launch");
        // Row i of block b: the sum of row i of the blocks up to b.
        let mut want = vec![0.0f64; blocks * 64];
        for b in 0..blocks {
            for i in 0..64 {
                let own: f64 = x[(b * 64 + i) * 64..][..64].iter().map(|&v| f64::from(v)).sum();
                want[b * 64 + i] = own + if b > 0 { want[(b - 1) * 64 + i] } else { 0.0 };
            }
        }
        let got = wide(&out.to_host().expect("out"));
        assert!(rel_error(&got, &want) < 1e-5, "look-back over {blocks} blocks: {}", rel_error(&got, &want));
        assert!(flags.to_host().expect("flags").iter().all(|&f| f == 2), "every flag raised twice ({blocks} blocks)");
        let looked = steps.to_host().expect("steps");
        assert!(looked.iter().enumerate().all(|(b, &n)| n >= (b > 0) as u8 as f32 && n <= b as f32), "steps {looked:?}");
    }
}

#[test]
fn gpu_look_back_sums_match() {
    if let Some(dev) = gpu_or_skip("gpu_look_back_sums_match") {
        look_back_sums_match(&dev);
    }
}

#[test]
fn interp_look_back_sums_match() {
    look_back_sums_match(&Device::cpu());
    look_back_sums_match(&Device::cpu_with_threads(8));
}

/// One row of `x` from column `col` through TMA, into `out`.
#[kernel(warpgroups = 2, targets(sm_90a))]
fn tma_row_from(x: Global<f32, 2>, out: Global<f32, 2>, col: i32) {
    let ring = Smem::<f32, 1, 64>::ring_swizzled(1, 0);
    let pipe = Pipeline::<1>::new(1);
    if warpgroup::id() == 0 {
        let s = pipe.acquire();
        tma::load(ring.at(s), x, [0, col], pipe);
        pipe.commit(s);
    } else {
        let s = pipe.wait();
        out.store([0, 0], ring.at(s).load());
        pipe.release(s);
    }
}

/// A TMA box starting off 16 bytes along the rows stops the GPU on an illegal instruction
/// (seen on the H200, and as packed attention sequences first met it): the interpreter
/// refuses it, naming the column; a box at 4 f32 columns in is fine.
#[test]
fn interp_tma_box_starts_16_byte_aligned() {
    let dev = Device::cpu();
    let x = random(4 * 128, -1.0, 1.0);
    let xd = Tensor::from_host(&dev, &x, &[4, 128]).expect("x");
    let mut out = Tensor::from_host(&dev, &[f32::NAN; 64], &[1, 64]).expect("out");
    tma_row_from::launch(&dev, 1, &xd, &mut out, 4).expect("an aligned box");
    assert_eq!(out.to_host().expect("out"), x[4..68].to_vec());
    let err = tma_row_from::launch(&dev, 1, &xd, &mut out, 1).map(|_| ()).and_then(|_| dev.synchronize());
    let msg = format!("{err:?}");
    assert!(err.is_err() && msg.contains("column 1") && msg.contains("16-byte aligned"), "{msg}");
}

/// `C = A·Bᵀ` for one 64×64 tile of C, K streamed through a two-stage ring by the prelude's
/// pipeline loops: the producer fills each stage with `fill_stages`, the consumer multiplies
/// and releases it with `drain_stages` (closures with the copies and the MMA), no
/// acquire/commit or wait/release spelled out.
#[kernel(warpgroups = 2, targets(sm_90a))]
fn staged_product(a: Global<bf16, 2>, b: Global<bf16, 2>, c: Global<f32, 2>) {
    let sa = Smem::<bf16, 64, 64>::ring(2);
    let sb = Smem::<bf16, 64, 64>::ring(2);
    let pipe = Pipeline::<2>::new(1);
    let steps = (a.dim(1) + 63) / 64;
    if warpgroup::id() == 0 {
        tessera_kernels::prelude::fill_stages(pipe, steps, |s, k| {
            tma::load(sa.at(s), a, [0, k * 64], pipe);
            tma::load(sb.at(s), b, [0, k * 64], pipe);
        });
    } else {
        let mut acc = Tile::<f32, 64, 64>::zeros();
        tessera_kernels::prelude::drain_stages(pipe, steps, |s, _k| {
            mma_sync(acc, sa.at(s), sb.at(s));
            mma_wait(0);
        });
        c.store([0, 0], acc);
    }
}

fn pipeline_loops_stream_stages(dev: &Device) {
    for k in [64, 72, 200, 640] {
        let (ha, hb): (Vec<bf16>, Vec<bf16>) = (
            random(64 * k, -1.0, 1.0).into_iter().map(bf16::from_f32).collect(),
            random(64 * k, -1.0, 1.0).into_iter().map(bf16::from_f32).collect(),
        );
        let a = Tensor::from_host(dev, &ha, &[64, k]).unwrap();
        let b = Tensor::from_host(dev, &hb, &[64, k]).unwrap();
        let mut c = Tensor::full(dev, &[64, 64], f32::NAN).unwrap();
        staged_product::launch(dev, 1, &a, &b, &mut c).unwrap();
        let want: Vec<f64> = (0..64 * 64)
            .map(|ij| (0..k).map(|x| f64::from(ha[(ij / 64) * k + x].to_f32()) * f64::from(hb[(ij % 64) * k + x].to_f32())).sum())
            .collect();
        let got: Vec<f64> = c.to_host().unwrap().into_iter().map(f64::from).collect();
        let err = rel_error(&got, &want);
        assert!(err < 1e-5, "K = {k}: relative error {err}");
    }
}

#[test]
fn gpu_pipeline_loops_stream_stages() {
    if let Some(dev) = gpu_or_skip("gpu_pipeline_loops_stream_stages") {
        pipeline_loops_stream_stages(&dev);
    }
}

#[test]
fn interp_pipeline_loops_stream_stages() {
    pipeline_loops_stream_stages(&Device::cpu());
}

/// `H = Kᵀ·diag(w)·V` (K `[T, 128]`, V `[T, 64]`, w `[T, 1]`), a linear attention's state: K
/// streams through a ring and enters the MMA transposed (`.t()`: stored K×M), and the consumer
/// writes each step's `w·V` into shared memory between its MMAs (the compiler fences the
/// stores for the MMA that reads them).
#[kernel(warpgroups = 2, targets(sm_90a))]
fn state_product(k: Global<bf16, 2>, v: Global<bf16, 2>, w: Global<f32, 2>, h: Global<f32, 2>) {
    let sk = Smem::<bf16, 64, 128>::ring(2);
    let sv = Smem::<bf16, 64, 64>::ring(1);
    let pipe = Pipeline::<2>::new(1);
    let steps = (k.dim(0) + 63) / 64;
    if warpgroup::id() == 0 {
        tessera_kernels::prelude::fill_stages(pipe, steps, |s, j| {
            tma::load(sk.at(s), k, [j * 64, 0], pipe);
        });
    } else {
        let mut acc = Tile::<f32, 128, 64>::zeros();
        tessera_kernels::prelude::drain_stages(pipe, steps, |s, j| {
            let vt: Tile<bf16, 64, 64> = v.load([j * 64, 0]);
            let wt: Tile<f32, 64, 1> = w.load([j * 64, 0]);
            sv.at(0).store((vt.cast::<f32>() * wt).cast::<bf16>());
            mma_sync_kn(acc, sk.at(s).t(), sv.at(0));
            mma_wait(0);
        });
        h.store([0, 0], acc);
    }
}

fn transposed_a_products(dev: &Device) {
    for t in [64, 7, 200, 640] {
        let bf = |n: usize| random(n, -1.0, 1.0).into_iter().map(bf16::from_f32).collect::<Vec<_>>();
        let (hk, hv, hw) = (bf(t * 128), bf(t * 64), random(t, 0.25, 2.0));
        let k = Tensor::from_host(dev, &hk, &[t, 128]).unwrap();
        let v = Tensor::from_host(dev, &hv, &[t, 64]).unwrap();
        let w = Tensor::from_host(dev, &hw, &[t, 1]).unwrap();
        let mut h = Tensor::full(dev, &[128, 64], f32::NAN).unwrap();
        state_product::launch(dev, 1, &k, &v, &w, &mut h).unwrap();
        // w·V is rounded to bf16 in shared memory, as the kernel's operand.
        let wv = |s: usize, j: usize| f64::from(bf16::from_f32(hv[s * 64 + j].to_f32() * hw[s]).to_f32());
        let want: Vec<f64> =
            (0..128 * 64).map(|ij| (0..t).map(|s| f64::from(hk[s * 128 + ij / 64].to_f32()) * wv(s, ij % 64)).sum()).collect();
        let got: Vec<f64> = h.to_host().unwrap().into_iter().map(f64::from).collect();
        let err = rel_error(&got, &want);
        assert!(err < 1e-5, "T = {t}: relative error {err}");
    }
}

#[test]
fn gpu_transposed_a_products() {
    if let Some(dev) = gpu_or_skip("gpu_transposed_a_products") {
        transposed_a_products(&dev);
    }
}

#[test]
fn interp_transposed_a_products() {
    transposed_a_products(&Device::cpu());
}

/// `view.load()`: consumer 1 reads a TMA-loaded tile (128-byte panels, swizzled) from shared
/// memory into registers and hands `2·x` and `x/2` to consumer 0 through f32 rings (one in
/// swizzled panels, one unswizzled) behind a named barrier; consumer 0 reads them back, adds
/// its own copy of x and stores `3.5·x`.
#[kernel(warpgroups = 3, targets(sm_90a))]
fn shared_round_trip(x: Global<bf16, 2>, y: Global<f32, 2>) {
    let sx = Smem::<bf16, 64, 128>::ring(1);
    let sf = Smem::<f32, 64, 128>::ring(1);
    let sg = Smem::<f32, 64, 128>::ring_swizzled(1, 0);
    let pipe = Pipeline::<1>::new(2);
    if warpgroup::id() == 0 {
        let s = pipe.acquire();
        tma::load(sx.at(s), x, [0, 0], pipe);
        pipe.commit(s);
    } else {
        let s = pipe.wait();
        let t = sx.at(s).load().cast::<f32>();
        if warpgroup::id() == 2 {
            sf.at(0).store(t * 2.0);
            sg.at(0).store(t * 0.5);
        }
        barrier::sync(0, 2);
        if warpgroup::id() == 1 {
            y.store([0, 0], t + sf.at(0).load() + sg.at(0).load());
        }
        pipe.release(s);
    }
}

fn shared_loads_round_trip(dev: &Device) {
    let hx: Vec<bf16> = random(64 * 128, -1.0, 1.0).into_iter().map(bf16::from_f32).collect();
    let x = Tensor::from_host(dev, &hx, &[64, 128]).unwrap();
    let mut y = Tensor::full(dev, &[64, 128], f32::NAN).unwrap();
    shared_round_trip::launch(dev, 1, &x, &mut y).unwrap();
    let want: Vec<f64> = hx.iter().map(|v| 3.5 * f64::from(v.to_f32())).collect();
    let got: Vec<f64> = y.to_host().unwrap().into_iter().map(f64::from).collect();
    assert!(rel_error(&got, &want) < 1e-6, "relative error {}", rel_error(&got, &want));
}

#[test]
fn gpu_shared_loads_round_trip() {
    if let Some(dev) = gpu_or_skip("gpu_shared_loads_round_trip") {
        shared_loads_round_trip(&dev);
    }
}

#[test]
fn interp_shared_loads_round_trip() {
    shared_loads_round_trip(&Device::cpu());
}

/// Integer division and remainder by constants (powers of two, lowered to shifts; others; and
/// constants folded) of a block's signed index `id − off`: row `id`, one 16-column run each.
#[kernel]
fn int_div_rem(y: Global<f32, 2>, off: i32) {
    let r = block::id_x();
    let x = r - off;
    let z = Tile::<f32, 1, 16>::zeros();
    y.store([r, 0], z + (x / 4) as f32);
    y.store([r, 16], z + (x % 4) as f32);
    y.store([r, 32], z + (x / 64) as f32);
    y.store([r, 48], z + (x % 64) as f32);
    y.store([r, 64], z + (x / 1) as f32);
    y.store([r, 80], z + (x % 1) as f32);
    y.store([r, 96], z + (x / 3) as f32);
    y.store([r, 112], z + (x % 3) as f32);
    y.store([r, 128], z + (x / -8) as f32);
    y.store([r, 144], z + (x % -8) as f32);
    y.store([r, 160], z + ((128 / 32) * x) as f32);
    y.store([r, 176], z + (7 % 4 - x) as f32);
}

fn int_div_rem_truncate(dev: &Device) {
    let (n, off) = (600, 300);
    let mut y = Tensor::full(dev, &[n, 192], f32::NAN).unwrap();
    int_div_rem::launch(dev, Grid::tiles(n, 1), &mut y, off).unwrap();
    let got = y.to_host().unwrap();
    for r in 0..n {
        let x = r as i32 - off;
        let want = [x / 4, x % 4, x / 64, x % 64, x, 0, x / 3, x % 3, x / -8, x % -8, 4 * x, 3 - x];
        for (c, w) in want.iter().enumerate() {
            for k in 0..16 {
                assert_eq!(got[r * 192 + c * 16 + k], *w as f32, "x = {x}, operation {c}");
            }
        }
    }
}

#[test]
fn gpu_int_div_rem_truncate() {
    if let Some(dev) = gpu_or_skip("gpu_int_div_rem_truncate") {
        int_div_rem_truncate(&dev);
    }
}

#[test]
fn interp_int_div_rem_truncate() {
    int_div_rem_truncate(&Device::cpu());
}

/// `view.cols(start, n)`: whole column panels of a shared view. Two consumers split
/// `H = Kᵀ·V` (K `[T, 128]`, V `[T, 128]`) by V's columns, each taking its 64-column panel of
/// the same V stage as `mma_sync_kn`'s B; the second also reads its panel back (`y`, V's first
/// 64 rows, columns 64..128).
#[kernel(warpgroups = 3, targets(sm_90a))]
fn column_panels(k: Global<bf16, 2>, v: Global<bf16, 2>, h: Global<f32, 2>, y: Global<f32, 2>) {
    let sk = Smem::<bf16, 64, 128>::ring(2);
    let sv = Smem::<bf16, 64, 128>::ring(2);
    let pipe = Pipeline::<2>::new(2);
    let steps = (k.dim(0) + 63) / 64;
    if warpgroup::id() == 0 {
        tessera_kernels::prelude::fill_stages(pipe, steps, |s, j| {
            tma::load(sk.at(s), k, [j * 64, 0], pipe);
            tma::load(sv.at(s), v, [j * 64, 0], pipe);
        });
    } else {
        let mut acc = Tile::<f32, 128, 64>::zeros();
        tessera_kernels::prelude::drain_stages(pipe, steps, |s, j| {
            if warpgroup::id() == 1 {
                mma_sync_kn(acc, sk.at(s).t(), sv.at(s).cols(0, 64));
            } else {
                mma_sync_kn(acc, sk.at(s).t(), sv.at(s).cols(64, 64));
                if j == 0 {
                    y.store([0, 0], sv.at(s).cols(64, 64).load().cast::<f32>());
                }
            }
            mma_wait(0);
        });
        h.store([0, (warpgroup::id() - 1) * 64], acc);
    }
}

fn column_panel_views(dev: &Device) {
    for t in [64, 7, 200] {
        let bf = |n: usize| random(n, -1.0, 1.0).into_iter().map(bf16::from_f32).collect::<Vec<_>>();
        let (hk, hv) = (bf(t * 128), bf(t * 128));
        let k = Tensor::from_host(dev, &hk, &[t, 128]).unwrap();
        let v = Tensor::from_host(dev, &hv, &[t, 128]).unwrap();
        let mut h = Tensor::full(dev, &[128, 128], f32::NAN).unwrap();
        let mut y = Tensor::full(dev, &[64, 64], f32::NAN).unwrap();
        column_panels::launch(dev, 1, &k, &v, &mut h, &mut y).unwrap();
        let want: Vec<f64> = (0..128 * 128)
            .map(|ij| (0..t).map(|s| f64::from(hk[s * 128 + ij / 128].to_f32()) * f64::from(hv[s * 128 + ij % 128].to_f32())).sum())
            .collect();
        let got: Vec<f64> = h.to_host().unwrap().into_iter().map(f64::from).collect();
        let err = rel_error(&got, &want);
        assert!(err < 1e-5, "T = {t}: relative error {err}");
        // Rows past T arrive as TMA's zeros.
        let want_y: Vec<f32> = (0..64 * 64).map(|ij| if ij / 64 < t { hv[(ij / 64) * 128 + 64 + ij % 64].to_f32() } else { 0.0 }).collect();
        assert_eq!(y.to_host().unwrap(), want_y, "T = {t}: V's second panel read back");
    }
}

#[test]
fn gpu_column_panel_views() {
    if let Some(dev) = gpu_or_skip("gpu_column_panel_views") {
        column_panel_views(&dev);
    }
}

#[test]
fn interp_column_panel_views() {
    column_panel_views(&Device::cpu());
}

/// `keep_where` on a tile's own layout: a condition loaded from memory, one per row, one per
/// column, and index tiles (`row_index()`, `col_index()` and scalars) given to a device
/// function, whose `let`-bound parameters meet the tile where it is.
#[tessera::device]
fn band<const M: usize, const N: usize>(x: Tile<f32, M, N>, qi: Tile<f32, M, N>, kj: Tile<f32, M, N>, w: i32) -> Tile<f32, M, N> {
    x.keep_where(min(qi - kj, kj - qi) + w as f32, f32::NEG_INFINITY) + (kj - qi) * 0.5
}

#[kernel]
fn keep_where_forms(
    x: Global<f32, 2>, c: Global<f32, 2>, rc: Global<f32, 2>, cc: Global<f32, 2>, y: Global<f32, 3>, r0: i32, c0: i32, w: i32,
) {
    let t: Tile<f32, 16, 64> = x.load([0, 0]);
    let full: Tile<f32, 16, 64> = c.load([0, 0]);
    let rows: Tile<f32, 16, 1> = rc.load([0, 0]);
    let cols: Tile<f32, 1, 64> = cc.load([0, 0]);
    y.store([0, 0, 0], t.keep_where(full, -1.0));
    y.store([1, 0, 0], t.keep_where(rows, 7.0));
    y.store([2, 0, 0], t.keep_where(cols, f32::NEG_INFINITY));
    let qi = Tile::<f32, 16, 64>::row_index() + r0 as f32;
    let kj = Tile::<f32, 16, 64>::col_index() + c0 as f32;
    y.store([3, 0, 0], band(t, qi, kj, w));
}

/// The same band on an MMA accumulator: `S = A·Bᵀ` (A `[64, 64]`, B `[64, 64]`, one stage).
#[kernel(warpgroups = 2, targets(sm_90a))]
fn keep_where_acc(a: Global<bf16, 2>, b: Global<bf16, 2>, s: Global<f32, 2>, r0: i32, c0: i32, w: i32) {
    let sa = Smem::<bf16, 64, 64>::ring(1);
    let sb = Smem::<bf16, 64, 64>::ring(1);
    let pipe = Pipeline::<1>::new(1);
    if warpgroup::id() == 0 {
        let st = pipe.acquire();
        tma::load(sa.at(st), a, [0, 0], pipe);
        tma::load(sb.at(st), b, [0, 0], pipe);
        pipe.commit(st);
    } else {
        let st = pipe.wait();
        let mut acc = Tile::<f32, 64, 64>::zeros();
        mma_sync(acc, sa.at(st), sb.at(st));
        mma_wait(0);
        pipe.release(st);
        let qi = Tile::<f32, 64, 64>::row_index() + r0 as f32;
        let kj = Tile::<f32, 64, 64>::col_index() + c0 as f32;
        s.store([0, 0], band(acc, qi, kj, w));
    }
}

/// The host's band: `x` where `|i − j| ≤ w` (else −∞), plus `(j − i)/2`.
fn band_ref(x: f64, i: i64, j: i64, w: i64) -> f64 {
    let kept = if (i - j).abs() <= w { x } else { f64::NEG_INFINITY };
    kept + 0.5 * (j - i) as f64
}

fn keep_where_selects(dev: &Device) {
    let (r0, c0, w) = (random(1, 0.0, 50.0)[0] as i32, random(1, 0.0, 50.0)[0] as i32, 9);
    let hx = random(16 * 64, -4.0, 4.0);
    let hc = random(16 * 64, -1.0, 1.0);
    let hr = random(16, -1.0, 1.0);
    let hcol = random(64, -1.0, 1.0);
    let x = Tensor::from_host(dev, &hx, &[16, 64]).unwrap();
    let c = Tensor::from_host(dev, &hc, &[16, 64]).unwrap();
    let rc = Tensor::from_host(dev, &hr, &[16, 1]).unwrap();
    let cc = Tensor::from_host(dev, &hcol, &[1, 64]).unwrap();
    let mut y = Tensor::full(dev, &[4, 16, 64], f32::NAN).unwrap();
    keep_where_forms::launch(dev, 1, &x, &c, &rc, &cc, &mut y, r0, c0, w).unwrap();
    let got = y.to_host().unwrap();
    for (i, &row_cond) in hr.iter().enumerate() {
        for (j, &col_cond) in hcol.iter().enumerate() {
            let e = i * 64 + j;
            let at = |f: usize| got[f * 1024 + e];
            assert_eq!(at(0), if hc[e] >= 0.0 { hx[e] } else { -1.0 }, "full condition at {i},{j}");
            assert_eq!(at(1), if row_cond >= 0.0 { hx[e] } else { 7.0 }, "row condition at {i},{j}");
            assert_eq!(at(2), if col_cond >= 0.0 { hx[e] } else { f32::NEG_INFINITY }, "column condition at {i},{j}");
            let want = band_ref(f64::from(hx[e]), (i as i32 + r0).into(), (j as i32 + c0).into(), w.into());
            assert_eq!(f64::from(at(3)), want, "index condition at {i},{j}");
        }
    }
    {
        let bf = |n: usize| random(n, -1.0, 1.0).into_iter().map(bf16::from_f32).collect::<Vec<_>>();
        let (ha, hb) = (bf(64 * 64), bf(64 * 64));
        let a = Tensor::from_host(dev, &ha, &[64, 64]).unwrap();
        let b = Tensor::from_host(dev, &hb, &[64, 64]).unwrap();
        let mut s = Tensor::full(dev, &[64, 64], f32::NAN).unwrap();
        let (r0, c0) = (r0 + 20, c0);
        keep_where_acc::launch(dev, 1, &a, &b, &mut s, r0, c0, w).unwrap();
        let got = s.to_host().unwrap();
        for i in 0..64 {
            for j in 0..64 {
                let dot: f64 = (0..64).map(|x| f64::from(ha[i * 64 + x].to_f32()) * f64::from(hb[j * 64 + x].to_f32())).sum();
                let want = band_ref(dot, (i as i32 + r0).into(), (j as i32 + c0).into(), w.into());
                let g = f64::from(got[i * 64 + j]);
                let ok = if want.is_infinite() { g == want } else { (g - want).abs() <= 1e-4 * want.abs().max(1.0) };
                assert!(ok, "accumulator at {i},{j}: {g}, expected {want}");
            }
        }
    }
}

#[test]
fn gpu_keep_where_selects() {
    if let Some(dev) = gpu_or_skip("gpu_keep_where_selects") {
        keep_where_selects(&dev);
    }
}

#[test]
fn interp_keep_where_selects() {
    keep_where_selects(&Device::cpu());
}

/// `exp2`, `exp2_fma` (a polynomial on the FMA pipe) and `exp2_split` (a tile's registers
/// shared between the two) of one tile.
#[kernel]
fn exp2_forms(x: Global<f32, 2>, y: Global<f32, 3>) {
    let t: Tile<f32, 16, 64> = x.load([0, 0]);
    y.store([0, 0, 0], exp2(t));
    y.store([1, 0, 0], exp2_fma(t));
    y.store([2, 0, 0], t.exp2_split());
}

/// `exp2_fma` within 3·10⁻⁷ of 2ˣ from −126 to 127, 0 below −126.5 (−∞ and NaN too), 2¹²⁷
/// above 127; `exp2_split` gives each element one of the two (on the GPU both occur).
fn exp2_on_the_fma_pipe(dev: &Device) {
    let special = [
        f32::NEG_INFINITY,
        f32::NAN,
        -1e30,
        -200.0,
        -127.0,
        -126.6,
        -126.5,
        -126.0,
        -125.5,
        -1.5,
        -0.5,
        0.0,
        0.5,
        1e-3,
        126.9,
        127.0,
        200.0,
    ];
    let mut hx = random(16 * 64, -130.0, 130.0);
    hx[..special.len()].copy_from_slice(&special);
    // Fractions near ±½ (the rounding's edges) and small magnitudes.
    for (i, v) in hx.iter_mut().enumerate().skip(special.len()).take(200) {
        *v = (i as f32 - 100.0) * 0.5 + if i % 2 == 0 { 1e-6 } else { -1e-6 };
    }
    let x = Tensor::from_host(dev, &hx, &[16, 64]).unwrap();
    let mut y = Tensor::full(dev, &[3, 16, 64], f32::NAN).unwrap();
    exp2_forms::launch(dev, 1, &x, &mut y).unwrap();
    let got = y.to_host().unwrap();
    let (mut by_mufu, mut by_fma) = (0, 0);
    for (e, &xv) in hx.iter().enumerate() {
        let (mufu, fma, split) = (got[e], got[1024 + e], got[2048 + e]);
        let want = 2f64.powf(f64::from(xv.clamp(-127.0, 127.0)));
        if xv.is_nan() || xv < -126.5 {
            assert_eq!(fma.to_bits(), 0, "exp2_fma({xv}) = {fma}, expected 0");
        } else if xv >= -126.0 {
            let err = (f64::from(fma) - want).abs() / want;
            assert!(err < 3e-7, "exp2_fma({xv}) = {fma}, expected {want} (relative error {err})");
        } else {
            assert!(f64::from(fma) <= 2f64.powi(-125) && fma >= 0.0, "exp2_fma({xv}) = {fma}");
        }
        assert!(
            split.to_bits() == mufu.to_bits() || split.to_bits() == fma.to_bits(),
            "exp2_split({xv}) = {split}: neither {mufu} nor {fma}"
        );
        if mufu.to_bits() != fma.to_bits() {
            by_mufu += usize::from(split.to_bits() == mufu.to_bits());
            by_fma += usize::from(split.to_bits() == fma.to_bits());
        }
    }
    if !dev.is_cpu() {
        assert!(by_mufu > 0 && by_fma > 0, "exp2_split took the MUFU {by_mufu} times and the polynomial {by_fma} times");
    }
}

#[test]
fn gpu_exp2_on_the_fma_pipe() {
    if let Some(dev) = gpu_or_skip("gpu_exp2_on_the_fma_pipe") {
        exp2_on_the_fma_pipe(&dev);
    }
}

#[test]
fn interp_exp2_on_the_fma_pipe() {
    exp2_on_the_fma_pipe(&Device::cpu());
}

/// Each block's `acc = A_blk·Bᵀ` (64×48, A's block `block::id_x()`) written in fragment order
/// (`store_fragments`), added by one flat bulk reduce-add into `sum`'s first 3072 elements and
/// copied by a flat bulk store to its row of `each`.
#[kernel(targets(sm_90a))]
fn fragment_sums(a: Global<bf16, 2>, b: Global<bf16, 2>, sum: Global<f32, 2>, each: Global<f32, 2>) {
    let sa = Smem::<bf16, 64, 32>::ring(1);
    let sb = Smem::<bf16, 64, 32>::ring(1);
    let frag = Smem::<f32, 64, 48>::ring_swizzled(1, 0);
    sa.at(0).store(a.load::<Tile<bf16, 64, 32>>([block::id_x() * 64, 0]));
    sb.at(0).store(b.load::<Tile<bf16, 64, 32>>([0, 0]));
    let mut acc = Tile::<f32, 64, 48>::zeros();
    mma_sync(acc, sa.at(0), sb.at(0).rows(0, 48));
    mma_wait(0);
    frag.at(0).store_fragments(acc);
    tma::reduce_add_flat(sum, [0, 0], frag.at(0));
    tma::store_flat(each, [block::id_x(), 0], frag.at(0));
    tma::store_wait(0);
}

/// `2·sum`, the accumulator read back from fragment order (`load_fragments`), stored by element.
#[kernel(targets(sm_90a))]
fn fragment_read(sum: Global<f32, 2>, out: Global<f32, 2>) {
    out.store([0, 0], sum.load_fragments::<Tile<f32, 64, 48>>([0, 0]) * 2.0);
}

fn fragments_round_trip(dev: &Device) {
    use tessera_ptx::layout::fragment_offset;
    let blocks = 3;
    let a: Vec<bf16> = random(blocks * 64 * 32, -1.0, 1.0).into_iter().map(bf16::from_f32).collect();
    let b: Vec<bf16> = random(48 * 32, -1.0, 1.0).into_iter().map(bf16::from_f32).collect();
    let s0 = random(2 * 3072, -1.0, 1.0);
    let (ad, bd) = (Tensor::from_host(dev, &a, &[blocks * 64, 32]).expect("a"), Tensor::from_host(dev, &b, &[48, 32]).expect("b"));
    let mut sum = Tensor::from_host(dev, &s0, &[2, 3072]).expect("sum");
    let mut each = Tensor::full(dev, &[blocks, 3072], f32::NAN).expect("each");
    let mut out = Tensor::full(dev, &[64, 48], f32::NAN).expect("out");
    fragment_sums::launch(dev, blocks as u32, &ad, &bd, &mut sum, &mut each).expect("fragment_sums");
    fragment_read::launch(dev, 1, &sum, &mut out).expect("fragment_read");
    let (sum, each, out) = (sum.to_host().expect("sum"), each.to_host().expect("each"), out.to_host().expect("out"));
    let product = |blk: usize, r: usize, c: usize| -> f64 {
        (0..32).map(|k| f64::from(a[(blk * 64 + r) * 32 + k].to_f32()) * f64::from(b[c * 32 + k].to_f32())).sum()
    };
    let (mut want_each, mut got_each) = (Vec::new(), Vec::new());
    let (mut want_out, mut got_out) = (Vec::new(), Vec::new());
    for r in 0..64 {
        for c in 0..48 {
            let at = fragment_offset(48, r as u32, c as u32) as usize;
            let mut total = f64::from(s0[at]);
            for blk in 0..blocks {
                want_each.push(product(blk, r, c));
                got_each.push(f64::from(each[blk * 3072 + at]));
                total += product(blk, r, c);
            }
            want_out.push(2.0 * total);
            got_out.push(f64::from(out[r * 48 + c]));
        }
    }
    assert!(rel_error(&got_each, &want_each) < 1e-5, "store_flat of fragments: {}", rel_error(&got_each, &want_each));
    assert!(rel_error(&got_out, &want_out) < 1e-5, "reduce_add_flat then load_fragments: {}", rel_error(&got_out, &want_out));
    // The second row of `sum` is past the 3072 elements added: untouched.
    assert_eq!(&sum[3072..], &s0[3072..], "a flat reduce-add wrote past its elements");
}

#[test]
fn gpu_fragments_round_trip() {
    if let Some(dev) = gpu_or_skip("gpu_fragments_round_trip") {
        fragments_round_trip(&dev);
    }
}

#[test]
fn interp_fragments_round_trip() {
    fragments_round_trip(&Device::cpu());
}

/// fp8 tiles stored from registers into shared memory and copied out by TMA: `y_w =
/// Q(x[:, :w] · scale)` for rows of 64 bytes (64-byte swizzle), 128 bytes and 256 bytes (two
/// 128-byte panels, stored a panel at a time), and `y_acc = Q(bf16(x[:, :64]) · scale)` from a wgmma accumulator (`x`'s
/// block times an identity), the fp8 GEMM's output path.
#[kernel(dtypes(Q = [f8e4m3, f8e5m2]), targets(sm_90a))]
#[allow(clippy::too_many_arguments)]
fn fp8_staged(
    x: Global<f32, 2>, eye: Global<bf16, 2>, y64: Global<Q, 2>, y128: Global<Q, 2>, y256: Global<Q, 2>, y_acc: Global<Q, 2>, scale: f32,
) {
    let r = block::id_x() * 64;
    let s64 = Smem::<Q, 64, 64>::ring(1);
    let s128 = Smem::<Q, 64, 128>::ring(1);
    let s256 = Smem::<Q, 64, 256>::ring(1);
    s64.at(0).store((x.load::<Tile<f32, 64, 64>>([r, 0]) * scale).cast::<Q>());
    tma::store(y64, [r, 0], s64.at(0));
    s128.at(0).store((x.load::<Tile<f32, 64, 128>>([r, 0]) * scale).cast::<Q>());
    tma::store(y128, [r, 0], s128.at(0));
    s256.at(0).store((x.load::<Tile<f32, 64, 256>>([r, 0]) * scale).cast::<Q>());
    tma::store(y256, [r, 0], s256.at(0).cols(0, 128));
    tma::store(y256, [r, 128], s256.at(0).cols(128, 128));
    let sa = Smem::<bf16, 64, 64>::ring(1);
    let sb = Smem::<bf16, 64, 64>::ring(1);
    sa.at(0).store(x.load::<Tile<f32, 64, 64>>([r, 0]).cast::<bf16>());
    sb.at(0).store(eye.load::<Tile<bf16, 64, 64>>([0, 0]));
    let mut acc = Tile::<f32, 64, 64>::zeros();
    mma_sync(acc, sa.at(0), sb.at(0));
    mma_wait(0);
    let sq = Smem::<Q, 64, 64>::ring(1);
    sq.at(0).store((acc * scale).cast::<Q>());
    tma::store(y_acc, [r, 0], sq.at(0));
    tma::store_wait(0);
}

fn fp8_staged_matches_the_host(dev: &Device) {
    use tessera::{F8E4M3, F8E5M2};
    fn run<Q: tessera::Element + Copy>(
        dev: &Device, launch: impl Fn(&Tensor<f32>, &Tensor<bf16>, [&mut Tensor<Q>; 4]), host: impl Fn(f32) -> Q, poison: Q, what: &str,
    ) {
        let bits = |q: Q| -> u8 { bytemuck::cast(q) };
        let m = 100; // two blocks, the second past the rows: TMA clips its stores
        let scale = 37.0;
        let x = random(m * 256, -8.0, 8.0);
        let xd = Tensor::from_host(dev, &x, &[m, 256]).expect("x");
        let eye: Vec<bf16> = (0..64 * 64).map(|i| bf16::from_f32(if i / 64 == i % 64 { 1.0 } else { 0.0 })).collect();
        let eye = Tensor::from_host(dev, &eye, &[64, 64]).expect("eye");
        let mut ys: Vec<Tensor<Q>> = [64, 128, 256, 64].iter().map(|&w| Tensor::full(dev, &[m, w], poison).expect("y")).collect();
        let [a, b, c, d] = &mut ys[..] else { unreachable!() };
        launch(&xd, &eye, [a, b, c, d]);
        for (k, (y, w)) in ys.iter().zip([64, 128, 256, 64]).enumerate() {
            let got = y.to_host().expect("y");
            for i in 0..m {
                for j in 0..w {
                    let v = x[i * 256 + j];
                    let v = if k == 3 { bf16::from_f32(v).to_f32() } else { v };
                    let want = host(v * scale);
                    let g = got[i * w + j];
                    assert_eq!(bits(g), bits(want), "{what}, output {k} (width {w}) at [{i}, {j}]: x·scale = {}", v * scale);
                }
            }
        }
    }
    let poison4 = F8E4M3::from_bits(0x55);
    run(
        dev,
        |x, e, [a, b, c, d]| fp8_staged_f8e4m3::launch(dev, 2, x, e, a, b, c, d, 37.0).expect("launch"),
        F8E4M3::from_f32,
        poison4,
        "e4m3",
    );
    let poison5 = F8E5M2::from_bits(0x55);
    run(
        dev,
        |x, e, [a, b, c, d]| fp8_staged_f8e5m2::launch(dev, 2, x, e, a, b, c, d, 37.0).expect("launch"),
        F8E5M2::from_f32,
        poison5,
        "e5m2",
    );
}

#[test]
fn gpu_fp8_staged_matches_the_host() {
    if let Some(dev) = gpu_or_skip("gpu_fp8_staged_matches_the_host") {
        fp8_staged_matches_the_host(&dev);
    }
}

#[test]
fn interp_fp8_staged_matches_the_host() {
    fp8_staged_matches_the_host(&Device::cpu());
}

/// `y[r, c] = x[r, c + shift]` (zero outside `x`) and, through a store at the shifted origin,
/// `z[r, c + shift] = x[r, c]` (the tile's zeros past `x` included) where that is inside `z`:
/// tiles whose first columns lie before a row's start, on rows shorter than a thread's run.
#[kernel(dtypes(T = [bf16, f32]))]
fn shifted_rows(x: Global<T, 2>, y: Global<T, 2>, z: Global<T, 2>, shift: i32) {
    let t = x.load::<Tile<T, 16, 256>>([0, shift]);
    y.store([0, 0], t);
    z.store([0, shift], x.load::<Tile<T, 16, 256>>([0, 0]));
}

/// The element types `shifted_rows` comes in.
trait Shifted: tessera::Element + Copy {
    fn launch(dev: &Device, x: &Tensor<Self>, y: &mut Tensor<Self>, z: &mut Tensor<Self>, shift: i32);
}

impl Shifted for f32 {
    fn launch(dev: &Device, x: &Tensor<Self>, y: &mut Tensor<Self>, z: &mut Tensor<Self>, shift: i32) {
        shifted_rows_f32::launch(dev, 1, x, y, z, shift).expect("launch");
    }
}

impl Shifted for bf16 {
    fn launch(dev: &Device, x: &Tensor<Self>, y: &mut Tensor<Self>, z: &mut Tensor<Self>, shift: i32) {
        shifted_rows_bf16::launch(dev, 1, x, y, z, shift).expect("launch");
    }
}

fn loads_and_stores_straddling_column_zero(dev: &Device) {
    fn run<T: Shifted>(dev: &Device, to: impl Fn(f32) -> T, back: impl Fn(T) -> f64) {
        for width in [1usize, 2, 3, 5, 7, 8, 9, 13] {
            for shift in [-9i32, -8, -5, -3, -1, 0, 2] {
                let rows = 3;
                let x: Vec<T> = random(rows * width, 0.5, 1.0).into_iter().map(&to).collect();
                let xt = Tensor::from_host(dev, &x, &[rows, width]).unwrap();
                let mut yt = Tensor::full(dev, &[rows, width], to(f32::NAN)).unwrap();
                let mut zt = Tensor::full(dev, &[rows, width], to(f32::NAN)).unwrap();
                T::launch(dev, &xt, &mut yt, &mut zt, shift);
                let (y, z) = (yt.to_host().unwrap(), zt.to_host().unwrap());
                let at = |r: usize, c: i32| (0..width as i32).contains(&c).then(|| back(x[r * width + c as usize]));
                for r in 0..rows {
                    for c in 0..width {
                        let (got_y, got_z) = (back(y[r * width + c]), back(z[r * width + c]));
                        let want_y = at(r, c as i32 + shift).unwrap_or(0.0);
                        assert_eq!(got_y, want_y, "load: width {width}, shift {shift}, [{r}, {c}]");
                        // The stored tile covers z's columns from `shift` on, zeros past x.
                        if c as i32 >= shift {
                            assert_eq!(got_z, at(r, c as i32 - shift).unwrap_or(0.0), "store: width {width}, shift {shift}, [{r}, {c}]");
                        } else {
                            assert!(got_z.is_nan(), "store: width {width}, shift {shift}, [{r}, {c}] written: {got_z}");
                        }
                    }
                }
            }
        }
    }
    run::<f32>(dev, |v| v, f64::from);
    run::<bf16>(dev, bf16::from_f32, |v| v.to_f64());
}

#[test]
fn gpu_loads_and_stores_straddling_column_zero() {
    if let Some(dev) = gpu_or_skip("gpu_loads_and_stores_straddling_column_zero") {
        loads_and_stores_straddling_column_zero(&dev);
    }
}

#[test]
fn interp_loads_and_stores_straddling_column_zero() {
    loads_and_stores_straddling_column_zero(&Device::cpu());
}

/// Funnel shifts: `cur.shift_cols(k, prev)` (the window `k` back along `[prev | cur]`) and
/// `cur.shift_cols(-k, next)` (`k` ahead along `[cur | next]`), at distances inside a lane's
/// run, across lanes, and on a width (48) and an axis (rows) that go through shared memory.
/// `x` `[48, 768]`: three 256-column tiles side by side, three 16-row tiles down.
#[kernel]
fn funnel_shifts(x: Global<f32, 2>, y: Global<f32, 2>) {
    let prev = x.load::<Tile<f32, 16, 256>>([16, 0]);
    let cur = x.load::<Tile<f32, 16, 256>>([16, 256]);
    let next = x.load::<Tile<f32, 16, 256>>([16, 512]);
    y.store([0, 0], cur.shift_cols(3, prev));
    y.store([16, 0], cur.shift_cols(16, prev));
    y.store([32, 0], cur.shift_cols(-5, next));
    y.store([48, 0], cur.shift_cols(-8, next));
    y.store([64, 0], cur.shift_cols(256, prev));
    let p48 = x.load::<Tile<f32, 16, 48>>([16, 208]);
    let c48 = x.load::<Tile<f32, 16, 48>>([16, 256]);
    let n48 = x.load::<Tile<f32, 16, 48>>([16, 304]);
    y.store([80, 0], c48.shift_cols(5, p48));
    y.store([96, 0], c48.shift_cols(-7, n48));
    let above = x.load::<Tile<f32, 16, 256>>([0, 256]);
    let below = x.load::<Tile<f32, 16, 256>>([32, 256]);
    y.store([112, 0], cur.shift_rows(3, above));
    y.store([128, 0], cur.shift_rows(-9, below));
}

fn funnel_shifts_match_the_host(dev: &Device) {
    let x = random(48 * 768, -1.0, 1.0);
    let xt = Tensor::from_host(dev, &x, &[48, 768]).unwrap();
    let mut yt = Tensor::full(dev, &[144, 256], f32::NAN).unwrap();
    funnel_shifts::launch(dev, 1, &xt, &mut yt).unwrap();
    let y = yt.to_host().unwrap();
    // Each output block: its first row in y, its width, and where its element [r, j] lies in x.
    type Src = fn(usize, usize) -> (usize, usize);
    let blocks: [(&str, usize, usize, Src); 9] = [
        ("cols 3", 0, 256, |r, j| (16 + r, 256 + j - 3)),
        ("cols 16", 16, 256, |r, j| (16 + r, 256 + j - 16)),
        ("cols -5", 32, 256, |r, j| (16 + r, 256 + j + 5)),
        ("cols -8", 48, 256, |r, j| (16 + r, 256 + j + 8)),
        ("cols 256", 64, 256, |r, j| (16 + r, j)),
        ("48 wide, cols 5", 80, 48, |r, j| (16 + r, 256 + j - 5)),
        ("48 wide, cols -7", 96, 48, |r, j| (16 + r, 256 + j + 7)),
        ("rows 3", 112, 256, |r, j| (16 + r - 3, 256 + j)),
        ("rows -9", 128, 256, |r, j| (16 + r + 9, 256 + j)),
    ];
    for (what, row0, width, src) in blocks {
        for r in 0..16 {
            for j in 0..width {
                let (sr, sc) = src(r, j);
                assert_eq!(y[(row0 + r) * 256 + j], x[sr * 768 + sc], "{what} at [{r}, {j}]");
            }
        }
    }
}

#[test]
fn gpu_funnel_shifts_match_the_host() {
    if let Some(dev) = gpu_or_skip("gpu_funnel_shifts_match_the_host") {
        funnel_shifts_match_the_host(&dev);
    }
}

#[test]
fn interp_funnel_shifts_match_the_host() {
    funnel_shifts_match_the_host(&Device::cpu());
}

/// A tile and a scalar read from mutable bindings before those are assigned again: `t` and `j`
/// keep the values of that moment (the load of the next chunk goes to `ahead`'s registers).
#[kernel]
fn load_ahead(x: Global<f32, 2>, y: Global<f32, 2>) {
    let mut ahead: Tile<f32, 16, 64> = x.load([0, 0]);
    let mut k = 0;
    for i in 0..x.dim(1) / 64 {
        let t = ahead;
        let j = k;
        ahead = x.load_or([0, (i + 1) * 64], 0.0);
        k = k + 1;
        y.store([0, i * 64], t + j as f32);
    }
}

fn reads_before_assignment(dev: &Device) {
    let (m, n) = (16, 64 * 5);
    let x = random(m * n, -1.0, 1.0);
    let xt = Tensor::from_host(dev, &x, &[m, n]).unwrap();
    let mut y = Tensor::full(dev, &[m, n], f32::NAN).unwrap();
    load_ahead::launch(dev, Grid::from(1), &xt, &mut y).unwrap();
    for (i, (&a, b)) in x.iter().zip(y.to_host().unwrap()).enumerate() {
        let want = a + ((i % n) / 64) as f32;
        assert!(b == want, "element {i}: got {b}, expected {want}");
    }
}

#[test]
fn gpu_reads_before_assignment() {
    if let Some(dev) = gpu_or_skip("gpu_reads_before_assignment") {
        reads_before_assignment(&dev);
    }
}

#[test]
fn interp_reads_before_assignment() {
    reads_before_assignment(&Device::cpu());
}

/// `tile_all`: each block's 16 × 64 tile, 1 where every element is ≥ 0, else 0.
#[kernel]
fn tile_all_blocks(x: Global<f32, 2>, y: Global<f32, 2>) {
    let t: Tile<f32, 16, 64> = x.load([block::id_x() * 16, 0]);
    let mut flag = Tile::<f32, 16, 64>::zeros();
    if tile_all(t) {
        flag = Tile::<f32, 16, 64>::full(1.0);
    }
    y.store([block::id_x() * 16, 0], flag);
}

/// Blocks of values ≥ 0 (zeros and −0 among them) pass; one negative element or one NaN
/// anywhere in a block fails it.
fn tile_all_tests_every_element(dev: &Device) {
    let (blocks, n) = (6, 64);
    let mut x = random(blocks * 16 * n, 0.0, 1.0);
    let spot = random(blocks, 0.0, (16 * n) as f32);
    x[0] = 0.0;
    x[1] = -0.0;
    let at = |b: usize| b * 16 * n + (spot[b] as usize).min(16 * n - 1);
    x[at(1)] = -1e-30;
    x[at(3)] = f32::NAN;
    x[at(4)] = -5.0;
    let xt = Tensor::from_host(dev, &x, &[blocks * 16, n]).unwrap();
    let mut y = Tensor::full(dev, &[blocks * 16, n], f32::NAN).unwrap();
    tile_all_blocks::launch(dev, Grid::from(blocks as u32), &xt, &mut y).unwrap();
    let got = y.to_host().unwrap();
    for b in 0..blocks {
        let want = if [1, 3, 4].contains(&b) { 0.0 } else { 1.0 };
        assert!(got[b * 16 * n..][..16 * n].iter().all(|&v| v == want), "block {b}: expected {want}");
    }
}

#[test]
fn gpu_tile_all_tests_every_element() {
    if let Some(dev) = gpu_or_skip("gpu_tile_all_tests_every_element") {
        tile_all_tests_every_element(&dev);
    }
}

#[test]
fn interp_tile_all_tests_every_element() {
    tile_all_tests_every_element(&Device::cpu());
}
