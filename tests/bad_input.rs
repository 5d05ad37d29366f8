//! Misused public entry points: each call gives a `tessera::Error::Argument` naming the
//! argument, before anything runs, and leaves every tensor it was given as it was (outputs
//! poisoned before the call stay poisoned). On the CPU device: the checks are the host's.
//! `cargo test bad_input` selects these and their kin in the other suites.

mod common;

use common::random;
use tessera::{bf16, Device, Element, Tensor};
use tessera_kernels::{HeadLayout, Rope, RopeStyle};

/// The element types the tests use, made from f32.
trait FromF32: Element {
    fn from_f32(v: f32) -> Self;
}
impl FromF32 for f32 {
    fn from_f32(v: f32) -> f32 {
        v
    }
}
impl FromF32 for bf16 {
    fn from_f32(v: f32) -> bf16 {
        bf16::from_f32(v)
    }
}

/// A tensor of fresh random values.
fn rand_t<T: FromF32>(dev: &Device, shape: &[usize]) -> Tensor<T> {
    let v: Vec<T> = random(shape.iter().product(), -2.0, 2.0).into_iter().map(T::from_f32).collect();
    Tensor::from_host(dev, &v, shape).unwrap()
}

/// The argument an error names (panics on anything but `Error::Argument`).
fn named(r: tessera::Result<()>) -> String {
    match r {
        Err(tessera::Error::Argument { arg, expected, found, .. }) => {
            assert!(!expected.is_empty() && !found.is_empty(), "the message says what was expected and what was given");
            arg
        }
        other => panic!("expected an argument error, got {other:?}"),
    }
}

/// Runs `call` on `out` and checks that the tensors are the same afterwards, bit for bit.
fn unchanged<T: Element + PartialEq + std::fmt::Debug>(
    ins: &[&Tensor<T>], out: &mut Tensor<T>, call: impl FnOnce(&mut Tensor<T>) -> tessera::Result<()>,
) -> String {
    let before: Vec<Vec<T>> = ins.iter().map(|t| t.to_host().unwrap()).collect();
    let out_before = out.to_host().unwrap();
    let arg = named(call(out));
    for (t, b) in ins.iter().zip(before) {
        assert_eq!(t.to_host().unwrap(), b, "an input changed");
    }
    assert_eq!(out.to_host().unwrap(), out_before, "the output changed");
    arg
}

#[test]
fn bad_input_rms_norm_rank() {
    let dev = Device::cpu();
    let x: Tensor<bf16> = rand_t(&dev, &[2, 3, 64]);
    let mut y: Tensor<bf16> = rand_t(&dev, &[2, 3, 64]);
    assert_eq!(unchanged(&[&x], &mut y, |y| tessera_kernels::rms_norm(&dev, &x, None, 1e-6, y)), "x");
}

#[test]
fn bad_input_rms_norm_output_shape() {
    let dev = Device::cpu();
    let x: Tensor<bf16> = rand_t(&dev, &[5, 64]);
    let mut y: Tensor<bf16> = rand_t(&dev, &[5, 65]);
    assert_eq!(unchanged(&[&x], &mut y, |y| tessera_kernels::rms_norm(&dev, &x, None, 1e-6, y)), "y");
}

#[test]
fn bad_input_rms_norm_weight_length() {
    let dev = Device::cpu();
    let x: Tensor<f32> = rand_t(&dev, &[5, 64]);
    let w: Tensor<f32> = rand_t(&dev, &[63]);
    let mut y: Tensor<f32> = rand_t(&dev, &[5, 64]);
    assert_eq!(unchanged(&[&x, &w], &mut y, |y| tessera_kernels::rms_norm(&dev, &x, Some(&w), 1e-6, y)), "weight");
}

#[test]
fn bad_input_layer_norm_bias_length() {
    let dev = Device::cpu();
    let x: Tensor<bf16> = rand_t(&dev, &[3, 128]);
    let w: Tensor<bf16> = rand_t(&dev, &[128]);
    let b: Tensor<bf16> = rand_t(&dev, &[129]);
    let mut y: Tensor<bf16> = rand_t(&dev, &[3, 128]);
    assert_eq!(unchanged(&[&x, &w, &b], &mut y, |y| tessera_kernels::layer_norm(&dev, &x, Some(&w), Some(&b), 1e-5, y)), "bias");
}

#[test]
fn bad_input_norms_zero_width_rows() {
    let dev = Device::cpu();
    let x: Tensor<bf16> = Tensor::from_host(&dev, &[], &[4, 0]).unwrap();
    let mut y: Tensor<bf16> = Tensor::from_host(&dev, &[], &[4, 0]).unwrap();
    assert_eq!(unchanged(&[&x], &mut y, |y| tessera_kernels::rms_norm(&dev, &x, None, 1e-6, y)), "x");
    assert_eq!(unchanged(&[&x], &mut y, |y| tessera_kernels::layer_norm(&dev, &x, None, None, 1e-5, y)), "x");
    assert_eq!(unchanged(&[&x], &mut y, |y| tessera_kernels::Norm::rms(1e-6).forward(&dev, &x, y, None)), "x");
}

#[test]
fn bad_input_softmax_zero_width_rows() {
    let dev = Device::cpu();
    let x: Tensor<f32> = Tensor::from_host(&dev, &[], &[3, 0]).unwrap();
    let mut y: Tensor<f32> = Tensor::from_host(&dev, &[], &[3, 0]).unwrap();
    assert_eq!(unchanged(&[&x], &mut y, |y| tessera_kernels::softmax(&dev, &x, y)), "x");
    assert_eq!(unchanged(&[&x, &x], &mut y, |dx| tessera_kernels::softmax_backward(&dev, &x, &x, dx, 1.0)), "y");
}

/// Not misuse: a batch of no rows is nothing to do.
#[test]
fn empty_batches_are_nothing_to_do() {
    let dev = Device::cpu();
    let x: Tensor<f32> = Tensor::from_host(&dev, &[], &[0, 64]).unwrap();
    let mut y: Tensor<f32> = Tensor::from_host(&dev, &[], &[0, 64]).unwrap();
    tessera_kernels::rms_norm(&dev, &x, None, 1e-6, &mut y).unwrap();
    tessera_kernels::layer_norm(&dev, &x, None, None, 1e-5, &mut y).unwrap();
    tessera_kernels::softmax(&dev, &x, &mut y).unwrap();
}

#[test]
fn bad_input_softmax_rank() {
    let dev = Device::cpu();
    let x: Tensor<f32> = rand_t(&dev, &[2, 2, 2, 8]);
    let mut y: Tensor<f32> = rand_t(&dev, &[2, 2, 2, 8]);
    assert_eq!(unchanged(&[&x], &mut y, |y| tessera_kernels::softmax(&dev, &x, y)), "x");
}

#[test]
fn bad_input_softmax_scale() {
    let dev = Device::cpu();
    let x: Tensor<f32> = rand_t(&dev, &[4, 8]);
    let mut y: Tensor<f32> = rand_t(&dev, &[4, 8]);
    for scale in [0.0, -1.0, f32::NAN, f32::INFINITY] {
        let o = tessera_kernels::SoftmaxOptions { scale, causal: false };
        assert_eq!(unchanged(&[&x], &mut y, |y| tessera_kernels::softmax_with(&dev, &x, y, o)), "scale", "scale {scale}");
    }
}

#[test]
fn bad_input_softmax_backward_gradient_shape() {
    let dev = Device::cpu();
    let y: Tensor<bf16> = rand_t(&dev, &[4, 8]);
    let dy: Tensor<bf16> = rand_t(&dev, &[4, 9]);
    let mut dx: Tensor<bf16> = rand_t(&dev, &[4, 8]);
    assert_eq!(unchanged(&[&y, &dy], &mut dx, |dx| tessera_kernels::softmax_backward(&dev, &y, &dy, dx, 1.0)), "dy");
}

#[test]
fn bad_input_rope_odd_head_dim() {
    let dev = Device::cpu();
    let x: Tensor<bf16> = rand_t(&dev, &[1, 4, 2, 63]);
    let mut y: Tensor<bf16> = rand_t(&dev, &[1, 4, 2, 63]);
    let r = Rope::new(RopeStyle::HalfSplit, HeadLayout::Bshd);
    assert_eq!(unchanged(&[&x], &mut y, |y| tessera_kernels::rope(&dev, &r, &x, y)), "x");
}

#[test]
fn bad_input_rope_rank_and_output() {
    let dev = Device::cpu();
    let r = Rope::new(RopeStyle::Interleaved, HeadLayout::Bhsd);
    let x: Tensor<f32> = rand_t(&dev, &[4, 2, 64]);
    let mut y: Tensor<f32> = rand_t(&dev, &[4, 2, 64]);
    assert_eq!(unchanged(&[&x], &mut y, |y| tessera_kernels::rope(&dev, &r, &x, y)), "x", "rank 3");
    let x: Tensor<f32> = rand_t(&dev, &[1, 2, 4, 64]);
    let mut y: Tensor<f32> = rand_t(&dev, &[1, 2, 5, 64]);
    assert_eq!(unchanged(&[&x], &mut y, |y| tessera_kernels::rope(&dev, &r, &x, y)), "y", "y of another shape");
}

#[test]
fn bad_input_rope_positions_and_cache() {
    let dev = Device::cpu();
    let x: Tensor<f32> = rand_t(&dev, &[2, 4, 2, 16]);
    let mut y: Tensor<f32> = rand_t(&dev, &[2, 4, 2, 16]);
    let p = Tensor::from_host(&dev, &[0i32, 1, 2, 3], &[1, 4]).unwrap();
    let r = Rope::new(RopeStyle::HalfSplit, HeadLayout::Bshd).positions(tessera_kernels::Positions::Tensor(&p));
    assert_eq!(unchanged(&[&x], &mut y, |y| tessera_kernels::rope(&dev, &r, &x, y)), "positions", "positions [1, 4] for batch 2");
    let (cos, sin) = tessera_kernels::rope_cache(&dev, RopeStyle::HalfSplit, 8, 32, 10000.0).unwrap();
    let r = Rope::new(RopeStyle::HalfSplit, HeadLayout::Bshd).cache(&cos, &sin);
    assert_eq!(unchanged(&[&x], &mut y, |y| tessera_kernels::rope(&dev, &r, &x, y)), "cos", "a cache for head_dim 32");
}

#[test]
fn bad_input_row_and_column_reductions() {
    let dev = Device::cpu();
    let x: Tensor<f32> = rand_t(&dev, &[6, 10]);
    let mut out: Tensor<f32> = rand_t(&dev, &[10]);
    assert_eq!(unchanged(&[&x], &mut out, |o| tessera_kernels::row_sum(&dev, &x, o)), "out", "row sums of 6 rows into 10");
    let mut out: Tensor<f32> = rand_t(&dev, &[6]);
    assert_eq!(unchanged(&[&x], &mut out, |o| tessera_kernels::col_max(&dev, &x, o)), "out", "column maxima of 10 columns into 6");
}

#[test]
fn bad_input_axpy_shapes() {
    let dev = Device::cpu();
    let x: Tensor<f32> = rand_t(&dev, &[3, 4]);
    let mut y: Tensor<f32> = rand_t(&dev, &[4, 3]);
    assert_eq!(unchanged(&[&x], &mut y, |y| tessera_kernels::axpy(&dev, 2.0, &x, y)), "y");
}

#[test]
fn bad_input_fused_norm_residual_and_dropout() {
    use tessera_kernels::{Dropout, Norm};
    let dev = Device::cpu();
    let x: Tensor<bf16> = rand_t(&dev, &[4, 64]);
    let res: Tensor<bf16> = rand_t(&dev, &[4, 32]);
    let mut y: Tensor<bf16> = rand_t(&dev, &[4, 64]);
    let norm = Norm::rms(1e-6).residual(&res);
    assert_eq!(unchanged(&[&x, &res], &mut y, |y| norm.forward(&dev, &x, y, None)), "residual");
    let norm = Norm::rms(1e-6).dropout(Dropout::new(1.0, 1, 0));
    assert_eq!(unchanged(&[&x], &mut y, |y| norm.forward(&dev, &x, y, None)), "dropout.p", "p = 1 keeps nothing");
}

#[test]
fn bad_input_fused_norm_stacked_output() {
    use tessera_kernels::Norm;
    let dev = Device::cpu();
    let x: Tensor<bf16> = rand_t(&dev, &[4, 64]);
    let w: Tensor<bf16> = rand_t(&dev, &[64]);
    let norm = Norm::rms(1e-6).weight(&w).residual(&x);
    // `yh` is `[2, rows, hidden]`: a `[rows, hidden]` or a `[3, rows, hidden]` one is named.
    for shape in [&[4, 64][..], &[3, 4, 64], &[2, 4, 32]] {
        let mut yh: Tensor<bf16> = rand_t(&dev, shape);
        assert_eq!(unchanged(&[&x, &w], &mut yh, |yh| norm.forward_stacked(&dev, &x, yh)), "yh", "{shape:?}");
    }
}

#[test]
fn bad_input_split_outer_overlapping_parts() {
    let dev = Device::cpu();
    // A first axis of stride 0 (a broadcast): its parts would be the same elements.
    let t: Tensor<f32> = rand_t(&dev, &[8]);
    let mut b = t.restride(0, &[2, 8], &[0, 1]).unwrap();
    match tessera::split_outer(&mut b, &dev) {
        Err(tessera::Error::Tensor { what, expected, found }) => {
            assert_eq!(what, "split_outer");
            assert!(expected.contains("8 elements") && found.contains("[0, 1]"), "{expected} / {found}");
        }
        other => panic!("expected a tensor error, got {:?}", other.map(|(p, _)| p.len())),
    }
    let mut s: Tensor<f32> = rand_t(&dev, &[]);
    assert!(matches!(tessera::split_outer(&mut s, &dev), Err(tessera::Error::Tensor { .. })), "rank 0 has no parts");
}

#[test]
fn bad_input_into_cudarc_as_another_size() {
    let dev = Device::cpu();
    let t: Tensor<f32> = rand_t(&dev, &[8]);
    match t.into_cudarc_as::<u8>() {
        Err(tessera::Error::Tensor { what, expected, found }) => {
            assert_eq!(what, "Tensor::into_cudarc_as");
            assert!(expected.contains("4 bytes") && found.contains("u8 of 1 bytes"), "{expected} / {found}");
        }
        other => panic!("expected a tensor error, got {:?}", other.map(|s| s.len())),
    }
    // One size: the interpreter's tensor has no CUDA buffer to hand out.
    let t: Tensor<f32> = rand_t(&dev, &[8]);
    assert!(matches!(t.into_cudarc_as::<u32>(), Err(tessera::Error::NotCuda { .. })));
}

#[test]
fn bad_input_gemm_inner_dimensions() {
    let dev = Device::cpu();
    let a: Tensor<bf16> = rand_t(&dev, &[8, 16]);
    let b: Tensor<bf16> = rand_t(&dev, &[8, 24]);
    let mut c: Tensor<bf16> = rand_t(&dev, &[8, 8]);
    assert_eq!(unchanged(&[&a, &b], &mut c, |c| tessera_kernels::gemm(&a, &b).run(&dev, c)), "b");
}

#[test]
fn bad_input_layer_norm_output_shape() {
    let dev = Device::cpu();
    let x: Tensor<f32> = rand_t(&dev, &[3, 96]);
    let mut y: Tensor<f32> = rand_t(&dev, &[96, 3]);
    assert_eq!(unchanged(&[&x], &mut y, |y| tessera_kernels::layer_norm(&dev, &x, None, None, 1e-5, y)), "y");
}

#[test]
fn bad_input_softmax_batch_output() {
    let dev = Device::cpu();
    let x: Tensor<bf16> = rand_t(&dev, &[2, 3, 8]);
    let mut y: Tensor<bf16> = rand_t(&dev, &[3, 2, 8]);
    assert_eq!(unchanged(&[&x], &mut y, |y| tessera_kernels::softmax(&dev, &x, y)), "y", "a batch of 3×8 matrices into 2×8 ones");
}

#[test]
fn bad_input_rope_cache_odd_dim() {
    let dev = Device::cpu();
    let r = tessera_kernels::rope_cache(&dev, RopeStyle::Interleaved, 16, 33, 10000.0).map(|_| ());
    assert_eq!(named(r), "dim");
}

#[test]
fn bad_input_rope_in_place_rank() {
    let dev = Device::cpu();
    let mut x: Tensor<f32> = rand_t(&dev, &[4, 2, 2, 8, 16]);
    let before = x.to_host().unwrap();
    let r = Rope::new(RopeStyle::HalfSplit, HeadLayout::Bshd);
    assert_eq!(named(tessera_kernels::rope_in_place(&dev, &r, &mut x)), "x");
    assert_eq!(x.to_host().unwrap(), before, "the tensor changed");
}

#[test]
fn bad_input_mean_reductions() {
    let dev = Device::cpu();
    let x: Tensor<f32> = rand_t(&dev, &[7, 5]);
    let mut out: Tensor<f32> = rand_t(&dev, &[5]);
    assert_eq!(unchanged(&[&x], &mut out, |o| tessera_kernels::row_mean(&dev, &x, o)), "out");
    let mut out: Tensor<f32> = rand_t(&dev, &[7]);
    assert_eq!(unchanged(&[&x], &mut out, |o| tessera_kernels::col_mean(&dev, &x, o)), "out");
}

#[test]
fn bad_input_fused_norm_parameters() {
    use tessera_kernels::Norm;
    let dev = Device::cpu();
    let x: Tensor<f32> = rand_t(&dev, &[4, 64]);
    let (w, b): (Tensor<f32>, Tensor<f32>) = (rand_t(&dev, &[64]), rand_t(&dev, &[32]));
    let mut y: Tensor<f32> = rand_t(&dev, &[4, 64]);
    let norm = Norm::layer(1e-5).weight(&w).bias(&b);
    assert_eq!(unchanged(&[&x, &w, &b], &mut y, |y| norm.forward(&dev, &x, y, None)), "bias");
    let mut h: Tensor<f32> = rand_t(&dev, &[4, 63]);
    let h_before = h.to_host().unwrap();
    let norm = Norm::rms(1e-6).weight(&w);
    assert_eq!(unchanged(&[&x, &w], &mut y, |y| norm.forward(&dev, &x, y, Some(&mut h))), "h");
    assert_eq!(h.to_host().unwrap(), h_before, "h changed");
}

#[test]
fn bad_input_gemm_output_and_bias() {
    use tessera_kernels::Bias;
    let dev = Device::cpu();
    let a: Tensor<bf16> = rand_t(&dev, &[8, 16]);
    let b: Tensor<bf16> = rand_t(&dev, &[24, 16]);
    let mut c: Tensor<bf16> = rand_t(&dev, &[8, 16]);
    assert_eq!(unchanged(&[&a, &b], &mut c, |c| tessera_kernels::gemm(&a, &b).run(&dev, c)), "c", "C of 8×16 for 8×24");
    let bias: Tensor<bf16> = rand_t(&dev, &[8]);
    let mut c: Tensor<bf16> = rand_t(&dev, &[8, 24]);
    let r = |c: &mut Tensor<bf16>| tessera_kernels::gemm(&a, &b).bias(Bias::PerColumn(&bias)).run(&dev, c);
    assert_eq!(unchanged(&[&a, &b, &bias], &mut c, r), "bias", "a per-column bias of 8 for 24 columns");
    // A gate of another shape than C, and a gate beside a residual.
    let (small, fits): (Tensor<bf16>, Tensor<bf16>) = (rand_t(&dev, &[8, 16]), rand_t(&dev, &[8, 24]));
    let r = |c: &mut Tensor<bf16>| tessera_kernels::gemm(&a, &b).gate(&small).run(&dev, c);
    assert_eq!(unchanged(&[&a, &b, &small], &mut c, r), "gate", "a gate of 8×16 for C of 8×24");
    let r = |c: &mut Tensor<bf16>| tessera_kernels::gemm(&a, &b).residual(&fits).gate(&fits).run(&dev, c);
    assert_eq!(unchanged(&[&a, &b, &fits], &mut c, r), "gate", "a gate beside a residual");
}

/// fp8 quantization: `y` of another shape, a scale that is not finite, a strided 3-D view;
/// dequantization's `y` of another shape. Every tensor left as it was.
#[test]
fn bad_input_fp8_quantize() {
    use tessera::F8E4M3;
    let dev = Device::cpu();
    let x: Tensor<f32> = rand_t(&dev, &[6, 40]);
    let x_before = x.to_host().unwrap();
    let mut y = Tensor::full(&dev, &[6, 41], F8E4M3::from_bits(0x55)).unwrap();
    let mut y_ok = Tensor::full(&dev, &[6, 40], F8E4M3::from_bits(0x55)).unwrap();
    let poisoned = |t: &Tensor<F8E4M3>| t.to_host().unwrap().iter().all(|q| q.to_bits() == 0x55);
    assert_eq!(named(tessera_kernels::quantize_fp8(&dev, &x, 1.0, &mut y)), "y");
    for scale in [f32::NAN, f32::INFINITY] {
        assert_eq!(named(tessera_kernels::quantize_fp8(&dev, &x, scale, &mut y_ok)), "scale");
    }
    let x3: Tensor<f32> = rand_t(&dev, &[2, 3, 40]);
    let x3_before = x3.to_host().unwrap();
    let strided = x3.restride(0, &[2, 3, 20], &[120, 40, 2]).unwrap();
    let mut y3 = Tensor::full(&dev, &[2, 3, 20], F8E4M3::from_bits(0x55)).unwrap();
    assert_eq!(named(tessera_kernels::quantize_fp8(&dev, &strided, 1.0, &mut y3)), "x");
    assert_eq!(strided.restride(0, &[2, 3, 40], &[120, 40, 1]).unwrap().to_host().unwrap(), x3_before, "the input changed");
    assert!(poisoned(&y) && poisoned(&y_ok) && poisoned(&y3), "an output changed");
    assert_eq!(x.to_host().unwrap(), x_before, "the input changed");
    let mut back = Tensor::full(&dev, &[6, 39], bf16::from_f32(-7.0)).unwrap();
    assert_eq!(named(tessera_kernels::dequantize_fp8(&dev, &y_ok, 1.0, &mut back)), "y");
    assert!(back.to_host().unwrap().iter().all(|v| v.to_f32() == -7.0), "the output changed");
}

/// Linear attention: a key head dim without a kernel, v's heads not a multiple of q's, a decay
/// of another length, `o` of another shape, a non-contiguous q. The SSD: B of another length, C
/// unlike B, dt of another shape. Each error names the argument; the output stays poisoned.
#[test]
fn bad_input_linear_attention_and_ssd() {
    use tessera_kernels::{LinearAttention, Ssd};
    let dev = Device::cpu();
    let (q, k, v): (Tensor<bf16>, Tensor<bf16>, Tensor<bf16>) =
        (rand_t(&dev, &[2, 70, 2, 64]), rand_t(&dev, &[2, 70, 2, 64]), rand_t(&dev, &[2, 70, 2, 64]));
    let mut o: Tensor<bf16> = rand_t(&dev, &[2, 70, 2, 64]);
    let q96: Tensor<bf16> = rand_t(&dev, &[2, 70, 2, 96]);
    assert_eq!(unchanged(&[&q96, &v], &mut o, |o| LinearAttention::new(&dev, &q96, &q96, &v).run(o, None)), "q", "head dim 96");
    let q3: Tensor<bf16> = rand_t(&dev, &[2, 70, 3, 64]);
    assert_eq!(unchanged(&[&q3, &v], &mut o, |o| LinearAttention::new(&dev, &q3, &q3, &v).run(o, None)), "q", "3 heads for 2");
    let g = Tensor::<f32>::zeros(&dev, &[2, 2, 69]).unwrap();
    assert_eq!(unchanged(&[&q, &k, &v], &mut o, |o| LinearAttention::new(&dev, &q, &k, &v).decay(&g).run(o, None)), "decay");
    let mut o2: Tensor<bf16> = rand_t(&dev, &[2, 70, 2, 128]);
    assert_eq!(unchanged(&[&q, &k, &v], &mut o2, |o| LinearAttention::new(&dev, &q, &k, &v).run(o, None)), "o");
    let wide: Tensor<bf16> = rand_t(&dev, &[2, 70, 2, 128]);
    let strided = wide.restride(0, &[2, 70, 2, 64], &[70 * 256, 256, 128, 1]).unwrap();
    assert_eq!(unchanged(&[&k, &v], &mut o, |o| LinearAttention::new(&dev, &strided, &k, &v).run(o, None)), "q", "strided");
    // Per-channel gates: k's shape, q and k with as many heads, not with a decay.
    let gv = Tensor::<f32>::zeros(&dev, &[2, 70, 2, 64]).unwrap();
    let gv_short = Tensor::<f32>::zeros(&dev, &[2, 69, 2, 64]).unwrap();
    assert_eq!(unchanged(&[&q, &k, &v], &mut o, |o| LinearAttention::new(&dev, &q, &k, &v).gates(&gv_short).run(o, None)), "gates");
    assert_eq!(unchanged(&[&q, &k, &v], &mut o, |o| LinearAttention::new(&dev, &q, &k, &v).gates(&gv).decay(&g).run(o, None)), "gates");
    let (k1, gv1): (Tensor<bf16>, Tensor<f32>) = (rand_t(&dev, &[2, 70, 1, 64]), Tensor::zeros(&dev, &[2, 70, 1, 64]).unwrap());
    assert_eq!(unchanged(&[&q, &k1, &v], &mut o, |o| LinearAttention::new(&dev, &q, &k1, &v).gates(&gv1).run(o, None)), "gates");

    let (x, dt): (Tensor<bf16>, Tensor<bf16>) = (rand_t(&dev, &[1, 70, 4, 64]), rand_t(&dev, &[1, 70, 4]));
    let a = Tensor::<f32>::zeros(&dev, &[4]).unwrap();
    let (b, c, b69): (Tensor<bf16>, Tensor<bf16>, Tensor<bf16>) =
        (rand_t(&dev, &[1, 70, 1, 128]), rand_t(&dev, &[1, 70, 2, 128]), rand_t(&dev, &[1, 69, 1, 128]));
    let mut y: Tensor<bf16> = rand_t(&dev, &[1, 70, 4, 64]);
    assert_eq!(unchanged(&[&x, &b69], &mut y, |y| Ssd::new(&dev, &x, &dt, &a, &b69, &b69).run(y, None)), "b");
    assert_eq!(unchanged(&[&x, &b, &c], &mut y, |y| Ssd::new(&dev, &x, &dt, &a, &b, &c).run(y, None)), "c");
    let dt2: Tensor<bf16> = rand_t(&dev, &[1, 70, 2]);
    assert_eq!(unchanged(&[&x, &b], &mut y, |y| Ssd::new(&dev, &x, &dt2, &a, &b, &b).run(y, None)), "dt");
}

/// A view of the device's zeroed workspace must lie within it: an error naming the view, not
/// an out-of-bounds kernel.
#[test]
fn bad_input_workspace_view_past_its_end() {
    let dev = Device::cpu();
    let mut ws = dev.zeroed_workspace(12).expect("workspace");
    assert!(ws.view(&[3, 4], &[4, 1]).is_ok());
    assert!(ws.view(&[4, 3], &[1, 4]).is_ok(), "a transposed view of the same 12 elements");
    for (shape, strides) in [(vec![4usize, 4], vec![4usize, 1]), (vec![3, 4], vec![5, 1]), (vec![0, 4], vec![4, 1]), (vec![3], vec![4, 1])]
    {
        match ws.view(&shape, &strides) {
            Err(tessera::Error::Tensor { what, .. }) => assert_eq!(what, "workspace view"),
            Err(other) => panic!("{shape:?}/{strides:?}: {other}"),
            Ok(_) => panic!("{shape:?}/{strides:?}: accepted"),
        }
    }
}
