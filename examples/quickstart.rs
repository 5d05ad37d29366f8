//! The README's first kernel: `y = a·x + y` written in the DSL, launched on the GPU — or,
//! where there is none, on the CPU interpreter of the same kernel. It says which it used.
//!
//! Run with `cargo run --release --example quickstart`.

use tessera::{kernel, Device, Grid, Tensor};

/// Each block updates one 16×256 tile; loads and stores past the edges are masked.
#[kernel]
pub fn axpy(a: f32, x: Global<f32, 2>, y: Global<f32, 2>) {
    let r = block::id_y() * 16;
    let c = block::id_x() * 256;
    let xt: Tile<f32, 16, 256> = x.load([r, c]);
    let yt: Tile<f32, 16, 256> = y.load([r, c]);
    y.store([r, c], a * xt + yt);
}

fn main() -> Result<(), tessera::Error> {
    // GPU 0 if this machine has one, else the interpreter: the launch below is the same.
    let dev = Device::gpu_or_cpu();
    if dev.is_cpu() {
        println!("no GPU here: running on the {}", dev.name());
    }
    let (m, n) = (1000, 3000);
    let x: Vec<f32> = (0..m * n).map(|i| (i % 7) as f32).collect();
    let y: Vec<f32> = (0..m * n).map(|i| (i % 5) as f32).collect();
    let xt = Tensor::from_host(&dev, &x, &[m, n])?;
    let mut yt = Tensor::from_host(&dev, &y, &[m, n])?;
    axpy::launch(&dev, (Grid::tiles(n, 256), Grid::tiles(m, 16)), 2.0, &xt, &mut yt)?;
    let out = yt.to_host()?;
    let wrong = (0..m * n).filter(|&i| out[i] != 2.0 * x[i] + y[i]).count();
    if dev.is_cpu() {
        println!("device: {}", dev.name());
    } else {
        println!("device: {} (compute capability {}.{})", dev.name(), dev.compute_capability().0, dev.compute_capability().1);
    }
    println!("axpy over {m}x{n}: {} of {} elements wrong", wrong, m * n);
    if wrong > 0 {
        std::process::exit(1);
    }
    Ok(())
}
