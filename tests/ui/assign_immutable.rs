use tessera::kernel;

#[kernel]
fn k(x: Global<f32, 2>) {
    let acc = Tile::<f32, 16, 16>::zeros();
    acc = Tile::<f32, 16, 16>::zeros();
    x.store([0, 0], acc);
}

fn main() {}
