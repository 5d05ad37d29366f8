//! Helpers for tests that need a GPU: a device or a printed reason to skip, and error norms.

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
