//! The block-sparse GEMM against a float64 reference, 128- and 64-blocks: fresh random blocks
//! and patterns (a block row without blocks, rows and K not multiples of the block, K not a multiple of 8), C
//! poisoned with NaN before the launch; and a malformed structure named in the error.

mod common;

use rand::seq::SliceRandom;
use tessera::testing::{gpu_or_skip, rel_error};
use tessera::{bf16, Device, Tensor};
use tessera_kernels::{gemm_bsr, gemm_bsr_variants, Activation, Bsr};

/// A random block pattern: for each of `block_rows` rows, `per_row[r]` distinct block columns
/// of `block_cols`, sorted.
fn pattern(per_row: &[usize], block_cols: usize) -> (Vec<i32>, Vec<i32>) {
    let mut rng = rand::rng();
    let (mut ptr, mut idx) = (vec![0i32], Vec::new());
    for &count in per_row {
        let mut cols: Vec<i32> = (0..block_cols as i32).collect();
        cols.shuffle(&mut rng);
        let mut row: Vec<i32> = cols[..count].to_vec();
        row.sort_unstable();
        idx.extend(row);
        ptr.push(idx.len() as i32);
    }
    (ptr, idx)
}

/// `gelu_tanh(alpha · A·Bᵀ)` with A `m × k` block-sparse in `B`×`B` blocks (`per_row` blocks in
/// each block row), every variant, against float64 over all of C.
fn bsr_matches<const B: usize>(dev: &Device, m: usize, n: usize, k: usize, per_row: &[usize]) {
    let (ptr, idx) = pattern(per_row, k.div_ceil(B));
    let nnz = idx.len();
    // Blocks' elements past m or k are random too: the GEMM must ignore them.
    let values: Vec<bf16> = common::random(nnz * B * B, -1.0, 1.0).into_iter().map(bf16::from_f32).collect();
    let b: Vec<bf16> = common::random(n * k, -1.0, 1.0).into_iter().map(bf16::from_f32).collect();
    let vt = Tensor::from_host(dev, &values, &[nnz, B, B]).unwrap();
    let pt = Tensor::from_host(dev, &ptr, &[ptr.len()]).unwrap();
    let it = Tensor::from_host(dev, &idx, &[nnz]).unwrap();
    let bt = Tensor::from_host(dev, &b, &[n, k]).unwrap();
    let a = Bsr::new(&vt, &pt, &it, m, k).unwrap();
    let alpha = 0.5;
    let mut want = vec![0f64; m * n];
    for i in 0..m {
        let r = i / B;
        for blk in ptr[r] as usize..ptr[r + 1] as usize {
            let c0 = idx[blk] as usize * B;
            for kk in 0..B.min(k - c0) {
                let x = values[(blk * B + i % B) * B + kk].to_f64();
                for j in 0..n {
                    want[i * n + j] += x * b[j * k + c0 + kk].to_f64();
                }
            }
        }
    }
    let want: Vec<f64> = want.iter().map(|&v| common::gelu_tanh(v * alpha as f64)).collect();
    assert_eq!(a.block(), B);
    for variant in gemm_bsr_variants::<bf16>(B) {
        let mut c = Tensor::full(dev, &[m, n], bf16::NAN).unwrap();
        gemm_bsr(a, &bt).alpha(alpha).activation(Activation::GeluTanh).variant(variant).run(dev, &mut c).unwrap();
        let have: Vec<f64> = c.to_host().unwrap().iter().map(|x| x.to_f64()).collect();
        let err = rel_error(&have, &want);
        assert!(err < 1e-2, "{variant} {m}x{n}x{k}, blocks {per_row:?}: relative error {err}");
        println!("{variant} {m}x{n}x{k}, {nnz} blocks: {err:.2e}");
    }
}

#[test]
fn gpu_gemm_bsr_matches_f64_reference() {
    let Some(dev) = gpu_or_skip("gpu_gemm_bsr") else { return };
    bsr_matches::<128>(&dev, 1000, 520, 1100, &[3, 0, 9, 1, 5, 2, 4, 8]);
    bsr_matches::<128>(&dev, 300, 264, 196, &[1, 2, 0]);
    bsr_matches::<128>(&dev, 700, 261, 640, &[5, 0, 3, 2, 1, 4]);
    bsr_matches::<64>(&dev, 1000, 520, 1100, &[3, 0, 9, 1, 5, 2, 4, 8, 17, 0, 1, 6, 2, 3, 11, 5]);
    bsr_matches::<64>(&dev, 300, 264, 196, &[1, 2, 0, 4, 3]);
    bsr_matches::<64>(&dev, 700, 261, 640, &[5, 0, 3, 2, 1, 4, 10, 0, 7, 2, 6]);
}

#[test]
fn interp_gemm_bsr_matches_f64_reference() {
    let dev = Device::cpu_with_threads(2);
    bsr_matches::<128>(&dev, 300, 136, 196, &[1, 0, 2]);
    // N not a multiple of 8: a padded C, copied back.
    bsr_matches::<128>(&dev, 200, 27, 256, &[2, 1]);
    // 64-blocks: a 64-row tile a block row, its columns split between the consumers.
    bsr_matches::<64>(&dev, 300, 136, 196, &[1, 0, 2, 4, 3]);
    bsr_matches::<64>(&dev, 130, 27, 256, &[2, 1, 4]);
}

#[test]
fn interp_gemm_bsr_names_a_malformed_structure() {
    let dev = Device::cpu();
    let values = Tensor::<bf16>::zeros(&dev, &[3, 128, 128]).unwrap();
    let i32s = |v: &[i32]| Tensor::from_host(&dev, v, &[v.len()]).unwrap();
    let err = |ptr: &[i32], idx: &[i32], v: &Tensor<bf16>| Bsr::new(v, &i32s(ptr), &i32s(idx), 256, 384).unwrap_err().to_string();
    let e = err(&[0, 2, 1], &[0, 1, 2], &values);
    assert!(e.contains("`row_ptr`") && e.contains("row_ptr[2] = 1"), "{e}");
    let e = err(&[0, 1, 2], &[0, 1, 2], &values);
    assert!(e.contains("`row_ptr`") && e.contains("nnz = 3"), "{e}");
    let e = err(&[0, 1, 3], &[0, 3, 2], &values);
    assert!(e.contains("`col_idx`") && e.contains("col_idx[1] = 3"), "{e}");
    let e = err(&[0, 1, 3], &[0, -1, 2], &values);
    assert!(e.contains("`col_idx`"), "{e}");
    let e = err(&[0, 1], &[0, 1, 2], &values);
    assert!(e.contains("`row_ptr`"), "{e}");
    let e = err(&[0, 1, 3], &[0, 1, 2], &Tensor::<bf16>::zeros(&dev, &[3, 32, 32]).unwrap());
    assert!(e.contains("`values`") && e.contains("[nnz, 64, 64]"), "{e}");
    // 64-blocks: four block rows of 256, six block columns of 384.
    let v64 = Tensor::<bf16>::zeros(&dev, &[3, 64, 64]).unwrap();
    let e = err(&[0, 1, 3], &[0, 1, 2], &v64);
    assert!(e.contains("`row_ptr`") && e.contains("[5]"), "{e}");
    let e = err(&[0, 1, 1, 2, 3], &[0, 6, 2], &v64);
    assert!(e.contains("`col_idx`") && e.contains("0..6"), "{e}");
    assert_eq!(Bsr::new(&v64, &i32s(&[0, 1, 1, 2, 3]), &i32s(&[0, 5, 2]), 256, 384).unwrap().block(), 64);
    // B's K must be A's; C must be [M, N].
    let (ptr, idx) = (i32s(&[0, 1, 3]), i32s(&[0, 1, 2]));
    let a = Bsr::new(&values, &ptr, &idx, 256, 384).unwrap();
    let mut c = Tensor::<bf16>::zeros(&dev, &[256, 64]).unwrap();
    let e = gemm_bsr(a, &Tensor::<bf16>::zeros(&dev, &[64, 380]).unwrap()).run(&dev, &mut c).unwrap_err().to_string();
    assert!(e.contains("`b`") && e.contains("K = 384"), "{e}");
    let b = Tensor::<bf16>::zeros(&dev, &[64, 384]).unwrap();
    let e = gemm_bsr(a, &b).run(&dev, &mut Tensor::<bf16>::zeros(&dev, &[255, 64]).unwrap()).unwrap_err().to_string();
    assert!(e.contains("`c`"), "{e}");
}
