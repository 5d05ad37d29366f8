use tessera::kernel;

// A type parameter is compared with `==` or `!=`, never ordered.
#[kernel(dtypes(T = [bf16, f32]), tune(W = [1024, 2048]), blocks_per_sm(W >= 2048, T < f32) = 3)]
fn k(x: Global<T, 2>) {
    x.store([0, 0], Tile::<T, 1, W>::zeros());
}

fn main() {}
