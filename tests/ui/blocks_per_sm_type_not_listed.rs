use tessera::kernel;

// `T` never takes `f16` here: the condition could not hold.
#[kernel(dtypes(T = [bf16, f32]), tune(W = [1024, 2048]), blocks_per_sm(T == f16) = 3)]
fn k(x: Global<T, 2>) {
    x.store([0, 0], Tile::<T, 1, W>::zeros());
}

fn main() {}
