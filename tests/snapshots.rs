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

/// The `#[kernel]`s of the library's sources, each with its `dtypes(...)` expanded: the names
/// of the kernel modules they make (`cumsum_bf16`, `axpy_f32`, …).
fn kernels_in_source(dir: &std::path::Path, out: &mut Vec<String>) {
    let mut entries: Vec<_> = std::fs::read_dir(dir).expect("read the library's sources").map(|e| e.expect("entry").path()).collect();
    entries.sort();
    for path in entries {
        if path.is_dir() {
            kernels_in_source(&path, out);
            continue;
        }
        if path.extension().is_none_or(|e| e != "rs") {
            continue;
        }
        let text = std::fs::read_to_string(&path).expect("read a source file");
        let mut rest = text.as_str();
        while let Some(at) = rest.find("#[kernel") {
            // Only an attribute: nothing but indentation before it on its line (not a comment).
            let line_start = rest[..at].rfind('\n').map_or(0, |i| i + 1);
            let code = rest[line_start..at].trim().is_empty();
            rest = &rest[at..];
            if !code {
                rest = &rest[1..];
                continue;
            }
            let fn_at = rest.find("fn ").expect("a #[kernel] attribute before a fn");
            let (attr, after) = rest.split_at(fn_at);
            let name: String = after[3..].chars().take_while(|c| c.is_alphanumeric() || *c == '_').collect();
            // `dtypes(T = [bf16, f16], Q = [f8e4m3])`: one module per choice of each parameter.
            let mut names = vec![name];
            if let Some(d) = attr.find("dtypes(") {
                let lists = &attr[d..];
                let lists = &lists[..lists.find(")").expect("dtypes(...) closes")];
                for list in lists.split('[').skip(1) {
                    let types: Vec<&str> = list[..list.find(']').expect("a dtype list closes")].split(',').map(str::trim).collect();
                    names = names.iter().flat_map(|n| types.iter().map(move |t| format!("{n}_{t}"))).collect();
                }
            }
            out.extend(names);
            rest = &after[3..];
        }
    }
}

/// Every kernel of the library's sources is in `all_kernels()`, so that the ptxas test, these
/// snapshots and the tools check it (a kernel left off the list is checked by none of them).
#[test]
fn every_library_kernel_is_listed() {
    let listed: std::collections::HashSet<&str> =
        tessera_kernels::all_kernels().iter().map(|s| s.name.split("__").next().unwrap_or(s.name)).collect();
    let mut found = Vec::new();
    kernels_in_source(&std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tessera-kernels/src"), &mut found);
    assert!(found.len() > 100, "found only {} kernels in tessera-kernels/src", found.len());
    let missing: Vec<&String> = found.iter().filter(|n| !listed.contains(n.as_str())).collect();
    assert!(missing.is_empty(), "kernels missing from tessera_kernels::all_kernels(): {missing:?}");
}
