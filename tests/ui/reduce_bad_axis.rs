use tessera::kernel;

#[kernel]
fn k(x: Global<f32, 2>, y: Global<f32, 1>) {
    let a: Tile<f32, 16, 32> = x.load([0, 0]);
    y.store([0], a.sum(2));
}

fn main() {}
