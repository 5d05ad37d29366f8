use tessera::kernel;

// A flat bulk copy reads contiguous bytes: a view's column panels are not.
#[kernel(targets(sm_90a))]
fn k(x: Global<f32, 2>, c: Global<f32, 2>) {
    let s = Smem::<f32, 64, 64>::ring(1);
    s.at(0).store(x.load::<Tile<f32, 64, 64>>([0, 0]));
    tma::reduce_add_flat(c, [0, 0], s.at(0).cols(32, 32));
    tma::store_wait(0);
}

fn main() {}
