//! The type checker of TIR-H: fills every [`Expr::ty`](crate::tirh::Expr::ty) and checks shapes, dtypes and ranks.
//!
//! Assumes: a kernel as the frontend builds it (names are plain strings, tile dimensions are
//! constants). Guarantees: on success every expression has a type, every operation's operands
//! agree in dtype and (broadcast) shape, every global access has one index per dimension,
//! every store writes a tile of the tensor's dtype, and every mutable binding keeps its type.
//! Lowering relies on all of this and does not check it again.

mod call;
mod expr;
mod hopper;

use crate::dtype::{DType, ScalarType};
use crate::error::CompileError;
use crate::tirh::{ExprKind, SourceLoc, Stmt, StmtKind, TileIr, TileType, Type};
use std::collections::HashMap;

pub use call::{CallSite, Callees, Inlined};

/// The most elements a tile may hold: 128 registers per thread of a warpgroup.
pub const MAX_TILE_ELEMENTS: u32 = 128 * 128;

/// Type-checks a kernel. Returns the kernel with every expression typed, or every error found.
/// A kernel that calls device functions needs [`typecheck_with`].
pub fn typecheck(ir: TileIr) -> Result<TileIr, Vec<CompileError>> {
    run(ir, None)
}

/// Type-checks a kernel, inlining its device-function calls ([`ExprKind::Call`]) as it meets
/// them: `callees` gives each call's body for its typed arguments (the frontend parses the
/// definition with its generic parameters bound). The result holds no call.
pub fn typecheck_with(ir: TileIr, callees: &mut dyn Callees) -> Result<TileIr, Vec<CompileError>> {
    run(ir, Some(callees))
}

fn run(mut ir: TileIr, callees: Option<&mut dyn Callees>) -> Result<TileIr, Vec<CompileError>> {
    let mut cx = Checker {
        scopes: vec![HashMap::new()],
        errors: Vec::new(),
        poisoned: Vec::new(),
        warpgroups: ir.warpgroups,
        callees,
        pending: Vec::new(),
        inlining: Vec::new(),
        pipes: Vec::new(),
    };
    for p in &ir.params {
        cx.bind(&p.name, p.ty, false);
    }
    let mut body = std::mem::take(&mut ir.body);
    cx.block(&mut body);
    ir.body = body;
    if cx.errors.is_empty() {
        Ok(ir)
    } else {
        Err(cx.errors)
    }
}

#[derive(Clone, Copy)]
struct Binding {
    ty: Type,
    mutable: bool,
    /// For a stage index, where it came from.
    slot: Option<Slot>,
}

/// Where a stage index came from: the pipeline whose `acquire()` or `wait()` gave it (an index
/// into `Checker::pipes`) and its depth; once it is released, the line of the release.
#[derive(Clone, Copy, PartialEq)]
struct Slot {
    pipe: u32,
    stages: u32,
    released: Option<u32>,
}

struct Checker<'c> {
    scopes: Vec<HashMap<String, Binding>>,
    errors: Vec<CompileError>,
    /// Names whose `let` failed: uses of them report nothing more.
    poisoned: Vec<String>,
    /// The kernel's warpgroups.
    warpgroups: u32,
    /// Where device-function bodies come from (none: a call is an error).
    callees: Option<&'c mut dyn Callees>,
    /// Checked statements of the calls inlined so far in the statement being checked: they
    /// go before it.
    pending: Vec<Stmt>,
    /// The definitions being inlined, outermost first (a call of one of them recurses).
    inlining: Vec<(u32, String)>,
    /// The pipelines that stage indices came from, by name (`Slot::pipe`).
    pipes: Vec<String>,
}

impl Checker<'_> {
    fn bind(&mut self, name: &str, ty: Type, mutable: bool) {
        if let Some(scope) = self.scopes.last_mut() {
            scope.insert(name.to_string(), Binding { ty, mutable, slot: None });
        }
    }

    /// The stage index `e` holds, if it names one (`s` after `let s = pipe.wait();`).
    fn slot_of(&self, e: &crate::tirh::Expr) -> Option<Slot> {
        match &e.kind {
            ExprKind::Var(n) => self.lookup(n).and_then(|b| b.slot),
            _ => None,
        }
    }

    /// Records what `name` (just bound or assigned `value`) holds: the stage `value` names, if
    /// any, unreleased — in this scope (an assignment inside a branch or a loop body says
    /// nothing of the binding after it).
    fn track_slot(&mut self, name: &str, value: &crate::tirh::Expr) {
        let slot = match &value.kind {
            ExprKind::PipeStage { pipe, .. } => self.pipeline(pipe, value.loc).ok().map(|(stages, _)| {
                let id = match self.pipes.iter().position(|p| p == pipe) {
                    Some(i) => i,
                    None => {
                        self.pipes.push(pipe.clone());
                        self.pipes.len() - 1
                    }
                };
                Slot { pipe: id as u32, stages, released: None }
            }),
            _ => self.slot_of(value).map(|s| Slot { released: None, ..s }),
        };
        if let (Some(b), Some(scope)) = (self.lookup(name), self.scopes.last_mut()) {
            scope.insert(name.to_string(), Binding { slot, ..b });
        }
    }

    /// `pipe.commit(stage)` or `pipe.release(stage)`: a stage of another pipeline is an error;
    /// a released one is marked so in this scope, where reading its ring is then an error.
    fn hand_back(&mut self, pipe: &str, stage: &crate::tirh::Expr, release: bool) -> Result<(), CompileError> {
        let (Some(slot), ExprKind::Var(name)) = (self.slot_of(stage), &stage.kind) else { return Ok(()) };
        let from = self.pipes.get(slot.pipe as usize).cloned().unwrap_or_default();
        if from != pipe {
            let what = if release { "release" } else { "commit" };
            return Err(CompileError::ty(stage.loc, format!("`{name}` is a stage of `{from}`, not of `{pipe}`: `{from}.{what}({name})`")));
        }
        if release {
            if let (Some(b), Some(scope)) = (self.lookup(name), self.scopes.last_mut()) {
                scope.insert(name.clone(), Binding { slot: Some(Slot { released: Some(stage.loc.line), ..slot }), ..b });
            }
        }
        Ok(())
    }

    fn lookup(&self, name: &str) -> Option<Binding> {
        self.scopes.iter().rev().find_map(|s| s.get(name).copied())
    }

    fn global(&self, name: &str, loc: SourceLoc) -> Result<(crate::dtype::DType, u32), CompileError> {
        match self.lookup(name).map(|b| b.ty) {
            Some(Type::Global { dtype, rank }) => Ok((dtype, rank)),
            Some(other) => Err(CompileError::ty(loc, format!("`{name}` is `{other}`, expected a `Global<T, R>` tensor parameter"))),
            None => Err(CompileError::ty(loc, format!("unknown tensor `{name}`: expected a `Global<T, R>` parameter"))),
        }
    }

    fn block(&mut self, body: &mut Vec<Stmt>) {
        self.scopes.push(HashMap::new());
        for s in std::mem::take(body) {
            self.stmt_into(s, body);
        }
        self.scopes.pop();
    }

    /// Checks `s` in the current scope and appends it to `out`, after the inlined bodies of
    /// the calls it holds; a call statement (`f(x);`, `let (a, b) = f(x);`) leaves only what
    /// it was inlined to.
    fn stmt_into(&mut self, mut s: Stmt, out: &mut Vec<Stmt>) {
        let outer = std::mem::take(&mut self.pending);
        let result = self.stmt(&mut s);
        out.append(&mut std::mem::replace(&mut self.pending, outer));
        if let Err(e) = result {
            // A binding that failed binds its names as poisoned, so later uses stay quiet.
            let names: Vec<String> = match &s.kind {
                StmtKind::Let { name, .. } | StmtKind::FetchAdd { name: Some(name), .. } => vec![name.clone()],
                StmtKind::Unpack { names, assign: false, .. } => names.iter().map(|(n, _)| n.clone()).collect(),
                _ => Vec::new(),
            };
            for name in names {
                self.bind(&name, Type::Scalar(ScalarType::Bool), false);
                self.poisoned.push(name);
            }
            if !e.to_string().is_empty() {
                self.errors.push(e);
            }
        }
        if !matches!(s.kind, StmtKind::Eval(_) | StmtKind::Unpack { .. }) {
            out.push(s);
        }
    }

    fn stmt(&mut self, s: &mut Stmt) -> Result<(), CompileError> {
        let loc = s.loc;
        match &mut s.kind {
            StmtKind::Let { name, mutable, declared, value } => {
                let declared = *declared;
                let ty = match &mut value.kind {
                    // Its one allowed place: the whole value of a `let`.
                    ExprKind::BlockReduce { op, value: inner } => {
                        let ty = self.expr(inner)?;
                        match ty {
                            Type::Tile(t) if t.dtype.is_float() => {}
                            _ => {
                                return Err(CompileError::ty(
                                    inner.loc,
                                    format!("`block_{}` combines a float tile, found `{ty}`", op.name()),
                                ))
                            }
                        }
                        value.ty = Some(ty);
                        ty
                    }
                    _ => self.expr_expecting(value, declared)?,
                };
                if let (Some(d), Type::Tile(t)) = (declared, ty) {
                    if d != t {
                        return Err(CompileError::ty(value.loc, format!("`{name}` is declared `{d}`, but its value is `{t}`")));
                    }
                }
                if let Some(d) = declared {
                    if !matches!(ty, Type::Tile(_)) {
                        return Err(CompileError::ty(value.loc, format!("`{name}` is declared `{d}`, but its value is `{ty}`")));
                    }
                }
                self.bind(name, ty, *mutable);
                let (name, value) = (name.clone(), value.clone());
                self.track_slot(&name, &value);
            }
            StmtKind::Assign { name, value } => {
                let Some(b) = self.lookup(name) else {
                    return Err(CompileError::ty(loc, format!("cannot assign to unknown name `{name}`")));
                };
                if !b.mutable {
                    return Err(CompileError::ty(
                        loc,
                        format!("cannot assign twice to immutable binding `{name}`: declare it `let mut {name}`"),
                    ));
                }
                let expect = if let Type::Tile(t) = b.ty { Some(t) } else { None };
                let ty = self.expr_expecting(value, expect)?;
                if ty != b.ty {
                    return Err(CompileError::ty(value.loc, format!("`{name}` is `{}`, it cannot be assigned a `{ty}`", b.ty)));
                }
                let (name, value) = (name.clone(), value.clone());
                self.track_slot(&name, &value);
            }
            StmtKind::Prefetch(load) => {
                self.expr(load)?;
            }
            StmtKind::Store { tensor, index, value, within } => {
                let (dtype, rank) = self.global(tensor, loc)?;
                self.indices(tensor, rank, index, loc)?;
                if let Some(ends) = within {
                    self.indices(tensor, rank, ends, loc)?;
                }
                let ty = self.expr(value)?;
                let Type::Tile(t) = ty else {
                    return Err(CompileError::ty(value.loc, format!("`{tensor}.store` takes a tile, found `{ty}`")));
                };
                if t.dtype != dtype {
                    return Err(CompileError::ty(value.loc, format!(
                        "`{tensor}` is `Global<{dtype}, {rank}>`: expected a `{dtype}` tile, found `{t}` (convert with `.cast::<{dtype}>()`)")));
                }
                check_rank1(rank, t, value.loc)?;
            }
            StmtKind::AtomicAdd { tensor, index, value, max } => {
                let (dtype, rank) = self.global(tensor, loc)?;
                self.indices(tensor, rank, index, loc)?;
                let ty = self.expr(value)?;
                let (op, verb) = if *max { ("atomic_max", "takes the maximum") } else { ("atomic_add", "adds") };
                match ty {
                    Type::Tile(t) if t.dtype == DType::F32 && dtype == DType::F32 => check_rank1(rank, t, value.loc)?,
                    Type::Tile(_) if dtype != DType::F32 => {
                        return Err(CompileError::ty(
                            loc,
                            format!("`{tensor}.{op}` {verb} into an f32 tensor, and `{tensor}` is `Global<{dtype}, {rank}>`"),
                        ));
                    }
                    _ => return Err(CompileError::ty(value.loc, format!("`{tensor}.{op}` {verb} of an f32 tile, found `{ty}`"))),
                }
            }
            StmtKind::WaitNonzero { name, tensor, index } => {
                self.i32_element(tensor, index, loc, "wait_nonzero` waits on an i32 flag")?;
                self.bind(name, Type::Scalar(ScalarType::I32), false);
            }
            StmtKind::FetchAdd { name, tensor, index, value, inc } => {
                let op = if *inc { "fetch_inc` counts in an i32 tensor" } else { "fetch_add` counts in an i32 tensor" };
                self.i32_element(tensor, index, loc, op)?;
                let what = if *inc { format!("the limit of `{tensor}.fetch_inc`") } else { format!("the value `{tensor}.fetch_add` adds") };
                self.expect_scalar(value, ScalarType::I32, &what)?;
                if let Some(name) = name {
                    self.bind(name, Type::Scalar(ScalarType::I32), false);
                }
            }
            StmtKind::For { var, start, end, step, body } => {
                self.expect_scalar(start, ScalarType::I32, "a loop bound")?;
                self.expect_scalar(end, ScalarType::I32, "a loop bound")?;
                self.expect_scalar(step, ScalarType::I32, "a loop step")?;
                self.scopes.push(HashMap::new());
                self.bind(var, Type::Scalar(ScalarType::I32), false);
                self.block(body);
                self.scopes.pop();
            }
            StmtKind::QueueFor { var, queue, total, body } => {
                self.queue(queue, loc)?;
                if let Some(total) = total {
                    self.expect_scalar(total, ScalarType::I32, "the number of indices")?;
                }
                self.scopes.push(HashMap::new());
                self.bind(var, Type::Scalar(ScalarType::I32), false);
                self.block(body);
                self.scopes.pop();
            }
            StmtKind::TmaLoad { dst, tensor, index, pipe } => {
                let (tensor, pipe) = (tensor.clone(), pipe.clone());
                self.tma_load(dst, &tensor, index, &pipe, loc)?;
            }
            StmtKind::PipeCommit { pipe, stage } => {
                self.pipeline(pipe, loc)?;
                self.expect_scalar(stage, ScalarType::I32, "a stage")?;
                self.hand_back(&pipe.clone(), &stage.clone(), false)?;
            }
            StmtKind::PipeRelease { pipe, stage } => {
                self.pipeline(pipe, loc)?;
                self.expect_scalar(stage, ScalarType::I32, "a stage")?;
                self.hand_back(&pipe.clone(), &stage.clone(), true)?;
            }
            StmtKind::MmaWait(_) | StmtKind::TmaStoreWait(_) => {}
            StmtKind::NamedBarrier { id, warpgroups, loc: at, .. } => {
                if *id > 6 {
                    return Err(CompileError::ty(*at, format!("named barriers are 0 to 6, found {id}")));
                }
                if *warpgroups == 0 || *warpgroups > self.warpgroups {
                    return Err(CompileError::ty(
                        *at,
                        format!("a named barrier counts 1 to {} warpgroups (the kernel's), found {warpgroups}", self.warpgroups),
                    ));
                }
            }
            StmtKind::SmemStore { view, value, fragments: true } => {
                let vt = self.expr(view)?;
                let tt = self.expr(value)?;
                match (vt, tt) {
                    (Type::SmemView { swizzle, .. }, _) if swizzle != 0 => {
                        return Err(CompileError::ty(
                            view.loc,
                            format!("`store_fragments` writes an unswizzled view (`ring_swizzled(stages, 0)`), found a {swizzle}-byte swizzle"),
                        ))
                    }
                    (Type::SmemView { dtype: DType::F32, rows, cols, .. }, Type::Tile(t))
                        if t.dtype == DType::F32 && t.rows * t.cols == rows * cols && t.rows % 64 == 0 && t.cols % 8 == 0 => {}
                    (Type::SmemView { dtype, rows, cols, .. }, other) => {
                        return Err(CompileError::ty(
                            value.loc,
                            format!(
                                "`store_fragments` writes an f32 MMA accumulator (rows a multiple of 64, columns of 8) of as many elements as the view: a `{rows}×{cols}` `{dtype}` view takes {} f32, found `{other}`", rows * cols
                            ),
                        ))
                    }
                    (other, _) => return Err(CompileError::ty(view.loc, format!("`store_fragments(acc)` writes a shared view, found `{other}`"))),
                }
            }
            StmtKind::SmemStore { view, value, fragments: false } => {
                let vt = self.expr(view)?;
                let tt = self.expr(value)?;
                match (vt, tt) {
                    (Type::SmemView { dtype, rows, cols, .. }, Type::Tile(t)) if t.dtype == dtype && t.rows == rows && t.cols == cols => {}
                    (Type::SmemView { dtype, rows, cols, .. }, other) => {
                        return Err(CompileError::ty(
                            value.loc,
                            format!("a `{rows}×{cols}` `{dtype}` shared view stores a `Tile<{dtype}, {rows}, {cols}>`, found `{other}`"),
                        ))
                    }
                    (other, _) => return Err(CompileError::ty(view.loc, format!("`store(tile)` writes a shared view, found `{other}`"))),
                }
            }
            StmtKind::TmaStore { tensor, index, src, add, flat: true } => {
                let what = if *add { "tma::reduce_add_flat" } else { "tma::store_flat" };
                let (dtype, rank) = self.global(tensor, loc)?;
                if *add && dtype != DType::F32 {
                    return Err(CompileError::ty(loc, format!("`{what}` adds into an f32 tensor, `{tensor}` holds `{dtype}`")));
                }
                let tensor = tensor.clone();
                self.indices(&tensor, rank, index, loc)?;
                if hopper::has_cols(src) {
                    return Err(CompileError::ty(
                        src.loc,
                        format!("`{what}` copies contiguous bytes: a stage or its rows (`ring.at(s)`, `.rows(r, n)`), not `.cols(…)`"),
                    ));
                }
                match self.expr(src)? {
                    Type::SmemView { dtype: d, rows, cols, swizzle: 0 } if d == dtype && (rows * cols * d.size()) % 16 == 0 => {}
                    Type::SmemView { swizzle, .. } if swizzle != 0 => {
                        return Err(CompileError::ty(
                            src.loc,
                            format!("`{what}` copies an unswizzled view (`ring_swizzled(stages, 0)`), found a {swizzle}-byte swizzle"),
                        ))
                    }
                    other => {
                        return Err(CompileError::ty(
                            src.loc,
                            format!("`{what}` into `{tensor}` copies an unswizzled `{dtype}` shared view of a multiple of 16 bytes, found `{other}`"),
                        ))
                    }
                }
            }
            StmtKind::TmaStore { tensor, index, src, add, flat: false } => {
                let (dtype, rank) = self.global(tensor, loc)?;
                if *add && dtype != DType::F32 {
                    return Err(CompileError::ty(loc, format!("`tma::reduce_add` adds into an f32 tensor, `{tensor}` holds `{dtype}`")));
                }
                let tensor = tensor.clone();
                self.indices(&tensor, rank, index, loc)?;
                if !(2..=3).contains(&rank) {
                    return Err(CompileError::ty(
                        loc,
                        format!("`tma::store` writes a rank-2 or rank-3 tensor, `{tensor}` has rank {rank}"),
                    ));
                }
                match self.expr(src)? {
                    Type::SmemView { dtype: d, cols, .. } if d == dtype => hopper::tma_rows("tma::store", d, cols, src.loc)?,
                    other => {
                        return Err(CompileError::ty(
                            src.loc,
                            format!("`tma::store` into `{tensor}` (`{dtype}`) copies a `{dtype}` shared view, found `{other}`"),
                        ))
                    }
                }
            }
            StmtKind::Mma { acc, a, b, b_kn, a_t } => {
                let acc = acc.clone();
                self.mma(&acc, a, b, *b_kn, *a_t, loc)?;
            }
            StmtKind::SetMaxNReg(n) => {
                if !(24..=256).contains(n) || *n % 8 != 0 {
                    return Err(CompileError::ty(loc, format!("`setmaxnreg` takes 24 to 256 registers in steps of 8, found {n}")));
                }
            }
            StmtKind::Eval(call) => {
                self.call(call, None)?;
            }
            StmtKind::Unpack { names, assign, value } => {
                let (names, assign) = (names.clone(), *assign);
                self.unpack(names, assign, value, loc, &s.text)?;
            }
            StmtKind::While { cond, body } => {
                self.expect_scalar(cond, ScalarType::Bool, "a `while` condition")?;
                self.block(body);
            }
            StmtKind::If { cond, then, otherwise } => {
                self.expect_scalar(cond, ScalarType::Bool, "an `if` condition")?;
                self.block(then);
                self.block(otherwise);
            }
        }
        Ok(())
    }

    /// `tensor[index]`, one element of an i32 tensor (a flag or a counter); `what` ends
    /// "`tensor.{what}, and `tensor` is …", the error where the tensor is of another dtype.
    fn i32_element(&mut self, tensor: &str, index: &mut [crate::tirh::Expr], loc: SourceLoc, what: &str) -> Result<(), CompileError> {
        let (dtype, rank) = self.global(tensor, loc)?;
        if dtype != DType::I32 {
            return Err(CompileError::ty(loc, format!("`{tensor}.{what}, and `{tensor}` is `Global<{dtype}, {rank}>`")));
        }
        self.indices(tensor, rank, index, loc)
    }

    fn indices(&mut self, tensor: &str, rank: u32, index: &mut [crate::tirh::Expr], loc: SourceLoc) -> Result<(), CompileError> {
        if index.len() != rank as usize {
            let at = index.first().map_or(loc, |e| e.loc);
            return Err(CompileError::ty(at, format!("`{tensor}` has rank {rank}: expected {rank} indices, found {}", index.len())));
        }
        for e in index.iter_mut() {
            self.expect_scalar(e, ScalarType::I32, "an index")?;
        }
        Ok(())
    }

    fn expect_scalar(&mut self, e: &mut crate::tirh::Expr, want: ScalarType, what: &str) -> Result<(), CompileError> {
        let ty = self.expr(e)?;
        if ty != Type::Scalar(want) {
            return Err(CompileError::ty(e.loc, format!("{what} must be `{want}`, found `{ty}`")));
        }
        Ok(())
    }
}

/// A tile stored to or loaded from a rank-1 tensor must be a row or a column.
fn check_rank1(rank: u32, t: TileType, loc: SourceLoc) -> Result<(), CompileError> {
    if rank == 1 && t.rows != 1 && t.cols != 1 {
        return Err(CompileError::ty(
            loc,
            format!("a rank-1 tensor takes a `Tile<{}, M, 1>` or `Tile<{}, 1, N>`, found `{t}`", t.dtype, t.dtype),
        ));
    }
    Ok(())
}
