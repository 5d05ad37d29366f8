use tessera::kernel;

// fp8 shared views are read by `mma_sync` and TMA stores, not loaded into registers.
#[kernel]
fn k(a: Global<f8e4m3, 2>, c: Global<f8e4m3, 2>) {
    let sa = Smem::<f8e4m3, 64, 128>::ring(2);
    let t = sa.at(0).load();
    c.store([0, 0], t);
}

fn main() {}
