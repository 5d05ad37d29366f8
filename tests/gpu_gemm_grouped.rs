//! The grouped GEMM (mixture-of-experts) against a float64 reference: fresh random inputs and
//! expert sizes (empty experts, sizes across the 64- and 128-row blocks, K not a multiple of
//! 8), C poisoned with NaN before the launch — each expert's rows must match, rows past the last
//! expert's end must stay NaN.

mod common;

use rand::Rng;
use tessera::testing::{gpu_or_skip, rel_error};
use tessera::{bf16, f16, Device, Tensor};
use tessera_kernels::{gemm_grouped, gemm_grouped_variants, Activation, BLayout, GemmElement};

/// bf16 or f16, to and from the host's floats.
trait Half: GemmElement {
    fn from(x: f32) -> Self;
    fn wide(self) -> f64;
}
impl Half for bf16 {
    fn from(x: f32) -> Self {
        bf16::from_f32(x)
    }
    fn wide(self) -> f64 {
        self.to_f64()
    }
}
impl Half for f16 {
    fn from(x: f32) -> Self {
        f16::from_f32(x)
    }
    fn wide(self) -> f64 {
        self.to_f64()
    }
}

/// Random row counts for `experts` experts summing to `rows`, some of them empty.
fn random_sizes(experts: usize, rows: usize) -> Vec<usize> {
    let mut rng = rand::rng();
    let mut cuts: Vec<usize> = (0..experts - 1).map(|_| rng.random_range(0..=rows)).collect();
    cuts.sort_unstable();
    cuts.push(rows);
    let mut out = Vec::with_capacity(experts);
    let mut last = 0;
    for c in cuts {
        out.push(c - last);
        last = c;
    }
    out
}

/// Each row's expert for cumulative `ends`, `None` past the last one.
fn expert_rows(ends: &[i32], m: usize) -> Vec<Option<usize>> {
    (0..m).map(|i| ends.iter().position(|&e| (i as i32) < e)).collect()
}

/// The entries of C that have a reference value, beside it; those that have none (rows past
/// the last expert) must still hold the NaN C was poisoned with.
fn compare(got: &[f64], want: &[Option<f64>], what: &str) -> (Vec<f64>, Vec<f64>) {
    let (mut have, mut expect) = (Vec::new(), Vec::new());
    for (x, (g, w)) in got.iter().zip(want).enumerate() {
        match w {
            Some(w) => {
                have.push(*g);
                expect.push(*w);
            }
            None => assert!(g.is_nan(), "{what}: C element {x} past the last expert written"),
        }
    }
    (have, expect)
}

/// One grouped GEMM, every variant, with `sizes` rows per expert and `spare` rows of C past
/// the last expert: C poisoned with NaN; `silu(alpha · A·B[e]ᵀ)` in each expert's rows against
/// float64, the spare rows still NaN.
fn grouped_matches<T: Half>(dev: &Device, sizes: &[usize], spare: usize, n: usize, k: usize, layout: BLayout) {
    let experts = sizes.len();
    let m: usize = sizes.iter().sum::<usize>() + spare;
    let to = |v: Vec<f32>| -> Vec<T> { v.into_iter().map(T::from).collect() };
    let a = to(common::random(m * k, -1.0, 1.0));
    let b = to(common::random(experts * n * k, -1.0, 1.0));
    let ends: Vec<i32> = sizes
        .iter()
        .scan(0usize, |s, &x| {
            *s += x;
            Some(*s as i32)
        })
        .collect();
    let at = Tensor::from_host(dev, &a, &[m, k]).unwrap();
    // B as each expert's N×K, or its transpose K×N.
    let bt = match layout {
        BLayout::NxK => Tensor::from_host(dev, &b, &[experts, n, k]).unwrap(),
        BLayout::KxN => {
            let t: Vec<T> = (0..experts * k * n).map(|x| b[(x / (k * n) * n + x % n) * k + x / n % k]).collect();
            Tensor::from_host(dev, &t, &[experts, k, n]).unwrap()
        }
    };
    let et = Tensor::from_host(dev, &ends, &[experts]).unwrap();
    let alpha = 0.75;
    // The reference once: each row's expert (`None` past the last), then silu(alpha·dot).
    let expert_of = expert_rows(&ends, m);
    let want: Vec<Option<f64>> = (0..m * n)
        .map(|x| {
            let (i, j) = (x / n, x % n);
            expert_of[i].map(|e| {
                let dot: f64 = (0..k).map(|p| a[i * k + p].wide() * b[(e * n + j) * k + p].wide()).sum::<f64>() * alpha as f64;
                dot / (1.0 + (-dot).exp())
            })
        })
        .collect();
    for variant in gemm_grouped_variants::<T>(layout) {
        let mut c = Tensor::full(dev, &[m, n], T::from(f32::NAN)).unwrap();
        let g = gemm_grouped(&at, &bt, &et).b_layout(layout).alpha(alpha).activation(Activation::Silu);
        g.variant(variant).run(dev, &mut c).unwrap();
        let (have, want) = compare(&c.to_host().unwrap().iter().map(|x| x.wide()).collect::<Vec<_>>(), &want, variant);
        let err = rel_error(&have, &want);
        assert!(err < 1e-2, "{variant} {m}x{n}x{k}, sizes {sizes:?}: relative error {err}");
        println!("{variant} {m}x{n}x{k}: {err:.2e} ({} values)", have.len());
    }
}

#[test]
fn gpu_gemm_grouped_matches_f64_reference() {
    let Some(dev) = gpu_or_skip("gpu_gemm_grouped") else { return };
    grouped_matches::<bf16>(&dev, &random_sizes(64, 3000), 37, 264, 200, BLayout::NxK);
    // N not a multiple of 8: a padded C, copied back (the rows past the last expert kept).
    grouped_matches::<bf16>(&dev, &random_sizes(9, 1000), 11, 261, 136, BLayout::NxK);
    grouped_matches::<bf16>(&dev, &[0, 700, 1, 0, 300, 128, 64, 65], 0, 512, 1000, BLayout::NxK);
    grouped_matches::<f16>(&dev, &random_sizes(7, 900), 5, 136, 72, BLayout::NxK);
    // Each expert's B stored K×N.
    grouped_matches::<bf16>(&dev, &random_sizes(40, 2000), 3, 264, 200, BLayout::KxN);
    grouped_matches::<bf16>(&dev, &[0, 300, 77], 0, 261, 136, BLayout::KxN);
}

#[test]
fn interp_gemm_grouped_matches_f64_reference() {
    let dev = Device::cpu_with_threads(2);
    grouped_matches::<bf16>(&dev, &[0, 130, 64, 1, 65], 3, 136, 72, BLayout::NxK);
    grouped_matches::<bf16>(&dev, &random_sizes(5, 300), 0, 264, 20, BLayout::NxK);
    grouped_matches::<bf16>(&dev, &[40, 0, 90], 5, 13, 24, BLayout::NxK);
    grouped_matches::<bf16>(&dev, &[0, 130, 64, 1, 65], 3, 136, 72, BLayout::KxN);
    grouped_matches::<bf16>(&dev, &[40, 0, 90], 5, 13, 24, BLayout::KxN);
}

#[test]
fn interp_gemm_grouped_rejects_bad_shapes() {
    let dev = Device::cpu();
    let t = |shape: &[usize]| Tensor::<bf16>::zeros(&dev, shape).unwrap();
    let ends = Tensor::from_host(&dev, &[10i32, 20], &[2]).unwrap();
    let (a, b, mut c) = (t(&[20, 32]), t(&[2, 16, 32]), t(&[20, 16]));
    let err = |r: tessera::Result<()>| r.unwrap_err().to_string();
    // B's K differs from A's.
    let e = err(gemm_grouped(&a, &t(&[2, 16, 24]), &ends).run(&dev, &mut c));
    assert!(e.contains("`b`") && e.contains("[E, N, 32]"), "{e}");
    // One end per expert.
    let e = err(gemm_grouped(&a, &b, &Tensor::from_host(&dev, &[20i32], &[1]).unwrap()).run(&dev, &mut c));
    assert!(e.contains("group_ends"), "{e}");
    // C must be [M, N].
    let e = err(gemm_grouped(&a, &b, &ends).run(&dev, &mut t(&[21, 16])));
    assert!(e.contains("`c`"), "{e}");
    // A must be 2-D.
    let e = err(gemm_grouped(&t(&[1, 20, 32]), &b, &ends).run(&dev, &mut c));
    assert!(e.contains("`a`") && e.contains("2-D"), "{e}");
}

/// Ends out of order or past M: no read or write outside the tensors (the kernel clamps them;
/// `scripts/sanitize.sh` runs this under compute-sanitizer), and the rows of the well-formed
/// expert before them still right.
fn survives_bad_ends(dev: &Device) {
    let (m, n, k) = (200, 64, 32);
    let a = Tensor::from_host(dev, &vec![bf16::ONE; m * k], &[m, k]).unwrap();
    let b = Tensor::from_host(dev, &vec![bf16::ONE; 3 * n * k], &[3, n, k]).unwrap();
    let ends = Tensor::from_host(dev, &[100i32, -5, 1_000_000], &[3]).unwrap();
    let mut c = Tensor::full(dev, &[m, n], bf16::NAN).unwrap();
    gemm_grouped(&a, &b, &ends).run(dev, &mut c).unwrap();
    let got = c.to_host().unwrap();
    assert!(got[..100 * n].iter().all(|x| x.to_f32() == k as f32), "the first expert's rows");
}

#[test]
fn interp_gemm_grouped_survives_bad_ends() {
    survives_bad_ends(&Device::cpu_with_threads(2));
}

#[test]
fn gpu_gemm_grouped_survives_bad_ends() {
    let Some(dev) = gpu_or_skip("gpu_gemm_grouped") else { return };
    survives_bad_ends(&dev);
}

/// The fp8 grouped GEMM (e4m3 or e5m2 A, e4m3 B, bf16 C), rowwise and tensorwise scales, fast
/// and promoted accumulation, every fast variant: fp8 inputs decoded exactly, against float64.
fn fp8_grouped_matches<A: tessera_kernels::Fp8GroupedGemm<bf16>>(
    dev: &Device, sizes: &[usize], spare: usize, n: usize, k: usize, encode: fn(f32) -> A, decode: fn(A) -> f64,
) {
    use tessera::F8E4M3;
    use tessera_kernels::{gemm_fp8_grouped, gemm_fp8_grouped_variants, Fp8GroupedScaling};
    let experts = sizes.len();
    let m: usize = sizes.iter().sum::<usize>() + spare;
    let a: Vec<A> = common::random(m * k, -2.0, 2.0).into_iter().map(encode).collect();
    let b: Vec<F8E4M3> = common::random(experts * n * k, -2.0, 2.0).into_iter().map(F8E4M3::from_f32).collect();
    let ends: Vec<i32> = sizes
        .iter()
        .scan(0usize, |s, &x| {
            *s += x;
            Some(*s as i32)
        })
        .collect();
    let rowwise = (common::random(m, 0.5, 1.5), common::random(experts * n, 0.5, 1.5));
    let at = Tensor::from_host(dev, &a, &[m, k]).unwrap();
    let bt = Tensor::from_host(dev, &b, &[experts, n, k]).unwrap();
    let et = Tensor::from_host(dev, &ends, &[experts]).unwrap();
    for per_row in [true, false] {
        let (sa, sb) = if per_row { rowwise.clone() } else { (vec![0.75], common::random(experts, 0.5, 1.5)) };
        let sat = Tensor::from_host(dev, &sa, &[sa.len()]).unwrap();
        let sbt =
            if per_row { Tensor::from_host(dev, &sb, &[experts, n]).unwrap() } else { Tensor::from_host(dev, &sb, &[experts]).unwrap() };
        let scaling =
            if per_row { Fp8GroupedScaling::Rowwise { a: &sat, b: &sbt } } else { Fp8GroupedScaling::Tensorwise { a: &sat, b: &sbt } };
        let expert_of = expert_rows(&ends, m);
        let want: Vec<Option<f64>> = (0..m * n)
            .map(|x| {
                let (i, j) = (x / n, x % n);
                expert_of[i].map(|e| {
                    let scale = f64::from(if per_row { sa[i] * sb[e * n + j] } else { sa[0] * sb[e] });
                    let dot = (0..k).map(|p| decode(a[i * k + p]) * f64::from(b[(e * n + j) * k + p].to_f32())).sum::<f64>() * scale;
                    dot / (1.0 + (-dot).exp())
                })
            })
            .collect();
        let mut runs: Vec<Option<&str>> = vec![None];
        runs.extend(gemm_fp8_grouped_variants::<A, bf16>().into_iter().map(Some));
        for variant in runs {
            let mut c = Tensor::full(dev, &[m, n], bf16::NAN).unwrap();
            let g = gemm_fp8_grouped(&at, &bt, &et, scaling).activation(Activation::Silu);
            match variant {
                None => g.run(dev, &mut c).unwrap(),
                Some(v) => g.fast_accumulation(true).variant(v).run(dev, &mut c).unwrap(),
            }
            let got: Vec<f64> = c.to_host().unwrap().iter().map(|x| x.to_f64()).collect();
            let (have, want) = compare(&got, &want, variant.unwrap_or("promoted"));
            let err = rel_error(&have, &want);
            assert!(err < 8e-3, "fp8 {variant:?} rowwise={per_row} {m}x{n}x{k}, sizes {sizes:?}: relative error {err}");
            println!("fp8 {} rowwise={per_row} {m}x{n}x{k}: {err:.2e}", variant.unwrap_or("promoted"));
        }
    }
}

#[test]
fn gpu_gemm_fp8_grouped_matches_f64_reference() {
    let Some(dev) = gpu_or_skip("gpu_gemm_fp8_grouped") else { return };
    fp8_grouped_matches(&dev, &random_sizes(64, 3000), 37, 264, 272, tessera::F8E4M3::from_f32, |x| f64::from(x.to_f32()));
    fp8_grouped_matches(&dev, &[0, 700, 1, 300, 129], 0, 128, 1040, tessera::F8E5M2::from_f32, |x| f64::from(x.to_f32()));
}

#[test]
fn interp_gemm_fp8_grouped_matches_f64_reference() {
    let dev = Device::cpu_with_threads(2);
    fp8_grouped_matches(&dev, &[0, 130, 64, 1, 65], 3, 130, 96, tessera::F8E4M3::from_f32, |x| f64::from(x.to_f32()));
}
