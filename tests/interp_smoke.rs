mod common;
use common::{random, wide};
use tessera::testing::rel_error;
use tessera::{bf16, Device, Tensor};

#[test]
fn interp_smoke() {
    let dev = Device::cpu();
    let (m, n) = (37, 300);
    let x = random(m * n, -8.0, 8.0);
    let xt = Tensor::from_host(&dev, &x, &[m, n]).unwrap();
    let mut y = Tensor::full(&dev, &[m, n], f32::NAN).unwrap();
    tessera_kernels::softmax(&dev, &xt, &mut y).unwrap();
    let got = wide(&y.to_host().unwrap());
    assert!(got.iter().all(|v| v.is_finite()));
    let (m, n, k) = (127, 129, 255);
    let a: Vec<bf16> = random(m * k, -1.0, 1.0).into_iter().map(bf16::from_f32).collect();
    let b: Vec<bf16> = random(n * k, -1.0, 1.0).into_iter().map(bf16::from_f32).collect();
    let at = Tensor::from_host(&dev, &a, &[m, k]).unwrap();
    let bt = Tensor::from_host(&dev, &b, &[n, k]).unwrap();
    let mut c = Tensor::full(&dev, &[m, n], bf16::NAN).unwrap();
    let t = std::time::Instant::now();
    tessera_kernels::gemm_tn(&dev, &at, &bt, &mut c).unwrap();
    eprintln!("gemm {:?}", t.elapsed());
    let got: Vec<f64> = c.to_host().unwrap().iter().map(|v| f64::from(v.to_f32())).collect();
    let mut want = vec![0.0; m * n];
    for i in 0..m {
        for j in 0..n {
            want[i * n + j] = (0..k).map(|q| f64::from(a[i * k + q].to_f32()) * f64::from(b[j * k + q].to_f32())).sum();
        }
    }
    let e = rel_error(&got, &want);
    eprintln!("err {e}");
    assert!(e < 1e-2);
}
