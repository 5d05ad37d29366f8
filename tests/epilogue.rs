//! How the library's epilogues stage their output tiles in shared memory, read in the PTX (no
//! GPU): a 16-bit accumulator tile 64 columns wide goes to its 128-byte-swizzled buffer by
//! `stmatrix.x4` — four per 64×64 chunk, each 8×8 fragment the accumulator's own — not by a
//! 32-bit `st.shared` per element pair with its swizzle computed per address (run 131: +0.7%
//! on attention's 8-block tiles, +0.6% on the 4096³ GEMM). The sm_80 lowering has no
//! `stmatrix` and keeps the per-pair stores.

use tessera_ptx::reflect::Target;

/// The PTX of a library kernel by entry name, for `target`.
fn ptx(name: &str, target: Target) -> &'static str {
    let spec = tessera_kernels::all_kernels().into_iter().find(|s| s.name == name).unwrap_or_else(|| panic!("no kernel {name}"));
    spec.variants.iter().find(|v| v.target == target).unwrap_or_else(|| panic!("{name}: no {target:?} PTX")).ptx()
}

#[test]
fn hopper_epilogues_stage_tiles_by_stmatrix() {
    // (kernel, 64×64 chunks its epilogue code stores)
    for (name, chunks) in [
        ("flash_attention_bf16__d128_stages2_bn160", 2),
        ("flash_attention_varlen_bf16__d128_stages2_bn160", 2),
        ("flash_attention_bf16__d64_stages2_bn192", 1),
        ("flash_attention_bf16__d64_stages4_bn128", 1),
        ("gemm_tn_bf16__bn256_stages4", 4),
        ("gemm_nn_bf16__bn256_stages4", 4),
    ] {
        let text = ptx(name, Target::Sm90a);
        let stm = text.matches("stmatrix.sync.aligned.m8n8.x4.shared.b16").count();
        assert_eq!(stm, 4 * chunks, "{name}: {stm} stmatrix for {chunks} chunks");
        let pair_stores = text.lines().filter(|l| l.contains("st.shared.b32") && l.contains("%r_pack")).count();
        assert_eq!(pair_stores, 0, "{name}: {pair_stores} per-pair shared stores left");
    }
}

#[test]
fn sm80_epilogues_keep_pair_stores() {
    // Every kernel built for sm_80 that stages a tile in shared memory: pair stores, no stmatrix.
    let mut checked = 0;
    for spec in tessera_kernels::all_kernels() {
        for v in spec.variants.iter().filter(|v| v.target == Target::Sm80) {
            assert!(!v.ptx().contains("stmatrix"), "{}: stmatrix in the sm_80 PTX", spec.name);
            checked += usize::from(v.ptx().contains("st.shared.b32"));
        }
    }
    assert!(checked > 0, "no sm_80 kernel stores to shared memory");
}

#[path = "../examples/custom_epilogue.rs"]
#[allow(dead_code)]
mod custom_epilogue;

/// A PTX line's instruction, after its predicate if it has one.
fn instruction(l: &str) -> &str {
    let l = l.trim_start();
    if l.starts_with('@') {
        l.split_once(char::is_whitespace).map_or("", |(_, rest)| rest.trim_start())
    } else {
        l
    }
}

/// How often each of the instructions that move data or multiply occurs in a PTX module.
fn traffic(ptx: &str) -> Vec<(&'static str, usize)> {
    [
        "cp.async.bulk.tensor.3d.global.shared::cta",
        "cp.async.bulk.tensor.3d.shared::cluster.global",
        "st.global",
        "ld.global",
        "stmatrix.sync.aligned",
        "wgmma.mma_async",
    ]
    .into_iter()
    .map(|op| (op, ptx.lines().filter(|l| instruction(l).starts_with(op)).count()))
    .collect()
}

/// A user's epilogue, a device function fused into the library's GEMM mainloop
/// (`examples/custom_epilogue.rs`), adds no pass over C: the kernel stores C exactly as the
/// library's `gemm_tn` does (the same TMA stores from the same `stmatrix` staging, no other
/// global store), loads no more than the library's kernel (its scale row where that loads its
/// bias), and issues the same MMAs.
#[test]
fn a_custom_epilogue_adds_no_store_pass() {
    let ours = sm90(&custom_epilogue::gemm_squared_relu::SPEC);
    let lib = ptx("gemm_tn_bf16__bn256_stages4", Target::Sm90a);
    let (ours, lib) = (traffic(ours), traffic(lib));
    for ((op, n), (_, want)) in ours.iter().zip(&lib) {
        if *op == "ld.global" {
            // gemm_tn's bias (a row per chunk, or a column) in the place of the scale row.
            assert!(n <= want && *n > 0, "{op}: {n} in the custom kernel, {want} in gemm_tn");
        } else {
            assert_eq!(n, want, "{op}: {n} in the custom kernel, {want} in gemm_tn");
        }
    }
    assert!(lib.iter().all(|(op, n)| *n > 0 || *op == "ld.global"), "the counted instructions occur: {lib:?}");
}

#[path = "../examples/epilogue_chain.rs"]
#[allow(dead_code)]
mod epilogue_chain;

/// The sm_90a PTX of a kernel module's only variant.
fn sm90(spec: &tessera::KernelSpec) -> &'static str {
    spec.variants.iter().find(|v| v.target == Target::Sm90a).expect("sm_90a PTX").ptx()
}

/// One chain (bias → GELU → dropout → residual, `examples/epilogue_chain.rs`) fused into the
/// GEMM's and the attention's store loops adds no pass over their outputs: each kernel stores
/// exactly as the library's own (the same TMA stores from the same `stmatrix` staging, the same
/// other global stores: the attention's log-sum-exp and split partials) and issues the same MMAs;
/// it only loads more (the residual's tile beside the bias row).
#[test]
fn an_epilogue_chain_adds_no_store_pass() {
    for (ours, lib) in [
        (sm90(&epilogue_chain::gemm_chain::SPEC), ptx("gemm_tn_bf16__bn256_stages4", Target::Sm90a)),
        (sm90(&epilogue_chain::attention_chain::SPEC), ptx("flash_attention_bf16__d128_stages2_bn128", Target::Sm90a)),
    ] {
        let (ours, lib) = (traffic(ours), traffic(lib));
        for ((op, n), (_, want)) in ours.iter().zip(&lib) {
            if *op == "ld.global" {
                assert!(n >= want, "{op}: {n} in the chained kernel, {want} in the library's");
            } else if *op == "st.global" {
                // No more plain stores (the chain's fixed arguments may let ptxas drop a store
                // of the library's, as its fixed "no log-sum-exp" does).
                assert!(n <= want, "{op}: {n} in the chained kernel, {want} in the library's");
            } else {
                assert_eq!(n, want, "{op}: {n} in the chained kernel, {want} in the library's");
            }
        }
    }
}
