//! NVTX ranges around kernel launches, so that an Nsight Systems or Nsight Compute timeline
//! reads like the model: each launch of a library kernel (or of yours) is a range named by the
//! kernel, its tensors' shapes and its grid, e.g. `rms_norm_row_bf16 x[4096, 4096]
//! y[4096, 4096] w[4096] grid 4096×1×1`.
//!
//! Ranges are pushed only while a profiler is attached — NVTX's injection variable
//! (`NVTX_INJECTION64_PATH`, which `nsys` and `ncu` set) is present — or after
//! [`set_enabled`]`(true)`; otherwise a launch pays one relaxed atomic load. The `nvtx` cargo
//! feature (on by default) links NVTX's header-only C implementation through the `nvtx` crate;
//! without it the ranges are counted (for tests) but not emitted.

use std::sync::atomic::{AtomicU64, AtomicU8, Ordering};
use std::sync::Mutex;

/// 0: not decided yet; 1: off; 2: on.
static STATE: AtomicU8 = AtomicU8::new(0);
static PUSHED: AtomicU64 = AtomicU64::new(0);
static LAST: Mutex<String> = Mutex::new(String::new());

/// Whether launches push NVTX ranges: a profiler's injection variable was set when the first
/// launch asked, or [`set_enabled`] said so since.
pub fn enabled() -> bool {
    match STATE.load(Ordering::Relaxed) {
        2 => true,
        1 => false,
        _ => {
            let on = ["NVTX_INJECTION64_PATH", "NVTX_INJECTION32_PATH"].iter().any(|v| std::env::var_os(v).is_some());
            STATE.store(if on { 2 } else { 1 }, Ordering::Relaxed);
            on
        }
    }
}

/// Turns the ranges on or off for the rest of the process (a profiler attached later, or a
/// test).
pub fn set_enabled(on: bool) {
    STATE.store(if on { 2 } else { 1 }, Ordering::Relaxed);
}

/// Ranges pushed in this process so far.
pub fn ranges_pushed() -> u64 {
    PUSHED.load(Ordering::Relaxed)
}

/// The name of the last range pushed (empty before the first).
pub fn last_range() -> String {
    LAST.lock().unwrap_or_else(|p| p.into_inner()).clone()
}

/// An open range, popped when dropped.
#[must_use]
#[cfg_attr(not(feature = "nvtx"), allow(dead_code))]
pub(crate) struct Range(bool);

/// Opens a range named `name()` where ranges are [`enabled`] (the name is built only then).
pub(crate) fn range(name: impl FnOnce() -> String) -> Range {
    if !enabled() {
        return Range(false);
    }
    let name = name();
    #[cfg(feature = "nvtx")]
    nvtx::range_push!("{name}");
    PUSHED.fetch_add(1, Ordering::Relaxed);
    *LAST.lock().unwrap_or_else(|p| p.into_inner()) = name;
    Range(true)
}

impl Drop for Range {
    fn drop(&mut self) {
        #[cfg(feature = "nvtx")]
        if self.0 {
            nvtx::range_pop!();
        }
    }
}
