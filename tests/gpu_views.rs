//! Every public entry point given views no vector load or TMA copy can take as they are: one
//! element into their buffer (misaligned for any 16-byte access) and, where the entry point
//! takes strides, rows padded apart. Each call either computes what the same call computes on
//! contiguous tensors, bit for bit, writing nothing outside the output view, or gives a
//! `tessera::Error::Argument` naming the tensor with every buffer as it was — never a CUDA
//! error, never a silent wrong answer. Which of the two each entry point does on the GPU is
//! pinned here; the interpreter takes every view.

mod common;

use common::random;
use tessera::testing::gpu_or_skip;
use tessera::{bf16, Device, Element, Tensor};

/// What an entry point does with odd views.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Want {
    /// Computes the contiguous call's result.
    Same,
    /// Rejects the view of this argument.
    Rejects(&'static str),
}

/// How odd a view is: misaligned by one element, and rows `pad` elements apart beyond their
/// length (0: contiguous).
#[derive(Clone, Copy, Debug)]
struct Odd {
    pad: usize,
    /// Whether the output is odd too (or only the inputs).
    out: bool,
}

/// `data` as a tensor of `shape`: plain, or odd — one element into a buffer of `poison`, the
/// rows `pad` elements apart (a rank-1 tensor: every second element).
fn place<T: Element>(dev: &Device, data: &[T], shape: &[usize], odd: Option<Odd>, poison: T) -> Tensor<T> {
    let Some(Odd { pad, .. }) = odd else {
        return Tensor::from_host(dev, data, shape).unwrap();
    };
    let rank = shape.len();
    let mut strides = vec![1; rank];
    if rank == 1 {
        strides[0] = 1 + usize::from(pad > 0);
    } else {
        strides[rank - 2] = shape[rank - 1] + pad;
        for k in (0..rank - 2).rev() {
            strides[k] = strides[k + 1] * shape[k + 1];
        }
    }
    let len = 2 + shape.iter().zip(&strides).map(|(&d, &s)| (d.max(1) - 1) * s).sum::<usize>();
    let mut buf = vec![poison; len];
    let mut idx = vec![0usize; rank];
    for &v in data {
        buf[1 + idx.iter().zip(&strides).map(|(i, s)| i * s).sum::<usize>()] = v;
        for d in (0..rank).rev() {
            idx[d] += 1;
            if idx[d] < shape[d] {
                break;
            }
            idx[d] = 0;
        }
    }
    Tensor::from_host(dev, &buf, &[len]).unwrap().restride(1, shape, &strides).unwrap()
}

/// The buffer positions a view covers (its buffer starting at element 0).
fn covered(shape: &[usize], strides: &[usize], offset: usize) -> Vec<usize> {
    let mut at = vec![offset];
    for (&d, &s) in shape.iter().zip(strides) {
        at = at.iter().flat_map(|&a| (0..d).map(move |i| a + i * s)).collect();
    }
    at
}

/// Bits of a slice, to compare NaN poison too.
fn bits<T: Element>(v: &[T]) -> &[u8] {
    bytemuck::cast_slice(v)
}

/// Runs `call` on plain tensors, then on odd views of the same values, and checks the outcome
/// against `want`. `inputs` are (values, shape); the output has `out_shape` and holds
/// `init` (an input too) or, given none, `poison`.
#[allow(clippy::too_many_arguments)]
fn case<T: Element>(
    dev: &Device, name: &str, odd: Odd, want: Want, inputs: &[(Vec<T>, Vec<usize>)], out_shape: &[usize], init: Option<Vec<T>>, poison: T,
    call: impl Fn(&[&Tensor<T>], &mut Tensor<T>) -> tessera::Result<()>,
) {
    let init = init.unwrap_or_else(|| vec![poison; out_shape.iter().product()]);
    let plain: Vec<Tensor<T>> = inputs.iter().map(|(v, s)| place(dev, v, s, None, poison)).collect();
    let mut out = place(dev, &init, out_shape, None, poison);
    call(&plain.iter().collect::<Vec<_>>(), &mut out).unwrap_or_else(|e| panic!("{name}: the contiguous call failed: {e}"));
    let expected = out.to_host().unwrap();
    let odd_in: Vec<Tensor<T>> = inputs.iter().map(|(v, s)| place(dev, v, s, Some(odd), poison)).collect();
    let mut odd_out = place(dev, &init, out_shape, Some(odd).filter(|o| o.out), poison);
    let before: Vec<Vec<T>> = odd_in.iter().map(|t| t.to_host().unwrap()).collect();
    let result = call(&odd_in.iter().collect::<Vec<_>>(), &mut odd_out);
    for (t, b) in odd_in.iter().zip(&before) {
        assert_eq!(bits(&t.to_host().unwrap()), bits(b), "{name}: an input changed");
    }
    let got = odd_out.to_host().unwrap();
    // The output's whole buffer: nothing written outside the view.
    let (shape, strides, offset) = (odd_out.shape().to_vec(), odd_out.strides().to_vec(), odd_out.offset());
    let len = offset + 1 + shape.iter().zip(&strides).map(|(&d, &s)| (d.max(1) - 1) * s).sum::<usize>();
    let all = odd_out.restride(0, &[len], &[1]).unwrap().to_host().unwrap();
    let mut inside = vec![false; all.len()];
    for i in covered(&shape, &strides, offset) {
        inside[i] = true;
    }
    for (i, v) in all.iter().enumerate() {
        if !inside[i] {
            assert_eq!(
                bits(std::slice::from_ref(v)),
                bits(&[poison]),
                "{name}: element {i} of the output's buffer, outside the view, was written"
            );
        }
    }
    match (want, result) {
        (Want::Same, Ok(())) => assert!(bits(&got) == bits(&expected), "{name} ({odd:?}): odd views computed another result"),
        (Want::Rejects(arg), Err(tessera::Error::Argument { arg: named, .. })) if named == arg => {
            assert!(bits(&got) == bits(&init), "{name}: a rejected call wrote its output");
        }
        (want, got) => panic!("{name} ({odd:?}): expected {want:?}, got {got:?}"),
    }
}

fn vals<T: Element>(n: usize, to: fn(f32) -> T) -> Vec<T> {
    random(n, -2.0, 2.0).into_iter().map(to).collect()
}

/// Every entry point, misaligned (`pad` 0) and misaligned with padded rows (`pad` 3).
fn odd_views(dev: &Device) {
    use tessera_kernels as k;
    // The TMA kernels reject what TMA cannot copy, on the GPU and in the interpreter alike.
    let tma = Want::Rejects;
    let b16 = bf16::from_f32;
    let nan16 = bf16::NAN;
    let (m, n) = (37, 1000);
    for pad in [0, 3] {
        let odd = Odd { pad, out: true };
        let x = || (vals(m * n, b16), vec![m, n]);
        let w = || (vals(n, b16), vec![n]);
        case(dev, "rms_norm", odd, Want::Same, &[x(), w()], &[m, n], None, nan16, |i, y| k::rms_norm(dev, i[0], Some(i[1]), 1e-5, y));
        case(dev, "layer_norm", odd, Want::Same, &[x(), w(), w()], &[m, n], None, nan16, |i, y| {
            k::layer_norm(dev, i[0], Some(i[1]), Some(i[2]), 1e-5, y)
        });
        case(dev, "Norm::forward", odd, Want::Same, &[x(), w(), x()], &[m, n], None, nan16, |i, y| {
            k::Norm::rms(1e-5).weight(i[1]).residual(i[2]).forward(dev, i[0], y, None)
        });
        case(dev, "softmax", odd, Want::Same, &[x()], &[m, n], None, nan16, |i, y| k::softmax(dev, i[0], y));
        case(dev, "softmax_backward", odd, Want::Same, &[x(), x()], &[m, n], None, nan16, |i, dx| {
            k::softmax_backward(dev, i[0], i[1], dx, 0.5)
        });
        // fp8 both ways, through an fp8 tensor laid out as the output (odd where it is).
        case(dev, "quantize_fp8, dequantize_fp8", odd, Want::Same, &[x()], &[m, n], None, nan16, |i, y| {
            let len = y.offset() + 1 + (m - 1) * y.strides()[0] + (n - 1) * y.strides()[1];
            let q = Tensor::full(dev, &[len], tessera::F8E4M3::from_bits(0x55))?;
            let mut q = q.restride(y.offset(), &[m, n], y.strides())?;
            k::quantize_fp8(dev, i[0], 4.0, &mut q)?;
            k::dequantize_fp8(dev, &q, 0.25, y)
        });
        case(dev, "bias_gelu", odd, Want::Same, &[x(), w()], &[m, n], None, nan16, |i, y| k::bias_gelu(dev, i[0], i[1], y));
        let xf = || (vals(m * n, |v| v), vec![m, n]);
        case(dev, "axpy", odd, Want::Same, &[xf()], &[m, n], Some(vals(m * n, |v| v)), f32::NAN, |i, y| k::axpy(dev, 1.5, i[0], y));
        case(dev, "row_sum", odd, Want::Same, &[xf()], &[m], None, f32::NAN, |i, o| k::row_sum(dev, i[0], o));
        case(dev, "row_max", odd, Want::Same, &[xf()], &[m], None, f32::NAN, |i, o| k::row_max(dev, i[0], o));
        case(dev, "row_mean", odd, Want::Same, &[xf()], &[m], None, f32::NAN, |i, o| k::row_mean(dev, i[0], o));
        case(dev, "col_sum", odd, Want::Same, &[xf()], &[n], None, f32::NAN, |i, o| k::col_sum(dev, i[0], o));
        case(dev, "col_max", odd, Want::Same, &[xf()], &[n], None, f32::NAN, |i, o| k::col_max(dev, i[0], o));
        case(dev, "col_mean", odd, Want::Same, &[xf()], &[n], None, f32::NAN, |i, o| k::col_mean(dev, i[0], o));
        let rope = k::Rope::new(k::RopeStyle::HalfSplit, k::HeadLayout::Bshd);
        let heads = || (vals(2 * 9 * 3 * 128, b16), vec![2, 9, 3, 128]);
        case(dev, "rope", odd, Want::Same, &[heads()], &[2, 9, 3, 128], None, nan16, |i, y| k::rope(dev, &rope, i[0], y));
        case(dev, "rope_backward", odd, Want::Same, &[heads()], &[2, 9, 3, 128], None, nan16, |i, y| k::rope_backward(dev, &rope, i[0], y));
        case(dev, "Norm::backward", odd, Want::Same, &[x(), x(), w()], &[m, n], None, nan16, |i, dh| {
            let grads = k::NormGrads { dh, dx: None, dweight: None, dbias: None };
            k::Norm::rms(1e-5).weight(i[2]).backward(dev, i[0], i[1], None, grads)
        });
        let shape = [2, 9, 3, 128];
        let init = || Some(vals(shape.iter().product(), b16));
        case(dev, "rope_in_place", odd, Want::Same, &[], &shape, init(), nan16, |_, x| k::rope_in_place(dev, &rope, x));
        case(dev, "rope_backward_in_place", odd, Want::Same, &[], &shape, init(), nan16, |_, x| k::rope_backward_in_place(dev, &rope, x));
        // GEMM copies a misaligned contiguous operand into a padded one; a strided and
        // misaligned one it cannot copy is an error. Its output must be contiguous, at any
        // offset (a misaligned one is stored without TMA).
        let (gm, gn, gk) = (33, 40, 72);
        let ab = || [(vals(gm * gk, b16), vec![gm, gk]), (vals(gn * gk, b16), vec![gn, gk])];
        let operand = if pad == 0 { Want::Same } else { Want::Rejects("a") };
        case(dev, "gemm operands", Odd { out: false, ..odd }, operand, &ab(), &[gm, gn], None, nan16, |i, c| {
            k::gemm(i[0], i[1]).run(dev, c)
        });
        let output = if pad == 0 { Want::Same } else { Want::Rejects("c") };
        let (a, b) = (
            Tensor::from_host(dev, &vals(gm * gk, b16), &[gm, gk]).unwrap(),
            Tensor::from_host(dev, &vals(gn * gk, b16), &[gn, gk]).unwrap(),
        );
        case(dev, "gemm output", odd, output, &[], &[gm, gn], None, nan16, |_, c| k::gemm(&a, &b).run(dev, c));
        // Attention takes contiguous tensors only, which TMA copies: misaligned ones are an
        // error on the GPU.
        if pad == 0 {
            let qkv = || (vals(2 * 130 * 2 * 64, b16), vec![2, 130, 2, 64]);
            let opts = k::Attention::new();
            case(dev, "attention", odd, tma("q"), &[qkv(), qkv(), qkv()], &[2, 130, 2, 64], None, nan16, |i, o| {
                k::attention(dev, &opts, i[0], i[1], i[2], o)
            });
            case(dev, "attention_with_lse", odd, tma("q"), &[qkv(), qkv(), qkv()], &[2, 130, 2, 64], None, nan16, |i, o| {
                let mut lse = Tensor::zeros(dev, &[2, 2, 130])?;
                k::attention_with_lse(dev, &opts, i[0], i[1], i[2], o, &mut lse)
            });
            // Two sequences packed end to end.
            let packed = || (vals(260 * 2 * 64, b16), vec![260, 2, 64]);
            let cu = Tensor::from_host(dev, &[0i32, 100, 260], &[3]).unwrap();
            case(dev, "attention_varlen", odd, tma("q"), &[packed(), packed(), packed()], &[260, 2, 64], None, nan16, |i, o| {
                let mut lse = Tensor::zeros(dev, &[2, 260])?;
                k::attention_varlen(dev, &opts, i[0], i[1], i[2], o, &mut lse, &cu, &cu, 160)
            });
        }
    }
}

#[test]
fn bad_input_odd_views_on_the_gpu() {
    if let Some(dev) = gpu_or_skip("bad_input_odd_views_on_the_gpu") {
        odd_views(&dev);
    }
}

#[test]
fn bad_input_odd_views_in_the_interpreter() {
    odd_views(&Device::cpu());
}

/// `Tensor::scratch`: the shape asked for, contiguous, holding what is written into it; a
/// shape past `usize` is an error, not a panic.
fn scratch_case(dev: &Device) {
    let mut t = Tensor::<f32>::scratch(dev, &[3, 5, 7]).expect("scratch");
    assert_eq!((t.shape(), t.strides()), (&[3usize, 5, 7][..], &[35usize, 7, 1][..]));
    let data = random(3 * 5 * 7, -1.0, 1.0);
    t.copy_from_host(&data).expect("write");
    assert_eq!(t.to_host().expect("read"), data);
    assert!(Tensor::<f32>::scratch(dev, &[usize::MAX, 2]).is_err());
}

#[test]
fn scratch_tensors_on_the_gpu() {
    if let Some(dev) = gpu_or_skip("scratch_tensors_on_the_gpu") {
        scratch_case(&dev);
    }
}

#[test]
fn scratch_tensors_in_the_interpreter() {
    scratch_case(&Device::cpu());
}

/// A buffer another library owns (here a bare cudarc allocation, as candle's storage is) is
/// read in place through `Tensor::borrow_cudarc` — at an offset, by a library kernel — and is
/// still its owner's, unchanged, after the borrow ends.
#[test]
fn gpu_borrowed_cudarc_buffers_are_read_in_place() {
    let Some(dev) = gpu_or_skip("gpu_borrowed_cudarc_buffers_are_read_in_place") else { return };
    let (rows, n, offset) = (5, 96, 3);
    let host = random(offset + rows * n + 7, -4.0, 4.0);
    let owned = dev.stream().unwrap().clone_htod(&host).unwrap();
    let mut got = Tensor::<f32>::full(&dev, &[rows, n], f32::NAN).unwrap();
    {
        let x = Tensor::borrow_cudarc(&dev, &owned, offset, &[rows, n]).unwrap();
        assert_eq!((x.shape(), x.offset()), (&[rows, n][..], offset));
        tessera_kernels::softmax(&dev, &x, &mut got).unwrap();
    }
    let got = got.to_host().unwrap();
    for (r, row) in host[offset..].chunks(n).take(rows).enumerate() {
        let m = row.iter().fold(f64::MIN, |a, &v| a.max(f64::from(v)));
        let sum: f64 = row.iter().map(|&v| (f64::from(v) - m).exp()).sum();
        for (j, &v) in row.iter().enumerate() {
            let want = (f64::from(v) - m).exp() / sum;
            assert!((f64::from(got[r * n + j]) - want).abs() < 1e-6, "row {r}, column {j}: {} vs {want}", got[r * n + j]);
        }
    }
    // The owner's buffer outlives the borrow, as it was.
    assert_eq!(dev.stream().unwrap().clone_dtoh(&owned).unwrap(), host);
    let e = Tensor::borrow_cudarc(&dev, &owned, offset, &[rows + 1, n + 7]).unwrap_err().to_string();
    assert!(e.contains("inside the buffer") && e.contains("offset 3"), "{e}");
}
