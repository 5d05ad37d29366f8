use tessera::kernel;

#[kernel(warpgroups = 2)]
fn k(x: Global<f32, 2>, n: i32) {
    let queue = TileQueue::<2>::new(x, 1);
    if warpgroup::id() == 0 {
        for t in queue.fetch(n) {}
    } else {
        for t in queue.take() {}
    }
}

fn main() {}
