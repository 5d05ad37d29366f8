//! The node's micro-tests, as `nccl-tests` and `bandwidthTest` print them: host↔device
//! bandwidth (pinned and pageable memory), device-to-device copy bandwidth, latencies (a small
//! copy, an empty collective), and each collective's algorithm and bus bandwidth by message
//! size on every GPU of the machine (one process driving all of them through
//! `Communicator::for_devices` and group calls).
//!
//! `cargo run --release --example node [-- MAX_MB]` (default 1024: messages 1 MB … MAX_MB).
//! Times are CUDA events around 20 calls after 5 warm-up calls, the median of 3 such runs.
//! Bus bandwidth follows nccl-tests' definitions: all-reduce `2(n−1)/n` of the algorithm
//! bandwidth, all-gather and reduce-scatter `(n−1)/n`, broadcast `1`; with one GPU every
//! collective is a copy and the bus figure is 0 by definition (the algorithm figure is shown).

use std::time::Instant;
use tessera::cudarc::driver::{CudaSlice, CudaStream};
use tessera::dist::{group, Communicator, ReduceOp};
use tessera::{Device, Tensor};

fn main() -> Result<(), tessera::Error> {
    let max_mb: usize = std::env::args().nth(1).and_then(|a| a.parse().ok()).unwrap_or(1024);
    let count = match tessera::cudarc::driver::CudaContext::device_count() {
        Ok(n) if tessera::driver_present() => n as usize,
        _ => {
            println!("node: no GPU here (the collectives run in the interpreter: see tests/gpu_dist.rs)");
            return Ok(());
        }
    };
    let devs: Vec<Device> = (0..count).map(Device::new).collect::<Result<_, _>>()?;
    println!("{} GPU(s): {}", count, devs.iter().map(|d| d.name().to_string()).collect::<Vec<_>>().join(", "));
    host_device(&devs[0], max_mb)?;
    if !tessera::dist::nccl_present() {
        println!("NCCL cannot be loaded here (put libnccl.so on LD_LIBRARY_PATH): no collectives");
        return Ok(());
    }
    let v = tessera::dist::nccl_version()?;
    println!("NCCL {}.{}.{}", v / 10000, (v / 100) % 100, v % 100);
    let comms = Communicator::for_devices(&devs)?;
    collectives(&comms, max_mb)
}

/// Milliseconds a call of `f` takes on `stream` (CUDA events around 20 calls after 5 warm-up
/// calls; the median of 3).
fn time_ms(stream: &CudaStream, mut f: impl FnMut() -> Result<(), tessera::Error>) -> Result<f64, tessera::Error> {
    for _ in 0..5 {
        f()?;
    }
    let mut runs = Vec::new();
    for _ in 0..3 {
        let start = stream.record_event(Some(tessera::cudarc::driver::sys::CUevent_flags::CU_EVENT_DEFAULT))?;
        for _ in 0..20 {
            f()?;
        }
        let end = stream.record_event(Some(tessera::cudarc::driver::sys::CUevent_flags::CU_EVENT_DEFAULT))?;
        runs.push(f64::from(start.elapsed_ms(&end)?) / 20.0);
    }
    Ok(tessera::testing::median(runs))
}

fn sizes(max_mb: usize) -> Vec<usize> {
    std::iter::successors(Some(1usize << 20), |&s| (s < max_mb << 20).then_some(s * 4)).collect()
}

fn host_device(dev: &Device, max_mb: usize) -> Result<(), tessera::Error> {
    let stream = dev.stream()?.clone();
    let ctx = dev.context()?.clone();
    let big = max_mb.min(256) << 20;
    // SAFETY: the pinned buffer is written (by a copy from the device) before it is read.
    let mut pinned = unsafe { ctx.alloc_pinned_with_flags::<u8>(big, 0)? };
    let mut pageable = vec![1u8; big];
    let mut d: CudaSlice<u8> = stream.alloc_zeros(big)?;
    let mut d2: CudaSlice<u8> = stream.alloc_zeros(big)?;
    println!("\n{:<28} {:>10} {:>10}", "host <-> device", "MB", "GB/s");
    let gbs = |bytes: usize, ms: f64| bytes as f64 / (ms * 1e6);
    let ms = time_ms(&stream, || Ok(stream.memcpy_htod(&pinned, &mut d)?))?;
    println!("{:<28} {:>10} {:>10.1}", "host→device, pinned", big >> 20, gbs(big, ms));
    let ms = time_ms(&stream, || Ok(stream.memcpy_dtoh(&d, &mut pinned)?))?;
    println!("{:<28} {:>10} {:>10.1}", "device→host, pinned", big >> 20, gbs(big, ms));
    // Pageable copies are synchronous for the host: timed by the host clock.
    let t = Instant::now();
    for _ in 0..5 {
        stream.memcpy_htod(&pageable, &mut d)?;
    }
    stream.synchronize()?;
    println!("{:<28} {:>10} {:>10.1}", "host→device, pageable", big >> 20, gbs(5 * big, t.elapsed().as_secs_f64() * 1e3));
    let t = Instant::now();
    for _ in 0..5 {
        stream.memcpy_dtoh(&d, &mut pageable)?;
    }
    stream.synchronize()?;
    println!("{:<28} {:>10} {:>10.1}", "device→host, pageable", big >> 20, gbs(5 * big, t.elapsed().as_secs_f64() * 1e3));
    let ms = time_ms(&stream, || Ok(stream.memcpy_dtod(&d, &mut d2)?))?;
    // A copy reads and writes every byte.
    println!("{:<28} {:>10} {:>10.1}", "device→device (read+write)", big >> 20, gbs(2 * big, ms));
    let small: CudaSlice<u8> = stream.alloc_zeros(4)?;
    let mut out = [0u8; 4];
    let t = Instant::now();
    for _ in 0..100 {
        stream.memcpy_dtoh(&small, &mut out)?;
        stream.synchronize()?;
    }
    println!("{:<28} {:>10} {:>8.1} µs", "latency: 4 B device→host", "", t.elapsed().as_secs_f64() * 1e6 / 100.0);
    Ok(())
}

/// Algorithm bandwidth (GB/s) of a collective over `bytes` per rank, and the bus factor.
fn collectives(comms: &[Communicator], max_mb: usize) -> Result<(), tessera::Error> {
    let n = comms.len();
    let nf = n as f64;
    let devs: Vec<&Device> = comms.iter().map(|c| c.device()).collect();
    let stream = devs[0].stream()?.clone();
    println!("\n{:<16} {:>10} {:>10} {:>12} {:>12}", "collective", "MB", "µs", "algbw GB/s", "busbw GB/s");
    for bytes in sizes(max_mb) {
        let elems = bytes / 4;
        let make =
            |shape: &[usize]| -> Result<Vec<Tensor<f32>>, tessera::Error> { devs.iter().map(|d| Tensor::full(d, shape, 1.0f32)).collect() };
        let (xs, mut ys, mut gathered) = (make(&[elems])?, make(&[elems])?, make(&[n * elems])?);
        let mut parts = make(&[elems / n.max(1)])?;
        let scattered_from = make(&[(elems / n.max(1)) * n])?;
        let mut rows: Vec<(&str, f64, f64)> = Vec::new();
        let ms = time_ms(&stream, || {
            group(|| comms.iter().zip(&xs).zip(ys.iter_mut()).try_for_each(|((c, x), y)| c.all_reduce(x, y, ReduceOp::Sum)))
        })?;
        rows.push(("all_reduce", ms, 2.0 * (nf - 1.0) / nf));
        let ms =
            time_ms(&stream, || group(|| comms.iter().zip(&xs).zip(gathered.iter_mut()).try_for_each(|((c, x), g)| c.all_gather(x, g))))?;
        rows.push(("all_gather", ms, (nf - 1.0) / nf));
        let ms = time_ms(&stream, || {
            group(|| {
                comms.iter().zip(&scattered_from).zip(parts.iter_mut()).try_for_each(|((c, s), p)| c.reduce_scatter(s, p, ReduceOp::Sum))
            })
        })?;
        rows.push(("reduce_scatter", ms, (nf - 1.0) / nf));
        let ms = time_ms(&stream, || group(|| comms.iter().zip(ys.iter_mut()).try_for_each(|(c, y)| c.broadcast(y, 0))))?;
        rows.push(("broadcast", ms, 1.0));
        for (name, ms, factor) in rows {
            // nccl-tests' algorithm bandwidth: the per-rank message over the time (the
            // all-gather's message is its output, n parts).
            let size = if name == "all_gather" || name == "reduce_scatter" {
                bytes as f64 * if name == "all_gather" { nf } else { 1.0 }
            } else {
                bytes as f64
            };
            let alg = size / (ms * 1e6);
            let bus = if n == 1 && name != "broadcast" { 0.0 } else { alg * factor };
            println!("{:<16} {:>10} {:>10.1} {:>12.1} {:>12.1}", name, bytes >> 20, ms * 1e3, alg, bus);
        }
    }
    // The latency of a collective: an all-reduce of one element.
    let ones: Vec<Tensor<f32>> = devs.iter().map(|d| Tensor::full(d, &[1], 1.0f32)).collect::<Result<_, _>>()?;
    let mut outs: Vec<Tensor<f32>> = devs.iter().map(|d| Tensor::full(d, &[1], 0.0f32)).collect::<Result<_, _>>()?;
    let ms = time_ms(&stream, || {
        group(|| comms.iter().zip(&ones).zip(outs.iter_mut()).try_for_each(|((c, x), y)| c.all_reduce(x, y, ReduceOp::Sum)))
    })?;
    println!("{:<16} {:>10} {:>10.1}", "all_reduce 4 B", 0, ms * 1e3);
    Ok(())
}
