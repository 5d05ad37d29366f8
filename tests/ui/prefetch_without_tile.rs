use tessera::kernel;

#[kernel]
fn k(x: Global<f32, 2>, y: Global<f32, 2>) {
    x.prefetch([0, 0]);
    let t: Tile<f32, 16, 64> = x.load([0, 0]);
    y.store([0, 0], t);
}

fn main() {}
