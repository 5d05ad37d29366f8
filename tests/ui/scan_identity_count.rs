use tessera::{device, kernel};

#[device]
fn linear(a1: Tile<f32, 16, 64>, b1: Tile<f32, 16, 64>, a2: Tile<f32, 16, 64>, b2: Tile<f32, 16, 64>) -> (Tile<f32, 16, 64>, Tile<f32, 16, 64>) {
    (a1 * a2, a2 * b1 + b2)
}

#[kernel]
fn k(x: Global<f32, 2>) {
    let a: Tile<f32, 16, 64> = x.load([0, 0]);
    let (p, h) = tile_scan::<linear>((a, a), 1, 0.0);
    x.store([0, 0], h);
}

fn main() {}
