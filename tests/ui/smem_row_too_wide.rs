use tessera::kernel;

#[kernel]
fn k(a: Global<bf16, 2>) {
    let sa = Smem::<bf16, 64, 128>::ring_swizzled(2, 64);
}

fn main() {}
