use tessera::kernel;

#[kernel]
fn k(a: Global<f32, 2>) {
    let carries = Smem::<f32, 128, 1>::ring(65);
}

fn main() {}
