use tessera::{device, kernel};

#[device]
fn add(a: Tile<f32, 16, 64>, b: Tile<f32, 16, 64>) -> Tile<f32, 16, 64> {
    a + b
}

#[kernel]
fn k(x: Global<bf16, 2>) {
    let t: Tile<bf16, 16, 64> = x.load([0, 0]);
    x.store([0, 0], tile_scan::<add>(t, 1, 0.0).cast::<bf16>());
}

fn main() {}
