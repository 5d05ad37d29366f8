//! A Llama-3-style decoder block in candle, twice: once on candle's own ops (cuBLAS matmuls,
//! candle-nn's fused RMSNorm, RoPE and softmax, attention as two matmuls around a masked
//! softmax, as candle-transformers' Llama runs it without flash-attn), once with Tessera's
//! kernels as candle ops (`tessera_candle`: RMSNorm, the projections with SiLU and the residual
//! in the GEMM's epilogue, RoPE, FlashAttention with grouped heads). Both blocks take the same
//! weights and inputs; the example checks that they agree, then times both at prefill and at
//! one decode step against a KV cache. candle's block keeps RoPE's tables and the causal mask
//! from call to call (as candle-transformers' Llama cache does); Tessera's computes the angles
//! in the RoPE kernel and masks inside the attention kernel.
//!
//! ```text
//! source scripts/cuda-toolkit.sh   # where no CUDA toolkit is installed
//! cargo run --release -p tessera-candle --features cuda --example llama_block
//! ```
//!
//! On a GPU: prefill at batch 1 × 4096 tokens, decode at batch 8 × 1 token against a cache of
//! 8192, d_model 4096, 32 query / 8 key-value heads of 128, MLP 14336. Without one (or without
//! the `cuda` feature) a small block runs on the CPU — candle's CPU ops beside Tessera's
//! interpreter — and only the agreement is checked.

use candle_core::{DType, Device, Tensor};
use std::time::Instant;
use tessera_candle::{Activation, HeadLayout, RopeStyle};

/// The block's sizes.
#[derive(Clone, Copy, Debug)]
struct Dims {
    model: usize,
    heads: usize,
    kv_heads: usize,
    head_dim: usize,
    mlp: usize,
}

/// The block's weights (bf16; linear weights `[out, in]` as PyTorch stores them).
struct Weights {
    attn_norm: Tensor,
    wq: Tensor,
    wk: Tensor,
    wv: Tensor,
    wo: Tensor,
    mlp_norm: Tensor,
    w_gate: Tensor,
    w_up: Tensor,
    w_down: Tensor,
}

const EPS: f32 = 1e-5;
const ROPE_BASE: f32 = 500_000.0;

impl Weights {
    fn random(d: Dims, dev: &Device) -> candle_core::Result<Weights> {
        let w = |rows: usize, cols: usize| -> candle_core::Result<Tensor> {
            Tensor::randn(0f32, 1.0 / (cols as f32).sqrt(), (rows, cols), dev)?.to_dtype(DType::BF16)
        };
        let norm = || -> candle_core::Result<Tensor> { (Tensor::rand(0.5f32, 1.5, d.model, dev)?).to_dtype(DType::BF16) };
        Ok(Weights {
            attn_norm: norm()?,
            wq: w(d.heads * d.head_dim, d.model)?,
            wk: w(d.kv_heads * d.head_dim, d.model)?,
            wv: w(d.kv_heads * d.head_dim, d.model)?,
            wo: w(d.model, d.heads * d.head_dim)?,
            mlp_norm: norm()?,
            w_gate: w(d.mlp, d.model)?,
            w_up: w(d.mlp, d.model)?,
            w_down: w(d.model, d.mlp)?,
        })
    }
}

/// A KV cache `[batch, len, kv_heads, head_dim]` whose last `new` slots the step fills.
struct Cache {
    k: Tensor,
    v: Tensor,
}

/// RoPE's cos and sin tables for positions `offset..offset + len` (`[len, head_dim / 2]`, bf16).
fn rope_tables(d: Dims, offset: usize, len: usize, dev: &Device) -> candle_core::Result<(Tensor, Tensor)> {
    let half = d.head_dim / 2;
    let inv: Vec<f32> = (0..half).map(|i| ROPE_BASE.powf(-2.0 * i as f32 / d.head_dim as f32)).collect();
    let pos: Vec<f32> = (offset..offset + len).map(|p| p as f32).collect();
    let angles =
        Tensor::new(pos.as_slice(), dev)?.reshape((len, 1))?.broadcast_mul(&Tensor::new(inv.as_slice(), dev)?.reshape((1, half))?)?;
    Ok((angles.cos()?.to_dtype(DType::BF16)?, angles.sin()?.to_dtype(DType::BF16)?))
}

/// What candle's block computes once per sequence shape and keeps (as candle-transformers'
/// Llama cache does): RoPE's tables and the causal mask.
struct Tables {
    cos: Tensor,
    sin: Tensor,
    /// `[seq, offset + seq]`, 1 where key j is hidden from query i (j > i + offset); none for
    /// one token.
    mask: Option<Tensor>,
}

impl Tables {
    fn new(d: Dims, offset: usize, s: usize, dev: &Device) -> candle_core::Result<Tables> {
        let (cos, sin) = rope_tables(d, offset, s, dev)?;
        let len = offset + s;
        let mask = if s > 1 {
            let m: Vec<u8> = (0..s).flat_map(|i| (0..len).map(move |j| u8::from(j > i + offset))).collect();
            Some(Tensor::from_slice(&m, (s, len), dev)?)
        } else {
            None
        };
        Ok(Tables { cos, sin, mask })
    }
}

/// The block on candle's own ops: `x` `[batch, seq, model]` at positions `offset..`, keys and
/// values written into `cache` (whose length is `offset + seq`) and attended over whole.
fn candle_block(d: Dims, w: &Weights, x: &Tensor, cache: &Cache, offset: usize, t: &Tables) -> candle_core::Result<Tensor> {
    let (b, s, _) = x.dims3()?;
    let x2 = x.reshape((b * s, d.model))?;
    let h = candle_nn::ops::rms_norm(&x2, &w.attn_norm, EPS)?;
    let (cos, sin) = (&t.cos, &t.sin);
    let q = h.matmul(&w.wq.t()?)?.reshape((b, s, d.heads, d.head_dim))?;
    let k = h.matmul(&w.wk.t()?)?.reshape((b, s, d.kv_heads, d.head_dim))?;
    let v = h.matmul(&w.wv.t()?)?.reshape((b, s, d.kv_heads, d.head_dim))?;
    let q = candle_nn::rotary_emb::rope_thd(&q, cos, sin)?;
    let k = candle_nn::rotary_emb::rope_thd(&k, cos, sin)?;
    cache.k.slice_set(&k, 1, offset)?;
    cache.v.slice_set(&v, 1, offset)?;
    let len = offset + s;
    // [batch, heads, seq, head_dim], the key/value heads repeated for their query heads.
    let repeat = |t: &Tensor| -> candle_core::Result<Tensor> {
        let t = t.transpose(1, 2)?;
        let rep = d.heads / d.kv_heads;
        t.unsqueeze(2)?.expand((b, d.kv_heads, rep, len, d.head_dim))?.reshape((b, d.heads, len, d.head_dim))
    };
    let q = q.transpose(1, 2)?.contiguous()?;
    let (k, v) = (repeat(&cache.k)?, repeat(&cache.v)?);
    let scores = (q.matmul(&k.t()?)? * (1.0 / (d.head_dim as f64).sqrt()))?.to_dtype(DType::F32)?;
    let scores = match &t.mask {
        Some(mask) => mask
            .broadcast_as(scores.shape())?
            .where_cond(&Tensor::new(f32::NEG_INFINITY, x.device())?.broadcast_as(scores.shape())?, &scores)?,
        None => scores,
    };
    let p = candle_nn::ops::softmax_last_dim(&scores)?.to_dtype(DType::BF16)?;
    let attn = p.matmul(&v)?.transpose(1, 2)?.reshape((b * s, d.heads * d.head_dim))?;
    let x2 = (x2 + attn.matmul(&w.wo.t()?)?)?;
    let h = candle_nn::ops::rms_norm(&x2, &w.mlp_norm, EPS)?;
    let gated = (h.matmul(&w.w_gate.t()?)?.silu()? * h.matmul(&w.w_up.t()?)?)?;
    (x2 + gated.matmul(&w.w_down.t()?)?)?.reshape((b, s, d.model))
}

/// The block with Tessera's kernels, the same math.
fn tessera_block(d: Dims, w: &Weights, x: &Tensor, cache: &Cache, offset: usize) -> candle_core::Result<Tensor> {
    let (b, s, _) = x.dims3()?;
    let x2 = x.reshape((b * s, d.model))?;
    let h = tessera_candle::rms_norm(&x2, &w.attn_norm, EPS)?;
    let project = |wt: &Tensor, heads: usize| -> candle_core::Result<Tensor> {
        tessera_candle::linear(&h, wt, None, Activation::None)?.reshape((b, s, heads, d.head_dim))
    };
    let rope = |t: &Tensor| tessera_candle::rope(t, RopeStyle::HalfSplit, HeadLayout::Bshd, ROPE_BASE, offset);
    let q = rope(&project(&w.wq, d.heads)?)?;
    let k = rope(&project(&w.wk, d.kv_heads)?)?;
    let v = project(&w.wv, d.kv_heads)?;
    cache.k.slice_set(&k, 1, offset)?;
    cache.v.slice_set(&v, 1, offset)?;
    let attn = tessera_candle::attention(&q, &cache.k, &cache.v, true, None)?.reshape((b * s, d.heads * d.head_dim))?;
    let x2 = tessera_candle::linear_residual(&attn, &w.wo, &x2)?;
    let h = tessera_candle::rms_norm(&x2, &w.mlp_norm, EPS)?;
    let gated =
        (tessera_candle::linear(&h, &w.w_gate, None, Activation::Silu)? * tessera_candle::linear(&h, &w.w_up, None, Activation::None)?)?;
    tessera_candle::linear_residual(&gated, &w.w_down, &x2)?.reshape((b, s, d.model))
}

/// `‖a − b‖ / ‖b‖` in f32.
fn rel_error(a: &Tensor, b: &Tensor) -> candle_core::Result<f32> {
    let (a, b) = (a.to_dtype(DType::F32)?, b.to_dtype(DType::F32)?);
    let num = (&a - &b)?.sqr()?.sum_all()?.to_scalar::<f32>()?;
    let den = b.sqr()?.sum_all()?.to_scalar::<f32>()?;
    Ok((num / den).sqrt())
}

/// Milliseconds a call of `f` takes on `dev`, the median of `iters` after warm-up.
fn time_ms(dev: &Device, iters: usize, mut f: impl FnMut() -> candle_core::Result<Tensor>) -> candle_core::Result<f64> {
    for _ in 0..3 {
        f()?;
    }
    dev.synchronize()?;
    let mut times = Vec::with_capacity(iters);
    for _ in 0..iters {
        let t0 = Instant::now();
        f()?;
        dev.synchronize()?;
        times.push(t0.elapsed().as_secs_f64() * 1e3);
    }
    times.sort_by(f64::total_cmp);
    Ok(times[iters / 2])
}

/// One phase: `batch` sequences of `seq` new tokens after `offset` cached ones. Checks the two
/// blocks agree (and, where `timed`, times them); returns (candle ms, Tessera ms).
fn phase(
    d: Dims, w: &Weights, dev: &Device, (batch, seq, offset): (usize, usize, usize), timed: bool,
) -> candle_core::Result<Option<(f64, f64)>> {
    let x = Tensor::randn(0f32, 1.0, (batch, seq, d.model), dev)?.to_dtype(DType::BF16)?;
    let cache_shape = (batch, offset + seq, d.kv_heads, d.head_dim);
    let cache = Cache {
        k: Tensor::randn(0f32, 1.0, cache_shape, dev)?.to_dtype(DType::BF16)?,
        v: Tensor::randn(0f32, 1.0, cache_shape, dev)?.to_dtype(DType::BF16)?,
    };
    let tables = Tables::new(d, offset, seq, dev)?;
    let want = candle_block(d, w, &x, &cache, offset, &tables)?;
    let got = tessera_block(d, w, &x, &cache, offset)?;
    let err = rel_error(&got, &want)?;
    println!("  batch {batch} × {seq} tokens after {offset}: Tessera's block vs candle's, relative difference {err:.2e}");
    if err.is_nan() || err >= 3e-2 {
        candle_core::bail!("the blocks disagree: relative difference {err}")
    }
    if !timed {
        return Ok(None);
    }
    let iters = 10;
    let ours = time_ms(dev, iters, || tessera_block(d, w, &x, &cache, offset))?;
    let theirs = time_ms(dev, iters, || candle_block(d, w, &x, &cache, offset, &tables))?;
    Ok(Some((theirs, ours)))
}

fn main() -> candle_core::Result<()> {
    let gpu = Device::cuda_if_available(0)?;
    if gpu.is_cuda() {
        let d = Dims { model: 4096, heads: 32, kv_heads: 8, head_dim: 128, mlp: 14336 };
        let w = Weights::random(d, &gpu)?;
        println!("Llama-3 8B block on the GPU ({d:?}):");
        let mut rows = Vec::new();
        for (name, shape) in [("prefill", (1, 4096, 0)), ("decode", (8, 1, 8191))] {
            if let Some((theirs, ours)) = phase(d, &w, &gpu, shape, true)? {
                rows.push((name, shape, theirs, ours));
            }
        }
        println!("\n| phase | batch × tokens (cache) | candle ms | Tessera ms | × |\n|---|---|---|---|---|");
        for (name, (b, s, o), theirs, ours) in rows {
            println!("| {name} | {b} × {s} ({}) | {theirs:.3} | {ours:.3} | {:.2} |", o + s, theirs / ours);
        }
    } else {
        let d = Dims { model: 256, heads: 4, kv_heads: 2, head_dim: 64, mlp: 512 };
        let w = Weights::random(d, &Device::Cpu)?;
        println!("a small block on the CPU (candle's CPU ops, Tessera's interpreter; {d:?}):");
        phase(d, &w, &Device::Cpu, (1, 70, 0), false)?;
        phase(d, &w, &Device::Cpu, (2, 1, 129), false)?;
    }
    Ok(())
}
