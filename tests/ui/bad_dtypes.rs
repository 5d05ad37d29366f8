use tessera::kernel;

#[kernel(dtypes(T = [f64]))]
fn k(a: Global<T, 2>) {}

fn main() {}
