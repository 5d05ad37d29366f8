//! What the CPU interpreter reports where the GPU would hang or compute garbage: a pipeline
//! wait nothing can satisfy, a shared tile nothing wrote reaching memory, a shared buffer
//! overwritten while a TMA store still reads it. Each error names the kernel, the line, and
//! the barrier, ring or tensor.

mod common;

use tessera::{bf16, kernel, Device, Tensor};

/// The producer loads a stage but never commits it: the consumer's wait cannot complete.
#[kernel(warpgroups = 2, targets(sm_90a))]
fn forgets_commit(x: Global<bf16, 2>, y: Global<f32, 2>) {
    let ring = Smem::<bf16, 64, 64>::ring(2);
    let pipe = Pipeline::<2>::new(1);
    if warpgroup::id() == 0 {
        let s = pipe.acquire();
        tma::load(ring.at(s), x, [0, 0], pipe);
    } else {
        let mut acc = Tile::<f32, 64, 64>::zeros();
        let s = pipe.wait();
        mma_sync(acc, ring.at(s), ring.at(s));
        mma_wait(0);
        pipe.release(s);
        y.store([0, 0], acc);
    }
}

/// Two consumers are declared but only one releases: the producer's second lap waits forever.
#[kernel(warpgroups = 2, targets(sm_90a))]
fn one_release_short(x: Global<bf16, 2>, y: Global<f32, 2>) {
    let ring = Smem::<bf16, 64, 64>::ring(1);
    let pipe = Pipeline::<1>::new(2);
    if warpgroup::id() == 0 {
        for k in 0..2 {
            let s = pipe.acquire();
            tma::load(ring.at(s), x, [0, k * 64], pipe);
            pipe.commit(s);
        }
    } else {
        let mut acc = Tile::<f32, 64, 64>::zeros();
        for k in 0..2 {
            let s = pipe.wait();
            mma_sync(acc, ring.at(s), ring.at(s));
            mma_wait(0);
            pipe.release(s);
        }
        y.store([0, 0], acc);
    }
}

/// B's ring is never loaded; `store` decides whether the product reaches memory.
#[kernel(warpgroups = 2, targets(sm_90a))]
fn reads_unwritten(a: Global<bf16, 2>, c: Global<f32, 2>, store: i32) {
    let sa = Smem::<bf16, 64, 64>::ring(1);
    let sb = Smem::<bf16, 64, 64>::ring(1);
    let pipe = Pipeline::<1>::new(1);
    if warpgroup::id() == 0 {
        let s = pipe.acquire();
        tma::load(sa.at(s), a, [0, 0], pipe);
        pipe.commit(s);
    } else {
        let mut acc = Tile::<f32, 64, 64>::zeros();
        let s = pipe.wait();
        mma_sync(acc, sa.at(s), sb.at(s));
        mma_wait(0);
        pipe.release(s);
        if store == 1 {
            c.store([0, 0], acc);
        }
    }
}

/// Loads a 64-column ring from a 32-column `x`: TMA leaves the second panel unwritten (it
/// starts past `x`'s columns); `mask_cols(keep, 0.0)` replaces what it read past `keep`.
#[kernel(warpgroups = 2, targets(sm_90a))]
fn masks_unwritten(x: Global<f32, 2>, y: Global<f32, 2>, keep: i32) {
    let sx = Smem::<f32, 64, 64>::ring(1);
    let pipe = Pipeline::<1>::new(1);
    if warpgroup::id() == 0 {
        let s = pipe.acquire();
        tma::load(sx.at(s), x, [0, 0], pipe);
        pipe.commit(s);
    } else {
        let s = pipe.wait();
        let t = sx.at(s).load().mask_cols(keep, 0.0);
        pipe.release(s);
        y.store([0, 0], t);
    }
}

/// Rewrites the staging buffer before the first TMA store has finished reading it (when
/// `wait` is 0), or after `tma::store_wait(0)` (when it is 1).
#[kernel(targets(sm_90a))]
fn restages(x: Global<bf16, 2>, y: Global<bf16, 2>, wait: i32) {
    let sc = Smem::<bf16, 64, 64>::ring(1);
    let t: Tile<bf16, 64, 64> = x.load([0, 0]);
    sc.at(0).store(t);
    tma::store(y, [0, 0], sc.at(0));
    if wait == 1 {
        tma::store_wait(0);
    }
    sc.at(0).store(t * 2.0);
    tma::store(y, [64, 0], sc.at(0));
    tma::store_wait(0);
}

fn inputs(dev: &Device) -> (Tensor<bf16>, Tensor<f32>) {
    let x: Vec<bf16> = common::random(128 * 128, -1.0, 1.0).into_iter().map(bf16::from_f32).collect();
    (Tensor::from_host(dev, &x, &[128, 128]).unwrap(), Tensor::full(dev, &[64, 64], f32::NAN).unwrap())
}

#[test]
fn interp_deadlock_names_the_barrier_and_the_line() {
    let dev = Device::cpu();
    let (x, mut y) = inputs(&dev);
    let e = forgets_commit::launch(&dev, 1, &x, &mut y).unwrap_err().to_string();
    assert!(e.contains("`forgets_commit`") && e.contains("deadlock"), "{e}");
    assert!(e.contains("full barrier of stage 0 of pipeline `pipe`") && e.contains("let s = pipe.wait()"), "{e}");
    assert!(e.contains("warpgroup 0 has finished"), "{e}");
    println!("{e}");
    let e = one_release_short::launch(&dev, 1, &x, &mut y).unwrap_err().to_string();
    assert!(e.contains("empty barrier of stage 0 of pipeline `pipe`") && e.contains("let s = pipe.acquire()"), "{e}");
    assert!(e.contains("still expects 1 arrival"), "{e}");
}

#[test]
fn interp_unwritten_shared_memory_is_reported_where_it_is_stored() {
    let dev = Device::cpu();
    let (x, mut y) = inputs(&dev);
    let e = reads_unwritten::launch(&dev, 1, &x, &mut y, 1).unwrap_err().to_string();
    assert!(e.contains("`reads_unwritten`") && e.contains("c.store"), "{e}");
    assert!(e.contains("into `c`") && e.contains("ring `sb`") && e.contains("mma_sync"), "{e}");
    println!("{e}");
    // Garbage that never reaches memory is no error (the GPU's columns past an edge).
    reads_unwritten::launch(&dev, 1, &x, &mut y, 0).unwrap();
}

#[test]
fn interp_masked_unwritten_shared_memory_is_no_error() {
    let dev = Device::cpu();
    let x = Tensor::from_host(&dev, &common::random(64 * 32, -1.0, 1.0), &[64, 32]).unwrap();
    let mut y = Tensor::full(&dev, &[64, 64], f32::NAN).unwrap();
    masks_unwritten::launch(&dev, 1, &x, &mut y, 32).unwrap();
    let (xs, ys) = (x.to_host().unwrap(), y.to_host().unwrap());
    for r in 0..64 {
        assert_eq!(&ys[r * 64..][..32], &xs[r * 32..][..32], "row {r}");
        assert!(ys[r * 64 + 32..][..32].iter().all(|&v| v == 0.0), "row {r}: the masked columns are the fill");
    }
    // One column past what TMA wrote still reaches memory: an error naming the ring.
    let e = masks_unwritten::launch(&dev, 1, &x, &mut y, 33).unwrap_err().to_string();
    assert!(e.contains("`masks_unwritten`") && e.contains("ring `sx`"), "{e}");
}

#[test]
fn interp_rewriting_a_buffer_a_tma_store_reads_is_reported() {
    let dev = Device::cpu();
    let (x, _) = inputs(&dev);
    let mut y = Tensor::full(&dev, &[128, 64], bf16::NAN).unwrap();
    let e = restages::launch(&dev, 1, &x, &mut y, 0).unwrap_err().to_string();
    assert!(e.contains("ring `sc`") && e.contains("store_wait"), "{e}");
    restages::launch(&dev, 1, &x, &mut y, 1).unwrap();
    let (xs, ys) = (x.to_host().unwrap(), y.to_host().unwrap());
    for r in 0..128 {
        for c in 0..64 {
            let want = if r < 64 { xs[r * 128 + c] } else { bf16::from_f32(xs[(r - 64) * 128 + c].to_f32() * 2.0) };
            assert_eq!(ys[r * 64 + c], want, "y[{r}, {c}]");
        }
    }
}

#[test]
fn interp_cpu_device_says_what_it_is() {
    let dev = Device::cpu_with_threads(3);
    assert!(dev.is_cpu() && dev.name().contains("CPU interpreter (3 threads)"));
    let e = dev.stream().unwrap_err().to_string();
    assert!(e.contains("CPU interpreter"), "{e}");
}
