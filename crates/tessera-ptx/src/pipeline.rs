//! The order of the compile stages. The only file that knows it.

use crate::emit::PtxEmitter;
use crate::error::CompileError;
use crate::reflect::{ParamKind, Target};
use crate::tirh::{TileIr, Type};
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
    /// Parameters and what they are.
    pub params: Vec<(String, ParamKind)>,
    /// Threads per block.
    pub threads: u32,
    /// Static shared memory per block.
    pub shared_bytes: u32,
    /// One per target, in the order asked.
    pub variants: Vec<CompiledVariant>,
}

/// Runs every stage: typecheck → lower → emit, once per target.
pub fn compile(ir: TileIr, opts: &CompileOptions) -> Result<CompiledKernel, Vec<CompileError>> {
    let ir = verify::typecheck(ir)?;
    let tirt = lower::lower(&ir).map_err(|e| vec![e])?;
    let tirt_text = tirt.to_string();
    let variants = opts
        .targets
        .iter()
        .map(|&target| CompiledVariant { target, tirt: tirt_text.clone(), ptx: PtxEmitter::new(target).emit(&tirt, &ir.file) })
        .collect();
    let params = ir
        .params
        .iter()
        .map(|p| {
            let kind = match p.ty {
                Type::Global { dtype, rank } => ParamKind::Global { dtype, rank, writes: ir.writes(&p.name) },
                Type::Scalar(crate::dtype::ScalarType::F32) => ParamKind::Scalar(crate::dtype::DType::F32),
                _ => ParamKind::Scalar(crate::dtype::DType::I32),
            };
            (p.name.clone(), kind)
        })
        .collect();
    Ok(CompiledKernel {
        name: ir.name.clone(),
        tirh: ir.to_string(),
        params,
        threads: tirt.threads,
        shared_bytes: tirt.shared_bytes,
        variants,
    })
}
