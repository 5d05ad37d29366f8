use tessera::kernel;

#[kernel]
fn k(a: Global<f16, 2>) {
    let sa = Smem::<bf16, 64, 64>::ring(2);
    let pipe = Pipeline::<2>::new(1);
    let s = pipe.acquire();
    tma::load(sa.at(s), a, [0, 0], pipe);
    pipe.commit(s);
}

fn main() {}
