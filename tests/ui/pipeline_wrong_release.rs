use tessera::kernel;

/// Releases a stage of one pipeline to another.
#[kernel(warpgroups = 2, targets(sm_90a))]
fn k(a: Global<bf16, 2>, y: Global<f32, 2>) {
    let sa = Smem::<bf16, 64, 64>::ring(2);
    let sb = Smem::<bf16, 64, 64>::ring(2);
    let pa = Pipeline::<2>::new(1);
    let pb = Pipeline::<2>::new(1);
    if warpgroup::id() == 0 {
        let s = pa.acquire();
        tma::load(sa.at(s), a, [0, 0], pa);
        pa.commit(s);
        let s = pb.acquire();
        tma::load(sb.at(s), a, [64, 0], pb);
        pb.commit(s);
    } else {
        let s = pa.wait();
        let mut t = Tile::<f32, 64, 64>::zeros();
        mma_sync(t, sa.at(s), sa.at(s));
        mma_wait(0);
        pb.release(s);
        y.store([0, 0], t);
    }
}

fn main() {}
