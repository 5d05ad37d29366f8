use tessera::kernel;

// fp8 wgmma reads both operands K-major: no K×N `b`.
#[kernel]
fn k(c: Global<f32, 2>) {
    let sa = Smem::<f8e4m3, 64, 128>::ring(2);
    let sb = Smem::<f8e4m3, 128, 64>::ring(2);
    let mut acc = Tile::<f32, 64, 64>::zeros();
    mma_sync_kn(acc, sa.at(0), sb.at(0));
    c.store([0, 0], acc);
}

fn main() {}
