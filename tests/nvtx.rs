//! Every launch pushes an NVTX range named by its kernel, its tensors' shapes and its grid while
//! ranges are on (a profiler attached, or `tessera::nvtx::set_enabled(true)`), and none while
//! they are off.

mod common;

use tessera::testing::gpu_or_skip;
use tessera::{nvtx, Device, Tensor};

fn launches_push_named_ranges(dev: &Device) {
    let (rows, hidden) = (37, 1000);
    let x = Tensor::from_host(dev, &common::random(rows * hidden, -1.0, 1.0), &[rows, hidden]).unwrap();
    let mut y = Tensor::<f32>::full(dev, &[rows, hidden], f32::NAN).unwrap();
    nvtx::set_enabled(false);
    let before = nvtx::ranges_pushed();
    tessera_kernels::softmax(dev, &x, &mut y).unwrap();
    assert_eq!(nvtx::ranges_pushed(), before, "a range while ranges are off");
    nvtx::set_enabled(true);
    tessera_kernels::softmax(dev, &x, &mut y).unwrap();
    nvtx::set_enabled(false);
    assert_eq!(nvtx::ranges_pushed(), before + 1, "one range for the one launch");
    let name = nvtx::last_range();
    assert!(name.starts_with("softmax") && name.contains("f32"), "{name}");
    assert!(name.contains(&format!("x[{rows}, {hidden}]")) && name.contains(&format!("y[{rows}, {hidden}]")), "{name}");
    assert!(name.contains("grid "), "{name}");
}

/// One test for both devices: the switch and the count are the process's.
#[test]
fn launches_push_named_ranges_interp_and_gpu() {
    launches_push_named_ranges(&Device::cpu());
    println!("{}", nvtx::last_range());
    if let Some(dev) = gpu_or_skip("launches_push_named_ranges_interp_and_gpu (GPU part)") {
        launches_push_named_ranges(&dev);
    }
}
