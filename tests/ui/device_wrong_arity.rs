use tessera::{device, kernel};

#[device]
fn scale(s: Tile<f32, 16, 64>, by: f32) -> Tile<f32, 16, 64> {
    s * by
}

#[kernel]
fn k(x: Global<f32, 2>) {
    let s: Tile<f32, 16, 64> = x.load([0, 0]);
    x.store([0, 0], scale(s));
}

fn main() {}
