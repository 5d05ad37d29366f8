use tessera::{device, kernel};

/// Applies `f` to a 16-row tile.
#[device]
fn each_rows<const N: usize>(x: Global<f32, 2>, f: impl Fn(Tile<f32, 16, N>) -> Tile<f32, 16, N>) {
    let t: Tile<f32, 16, N> = x.load([0, 0]);
    x.store([0, 0], f(t));
}

#[kernel]
fn k(x: Global<f32, 2>, y: Global<f32, 2>) {
    each_rows::<64>(x, y);
}

fn main() {}
