use tessera::device;

#[device]
fn sum_all(v: Vec<f32>) -> f32 {
    0.0
}

fn main() {}
