//! A mixture-of-experts feed-forward layer with the grouped GEMM: each token is routed to one
//! of E experts (top-1, a random router here), the tokens are sorted by expert on the host, and
//! two grouped GEMMs run every expert in one launch each — `h = silu(x·W1[e]ᵀ)` then `y =
//! h·W2[e]ᵀ` — the experts' row counts given on the device as cumulative ends (no host sync
//! inside). Then the block-sparse GEMM: a 128×128-block mask of a weight matrix (a quarter of
//! its blocks kept) applied as `Bsr` and compared with the dense product of the masked weights.
//! Each output against float64. On the GPU, or on the CPU interpreter where there is none
//! (smaller sizes).
//!
//! `cargo run --release --example moe`

use tessera::testing::{rel_error, Uniform};
use tessera::{bf16, Device, Tensor};
use tessera_kernels::{gemm, gemm_bsr, gemm_grouped, Activation, Bsr};

fn main() -> tessera::Result<()> {
    let (dev, (tokens, experts, d, ff)) = match Device::new(0) {
        Ok(dev) => (dev, (2048, 16, 512, 1024)),
        Err(e) => {
            println!("no GPU here ({e}): on the CPU interpreter, smaller");
            (Device::cpu(), (304, 6, 64, 136))
        }
    };
    let mut rng = Uniform::new();
    let x: Vec<bf16> = rng.vec(tokens * d, bf16::from_f32);
    let w1: Vec<bf16> = rng.vec(experts * ff * d, |v| bf16::from_f32(v * 0.1));
    let w2: Vec<bf16> = rng.vec(experts * d * ff, |v| bf16::from_f32(v * 0.1));

    // The router: an expert per token; tokens sorted by expert, `ends` the cumulative counts.
    let route: Vec<usize> = (0..tokens).map(|_| (((rng.next_f32() + 1.0) * 0.5 * experts as f32) as usize).min(experts - 1)).collect();
    let mut order: Vec<usize> = (0..tokens).collect();
    order.sort_by_key(|&t| route[t]);
    let ends: Vec<i32> = (0..experts).map(|e| route.iter().filter(|&&r| r <= e).count() as i32).collect();
    let xs: Vec<bf16> = order.iter().flat_map(|&t| x[t * d..(t + 1) * d].iter().copied()).collect();

    let xt = Tensor::from_host(&dev, &xs, &[tokens, d])?;
    let w1t = Tensor::from_host(&dev, &w1, &[experts, ff, d])?;
    let w2t = Tensor::from_host(&dev, &w2, &[experts, d, ff])?;
    let ends_t = Tensor::from_host(&dev, &ends, &[experts])?;
    let mut h = Tensor::<bf16>::zeros(&dev, &[tokens, ff])?;
    let mut y = Tensor::<bf16>::zeros(&dev, &[tokens, d])?;
    gemm_grouped(&xt, &w1t, &ends_t).activation(Activation::Silu).run(&dev, &mut h)?;
    gemm_grouped(&h, &w2t, &ends_t).run(&dev, &mut y)?;

    // float64, token by token in sorted order (h rounded to bf16 as the layer stores it).
    let hs = h.to_host()?;
    let (mut want_h, mut want_y) = (Vec::with_capacity(tokens * ff), Vec::with_capacity(tokens * d));
    for (i, &t) in order.iter().enumerate() {
        let e = route[t];
        for j in 0..ff {
            let v: f64 = (0..d).map(|k| xs[i * d + k].to_f64() * w1[(e * ff + j) * d + k].to_f64()).sum();
            want_h.push(v / (1.0 + (-v).exp()));
        }
        for j in 0..d {
            want_y.push((0..ff).map(|k| hs[i * ff + k].to_f64() * w2[(e * d + j) * ff + k].to_f64()).sum());
        }
    }
    let read = |t: &Tensor<bf16>| -> tessera::Result<Vec<f64>> { Ok(t.to_host()?.into_iter().map(|v| v.to_f64()).collect()) };
    let (e_h, e_y) = (rel_error(&read(&h)?, &want_h), rel_error(&read(&y)?, &want_y));
    println!("MoE FFN, {tokens} tokens over {experts} experts ({:?} rows each), d {d}, ff {ff}", sizes(&ends));
    println!("  silu(x·W1[e]ᵀ): relative error {e_h:.2e}");
    println!("  h·W2[e]ᵀ:       relative error {e_y:.2e}");

    // Block-sparse: W1[0] with a quarter of its 128×128 blocks kept, as BSR and as dense.
    let (rows, cols) = (ff.div_ceil(128), d.div_ceil(128));
    let (mut values, mut row_ptr, mut col_idx) = (Vec::new(), vec![0i32], Vec::new());
    let mut masked = vec![bf16::ZERO; ff * d];
    for r in 0..rows {
        for c in 0..cols {
            if (r + 3 * c) % 4 != 0 {
                continue;
            }
            for i in 0..128 {
                for j in 0..128 {
                    let (gi, gj) = (r * 128 + i, c * 128 + j);
                    let v = if gi < ff && gj < d { w1[gi * d + gj] } else { bf16::ZERO };
                    values.push(v);
                    if gi < ff && gj < d {
                        masked[gi * d + gj] = v;
                    }
                }
            }
            col_idx.push(c as i32);
        }
        row_ptr.push(col_idx.len() as i32);
    }
    let nnz = col_idx.len();
    let (vt, pt, it) = (
        Tensor::from_host(&dev, &values, &[nnz, 128, 128])?,
        Tensor::from_host(&dev, &row_ptr, &[rows + 1])?,
        Tensor::from_host(&dev, &col_idx, &[nnz])?,
    );
    let a = Bsr::new(&vt, &pt, &it, ff, d)?;
    // `Wmasked · Xᵀ`: the sparse weights on the left, the tokens as B (N = tokens).
    let mut sparse = Tensor::<bf16>::zeros(&dev, &[ff, tokens])?;
    gemm_bsr(a, &xt).run(&dev, &mut sparse)?;
    let mut dense = Tensor::<bf16>::zeros(&dev, &[ff, tokens])?;
    gemm(&Tensor::from_host(&dev, &masked, &[ff, d])?, &xt).run(&dev, &mut dense)?;
    let want_s: Vec<f64> = (0..ff * tokens)
        .map(|ij| {
            let (i, j) = (ij / tokens, ij % tokens);
            (0..d).map(|k| masked[i * d + k].to_f64() * xs[j * d + k].to_f64()).sum()
        })
        .collect();
    println!(
        "Block-sparse W1[0] ({nnz} of {} blocks) · xᵀ: relative error {:.2e} (the dense GEMM of the masked weights: {:.2e})",
        rows * cols,
        rel_error(&read(&sparse)?, &want_s),
        rel_error(&read(&dense)?, &want_s)
    );
    Ok(())
}

/// Each expert's row count from cumulative ends.
fn sizes(ends: &[i32]) -> Vec<i32> {
    ends.iter().scan(0, |prev, &e| Some(e - std::mem::replace(prev, e))).collect()
}
