//! Pre-tunes GEMM shapes into the schedule cache, and exports or imports the cache file.
//!
//! ```text
//! cargo run --release --example tune -- --shapes 4096x4096x4096,128x4096x4096 [--dtype f16] [--kn]
//! cargo run --release --example tune -- --export schedules.sqlite
//! cargo run --release --example tune -- --import schedules.sqlite --list
//! ```
//!
//! The cache is `$TESSERA_CACHE_DIR/schedules.sqlite` (or `~/.cache/tessera/schedules.sqlite`).
//! Shapes are `MxNxK` or `BxMxNxK` (a batch). With `TESSERA_TUNE=replay` later, every process
//! on this machine runs the variants found here.

use tessera::{bf16, f16, Device, Error, Result, Tensor, TuneMode, Tuner};
use tessera_kernels::{gemm, BLayout, GemmElement};

fn usage(why: &str) -> Error {
    Error::Argument {
        kernel: "tune",
        arg: "command line".into(),
        expected: "--shapes MxNxK[,...] [--dtype bf16|f16] [--kn] [--export FILE] [--import FILE] [--list]".into(),
        found: why.into(),
    }
}

fn parse_shape(s: &str) -> Result<[usize; 4]> {
    let v: Vec<usize> = s.split('x').map(|p| p.parse().map_err(|_| usage(&format!("shape `{s}`")))).collect::<Result<_>>()?;
    match v[..] {
        [m, n, k] => Ok([1, m, n, k]),
        [b, m, n, k] => Ok([b, m, n, k]),
        _ => Err(usage(&format!("shape `{s}`"))),
    }
}

fn tune_one<T: GemmElement>(dev: &Device, [b, m, n, k]: [usize; 4], kn: bool, from: fn(f32) -> T) -> Result<()> {
    let lead = |r, c| if b == 1 { vec![r, c] } else { vec![b, r, c] };
    let mut u = tessera::testing::Uniform::new();
    let a = Tensor::from_host(dev, &u.vec(b * m * k, from), &lead(m, k))?;
    let bt = Tensor::from_host(dev, &u.vec(b * n * k, from), &if kn { lead(k, n) } else { lead(n, k) })?;
    let mut c = Tensor::<T>::zeros(dev, &lead(m, n))?;
    gemm(&a, &bt).b_layout(if kn { BLayout::KxN } else { BLayout::NxK }).run(dev, &mut c)?;
    dev.synchronize()
}

fn main() -> Result<()> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let value = |flag: &str| args.iter().position(|a| a == flag).and_then(|i| args.get(i + 1)).cloned();
    let mut tuner = Tuner::global();
    if tuner.cache().is_none() {
        return Err(usage("no cache file could be opened (see the warning above)"));
    }
    if let Some(path) = value("--import") {
        let n = tuner.cache().map(|c| c.import(path.as_ref())).transpose()?.unwrap_or(0);
        println!("imported {n} entries from {path}");
    }
    if let Some(shapes) = value("--shapes") {
        tuner.set_mode(TuneMode::Search);
        drop(tuner);
        let dev = Device::new(0)?;
        let kn = args.iter().any(|a| a == "--kn");
        for s in shapes.split(',') {
            let shape = parse_shape(s)?;
            match value("--dtype").as_deref().unwrap_or("bf16") {
                "bf16" => tune_one(&dev, shape, kn, bf16::from_f32)?,
                "f16" => tune_one(&dev, shape, kn, f16::from_f32)?,
                other => return Err(usage(&format!("dtype `{other}`"))),
            }
        }
        tuner = Tuner::global();
        for (key, choice) in tuner.decisions() {
            println!("{} → {}", key, choice.as_deref().unwrap_or("(default)"));
        }
    }
    let Some(cache) = tuner.cache() else { return Ok(()) };
    if args.iter().any(|a| a == "--list") {
        for e in cache.entries()? {
            let vs = e.default_us.map_or(String::new(), |d| format!(" (default {d:.1} µs)"));
            println!("{}: {} {:.1} µs{vs}, {} launches, {}", e.key, e.choice, e.best_us, e.launches, e.strategy);
        }
    }
    if let Some(path) = value("--export") {
        cache.export(path.as_ref())?;
        println!("exported {} entries to {path}", cache.entries()?.len());
    }
    println!("cache: {}", cache.path().display());
    Ok(())
}
