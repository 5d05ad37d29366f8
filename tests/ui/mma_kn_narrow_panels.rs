use tessera::kernel;

// A K×N `b` in 32-byte panels: wgmma's N-major operands take 128- or 64-byte ones.
#[kernel]
fn k(a: Global<bf16, 2>, c: Global<f32, 2>) {
    let sa = Smem::<bf16, 64, 64>::ring(2);
    let sb = Smem::<bf16, 64, 64>::ring_swizzled(2, 32);
    let mut acc = Tile::<f32, 64, 64>::zeros();
    mma_sync_kn(acc, sa.at(0), sb.at(0));
    c.store([0, 0], acc);
}

fn main() {}
