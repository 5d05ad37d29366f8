use tessera::kernel;

// A swizzled ring's views take whole 8-row atoms; an unswizzled one's any number of rows.
#[kernel]
fn k(a: Global<bf16, 2>, y: Global<bf16, 2>) {
    let flat = Smem::<bf16, 64, 8>::ring_swizzled(1, 0);
    let swizzled = Smem::<bf16, 64, 64>::ring(1);
    let one: Tile<bf16, 1, 8> = flat.at(0).rows(5, 1).load();
    let bad: Tile<bf16, 1, 64> = swizzled.at(0).rows(5, 1).load();
    y.store([0, 0], one);
    y.store([1, 0], bad);
}

fn main() {}
