use tessera::kernel;

// A register A operand must be cast to the operands' 16-bit type first.
#[kernel]
fn k(c: Global<f32, 2>) {
    let sv = Smem::<bf16, 64, 64>::ring(2);
    let p = Tile::<f32, 64, 64>::full(1.0);
    let mut acc = Tile::<f32, 64, 64>::zeros();
    mma_sync_kn(acc, p, sv.at(0));
    c.store([0, 0], acc);
}

fn main() {}
