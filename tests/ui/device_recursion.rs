use tessera::{device, kernel};

#[device]
fn halve(s: Tile<f32, 16, 64>) -> Tile<f32, 16, 64> {
    halve(s * 0.5)
}

#[kernel]
fn k(x: Global<f32, 2>) {
    let s: Tile<f32, 16, 64> = x.load([0, 0]);
    x.store([0, 0], halve(s));
}

fn main() {}
