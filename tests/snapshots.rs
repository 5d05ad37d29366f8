//! Whole-kernel snapshots of the PTX of every library kernel (sm_90a; the sm_80 module differs
//! only in `.target`, which `ptx_targets_differ_only_in_target` pins). Review changes with
//! `cargo insta review`, as one reads a diff of generated code.
//!
//! One element type per kernel: the bf16 variant where there is one (its f16 and f32 siblings
//! come from the same TIR and differ only in conversions, which the GPU tests check), so that
//! the snapshots stay a size one can review and carry to the GPU machine. Of a `tune(...)`
//! kernel only the default variant (the first of its `VARIANTS`) is snapshotted; the ptxas
//! test and the GPU tests cover the others.

/// Whether `name` is the snapshot of its family: not an f16 or f32 variant of a kernel that
/// also has a bf16 one.
fn snapshotted(name: &str, all: &[&str]) -> bool {
    match name.strip_suffix("_f16").or_else(|| name.strip_suffix("_f32")) {
        Some(stem) => !all.contains(&format!("{stem}_bf16").as_str()),
        None => true,
    }
}

#[test]
fn ptx_snapshots() {
    let all = tessera_kernels::all_kernels();
    // A variant's entry name is `<kernel>__<knobs>`.
    let base = |name: &'static str| name.split("__").next().unwrap_or(name);
    let names: Vec<&str> = all.iter().map(|s| base(s.name)).collect();
    let mut seen = std::collections::HashSet::new();
    for spec in all.iter().filter(|s| seen.insert(base(s.name)) && snapshotted(base(s.name), &names)) {
        insta::assert_snapshot!(format!("{}.sm_90a.ptx", spec.name), spec.variants[0].ptx());
    }
}

#[test]
fn ptx_targets_differ_only_in_target() {
    for spec in tessera_kernels::all_kernels() {
        // Kernels with pipelines lower them differently per target (TMA and wgmma, or
        // cp.async and mma.sync); the others differ only in `.target`.
        if let [a, b] = spec.variants {
            if !a.ptx().contains("mbarrier") {
                assert_eq!(a.ptx().replace(".target sm_90a", ".target sm_80"), b.ptx(), "{}", spec.name);
            }
        }
    }
}
