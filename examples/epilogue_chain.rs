//! One epilogue chain — bias → GELU → dropout → residual — written once, as a device
//! function, and fused into the store loops of two different kernels: the library's Hopper
//! GEMM (`tessera_kernels::prelude::gemm_persistent`) and its FlashAttention forward
//! (`attention_persistent`). Each kernel hands the chain its output 64×64 chunk by chunk, in
//! registers, with the chunk's origin in the output; the chain reads its bias and residual
//! there, draws its dropout mask from the Philox stream of the element's coordinates (so the
//! mask does not depend on the tiling), and the kernel stores what it returns. Neither kernel
//! makes a second pass over its output (`tests/epilogue.rs` reads their PTX).
//!
//! `cargo run --release --example epilogue_chain` checks both against float64 references: on
//! the GPU where there is one (Hopper), else in the CPU interpreter at a smaller size.

use tessera::{bf16, device, kernel, Device, Grid, Tensor, F8E4M3};
use tessera_kernels::prelude::{attention_persistent, causal_keys, causal_visible, dropout, gelu_tanh, gemm_persistent, gemm_portable};

/// `residual + dropout(gelu(x + bias[col]))` on the chunk at `[plane, row, col]` of an
/// output: `bias` per column, `residual` shaped as the output, elements dropped with
/// probability `p` by the Philox stream of (`seed`, `plane`, their row and column).
#[device]
pub fn bias_gelu_dropout_residual<T, const W: usize>(
    x: Tile<f32, 64, W>, bias: Global<T, 1>, residual: Global<T, 3>, p: f32, seed: i32, plane: i32, row: i32, col: i32,
) -> Tile<f32, 64, W> {
    let g = gelu_tanh(x + bias.load::<Tile<T, 1, W>>([col]).cast::<f32>());
    let kept = dropout(g, p, 1.0 / (1.0 - p), seed, 0, plane, row, col);
    kept + residual.load::<Tile<T, 64, W>>([plane, row, col]).cast::<f32>()
}

/// `C = residual + dropout(gelu(A·Bᵀ + bias))`: A `[batch, M, K]`, B `[batch, N, K]`, C and
/// `residual` `[batch, M, N]` (rows 16-byte aligned), a persistent grid of at most one block
/// per SM drawing 128×256 tiles from `counter` (a zeroed `Device::tile_counter()`).
#[kernel(warpgroups = 3, targets(sm_90a))]
pub fn gemm_chain(
    a: Global<bf16, 3>, b: Global<bf16, 3>, c: Global<bf16, 3>, bias: Global<bf16, 1>, residual: Global<bf16, 3>, counter: Global<i32, 1>,
    p: f32, seed: i32,
) {
    let sa = Smem::<bf16, 128, 64>::ring(4);
    let sb = Smem::<bf16, 256, 64>::ring(4);
    let sc = Smem::<bf16, 64, 64>::ring(4);
    let pipe = Pipeline::<4>::new(2);
    gemm_persistent::<0, 256>(a, b, c, counter, sa, sb, sc, pipe, |acc, bt, m, n| {
        bias_gelu_dropout_residual(acc, bias, residual, p, seed, bt, m, n)
    });
}

/// The same chain, then a scale and a cast to fp8: `C = e4m3((residual + dropout(gelu(A·Bᵀ +
/// bias))) · scale)` on the library's portable GEMM (`gemm_portable`, 64×16 chunks stored
/// directly, so C may be an fp8 tensor): the quantized output of a layer whose next GEMM reads
/// fp8, in the one pass over C.
#[kernel(warpgroups = 3, targets(sm_90a))]
pub fn gemm_chain_fp8(
    a: Global<bf16, 3>, b: Global<bf16, 3>, c: Global<f8e4m3, 3>, bias: Global<bf16, 1>, residual: Global<bf16, 3>, p: f32, seed: i32,
    scale: f32,
) {
    let sa = Smem::<bf16, 128, 64>::ring(4);
    let sb = Smem::<bf16, 128, 64>::ring(4);
    let pipe = Pipeline::<4>::new(2);
    gemm_portable::<0>(a, b, c, sa, sb, pipe, |acc, bt, m, n| bias_gelu_dropout_residual(acc, bias, residual, p, seed, bt, m, n) * scale);
}

/// `O = residual + dropout(gelu(softmax(Q·Kᵀ·scale)·V + bias))` per (batch·head): Q, K, V, O
/// and `residual` `[batch·heads, seq, 128]`, `bias` `[128]`; the library's attention schedule
/// (128-query tiles, 128-key blocks, two stages) with every tile whole (`full` = every tile,
/// `parts` = 1: split tiles would be combined without the epilogue). `scale_log2` is the
/// scores' scale times log₂e; `opart`/`lpart`, unused without parts, any f32 tensors.
#[kernel(warpgroups = 3, targets(sm_90a))]
pub fn attention_chain(
    q: Global<bf16, 3>, k: Global<bf16, 3>, v: Global<bf16, 3>, o: Global<bf16, 3>, lse: Global<f32, 3>, counter: Global<i32, 1>,
    opart: Global<f32, 3>, lpart: Global<f32, 3>, bias: Global<bf16, 1>, residual: Global<bf16, 3>, causal: i32, scale_log2: f32, p: f32,
    seed: i32,
) {
    let tiles = (q.dim(1) + 127) / 128 * q.dim(0);
    let seq_k = k.dim(1);
    let shift = seq_k - q.dim(1);
    // [batch·heads, seq, dim] views, one head a plane: (q_bm, k_bm, hm, cm) = (1, 1, 0, 0)
    // with `heads` 1; no grouped heads, one head per group, no log-sum-exp; scores as they
    // are, under the causal mask when `causal` is 1.
    #[rustfmt::skip]
    attention_persistent::<bf16, 128, 128, 2>(
        q, k, v, o, lse, counter, opart, lpart, tiles, 1, 1, 1, 1, 1, 0, 0, 1, 0, scale_log2,
        |x, plane, row, col| bias_gelu_dropout_residual(x, bias, residual, p, seed, plane, row, col),
        |s, _qi, _kj, _bh| s,
        |qi, kj, _bh| causal_visible(qi, kj, shift),
        |_bh, q0, rows| causal_keys(q0, rows, seq_k, shift, causal),
        |p, _bh, _q0, _k0| p,
    );
}

/// The chain in float64 for element `[plane, row, col]` of an output whose pre-epilogue value
/// is `x`.
#[allow(clippy::too_many_arguments)]
pub fn chain_reference(
    x: f64, bias: &[bf16], residual: &[bf16], dims: [usize; 2], p: f32, seed: i32, [plane, row, col]: [usize; 3],
) -> f64 {
    let g = {
        let v = x + f64::from(bias[col].to_f32());
        0.5 * v * (1.0 + (0.7978845608 * (v + 0.044715 * v * v * v)).tanh())
    };
    let keep = tessera::random::uniform(seed as u32 as u64, plane as u32, row, col) >= p;
    let kept = if keep { g / (1.0 - f64::from(p)) } else { 0.0 };
    kept + f64::from(residual[(plane * dims[0] + row) * dims[1] + col].to_f32())
}

/// `a` (M×K), `b` (N×K) and an M×N tensor as the batch-of-one views the GEMM kernels read.
fn batch_of_one<'t>(a: &'t Tensor<bf16>, b: &'t Tensor<bf16>, mn: &'t Tensor<bf16>) -> tessera::Result<[tessera::TensorView<'t, bf16>; 3]> {
    let (m, k, n) = (a.shape()[0], a.shape()[1], b.shape()[0]);
    Ok([a.view(&[1, m, k], &[m * k, k, 1])?, b.view(&[1, n, k], &[n * k, k, 1])?, mn.view(&[1, m, n], &[m * n, n, 1])?])
}

/// Runs `gemm_chain` on `a` (M×K), `b` (N×K), `bias` (N), `residual` (M×N) into `c`.
///
/// # Errors
/// As the launcher's: a tensor of the wrong rank, dtype or alignment, or a driver failure.
#[allow(clippy::too_many_arguments)]
pub fn run_gemm(
    dev: &Device, a: &Tensor<bf16>, b: &Tensor<bf16>, bias: &Tensor<bf16>, residual: &Tensor<bf16>, c: &mut Tensor<bf16>, p: f32, seed: i32,
) -> tessera::Result<()> {
    let [a3, b3, r3] = batch_of_one(a, b, residual)?;
    let (m, n) = (a.shape()[0], b.shape()[0]);
    let mut c3 = c.view_mut(&[1, m, n], &[m * n, n, 1])?;
    let tiles = Grid::tiles(m, 128).saturating_mul(Grid::tiles(n, 256));
    let mut counter = dev.tile_counter()?;
    gemm_chain::launch(dev, tiles.min(dev.sm_count()), &a3, &b3, &mut c3, bias, &r3, &mut counter, p, seed)
}

/// Runs `gemm_chain_fp8` as [`run_gemm`] runs `gemm_chain`, C in E4M3 scaled by `scale`.
///
/// # Errors
/// As the launcher's.
#[allow(clippy::too_many_arguments)]
pub fn run_gemm_fp8(
    dev: &Device, a: &Tensor<bf16>, b: &Tensor<bf16>, bias: &Tensor<bf16>, residual: &Tensor<bf16>, c: &mut Tensor<F8E4M3>, p: f32,
    seed: i32, scale: f32,
) -> tessera::Result<()> {
    let [a3, b3, r3] = batch_of_one(a, b, residual)?;
    let (m, n) = (a.shape()[0], b.shape()[0]);
    let mut c3 = c.view_mut(&[1, m, n], &[m * n, n, 1])?;
    let tiles = Grid::tiles(m, 128).saturating_mul(Grid::tiles(n, 128));
    gemm_chain_fp8::launch(dev, tiles.min(dev.sm_count()), &a3, &b3, &mut c3, bias, &r3, p, seed, scale)
}

/// Runs `attention_chain` on `[planes, seq, 128]` tensors.
///
/// # Errors
/// As the launcher's: a tensor of the wrong rank, dtype or alignment, or a driver failure.
#[allow(clippy::too_many_arguments)]
pub fn run_attention(
    dev: &Device, [q, k, v]: [&Tensor<bf16>; 3], bias: &Tensor<bf16>, residual: &Tensor<bf16>, o: &mut Tensor<bf16>, causal: bool, p: f32,
    seed: i32,
) -> tessera::Result<()> {
    let (planes, seq) = (q.shape()[0], q.shape()[1]);
    let mut lse = Tensor::<f32>::full(dev, &[planes, seq, 1], 0.0)?;
    let mut part = Tensor::<f32>::full(dev, &[1, 128, 128], 0.0)?;
    let mut lpart = Tensor::<f32>::full(dev, &[1, 128, 1], 0.0)?;
    let mut counter = dev.tile_counter()?;
    let tiles = Grid::tiles(seq, 128).saturating_mul(planes as u32);
    let scale_log2 = (1.0 / 128f32.sqrt()) * std::f32::consts::LOG2_E;
    attention_chain::launch(
        dev,
        tiles.min(dev.sm_count()),
        q,
        k,
        v,
        o,
        &mut lse,
        &mut counter,
        &mut part,
        &mut lpart,
        bias,
        residual,
        i32::from(causal),
        scale_log2,
        p,
        seed,
    )
}

/// Float64 `softmax(q·kᵀ/√128)·v` row `i` of plane `pl` (`[planes, seq, 128]` slices).
pub fn attention_row(q: &[bf16], k: &[bf16], v: &[bf16], seq: usize, causal: bool, pl: usize, i: usize) -> Vec<f64> {
    let at = |t: &[bf16], r: usize, x: usize| f64::from(t[(pl * seq + r) * 128 + x].to_f32());
    let keys = if causal { i + 1 } else { seq };
    let s: Vec<f64> = (0..keys).map(|j| (0..128).map(|x| at(q, i, x) * at(k, j, x)).sum::<f64>() / 128f64.sqrt()).collect();
    let mx = s.iter().copied().fold(f64::NEG_INFINITY, f64::max);
    let w: Vec<f64> = s.iter().map(|x| (x - mx).exp()).collect();
    let sum: f64 = w.iter().sum();
    (0..128).map(|x| (0..keys).map(|j| w[j] * at(v, j, x)).sum::<f64>() / sum).collect()
}

/// `‖got − want‖ / ‖want‖` over `(got, want)` pairs.
fn rel(pairs: impl Iterator<Item = (f64, f64)>) -> f64 {
    let (num, den) = pairs.fold((0.0, 0.0), |(n, d), (g, w)| (n + (g - w).powi(2), d + w * w));
    (num / f64::max(den, 1e-30)).sqrt()
}

/// Runs the three kernels at `(m, n, k)` and `(planes, seq)` (causal) on fresh random inputs,
/// outputs poisoned, and returns their relative errors against float64 (GEMM, fp8 GEMM,
/// attention), every `step`-th row checked.
///
/// # Errors
/// As the launchers'.
pub fn check(dev: &Device, (m, n, k): (usize, usize, usize), (planes, seq): (usize, usize), step: usize) -> tessera::Result<[f64; 3]> {
    let mut rng = tessera::testing::Uniform::new();
    let p = 0.1 + 0.2 * rng.vec(1, |x| x.abs())[0];
    let seed = rng.vec(1, |x| (x * 1e6) as i32)[0];
    // The GEMM.
    let (ha, hb) = (rng.vec(m * k, |x| bf16::from_f32(x * 0.5)), rng.vec(n * k, |x| bf16::from_f32(x * 0.5)));
    let (hbias, hres) = (rng.vec(n, bf16::from_f32), rng.vec(m * n, bf16::from_f32));
    let a = Tensor::from_host(dev, &ha, &[m, k])?;
    let b = Tensor::from_host(dev, &hb, &[n, k])?;
    let bias = Tensor::from_host(dev, &hbias, &[n])?;
    let res = Tensor::from_host(dev, &hres, &[m, n])?;
    let mut c = Tensor::from_host(dev, &vec![bf16::NAN; m * n], &[m, n])?;
    run_gemm(dev, &a, &b, &bias, &res, &mut c, p, seed)?;
    // The float64 chain at every checked element, once for both GEMMs.
    let want: Vec<(usize, f64)> = (0..m)
        .step_by(step)
        .flat_map(|i| (0..n).map(move |j| (i, j)))
        .map(|(i, j)| {
            let dot: f64 = (0..k).map(|x| f64::from(ha[i * k + x].to_f32()) * f64::from(hb[j * k + x].to_f32())).sum();
            (i * n + j, chain_reference(dot, &hbias, &hres, [m, n], p, seed, [0, i, j]))
        })
        .collect();
    let got = c.to_host()?;
    let gemm_err = rel(want.iter().map(|&(at, w)| (f64::from(got[at].to_f32()), w)));
    // The same chain into fp8 (E4M3 keeps 3 mantissa bits: a relative error near 2⁻⁵).
    let scale = 0.5 + rng.vec(1, |x| x.abs())[0];
    let mut c8 = Tensor::from_host(dev, &vec![F8E4M3::from_bits(0x7f); m * n], &[m, n])?;
    run_gemm_fp8(dev, &a, &b, &bias, &res, &mut c8, p, seed, scale)?;
    let got8 = c8.to_host()?;
    let fp8_err = rel(want.iter().map(|&(at, w)| (f64::from(got8[at].to_f32()), w * f64::from(scale))));
    // The attention.
    let len = planes * seq * 128;
    let qkv: Vec<Vec<bf16>> = (0..3).map(|_| rng.vec(len, bf16::from_f32)).collect();
    let (abias, ares) = (rng.vec(128, bf16::from_f32), rng.vec(len, bf16::from_f32));
    let t: Vec<Tensor<bf16>> = qkv.iter().map(|h| Tensor::from_host(dev, h, &[planes, seq, 128])).collect::<Result<_, _>>()?;
    let bias = Tensor::from_host(dev, &abias, &[128])?;
    let res = Tensor::from_host(dev, &ares, &[planes, seq, 128])?;
    let mut o = Tensor::from_host(dev, &vec![bf16::NAN; len], &[planes, seq, 128])?;
    run_attention(dev, [&t[0], &t[1], &t[2]], &bias, &res, &mut o, true, p, seed)?;
    let got = o.to_host()?;
    let pairs = (0..planes).flat_map(|pl| (0..seq).step_by(step).map(move |i| (pl, i))).flat_map(|(pl, i)| {
        let row = attention_row(&qkv[0], &qkv[1], &qkv[2], seq, true, pl, i);
        let (abias, ares, got) = (&abias, &ares, &got);
        row.into_iter().enumerate().map(move |(x, y)| {
            (f64::from(got[(pl * seq + i) * 128 + x].to_f32()), chain_reference(y, abias, ares, [seq, 128], p, seed, [pl, i, x]))
        })
    });
    let attn_err = rel(pairs);
    Ok([gemm_err, fp8_err, attn_err])
}

#[allow(dead_code)]
fn main() -> tessera::Result<()> {
    let dev = Device::gpu_or_cpu();
    let gpu = !dev.is_cpu();
    let (gemm, attn, step) = if gpu { ((1000, 2048, 520), (6, 1000), 37) } else { ((130, 264, 72), (2, 130), 1) };
    let [g, g8, a] = check(&dev, gemm, attn, step)?;
    println!(
        "epilogue chain on {}: GEMM {gemm:?} relative error {g:.2e}, into fp8 {g8:.2e}; causal attention {attn:?}×128 {a:.2e}",
        if gpu { "the GPU" } else { "the CPU interpreter" }
    );
    assert!(g < 1e-2 && g8 < 6e-2 && a < 1e-2, "the chain's outputs differ from float64");
    Ok(())
}
