use tessera::kernel;

// `keep_where`'s condition is an f32 tile of the masked tile's shape or one that broadcasts to
// it: a 16×32 condition for a 16×64 tile is an error at the condition.
#[kernel]
fn k(x: Global<f32, 2>, c: Global<f32, 2>, y: Global<f32, 2>) {
    let t: Tile<f32, 16, 64> = x.load([0, 0]);
    let cond: Tile<f32, 16, 32> = c.load([0, 0]);
    y.store([0, 0], t.keep_where(cond, f32::NEG_INFINITY));
}

fn main() {}
