//! Times the attention forward on the shapes named on the command line, to take the kernel's
//! costs apart (per key block, per query tile, the last wave's):
//!
//! `cargo run --release --example attention_probe -- 4x16x4096x8192 4x16x4096x4096/s1 …`
//!
//! A shape is `BxHxSQxSK` (bf16, head_dim 128, `[batch, heads, seq, dim]`), then optionally
//! `c` (causal), `/sN` (`kv_splits(N)`), `/dD` (head_dim D) and `/b1` (also the backward; `/b2`
//! its deterministic mode). Each prints its time and TFLOP/s, and the time of
//! `attention_with_lse` (the log-sum-exp kept) on the same inputs: the best of three rounds of
//! 20 launches after warm-up, the two in turn; the backward its own line (FLOPs 2.5× the
//! forward's). Under a profiler, `ncu --kernel-name regex:attention_bwd_dkv --launch-count 1
//! ./attention_probe 4x16x8192x8192/b1` takes the dK/dV walk's first launch.

use tessera::testing::{time_ms, Uniform};
use tessera::{bf16, Device, Tensor};
use tessera_kernels::{attention, attention_backward, attention_with_lse, Attention, AttentionLayout};

struct Shape {
    b: usize,
    h: usize,
    sq: usize,
    sk: usize,
    d: usize,
    causal: bool,
    splits: Option<usize>,
    backward: usize,
}

fn parse(arg: &str) -> Option<Shape> {
    let mut parts = arg.split('/');
    let dims = parts.next()?;
    let causal = dims.ends_with('c');
    let n: Vec<usize> = dims.trim_end_matches('c').split('x').map(|x| x.parse().ok()).collect::<Option<_>>()?;
    let [b, h, sq, sk] = n[..] else { return None };
    let mut shape = Shape { b, h, sq, sk, d: 128, causal, splits: None, backward: 0 };
    for p in parts {
        let (key, value) = p.split_at(1);
        let value = value.parse().ok()?;
        match key {
            "s" => shape.splits = Some(value),
            "d" => shape.d = value,
            "b" if value <= 2 => shape.backward = value,
            _ => return None,
        }
    }
    Some(shape)
}

fn main() -> tessera::Result<()> {
    let dev = Device::new(0)?;
    let mut rng = Uniform::new();
    println!("| shape | µs | TFLOP/s | with lse µs |");
    println!("|---|---|---|---|");
    for arg in std::env::args().skip(1) {
        let Some(s) = parse(&arg) else {
            eprintln!("attention_probe: `{arg}` is not BxHxSQxSK[c][/sN][/dD][/b1|/b2]");
            std::process::exit(2);
        };
        let (qs, ks) = ([s.b, s.h, s.sq, s.d], [s.b, s.h, s.sk, s.d]);
        let mut t = |shape: &[usize]| Tensor::from_host(&dev, &rng.vec(shape.iter().product(), bf16::from_f32), shape);
        let (q, k, v) = (t(&qs)?, t(&ks)?, t(&ks)?);
        let mut o = Tensor::<bf16>::zeros(&dev, &qs)?;
        let mut opts = Attention::new().layout(AttentionLayout::Bhsd).causal(s.causal);
        if let Some(n) = s.splits {
            opts = opts.kv_splits(n);
        }
        let mut lse = Tensor::<f32>::scratch(&dev, &[s.b, s.h, s.sq])?;
        let (mut ms, mut ms_lse) = (f64::INFINITY, f64::INFINITY);
        for _ in 0..3 {
            ms = ms.min(time_ms(&dev, 3, 20, || attention(&dev, &opts, &q, &k, &v, &mut o).expect("attention"))?);
            ms_lse =
                ms_lse.min(time_ms(&dev, 3, 20, || attention_with_lse(&dev, &opts, &q, &k, &v, &mut o, &mut lse).expect("attention"))?);
        }
        let flop = 4.0 * (s.b * s.h * s.sq * s.sk * s.d) as f64 / if s.causal { 2.0 } else { 1.0 };
        println!("| {arg} | {:.1} | {:.0} | {:.1} |", ms * 1e3, flop / ms * 1e-9, ms_lse * 1e3);
        if s.backward > 0 {
            let opts = opts.deterministic(s.backward == 2);
            attention_with_lse(&dev, &opts, &q, &k, &v, &mut o, &mut lse)?;
            let dout = t(&qs)?;
            let mut bwd = f64::INFINITY;
            for _ in 0..3 {
                bwd = bwd.min(time_ms(&dev, 3, 20, || {
                    drop(attention_backward(&dev, &opts, &q, &k, &v, &o, &lse, &dout).expect("backward"));
                })?);
            }
            println!("| {arg} backward | {:.1} | {:.0} | |", bwd * 1e3, 2.5 * flop / bwd * 1e-9);
        }
    }
    Ok(())
}
