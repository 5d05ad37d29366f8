//! Whole-kernel snapshots of the PTX of every library kernel (sm_90a; the sm_80 module differs
//! only in `.target`, which `ptx_targets_differ_only_in_target` pins). Review changes with
//! `cargo insta review`, as one reads a diff of generated code.

#[test]
fn ptx_snapshots() {
    for spec in tessera_kernels::all_kernels() {
        insta::assert_snapshot!(format!("{}.sm_90a.ptx", spec.name), spec.variants[0].ptx);
    }
}

#[test]
fn ptx_targets_differ_only_in_target() {
    for spec in tessera_kernels::all_kernels() {
        // Kernels with pipelines lower them differently per target (TMA and wgmma, or
        // cp.async and mma.sync); the others differ only in `.target`.
        if let [a, b] = spec.variants {
            if !a.ptx.contains("mbarrier") {
                assert_eq!(a.ptx.replace(".target sm_90a", ".target sm_80"), b.ptx, "{}", spec.name);
            }
        }
    }
}
