//! The frontend of `#[tessera::kernel]`, as a library on `proc_macro2` token streams, so that
//! it runs (and is tested, fuzzed) without a compiler in the loop; `tessera-macros` is a thin
//! wrapper around [`expand`].
//!
//! The work is split as thiserror's is: `parse` turns the function into TIR-H (syntax and
//! names), `tessera-ptx` checks and compiles it, `expand` writes the module. Every error
//! points at the offending token; all are reported together.

mod device;
mod expand;
mod parse;

pub use expand::{compile, compile_with_devices, device, kernel as expand, resume};
