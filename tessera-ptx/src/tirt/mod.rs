//! TIR-T: the target-level IR. A flat list of PTX instructions over named virtual registers,
//! produced by [`crate::lower`] and printed by [`crate::emit`]. `Display` is the `tirt` dump.

use std::fmt;

/// A register class, which fixes its PTX type and name prefix.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum RegClass {
    /// `.pred`, `%p`.
    Pred,
    /// `.b16`, `%h` (bf16 and f16 elements).
    B16,
    /// `.b32`, `%r` (integers).
    B32,
    /// `.f32`, `%f`.
    F32,
    /// `.b64`, `%rd` (addresses).
    B64,
}

impl RegClass {
    /// The PTX type of the declaration.
    pub fn ptx_type(self) -> &'static str {
        match self {
            RegClass::Pred => ".pred",
            RegClass::B16 => ".b16",
            RegClass::B32 => ".b32",
            RegClass::F32 => ".f32",
            RegClass::B64 => ".b64",
        }
    }

    /// The register name prefix.
    pub fn prefix(self) -> &'static str {
        match self {
            RegClass::Pred => "%p",
            RegClass::B16 => "%h",
            RegClass::B32 => "%r",
            RegClass::F32 => "%f",
            RegClass::B64 => "%rd",
        }
    }
}

/// A virtual register: an index into [`PtxKernel::regs`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Reg {
    /// Its class.
    pub class: RegClass,
    /// Its index in the kernel's register table.
    pub id: u32,
}

/// An instruction operand.
#[derive(Clone, Debug, PartialEq)]
pub enum Operand {
    /// A register.
    Reg(Reg),
    /// An integer immediate.
    Imm(i64),
    /// An f32 immediate, printed in hex (`0f3F800000`) so that it round-trips exactly.
    F32(f32),
    /// A symbol: a parameter, a special register (`%tid.x`), a label or a shared array.
    Sym(String),
    /// A memory address `[reg+offset]`.
    Addr(Reg, i64),
    /// A memory address `[symbol]`.
    SymAddr(String),
    /// A vector `{a, b, …}`.
    Vec(Vec<Reg>),
}

/// One TIR-T instruction.
#[derive(Clone, Debug, PartialEq)]
pub enum Inst {
    /// A comment line (the DSL statement an instruction block comes from).
    Comment(String),
    /// A branch target.
    Label(String),
    /// `[@p] op a, b, …;` — `pred` is the guard and whether it is negated.
    Op {
        /// Optional guard predicate, negated if the flag is set.
        pred: Option<(Reg, bool)>,
        /// The opcode with its suffixes (`add.f32`, `ld.global.f32`).
        op: String,
        /// Operands, destination first.
        args: Vec<Operand>,
    },
}

/// A kernel parameter as PTX declares it.
#[derive(Clone, Debug, PartialEq)]
pub struct PtxParam {
    /// Parameter symbol.
    pub name: String,
    /// `.u64`, `.u32`, `.f32`, `.s32`, or `.align 64 .b8` for a byte array.
    pub ty: &'static str,
    /// For a byte array (a TMA tensor map), its size.
    pub bytes: Option<u32>,
}

/// What a kernel's TMA copies need of one global tensor: reflection tells the runtime.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct TmaUse {
    /// Box rows (the shared view's rows).
    pub rows: u32,
    /// Box columns.
    pub cols: u32,
    /// Swizzle span in bytes (0, 32, 64, 128).
    pub swizzle: u32,
}

/// A kernel in TIR-T.
#[derive(Clone, Debug, PartialEq)]
pub struct PtxKernel {
    /// Entry name.
    pub name: String,
    /// Parameters in ABI order.
    pub params: Vec<PtxParam>,
    /// Threads per block (`.reqntid`).
    pub threads: u32,
    /// Static shared memory in bytes.
    pub shared_bytes: u32,
    /// Dynamic shared memory in bytes (rings and barriers, plus alignment slack).
    pub dynamic_shared_bytes: u32,
    /// `.minnctapersm` (0 for none): the kernel's `blocks_per_sm`, or 1 where `setmaxnreg`
    /// needs a register cap at entry.
    pub min_ctas_per_sm: u32,
    /// Globals copied by TMA, with their box.
    pub tma: Vec<(String, TmaUse)>,
    /// Register names, indexed by [`Reg::id`].
    pub regs: Vec<(RegClass, String)>,
    /// The body.
    pub body: Vec<Inst>,
}

impl fmt::Display for Operand {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Operand::Reg(r) => write!(f, "{}#{}", r.class.prefix(), r.id),
            Operand::Imm(v) => write!(f, "{v}"),
            Operand::F32(v) => write!(f, "0f{:08X}", v.to_bits()),
            Operand::Sym(s) => f.write_str(s),
            Operand::Addr(r, 0) => write!(f, "[{}#{}]", r.class.prefix(), r.id),
            Operand::Addr(r, o) => write!(f, "[{}#{}+{o}]", r.class.prefix(), r.id),
            Operand::SymAddr(s) => write!(f, "[{s}]"),
            Operand::Vec(rs) => {
                f.write_str("{")?;
                for (i, r) in rs.iter().enumerate() {
                    if i > 0 {
                        f.write_str(", ")?;
                    }
                    write!(f, "{}#{}", r.class.prefix(), r.id)?;
                }
                f.write_str("}")
            }
        }
    }
}

impl fmt::Display for PtxKernel {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(f, "tirt {} threads={} shared={}", self.name, self.threads, self.shared_bytes)?;
        for p in &self.params {
            writeln!(f, "  param {} {}", p.ty, p.name)?;
        }
        for inst in &self.body {
            match inst {
                Inst::Comment(c) => writeln!(f, "  // {c}")?,
                Inst::Label(l) => writeln!(f, "{l}:")?,
                Inst::Op { pred, op, args } => {
                    f.write_str("    ")?;
                    if let Some((p, neg)) = pred {
                        write!(f, "@{}%p#{} ", if *neg { "!" } else { "" }, p.id)?;
                    }
                    write!(f, "{op}")?;
                    for (i, a) in args.iter().enumerate() {
                        write!(f, "{}{a}", if i == 0 { " " } else { ", " })?;
                    }
                    writeln!(f)?;
                }
            }
        }
        Ok(())
    }
}
