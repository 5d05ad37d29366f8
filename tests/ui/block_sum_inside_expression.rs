use tessera::kernel;

// `block_sum` stops every warpgroup until all have arrived: only the whole value of a `let`.
#[kernel(warpgroups = 2)]
fn k(x: Global<f32, 2>, y: Global<f32, 2>) {
    let t: Tile<f32, 4, 256> = x.load([0, warpgroup::id() * 256]);
    y.store([0, 0], t * block_sum(row_sum(t)));
}

fn main() {}
