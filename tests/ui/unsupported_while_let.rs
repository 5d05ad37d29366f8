use tessera::kernel;

#[kernel]
fn k(x: Global<f32, 2>, n: i32) {
    while let Some(i) = None {
    }
}

fn main() {}
