use tessera::device;

/// A function parameter must be `impl Fn(…)` of types the language binds.
#[device]
fn apply(t: Tile<f32, 16, 64>, f: impl FnMut(Tile<f32, 16, 64>) -> Tile<f32, 16, 64>) -> Tile<f32, 16, 64> {
    f(t)
}

fn main() {}
