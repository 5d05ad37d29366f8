use tessera::kernel;

#[kernel]
fn k(out: Global<f32, 1>, n: i32) {
    let mut j = n;
    while j {
        j = j - 1;
    }
    out.store([0], Tile::<f32, 1, 1>::full(1.0));
}

fn main() {}
