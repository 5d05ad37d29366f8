//! The mbarrier waits the compiler emits, read in the library's PTX (no GPU):
//!
//! - every producer-side wait (a thread waiting for a ring stage to empty: a pipeline's
//!   `acquire`, a tile queue's `fetch`) is followed by its warpgroup's barrier, so that no warp
//!   can still be polling for a phase when the leader's next step lets the consumers complete
//!   the next one, of the same parity (a slow warp then waited for good: memcheck's stall on
//!   packed attention, run 115);
//! - a diagnostic build's watchdog (`TileIr::wait_limit`, from `TESSERA_WAIT_LIMIT`) stores to
//!   a tag naming each wait's line and side, and a normal build has none.

use tessera_ptx::tirh::TileIr;

/// The spec of a library kernel by entry name.
fn spec(name: &str) -> tessera::KernelSpec {
    **tessera_kernels::all_kernels().iter().find(|s| s.name == name).unwrap_or_else(|| panic!("no kernel {name}"))
}

/// Each wait loop of `ptx` (a `$L_wait_*` label): whether it waits on the producer side (its
/// parity is the thread's phase flipped) and the first instruction after the loop.
fn waits(ptx: &str) -> Vec<(bool, String)> {
    let lines: Vec<&str> = ptx.lines().map(str::trim).collect();
    let mut out = Vec::new();
    for (i, l) in lines.iter().enumerate() {
        if !(l.starts_with("$L_wait_") && l.ends_with(':')) {
            continue;
        }
        let wait = lines[i + 1];
        let parity = wait.rsplit(", ").next().unwrap_or("").trim_end_matches(';');
        // The producer side waits on the phase flipped (`xor.b32 %r_parity_N, %r_phase_M, 1`),
        // the consumer side on the phase itself.
        let producer = parity.starts_with("%r_parity");
        let after = lines[i + 2..].iter().find(|n| !n.starts_with('@') || !n.contains(l.trim_end_matches(':'))).unwrap_or(&"");
        out.push((producer, after.to_string()));
    }
    out
}

#[test]
fn producer_waits_end_with_the_warpgroup_barrier() {
    for name in
        ["flash_attention_varlen_bf16__d128_stages2_bn160", "flash_attention_bf16__d128_stages2_bn160", "gemm_tn_bf16__bn256_stages4"]
    {
        let ptx = spec(name).variants[0].ptx();
        let all = waits(ptx);
        let producer: Vec<_> = all.iter().filter(|(p, _)| *p).collect();
        assert!(producer.len() >= 2 && producer.len() < all.len(), "{name}: {} waits, {} on the producer side", all.len(), producer.len());
        for (_, after) in producer {
            assert!(after.starts_with("bar.sync") && after.ends_with("128;"), "{name}: a producer wait followed by `{after}`");
        }
    }
}

#[test]
fn the_wait_watchdog_names_each_wait_and_is_off_by_default() {
    let name = "flash_attention_varlen_bf16__d128_stages2_bn160";
    let s = spec(name);
    assert!(!s.variants[0].ptx().contains("st.global.u32       [%rd_tag"), "{name}: a watchdog in a normal build");
    let mut ir = TileIr::from_json(s.tirh()).expect("the embedded TIR-H");
    ir.wait_limit = 1000;
    let opts = tessera_ptx::CompileOptions { targets: vec![tessera_ptx::Target::Sm90a] };
    let k = tessera_ptx::compile(ir, &opts).unwrap_or_else(|e| panic!("{name} with a watchdog: {e:?}"));
    let ptx = &k.variants[0].ptx;
    let tags: Vec<(u32, bool, u32)> = ptx
        .lines()
        .filter(|l| l.contains("add.u64") && l.contains("%rd_tag"))
        .filter_map(|l| l.rsplit(", ").next()?.trim_end_matches(';').parse::<u64>().ok())
        .filter_map(tessera_ptx::wait_tag_decode)
        .collect();
    assert_eq!(tags.len(), waits(ptx).len(), "{name}: one tag per wait");
    // The tile queue's producer side: the `for tile in queue.fetch(...)` line of the source.
    let source = include_str!("../tessera-kernels/src/attention/kernels.rs");
    let fetch =
        source.lines().position(|l| l.contains("queue.fetch(m_tiles * batch * heads)")).expect("the packed kernel's fetch") as u32 + 1;
    assert!(tags.contains(&(fetch, true, 0)), "{name}: no producer tag at line {fetch}: {tags:?}");
    assert!(tags.iter().any(|&(_, producer, _)| !producer), "{name}: no consumer tag");
    assert!(ptx.contains("setp.lt.u32") && ptx.contains(", 1000;"), "{name}: the limit");
}

#[test]
fn wait_tags_decode_back() {
    for (line, producer, stage) in [(1, false, 0), (347, true, 1), (99_999, true, 31)] {
        assert_eq!(tessera_ptx::wait_tag_decode(tessera_ptx::wait_tag(line, producer, stage)), Some((line, producer, stage)));
    }
    assert_eq!(tessera_ptx::wait_tag_decode(0x1000), None);
    assert_eq!(tessera_ptx::wait_tag_decode(tessera_ptx::WAIT_TAG_BASE + 8), None);
}
