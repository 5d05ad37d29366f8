//! A Llama block's SwiGLU MLP split across GPUs (tensor parallel, `tessera_kernels::tp`):
//! each rank holds its rows of the gate and up weights and those columns of the down weights,
//! runs three GEMMs (SiLU and the gate fused in the second's epilogue) and one all-reduce.
//!
//! `cargo run --release --example tp_mlp`. With two or more GPUs: NCCL, every GPU a rank, at
//! Llama-3-8B's widths (4096 → 14336 → 4096, 1024 tokens); with one GPU: two ranks simulated
//! on it (staged through the host); without a GPU: two ranks in the interpreter at small
//! widths. Every rank's output is checked against the unsplit MLP on one device. (Timing at
//! several GPUs, and micro-batches overlapping their all-reduces with the next GEMMs, wait for
//! a machine with several: notes/ISSUE-32.md.)

use tessera::dist::Communicator;
use tessera::{bf16, Device, Tensor};
use tessera_kernels::{gemm, tp::tp_swiglu, Activation};

fn random(n: usize, scale: f32, seed: u64) -> Vec<bf16> {
    // A small LCG: the example has no dependencies of its own.
    let mut s = seed.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
    (0..n)
        .map(|_| {
            s = s.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
            bf16::from_f32(((s >> 40) as f32 / (1u64 << 24) as f32 * 2.0 - 1.0) * scale)
        })
        .collect()
}

/// The unsplit MLP on one device.
fn mlp(
    dev: &Device, x: &Tensor<bf16>, wg: &Tensor<bf16>, wu: &Tensor<bf16>, wd: &Tensor<bf16>, y: &mut Tensor<bf16>,
) -> tessera::Result<()> {
    let (m, f) = (x.shape()[0], wg.shape()[0]);
    let mut up = Tensor::scratch(dev, &[m, f])?;
    gemm(x, wu).run(dev, &mut up)?;
    let mut h = Tensor::scratch(dev, &[m, f])?;
    gemm(x, wg).activation(Activation::Silu).gate(&up).run(dev, &mut h)?;
    gemm(&h, wd).run(dev, y)
}

/// Rank `r`'s shards of the weights, on `dev`.
fn shards(
    dev: &Device, r: usize, world: usize, (wg, wu, wd): (&[bf16], &[bf16], &[bf16]), hidden: usize, ffn: usize,
) -> tessera::Result<[Tensor<bf16>; 3]> {
    let f = ffn / world;
    let rows = |w: &[bf16]| Tensor::from_host(dev, &w[r * f * hidden..(r + 1) * f * hidden], &[f, hidden]);
    let cols: Vec<bf16> = (0..hidden).flat_map(|i| wd[i * ffn + r * f..i * ffn + (r + 1) * f].to_vec()).collect();
    Ok([rows(wg)?, rows(wu)?, Tensor::from_host(dev, &cols, &[hidden, f])?])
}

fn main() -> tessera::Result<()> {
    let gpus = if tessera::driver_present() { tessera::cudarc::driver::CudaContext::device_count().map_or(0, |n| n as usize) } else { 0 };
    let (m, hidden, ffn) = if gpus == 0 { (24, 128, 256) } else { (1024, 4096, 14336) };
    let (devs, comms): (Vec<Device>, Vec<Communicator>) = if gpus >= 2 && tessera::dist::nccl_present() {
        let devs: Vec<Device> = (0..gpus).map(Device::new).collect::<Result<_, _>>()?;
        let comms = Communicator::for_devices(&devs)?;
        (devs, comms)
    } else if gpus >= 1 {
        let dev = Device::new(0)?;
        let devs: Vec<Device> = (0..2).map(|_| Device::from_stream(dev.context()?.new_stream()?)).collect::<Result<_, _>>()?;
        let comms = Communicator::simulated(&devs)?;
        (devs, comms)
    } else {
        let devs: Vec<Device> = (0..2).map(|_| Device::cpu()).collect();
        let comms = Communicator::for_devices(&devs)?;
        (devs, comms)
    };
    let world = comms.len();
    println!("{world} ranks ({:?}), MLP {hidden} → {ffn} → {hidden}, {m} tokens", comms[0]);
    let (x, wg, wu, wd) =
        (random(m * hidden, 1.0, 1), random(ffn * hidden, 0.02, 2), random(ffn * hidden, 0.02, 3), random(hidden * ffn, 0.02, 4));
    // The unsplit MLP on rank 0's device, the reference.
    let d0 = &devs[0];
    let t = |v: &[bf16], shape: &[usize]| Tensor::from_host(d0, v, shape);
    let mut want = Tensor::full(d0, &[m, hidden], bf16::NAN)?;
    mlp(d0, &t(&x, &[m, hidden])?, &t(&wg, &[ffn, hidden])?, &t(&wu, &[ffn, hidden])?, &t(&wd, &[hidden, ffn])?, &mut want)?;
    let want: Vec<f64> = want.to_host()?.iter().map(|v| f64::from(v.to_f32())).collect();
    let outs: Vec<Vec<bf16>> = std::thread::scope(|s| {
        // Communicators are not `Sync`: each moves into its rank's thread.
        let hs: Vec<_> = comms
            .into_iter()
            .zip(&devs)
            .enumerate()
            .map(|(r, (c, dev))| {
                let (x, wg, wu, wd) = (&x, &wg, &wu, &wd);
                s.spawn(move || -> tessera::Result<Vec<bf16>> {
                    let [g, u, d] = shards(dev, r, world, (wg, wu, wd), hidden, ffn)?;
                    let mut y = Tensor::full(dev, &[m, hidden], bf16::NAN)?;
                    tp_swiglu(dev, &c, &Tensor::from_host(dev, x, &[m, hidden])?, &g, &u, &d, &mut y)?;
                    c.synchronize()?;
                    y.to_host()
                })
            })
            .collect();
        hs.into_iter().map(|h| h.join().expect("rank thread")).collect::<tessera::Result<_>>()
    })?;
    for (r, y) in outs.iter().enumerate() {
        let got: Vec<f64> = y.iter().map(|v| f64::from(v.to_f32())).collect();
        let err = tessera::testing::rel_error(&got, &want);
        println!("rank {r}: relative error against the unsplit MLP {err:.2e}");
        if err > 2e-2 {
            eprintln!("tp_mlp: rank {r} differs from the unsplit MLP");
            std::process::exit(1);
        }
    }
    Ok(())
}
