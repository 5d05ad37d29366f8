use tessera::kernel;

// A funnel shift moves at most the tile's own length: 300 columns back from a 256-column tile
// would reach before the tile shifted in.
#[kernel]
fn k(x: Global<f32, 2>, y: Global<f32, 2>) {
    let cur: Tile<f32, 16, 256> = x.load([0, 256]);
    let prev: Tile<f32, 16, 256> = x.load([0, 0]);
    y.store([0, 0], cur.shift_cols(-300, prev));
}

fn main() {}
