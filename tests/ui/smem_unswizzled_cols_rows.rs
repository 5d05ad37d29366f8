use tessera::kernel;

// A column run of an unswizzled shared view is taken from one row of it (`.rows(r, 1)`):
// the error names what is expected and the view's shape.
#[kernel(warpgroups = 1, targets(sm_90a))]
fn k(a: Global<f32, 2>, c: Global<f32, 2>) {
    let sa = Smem::<f32, 2, 2048>::ring_swizzled(1, 0);
    sa.at(0).cols(0, 1024).store(a.load::<Tile<f32, 2, 1024>>([0, 0]));
    c.store([0, 0], sa.at(0).rows(0, 1).cols(0, 1024).load());
}

fn main() {}
