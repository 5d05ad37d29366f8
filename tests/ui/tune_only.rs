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

// A dtype the kernel's `dtypes` does not list.
#[kernel(dtypes(T = [bf16, f32]), tune(C = [128, 1024], only(T == f16 && C == 128)))]
fn unlisted_type(x: Global<T, 2>) {}

// No combination left for one of the types.
#[kernel(dtypes(T = [bf16, f32]), tune(C = [128, 1024], only(T == f32 && C == 128)))]
fn none_for_a_type(x: Global<T, 2>) {}

fn main() {}
