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

#[test]
fn several_blocks_per_sm_requests_take_the_first_that_holds() {
    let attr = quote!(tune(U = [0, 2, 4]), blocks_per_sm(U == 4) = 2, blocks_per_sm(U >= 2) = 4, blocks_per_sm = 8);
    let item = quote!(
        fn k(x: Global<f32, 2>) {
            x.store([0, 0], Tile::<f32, 1, 64>::zeros());
        }
    );
    let kernels = tessera_frontend::compile(attr, item).expect("the kernel compiles");
    let request = |name: &str| {
        let k = kernels.iter().find(|k| k.name == name).expect("the variant");
        k.variants[0].ptx.lines().find_map(|l| l.trim().strip_prefix(".minnctapersm")?.trim().parse::<u32>().ok())
    };
    assert_eq!([request("k__u0"), request("k__u2"), request("k__u4")], [Some(8), Some(4), Some(2)]);
}

/// A knob's guard in front of a run-time test folds where the knob decides it (`false && x`,
/// `true || x`): no branch is left in that variant, and the run-time test stays in the other.
#[test]
fn a_knobs_guard_folds_the_branch_it_decides() {
    let attr = quote!(tune(K = [0, 4]));
    let item = quote!(
        fn k(x: Global<f32, 2>, n: i32) {
            let mut t = Tile::<f32, 1, 64>::zeros();
            if K == 0 && n > 3 || K > 0 && 2 < K {
                t = t + 1.0;
            }
            if K > 0 && n > 5 {
                t = t + 2.0;
            }
            x.store([0, 0], t);
        }
    );
    let kernels = tessera_frontend::compile(attr, item).expect("the kernel compiles");
    let ptx = |name: &str| kernels.iter().find(|k| k.name == name).map(|k| k.variants[0].ptx.clone()).expect("the variant");
    let branches = |p: &str| p.lines().filter(|l| l.contains("bra.uni") && l.contains("else")).count();
    // K = 0: the first guard stays a run-time test, the second folds away with its body.
    assert_eq!(branches(&ptx("k__k0")), 1, "{}", ptx("k__k0"));
    // K = 4: the first guard folds true (its body, unguarded), the second keeps `n > 5`.
    assert_eq!(branches(&ptx("k__k4")), 1, "{}", ptx("k__k4"));
    // The folded-away body's constant (2.0) is in the variant that keeps it only.
    assert!(!ptx("k__k0").contains("0f40000000") && ptx("k__k4").contains("0f40000000"));
}

/// `f32::consts` the language knows fold to their f32 values (TAU as `0f40C90FDB`); an unknown
/// one is an error that lists them.
#[test]
fn f32_consts_fold_and_unknown_ones_are_named() {
    let item = quote!(
        fn k(x: Global<f32, 2>) {
            x.store([0, 0], Tile::<f32, 1, 64>::full(f32::consts::TAU));
        }
    );
    let kernels = tessera_frontend::compile(quote!(), item).expect("the kernel compiles");
    assert!(kernels[0].variants[0].ptx.contains("0f40C90FDB"), "{}", kernels[0].variants[0].ptx);
    let item = quote!(
        fn k(x: Global<f32, 2>) {
            x.store([0, 0], Tile::<f32, 1, 64>::full(f32::consts::PHI));
        }
    );
    let Err(err) = tessera_frontend::compile(quote!(), item) else { panic!("an unknown constant compiled") };
    let text = format!("{err:?}");
    assert!(text.contains("unknown constant `f32::consts::PHI`") && text.contains("TAU"), "{text}");
}
