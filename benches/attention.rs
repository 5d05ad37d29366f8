//! FlashAttention forward TFLOP/s beside cuDNN's (PyTorch's scaled-dot-product attention,
//! `benches/attention_cudnn.py`, a child process on the same GPU in the same run, asked for
//! each shape right before ours is timed on it, so that both meet the same clocks; criterion's
//! sustained loop comes after both). TFLOP/s count 4·B·H·Sq·Sk·D, half of that when causal;
//! CUDA-event timing after warm-up, seven rounds in turn, the median of each side; bf16,
//! `[batch, heads, seq, dim]` as PyTorch takes it. The ratio is `attention()`'s, which like
//! cuDNN's inference forward (inputs without gradients) keeps no log-sum-exp;
//! `attention_with_lse`, timed in the same rounds, has a column of its own.
//!
//! Then the autotuner at head_dim 64 (K/V pipeline depth 2, 3 or 4; key blocks of 192, 160 or
//! 128): the default beside the variant a search picked, timed in alternating rounds (a
//! temporary cache unless `TESSERA_CACHE_DIR` is set).
//!
//! `cargo bench --bench attention` (prints a skip where there is no GPU; the baseline column
//! says why where PyTorch or cuDNN is missing). `TESSERA_CUDNN_SCRIPT` overrides the script's
//! path. `TESSERA_BENCH_ATTENTION=backward` times the backward alone instead
//! ([`tessera_kernels::attention_backward`] from a saved forward beside cuDNN's through
//! `torch.autograd.grad`, FLOPs counted as 2.5× the forward's; the default (dQ by reduce-adds)
//! and `deterministic(true)`, in turn). `TESSERA_BENCH_ATTENTION=mods` times the score and
//! mask modifiers beside the plain kernel in alternating rounds, forward and backward:
//! soft-capping and ALiBi against the same mask without them, and a 1024-key sliding window
//! against the plain causal kernel, both counted over the blocks each computes, and dropout
//! (0.1) against none (`TESSERA_BENCH_MODS=dropout` runs only the modifiers so named).
//! `TESSERA_BENCH_ATTENTION=wide` times head dims 96, 192 and 256 beside cuDNN, then head dim
//! 192's variants; `backward_wide` their backward (at these head dims both modes run the
//! same kernels: dQ takes its own walk). `TESSERA_BENCH_ATTENTION=varlen` times each variant of the packed kernel at head dim 128
//! (eight sequences of 4096 packed, causal and not), in alternating rounds.

use criterion::Criterion;
mod common;
use std::time::Duration;
use tessera::testing::{median, Uniform};
use tessera::{bf16, Device, Tensor};
use tessera_kernels::{Attention, AttentionLayout};

/// The shapes: batch 4, 16 heads, these sequence lengths, head dims and masks; with `wide`,
/// head dims 96, 192 and 256 (batch 2 at 256, as the cuDNN figures were taken).
fn shapes(wide: bool) -> Vec<(usize, usize, usize, usize, bool)> {
    let mut v = Vec::new();
    let (dims, lens) = dims_and_lengths(wide);
    for d in dims {
        for &s in lens {
            for causal in [false, true] {
                v.push((if d == 256 { 2 } else { 4 }, 16, s, d, causal));
            }
        }
    }
    v
}

/// The head dims and sequence lengths timed: 128 and 64 at 1K–16K, or with `wide` 96, 192 and
/// 256 at 2K and 8K; `TESSERA_BENCH_DIMS` (`96,192`) keeps only the head dims it names.
fn dims_and_lengths(wide: bool) -> (Vec<usize>, &'static [usize]) {
    let (dims, lens): (&[usize], &[usize]) = if wide { (&[96, 192, 256], &[2048, 8192]) } else { (&[128, 64], &[1024, 4096, 8192, 16384]) };
    let only: Vec<usize> =
        std::env::var("TESSERA_BENCH_DIMS").unwrap_or_default().split(',').filter_map(|d| d.trim().parse().ok()).collect();
    (dims.iter().copied().filter(|d| only.is_empty() || only.contains(d)).collect(), lens)
}

/// cuDNN through PyTorch: `benches/attention_cudnn.py` as a child process.
struct Cudnn(common::PyBaseline);

impl Cudnn {
    fn spawn() -> Result<Cudnn, String> {
        common::PyBaseline::spawn("TESSERA_CUDNN_SCRIPT", "attention_cudnn.py").map(Cudnn)
    }

    /// cuDNN's TFLOP/s on one shape, or why there is none.
    fn time(&mut self, shape: (usize, usize, usize, usize, bool)) -> Result<f64, String> {
        self.time_pass(shape, false)
    }

    /// cuDNN's forward (`bwd` false) or backward TFLOP/s on one shape, or why there is none.
    fn time_pass(&mut self, (b, h, s, d, causal): (usize, usize, usize, usize, bool), bwd: bool) -> Result<f64, String> {
        let pass = if bwd { " bwd" } else { "" };
        self.0.ask(&format!("{b} {h} {s} {d} {}{pass}", u8::from(causal)), 5)
    }
}

fn main() {
    let Ok(dev) = Device::new(0) else {
        println!("attention: skipped, no GPU");
        return;
    };
    common::temporary_tune_cache();
    match std::env::var("TESSERA_BENCH_ATTENTION").as_deref() {
        Ok("backward") => return backward(&dev, false),
        Ok("backward_wide") => return backward(&dev, true),
        Ok("mods") => return modifiers(&dev),
        Ok("varlen") => return varlen_variants(&dev),
        _ => {}
    }
    let wide = std::env::var("TESSERA_BENCH_ATTENTION").as_deref() == Ok("wide");
    let shapes = shapes(wide);
    let mut cudnn = Cudnn::spawn();
    let mut criterion = Criterion::default()
        .configure_from_args()
        .sample_size(10)
        .warm_up_time(Duration::from_millis(200))
        .measurement_time(Duration::from_millis(800));
    let mut rng = Uniform::new();
    let mut rows = Vec::new();
    // The JSON report (`target/tessera-bench/attention-<arch>.json`): each shape's rows as it is
    // timed, with the kernels they launched.
    let mut report = tessera::report::Report::new("attention", &dev);
    for &(b, h, s, d, causal) in &shapes {
        let shape = [b, h, s, d];
        let mut t = || Tensor::from_host(&dev, &rng.vec(b * h * s * d, bf16::from_f32), &shape).expect("input");
        let (q, k, v) = (t(), t(), t());
        let (mut o, mut o2) = (Tensor::<bf16>::zeros(&dev, &shape).expect("o"), Tensor::<bf16>::zeros(&dev, &shape).expect("o"));
        let mut lse = Tensor::<f32>::zeros(&dev, &[b, h, s]).expect("lse");
        let opts = Attention::new().layout(AttentionLayout::Bhsd).causal(causal);
        let mut ours = || tessera_kernels::attention(&dev, &opts, &q, &k, &v, &mut o).expect("attention");
        let mut ours_lse = || tessera_kernels::attention_with_lse(&dev, &opts, &q, &k, &v, &mut o2, &mut lse).expect("attention");
        let name = format!("b{b} h{h} s{s} d{d}{}", if causal { " causal" } else { "" });
        // cuDNN and ours in turn, seven rounds, the median of each (the clocks drift with the
        // load behind them, so neither side gets the cooler GPU); criterion's sustained loop
        // after both.
        let flop = 4.0 * (b * h * s * s * d) as f64 / if causal { 2.0 } else { 1.0 };
        let (mut base, mut mine, mut mine_lse) = (Vec::new(), Vec::new(), Vec::new());
        report.skip_launches();
        for _ in 0..7 {
            base.push(match &mut cudnn {
                Ok(c) => c.time((b, h, s, d, causal)),
                Err(why) => Err(why.clone()),
            });
            // As the script times cuDNN: 30 calls after 5 (10 left the ratio ±4% between runs).
            mine.push(flop / tessera::testing::time_ms(&dev, 5, 30, &mut ours).expect("timing") * 1e-9);
            mine_lse.push(flop / tessera::testing::time_ms(&dev, 5, 30, &mut ours_lse).expect("timing") * 1e-9);
        }
        let base = base.into_iter().collect::<Result<Vec<f64>, String>>().map(median);
        // Both passes ran in each round: each row's kernels are those of one more call of its
        // own, untimed.
        let record = |kernel: &str, tf: f64| record(kernel, &name, flop, tf, base.as_ref().ok().map(|v| ("cuDNN (torch)", *v)));
        let (plain, with_lse) =
            (record("attention forward", median(mine.clone())), record("attention forward + lse", median(mine_lse.clone())));
        report.skip_launches();
        ours();
        report.push(&dev, plain);
        ours_lse();
        report.push(&dev, with_lse);
        rows.push((name.clone(), base, median(mine), median(mine_lse)));
        criterion.bench_function(&format!("tessera attention {name}"), |bch| {
            bch.iter_custom(|it| {
                Duration::from_secs_f64(tessera::testing::time_ms(&dev, 0, it as usize, &mut ours).expect("timing") * 1e-3 * it as f64)
            })
        });
    }
    drop(cudnn);
    println!("\nattention bf16 forward on {} (TFLOP/s; baseline: cuDNN through PyTorch, same run)", dev.name());
    println!("| shape | cuDNN | tessera | × cuDNN | with lse | × cuDNN |");
    println!("|---|---|---|---|---|---|");
    for (name, base, ours, with_lse) in &rows {
        match base {
            Ok(v) => println!("| {name} | {v:.0} | {ours:.0} | {:.2} | {with_lse:.0} | {:.2} |", ours / v, with_lse / v),
            Err(_) => println!("| {name} | — | {ours:.0} | — | {with_lse:.0} | — |"),
        }
    }
    common::write_report(&report);
    if let Some((_, Err(why), ..)) = rows.iter().find(|r| r.1.is_err()) {
        println!("no cuDNN baseline: {why}");
    }
    if wide {
        if dims_and_lengths(true).0.contains(&192) {
            wide_variants(&dev, &mut rng);
        }
        return;
    }
    split_vs_unsplit(&dev, &mut rng);
    tuned_vs_default(&dev, &mut rng);
}

/// Head dim 192's variants (96- or 64-key blocks, two or three stages) against its default,
/// in alternating rounds, at B4 H16 N8192 causal and not.
fn wide_variants(dev: &Device, rng: &mut Uniform) {
    let (b, h, s, d) = (4, 16, 8192, 192);
    let shape = [b, h, s, d];
    let mut t = || Tensor::from_host(dev, &rng.vec(b * h * s * d, bf16::from_f32), &shape).expect("input");
    let (q, k, v) = (t(), t(), t());
    let mut o = Tensor::<bf16>::zeros(dev, &shape).expect("o");
    println!("\nhead dim 192 variants, b{b} h{h} s{s} (TFLOP/s, alternating rounds, median of 7)");
    println!("| variant | mask | TFLOP/s |");
    println!("|---|---|---|");
    for causal in [false, true] {
        let flop = 4.0 * (b * h * s * s * d) as f64 / if causal { 2.0 } else { 1.0 };
        let names = tessera_kernels::attention_variants::<bf16>(d, false);
        let mut times = vec![Vec::new(); names.len()];
        for _ in 0..7 {
            for (i, name) in names.iter().enumerate() {
                let opts = Attention::new().layout(AttentionLayout::Bhsd).causal(causal).variant(name);
                let mut run = || tessera_kernels::attention(dev, &opts, &q, &k, &v, &mut o).expect("attention");
                times[i].push(flop / tessera::testing::time_ms(dev, 5, 30, &mut run).expect("timing") * 1e-9);
            }
        }
        for (name, t) in names.iter().zip(times) {
            println!("| {name} | {} | {:.0} |", if causal { "causal" } else { "none" }, median(t));
        }
    }
}

/// The default launch (non-causal: the last wave's tiles split over key ranges when the
/// model of the wave says so) against `kv_splits(1)` (never split), in alternating rounds:
/// d128 at three lengths, and decoding (one query row, a long KV cache, grouped heads).
fn split_vs_unsplit(dev: &Device, rng: &mut Uniform) {
    println!("\nattention bf16 d128 non-causal on {}: default (split tail) vs kv_splits(1)", dev.name());
    println!("| shape | kv_splits(1) | default | × |");
    println!("|---|---|---|---|");
    for (b, h, hk, sq, sk) in
        [(4, 16, 16, 4096, 4096), (4, 16, 16, 8192, 8192), (4, 16, 16, 16384, 16384), (1, 32, 8, 1, 16384), (8, 32, 8, 1, 8192)]
    {
        let d = 128;
        let (qs, ks) = ([b, h, sq, d], [b, hk, sk, d]);
        let mut t = |shape: &[usize]| Tensor::from_host(dev, &rng.vec(shape.iter().product(), bf16::from_f32), shape).expect("input");
        let (q, k, v) = (t(&qs), t(&ks), t(&ks));
        let (mut o, mut o2) = (Tensor::<bf16>::zeros(dev, &qs).expect("o"), Tensor::<bf16>::zeros(dev, &qs).expect("o"));
        let opts = Attention::new().layout(AttentionLayout::Bhsd);
        let unsplit_opts = opts.kv_splits(1);
        let unsplit = || tessera_kernels::attention(dev, &unsplit_opts, &q, &k, &v, &mut o).expect("attention");
        let default = || tessera_kernels::attention(dev, &opts, &q, &k, &v, &mut o2).expect("attention");
        let (t1, t0) = tessera::testing::time_pair_ms(dev, 2, 10, 5, unsplit, default).expect("timing");
        let name = format!("b{b} h{h}/{hk} sq{sq} sk{sk}");
        if sq == 1 {
            println!("| {name} | {:.1} µs | {:.1} µs | {:.2} |", t1 * 1e3, t0 * 1e3, t1 / t0);
        } else {
            let flop = 4.0 * (b * h * sq * sk * d) as f64;
            println!("| {name} | {:.0} | {:.0} | {:.2} |", flop / t1 * 1e-9, flop / t0 * 1e-9, t1 / t0);
        }
    }
}

/// Per d64 shape: a search, then the default and the searched variant in alternating rounds.
fn tuned_vs_default(dev: &Device, rng: &mut Uniform) {
    use tessera::{TuneMode, Tuner};
    println!("\nattention bf16 d64 autotuned on {} (TFLOP/s; default vs the searched depth and key block)", dev.name());
    println!("| shape | default | tuned | × | tuned variant |");
    println!("|---|---|---|---|---|");
    for (s, causal) in [(1024, true), (4096, false), (4096, true), (16384, false)] {
        let (b, h, d) = (4, 16, 64);
        let shape = [b, h, s, d];
        let mut t = || Tensor::from_host(dev, &rng.vec(b * h * s * d, bf16::from_f32), &shape).expect("input");
        let (q, k, v) = (t(), t(), t());
        let mut o = Tensor::<bf16>::zeros(dev, &shape).expect("o");
        let mut lse = Tensor::<f32>::zeros(dev, &[b, h, s]).expect("lse");
        let opts = Attention::new().layout(AttentionLayout::Bhsd).causal(causal);
        Tuner::global().set_mode(TuneMode::Search);
        tessera_kernels::attention_with_lse(dev, &opts, &q, &k, &v, &mut o, &mut lse).expect("tuning attention");
        let needle = format!("shape=(4, 16, 1, {s}, {s}, 64);causal={causal}");
        let chosen = Tuner::global()
            .decisions()
            .into_iter()
            .find(|(key, _)| key.contains("op=attention") && key.contains(&needle))
            .and_then(|(_, v)| v)
            .unwrap_or_else(|| "(no decision)".into());
        let (mut o2, mut lse2) = (Tensor::<bf16>::zeros(dev, &shape).expect("o"), Tensor::<f32>::zeros(dev, &[b, h, s]).expect("lse"));
        let default = || {
            Tuner::global().set_mode(TuneMode::Off);
            tessera_kernels::attention_with_lse(dev, &opts, &q, &k, &v, &mut o, &mut lse).expect("attention")
        };
        let tuned = || {
            Tuner::global().set_mode(TuneMode::Replay);
            tessera_kernels::attention_with_lse(dev, &opts, &q, &k, &v, &mut o2, &mut lse2).expect("attention")
        };
        let (t_default, t_tuned) = tessera::testing::time_pair_ms(dev, 2, 10, 5, default, tuned).expect("timing");
        let flop = 4.0 * (b * h * s * s * d) as f64 / if causal { 2.0 } else { 1.0 };
        let name = format!("b{b} h{h} s{s} d{d}{}", if causal { " causal" } else { "" });
        let (td, tt) = (flop / t_default * 1e-9, flop / t_tuned * 1e-9);
        println!("| {name} | {td:.0} | {tt:.0} | {:.2} | {chosen} |", tt / td);
    }
    Tuner::global().set_mode(TuneMode::Replay);
}

/// A bf16 attention row of the JSON report: `tf` TFLOP/s over `flop`, against `base` (its
/// name and TFLOP/s) where there is one.
fn record(kernel: &str, shape: &str, flop: f64, tf: f64, base: Option<(&str, f64)>) -> tessera::report::Record {
    let r = tessera::report::Record::new("attention", kernel, shape, "bf16", flop / tf * 1e-9, "TFLOP/s", tf);
    match base {
        Some((name, v)) => r.against(name, v),
        None => r,
    }
}

/// The backward alone, beside cuDNN's in turn (seven rounds, the median of each): ours from a
/// saved forward (`attention_with_lse`), the gradients allocated in each call as a training
/// step would; FLOPs 2.5× the forward's (causal halved).
fn backward(dev: &Device, wide: bool) {
    let mut cudnn = Cudnn::spawn();
    let mut rng = Uniform::new();
    println!("\nattention bf16 backward on {} (TFLOP/s; baseline: cuDNN through PyTorch, same run)", dev.name());
    println!("| shape | cuDNN | tessera | × cuDNN | deterministic | × cuDNN |");
    println!("|---|---|---|---|---|---|");
    // The JSON report (`target/tessera-bench/attention_backward-<arch>.json`): both modes' rows,
    // each with the kernels of one more call of its own.
    let mut report = tessera::report::Report::new("attention_backward", dev);
    let (dims, lens) = dims_and_lengths(wide);
    for d in dims {
        for &s in lens {
            for causal in [false, true] {
                let (b, h) = (if d == 256 { 2 } else { 4 }, 16);
                let shape = [b, h, s, d];
                let mut t = || Tensor::from_host(dev, &rng.vec(b * h * s * d, bf16::from_f32), &shape).expect("input");
                let (q, k, v, dout) = (t(), t(), t(), t());
                let mut o = Tensor::<bf16>::zeros(dev, &shape).expect("o");
                let mut lse = Tensor::<f32>::zeros(dev, &[b, h, s]).expect("lse");
                let opts = Attention::new().layout(AttentionLayout::Bhsd).causal(causal);
                tessera_kernels::attention_with_lse(dev, &opts, &q, &k, &v, &mut o, &mut lse).expect("attention");
                let mut ours = || drop(tessera_kernels::attention_backward(dev, &opts, &q, &k, &v, &o, &lse, &dout).expect("backward"));
                let det = opts.deterministic(true);
                let mut ours_det = || drop(tessera_kernels::attention_backward(dev, &det, &q, &k, &v, &o, &lse, &dout).expect("backward"));
                let flop = 2.5 * 4.0 * (b * h * s * s * d) as f64 / if causal { 2.0 } else { 1.0 };
                let (mut base, mut mine, mut mine_det) = (Vec::new(), Vec::new(), Vec::new());
                for _ in 0..7 {
                    base.push(match &mut cudnn {
                        Ok(c) => c.time_pass((b, h, s, d, causal), true),
                        Err(why) => Err(why.clone()),
                    });
                    mine.push(flop / tessera::testing::time_ms(dev, 3, 10, &mut ours).expect("timing") * 1e-9);
                    mine_det.push(flop / tessera::testing::time_ms(dev, 3, 10, &mut ours_det).expect("timing") * 1e-9);
                }
                let name = format!("b{b} h{h} s{s} d{d}{}", if causal { " causal" } else { "" });
                let (ours_tf, det_tf) = (median(mine), median(mine_det));
                let base = base.into_iter().collect::<Result<Vec<f64>, String>>().map(median);
                match &base {
                    Ok(v) => println!("| {name} | {v:.0} | {ours_tf:.0} | {:.2} | {det_tf:.0} | {:.2} |", ours_tf / v, det_tf / v),
                    Err(why) => println!("| {name} | — ({why}) | {ours_tf:.0} | — | {det_tf:.0} | — |"),
                }
                let record =
                    |kernel: &str, tf: f64| record(kernel, &name, flop, tf, base.as_ref().ok().map(|v| ("cuDNN backward (torch)", *v)));
                let (fast, deterministic) = (record("attention backward", ours_tf), record("attention backward (deterministic)", det_tf));
                report.skip_launches();
                ours();
                report.push(dev, fast);
                ours_det();
                report.push(dev, deterministic);
            }
        }
    }
    common::write_report(&report);
}

/// The modifiers beside the plain kernel, forward and backward: the ratio of their times on
/// the same shape (softcap, ALiBi), and for the sliding window, TFLOP/s over the blocks each
/// kernel computes (forward: 128 queries × `BN` keys; backward, the default mode's dK/dV walk:
/// 128 keys × `8192 / d` queries, FLOPs 2.5× the forward's).
fn modifiers(dev: &Device) {
    let mut rng = Uniform::new();
    // `TESSERA_BENCH_MODS=dropout` times only the modifiers whose name contains it.
    let only = std::env::var("TESSERA_BENCH_MODS").unwrap_or_default();
    let mut rows = Vec::new();
    for d in [128, 64] {
        for s in [4096, 16384] {
            let (b, h) = (4, 16);
            let shape = [b, h, s, d];
            let mut t = || Tensor::from_host(dev, &rng.vec(b * h * s * d, bf16::from_f32), &shape).expect("input");
            let (q, k, v, dout) = (t(), t(), t(), t());
            let mut o = Tensor::<bf16>::zeros(dev, &shape).expect("o");
            let mut lse = Tensor::<f32>::zeros(dev, &[b, h, s]).expect("lse");
            let base = Attention::new().layout(AttentionLayout::Bhsd);
            // Blocks of `rows` × `cols` over `s`, `blocks(r0)` of them for the tile at r0.
            let block_flop = |rows: usize, cols: usize, blocks: &dyn Fn(usize) -> usize| {
                (0..s.div_ceil(rows)).map(|t| blocks(t * rows)).sum::<usize>() as f64 * (4 * rows * cols * d * b * h) as f64
            };
            // The forward's key blocks at these lengths (`key_block`'s choice): 160 keys at head
            // dim 128, 192 at 64; the backward's query blocks 8192 / d.
            let (bn, bq) = (if d == 128 { 160 } else { 192 }, 8192 / d);
            let window = 1024;
            let causal_fwd = |q0: usize| (q0 + 128).min(s).div_ceil(bn);
            let window_fwd = |q0: usize| (q0 + 128).min(s).div_ceil(bn) - (q0 + 1).saturating_sub(window) / bn;
            let causal_bwd = |k0: usize| s.div_ceil(bq) - k0 / bq;
            let window_bwd = |k0: usize| (k0 + 127 + window).min(s).div_ceil(bq) - k0 / bq;
            let flops = [
                (block_flop(128, bn, &causal_fwd), block_flop(128, bn, &window_fwd)),
                (2.5 * block_flop(128, bq, &causal_bwd), 2.5 * block_flop(128, bq, &window_bwd)),
            ];
            for (what, plain, modified, window_flops) in [
                ("softcap 30", base, base.softcap(30.0), None),
                ("softcap 30 causal", base.causal(true), base.causal(true).softcap(30.0), None),
                ("alibi causal", base.causal(true), base.causal(true).alibi(8.0), None),
                // The window's kernel on the plain causal mask's work (a prefix of one key).
                ("prefix 1 (no-op)", base.causal(true), base.causal(true).prefix(1), None),
                ("window 1024", base.causal(true), base.causal(true).sliding_window(window), Some(flops)),
                // Dropout (variant M 15, a Philox call per 16 probabilities) against none.
                ("dropout 0.1", base, base.dropout(0.1, 0x5eed, 1), None),
                ("dropout 0.1 causal", base.causal(true), base.causal(true).dropout(0.1, 0x5eed, 1), None),
            ] {
                if !only.is_empty() && !what.contains(only.as_str()) {
                    continue;
                }
                let (mut tp, mut tm, mut bp, mut bm) = (Vec::new(), Vec::new(), Vec::new(), Vec::new());
                for _ in 0..5 {
                    for (opts, times, bwd_times) in [(&plain, &mut tp, &mut bp), (&modified, &mut tm, &mut bm)] {
                        let mut run = || tessera_kernels::attention(dev, opts, &q, &k, &v, &mut o).expect("attention");
                        times.push(tessera::testing::time_ms(dev, 3, 10, &mut run).expect("timing"));
                        tessera_kernels::attention_with_lse(dev, opts, &q, &k, &v, &mut o, &mut lse).expect("attention");
                        let mut bwd =
                            || drop(tessera_kernels::attention_backward(dev, opts, &q, &k, &v, &o, &lse, &dout).expect("backward"));
                        bwd_times.push(tessera::testing::time_ms(dev, 3, 10, &mut bwd).expect("timing"));
                    }
                }
                let name = format!("s{s} d{d} {what}");
                for (pass, tp, tm, flop) in [
                    ("forward", median(tp), median(tm), window_flops.map(|f| f[0])),
                    ("backward", median(bp), median(bm), window_flops.map(|f| f[1])),
                ] {
                    rows.push(match flop {
                        Some((fp, fm)) => {
                            let (p, m) = (fp / tp * 1e-9, fm / tm * 1e-9);
                            format!("| {name} | {pass} | {tp:.3} | {tm:.3} | {:.2} | {p:.0} | {m:.0} | {:.2} |", tp / tm, m / p)
                        }
                        None => format!("| {name} | {pass} | {tp:.3} | {tm:.3} | {:.2} | | | |", tp / tm),
                    });
                }
            }
        }
    }
    println!("\nattention bf16 modifiers on {} (B4 H16; ms, and TFLOP/s over computed blocks for the window)", dev.name());
    println!("| shape | pass | plain | modified | × plain (time) | plain TFLOP/s | modified TFLOP/s | × plain (TFLOP/s) |");
    println!("|---|---|---|---|---|---|---|---|");
    rows.iter().for_each(|r| println!("{r}"));
}

/// Each packed-kernel variant at head dim 128, eight sequences of 4096, 16 heads, causal and
/// not: TFLOP/s, the median of five alternating rounds.
fn varlen_variants(dev: &Device) {
    let mut rng = Uniform::new();
    let (n, s, h, d) = (8, 4096, 16, 128);
    let total = n * s;
    let mut t = || Tensor::from_host(dev, &rng.vec(total * h * d, bf16::from_f32), &[total, h, d]).expect("input");
    let (q, k, v) = (t(), t(), t());
    let mut o = Tensor::<bf16>::zeros(dev, &[total, h, d]).expect("o");
    let mut lse = Tensor::<f32>::zeros(dev, &[h, total]).expect("lse");
    let cu: Vec<i32> = (0..=n).map(|i| (i * s) as i32).collect();
    let cu = Tensor::from_host(dev, &cu, &[n + 1]).expect("offsets");
    let names = tessera_kernels::attention_variants::<bf16>(d, true);
    println!("\npacked attention bf16 d{d} on {} (8 × {s}, H{h}; TFLOP/s)", dev.name());
    for causal in [false, true] {
        let flop = 4.0 * (n * h * s * s * d) as f64 / if causal { 2.0 } else { 1.0 };
        let mut times = vec![Vec::new(); names.len()];
        for _ in 0..5 {
            for (name, ts) in names.iter().zip(&mut times) {
                let opts = Attention::new().causal(causal).variant(name);
                let mut run = || tessera_kernels::attention_varlen(dev, &opts, &q, &k, &v, &mut o, &mut lse, &cu, &cu, s).expect("varlen");
                ts.push(tessera::testing::time_ms(dev, 3, 10, &mut run).expect("timing"));
            }
        }
        for (name, ts) in names.iter().zip(times) {
            println!("| causal={causal} | {name} | {:.0} |", flop / median(ts) * 1e-9);
        }
    }
}
