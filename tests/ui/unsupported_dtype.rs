use tessera::kernel;

#[kernel]
fn k(x: Global<f32, 2>) {
    let a = Tile::<f64, 16, 32>::zeros();
    x.store([0, 0], a);
}

fn main() {}
