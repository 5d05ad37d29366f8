//! Shared helpers of the cross-crate tests.
#![allow(dead_code)]

use rand::Rng;

/// Fresh uniform random values in `[lo, hi)`.
pub fn random(n: usize, lo: f32, hi: f32) -> Vec<f32> {
    let mut rng = rand::rng();
    (0..n).map(|_| rng.random_range(lo..hi)).collect()
}

/// Widens to f64 for references.
pub fn wide(v: &[f32]) -> Vec<f64> {
    v.iter().map(|&x| f64::from(x)).collect()
}

/// The odd shapes every kernel is tested on.
pub const SHAPES: &[(usize, usize)] = &[(1, 1), (3, 1000), (1000, 3), (4097, 513), (17, 256), (64, 4096), (5, 7)];

/// GELU, tanh form, in f64 (the GEMM epilogues' references).
pub fn gelu_tanh(x: f64) -> f64 {
    0.5 * x * (1.0 + ((2.0 / std::f64::consts::PI).sqrt() * (x + 0.044715 * x * x * x)).tanh())
}

/// erf in f64: Simpson's rule on [0, |x|] (2000 intervals); ±1 past |x| = 6, where erf is 1
/// to f64's precision (and the rule's step would outgrow the integrand; ±∞ gives ±1).
pub fn erf(x: f64) -> f64 {
    if x.abs() > 6.0 {
        return x.signum();
    }
    let n = 2000;
    let h = x.abs() / n as f64;
    let f = |t: f64| (-t * t).exp();
    let mut s = f(0.0) + f(x.abs());
    for i in 1..n {
        s += f(i as f64 * h) * if i % 2 == 1 { 4.0 } else { 2.0 };
    }
    (s * h / 3.0 * 2.0 / std::f64::consts::PI.sqrt()).copysign(x)
}

/// Attention's shape for [`attention_reference`]: batch, query length, key length, query heads,
/// key/value heads, head dim.
#[derive(Clone, Copy, Debug)]
pub struct AttentionDims {
    pub b: usize,
    pub sq: usize,
    pub sk: usize,
    pub h: usize,
    pub hk: usize,
    pub d: usize,
}

/// What attention's scores go through in [`attention_reference`]: `score(s, i, j, h)` on the
/// scaled score of query `i` and key `j` in head `h`, its derivative `grad(s, i, j, h)` by `s`
/// (for [`attention_backward_reference`]), whether key `j` is visible to query `i`, and
/// dropout's factor on probability `(i, j)` of (batch·head) `bh` (`dropout(bh, i, j)`: 0 or
/// `1 / (1 − p)`; `None`, 1).
pub struct ScoreMods<'a> {
    pub score: &'a dyn Fn(f64, i64, i64, usize) -> f64,
    pub grad: &'a dyn Fn(f64, i64, i64, usize) -> f64,
    pub visible: &'a dyn Fn(i64, i64) -> bool,
    pub dropout: Option<&'a dyn Fn(usize, usize, usize) -> f64>,
}

impl ScoreMods<'_> {
    /// Dropout's factor on probability `(i, j)` of (batch·head) `bh`.
    pub fn keep(&self, bh: usize, i: usize, j: usize) -> f64 {
        self.dropout.map_or(1.0, |z| z(bh, i, j))
    }
}

/// No score modifier, as [`ScoreMods::score`].
pub fn unmodified(s: f64, _: i64, _: i64, _: usize) -> f64 {
    s
}

/// [`unmodified`]'s derivative, as [`ScoreMods::grad`].
pub fn unit_grad(_: f64, _: i64, _: i64, _: usize) -> f64 {
    1.0
}

/// The causal mask (the diagonal aligned at the end, `shift` = seq_k − seq_q) or none, as
/// [`ScoreMods::visible`].
pub fn causal_mask(causal: bool, shift: i64) -> impl Fn(i64, i64) -> bool {
    move |i, j| !causal || j <= i + shift
}

/// Attention in float64: `o` (laid out as `q`) and the natural-log LSE `[b, h, sq]` (−∞ where
/// every key is masked, `o` 0 there). `at(len, heads, b, s, h)` is where row `s` of head `h`
/// of batch entry `b` starts in a tensor of `len` rows and `heads` heads; query head `h` reads
/// key/value head `h / (h_q / h_kv)`.
#[allow(clippy::too_many_arguments)]
pub fn attention_reference(
    c: AttentionDims, at: &dyn Fn(usize, usize, usize, usize, usize) -> usize, scale: f64, mods: &ScoreMods<'_>, q: &[f64], k: &[f64],
    v: &[f64],
) -> (Vec<f64>, Vec<f64>) {
    let mut o = vec![0.0; c.b * c.sq * c.h * c.d];
    let mut lse = vec![0.0; c.b * c.h * c.sq];
    let group = c.h / c.hk;
    let mut s = vec![0.0; c.sk];
    for bi in 0..c.b {
        for hi in 0..c.h {
            let kh = hi / group;
            for i in 0..c.sq {
                let qi = at(c.sq, c.h, bi, i, hi);
                let mut mx = f64::NEG_INFINITY;
                for (j, sj) in s.iter_mut().enumerate() {
                    *sj = if (mods.visible)(i as i64, j as i64) {
                        let kj = at(c.sk, c.hk, bi, j, kh);
                        let raw = (0..c.d).map(|x| q[qi + x] * k[kj + x]).sum::<f64>() * scale;
                        (mods.score)(raw, i as i64, j as i64, hi)
                    } else {
                        f64::NEG_INFINITY
                    };
                    mx = mx.max(*sj);
                }
                let out = &mut o[qi..qi + c.d];
                if mx == f64::NEG_INFINITY {
                    lse[(bi * c.h + hi) * c.sq + i] = f64::NEG_INFINITY;
                    continue;
                }
                let mut sum = 0.0;
                for (j, &sj) in s.iter().enumerate() {
                    let p = (sj - mx).exp();
                    sum += p;
                    // (Dropped after the softmax: the sum is the undropped one.)
                    let pz = p * mods.keep(bi * c.h + hi, i, j);
                    if pz > 0.0 {
                        let vj = at(c.sk, c.hk, bi, j, kh);
                        for x in 0..c.d {
                            out[x] += pz * v[vj + x];
                        }
                    }
                }
                out.iter_mut().for_each(|x| *x /= sum);
                lse[(bi * c.h + hi) * c.sq + i] = mx + sum.ln();
            }
        }
    }
    (o, lse)
}

/// Attention's gradients in float64 from the definition, under `mods` (layouts and heads as
/// [`attention_reference`]'s): per query row, P = softmax of the modified scores over its
/// visible keys (Z its dropout factors, 1 without), `dV += (P∘Z)ᵀ·dO`, `dP = Z ∘ (dO·Vᵀ)`,
/// `dS = P ∘ (dP − rowsum(dP ∘ P))` taken back
/// through the modifier (`× grad`), `dQ = scale·dS·K`, `dK = scale·dSᵀ·Q`, summed over the query
/// heads of a key/value group. Returns each gradient with the absolute sum of its terms
/// (see [`Grad::error`]).
#[allow(clippy::too_many_arguments)]
pub fn attention_backward_reference(
    c: AttentionDims, at: &dyn Fn(usize, usize, usize, usize, usize) -> usize, scale: f64, mods: &ScoreMods<'_>, q: &[f64], k: &[f64],
    v: &[f64], dout: &[f64],
) -> [Grad; 3] {
    let [mut dq, mut dk, mut dv] = [q.len(), k.len(), v.len()].map(Grad::zeros);
    let group = c.h / c.hk;
    let dot = |a: &[f64], b: &[f64]| a.iter().zip(b).map(|(x, y)| x * y).sum::<f64>();
    for bi in 0..c.b {
        for hi in 0..c.h {
            let kh = hi / group;
            for i in 0..c.sq {
                let qi = at(c.sq, c.h, bi, i, hi);
                let raw: Vec<f64> = (0..c.sk).map(|j| dot(&q[qi..qi + c.d], &k[at(c.sk, c.hk, bi, j, kh)..][..c.d]) * scale).collect();
                let s: Vec<f64> =
                    (0..c.sk)
                        .map(|j| {
                            if (mods.visible)(i as i64, j as i64) {
                                (mods.score)(raw[j], i as i64, j as i64, hi)
                            } else {
                                f64::NEG_INFINITY
                            }
                        })
                        .collect();
                let mx = s.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
                if mx == f64::NEG_INFINITY {
                    continue;
                }
                let e: Vec<f64> = s.iter().map(|x| (x - mx).exp()).collect();
                let sum: f64 = e.iter().sum();
                let p: Vec<f64> = e.iter().map(|x| x / sum).collect();
                // With dropout O = (P∘Z)·V: dV by P∘Z, and dP reaches P through Z.
                let z: Vec<f64> = (0..c.sk).map(|j| mods.keep(bi * c.h + hi, i, j)).collect();
                let dp: Vec<f64> = (0..c.sk).map(|j| z[j] * dot(&dout[qi..qi + c.d], &v[at(c.sk, c.hk, bi, j, kh)..][..c.d])).collect();
                let rowdot: f64 = p.iter().zip(&dp).map(|(a, b)| a * b).sum();
                for j in 0..c.sk {
                    if p[j] == 0.0 {
                        continue;
                    }
                    let kj = at(c.sk, c.hk, bi, j, kh);
                    let g = (mods.grad)(raw[j], i as i64, j as i64, hi);
                    let ds = p[j] * (dp[j] - rowdot) * g;
                    // dS's two parts apart, for the magnitude: P·dP and P·D can cancel.
                    let ds_abs = p[j] * (dp[j].abs() + rowdot.abs()) * g.abs();
                    for x in 0..c.d {
                        let pz = p[j] * z[j] * dout[qi + x];
                        dv.add(kj + x, pz, pz.abs());
                        dq.add(qi + x, scale * ds * k[kj + x], scale * ds_abs * k[kj + x].abs());
                        dk.add(kj + x, scale * ds * q[qi + x], scale * ds_abs * q[qi + x].abs());
                    }
                }
            }
        }
    }
    [dq, dk, dv]
}

/// A float64 gradient and, per element, the sum of its terms' absolute values (for dQ and dK
/// each term `P·(dP − D)·K` counted as `P·(|dP| + |D|)·|K|`: the kernel's D comes from the
/// rounded O, so its error is a fraction of |D|, whatever dP − D is).
pub struct Grad {
    pub value: Vec<f64>,
    pub magnitude: Vec<f64>,
}

impl Grad {
    fn zeros(n: usize) -> Self {
        Grad { value: vec![0.0; n], magnitude: vec![0.0; n] }
    }

    fn add(&mut self, i: usize, term: f64, magnitude: f64) {
        self.value[i] += term;
        self.magnitude[i] += magnitude;
    }

    /// `got`'s relative error: ‖got − value‖₂ over ‖value‖₂, or over an eighth of
    /// ‖magnitude‖₂ where that is larger. The kernels round P, dS and O to 16 bits, and a sum
    /// of rounded terms is off by up to the rounding of their absolute sum: where the terms
    /// cancel (a short sequence, dropout's few kept keys, one key taking all of P), the plain
    /// relative error measures the cancellation rather than the kernel. A missing or doubled
    /// term is still a whole term's size against an eighth of all of them.
    pub fn error(&self, got: &[f64]) -> f64 {
        assert_eq!(got.len(), self.value.len(), "Grad::error: lengths differ");
        if got.iter().chain(&self.value).any(|x| x.is_nan()) {
            return f64::INFINITY;
        }
        let norm = |x: &mut dyn Iterator<Item = f64>| x.map(|v| v * v).sum::<f64>().sqrt();
        let off = norm(&mut got.iter().zip(&self.value).map(|(g, w)| g - w));
        let den = norm(&mut self.value.iter().copied()).max(norm(&mut self.magnitude.iter().copied()) / 8.0);
        if den == 0.0 {
            off
        } else {
            off / den
        }
    }
}
