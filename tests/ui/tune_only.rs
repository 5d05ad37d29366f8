use tessera::kernel;

// `only(...)` names a knob `tune` does not have.
#[kernel(tune(BN = [128, 64], D = [64, 256], only(D < 256 || BM == 64)))]
fn unknown(x: Global<f32, 2>) {}

// A condition that holds for no combination.
#[kernel(tune(BN = [128, 64], only(BN > 128)))]
fn none_left(x: Global<f32, 2>) {}

// Not a condition on integers.
#[kernel(tune(BN = [128, 64], only(BN.max(2) > 1)))]
fn method(x: Global<f32, 2>) {}

fn main() {}
