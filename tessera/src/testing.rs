//! Helpers for tests and benches that need a GPU: a device or a printed reason to skip, error
//! norms, CUDA-event timing and random inputs.

use crate::Device;

/// The GPU to test on, or `None` with the reason printed where there is none.
///
/// # Panics
/// With `TESSERA_REQUIRE_GPU=1`, when no GPU is usable: a skip becomes a failure.
pub fn gpu_or_skip(test: &str) -> Option<Device> {
    let reason = if !crate::driver_present() {
        "no CUDA driver on this machine".to_string()
    } else {
        match Device::new(0) {
            Ok(d) => return Some(d),
            Err(e) => format!("no usable GPU: {e}"),
        }
    };
    if std::env::var("TESSERA_REQUIRE_GPU").is_ok_and(|v| v == "1") {
        panic!("{test}: TESSERA_REQUIRE_GPU=1 but {reason}");
    }
    eprintln!("skipped {test}: {reason}");
    None
}

/// ‖got − want‖₂ / ‖want‖₂, or the absolute norm where `want` is all zeros. NaN anywhere
/// gives infinity, so that a NaN never passes.
pub fn rel_error(got: &[f64], want: &[f64]) -> f64 {
    assert_eq!(got.len(), want.len(), "rel_error: lengths differ");
    let (mut num, mut den) = (0.0, 0.0);
    for (&g, &w) in got.iter().zip(want) {
        if g.is_nan() || w.is_nan() {
            return f64::INFINITY;
        }
        num += (g - w) * (g - w);
        den += w * w;
    }
    if den == 0.0 {
        num.sqrt()
    } else {
        (num / den).sqrt()
    }
}

/// Milliseconds per call of `f` on `device`'s stream: `warm` calls first, then CUDA events
/// around `iters` calls (timing events, created with the default flags).
///
/// # Errors
/// A driver error from creating, recording or reading the events.
///
/// On the CPU interpreter, wall-clock time (launches there return when done).
pub fn time_ms(device: &Device, warm: usize, iters: usize, mut f: impl FnMut()) -> crate::Result<f64> {
    use cudarc::driver::sys::CUevent_flags;
    for _ in 0..warm {
        f();
    }
    if device.is_cpu() {
        let t = std::time::Instant::now();
        for _ in 0..iters.max(1) {
            f();
        }
        return Ok(t.elapsed().as_secs_f64() * 1e3 / iters.max(1) as f64);
    }
    let ctx = device.context()?;
    let start = ctx.new_event(Some(CUevent_flags::CU_EVENT_DEFAULT))?;
    let stop = ctx.new_event(Some(CUevent_flags::CU_EVENT_DEFAULT))?;
    start.record(device.stream()?)?;
    for _ in 0..iters.max(1) {
        f();
    }
    stop.record(device.stream()?)?;
    stop.synchronize()?;
    Ok(f64::from(start.elapsed_ms(&stop)?) / iters.max(1) as f64)
}

/// Milliseconds per call of `f` with the host's launch overhead left out, as a CUDA-graph
/// replay times a PyTorch kernel: `f` runs `warm` times, then once under stream capture on the
/// device's stream, and the captured graph is replayed `iters` times between two events. `f`
/// must only enqueue work on that stream (a library kernel's launch does). On the interpreter,
/// as [`time_ms`].
///
/// # Errors
/// A driver error, or capture refused by something `f` did.
pub fn time_graph_ms(device: &Device, warm: usize, iters: usize, mut f: impl FnMut()) -> crate::Result<f64> {
    use cudarc::driver::sys::{CUevent_flags, CUgraphInstantiate_flags, CUstreamCaptureMode};
    if device.is_cpu() {
        return time_ms(device, warm, iters, f);
    }
    for _ in 0..warm {
        f();
    }
    let stream = device.stream()?;
    stream.synchronize()?;
    stream.begin_capture(CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_RELAXED)?;
    f();
    // Nothing captured: as the driver says of a capture that went wrong.
    let empty = || cudarc::driver::DriverError(cudarc::driver::sys::CUresult::CUDA_ERROR_STREAM_CAPTURE_INVALIDATED);
    let graph = stream.end_capture(CUgraphInstantiate_flags(0))?.ok_or_else(empty)?;
    graph.upload()?;
    for _ in 0..warm.max(1) {
        graph.launch()?;
    }
    let ctx = device.context()?;
    let start = ctx.new_event(Some(CUevent_flags::CU_EVENT_DEFAULT))?;
    let stop = ctx.new_event(Some(CUevent_flags::CU_EVENT_DEFAULT))?;
    start.record(stream)?;
    for _ in 0..iters.max(1) {
        graph.launch()?;
    }
    stop.record(stream)?;
    stop.synchronize()?;
    Ok(f64::from(start.elapsed_ms(&stop)?) / iters.max(1) as f64)
}

/// Times two implementations of the same work fairly: `rounds` rounds, each timing `iters`
/// calls of `a` and then of `b` ([`time_ms`], `warm` calls first), so that clock and thermal
/// drift fall on both alike. Gives the median milliseconds per call of `a` and of `b`.
///
/// # Errors
/// As [`time_ms`].
pub fn time_pair_ms(
    device: &Device, warm: usize, iters: usize, rounds: usize, mut a: impl FnMut(), mut b: impl FnMut(),
) -> crate::Result<(f64, f64)> {
    let (mut ta, mut tb) = (Vec::new(), Vec::new());
    for _ in 0..rounds.max(1) {
        ta.push(time_ms(device, warm, iters, &mut a)?);
        tb.push(time_ms(device, warm, iters, &mut b)?);
    }
    Ok((median(ta), median(tb)))
}

/// The middle of `v` (the upper middle of an even count), as [`time_pair_ms`] reports its
/// rounds; NaN for none.
pub fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v.get(v.len() / 2).copied().unwrap_or(f64::NAN)
}

/// A small xorshift generator for benchmark inputs: uniform values in `[-1, 1)`, seeded from
/// the clock, so every run times fresh random data (never zeros, never constants).
pub struct Uniform(u64);

impl Uniform {
    /// A generator seeded from the clock.
    pub fn new() -> Uniform {
        let t = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_nanos() as u64).unwrap_or(1);
        Uniform(t | 1)
    }

    /// The next value in `[-1, 1)`.
    pub fn next_f32(&mut self) -> f32 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        (self.0 >> 40) as f32 / (1u64 << 24) as f32 * 2.0 - 1.0
    }

    /// `n` values converted by `f` (e.g. `bf16::from_f32`).
    pub fn vec<T>(&mut self, n: usize, f: impl Fn(f32) -> T) -> Vec<T> {
        (0..n).map(|_| f(self.next_f32())).collect()
    }
}

impl Default for Uniform {
    fn default() -> Self {
        Uniform::new()
    }
}
