//! bf16 GEMM TFLOP/s beside cuBLAS (through cudarc) in the same process, CUDA-event timing
//! after warm-up, the two alternating over 5 rounds (medians) so that clock drift falls on
//! both. `C = A·Bᵀ` with A M×K and B N×K row-major (cuBLAS: the same product,
//! column-major as `Cᵀ = B·Aᵀ`).
//!
//! Then the autotuner: for each shape, the default heuristic's kernel (`TESSERA_TUNE=off`)
//! beside the variant a search picked (timed in the same rounds), with the variant's name.
//! The search writes to a temporary cache unless `TESSERA_CACHE_DIR` is set.
//!
//! `cargo bench --bench gemm` (prints a skip where there is no GPU). `TESSERA_BENCH_GEMM` picks
//! another table instead: `small_m` (decode shapes), `fp8` (beside `torch._scaled_mm`), `syrk`
//! (`triangular_only` beside cuBLAS's full product), `grouped` (the MoE grouped GEMM beside one
//! dense cuBLAS GEMM of the same FLOPs and `torch._grouped_mm`), `bsr` (block-sparse × dense
//! beside dense cuBLAS and PyTorch's BSR kernel).

use criterion::Criterion;
use std::time::Duration;
mod common;
#[path = "../examples/custom_epilogue.rs"]
#[allow(dead_code)]
mod custom_epilogue;

use common::cublas_tn;
use tessera::cudarc::cublas::{sys::cublasOperation_t, CudaBlas, Gemm, GemmConfig};
use tessera::testing::{median, Uniform};
use tessera::{bf16, Device, Tensor};

fn time_ms(dev: &Device, warm: usize, iters: usize, f: impl FnMut()) -> f64 {
    tessera::testing::time_ms(dev, warm, iters, f).expect("CUDA event timing")
}

/// Median ms per call of cuBLAS (`theirs`) and Tessera (`ours`) over 5 alternating rounds.
fn time_pair(dev: &Device, iters: usize, theirs: impl FnMut(), ours: impl FnMut()) -> (f64, f64) {
    tessera::testing::time_pair_ms(dev, 2, iters, 5, theirs, ours).expect("CUDA event timing")
}

fn main() {
    let Ok(dev) = Device::new(0) else {
        println!("gemm: skipped, no GPU");
        return;
    };
    common::temporary_tune_cache();
    let blas = CudaBlas::new(dev.stream().expect("a CUDA stream").clone()).expect("cublas");
    match std::env::var("TESSERA_BENCH_GEMM").as_deref() {
        Ok("small_m") => return small_m(&dev),
        Ok("small_m_variants") => return small_m_variants(&dev),
        Ok("fp8") => return fp8(&dev, "bf16"),
        Ok("fp8_out") => return fp8(&dev, "e4m3"),
        Ok("fp8_f32") => return fp8(&dev, "f32"),
        Ok("syrk") => return syrk(&dev, &blas),
        Ok("grouped") => return grouped(&dev, &blas),
        Ok("bsr") => return bsr(&dev, &blas),
        _ => {}
    }
    let shapes: &[(usize, usize, usize)] = &[
        (2048, 2048, 2048),
        (4096, 4096, 4096),
        (8192, 8192, 8192),
        (8192, 4096, 4096),
        (8192, 14336, 4096),
        (8192, 4096, 14336),
        (128, 4096, 4096),
    ];
    let mut criterion = Criterion::default()
        .configure_from_args()
        .sample_size(10)
        .warm_up_time(Duration::from_millis(300))
        .measurement_time(Duration::from_secs(1));
    let mut rng = Uniform::new();
    let mut rows = Vec::new();
    // The JSON report (`target/tessera-bench/gemm-<arch>.json`): each row of the main table as
    // it is timed, with the kernels it launched.
    let mut report = tessera::report::Report::new("gemm", &dev);
    let record = |report: &mut tessera::report::Report, name: &str, flop: f64, t_cublas: f64, t_ours: f64| {
        let record = tessera::report::Record::new("gemm", "gemm (C = A·Bᵀ)", name, "bf16", t_ours, "TFLOP/s", flop / t_ours * 1e-9);
        report.push(&dev, record.against("cuBLAS", flop / t_cublas * 1e-9));
    };
    for &(m, n, k) in shapes {
        let mut random = |len: usize| rng.vec(len, bf16::from_f32);
        let a = Tensor::from_host(&dev, &random(m * k), &[m, k]).expect("a");
        let b = Tensor::from_host(&dev, &random(n * k), &[n, k]).expect("b");
        let mut c = Tensor::<bf16>::zeros(&dev, &[m, n]).expect("c");
        let a_raw = dev.stream().expect("a CUDA stream").clone_htod(&a.to_host().expect("a")).expect("a raw");
        let b_raw = dev.stream().expect("a CUDA stream").clone_htod(&b.to_host().expect("b")).expect("b raw");
        let mut c_raw = dev.stream().expect("a CUDA stream").alloc_zeros::<bf16>(m * n).expect("c raw");
        let cfg = cublas_tn(m, n, k);
        let mut ours = || tessera_kernels::gemm_tn(&dev, &a, &b, &mut c).expect("gemm");
        let mut theirs = || unsafe { blas.gemm(cfg, &b_raw, &a_raw, &mut c_raw) }.expect("cublas");
        let name = format!("{m}x{n}x{k}");
        criterion.bench_function(&format!("tessera {name}"), |bch| {
            bch.iter_custom(|it| Duration::from_secs_f64(time_ms(&dev, 0, it as usize, &mut ours) * 1e-3 * it as f64))
        });
        let flop = 2.0 * m as f64 * n as f64 * k as f64;
        let iters = if flop > 1e12 { 10 } else { 50 };
        report.skip_launches();
        let (t_cublas, t_ours) = time_pair(&dev, iters, &mut theirs, &mut ours);
        record(&mut report, &name, flop, t_cublas, t_ours);
        // Both compute the same C: compare a few entries.
        let (x, y) = (c.to_host().expect("c"), dev.stream().expect("a CUDA stream").clone_dtoh(&c_raw).expect("c raw"));
        let diff = x.iter().zip(&y).take(4096).map(|(p, q)| (p.to_f32() - q.to_f32()).abs()).fold(0.0f32, f32::max);
        rows.push((name, flop / t_cublas * 1e-9, flop / t_ours * 1e-9, diff));
    }
    // B stored K×N: cuBLAS sees the row-major product as Cᵀ (N×M) = B' (N×K) · A' (K×M).
    for &(m, n, k) in &[(4096usize, 4096usize, 4096usize), (8192, 8192, 8192)] {
        let a = Tensor::from_host(&dev, &rng.vec(m * k, bf16::from_f32), &[m, k]).expect("a");
        let b = Tensor::from_host(&dev, &rng.vec(k * n, bf16::from_f32), &[k, n]).expect("b");
        let mut c = Tensor::<bf16>::zeros(&dev, &[m, n]).expect("c");
        let a_raw = dev.stream().expect("a CUDA stream").clone_htod(&a.to_host().expect("a")).expect("a raw");
        let b_raw = dev.stream().expect("a CUDA stream").clone_htod(&b.to_host().expect("b")).expect("b raw");
        let mut c_raw = dev.stream().expect("a CUDA stream").alloc_zeros::<bf16>(m * n).expect("c raw");
        let cfg = GemmConfig { transa: cublasOperation_t::CUBLAS_OP_N, lda: n as i32, ..cublas_tn(m, n, k) };
        let mut ours = || tessera_kernels::gemm(&a, &b).b_layout(tessera_kernels::BLayout::KxN).run(&dev, &mut c).expect("gemm kn");
        let mut theirs = || unsafe { blas.gemm(cfg, &b_raw, &a_raw, &mut c_raw) }.expect("cublas");
        let flop = 2.0 * (m * n * k) as f64;
        report.skip_launches();
        let (t_cublas, t_ours) = time_pair(&dev, 10, &mut theirs, &mut ours);
        record(&mut report, &format!("{m}x{n}x{k} B:KxN"), flop, t_cublas, t_ours);
        let (x, y) = (c.to_host().expect("c"), dev.stream().expect("a CUDA stream").clone_dtoh(&c_raw).expect("c raw"));
        let diff = x.iter().zip(&y).take(4096).map(|(p, q)| (p.to_f32() - q.to_f32()).abs()).fold(0.0f32, f32::max);
        rows.push((format!("{m}x{n}x{k} B:KxN"), flop / t_cublas * 1e-9, flop / t_ours * 1e-9, diff));
    }

    // GEMM + bias + GELU: fused in the epilogue, against cuBLAS then a separate bias+GELU kernel.
    let (m, n, k) = (8192usize, 4096usize, 4096usize);
    let data: Vec<bf16> = rng.vec(m * k, bf16::from_f32);
    let a = Tensor::from_host(&dev, &data, &[m, k]).expect("a");
    let b = Tensor::from_host(&dev, &data[..n * k], &[n, k]).expect("b");
    let bias = Tensor::from_host(&dev, &vec![bf16::from_f32(0.5); n], &[n]).expect("bias");
    let mut c = Tensor::<bf16>::zeros(&dev, &[m, n]).expect("c");
    let mut c2 = Tensor::<bf16>::zeros(&dev, &[m, n]).expect("c2");
    let a_raw = dev.stream().expect("a CUDA stream").clone_htod(&data).expect("a raw");
    let b_raw = dev.stream().expect("a CUDA stream").clone_htod(&data[..n * k]).expect("b raw");
    let mut c_raw = dev.stream().expect("a CUDA stream").alloc_zeros::<bf16>(m * n).expect("c raw");
    let cfg = cublas_tn(m, n, k);
    let mut unfused = || {
        unsafe { blas.gemm(cfg, &b_raw, &a_raw, &mut c_raw) }.expect("cublas");
        let tmp = Tensor::from_cudarc(&dev, c_raw.clone(), &[m, n]).expect("view");
        tessera_kernels::bias_gelu(&dev, &tmp, &bias, &mut c2).expect("bias_gelu");
    };
    let mut fused = || {
        tessera_kernels::gemm(&a, &b)
            .bias(tessera_kernels::Bias::PerColumn(&bias))
            .activation(tessera_kernels::Activation::GeluTanh)
            .run(&dev, &mut c)
            .expect("fused")
    };
    let flop = 2.0 * (m * n * k) as f64;
    let (t_unfused, t_fused) = time_pair(&dev, 10, &mut unfused, &mut fused);
    // A user's epilogue (squared ReLU times a per-column scale, `examples/custom_epilogue.rs`)
    // on the library's mainloop: beside the built-in bias + GELU epilogue, and beside cuBLAS
    // followed by the same epilogue as a separate kernel.
    let mut c3 = Tensor::<bf16>::zeros(&dev, &[m, n]).expect("c3");
    let mut custom = || custom_epilogue::run(&dev, &a, &b, &bias, &mut c3).expect("custom epilogue");
    let (t_builtin, t_custom) = time_pair(&dev, 10, &mut fused, &mut custom);
    let mut custom_unfused = || {
        unsafe { blas.gemm(cfg, &b_raw, &a_raw, &mut c_raw) }.expect("cublas");
        let tmp = Tensor::from_cudarc(&dev, c_raw.clone(), &[m, n]).expect("view");
        let grid = (tessera::Grid::tiles(n, 256), tessera::Grid::tiles(m, 16));
        custom_epilogue::squared_relu_scaled_rows::launch(&dev, grid, &tmp, &bias, &mut c2).expect("epilogue kernel");
    };
    let (t_custom_unfused, t_custom2) = time_pair(&dev, 10, &mut custom_unfused, &mut custom);
    let tuned = tuned_vs_default(&dev, &mut rng);

    println!("\ngemm bf16 on {} (TFLOP/s)", dev.name());
    println!("{:<18} {:>9} {:>9} {:>7} {:>9}", "MxNxK", "cuBLAS", "tessera", "ratio", "max|dC|");
    for (name, cb, us, diff) in rows {
        println!("{name:<18} {cb:>9.0} {us:>9.0} {:>7.2} {diff:>9.3}", us / cb);
    }
    common::write_report(&report);
    println!(
        "{:<18} {:>9.0} {:>9.0} {:>7.2}   (GEMM+bias+GELU {m}x{n}x{k}: cuBLAS + separate kernel vs fused)",
        "bias+gelu",
        flop / t_unfused * 1e-9,
        flop / t_fused * 1e-9,
        t_unfused / t_fused
    );
    println!(
        "{:<18} {:>9.0} {:>9.0} {:>7.2}   (user epilogue relu²·scale {m}x{n}x{k}: built-in fused bias+GELU vs custom)",
        "custom epilogue",
        flop / t_builtin * 1e-9,
        flop / t_custom * 1e-9,
        t_builtin / t_custom
    );
    println!(
        "{:<18} {:>9.0} {:>9.0} {:>7.2}   (the same: cuBLAS + separate relu²·scale kernel vs custom)",
        "custom vs unfused",
        flop / t_custom_unfused * 1e-9,
        flop / t_custom2 * 1e-9,
        t_custom_unfused / t_custom2
    );
    println!("\ngemm bf16 autotuned on {} (TFLOP/s; default heuristic vs the searched variant)", dev.name());
    println!("{:<18} {:>9} {:>9} {:>7}  tuned variant", "MxNxK", "default", "tuned", "ratio");
    for (name, d, t, v) in tuned {
        println!("{name:<18} {d:>9.0} {t:>9.0} {:>7.2}  {v}", t / d);
    }
}

/// Per shape: a search (`TESSERA_TUNE=search`), then the default heuristic's choice and the
/// tuned one timed in alternating rounds. Gives (shape, default TFLOP/s, tuned TFLOP/s, the
/// tuned variant's name).
fn tuned_vs_default(dev: &Device, rng: &mut Uniform) -> Vec<(String, f64, f64, String)> {
    use tessera::{TuneMode, Tuner};
    let shapes: &[(usize, usize, usize)] = &[
        (128, 4096, 4096),
        (256, 4096, 4096),
        (1024, 4096, 4096),
        (2048, 2048, 2048),
        (4096, 4096, 4096),
        (8192, 8192, 8192),
        (1024, 14336, 4096),
    ];
    let mut rows = Vec::new();
    for &(m, n, k) in shapes {
        let a = Tensor::from_host(dev, &rng.vec(m * k, bf16::from_f32), &[m, k]).expect("a");
        let b = Tensor::from_host(dev, &rng.vec(n * k, bf16::from_f32), &[n, k]).expect("b");
        let mut c = Tensor::<bf16>::zeros(dev, &[m, n]).expect("c");
        Tuner::global().set_mode(TuneMode::Search);
        tessera_kernels::gemm_tn(dev, &a, &b, &mut c).expect("tuning gemm");
        let shape = format!("b_layout=NxK;shape=[1, {m}, {n}]");
        let (chosen, search) = {
            let mut tuner = Tuner::global();
            let decision = tuner.decisions().into_iter().find(|(key, _)| key.contains("op=gemm") && key.contains(&shape));
            let entry = decision.as_ref().and_then(|(key, _)| tuner.cache()?.get(key).ok().flatten());
            let search = entry.map_or(String::new(), |e| {
                format!("  (search: {:.1} µs, default {:.1} µs, {} launches)", e.best_us, e.default_us.unwrap_or(f64::NAN), e.launches)
            });
            (decision.and_then(|(_, v)| v).unwrap_or_else(|| "(no decision)".into()), search)
        };
        let mut c2 = Tensor::<bf16>::zeros(dev, &[m, n]).expect("c");
        let mut default = || {
            Tuner::global().set_mode(TuneMode::Off);
            tessera_kernels::gemm_tn(dev, &a, &b, &mut c).expect("gemm")
        };
        let mut tuned = || {
            Tuner::global().set_mode(TuneMode::Replay);
            tessera_kernels::gemm_tn(dev, &a, &b, &mut c2).expect("gemm")
        };
        let flop = 2.0 * (m * n * k) as f64;
        let iters = if flop > 1e12 { 10 } else { 50 };
        let (t_default, t_tuned) = time_pair(dev, iters, &mut default, &mut tuned);
        rows.push((format!("{m}x{n}x{k}"), flop / t_default * 1e-9, flop / t_tuned * 1e-9, chosen + &search));
    }
    Tuner::global().set_mode(TuneMode::Replay);
    rows
}

/// `TESSERA_BENCH_SHAPES` (`MxNxK,…`), where set: the shapes a table times instead of its own.
fn shapes_from_env() -> Option<Vec<(usize, usize, usize)>> {
    let v = std::env::var("TESSERA_BENCH_SHAPES").ok()?;
    let shape = |s: &str| {
        let d: Vec<usize> = s.split('x').filter_map(|x| x.trim().parse().ok()).collect();
        (d.len() == 3).then(|| (d[0], d[1], d[2]))
    };
    Some(v.split(',').filter_map(shape).collect())
}

/// Copies of an `n × k` weight matrix (ours and a raw one for cuBLAS, equal), 256 MB of them
/// together, so that calls cycling through them read their weights from DRAM, not from L2
/// (50 MB) as a replayed call on one copy would.
fn weight_copies(dev: &Device, rng: &mut Uniform, n: usize, k: usize) -> Vec<(Tensor<bf16>, tessera::cudarc::driver::CudaSlice<bf16>)> {
    let stream = dev.stream().expect("a CUDA stream");
    let copies = ((256 << 20) / (n * k * 2)).clamp(1, 8);
    let make = |rng: &mut Uniform| {
        let b = Tensor::from_host(dev, &rng.vec(n * k, bf16::from_f32), &[n, k]).expect("b");
        let b_raw = stream.clone_htod(&b.to_host().expect("b")).expect("b raw");
        (b, b_raw)
    };
    (0..copies).map(|_| make(rng)).collect()
}

/// A device on a stream of its own for CUDA-graph timing (the default stream cannot be
/// captured), with cudarc's cross-stream event tracking off (one stream: nothing to track,
/// and a capture cannot wait on events recorded before it).
fn graph_device(dev: &Device) -> Device {
    let ctx = dev.context().expect("a CUDA context").clone();
    // SAFETY: the buffers made while tracking is off live on this one stream alone.
    unsafe { ctx.disable_event_tracking() };
    Device::from_stream(ctx.new_stream().expect("a stream")).expect("a device on its own stream")
}

/// Median ms per call of `f` over 5 CUDA-graph replays of 10 calls each.
fn graph_ms(dev: &Device, mut f: impl FnMut()) -> f64 {
    let t: Vec<f64> =
        (0..5).map(|_| tessera::testing::time_graph_ms(dev, 2, 10, || (0..10).for_each(|_| f())).expect("graph") / 10.0).collect();
    median(t)
}

/// `TESSERA_BENCH_GEMM=small_m_variants`: every variant the tuner chooses from for the
/// small-M shapes (the tiled kernels, the small-M kernel at each split of K), each forced and
/// timed by graph replays (cycling through copies of the weights, as `small_m`), the fastest
/// first — what the default heuristic should pick.
/// `TESSERA_BENCH_SHAPES` replaces the shapes.
fn small_m_variants(dev: &Device) {
    let dev = &graph_device(dev);
    let mut shapes = vec![(1, 14336, 4096), (64, 4096, 4096), (128, 4096, 4096), (256, 4096, 4096), (128, 4096, 14336), (512, 4096, 4096)];
    if let Some(s) = shapes_from_env() {
        shapes = s;
    }
    let mut rng = Uniform::new();
    let mut names: Vec<String> =
        tessera_kernels::gemm_variants::<bf16>(tessera_kernels::BLayout::NxK).iter().map(|s| s.to_string()).collect();
    for mn in [16, 32, 64, 128, 256] {
        names.extend([1, 2, 4, 8, 16].iter().map(|s| format!("gemm_small_m/mn{mn}/splits{s}")));
    }
    for (m, n, k) in shapes {
        let a = Tensor::from_host(dev, &rng.vec(m * k, bf16::from_f32), &[m, k]).expect("a");
        let bs = weight_copies(dev, &mut rng, n, k);
        let mut c = Tensor::<bf16>::zeros(dev, &[m, n]).expect("c");
        let mut i = 0;
        let mut call = |v: Option<&str>| {
            i += 1;
            let g = tessera_kernels::gemm(&a, &bs[i % bs.len()].0);
            match v {
                Some(v) => g.variant(v).run(dev, &mut c),
                None => g.run(dev, &mut c),
            }
        };
        let default = graph_ms(dev, || call(None).expect("gemm"));
        let mut rows: Vec<(f64, &str)> = Vec::new();
        for v in &names {
            if call(Some(v)).is_ok() {
                rows.push((graph_ms(dev, || call(Some(v)).expect("gemm")), v));
            }
        }
        rows.sort_by(|x, y| x.0.total_cmp(&y.0));
        let list: Vec<String> = rows.iter().take(8).map(|(t, v)| format!("{} {:.1}", v.replace("gemm_small_m/", "sm/"), t * 1e3)).collect();
        println!("{m}x{n}x{k}: default {:.1} µs | {}", default * 1e3, list.join(" | "));
    }
}

/// `TESSERA_BENCH_GEMM=small_m`: the decode and small-batch shapes of issue 29 — M in 1, 16, 64,
/// 128, 256, 512 by N, K in 4096, 14336 — beside cuBLAS, alternating in one run, timed two ways:
/// back-to-back calls on the stream (the host's cost per call included, as a caller sees it)
/// and CUDA-graph replays of 10 calls (the kernels alone), each call on the next of several
/// copies of the weights (256 MB together: read from DRAM, not L2); the weights' read
/// bandwidth against a device-to-device copy of 512 MB timed in the same run. `TESSERA_BENCH_SHAPES` (`MxNxK,…`)
/// replaces the shapes.
fn small_m(dev: &Device) {
    let dev = &graph_device(dev);
    let stream = dev.stream().expect("a CUDA stream").clone();
    let blas = &CudaBlas::new(stream.clone()).expect("cuBLAS");
    let src = stream.alloc_zeros::<u8>(1 << 29).expect("copy source");
    let mut dst = stream.alloc_zeros::<u8>(1 << 29).expect("copy destination");
    let mut copy = || stream.memcpy_dtod(&src, &mut dst).expect("copy");
    let t_copy = time_ms(dev, 3, 20, &mut copy);
    let copy_gbs = 2.0 * (1u64 << 29) as f64 / t_copy * 1e-6;
    let mut shapes = Vec::new();
    for (n, k) in [(4096usize, 4096usize), (14336, 4096), (4096, 14336), (14336, 14336)] {
        for m in [1usize, 16, 64, 128, 256, 512] {
            shapes.push((m, n, k));
        }
    }
    if let Some(s) = shapes_from_env() {
        shapes = s;
    }
    let mut rng = Uniform::new();
    let mut rows = Vec::new();
    // The JSON report (`target/tessera-bench/gemm_small_m-<arch>.json`): each shape's two
    // timings, with the kernels of one more call of ours.
    let mut report = tessera::report::Report::new("gemm_small_m", dev);
    let mut weights_of = (0, 0, Vec::new());
    for (m, n, k) in shapes {
        if (weights_of.0, weights_of.1) != (n, k) {
            weights_of = (n, k, weight_copies(dev, &mut rng, n, k));
        }
        let bs = &weights_of.2;
        let a = Tensor::from_host(dev, &rng.vec(m * k, bf16::from_f32), &[m, k]).expect("a");
        let a_raw = stream.clone_htod(&a.to_host().expect("a")).expect("a raw");
        let mut c = Tensor::<bf16>::zeros(dev, &[m, n]).expect("c");
        let mut c_raw = stream.alloc_zeros::<bf16>(m * n).expect("c raw");
        let cfg = cublas_tn(m, n, k);
        let (mut i, mut j) = (0, 0);
        let mut ours = || {
            i += 1;
            tessera_kernels::gemm(&a, &bs[i % bs.len()].0).run(dev, &mut c).expect("gemm")
        };
        let mut theirs = || {
            j += 1;
            unsafe { blas.gemm(cfg, &bs[j % bs.len()].1, &a_raw, &mut c_raw) }.expect("cublas")
        };
        let (t_cublas, t_ours) = time_pair(dev, 50, &mut theirs, &mut ours);
        let (g_cublas, g_ours) = (graph_ms(dev, &mut theirs), graph_ms(dev, &mut ours));
        let flop = 2.0 * (m * n * k) as f64;
        for (kernel, t_theirs, t_mine) in [("gemm small M (stream)", t_cublas, t_ours), ("gemm small M (graph)", g_cublas, g_ours)] {
            let record =
                tessera::report::Record::new("gemm", kernel, &format!("{m}x{n}x{k}"), "bf16", t_mine, "TFLOP/s", flop / t_mine * 1e-9);
            report.skip_launches();
            // Both on the same weights for the comparison.
            tessera_kernels::gemm(&a, &bs[0].0).run(dev, &mut c).expect("gemm");
            report.push(dev, record.against("cuBLAS", flop / t_theirs * 1e-9));
        }
        unsafe { blas.gemm(cfg, &bs[0].1, &a_raw, &mut c_raw) }.expect("cublas");
        let (x, y) = (c.to_host().expect("c"), stream.clone_dtoh(&c_raw).expect("c raw"));
        let diff = x.iter().zip(&y).map(|(p, q)| (p.to_f32() - q.to_f32()).abs()).fold(0.0f32, f32::max);
        let weights = (n * k * 2) as f64;
        rows.push((format!("{m}x{n}x{k}"), [t_cublas, t_ours, g_cublas, g_ours], weights / g_ours * 1e-6 / copy_gbs, diff));
    }
    println!(
        "\ngemm bf16 small M on {} (µs; stream: back-to-back calls; graph: replays; a device copy {copy_gbs:.0} GB/s in the same run)",
        dev.name()
    );
    println!("| MxNxK | cuBLAS | tessera | × cuBLAS | cuBLAS graph | tessera graph | × cuBLAS graph | weights × copy (graph) | max|dC| |");
    println!("|---|---|---|---|---|---|---|---|---|");
    for (name, [tc, tu, gc, gu], bw, diff) in rows {
        println!(
            "| {name} | {:.1} | {:.1} | {:.2} | {:.1} | {:.1} | {:.2} | {bw:.2} | {diff:.3} |",
            tc * 1e3,
            tu * 1e3,
            tc / tu,
            gc * 1e3,
            gu * 1e3,
            gc / gu
        );
    }
    common::write_report(&report);
}

/// `TESSERA_BENCH_GEMM=fp8`: the fp8 GEMM (e4m3 × e4m3 → bf16) beside `torch._scaled_mm`
/// (`benches/scaled_mm.py`, a child process asked right before ours is timed on each shape)
/// for each scaling: tensorwise and rowwise against cuBLASLt's fast accumulation (ours
/// unpromoted) and its promoted one (ours promoted), blockwise (always promoted). Then the
/// relative error of tensorwise scaling with and without promotion at K = 16384 against a
/// float64 reference on the host (256 × 256 of C). `TESSERA_BENCH_SHAPES` (`4096x4096x4096,…`)
/// replaces the shapes. `TESSERA_BENCH_GEMM=fp8_out` (`out` "e4m3"): C in e4m3 instead, with an
/// output scale and ours keeping the amax ([`Fp8GemmBuilder::run_fp8`]), beside `_scaled_mm`
/// with `scale_result` (tensorwise and rowwise; no error table); `fp8_f32`: C in f32.
///
/// [`Fp8GemmBuilder::run_fp8`]: tessera_kernels::Fp8GemmBuilder::run_fp8
fn fp8(dev: &Device, out: &str) {
    let out8 = out == "e4m3";
    use tessera::F8E4M3;
    use tessera_kernels::{gemm_fp8, Fp8Scaling};
    let mut torch = common::PyBaseline::spawn("TESSERA_SCALED_MM_SCRIPT", "scaled_mm.py");
    let mut shapes = vec![(4096, 4096, 4096), (8192, 8192, 8192), (8192, 14336, 4096), (8192, 4096, 14336), (2048, 2048, 2048)];
    if let Some(s) = shapes_from_env() {
        shapes = s;
    }
    let mut rng = Uniform::new();
    let (mut rows, mut plain) = (Vec::new(), Vec::new());
    // The JSON report (`target/tessera-bench/gemm_fp8_<out>-<arch>.json`): a row for each
    // scaling and accumulation, with the kernels its timing launched.
    let mut report = tessera::report::Report::new(&format!("gemm_fp8_{out}"), dev);
    for &(m, n, k) in &shapes {
        let q = |x: f32| F8E4M3::from_f32(x * 8.0);
        let a = Tensor::from_host(dev, &rng.vec(m * k, q), &[m, k]).expect("a");
        let b = Tensor::from_host(dev, &rng.vec(n * k, q), &[n, k]).expect("b");
        let mut c = Tensor::<bf16>::zeros(dev, &[m, n]).expect("c");
        let mut c8 = Tensor::<F8E4M3>::zeros(dev, &[m, n]).expect("c8");
        let mut c32 = Tensor::<f32>::zeros(dev, &[m, n]).expect("c32");
        let mut amax = Tensor::<f32>::zeros(dev, &[1]).expect("amax");
        let one = |len: usize, rng: &mut Uniform| Tensor::from_host(dev, &rng.vec(len, |x| 1.0 + 0.5 * x), &[len]).expect("scale");
        let (ta, tb, tc) = (one(1, &mut rng), one(1, &mut rng), one(1, &mut rng));
        let (ra, rb) = (one(m, &mut rng), one(n, &mut rng));
        let (kb, nb) = (k.div_ceil(128), n.div_ceil(128));
        let ba = Tensor::from_host(dev, &rng.vec(m * kb, |x| 1.0 + 0.5 * x), &[m, kb]).expect("scale");
        let bb = Tensor::from_host(dev, &rng.vec(nb * kb, |x| 1.0 + 0.5 * x), &[nb, kb]).expect("scale");
        let flop = 2.0 * (m * n * k) as f64;
        let tflops = |ms: f64| flop / ms * 1e-9;
        for (name, scaling) in [
            ("tensor", Fp8Scaling::Tensorwise { a: &ta, b: &tb }),
            ("row", Fp8Scaling::Rowwise { a: &ra, b: &rb }),
            ("block", Fp8Scaling::Blockwise { a: &ba, b: &bb }),
        ] {
            if out8 && name == "block" {
                continue;
            }
            let mut theirs = |fast: bool| {
                torch.as_mut().map_err(|e| e.clone()).and_then(|t| t.ask(&format!("{m} {n} {k} {name} {} {out}", u8::from(fast)), 5))
            };
            let mut ours_amax = |promote: bool, keep_amax: bool| {
                let g = gemm_fp8(&a, &b, scaling).fast_accumulation(!promote);
                let mut f = || match out {
                    "e4m3" => g.run_fp8(dev, &mut c8, &tc, if keep_amax { Some(&mut amax) } else { None }).expect("gemm_fp8 into e4m3"),
                    "f32" => gemm_fp8(&a, &b, scaling).fast_accumulation(!promote).run(dev, &mut c32).expect("gemm_fp8 into f32"),
                    _ => g.run(dev, &mut c).expect("gemm_fp8"),
                };
                tflops(median((0..3).map(|_| time_ms(dev, 3, 20, &mut f)).collect()))
            };
            if out8 {
                // With and without the amax, alternately (the clocks drift at fp8's power draw).
                let mut pairs = Vec::new();
                for promote in [false, true] {
                    let (mut with, mut without) = (Vec::new(), Vec::new());
                    for _ in 0..3 {
                        without.push(ours_amax(promote, false));
                        with.push(ours_amax(promote, true));
                    }
                    pairs.push((median(with), median(without)));
                }
                let [(fw, fo), (pw, po)] = [pairs[0], pairs[1]];
                plain.push(format!("{m}x{n}x{k} {name}: fast {fw:.0} / {fo:.0}, promoted {pw:.0} / {po:.0}"));
            }
            let mut ours = |promote: bool| ours_amax(promote, true);
            let record = |report: &mut tessera::report::Report, accumulation: &str, theirs: &Result<f64, String>, tf: f64| {
                let kernel = format!("gemm fp8 → {out} ({name}, {accumulation})");
                let r = tessera::report::Record::new("gemm", &kernel, &format!("{m}x{n}x{k}"), "e4m3", flop / tf * 1e-9, "TFLOP/s", tf);
                report.push(dev, if let Ok(v) = theirs { r.against("torch._scaled_mm", *v) } else { r });
            };
            report.skip_launches();
            let (fast, fast_ours) =
                if name == "block" { (Err("no fast accumulation".into()), f64::NAN) } else { (theirs(true), ours(false)) };
            if name != "block" {
                record(&mut report, "fast", &fast, fast_ours);
            }
            let exact = theirs(false);
            report.skip_launches();
            let exact_ours = ours(true);
            record(&mut report, "promoted", &exact, exact_ours);
            rows.push((format!("{m}x{n}x{k}"), name, fast, fast_ours, exact, exact_ours));
        }
    }
    let show = |r: &Result<f64, String>| r.as_ref().map_or_else(|e| format!("— ({e})"), |v| format!("{v:.0}"));
    let ratio = |r: &Result<f64, String>, o: f64| r.as_ref().map_or_else(|_| "—".to_string(), |v| format!("{:.2}", o / v));
    let out = if out8 { "e4m3 (scaled, ours with amax)" } else { out };
    println!("\ngemm fp8 e4m3 → {out} on {} (TFLOP/s; baseline torch._scaled_mm, same run)", dev.name());
    println!("| MxNxK | scaling | torch fast | tessera | × | torch promoted | tessera promoted | × |");
    println!("|---|---|---|---|---|---|---|---|");
    for (shape, name, fast, fast_ours, exact, exact_ours) in &rows {
        println!(
            "| {shape} | {name} | {} | {fast_ours:.0} | {} | {} | {exact_ours:.0} | {} |",
            show(fast),
            ratio(fast, *fast_ours),
            show(exact),
            ratio(exact, *exact_ours)
        );
    }
    common::write_report(&report);
    if out8 {
        println!("\nours into e4m3 with / without the amax, timed alternately (TFLOP/s):");
        for line in &plain {
            println!("  {line}");
        }
    } else if out == "bf16" {
        fp8_promotion_error(dev, &mut rng);
    }
}

/// Tensorwise fp8 at K = 16384 with and without promotion against float64 (256 × 256 of C).
fn fp8_promotion_error(dev: &Device, rng: &mut Uniform) {
    use tessera::F8E4M3;
    use tessera_kernels::{gemm_fp8, Fp8Scaling};
    let (m, n, k) = (256, 256, 16384);
    // Positive values: sums that grow with K, where short accumulators lose the most.
    let ha = rng.vec(m * k, |x| F8E4M3::from_f32(1.0 + x));
    let hb = rng.vec(n * k, |x| F8E4M3::from_f32(1.0 + x));
    let want: Vec<f64> = (0..m * n)
        .map(|ij| (0..k).map(|x| f64::from(ha[(ij / n) * k + x].to_f32()) * f64::from(hb[(ij % n) * k + x].to_f32())).sum())
        .collect();
    let a = Tensor::from_host(dev, &ha, &[m, k]).expect("a");
    let b = Tensor::from_host(dev, &hb, &[n, k]).expect("b");
    let one = Tensor::from_host(dev, &[1.0f32], &[1]).expect("scale");
    let mut c = Tensor::<tessera::f16>::zeros(dev, &[m, n]).expect("c");
    println!("\nfp8 tensorwise, K = {k}, {m}×{n} of C in f16, relative error against float64:");
    for promote in [false, true] {
        gemm_fp8(&a, &b, Fp8Scaling::Tensorwise { a: &one, b: &one }).fast_accumulation(!promote).run(dev, &mut c).expect("gemm_fp8");
        let got: Vec<f64> = c.to_host().expect("c").into_iter().map(|x| x.to_f64()).collect();
        println!("  promote={promote}: {:.2e}", tessera::testing::rel_error(&got, &want));
    }
}

/// `TESSERA_BENCH_GEMM=syrk`: `C = A·Aᵀ` with only C's lower triangle's tiles
/// (`triangular_only`), its time against cuBLAS's full GEMM of the same shape in the same run
/// (the issue asks ≤ 0.55×), at 8192×8192, K 8192 and 4096.
fn syrk(dev: &Device, blas: &CudaBlas) {
    use tessera_kernels::{gemm, Triangle};
    let stream = dev.stream().expect("a CUDA stream").clone();
    let mut rng = Uniform::new();
    println!("\nSYRK (lower) bf16 on {} (ms; cuBLAS computes the full product)", dev.name());
    println!("| N×K | cuBLAS full | tessera triangle | × cuBLAS time |");
    println!("|---|---|---|---|");
    for &(n, k) in &[(8192usize, 8192usize), (8192, 4096)] {
        let a = Tensor::from_host(dev, &rng.vec(n * k, bf16::from_f32), &[n, k]).expect("a");
        let a_raw = stream.clone_htod(&a.to_host().expect("a")).expect("a raw");
        let mut c = Tensor::<bf16>::zeros(dev, &[n, n]).expect("c");
        let mut c_raw = stream.alloc_zeros::<bf16>(n * n).expect("c raw");
        let cfg = cublas_tn(n, n, k);
        let mut ours = || gemm(&a, &a).triangular_only(Triangle::Lower).run(dev, &mut c).expect("syrk");
        let mut theirs = || unsafe { blas.gemm(cfg, &a_raw, &a_raw, &mut c_raw) }.expect("cublas");
        let (t_cublas, t_ours) = time_pair(dev, 10, &mut theirs, &mut ours);
        println!("| {n}×{k} | {t_cublas:.3} | {t_ours:.3} | {:.2} |", t_ours / t_cublas);
    }
}

/// `TESSERA_BENCH_GEMM=grouped`: the grouped GEMM over E experts whose rows sum to 16384 (N 2048,
/// K 4096) beside one dense cuBLAS GEMM of the same FLOPs (16384×2048×4096) in the same rounds,
/// and `torch._grouped_mm` (`benches/grouped_mm.py`) on the same row ends. Sizes "routed": each
/// row sent to an expert drawn uniformly (a router's balanced counts); "skewed": the ends drawn
/// uniformly (many small experts and a few large); "equal": 16384 / E each. Then each variant's
/// TFLOP/s (the tuner's choice is in the table). `TESSERA_BENCH_EXPERTS` (`64,128`) and
/// `TESSERA_BENCH_SIZES` (`equal,routed`) narrow the table (for a profiler).
fn grouped(dev: &Device, blas: &CudaBlas) {
    use tessera::F8E4M3;
    use tessera_kernels::{gemm_fp8_grouped, gemm_grouped, gemm_grouped_variants, Fp8GroupedScaling};
    let mut fp8_rows = Vec::new();
    let stream = dev.stream().expect("a CUDA stream").clone();
    let mut py = common::PyBaseline::spawn("TESSERA_GROUPED_MM_SCRIPT", "grouped_mm.py");
    let (m, n, k) = (16384usize, 2048usize, 4096usize);
    let mut rng = Uniform::new();
    let a = Tensor::from_host(dev, &rng.vec(m * k, bf16::from_f32), &[m, k]).expect("a");
    let a_raw = stream.clone_htod(&a.to_host().expect("a")).expect("a raw");
    let b_raw = stream.clone_htod(&rng.vec(n * k, bf16::from_f32)).expect("b raw");
    let mut c_raw = stream.alloc_zeros::<bf16>(m * n).expect("c raw");
    let mut c = Tensor::<bf16>::zeros(dev, &[m, n]).expect("c");
    let mut a8 = Tensor::<F8E4M3>::zeros(dev, &[m, k]).expect("a8");
    tessera_kernels::quantize_fp8(dev, &a, 2.0, &mut a8).expect("a8");
    let flop = 2.0 * (m * n * k) as f64;
    println!("\nGrouped GEMM bf16 on {} ({m} rows in all, N {n}, K {k}; TFLOP/s of the useful work)", dev.name());
    println!("| experts | sizes | cuBLAS dense | tessera grouped | × dense | torch _grouped_mm | × torch |");
    println!("|---|---|---|---|---|---|---|");
    let mut by_variant = Vec::new();
    // The JSON report (`target/tessera-bench/gemm_grouped-<arch>.json`): bf16 and fp8 rows
    // against torch's grouped kernels, each with the kernels of one more call of ours.
    let mut report = tessera::report::Report::new("gemm_grouped", dev);
    let list = |var: &str, all: &str| std::env::var(var).unwrap_or_else(|_| all.to_string());
    let experts_list: Vec<usize> = list("TESSERA_BENCH_EXPERTS", "1,8,64,128").split(',').filter_map(|x| x.trim().parse().ok()).collect();
    let kinds = list("TESSERA_BENCH_SIZES", "routed,skewed,equal");
    for experts in experts_list {
        let w_host = rng.vec(experts * n * k, bf16::from_f32);
        let w = Tensor::from_host(dev, &w_host, &[experts, n, k]).expect("w");
        // The same numbers as each expert's K×N (B `[E, K, N]`, `BLayout::KxN`).
        let w_kn = Tensor::from_host(dev, &w_host, &[experts, k, n]).expect("w kn");
        drop(w_host);
        // fp8 operands: the bf16 ones converted on the device.
        let mut w8 = Tensor::<F8E4M3>::zeros(dev, &[experts, n, k]).expect("w8");
        tessera_kernels::quantize_fp8(dev, &w, 2.0, &mut w8).expect("w8");
        let sa = Tensor::from_host(dev, &rng.vec(m, |x| 1.0 + 0.5 * x), &[m]).expect("sa");
        let sb = Tensor::from_host(dev, &rng.vec(experts * n, |x| 1.0 + 0.5 * x), &[experts, n]).expect("sb");
        for kind in ["routed", "skewed", "equal"] {
            if (experts == 1 && kind != "equal") || !kinds.split(',').any(|x| x.trim() == kind) {
                continue;
            }
            let mut sizes = vec![m / experts; experts];
            if kind == "skewed" {
                let mut cuts: Vec<usize> = (1..experts).map(|_| ((rng.next_f32() + 1.0) * 0.5 * m as f32) as usize).collect();
                cuts.sort_unstable();
                cuts.push(m);
                let mut last = 0;
                for (s, c) in sizes.iter_mut().zip(cuts) {
                    *s = c - last;
                    last = c;
                }
            } else if kind == "routed" {
                sizes.fill(0);
                for _ in 0..m {
                    sizes[(((rng.next_f32() + 1.0) * 0.5 * experts as f32) as usize).min(experts - 1)] += 1;
                }
            }
            let ends: Vec<i32> = sizes
                .iter()
                .scan(0, |e, &s| {
                    *e += s as i32;
                    Some(*e)
                })
                .collect();
            let ends_t = Tensor::from_host(dev, &ends, &[experts]).expect("ends");
            let cfg = cublas_tn(m, n, k);
            let mut theirs = || unsafe { blas.gemm(cfg, &b_raw, &a_raw, &mut c_raw) }.expect("cublas");
            let mut ours = || gemm_grouped(&a, &w, &ends_t).run(dev, &mut c).expect("grouped");
            ours();
            let (t_cublas, t_ours) = time_pair(dev, 10, &mut theirs, &mut ours);
            let csv: Vec<String> = ends.iter().map(|e| e.to_string()).collect();
            let torch = py.as_mut().map_err(|e| e.clone()).and_then(|t| t.ask(&format!("{n} {k} {}", csv.join(",")), 0));
            let (dense, ours_tf) = (flop / t_cublas * 1e-9, flop / t_ours * 1e-9);
            let (torch_tf, vs) = match &torch {
                Ok(t) => (format!("{t:.0}"), format!("{:.2}", ours_tf / t)),
                Err(e) => (format!("— ({e})"), "—".into()),
            };
            println!("| {experts} | {kind} | {dense:.0} | {ours_tf:.0} | {:.2} | {torch_tf} | {vs} |", ours_tf / dense);
            let shape = format!("{experts} experts {kind}, {m}x{n}x{k}");
            let record =
                |report: &mut tessera::report::Report, kernel: &str, dtype: &str, ms: f64, theirs: (&str, &Result<f64, String>)| {
                    let r = tessera::report::Record::new("gemm", kernel, &shape, dtype, ms, "TFLOP/s", flop / ms * 1e-9);
                    report.push(dev, if let Ok(v) = theirs.1 { r.against(theirs.0, *v) } else { r });
                };
            report.skip_launches();
            ours();
            record(&mut report, "gemm grouped", "bf16", t_ours, ("torch _grouped_mm", &torch));
            // fp8 (e4m3, rowwise scales): ours fast and promoted, torch's `_scaled_grouped_mm`.
            let scaling = Fp8GroupedScaling::Rowwise { a: &sa, b: &sb };
            let fast = time_ms(dev, 2, 10, || {
                gemm_fp8_grouped(&a8, &w8, &ends_t, scaling).fast_accumulation(true).run(dev, &mut c).expect("fp8 grouped")
            });
            let promoted = time_ms(dev, 2, 10, || gemm_fp8_grouped(&a8, &w8, &ends_t, scaling).run(dev, &mut c).expect("fp8 grouped"));
            let torch8 = py.as_mut().map_err(|e| e.clone()).and_then(|t| t.ask(&format!("{n} {k} {} fp8", csv.join(",")), 0));
            for (kernel, ms, fast_acc) in
                [("gemm fp8 grouped (rowwise, fast)", fast, true), ("gemm fp8 grouped (rowwise, promoted)", promoted, false)]
            {
                report.skip_launches();
                gemm_fp8_grouped(&a8, &w8, &ends_t, scaling).fast_accumulation(fast_acc).run(dev, &mut c).expect("fp8 grouped");
                record(&mut report, kernel, "e4m3", ms, ("torch _scaled_grouped_mm", &torch8));
            }
            fp8_rows.push(format!(
                "| {experts} | {kind} | {:.0} | {:.0} | {} |",
                flop / fast * 1e-9,
                flop / promoted * 1e-9,
                match torch8 {
                    Ok(t) => format!("{t:.0}"),
                    Err(e) => format!("— ({e})"),
                }
            ));
            for v in gemm_grouped_variants::<bf16>(tessera_kernels::BLayout::NxK) {
                let t = time_ms(dev, 2, 10, || gemm_grouped(&a, &w, &ends_t).variant(v).run(dev, &mut c).expect("grouped"));
                by_variant.push(format!("{experts} {kind} {v}: {:.0}", flop / t * 1e-9));
            }
            let kn = tessera_kernels::BLayout::KxN;
            let t = time_ms(dev, 2, 10, || gemm_grouped(&a, &w_kn, &ends_t).b_layout(kn).run(dev, &mut c).expect("grouped kn"));
            by_variant.push(format!("{experts} {kind} B K×N (default variant): {:.0}", flop / t * 1e-9));
        }
    }
    common::write_report(&report);
    println!("\nEach variant (TFLOP/s): {}", by_variant.join("; "));
    println!("\nfp8 grouped (e4m3, rowwise scales, TFLOP/s)\n| experts | sizes | tessera fast | tessera promoted | torch _scaled_grouped_mm |\n|---|---|---|---|---|");
    for r in fp8_rows {
        println!("{r}");
    }
}

/// `TESSERA_BENCH_GEMM=bsr`: the block-sparse GEMM at seed 004's configuration — 8192³, 128×128
/// blocks, 16 random nonzero blocks in each block row (of 64) — its effective TFLOP/s (the
/// nonzero blocks' work) beside dense cuBLAS's TFLOP/s at 8192³ in the same rounds, and PyTorch's
/// BSR kernel (`benches/bsr_mm.py`, another random pattern of the same density). Also 4 and 32
/// blocks a row.
fn bsr(dev: &Device, blas: &CudaBlas) {
    use tessera_kernels::{gemm_bsr, gemm_bsr_variants, Bsr};
    let stream = dev.stream().expect("a CUDA stream").clone();
    let mut torch = common::PyBaseline::spawn("TESSERA_BSR_MM_SCRIPT", "bsr_mm.py");
    let (m, n, k) = (8192usize, 8192usize, 8192usize);
    let mut rng = Uniform::new();
    let b = Tensor::from_host(dev, &rng.vec(n * k, bf16::from_f32), &[n, k]).expect("b");
    let a_raw = stream.clone_htod(&rng.vec(m * k, bf16::from_f32)).expect("a raw");
    let b_raw = stream.clone_htod(&b.to_host().expect("b")).expect("b raw");
    let mut c_raw = stream.alloc_zeros::<bf16>(m * n).expect("c raw");
    let mut c = Tensor::<bf16>::zeros(dev, &[m, n]).expect("c");
    println!("\nBlock-sparse GEMM bf16 on {} ({m}³; effective TFLOP/s over the nonzero blocks)", dev.name());
    println!("| block | blocks a row | cuBLAS dense | tessera BSR | × dense | torch BSR | × torch |");
    println!("|---|---|---|---|---|---|---|");
    let mut by_variant = Vec::new();
    // 128-blocks (seed 004: 16 a row), and 64-blocks at the same densities.
    for (blk, per_row) in [(128usize, 16usize), (128, 4), (128, 32), (64, 32), (64, 8), (64, 64)] {
        let (rows, cols) = (m / blk, k / blk);
        let mut idx = Vec::with_capacity(rows * per_row);
        for _ in 0..rows {
            let mut row: Vec<i32> = Vec::with_capacity(per_row);
            while row.len() < per_row {
                let col = (((rng.next_f32() + 1.0) * 0.5 * cols as f32) as i32).min(cols as i32 - 1);
                if !row.contains(&col) {
                    row.push(col);
                }
            }
            row.sort_unstable();
            idx.extend(row);
        }
        let ptr: Vec<i32> = (0..=rows).map(|r| (r * per_row) as i32).collect();
        let values = Tensor::from_host(dev, &rng.vec(idx.len() * blk * blk, bf16::from_f32), &[idx.len(), blk, blk]).expect("values");
        let (ptr_t, idx_t) =
            (Tensor::from_host(dev, &ptr, &[rows + 1]).expect("ptr"), Tensor::from_host(dev, &idx, &[idx.len()]).expect("idx"));
        let a = Bsr::new(&values, &ptr_t, &idx_t, m, k).expect("bsr");
        let cfg = cublas_tn(m, n, k);
        let mut theirs = || unsafe { blas.gemm(cfg, &b_raw, &a_raw, &mut c_raw) }.expect("cublas");
        let mut ours = || gemm_bsr(a, &b).run(dev, &mut c).expect("bsr");
        ours();
        let (t_cublas, t_ours) = time_pair(dev, 10, &mut theirs, &mut ours);
        let work = 2.0 * (m * n * per_row * blk) as f64;
        let (dense, eff) = (2.0 * (m * n * k) as f64 / t_cublas * 1e-9, work / t_ours * 1e-9);
        let torch = torch.as_mut().map_err(|e| e.clone()).and_then(|t| t.ask(&format!("{m} {n} {k} {per_row} {blk}"), 0));
        let (torch_tf, vs) = match &torch {
            Ok(t) => (format!("{t:.0}"), format!("{:.2}", eff / t)),
            Err(e) => (format!("— ({e})"), "—".into()),
        };
        println!("| {blk} | {per_row} | {dense:.0} | {eff:.0} | {:.2} | {torch_tf} | {vs} |", eff / dense);
        for v in gemm_bsr_variants::<bf16>(blk) {
            let t = time_ms(dev, 2, 10, || gemm_bsr(a, &b).variant(v).run(dev, &mut c).expect("bsr"));
            by_variant.push(format!("{blk}/{per_row} {v}: {:.0}", work / t * 1e-9));
        }
    }
    println!("\nEach variant (effective TFLOP/s): {}", by_variant.join("; "));
}
