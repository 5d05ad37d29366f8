//! Typing of expressions.

use super::{check_rank1, Checker, MAX_TILE_ELEMENTS};
use crate::dtype::{DType, ScalarType};
use crate::error::CompileError;
use crate::tirh::{BinOp, Builtin, Expr, ExprKind, TileType, Type, UnOp};

impl Checker<'_> {
    pub(super) fn expr(&mut self, e: &mut Expr) -> Result<Type, CompileError> {
        self.expr_expecting(e, None)
    }

    /// Types `e`; `expect` is the tile type the context wants (a `let` annotation), used to
    /// give a `load` its shape.
    pub(super) fn expr_expecting(&mut self, e: &mut Expr, expect: Option<TileType>) -> Result<Type, CompileError> {
        if let ExprKind::Var(name) = &e.kind {
            if self.poisoned.contains(name) {
                // Already reported where it was bound.
                return Err(CompileError::ty(e.loc, String::new()));
            }
        }
        let ty = self.infer(e, expect)?;
        e.ty = Some(ty);
        Ok(ty)
    }

    fn infer(&mut self, e: &mut Expr, expect: Option<TileType>) -> Result<Type, CompileError> {
        if let Some(t) = self.hopper_expr(e) {
            return t;
        }
        let loc = e.loc;
        Ok(match &mut e.kind {
            ExprKind::Var(name) => match self.lookup(name) {
                Some(b) => b.ty,
                None => return Err(CompileError::ty(loc, format!("unknown name `{name}`"))),
            },
            ExprKind::Int(_) => Type::Scalar(ScalarType::I32),
            ExprKind::Float(_) => Type::Scalar(ScalarType::F32),
            ExprKind::Bool(_) => Type::Scalar(ScalarType::Bool),
            ExprKind::Builtin(Builtin::BlockId(_) | Builtin::GridDim(_) | Builtin::WarpgroupId) => Type::Scalar(ScalarType::I32),
            ExprKind::Dim { tensor, axis } => {
                let (_, rank) = self.global(tensor, loc)?;
                if *axis >= rank {
                    return Err(CompileError::ty(loc, format!("`{tensor}` has rank {rank}: expected an axis below {rank}, found {axis}")));
                }
                Type::Scalar(ScalarType::I32)
            }
            ExprKind::Full { tile, value } => {
                check_tile_size(*tile, loc)?;
                self.fill_value(value, tile.dtype)?;
                Type::Tile(*tile)
            }
            ExprKind::Load { tensor, index, fill, tile } => {
                let (dtype, rank) = self.global(tensor, loc)?;
                if dtype == DType::I32 {
                    return Err(CompileError::ty(
                        loc,
                        format!("`{tensor}` is `Global<i32, {rank}>`: tiles load `f32`, `bf16` or `f16` tensors (read one `i32` with `{tensor}.get([…])`)"),
                    ));
                }
                let tensor = tensor.clone();
                self.indices(&tensor, rank, index, loc)?;
                let t = match (*tile, expect) {
                    (Some(t), _) | (None, Some(t)) => t,
                    (None, None) => {
                        return Err(CompileError::ty(loc, format!(
                            "cannot tell the shape of this load: annotate the binding, e.g. `let t: Tile<{dtype}, 16, 256> = {tensor}.load(…)`")))
                    }
                };
                *tile = Some(t);
                if t.dtype != dtype {
                    return Err(CompileError::ty(loc, format!(
                        "`{tensor}` is `Global<{dtype}, {rank}>`: expected a `{dtype}` tile, found `{t}` (load `{dtype}`, then `.cast::<{}>()`)", t.dtype)));
                }
                check_tile_size(t, loc)?;
                check_rank1(rank, t, loc)?;
                if let Some(fill) = fill {
                    self.fill_value(fill, dtype)?;
                }
                Type::Tile(t)
            }
            ExprKind::LoadFragments { tensor, index, tile } => {
                let (dtype, rank) = self.global(tensor, loc)?;
                let (tensor, t) = (tensor.clone(), *tile);
                self.indices(&tensor, rank, index, loc)?;
                if dtype != DType::F32 || t.dtype != DType::F32 || t.rows % 64 != 0 || t.cols % 8 != 0 || t.cols > 256 {
                    return Err(CompileError::ty(loc, format!(
                        "`load_fragments` reads an f32 MMA accumulator (rows a multiple of 64, columns of 8 up to 256) from an f32 tensor: `{tensor}` holds `{dtype}`, the tile is `{t}`")));
                }
                check_tile_size(t, loc)?;
                Type::Tile(t)
            }
            ExprKind::Cast { value, to } => match self.expr(value)? {
                Type::Tile(t) => {
                    if !to.is_float() {
                        return Err(CompileError::ty(loc, format!("tiles cast to `f32`, `bf16` or `f16`, found `{to}`")));
                    }
                    Type::Tile(TileType { dtype: *to, ..t })
                }
                Type::Scalar(ScalarType::F32 | ScalarType::I32) => match to {
                    DType::F32 => Type::Scalar(ScalarType::F32),
                    DType::I32 => Type::Scalar(ScalarType::I32),
                    other => return Err(CompileError::ty(loc, format!("scalars cast to `f32` or `i32`, found `{other}`"))),
                },
                other => return Err(CompileError::ty(loc, format!("cannot cast a `{other}`"))),
            },
            ExprKind::SmemRing(_)
            | ExprKind::PipelineNew { .. }
            | ExprKind::QueueNew { .. }
            | ExprKind::SmemAt { .. }
            | ExprKind::SmemRows { .. }
            | ExprKind::SmemCols { .. }
            | ExprKind::SmemLoad(_)
            | ExprKind::PipeStage { .. } => {
                unreachable!("typed by hopper_expr")
            }
            ExprKind::MaskCols { value, limit, fill } => {
                let ty = self.expr(value)?;
                let Type::Tile(t) = ty else {
                    return Err(CompileError::ty(value.loc, format!("`mask_cols` takes a tile, found `{ty}`")));
                };
                // One first column for every row (an i32), or one per row (an f32 column tile).
                match self.expr(limit)? {
                    Type::Scalar(ScalarType::I32) => {}
                    Type::Tile(l) if l.dtype == DType::F32 && l.cols == 1 && l.rows == t.rows => {}
                    other => {
                        return Err(CompileError::ty(
                            limit.loc,
                            format!("`mask_cols`'s first column to replace must be an `i32`, or a `Tile<f32, {}, 1>` of one per row, found `{other}`", t.rows),
                        ))
                    }
                }
                self.fill_value(fill, t.dtype)?;
                Type::Tile(t)
            }
            ExprKind::KeepWhere { value, cond, fill } => {
                let ty = self.expr(value)?;
                let Type::Tile(t) = ty else {
                    return Err(CompileError::ty(value.loc, format!("`keep_where` takes a tile, found `{ty}`")));
                };
                // An f32 condition of the tile's shape, or one that broadcasts to it.
                match self.expr(cond)? {
                    Type::Tile(c) if c.dtype == DType::F32 && broadcast(t, TileType { dtype: t.dtype, ..c }) == Some(t) => {}
                    other => {
                        return Err(CompileError::ty(
                            cond.loc,
                            format!(
                                "`keep_where`'s condition must be an `f32` tile of the shape `{}×{}` (or `{}×1`, `1×{}`, broadcast), found `{other}`",
                                t.rows, t.cols, t.rows, t.cols
                            ),
                        ))
                    }
                }
                self.fill_value(fill, t.dtype)?;
                Type::Tile(t)
            }
            ExprKind::Iota { tile, axis } => {
                if tile.dtype != DType::F32 {
                    let what = if *axis == 1 { "col_index" } else { "row_index" };
                    return Err(CompileError::ty(loc, format!("`{what}` makes an `f32` tile, found `{tile}`")));
                }
                check_tile_size(*tile, loc)?;
                Type::Tile(*tile)
            }
            ExprKind::Uniform { tile, kind, seed, origin } => {
                let name = kind.name();
                if tile.dtype != DType::F32 {
                    return Err(CompileError::ty(loc, format!("`{name}` makes an `f32` tile, found `{tile}`")));
                }
                check_tile_size(*tile, loc)?;
                if origin.len() != 2 {
                    return Err(CompileError::ty(loc, format!("`{name}`'s origin is `[row, col]`, found {} indices", origin.len())));
                }
                let mut names = vec!["the seed's low word", "the seed's high word", "the offset"];
                if seed.len() == 4 {
                    names.push("the stream");
                }
                names.extend(["the origin's row", "the origin's column"]);
                for (what, a) in names.iter().zip(seed.iter_mut().chain(origin.iter_mut())) {
                    let ty = self.expr(a)?;
                    if ty != Type::Scalar(ScalarType::I32) {
                        return Err(CompileError::ty(a.loc, format!("`{name}` takes {what} as an `i32`, found `{ty}`")));
                    }
                }
                Type::Tile(*tile)
            }
            ExprKind::SwapPairs(value) => {
                let ty = self.expr(value)?;
                match ty {
                    Type::Tile(t) if t.cols % 2 == 0 => Type::Tile(t),
                    _ => {
                        return Err(CompileError::ty(
                            value.loc,
                            format!("`swap_pairs` takes a tile with an even number of columns, found `{ty}`"),
                        ))
                    }
                }
            }
            ExprKind::EdgeCol { value, last } => match self.expr(value)? {
                Type::Tile(t) if t.dtype == DType::F32 => Type::Tile(TileType { cols: 1, ..t }),
                ty => {
                    let name = if *last { "last_col" } else { "first_col" };
                    return Err(CompileError::ty(value.loc, format!("`{name}` takes an f32 tile, found `{ty}`")));
                }
            },
            ExprKind::Get { tensor, index } => {
                let (dtype, rank) = self.global(tensor, loc)?;
                let tensor = tensor.clone();
                self.indices(&tensor, rank, index, loc)?;
                match dtype {
                    DType::I32 => Type::Scalar(ScalarType::I32),
                    // 16-bit and 8-bit floats widen to f32 (the DSL has no narrower scalars).
                    DType::F32 | DType::F16 | DType::BF16 | DType::F8E4M3 | DType::F8E5M2 => Type::Scalar(ScalarType::F32),
                }
            }
            ExprKind::TileCols { value, start, cols } => {
                let ty = self.expr(value)?;
                if let Type::SmemView { .. } = ty {
                    // Columns of a shared view: typed (and lowered) as one.
                    let view = std::mem::replace(value, Box::new(Expr::new(ExprKind::Bool(false), value.loc)));
                    e.kind = ExprKind::SmemCols { view, start: *start, cols: *cols };
                    return self.infer(e, expect);
                }
                let Type::Tile(t) = ty else {
                    return Err(CompileError::ty(value.loc, format!("`cols` takes a tile, found `{ty}`")));
                };
                // Which counts a tile's layout allows (8-column runs of an MMA accumulator, any of
                // a tile whose rows lie whole in their threads) is the lowering's to check.
                if *cols == 0 || *start % *cols != 0 || *start + *cols > t.cols {
                    return Err(CompileError::ty(
                        loc,
                        format!(
                            "`cols({start}, {cols})` of `{t}`: expected columns starting at a multiple of the count, inside {} columns",
                            t.cols
                        ),
                    ));
                }
                Type::Tile(TileType { cols: *cols, ..t })
            }
            // A device function's call (or a scan's): inlined, and replaced by its result.
            ExprKind::Call { .. } | ExprKind::Scan { .. } => return self.call_value(e, expect),
            ExprKind::ScanPart { value, fill, .. } => {
                let ty = self.expr(value)?;
                self.fill_value(fill, DType::F32)?;
                ty
            }
            ExprKind::ScanPick { updated, old, .. } => {
                self.expr(old)?;
                self.expr(updated)?
            }
            ExprKind::Shift { value, axis, by, fill, .. } => {
                let ty = self.expr(value)?;
                match ty {
                    Type::Tile(t) if t.dtype == DType::F32 && *axis <= 1 => {
                        // The fill: a scalar, or a tile of the same type whose elements shift in
                        // (a funnel shift: the window `by` back along `[fill | value]`).
                        match self.expr(fill)? {
                            Type::Tile(f) if f == t => {
                                let n = if *axis == 1 { t.cols } else { t.rows };
                                if *by > n {
                                    let what = if *axis == 1 { "columns" } else { "rows" };
                                    return Err(CompileError::ty(
                                        loc,
                                        format!("a funnel shift moves at most the tile's {n} {what}, found a shift of {by}"),
                                    ));
                                }
                            }
                            Type::Tile(f) => {
                                return Err(CompileError::ty(
                                    fill.loc,
                                    format!(
                                        "the tile shifted in is of the shifted tile's type, `{}`: found `{}`",
                                        Type::Tile(t),
                                        Type::Tile(f)
                                    ),
                                ))
                            }
                            fty => self.fill_typed(fill, fty, DType::F32)?,
                        }
                        Type::Tile(t)
                    }
                    _ => {
                        let name = if *axis == 1 { "shift_cols" } else { "shift_rows" };
                        return Err(CompileError::ty(value.loc, format!("`{name}` shifts an f32 tile, found `{ty}`")));
                    }
                }
            }
            ExprKind::TileAll(value) => match self.expr(value)? {
                Type::Tile(t) if t.dtype.is_float() => Type::Scalar(ScalarType::Bool),
                ty => return Err(CompileError::ty(value.loc, format!("`tile_all` tests a float tile, found `{ty}`"))),
            },
            ExprKind::BlockReduce { op, .. } => {
                return Err(CompileError::ty(
                    loc,
                    format!("`block_{0}` must be the whole value of a `let` (`let s = block_{0}(t);`): every warpgroup stops there until all have arrived", op.name()),
                ));
            }
            ExprKind::Reduce { op, axis, value } => {
                let ty = self.expr(value)?;
                let Type::Tile(t) = ty else {
                    return Err(CompileError::ty(value.loc, format!("`{}` reduces a tile, found `{ty}`", op.name())));
                };
                if *axis > 1 {
                    return Err(CompileError::ty(
                        loc,
                        format!("`{t}` has 2 dimensions: expected axis 0 (down the rows) or 1 (along each row), found axis {axis}"),
                    ));
                }
                if !t.dtype.is_float() {
                    return Err(CompileError::ty(value.loc, format!("reductions take float tiles, found `{t}`")));
                }
                Type::Tile(if *axis == 1 { TileType { cols: 1, ..t } } else { TileType { rows: 1, ..t } })
            }
            ExprKind::Unary(op, a) => {
                let op = *op;
                let ty = self.expr(a)?;
                if matches!(op, UnOp::SinReduced | UnOp::CosReduced) {
                    let literal = match &a.kind {
                        ExprKind::Float(x) => Some(*x),
                        ExprKind::Unary(UnOp::Neg, x) => {
                            if let ExprKind::Float(x) = x.kind {
                                Some(-x)
                            } else {
                                None
                            }
                        }
                        _ => None,
                    };
                    if let Some(x) = literal.filter(|x| x.abs() > std::f64::consts::PI) {
                        return Err(CompileError::ty(
                            a.loc,
                            format!(
                                "`{}` takes arguments in [−π, π] (no range reduction), found {x}: use `{}`",
                                op.name(),
                                if op == UnOp::SinReduced { "sin" } else { "cos" }
                            ),
                        ));
                    }
                }
                match (op, ty) {
                    (UnOp::Not, Type::Scalar(ScalarType::Bool)) => ty,
                    (UnOp::Neg, Type::Scalar(ScalarType::I32 | ScalarType::F32)) => ty,
                    (_, Type::Scalar(ScalarType::F32)) if op != UnOp::Not => ty,
                    (_, Type::Tile(t)) if t.dtype.is_float() && op != UnOp::Not => ty,
                    _ => return Err(CompileError::ty(a.loc, format!("`{}` does not apply to `{ty}`", op.name()))),
                }
            }
            ExprKind::Binary(op, a, b) => {
                let op = *op;
                let ta = self.expr(a)?;
                let tb = self.expr(b)?;
                // An integer literal beside a float takes the float's type, as `2.0` would.
                let (ta, tb) = (coerce_literal(a, tb, ta), coerce_literal(b, ta, tb));
                binary(op, ta, tb, loc, b.loc)?
            }
        })
    }

    pub(super) fn fill_value(&mut self, value: &mut Expr, dtype: DType) -> Result<(), CompileError> {
        let ty = self.expr(value)?;
        self.fill_typed(value, ty, dtype)
    }

    /// [`Self::fill_value`] of a fill already typed `ty`.
    fn fill_typed(&mut self, value: &mut Expr, ty: Type, dtype: DType) -> Result<(), CompileError> {
        let ty = coerce_literal(value, Type::Scalar(ScalarType::F32), ty);
        let want = if dtype.is_float() { ScalarType::F32 } else { ScalarType::I32 };
        if ty != Type::Scalar(want) {
            return Err(CompileError::ty(value.loc, format!("a `{dtype}` tile is filled with an `{want}` scalar, found `{ty}`")));
        }
        Ok(())
    }
}

fn coerce_literal(e: &mut Expr, other: Type, ty: Type) -> Type {
    let float_ctx = match other {
        Type::Scalar(ScalarType::F32) => true,
        Type::Tile(t) => t.dtype.is_float(),
        _ => false,
    };
    if let (ExprKind::Int(v), true) = (&e.kind, float_ctx) {
        e.kind = ExprKind::Float(*v as f64);
        e.ty = Some(Type::Scalar(ScalarType::F32));
        return Type::Scalar(ScalarType::F32);
    }
    ty
}

fn check_tile_size(t: TileType, loc: crate::tirh::SourceLoc) -> Result<(), CompileError> {
    // In u64: a tile of 16 × 2³¹ (a `tune` value) overflows u32 (the fuzzer found it).
    let elements = u64::from(t.rows) * u64::from(t.cols);
    if elements > u64::from(MAX_TILE_ELEMENTS) {
        return Err(CompileError::ty(
            loc,
            format!("`{t}` holds {elements} elements, more than the {MAX_TILE_ELEMENTS} a warpgroup keeps in registers"),
        ));
    }
    Ok(())
}

/// The broadcast shape of two tiles, if they are compatible.
pub fn broadcast(a: TileType, b: TileType) -> Option<TileType> {
    let dim = |x: u32, y: u32| {
        if x == y || y == 1 {
            Some(x)
        } else if x == 1 {
            Some(y)
        } else {
            None
        }
    };
    Some(TileType { dtype: a.dtype, rows: dim(a.rows, b.rows)?, cols: dim(a.cols, b.cols)? })
}

fn binary(op: BinOp, ta: Type, tb: Type, loc: crate::tirh::SourceLoc, rhs_loc: crate::tirh::SourceLoc) -> Result<Type, CompileError> {
    use ScalarType as S;
    let sym = op.symbol();
    match (ta, tb) {
        (Type::Scalar(a), Type::Scalar(b)) => {
            if a != b {
                return Err(CompileError::ty(rhs_loc, format!("`{sym}`: expected `{a}` to match the left side, found `{b}`")));
            }
            match op {
                BinOp::And | BinOp::Or if a == S::Bool => Ok(Type::Scalar(S::Bool)),
                _ if op.is_comparison() && a != S::Bool => Ok(Type::Scalar(S::Bool)),
                BinOp::Rem if a == S::I32 => Ok(ta),
                BinOp::Add | BinOp::Sub | BinOp::Mul | BinOp::Div | BinOp::Max | BinOp::Min if a != S::Bool => Ok(ta),
                _ => Err(CompileError::ty(loc, format!("`{sym}` does not apply to `{a}`"))),
            }
        }
        (Type::Tile(a), Type::Tile(b)) => {
            if a.dtype != b.dtype {
                return Err(CompileError::ty(
                    rhs_loc,
                    format!("`{sym}`: expected a `{}` tile to match `{a}`, found `{b}` (convert with `.cast::<{}>()`)", a.dtype, a.dtype),
                ));
            }
            arith_only(op, loc)?;
            broadcast(a, b).map(Type::Tile).ok_or_else(|| {
                CompileError::ty(
                    rhs_loc,
                    format!("`{sym}`: shapes do not match: `{a}` and `{b}` (each dimension must be equal, or 1 to broadcast)"),
                )
            })
        }
        (Type::Tile(t), Type::Scalar(s)) | (Type::Scalar(s), Type::Tile(t)) => {
            arith_only(op, loc)?;
            if s != S::F32 || !t.dtype.is_float() {
                return Err(CompileError::ty(rhs_loc, format!("`{sym}`: a `{t}` combines with an `f32` scalar, found `{s}`")));
            }
            Ok(Type::Tile(t))
        }
        (a, b) => Err(CompileError::ty(loc, format!("`{sym}` does not apply to `{a}` and `{b}`"))),
    }
}

fn arith_only(op: BinOp, loc: crate::tirh::SourceLoc) -> Result<(), CompileError> {
    match op {
        BinOp::Add | BinOp::Sub | BinOp::Mul | BinOp::Div | BinOp::Max | BinOp::Min => Ok(()),
        _ => Err(CompileError::ty(loc, format!("`{}` does not apply to tiles: expected `+ - * /`, `max` or `min`", op.symbol()))),
    }
}
