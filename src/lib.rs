//! Cross-crate tests, benches and examples of Tessera live in this package; it has no API.
//!
//! The library crates are `tessera` (runtime), `tessera-macros` (the `#[kernel]` macro),
//! `tessera-ptx` (the compiler) and `tessera-kernels` (kernels written in the DSL).
