use tessera::kernel;

// Named barriers are 0 to 6 (the others belong to the lowering).
#[kernel(warpgroups = 2)]
fn k(y: Global<f32, 2>) {
    barrier::sync(9, 2);
    y.store([0, 0], Tile::<f32, 1, 8>::zeros());
}

fn main() {}
