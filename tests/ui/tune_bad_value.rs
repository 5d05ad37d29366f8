use tessera::kernel;

#[kernel(tune(BN = [128, big]))]
fn k(x: Global<f32, 2>) {}

#[kernel(tune(BN = [128, 128]))]
fn twice(x: Global<f32, 2>) {}

#[kernel(tune(BN = []))]
fn empty(x: Global<f32, 2>) {}

fn main() {}
