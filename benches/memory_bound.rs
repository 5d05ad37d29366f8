//! GB/s of the memory-bound library kernels beside a device-to-device copy of the same
//! bytes, measured in the same run with CUDA events after warm-up.
//!
//! Bytes count each input read once and each output written once. The copy moves its buffer
//! once: bytes read plus bytes written. Inputs are 16384×8192 f32 (512 MiB), far above L2.
//!
//! `cargo bench --bench memory_bound` (prints a skip where there is no GPU).
//! `TESSERA_BENCH_WIDTHS=11008,12288` times the copy and the norms at those hidden sizes only;
//! `TESSERA_BENCH_SCANS=1` the first table and the scan rows only (`=prefix`, `=selective`,
//! `=linear`, `=ssd`, `=conv`: the copy and that part of them).
//! The scan rows have PyTorch's beside them (`benches/torch_scans.py`, run as a child process;
//! `TESSERA_TORCH_SCANS_SCRIPT` overrides its path); the selective scan's decode step has
//! mamba-ssm's Triton kernel beside it (`benches/mamba_step.py`, which says what it needs), the
//! linear attention flash-linear-attention's (`benches/fla_linear_attn.py`, likewise), Mamba-2's
//! SSD mamba-ssm's Triton `mamba_chunk_scan_combined` (`benches/mamba_ssd.py`), the convolutions
//! PyTorch's `conv1d` and FFT convolution (`benches/torch_conv.py`), and the selective
//! scan mamba-ssm's own CUDA kernels, forward and backward (`scripts/mamba-selective-scan.sh`, built there
//! with nvcc from the sources `scripts/fetch-baselines.sh` fetches).

mod common;

use criterion::Criterion;
use std::time::Duration;
use tessera::report::{Record, Report};
use tessera::testing::Uniform;
use tessera::{Device, Tensor};

/// A row into the JSON report beside the printed tables: GB/s against the copy measured first
/// (its rate the roofline), with the kernels launched since the last row. `shape` and `dtype`
/// where the label names none.
fn record(report: &mut Report, dev: &Device, label: &str, bytes: f64, ms: f64, shape: &str, dtype: &str) {
    let (source, family, kernel, shape, dtype) = common::label_fields(label, shape, dtype);
    let gbs = bytes / ms * 1e-6;
    let mut r = Record::new(&family, &kernel, &shape, &dtype, ms, "GB/s", gbs).source(&source);
    if let Some(copy) = report.records.first().map(|c| c.value) {
        r = r.against("copy", copy).roofline(copy);
    }
    report.push(dev, r);
}

/// CUDA-event milliseconds a call after `warm` calls, over `iters`. Under
/// `TESSERA_BENCH_PROFILE` (`scripts/bench-report.sh --ncu`: a profiler replays every launch)
/// each row runs once, untimed in earnest.
fn time_ms(dev: &Device, warm: usize, iters: usize, f: impl FnMut()) -> f64 {
    let (warm, iters) = if std::env::var_os("TESSERA_BENCH_PROFILE").is_some() { (0, 1) } else { (warm, iters) };
    tessera::testing::time_ms(dev, warm, iters, f).expect("CUDA event timing")
}

const M: usize = 16384;
const N: usize = 8192;

/// A Python baseline's `name value` lines: `benches/<file>` (or `<file>`, `bin/<file>` where the
/// bench runs from a bundle; `env` overrides the path) run with `args`, or why there are none
/// (the script's `error <reason>`, or its output when it is not such lines).
fn python_baseline(env: &str, file: &str, args: &[usize]) -> Result<Vec<(String, f64)>, String> {
    let script = std::env::var(env).ok().unwrap_or_else(|| {
        [format!("benches/{file}"), file.to_string(), format!("bin/{file}")]
            .into_iter()
            .find(|p| std::path::Path::new(p).exists())
            .unwrap_or_else(|| format!("benches/{file}"))
    });
    let out = std::process::Command::new("python3")
        .arg(&script)
        .args(args.iter().map(|a| a.to_string()))
        .output()
        .map_err(|e| format!("python3 {script}: {e}"))?;
    let text = String::from_utf8_lossy(&out.stdout);
    let mut lines = Vec::new();
    for line in text.lines() {
        match line.split_once(' ') {
            Some(("error", why)) => return Err(why.to_string()),
            Some((name, ms)) => lines.push((name.to_string(), ms.trim().parse::<f64>().map_err(|e| format!("{script}: `{line}`: {e}"))?)),
            None => return Err(format!("{script}: `{line}` {}", String::from_utf8_lossy(&out.stderr))),
        }
    }
    Ok(lines)
}

/// `benches/torch_scans.py` at one shape: `(name, ms)` per line, or why there is none.
/// `TESSERA_TORCH_SCANS_SCRIPT` overrides the script's path.
fn torch_scans(rows: usize, cols: usize) -> Result<Vec<(String, f64)>, String> {
    python_baseline("TESSERA_TORCH_SCANS_SCRIPT", "torch_scans.py", &[rows, cols])
}

/// mamba-ssm's Triton decode step (`benches/mamba_step.py`) at one shape, in ms, or why there is
/// none. `TESSERA_MAMBA_STEP_SCRIPT` overrides the script's path.
fn mamba_step(batch: usize, dim: usize, dstate: usize) -> Result<f64, String> {
    let lines = python_baseline("TESSERA_MAMBA_STEP_SCRIPT", "mamba_step.py", &[batch, dim, dstate])?;
    lines.iter().find(|(name, _)| name == "ms").map(|&(_, ms)| ms).ok_or_else(|| "mamba_step.py printed no `ms` line".to_string())
}

/// mamba-ssm's selective scan CUDA kernels at one shape, forward and backward, in ms, or why
/// there are none:
/// `scripts/mamba-selective-scan.sh` builds it with the machine's nvcc from mamba-ssm's sources
/// (`TESSERA_MAMBA_CSRC`, else `mamba_csrc` or `.gpu2/mamba_csrc` as
/// `scripts/fetch-baselines.sh` leaves them) and runs it.
fn mamba_scan(batch: usize, dim: usize, len: usize, dstate: usize) -> Result<(f64, f64), String> {
    let found = |paths: &[&str]| paths.iter().find(|p| std::path::Path::new(p).exists()).map(|p| p.to_string());
    let csrc = std::env::var("TESSERA_MAMBA_CSRC").ok().or_else(|| found(&["mamba_csrc", ".gpu2/mamba_csrc"])).ok_or("no mamba_csrc")?;
    let script =
        found(&["scripts/mamba-selective-scan.sh", "../scripts/mamba-selective-scan.sh"]).ok_or("no scripts/mamba-selective-scan.sh")?;
    let out = std::process::Command::new("bash")
        .arg(&script)
        .arg(&csrc)
        .args([batch, dim, len, dstate].iter().map(|a| a.to_string()))
        .output()
        .map_err(|e| format!("bash {script}: {e}"))?;
    let text = String::from_utf8_lossy(&out.stdout);
    let ms = |name: &str| {
        let line = text
            .lines()
            .find(|l| l.starts_with(name))
            .ok_or_else(|| format!("{script}: no `{name}` line: {}", String::from_utf8_lossy(&out.stderr)))?;
        line.rsplit(' ').next().and_then(|ms| ms.parse::<f64>().ok()).ok_or_else(|| format!("{script}: `{line}`"))
    };
    Ok((ms("mamba_selective_scan_fwd")?, ms("mamba_selective_scan_bwd")?))
}

fn main() {
    let Ok(dev) = Device::new(0) else {
        println!("memory_bound: skipped, no GPU");
        return;
    };
    let mut rng = Uniform::new();
    let mut random = |n: usize| rng.vec(n, |v| v);
    let mut rng2 = Uniform::new();
    let mut rng_bf16 = |n: usize| rng2.vec(n, tessera::bf16::from_f32);
    let x = Tensor::from_host(&dev, &random(M * N), &[M, N]).expect("x");
    let mut y = Tensor::from_host(&dev, &random(M * N), &[M, N]).expect("y");
    let mut out = Tensor::<f32>::zeros(&dev, &[M]).expect("out");
    let src = dev.stream().expect("a CUDA stream").clone_htod(&random(M * N)).expect("src");
    let mut dst = dev.stream().expect("a CUDA stream").alloc_zeros::<f32>(M * N).expect("dst");

    let mut criterion = Criterion::default()
        .configure_from_args()
        .sample_size(10)
        .warm_up_time(Duration::from_millis(500))
        .measurement_time(Duration::from_secs(2));
    let timed = |c: &mut Criterion, name: &str, f: &mut dyn FnMut()| {
        c.bench_function(name, |b| {
            b.iter_custom(|iters| Duration::from_secs_f64(time_ms(&dev, 0, iters as usize, &mut *f) * 1e-3 * iters as f64))
        });
    };
    let mb = (M * N * 4) as f64;
    let mut rows: Vec<(&str, f64, f64)> = Vec::new();
    let mut norm_rows: Vec<(String, f64, f64)> = Vec::new();
    let mut report = Report::new("memory_bound", &dev);
    let whole = format!("{M}x{N}");
    // A row of the first table (f32 at 16384×8192 unless its label says), or of the second
    // (bf16): printed at the end, recorded in the report now.
    macro_rules! row {
        ($label:expr, $bytes:expr, $ms:expr $(,)?) => {{
            let (label, bytes, ms) = ($label, $bytes, $ms);
            record(&mut report, &dev, label, bytes, ms, &whole, "f32");
            rows.push((label, bytes, ms));
        }};
    }
    macro_rules! norm_row {
        ($label:expr, $bytes:expr, $ms:expr $(,)?) => {{
            let (label, bytes, ms): (String, f64, f64) = ($label, $bytes, $ms);
            record(&mut report, &dev, &label, bytes, ms, "", "bf16");
            norm_rows.push((label, bytes, ms));
        }};
    }
    {
        let mut f = || dev.stream().expect("a CUDA stream").memcpy_dtod(&src, &mut dst).expect("copy");
        timed(&mut criterion, "copy", &mut f);
        row!("copy (read+write)", 2.0 * mb, time_ms(&dev, 5, 20, f));
    }
    // Only some norm widths (and the copy), to look at one kernel quickly.
    let only: Option<Vec<usize>> = std::env::var("TESSERA_BENCH_WIDTHS")
        .ok()
        .map(|v| v.split(',').map(|w| w.trim().parse().expect("TESSERA_BENCH_WIDTHS: widths like 11008,12288")).collect());
    let all = only.is_none();
    // Only the copy, the first table and the scan rows.
    let scans_only = std::env::var_os("TESSERA_BENCH_SCANS").is_some();
    // `TESSERA_BENCH_SCANS=prefix`, `selective`, `linear`, `ssd` (or several, comma-separated):
    // those parts of the scan rows alone.
    let part = |name: &str| std::env::var("TESSERA_BENCH_SCANS").map_or(true, |v| v == "1" || v.split(',').any(|p| p == name));
    if all && part("prefix") {
        {
            let mut f = || tessera_kernels::axpy(&dev, 0.5, &x, &mut y).expect("axpy");
            timed(&mut criterion, "axpy", &mut f);
            row!("axpy y=a*x+y", 3.0 * mb, time_ms(&dev, 5, 20, f));
        }
        {
            let mut f = || tessera_kernels::row_sum(&dev, &x, &mut out).expect("row_sum");
            timed(&mut criterion, "row_sum", &mut f);
            row!("row_sum", mb + (M * 4) as f64, time_ms(&dev, 5, 20, f));
        }
        {
            let mut f = || tessera_kernels::row_max(&dev, &x, &mut out).expect("row_max");
            timed(&mut criterion, "row_max", &mut f);
            row!("row_max", mb + (M * 4) as f64, time_ms(&dev, 5, 20, f));
        }
        {
            let mut f = || tessera_kernels::softmax(&dev, &x, &mut y).expect("softmax");
            timed(&mut criterion, "softmax", &mut f);
            row!("softmax", 2.0 * mb, time_ms(&dev, 5, 20, f));
        }
        // Prefix scans along the rows (4 rows a block, 1024-column chunks carried along; the
        // 16-bit logcumsumexp 16 rows × 256).
        {
            let mut f = || tessera_kernels::cumsum(&dev, &x, &mut y).expect("cumsum");
            timed(&mut criterion, "cumsum", &mut f);
            row!("cumsum", 2.0 * mb, time_ms(&dev, 5, 20, f));
        }
        {
            let mut f = || tessera_kernels::logcumsumexp(&dev, &x, &mut y).expect("logcumsumexp");
            row!("logcumsumexp", 2.0 * mb, time_ms(&dev, 5, 20, &mut f));
        }
        {
            let xb = Tensor::from_host(&dev, &rng_bf16(M * N), &[M, N]).expect("x bf16");
            let mut yb = Tensor::<tessera::bf16>::zeros(&dev, &[M, N]).expect("y bf16");
            let mut f = || tessera_kernels::cumsum(&dev, &xb, &mut yb).expect("cumsum bf16");
            row!("cumsum bf16", mb, time_ms(&dev, 5, 20, &mut f));
            let mut f = || tessera_kernels::logcumsumexp(&dev, &xb, &mut yb).expect("logcumsumexp bf16");
            row!("logcumsumexp bf16", mb, time_ms(&dev, 5, 20, &mut f));
        }
        // The backwards: the bytes each must read and write. `y` is the forward's output
        // (cumprod_backward reads one column of it every 256).
        {
            let dy = Tensor::from_host(&dev, &random(M * N), &[M, N]).expect("dy");
            let mut dx = Tensor::<f32>::zeros(&dev, &[M, N]).expect("dx");
            let mut f = || tessera_kernels::cumsum_backward(&dev, &dy, &mut dx).expect("cumsum_backward");
            row!("cumsum_backward", 2.0 * mb, time_ms(&dev, 5, 20, &mut f));
            let mut prod = Tensor::<f32>::zeros(&dev, &[M, N]).expect("cumprod");
            tessera_kernels::cumprod(&dev, &x, &mut prod).expect("cumprod");
            let mut f = || tessera_kernels::cumprod_backward(&dev, &x, &prod, &dy, &mut dx).expect("cumprod_backward");
            row!("cumprod_backward", 3.0 * mb, time_ms(&dev, 5, 20, &mut f));
            let mut lse = Tensor::<f32>::zeros(&dev, &[M, N]).expect("lse");
            tessera_kernels::logcumsumexp(&dev, &x, &mut lse).expect("logcumsumexp");
            let mut f = || tessera_kernels::logcumsumexp_backward(&dev, &x, &lse, &dy, &mut dx).expect("logcumsumexp_backward");
            row!("logcumsumexp_backward", 4.0 * mb, time_ms(&dev, 5, 20, &mut f));
            drop((dx, lse, prod));
            let to16 = |t: &Tensor<f32>| {
                Tensor::from_host(
                    &dev,
                    &t.to_host().expect("to host").into_iter().map(tessera::bf16::from_f32).collect::<Vec<_>>(),
                    &[M, N],
                )
            };
            let (xb, dyb) = (to16(&x).expect("x bf16"), to16(&dy).expect("dy bf16"));
            let mut lseb = Tensor::<tessera::bf16>::zeros(&dev, &[M, N]).expect("lse bf16");
            tessera_kernels::logcumsumexp(&dev, &xb, &mut lseb).expect("logcumsumexp bf16");
            let mut dxb = Tensor::<tessera::bf16>::zeros(&dev, &[M, N]).expect("dx bf16");
            let mut f = || tessera_kernels::logcumsumexp_backward(&dev, &xb, &lseb, &dyb, &mut dxb).expect("logcumsumexp_backward bf16");
            row!("logcumsumexp_backward bf16", 2.0 * mb, time_ms(&dev, 5, 20, &mut f));
        }
        // PyTorch's scans on the same shapes, in this run (a child process; its own copy row
        // shows whether the device is in the same state).
        match torch_scans(M, N) {
            Ok(lines) => {
                for (name, ms) in lines {
                    let (row, bytes) = match name.as_str() {
                        "copy" => ("torch copy", 2.0 * mb),
                        "cumsum" => ("torch cumsum", 2.0 * mb),
                        "logcumsumexp" => ("torch logcumsumexp", 2.0 * mb),
                        "cumsum_bf16" => ("torch cumsum bf16", mb),
                        _ => continue,
                    };
                    row!(row, bytes, ms);
                }
            }
            Err(why) => println!("memory_bound: no torch scan baseline: {why}"),
        }
        // Four rows of 2^25 (the same bytes): each row split into segments over the GPU, a
        // pass for the segments' totals first.
        let (rows4, cols4) = (4, M * N / 4);
        let x4 = Tensor::from_host(&dev, &random(M * N), &[rows4, cols4]).expect("x 4 rows");
        let mut y4 = Tensor::<f32>::zeros(&dev, &[rows4, cols4]).expect("y 4 rows");
        let mut f = || tessera_kernels::cumsum(&dev, &x4, &mut y4).expect("cumsum 4 rows");
        row!("cumsum 4 long rows", 2.0 * mb, time_ms(&dev, 5, 20, &mut f));
        let mut f = || tessera_kernels::logcumsumexp(&dev, &x4, &mut y4).expect("logcumsumexp 4 rows");
        row!("logcumsumexp 4 long rows", 2.0 * mb, time_ms(&dev, 5, 20, &mut f));
        {
            let x4h = Tensor::from_host(&dev, &rng_bf16(M * N), &[rows4, cols4]).expect("x 4 rows bf16");
            let mut y4h = Tensor::<tessera::bf16>::zeros(&dev, &[rows4, cols4]).expect("y 4 rows bf16");
            let mut f = || tessera_kernels::cumsum(&dev, &x4h, &mut y4h).expect("cumsum 4 rows bf16");
            row!("cumsum bf16 4 long rows", mb, time_ms(&dev, 5, 20, &mut f));
        }
        if let Ok(lines) = torch_scans(rows4, cols4) {
            if let Some(&(_, ms)) = lines.iter().find(|(name, _)| name == "cumsum") {
                row!("torch cumsum 4 rows", 2.0 * mb, ms);
            }
        }
        // The backwards of four long rows (segments of 16-row blocks: a pass of the segments'
        // totals, then the walk; at most 256 segments a row).
        let dy4 = Tensor::from_host(&dev, &random(M * N), &[rows4, cols4]).expect("dy 4 rows");
        let mut prod4 = Tensor::<f32>::zeros(&dev, &[rows4, cols4]).expect("cumprod 4 rows");
        tessera_kernels::cumprod(&dev, &x4, &mut prod4).expect("cumprod 4 rows");
        let mut f = || tessera_kernels::cumprod_backward(&dev, &x4, &prod4, &dy4, &mut y4).expect("cumprod_backward 4 rows");
        row!("cumprod_backward 4 long rows", 3.0 * mb, time_ms(&dev, 5, 20, &mut f));
        drop(prod4);
        let mut lse4 = Tensor::<f32>::zeros(&dev, &[rows4, cols4]).expect("lse 4 rows");
        tessera_kernels::logcumsumexp(&dev, &x4, &mut lse4).expect("logcumsumexp 4 rows");
        let mut f = || tessera_kernels::logcumsumexp_backward(&dev, &x4, &lse4, &dy4, &mut y4).expect("logcumsumexp_backward 4 rows");
        row!("logcumsumexp_backward 4 long rows", 4.0 * mb, time_ms(&dev, 5, 20, &mut f));
    }
    // The norms in bf16 with weight (and bias): x read once, y written once, the [hidden]
    // parameters once. 16384×8192 first (the shape), then hidden sizes around it with
    // rows chosen for 256 MiB of input, far above L2.
    let widths = if scans_only {
        Vec::new()
    } else {
        only.unwrap_or_else(|| vec![8192, 768, 1024, 1536, 2048, 2304, 2560, 3072, 4096, 5120, 6144, 10240, 11008, 12288, 16384])
    };
    for (i, &n) in widths.iter().enumerate() {
        use tessera::bf16;
        let m = if i == 0 && n == N { M } else { (1usize << 27) / n };
        let xb = Tensor::from_host(&dev, &rng_bf16(m * n), &[m, n]).expect("x bf16");
        let wb = Tensor::from_host(&dev, &rng_bf16(n), &[n]).expect("w bf16");
        let bb = Tensor::from_host(&dev, &rng_bf16(n), &[n]).expect("b bf16");
        let mut yb = Tensor::<bf16>::zeros(&dev, &[m, n]).expect("y bf16");
        let bytes = (2 * m * n * 2 + n * 2) as f64;
        // Every kernel that takes this width (`TESSERA_NORM_PATH`), so the dispatch can be
        // checked against the alternatives; the default path is marked `*`.
        let default = format!("{:?}", tessera_kernels::NormPath::choose(m, n, dev.sm_count() as usize)).to_lowercase();
        for path in ["rows4", "rows2", "row", "wide", "tiled"] {
            if (path == "rows4" && n > tessera_kernels::ROW_IN_REGISTERS)
                || (path == "rows2" && !(2048..=3584).contains(&n))
                || (path == "row" && n > tessera_kernels::ROW_PER_BLOCK_MAX)
                || (path == "wide" && !(8193..=tessera_kernels::NORM_WIDE_MAX).contains(&n))
            {
                continue;
            }
            std::env::set_var("TESSERA_NORM_PATH", path);
            let mark = if path == default { "*" } else { "" };
            let mut rms = || tessera_kernels::rms_norm(&dev, &xb, Some(&wb), 1e-6, &mut yb).expect("rms_norm");
            if i == 0 && path == default {
                timed(&mut criterion, "rms_norm bf16", &mut rms);
            }
            norm_row!(format!("rms_norm {m}x{n} {path}{mark}"), bytes, time_ms(&dev, 5, 20, &mut rms));
            let mut ln = || tessera_kernels::layer_norm(&dev, &xb, Some(&wb), Some(&bb), 1e-5, &mut yb).expect("layer_norm");
            if i == 0 && path == default {
                timed(&mut criterion, "layer_norm bf16", &mut ln);
            }
            norm_row!(format!("layer_norm {m}x{n} {path}{mark}"), bytes + (n * 2) as f64, time_ms(&dev, 5, 20, &mut ln));
            if path == "wide" {
                // Softmax has no two-warpgroup kernel: its default at these widths follows.
                continue;
            }
            let mut sm = || tessera_kernels::softmax(&dev, &xb, &mut yb).expect("softmax");
            if i == 0 && path == default {
                timed(&mut criterion, "softmax bf16", &mut sm);
            }
            let mark =
                if path == "tiled" && n > tessera_kernels::ROW_PER_BLOCK_MAX && n <= tessera_kernels::SOFTMAX_ROW_MAX { "" } else { mark };
            norm_row!(format!("softmax {m}x{n} {path}{mark}"), bytes - (n * 2) as f64, time_ms(&dev, 5, 20, &mut sm));
        }
        std::env::remove_var("TESSERA_NORM_PATH");
        if n > tessera_kernels::ROW_PER_BLOCK_MAX && n <= tessera_kernels::SOFTMAX_ROW_MAX {
            // Softmax's forward reads rows this wide once, a block per row (its default here).
            let mut sm = || tessera_kernels::softmax(&dev, &xb, &mut yb).expect("softmax");
            norm_row!(format!("softmax {m}x{n} row*"), bytes - (n * 2) as f64, time_ms(&dev, 5, 20, &mut sm));
        }
        if n <= tessera_kernels::ROW_PER_BLOCK_MAX {
            // y, dy read, dx written.
            let mut dx = Tensor::<bf16>::zeros(&dev, &[m, n]).expect("dx bf16");
            let dy = Tensor::from_host(&dev, &rng_bf16(m * n), &[m, n]).expect("dy bf16");
            let mut bwd = || tessera_kernels::softmax_backward(&dev, &xb, &dy, &mut dx, 1.0).expect("softmax_backward");
            norm_row!(format!("softmax_backward {m}x{n}"), (3 * m * n * 2) as f64, time_ms(&dev, 5, 20, &mut bwd));
        }
        if i == 0 || !all || matches!(n, 2048 | 2304 | 5120 | 11008) {
            // Fused RMSNorm: dropout + residual + weight, the new residual returned (x, res read;
            // y, h written), then its backward (h, dy, dres read; dh, dx written; dweight).
            use tessera_kernels::{Dropout, Norm, NormGrads};
            let res = Tensor::from_host(&dev, &rng_bf16(m * n), &[m, n]).expect("res bf16");
            let [mut h, mut dh, mut dx] = [(); 3].map(|_| Tensor::<bf16>::zeros(&dev, &[m, n]).expect("bf16"));
            let mut dw = Tensor::<bf16>::zeros(&dev, &[n]).expect("dw");
            let norm = Norm::rms(1e-6).weight(&wb).residual(&res).dropout(Dropout::new(0.1, 42, 0));
            let mut fwd = || norm.forward(&dev, &xb, &mut yb, Some(&mut h)).expect("fused norm");
            norm_row!(format!("rms fused drop+res {m}x{n}"), (4 * m * n * 2) as f64, time_ms(&dev, 5, 20, &mut fwd));
            let mut bwd = || {
                let grads = NormGrads { dh: &mut dh, dx: Some(&mut dx), dweight: Some(&mut dw), dbias: None };
                norm.backward(&dev, &xb, &res, Some(&yb), grads).expect("fused norm backward");
            };
            norm_row!(format!("rms fused backward {m}x{n}"), (5 * m * n * 2) as f64, time_ms(&dev, 5, 20, &mut bwd));
            // Plain RMSNorm's backward with its weight (h, dy read; dh written; dweight).
            let plain = Norm::rms(1e-6).weight(&wb);
            let mut bwd = || {
                let grads = NormGrads { dh: &mut dh, dx: None, dweight: Some(&mut dw), dbias: None };
                plain.backward(&dev, &xb, &yb, None, grads).expect("rms backward");
            };
            norm_row!(format!("rms backward {m}x{n}"), (3 * m * n * 2) as f64, time_ms(&dev, 5, 20, &mut bwd));
        }
    }
    // RoPE in bf16: the shape (batch 8, seq 4096, 32 heads, dim 128) in each
    // convention, layout, angle source, and in place; then 16384 tokens of 64×128 heads.
    if all && !scans_only {
        use tessera::bf16;
        use tessera_kernels::{HeadLayout, Rope, RopeStyle};
        for (b, s, h, d) in [(8usize, 4096usize, 32usize, 128usize), (1, 16384, 64, 128)] {
            let numel = b * s * h * d;
            let xb = Tensor::from_host(&dev, &rng_bf16(numel), &[b, s, h, d]).expect("x bf16");
            let mut yb = Tensor::<bf16>::zeros(&dev, &[b, s, h, d]).expect("y bf16");
            let bytes = (2 * numel * 2) as f64;
            let shape = format!("{b}x{s}x{h}x{d}");
            for style in [RopeStyle::HalfSplit, RopeStyle::Interleaved] {
                let (cos, sin) = tessera_kernels::rope_cache(&dev, style, s, d, 10_000.0).expect("rope cache");
                for (layout, cached) in [(HeadLayout::Bshd, false), (HeadLayout::Bshd, true), (HeadLayout::Bhsd, false)] {
                    if b == 1 && (cached || layout == HeadLayout::Bhsd) {
                        continue;
                    }
                    let mut rope = Rope::new(style, layout);
                    if cached {
                        rope = rope.cache(&cos, &sin);
                    }
                    let mut f = || tessera_kernels::rope(&dev, &rope, &xb, &mut yb).expect("rope");
                    if b == 8 && style == RopeStyle::HalfSplit && !cached && layout == HeadLayout::Bshd {
                        timed(&mut criterion, "rope bf16", &mut f);
                    }
                    let src = if cached { "cache" } else { "computed" };
                    norm_row!(format!("rope {shape} {style:?} {layout:?} {src}"), bytes, time_ms(&dev, 5, 20, &mut f));
                }
            }
            if b == 8 {
                let rope = Rope::new(RopeStyle::HalfSplit, HeadLayout::Bshd);
                let mut f = || tessera_kernels::rope_in_place(&dev, &rope, &mut yb).expect("rope in place");
                norm_row!(format!("rope {shape} in place"), bytes, time_ms(&dev, 5, 20, &mut f));
            }
        }
    }
    // fp8 quantization, bf16 to E4M3 and back, at 16384×8192: 2 bytes read and 1 written an
    // element, or the reverse.
    if all && !scans_only {
        use tessera::{bf16, F8E4M3};
        let (m, n) = (16384usize, 8192usize);
        let xb = Tensor::from_host(&dev, &rng_bf16(m * n), &[m, n]).expect("x bf16");
        let mut q = Tensor::<F8E4M3>::zeros(&dev, &[m, n]).expect("q");
        let mut yb = Tensor::<bf16>::zeros(&dev, &[m, n]).expect("y bf16");
        let bytes = (m * n * 3) as f64;
        let mut f = || tessera_kernels::quantize_fp8(&dev, &xb, 8.0, &mut q).expect("quantize");
        norm_row!(format!("quantize_fp8 {m}x{n} bf16->e4m3"), bytes, time_ms(&dev, 5, 20, &mut f));
        let mut f = || tessera_kernels::dequantize_fp8(&dev, &q, 0.125, &mut yb).expect("dequantize");
        norm_row!(format!("dequantize_fp8 {m}x{n} e4m3->bf16"), bytes, time_ms(&dev, 5, 20, &mut f));
    }
    // The selective scan (Mamba-1) forward, bf16, d_state 16, one group, with D, the gate and
    // softplus: its roofline reads u, delta, z (batch·channels·L each), B and C
    // (batch·d_state·L each) once and writes y once (2 bytes an element).
    if all && part("conv") {
        // Mamba's short causal convolution (4 taps, bias, SiLU; bf16): x read and y written
        // once forward; x and dy read, dx written backward (the filter's sums are small).
        let (b, ch, l, taps) = (8, 4096, 4096, 4);
        let n = b * ch * l;
        let x = Tensor::from_host(&dev, &rng_bf16(n), &[b, ch, l]).expect("x");
        let w = Tensor::from_host(&dev, &random(ch * taps), &[ch, taps]).expect("w");
        let bias = Tensor::from_host(&dev, &random(ch), &[ch]).expect("bias");
        let mut y = Tensor::<tessera::bf16>::zeros(&dev, &[b, ch, l]).expect("y");
        let conv = tessera_kernels::Conv1d::causal_conv1d(&dev, &x, &w).bias(&bias).silu();
        let mut f = || conv.run(&mut y).expect("conv1d");
        norm_row!(format!("conv1d causal K{taps} silu {b}x{ch}x{l}"), (2 * n * 2) as f64, time_ms(&dev, 5, 20, &mut f));
        let dy = Tensor::from_host(&dev, &rng_bf16(n), &[b, ch, l]).expect("dy");
        let mut f = || drop(conv.backward(&dy).expect("conv1d backward"));
        norm_row!(format!("conv1d causal K{taps} silu bwd {b}x{ch}x{l}"), (3 * n * 2) as f64, time_ms(&dev, 2, 10, &mut f));
        if let Ok(lines) = python_baseline("TESSERA_TORCH_CONV_SCRIPT", "torch_conv.py", &[b, ch, l, taps]) {
            if let Some(&(_, ms)) = lines.iter().find(|(name, _)| name == "conv1d_bf16") {
                norm_row!(format!("  torch conv1d K{taps} {b}x{ch}x{l}"), (2 * n * 2) as f64, ms);
            }
        }
        drop((x, y, dy));
        // A long causal convolution (Hyena's: the filter as long as the signal, f32) on the
        // direct path and through cuFFT (the filter's transform in the timing, as torch's),
        // beside PyTorch's FFT convolution.
        // The tensor-core FFT in bf16 where `2L − 1` fits its lengths (the filter's transform in
        // the timing too).
        for (b, ch, l) in [(8, 768, 2048), (8, 768, 4096), (4, 768, 16384), (2, 768, 32768), (1, 768, 65536)] {
            let n = b * ch * l;
            let x = Tensor::from_host(&dev, &random(n), &[b, ch, l]).expect("x");
            let k = Tensor::from_host(&dev, &random(ch * l), &[ch, l]).expect("k");
            let mut y = Tensor::<f32>::zeros(&dev, &[b, ch, l]).expect("y");
            if 2 * l - 1 <= tessera_kernels::CONV_TENSOR_CORE_MAX {
                let xb = Tensor::from_host(&dev, &rng_bf16(n), &[b, ch, l]).expect("x bf16");
                let mut yb = Tensor::<tessera::bf16>::zeros(&dev, &[b, ch, l]).expect("y bf16");
                let conv = tessera_kernels::Conv1d::new(&dev, &xb, &k, tessera_kernels::ConvMode::Causal)
                    .path(tessera_kernels::ConvPath::TensorCore);
                let mut f = || conv.run(&mut yb).expect("conv1d long, tensor-core path");
                norm_row!(format!("conv1d causal tensor-core K{l} bf16 {b}x{ch}x{l}"), (2 * n * 2) as f64, time_ms(&dev, 3, 10, &mut f));
                // The filters' spectrum made once (`ConvSpectrum`), as a model's layer reuses it.
                let spectrum = conv.spectrum().expect("tensor-core spectrum");
                let conv = conv.with_spectrum(&spectrum);
                let mut f = || conv.run(&mut yb).expect("conv1d long, tensor-core path, spectrum kept");
                let ms = time_ms(&dev, 3, 10, &mut f);
                norm_row!(format!("conv1d causal tensor-core K{l} bf16 spectrum kept {b}x{ch}x{l}"), (2 * n * 2) as f64, ms);
                let t = std::time::Instant::now();
                for _ in 0..10 {
                    f();
                }
                let host = t.elapsed().as_secs_f64() * 1e5;
                dev.synchronize().expect("sync");
                println!("  (host time to enqueue one call: {host:.0} µs)");
            }
            let conv =
                tessera_kernels::Conv1d::new(&dev, &x, &k, tessera_kernels::ConvMode::Causal).path(tessera_kernels::ConvPath::Direct);
            if l > 2048 && l <= 4096 {
                let mut f = || conv.run(&mut y).expect("conv1d long");
                norm_row!(format!("conv1d causal direct K{l} f32 {b}x{ch}x{l}"), (2 * n * 4) as f64, time_ms(&dev, 1, 3, &mut f));
            }
            let conv = conv.path(tessera_kernels::ConvPath::Fft);
            let mut f = || conv.run(&mut y).expect("conv1d long, FFT path");
            norm_row!(format!("conv1d causal fft K{l} f32 {b}x{ch}x{l}"), (2 * n * 4) as f64, time_ms(&dev, 3, 10, &mut f));
            let spectrum = conv.spectrum().expect("cuFFT spectrum");
            let conv = conv.with_spectrum(&spectrum);
            let mut f = || conv.run(&mut y).expect("conv1d long, FFT path, spectrum kept");
            let ms = time_ms(&dev, 3, 10, &mut f);
            norm_row!(format!("conv1d causal fft K{l} f32 spectrum kept {b}x{ch}x{l}"), (2 * n * 4) as f64, ms);
            match python_baseline("TESSERA_TORCH_CONV_SCRIPT", "torch_conv.py", &[b, ch, l, l]) {
                Ok(lines) => {
                    if let Some(&(_, ms)) = lines.iter().find(|(name, _)| name == "fftconv") {
                        norm_row!(format!("  torch fftconv f32 {b}x{ch}x{l}"), (2 * n * 4) as f64, ms);
                    }
                }
                Err(why) => println!("memory_bound: no torch conv baseline: {why}"),
            }
        }
    }
    // Where the transform paths overtake the direct one (the `ConvPath::Auto` thresholds), by
    // filter length; only when asked (`TESSERA_BENCH_SCANS=convpaths`): 56 timings.
    if all && std::env::var("TESSERA_BENCH_SCANS").is_ok_and(|v| v.split(',').any(|p| p == "convpaths")) {
        use tessera_kernels::{Conv1d, ConvMode, ConvPath};
        for (b, ch, l) in [(8, 768, 2048), (2, 768, 8192)] {
            let n = b * ch * l;
            let x = Tensor::from_host(&dev, &random(n), &[b, ch, l]).expect("x");
            let xb = Tensor::from_host(&dev, &rng_bf16(n), &[b, ch, l]).expect("x bf16");
            let mut y = Tensor::<f32>::zeros(&dev, &[b, ch, l]).expect("y");
            let mut yb = Tensor::<tessera::bf16>::zeros(&dev, &[b, ch, l]).expect("y bf16");
            for taps in [8, 16, 32, 64, 128, 256, 512] {
                let k = Tensor::from_host(&dev, &random(ch * taps), &[ch, taps]).expect("k");
                for path in [ConvPath::Direct, ConvPath::TensorCore] {
                    let conv = Conv1d::new(&dev, &xb, &k, ConvMode::Causal).path(path);
                    let mut f = || conv.run(&mut yb).expect("conv1d bf16");
                    norm_row!(format!("conv1d paths {path:?} K{taps} bf16 {b}x{ch}x{l}"), (2 * n * 2) as f64, time_ms(&dev, 3, 10, &mut f));
                }
                for path in [ConvPath::Direct, ConvPath::Fft] {
                    let conv = Conv1d::new(&dev, &x, &k, ConvMode::Causal).path(path);
                    let mut f = || conv.run(&mut y).expect("conv1d f32");
                    norm_row!(format!("conv1d paths {path:?} K{taps} f32 {b}x{ch}x{l}"), (2 * n * 4) as f64, time_ms(&dev, 3, 10, &mut f));
                }
            }
        }
    }
    if all && part("selective") {
        use tessera::bf16;
        let (b, ch, n, l) = (8usize, 1536usize, 16usize, 4096usize);
        let mut t = |shape: &[usize]| Tensor::from_host(&dev, &rng_bf16(shape.iter().product()), shape).expect("bf16 input");
        let a = Tensor::from_host(&dev, &vec![-0.5f32; ch * n], &[ch, n]).expect("a");
        let dskip = Tensor::from_host(&dev, &vec![1.0f32; ch], &[ch]).expect("d");
        // u, delta, z, B, C, the backward's dout, y, the last state and the forward's bytes
        // at batch b, length l.
        let mut inputs = |b: usize, l: usize| {
            let (u, delta, z) = (t(&[b, ch, l]), t(&[b, ch, l]), t(&[b, ch, l]));
            let (bm, cm) = (t(&[b, 1, n, l]), t(&[b, 1, n, l]));
            let y = Tensor::<bf16>::zeros(&dev, &[b, ch, l]).expect("y");
            let h = Tensor::<f32>::zeros(&dev, &[b, ch, n]).expect("h");
            (u, delta, z, bm, cm, t(&[b, ch, l]), y, h, ((4 * b * ch * l + 2 * b * n * l) * 2) as f64)
        };
        let (u, delta, z, bm, cm, dout, mut y, mut h, bytes) = inputs(b, l);
        let scan = tessera_kernels::SelectiveScan::new(&dev, &u, &delta, &a, &bm, &cm).d(&dskip).z(&z).delta_softplus(true);
        let mut f = || scan.run(&mut y, &mut h).expect("selective scan");
        norm_row!(format!("selective_scan fwd {b}x{ch}x{l} N{n}"), bytes, time_ms(&dev, 3, 10, &mut f));
        let mamba = mamba_scan(b, ch, l, n);
        match &mamba {
            Ok((ms, _)) => norm_row!(format!("  mamba cuda fwd {b}x{ch}x{l} N{n}"), bytes, *ms),
            Err(why) => println!("memory_bound: no mamba selective scan baseline: {why}"),
        }
        // The backward (gradients allocated and zeroed in each call): u, delta, z, dout, B, C
        // read, du, ddelta, dz written (bf16), dB and dC added into (f32, per channel).
        let bwd_bytes_of = |b: usize, l: usize| ((7 * b * ch * l + 2 * b * n * l) * 2 + 2 * b * ch * n * l * 4 / ch) as f64;
        let bwd_bytes = bwd_bytes_of(b, l);
        let mut f = || drop(scan.backward(&dout).expect("selective scan backward"));
        norm_row!(format!("selective_scan bwd {b}x{ch}x{l} N{n}"), bwd_bytes, time_ms(&dev, 2, 5, &mut f));
        if let Ok((_, ms)) = mamba {
            // mamba's backward starts from its forward's saved chunk states; ours recomputes them.
            norm_row!(format!("  mamba cuda bwd {b}x{ch}x{l} N{n}"), bwd_bytes, ms);
        }
        // A training step's scan: forward then backward, recomputing the states or keeping
        // them (`run_saving`); mamba's two kernels' times added.
        let fb_bytes = bytes + bwd_bytes;
        let mut f = || {
            scan.run(&mut y, &mut h).expect("selective scan");
            drop(scan.backward(&dout).expect("selective scan backward"));
        };
        norm_row!(format!("selective_scan fwd+bwd {b}x{ch}x{l} N{n}"), fb_bytes, time_ms(&dev, 2, 5, &mut f));
        let mut f = || {
            let saved = scan.run_saving(&mut y, &mut h).expect("selective scan");
            drop(scan.backward_saved(&saved, &dout).expect("selective scan backward"));
        };
        norm_row!(format!("selective_scan fwd+bwd kept {b}x{ch}x{l} N{n}"), fb_bytes, time_ms(&dev, 2, 5, &mut f));
        if let Ok((fwd, bwd)) = mamba {
            norm_row!(format!("  mamba cuda fwd+bwd {b}x{ch}x{l} N{n}"), fb_bytes, fwd + bwd);
        }
        // A batch of one over a long prompt (prefill): 12 blocks of 128 channels, the sequence
        // split into segments across the GPU.
        let (b, l) = (1usize, 16384usize);
        let (u, delta, z, bm, cm, dout, mut y, mut h, bytes) = inputs(b, l);
        let scan = tessera_kernels::SelectiveScan::new(&dev, &u, &delta, &a, &bm, &cm).d(&dskip).z(&z).delta_softplus(true);
        let mut f = || scan.run(&mut y, &mut h).expect("selective scan");
        norm_row!(format!("selective_scan fwd {b}x{ch}x{l} N{n}"), bytes, time_ms(&dev, 3, 10, &mut f));
        let bwd_bytes = bwd_bytes_of(b, l);
        let mut f = || drop(scan.backward(&dout).expect("selective scan backward"));
        norm_row!(format!("selective_scan bwd {b}x{ch}x{l} N{n}"), bwd_bytes, time_ms(&dev, 2, 5, &mut f));
        match mamba_scan(b, ch, l, n) {
            Ok((fwd, bwd)) => {
                norm_row!(format!("  mamba cuda fwd {b}x{ch}x{l} N{n}"), bytes, fwd);
                norm_row!(format!("  mamba cuda bwd {b}x{ch}x{l} N{n}"), bwd_bytes, bwd);
            }
            Err(why) => println!("memory_bound: no mamba selective scan baseline: {why}"),
        }
    }
    // Causal linear attention (chunked), B 8, T 4096, H 16, D 128, bf16, beside
    // flash-linear-attention's `chunk_linear_attn` (and `chunk_simple_gla` for the decayed
    // form) in the same run (`benches/fla_linear_attn.py`): its I/O roofline reads q, k, v and
    // writes o once (the decay adds 4 bytes a step and head, β as many).
    if all && part("linear") {
        use tessera::bf16;
        let (b, t, h, d) = (8usize, 4096usize, 16usize, 128usize);
        let mut r = |shape: &[usize]| Tensor::from_host(&dev, &rng_bf16(shape.iter().product()), shape).expect("bf16 input");
        let (q, k, v) = (r(&[b, t, h, d]), r(&[b, t, h, d]), r(&[b, t, h, d]));
        let mut o = Tensor::<bf16>::zeros(&dev, &[b, t, h, d]).expect("o");
        let g = Tensor::from_host(&dev, &random(b * h * t).iter().map(|x| -0.3 * x.abs()).collect::<Vec<_>>(), &[b, h, t]).expect("g");
        let bytes = (4 * b * t * h * d * 2) as f64;
        let la = tessera_kernels::LinearAttention::new(&dev, &q, &k, &v);
        let mut f = || la.run(&mut o, None).expect("linear attention");
        norm_row!(format!("linear_attention fwd {b}x{t}x{h}x{d}"), bytes, time_ms(&dev, 3, 10, &mut f));
        let la = tessera_kernels::LinearAttention::new(&dev, &q, &k, &v).decay(&g).beta(&g);
        let mut f = || la.run(&mut o, None).expect("linear attention");
        norm_row!(
            format!("linear_attention fwd decay+beta {b}x{t}x{h}x{d}"),
            bytes + (2 * b * h * t * 4) as f64,
            time_ms(&dev, 3, 10, &mut f),
        );
        // Forward + backward (the gradients allocated in each call): the backward reads q, k,
        // v, dout and writes dq, dk, dv, so 11 tensors' bytes with the forward's.
        let dout = r(&[b, t, h, d]);
        let la = tessera_kernels::LinearAttention::new(&dev, &q, &k, &v);
        let mut f = || {
            la.run(&mut o, None).expect("linear attention");
            drop(la.backward(&dout, None).expect("linear attention backward"));
        };
        let bytes_fb = bytes * 11.0 / 4.0;
        norm_row!(format!("linear_attention fwd+bwd {b}x{t}x{h}x{d}"), bytes_fb, time_ms(&dev, 2, 5, &mut f));
        let la = tessera_kernels::LinearAttention::new(&dev, &q, &k, &v).decay(&g).beta(&g);
        let mut f = || {
            la.run(&mut o, None).expect("linear attention");
            drop(la.backward(&dout, None).expect("linear attention backward"));
        };
        norm_row!(format!("linear_attention fwd+bwd decay+beta {b}x{t}x{h}x{d}"), bytes_fb, time_ms(&dev, 2, 5, &mut f));
        // Per-channel gates (GLA): the gates (f32, as k) read besides q, k, v; a pass prepares
        // q and k.
        let gk = Tensor::from_host(&dev, &random(b * t * h * d).iter().map(|x| -0.1 * x.abs()).collect::<Vec<_>>(), &[b, t, h, d])
            .expect("gates");
        let la = tessera_kernels::LinearAttention::new(&dev, &q, &k, &v).gates(&gk);
        let mut f = || la.run(&mut o, None).expect("linear attention");
        norm_row!(format!("linear_attention fwd gates {b}x{t}x{h}x{d}"), bytes * 1.5, time_ms(&dev, 3, 10, &mut f));
        let mut f = || {
            la.run(&mut o, None).expect("linear attention");
            drop(la.backward(&dout, None).expect("linear attention backward"));
        };
        norm_row!(format!("linear_attention fwd+bwd gates {b}x{t}x{h}x{d}"), bytes_fb * 1.5, time_ms(&dev, 2, 5, &mut f));
        // The elu + 1 feature map on q and k (a pass that maps them first, one that takes
        // dq, dk through φ′ after the backward).
        let la = tessera_kernels::LinearAttention::new(&dev, &q, &k, &v).feature_map(tessera_kernels::FeatureMap::EluPlusOne);
        let mut f = || la.run(&mut o, None).expect("linear attention");
        norm_row!(format!("linear_attention fwd elu {b}x{t}x{h}x{d}"), bytes, time_ms(&dev, 3, 10, &mut f));
        let mut f = || {
            la.run(&mut o, None).expect("linear attention");
            drop(la.backward(&dout, None).expect("linear attention backward"));
        };
        norm_row!(format!("linear_attention fwd+bwd elu {b}x{t}x{h}x{d}"), bytes_fb, time_ms(&dev, 2, 5, &mut f));
        match python_baseline("TESSERA_FLA_SCRIPT", "fla_linear_attn.py", &[b, t, h, d]) {
            Ok(lines) => {
                for (name, ms) in lines {
                    let by = if name.contains("bwd") {
                        bytes_fb
                    } else if name.contains("vec") {
                        bytes * 1.5
                    } else {
                        bytes
                    };
                    norm_row!(format!("  fla {name} {b}x{t}x{h}x{d}"), by, ms);
                }
            }
            Err(why) => println!("memory_bound: no flash-linear-attention baseline: {why}"),
        }
    }
    // Mamba-2's SSD, B 8, L 4096, 32 heads of 64, d_state 128, one group, D, dt bias and
    // softplus, beside mamba-ssm's Triton `mamba_chunk_scan_combined` in the same run
    // (`benches/mamba_ssd.py`): its I/O roofline reads x, dt, B, C and writes y once; forward
    // + backward also reads dy and writes dx, ddt, dB, dC.
    if all && part("ssd") {
        use tessera::bf16;
        let (b, l, h, p, n) = (8usize, 4096usize, 32usize, 64usize, 128usize);
        let mut r = |shape: &[usize]| Tensor::from_host(&dev, &rng_bf16(shape.iter().product()), shape).expect("bf16 input");
        let (x, dt, bm, cm, dy) = (r(&[b, l, h, p]), r(&[b, l, h]), r(&[b, l, 1, n]), r(&[b, l, 1, n]), r(&[b, l, h, p]));
        let a = Tensor::from_host(&dev, &vec![-1.0f32; h], &[h]).expect("a");
        let d = Tensor::from_host(&dev, &vec![0.5f32; h], &[h]).expect("d");
        let mut y = Tensor::<bf16>::zeros(&dev, &[b, l, h, p]).expect("y");
        let io = |tensors: usize| ((tensors * b * l * h * p + 2 * b * l * n + b * l * h) * 2) as f64;
        let ssd = tessera_kernels::Ssd::new(&dev, &x, &dt, &a, &bm, &cm).d(&d).dt_bias(&d).dt_softplus(true);
        let mut f = || ssd.run(&mut y, None).expect("ssd");
        norm_row!(format!("ssd fwd {b}x{l}x{h}x{p} N{n}"), io(2), time_ms(&dev, 3, 10, &mut f));
        let mut f = || {
            ssd.run(&mut y, None).expect("ssd");
            drop(ssd.backward(&dy, None).expect("ssd backward"));
        };
        norm_row!(format!("ssd fwd+bwd {b}x{l}x{h}x{p} N{n}"), 2.0 * io(3), time_ms(&dev, 2, 5, &mut f));
        match python_baseline("TESSERA_MAMBA_SSD_SCRIPT", "mamba_ssd.py", &[b, l, h, p, n]) {
            Ok(lines) => {
                for (name, ms) in lines {
                    let by = if name.contains("bwd") { 2.0 * io(3) } else { io(2) };
                    norm_row!(format!("  mamba triton ssd {name} {b}x{l}x{h}x{p} N{n}"), by, ms);
                }
            }
            Err(why) => println!("memory_bound: no mamba SSD baseline: {why}"),
        }
    }
    // The selective scan's decode step (one token, the state updated in place) beside
    // mamba-ssm's Triton `selective_state_update` in the same run: f32 state read and written
    // once, bf16 x, dt, z, y, B, C, f32 A, D, dt bias; softplus on. The baseline is timed as
    // CUDA-graph replays (Python's launch would dominate); so is ours, on a stream of its own
    // (the default stream cannot be captured) with cudarc's cross-stream event tracking off
    // for its tensors (one stream: nothing to track, and a capture cannot wait on events
    // recorded before it).
    if all && part("selective") {
        use tessera::bf16;
        let ctx = dev.context().expect("a CUDA context").clone();
        // SAFETY: the tensors made while tracking is off live on `sdev`'s stream alone.
        unsafe { ctx.disable_event_tracking() };
        let sdev = Device::from_stream(ctx.new_stream().expect("a stream")).expect("a device on its own stream");
        for (b, ch, n) in [(64usize, 5120usize, 16usize), (8, 5120, 16), (64, 2048, 64)] {
            let mut t = |shape: &[usize]| Tensor::from_host(&sdev, &rng_bf16(shape.iter().product()), shape).expect("bf16 input");
            let (u, delta, z) = (t(&[b, ch, 1]), t(&[b, ch, 1]), t(&[b, ch, 1]));
            let (bm, cm) = (t(&[b, 1, n, 1]), t(&[b, 1, n, 1]));
            let a = Tensor::from_host(&sdev, &vec![-0.5f32; ch * n], &[ch, n]).expect("a");
            let dskip = Tensor::from_host(&sdev, &vec![1.0f32; ch], &[ch]).expect("d");
            let mut y = Tensor::<bf16>::zeros(&sdev, &[b, ch, 1]).expect("y");
            let mut state = Tensor::from_host(&sdev, &random(b * ch * n), &[b, ch, n]).expect("state");
            let bytes = (2 * b * ch * n * 4 + ch * n * 4 + 4 * b * ch * 2 + 2 * b * n * 2 + 2 * ch * 4) as f64;
            let s = tessera_kernels::SelectiveScan::new(&sdev, &u, &delta, &a, &bm, &cm)
                .d(&dskip)
                .z(&z)
                .delta_bias(&dskip)
                .delta_softplus(true);
            let mut f = || s.run_step(&mut state, &mut y).expect("selective scan step");
            norm_row!(format!("selective_scan step {b}x{ch} N{n} launched"), bytes, time_ms(&sdev, 10, 50, &mut f));
            match tessera::testing::time_graph_ms(&sdev, 10, 50, &mut f) {
                Ok(ms) => norm_row!(format!("selective_scan step {b}x{ch} N{n} graph"), bytes, ms),
                Err(e) => println!("memory_bound: no graph replay: {e:?}"),
            }
            match mamba_step(b, ch, n) {
                Ok(ms) => norm_row!(format!("  mamba triton step {b}x{ch} N{n} graph"), bytes, ms),
                Err(why) => println!("memory_bound: no mamba step baseline: {why}"),
            }
        }
        // SAFETY: as above; later tensors track their uses again.
        unsafe { ctx.enable_event_tracking() };
    }
    // Small shapes, where launch latency dominates: microseconds per call.
    let mut small: Vec<(String, f64)> = Vec::new();
    if all && !scans_only {
        use tessera::bf16;
        let (m, n) = (4usize, 4096usize);
        let xb = Tensor::from_host(&dev, &rng_bf16(m * n), &[m, n]).expect("x bf16");
        let wb = Tensor::from_host(&dev, &rng_bf16(n), &[n]).expect("w bf16");
        let mut yb = Tensor::<bf16>::zeros(&dev, &[m, n]).expect("y bf16");
        let us = 1e3 * time_ms(&dev, 20, 200, || tessera_kernels::rms_norm(&dev, &xb, Some(&wb), 1e-6, &mut yb).expect("rms_norm"));
        small.push((format!("rms_norm {m}x{n} bf16"), us));
        let us = 1e3 * time_ms(&dev, 20, 200, || tessera_kernels::layer_norm(&dev, &xb, Some(&wb), Some(&wb), 1e-5, &mut yb).expect("ln"));
        small.push((format!("layer_norm {m}x{n} bf16"), us));
        let stream = dev.stream().expect("a CUDA stream");
        let src = stream.clone_htod(&rng_bf16(m * n)).expect("src");
        let mut dst = stream.alloc_zeros::<bf16>(m * n).expect("dst");
        let us = 1e3 * time_ms(&dev, 20, 200, || stream.memcpy_dtod(&src, &mut dst).expect("copy"));
        small.push((format!("copy {m}x{n} bf16"), us));
    }
    let copy = rows[0].1 / rows[0].2 * 1e-6;
    println!("\nmemory_bound on {} ({M}x{N} f32; rms_norm in bf16)", dev.name());
    println!("{:<20} {:>10} {:>10} {:>10} {:>8}", "kernel", "MB", "ms", "GB/s", "x copy");
    for (name, bytes, ms) in &rows {
        let gbs = bytes / ms * 1e-6;
        println!("{name:<20} {:>10.0} {ms:>10.3} {gbs:>10.0} {:>8.2}", bytes / 1e6, gbs / copy);
    }
    println!("\nbf16: norms with weight (and bias), M x hidden; RoPE, batch x seq x heads x dim");
    for (name, bytes, ms) in &norm_rows {
        let gbs = bytes / ms * 1e-6;
        println!("{name:<44} {:>10.0} {ms:>10.3} {gbs:>10.0} {:>8.2}", bytes / 1e6, gbs / copy);
    }
    println!("\nsmall shapes (launch latency), microseconds per call");
    for (name, us) in &small {
        println!("{name:<24} {us:>8.1}");
    }
    common::write_report(&report);
}
