use tessera::{device, kernel};

#[device]
fn ones<const N: usize>(x: f32) -> Tile<f32, 16, N> {
    Tile::<f32, 16, N>::full(x)
}

#[kernel]
fn k(x: Global<f32, 2>) {
    x.store([0, 0], ones(1.0));
}

fn main() {}
