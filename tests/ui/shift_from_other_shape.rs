use tessera::kernel;

// A funnel shift takes the elements it shifts in from a tile of the shifted tile's own type:
// a 16×128 tile shifted into a 16×256 one is an error at the tile shifted in.
#[kernel]
fn k(x: Global<f32, 2>, y: Global<f32, 2>) {
    let cur: Tile<f32, 16, 256> = x.load([0, 256]);
    let prev: Tile<f32, 16, 128> = x.load([0, 128]);
    y.store([0, 0], cur.shift_cols(3, prev));
}

fn main() {}
