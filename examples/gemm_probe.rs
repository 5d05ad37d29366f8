//! Experiments on the GEMM's schedule, timed on the device beside the library kernel.
//!
//! `gemm_pingpong`: each consumer warpgroup owns whole 128×128 tiles, fed by its own pipeline;
//! the producer alternates tiles between the two, so one consumer's epilogue runs while the
//! other's MMAs do (the library kernel's two consumers share a tile and finish together).
//!
//! `cargo run --release --example gemm_probe`

use tessera::testing::{time_ms, Uniform};
use tessera::{bf16, kernel, Device, Grid, Tensor};

#[kernel(warpgroups = 3)]
pub fn gemm_pingpong(a: Global<bf16, 2>, b: Global<bf16, 2>, c: Global<bf16, 2>) {
    let sa1 = Smem::<bf16, 128, 64>::ring(3);
    let sb1 = Smem::<bf16, 128, 64>::ring(3);
    let sa2 = Smem::<bf16, 128, 64>::ring(3);
    let sb2 = Smem::<bf16, 128, 64>::ring(3);
    let p1 = Pipeline::<3>::new(1);
    let p2 = Pipeline::<3>::new(1);
    let k_steps = (a.dim(1) + 63) / 64;
    let tiles_m = (c.dim(0) + 127) / 128;
    let tiles_n = (c.dim(1) + 127) / 128;
    let group = 8 * tiles_n;
    if warpgroup::id() == 0 {
        setmaxnreg(40);
        let mut turn = 0;
        for tile in (block::id_x()..tiles_m * tiles_n).step_by(grid::dim_x()) {
            let first = (tile / group) * 8;
            let height = min(tiles_m - first, 8);
            let m0 = (first + (tile % group) % height) * 128;
            let n0 = ((tile % group) / height) * 128;
            if turn == 0 {
                for k in 0..k_steps {
                    let s = p1.acquire();
                    tma::load(sa1.at(s), a, [m0, k * 64], p1);
                    tma::load(sb1.at(s), b, [n0, k * 64], p1);
                    p1.commit(s);
                }
            } else {
                for k in 0..k_steps {
                    let s = p2.acquire();
                    tma::load(sa2.at(s), a, [m0, k * 64], p2);
                    tma::load(sb2.at(s), b, [n0, k * 64], p2);
                    p2.commit(s);
                }
            }
            turn = 1 - turn;
        }
    } else {
        setmaxnreg(232);
        let me = warpgroup::id() - 1;
        let mut acc = Tile::<f32, 128, 128>::zeros();
        let mut turn = 0;
        for tile in (block::id_x()..tiles_m * tiles_n).step_by(grid::dim_x()) {
            if turn == me {
                let first = (tile / group) * 8;
                let height = min(tiles_m - first, 8);
                let m0 = (first + (tile % group) % height) * 128;
                let n0 = ((tile % group) / height) * 128;
                acc = Tile::<f32, 128, 128>::zeros();
                let mut prev = 0;
                if me == 0 {
                    for k in 0..k_steps {
                        let s = p1.wait();
                        mma_sync(acc, sa1.at(s), sb1.at(s));
                        mma_wait(1);
                        if k > 0 {
                            p1.release(prev);
                        }
                        prev = s;
                    }
                    mma_wait(0);
                    p1.release(prev);
                } else {
                    for k in 0..k_steps {
                        let s = p2.wait();
                        mma_sync(acc, sa2.at(s), sb2.at(s));
                        mma_wait(1);
                        if k > 0 {
                            p2.release(prev);
                        }
                        prev = s;
                    }
                    mma_wait(0);
                    p2.release(prev);
                }
                #[unroll]
                for j in 0..4 {
                    c.store([m0, n0 + j * 32], acc.cols(j * 32, 32).cast::<bf16>());
                }
            }
            turn = 1 - turn;
        }
    }
}

fn main() -> Result<(), tessera::Error> {
    let dev = Device::new(0)?;
    let mut rng = Uniform::new();
    for &(m, n, k) in &[(8192usize, 8192usize, 8192usize), (8192, 14336, 4096), (4096, 4096, 4096), (8192, 4096, 14336)] {
        // Random data: constant inputs draw less power and run at higher clocks.
        let a = Tensor::from_host(&dev, &rng.vec(m * k, bf16::from_f32), &[m, k])?;
        let b = Tensor::from_host(&dev, &rng.vec(n * k, bf16::from_f32), &[n, k])?;
        let mut c = Tensor::<bf16>::zeros(&dev, &[m, n])?;
        let mut c2 = Tensor::<bf16>::zeros(&dev, &[m, n])?;
        let flop = 2.0 * (m * n * k) as f64;
        let grid = (Grid::tiles(m, 128) * Grid::tiles(n, 128)).min(dev.sm_count());
        let lib = time_ms(&dev, 3, 10, || tessera_kernels::gemm_tn(&dev, &a, &b, &mut c).expect("gemm"))?;
        let pp = time_ms(&dev, 3, 10, || gemm_pingpong::launch(&dev, grid, &a, &b, &mut c2).expect("pingpong"))?;
        let (x, y) = (c.to_host()?, c2.to_host()?);
        let diff = x.iter().zip(&y).map(|(p, q)| (p.to_f32() - q.to_f32()).abs()).fold(0.0f32, f32::max);
        println!("{m}x{n}x{k}: library {:.0} TFLOP/s, ping-pong {:.0} TFLOP/s, max |dC| {diff}", flop / lib * 1e-9, flop / pp * 1e-9);
    }
    Ok(())
}
