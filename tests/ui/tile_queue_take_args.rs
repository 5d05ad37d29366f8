use tessera::kernel;

#[kernel(warpgroups = 2)]
fn k(counter: Global<i32, 1>, n: i32) {
    let queue = TileQueue::<2>::new(counter, 1);
    if warpgroup::id() == 0 {
        for t in queue.fetch(n) {}
    } else {
        for t in queue.take(n) {}
    }
}

fn main() {}
