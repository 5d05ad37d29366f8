//! The library kernels on the GPU against float64 references: fresh random inputs, odd
//! shapes, outputs poisoned with NaN before each launch. Skipped, with the reason printed,
//! where no GPU is present; `TESSERA_REQUIRE_GPU=1` makes a skip a failure.

mod common;

use common::{random, wide, SHAPES};
use tessera::testing::{gpu_or_skip, rel_error};
use tessera::{Device, Tensor};

fn poisoned(dev: &Device, shape: &[usize]) -> Tensor<f32> {
    Tensor::full(dev, shape, f32::NAN).expect("allocate output")
}

/// The shapes for `dev`: all of them on a GPU, the smaller ones on the interpreter.
fn shapes(dev: &Device) -> &'static [(usize, usize)] {
    if dev.is_cpu() {
        &SHAPES[..5]
    } else {
        SHAPES
    }
}

#[test]
fn gpu_axpy_matches_f64_reference() {
    if let Some(dev) = gpu_or_skip("gpu_axpy_matches_f64_reference") {
        axpy_matches_f64_reference(&dev);
    }
}

#[test]
fn interp_axpy_matches_f64_reference() {
    axpy_matches_f64_reference(&Device::cpu());
}

fn axpy_matches_f64_reference(dev: &Device) {
    for &(m, n) in shapes(dev) {
        let (x, y0) = (random(m * n, -1.0, 1.0), random(m * n, -1.0, 1.0));
        let a = random(1, -2.0, 2.0)[0];
        let xt = Tensor::from_host(dev, &x, &[m, n]).unwrap();
        let mut yt = Tensor::from_host(dev, &y0, &[m, n]).unwrap();
        tessera_kernels::axpy(dev, a, &xt, &mut yt).unwrap();
        let got = wide(&yt.to_host().unwrap());
        let want: Vec<f64> = x.iter().zip(&y0).map(|(&x, &y)| f64::from(a) * f64::from(x) + f64::from(y)).collect();
        let err = rel_error(&got, &want);
        assert!(err < 1e-6, "axpy {m}x{n}: relative error {err}");
    }
}

fn check_rows_on(
    dev: &Device, name: &str, f: fn(&Device, &Tensor<f32>, &mut Tensor<f32>) -> tessera::Result<()>, reference: fn(&[f64]) -> f64,
) {
    let dev = dev.clone();
    for &(m, n) in shapes(&dev) {
        let x = random(m * n, -1.0, 1.0);
        let xt = Tensor::from_host(&dev, &x, &[m, n]).unwrap();
        let mut out = poisoned(&dev, &[m]);
        f(&dev, &xt, &mut out).unwrap();
        let got = wide(&out.to_host().unwrap());
        let want: Vec<f64> = wide(&x).chunks(n).map(reference).collect();
        let err = rel_error(&got, &want);
        assert!(err < 1e-5, "{name} {m}x{n}: relative error {err}");
    }
}

fn row_max_ref(r: &[f64]) -> f64 {
    r.iter().cloned().fold(f64::NEG_INFINITY, f64::max)
}

#[test]
fn gpu_row_sum_matches_f64_reference() {
    if let Some(dev) = gpu_or_skip("gpu_row_sum") {
        check_rows_on(&dev, "row_sum", tessera_kernels::row_sum, |r| r.iter().sum());
    }
}

#[test]
fn interp_row_sum_matches_f64_reference() {
    check_rows_on(&Device::cpu(), "row_sum", tessera_kernels::row_sum, |r| r.iter().sum());
}

#[test]
fn gpu_row_max_matches_f64_reference() {
    if let Some(dev) = gpu_or_skip("gpu_row_max") {
        check_rows_on(&dev, "row_max", tessera_kernels::row_max, row_max_ref);
    }
}

#[test]
fn interp_row_max_matches_f64_reference() {
    check_rows_on(&Device::cpu(), "row_max", tessera_kernels::row_max, row_max_ref);
}

fn softmax_ref(x: &[f64], n: usize) -> Vec<f64> {
    x.chunks(n)
        .flat_map(|r| {
            let m = r.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
            let s: f64 = r.iter().map(|v| (v - m).exp()).sum();
            r.iter().map(move |v| (v - m).exp() / s).collect::<Vec<_>>()
        })
        .collect()
}

#[test]
fn gpu_softmax_matches_f64_reference() {
    if let Some(dev) = gpu_or_skip("gpu_softmax_matches_f64_reference") {
        softmax_matches_f64_reference(&dev);
    }
}

#[test]
fn interp_softmax_matches_f64_reference() {
    softmax_matches_f64_reference(&Device::cpu());
}

fn softmax_matches_f64_reference(dev: &Device) {
    for &(m, n) in shapes(dev) {
        let x = random(m * n, -8.0, 8.0);
        let xt = Tensor::from_host(dev, &x, &[m, n]).unwrap();
        let mut y = poisoned(dev, &[m, n]);
        tessera_kernels::softmax(dev, &xt, &mut y).unwrap();
        let err = rel_error(&wide(&y.to_host().unwrap()), &softmax_ref(&wide(&x), n));
        assert!(err < 1e-5, "softmax {m}x{n}: relative error {err}");
    }
}

fn softmax_survives_huge_logits(dev: &Device) {
    let (m, n) = (37, 700);
    // Rows of ±1e4 plus noise: a naive exp overflows.
    let mut x = random(m * n, -1.0, 1.0);
    for (i, v) in x.iter_mut().enumerate() {
        *v += if (i / n) % 2 == 0 { 1e4 } else { -1e4 };
    }
    let xt = Tensor::from_host(dev, &x, &[m, n]).unwrap();
    let mut y = poisoned(dev, &[m, n]);
    tessera_kernels::softmax(dev, &xt, &mut y).unwrap();
    let got = wide(&y.to_host().unwrap());
    assert!(got.iter().all(|v| v.is_finite()), "softmax of ±1e4 rows produced a non-finite value");
    let err = rel_error(&got, &softmax_ref(&wide(&x), n));
    assert!(err < 1e-4, "softmax ±1e4: relative error {err}");
}

#[test]
fn gpu_softmax_survives_huge_logits() {
    if let Some(dev) = gpu_or_skip("gpu_softmax_survives_huge_logits") {
        softmax_survives_huge_logits(&dev);
    }
}

#[test]
fn interp_softmax_survives_huge_logits() {
    softmax_survives_huge_logits(&Device::cpu());
}

#[test]
fn gpu_module_is_loaded_once_per_device() {
    let Some(dev) = gpu_or_skip("gpu_module_is_loaded_once_per_device") else { return };
    let x = Tensor::from_host(&dev, &random(64, -1.0, 1.0), &[8, 8]).unwrap();
    let mut y = Tensor::<f32>::zeros(&dev, &[8, 8]).unwrap();
    tessera_kernels::axpy(&dev, 1.0, &x, &mut y).unwrap();
    let after_first = dev.loaded_modules();
    assert!(after_first >= 1);
    for _ in 0..3 {
        tessera_kernels::axpy(&dev, 1.0, &x, &mut y).unwrap();
    }
    assert_eq!(dev.loaded_modules(), after_first, "a launch loaded the module again");
    dev.synchronize().unwrap();
}

fn launch_rejects_mismatched_arguments(dev: &Device) {
    let x = Tensor::from_host(dev, &random(12, -1.0, 1.0), &[3, 4]).unwrap();
    let mut y = Tensor::<f32>::zeros(dev, &[4, 3]).unwrap();
    let e = tessera_kernels::axpy(dev, 1.0, &x, &mut y).unwrap_err().to_string();
    assert!(e.contains("`y`") && e.contains("[3, 4]") && e.contains("[4, 3]"), "{e}");
    // Rank checked by the generated launcher itself.
    let flat = Tensor::from_host(dev, &random(12, -1.0, 1.0), &[12]).unwrap();
    let e = tessera_kernels::kernels::axpy_f32::launch(dev, 1, 1.0, &flat, &mut y).unwrap_err().to_string();
    assert!(e.contains("`x`") && e.contains("rank-2"), "{e}");
    // A view offset by one element is still aligned for f32 scalars; a zero grid is not launchable.
    let e = tessera_kernels::kernels::axpy_f32::launch(dev, (0, 1), 1.0, &x, &mut y).unwrap_err().to_string();
    assert!(e.contains("grid"), "{e}");
    // Nothing was written by the failed calls.
    assert!(y.to_host().unwrap().iter().all(|&v| v == 0.0));
}

#[test]
fn gpu_launch_rejects_mismatched_arguments() {
    if let Some(dev) = gpu_or_skip("gpu_launch_rejects_mismatched_arguments") {
        launch_rejects_mismatched_arguments(&dev);
    }
}

#[test]
fn interp_launch_rejects_mismatched_arguments() {
    launch_rejects_mismatched_arguments(&Device::cpu());
}

#[test]
fn gpu_kernels_accept_cudarc_buffers() {
    let Some(dev) = gpu_or_skip("gpu_kernels_accept_cudarc_buffers") else { return };
    let (m, n) = (33, 65);
    let x = random(m * n, -1.0, 1.0);
    let xb = dev.stream().expect("a CUDA stream").clone_htod(&x).unwrap();
    let mut yb = dev.stream().expect("a CUDA stream").clone_htod(&vec![1.0f32; m * n]).unwrap();
    let grid = (tessera::Grid::tiles(n, 256), tessera::Grid::tiles(m, 16));
    tessera_kernels::kernels::axpy_f32::launch(&dev, grid, 2.0, &tessera::global(&xb, &[m, n]), &mut tessera::global_mut(&mut yb, &[m, n]))
        .unwrap();
    let got: Vec<f32> = dev.stream().expect("a CUDA stream").clone_dtoh(&yb).unwrap();
    let want: Vec<f64> = x.iter().map(|&v| 2.0 * f64::from(v) + 1.0).collect();
    assert!(rel_error(&wide(&got), &want) < 1e-6);
}

fn sm80_variants_run_forward_on_newer_gpus(dev: &Device) {
    let dev = dev.with_target(tessera::Target::Sm80);
    let (m, n) = (257, 1000);
    let x = random(m * n, -4.0, 4.0);
    let xt = Tensor::from_host(&dev, &x, &[m, n]).unwrap();
    let mut y = poisoned(&dev, &[m, n]);
    tessera_kernels::softmax(&dev, &xt, &mut y).unwrap();
    assert!(rel_error(&wide(&y.to_host().unwrap()), &softmax_ref(&wide(&x), n)) < 1e-5, "sm_80 softmax");
    let mut out = poisoned(&dev, &[m]);
    tessera_kernels::row_sum(&dev, &xt, &mut out).unwrap();
    let want: Vec<f64> = wide(&x).chunks(n).map(|r| r.iter().sum()).collect();
    assert!(rel_error(&wide(&out.to_host().unwrap()), &want) < 1e-5, "sm_80 row_sum");
    let mut yt = Tensor::from_host(&dev, &x, &[m, n]).unwrap();
    tessera_kernels::axpy(&dev, 2.0, &xt, &mut yt).unwrap();
    let want: Vec<f64> = x.iter().map(|&v| 3.0 * f64::from(v)).collect();
    assert!(rel_error(&wide(&yt.to_host().unwrap()), &want) < 1e-6, "sm_80 axpy");
    // A Hopper-only kernel asked for sm_80: a clear error, not a crash.
    let a = Tensor::<tessera::bf16>::zeros(&dev, &[64, 64]).unwrap();
    let mut c = Tensor::<tessera::bf16>::zeros(&dev, &[1, 64, 64]).unwrap();
    let (a3, b3) = (a.view(&[1, 64, 64], &[4096, 64, 1]).unwrap(), a.view(&[1, 64, 64], &[4096, 64, 1]).unwrap());
    let one = Tensor::<tessera::bf16>::zeros(&dev, &[1]).unwrap();
    let mut counter = dev.tile_counter().unwrap();
    let e =
        tessera_kernels::kernels::gemm_tn_bf16::launch(&dev, 1, &a3, &b3, &mut c, &one, &mut counter, 1.0, 0, 0).unwrap_err().to_string();
    assert!(e.contains("no sm_80 PTX") && e.contains("it has sm_90a"), "{e}");
}

#[test]
fn gpu_sm80_variants_run_forward_on_newer_gpus() {
    if let Some(dev) = gpu_or_skip("gpu_sm80_variants") {
        sm80_variants_run_forward_on_newer_gpus(&dev);
    }
}

#[test]
fn interp_sm80_variants_run_forward_on_newer_gpus() {
    sm80_variants_run_forward_on_newer_gpus(&Device::cpu());
}

/// Row counts and hidden sizes for the norms: odd ones, non-powers of two, both sides of
/// `ROW_IN_REGISTERS` (the one-read and the tiled kernels).
fn norm_shapes(dev: &Device) -> Vec<(usize, usize)> {
    // Few rows take a block per row, as do many rows of 4097..=12288 (and of 2049..=4096 where
    // that tile is as full as two rows'); many rows of 257..=2304 four rows per block, of
    // 2305..=4096 otherwise two; the rest the tiled kernels (`NormPath::choose`); each
    // appears here on the GPU.
    // 12289..=16384 wide: a row per block of two warpgroups (`rms_norm_wide`…); 20000 tiled.
    let mut shapes = vec![(1, 1), (7, 129), (37, 1536), (3, 5000), (20, 2304), (2, 8192), (3, 9000), (41, 2000), (3, 13001)];
    if !dev.is_cpu() {
        shapes.extend([(5, 16384), (70, 16000), (3, 20000)]);
        shapes.extend([
            (4097, 5000),
            (64, 16384),
            (1000, 11008),
            (300, 2560),
            (64, 5120),
            (4001, 2048),
            (3000, 1900),
            (1201, 3001),
            (999, 4096),
        ]);
        // Every tile width of the one-read kernels (`tune(W = ...)`, the narrowest that holds
        // the row): few rows take a block per row (W a multiple of 1024 to 12288), 600 rows
        // the two- and four-row kernels (multiples of 512 and 256) and the row kernel past
        // 4096.
        shapes.extend([1000, 1500, 2500, 3500, 6100, 7000, 9100, 10100, 11100, 12000].map(|n| (5, n)));
        shapes.extend([300, 700, 1000, 1100, 1536, 1700, 2304, 2500, 3500, 6100, 7000, 8000, 12288].map(|n| (600, n)));
    }
    shapes
}

/// RMSNorm in `T` against f64 on the values `T` holds: each shape with and without a weight.
fn rms_norm_case<T: tessera_kernels::NormElement>(dev: &Device, to: fn(f32) -> T, from: fn(T) -> f64, tol: f64) {
    for (m, n) in norm_shapes(dev) {
        let x: Vec<T> = random(m * n, -3.0, 3.0).into_iter().map(to).collect();
        let w: Vec<T> = random(n, 0.5, 1.5).into_iter().map(to).collect();
        let xt = Tensor::from_host(dev, &x, &[m, n]).unwrap();
        let wt = Tensor::from_host(dev, &w, &[n]).unwrap();
        for with_weight in [true, false] {
            let mut y = Tensor::full(dev, &[m, n], to(f32::NAN)).unwrap();
            tessera_kernels::rms_norm(dev, &xt, with_weight.then_some(&wt), 1e-5, &mut y).unwrap();
            let got: Vec<f64> = y.to_host().unwrap().into_iter().map(from).collect();
            let want: Vec<f64> = (0..m)
                .flat_map(|i| {
                    let row: Vec<f64> = x[i * n..(i + 1) * n].iter().map(|&v| from(v)).collect();
                    let inv = 1.0 / (row.iter().map(|v| v * v).sum::<f64>() / n as f64 + 1e-5).sqrt();
                    let w = &w;
                    row.into_iter().enumerate().map(move |(j, v)| v * inv * if with_weight { from(w[j]) } else { 1.0 })
                })
                .collect();
            let err = rel_error(&got, &want);
            assert!(err < tol, "rms_norm {m}x{n} weight={with_weight}: relative error {err}");
        }
    }
}

/// LayerNorm in `T` against f64: each shape with every combination of weight and bias, on
/// rows centred far from 0 (a variance taken as `E[x²] − E[x]²` would lose it), and on rows of
/// equal values (variance 0: the output is the bias).
fn layer_norm_case<T: tessera_kernels::NormElement>(dev: &Device, to: fn(f32) -> T, from: fn(T) -> f64, tol: f64) {
    for (m, n) in norm_shapes(dev) {
        // A multiple of 1/8, so that the constant row's f32 sum is exact and its mean within an
        // ulp: with an inexact mean the constant row's output is off by (mean error)/sqrt(eps)
        // in any f32 implementation.
        let offset = (random(1, -8.0, 8.0)[0] * 8.0).round() / 8.0;
        let mut x: Vec<T> = random(m * n, -1.0, 1.0).into_iter().map(|v| to(v + offset)).collect();
        // The last row is constant.
        for v in &mut x[(m - 1) * n..] {
            *v = to(offset);
        }
        let w: Vec<T> = random(n, 0.5, 1.5).into_iter().map(to).collect();
        let b: Vec<T> = random(n, -1.0, 1.0).into_iter().map(to).collect();
        let xt = Tensor::from_host(dev, &x, &[m, n]).unwrap();
        let (wt, bt) = (Tensor::from_host(dev, &w, &[n]).unwrap(), Tensor::from_host(dev, &b, &[n]).unwrap());
        for (with_w, with_b) in [(true, true), (true, false), (false, true), (false, false)] {
            let mut y = Tensor::full(dev, &[m, n], to(f32::NAN)).unwrap();
            tessera_kernels::layer_norm(dev, &xt, with_w.then_some(&wt), with_b.then_some(&bt), 1e-5, &mut y).unwrap();
            let got: Vec<f64> = y.to_host().unwrap().into_iter().map(from).collect();
            let mut want = Vec::with_capacity(m * n);
            for i in 0..m {
                let row: Vec<f64> = x[i * n..(i + 1) * n].iter().map(|&v| from(v)).collect();
                let mean = row.iter().sum::<f64>() / n as f64;
                let var = row.iter().map(|v| (v - mean) * (v - mean)).sum::<f64>() / n as f64;
                let rstd = 1.0 / (var + 1e-5).sqrt();
                for (j, v) in row.iter().enumerate() {
                    let wj = if with_w { from(w[j]) } else { 1.0 };
                    let bj = if with_b { from(b[j]) } else { 0.0 };
                    want.push((v - mean) * rstd * wj + bj);
                }
            }
            let what = format!("layer_norm {m}x{n} weight={with_w} bias={with_b} offset={offset}");
            assert!(got.iter().all(|v| v.is_finite()), "{what}: non-finite output");
            // The constant row: the bias, or zeros (f32 rounding of the mean leaves ~1e-4).
            let last = &got[(m - 1) * n..];
            let (worst, dev_from_bias) = last
                .iter()
                .enumerate()
                .map(|(j, v)| (j, (v - want[(m - 1) * n + j]).abs()))
                .fold((0, 0.0), |a, b| if b.1 > a.1 { b } else { a });
            assert!(
                dev_from_bias < 2e-2,
                "{what}: constant row is off by {dev_from_bias} at column {worst} (got {}, want {})",
                last[worst],
                want[(m - 1) * n + worst]
            );
            if m > 1 {
                let err = rel_error(&got[..(m - 1) * n], &want[..(m - 1) * n]);
                assert!(err < tol, "{what}: relative error {err}");
            }
        }
    }
}

fn layer_norm_matches_f64_reference(dev: &Device) {
    use tessera::{bf16, f16};
    layer_norm_case::<bf16>(dev, bf16::from_f32, |v| v.to_f64(), 1e-2);
    layer_norm_case::<f16>(dev, f16::from_f32, |v| v.to_f64(), 5e-3);
    // The mean's f32 rounding (|x| up to 9) moves every output by mean error · rstd.
    layer_norm_case::<f32>(dev, |v| v, f64::from, 5e-4);
}

#[test]
fn gpu_layer_norm_matches_f64_reference() {
    if let Some(dev) = gpu_or_skip("gpu_layer_norm") {
        layer_norm_matches_f64_reference(&dev);
    }
}

#[test]
fn interp_layer_norm_matches_f64_reference() {
    layer_norm_matches_f64_reference(&Device::cpu());
}

fn rms_norm_matches_f64_reference(dev: &Device) {
    use tessera::{bf16, f16};
    rms_norm_case::<bf16>(dev, bf16::from_f32, |v| v.to_f64(), 1e-2);
    rms_norm_case::<f16>(dev, f16::from_f32, |v| v.to_f64(), 2e-3);
    rms_norm_case::<f32>(dev, |v| v, f64::from, 1e-5);
}

#[test]
fn gpu_rms_norm_matches_f64_reference() {
    if let Some(dev) = gpu_or_skip("gpu_rms_norm") {
        rms_norm_matches_f64_reference(&dev);
    }
}

#[test]
fn interp_rms_norm_matches_f64_reference() {
    rms_norm_matches_f64_reference(&Device::cpu());
}

/// RoPE shapes `(batch, seq, heads, dim)`: more heads than a block's 32, a dimension the
/// 64-column tiles do not divide, and every tuned head dimension.
fn rope_shapes(dev: &Device) -> Vec<(usize, usize, usize, usize)> {
    if dev.is_cpu() {
        vec![(1, 3, 3, 64), (1, 2, 33, 128), (2, 1, 2, 96)]
    } else {
        vec![(2, 37, 3, 64), (1, 9, 40, 128), (3, 5, 8, 256), (1, 3, 2, 96), (2, 65, 32, 128)]
    }
}

/// `rope(x)` in f64 for the tensor `x` of logical axes `[b, s, h, d]` (`at` maps them to the
/// flat index); `sign` −1 for the inverse.
#[allow(clippy::too_many_arguments)]
fn rope_reference(
    x: &[f64], (b, s, h, d): (usize, usize, usize, usize), at: &dyn Fn(usize, usize, usize, usize) -> usize,
    style: tessera_kernels::RopeStyle, pos: &dyn Fn(usize, usize) -> usize, base: f64, sign: f64,
) -> Vec<f64> {
    let mut y = vec![0.0; x.len()];
    for bi in 0..b {
        for si in 0..s {
            let p = pos(bi, si) as f64;
            for hi in 0..h {
                for c in 0..d {
                    let (i, partner, sin_sign) = match style {
                        tessera_kernels::RopeStyle::HalfSplit if c < d / 2 => (c, c + d / 2, -1.0),
                        tessera_kernels::RopeStyle::HalfSplit => (c - d / 2, c - d / 2, 1.0),
                        tessera_kernels::RopeStyle::Interleaved => (c / 2, c ^ 1, if c % 2 == 0 { -1.0 } else { 1.0 }),
                    };
                    let theta = p * base.powf(-2.0 * i as f64 / d as f64);
                    let v = x[at(bi, si, hi, c)] * theta.cos() + sign * sin_sign * x[at(bi, si, hi, partner)] * theta.sin();
                    y[at(bi, si, hi, c)] = v;
                }
            }
        }
    }
    y
}

/// RoPE in `T` for both conventions and layouts, angles computed and cached, positions from
/// an offset and from a tensor: out of place against f64, in place equal to out of place, and
/// the backward pass against the inverse rotation in f64.
fn rope_case<T: tessera_kernels::RopeElement>(dev: &Device, to: fn(f32) -> T, from: fn(T) -> f64, tol: f64) {
    use tessera_kernels::{HeadLayout, Positions, Rope, RopeStyle};
    let base = 10_000.0f32;
    for (b, s, h, d) in rope_shapes(dev) {
        let max_pos = 4096;
        let offset = (random(1, 0.0, 3000.0)[0]) as usize;
        let table: Vec<i32> = random(b * s, 0.0, max_pos as f32).into_iter().map(|v| v as i32).collect();
        let pos_t = Tensor::from_host(dev, &table, &[b, s]).unwrap();
        for style in [RopeStyle::HalfSplit, RopeStyle::Interleaved] {
            let (cos, sin) = tessera_kernels::rope_cache(dev, style, max_pos, d, base).unwrap();
            for layout in [HeadLayout::Bshd, HeadLayout::Bhsd] {
                let shape = match layout {
                    HeadLayout::Bshd => [b, s, h, d],
                    HeadLayout::Bhsd => [b, h, s, d],
                };
                let at = move |bi: usize, si: usize, hi: usize, c: usize| match layout {
                    HeadLayout::Bshd => ((bi * s + si) * h + hi) * d + c,
                    HeadLayout::Bhsd => ((bi * h + hi) * s + si) * d + c,
                };
                let x: Vec<T> = random(b * s * h * d, -2.0, 2.0).into_iter().map(to).collect();
                let xw: Vec<f64> = x.iter().map(|&v| from(v)).collect();
                let xt = Tensor::from_host(dev, &x, &shape).unwrap();
                for (cached, by_tensor) in [(false, false), (true, false), (false, true), (true, true)] {
                    let mut rope = Rope::new(style, layout).base(base);
                    rope = if by_tensor { rope.positions(Positions::Tensor(&pos_t)) } else { rope.positions(Positions::Offset(offset)) };
                    if cached {
                        rope = rope.cache(&cos, &sin);
                    }
                    let pos = |bi: usize, si: usize| if by_tensor { table[bi * s + si] as usize } else { offset + si };
                    let what = format!("rope {style:?} {layout:?} {shape:?} cached={cached} positions_tensor={by_tensor}");
                    let mut y = Tensor::full(dev, &shape, to(f32::NAN)).unwrap();
                    tessera_kernels::rope(dev, &rope, &xt, &mut y).unwrap();
                    let got: Vec<f64> = y.to_host().unwrap().into_iter().map(from).collect();
                    let want = rope_reference(&xw, (b, s, h, d), &at, style, &pos, f64::from(base), 1.0);
                    let err = rel_error(&got, &want);
                    assert!(err < tol, "{what}: relative error {err}");

                    let mut inplace = Tensor::from_host(dev, &x, &shape).unwrap();
                    tessera_kernels::rope_in_place(dev, &rope, &mut inplace).unwrap();
                    let same = inplace.to_host().unwrap().into_iter().map(from).zip(&got).all(|(a, b)| a == *b);
                    assert!(same, "{what}: in place differs from out of place");

                    let mut dx = Tensor::full(dev, &shape, to(f32::NAN)).unwrap();
                    tessera_kernels::rope_backward(dev, &rope, &xt, &mut dx).unwrap();
                    let got: Vec<f64> = dx.to_host().unwrap().into_iter().map(from).collect();
                    let want = rope_reference(&xw, (b, s, h, d), &at, style, &pos, f64::from(base), -1.0);
                    let err = rel_error(&got, &want);
                    assert!(err < tol, "{what} backward: relative error {err}");
                }
            }
        }
    }
}

fn rope_matches_f64_reference(dev: &Device) {
    use tessera::{bf16, f16};
    rope_case::<bf16>(dev, bf16::from_f32, |v| v.to_f64(), 1e-2);
    rope_case::<f16>(dev, f16::from_f32, |v| v.to_f64(), 3e-3);
    // Angles up to ~7000 rad computed in f32: ~1e-4 of error from the angle alone.
    rope_case::<f32>(dev, |v| v, f64::from, 2e-3);
}

#[test]
fn gpu_rope_matches_f64_reference() {
    if let Some(dev) = gpu_or_skip("gpu_rope") {
        rope_matches_f64_reference(&dev);
    }
}

#[test]
fn interp_rope_matches_f64_reference() {
    rope_matches_f64_reference(&Device::cpu());
}

/// `softmax(scale·x)` in f64 with the causal mask (column `j` of row `i mod period` kept
/// where `j ≤ i mod period`).
fn softmax_options_ref(x: &[f64], n: usize, period: usize, scale: f64, causal: bool) -> Vec<f64> {
    x.chunks(n)
        .enumerate()
        .flat_map(|(r, row)| {
            let keep = |j: usize| !causal || j <= r % period;
            let m = row.iter().enumerate().filter(|(j, _)| keep(*j)).map(|(_, v)| v * scale).fold(f64::NEG_INFINITY, f64::max);
            let s: f64 = row.iter().enumerate().filter(|(j, _)| keep(*j)).map(|(_, v)| (v * scale - m).exp()).sum();
            row.iter().enumerate().map(move |(j, v)| if keep(j) { (v * scale - m).exp() / s } else { 0.0 }).collect::<Vec<_>>()
        })
        .collect()
}

/// Softmax in `T` with a scale, with and without the causal mask, on every path's shapes (2-D
/// and a 3-D batch), rows of ±1e4, then the backward pass against f64.
fn softmax_options_case<T: tessera_kernels::SoftmaxElement>(dev: &Device, to: fn(f32) -> T, from: fn(T) -> f64, tol: f64) {
    use tessera_kernels::SoftmaxOptions;
    let mut shapes: Vec<Vec<usize>> = norm_shapes(dev).into_iter().map(|(m, n)| vec![m, n]).collect();
    shapes.push(vec![3, 50, 70]);
    shapes.push(vec![2, 129, 129]);
    // Matrices of 3 and 1 rows, 600 rows in all (the four-row kernel on the GPU): a block's
    // rows wrap the period more than once.
    shapes.push(vec![200, 3, 300]);
    shapes.push(vec![600, 1, 260]);
    if !dev.is_cpu() {
        // Past the norms' widest row tile: softmax's forward still a block per row (W 16384).
        shapes.push(vec![5, 16000]);
    }
    for shape in shapes {
        let n = *shape.last().unwrap();
        let rows: usize = shape.iter().product::<usize>() / n;
        let period = if shape.len() == 3 { shape[1] } else { rows };
        let mut x: Vec<f32> = random(rows * n, -4.0, 4.0);
        // Every third row sits at ±1e4: exp of the raw logits would overflow.
        for (i, v) in x.iter_mut().enumerate() {
            if (i / n) % 3 == 1 {
                *v += if (i / n) % 2 == 0 { 1e4 } else { -1e4 };
            }
        }
        let x: Vec<T> = x.into_iter().map(to).collect();
        let xw: Vec<f64> = x.iter().map(|&v| from(v)).collect();
        let xt = Tensor::from_host(dev, &x, &shape).unwrap();
        for causal in [false, true] {
            let scale = random(1, 0.25, 1.5)[0];
            let what = format!("softmax {shape:?} scale={scale} causal={causal}");
            let mut y = Tensor::full(dev, &shape, to(f32::NAN)).unwrap();
            tessera_kernels::softmax_with(dev, &xt, &mut y, SoftmaxOptions { scale, causal }).unwrap();
            let got: Vec<f64> = y.to_host().unwrap().into_iter().map(from).collect();
            assert!(got.iter().all(|v| v.is_finite()), "{what}: non-finite output");
            let want = softmax_options_ref(&xw, n, period, f64::from(scale), causal);
            let err = rel_error(&got, &want);
            assert!(err < tol, "{what}: relative error {err}");

            // Backward from the kernel's own y (as training does) against f64 on the same y.
            let dy: Vec<T> = random(rows * n, -1.0, 1.0).into_iter().map(to).collect();
            let dyt = Tensor::from_host(dev, &dy, &shape).unwrap();
            let mut dx = Tensor::full(dev, &shape, to(f32::NAN)).unwrap();
            tessera_kernels::softmax_backward(dev, &y, &dyt, &mut dx, scale).unwrap();
            let dxg: Vec<f64> = dx.to_host().unwrap().into_iter().map(from).collect();
            let dyw: Vec<f64> = dy.iter().map(|&v| from(v)).collect();
            let want: Vec<f64> = got
                .chunks(n)
                .zip(dyw.chunks(n))
                .flat_map(|(yr, gr)| {
                    let dot: f64 = yr.iter().zip(gr).map(|(a, b)| a * b).sum();
                    yr.iter().zip(gr).map(move |(a, b)| f64::from(scale) * a * (b - dot)).collect::<Vec<_>>()
                })
                .collect();
            // Relative to the size of the terms, `|scale·y|·(|dy| + |dot|)`, not of dx: where
            // `dy − dot` cancels (a row of two live elements with near-equal dy) dx is tiny
            // and f32 rounding of the terms is all there is (5.8e-4 of dx seen once in 40 runs).
            // f32 at least 1e-4: the row's dot product sums 8192 f32 terms.
            let mag: Vec<f64> = got
                .chunks(n)
                .zip(dyw.chunks(n))
                .flat_map(|(yr, gr)| {
                    let dot: f64 = yr.iter().zip(gr).map(|(a, b)| a * b).sum();
                    yr.iter().zip(gr).map(move |(a, b)| (f64::from(scale) * a).abs() * (b.abs() + dot.abs())).collect::<Vec<_>>()
                })
                .collect();
            let diff: f64 = dxg.iter().zip(&want).map(|(a, b)| (a - b) * (a - b)).sum::<f64>().sqrt();
            let err = diff / mag.iter().map(|v| v * v).sum::<f64>().sqrt().max(f64::MIN_POSITIVE);
            assert!(err < tol.max(1e-4), "{what} backward: relative error {err}");
        }
    }
}

fn softmax_options_match_f64_reference(dev: &Device) {
    use tessera::{bf16, f16};
    softmax_options_case::<bf16>(dev, bf16::from_f32, |v| v.to_f64(), 1e-2);
    softmax_options_case::<f16>(dev, f16::from_f32, |v| v.to_f64(), 2e-3);
    // f32 at 3e-5: rows up to 16000 wide sum that many rounded exponentials (1.1e-5 seen at 13001).
    softmax_options_case::<f32>(dev, |v| v, f64::from, 3e-5);
}

#[test]
fn gpu_softmax_options_match_f64_reference() {
    if let Some(dev) = gpu_or_skip("gpu_softmax_options") {
        softmax_options_match_f64_reference(&dev);
    }
}

#[test]
fn interp_softmax_options_match_f64_reference() {
    softmax_options_match_f64_reference(&Device::cpu());
}

/// Column reductions, and the means of both axes, against f64 on every shape.
fn reductions_match_f64_reference(dev: &Device) {
    type Op = fn(&Device, &Tensor<f32>, &mut Tensor<f32>) -> tessera::Result<()>;
    type Reference = fn(&[f64]) -> f64;
    let cases: [(&str, Op, bool, Reference); 4] = [
        ("col_sum", tessera_kernels::col_sum, false, |v| v.iter().sum()),
        ("col_max", tessera_kernels::col_max, false, row_max_ref),
        ("col_mean", tessera_kernels::col_mean, false, |v| v.iter().sum::<f64>() / v.len() as f64),
        ("row_mean", tessera_kernels::row_mean, true, |v| v.iter().sum::<f64>() / v.len() as f64),
    ];
    for &(m, n) in shapes(dev) {
        // Centred away from 0 so that a mean is not a relative error of noise.
        let x = random(m * n, 0.5, 1.5);
        let xt = Tensor::from_host(dev, &x, &[m, n]).unwrap();
        let xw = wide(&x);
        for (name, f, rows, reference) in cases {
            let len = if rows { m } else { n };
            let mut out = poisoned(dev, &[len]);
            f(dev, &xt, &mut out).unwrap();
            let got = wide(&out.to_host().unwrap());
            let want: Vec<f64> = if rows {
                xw.chunks(n).map(reference).collect()
            } else {
                (0..n).map(|j| reference(&(0..m).map(|i| xw[i * n + j]).collect::<Vec<_>>())).collect()
            };
            let err = rel_error(&got, &want);
            assert!(err < 1e-5, "{name} {m}x{n}: relative error {err}");
        }
    }
}

#[test]
fn gpu_reductions_match_f64_reference() {
    if let Some(dev) = gpu_or_skip("gpu_reductions") {
        reductions_match_f64_reference(&dev);
    }
}

#[test]
fn interp_reductions_match_f64_reference() {
    reductions_match_f64_reference(&Device::cpu());
}

/// The f64 reference of a norm of `h` (`m × n`): `norm(h) · w + b`, then `· (1 + scale[g]) +
/// shift[g]` with `g = row / (m / groups)`.
#[allow(clippy::too_many_arguments)]
fn norm_ref(
    layer: bool, h: &[f64], n: usize, w: Option<&[f64]>, b: Option<&[f64]>, modulation: Option<(&[f64], &[f64], usize)>, eps: f64,
) -> Vec<f64> {
    let m = h.len() / n.max(1);
    let mut out = Vec::with_capacity(h.len());
    for (i, row) in h.chunks(n).enumerate() {
        let mean = if layer { row.iter().sum::<f64>() / n as f64 } else { 0.0 };
        let rstd = 1.0 / (row.iter().map(|v| (v - mean) * (v - mean)).sum::<f64>() / n as f64 + eps).sqrt();
        for (j, v) in row.iter().enumerate() {
            let mut o = (v - mean) * rstd * w.map_or(1.0, |w| w[j]) + b.map_or(0.0, |b| b[j]);
            if let Some((scale, shift, groups)) = modulation {
                let g = i / (m / groups);
                o = o * (1.0 + scale[g * n + j]) + shift[g * n + j];
            }
            out.push(o);
        }
    }
    out
}

/// The f64 backward of a norm of `h`: `(dh, dweight, dbias)`, `dh` including `dres`.
fn norm_backward_ref(layer: bool, h: &[f64], dy: &[f64], dres: &[f64], n: usize, w: &[f64], eps: f64) -> (Vec<f64>, Vec<f64>, Vec<f64>) {
    let (mut dh, mut dw, mut db) = (Vec::with_capacity(h.len()), vec![0.0; n], vec![0.0; n]);
    for (i, row) in h.chunks(n).enumerate() {
        let g = &dy[i * n..(i + 1) * n];
        let mean = if layer { row.iter().sum::<f64>() / n as f64 } else { 0.0 };
        let rstd = 1.0 / (row.iter().map(|v| (v - mean) * (v - mean)).sum::<f64>() / n as f64 + eps).sqrt();
        let xhat: Vec<f64> = row.iter().map(|v| (v - mean) * rstd).collect();
        let gw: Vec<f64> = g.iter().zip(w).map(|(a, b)| a * b).collect();
        let ma = gw.iter().zip(&xhat).map(|(a, b)| a * b).sum::<f64>() / n as f64;
        let mb = if layer { gw.iter().sum::<f64>() / n as f64 } else { 0.0 };
        for j in 0..n {
            dh.push(rstd * (gw[j] - mb - xhat[j] * ma) + dres[i * n + j]);
            dw[j] += g[j] * xhat[j];
            db[j] += g[j];
        }
    }
    (dh, dw, db)
}

/// The fused norms in `T`: dropout, residual, weight, bias, scale and shift forward (`y` and
/// the new residual `h`, twice: the same bits), then the backward pass from that `h` (`dh`
/// with a residual gradient, `dx` through the same mask, `dweight`, `dbias`).
fn fused_norm_case<T: tessera_kernels::NormElement>(dev: &Device, to: fn(f32) -> T, from: fn(T) -> f64, tol: f64) {
    use tessera_kernels::{Dropout, Norm, NormGrads};
    // (2, 12800): the backward's two-warpgroup kernel, each half of a row in registers.
    // (3, 2064), (4, 8192): the staged backward's widths (`TESSERA_NORM_BACKWARD=staged`), its
    // last box partly past the row and one not issued at 2064. (4, 8192), (9, 8193): the
    // two-warpgroup kernel's half rows of 4096 and 5120.
    // (3, 4000), (3, 5000): the row kernel's widest tiles (its sums in registers; 16-bit rows to
    // 4096, to 5120 in the plain backward). (3, 2300), (3, 4600): the tiles of 2304 and 4608
    // (runs of 2 and 4 columns a thread), the latter the shared-memory sums' kernel in the
    // fused backward.
    let mut shapes = vec![
        (1, 1),
        (7, 129),
        (6, 1536),
        (3, 9000),
        (4, 8192),
        (3, 2064),
        (3, 4000),
        (3, 5000),
        (72, 1024),
        (2, 12800),
        (3, 2300),
        (3, 4600),
    ];
    if !dev.is_cpu() {
        shapes.extend([(300, 8192), (60, 12288), (130, 16384), (1000, 2304), (2, 20000), (1000, 1536), (1002, 2048)]);
        shapes.extend([(1, 12289), (300, 13000), (40, 11000), (9, 8193)]);
        // Every tile width of the fused row kernel (a block per row) and of the four-row one
        // (1000 rows in two groups of 500: a multiple of four).
        shapes.extend([1000, 3000, 4000, 6000, 7000, 9100, 10100, 11100].map(|n| (5, n)));
        shapes.extend([300, 700, 1000, 1100, 1700].map(|n| (1000, n)));
    }
    let host = |v: Vec<f32>| -> Vec<T> { v.into_iter().map(to).collect() };
    let wide64 = |v: &[T]| -> Vec<f64> { v.iter().map(|&x| from(x)).collect() };
    for (m, n) in shapes {
        for layer in [false, true] {
            let groups = if m % 2 == 0 { 2 } else { 1 };
            let (x, res, dy, dres) = (
                host(random(m * n, -2.0, 2.0)),
                host(random(m * n, -1.0, 1.0)),
                host(random(m * n, -1.0, 1.0)),
                host(random(m * n, -1.0, 1.0)),
            );
            let (w, b) = (host(random(n, 0.5, 1.5)), host(random(n, -1.0, 1.0)));
            let (scale, shift) = (host(random(groups * n, -0.5, 0.5)), host(random(groups * n, -1.0, 1.0)));
            let t = |v: &[T], shape: &[usize]| Tensor::from_host(dev, v, shape).unwrap();
            let (xt, rt, dyt, drt, wt, bt, st, sht) = (
                t(&x, &[m, n]),
                t(&res, &[m, n]),
                t(&dy, &[m, n]),
                t(&dres, &[m, n]),
                t(&w, &[n]),
                t(&b, &[n]),
                t(&scale, &[groups, n]),
                t(&shift, &[groups, n]),
            );
            let drop = Dropout::new(0.2, rand::random(), rand::random());
            let base = if layer { Norm::layer(1e-5) } else { Norm::rms(1e-5) };
            let norm = base.weight(&wt).bias(&bt).residual(&rt).dropout(drop);
            let what = format!("{} {m}x{n} seed {:#x} offset {}", if layer { "layer" } else { "rms" }, drop.seed, drop.offset);
            let run = || {
                let (mut y, mut h) = (Tensor::full(dev, &[m, n], to(f32::NAN)).unwrap(), Tensor::full(dev, &[m, n], to(f32::NAN)).unwrap());
                norm.modulate(&st, &sht).forward(dev, &xt, &mut y, Some(&mut h)).unwrap();
                (y.to_host().unwrap(), h.to_host().unwrap())
            };
            let (y, h) = run();
            let (y2, h2) = run();
            assert!(
                y.iter().zip(&y2).chain(h.iter().zip(&h2)).all(|(a, b)| from(*a).to_bits() == from(*b).to_bits()),
                "{what}: two runs differ"
            );
            let keep_scale = f64::from(1.0 / (1.0 - drop.p));
            let h_want: Vec<f64> =
                (0..m * n).map(|k| from(x[k]) * if drop.keeps(k / n, k % n) { keep_scale } else { 0.0 } + from(res[k])).collect();
            let err = rel_error(&wide64(&h), &h_want);
            assert!(err < tol, "{what}: h relative error {err}");
            let (w64, b64, s64, sh64) = (wide64(&w), wide64(&b), wide64(&scale), wide64(&shift));
            let y_want = norm_ref(layer, &h_want, n, Some(&w64), Some(&b64), Some((&s64, &sh64, groups)), 1e-5);
            let err = rel_error(&wide64(&y), &y_want);
            assert!(err < tol, "{what}: y relative error {err}");

            // Backward from the h the forward pass returned.
            let ht = t(&h, &[m, n]);
            let [mut dh, mut dx] = [(); 2].map(|_| Tensor::full(dev, &[m, n], to(f32::NAN)).unwrap());
            let [mut dw, mut db] = [(); 2].map(|_| Tensor::full(dev, &[n], to(f32::NAN)).unwrap());
            let grads = NormGrads { dh: &mut dh, dx: Some(&mut dx), dweight: Some(&mut dw), dbias: Some(&mut db) };
            norm.backward(dev, &ht, &dyt, Some(&drt), grads).unwrap();
            let (dh_want, dw_want, db_want) = norm_backward_ref(layer, &wide64(&h), &wide64(&dy), &wide64(&dres), n, &w64, 1e-5);
            let dx_want: Vec<f64> =
                dh_want.iter().enumerate().map(|(k, v)| v * if drop.keeps(k / n, k % n) { keep_scale } else { 0.0 }).collect();
            for (name, got, want) in [("dh", &dh, &dh_want), ("dx", &dx, &dx_want), ("dweight", &dw, &dw_want), ("dbias", &db, &db_want)] {
                let err = rel_error(&wide64(&got.to_host().unwrap()), want);
                assert!(err < tol, "{what}: {name} relative error {err}");
            }
            // The plain backward (no residual gradient, no dropout: the row kernel's widest
            // tiles in 16 bits), against the same reference with a zero residual gradient (not
            // for one column: its dh is zero up to rounding, so no relative error).
            if n == 1 {
                continue;
            }
            let plain = base.weight(&wt).bias(&bt);
            let [mut dh, mut dw, mut db] = [[m, n].as_slice(), &[n], &[n]].map(|s| Tensor::full(dev, s, to(f32::NAN)).unwrap());
            plain
                .backward(dev, &ht, &dyt, None, NormGrads { dh: &mut dh, dx: None, dweight: Some(&mut dw), dbias: Some(&mut db) })
                .unwrap();
            let (dh_want, dw_want, db_want) = norm_backward_ref(layer, &wide64(&h), &wide64(&dy), &vec![0.0; m * n], n, &w64, 1e-5);
            for (name, got, want) in [("dh", &dh, &dh_want), ("dweight", &dw, &dw_want), ("dbias", &db, &db_want)] {
                let err = rel_error(&wide64(&got.to_host().unwrap()), want);
                assert!(err < tol, "{what}, plain: {name} relative error {err}");
            }
            // The backward pass takes no scale and shift yet: an error naming them.
            let mut dh = Tensor::full(dev, &[m, n], to(f32::NAN)).unwrap();
            let e = norm.modulate(&st, &sht).backward(
                dev,
                &ht,
                &dyt,
                None,
                NormGrads { dh: &mut dh, dx: Some(&mut dx), dweight: None, dbias: None },
            );
            assert!(matches!(e, Err(tessera::Error::Argument { ref arg, .. }) if arg == "scale"), "{what}: {e:?}");
        }
    }
    // The keep rate over many draws, within 6 standard deviations of 1 − p.
    let (m, n) = if dev.is_cpu() { (16, 1000) } else { (512, 4096) };
    let x: Vec<T> = random(m * n, 0.5, 2.0).into_iter().map(to).collect();
    let xt = Tensor::from_host(dev, &x, &[m, n]).unwrap();
    let (mut y, mut h) = (Tensor::full(dev, &[m, n], to(f32::NAN)).unwrap(), Tensor::full(dev, &[m, n], to(f32::NAN)).unwrap());
    Norm::rms(1e-5).dropout(Dropout::new(0.25, rand::random(), 7)).forward(dev, &xt, &mut y, Some(&mut h)).unwrap();
    let count = (m * n) as f64;
    let rate = h.to_host().unwrap().iter().filter(|&&v| from(v) != 0.0).count() as f64 / count;
    assert!((rate - 0.75).abs() < 6.0 * (0.75 * 0.25 / count).sqrt(), "keep rate {rate}");
}

fn fused_norms_match_f64_reference(dev: &Device) {
    use tessera::bf16;
    fused_norm_case::<bf16>(dev, bf16::from_f32, |v| v.to_f64(), 1e-2);
    fused_norm_case::<f32>(dev, |v| v, f64::from, 5e-4);
}

#[test]
fn gpu_fused_norms_match_f64_reference() {
    if let Some(dev) = gpu_or_skip("gpu_fused_norms") {
        fused_norms_match_f64_reference(&dev);
    }
}

#[test]
fn interp_fused_norms_match_f64_reference() {
    fused_norms_match_f64_reference(&Device::cpu());
}

/// A tensor of the other backend, each way: an error naming it, before anything runs, and no
/// tensor changed (the GPU's counterpart of `tests/bad_input.rs`, which runs on the CPU alone).
#[test]
fn bad_input_tensors_of_the_other_backend() {
    let Some(gpu) = gpu_or_skip("bad_input_tensors_of_the_other_backend") else { return };
    let cpu = Device::cpu();
    let x = random(8 * 256, -1.0, 1.0);
    for (run_on, x_on, y_on) in [(&gpu, &cpu, &gpu), (&cpu, &gpu, &cpu), (&gpu, &gpu, &cpu)] {
        let xt = Tensor::from_host(x_on, &x, &[8, 256]).unwrap();
        let mut y = poisoned(y_on, &[8, 256]);
        let before = y.to_host().unwrap();
        let got = tessera_kernels::rms_norm(run_on, &xt, None, 1e-6, &mut y);
        let want = if x_on.is_cpu() != run_on.is_cpu() { "x" } else { "y" };
        match got {
            Err(tessera::Error::Argument { arg, expected, found, .. }) => {
                assert_eq!(arg, want, "names the tensor of the other backend ({expected}; {found})");
            }
            other => panic!("expected an argument error naming {want}, got {other:?}"),
        }
        assert_eq!(xt.to_host().unwrap(), x, "x changed");
        let after = y.to_host().unwrap();
        assert!(after.iter().zip(&before).all(|(a, b)| a.to_bits() == b.to_bits()), "y changed");
    }
}
