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

/// The lowest address of the wait watchdog's tags (see [`tirh::TileIr::wait_limit`]).
pub const WAIT_TAG_BASE: u64 = 0x7000_0000_0000;
/// Bytes between the tags of one wait's ring stages.
pub const WAIT_TAG_STAGE: u64 = 64;

/// The address a watchdog wait at DSL `line` stores to once it has spun too long: the
/// producer side (waiting for a stage to empty) or the consumer side (waiting for it to fill),
/// at ring `stage`. Far from any allocation, so memcheck reports the store.
pub fn wait_tag(line: u32, producer: bool, stage: u32) -> u64 {
    WAIT_TAG_BASE + u64::from(line) * 4096 + if producer { 2048 } else { 0 } + u64::from(stage) * WAIT_TAG_STAGE
}

/// `(line, producer side, stage)` from an address memcheck reported, if it is a wait's tag.
pub fn wait_tag_decode(addr: u64) -> Option<(u32, bool, u32)> {
    let off = addr.checked_sub(WAIT_TAG_BASE)?;
    let line = u32::try_from(off / 4096).ok()?;
    let (producer, rest) = (off % 4096 >= 2048, off % 2048);
    (rest % WAIT_TAG_STAGE == 0).then_some((line, producer, (rest / WAIT_TAG_STAGE) as u32))
}

pub use dtype::{DType, ScalarType};
pub use error::CompileError;
pub use pipeline::{compile, compile_with, CompileOptions, CompiledKernel, CompiledVariant};
pub use reflect::{pack, KernelSpec, Packed, ParamInfo, ParamKind, PtxVariant, Target, TmaBox};
