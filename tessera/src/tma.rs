//! `TmaDescriptorCache`: tensor maps for TMA copies, built once per (address, dtype, dims,
//! strides, box, swizzle) with `cuTensorMapEncodeTiled` and passed by value to kernels.

use crate::{Error, Result};
use cudarc::driver::sys;
use std::collections::HashMap;
use std::sync::Mutex;
use tessera_ptx::{DType, TmaBox};

/// A CUDA tensor map: 128 opaque bytes, 64-byte aligned, passed as a kernel parameter.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(C, align(64))]
pub struct TensorMap(pub [u64; 16]);

#[derive(Clone, Debug, PartialEq, Eq, Hash)]
struct Key {
    ptr: u64,
    dtype: DType,
    dims: Vec<u64>,
    strides: Vec<u64>,
    tma: TmaBox,
}

/// Tensor maps built so far on one device.
#[derive(Default)]
pub struct TmaDescriptorCache {
    maps: Mutex<HashMap<Key, TensorMap>>,
}

/// Why a tensor cannot be copied by TMA, or `None` if it can.
pub fn tma_unfit(ptr: u64, dtype: DType, shape: &[usize], strides: &[usize]) -> Option<String> {
    let es = dtype.size() as usize;
    if !ptr.is_multiple_of(16) {
        return Some(format!("address {ptr:#x} is not 16-byte aligned"));
    }
    if strides.last() != Some(&1) {
        return Some(format!("the last dimension's stride is {:?}, not 1", strides.last()));
    }
    if let Some(s) = strides[..strides.len() - 1].iter().find(|&&s| !(s * es).is_multiple_of(16)) {
        return Some(format!("a stride of {s} elements ({} bytes) is not a multiple of 16 bytes", s * es));
    }
    if shape.contains(&0) {
        return Some(format!("shape {shape:?} is empty"));
    }
    None
}

impl TmaDescriptorCache {
    /// How many tensor maps have been built.
    pub fn len(&self) -> usize {
        self.maps.lock().map(|m| m.len()).unwrap_or(0)
    }

    /// Whether none has been built.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The tensor map of a tensor at `ptr` with `shape` and `strides` (elements, row-major
    /// order), for boxes of `tma.rows × tma.cols` over its last two dimensions.
    pub(crate) fn get(&self, ptr: u64, dtype: DType, shape: &[usize], strides: &[usize], tma: TmaBox) -> Result<TensorMap, String> {
        if let Some(why) = tma_unfit(ptr, dtype, shape, strides) {
            return Err(why);
        }
        let es = u64::from(dtype.size());
        // Innermost first.
        let dims: Vec<u64> = shape.iter().rev().map(|&d| d as u64).collect();
        let byte_strides: Vec<u64> = strides.iter().rev().skip(1).map(|&s| s as u64 * es).collect();
        let key = Key { ptr, dtype, dims: dims.clone(), strides: byte_strides.clone(), tma };
        let mut maps = self.maps.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(m) = maps.get(&key) {
            return Ok(*m);
        }
        let mut boxes = vec![1u32; dims.len()];
        boxes[0] = tma.cols;
        if boxes.len() > 1 {
            boxes[1] = tma.rows;
        }
        let elem_strides = vec![1u32; dims.len()];
        let data_type = match dtype {
            DType::BF16 => sys::CUtensorMapDataType::CU_TENSOR_MAP_DATA_TYPE_BFLOAT16,
            DType::F16 => sys::CUtensorMapDataType::CU_TENSOR_MAP_DATA_TYPE_FLOAT16,
            DType::F32 => sys::CUtensorMapDataType::CU_TENSOR_MAP_DATA_TYPE_FLOAT32,
            DType::I32 => sys::CUtensorMapDataType::CU_TENSOR_MAP_DATA_TYPE_INT32,
            DType::F8E4M3 | DType::F8E5M2 => sys::CUtensorMapDataType::CU_TENSOR_MAP_DATA_TYPE_UINT8,
        };
        let swizzle = match tma.swizzle {
            128 => sys::CUtensorMapSwizzle::CU_TENSOR_MAP_SWIZZLE_128B,
            64 => sys::CUtensorMapSwizzle::CU_TENSOR_MAP_SWIZZLE_64B,
            32 => sys::CUtensorMapSwizzle::CU_TENSOR_MAP_SWIZZLE_32B,
            _ => sys::CUtensorMapSwizzle::CU_TENSOR_MAP_SWIZZLE_NONE,
        };
        let mut map = TensorMap([0; 16]);
        // SAFETY: every array holds `rank` (strides `rank - 1`) entries and outlives the call;
        // `map` is 128 bytes, 64-byte aligned, as the driver requires.
        let r = unsafe {
            sys::cuTensorMapEncodeTiled(
                (&mut map as *mut TensorMap).cast(),
                data_type,
                dims.len() as u32,
                ptr as *mut std::ffi::c_void,
                dims.as_ptr(),
                byte_strides.as_ptr(),
                boxes.as_ptr(),
                elem_strides.as_ptr(),
                sys::CUtensorMapInterleave::CU_TENSOR_MAP_INTERLEAVE_NONE,
                swizzle,
                sys::CUtensorMapL2promotion::CU_TENSOR_MAP_L2_PROMOTION_L2_128B,
                sys::CUtensorMapFloatOOBfill::CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE,
            )
        };
        if r != sys::CUresult::CUDA_SUCCESS {
            return Err(format!(
                "cuTensorMapEncodeTiled failed ({r:?}) for dims {dims:?}, strides {byte_strides:?} bytes, box {}x{}",
                tma.rows, tma.cols
            ));
        }
        maps.insert(key, map);
        Ok(map)
    }
}

impl From<String> for Error {
    fn from(s: String) -> Error {
        Error::Tensor { what: "TMA descriptor", expected: "a tensor TMA can copy".into(), found: s }
    }
}
