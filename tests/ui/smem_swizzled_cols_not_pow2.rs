use tessera::kernel;

// A swizzled ring's columns are a power of two (its rows of 384 bytes would be 128-byte
// panels here); an unswizzled ring takes any multiple of 8.
#[kernel]
fn k(x: Global<f32, 2>, y: Global<f32, 2>) {
    let ok = Smem::<f32, 1, 96>::ring_swizzled(1, 0);
    let bad = Smem::<f32, 64, 96>::ring(1);
    ok.at(0).store(x.load::<Tile<f32, 1, 96>>([0, 0]));
    bad.at(0).store(x.load::<Tile<f32, 64, 96>>([0, 0]));
    y.store([0, 0], ok.at(0).load());
}

fn main() {}
