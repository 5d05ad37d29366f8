use tessera::kernel;

#[kernel(warpgroups = 0)]
fn k(x: Global<f32, 2>) {}

fn main() {}
