use tessera::kernel;

/// Reads a stage after handing it back to the producer.
#[kernel(warpgroups = 2, targets(sm_90a))]
fn k(a: Global<bf16, 2>, y: Global<f32, 2>) {
    let sa = Smem::<bf16, 64, 64>::ring(2);
    let pipe = Pipeline::<2>::new(1);
    if warpgroup::id() == 0 {
        let s = pipe.acquire();
        tma::load(sa.at(s), a, [0, 0], pipe);
        pipe.commit(s);
    } else {
        let s = pipe.wait();
        pipe.release(s);
        let mut t = Tile::<f32, 64, 64>::zeros();
        mma_sync(t, sa.at(s), sa.at(s));
        mma_wait(0);
        y.store([0, 0], t);
    }
}

fn main() {}
