use tessera::kernel;

#[kernel(warpgroups = 2)]
fn k(x: Global<f32, 2>, y: Global<f32, 2>) {
    let s = block_sum(x.dim(1) as f32);
    let t: Tile<f32, 4, 256> = x.load([0, 0]);
    y.store([0, 0], t * s);
}

fn main() {}
