use tessera::kernel;

#[kernel]
fn k(x: Global<u8, 2>) {}

fn main() {}
