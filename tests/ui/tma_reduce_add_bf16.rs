use tessera::kernel;

// `tma::reduce_add` adds into f32 tensors only: the error names the tensor and its dtype.
#[kernel(targets(sm_90a))]
fn k(x: Global<f32, 2>, sum: Global<bf16, 2>) {
    let ring = Smem::<bf16, 64, 64>::ring(1);
    ring.at(0).store(x.load::<Tile<f32, 64, 64>>([0, 0]).cast::<bf16>());
    tma::reduce_add(sum, [0, 0], ring.at(0));
}

fn main() {}
