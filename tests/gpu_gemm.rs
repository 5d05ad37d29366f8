//! GEMM on the GPU against a float64 reference: fresh random inputs, odd shapes, C poisoned
//! with NaN before the launch. Large shapes are checked on a random sample of entries.

mod common;

use common::{erf, gelu_tanh};
use rand::Rng;
use tessera::testing::{gpu_or_skip, rel_error};
use tessera::{bf16, Device, Tensor};

fn random_bf16(n: usize) -> Vec<bf16> {
    common::random(n, -1.0, 1.0).into_iter().map(bf16::from_f32).collect()
}

/// C = A·Bᵀ entry (i, j) in f64.
fn dot(a: &[bf16], b: &[bf16], k: usize, i: usize, j: usize) -> f64 {
    (0..k).map(|p| a[i * k + p].to_f64() * b[j * k + p].to_f64()).sum()
}

fn check(dev: &Device, m: usize, n: usize, k: usize, samples: Option<usize>) {
    let (a, b) = (random_bf16(m * k), random_bf16(n * k));
    let at = Tensor::from_host(dev, &a, &[m, k]).unwrap();
    let bt = Tensor::from_host(dev, &b, &[n, k]).unwrap();
    let mut c = Tensor::full(dev, &[m, n], bf16::NAN).unwrap();
    tessera_kernels::gemm_tn(dev, &at, &bt, &mut c).unwrap();
    let got = c.to_host().unwrap();
    let idx: Vec<(usize, usize)> = match samples {
        None => (0..m * n).map(|x| (x / n, x % n)).collect(),
        Some(s) => {
            let mut rng = rand::rng();
            let mut v: Vec<(usize, usize)> = (0..s).map(|_| (rng.random_range(0..m), rng.random_range(0..n))).collect();
            v.extend([(0, 0), (m - 1, n - 1), (m - 1, 0), (0, n - 1)]);
            v
        }
    };
    let want: Vec<f64> = idx.iter().map(|&(i, j)| dot(&a, &b, k, i, j)).collect();
    let have: Vec<f64> = idx.iter().map(|&(i, j)| got[i * n + j].to_f64()).collect();
    let err = rel_error(&have, &want);
    assert!(err < 1e-2, "gemm {m}x{n}x{k}: relative error {err}");
    println!("gemm {m}x{n}x{k}: relative error {err:.2e}");
}

#[test]
fn gpu_gemm_odd_shapes_match_f64_reference() {
    let Some(dev) = gpu_or_skip("gpu_gemm_odd_shapes") else { return };
    for &(m, n, k) in &[(1, 1, 1), (17, 33, 65), (127, 129, 255), (128, 256, 64), (200, 300, 1000), (1, 4096, 4096), (4095, 4097, 31)] {
        let samples = if m * n * k > 50_000_000 { Some(4000) } else { None };
        check(&dev, m, n, k, samples);
    }
}

#[test]
fn gpu_gemm_large_shapes_match_f64_reference() {
    let Some(dev) = gpu_or_skip("gpu_gemm_large_shapes") else { return };
    for &(m, n, k) in &[(2048, 2048, 2048), (4096, 4096, 4096), (8192, 4096, 4096), (1000, 14336, 4096)] {
        check(&dev, m, n, k, Some(3000));
    }
}

fn gemm_rejects_mismatched_shapes(dev: &Device) {
    let a = Tensor::from_host(dev, &random_bf16(6), &[2, 3]).unwrap();
    let b = Tensor::from_host(dev, &random_bf16(8), &[2, 4]).unwrap();
    let mut c = Tensor::<bf16>::zeros(dev, &[2, 2]).unwrap();
    let e = tessera_kernels::gemm_tn(dev, &a, &b, &mut c).unwrap_err().to_string();
    assert!(e.contains("`b`") && e.contains("K = 3"), "{e}");
}

#[test]
fn gpu_gemm_rejects_mismatched_shapes() {
    if let Some(dev) = gpu_or_skip("gpu_gemm_rejects_mismatched_shapes") {
        gemm_rejects_mismatched_shapes(&dev);
    }
}

#[test]
fn interp_gemm_rejects_mismatched_shapes() {
    gemm_rejects_mismatched_shapes(&Device::cpu());
}

/// The reference epilogue in f64: `act(alpha·ab + beta·c_in + bias) + residual` (or `· gate`).
struct Epi {
    alpha: f64,
    beta: Option<Vec<bf16>>,
    beta_v: f64,
    bias: Option<(Vec<bf16>, bool)>,
    act: tessera_kernels::Activation,
    residual: Option<Vec<bf16>>,
    gate: Option<Vec<bf16>>,
}

fn check_epilogue(dev: &Device, m: usize, n: usize, k: usize, epi: Epi) {
    check_epilogue_variant(dev, m, n, k, epi, None);
}

/// [`check_epilogue`] with one kernel variant forced (`GemmBuilder::variant`).
fn check_epilogue_variant(dev: &Device, m: usize, n: usize, k: usize, epi: Epi, variant: Option<&str>) {
    use tessera_kernels::{gemm, Activation, Bias};
    let (a, b) = (random_bf16(m * k), random_bf16(n * k));
    let at = Tensor::from_host(dev, &a, &[m, k]).unwrap();
    let bt = Tensor::from_host(dev, &b, &[n, k]).unwrap();
    let mut c = Tensor::full(dev, &[m, n], bf16::NAN).unwrap();
    let c_in = epi.beta.as_ref().map(|v| Tensor::from_host(dev, v, &[m, n]).unwrap());
    let bias = epi.bias.as_ref().map(|(v, per_col)| (Tensor::from_host(dev, v, &[v.len()]).unwrap(), *per_col));
    let residual = epi.residual.as_ref().map(|v| Tensor::from_host(dev, v, &[m, n]).unwrap());
    let gate = epi.gate.as_ref().map(|v| Tensor::from_host(dev, v, &[m, n]).unwrap());
    let mut g = gemm(&at, &bt).alpha(epi.alpha as f32).activation(epi.act);
    if let Some(t) = &gate {
        g = g.gate(t);
    }
    if let Some(t) = &c_in {
        g = g.beta(epi.beta_v as f32, t);
    }
    if let Some((t, per_col)) = &bias {
        g = g.bias(if *per_col { Bias::PerColumn(t) } else { Bias::PerRow(t) });
    }
    if let Some(t) = &residual {
        g = g.residual(t);
    }
    if let Some(v) = variant {
        g = g.variant(v);
    }
    g.run(dev, &mut c).unwrap();
    let got = c.to_host().unwrap();
    let mut want = Vec::with_capacity(m * n);
    for i in 0..m {
        for j in 0..n {
            let mut v = epi.alpha * dot(&a, &b, k, i, j);
            if let Some(ci) = &epi.beta {
                v += epi.beta_v * ci[i * n + j].to_f64();
            }
            if let Some((bv, per_col)) = &epi.bias {
                v += bv[if *per_col { j } else { i }].to_f64();
            }
            v = match epi.act {
                Activation::None => v,
                Activation::GeluTanh => gelu_tanh(v),
                Activation::GeluErf => 0.5 * v * (1.0 + erf(v / std::f64::consts::SQRT_2)),
                Activation::Silu => v / (1.0 + (-v).exp()),
            };
            if let Some(r) = &epi.residual {
                v += r[i * n + j].to_f64();
            }
            if let Some(r) = &epi.gate {
                v *= r[i * n + j].to_f64();
            }
            want.push(v);
        }
    }
    let have: Vec<f64> = got.iter().map(|x| x.to_f64()).collect();
    let err = rel_error(&have, &want);
    assert!(err < 1e-2, "epilogue {m}x{n}x{k} {variant:?}: relative error {err}");
}

#[test]
fn gpu_gemm_epilogues_match_f64_reference() {
    let Some(dev) = gpu_or_skip("gpu_gemm_epilogues") else { return };
    for &(m, n, k) in &[(200, 300, 100), (129, 520, 72)] {
        check_every_epilogue(&dev, m, n, k);
    }
}

/// Each epilogue alone, then all of them at once.
fn check_every_epilogue(dev: &Device, m: usize, n: usize, k: usize) {
    use tessera_kernels::Activation;
    let plain = || Epi { alpha: 1.0, beta: None, beta_v: 0.0, bias: None, act: Activation::None, residual: None, gate: None };
    check_epilogue(dev, m, n, k, Epi { alpha: 0.5, ..plain() });
    check_epilogue(dev, m, n, k, Epi { beta: Some(random_bf16(m * n)), beta_v: -2.0, ..plain() });
    check_epilogue(dev, m, n, k, Epi { bias: Some((random_bf16(n), true)), act: Activation::GeluTanh, ..plain() });
    check_epilogue(dev, m, n, k, Epi { bias: Some((random_bf16(m), false)), act: Activation::GeluErf, ..plain() });
    check_epilogue(dev, m, n, k, Epi { act: Activation::Silu, alpha: 3.0, ..plain() });
    check_epilogue(dev, m, n, k, Epi { residual: Some(random_bf16(m * n)), ..plain() });
    // SwiGLU's gate: silu(x·W_gᵀ) ⊙ up.
    check_epilogue(dev, m, n, k, Epi { act: Activation::Silu, gate: Some(random_bf16(m * n)), ..plain() });
    let all = Epi {
        alpha: 0.75,
        beta: Some(random_bf16(m * n)),
        beta_v: 0.5,
        bias: Some((random_bf16(n), true)),
        act: Activation::GeluTanh,
        residual: Some(random_bf16(m * n)),
        gate: None,
    };
    check_epilogue(dev, m, n, k, all);
}

fn bias_gelu_matches_f64_reference(dev: &Device) {
    let (m, n) = (77, 1000);
    let (x, b) = (random_bf16(m * n), random_bf16(n));
    let xt = Tensor::from_host(dev, &x, &[m, n]).unwrap();
    let bt = Tensor::from_host(dev, &b, &[n]).unwrap();
    let mut y = Tensor::full(dev, &[m, n], bf16::NAN).unwrap();
    tessera_kernels::bias_gelu(dev, &xt, &bt, &mut y).unwrap();
    let want: Vec<f64> = (0..m * n).map(|i| gelu_tanh(x[i].to_f64() + b[i % n].to_f64())).collect();
    let have: Vec<f64> = y.to_host().unwrap().iter().map(|v| v.to_f64()).collect();
    assert!(rel_error(&have, &want) < 1e-2);
}

#[test]
fn gpu_bias_gelu_matches_f64_reference() {
    if let Some(dev) = gpu_or_skip("gpu_bias_gelu") {
        bias_gelu_matches_f64_reference(&dev);
    }
}

#[test]
fn interp_bias_gelu_matches_f64_reference() {
    bias_gelu_matches_f64_reference(&Device::cpu());
}

/// f16 with bias and SiLU, by the default path and, where named, one variant forced (the f16
/// small-M kernel in chunks of X and splits of K).
fn gemm_f16_matches_f64_reference(dev: &Device, variant: Option<&str>) {
    use tessera::f16;
    use tessera_kernels::{gemm, Activation, Bias};
    let (m, n, k) = (130, 250, 520);
    let rnd = |len: usize| -> Vec<f16> { common::random(len, -1.0, 1.0).into_iter().map(f16::from_f32).collect() };
    let (a, b, bias) = (rnd(m * k), rnd(n * k), rnd(n));
    let at = Tensor::from_host(dev, &a, &[m, k]).unwrap();
    let bt = Tensor::from_host(dev, &b, &[n, k]).unwrap();
    let biast = Tensor::from_host(dev, &bias, &[n]).unwrap();
    let mut c = Tensor::full(dev, &[m, n], f16::NAN).unwrap();
    let mut g = gemm(&at, &bt).bias(Bias::PerColumn(&biast)).activation(Activation::Silu);
    if let Some(v) = variant {
        g = g.variant(v);
    }
    g.run(dev, &mut c).unwrap();
    let got: Vec<f64> = c.to_host().unwrap().iter().map(|v| v.to_f64()).collect();
    let want: Vec<f64> = (0..m * n)
        .map(|x| {
            let (i, j) = (x / n, x % n);
            let v: f64 = (0..k).map(|p| a[i * k + p].to_f64() * b[j * k + p].to_f64()).sum::<f64>() + bias[j].to_f64();
            v / (1.0 + (-v).exp())
        })
        .collect();
    let err = rel_error(&got, &want);
    assert!(err < 1e-2, "f16 gemm {variant:?}: relative error {err}");
}

#[test]
fn gpu_gemm_f16_matches_f64_reference() {
    if let Some(dev) = gpu_or_skip("gpu_gemm_f16") {
        for v in [None, Some("gemm_small_m/mn64/splits2"), Some("gemm_small_m/mn256/splits1")] {
            gemm_f16_matches_f64_reference(&dev, v);
        }
    }
}

#[test]
fn interp_gemm_f16_matches_f64_reference() {
    for v in [None, Some("gemm_small_m/mn64/splits2")] {
        gemm_f16_matches_f64_reference(&Device::cpu(), v);
    }
}

/// Checks a batched GEMM with B in either layout against f64, on sampled entries when large.
fn check_layout(dev: &Device, batch: usize, m: usize, n: usize, k: usize, kn: bool) {
    check_layout_variant(dev, batch, m, n, k, kn, None);
}

/// [`check_layout`] with one kernel variant forced (`GemmBuilder::variant`).
fn check_layout_variant(dev: &Device, batch: usize, m: usize, n: usize, k: usize, kn: bool, variant: Option<&str>) {
    use tessera_kernels::{gemm, BLayout};
    let (a, b) = (random_bf16(batch * m * k), random_bf16(batch * n * k));
    let (sa, sb, sc) = if batch == 1 {
        (vec![m, k], if kn { vec![k, n] } else { vec![n, k] }, vec![m, n])
    } else {
        (vec![batch, m, k], if kn { vec![batch, k, n] } else { vec![batch, n, k] }, vec![batch, m, n])
    };
    let at = Tensor::from_host(dev, &a, &sa).unwrap();
    let bt = Tensor::from_host(dev, &b, &sb).unwrap();
    let mut c = Tensor::full(dev, &sc, bf16::NAN).unwrap();
    let mut g = gemm(&at, &bt).b_layout(if kn { BLayout::KxN } else { BLayout::NxK });
    if let Some(v) = variant {
        g = g.variant(v);
    }
    g.run(dev, &mut c).unwrap();
    let got = c.to_host().unwrap();
    let mut rng = rand::rng();
    let samples: Vec<(usize, usize, usize)> = if batch * m * n <= 200_000 {
        (0..batch * m * n).map(|x| (x / (m * n), (x / n) % m, x % n)).collect()
    } else {
        (0..3000).map(|_| (rng.random_range(0..batch), rng.random_range(0..m), rng.random_range(0..n))).collect()
    };
    let bval = |q: usize, p: usize, j: usize| if kn { b[q * k * n + p * n + j] } else { b[q * n * k + j * k + p] };
    let want: Vec<f64> =
        samples.iter().map(|&(q, i, j)| (0..k).map(|p| a[q * m * k + i * k + p].to_f64() * bval(q, p, j).to_f64()).sum()).collect();
    let have: Vec<f64> = samples.iter().map(|&(q, i, j)| got[q * m * n + i * n + j].to_f64()).collect();
    let err = rel_error(&have, &want);
    assert!(err < 1e-2, "gemm batch {batch} {m}x{n}x{k} kn={kn} {variant:?}: relative error {err}");
}

/// Every variant the tuner may choose computes the same GEMM, in both layouts, batched, on
/// shapes that leave partial tiles of 128 and 256 columns; a name that is not a variant (or
/// one the operands rule out) is an error naming `variant`.
fn every_gemm_variant_matches_f64_reference(dev: &Device, shapes: &[(usize, usize, usize, usize)]) {
    use tessera_kernels::{gemm, gemm_variants, BLayout};
    for kn in [false, true] {
        let names = gemm_variants::<bf16>(if kn { BLayout::KxN } else { BLayout::NxK });
        assert!(names.len() >= 4, "{names:?}");
        for v in &names {
            for &(batch, m, n, k) in shapes {
                check_layout_variant(dev, batch, m, n, k, kn, Some(v));
            }
        }
    }
    let a = Tensor::from_host(dev, &random_bf16(64 * 32), &[64, 32]).unwrap();
    for bad in ["gemm_tn_bf16__bn512_stages9", "gemm_nn_bf16__bn256_stages4"] {
        match gemm(&a, &a).variant(bad).run(dev, &mut Tensor::full(dev, &[64, 64], bf16::NAN).unwrap()) {
            Err(tessera::Error::Argument { arg, expected, .. }) => {
                assert_eq!(arg, "variant");
                assert!(expected.contains("gemm_tn_bf16__bn128_stages4"), "{expected}");
            }
            other => panic!("{bad}: expected an argument error, got {other:?}"),
        }
    }
    // Odd N: C's rows are not 16-byte aligned, so only the 128×128 kernel may be forced.
    let mut odd = Tensor::full(dev, &[64, 63], bf16::NAN).unwrap();
    let b = Tensor::from_host(dev, &random_bf16(63 * 32), &[63, 32]).unwrap();
    assert!(gemm(&a, &b).variant("gemm_tn_bf16__bn128_stages3").run(dev, &mut odd).is_err());
    assert!(odd.to_host().unwrap().iter().all(|v| v.is_nan()), "a refused call writes nothing");
}

#[test]
fn gpu_every_gemm_variant_matches_f64_reference() {
    let Some(dev) = gpu_or_skip("gpu_every_gemm_variant") else { return };
    every_gemm_variant_matches_f64_reference(&dev, &[(1, 200, 392, 136), (3, 129, 264, 72), (1, 1000, 1000, 520)]);
}

#[test]
fn interp_every_gemm_variant_matches_f64_reference() {
    every_gemm_variant_matches_f64_reference(&Device::cpu(), &[(2, 129, 264, 72)]);
}

#[test]
fn gpu_gemm_b_stored_k_by_n_matches_f64_reference() {
    let Some(dev) = gpu_or_skip("gpu_gemm_b_kxn") else { return };
    for &(m, n, k) in &[(1, 1, 1), (17, 33, 65), (127, 129, 255), (200, 300, 100), (1, 4096, 4096), (1000, 2048, 1024)] {
        check_layout(&dev, 1, m, n, k, true);
    }
}

#[test]
fn gpu_gemm_strided_batches_match_f64_reference() {
    let Some(dev) = gpu_or_skip("gpu_gemm_batches") else { return };
    for &(batch, m, n, k) in &[(3, 100, 130, 70), (5, 256, 256, 128), (2, 17, 300, 33)] {
        check_layout(&dev, batch, m, n, k, false);
        check_layout(&dev, batch, m, n, k, true);
    }
}

#[test]
fn gpu_gemm_sm80_path_matches_f64_reference() {
    // The portable path (cp.async + mma.sync, 128×128 tiles), run on Hopper through the
    // driver's forward compilation of the sm_80 PTX.
    let Some(dev) = gpu_or_skip("gpu_gemm_sm80") else { return };
    let dev = dev.with_target(tessera::Target::Sm80);
    for &(m, n, k) in &[(1, 1, 1), (17, 33, 65), (127, 129, 255), (300, 200, 1000)] {
        check(&dev, m, n, k, None);
        check_layout(&dev, 1, m, n, k, true);
    }
    check_layout(&dev, 3, 100, 130, 70, false);
    check_layout(&dev, 3, 100, 130, 70, true);
    use tessera_kernels::Activation;
    let plain = || Epi { alpha: 1.0, beta: None, beta_v: 0.0, bias: None, act: Activation::None, residual: None, gate: None };
    check_epilogue(
        &dev,
        129,
        200,
        72,
        Epi { bias: Some((random_bf16(200), true)), act: Activation::GeluTanh, residual: Some(random_bf16(129 * 200)), ..plain() },
    );
}

fn gemm_k_by_n_with_full_epilogue(dev: &Device) {
    use tessera_kernels::{gemm, BLayout};
    let (m, n, k) = (130, 250, 96);
    let (a, b, cin, res) = (random_bf16(m * k), random_bf16(k * n), random_bf16(m * n), random_bf16(m * n));
    let at = Tensor::from_host(dev, &a, &[m, k]).unwrap();
    let bt = Tensor::from_host(dev, &b, &[k, n]).unwrap();
    let cint = Tensor::from_host(dev, &cin, &[m, n]).unwrap();
    let rest = Tensor::from_host(dev, &res, &[m, n]).unwrap();
    let mut c = Tensor::full(dev, &[m, n], bf16::NAN).unwrap();
    gemm(&at, &bt).b_layout(BLayout::KxN).beta(0.5, &cint).residual(&rest).run(dev, &mut c).unwrap();
    let got: Vec<f64> = c.to_host().unwrap().iter().map(|v| v.to_f64()).collect();
    let want: Vec<f64> = (0..m * n)
        .map(|x| {
            let (i, j) = (x / n, x % n);
            (0..k).map(|p| a[i * k + p].to_f64() * b[p * n + j].to_f64()).sum::<f64>() + 0.5 * cin[x].to_f64() + res[x].to_f64()
        })
        .collect();
    assert!(rel_error(&got, &want) < 1e-2);
}

#[test]
fn gpu_gemm_k_by_n_with_full_epilogue() {
    if let Some(dev) = gpu_or_skip("gpu_gemm_kn_full") {
        gemm_k_by_n_with_full_epilogue(&dev);
    }
}

#[test]
fn interp_gemm_k_by_n_with_full_epilogue() {
    gemm_k_by_n_with_full_epilogue(&Device::cpu());
}

#[test]
fn gpu_gemm_tma_store_path_with_epilogues() {
    // Shapes with enough 128×256 tiles and 16-byte aligned rows of C take the kernels that
    // store C through shared memory and TMA; M = 1000 leaves a partial last tile-row.
    use tessera_kernels::Activation;
    let Some(dev) = gpu_or_skip("gpu_gemm_tma_store") else { return };
    let plain = || Epi { alpha: 1.0, beta: None, beta_v: 0.0, bias: None, act: Activation::None, residual: None, gate: None };
    check_epilogue(&dev, 1000, 2048, 128, Epi { alpha: 0.5, bias: Some((random_bf16(2048), true)), act: Activation::GeluTanh, ..plain() });
    check_epilogue(&dev, 1000, 2048, 128, Epi { bias: Some((random_bf16(1000), false)), act: Activation::Silu, ..plain() });
    check_layout(&dev, 1, 1000, 2048, 200, false);
    check_layout(&dev, 1, 1000, 2048, 200, true);
}

// The same checks on the CPU interpreter, on shapes small enough for it. With a 2-thread
// "device" the host picks the 128×256 TMA-store kernels wherever C's rows are 16-byte
// aligned and the 128×128 ones elsewhere; `with_target(Sm80)` picks the portable ones.

#[test]
fn interp_gemm_odd_shapes_match_f64_reference() {
    let dev = Device::cpu();
    for &(m, n, k) in &[(1, 1, 1), (17, 33, 65), (127, 129, 255), (128, 256, 64), (130, 264, 100), (3, 500, 31)] {
        check(&dev, m, n, k, None);
    }
}

#[test]
fn interp_gemm_epilogues_match_f64_reference() {
    let dev = Device::cpu();
    // 136 columns take the TMA-store kernels (aligned rows), 70 the 128×128 ones.
    for &(m, n, k) in &[(129, 136, 72), (65, 70, 40)] {
        check_every_epilogue(&dev, m, n, k);
    }
}

#[test]
fn interp_gemm_b_layouts_and_batches_match_f64_reference() {
    let dev = Device::cpu();
    for &(m, n, k) in &[(1, 1, 1), (17, 33, 65), (100, 264, 70)] {
        check_layout(&dev, 1, m, n, k, true);
    }
    for &(batch, m, n, k) in &[(3, 50, 70, 40), (2, 17, 136, 33)] {
        check_layout(&dev, batch, m, n, k, false);
        check_layout(&dev, batch, m, n, k, true);
    }
}

#[test]
fn interp_gemm_sm80_path_matches_f64_reference() {
    use tessera_kernels::Activation;
    let dev = Device::cpu().with_target(tessera::Target::Sm80);
    for &(m, n, k) in &[(1, 1, 1), (17, 33, 65), (130, 136, 100)] {
        check(&dev, m, n, k, None);
        check_layout(&dev, 1, m, n, k, true);
    }
    check_layout(&dev, 3, 50, 70, 40, false);
    let plain = || Epi { alpha: 1.0, beta: None, beta_v: 0.0, bias: None, act: Activation::None, residual: None, gate: None };
    let epi = Epi { bias: Some((random_bf16(72), true)), act: Activation::GeluTanh, residual: Some(random_bf16(65 * 72)), ..plain() };
    check_epilogue(&dev, 65, 72, 40, epi);
}

#[test]
fn interp_results_do_not_depend_on_threads() {
    use tessera_kernels::{gemm, Activation, Bias};
    let (m, n, k) = (300, 520, 70);
    let (a, b, bias) = (random_bf16(m * k), random_bf16(n * k), random_bf16(n));
    let run = |dev: &Device| {
        let at = Tensor::from_host(dev, &a, &[m, k]).unwrap();
        let bt = Tensor::from_host(dev, &b, &[n, k]).unwrap();
        let biast = Tensor::from_host(dev, &bias, &[n]).unwrap();
        let mut c = Tensor::full(dev, &[m, n], bf16::NAN).unwrap();
        gemm(&at, &bt).bias(Bias::PerColumn(&biast)).activation(Activation::GeluErf).run(dev, &mut c).unwrap();
        c.to_host().unwrap().iter().map(|v| v.to_bits()).collect::<Vec<u16>>()
    };
    // A persistent grid of 1, 3 or 8 blocks: each block takes other tiles.
    let one = run(&Device::cpu_with_threads(1));
    assert_eq!(one, run(&Device::cpu_with_threads(3)), "1 vs 3 threads");
    assert_eq!(one, run(&Device::cpu_with_threads(8)), "1 vs 8 threads");
}

#[test]
fn interp_gemm_256_cubed_time() {
    // The yardstick: a 256×256×256 GEMM in well under a second (release build).
    let dev = Device::cpu();
    let n = 256;
    let a = Tensor::from_host(&dev, &random_bf16(n * n), &[n, n]).unwrap();
    let b = Tensor::from_host(&dev, &random_bf16(n * n), &[n, n]).unwrap();
    let mut c = Tensor::full(&dev, &[n, n], bf16::NAN).unwrap();
    let ms = tessera::testing::time_ms(&dev, 1, 3, || tessera_kernels::gemm_tn(&dev, &a, &b, &mut c).unwrap()).unwrap();
    println!("interpreter: 256x256x256 GEMM in {ms:.1} ms on {}", dev.name());
    if !cfg!(debug_assertions) {
        assert!(ms < 1000.0, "256³ GEMM took {ms:.0} ms on the interpreter");
    }
}

#[test]
fn interp_gemm_f16_kernels_match_f64_reference() {
    // f16 through the 128×256 kernels (C rows 16-byte aligned) and the 128×128 ones (odd N,
    // and odd K, which pads the operands first), B in both layouts.
    use tessera::f16;
    use tessera_kernels::{gemm, BLayout};
    let dev = Device::cpu();
    let rnd = |len: usize| -> Vec<f16> { common::random(len, -1.0, 1.0).into_iter().map(f16::from_f32).collect() };
    for (m, n, k) in [(70, 136, 48), (33, 70, 45)] {
        let (a, b) = (rnd(m * k), rnd(n * k));
        for kn in [false, true] {
            let at = Tensor::from_host(&dev, &a, &[m, k]).unwrap();
            let shape = if kn { [k, n] } else { [n, k] };
            let bt = Tensor::from_host(&dev, &b, &shape).unwrap();
            let mut c = Tensor::full(&dev, &[m, n], f16::NAN).unwrap();
            gemm(&at, &bt).b_layout(if kn { BLayout::KxN } else { BLayout::NxK }).run(&dev, &mut c).unwrap();
            let got: Vec<f64> = c.to_host().unwrap().iter().map(|v| v.to_f64()).collect();
            let bval = |p: usize, j: usize| if kn { b[p * n + j] } else { b[j * k + p] };
            let want: Vec<f64> = (0..m * n).map(|x| (0..k).map(|p| a[(x / n) * k + p].to_f64() * bval(p, x % n).to_f64()).sum()).collect();
            let err = rel_error(&got, &want);
            assert!(err < 1e-2, "f16 gemm {m}x{n}x{k} kn={kn}: relative error {err}");
        }
    }
}

#[path = "../examples/custom_epilogue.rs"]
#[allow(dead_code)]
mod custom_epilogue;

/// The library's GEMM mainloop with a user's epilogue (`examples/custom_epilogue.rs`):
/// `relu(A·Bᵀ)² · scale` against float64, on shapes off the tile grid, C poisoned first.
fn custom_epilogue_matches_f64(dev: &Device, shapes: &[(usize, usize, usize)]) {
    for &(m, n, k) in shapes {
        let (ha, hb) = (random_bf16(m * k), random_bf16(n * k));
        let hs: Vec<bf16> = random_bf16(n).into_iter().map(|v| bf16::from_f32(v.to_f32().abs() + 0.5)).collect();
        let a = Tensor::from_host(dev, &ha, &[m, k]).expect("a");
        let b = Tensor::from_host(dev, &hb, &[n, k]).expect("b");
        let scale = Tensor::from_host(dev, &hs, &[n]).expect("scale");
        let mut c = Tensor::from_host(dev, &vec![bf16::NAN; m * n], &[m, n]).expect("c");
        custom_epilogue::run(dev, &a, &b, &scale, &mut c).expect("custom epilogue");
        let got: Vec<f64> = c.to_host().expect("c").iter().map(|v| f64::from(v.to_f32())).collect();
        let want: Vec<f64> = (0..m).flat_map(|i| custom_epilogue::reference_row(&ha, &hb, &hs, k, i)).collect();
        let err = rel_error(&got, &want);
        assert!(err < 1e-2, "{m}×{n}×{k}: relative error {err}");
    }
}

#[test]
fn gpu_custom_epilogue_matches_f64_reference() {
    if let Some(dev) = gpu_or_skip("gpu_custom_epilogue_matches_f64_reference") {
        custom_epilogue_matches_f64(&dev, &[(1000, 1032, 136), (128, 256, 64), (2049, 520, 1000)]);
    }
}

#[test]
fn interp_custom_epilogue_matches_f64_reference() {
    custom_epilogue_matches_f64(&Device::cpu(), &[(130, 264, 72), (7, 8, 8)]);
}

#[path = "../examples/epilogue_chain.rs"]
#[allow(dead_code)]
mod epilogue_chain;

/// One epilogue chain, bias → GELU → dropout → residual (`examples/epilogue_chain.rs`), fused
/// into the library's GEMM (and, scaled, cast to fp8 in its portable GEMM) and its attention
/// forward: each against float64 (the dropout mask
/// from the host's copy of the Philox stream), outputs poisoned, off the tile grid.
#[test]
fn gpu_epilogue_chain_matches_f64_reference() {
    if let Some(dev) = gpu_or_skip("gpu_epilogue_chain_matches_f64_reference") {
        for (gemm, attn) in [((1000, 2048, 520), (6, 1000)), ((129, 264, 64), (3, 77))] {
            let [g, g8, a] = epilogue_chain::check(&dev, gemm, attn, 7).expect("chain");
            assert!(g < 1e-2 && g8 < 6e-2 && a < 1e-2, "{gemm:?} {attn:?}: GEMM relative error {g}, fp8 {g8}, attention {a}");
        }
    }
}

#[test]
fn interp_epilogue_chain_matches_f64_reference() {
    let [g, g8, a] = epilogue_chain::check(&Device::cpu(), (130, 264, 72), (2, 130), 1).expect("chain");
    assert!(g < 1e-2 && g8 < 6e-2 && a < 1e-2, "GEMM relative error {g}, fp8 {g8}, attention {a}");
}

/// The small-M path (M ≤ 64, weights N×K, no `beta` or residual; the other epilogues take the
/// 128×128 kernel): every epilogue, batches, odd K, K split in several (the partial products
/// summed by atomics).
fn small_m_matches_f64_reference(dev: &Device, shapes: &[(usize, usize, usize)]) {
    for &(m, n, k) in shapes {
        check_every_epilogue(dev, m, n, k);
        check_layout(dev, 2, m, n, k, false);
    }
}

#[test]
fn gpu_gemm_small_m_matches_f64_reference() {
    let Some(dev) = gpu_or_skip("gpu_gemm_small_m") else { return };
    small_m_matches_f64_reference(&dev, &[(1, 136, 72), (16, 1000, 777), (33, 4096, 4096), (64, 520, 14336)]);
    for &(m, n, k) in &[(1, 14336, 4096), (16, 4096, 14336), (64, 14336, 4096)] {
        check(&dev, m, n, k, Some(3000));
    }
}

#[test]
fn interp_gemm_small_m_matches_f64_reference() {
    // 264 columns: 3 slabs of 128 rows; on the interpreter's 2 "SMs" K's 9 steps split in 2
    // (17 rows take the small-M path only so).
    small_m_matches_f64_reference(&Device::cpu_with_threads(2), &[(1, 136, 72), (17, 264, 520)]);
}

/// The small-M kernel forced (`gemm_small_m/mnW/splitsS`) at the `MN` that `m` picks (16 to
/// 256, 256-row chunks past that) and at 64-row chunks past 64 rows, unsplit (C stored from
/// the accumulator) and split in every count K's steps allow up to 8 (the last arrival of each
/// tile's splits finishing it: sums and counters left zeroed for the next call, which the next
/// check is): bias per column and per row with activations, and batches.
fn small_m_forced_matches_f64(dev: &Device, shapes: &[(usize, usize, usize)]) {
    use tessera_kernels::Activation;
    for &(m, n, k) in shapes {
        let narrowest = [16, 32, 64, 128, 256].into_iter().find(|&w| w >= m).unwrap_or(256);
        let splits = [1usize, 2, 4, 8].into_iter().filter(|&s| s <= (k.div_ceil(64) / 4).max(1));
        let chunked = (m > 64).then_some((64, (k.div_ceil(64) / 4).clamp(1, 2)));
        for (mn, s) in splits.map(|s| (narrowest, s)).chain(chunked) {
            let v = format!("gemm_small_m/mn{mn}/splits{s}");
            let per = |per_col: bool, act| Epi {
                alpha: 0.5,
                beta: None,
                beta_v: 0.0,
                bias: Some((random_bf16(if per_col { n } else { m }), per_col)),
                act,
                residual: None,
                gate: None,
            };
            check_epilogue_variant(dev, m, n, k, per(true, Activation::GeluTanh), Some(&v));
            check_epilogue_variant(dev, m, n, k, per(false, Activation::Silu), Some(&v));
            check_layout_variant(dev, 3, m, n, k, false, Some(&v));
        }
    }
}

#[test]
fn gpu_gemm_small_m_forced_matches_f64_reference() {
    let Some(dev) = gpu_or_skip("gpu_gemm_small_m_forced") else { return };
    small_m_forced_matches_f64(
        &dev,
        &[(5, 136, 72), (20, 1000, 520), (40, 300, 1000), (100, 1000, 2000), (200, 264, 777), (300, 1032, 1100), (512, 520, 2048)],
    );
}

#[test]
fn interp_gemm_small_m_forced_matches_f64_reference() {
    small_m_forced_matches_f64(&Device::cpu_with_threads(2), &[(20, 136, 520), (300, 136, 264)]);
}

/// `triangular_only`: every variant (128×256 and 128×128 tiles), lower and upper, SYRK (`B = A`)
/// and a rectangular product; C poisoned with NaN: the triangle's elements match float64, and
/// elements more than a tile's width past the diagonal (in tiles wholly outside) stay NaN.
fn triangle_matches_f64_reference(dev: &Device, shapes: &[(usize, usize, usize, bool)]) {
    use tessera_kernels::{gemm, gemm_triangle_variants, Triangle};
    for &(m, n, k, syrk) in shapes {
        let a = random_bf16(m * k);
        let b = if syrk { a.clone() } else { random_bf16(n * k) };
        let at = Tensor::from_host(dev, &a, &[m, k]).unwrap();
        let bt = Tensor::from_host(dev, &b, &[n, k]).unwrap();
        for variant in gemm_triangle_variants::<bf16>() {
            for triangle in [Triangle::Lower, Triangle::Upper] {
                let mut c = Tensor::full(dev, &[m, n], bf16::NAN).unwrap();
                let g = if syrk { gemm(&at, &at) } else { gemm(&at, &bt) };
                g.triangular_only(triangle).variant(variant).run(dev, &mut c).unwrap();
                let got = c.to_host().unwrap();
                let inside = |i: usize, j: usize| if triangle == Triangle::Lower { j <= i } else { j >= i };
                let outside = |i: usize, j: usize| if triangle == Triangle::Lower { j > i + 256 } else { j + 256 < i };
                let (mut have, mut want) = (Vec::new(), Vec::new());
                for i in 0..m {
                    for j in 0..n {
                        let x = got[i * n + j].to_f64();
                        if inside(i, j) {
                            have.push(x);
                            want.push(dot(&a, &b, k, i, j));
                        } else if outside(i, j) {
                            assert!(x.is_nan(), "{variant} {triangle:?} {m}x{n}x{k}: C[{i}, {j}] written outside the triangle's tiles");
                        }
                    }
                }
                let err = rel_error(&have, &want);
                assert!(err < 1e-2, "{variant} {triangle:?} {m}x{n}x{k}: relative error {err}");
            }
        }
    }
}

#[test]
fn gpu_gemm_triangle_matches_f64_reference() {
    let Some(dev) = gpu_or_skip("gpu_gemm_triangle") else { return };
    triangle_matches_f64_reference(&dev, &[(1000, 1000, 520, true), (777, 1496, 300, false), (1500, 640, 72, false)]);
}

#[test]
fn interp_gemm_triangle_matches_f64_reference() {
    let dev = Device::cpu_with_threads(2);
    triangle_matches_f64_reference(&dev, &[(296, 296, 72, true), (200, 600, 40, false)]);
    // B K×N, or C's rows not 16-byte aligned: an error naming the option.
    use tessera_kernels::{gemm, BLayout, Triangle};
    let a = Tensor::from_host(&dev, &random_bf16(64 * 32), &[64, 32]).unwrap();
    let b = Tensor::from_host(&dev, &random_bf16(32 * 64), &[32, 64]).unwrap();
    let mut c = Tensor::<bf16>::zeros(&dev, &[64, 64]).unwrap();
    let e = gemm(&a, &b).b_layout(BLayout::KxN).triangular_only(Triangle::Lower).run(&dev, &mut c).unwrap_err().to_string();
    assert!(e.contains("triangular_only") && e.contains("N×K"), "{e}");
    let (a, mut c) = (Tensor::from_host(&dev, &random_bf16(63 * 32), &[63, 32]).unwrap(), Tensor::<bf16>::zeros(&dev, &[63, 63]).unwrap());
    let e = gemm(&a, &a).triangular_only(Triangle::Upper).run(&dev, &mut c).unwrap_err().to_string();
    assert!(e.contains("triangular_only") && e.contains("aligned"), "{e}");
}
