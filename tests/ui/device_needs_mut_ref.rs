use tessera::{device, kernel};

#[device]
fn bump(s: &mut Tile<f32, 16, 64>) {
    *s = *s + 1.0;
}

#[kernel]
fn k(x: Global<f32, 2>) {
    let mut s: Tile<f32, 16, 64> = x.load([0, 0]);
    bump(s);
    x.store([0, 0], s);
}

fn main() {}
