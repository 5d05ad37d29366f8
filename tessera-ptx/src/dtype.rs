//! Element and scalar types of the language.

use std::fmt;

/// The element type of a tile or a global tensor.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, serde::Serialize, serde::Deserialize)]
pub enum DType {
    /// IEEE binary32.
    F32,
    /// bfloat16.
    BF16,
    /// IEEE binary16.
    F16,
    /// 32-bit signed integer.
    I32,
    /// fp8 E4M3 (`f8e4m3`): 4 exponent bits, 3 mantissa bits, no infinities, largest 448.
    /// Conversions to it round to nearest even and saturate (`cvt.rn.satfinite`): beyond
    /// ±448, ±∞ included, gives ±448; NaN gives the NaN code 0x7F. sm_89 and later.
    F8E4M3,
    /// fp8 E5M2 (`f8e5m2`): 5 exponent bits, 2 mantissa bits, largest finite 57344.
    /// Conversions saturate like [`DType::F8E4M3`]'s (±∞ gives ±57344; NaN gives 0x7F).
    F8E5M2,
}

impl DType {
    /// Size of one element in bytes.
    pub const fn size(self) -> u32 {
        match self {
            DType::F32 | DType::I32 => 4,
            DType::BF16 | DType::F16 => 2,
            DType::F8E4M3 | DType::F8E5M2 => 1,
        }
    }

    /// The spelling in the DSL (`f32`, `bf16`, …).
    pub const fn name(self) -> &'static str {
        match self {
            DType::F32 => "f32",
            DType::BF16 => "bf16",
            DType::F16 => "f16",
            DType::I32 => "i32",
            DType::F8E4M3 => "f8e4m3",
            DType::F8E5M2 => "f8e5m2",
        }
    }

    /// Parses the DSL spelling.
    pub fn from_name(s: &str) -> Option<DType> {
        Some(match s {
            "f32" => DType::F32,
            "bf16" => DType::BF16,
            "f16" => DType::F16,
            "i32" => DType::I32,
            "f8e4m3" => DType::F8E4M3,
            "f8e5m2" => DType::F8E5M2,
            _ => return None,
        })
    }

    /// Whether tiles of this type support floating-point math.
    pub const fn is_float(self) -> bool {
        !matches!(self, DType::I32)
    }

    /// Whether this is one of the fp8 types (held one per 16-bit register, the code in the
    /// low byte; converted through f32 by `cvt`, which needs sm_89 or later).
    pub const fn is_fp8(self) -> bool {
        matches!(self, DType::F8E4M3 | DType::F8E5M2)
    }

    /// The `cvt` spelling of an fp8 type (`e4m3`, `e5m2`), else `None`.
    pub const fn fp8_cvt_name(self) -> Option<&'static str> {
        match self {
            DType::F8E4M3 => Some("e4m3"),
            DType::F8E5M2 => Some("e5m2"),
            _ => None,
        }
    }
}

impl fmt::Display for DType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// The type of a uniform scalar value (the same in every thread of a warpgroup).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
pub enum ScalarType {
    /// 32-bit float.
    F32,
    /// 32-bit signed integer, the index type.
    I32,
    /// A condition.
    Bool,
}

impl fmt::Display for ScalarType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            ScalarType::F32 => "f32",
            ScalarType::I32 => "i32",
            ScalarType::Bool => "bool",
        })
    }
}
