use tessera::{device, kernel};

/// Adds an 8-row tile to a 16-row one: a mistake found only when it is called.
#[device]
fn add_half<const N: usize>(s: Tile<f32, 16, N>) -> Tile<f32, 16, N> {
    let t = Tile::<f32, 8, N>::zeros();
    s + t
}

#[kernel]
fn k(x: Global<f32, 2>) {
    let s: Tile<f32, 16, 64> = x.load([0, 0]);
    x.store([0, 0], add_half(s));
}

fn main() {}
