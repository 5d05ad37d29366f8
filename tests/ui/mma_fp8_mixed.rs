use tessera::kernel;

// An fp8 `a` with a bf16 `b`: both sides are fp8 (e4m3 or e5m2, either way round).
#[kernel]
fn k(c: Global<f32, 2>) {
    let sa = Smem::<f8e4m3, 64, 128>::ring(2);
    let sb = Smem::<bf16, 64, 64>::ring(2);
    let mut acc = Tile::<f32, 64, 64>::zeros();
    mma_sync(acc, sa.at(0), sb.at(0));
    c.store([0, 0], acc);
}

fn main() {}
