//! The library's GEMM mainloop with an epilogue of your own: `C = relu(A·Bᵀ)² · scale[n]`
//! (squared ReLU times a per-column scale), fused into the store loop.
//!
//! The kernel is the library's warp-specialized Hopper GEMM — a TMA producer warpgroup, two
//! wgmma consumer warpgroups, a tile queue, C staged through shared memory and stored by TMA —
//! as one call of `tessera_kernels::prelude::gemm_persistent`, the epilogue a closure that the
//! GEMM calls on each 64×64 chunk of the accumulator in registers, in its store loop. It
//! compiles to the instructions of the library's `gemm_tn` with this epilogue in that place,
//! and runs at its speed (`cargo bench --bench gemm` times it beside the built-in bias + GELU
//! epilogue and beside cuBLAS followed by a separate elementwise kernel).
//!
//! `cargo run --release --example custom_epilogue` checks it against float64: on the GPU
//! where there is one (Hopper), else on the CPU interpreter at a smaller size.

use tessera::{bf16, device, kernel, Device, Grid, Tensor};
use tessera_kernels::prelude::gemm_persistent;

/// The epilogue: a 64×64 chunk of the accumulator at column `n`, squared-ReLU'd and scaled.
#[device]
pub fn squared_relu_scaled<T>(out: Tile<f32, 64, 64>, scale: Global<T, 1>, n: i32) -> Tile<f32, 64, 64> {
    let r = max(out, 0.0);
    r * r * scale.load::<Tile<T, 1, 64>>([n]).cast::<f32>()
}

/// `C = relu(A·Bᵀ)² · scale`: A `[batch, M, K]`, B `[batch, N, K]`, C `[batch, M, N]` (rows
/// 16-byte aligned, for the TMA stores), 128×256 tiles, a persistent grid of at most one block
/// per SM drawing tiles from `counter` (a zeroed `Device::tile_counter()`).
#[kernel(warpgroups = 3, targets(sm_90a))]
pub fn gemm_squared_relu(a: Global<bf16, 3>, b: Global<bf16, 3>, c: Global<bf16, 3>, scale: Global<bf16, 1>, counter: Global<i32, 1>) {
    let sa = Smem::<bf16, 128, 64>::ring(4);
    let sb = Smem::<bf16, 256, 64>::ring(4);
    let sc = Smem::<bf16, 64, 64>::ring(4);
    let pipe = Pipeline::<4>::new(2);
    gemm_persistent::<0, 256>(a, b, c, counter, sa, sb, sc, pipe, |acc, _batch, _row, col| squared_relu_scaled(acc, scale, col));
}

/// The same epilogue as a separate elementwise kernel over a finished C (the unfused
/// baseline: cuBLAS, then this): 16×256 tiles.
#[kernel]
pub fn squared_relu_scaled_rows(x: Global<bf16, 2>, scale: Global<bf16, 1>, y: Global<bf16, 2>) {
    let r = block::id_y() * 16;
    let c = block::id_x() * 256;
    let t: Tile<bf16, 16, 256> = x.load([r, c]);
    let v = max(t.cast::<f32>(), 0.0);
    y.store([r, c], (v * v * scale.load::<Tile<bf16, 1, 256>>([c]).cast::<f32>()).cast::<bf16>());
}

/// Runs `gemm_squared_relu` on `a` (M×K), `b` (N×K), `scale` (N) into `c` (M×N).
///
/// # Errors
/// As the launcher's: a tensor of the wrong rank, dtype or alignment, or a driver failure.
pub fn run(dev: &Device, a: &Tensor<bf16>, b: &Tensor<bf16>, scale: &Tensor<bf16>, c: &mut Tensor<bf16>) -> tessera::Result<()> {
    let (m, k, n) = (a.shape()[0], a.shape()[1], b.shape()[0]);
    let a3 = a.view(&[1, m, k], &[m * k, k, 1])?;
    let b3 = b.view(&[1, n, k], &[n * k, k, 1])?;
    let mut c3 = c.view_mut(&[1, m, n], &[m * n, n, 1])?;
    let tiles = Grid::tiles(m, 128).saturating_mul(Grid::tiles(n, 256));
    let mut counter = dev.tile_counter()?;
    gemm_squared_relu::launch(dev, tiles.min(dev.sm_count()), &a3, &b3, &mut c3, scale, &mut counter)
}

/// The float64 reference of `C = relu(A·Bᵀ)² · scale`, row `i`.
pub fn reference_row(a: &[bf16], b: &[bf16], scale: &[bf16], k: usize, i: usize) -> Vec<f64> {
    let n = scale.len();
    (0..n)
        .map(|j| {
            let dot: f64 = (0..k).map(|p| f64::from(a[i * k + p].to_f32()) * f64::from(b[j * k + p].to_f32())).sum();
            dot.max(0.0).powi(2) * f64::from(scale[j].to_f32())
        })
        .collect()
}

#[allow(dead_code)]
fn main() -> tessera::Result<()> {
    let dev = Device::gpu_or_cpu();
    let gpu = !dev.is_cpu();
    let (m, n, k) = if gpu { (2048, 4096, 1024) } else { (200, 300, 96) };
    let mut rng = tessera::testing::Uniform::new();
    let (ha, hb) = (rng.vec(m * k, |v| bf16::from_f32(v * 0.5)), rng.vec(n * k, |v| bf16::from_f32(v * 0.5)));
    let hs = rng.vec(n, |v| bf16::from_f32(0.5 + v.abs()));
    let a = Tensor::from_host(&dev, &ha, &[m, k])?;
    let b = Tensor::from_host(&dev, &hb, &[n, k])?;
    let scale = Tensor::from_host(&dev, &hs, &[n])?;
    let mut c = Tensor::from_host(&dev, &vec![bf16::NAN; m * n], &[m, n])?;
    run(&dev, &a, &b, &scale, &mut c)?;
    let got = c.to_host()?;
    let (mut num, mut den) = (0.0f64, 0.0f64);
    for i in (0..m).step_by(if gpu { 97 } else { 1 }) {
        for (j, want) in reference_row(&ha, &hb, &hs, k, i).into_iter().enumerate() {
            num += (f64::from(got[i * n + j].to_f32()) - want).powi(2);
            den += want * want;
        }
    }
    let err = (num / den).sqrt();
    println!("custom epilogue on {}: {m}×{n}×{k}, relative error {err:.2e}", if gpu { dev.name() } else { "the CPU interpreter" });
    assert!(err < 1e-2, "relative error {err}");
    Ok(())
}
