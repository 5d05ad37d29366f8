use tessera::kernel;

#[kernel]
fn double(x: Global<f32, 2>) {
    let s: Tile<f32, 16, 64> = x.load([0, 0]);
    x.store([0, 0], s * 2.0);
}

#[kernel]
fn k(x: Global<f32, 2>) {
    double(x);
}

fn main() {}
