//! A fuzzed frontend: mutated kernels, built from the library's own kernels and from random
//! syntax, go through [`tessera_frontend::compile`] as the macro would take them. It must
//! never panic, never run away, and reject with `syn::Error`s whose spans lie inside the
//! input (a message at `call_site` would point a user at nothing).
//!
//! The number of cases comes from `TESSERA_FUZZ_CASES` (default 64 per property, a few
//! seconds); `.ci/run` runs about a minute's worth. Inputs that once failed are pinned in
//! `regressions` below.

use proc_macro2::{Delimiter, Group, Ident, Literal, Punct, Spacing, Span, TokenStream, TokenTree};
use proptest::prelude::*;
use proptest::test_runner::{Config, TestRunner};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::path::Path;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

/// Inputs tried, and of them compiled (the rest rejected), for the run's summary line.
static TRIED: AtomicUsize = AtomicUsize::new(0);
static COMPILED: AtomicUsize = AtomicUsize::new(0);

/// `(attribute arguments, function)` of every `#[kernel]` in the library's sources and the
/// language tests.
fn corpus() -> Vec<(TokenStream, TokenStream)> {
    sources().0
}

/// Every `#[device]` function of the same sources, without its attribute: what the kernels
/// call (by name; [`tessera_frontend::compile_with_devices`]).
fn devices() -> &'static [TokenStream] {
    // Token streams are not `Sync`: one copy a test thread.
    thread_local! {
        static DEVICES: &'static [TokenStream] = Box::leak(sources().1.into_boxed_slice());
    }
    DEVICES.with(|d| *d)
}

/// The kernels and the device functions of the library's sources and the language tests.
fn sources() -> (Vec<(TokenStream, TokenStream)>, Vec<TokenStream>) {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let mut files = Vec::new();
    let mut dirs = vec![root.join("tessera-kernels/src")];
    while let Some(d) = dirs.pop() {
        for e in std::fs::read_dir(&d).expect("kernel sources").flatten() {
            let p = e.path();
            if p.is_dir() {
                dirs.push(p);
            } else if p.extension().is_some_and(|x| x == "rs") {
                files.push(p);
            }
        }
    }
    files.push(root.join("tests/gpu_language.rs"));
    files.sort();
    let (mut out, mut devices) = (Vec::new(), Vec::new());
    for f in files {
        let text = std::fs::read_to_string(&f).expect("read a source file");
        let Ok(file) = syn::parse_file(&text) else { continue };
        let mut items: Vec<syn::Item> = file.items;
        while let Some(item) = items.pop() {
            match item {
                syn::Item::Fn(mut func) => {
                    if let Some(at) = func.attrs.iter().position(|a| a.path().segments.last().is_some_and(|s| s.ident == "device")) {
                        func.attrs.remove(at);
                        func.attrs.retain(|a| !a.path().is_ident("doc"));
                        devices.push(quote::quote!(#func));
                        continue;
                    }
                    let Some(at) = func.attrs.iter().position(|a| a.path().segments.last().is_some_and(|s| s.ident == "kernel")) else {
                        continue;
                    };
                    let attr = func.attrs.remove(at);
                    let args = match attr.meta {
                        syn::Meta::List(l) => l.tokens,
                        _ => TokenStream::new(),
                    };
                    func.attrs.retain(|a| !a.path().is_ident("doc"));
                    out.push((args, quote::quote!(#func)));
                }
                syn::Item::Mod(m) => items.extend(m.content.map(|c| c.1).unwrap_or_default()),
                _ => {}
            }
        }
    }
    assert!(out.len() >= 30, "expected the library's kernels, found {}", out.len());
    assert!(devices.len() >= 20, "expected the library's device functions, found {}", devices.len());
    (out, devices)
}

/// Tokens a mutation may put in: the language's words, Rust's, and edge-case literals.
fn pool(i: usize, span: Span) -> TokenTree {
    const WORDS: &[&str] = &[
        "Tile",
        "Global",
        "Smem",
        "load",
        "store",
        "row_sum",
        "block_sum",
        "mask_cols",
        "cast",
        "f32",
        "bf16",
        "i32",
        "let",
        "mut",
        "for",
        "in",
        "if",
        "else",
        "x",
        "y",
        "t",
        "r",
        "warpgroup",
        "block",
        "id_x",
        "mma_sync",
        "tma",
        "step_by",
        "as",
        "fn",
        "self",
        "true",
        "unroll",
        "Pipeline",
        "TileQueue",
        "exp2",
    ];
    const PUNCT: &[char] = &['+', '-', '*', '/', '%', '=', '<', '>', '!', '&', '|', '.', ',', ';', ':', '#', '?', '@', '^'];
    let mut t: TokenTree = match i % 4 {
        0 => Ident::new(WORDS[(i / 4) % WORDS.len()], span).into(),
        1 => Punct::new(PUNCT[(i / 4) % PUNCT.len()], if i % 8 == 1 { Spacing::Alone } else { Spacing::Joint }).into(),
        2 => match (i / 4) % 8 {
            0 => Literal::i64_unsuffixed(0),
            1 => Literal::i64_unsuffixed(-1),
            2 => Literal::u64_unsuffixed(u64::MAX),
            3 => Literal::i64_unsuffixed(1 << 31),
            4 => Literal::f32_unsuffixed(1e30),
            5 => Literal::string("s"),
            6 => Literal::i64_unsuffixed(3),
            _ => Literal::i64_unsuffixed(65537),
        }
        .into(),
        _ => Group::new([Delimiter::Parenthesis, Delimiter::Bracket, Delimiter::Brace][(i / 4) % 3], TokenStream::new()).into(),
    };
    t.set_span(span);
    t
}

/// One edit at the `at`-th token (depth first, groups counted): 0 delete, 1 duplicate, 2
/// replace from the pool, 3 swap with the next, 4 put a pool token before it, 5 empty a group.
fn mutate(ts: TokenStream, op: u8, at: &mut usize, pick: usize) -> TokenStream {
    let mut out: Vec<TokenTree> = Vec::new();
    let tokens: Vec<TokenTree> = ts.into_iter().collect();
    let mut i = 0;
    while i < tokens.len() {
        let t = tokens[i].clone();
        if *at == 0 {
            *at = usize::MAX;
            let span = t.span();
            match op % 6 {
                0 => {}
                1 => out.extend([t.clone(), t]),
                2 => out.push(pool(pick, span)),
                3 if i + 1 < tokens.len() => {
                    out.extend([tokens[i + 1].clone(), t]);
                    i += 1;
                }
                4 => out.extend([pool(pick, span), t]),
                5 => match t {
                    TokenTree::Group(g) => {
                        let mut n = Group::new(g.delimiter(), TokenStream::new());
                        n.set_span(g.span());
                        out.push(n.into());
                    }
                    other => out.push(other),
                },
                _ => out.push(t),
            }
            i += 1;
            continue;
        }
        if *at != usize::MAX {
            *at -= 1;
        }
        match t {
            TokenTree::Group(g) => {
                let mut n = Group::new(g.delimiter(), mutate(g.stream(), op, at, pick));
                n.set_span(g.span());
                out.push(n.into());
            }
            other => out.push(other),
        }
        i += 1;
    }
    out.into_iter().collect()
}

fn count(ts: &TokenStream) -> usize {
    ts.clone()
        .into_iter()
        .map(|t| match t {
            TokenTree::Group(g) => 1 + count(&g.stream()),
            _ => 1,
        })
        .sum()
}

/// The lines the input's tokens cover.
fn lines(ts: &TokenStream, range: &mut (usize, usize)) {
    for t in ts.clone() {
        let (a, b) = (t.span().start().line, t.span().end().line);
        if a > 0 {
            *range = (range.0.min(a), range.1.max(b));
        }
        if let TokenTree::Group(g) = t {
            lines(&g.stream(), range);
        }
    }
}

/// The property: no panic, no runaway, every rejection at a span inside the input.
fn check(attr: TokenStream, item: TokenStream) -> Result<(), TestCaseError> {
    let mut range = (usize::MAX, 0);
    lines(&attr, &mut range);
    lines(&item, &mut range);
    let start = Instant::now();
    let (a, i) = (attr.clone(), item.clone());
    let result = catch_unwind(AssertUnwindSafe(|| tessera_frontend::compile_with_devices(a, i, devices())));
    let took = start.elapsed();
    let input = format!("#[kernel({attr})] {item}");
    // A runaway (a loop without end, variants multiplying) takes far longer than this. The
    // slowest library kernel, attention_bwd_dq_mods (80 variants), compiles in about 6 s on
    // two busy cores with the frontend optimized as Cargo.toml has it (23 s unoptimized), and
    // a mutation that drops its `only` doubles the variants.
    prop_assert!(took < Duration::from_secs(60), "took {took:?} on {input}");
    let Ok(result) = result else {
        return Err(TestCaseError::fail(format!("the frontend panicked on {input}")));
    };
    TRIED.fetch_add(1, Ordering::Relaxed);
    if result.is_ok() {
        COMPILED.fetch_add(1, Ordering::Relaxed);
    }
    if let Err(errs) = result {
        prop_assert!(!errs.is_empty(), "a rejection without an error on {input}");
        for e in errs {
            for m in e {
                let line = m.span().start().line;
                prop_assert!(
                    line >= range.0 && line <= range.1,
                    "error `{m}` at line {line}, outside the input's lines {range:?}: {input}"
                );
                prop_assert!(!m.to_string().trim().is_empty(), "an empty message on {input}");
            }
        }
    }
    Ok(())
}

fn cases() -> u32 {
    std::env::var("TESSERA_FUZZ_CASES").ok().and_then(|v| v.parse().ok()).unwrap_or(64)
}

/// The baseline the mutations start from: every kernel of the corpus compiles as it is.
#[test]
fn the_corpus_compiles_unmutated() {
    for (attr, item) in corpus() {
        let name = item.to_string().split_whitespace().take(3).collect::<Vec<_>>().join(" ");
        let built = tessera_frontend::compile_with_devices(attr, item, devices()).unwrap_or_else(|e| panic!("{name}: {}", e[0]));
        assert!(!built.is_empty(), "{name}: no kernel");
    }
}

#[test]
fn mutated_library_kernels_never_panic_and_errors_point_inside() {
    let corpus = corpus();
    let n = corpus.len();
    let mut runner = TestRunner::new(Config { cases: cases(), failure_persistence: None, ..Config::default() });
    let edits = prop::collection::vec((any::<u8>(), any::<usize>(), any::<usize>()), 1..4);
    runner
        .run(&(0..n, any::<bool>(), edits), |(k, in_attr, edits)| {
            let (mut attr, mut item) = corpus[k].clone();
            for (op, at, pick) in edits {
                if in_attr && count(&attr) > 0 {
                    let mut at = at % count(&attr);
                    attr = mutate(attr, op, &mut at, pick);
                } else {
                    let mut at = at % count(&item).max(1);
                    item = mutate(item, op, &mut at, pick);
                }
            }
            check(attr, item)
        })
        .unwrap();
    summary();
}

fn summary() {
    let (tried, compiled) = (TRIED.load(Ordering::Relaxed), COMPILED.load(Ordering::Relaxed));
    println!("fuzz: {tried} inputs so far in this process, {compiled} compiled, {} rejected at a token", tried - compiled);
}

#[test]
fn random_syntax_never_panics_and_errors_point_inside() {
    let mut runner = TestRunner::new(Config { cases: cases(), failure_persistence: None, ..Config::default() });
    let body = prop::collection::vec(any::<usize>(), 0..40);
    runner
        .run(&(body, 0usize..4), |(picks, attr_kind)| {
            // Random tokens as a statement list, nested one level where the pool gives a group.
            let span = Span::call_site();
            let src = "fn k(x: Global<f32, 2>, y: Global<f32, 2>, n: i32) {\n}\n";
            let item: TokenStream = src.parse().expect("a function");
            let mut toks: Vec<TokenTree> = item.into_iter().collect();
            let body: TokenStream = picks
                .iter()
                .map(|&p| match pool(p, span) {
                    TokenTree::Group(g) if p % 7 == 0 => {
                        let inner: TokenStream = picks.iter().take(5).map(|&q| pool(q / 3, g.span())).collect();
                        Group::new(g.delimiter(), inner).into()
                    }
                    t => t,
                })
                .collect();
            // Give the random tokens the braces' span, so that "inside the input" is checkable.
            let Some(TokenTree::Group(g)) = toks.pop() else { return Err(TestCaseError::fail("no body")) };
            let respan = |ts: TokenStream| -> TokenStream { respan(ts, g.span()) };
            let mut braces = Group::new(Delimiter::Brace, respan(body));
            braces.set_span(g.span());
            toks.push(braces.into());
            let attr: TokenStream =
                ["", "warpgroups = 2", "dtypes(T = [bf16, f16])", "tune(W = [256, 512])"][attr_kind].parse().expect("an attribute");
            check(respan(attr), toks.into_iter().collect())
        })
        .unwrap();
    summary();
}

fn respan(ts: TokenStream, span: Span) -> TokenStream {
    ts.into_iter()
        .map(|mut t| {
            if let TokenTree::Group(g) = &t {
                let mut n = Group::new(g.delimiter(), respan(g.stream(), span));
                n.set_span(span);
                t = n.into();
            }
            t.set_span(span);
            t
        })
        .collect()
}

/// Inputs the fuzzing found rejected at no place in the input (syn's end-of-input errors at
/// the call site), and one it found rejected at all (a stray `;`, which Rust allows).
#[test]
fn regressions() {
    let kernel = "fn k(x: Global<f32, 2>, y: Global<f32, 2>) {\n    let t: Tile<f32, 16, 32> = x.load([0, 0]);\n    y.store([0, 0], t);\n}";
    for attr in ["dtypes", "warpgroups", "blocks_per_sm", "tune", "targets", "warpgroups =", "dtypes(T)"] {
        let (a, i) = (attr.parse().expect("tokens"), kernel.parse().expect("tokens"));
        check(a, i).unwrap_or_else(|e| panic!("#[kernel({attr})]: {e}"));
        assert!(tessera_frontend::compile(attr.parse().unwrap(), kernel.parse().unwrap()).is_err(), "#[kernel({attr})] accepted");
    }
    let stray =
        "fn k(x: Global<f32, 2>, y: Global<f32, 2>) {\n    let t: Tile<f32, 16, 32> = x.load([0, 0]);;\n    ;\n    y.store([0, 0], t);\n}";
    assert!(tessera_frontend::compile(TokenStream::new(), stray.parse().expect("tokens")).is_ok(), "a stray `;` rejected");
    // A function cut short: the error on its last token.
    let cut = "fn k(x: Global<f32, 2>)";
    check(TokenStream::new(), cut.parse().expect("tokens")).unwrap_or_else(|e| panic!("{cut}: {e}"));
    // A `tune` value of 2³¹ as a tile's width: 16 × 2³¹ elements overflowed u32 in the size check.
    let (attr, wide) = ("tune(D = [2147483648, 64])", "fn k(x: Global<f32, 2>) {\n    let t = Tile::<f32, 16, D>::zeros();\n}");
    check(attr.parse().expect("tokens"), wide.parse().expect("tokens")).unwrap_or_else(|e| panic!("{wide}: {e}"));
    // A ring 2³⁰ columns wide: its row bytes overflowed u32 in the parser (CI, session 20).
    for ring in ["Smem::<bf16, 64, 1073741824>::ring(2)", "Smem::<f32, 128, 128>::ring(4000000)", "Smem::<f32, 64, 64>::ring(0)"] {
        let k = format!("fn k(x: Global<f32, 2>) {{\n    let s = {ring};\n}}");
        check(TokenStream::new(), k.parse().expect("tokens")).unwrap_or_else(|e| panic!("{k}: {e}"));
        assert!(tessera_frontend::compile(TokenStream::new(), k.parse().unwrap()).is_err(), "{ring} accepted");
    }
    // A pipeline's stage inside an expression (`pipe.wait() + 1`): typed as a scalar, but
    // lowered only as a whole `let` value, it panicked the lowering (CI, session 38).
    for stage in ["pipe.wait() + 1", "-pipe.wait()", "pipe.wait() as f32 as i32", "(pipe.wait() % 2 == 0) as i32"] {
        let k = format!(
            "fn k(x: Global<f32, 2>) {{\n    let ring = Smem::<f32, 1, 64>::ring(2);\n    let pipe = Pipeline::<2>::new(1);\n    \
             let s = {stage};\n    x.store([0, 0], ring.at(s % 2).load());\n}}"
        );
        check("warpgroups = 2, targets(sm_90a)".parse().expect("tokens"), k.parse().expect("tokens"))
            .unwrap_or_else(|e| panic!("{k}: {e}"));
    }
}
