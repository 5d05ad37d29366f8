use tessera::{device, kernel};

/// Applies `f` to a 16-row tile and its row.
#[device]
fn each_rows<const N: usize>(x: Global<f32, 2>, f: impl Fn(Tile<f32, 16, N>, i32) -> Tile<f32, 16, N>) {
    let r = block::id_x() * 16;
    let t: Tile<f32, 16, N> = x.load([r, 0]);
    x.store([r, 0], f(t, r));
}

#[kernel]
fn k(x: Global<f32, 2>) {
    each_rows::<64>(x, |t| t * 2.0);
}

fn main() {}
