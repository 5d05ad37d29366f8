use tessera::kernel;

// Fragments are an f32 accumulator's.
#[kernel(targets(sm_90a))]
fn k(x: Global<bf16, 2>, y: Global<bf16, 2>) {
    y.store([0, 0], x.load_fragments::<Tile<bf16, 64, 64>>([0, 0]));
}

fn main() {}
