use tessera::kernel;

#[kernel]
fn k(x: Global<f32, 2>) {
    let f = |v: f32| v * 2.0;
}

fn main() {}
