//! Kernel options that reach the PTX: a conditional `blocks_per_sm` requests its occupancy
//! (`.minnctapersm`) in exactly the variants that meet every condition.

use quote::quote;

#[test]
fn conditional_blocks_per_sm_reaches_only_the_variants_it_names() {
    let attr = quote!(dtypes(T = [bf16, f32]), tune(W = [1024, 2048, 3072]), blocks_per_sm(W >= 2048, W != 3072, T != f32) = 3);
    let item = quote!(
        fn k(x: Global<T, 2>, y: Global<T, 2>) {
            let t = x.load::<Tile<T, 1, W>>([block::id_x(), 0]);
            y.store([block::id_x(), 0], t);
        }
    );
    let kernels = tessera_frontend::compile(attr, item).expect("the kernel compiles");
    assert_eq!(kernels.len(), 6, "two dtypes × three widths");
    let capped: Vec<&str> =
        kernels.iter().filter(|k| k.variants.iter().any(|v| v.ptx.contains(".minnctapersm 3"))).map(|k| k.name.as_str()).collect();
    assert_eq!(capped, ["k_bf16__w2048"]);
}

#[test]
fn plain_blocks_per_sm_reaches_every_variant() {
    let attr = quote!(tune(W = [1024, 2048]), blocks_per_sm = 2);
    let item = quote!(
        fn k(x: Global<f32, 2>) {
            x.store([0, 0], Tile::<f32, 1, W>::zeros());
        }
    );
    let kernels = tessera_frontend::compile(attr, item).expect("the kernel compiles");
    assert_eq!(kernels.len(), 2);
    for k in &kernels {
        assert!(k.variants.iter().all(|v| v.ptx.contains(".minnctapersm 2")), "{} lacks the request", k.name);
    }
}
