//! FlashAttention backward against float64 gradients of softmax(Q·Kᵀ·scale)·V computed on the
//! host from the definition (P from its own softmax, not from our forward's log-sum-exp):
//! `dV = Pᵀ·dO`, `dP = dO·Vᵀ`, `dS = P ∘ (dP − rowsum(dP ∘ P))`, `dQ = scale·dS·K`,
//! `dK = scale·dSᵀ·Q`, summed over the query heads of a key/value group. Fresh random inputs,
//! odd lengths, both layouts, causal and not, grouped-query heads, seq_q ≠ seq_k; gradients
//! poisoned before the launch (the library allocates them, so the forward's outputs are
//! poisoned instead). On the GPU (Hopper) and, at small shapes, in the interpreter.

mod common;

use common::{attention_backward_reference, causal_mask, random, unit_grad, unmodified, AttentionDims, Grad, ScoreMods};
use tessera::testing::gpu_or_skip;
use tessera::{bf16, f16, Device, Tensor};
use tessera_kernels::{Attention, AttentionElement, AttentionLayout};

/// One problem: batch, query length, key length, query heads, key/value heads, head dim.
type Case = AttentionDims;

/// The f64 gradients `[dq, dk, dv]` in `layout`.
#[allow(clippy::too_many_arguments)]
fn reference(c: Case, layout: AttentionLayout, causal: bool, scale: f64, q: &[f64], k: &[f64], v: &[f64], dout: &[f64]) -> [Grad; 3] {
    let at = |s_len: usize, heads: usize, bi: usize, si: usize, hi: usize| match layout {
        AttentionLayout::Bshd => ((bi * s_len + si) * heads + hi) * c.d,
        AttentionLayout::Bhsd => ((bi * heads + hi) * s_len + si) * c.d,
    };
    let visible = causal_mask(causal, c.sk as i64 - c.sq as i64);
    attention_backward_reference(
        c,
        &at,
        scale,
        &ScoreMods { score: &unmodified, grad: &unit_grad, visible: &visible, dropout: None },
        q,
        k,
        v,
        dout,
    )
}

fn check<T: AttentionElement>(
    dev: &Device, c: Case, layout: AttentionLayout, causal: bool, tol: f64, to: fn(f32) -> T, from: fn(T) -> f64,
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
    let (q, qw) = gen(qs.iter().product(), 2.0);
    let (k, kw) = gen(ks.iter().product(), 2.0);
    let (v, vw) = gen(ks.iter().product(), 1.0);
    let (dout, dow) = gen(qs.iter().product(), 1.0);
    let scale = 1.0 / (c.d as f32).sqrt() * random(1, 0.5, 1.5)[0];
    let opts = Attention::new().layout(layout).causal(causal).scale(scale);
    let t = |x: &[T], s: &[usize]| Tensor::from_host(dev, x, s).unwrap();
    let (qt, kt, vt, dot) = (t(&q, &qs), t(&k, &ks), t(&v, &ks), t(&dout, &qs));
    let mut o = Tensor::full(dev, &qs, to(f32::NAN)).unwrap();
    let mut lse = Tensor::full(dev, &[c.b, c.h, c.sq], f32::NAN).unwrap();
    tessera_kernels::attention_with_lse(dev, &opts, &qt, &kt, &vt, &mut o, &mut lse).unwrap();
    let [want_dq, want_dk, want_dv] = reference(c, layout, causal, f64::from(scale), &qw, &kw, &vw, &dow);
    let host = |t: &Tensor<T>| t.to_host().unwrap().into_iter().map(from).collect::<Vec<f64>>();
    // The fast mode (dQ by reduce-adds) and the deterministic one.
    for deterministic in [false, true] {
        let opts = opts.deterministic(deterministic);
        let what = format!("{c:?} {layout:?} causal={causal} deterministic={deterministic}");
        let g = tessera_kernels::attention_backward(dev, &opts, &qt, &kt, &vt, &o, &lse, &dot).unwrap_or_else(|e| panic!("{what}: {e}"));
        for (name, got, want) in [("dq", host(&g.dq), &want_dq), ("dk", host(&g.dk), &want_dk), ("dv", host(&g.dv), &want_dv)] {
            assert!(got.iter().all(|x| x.is_finite()), "{what}: {name} has a non-finite element");
            let err = want.error(&got);
            assert!(err < tol, "{what}: {name} relative error {err}");
        }
        if deterministic {
            // No float atomics: the same bits on a second run.
            let g2 = tessera_kernels::attention_backward(dev, &opts, &qt, &kt, &vt, &o, &lse, &dot).unwrap();
            let bits = |t: &Tensor<T>| host(t).into_iter().map(f64::to_bits).collect::<Vec<_>>();
            assert!(
                bits(&g2.dq) == bits(&g.dq) && bits(&g2.dk) == bits(&g.dk) && bits(&g2.dv) == bits(&g.dv),
                "{what}: a second run differs"
            );
        }
    }
}

fn cases(dev: &Device) -> Vec<Case> {
    let c = |b, sq, sk, h, hk, d| Case { b, sq, sk, h, hk, d };
    if dev.is_cpu() {
        vec![
            c(1, 7, 5, 2, 1, 64),
            c(1, 70, 130, 2, 1, 64),
            c(1, 65, 17, 1, 1, 128),
            c(1, 70, 97, 2, 1, 192),
            c(1, 33, 130, 2, 2, 256),
            c(1, 40, 75, 2, 1, 96),
        ]
    } else {
        vec![
            c(1, 1, 1, 1, 1, 128),
            c(2, 200, 333, 4, 2, 128),
            c(1, 300, 129, 2, 1, 128),
            c(1, 1031, 1031, 2, 1, 128),
            c(1, 1, 1000, 8, 2, 64),
            c(2, 200, 333, 4, 2, 64),
            c(3, 700, 517, 4, 1, 64),
            c(1, 4099, 4099, 2, 2, 64),
            c(1, 1, 1, 1, 1, 96),
            c(2, 200, 333, 4, 2, 96),
            c(1, 1031, 1031, 2, 1, 96),
            c(1, 1, 1, 1, 1, 192),
            c(2, 200, 333, 4, 2, 192),
            c(1, 1031, 1031, 2, 1, 192),
            c(1, 1, 1000, 4, 2, 256),
            c(1, 300, 129, 2, 1, 256),
            c(2, 777, 777, 3, 3, 256),
        ]
    }
}

fn backward_matches_f64(dev: &Device) {
    for c in cases(dev) {
        for layout in [AttentionLayout::Bshd, AttentionLayout::Bhsd] {
            for causal in [false, true] {
                check::<bf16>(dev, c, layout, causal, 3e-2, bf16::from_f32, |v| v.to_f64());
                check::<f16>(dev, c, layout, causal, 6e-3, f16::from_f32, |v| v.to_f64());
            }
        }
    }
}

#[test]
fn gpu_attention_backward_matches_f64_reference() {
    if let Some(dev) = gpu_or_skip("gpu_attention_backward_matches_f64_reference") {
        backward_matches_f64(&dev);
    }
}

#[test]
fn interp_attention_backward_matches_f64_reference() {
    backward_matches_f64(&Device::cpu());
}

/// Packed sequences (`attention_varlen_backward`): each sequence's gradients against the
/// reference of that sequence alone; a sequence without keys (gradients 0) and one without
/// queries (dK, dV 0) among them.
#[allow(clippy::too_many_arguments)]
fn varlen_backward_matches_f64<T: AttentionElement>(
    dev: &Device, lq: &[usize], lk: &[usize], h: usize, hk: usize, d: usize, causal: bool, deterministic: bool, tol: f64, to: fn(f32) -> T,
    from: fn(T) -> f64,
) {
    let (tq, tk): (usize, usize) = (lq.iter().sum(), lk.iter().sum());
    let offsets = |l: &[usize]| {
        std::iter::once(0)
            .chain(l.iter().scan(0, |a, &x| {
                *a += x as i32;
                Some(*a)
            }))
            .collect::<Vec<i32>>()
    };
    let (cq, ck) = (offsets(lq), offsets(lk));
    let gen = |n: usize, r: f32| -> (Vec<T>, Vec<f64>) {
        let x: Vec<T> = random(n, -r, r).into_iter().map(to).collect();
        let w = x.iter().map(|&v| from(v)).collect();
        (x, w)
    };
    let (q, qw) = gen(tq * h * d, 2.0);
    let (k, kw) = gen(tk * hk * d, 2.0);
    let (v, vw) = gen(tk * hk * d, 1.0);
    let (dout, dow) = gen(tq * h * d, 1.0);
    let scale = 1.0 / (d as f32).sqrt();
    let opts = Attention::new().causal(causal).check_offsets(true).deterministic(deterministic);
    let t = |x: &[T], s: &[usize]| Tensor::from_host(dev, x, s).unwrap();
    let (qt, kt, vt, dot) = (t(&q, &[tq, h, d]), t(&k, &[tk, hk, d]), t(&v, &[tk, hk, d]), t(&dout, &[tq, h, d]));
    let (cqt, ckt) = (Tensor::from_host(dev, &cq, &[cq.len()]).unwrap(), Tensor::from_host(dev, &ck, &[ck.len()]).unwrap());
    let mut o = Tensor::full(dev, &[tq, h, d], to(f32::NAN)).unwrap();
    let mut lse = Tensor::full(dev, &[h, tq], f32::NAN).unwrap();
    let (max_q, max_k) = (lq.iter().copied().max().unwrap_or(1).max(1), lk.iter().copied().max().unwrap_or(1).max(1));
    tessera_kernels::attention_varlen(dev, &opts, &qt, &kt, &vt, &mut o, &mut lse, &cqt, &ckt, max_q).unwrap();
    let g = tessera_kernels::attention_varlen_backward(dev, &opts, &qt, &kt, &vt, &o, &lse, &dot, &cqt, &ckt, max_q, max_k).unwrap();
    let host = |t: &Tensor<T>| t.to_host().unwrap().into_iter().map(from).collect::<Vec<f64>>();
    let (gq, gk, gv) = (host(&g.dq), host(&g.dk), host(&g.dv));
    for bi in 0..lq.len() {
        let (q0, k0) = (cq[bi] as usize, ck[bi] as usize);
        let (rq, rk) = (q0 * h * d..(q0 + lq[bi]) * h * d, k0 * hk * d..(k0 + lk[bi]) * hk * d);
        let c = Case { b: 1, sq: lq[bi], sk: lk[bi], h, hk, d };
        let [wq, wk, wv] = reference(
            c,
            AttentionLayout::Bshd,
            causal,
            f64::from(scale),
            &qw[rq.clone()],
            &kw[rk.clone()],
            &vw[rk.clone()],
            &dow[rq.clone()],
        );
        let what = format!("varlen sequence {bi} ({}×{}, d{d}) causal={causal} deterministic={deterministic}", lq[bi], lk[bi]);
        for (name, got, want) in [("dq", &gq[rq.clone()], wq), ("dk", &gk[rk.clone()], wk), ("dv", &gv[rk.clone()], wv)] {
            assert!(got.iter().all(|x| x.is_finite()), "{what}: {name} has a non-finite element");
            // Structural zeros (no keys: dQ; no queries: dK, dV) are written as zeros. A
            // sequence of one key has dQ = 0 only by cancellation (dP − D with P = 1, O = V):
            // the kernel's D comes from the rounded O, so it gets rounding-sized values there,
            // measured against the terms' magnitude by `Grad::error`.
            let structural = if name == "dq" { lk[bi] == 0 } else { lq[bi] == 0 };
            if structural {
                assert!(got.iter().all(|&x| x == 0.0), "{what}: {name} should be 0");
            } else {
                let err = want.error(got);
                assert!(err < tol, "{what}: {name} relative error {err}");
            }
        }
    }
}

#[test]
fn interp_attention_varlen_backward_matches_f64_reference() {
    let dev = Device::cpu();
    for (causal, det) in [(false, false), (false, true), (true, false), (true, true)] {
        let (lq, lk) = ([3, 70, 0, 9, 5], [7, 140, 2, 0, 1]);
        varlen_backward_matches_f64::<bf16>(&dev, &lq, &lk, 2, 1, 64, causal, det, 3e-2, bf16::from_f32, |v| v.to_f64());
        varlen_backward_matches_f64::<f16>(&dev, &[65, 5], &[17, 5], 1, 1, 128, causal, det, 6e-3, f16::from_f32, |v| v.to_f64());
        varlen_backward_matches_f64::<bf16>(&dev, &[3, 70, 0], &[7, 66, 2], 2, 1, 256, causal, det, 3e-2, bf16::from_f32, |v| v.to_f64());
    }
}

#[test]
fn gpu_attention_varlen_backward_matches_f64_reference() {
    if let Some(dev) = gpu_or_skip("gpu_attention_varlen_backward_matches_f64_reference") {
        for (causal, det) in [(false, false), (false, true), (true, false), (true, true)] {
            for d in [64, 96, 128, 192, 256] {
                let (lq, lk) = ([1, 200, 0, 129, 700, 64], [5, 333, 17, 0, 700, 1]);
                varlen_backward_matches_f64::<bf16>(&dev, &lq, &lk, 4, 2, d, causal, det, 3e-2, bf16::from_f32, |v| v.to_f64());
                varlen_backward_matches_f64::<f16>(&dev, &lq, &lk, 4, 2, d, causal, det, 6e-3, f16::from_f32, |v| v.to_f64());
            }
        }
    }
}

#[test]
fn attention_backward_refuses_bad_input() {
    let dev = Device::cpu();
    let z = |s: &[usize]| Tensor::<bf16>::zeros(&dev, s).unwrap();
    let (q, k, o) = (z(&[1, 8, 2, 64]), z(&[1, 8, 1, 64]), z(&[1, 8, 2, 64]));
    let lse = Tensor::<f32>::zeros(&dev, &[1, 2, 8]).unwrap();
    let opts = Attention::new();
    let e = tessera_kernels::attention_backward(&dev, &opts, &q, &k, &k, &o, &lse, &z(&[1, 8, 2, 32])).err().expect("dout's shape");
    assert!(e.to_string().contains("dout"), "{e}");
    let bad_lse = Tensor::<f32>::zeros(&dev, &[1, 2, 9]).unwrap();
    let e = tessera_kernels::attention_backward(&dev, &opts, &q, &k, &k, &o, &bad_lse, &o).err().expect("lse's shape");
    assert!(e.to_string().contains("lse"), "{e}");
    let (q80, k80) = (z(&[1, 8, 2, 80]), z(&[1, 8, 1, 80]));
    let lse2 = Tensor::<f32>::zeros(&dev, &[1, 2, 8]).unwrap();
    let e = tessera_kernels::attention_backward(&dev, &opts, &q80, &k80, &k80, &q80, &lse2, &q80).err().expect("head_dim 80");
    assert!(e.to_string().contains("head_dim"), "{e}");
}

/// At training sizes, beside PyTorch on the device: each gradient's relative error against a
/// float64 reference computed by `tests/attention_torch_reference.py` (PyTorch on the GPU, from
/// the definition), printed beside PyTorch's own bf16 backward's, and asserted below 2·10⁻²
/// — odd lengths, grouped heads, causal and not, soft-capping and a sliding window, head dims
/// 64 to 256. Skips where
/// there is no GPU, or no PyTorch (`TESSERA_TORCH_REFERENCE` names the script elsewhere).
#[test]
fn gpu_attention_backward_matches_torch_at_scale() {
    let Some(dev) = gpu_or_skip("gpu_attention_backward_matches_torch_at_scale") else { return };
    let script = std::env::var("TESSERA_TORCH_REFERENCE")
        .unwrap_or_else(|_| concat!(env!("CARGO_MANIFEST_DIR"), "/tests/attention_torch_reference.py").into());
    let dir = std::env::temp_dir().join(format!("tessera-torch-check-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let write = |name: &str, x: &[bf16]| {
        let bytes: Vec<u8> = x.iter().flat_map(|v| v.to_bits().to_le_bytes()).collect();
        std::fs::write(dir.join(format!("{name}.bin")), bytes).unwrap();
    };
    // (shape, causal, soft-cap, window)
    let cases = [
        (Case { b: 2, sq: 4099, sk: 4099, h: 8, hk: 2, d: 128 }, false, 0.0, 0),
        (Case { b: 2, sq: 4099, sk: 4099, h: 8, hk: 2, d: 128 }, true, 0.0, 0),
        (Case { b: 2, sq: 4099, sk: 4099, h: 8, hk: 8, d: 64 }, true, 0.0, 0),
        (Case { b: 1, sq: 2048, sk: 2048, h: 8, hk: 4, d: 128 }, true, 30.0, 0),
        (Case { b: 1, sq: 4099, sk: 4099, h: 8, hk: 4, d: 64 }, true, 0.0, 1024),
        (Case { b: 1, sq: 3001, sk: 3001, h: 8, hk: 2, d: 96 }, true, 0.0, 0),
        (Case { b: 1, sq: 3001, sk: 3001, h: 8, hk: 2, d: 192 }, false, 0.0, 0),
        (Case { b: 1, sq: 3001, sk: 3001, h: 4, hk: 4, d: 256 }, true, 0.0, 0),
    ];
    for (c, causal, cap, window) in cases {
        let (qs, ks) = ([c.b, c.sq, c.h, c.d], [c.b, c.sk, c.hk, c.d]);
        let gen = |n: usize, r: f32| random(n, -r, r).into_iter().map(bf16::from_f32).collect::<Vec<bf16>>();
        let (q, k, v, dout) =
            (gen(qs.iter().product(), 2.0), gen(ks.iter().product(), 2.0), gen(ks.iter().product(), 1.0), gen(qs.iter().product(), 1.0));
        let scale = 1.0 / (c.d as f32).sqrt();
        let mut opts = Attention::new().causal(causal).scale(scale);
        if cap > 0.0 {
            opts = opts.softcap(cap);
        }
        if window > 0 {
            opts = opts.sliding_window(window);
        }
        let t = |x: &[bf16], s: &[usize]| Tensor::from_host(&dev, x, s).unwrap();
        let (qt, kt, vt, dot) = (t(&q, &qs), t(&k, &ks), t(&v, &ks), t(&dout, &qs));
        let mut o = Tensor::full(&dev, &qs, bf16::from_f32(f32::NAN)).unwrap();
        let mut lse = Tensor::full(&dev, &[c.b, c.h, c.sq], f32::NAN).unwrap();
        tessera_kernels::attention_with_lse(&dev, &opts, &qt, &kt, &vt, &mut o, &mut lse).unwrap();
        for (name, x) in [("q", &q), ("k", &k), ("v", &v), ("dout", &dout)] {
            write(name, x);
        }
        let meta = format!("{} {} {} {} {} {} {} {scale} {cap} {window}", c.b, c.sq, c.sk, c.h, c.hk, c.d, u8::from(causal));
        std::fs::write(dir.join("meta.txt"), meta).unwrap();
        for deterministic in [false, true] {
            let g = tessera_kernels::attention_backward(&dev, &opts.deterministic(deterministic), &qt, &kt, &vt, &o, &lse, &dot).unwrap();
            for (name, x) in [("dq", &g.dq), ("dk", &g.dk), ("dv", &g.dv)] {
                write(name, &x.to_host().unwrap());
            }
            let out = std::process::Command::new("python3").arg(&script).arg(&dir).output().expect("python3");
            let text = String::from_utf8_lossy(&out.stdout).to_string();
            if text.starts_with("error") || !out.status.success() {
                eprintln!("skipped the comparison with PyTorch: {text}{}", String::from_utf8_lossy(&out.stderr));
                return;
            }
            let what = format!("{c:?} causal={causal} softcap={cap} window={window} deterministic={deterministic}");
            for line in text.lines() {
                // `name ours torch`
                let w: Vec<&str> = line.split_whitespace().collect();
                let ours: f64 = w[1].parse().unwrap();
                println!("{what}: {} relative error {ours:.2e} (PyTorch's bf16 backward: {})", w[0], w[2]);
                assert!(ours < 2e-2, "{what}: {} relative error {ours}", w[0]);
            }
        }
    }
    let _ = std::fs::remove_dir_all(&dir);
}
