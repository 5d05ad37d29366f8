use tessera::kernel;

// A ring of 8-byte rows is fine in shared memory (a thread's carries, say), but TMA copies rows of
// 16 bytes or more: the error is at the copy.
#[kernel]
fn k(a: Global<f32, 2>) {
    let sa = Smem::<f32, 64, 2>::ring(2);
    let pipe = Pipeline::<2>::new(1);
    let s = pipe.acquire();
    tma::load(sa.at(s), a, [0, 0], pipe);
    pipe.commit(s);
}

fn main() {}
