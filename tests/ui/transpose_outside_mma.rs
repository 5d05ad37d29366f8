use tessera::kernel;

// `.t()` is an MMA operand, not a value.
#[kernel]
fn k(c: Global<f32, 2>) {
    let sv = Smem::<bf16, 64, 64>::ring(2);
    let v = sv.at(0).t();
    let mut acc = Tile::<f32, 64, 64>::zeros();
    mma_sync_kn(acc, v, sv.at(0));
    c.store([0, 0], acc);
}

fn main() {}
