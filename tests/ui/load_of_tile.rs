use tessera::kernel;

// `load()` without an index reads a shared view; a register tile is already loaded.
#[kernel]
fn k(y: Global<f32, 2>) {
    let t = Tile::<f32, 64, 64>::zeros();
    y.store([0, 0], t.load());
}

fn main() {}
