//! Helpers shared by the tests: fresh random inputs, candle tensors and their values, and the
//! relative error.

#![allow(dead_code)]

use candle_core::{DType, Device, Tensor};

/// Uniform values in [-scale, scale) from a fresh seed (the clock).
pub fn random(n: usize, scale: f32) -> Vec<f32> {
    let mut s = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(1, |d| d.as_nanos() as u64) | 1;
    (0..n)
        .map(|_| {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            ((s >> 40) as f32 / (1u64 << 24) as f32 * 2.0 - 1.0) * scale
        })
        .collect()
}

/// `‖got − want‖ / ‖want‖`.
pub fn rel_error(got: &[f64], want: &[f64]) -> f64 {
    let num: f64 = got.iter().zip(want).map(|(g, w)| (g - w).powi(2)).sum();
    let den: f64 = want.iter().map(|w| w * w).sum();
    (num / den).sqrt()
}

/// The devices the ops are tested on: the CPU (Tessera's interpreter) and, with the `cuda`
/// feature, GPU 0 where there is one (`TESSERA_REQUIRE_GPU=1` makes its absence a failure).
pub fn devices() -> Vec<Device> {
    #[allow(unused_mut)]
    let mut devices = vec![Device::Cpu];
    #[cfg(feature = "cuda")]
    match Device::new_cuda(0) {
        Ok(gpu) => devices.push(gpu),
        Err(e) if std::env::var_os("TESSERA_REQUIRE_GPU").is_some() => panic!("TESSERA_REQUIRE_GPU is set and there is no GPU: {e}"),
        Err(e) => eprintln!("skipping the CUDA side: {e}"),
    }
    devices
}

/// A candle tensor of `dtype` on `dev` holding `v` (rounded), and the values it holds, widened.
pub fn tensor(dev: &Device, v: &[f32], dims: &[usize], dtype: DType) -> (Tensor, Vec<f64>) {
    let t = Tensor::from_vec(v.to_vec(), dims, dev).unwrap().to_dtype(dtype).unwrap();
    (t.clone(), values(&t))
}

/// A tensor's elements in float64.
pub fn values(t: &Tensor) -> Vec<f64> {
    t.to_dtype(DType::F64).unwrap().flatten_all().unwrap().to_vec1::<f64>().unwrap()
}
