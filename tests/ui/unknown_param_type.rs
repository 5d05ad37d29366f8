use tessera::kernel;

#[kernel]
fn k(x: Vec<f32>) {}

fn main() {}
