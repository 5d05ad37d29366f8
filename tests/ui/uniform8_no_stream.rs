use tessera::kernel;

// `uniform8` draws a stream of its own (attention's dropout: one per batch·head); leaving it
// out is an error at the constructor, not a wrong stream.
#[kernel]
fn k(x: Global<f32, 2>, seed: i32) {
    x.store([0, 0], Tile::<f32, 16, 16>::uniform8(seed, 0, 0, [0, 0]));
}

fn main() {}
