use tessera::kernel;

// A shared view's `cols` takes whole column panels (64 bf16 columns under a 128-byte swizzle):
// the error names the panel width and the view's columns.
#[kernel(warpgroups = 2, targets(sm_90a))]
fn k(a: Global<bf16, 2>, c: Global<f32, 2>) {
    let sa = Smem::<bf16, 64, 64>::ring(1);
    let sb = Smem::<bf16, 64, 128>::ring(1);
    let mut acc = Tile::<f32, 64, 32>::zeros();
    mma_sync_kn(acc, sa.at(0), sb.at(0).cols(32, 32));
    mma_wait(0);
    c.store([0, 0], acc);
}

fn main() {}
