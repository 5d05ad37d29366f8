use tessera::kernel;

#[kernel(dtypes(T = [bf16], Q = [f8e4m3], R = [f32]))]
fn k(a: Global<T, 2>, b: Global<Q, 2>, c: Global<R, 2>) {}

fn main() {}
