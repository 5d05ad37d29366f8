use tessera::kernel;

// fp8 shared views are filled by TMA and read by `mma_sync`, not loaded into registers.
#[kernel]
fn k(a: Global<f8e4m3, 2>, c: Global<f8e4m3, 2>) {
    let sa = Smem::<f8e4m3, 64, 128>::ring(2);
    let t = sa.at(0).load();
    c.store([0, 0], t);
}

fn main() {}
