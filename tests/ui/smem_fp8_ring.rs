use tessera::kernel;

#[kernel]
fn k(a: Global<f8e4m3, 2>) {
    let sa = Smem::<f8e4m3, 64, 128>::ring_swizzled(2, 128);
}

fn main() {}
