//! The order of the compile stages. The only file that knows it.

use crate::emit::PtxEmitter;
use crate::error::CompileError;
use crate::reflect::{ParamKind, Target};
use crate::tirh::{TileIr, Type};
use crate::verify::Callees;
use crate::{lower, verify};

/// Options for one compilation.
#[derive(Clone, Debug)]
pub struct CompileOptions {
    /// Targets to emit PTX for.
    pub targets: Vec<Target>,
}

impl Default for CompileOptions {
    fn default() -> Self {
        CompileOptions { targets: Target::ALL.to_vec() }
    }
}

/// One target's output.
#[derive(Clone, Debug)]
pub struct CompiledVariant {
    /// The target.
    pub target: Target,
    /// The `tirt` dump.
    pub tirt: String,
    /// The PTX module.
    pub ptx: String,
}

/// A compiled kernel: every stage's dump, the PTX per target, and reflection.
#[derive(Clone, Debug)]
pub struct CompiledKernel {
    /// The entry name.
    pub name: String,
    /// The `tirh` dump of the checked kernel.
    pub tirh: String,
    /// The checked kernel as JSON, for the CPU interpreter.
    pub tirh_json: String,
    /// Parameters and what they are.
    pub params: Vec<(String, ParamKind)>,
    /// Threads per block.
    pub threads: u32,
    /// Static shared memory per block.
    pub shared_bytes: u32,
    /// Dynamic shared memory per block (rings, barriers, alignment slack).
    pub dynamic_shared_bytes: u32,
    /// One per target that the kernel fits, in the order asked.
    pub variants: Vec<CompiledVariant>,
    /// Targets left out, and why (e.g. TMA on sm_80).
    pub dropped: Vec<(Target, String)>,
}

/// Runs every stage: typecheck → lower → emit, once per target. A kernel that calls device
/// functions needs [`compile_with`].
pub fn compile(ir: TileIr, opts: &CompileOptions) -> Result<CompiledKernel, Vec<CompileError>> {
    compile_checked(verify::typecheck(ir)?, opts)
}

/// [`compile`], with the kernel's device-function calls inlined from `callees` as the type
/// checker meets them.
pub fn compile_with(ir: TileIr, opts: &CompileOptions, callees: &mut dyn Callees) -> Result<CompiledKernel, Vec<CompileError>> {
    compile_checked(verify::typecheck_with(ir, callees)?, opts)
}

fn compile_checked(ir: TileIr, opts: &CompileOptions) -> Result<CompiledKernel, Vec<CompileError>> {
    let mut variants = Vec::new();
    let mut dropped = Vec::new();
    let mut first: Option<crate::tirt::PtxKernel> = None;
    for &target in &opts.targets {
        let lowered = lower::lower(&ir, target).and_then(|tirt| {
            // The driver counts static shared memory in 1024-byte units beside the dynamic
            // (768 static + 231472 dynamic bytes failed to load on an H100, run 228).
            let bytes = tirt.shared_bytes.next_multiple_of(1024) + tirt.dynamic_shared_bytes;
            if bytes > target.max_shared_bytes() {
                let loc = ir.body.first().map(|s| s.loc).unwrap_or_default();
                let message = format!(
                    "the kernel needs {bytes} bytes of shared memory per block, over {}'s limit of {}",
                    target.name(),
                    target.max_shared_bytes()
                );
                return Err(CompileError::Lower { message, loc });
            }
            Ok(tirt)
        });
        match lowered {
            Ok(tirt) => {
                variants.push(CompiledVariant { target, tirt: tirt.to_string(), ptx: PtxEmitter::new(target).emit(&tirt, &ir.file) });
                first.get_or_insert(tirt);
            }
            // A target that lacks a feature the kernel uses is left out, if another is built.
            Err(e) if target == Target::Sm80 => dropped.push((target, e.to_string())),
            Err(e) => return Err(vec![e]),
        }
    }
    let Some(tirt) = first else {
        let loc = ir.body.first().map(|s| s.loc).unwrap_or_default();
        return Err(vec![CompileError::Lower { message: "no target can build this kernel".into(), loc }]);
    };
    let params = ir
        .params
        .iter()
        .map(|p| {
            let kind = match p.ty {
                Type::Global { dtype, rank } => {
                    let tma = tirt.tma.iter().find(|(n, _)| *n == p.name).map(|(_, u)| crate::reflect::TmaBox {
                        rows: u.rows,
                        cols: u.cols,
                        swizzle: u.swizzle,
                    });
                    ParamKind::Global { dtype, rank, writes: ir.writes(&p.name), tma }
                }
                Type::Scalar(crate::dtype::ScalarType::F32) => ParamKind::Scalar(crate::dtype::DType::F32),
                _ => ParamKind::Scalar(crate::dtype::DType::I32),
            };
            (p.name.clone(), kind)
        })
        .collect();
    Ok(CompiledKernel {
        name: ir.name.clone(),
        tirh: ir.to_string(),
        tirh_json: ir.to_json(),
        params,
        threads: tirt.threads,
        shared_bytes: tirt.shared_bytes,
        dynamic_shared_bytes: tirt.dynamic_shared_bytes,
        variants,
        dropped,
    })
}
