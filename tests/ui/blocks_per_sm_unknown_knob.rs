use tessera::kernel;

// The condition names `N`, which is not one of `tune`'s knobs.
#[kernel(dtypes(T = [bf16, f32]), tune(W = [1024, 2048]), blocks_per_sm(N >= 2048, T != f32) = 3)]
fn k(x: Global<T, 2>) {
    x.store([0, 0], Tile::<T, 1, W>::zeros());
}

fn main() {}
