use tessera::kernel;

// A register tile's columns are a power of two or a multiple of 8 (runs of 8 columns).
#[kernel]
fn k(x: Global<f32, 2>, y: Global<f32, 2>) {
    let t = x.load::<Tile<f32, 1, 300>>([0, 0]);
    y.store([0, 0], t);
}

fn main() {}
