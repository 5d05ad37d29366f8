use tessera::device;

#[device]
fn scale(s: Tile<f32, 16, 64>, by: f32) -> Tile<f32, 16, 64> {
    s * by
}

fn main() {
    scale(1.0f32, 2.0f32);
}
