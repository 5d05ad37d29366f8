//! Typing of the Hopper pieces: shared rings and views, pipelines, TMA loads, `mma_sync`.

use super::Checker;
use crate::dtype::{DType, ScalarType};
use crate::error::CompileError;
use crate::tirh::{Expr, ExprKind, SmemType, SourceLoc, Type};

/// Shapes `mma_sync` accepts: `wgmma.mma_async` m64nNk16.
fn check_mma_shapes(
    acc: crate::tirh::TileType, a: (DType, u32, u32), b: (DType, u32, u32), at: [SourceLoc; 3],
) -> Result<(), CompileError> {
    let [acc_loc, a_loc, b_loc] = at;
    if acc.dtype != DType::F32 {
        return Err(CompileError::ty(acc_loc, format!("`mma_sync` accumulates in f32: expected a `Tile<f32, M, N>`, found `{acc}`")));
    }
    let (at, am, ak) = a;
    let (bt, bn, bk) = b;
    if !matches!(at, DType::BF16 | DType::F16) && !at.is_fp8() {
        return Err(CompileError::ty(a_loc, format!("`mma_sync` takes bf16, f16, f8e4m3 or f8e5m2 operands, found `{at}`")));
    }
    if at.is_fp8() && !bt.is_fp8() {
        return Err(CompileError::ty(b_loc, format!("`mma_sync`: `b` must be an fp8 type (f8e4m3 or f8e5m2) like `a`, found `{bt}`")));
    }
    if !at.is_fp8() && bt != at {
        return Err(CompileError::ty(b_loc, format!("`mma_sync`: `b` must be `{at}` like `a`, found `{bt}`")));
    }
    // One instruction's K: 32 bytes of a row.
    let k_step = 32 / at.size();
    if am != acc.rows || am % 64 != 0 {
        return Err(CompileError::ty(
            a_loc,
            format!("`mma_sync`: `a` must have the accumulator's {} rows, a multiple of 64, found {am}", acc.rows),
        ));
    }
    if bn != acc.cols || !(8..=256).contains(&bn) || bn % 8 != 0 {
        return Err(CompileError::ty(
            b_loc,
            format!("`mma_sync`: `b` (N×K) must have the accumulator's {} columns as rows, 8 to 256 in steps of 8, found {bn}", acc.cols),
        ));
    }
    if bk != ak || ak % k_step != 0 {
        return Err(CompileError::ty(
            b_loc,
            format!("`mma_sync`: `b` must have {ak} columns (K) like `a`, a multiple of {k_step}, found {bk}"),
        ));
    }
    Ok(())
}

impl Checker<'_> {
    /// The type of a Hopper expression, or `None` if `e` is not one.
    pub(super) fn hopper_expr(&mut self, e: &mut Expr) -> Option<Result<Type, CompileError>> {
        use crate::tirh::ExprKind as K;
        let loc = e.loc;
        Some(match &mut e.kind {
            K::SmemRing(t) => check_ring(*t, loc).map(Type::Smem),
            K::PipelineNew { stages, consumers } => {
                if *stages == 0 || *consumers == 0 {
                    Err(CompileError::ty(loc, "a pipeline needs at least one stage and one consumer warpgroup"))
                } else {
                    Ok(Type::Pipeline { stages: *stages, consumers: *consumers })
                }
            }
            K::QueueNew { stages, consumers, counter } => {
                if *stages == 0 || *stages > 16 || *consumers == 0 {
                    Err(CompileError::ty(loc, "a tile queue needs 1 to 16 slots and at least one consumer warpgroup"))
                } else {
                    match self.global(counter, loc) {
                        Ok((DType::I32, 1)) => Ok(Type::Queue { stages: *stages, consumers: *consumers }),
                        Ok((dtype, rank)) => Err(CompileError::ty(
                            loc,
                            format!("a tile queue counts in a `Global<i32, 1>`, `{counter}` is `Global<{dtype}, {rank}>`"),
                        )),
                        Err(e) => Err(e),
                    }
                }
            }
            K::SmemAt { ring, stage } => {
                let ring = ring.clone();
                match self.lookup(&ring).map(|b| b.ty) {
                    Some(Type::Smem(t)) => self
                        .expect_scalar(stage, ScalarType::I32, "a stage")
                        .and_then(|_| self.stage_fits(&ring, t.stages, stage))
                        .map(|_| Type::SmemView { dtype: t.dtype, rows: t.rows, cols: t.cols, swizzle: t.swizzle }),
                    other => Err(CompileError::ty(
                        loc,
                        format!("`{ring}` is {}, expected a shared ring (`Smem::<T, M, N>::ring(stages)`)", describe(other)),
                    )),
                }
            }
            K::SmemRows { view, start, rows } => {
                let rows = *rows;
                match self.expr(view) {
                    Ok(Type::SmemView { dtype, rows: have, cols, swizzle }) => {
                        // Swizzled rows go in 8-row atoms; unswizzled ones any number at a time.
                        if rows == 0 || rows > have {
                            Err(CompileError::ty(loc, format!("`rows`: expected 1 to {have} rows, found {rows}")))
                        } else if swizzle > 0 && rows % 8 != 0 {
                            Err(CompileError::ty(
                                loc,
                                format!("`rows` of a {swizzle}-byte swizzled ring: expected a multiple of 8 (its 8-row atoms) up to {have}, found {rows}; an unswizzled ring (`ring_swizzled(stages, 0)`) takes any number"),
                            ))
                        } else {
                            self.expect_scalar(start, ScalarType::I32, "a first row").map(|_| Type::SmemView { dtype, rows, cols, swizzle })
                        }
                    }
                    Ok(other) => Err(CompileError::ty(view.loc, format!("`rows` takes a shared view, found `{other}`"))),
                    Err(e) => Err(e),
                }
            }
            K::SmemCols { view, start, cols } => {
                let (start, cols) = (*start, *cols);
                match self.expr(view) {
                    Ok(Type::SmemView { dtype, rows, cols: have, swizzle }) => {
                        // Whole column panels of one swizzle span each; of an unswizzled view of
                        // one row, any run of columns starting on 16 bytes.
                        let panel = if swizzle == 0 { have } else { swizzle / dtype.size() };
                        let whole = start == 0 && cols == have;
                        let run =
                            swizzle == 0 && rows == 1 && cols > 0 && (start * dtype.size()).is_multiple_of(16) && start + cols <= have;
                        if swizzle == 0 && !whole && !run {
                            Err(CompileError::ty(
                                loc,
                                format!("`cols({start}, {cols})` of a `{rows}×{have}` unswizzled shared view: expected a view of one row (`.rows(r, 1)`) and columns starting on 16 bytes, inside its {have} columns"),
                            ))
                        } else if !whole && !run && (cols == 0 || start % panel != 0 || cols % panel != 0 || start + cols > have) {
                            Err(CompileError::ty(
                                loc,
                                format!("`cols({start}, {cols})` of a `{rows}×{have}` shared view: expected whole column panels of a swizzled ring ({panel} columns each here), inside its {have} columns"),
                            ))
                        } else {
                            Ok(Type::SmemView { dtype, rows, cols, swizzle })
                        }
                    }
                    Ok(other) => Err(CompileError::ty(view.loc, format!("`cols` takes a tile or a shared view, found `{other}`"))),
                    Err(e) => Err(e),
                }
            }
            K::PipeStage { pipe, .. } => self.pipeline(pipe, loc).map(|_| Type::Scalar(ScalarType::I32)),
            K::SmemLoad(view) => match self.expr(view) {
                Ok(Type::SmemView { dtype, .. }) if dtype.is_fp8() => Err(CompileError::ty(view.loc, fp8_view_only(dtype, "load"))),
                Ok(Type::SmemView { dtype, rows, cols, swizzle }) => {
                    let row = cols * dtype.size();
                    if swizzle > 0 && row > swizzle && !row.is_multiple_of(swizzle) {
                        Err(CompileError::ty(view.loc, format!("`load`: rows of {row} bytes do not fit a {swizzle}-byte swizzle")))
                    } else {
                        Ok(Type::Tile(crate::tirh::TileType { dtype, rows, cols }))
                    }
                }
                Ok(other) => Err(CompileError::ty(view.loc, format!("`load()` reads a shared view (`ring.at(stage)`), found `{other}`"))),
                Err(e) => Err(e),
            },
            _ => return None,
        })
    }

    /// `ring.at(stage)` where `stage` came from a pipeline: the pipeline guards a ring of as
    /// many stages, and the stage is not yet released.
    fn stage_fits(&self, ring: &str, stages: u32, stage: &Expr) -> Result<(), CompileError> {
        let (Some(slot), ExprKind::Var(name)) = (self.slot_of(stage), &stage.kind) else { return Ok(()) };
        let pipe = self.pipes.get(slot.pipe as usize).cloned().unwrap_or_default();
        if let Some(line) = slot.released {
            return Err(CompileError::ty(
                stage.loc,
                format!("`{name}` was released to `{pipe}` (line {line}): the producer may already be refilling its stage; read `{ring}.at({name})` before `{pipe}.release({name})`"),
            ));
        }
        if slot.stages != stages {
            return Err(CompileError::ty(
                stage.loc,
                format!("`{ring}` is a ring of {stages} stage(s), `{name}` a stage of `{pipe}`, a `Pipeline<{}>`: a pipeline and the ring it guards have as many stages", slot.stages),
            ));
        }
        Ok(())
    }

    pub(super) fn pipeline(&self, name: &str, loc: SourceLoc) -> Result<(u32, u32), CompileError> {
        self.barrier_ring(name, loc, false)
    }

    pub(super) fn queue(&self, name: &str, loc: SourceLoc) -> Result<(u32, u32), CompileError> {
        self.barrier_ring(name, loc, true)
    }

    /// `(stages, consumers)` of the pipeline (or, with `queue`, the tile queue) `name`.
    fn barrier_ring(&self, name: &str, loc: SourceLoc, queue: bool) -> Result<(u32, u32), CompileError> {
        if self.poisoned.iter().any(|p| p == name) {
            // Already reported where it was bound.
            return Err(CompileError::ty(loc, String::new()));
        }
        match (self.lookup(name).map(|b| b.ty), queue) {
            (Some(Type::Pipeline { stages, consumers }), false) | (Some(Type::Queue { stages, consumers }), true) => {
                Ok((stages, consumers))
            }
            (other, _) => {
                let want = if queue { "TileQueue" } else { "Pipeline" };
                Err(CompileError::ty(loc, format!("`{name}` is {}, expected a `{want}`", describe(other))))
            }
        }
    }

    pub(super) fn tma_load(
        &mut self, dst: &mut Expr, tensor: &str, index: &mut [Expr], pipe: &str, loc: SourceLoc,
    ) -> Result<(), CompileError> {
        let (dtype, rank) = self.global(tensor, loc)?;
        let (pipe_stages, _) = self.pipeline(pipe, loc)?;
        self.indices(tensor, rank, index, loc)?;
        // The ring the copy lands in (`ring.at(s)`, or rows of it) fills the pipeline's stages.
        let mut view = &*dst;
        while let ExprKind::SmemRows { view: v, .. } | ExprKind::SmemCols { view: v, .. } = &view.kind {
            view = v;
        }
        if let ExprKind::SmemAt { ring, .. } = &view.kind {
            if let Some(Type::Smem(t)) = self.lookup(ring).map(|b| b.ty) {
                if t.stages != pipe_stages {
                    return Err(CompileError::ty(
                        dst.loc,
                        format!("`tma::load` fills `{ring}`, a ring of {} stage(s), and signals `{pipe}`, a `Pipeline<{pipe_stages}>`: a pipeline and the ring it guards have as many stages", t.stages),
                    ));
                }
            }
        }
        if !(2..=3).contains(&rank) {
            return Err(CompileError::ty(loc, format!("`tma::load` copies from a rank-2 or rank-3 tensor, `{tensor}` has rank {rank}")));
        }
        match self.expr(dst)? {
            Type::SmemView { dtype: d, rows, cols, .. } if d == dtype && rows <= 256 => tma_rows("tma::load", d, cols, dst.loc),
            Type::SmemView { dtype: d, .. } if d != dtype => {
                Err(CompileError::ty(dst.loc, format!("`tma::load`: `{tensor}` is `{dtype}`, the shared tile is `{d}`")))
            }
            Type::SmemView { rows, .. } => Err(CompileError::ty(dst.loc, format!("`tma::load`: a box has at most 256 rows, found {rows}"))),
            other => Err(CompileError::ty(dst.loc, format!("`tma::load` copies into a shared view (`ring.at(stage)`), found `{other}`"))),
        }
    }

    #[allow(clippy::too_many_arguments)]
    pub(super) fn mma(&mut self, acc: &str, a: &mut Expr, b: &mut Expr, b_kn: bool, a_t: bool, loc: SourceLoc) -> Result<(), CompileError> {
        let Some(binding) = self.lookup(acc) else {
            return Err(CompileError::ty(loc, format!("unknown accumulator `{acc}`")));
        };
        let Type::Tile(acc_ty) = binding.ty else {
            return Err(CompileError::ty(loc, format!("`mma_sync` accumulates into a tile, `{acc}` is `{}`", binding.ty)));
        };
        if !binding.mutable {
            return Err(CompileError::ty(loc, format!("`mma_sync` writes `{acc}`: declare it `let mut {acc}`")));
        }
        let view = |t: Type, at: SourceLoc, which: &str| {
            match t {
            // One swizzle span per row, or whole panels of one (K past 64 bf16 columns).
            Type::SmemView { dtype, rows, cols, swizzle }
                if swizzle > 0 && (cols * dtype.size()).is_multiple_of(swizzle) =>
            {
                Ok((dtype, rows, cols))
            }
            Type::SmemView { dtype, cols, swizzle, .. } => Err(CompileError::ty(at, format!(
                "`mma_sync`: `{which}` must be a swizzled shared tile whose rows are one swizzle span ({} bytes) or whole panels of one, found rows of {} bytes with swizzle {swizzle}",
                swizzle.max(32), cols * dtype.size()))),
            // A from registers (`b` always comes from shared memory).
            Type::Tile(t) if which == "a" => Ok((t.dtype, t.rows, t.cols)),
            other => Err(CompileError::ty(at, format!("`mma_sync`: `{which}` must be a shared view{}, found `{other}`",
                if which == "a" { " or a register tile" } else { "" }))),
        }
        };
        let ta = self.expr(a)?;
        let tb = self.expr(b)?;
        // wgmma reads fp8 K-major from shared memory only.
        let fp8 = |t: &Type| matches!(t, Type::SmemView { dtype, .. } | Type::Tile(crate::tirh::TileType { dtype, .. }) if dtype.is_fp8());
        if fp8(&ta) || fp8(&tb) {
            let (what, at) = match (&ta, a_t, b_kn) {
                (Type::Tile(_), ..) => ("`a` from registers", a.loc),
                (_, true, _) => ("`a.t()`", a.loc),
                (_, _, true) => ("`mma_sync_kn`", loc),
                _ => ("", loc),
            };
            if !what.is_empty() {
                return Err(CompileError::ty(
                    at,
                    format!("`mma_sync` reads fp8 operands K-major from shared memory only: {what} takes bf16 or f16 (store fp8 as `[rows, K]` tiles)"),
                ));
            }
        }
        let va = if a_t {
            // a is K×M, M-major, in 128- or 64-byte panels (as `mma_sync_kn`'s b), a 64-row
            // slab of A whole panels.
            match ta {
                Type::SmemView { dtype, rows, cols, swizzle } if mn_major_panels(dtype, cols, swizzle) && (64 * dtype.size()).is_multiple_of(swizzle) => (dtype, cols, rows),
                Type::SmemView { dtype, cols, swizzle, .. } => {
                    return Err(CompileError::ty(a.loc, format!(
                        "`a.t()` (K×M) must be 128- or 64-byte swizzled with rows a multiple of 128 bytes, found swizzle {swizzle}, rows of {} bytes",
                        cols * dtype.size())))
                }
                other => return Err(CompileError::ty(a.loc, format!("`.t()` transposes a shared view, found `{other}`"))),
            }
        } else {
            view(ta, a.loc, "a")?
        };
        if b_kn {
            // b is K×N, N-major, in 128- or 64-byte panels.
            let Type::SmemView { dtype, rows, cols, swizzle } = tb else {
                return Err(CompileError::ty(b.loc, format!("`mma_sync_kn`: `b` must be a shared view, found `{tb}`")));
            };
            if !mn_major_panels(dtype, cols, swizzle) {
                return Err(CompileError::ty(b.loc, format!(
                    "`mma_sync_kn`: `b` (K×N) must be 128- or 64-byte swizzled in whole panels (rows a multiple of the span), found swizzle {swizzle}, rows of {} bytes",
                    cols * dtype.size())));
            }
            return check_mma_shapes(acc_ty, va, (dtype, cols, rows), [loc, a.loc, b.loc]);
        }
        let vb = view(tb, b.loc, "b")?;
        check_mma_shapes(acc_ty, va, vb, [loc, a.loc, b.loc])
    }
}

/// Why an fp8 shared view may not be loaded into registers.
pub(super) fn fp8_view_only(dtype: DType, what: &str) -> String {
    format!("`{what}`: `{dtype}` shared views are read by `mma_sync` and TMA stores, not loaded into registers; load the fp8 tensor from global memory instead")
}

/// An MN-major wgmma operand's rows: whole panels of a 128- or 64-byte swizzle span.
fn mn_major_panels(dtype: crate::DType, cols: u32, swizzle: u32) -> bool {
    matches!(swizzle, 64 | 128) && (cols * dtype.size()).is_multiple_of(swizzle)
}

fn describe(t: Option<Type>) -> String {
    t.map_or_else(|| "not defined".to_string(), |t| format!("`{t}`"))
}

/// A TMA box's rows: multiples of 16 bytes (a ring's rows may be narrower where no TMA copies
/// them).
pub(super) fn tma_rows(what: &str, dtype: crate::DType, cols: u32, loc: SourceLoc) -> Result<(), CompileError> {
    let row = cols * dtype.size();
    if row.is_multiple_of(16) {
        Ok(())
    } else {
        Err(CompileError::ty(loc, format!("`{what}`: a box's rows are multiples of 16 bytes, found {row}")))
    }
}

fn check_ring(t: SmemType, loc: SourceLoc) -> Result<SmemType, CompileError> {
    if t.stages == 0 || t.stages > 64 {
        return Err(CompileError::ty(loc, format!("a ring has 1 to 64 stages, found {}", t.stages)));
    }
    // In u64, before any u32 product of the sizes: a ring this large fits no GPU.
    let bytes = u64::from(t.rows) * u64::from(t.cols) * u64::from(t.dtype.size()) * u64::from(t.stages);
    if bytes > 1 << 20 {
        return Err(CompileError::ty(
            loc,
            format!("a ring of `Smem<{}, {}, {}>` needs {bytes} bytes of shared memory, more than a block has", t.dtype, t.rows, t.cols),
        ));
    }
    if !matches!(t.swizzle, 0 | 32 | 64 | 128) {
        return Err(CompileError::ty(loc, format!("swizzle is 128, 64, 32 or 0 bytes, found {}", t.swizzle)));
    }
    let row = t.row_bytes();
    // Rows wider than the span are stored as panels of one span each.
    if t.swizzle > 0 && row > t.swizzle && !row.is_multiple_of(t.swizzle) {
        return Err(CompileError::ty(
            loc,
            format!(
                "a row of `Smem<{}, {}, {}>` is {row} bytes, wider than its {}-byte swizzle span and not whole panels of it",
                t.dtype, t.rows, t.cols, t.swizzle
            ),
        ));
    }
    Ok(t)
}

/// Whether a shared view expression takes columns (`.cols(…)`) anywhere: not contiguous.
pub(super) fn has_cols(e: &Expr) -> bool {
    match &e.kind {
        // (Before typing, a view's `.cols(…)` is parsed as a tile's.)
        crate::tirh::ExprKind::SmemCols { .. } | crate::tirh::ExprKind::TileCols { .. } => true,
        crate::tirh::ExprKind::SmemRows { view, .. } => has_cols(view),
        _ => false,
    }
}
