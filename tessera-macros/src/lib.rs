//! `#[tessera::kernel]`: compiles a Rust function written in Tessera's tile language to PTX
//! while `cargo build` runs, and generates a module with its reflection and a typed launcher.
//! The work is `tessera-frontend`'s; this crate only hands it the tokens.

use proc_macro::TokenStream;

/// Compiles a kernel. See the `tessera` crate's documentation for the language.
///
/// ```ignore
/// #[tessera::kernel]
/// pub fn axpy(a: f32, x: Global<f32, 2>, y: Global<f32, 2>) {
///     let (r, c) = (block::id_y() * 16, block::id_x() * 256);
///     let xt: Tile<f32, 16, 256> = x.load([r, c]);
///     let yt: Tile<f32, 16, 256> = y.load([r, c]);
///     y.store([r, c], a * xt + yt);
/// }
/// ```
///
/// Attribute options: `warpgroups = N` (threads per block = 128·N, default 1);
/// `dtypes(T = [bf16, f16])` (one kernel per type, `<fn>_<type>`; a second parameter,
/// `dtypes(T = [...], Q = [f8e4m3, f8e5m2])`, gives one per pair, `<fn>_<t>_<q>`); `tune(BN = [256, 128],
/// STAGES = [4, 3])` (one variant per combination of the knobs' integer values, in the module's
/// `VARIANTS`; a combination that does not compile is dropped, and an empty set is an error at
/// `tune`; `only(D <= 128 || BN <= 96)` among the knobs builds just the combinations where the
/// condition holds, and may compare a `dtypes` parameter, `only(T == f32 && C == 128 || T != f32
/// && C == 1024)`, for variants per type); `blocks_per_sm = N`; `targets(sm_90a, sm_80)`.
#[proc_macro_attribute]
pub fn kernel(attr: TokenStream, item: TokenStream) -> TokenStream {
    tessera_frontend::expand(attr.into(), item.into()).into()
}

/// Marks a device function: a Rust function in the kernel language that kernels and other
/// device functions call, inlined where it is called. See the `tessera` crate's documentation.
///
/// ```ignore
/// #[tessera::device]
/// pub fn rescale<const M: usize, const N: usize>(x: Tile<f32, M, N>, s: Tile<f32, M, 1>) -> Tile<f32, M, N> {
///     x * s
/// }
/// ```
#[proc_macro_attribute]
pub fn device(attr: TokenStream, item: TokenStream) -> TokenStream {
    tessera_frontend::device(attr.into(), item.into()).into()
}

/// Where a device function's exported `macro_rules!` hands its definition back to the kernel
/// (or device function) that asked for it. Not for direct use.
#[doc(hidden)]
#[proc_macro]
pub fn __resume(input: TokenStream) -> TokenStream {
    tessera_frontend::resume(input.into()).into()
}
