use tessera::kernel;

#[kernel]
fn k(x: Global<f32, 2>, g: Global<bf16, 2>) {
    let t: Tile<f32, 16, 64> = x.load([0, 0]);
    g.atomic_max([0, 0], t);
}

fn main() {}
