//! FlashAttention forward against a float64 softmax(Q·Kᵀ·scale)·V: fresh random inputs, odd
//! sequence lengths, both layouts, causal and not, grouped-query heads, cross-attention and
//! decoding shapes, logits that overflow a naive softmax; outputs poisoned before each launch.
//! On the GPU (Hopper) and, on small shapes, in the interpreter.

mod common;

use common::{attention_reference, causal_mask, random, unit_grad, unmodified, AttentionDims, ScoreMods};
use tessera::testing::{gpu_or_skip, rel_error};
use tessera::{bf16, f16, Device, Tensor};
use tessera_kernels::{Attention, AttentionElement, AttentionLayout};

/// One problem: batch, query length, key length, query heads, key/value heads, head dim.
#[derive(Clone, Copy, Debug)]
struct Case {
    b: usize,
    sq: usize,
    sk: usize,
    h: usize,
    hk: usize,
    d: usize,
}

/// The f64 reference: `o` and the natural-log LSE (−∞ where every key is masked, `o` 0 there).
fn reference(c: Case, layout: AttentionLayout, causal: bool, scale: f64, q: &[f64], k: &[f64], v: &[f64]) -> (Vec<f64>, Vec<f64>) {
    let at = |s_len: usize, heads: usize, bi: usize, si: usize, hi: usize| match layout {
        AttentionLayout::Bshd => ((bi * s_len + si) * heads + hi) * c.d,
        AttentionLayout::Bhsd => ((bi * heads + hi) * s_len + si) * c.d,
    };
    let visible = causal_mask(causal, c.sk as i64 - c.sq as i64);
    let mods = ScoreMods { score: &unmodified, grad: &unit_grad, visible: &visible, dropout: None };
    let dims = AttentionDims { b: c.b, sq: c.sq, sk: c.sk, h: c.h, hk: c.hk, d: c.d };
    attention_reference(dims, &at, scale, &mods, q, k, v)
}

/// Runs one case in `T` and checks O by relative error and the LSE elementwise.
#[allow(clippy::too_many_arguments)]
fn check<T: AttentionElement>(
    dev: &Device, c: Case, layout: AttentionLayout, causal: bool, spread: f32, tol: f64, to: fn(f32) -> T, from: fn(T) -> f64,
    variant: Option<&'static str>, splits: Option<usize>,
) {
    let (qs, ks) = match layout {
        AttentionLayout::Bshd => ([c.b, c.sq, c.h, c.d], [c.b, c.sk, c.hk, c.d]),
        AttentionLayout::Bhsd => ([c.b, c.h, c.sq, c.d], [c.b, c.hk, c.sk, c.d]),
    };
    let gen = |n: usize, r: f32| -> (Vec<T>, Vec<f64>) {
        let x: Vec<T> = random(n, -r, r).into_iter().map(to).collect();
        let w = x.iter().map(|&v| from(v)).collect();
        (x, w)
    };
    let (q, qw) = gen(qs.iter().product(), spread);
    let (k, kw) = gen(ks.iter().product(), spread);
    let (v, vw) = gen(ks.iter().product(), 1.0);
    let scale = 1.0 / (c.d as f32).sqrt() * random(1, 0.5, 1.5)[0];
    let mut opts = Attention::new().layout(layout).causal(causal).scale(scale);
    if let Some(v) = variant {
        opts = opts.variant(v);
    }
    if let Some(n) = splits {
        opts = opts.kv_splits(n);
    }
    let (qt, kt, vt) =
        (Tensor::from_host(dev, &q, &qs).unwrap(), Tensor::from_host(dev, &k, &ks).unwrap(), Tensor::from_host(dev, &v, &ks).unwrap());
    let mut o = Tensor::full(dev, &qs, to(f32::NAN)).unwrap();
    let mut lse = Tensor::full(dev, &[c.b, c.h, c.sq], f32::NAN).unwrap();
    tessera_kernels::attention_with_lse(dev, &opts, &qt, &kt, &vt, &mut o, &mut lse).unwrap();
    let (want_o, want_lse) = reference(c, layout, causal, f64::from(scale), &qw, &kw, &vw);
    let got: Vec<f64> = o.to_host().unwrap().into_iter().map(from).collect();
    let what = format!("{c:?} {layout:?} causal={causal} spread={spread} {variant:?} kv_splits {splits:?}");
    let err = rel_error(&got, &want_o);
    assert!(err < tol, "{what}: O relative error {err}");
    // Without the log-sum-exp (its buffer the library's own, uncleared): the same O, bit for bit.
    let mut o2 = Tensor::full(dev, &qs, to(f32::NAN)).unwrap();
    tessera_kernels::attention(dev, &opts, &qt, &kt, &vt, &mut o2).unwrap();
    let bits = |t: &Tensor<T>| t.to_host().unwrap().into_iter().map(from).map(f64::to_bits).collect::<Vec<_>>();
    assert!(bits(&o2) == bits(&o), "{what}: `attention` and `attention_with_lse` differ");
    for (i, (g, w)) in lse.to_host().unwrap().into_iter().zip(&want_lse).enumerate() {
        let g = f64::from(g);
        let ok = if w.is_infinite() { g == *w } else { (g - w).abs() <= 1e-3 * w.abs().max(1.0) };
        assert!(ok, "{what}: lse[{i}] = {g}, expected {w}");
    }
}

fn cases(dev: &Device) -> Vec<Case> {
    let c = |b, sq, sk, h, hk, d| Case { b, sq, sk, h, hk, d };
    if dev.is_cpu() {
        vec![
            c(1, 5, 7, 2, 1, 128),
            c(1, 130, 140, 1, 1, 128),
            c(2, 9, 200, 2, 2, 64),
            c(1, 70, 97, 2, 1, 192),
            c(1, 19, 130, 1, 1, 256),
            c(1, 33, 150, 2, 1, 96),
        ]
    } else {
        vec![
            c(1, 1, 1, 1, 1, 128),
            c(2, 200, 333, 4, 2, 128),
            c(1, 1, 1000, 8, 2, 128),
            c(1, 300, 129, 2, 1, 128),
            c(2, 384, 384, 3, 3, 128),
            c(1, 1031, 1031, 2, 1, 128),
            c(1, 1, 1, 1, 1, 64),
            c(2, 200, 333, 4, 2, 64),
            c(1, 300, 129, 2, 1, 64),
            c(3, 700, 517, 4, 1, 64),
            c(1, 1, 1, 1, 1, 96),
            c(2, 200, 333, 4, 2, 96),
            c(1, 1031, 700, 2, 1, 96),
            c(1, 1, 1, 1, 1, 192),
            c(2, 200, 333, 4, 2, 192),
            c(1, 1031, 1031, 2, 1, 192),
            c(1, 1, 1000, 2, 2, 256),
            c(2, 300, 129, 2, 1, 256),
            c(1, 1031, 700, 3, 3, 256),
        ]
    }
}

fn attention_matches_f64_reference(dev: &Device) {
    for c in cases(dev) {
        for layout in [AttentionLayout::Bshd, AttentionLayout::Bhsd] {
            for causal in [false, true] {
                check::<bf16>(dev, c, layout, causal, 2.0, 2e-2, bf16::from_f32, |v| v.to_f64(), None, None);
                check::<f16>(dev, c, layout, causal, 2.0, 4e-3, f16::from_f32, |v| v.to_f64(), None, None);
            }
        }
    }
}

#[test]
fn gpu_attention_matches_f64_reference() {
    if let Some(dev) = gpu_or_skip("gpu_attention_matches_f64_reference") {
        attention_matches_f64_reference(&dev);
    }
}

#[test]
fn interp_attention_matches_f64_reference() {
    attention_matches_f64_reference(&Device::cpu());
}

/// Logits in the hundreds: `exp` of them overflows f32, the online softmax must not.
#[test]
fn gpu_attention_survives_large_logits() {
    if let Some(dev) = gpu_or_skip("gpu_attention_survives_large_logits") {
        for (causal, d) in [(false, 128), (true, 128), (false, 64), (true, 64)] {
            let c = Case { b: 1, sq: 257, sk: 519, h: 2, hk: 2, d };
            check::<bf16>(&dev, c, AttentionLayout::Bshd, causal, 12.0, 3e-2, bf16::from_f32, |v| v.to_f64(), None, None);
            check::<f16>(&dev, c, AttentionLayout::Bhsd, causal, 12.0, 1e-2, f16::from_f32, |v| v.to_f64(), None, None);
        }
    }
}

/// Keys split into ranges run apart and combined (`kv_splits`): more parts than key blocks,
/// causal rows whose every key is masked (seq_q > seq_k: output 0, lse −∞ in every part).
/// Unasked (`None`), a non-causal grid of a wave and two tiles splits those two tiles' keys
/// and leaves the wave's tiles whole.
fn kv_splits_match_f64_reference(dev: &Device) {
    let c = |b, sq, sk, h, hk, d| Case { b, sq, sk, h, hk, d };
    let cases = if dev.is_cpu() {
        vec![(c(1, 130, 300, 1, 1, 64), Some(3)), (c(1, 70, 200, 1, 1, 192), Some(2))]
    } else {
        let heads = (dev.sm_count() as usize + 2) / 2;
        vec![
            (c(2, 200, 333, 4, 2, 128), Some(2)),
            (c(1, 1, 1000, 8, 2, 128), Some(5)),
            (c(1, 300, 129, 2, 1, 64), Some(16)),
            (c(1, 517, 1400, 3, 1, 64), Some(4)),
            (c(1, 129, 2000, heads, 1, 64), None),
            (c(1, 200, 900, 2, 1, 192), Some(3)),
            (c(1, 129, 1500, heads, 1, 256), None),
        ]
    };
    for (c, n) in cases {
        for causal in [false, true] {
            check::<bf16>(dev, c, AttentionLayout::Bshd, causal, 2.0, 2e-2, bf16::from_f32, |v| v.to_f64(), None, n);
            check::<f16>(dev, c, AttentionLayout::Bhsd, causal, 2.0, 4e-3, f16::from_f32, |v| v.to_f64(), None, n);
        }
    }
}

#[test]
fn gpu_attention_kv_splits_match_f64_reference() {
    if let Some(dev) = gpu_or_skip("gpu_attention_kv_splits_match_f64_reference") {
        kv_splits_match_f64_reference(&dev);
    }
}

#[test]
fn interp_attention_kv_splits_match_f64_reference() {
    kv_splits_match_f64_reference(&Device::cpu());
}

/// Sequences of different lengths packed end to end (empty ones too): each against the f64
/// reference on its own rows; 5 rows after the last sequence belong to none and must stay
/// poisoned (a tile that wrote past its sequence's end would reach them).
fn varlen_matches_f64_reference(
    dev: &Device, lens_q: &[usize], lens_k: &[usize], h: usize, hk: usize, d: usize, variant: Option<&'static str>,
) {
    let offsets = |lens: &[usize]| -> Vec<usize> {
        std::iter::once(0).chain(lens.iter().scan(0, |acc, &l| Some(*acc + l).inspect(|&x| *acc = x))).collect()
    };
    let (cq, ck) = (offsets(lens_q), offsets(lens_k));
    let (tq, tk) = (cq[lens_q.len()] + 5, ck[lens_k.len()]);
    for causal in [false, true] {
        let gen = |n: usize| -> (Vec<bf16>, Vec<f64>) {
            let x: Vec<bf16> = random(n, -2.0, 2.0).into_iter().map(bf16::from_f32).collect();
            let w = x.iter().map(|v| v.to_f64()).collect();
            (x, w)
        };
        let (q, qw) = gen(tq * h * d);
        let (k, kw) = gen(tk * hk * d);
        let (v, vw) = gen(tk * hk * d);
        let scale = 1.0 / (d as f32).sqrt();
        let mut opts = Attention::new().causal(causal);
        if let Some(v) = variant {
            opts = opts.variant(v);
        }
        let qt = Tensor::from_host(dev, &q, &[tq, h, d]).unwrap();
        let (kt, vt) = (Tensor::from_host(dev, &k, &[tk, hk, d]).unwrap(), Tensor::from_host(dev, &v, &[tk, hk, d]).unwrap());
        let mut o = Tensor::full(dev, &[tq, h, d], bf16::NAN).unwrap();
        let mut lse = Tensor::full(dev, &[h, tq], f32::NAN).unwrap();
        let to_i32 = |v: &[usize]| v.iter().map(|&x| x as i32).collect::<Vec<i32>>();
        let cqt = Tensor::from_host(dev, &to_i32(&cq), &[cq.len()]).unwrap();
        let ckt = Tensor::from_host(dev, &to_i32(&ck), &[ck.len()]).unwrap();
        let max_q = lens_q.iter().copied().max().unwrap_or(1).max(1);
        tessera_kernels::attention_varlen(dev, &opts, &qt, &kt, &vt, &mut o, &mut lse, &cqt, &ckt, max_q).unwrap();
        let (o, lse) = (o.to_host().unwrap(), lse.to_host().unwrap());
        let end = cq[lens_q.len()];
        assert!(o[end * h * d..].iter().all(|v| v.is_nan()), "causal={causal}: rows past the last sequence were written");
        assert!((0..h).all(|hi| lse[hi * tq + end..(hi + 1) * tq].iter().all(|v| v.is_nan())), "lse past the last sequence written");
        for (bi, (&lq, &lk)) in lens_q.iter().zip(lens_k).enumerate() {
            if lq == 0 {
                continue;
            }
            let c = Case { b: 1, sq: lq, sk: lk, h, hk, d };
            let (qs, ks) = (cq[bi] * h * d, ck[bi] * hk * d);
            let (want_o, want_lse) = reference(
                c,
                AttentionLayout::Bshd,
                causal,
                f64::from(scale),
                &qw[qs..qs + lq * h * d],
                &kw[ks..ks + lk * hk * d],
                &vw[ks..ks + lk * hk * d],
            );
            let got: Vec<f64> = o[qs..qs + lq * h * d].iter().map(|v| v.to_f64()).collect();
            let what = format!("varlen sequence {bi} ({lq}×{lk}, d{d}) causal={causal} {variant:?}");
            let err = rel_error(&got, &want_o);
            assert!(err < 2e-2, "{what}: O relative error {err}");
            for hi in 0..h {
                for i in 0..lq {
                    let (g, w) = (f64::from(lse[hi * tq + cq[bi] + i]), want_lse[hi * lq + i]);
                    let ok = if w.is_infinite() { g == w } else { (g - w).abs() <= 1e-3 * w.abs().max(1.0) };
                    assert!(ok, "{what}: lse[{hi}, {i}] = {g}, expected {w}");
                }
            }
        }
    }
}

#[test]
fn gpu_attention_varlen_matches_f64_reference() {
    if let Some(dev) = gpu_or_skip("gpu_attention_varlen_matches_f64_reference") {
        for d in [128, 64, 96, 192, 256] {
            varlen_matches_f64_reference(&dev, &[1, 200, 0, 129, 700, 64], &[5, 333, 17, 0, 700, 1], 4, 2, d, None);
        }
    }
}

/// A packed sequence with queries and no keys (its rows 0, lse −∞) beside one with both;
/// and more tiles than the GPU has SMs, every sequence with keys (each block takes several).
/// Apart from the mixed test above, so that a sanitizer can take each alone.
#[test]
fn gpu_attention_varlen_keyless_sequence() {
    if let Some(dev) = gpu_or_skip("gpu_attention_varlen_keyless_sequence") {
        varlen_matches_f64_reference(&dev, &[129, 5], &[0, 7], 2, 1, 128, None);
    }
}

#[test]
fn gpu_attention_varlen_more_tiles_than_sms() {
    if let Some(dev) = gpu_or_skip("gpu_attention_varlen_more_tiles_than_sms") {
        let heads = (dev.sm_count() as usize).div_ceil(12) + 1;
        varlen_matches_f64_reference(&dev, &[700, 650], &[700, 333], heads, 1, 64, None);
    }
}

/// The packed test on a shape from `TESSERA_VARLEN` (`"1,200,0;5,333,17;4;2;128"`: query
/// lengths, key lengths, heads, key heads, head dim), so that a sanitizer can take one shape
/// at a time. Two more fields (`…;128;1;50`: causal `0`, `1` or `01`, and a count) launch it that
/// many times instead, unchecked, saying when each launch starts and ends (where a run stalls).
/// Ignored unless asked for (`--ignored`); without the variable it does nothing.
#[test]
#[ignore = "a shape named by TESSERA_VARLEN, for sanitizer runs"]
fn gpu_attention_varlen_shape_from_env() {
    let Ok(spec) = std::env::var("TESSERA_VARLEN") else { return };
    let fields: Vec<&str> = spec.split(';').collect();
    let nums = |f: &str| -> Vec<usize> { f.split(',').map(|v| v.trim().parse().expect("TESSERA_VARLEN: a number")).collect() };
    let [q, k, h, hk, d] =
        [0, 1, 2, 3, 4].map(|i| nums(fields.get(i).copied().unwrap_or_else(|| panic!("TESSERA_VARLEN: five fields, found {spec:?}"))));
    let Some(dev) = gpu_or_skip("gpu_attention_varlen_shape_from_env") else { return };
    let (Some(causal), Some(count)) = (fields.get(5), fields.get(6)) else {
        return varlen_matches_f64_reference(&dev, &q, &k, h[0], hk[0], d[0], None);
    };
    let (h, hk, d) = (h[0], hk[0], d[0]);
    let offsets = |lens: &[usize]| -> Vec<i32> {
        std::iter::once(0).chain(lens.iter().scan(0, |a, &l| Some(*a + l).inspect(|&x| *a = x))).map(|x| x as i32).collect()
    };
    let (cq, ck) = (offsets(&q), offsets(&k));
    let (tq, tk) = (*cq.last().unwrap() as usize + 5, *ck.last().unwrap() as usize);
    let gen = |n: usize| -> Tensor<bf16> {
        Tensor::from_host(&dev, &random(n, -2.0, 2.0).into_iter().map(bf16::from_f32).collect::<Vec<_>>(), &[n]).unwrap()
    };
    let (qt, kt, vt) = (
        gen(tq * h * d).restride(0, &[tq, h, d], &[h * d, d, 1]).unwrap(),
        gen(tk * hk * d).restride(0, &[tk, hk, d], &[hk * d, d, 1]).unwrap(),
        gen(tk * hk * d).restride(0, &[tk, hk, d], &[hk * d, d, 1]).unwrap(),
    );
    let mut o = Tensor::full(&dev, &[tq, h, d], bf16::NAN).unwrap();
    let mut lse = Tensor::full(&dev, &[h, tq], f32::NAN).unwrap();
    let (cqt, ckt) = (Tensor::from_host(&dev, &cq, &[cq.len()]).unwrap(), Tensor::from_host(&dev, &ck, &[ck.len()]).unwrap());
    let max_q = q.iter().copied().max().unwrap_or(1).max(1);
    let count: usize = count.parse().expect("TESSERA_VARLEN: a count");
    for c in causal.chars() {
        let opts = Attention::new().causal(c == '1');
        for i in 0..count {
            eprintln!("launch causal={c} #{i}");
            tessera_kernels::attention_varlen(&dev, &opts, &qt, &kt, &vt, &mut o, &mut lse, &cqt, &ckt, max_q).unwrap();
            let _ = lse.to_host().unwrap();
            eprintln!("done causal={c} #{i}");
        }
    }
}

#[test]
fn interp_attention_varlen_matches_f64_reference() {
    varlen_matches_f64_reference(&Device::cpu(), &[3, 130, 0], &[7, 140, 2], 2, 1, 64, None);
}

/// Every variant the tuner may choose (each pipeline depth and key block of each head dim), dense and
/// packed, on odd shapes; an unknown variant is an error naming `variant`.
fn every_attention_variant_matches_f64_reference(dev: &Device) {
    use tessera_kernels::attention_variants;
    for d in [64, 96, 128, 192, 256] {
        let dense = attention_variants::<bf16>(d, false);
        assert!(!dense.is_empty());
        for &v in &dense {
            let c = Case { b: 2, sq: 131, sk: 259, h: 2, hk: 1, d };
            check::<bf16>(dev, c, AttentionLayout::Bshd, true, 2.0, 2e-2, bf16::from_f32, |x| x.to_f64(), Some(v), None);
            check::<bf16>(dev, c, AttentionLayout::Bhsd, false, 2.0, 2e-2, bf16::from_f32, |x| x.to_f64(), Some(v), None);
        }
        for v in attention_variants::<bf16>(d, true) {
            varlen_matches_f64_reference(dev, &[3, 130, 0, 70], &[7, 140, 2, 300], 2, 1, d, Some(v));
        }
    }
    let names =
        |d, packed| attention_variants::<bf16>(d, packed).into_iter().map(|n| n.split("__").nth(1).unwrap_or(n)).collect::<Vec<_>>();
    // Those that fit in shared memory, in the attribute's order (stages 4, 2, 3; blocks 192, 160, 128).
    assert_eq!(names(128, false), ["d128_stages2_bn160", "d128_stages2_bn128"]);
    assert_eq!(
        names(64, false),
        [
            "d64_stages4_bn160",
            "d64_stages4_bn128",
            "d64_stages2_bn192",
            "d64_stages2_bn160",
            "d64_stages2_bn128",
            "d64_stages3_bn192",
            "d64_stages3_bn160",
            "d64_stages3_bn128"
        ]
    );
    assert_eq!(
        names(64, true),
        ["d64_stages4_bn160", "d64_stages4_bn128", "d64_stages2_bn160", "d64_stages2_bn128", "d64_stages3_bn160", "d64_stages3_bn128"]
    );
    // Head dim 96 (64-byte swizzle panels): 160- and 128-key blocks, two or three stages.
    assert_eq!(names(96, false), ["d96_stages2_bn160", "d96_stages2_bn128", "d96_stages3_bn160", "d96_stages3_bn128"]);
    // Past 128 columns: 96- and 64-key blocks, two stages (three of 64 keys at 192).
    assert_eq!(names(192, false), ["d192_stages2_bn96", "d192_stages2_bn64", "d192_stages3_bn64"]);
    assert_eq!(names(256, false), ["d256_stages2_bn64"]);
    assert_eq!(names(256, true), ["d256_stages2_bn64"]);
    let q = Tensor::full(dev, &[1, 4, 1, 64], bf16::ONE).unwrap();
    let mut o = Tensor::full(dev, &[1, 4, 1, 64], bf16::NAN).unwrap();
    let opts = Attention::new().variant("flash_attention_bf16__d128_stages2_bn160");
    match tessera_kernels::attention(dev, &opts, &q, &q, &q, &mut o) {
        Err(tessera::Error::Argument { arg, .. }) => assert_eq!(arg, "variant"),
        other => panic!("a d128 variant for d64 inputs: expected an argument error, got {other:?}"),
    }
}

#[test]
fn gpu_every_attention_variant_matches_f64_reference() {
    if let Some(dev) = gpu_or_skip("gpu_every_attention_variant") {
        every_attention_variant_matches_f64_reference(&dev);
    }
}

#[test]
fn interp_every_attention_variant_matches_f64_reference() {
    every_attention_variant_matches_f64_reference(&Device::cpu());
}

/// Misfit arguments are `Error::Argument`s naming the argument, before anything runs.
#[test]
fn bad_input_attention_names_the_argument() {
    let dev = Device::cpu();
    let t = |shape: &[usize]| Tensor::<bf16>::zeros(&dev, shape).unwrap();
    let named = |r: tessera::Result<()>| match r {
        Err(tessera::Error::Argument { arg, .. }) => arg,
        other => panic!("expected an argument error, got {other:?}"),
    };
    let opts = Attention::new();
    let (q, k, v) = (t(&[1, 8, 4, 128]), t(&[1, 8, 3, 128]), t(&[1, 8, 3, 128]));
    let mut o = t(&[1, 8, 4, 128]);
    assert_eq!(named(tessera_kernels::attention(&dev, &opts, &q, &k, &v, &mut o)), "k", "3 kv heads for 4 heads");
    let (q, k) = (t(&[1, 8, 2, 80]), t(&[1, 8, 2, 80]));
    let mut o = t(&[1, 8, 2, 80]);
    assert_eq!(named(tessera_kernels::attention(&dev, &opts, &q, &k, &k, &mut o)), "q", "head_dim 80");
    let (q, k) = (t(&[1, 8, 2, 64]), t(&[1, 8, 2, 64]));
    let mut o = t(&[1, 9, 2, 64]);
    assert_eq!(named(tessera_kernels::attention(&dev, &opts, &q, &k, &k, &mut o)), "o", "o of another shape");
    let (q, k) = (t(&[8, 2, 64]), t(&[8, 2, 64]));
    let mut o = t(&[8, 2, 64]);
    assert_eq!(named(tessera_kernels::attention(&dev, &opts, &q, &k, &k, &mut o)), "q", "rank 3 for the padded form");
    let mut lse = Tensor::<f32>::zeros(&dev, &[2, 8]).unwrap();
    let (cq, ck) = (Tensor::from_host(&dev, &[0i32, 8], &[2]).unwrap(), Tensor::from_host(&dev, &[0i32, 4, 8], &[3]).unwrap());
    let r = tessera_kernels::attention_varlen(&dev, &opts, &q, &k, &k, &mut o, &mut lse, &cq, &ck, 8);
    assert_eq!(named(r), "cu_seqlens_k", "offsets of different lengths");
    let cq = Tensor::from_host(&dev, &[0i32, 8], &[2]).unwrap();
    let r = tessera_kernels::attention_varlen(&dev, &opts.kv_splits(2), &q, &k, &k, &mut o, &mut lse, &cq, &cq, 8);
    assert_eq!(named(r), "kv_splits", "packed sequences split");
    // Offsets read back and checked (on by default in debug builds; asked for here): decreasing,
    // past the packed rows, not from 0, a sequence longer than max_seqlen_q.
    let checked = opts.check_offsets(true);
    let offsets = |x: &[i32]| Tensor::from_host(&dev, x, &[x.len()]).unwrap();
    for (cq, ck, max_q, bad, why) in [
        (&[0, 6, 4][..], &[0, 4, 8][..], 8, "cu_seqlens_q", "decreasing query offsets"),
        (&[0, 4, 8], &[0, 4, 9], 8, "cu_seqlens_k", "key offsets past the 8 packed rows"),
        (&[1, 4, 8], &[0, 4, 8], 8, "cu_seqlens_q", "offsets not from 0"),
        (&[0, 2, 8], &[0, 4, 8], 5, "cu_seqlens_q", "a sequence of 6 rows with max_seqlen_q 5"),
    ] {
        let r = tessera_kernels::attention_varlen(&dev, &checked, &q, &k, &k, &mut o, &mut lse, &offsets(cq), &offsets(ck), max_q);
        assert_eq!(named(r), bad, "{why}");
    }
    assert!(tessera_kernels::check_cu_seqlens(&[0, 3, 3, 8], &[0, 0, 5, 8], 8, 8, 5).is_ok(), "empty sequences are fine");
    let (q, k) = (t(&[1, 8, 2, 64]), t(&[1, 8, 2, 64]));
    let mut o = t(&[1, 8, 2, 64]);
    assert_eq!(named(tessera_kernels::attention(&dev, &opts.kv_splits(0), &q, &k, &k, &mut o)), "kv_splits", "no parts");
}

/// Unchecked offsets that decrease or run past the packed rows (`check_offsets(false)`): the
/// kernels clamp each sequence to the tensors, so the forward and the backward run to the end
/// without touching memory outside them (the interpreter stops on any such access), their
/// outputs finite.
#[test]
fn interp_attention_varlen_clamps_bad_offsets() {
    let dev = Device::cpu();
    let (tq, h, d) = (24, 2, 64);
    let gen = |n: usize| random(n, -1.0, 1.0).into_iter().map(bf16::from_f32).collect::<Vec<_>>();
    let t = |x: &[bf16]| Tensor::from_host(&dev, x, &[tq, h, d]).unwrap();
    let (q, k, v, dout) = (t(&gen(tq * h * d)), t(&gen(tq * h * d)), t(&gen(tq * h * d)), t(&gen(tq * h * d)));
    let offsets = |x: &[i32]| Tensor::from_host(&dev, x, &[x.len()]).unwrap();
    let opts = Attention::new().check_offsets(false);
    for (cu, why) in [(&[0, 8, 5, 24][..], "decreasing"), (&[0, 8, 40, 90][..], "past the 24 rows"), (&[-9, 8, 16, 24][..], "negative")] {
        let (cq, ck) = (offsets(cu), offsets(cu));
        let mut o = Tensor::full(&dev, &[tq, h, d], bf16::from_f32(0.0)).unwrap();
        let mut lse = Tensor::full(&dev, &[h, tq], 0.0f32).unwrap();
        tessera_kernels::attention_varlen(&dev, &opts, &q, &k, &v, &mut o, &mut lse, &cq, &ck, 24).unwrap_or_else(|e| panic!("{why}: {e}"));
        let g = tessera_kernels::attention_varlen_backward(&dev, &opts, &q, &k, &v, &o, &lse, &dout, &cq, &ck, 24, 24)
            .unwrap_or_else(|e| panic!("{why}: backward: {e}"));
        for (name, x) in [("o", &o), ("dq", &g.dq), ("dk", &g.dk), ("dv", &g.dv)] {
            assert!(x.to_host().unwrap().iter().all(|v| v.to_f32().is_finite()), "{why}: {name} not finite");
        }
    }
}

/// Attention at the edges: rows whose every key is masked (causal, seq_q > seq_k) give 0 and
/// an lse of −∞, never NaN, unsplit and split; a NaN in one query row makes that row's output
/// and lse NaN and no other's; logits of ±1e4 (queries and keys of ±95) match the f64
/// reference.
fn attention_edges(dev: &Device) {
    let (b, sq, sk, h, d) = if dev.is_cpu() { (1, 140, 10, 2, 64) } else { (2, 300, 129, 2, 64) };
    let masked = sq - sk;
    let n = b * sq * h * d;
    let mut q: Vec<bf16> = random(n, -2.0, 2.0).into_iter().map(bf16::from_f32).collect();
    // Query row `masked + 5` of head 1 in batch 0 reads NaN.
    let nan_row = masked + 5;
    q[(nan_row * h + 1) * d + 3] = bf16::NAN;
    let kv: Vec<bf16> = random(b * sk * h * d, -2.0, 2.0).into_iter().map(bf16::from_f32).collect();
    let qt = Tensor::from_host(dev, &q, &[b, sq, h, d]).unwrap();
    let kt = Tensor::from_host(dev, &kv, &[b, sk, h, d]).unwrap();
    for splits in [None, Some(2)] {
        let mut opts = Attention::new().causal(true);
        if let Some(s) = splits {
            opts = opts.kv_splits(s);
        }
        let mut o = Tensor::full(dev, &[b, sq, h, d], bf16::from_f32(-7.0)).unwrap();
        let mut lse = Tensor::full(dev, &[b, h, sq], -7.0f32).unwrap();
        tessera_kernels::attention_with_lse(dev, &opts, &qt, &kt, &kt, &mut o, &mut lse).unwrap();
        let (o, lse) = (o.to_host().unwrap(), lse.to_host().unwrap());
        for bi in 0..b {
            for i in 0..sq {
                for hi in 0..h {
                    let row = &o[((bi * sq + i) * h + hi) * d..][..d];
                    let l = lse[(bi * h + hi) * sq + i];
                    let what = format!("kv_splits {splits:?}: batch {bi} row {i} head {hi}");
                    if bi == 0 && i == nan_row && hi == 1 {
                        assert!(row.iter().all(|v| v.is_nan()) && l.is_nan(), "{what}: the NaN's row is NaN");
                    } else if i < masked {
                        assert!(row.iter().all(|v| v.to_f32() == 0.0) && l == f32::NEG_INFINITY, "{what}: masked throughout: 0, −∞");
                    } else {
                        assert!(row.iter().all(|v| v.is_finite()) && l.is_finite(), "{what}: finite");
                    }
                }
            }
        }
    }
    let c = Case { b: 1, sq: if dev.is_cpu() { 70 } else { 257 }, sk: if dev.is_cpu() { 90 } else { 519 }, h: 2, hk: 1, d: 64 };
    for causal in [false, true] {
        check::<bf16>(dev, c, AttentionLayout::Bshd, causal, 95.0, 5e-2, bf16::from_f32, |v| v.to_f64(), None, None);
    }
}

#[test]
fn gpu_attention_numerics_at_the_edges() {
    if let Some(dev) = gpu_or_skip("gpu_attention_numerics_at_the_edges") {
        attention_edges(&dev);
    }
}

#[test]
fn interp_attention_numerics_at_the_edges() {
    attention_edges(&Device::cpu());
}
