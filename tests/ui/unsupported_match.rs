use tessera::kernel;

#[kernel]
fn k(x: Global<f32, 2>, n: i32) {
    match n {
        0 => {}
        _ => {}
    }
}

fn main() {}
