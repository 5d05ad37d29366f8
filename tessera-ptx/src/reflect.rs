//! Reflection: what the runtime needs to know about a compiled kernel to check arguments and
//! launch it. The macro embeds these as `'static` constants in the user's crate.

use crate::dtype::DType;

/// A PTX target.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Target {
    /// Hopper (H100, H200): compute capability 9.0 only.
    Sm90a,
    /// The portable path: Ampere and later, JIT-compiled forward by the driver.
    Sm80,
}

impl Target {
    /// Every target the compiler emits, best first.
    pub const ALL: [Target; 2] = [Target::Sm90a, Target::Sm80];

    /// The `.target` name.
    pub const fn name(self) -> &'static str {
        match self {
            Target::Sm90a => "sm_90a",
            Target::Sm80 => "sm_80",
        }
    }

    /// The most shared memory (static and dynamic) one block may use on this target: 227 KiB
    /// on Hopper, 163 KiB on the A100 (the smallest sm_8x that has the most).
    pub const fn max_shared_bytes(self) -> u32 {
        match self {
            Target::Sm90a => 227 * 1024,
            Target::Sm80 => 163 * 1024,
        }
    }

    /// Whether PTX for this target can run on a device of compute capability `major.minor`.
    pub const fn runs_on(self, major: i32, minor: i32) -> bool {
        match self {
            Target::Sm90a => major == 9 && minor == 0,
            Target::Sm80 => major >= 8,
        }
    }
}

/// The box a kernel's TMA copies move of a tensor: the runtime builds its tensor map.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct TmaBox {
    /// Rows of the box (its second-innermost extent).
    pub rows: u32,
    /// Columns of the box (innermost).
    pub cols: u32,
    /// Swizzle span in bytes: 128, 64, 32 or 0.
    pub swizzle: u32,
}

/// What a kernel parameter is.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ParamKind {
    /// A `Global<T, R>` tensor: ABI is pointer, then `rank` u32 dims, then `rank` u32 strides
    /// (in elements), then a 128-byte tensor map if the kernel copies it by TMA.
    Global {
        /// Element type.
        dtype: DType,
        /// Rank.
        rank: u32,
        /// Whether the kernel stores into it.
        writes: bool,
        /// The TMA box, if the kernel copies it by TMA.
        tma: Option<TmaBox>,
    },
    /// A scalar (`f32` or `i32`).
    Scalar(DType),
}

/// One parameter.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ParamInfo {
    /// The Rust name.
    pub name: &'static str,
    /// What it is.
    pub kind: ParamKind,
}

/// The PTX of one variant.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PtxVariant {
    /// Its target.
    pub target: Target,
    /// The PTX module text, packed ([`PtxVariant::ptx`] reads it).
    pub packed: Packed,
}

impl PtxVariant {
    /// The PTX module text (unpacked on the first call in a process, then kept).
    pub fn ptx(&self) -> &'static str {
        self.packed.text()
    }
}

/// Text the macro embeds in a binary, zstd-compressed ([`pack`]), behind a function that is
/// never inlined across crates, so that neither the text nor its compressed bytes go into
/// crate metadata (as the value of a `static` would). [`Packed::text`] unpacks it once per
/// process.
#[derive(Clone, Copy)]
pub struct Packed(pub fn() -> &'static [u8]);

impl Packed {
    /// The text, unpacked on the first call for these bytes and kept for the process.
    pub fn text(&self) -> &'static str {
        use std::collections::HashMap;
        use std::sync::{Mutex, OnceLock};
        static TEXTS: OnceLock<Mutex<HashMap<usize, &'static str>>> = OnceLock::new();
        let bytes = (self.0)();
        let mut texts = TEXTS.get_or_init(Default::default).lock().unwrap_or_else(|e| e.into_inner());
        texts.entry(bytes.as_ptr() as usize).or_insert_with(|| {
            // Bytes the macro packed; a binary whose bytes do not unpack gives a text that the
            // driver (or the interpreter's JSON reader) rejects with its own error.
            let text = zstd::decode_all(bytes).ok().and_then(|v| String::from_utf8(v).ok());
            Box::leak(text.unwrap_or_else(|| "// tessera: embedded text that does not unpack".into()).into_boxed_str())
        })
    }

    /// The packed bytes.
    pub fn bytes(&self) -> &'static [u8] {
        (self.0)()
    }
}

impl std::fmt::Debug for Packed {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Packed({} bytes)", self.bytes().len())
    }
}

impl PartialEq for Packed {
    fn eq(&self, other: &Packed) -> bool {
        self.bytes() == other.bytes()
    }
}

impl Eq for Packed {}

/// `text` compressed as the macro embeds it (zstd, level 3: ~12× on PTX, fast enough that the
/// kernel library's hundreds of variants pack in about a second).
pub fn pack(text: &str) -> Vec<u8> {
    zstd::encode_all(text.as_bytes(), 3).unwrap_or_default()
}

/// Everything known about a kernel at build time.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct KernelSpec {
    /// The entry name.
    pub name: &'static str,
    /// The crate that defines it.
    pub crate_name: &'static str,
    /// Parameters in order.
    pub params: &'static [ParamInfo],
    /// Threads per block.
    pub threads: u32,
    /// Static shared memory per block in bytes.
    pub shared_bytes: u32,
    /// Dynamic shared memory per block in bytes, passed at launch.
    pub dynamic_shared_bytes: u32,
    /// One PTX module per target, best first.
    pub variants: &'static [PtxVariant],
    /// The checked TIR-H as JSON ([`crate::tirh::TileIr::from_json`]), packed: what the CPU
    /// interpreter runs ([`KernelSpec::tirh`] reads it).
    pub tirh_packed: Packed,
    /// The knob values of this variant of a `tune(...)` kernel, in the attribute's order
    /// (empty for a kernel without knobs).
    pub knobs: &'static [(&'static str, i64)],
}

impl KernelSpec {
    /// The checked TIR-H as JSON ([`crate::tirh::TileIr::from_json`]).
    pub fn tirh(&self) -> &'static str {
        self.tirh_packed.text()
    }

    /// The best variant that runs on compute capability `major.minor`.
    pub fn variant_for(&self, major: i32, minor: i32) -> Option<&PtxVariant> {
        self.variants.iter().find(|v| v.target.runs_on(major, minor))
    }

    /// The value of knob `name` in this variant, if the kernel has that knob.
    pub fn knob(&self, name: &str) -> Option<i64> {
        self.knobs.iter().find(|(n, _)| *n == name).map(|&(_, v)| v)
    }

    /// Whether every `(name, value)` pair is one of this variant's knob values.
    pub fn has_knobs(&self, knobs: &[(&str, i64)]) -> bool {
        knobs.iter().all(|&(n, v)| self.knob(n) == Some(v))
    }

    /// The knob values as `BN=128 STAGES=4` (empty for a kernel without knobs).
    pub fn knobs_string(&self) -> String {
        self.knobs.iter().map(|(n, v)| format!("{n}={v}")).collect::<Vec<_>>().join(" ")
    }
}
