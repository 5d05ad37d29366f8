use tessera::{device, kernel};

#[device]
fn add3(a: Tile<f32, 16, 64>, b: Tile<f32, 16, 64>, c: Tile<f32, 16, 64>) -> Tile<f32, 16, 64> {
    a + b + c
}

#[kernel]
fn k(x: Global<f32, 2>) {
    let a: Tile<f32, 16, 64> = x.load([0, 0]);
    x.store([0, 0], tile_scan::<add3>(a, 1, 0.0));
}

fn main() {}
