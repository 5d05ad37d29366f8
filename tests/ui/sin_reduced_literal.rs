use tessera::kernel;

#[kernel]
fn k(x: Global<f32, 2>, y: Global<f32, 2>) {
    let t = x.load::<Tile<f32, 16, 64>>([0, 0]);
    y.store([0, 0], t * cos_reduced(-4.0));
}

fn main() {}
