//! Device functions: a user's `#[tessera::device]` function calling the library's prelude,
//! inlined into a kernel. Runs on the GPU where there is one, else on the CPU interpreter, and
//! checks the result against float64.
//!
//! `cargo run --release --example device_functions`

use tessera::{device, kernel, Device, Grid, Tensor};
use tessera_kernels::prelude::{online_softmax, rms_scale};

/// RMSNorm of a block of rows, then a softmax of each normalized row: the row's max and sum
/// through the library's online softmax, one 64-column block at a time.
#[device]
fn rms_then_softmax<const R: usize>(t: Tile<f32, R, 256>, n: i32) -> Tile<f32, R, 256> {
    let x = rms_scale(t, n, 1.0e-6).mask_cols(n, f32::NEG_INFINITY);
    let mut l = Tile::<f32, R, 1>::zeros();
    let (p, _m) = online_softmax(x, Tile::<f32, R, 1>::full(-1.0e30), &mut l);
    p / l
}

/// Each block takes 16 rows of up to 256 columns.
#[kernel]
fn normalized_softmax(x: Global<f32, 2>, y: Global<f32, 2>) {
    let r = block::id_x() * 16;
    let t: Tile<f32, 16, 256> = x.load([r, 0]);
    y.store([r, 0], rms_then_softmax(t, x.dim(1)));
}

fn main() -> tessera::Result<()> {
    let dev = Device::gpu_or_cpu();
    let (m, n) = (1000, 200);
    let host: Vec<f32> = (0..m * n).map(|i| ((i * 7919) % 1000) as f32 / 250.0 - 2.0).collect();
    let x = Tensor::from_host(&dev, &host, &[m, n])?;
    let mut y = Tensor::from_host(&dev, &vec![f32::NAN; m * n], &[m, n])?;
    normalized_softmax::launch(&dev, Grid::tiles(m, 16), &x, &mut y)?;
    let got = y.to_host()?;
    let mut worst = 0.0f64;
    for (i, row) in host.chunks(n).enumerate() {
        let ms = row.iter().map(|&v| f64::from(v) * f64::from(v)).sum::<f64>() / n as f64;
        let z: Vec<f64> = row.iter().map(|&v| f64::from(v) / (ms + 1e-6).sqrt()).collect();
        let mx = z.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
        let sum: f64 = z.iter().map(|v| (v - mx).exp2()).sum();
        for (j, v) in z.iter().enumerate() {
            let want = (v - mx).exp2() / sum;
            worst = worst.max((f64::from(got[i * n + j]) - want).abs() / want);
        }
    }
    println!(
        "device functions on {}: {m}×{n}, worst relative error {worst:.2e}",
        if dev.is_cpu() { "the CPU interpreter" } else { "the GPU" }
    );
    assert!(worst < 1e-4, "relative error {worst}");
    Ok(())
}
