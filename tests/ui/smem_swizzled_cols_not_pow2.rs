use tessera::kernel;

// A swizzled ring's columns are a power of two or whole panels of its span (rows of 384
// bytes are three 128-byte ones); rows of 192 bytes are not 128-byte panels. An unswizzled
// ring takes any multiple of 8.
#[kernel]
fn k(x: Global<f32, 2>, y: Global<f32, 2>) {
    let ok = Smem::<f32, 1, 96>::ring_swizzled(1, 0);
    let panels = Smem::<f32, 64, 96>::ring(1);
    let bad = Smem::<f32, 64, 48>::ring_swizzled(1, 128);
    ok.at(0).store(x.load::<Tile<f32, 1, 96>>([0, 0]));
    panels.at(0).store(x.load::<Tile<f32, 64, 96>>([0, 0]));
    bad.at(0).store(x.load::<Tile<f32, 64, 48>>([0, 0]));
    y.store([0, 0], ok.at(0).load());
}

fn main() {}
