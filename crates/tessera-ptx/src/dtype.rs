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
}

impl DType {
    /// Size of one element in bytes.
    pub const fn size(self) -> u32 {
        match self {
            DType::F32 | DType::I32 => 4,
            DType::BF16 | DType::F16 => 2,
        }
    }

    /// The spelling in the DSL (`f32`, `bf16`, …).
    pub const fn name(self) -> &'static str {
        match self {
            DType::F32 => "f32",
            DType::BF16 => "bf16",
            DType::F16 => "f16",
            DType::I32 => "i32",
        }
    }

    /// Parses the DSL spelling.
    pub fn from_name(s: &str) -> Option<DType> {
        Some(match s {
            "f32" => DType::F32,
            "bf16" => DType::BF16,
            "f16" => DType::F16,
            "i32" => DType::I32,
            _ => return None,
        })
    }

    /// Whether tiles of this type support floating-point math.
    pub const fn is_float(self) -> bool {
        !matches!(self, DType::I32)
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
