//! Attention's score and mask modifiers against a float64 softmax of the modified scores:
//! soft-capping, ALiBi, a sliding window, a prefix LM, dropout and their combinations, forward and
//! backward (gradients from the definition, both backward modes), and a kernel of the caller's
//! own (a score modifier and a banded mask written as closures given to
//! `attention_persistent`; forward only). Fresh random inputs, odd lengths, outputs poisoned
//! before each launch; on the GPU (Hopper) and, on small shapes, in the interpreter.

mod common;

use common::{
    attention_backward_reference, attention_reference, causal_mask, random, unit_grad, unmodified, AttentionDims, ScoreMods as Mods,
};
use tessera::testing::{gpu_or_skip, rel_error};
use tessera::{bf16, kernel, Device, Tensor};
use tessera_kernels::prelude::attention_persistent;
use tessera_kernels::{Attention, AttentionLayout};

/// One problem: batch, query length, key length, query heads, key/value heads, head dim.
type Case = AttentionDims;

/// Where row `si` of head `hi` of batch entry `bi` starts in `[batch, seq, heads, dim]`.
fn bshd(d: usize) -> impl Fn(usize, usize, usize, usize, usize) -> usize {
    move |s_len, heads, bi, si, hi| ((bi * s_len + si) * heads + hi) * d
}

/// Runs `opts` (bf16, `[batch, seq, heads, dim]`) on one case and checks O by relative error
/// and the LSE elementwise against the reference under `mods`; with `backward`, the gradients
/// of both backward modes too.
fn check(dev: &Device, c: Case, opts: Attention, scale: f32, mods: &Mods<'_>, what: &str, backward: bool) {
    let (qs, ks) = ([c.b, c.sq, c.h, c.d], [c.b, c.sk, c.hk, c.d]);
    let gen = |n: usize, r: f32| -> (Vec<bf16>, Vec<f64>) {
        let x: Vec<bf16> = random(n, -r, r).into_iter().map(bf16::from_f32).collect();
        let w = x.iter().map(|v| v.to_f64()).collect();
        (x, w)
    };
    let (q, qw) = gen(qs.iter().product(), 2.0);
    let (k, kw) = gen(ks.iter().product(), 2.0);
    let (v, vw) = gen(ks.iter().product(), 1.0);
    let (qt, kt, vt) =
        (Tensor::from_host(dev, &q, &qs).unwrap(), Tensor::from_host(dev, &k, &ks).unwrap(), Tensor::from_host(dev, &v, &ks).unwrap());
    let mut o = Tensor::full(dev, &qs, bf16::from_f32(f32::NAN)).unwrap();
    let mut lse = Tensor::full(dev, &[c.b, c.h, c.sq], f32::NAN).unwrap();
    let opts = opts.layout(AttentionLayout::Bshd).scale(scale);
    tessera_kernels::attention_with_lse(dev, &opts, &qt, &kt, &vt, &mut o, &mut lse).unwrap();
    let (want_o, want_lse) = attention_reference(c, &bshd(c.d), f64::from(scale), mods, &qw, &kw, &vw);
    let got: Vec<f64> = o.to_host().unwrap().into_iter().map(|x| x.to_f64()).collect();
    let what = format!("{c:?} {what}");
    let err = rel_error(&got, &want_o);
    assert!(err < 2e-2, "{what}: O relative error {err}");
    for (i, (g, w)) in lse.to_host().unwrap().into_iter().zip(&want_lse).enumerate() {
        let g = f64::from(g);
        let ok = if w.is_infinite() { g == *w } else { (g - w).abs() <= 2e-3 * w.abs().max(1.0) };
        assert!(ok, "{what}: lse[{i}] = {g}, expected {w}");
    }
    if !backward {
        return;
    }
    let (dout, dow) = gen(qs.iter().product(), 1.0);
    let dot = Tensor::from_host(dev, &dout, &qs).unwrap();
    let [want_dq, want_dk, want_dv] = attention_backward_reference(c, &bshd(c.d), f64::from(scale), mods, &qw, &kw, &vw, &dow);
    let host = |t: &Tensor<bf16>| t.to_host().unwrap().into_iter().map(|x| x.to_f64()).collect::<Vec<f64>>();
    // The fast mode (dQ by reduce-adds) and the deterministic one.
    for deterministic in [false, true] {
        let opts = opts.deterministic(deterministic);
        let g = tessera_kernels::attention_backward(dev, &opts, &qt, &kt, &vt, &o, &lse, &dot)
            .unwrap_or_else(|e| panic!("{what} deterministic={deterministic}: {e}"));
        for (name, got, want) in [("dq", host(&g.dq), &want_dq), ("dk", host(&g.dk), &want_dk), ("dv", host(&g.dv), &want_dv)] {
            assert!(got.iter().all(|x| x.is_finite()), "{what} deterministic={deterministic}: {name} has a non-finite element");
            let err = want.error(&got);
            assert!(err < 3e-2, "{what} deterministic={deterministic}: {name} relative error {err}");
        }
    }
}

fn cases(dev: &Device) -> Vec<Case> {
    let c = |b, sq, sk, h, hk, d| Case { b, sq, sk, h, hk, d };
    if dev.is_cpu() {
        vec![c(1, 130, 140, 2, 1, 64), c(1, 7, 300, 2, 2, 128), c(1, 40, 200, 1, 1, 256)]
    } else {
        vec![
            c(2, 1000, 1000, 4, 2, 128),
            c(1, 1, 777, 8, 2, 128),
            c(1, 300, 129, 2, 1, 64),
            c(2, 4099, 4099, 2, 1, 64),
            c(1, 700, 900, 2, 1, 96),
            c(1, 1000, 1000, 2, 1, 192),
            c(1, 333, 700, 2, 2, 256),
        ]
    }
}

fn library_modifiers(dev: &Device) {
    for c in cases(dev) {
        let shift = c.sk as i64 - c.sq as i64;
        let scale = 1.0 / (c.d as f32).sqrt() * random(1, 0.5, 1.5)[0];
        let causal = |i: i64, j: i64| j <= i + shift;
        let all = |_: i64, _: i64| true;
        // Soft-capping at 5 (the random scores reach ±10 or so: the cap bites).
        let cap = 5.0;
        let capped = |s: f64, _: i64, _: i64, _: usize| cap * (s / cap).tanh();
        let capped_grad = |s: f64, _: i64, _: i64, _: usize| 1.0 - (s / cap).tanh().powi(2);
        for (causal_on, vis) in [(false, &all as &dyn Fn(i64, i64) -> bool), (true, &causal)] {
            let opts = Attention::new().causal(causal_on).softcap(cap as f32);
            check(
                dev,
                c,
                opts,
                scale,
                &Mods { score: &capped, grad: &capped_grad, visible: vis, dropout: None },
                &format!("softcap 5 causal={causal_on}"),
                true,
            );
        }
        // ALiBi with the paper's slopes over `h` heads.
        let heads = c.h as f64;
        let alibi = |s: f64, i: i64, j: i64, h: usize| s - 2f64.powf(-8.0 * (h as f64 + 1.0) / heads) * ((i + shift - j).abs() as f64);
        for (causal_on, vis) in [(false, &all as &dyn Fn(i64, i64) -> bool), (true, &causal)] {
            let opts = Attention::new().causal(causal_on).alibi(8.0);
            check(
                dev,
                c,
                opts,
                scale,
                &Mods { score: &alibi, grad: &unit_grad, visible: vis, dropout: None },
                &format!("alibi 8 causal={causal_on}"),
                true,
            );
        }
        // Sliding windows: one key (the diagonal), a few, a block's worth and more.
        for w in [1usize, 7, 100, 300] {
            let win = move |i: i64, j: i64| j <= i + shift && j > i + shift - w as i64;
            let opts = Attention::new().causal(true).sliding_window(w);
            check(
                dev,
                c,
                opts,
                scale,
                &Mods { score: &unmodified, grad: &unit_grad, visible: &win, dropout: None },
                &format!("sliding window {w}"),
                true,
            );
        }
        // A prefix every query sees.
        for p in [5usize, 200] {
            let pre = move |i: i64, j: i64| j < p as i64 || j <= i + shift;
            let opts = Attention::new().causal(true).prefix(p);
            check(
                dev,
                c,
                opts,
                scale,
                &Mods { score: &unmodified, grad: &unit_grad, visible: &pre, dropout: None },
                &format!("prefix {p}"),
                true,
            );
        }
        // Together: a window under soft-capping and ALiBi.
        let w = 150i64;
        let win = move |i: i64, j: i64| j <= i + shift && j > i + shift - w;
        let both = |s: f64, i: i64, j: i64, h: usize| alibi(capped(s, i, j, h), i, j, h);
        let opts = Attention::new().causal(true).sliding_window(w as usize).softcap(cap as f32).alibi(8.0);
        check(
            dev,
            c,
            opts,
            scale,
            &Mods { score: &both, grad: &capped_grad, visible: &win, dropout: None },
            "window 150, softcap, alibi",
            true,
        );
        // Dropout, alone (causal and not) and under the others: the forward and both backward
        // modes against the host's mask, so all three draw the same bits.
        let (seed, offset): (u64, u32) = (rand::random(), rand::random());
        for (p, causal_on) in [(0.2f32, false), (0.5, true), (0.1, true)] {
            let zf = move |bh: usize, i: usize, j: usize| {
                let t = (p * 256.0).round() / 256.0;
                if tessera_kernels::attention_dropout_keep(seed, offset, bh, i, j, p) {
                    1.0 / (1.0 - f64::from(t))
                } else {
                    0.0
                }
            };
            let vis = causal_mask(causal_on, shift);
            let mut opts = Attention::new().causal(causal_on).dropout(p, seed, offset);
            let mods = if p == 0.1 {
                opts = opts.sliding_window(w as usize).softcap(cap as f32).alibi(8.0);
                Mods { score: &both, grad: &capped_grad, visible: &win, dropout: Some(&zf) }
            } else {
                Mods { score: &unmodified, grad: &unit_grad, visible: &vis, dropout: Some(&zf) }
            };
            check(dev, c, opts, scale, &mods, &format!("dropout {p} causal={causal_on}"), true);
        }
    }
}

#[test]
fn gpu_attention_modifiers_match_f64_reference() {
    if let Some(dev) = gpu_or_skip("gpu_attention_modifiers_match_f64_reference") {
        library_modifiers(&dev);
    }
}

#[test]
fn interp_attention_modifiers_match_f64_reference() {
    library_modifiers(&Device::cpu());
}

/// The library's modifiers on sequences packed end to end (`attention_varlen` and its
/// backward): soft-capping, ALiBi, windows and a prefix over sequences whose key lengths differ
/// from their query lengths (the causal diagonal aligned at each one's end), one without
/// queries and one of a single query; each sequence's output, log-sum-exp and gradients
/// against the float64 reference of that sequence alone.
fn packed_modifiers(dev: &Device) {
    #[derive(Clone, Copy, Debug)]
    enum Mod {
        Softcap,
        Alibi,
        Window(usize),
        Prefix(usize),
        All(usize),
        Dropout(f32),
    }
    let (lq, lk) = ([70usize, 1, 0, 130, 33], [70usize, 5, 9, 130, 200]);
    let (h, hk) = (2, 1);
    let cum = |l: &[usize]| {
        let mut a = 0i32;
        std::iter::once(0)
            .chain(l.iter().map(|&x| {
                a += x as i32;
                a
            }))
            .collect::<Vec<i32>>()
    };
    let (cq, ck) = (cum(&lq), cum(&lk));
    let (tq, tk) = (lq.iter().sum::<usize>(), lk.iter().sum::<usize>());
    let cap = 5.0f64;
    // (Head dim 96 on the GPU alone: the interpreter's time goes to the others.)
    let dims: &[usize] = if dev.is_cpu() { &[64, 128, 256] } else { &[64, 96, 128, 256] };
    for &d in dims {
        let gen = |n: usize, r: f32| -> (Vec<bf16>, Vec<f64>) {
            let x: Vec<bf16> = random(n, -r, r).into_iter().map(bf16::from_f32).collect();
            let w = x.iter().map(|v| v.to_f64()).collect();
            (x, w)
        };
        let (q, qw) = gen(tq * h * d, 2.0);
        let (k, kw) = gen(tk * hk * d, 2.0);
        let (v, vw) = gen(tk * hk * d, 1.0);
        let (dout, dow) = gen(tq * h * d, 1.0);
        let t = |x: &[bf16], s: &[usize]| Tensor::from_host(dev, x, s).unwrap();
        let (qt, kt, vt, dot) = (t(&q, &[tq, h, d]), t(&k, &[tk, hk, d]), t(&v, &[tk, hk, d]), t(&dout, &[tq, h, d]));
        let (cqt, ckt) = (Tensor::from_host(dev, &cq, &[cq.len()]).unwrap(), Tensor::from_host(dev, &ck, &[ck.len()]).unwrap());
        let scale = 1.0 / (d as f32).sqrt() * random(1, 0.5, 1.5)[0];
        let (seed, offset): (u64, u32) = (rand::random(), rand::random());
        for m in [Mod::Softcap, Mod::Alibi, Mod::Window(1), Mod::Window(100), Mod::Prefix(5), Mod::All(50), Mod::Dropout(0.3)] {
            let base = Attention::new().causal(true).scale(scale).check_offsets(true);
            let opts = match m {
                Mod::Softcap => base.softcap(cap as f32),
                Mod::Alibi => base.alibi(8.0),
                Mod::Window(w) => base.sliding_window(w),
                Mod::Prefix(p) => base.prefix(p),
                Mod::All(w) => base.sliding_window(w).softcap(cap as f32).alibi(8.0),
                Mod::Dropout(p) => base.dropout(p, seed, offset),
            };
            let mut o = Tensor::full(dev, &[tq, h, d], bf16::from_f32(f32::NAN)).unwrap();
            let mut lse = Tensor::full(dev, &[h, tq], f32::NAN).unwrap();
            let max_q = *lq.iter().max().unwrap();
            let max_k = *lk.iter().max().unwrap();
            tessera_kernels::attention_varlen(dev, &opts, &qt, &kt, &vt, &mut o, &mut lse, &cqt, &ckt, max_q)
                .unwrap_or_else(|e| panic!("{m:?} d{d}: {e}"));
            let host = |t: &Tensor<bf16>| t.to_host().unwrap().into_iter().map(|x| x.to_f64()).collect::<Vec<f64>>();
            let (go, gl) = (host(&o), lse.to_host().unwrap());
            let grads: Vec<_> = [false, true]
                .into_iter()
                .map(|det| {
                    let g = tessera_kernels::attention_varlen_backward(
                        dev,
                        &opts.deterministic(det),
                        &qt,
                        &kt,
                        &vt,
                        &o,
                        &lse,
                        &dot,
                        &cqt,
                        &ckt,
                        max_q,
                        max_k,
                    )
                    .unwrap_or_else(|e| panic!("{m:?} d{d}: {e}"));
                    (det, host(&g.dq), host(&g.dk), host(&g.dv))
                })
                .collect();
            for bi in 0..lq.len() {
                let shift = lk[bi] as i64 - lq[bi] as i64;
                let heads = h as f64;
                let capped = |s: f64| cap * (s / cap).tanh();
                let capped_grad = |s: f64| 1.0 - (s / cap).tanh().powi(2);
                let alibi =
                    |s: f64, i: i64, j: i64, hh: usize| s - 2f64.powf(-8.0 * (hh as f64 + 1.0) / heads) * ((i + shift - j).abs() as f64);
                let score = |s: f64, i: i64, j: i64, hh: usize| match m {
                    Mod::Softcap => capped(s),
                    Mod::Alibi => alibi(s, i, j, hh),
                    Mod::All(_) => alibi(capped(s), i, j, hh),
                    _ => s,
                };
                let grad = |s: f64, _: i64, _: i64, _: usize| match m {
                    Mod::Softcap | Mod::All(_) => capped_grad(s),
                    _ => 1.0,
                };
                let visible = |i: i64, j: i64| match m {
                    Mod::Window(w) | Mod::All(w) => j <= i + shift && j > i + shift - w as i64,
                    Mod::Prefix(p) => j < p as i64 || j <= i + shift,
                    _ => j <= i + shift,
                };
                // Dropout's mask: (batch·head) `bi·h + hh`, queries and keys counted in the sequence.
                let zf = |bh: usize, i: usize, j: usize| match m {
                    Mod::Dropout(p) if tessera_kernels::attention_dropout_keep(seed, offset, bi * h + bh, i, j, p) => {
                        1.0 / (1.0 - f64::from((p * 256.0).round() / 256.0))
                    }
                    Mod::Dropout(_) => 0.0,
                    _ => 1.0,
                };
                let mods = Mods { score: &score, grad: &grad, visible: &visible, dropout: Some(&zf) };
                let c = Case { b: 1, sq: lq[bi], sk: lk[bi], h, hk, d };
                let (q0, k0) = (cq[bi] as usize, ck[bi] as usize);
                let (rq, rk) = (q0 * h * d..(q0 + lq[bi]) * h * d, k0 * hk * d..(k0 + lk[bi]) * hk * d);
                let what = format!("packed sequence {bi} ({}×{}, d{d}) {m:?}", lq[bi], lk[bi]);
                let (wo, wl) = attention_reference(c, &bshd(d), f64::from(scale), &mods, &qw[rq.clone()], &kw[rk.clone()], &vw[rk.clone()]);
                if lq[bi] > 0 {
                    let err = rel_error(&go[rq.clone()], &wo);
                    assert!(err < 2e-2, "{what}: O relative error {err}");
                    for hh in 0..h {
                        for i in 0..lq[bi] {
                            let (g, w) = (f64::from(gl[hh * tq + q0 + i]), wl[hh * lq[bi] + i]);
                            let ok = if w.is_infinite() { g == w } else { (g - w).abs() <= 2e-3 * w.abs().max(1.0) };
                            assert!(ok, "{what}: lse[{hh}, {i}] = {g}, expected {w}");
                        }
                    }
                }
                let [wq, wk, wv] = attention_backward_reference(
                    c,
                    &bshd(d),
                    f64::from(scale),
                    &mods,
                    &qw[rq.clone()],
                    &kw[rk.clone()],
                    &vw[rk.clone()],
                    &dow[rq.clone()],
                );
                for (det, gq, gk, gv) in &grads {
                    for (name, got, want) in [("dq", &gq[rq.clone()], &wq), ("dk", &gk[rk.clone()], &wk), ("dv", &gv[rk.clone()], &wv)] {
                        assert!(got.iter().all(|x| x.is_finite()), "{what} deterministic={det}: {name} has a non-finite element");
                        if want.value.iter().all(|&x| x == 0.0) {
                            // No queries (dK, dV) or no keys: zeros, up to D's rounding for dQ.
                            let worst = got.iter().fold(0.0f64, |a, &x| a.max(x.abs()));
                            assert!(worst < 3e-2, "{what} deterministic={det}: {name} should be about 0, has {worst}");
                        } else {
                            // 4e-2: a packed sequence of a few queries under dropout sums a
                            // handful of 16-bit terms, whose rounding against an eighth of their
                            // magnitude reaches ~3e-2 (CI, session 56: dq of a 1×5 sequence at
                            // 0.0315); a missing or doubled term is still several times this.
                            let err = want.error(got);
                            assert!(err < 4e-2, "{what} deterministic={det}: {name} relative error {err}");
                        }
                    }
                }
            }
        }
    }
}

#[test]
fn gpu_attention_packed_modifiers_match_f64_reference() {
    if let Some(dev) = gpu_or_skip("gpu_attention_packed_modifiers_match_f64_reference") {
        packed_modifiers(&dev);
    }
}

#[test]
fn interp_attention_packed_modifiers_match_f64_reference() {
    packed_modifiers(&Device::cpu());
}

/// A kernel of the caller's: scores plus `0.01·(kj − qi)` (in raw units), keys within 40 of
/// the query either side visible (a band), its key blocks found by `key_range`.
#[kernel(warpgroups = 3, dtypes(T = [bf16]), tune(D = [128, 64]), targets(sm_90a))]
pub fn banded_attention(
    q: Global<T, 3>, k: Global<T, 3>, v: Global<T, 3>, o: Global<T, 3>, lse: Global<f32, 3>, counter: Global<i32, 1>,
    opart: Global<f32, 3>, lpart: Global<f32, 3>, full: i32, parts: i32, heads: i32, group: i32, q_bm: i32, k_bm: i32, hm: i32, cm: i32,
    causal: i32, hg: i32, keep_lse: i32, scale_log2: f32,
) {
    let seq_k = k.dim(1);
    #[rustfmt::skip]
    attention_persistent::<T, D, 128, 2>(
        q, k, v, o, lse, counter, opart, lpart, full, parts, heads, group, q_bm, k_bm, hm, cm, hg, keep_lse, scale_log2,
        |x, _plane, _row, _col| x,
        |s, qi, kj, _bh| s + (kj - qi) * 0.01,
        |qi, kj, _bh| 40.0 - abs(qi - kj),
        |_bh, q0, rows| (max(q0 - 40, 0), min(q0 + rows + 40, seq_k), q0 + rows - 1 - 40, q0 + 41),
        |p, _bh, _q0, _k0| p,
    );
}

fn custom_kernel(dev: &Device) {
    // (Its variants: head dims 64 and 128.)
    for c in cases(dev).into_iter().filter(|c| c.d == 64 || c.d == 128) {
        let scale = 1.0 / (c.d as f32).sqrt();
        let score = |s: f64, i: i64, j: i64, _: usize| s + 0.01 * f64::from(scale) * (j - i) as f64;
        let band = |i: i64, j: i64| (i - j).abs() <= 40;
        let opts = Attention::new().kernel(banded_attention_bf16::VARIANTS);
        check(
            dev,
            c,
            opts,
            scale,
            &Mods { score: &score, grad: &unit_grad, visible: &band, dropout: None },
            "banded kernel of the caller's",
            false,
        );
    }
    // Its parameters checked by name: a kernel of another signature is refused.
    let bad = Attention::new().kernel(tessera_kernels::kernels::attention_combine_bf16::VARIANTS);
    let (qs, ks) = ([1, 8, 1, 64], [1, 8, 1, 64]);
    let q = Tensor::<bf16>::full(dev, &qs, bf16::from_f32(0.5)).unwrap();
    let k = Tensor::<bf16>::full(dev, &ks, bf16::from_f32(0.5)).unwrap();
    let mut o = Tensor::<bf16>::full(dev, &qs, bf16::from_f32(0.0)).unwrap();
    let err = tessera_kernels::attention(dev, &bad, &q, &k, &k, &mut o).unwrap_err().to_string();
    assert!(err.contains("kernel") && err.contains("attention_combine_bf16"), "{err}");
    // A kernel beside the library's modifiers is refused, named (not its PTX) in the message.
    let both = Attention::new().softcap(5.0).kernel(banded_attention_bf16::VARIANTS);
    let err = tessera_kernels::attention(dev, &both, &q, &k, &k, &mut o).unwrap_err().to_string();
    assert!(err.contains("AttentionKernel(banded_attention_bf16") && err.len() < 1000, "{err}");
}

#[test]
fn gpu_attention_kernel_of_callers_matches_f64_reference() {
    if let Some(dev) = gpu_or_skip("gpu_attention_kernel_of_callers_matches_f64_reference") {
        custom_kernel(&dev);
    }
}

#[test]
fn interp_attention_kernel_of_callers_matches_f64_reference() {
    custom_kernel(&Device::cpu());
}

/// Modifiers that cannot apply are refused, naming the option.
#[test]
fn bad_input_attention_modifiers_name_the_option() {
    let dev = Device::cpu();
    let s = [1, 16, 2, 64];
    let x = Tensor::<bf16>::full(&dev, &s, bf16::from_f32(0.5)).unwrap();
    let mut o = Tensor::<bf16>::full(&dev, &s, bf16::from_f32(0.0)).unwrap();
    let run = |opts: Attention, o: &mut Tensor<bf16>| tessera_kernels::attention(&dev, &opts, &x, &x, &x, o).unwrap_err().to_string();
    for (opts, name) in [
        (Attention::new().sliding_window(8), "sliding_window"),
        (Attention::new().prefix(8), "prefix"),
        (Attention::new().causal(true).sliding_window(0), "sliding_window"),
        (Attention::new().softcap(-1.0), "softcap"),
        (Attention::new().softcap(f32::NAN), "softcap"),
        (Attention::new().alibi(0.0), "alibi"),
        (Attention::new().dropout(1.0, 7, 0), "dropout"),
        (Attention::new().dropout(-0.25, 7, 0), "dropout"),
        (Attention::new().dropout(f32::NAN, 7, 0), "dropout"),
        (Attention::new().dropout(0.1, 7, 0).kernel(banded_attention_bf16::VARIANTS), "kernel"),
    ] {
        let err = run(opts, &mut o);
        assert!(err.contains(name), "{opts:?}: {err}");
    }
    // The backward of a kernel of the caller's is refused rather than computed without it;
    // the modifiers' backward refuses what their forward does.
    let lse = Tensor::<f32>::full(&dev, &[1, 2, 16], 0.0).unwrap();
    let backward_err = |opts: Attention| {
        tessera_kernels::attention_backward(&dev, &opts, &x, &x, &x, &x, &lse, &x).err().map(|e| e.to_string()).unwrap_or_default()
    };
    let err = backward_err(Attention::new().kernel(banded_attention_bf16::VARIANTS));
    assert!(err.contains("kernel of yours"), "{err}");
    let err = backward_err(Attention::new().sliding_window(4));
    assert!(err.contains("sliding_window"), "{err}");
}
