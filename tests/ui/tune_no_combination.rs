use tessera::kernel;

// Every combination fails (a tile's columns must be a power of two or a multiple of 8): the
// error is at `tune`, listing why each was dropped, with the first combination's error at its
// token.
#[kernel(tune(W = [36, 100]))]
fn k(x: Global<f32, 2>, y: Global<f32, 2>) {
    let t: Tile<f32, 16, W> = x.load([0, 0]);
    y.store([0, 0], t);
}

fn main() {}
