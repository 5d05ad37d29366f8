use tessera::kernel;

// Fragment order is flat bytes: a swizzled view would scatter them.
#[kernel(targets(sm_90a))]
fn k(a: Global<bf16, 2>, c: Global<f32, 2>) {
    let sa = Smem::<bf16, 64, 64>::ring(1);
    let frag = Smem::<f32, 64, 32>::ring(1);
    sa.at(0).store(a.load::<Tile<bf16, 64, 64>>([0, 0]));
    let mut acc = Tile::<f32, 64, 32>::zeros();
    mma_sync(acc, sa.at(0), sa.at(0).rows(0, 32));
    mma_wait(0);
    frag.at(0).store_fragments(acc);
    tma::reduce_add_flat(c, [0, 0], frag.at(0));
    tma::store_wait(0);
}

fn main() {}
