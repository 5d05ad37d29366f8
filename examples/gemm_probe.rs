//! Where does the GEMM's time go? Times the library kernel beside a copy whose epilogue is
//! switched off by a run-time flag (so ptxas keeps the MMAs), on the device.
//!
//! `cargo run --release --example gemm_probe`

use tessera::testing::{time_ms, Uniform};
use tessera::{bf16, kernel, Device, Grid, Tensor};

/// The library's GEMM with `if store == 1` around the epilogue.
#[kernel(warpgroups = 3)]
pub fn gemm_probe(a: Global<bf16, 2>, b: Global<bf16, 2>, c: Global<bf16, 2>, store: i32) {
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
            if store == 1 {
                c.store([m0 + row, n0], acc.cast::<bf16>());
            }
        }
    }
}

fn main() -> Result<(), tessera::Error> {
    let dev = Device::new(0)?;
    for &(m, n, k) in &[(8192usize, 8192usize, 8192usize), (8192, 14336, 4096), (4096, 4096, 4096)] {
        // Random data: constant inputs draw less power and run at higher clocks.
        let mut rng = Uniform::new();
        let mut random = |len: usize| rng.vec(len, bf16::from_f32);
        let a = Tensor::from_host(&dev, &random(m * k), &[m, k])?;
        let b = Tensor::from_host(&dev, &random(n * k), &[n, k])?;
        let mut c = Tensor::<bf16>::zeros(&dev, &[m, n])?;
        let grid = (Grid::tiles(m, 128) * Grid::tiles(n, 256)).min(dev.sm_count());
        let flop = 2.0 * (m * n * k) as f64;
        let mut row = format!("{m}x{n}x{k}:");
        for store in [1, 0] {
            let ms = time_ms(&dev, 3, 10, || gemm_probe::launch(&dev, grid, &a, &b, &mut c, store).expect("launch"))?;
            row += &format!("  store={store} {:.0} TFLOP/s", flop / ms * 1e-9);
        }
        println!("{row}");
    }
    Ok(())
}
