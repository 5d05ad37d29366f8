use tessera::{device, kernel};

#[device]
fn store_twice(x: Global<f32, 2>, s: Tile<f32, 16, 64>) {
    x.store([0, 0], s * 2.0);
}

#[kernel]
fn k(x: Global<f32, 2>) {
    let s: Tile<f32, 16, 64> = x.load([0, 0]);
    let t = store_twice(x, s);
}

fn main() {}
