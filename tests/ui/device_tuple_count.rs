use tessera::{device, kernel};

#[device]
fn split(s: Tile<f32, 16, 64>) -> (Tile<f32, 16, 64>, Tile<f32, 16, 64>) {
    (s * 2.0, s * 3.0)
}

#[kernel]
fn k(x: Global<f32, 2>) {
    let s: Tile<f32, 16, 64> = x.load([0, 0]);
    let (a, b, c) = split(s);
    x.store([0, 0], a + b + c);
}

fn main() {}
