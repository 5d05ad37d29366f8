//! A linear layer with its epilogue fused: `y = gelu(x·Wᵀ + b)` in bf16, on the GPU, checked
//! against float64 on a sample of entries.
//!
//! `cargo run --release --example linear`

use tessera::testing::{rel_error, Uniform};
use tessera::{bf16, Device, Tensor};
use tessera_kernels::{gemm, Activation, Bias};

fn main() -> tessera::Result<()> {
    let dev = match Device::new(0) {
        Ok(dev) => dev,
        Err(e) => {
            println!("no GPU here ({e}): nothing to run");
            return Ok(());
        }
    };
    let (tokens, d_in, d_out) = (1000, 1024, 4096);
    let mut rng = Uniform::new();
    let (x, w, b) = (rng.vec(tokens * d_in, bf16::from_f32), rng.vec(d_out * d_in, bf16::from_f32), rng.vec(d_out, bf16::from_f32));
    let xt = Tensor::from_host(&dev, &x, &[tokens, d_in])?;
    let wt = Tensor::from_host(&dev, &w, &[d_out, d_in])?; // weights stored N×K, as checkpoints keep them
    let bt = Tensor::from_host(&dev, &b, &[d_out])?;
    let mut y = Tensor::<bf16>::zeros(&dev, &[tokens, d_out])?;
    gemm(&xt, &wt).bias(Bias::PerColumn(&bt)).activation(Activation::GeluTanh).run(&dev, &mut y)?;
    let got = y.to_host()?;
    let gelu = |v: f64| 0.5 * v * (1.0 + ((2.0 / std::f64::consts::PI).sqrt() * (v + 0.044715 * v * v * v)).tanh());
    let (mut have, mut want) = (Vec::new(), Vec::new());
    for s in 0..256 {
        let (i, j) = ((s * 7919) % tokens, (s * 104_729) % d_out);
        let dot: f64 = (0..d_in).map(|k| x[i * d_in + k].to_f64() * w[j * d_in + k].to_f64()).sum();
        want.push(gelu(dot + b[j].to_f64()));
        have.push(got[i * d_out + j].to_f64());
    }
    println!("device: {}", dev.name());
    println!(
        "y = gelu(x·Wᵀ + b): {tokens}×{d_out} from {tokens}×{d_in} and {d_out}×{d_in}; relative error on 256 entries {:.2e}",
        rel_error(&have, &want)
    );
    Ok(())
}
