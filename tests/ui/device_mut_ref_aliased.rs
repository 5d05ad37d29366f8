use tessera::{device, kernel};

#[device]
fn accumulate(acc: &mut Tile<f32, 16, 64>, s: Tile<f32, 16, 64>) {
    *acc = *acc + s;
}

#[kernel]
fn k(x: Global<f32, 2>) {
    let mut s: Tile<f32, 16, 64> = x.load([0, 0]);
    accumulate(&mut s, s);
    x.store([0, 0], s);
}

fn main() {}
