use tessera::kernel;

#[kernel]
fn k(x: Global<f32, 2>, y: Global<f32, 2>) {
    let s = x.get([0, 0]);
    y.store([0, 0], s.first_col());
}

fn main() {}
