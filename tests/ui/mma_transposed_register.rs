use tessera::kernel;

// Only a shared view can be taken transposed as an MMA's A (wgmma reads an M-major A from
// shared memory, never from registers).
#[kernel]
fn k(c: Global<f32, 2>) {
    let sv = Smem::<bf16, 64, 64>::ring(2);
    let p = Tile::<bf16, 64, 64>::full(1.0);
    let mut acc = Tile::<f32, 64, 64>::zeros();
    mma_sync_kn(acc, p.t(), sv.at(0));
    c.store([0, 0], acc);
}

fn main() {}
