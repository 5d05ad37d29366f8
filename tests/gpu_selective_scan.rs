//! The selective scan (Mamba-1) forward against a float64 sequential recurrence on the host:
//! fresh random inputs, odd lengths (1, 7, 1000, 4099), d_state 16/32/64, grouped B and C,
//! with and without D, the gate, the delta bias, softplus and an initial state; outputs
//! poisoned before each launch. Short sequences also run as decode steps (`run_step`, the state
//! updated in place), which must give the same outputs and last state. On the GPU and, at
//! small sizes, in the interpreter.

mod common;

use common::random;
use tessera::testing::{gpu_or_skip, rel_error};
use tessera::{bf16, Device, Tensor};
use tessera_kernels::{SelectiveScan, SelectiveScanElement, SelectiveScanGrads};

#[derive(Clone, Copy, Debug)]
struct Case {
    batch: usize,
    channels: usize,
    groups: usize,
    states: usize,
    len: usize,
    extras: bool,
}

/// `y` and the last state, sequentially in f64.
#[allow(clippy::too_many_arguments)]
fn reference(
    c: Case, u: &[f64], delta: &[f64], a: &[f64], b: &[f64], cm: &[f64], d: &[f64], z: &[f64], bias: &[f64], h0: &[f64],
) -> (Vec<f64>, Vec<f64>) {
    let (bt, ch, g, n, l) = (c.batch, c.channels, c.groups, c.states, c.len);
    let mut y = vec![0.0; bt * ch * l];
    let mut h_last = vec![0.0; bt * ch * n];
    for bi in 0..bt {
        for di in 0..ch {
            let gi = di / (ch / g);
            let row = bi * ch + di;
            let mut h: Vec<f64> = (0..n).map(|k| if c.extras { h0[row * n + k] } else { 0.0 }).collect();
            for t in 0..l {
                let x = delta[row * l + t] + if c.extras { bias[di] } else { 0.0 };
                let dt = if c.extras { x.max(0.0) + (-x.abs()).exp().ln_1p() } else { x };
                let ut = u[row * l + t];
                let mut out = 0.0;
                for k in 0..n {
                    let s = ((bi * g + gi) * n + k) * l + t;
                    h[k] = (dt * a[di * n + k]).exp() * h[k] + dt * b[s] * ut;
                    out += cm[s] * h[k];
                }
                if c.extras {
                    out += d[di] * ut;
                    let zt = z[row * l + t];
                    out *= zt / (1.0 + (-zt).exp());
                }
                y[row * l + t] = out;
            }
            h_last[row * n..(row + 1) * n].copy_from_slice(&h);
        }
    }
    (y, h_last)
}

/// Fresh random inputs for a case, each as sent (`T` or f32) and as the reference reads it
/// (f64 of the same values).
struct Inputs<T> {
    u: (Vec<T>, Vec<f64>),
    delta: (Vec<T>, Vec<f64>),
    b: (Vec<T>, Vec<f64>),
    cm: (Vec<T>, Vec<f64>),
    z: (Vec<T>, Vec<f64>),
    dout: (Vec<T>, Vec<f64>),
    a: (Vec<f32>, Vec<f64>),
    d: (Vec<f32>, Vec<f64>),
    bias: (Vec<f32>, Vec<f64>),
    h0: (Vec<f32>, Vec<f64>),
}

impl<T: Copy> Inputs<T> {
    fn new(c: Case, to: fn(f32) -> T, from: fn(T) -> f64) -> Self {
        let (bt, ch, g, n, l) = (c.batch, c.channels, c.groups, c.states, c.len);
        let gen = |len: usize, lo: f32, hi: f32| -> (Vec<T>, Vec<f64>) {
            let x: Vec<T> = random(len, lo, hi).into_iter().map(to).collect();
            let w = x.iter().map(|&v| from(v)).collect();
            (x, w)
        };
        let f32s = |len: usize, lo: f32, hi: f32| -> (Vec<f32>, Vec<f64>) {
            let x = random(len, lo, hi);
            let w = x.iter().map(|&v| f64::from(v)).collect();
            (x, w)
        };
        Inputs {
            u: gen(bt * ch * l, -1.0, 1.0),
            // Raw step sizes: small positive without softplus, around 0 with it.
            delta: if c.extras { gen(bt * ch * l, -3.0, 1.0) } else { gen(bt * ch * l, 0.001, 0.1) },
            b: gen(bt * g * n * l, -1.0, 1.0),
            cm: gen(bt * g * n * l, -1.0, 1.0),
            z: gen(bt * ch * l, -2.0, 2.0),
            dout: gen(bt * ch * l, -1.0, 1.0),
            a: f32s(ch * n, -2.0, -0.1),
            d: f32s(ch, -1.0, 1.0),
            bias: f32s(ch, -1.0, 0.0),
            h0: f32s(bt * ch * n, -1.0, 1.0),
        }
    }
}

fn check<T: SelectiveScanElement>(dev: &Device, c: Case, to: fn(f32) -> T, from: fn(T) -> f64, tol: f64) {
    let (bt, ch, g, n, l) = (c.batch, c.channels, c.groups, c.states, c.len);
    let x = Inputs::new(c, to, from);
    let (u, delta, z, b, cm, a, d, bias, h0) = (&x.u.0, &x.delta.0, &x.z.0, &x.b.0, &x.cm.0, &x.a.0, &x.d.0, &x.bias.0, &x.h0.0);
    let t = |x: &[T], s: &[usize]| Tensor::from_host(dev, x, s).unwrap();
    let tf = |x: &[f32], s: &[usize]| Tensor::from_host(dev, x, s).unwrap();
    let (ut, dt, zt) = (t(u, &[bt, ch, l]), t(delta, &[bt, ch, l]), t(z, &[bt, ch, l]));
    let (bt_, ct) = (t(b, &[bt, g, n, l]), t(cm, &[bt, g, n, l]));
    let (at, dst, biast, h0t) = (tf(a, &[ch, n]), tf(d, &[ch]), tf(bias, &[ch]), tf(h0, &[bt, ch, n]));
    let mut y = Tensor::full(dev, &[bt, ch, l], to(f32::NAN)).unwrap();
    let mut h_last = Tensor::full(dev, &[bt, ch, n], f32::NAN).unwrap();
    let mut s = SelectiveScan::new(dev, &ut, &dt, &at, &bt_, &ct);
    if c.extras {
        s = s.d(&dst).z(&zt).delta_bias(&biast).delta_softplus(true).initial_state(&h0t);
    }
    s.run(&mut y, &mut h_last).unwrap_or_else(|e| panic!("{c:?}: {e}"));
    let (want_y, want_h) = reference(c, &x.u.1, &x.delta.1, &x.a.1, &x.b.1, &x.cm.1, &x.d.1, &x.z.1, &x.bias.1, &x.h0.1);
    let got_y: Vec<f64> = y.to_host().unwrap().into_iter().map(from).collect();
    let got_h: Vec<f64> = h_last.to_host().unwrap().into_iter().map(f64::from).collect();
    let (ey, eh) = (rel_error(&got_y, &want_y), rel_error(&got_h, &want_h));
    assert!(ey < tol && eh < tol, "{c:?} {}: y relative error {ey}, last state {eh}", std::any::type_name::<T>());
    // Without the last state: the same kernels, so the same bits of y.
    let mut y_only = Tensor::full(dev, &[bt, ch, l], to(f32::NAN)).unwrap();
    s.run_y(&mut y_only).unwrap_or_else(|e| panic!("{c:?} run_y: {e}"));
    let bits = |t: &Tensor<T>| -> Vec<u64> { t.to_host().unwrap().into_iter().map(|v| from(v).to_bits()).collect() };
    assert!(bits(&y_only) == bits(&y), "{c:?} {}: run_y's y differs from run's", std::any::type_name::<T>());
    if l > 8 {
        return;
    }
    // The same sequence as `l` decode steps, the state updated in place from h0 (or zeros).
    let at_t = |x: &[T], rows: usize, t: usize| -> Vec<T> { (0..rows).map(|r| x[r * l + t]).collect() };
    let mut state = tf(&if c.extras { h0.clone() } else { vec![0.0; bt * ch * n] }, &[bt, ch, n]);
    let mut got_y = vec![0.0; bt * ch * l];
    for step in 0..l {
        let (ut, dt, zt) = (
            t(&at_t(u, bt * ch, step), &[bt, ch, 1]),
            t(&at_t(delta, bt * ch, step), &[bt, ch, 1]),
            t(&at_t(z, bt * ch, step), &[bt, ch, 1]),
        );
        let (bt_, ct) = (t(&at_t(b, bt * g * n, step), &[bt, g, n, 1]), t(&at_t(cm, bt * g * n, step), &[bt, g, n, 1]));
        let mut y = Tensor::full(dev, &[bt, ch, 1], to(f32::NAN)).unwrap();
        let mut s = SelectiveScan::new(dev, &ut, &dt, &at, &bt_, &ct);
        if c.extras {
            s = s.d(&dst).z(&zt).delta_bias(&biast).delta_softplus(true);
        }
        s.run_step(&mut state, &mut y).unwrap_or_else(|e| panic!("{c:?} step {step}: {e}"));
        for (r, v) in y.to_host().unwrap().into_iter().enumerate() {
            got_y[r * l + step] = from(v);
        }
    }
    let got_h: Vec<f64> = state.to_host().unwrap().into_iter().map(f64::from).collect();
    let (ey, eh) = (rel_error(&got_y, &want_y), rel_error(&got_h, &want_h));
    assert!(ey < tol && eh < tol, "{c:?} {} decode steps: y relative error {ey}, last state {eh}", std::any::type_name::<T>());
}

/// The gradients of the scan by reverse-mode differentiation of the sequential recurrence in
/// f64 (the forward's states kept, then a walk back in time): `(du, ddelta, da, db, dc, dd, dz,
/// dbias)`, the gradient of the last state taken as zero.
#[allow(clippy::too_many_arguments, clippy::type_complexity)]
fn reference_backward(
    c: Case, u: &[f64], delta: &[f64], a: &[f64], b: &[f64], cm: &[f64], d: &[f64], z: &[f64], bias: &[f64], h0: &[f64], dout: &[f64],
) -> [Vec<f64>; 8] {
    let (bt, ch, g, n, l) = (c.batch, c.channels, c.groups, c.states, c.len);
    let (mut du, mut ddelta, mut dz) = (vec![0.0; bt * ch * l], vec![0.0; bt * ch * l], vec![0.0; bt * ch * l]);
    let (mut da, mut db, mut dc) = (vec![0.0; ch * n], vec![0.0; bt * g * n * l], vec![0.0; bt * g * n * l]);
    let (mut dd, mut dbias) = (vec![0.0; ch], vec![0.0; ch]);
    let sigmoid = |x: f64| 1.0 / (1.0 + (-x).exp());
    for bi in 0..bt {
        for di in 0..ch {
            let gi = di / (ch / g);
            let row = bi * ch + di;
            let s = |k: usize, t: usize| ((bi * g + gi) * n + k) * l + t;
            // Forward, keeping x, Δ, the states before and after each step and y.
            let mut h: Vec<f64> = (0..n).map(|k| if c.extras { h0[row * n + k] } else { 0.0 }).collect();
            let (mut xs, mut dts, mut ys) = (vec![0.0; l], vec![0.0; l], vec![0.0; l]);
            let (mut before, mut after) = (vec![vec![0.0; n]; l], vec![vec![0.0; n]; l]);
            for t in 0..l {
                let x = delta[row * l + t] + if c.extras { bias[di] } else { 0.0 };
                let dt = if c.extras { x.max(0.0) + (-x.abs()).exp().ln_1p() } else { x };
                before[t].clone_from(&h);
                let mut y = if c.extras { d[di] * u[row * l + t] } else { 0.0 };
                for k in 0..n {
                    h[k] = (dt * a[di * n + k]).exp() * h[k] + dt * b[s(k, t)] * u[row * l + t];
                    y += cm[s(k, t)] * h[k];
                }
                after[t].clone_from(&h);
                (xs[t], dts[t], ys[t]) = (x, dt, y);
            }
            // Back in time: `gn[k]` carries a_{t+1}·g_{t+1}.
            let mut gn = vec![0.0; n];
            for t in (0..l).rev() {
                let (ut, dt, go) = (u[row * l + t], dts[t], dout[row * l + t]);
                let dy = if c.extras {
                    let zt = z[row * l + t];
                    let sg = sigmoid(zt);
                    dz[row * l + t] = go * ys[t] * sg * (1.0 + zt * (1.0 - sg));
                    go * zt * sg
                } else {
                    go
                };
                let mut dut = if c.extras { d[di] * dy } else { 0.0 };
                dd[di] += dy * ut;
                let mut ddt = 0.0;
                for k in 0..n {
                    let ak = (dt * a[di * n + k]).exp();
                    let gk = cm[s(k, t)] * dy + gn[k];
                    dc[s(k, t)] += dy * after[t][k];
                    db[s(k, t)] += gk * dt * ut;
                    dut += gk * dt * b[s(k, t)];
                    ddt += gk * (b[s(k, t)] * ut + a[di * n + k] * ak * before[t][k]);
                    da[di * n + k] += gk * dt * ak * before[t][k];
                    gn[k] = ak * gk;
                }
                let dx = if c.extras { ddt * sigmoid(xs[t]) } else { ddt };
                du[row * l + t] = dut;
                ddelta[row * l + t] = dx;
                dbias[di] += dx;
            }
        }
    }
    [du, ddelta, da, db, dc, dd, dz, dbias]
}

fn check_backward<T: SelectiveScanElement>(dev: &Device, c: Case, to: fn(f32) -> T, from: fn(T) -> f64, tol: f64) {
    let (bt, ch, g, n, l) = (c.batch, c.channels, c.groups, c.states, c.len);
    let x = Inputs::new(c, to, from);
    let t = |x: &[T], s: &[usize]| Tensor::from_host(dev, x, s).unwrap();
    let tf = |x: &[f32], s: &[usize]| Tensor::from_host(dev, x, s).unwrap();
    let (ut, dt, zt, gt) = (t(&x.u.0, &[bt, ch, l]), t(&x.delta.0, &[bt, ch, l]), t(&x.z.0, &[bt, ch, l]), t(&x.dout.0, &[bt, ch, l]));
    let (bt_, ct) = (t(&x.b.0, &[bt, g, n, l]), t(&x.cm.0, &[bt, g, n, l]));
    let (at, dst, biast, h0t) = (tf(&x.a.0, &[ch, n]), tf(&x.d.0, &[ch]), tf(&x.bias.0, &[ch]), tf(&x.h0.0, &[bt, ch, n]));
    let mut s = SelectiveScan::new(dev, &ut, &dt, &at, &bt_, &ct);
    if c.extras {
        s = s.d(&dst).z(&zt).delta_bias(&biast).delta_softplus(true).initial_state(&h0t);
    }
    let want = reference_backward(c, &x.u.1, &x.delta.1, &x.a.1, &x.b.1, &x.cm.1, &x.d.1, &x.z.1, &x.bias.1, &x.h0.1, &x.dout.1);
    let wide_t = |x: &Tensor<T>| -> Vec<f64> { x.to_host().unwrap().into_iter().map(from).collect() };
    let wide_f = |x: &Tensor<f32>| -> Vec<f64> { x.to_host().unwrap().into_iter().map(f64::from).collect() };
    let compare = |grads: SelectiveScanGrads<T>, how: &str| {
        let mut got = vec![("du", wide_t(&grads.du), &want[0]), ("ddelta", wide_t(&grads.ddelta), &want[1])];
        got.extend([("da", wide_f(&grads.da), &want[2]), ("db", wide_f(&grads.db), &want[3]), ("dc", wide_f(&grads.dc), &want[4])]);
        if c.extras {
            let (dd, dz, dbias) =
                (grads.dd.as_ref().expect("dd"), grads.dz.as_ref().expect("dz"), grads.d_delta_bias.as_ref().expect("dbias"));
            got.extend([("dd", wide_f(dd), &want[5]), ("dz", wide_t(dz), &want[6]), ("d_delta_bias", wide_f(dbias), &want[7])]);
        } else {
            assert!(grads.dd.is_none() && grads.dz.is_none() && grads.d_delta_bias.is_none(), "{c:?}: gradients of inputs not given");
        }
        for (name, g, w) in got {
            let err = rel_error(&g, w);
            assert!(err < tol, "{c:?} {} {how}: {name} relative error {err}", std::any::type_name::<T>());
        }
    };
    compare(s.backward(&gt).unwrap_or_else(|e| panic!("{c:?}: {e}")), "backward");
    // The forward kept for the backward: y and the last state bit for bit `run`'s, the same
    // gradients from the kept states.
    let poisoned = || t(&vec![to(f32::NAN); bt * ch * l], &[bt, ch, l]);
    let (mut y, mut y_kept) = (poisoned(), poisoned());
    let (mut h, mut h_kept) = (tf(&vec![f32::NAN; bt * ch * n], &[bt, ch, n]), tf(&vec![f32::NAN; bt * ch * n], &[bt, ch, n]));
    s.run(&mut y, &mut h).unwrap_or_else(|e| panic!("{c:?}: {e}"));
    let saved = s.run_saving(&mut y_kept, &mut h_kept).unwrap_or_else(|e| panic!("{c:?}: {e}"));
    let bits_t = |x: &Tensor<T>| -> Vec<u64> { x.to_host().unwrap().into_iter().map(|v| from(v).to_bits()).collect() };
    assert!(bits_t(&y) == bits_t(&y_kept), "{c:?}: run_saving's y is not run's");
    assert!(h.to_host().unwrap() == h_kept.to_host().unwrap(), "{c:?}: run_saving's last state is not run's");
    compare(s.backward_saved(&saved, &gt).unwrap_or_else(|e| panic!("{c:?}: {e}")), "backward_saved");
    // States kept for other sizes are refused.
    if l > 8 {
        let (us, ds) = (t(&x.u.0[..bt * ch * 8], &[bt, ch, 8]), t(&x.delta.0[..bt * ch * 8], &[bt, ch, 8]));
        let (bs, cs) = (t(&x.b.0[..bt * g * n * 8], &[bt, g, n, 8]), t(&x.cm.0[..bt * g * n * 8], &[bt, g, n, 8]));
        let e = SelectiveScan::new(dev, &us, &ds, &at, &bs, &cs).backward_saved(&saved, &us).err();
        assert!(matches!(&e, Some(tessera::Error::Argument { arg, .. }) if arg == "saved"), "{c:?}: {e:?}");
    }
}

fn backward_matches_f64(dev: &Device) {
    for c in cases(dev) {
        check_backward::<f32>(dev, c, |v| v, f64::from, 2e-4);
        check_backward::<bf16>(dev, c, bf16::from_f32, |v| v.to_f64(), 5e-2);
    }
}

#[test]
fn gpu_selective_scan_backward_matches_f64_reference() {
    if let Some(dev) = gpu_or_skip("gpu_selective_scan_backward_matches_f64_reference") {
        backward_matches_f64(&dev);
    }
}

#[test]
fn interp_selective_scan_backward_matches_f64_reference() {
    backward_matches_f64(&Device::cpu());
}

fn cases(dev: &Device) -> Vec<Case> {
    let c = |batch, channels, groups, states, len, extras| Case { batch, channels, groups, states, len, extras };
    if dev.is_cpu() {
        vec![
            c(1, 2, 1, 16, 1, true),
            c(2, 3, 1, 16, 7, false),
            c(1, 1, 1, 16, 300, false),
            c(1, 4, 2, 32, 130, true),
            c(1, 2, 1, 64, 70, true),
            c(2, 140, 2, 16, 3, true),
            // 128 channels of a group, rows of 16 bytes: a thread a channel
            // (`selective_scan_fwd_rows`; bf16 at 12 steps falls back).
            c(1, 128, 1, 16, 24, true),
            c(2, 256, 2, 32, 12, true),
            c(1, 128, 1, 64, 8, false),
        ]
    } else {
        vec![
            c(1, 3, 1, 16, 1, true),
            c(2, 5, 1, 16, 7, false),
            c(3, 200, 2, 32, 5, true),
            c(2, 130, 1, 64, 2, false),
            c(1, 384, 3, 16, 4, true),
            c(2, 6, 2, 16, 1000, true),
            c(1, 8, 4, 32, 4099, true),
            c(2, 4, 1, 64, 1000, false),
            c(1, 3, 3, 64, 4099, true),
            // 128 channels of a group, rows of 16 bytes: a thread a channel
            // (`selective_scan_fwd_rows`; a last chunk of 4 steps in f32 at 1004, bf16 falls
            // back there).
            c(3, 128, 1, 16, 1, true),
            c(2, 256, 1, 16, 1000, true),
            c(1, 256, 2, 32, 4104, true),
            c(2, 128, 1, 64, 1004, false),
            // Few blocks over a long sequence: split into segments (pass 1, the carried
            // states, pass 2), here 8 (4104) and 9 (5000).
            c(1, 128, 1, 64, 5000, true),
        ]
    }
}

/// A sequence split into segments over the blocks (`selective_scan_fwd_rows`' passes 1 and 2
/// and `selective_scan_seg_carry`): an interpreter of 8 "SMs" splits 128 channels of 1544 steps
/// in three, with an initial state, D, z and the delta bias; forward, `run_saving` and backward.
#[test]
fn interp_selective_scan_split_sequence_matches_f64_reference() {
    let dev = Device::cpu_with_threads(8);
    let c = Case { batch: 1, channels: 128, groups: 1, states: 16, len: 1544, extras: true };
    check::<f32>(&dev, c, |v| v, f64::from, 1e-4);
    check::<bf16>(&dev, c, bf16::from_f32, |v| v.to_f64(), 2e-2);
    check_backward::<f32>(&dev, c, |v| v, f64::from, 2e-4);
}

fn selective_scan_matches_f64(dev: &Device) {
    for c in cases(dev) {
        check::<f32>(dev, c, |v| v, f64::from, 1e-4);
        check::<bf16>(dev, c, bf16::from_f32, |v| v.to_f64(), 2e-2);
    }
}

#[test]
fn gpu_selective_scan_matches_f64_reference() {
    if let Some(dev) = gpu_or_skip("gpu_selective_scan_matches_f64_reference") {
        selective_scan_matches_f64(&dev);
    }
}

#[test]
fn interp_selective_scan_matches_f64_reference() {
    selective_scan_matches_f64(&Device::cpu());
}

#[test]
fn selective_scan_refuses_bad_input() {
    let dev = Device::cpu();
    let z3 = |s: &[usize]| Tensor::<f32>::zeros(&dev, s).unwrap();
    let (u, a, b) = (z3(&[1, 4, 8]), z3(&[4, 24]), z3(&[1, 1, 24, 8]));
    let (mut y, mut h) = (z3(&[1, 4, 8]), z3(&[1, 4, 24]));
    let e = SelectiveScan::new(&dev, &u, &u, &a, &b, &b).run(&mut y, &mut h).expect_err("d_state 24").to_string();
    assert!(e.contains("d_state 16, 32 or 64"), "{e}");
    let b3 = z3(&[1, 3, 16, 8]);
    let a16 = z3(&[4, 16]);
    let mut h16 = z3(&[1, 4, 16]);
    let e = SelectiveScan::new(&dev, &u, &u, &a16, &b3, &b3).run(&mut y, &mut h16).expect_err("3 groups, 4 channels").to_string();
    assert!(e.contains("groups dividing 4"), "{e}");
    let short = z3(&[1, 4, 7]);
    let b16 = z3(&[1, 1, 16, 8]);
    let e = SelectiveScan::new(&dev, &u, &short, &a16, &b16, &b16).run(&mut y, &mut h16).expect_err("delta's length").to_string();
    assert!(e.contains("delta") && e.contains("[1, 4, 8]"), "{e}");
    // Decode steps take one step, from the state they update.
    let e = SelectiveScan::new(&dev, &u, &u, &a16, &b16, &b16).run_step(&mut h16, &mut y).expect_err("8 steps").to_string();
    assert!(e.contains("one step"), "{e}");
    let (u1, b1, mut y1) = (z3(&[1, 4, 1]), z3(&[1, 1, 16, 1]), z3(&[1, 4, 1]));
    let h0 = z3(&[1, 4, 16]);
    let e = SelectiveScan::new(&dev, &u1, &u1, &a16, &b1, &b1).initial_state(&h0).run_step(&mut h16, &mut y1).expect_err("h0").to_string();
    assert!(e.contains("initial_state"), "{e}");
    let mut h_wrong = z3(&[1, 4, 32]);
    let e = SelectiveScan::new(&dev, &u1, &u1, &a16, &b1, &b1).run_step(&mut h_wrong, &mut y1).expect_err("state's d_state").to_string();
    assert!(e.contains("state") && e.contains("[1, 4, 16]"), "{e}");
}

#[path = "../examples/mamba_block.rs"]
#[allow(dead_code)]
mod mamba_block;

/// The Mamba block of `examples/mamba_block.rs` (in-projection GEMM → causal conv → x/Δ
/// projections → selective scan with D and the gate → out-projection) against its float64
/// reference, at odd lengths: bf16 activations between the kernels keep the output's relative
/// error near 4e-3, so 2e-2 fails on any wrong step (a wrong tap, a lost gate or skip).
fn mamba_block_matches_f64(dev: &Device, sizes: &[(usize, usize, usize, usize)]) {
    for &(batch, len, model, inner) in sizes {
        let s = mamba_block::Sizes { batch, len, model, inner, states: 16, rank: 8, taps: 4 };
        let (out, state) = mamba_block::check(dev, s).unwrap_or_else(|e| panic!("{s:?}: {e}"));
        assert!(out < 2e-2 && state < 2e-2, "{s:?}: relative errors {out:.3e} (output), {state:.3e} (last state)");
    }
}

#[test]
fn gpu_mamba_block_matches_f64_reference() {
    if let Some(dev) = gpu_or_skip("gpu_mamba_block_matches_f64_reference") {
        mamba_block_matches_f64(&dev, &[(2, 1000, 256, 512), (1, 4099, 128, 192), (3, 1, 64, 128)]);
    }
}

#[test]
fn interp_mamba_block_matches_f64_reference() {
    mamba_block_matches_f64(&Device::cpu(), &[(2, 37, 64, 128), (1, 7, 72, 80)]);
}
