use tessera::kernel;

#[kernel]
fn k(flags: Global<i32, 1>, out: Global<f32, 1>) {
    let mut j = 3;
    while flags.wait_nonzero([j]) == 1 {
        j = j - 1;
    }
    out.store([0], Tile::<f32, 1, 1>::full(1.0));
}

fn main() {}
