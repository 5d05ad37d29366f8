use tessera::{device, kernel};

#[device]
fn add(a: Tile<f32, 16, 64>, b: Tile<f32, 16, 64>) -> Tile<f32, 16, 64> {
    a + b
}

#[kernel]
fn k(x: Global<f32, 2>) {
    let t: Tile<f32, 16, 64> = x.load([0, 0]);
    x.store([0, 0], tile_scan_reverse::<add>(t, 2, 0.0));
}

fn main() {}
