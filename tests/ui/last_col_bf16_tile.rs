use tessera::kernel;

#[kernel]
fn k(x: Global<bf16, 2>, y: Global<bf16, 2>) {
    let t: Tile<bf16, 16, 64> = x.load([0, 0]);
    y.store([0, 0], t.last_col());
}

fn main() {}
