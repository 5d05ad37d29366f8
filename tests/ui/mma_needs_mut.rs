use tessera::kernel;

#[kernel]
fn k(a: Global<bf16, 2>, c: Global<f32, 2>) {
    let sa = Smem::<bf16, 64, 64>::ring(2);
    let sb = Smem::<bf16, 128, 64>::ring(2);
    let acc = Tile::<f32, 64, 128>::zeros();
    mma_sync(acc, sa.at(0), sb.at(0));
    c.store([0, 0], acc);
}

fn main() {}
