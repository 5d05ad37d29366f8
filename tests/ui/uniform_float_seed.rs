use tessera::kernel;

#[kernel]
fn k(x: Global<f32, 2>, seed: f32) {
    x.store([0, 0], Tile::<f32, 16, 16>::uniform(seed, 0, 0, [0, 0]));
}

fn main() {}
