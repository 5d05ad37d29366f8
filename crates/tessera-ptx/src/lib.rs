//! The compiler core of Tessera: TIR-H, its verifier, lowering to TIR-T, the PTX emitter and
//! reflection. It knows nothing of `syn` or `cudarc`: the `tessera-macros` frontend builds a
//! [`tirh::TileIr`] from a Rust function and calls [`pipeline::compile`]; the `tessera` runtime
//! reads the [`reflect::KernelSpec`] the macro embeds.
//!
//! # The language, as TIR-H sees it
//!
//! A kernel describes one thread block of `warpgroups × 128` threads. Its values are
//!
//! - **uniform scalars** (`i32`, `f32`, `bool`): parameters, literals, `block::id_x()`,
//!   `warpgroup::id()`, `tensor.dim(axis)` and arithmetic on them. Every thread of a
//!   warpgroup holds the same value, so `if` and `for` on them never diverge within it;
//! - **register tiles** `Tile<T, M, N>` (`T` in `f32`, `bf16`, `f16`; `M`, `N` powers of
//!   two): spread over the warpgroup's registers in a [`layout::Layout`]. Elementwise math
//!   broadcasts `M×1` and `1×N` operands and computes in f32, rounding back to `T` to nearest
//!   even. Reductions (`sum`, `max`, `min` along an axis) give an `M×1` or `1×N` tile;
//! - **global tensors** `Global<T, R>`: a pointer, `R` dims and `R` strides (elements).
//!   `load` and `store` move a tile at an origin with bounds masks: out-of-bounds elements
//!   read as the fill value and are never written.
//!
//! # Stages
//!
//! | stage | module | dump |
//! |---|---|---|
//! | type check | [`verify`] | `tirh` |
//! | lower | [`lower`] | `tirt` |
//! | emit | [`emit`] | `ptx` |
#![warn(missing_docs)]

pub mod dtype;
pub mod emit;
pub mod error;
pub mod layout;
pub mod lower;
pub mod pipeline;
pub mod random;
pub mod reflect;
pub mod tirh;
pub mod tirt;
pub mod verify;

pub use dtype::{DType, ScalarType};
pub use error::CompileError;
pub use pipeline::{compile, CompileOptions, CompiledKernel, CompiledVariant};
pub use reflect::{KernelSpec, ParamInfo, ParamKind, PtxVariant, Target, TmaBox};
