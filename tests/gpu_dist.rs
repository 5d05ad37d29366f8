//! `tessera::dist`: every collective against results computed on the host from the ranks'
//! inputs (fresh random data, odd sizes — 1, 7 and 1003 elements — every element type),
//! outputs poisoned before each call. Interpreter groups of 1–4 ranks, a thread a rank and one
//! thread driving all ranks in a group; on a GPU, NCCL with one rank (a machine of one GPU) and
//! a collective on a stream of its own beside a GEMM. Bad input: an error, never a hang.

mod common;

use std::time::Duration;
use tessera::dist::{group, Communicator, ReduceOp, UniqueId};
use tessera::testing::{gpu_or_skip, rel_error};
use tessera::{bf16, f16, Device, Element, Error, Tensor};

/// An element type with its conversions and the tolerance of one rounding of a reduction.
trait Elem: Element + Copy {
    fn from_f64(x: f64) -> Self;
    fn to_f64(self) -> f64;
    fn poison() -> Self;
    /// The relative error one rounding to this type may make.
    const TOL: f64;
    /// Random values that survive reductions of up to 4 ranks in this type.
    fn random(n: usize) -> Vec<Self> {
        common::random(n, -4.0, 4.0).into_iter().map(|x| Self::from_f64(f64::from(x))).collect()
    }
}

impl Elem for f32 {
    fn from_f64(x: f64) -> Self {
        x as f32
    }
    fn to_f64(self) -> f64 {
        f64::from(self)
    }
    fn poison() -> Self {
        f32::NAN
    }
    const TOL: f64 = 1e-6;
}
/// The 16-bit floats: through f32 both ways, NaN as the poison.
macro_rules! half_elem {
    ($t:ty, $tol:expr) => {
        impl Elem for $t {
            fn from_f64(x: f64) -> Self {
                <$t>::from_f64(x)
            }
            fn to_f64(self) -> f64 {
                f64::from(self.to_f32())
            }
            fn poison() -> Self {
                <$t>::NAN
            }
            const TOL: f64 = $tol;
        }
    };
}
half_elem!(bf16, 8e-3);
half_elem!(f16, 1e-3);
impl Elem for i32 {
    fn from_f64(x: f64) -> Self {
        x.round() as i32
    }
    fn to_f64(self) -> f64 {
        f64::from(self)
    }
    fn poison() -> Self {
        i32::MIN
    }
    const TOL: f64 = 0.0;
    fn random(n: usize) -> Vec<Self> {
        common::random(n, -1000.0, 1000.0).into_iter().map(|x| x as i32).collect()
    }
}

fn wide<T: Elem>(v: &[T]) -> Vec<f64> {
    v.iter().map(|x| x.to_f64()).collect()
}

fn reduce(op: ReduceOp, parts: &[Vec<f64>]) -> Vec<f64> {
    (0..parts[0].len())
        .map(|i| {
            let v = parts.iter().map(|p| p[i]);
            match op {
                ReduceOp::Sum => v.sum(),
                ReduceOp::Prod => v.product(),
                ReduceOp::Max => v.fold(f64::NEG_INFINITY, f64::max),
                ReduceOp::Min => v.fold(f64::INFINITY, f64::min),
                ReduceOp::Avg => v.sum::<f64>() / parts.len() as f64,
            }
        })
        .collect()
}

/// Asserts `got` is `want` within the type's rounding (exactly for integers).
fn close<T: Elem>(what: &str, got: &[T], want: &[f64]) {
    let got = wide(got);
    let err = rel_error(&got, want);
    let tol = if T::TOL == 0.0 { 0.0 } else { T::TOL * 4.0 };
    let head = |v: &[f64]| v.iter().take(4).map(|x| format!("{x:.4}")).collect::<Vec<_>>().join(", ");
    assert!(err <= tol, "{what} ({}): relative error {err:e} > {tol:e}: got [{}…], want [{}…]", T::DTYPE, head(&got), head(want));
}

/// Every collective on every rank of `comms`, one thread a rank (`threaded`) or all from this
/// thread inside groups; results against the host.
fn collectives<T: Elem>(comms: Vec<Communicator>, n: usize, threaded: bool) {
    let world = comms.len();
    let inputs: Vec<Vec<T>> = (0..world).map(|_| T::random(n)).collect();
    let ops: &[ReduceOp] =
        if T::DTYPE == tessera::DType::I32 { &[ReduceOp::Sum, ReduceOp::Max] } else { &[ReduceOp::Sum, ReduceOp::Max, ReduceOp::Avg] };
    let parts: Vec<Vec<f64>> = inputs.iter().map(|v| wide(v)).collect();
    // What each rank ends with, per step.
    type Outs<T> = Vec<(String, Vec<T>)>;
    let run = |c: &Communicator| -> tessera::Result<Outs<T>> {
        let dev = c.device();
        let r = c.rank();
        let x = Tensor::from_host(dev, &inputs[r], &[n])?;
        let mut outs = Vec::new();
        for &op in ops {
            let mut y = Tensor::full(dev, &[n], T::poison())?;
            c.all_reduce(&x, &mut y, op)?;
            outs.push((format!("all_reduce {op:?}"), y.to_host()?));
        }
        let mut g = Tensor::full(dev, &[world, n], T::poison())?;
        c.all_gather(&x, &mut g)?;
        outs.push(("all_gather".into(), g.to_host()?));
        // Reduce-scatter of the gathered rows: rank i gets the sum of everyone's row i.
        let mut part = Tensor::full(dev, &[n], T::poison())?;
        c.reduce_scatter(&g, &mut part, ReduceOp::Sum)?;
        outs.push(("reduce_scatter".into(), part.to_host()?));
        let mut b = Tensor::from_host(dev, &inputs[r], &[n])?;
        c.broadcast(&mut b, world - 1)?;
        outs.push(("broadcast".into(), b.to_host()?));
        let mut ring = Tensor::full(dev, &[n], T::poison())?;
        group(|| {
            c.send(&x, (r + 1) % world)?;
            c.recv(&mut ring, (r + world - 1) % world)
        })?;
        outs.push(("ring send/recv".into(), ring.to_host()?));
        let mut inplace = Tensor::from_host(dev, &inputs[r], &[n])?;
        c.all_reduce_in_place(&mut inplace, ReduceOp::Sum)?;
        outs.push(("all_reduce_in_place".into(), inplace.to_host()?));
        Ok(outs)
    };
    let results: Vec<Outs<T>> = if threaded {
        std::thread::scope(|s| {
            let run = &run;
            let hs: Vec<_> = comms.into_iter().map(|c| s.spawn(move || run(&c))).collect();
            hs.into_iter().map(|h| h.join().expect("rank thread").expect("rank's calls")).collect()
        })
    } else {
        // One thread: each step of every rank queued in one group, so that none waits first.
        step_by_step(&comms, &inputs, n, ops)
    };
    let gathered: Vec<f64> = parts.concat();
    for (r, outs) in results.iter().enumerate() {
        let mut it = outs.iter();
        for &op in ops {
            let (what, got) = it.next().expect("all_reduce");
            close(&format!("rank {r}/{world} {what}"), got, &reduce(op, &parts));
        }
        let want: Vec<(&str, Vec<f64>)> = vec![
            ("all_gather", gathered.clone()),
            ("reduce_scatter", reduce(ReduceOp::Sum, &vec![parts[r].clone(); world])),
            ("broadcast", parts[world - 1].clone()),
            ("ring send/recv", parts[(r + world - 1) % world].clone()),
            ("all_reduce_in_place", reduce(ReduceOp::Sum, &parts)),
        ];
        for ((name, want), (what, got)) in want.iter().zip(it) {
            assert_eq!(name, what);
            close(&format!("rank {r}/{world} {what}"), got, want);
        }
    }
}

/// [`collectives`]' steps driven from one thread: each step queued for every rank in a group.
fn step_by_step<T: Elem>(comms: &[Communicator], inputs: &[Vec<T>], n: usize, ops: &[ReduceOp]) -> Vec<Vec<(String, Vec<T>)>> {
    let world = comms.len();
    let dev = |r: usize| comms[r].device();
    let xs: Vec<Tensor<T>> = (0..world).map(|r| Tensor::from_host(dev(r), &inputs[r], &[n]).unwrap()).collect();
    let mut outs: Vec<Vec<(String, Vec<T>)>> = vec![Vec::new(); world];
    let fresh = |shape: &[usize]| -> Vec<Tensor<T>> { (0..world).map(|r| Tensor::full(dev(r), shape, T::poison()).unwrap()).collect() };
    let mut collect = |what: String, ts: &[Tensor<T>]| {
        for (r, t) in ts.iter().enumerate() {
            outs[r].push((what.clone(), t.to_host().unwrap()));
        }
    };
    for &op in ops {
        let mut ys = fresh(&[n]);
        group(|| comms.iter().zip(&xs).zip(ys.iter_mut()).try_for_each(|((c, x), y)| c.all_reduce(x, y, op))).unwrap();
        collect(format!("all_reduce {op:?}"), &ys);
    }
    let mut gs = fresh(&[world, n]);
    group(|| comms.iter().zip(&xs).zip(gs.iter_mut()).try_for_each(|((c, x), g)| c.all_gather(x, g))).unwrap();
    collect("all_gather".into(), &gs);
    let mut ps = fresh(&[n]);
    group(|| comms.iter().zip(&gs).zip(ps.iter_mut()).try_for_each(|((c, g), p)| c.reduce_scatter(g, p, ReduceOp::Sum))).unwrap();
    collect("reduce_scatter".into(), &ps);
    let mut bs: Vec<Tensor<T>> = (0..world).map(|r| Tensor::from_host(dev(r), &inputs[r], &[n]).unwrap()).collect();
    group(|| comms.iter().zip(bs.iter_mut()).try_for_each(|(c, b)| c.broadcast(b, world - 1))).unwrap();
    collect("broadcast".into(), &bs);
    let mut rings = fresh(&[n]);
    group(|| {
        for (r, (c, ring)) in comms.iter().zip(rings.iter_mut()).enumerate() {
            c.send(&xs[r], (r + 1) % world)?;
            c.recv(ring, (r + world - 1) % world)?;
        }
        Ok(())
    })
    .unwrap();
    collect("ring send/recv".into(), &rings);
    let mut ins: Vec<Tensor<T>> = (0..world).map(|r| Tensor::from_host(dev(r), &inputs[r], &[n]).unwrap()).collect();
    group(|| comms.iter().zip(ins.iter_mut()).try_for_each(|(c, t)| c.all_reduce_in_place(t, ReduceOp::Sum))).unwrap();
    collect("all_reduce_in_place".into(), &ins);
    outs
}

fn cpu_group(world: usize) -> Vec<Communicator> {
    let devs: Vec<Device> = (0..world).map(|_| Device::cpu_with_threads(1)).collect();
    Communicator::for_devices(&devs).unwrap().into_iter().map(|c| c.with_timeout(Duration::from_secs(60))).collect()
}

#[test]
fn interp_collectives_match_host_references() {
    for world in 1..=4 {
        for &n in &[1, 7, 1003] {
            for threaded in [true, false] {
                collectives::<f32>(cpu_group(world), n, threaded);
                collectives::<bf16>(cpu_group(world), n, threaded);
                collectives::<f16>(cpu_group(world), n, threaded);
                collectives::<i32>(cpu_group(world), n, threaded);
            }
        }
    }
}

#[test]
fn interp_ranks_join_by_id_from_their_own_threads() {
    let world = 3;
    let id = UniqueId::local();
    // The id travels as hex, as it would through an environment variable.
    let hex = id.to_hex();
    let sums: Vec<Vec<f32>> = std::thread::scope(|s| {
        let hs: Vec<_> = (0..world)
            .map(|r| {
                let hex = hex.clone();
                s.spawn(move || {
                    let id = UniqueId::from_hex(&hex).unwrap();
                    let dev = Device::cpu_with_threads(1);
                    let c = Communicator::for_rank(&dev, r, world, &id).unwrap();
                    assert_eq!((c.rank(), c.world_size()), (r, world));
                    let mut t = Tensor::from_host(&dev, &[r as f32 + 1.0, 10.0 * r as f32], &[2]).unwrap();
                    c.all_reduce_in_place(&mut t, ReduceOp::Sum).unwrap();
                    t.to_host().unwrap()
                })
            })
            .collect();
        hs.into_iter().map(|h| h.join().unwrap()).collect()
    });
    for s in sums {
        assert_eq!(s, vec![6.0, 30.0]);
    }
}

#[test]
fn interp_unique_id_round_trips_through_hex_and_a_file() {
    let id = UniqueId::local();
    assert_eq!(UniqueId::from_hex(&id.to_hex()).unwrap(), id);
    assert_eq!(UniqueId::from_bytes(id.as_bytes()).unwrap(), id);
    let path = std::env::temp_dir().join(format!("tessera-id-{}-{:?}", std::process::id(), std::thread::current().id()));
    let _ = std::fs::remove_file(&path);
    let reader = {
        let path = path.clone();
        std::thread::spawn(move || UniqueId::wait_for_file(&path, Duration::from_secs(20)))
    };
    std::thread::sleep(Duration::from_millis(50));
    id.publish(&path).unwrap();
    assert_eq!(reader.join().unwrap().unwrap(), id);
    let _ = std::fs::remove_file(&path);
    match UniqueId::wait_for_file(&path, Duration::from_millis(50)) {
        Err(Error::Timeout { .. }) => {}
        other => panic!("expected a timeout, got {other:?}"),
    }
}

#[test]
fn bad_input_dist_errors_name_the_argument() {
    let comms = cpu_group(2);
    let dev = comms[0].device().clone();
    let x = Tensor::from_host(&dev, &[1.0f32; 6], &[6]).unwrap();
    let msg = |e: Error| e.to_string();
    // Sizes that do not fit the call (checked before anything is queued: no rank waits).
    let mut y = Tensor::full(&dev, &[5], 0.0f32).unwrap();
    let e = msg(comms[0].all_reduce(&x, &mut y, ReduceOp::Sum).unwrap_err());
    assert!(e.contains("recv") && e.contains("6 elements") && e.contains("5 elements"), "{e}");
    let mut g = Tensor::full(&dev, &[6], 0.0f32).unwrap();
    let e = msg(comms[0].all_gather(&x, &mut g).unwrap_err());
    assert!(e.contains("2 × send's 6 elements"), "{e}");
    let mut p = Tensor::full(&dev, &[4], 0.0f32).unwrap();
    let e = msg(comms[0].reduce_scatter(&x, &mut p, ReduceOp::Sum).unwrap_err());
    assert!(e.contains("send's 6 elements / 2 ranks"), "{e}");
    let mut b = Tensor::from_host(&dev, &[1.0f32; 6], &[6]).unwrap();
    let e = msg(comms[0].broadcast(&mut b, 2).unwrap_err());
    assert!(e.contains("root") && e.contains("below 2"), "{e}");
    let e = msg(comms[0].send(&x, 7).unwrap_err());
    assert!(e.contains("peer") && e.contains('7'), "{e}");
    // A strided view.
    let m = Tensor::from_host(&dev, &[1.0f32; 12], &[3, 4]).unwrap();
    let col = m.view(&[3, 2], &[4, 1]).unwrap();
    let mut out = Tensor::full(&dev, &[6], 0.0f32).unwrap();
    let e = msg(comms[0].all_reduce(&col, &mut out, ReduceOp::Sum).unwrap_err());
    assert!(e.contains("dense") && e.contains("strides"), "{e}");
    // No devices; an NCCL-kind id for an interpreter device; a rank past the group.
    assert!(msg(Communicator::for_devices(&[]).unwrap_err()).contains("at least one device"));
    let mut nccl_like = [0u8; 128];
    nccl_like[0] = 2;
    let e = msg(Communicator::for_rank(&dev, 0, 2, &UniqueId::from_bytes(&nccl_like).unwrap()).unwrap_err());
    assert!(e.contains("UniqueId::local"), "{e}");
    let e = msg(Communicator::for_rank(&dev, 3, 2, &UniqueId::local()).unwrap_err());
    assert!(e.contains("rank") && e.contains('3'), "{e}");
    assert!(msg(UniqueId::from_hex("abc").unwrap_err()).contains("256 hexadecimal digits"));
    assert!(msg(UniqueId::from_bytes(&[0; 3]).unwrap_err()).contains("3 bytes"));
    // A GPU tensor on an interpreter group is refused without a GPU too: covered by the GPU
    // test below where there is one.
}

#[test]
fn bad_input_dist_ranks_that_disagree_get_an_error_not_a_hang() {
    // Sizes that differ across ranks: every rank learns it.
    let comms = cpu_group(2);
    let errs: Vec<String> = std::thread::scope(|s| {
        let hs: Vec<_> = comms
            .into_iter()
            .map(|c| {
                s.spawn(move || {
                    let n = 5 + c.rank();
                    let mut t = Tensor::full(c.device(), &[n], 1.0f32).unwrap();
                    c.all_reduce_in_place(&mut t, ReduceOp::Sum).unwrap_err().to_string()
                })
            })
            .collect();
        hs.into_iter().map(|h| h.join().unwrap()).collect()
    });
    for e in &errs {
        assert!(e.contains("disagree") && e.contains("5 f32") && e.contains("6 f32"), "{e}");
    }
    // A rank that never calls: the other times out, and the group is aborted.
    let comms: Vec<Communicator> = cpu_group(2).into_iter().map(|c| c.with_timeout(Duration::from_millis(200))).collect();
    let mut t = Tensor::full(comms[0].device(), &[3], 1.0f32).unwrap();
    let start = std::time::Instant::now();
    match comms[0].all_reduce_in_place(&mut t, ReduceOp::Sum) {
        Err(Error::Timeout { rank: Some(0), waiting, .. }) => assert!(waiting.contains("rank(s) [1]"), "{waiting}"),
        other => panic!("expected a timeout, got {other:?}"),
    }
    assert!(start.elapsed() < Duration::from_secs(10));
    let mut u = Tensor::full(comms[1].device(), &[3], 1.0f32).unwrap();
    let e = comms[1].all_reduce_in_place(&mut u, ReduceOp::Sum).unwrap_err().to_string();
    assert!(e.contains("aborted"), "{e}");
    // A receive with no sender.
    let comms: Vec<Communicator> = cpu_group(2).into_iter().map(|c| c.with_timeout(Duration::from_millis(100))).collect();
    let mut r = Tensor::full(comms[1].device(), &[3], 1.0f32).unwrap();
    match comms[1].recv(&mut r, 0) {
        Err(Error::Timeout { waiting, .. }) => assert!(waiting.contains("message from rank 0"), "{waiting}"),
        other => panic!("expected a timeout, got {other:?}"),
    }
}

/// Every collective on NCCL with one rank (what a machine of one GPU can run), both ways of
/// making the communicator, results against the host.
#[test]
fn gpu_nccl_collectives_one_rank() {
    let Some(dev) = gpu_or_skip("gpu_nccl_collectives_one_rank") else { return };
    if !tessera::dist::nccl_present() {
        assert!(std::env::var("TESSERA_REQUIRE_GPU").map_or(true, |v| v != "1"), "TESSERA_REQUIRE_GPU=1 but NCCL cannot be loaded");
        eprintln!("skipped gpu_nccl_collectives_one_rank: NCCL cannot be loaded");
        return;
    }
    eprintln!("NCCL {}", tessera::dist::nccl_version().unwrap());
    for &n in &[1, 7, 1003, (1 << 20) + 3] {
        collectives::<f32>(Communicator::for_devices(std::slice::from_ref(&dev)).unwrap(), n, true);
        collectives::<bf16>(Communicator::for_devices(std::slice::from_ref(&dev)).unwrap(), n, false);
        collectives::<f16>(vec![Communicator::for_rank(&dev, 0, 1, &UniqueId::new().unwrap()).unwrap().checked(true)], n, true);
        collectives::<i32>(vec![Communicator::for_rank(&dev, 0, 1, &UniqueId::new().unwrap()).unwrap()], n, false);
    }
    // A tensor of the CPU interpreter on a GPU communicator, and the other way round.
    let c = Communicator::for_devices(std::slice::from_ref(&dev)).unwrap().remove(0);
    let mut host = Tensor::full(&Device::cpu_with_threads(1), &[4], 1.0f32).unwrap();
    let e = c.all_reduce_in_place(&mut host, ReduceOp::Sum).unwrap_err().to_string();
    assert!(e.contains("CPU interpreter"), "{e}");
    let cpu = cpu_group(1).remove(0);
    let mut gpu = Tensor::full(&dev, &[4], 1.0f32).unwrap();
    let e = cpu.all_reduce_in_place(&mut gpu, ReduceOp::Sum).unwrap_err().to_string();
    assert!(e.contains("GPU tensor"), "{e}");
    let e = Communicator::for_devices(&[dev.clone(), dev.clone()]).unwrap_err().to_string();
    assert!(e.contains("twice"), "{e}");
    c.synchronize().unwrap();
}

/// A GEMM on the compute stream and an all-reduce on a stream of its own at the same time:
/// both right, and an all-reduce of the GEMM's own output waits for it (cudarc's events).
#[test]
fn gpu_nccl_overlaps_a_gemm() {
    let Some(dev) = gpu_or_skip("gpu_nccl_overlaps_a_gemm") else { return };
    if !tessera::dist::nccl_present() {
        assert!(std::env::var("TESSERA_REQUIRE_GPU").map_or(true, |v| v != "1"), "TESSERA_REQUIRE_GPU=1 but NCCL cannot be loaded");
        return;
    }
    let side = Device::from_stream(dev.context().unwrap().new_stream().unwrap()).unwrap();
    let c = Communicator::for_devices(std::slice::from_ref(&dev)).unwrap().remove(0).with_stream(&side).unwrap();
    let (m, n, k) = (1024, 1000, 512);
    let a: Vec<bf16> = common::random(m * k, -1.0, 1.0).into_iter().map(bf16::from_f32).collect();
    let b: Vec<bf16> = common::random(n * k, -1.0, 1.0).into_iter().map(bf16::from_f32).collect();
    let (at, bt) = (Tensor::from_host(&dev, &a, &[m, k]).unwrap(), Tensor::from_host(&dev, &b, &[n, k]).unwrap());
    let grad: Vec<f32> = common::random(1 << 22, -1.0, 1.0);
    let g = Tensor::from_host(&dev, &grad, &[1 << 22]).unwrap();
    let mut summed = Tensor::full(&dev, &[1 << 22], f32::NAN).unwrap();
    let mut out = Tensor::full(&dev, &[m, n], bf16::NAN).unwrap();
    // The independent all-reduce, then the GEMM, then an all-reduce of the GEMM's output.
    c.all_reduce(&g, &mut summed, ReduceOp::Sum).unwrap();
    tessera_kernels::gemm(&at, &bt).run(&dev, &mut out).unwrap();
    let mut reduced = Tensor::full(&dev, &[m, n], bf16::NAN).unwrap();
    c.all_reduce(&out, &mut reduced, ReduceOp::Sum).unwrap();
    c.synchronize().unwrap();
    close("overlapped all_reduce", &summed.to_host().unwrap(), &wide(&grad));
    let want: Vec<f64> = (0..m * n)
        .map(|idx| {
            let (i, j) = (idx / n, idx % n);
            (0..k).map(|p| f64::from(a[i * k + p].to_f32()) * f64::from(b[j * k + p].to_f32())).sum()
        })
        .collect();
    close("gemm then all_reduce of its output", &reduced.to_host().unwrap(), &want);
}

/// Three ranks sharing the one GPU (a stream each), staged through the host: every collective
/// as in a real group, a thread a rank and one thread in groups.
#[test]
fn gpu_simulated_group_shares_one_gpu() {
    let Some(dev) = gpu_or_skip("gpu_simulated_group_shares_one_gpu") else { return };
    let ctx = dev.context().unwrap().clone();
    let ranks = || -> Vec<Device> { (0..3).map(|_| Device::from_stream(ctx.new_stream().unwrap()).unwrap()).collect() };
    for &n in &[1, 1003, (1 << 18) + 5] {
        collectives::<f32>(Communicator::simulated(&ranks()).unwrap(), n, true);
        collectives::<bf16>(Communicator::simulated(&ranks()).unwrap(), n, false);
        collectives::<i32>(Communicator::simulated(&ranks()).unwrap(), n, true);
    }
    let comms = Communicator::simulated(&ranks()).unwrap();
    let mut host = Tensor::full(&Device::cpu_with_threads(1), &[4], 1.0f32).unwrap();
    let e = comms[0].all_reduce_in_place(&mut host, ReduceOp::Sum).unwrap_err().to_string();
    assert!(e.contains("CPU interpreter"), "{e}");
    assert!(Communicator::simulated(&[Device::cpu_with_threads(1)]).unwrap_err().to_string().contains("GPUs"));
}

/// A SwiGLU MLP split across a group (`tp_swiglu`): every rank's `y` against the float64 MLP
/// of the whole weights, from the bf16 values each rank was given.
fn tp_mlp_matches(comms: Vec<Communicator>, m: usize, hidden: usize, ffn: usize) {
    let world = comms.len();
    let rnd = |n: usize, s: f32| -> Vec<bf16> { common::random(n, -s, s).into_iter().map(bf16::from_f32).collect() };
    let (x, wg, wu, wd) = (rnd(m * hidden, 1.0), rnd(ffn * hidden, 0.2), rnd(ffn * hidden, 0.2), rnd(hidden * ffn, 0.2));
    let f = ffn / world;
    let ys: Vec<Vec<bf16>> = std::thread::scope(|s| {
        let hs: Vec<_> = comms
            .into_iter()
            .map(|c| {
                let (x, wg, wu, wd) = (&x, &wg, &wu, &wd);
                s.spawn(move || {
                    let (dev, r) = (c.device().clone(), c.rank());
                    // Rows r·f.. of the gate and up weights, the same columns of down.
                    let rows = |w: &[bf16]| w[r * f * hidden..(r + 1) * f * hidden].to_vec();
                    let cols: Vec<bf16> = (0..hidden).flat_map(|i| wd[i * ffn + r * f..i * ffn + (r + 1) * f].to_vec()).collect();
                    let t = |v: &[bf16], shape: &[usize]| Tensor::from_host(&dev, v, shape).unwrap();
                    let mut y = Tensor::full(&dev, &[m, hidden], bf16::NAN).unwrap();
                    tessera_kernels::tp::tp_swiglu(
                        &dev,
                        &c,
                        &t(x, &[m, hidden]),
                        &t(&rows(wg), &[f, hidden]),
                        &t(&rows(wu), &[f, hidden]),
                        &t(&cols, &[hidden, f]),
                        &mut y,
                    )
                    .unwrap();
                    y.to_host().unwrap()
                })
            })
            .collect();
        hs.into_iter().map(|h| h.join().unwrap()).collect()
    });
    let w = |v: &[bf16], i: usize| f64::from(v[i].to_f32());
    let mut want = vec![0.0; m * hidden];
    for i in 0..m {
        let h: Vec<f64> = (0..ffn)
            .map(|j| {
                let (g, u): (f64, f64) = (0..hidden)
                    .map(|p| (w(&x, i * hidden + p) * w(&wg, j * hidden + p), w(&x, i * hidden + p) * w(&wu, j * hidden + p)))
                    .fold((0.0, 0.0), |a, b| (a.0 + b.0, a.1 + b.1));
                g / (1.0 + (-g).exp()) * u
            })
            .collect();
        for o in 0..hidden {
            want[i * hidden + o] = (0..ffn).map(|j| h[j] * w(&wd, o * ffn + j)).sum();
        }
    }
    for (r, y) in ys.iter().enumerate() {
        let err = rel_error(&wide(y), &want);
        // bf16 intermediates (up, the gated product, each rank's partial y) and the sum.
        assert!(err < 2e-2, "tp_swiglu rank {r}/{world} M {m} H {hidden} F {ffn}: relative error {err:e}");
    }
}

#[test]
fn interp_tp_swiglu_matches_f64_mlp() {
    tp_mlp_matches(cpu_group(2), 19, 64, 128);
    tp_mlp_matches(cpu_group(1), 7, 64, 64);
}

#[test]
fn bad_input_tp_swiglu_names_the_weight() {
    let comms = cpu_group(1);
    let dev = comms[0].device().clone();
    let t = |shape: &[usize]| Tensor::full(&dev, shape, bf16::ONE).unwrap();
    let mut y = t(&[4, 64]);
    let e = tessera_kernels::tp::tp_swiglu(&dev, &comms[0], &t(&[4, 64]), &t(&[32, 64]), &t(&[32, 48]), &t(&[64, 32]), &mut y)
        .unwrap_err()
        .to_string();
    assert!(e.contains("w_up") && e.contains("[32, 48]"), "{e}");
    let e = tessera_kernels::tp::tp_swiglu(&dev, &comms[0], &t(&[4, 64]), &t(&[32, 64]), &t(&[32, 64]), &t(&[64, 16]), &mut y)
        .unwrap_err()
        .to_string();
    assert!(e.contains("w_down") && e.contains("[64, 32]"), "{e}");
}

#[test]
fn gpu_tp_swiglu_matches_f64_mlp() {
    let Some(dev) = gpu_or_skip("gpu_tp_swiglu_matches_f64_mlp") else { return };
    let ctx = dev.context().unwrap().clone();
    let ranks = |n: usize| -> Vec<Device> { (0..n).map(|_| Device::from_stream(ctx.new_stream().unwrap()).unwrap()).collect() };
    tp_mlp_matches(Communicator::simulated(&ranks(2)).unwrap(), 257, 512, 1536);
    tp_mlp_matches(Communicator::simulated(&ranks(4)).unwrap(), 100, 256, 1024);
    if tessera::dist::nccl_present() {
        tp_mlp_matches(Communicator::for_devices(std::slice::from_ref(&dev)).unwrap(), 129, 512, 1024);
    }
}

/// Ring attention at `world` ranks (zig-zag chunks of `chunk` rows for causal, an equal split
/// otherwise): every rank's rows of `o` and `lse` against float64 attention of the whole
/// sequence.
#[allow(clippy::too_many_arguments)]
fn ring_matches(comms: Vec<Communicator>, b: usize, h: usize, hk: usize, d: usize, chunk: usize, causal: bool) {
    use tessera_kernels::{
        ring::{ring_attention, ring_attention_backward},
        Attention,
    };
    let world = comms.len();
    let total = 2 * world * chunk;
    let rnd = |n: usize| -> Vec<bf16> { common::random(n, -1.0, 1.0).into_iter().map(bf16::from_f32).collect() };
    let (q, k, v) = (rnd(b * total * h * d), rnd(b * total * hk * d), rnd(b * total * hk * d));
    let dout = rnd(b * total * h * d);
    // Rank r's rows of the sequence: chunks r and 2·world − 1 − r (causal), or rows r·2c.. .
    let rows_of = |r: usize| -> Vec<usize> {
        let (a, z) = if causal { (r, 2 * world - 1 - r) } else { (2 * r, 2 * r + 1) };
        (a * chunk..(a + 1) * chunk).chain(z * chunk..(z + 1) * chunk).collect()
    };
    let pick = |x: &[bf16], heads: usize, rows: &[usize]| -> Vec<bf16> {
        (0..b)
            .flat_map(|bi| rows.iter().flat_map(move |&s| x[(bi * total + s) * heads * d..(bi * total + s + 1) * heads * d].to_vec()))
            .collect()
    };
    type Out = (Vec<bf16>, Vec<f32>, [Vec<bf16>; 3]);
    let outs: Vec<Out> = std::thread::scope(|s| {
        let hs: Vec<_> = comms
            .into_iter()
            .map(|c| {
                let (q, k, v, dout, rows_of, pick) = (&q, &k, &v, &dout, &rows_of, &pick);
                s.spawn(move || {
                    let dev = c.device().clone();
                    let rows = rows_of(c.rank());
                    let n = rows.len();
                    let t = |x: Vec<bf16>, heads: usize| Tensor::from_host(&dev, &x, &[b, n, heads, d]).unwrap();
                    let (qt, kt, vt) = (t(pick(q, h, &rows), h), t(pick(k, hk, &rows), hk), t(pick(v, hk, &rows), hk));
                    let mut o = Tensor::full(&dev, &[b, n, h, d], bf16::NAN).unwrap();
                    let mut lse = Tensor::full(&dev, &[b, h, n], f32::NAN).unwrap();
                    let opts = Attention::new().causal(causal);
                    ring_attention(&dev, &c, &opts, &qt, &kt, &vt, &mut o, &mut lse).unwrap();
                    let g = ring_attention_backward(&dev, &c, &opts, &qt, &kt, &vt, &o, &lse, &t(pick(dout, h, &rows), h)).unwrap();
                    let grads = [g.dq.to_host().unwrap(), g.dk.to_host().unwrap(), g.dv.to_host().unwrap()];
                    (o.to_host().unwrap(), lse.to_host().unwrap(), grads)
                })
            })
            .collect();
        hs.into_iter().map(|h| h.join().unwrap()).collect()
    });
    let dims = common::AttentionDims { b, sq: total, sk: total, h, hk, d };
    let at = |len: usize, heads: usize, bi: usize, s: usize, hh: usize| ((bi * len + s) * heads + hh) * d;
    let visible = common::causal_mask(causal, 0);
    let mods = common::ScoreMods { score: &common::unmodified, grad: &common::unit_grad, visible: &visible, dropout: None };
    let scale = 1.0 / (d as f64).sqrt();
    let (wo, wl) = common::attention_reference(dims, &at, scale, &mods, &wide(&q), &wide(&k), &wide(&v));
    let wg = common::attention_backward_reference(dims, &at, scale, &mods, &wide(&q), &wide(&k), &wide(&v), &wide(&dout));
    for (r, (o, lse, grads)) in outs.iter().enumerate() {
        let rows = rows_of(r);
        let n = rows.len();
        let want_o: Vec<f64> = (0..b)
            .flat_map(|bi| rows.iter().flat_map(move |&s| (0..h * d).map(move |x| at(total, h, bi, s, 0) + x)))
            .map(|i| wo[i])
            .collect();
        let err = rel_error(&wide(o), &want_o);
        assert!(err < 1e-2, "ring attention rank {r}/{world} causal {causal}: o relative error {err:e}");
        for bi in 0..b {
            for hh in 0..h {
                for (i, &s) in rows.iter().enumerate() {
                    let (got, want) = (f64::from(lse[(bi * h + hh) * n + i]), wl[(bi * h + hh) * total + s]);
                    assert!((got - want).abs() < 1e-2 * want.abs().max(1.0), "rank {r} lse [{bi}, {hh}, {s}]: {got} vs {want}");
                }
            }
        }
        // The gradients of this rank's rows, against the whole sequence's (the reference's
        // value and magnitude picked the same way).
        for ((name, got), (want, heads)) in ["dq", "dk", "dv"].iter().zip(grads).zip([(&wg[0], h), (&wg[1], hk), (&wg[2], hk)]) {
            let idx: Vec<usize> =
                (0..b).flat_map(|bi| rows.iter().flat_map(move |&s| (0..heads * d).map(move |x| at(total, heads, bi, s, 0) + x))).collect();
            let part = common::Grad {
                value: idx.iter().map(|&i| want.value[i]).collect(),
                magnitude: idx.iter().map(|&i| want.magnitude[i]).collect(),
            };
            let err = part.error(&wide(got));
            assert!(err < 2e-2, "ring attention backward rank {r}/{world} causal {causal}: {name} relative error {err:e}");
        }
    }
}

#[test]
fn interp_ring_attention_matches_f64_attention() {
    ring_matches(cpu_group(2), 2, 2, 1, 64, 13, true);
    ring_matches(cpu_group(3), 1, 2, 2, 64, 5, false);
    ring_matches(cpu_group(1), 1, 1, 1, 64, 9, true);
}

#[test]
fn gpu_ring_attention_matches_f64_attention() {
    let Some(dev) = gpu_or_skip("gpu_ring_attention_matches_f64_attention") else { return };
    let ctx = dev.context().unwrap().clone();
    let ranks = |n: usize| -> Vec<Device> { (0..n).map(|_| Device::from_stream(ctx.new_stream().unwrap()).unwrap()).collect() };
    ring_matches(Communicator::simulated(&ranks(2)).unwrap(), 2, 4, 2, 128, 300, true);
    ring_matches(Communicator::simulated(&ranks(4)).unwrap(), 1, 4, 4, 64, 129, true);
    ring_matches(Communicator::simulated(&ranks(3)).unwrap(), 1, 2, 1, 128, 200, false);
    if tessera::dist::nccl_present() {
        ring_matches(Communicator::for_devices(std::slice::from_ref(&dev)).unwrap(), 1, 4, 4, 128, 1000, true);
    }
}
