//! Rust function → TIR-H: syntax and names. Shapes and dtypes are checked in `tessera-ptx`.

use proc_macro2::Span;
use quote::ToTokens;
use syn::spanned::Spanned;
use syn::{BinOp as SynBinOp, Expr as SynExpr, Pat, Stmt as SynStmt, UnOp as SynUnOp};
use tessera_ptx::tirh::{
    BinOp, Builtin, Expr, ExprKind, Param, ReduceOp, SourceLoc, Stmt, StmtKind, TileIr, TileType, Type, UnOp, UniformKind,
};
use tessera_ptx::{DType, ScalarType};

/// The frontend's state: the span table that [`SourceLoc::span`] indexes, and the errors.
pub struct Frontend {
    pub spans: Vec<Span>,
    pub errors: Vec<syn::Error>,
    /// For each span, the inlined call whose body it is in (an index into `sites`), if any.
    pub origins: Vec<Option<u32>>,
    /// Each inlined call: the span index of the call, and the callee's name.
    pub sites: Vec<(u32, String)>,
    /// The inlined call whose body is being parsed.
    pub site: Option<u32>,
    /// The device functions known: the definitions the macro was handed.
    pub defs: Vec<crate::device::DeviceDef>,
    /// The device functions the code being parsed can call: the path it calls each by, and
    /// the definition (the kernel's, or a device function's own, resolved where it is defined).
    pub deps: Vec<(String, u32)>,
    /// A call's explicit generic arguments (`f::<64, bf16>(x)`), by the call's span index.
    pub explicit: std::collections::HashMap<u32, Vec<syn::GenericArgument>>,
    /// Device-function bodies inlined so far: each gets its own suffix for its locals.
    pub instances: u32,
    /// Every definition by its name, consulted when a call's path names none of `deps`
    /// (`compile_with_devices`, for tools that hand over definitions without their paths).
    pub by_name: Vec<(String, u32)>,
    /// The closures written as arguments of device-function calls, each with the calls its
    /// body may make (the `deps` where it was written).
    pub lambdas: Vec<Lambda>,
    /// A call's function arguments (closures, or functions passed on by name), by the call's
    /// span index: each one's position among the arguments, and what it is.
    pub fn_args: std::collections::HashMap<u32, Vec<(usize, crate::device::FnArg)>>,
}

type R<T> = Result<T, syn::Error>;

/// A closure written as a device function's argument: itself, the calls its body may make
/// (the `deps` where it was written), and where it stands.
pub type Lambda = (syn::ExprClosure, Vec<(String, u32)>, SourceLoc);

const FUNCTIONS: &str = "`exp2`, `log2`, `abs`, `sqrt`, `rsqrt`, `tanh`, `erf`, `sin`, `cos`, `sin_reduced`, `cos_reduced`, `floor`, `step`, `max`, `min`, `row_sum`, `row_max`, `row_min`, `col_sum`, `col_max`, `col_min`, `block_sum`, `block_max`, `block_min`, `tile_all`, `block::id_x`, `grid::dim_x`, `warpgroup::id`, `Tile::<T, M, N>::zeros`, `Tile::<T, M, N>::full`, `Tile::<f32, M, N>::col_index`, `Tile::<f32, M, N>::row_index`, `Tile::<f32, M, N>::uniform`, `Tile::<f32, M, N>::uniform8`, `Tile::<f32, M, N>::uniform8_t`, `Smem::<T, M, N>::ring`, `Pipeline::<S>::new`, `TileQueue::<S>::new`, `tma::load`, `tma::store`, `tma::reduce_add`, `tma::store_flat`, `tma::reduce_add_flat`, `tma::store_wait`, `mma_sync`, `mma_sync_kn`, `mma_wait`, `setmaxnreg`, `barrier::sync`, `barrier::arrive`, `tile_scan::<F>`, `tile_scan_exclusive::<F>`, `tile_scan_reverse::<F>`, `tile_scan_reverse_exclusive::<F>`";

/// The scans: inclusive or exclusive, from the first element or from the last.
const SCANS: [&str; 4] = ["tile_scan", "tile_scan_exclusive", "tile_scan_reverse", "tile_scan_reverse_exclusive"];
const METHODS: &str = "`load`, `load_or`, `get`, `store`, `store_within`, `atomic_add`, `atomic_max`, `fetch_add`, `fetch_inc`, `wait_nonzero`, `dim`, `cast`, `exp2`, `exp2_fma`, `exp2_split`, `log2`, `abs`, `sqrt`, `rsqrt`, `tanh`, `erf`, `sin`, `cos`, `sin_reduced`, `cos_reduced`, `floor`, `step`, `mask_cols`, `keep_where`, `swap_pairs`, `last_col`, `first_col`, `shift_cols`, `shift_rows`, `max`, `min`, `sum`, `reduce_max`, `reduce_min`, `row_sum`, `row_max`, `at`, `rows`, `cols`, `acquire`, `wait`, `commit`, `release`";

/// Whether a call's path names one of the language's own functions (which a device function
/// cannot shadow): every other call is a device function's.
pub(crate) fn is_builtin(segs: &[&str]) -> bool {
    matches!(segs, [f] if UnOp::function(f).is_some())
        || matches!(
            segs,
            ["block", "id_x" | "id_y" | "id_z"]
                | ["grid", "dim_x" | "dim_y" | "dim_z"]
                | ["warpgroup", "id" | "setmaxnreg"]
                | ["max" | "min" | "block_sum" | "block_max" | "block_min" | "tile_all"]
                | ["row_sum" | "row_max" | "row_min" | "col_sum" | "col_max" | "col_min"]
                | ["Smem" | "smem", _]
                | ["Pipeline" | "TileQueue", _]
                | ["Tile" | "tile", _]
                | ["tma", _]
                | ["mma_sync" | "mma_sync_kn" | "mma_wait" | "setmaxnreg"]
                | ["barrier", _]
                | ["tile_scan" | "tile_scan_exclusive" | "tile_scan_reverse" | "tile_scan_reverse_exclusive"]
        )
}

/// The combine of a `tile_scan::<F>(…)` call: `F`'s path, if the call is a scan's.
pub(crate) fn scan_combine(c: &syn::ExprCall) -> Option<syn::Path> {
    let SynExpr::Path(p) = &*c.func else { return None };
    let last = p.path.segments.last()?;
    if p.path.segments.len() != 1 || !SCANS.iter().any(|s| last.ident == s) {
        return None;
    }
    let syn::PathArguments::AngleBracketed(g) = &last.arguments else { return None };
    match g.args.first() {
        Some(syn::GenericArgument::Type(syn::Type::Path(t))) if g.args.len() == 1 && t.qself.is_none() => Some(t.path.clone()),
        _ => None,
    }
}

fn err<T>(span: impl ToTokens, msg: impl std::fmt::Display) -> R<T> {
    Err(syn::Error::new_spanned(span, msg))
}

impl Frontend {
    pub fn new() -> Self {
        Frontend {
            spans: Vec::new(),
            errors: Vec::new(),
            origins: Vec::new(),
            sites: Vec::new(),
            site: None,
            defs: Vec::new(),
            deps: Vec::new(),
            explicit: std::collections::HashMap::new(),
            instances: 0,
            by_name: Vec::new(),
            lambdas: Vec::new(),
            fn_args: std::collections::HashMap::new(),
        }
    }

    pub(crate) fn loc(&mut self, span: Span) -> SourceLoc {
        self.spans.push(span);
        self.origins.push(self.site);
        let start = span.start();
        SourceLoc { span: (self.spans.len() - 1) as u32, line: start.line as u32, col: start.column as u32 }
    }

    /// Builds TIR-H from the function; syntax errors are collected in `self.errors`.
    pub fn kernel(&mut self, f: &syn::ItemFn, warpgroups: u32) -> Option<TileIr> {
        if !f.sig.generics.params.is_empty() {
            self.errors
                .push(syn::Error::new_spanned(&f.sig.generics, "kernels take no generic parameters (use `dtypes(...)` variants instead)"));
        }
        if let syn::ReturnType::Type(_, ty) = &f.sig.output {
            self.errors.push(syn::Error::new_spanned(ty, "kernels return nothing: store results into a `Global` parameter"));
        }
        let mut params = Vec::new();
        for input in &f.sig.inputs {
            match self.param(input) {
                Ok(p) => params.push(p),
                Err(e) => self.errors.push(e),
            }
        }
        let body = self.block(&f.block.stmts);
        if !self.errors.is_empty() {
            return None;
        }
        let file = f.sig.ident.span().file();
        Some(TileIr { name: f.sig.ident.to_string(), file, params, warpgroups, blocks_per_sm: 0, wait_limit: 0, body })
    }

    fn param(&mut self, input: &syn::FnArg) -> R<Param> {
        let syn::FnArg::Typed(pt) = input else {
            return err(input, "kernels are free functions: `self` is not a parameter");
        };
        let Pat::Ident(id) = &*pt.pat else {
            return err(&pt.pat, "expected a parameter name");
        };
        let ty = param_type(&pt.ty)?;
        let loc = self.loc(id.ident.span());
        Ok(Param { name: id.ident.to_string(), ty, loc })
    }

    pub(crate) fn block(&mut self, stmts: &[SynStmt]) -> Vec<Stmt> {
        let mut out = Vec::new();
        for s in stmts {
            match self.stmt(s) {
                // A compile-time `if`'s branch that binds nothing stands in its place, so that
                // choosing code by a constant costs no branch in the PTX.
                Ok(Some(Stmt { kind: StmtKind::If { cond: Expr { kind: ExprKind::Bool(true), .. }, then, otherwise }, text, .. }))
                    if otherwise.is_empty()
                        && text.starts_with(CONST_IF)
                        && !then.iter().any(|t| matches!(t.kind, StmtKind::Let { .. } | StmtKind::Unpack { assign: false, .. })) =>
                {
                    out.extend(then)
                }
                Ok(Some(s)) => out.push(s),
                Ok(None) => {}
                Err(e) => self.errors.push(e),
            }
        }
        out
    }

    fn stmt(&mut self, s: &SynStmt) -> R<Option<Stmt>> {
        let text = match self.site {
            Some(site) => format!("{}: {}", self.sites[site as usize].1, statement_text(s)),
            None => statement_text(s),
        };
        let loc = self.loc(s.span());
        let kind = match s {
            SynStmt::Local(local) => {
                let (pat, declared) = match &local.pat {
                    Pat::Type(pt) => (&*pt.pat, Some(tile_type(&pt.ty)?)),
                    other => (other, None),
                };
                if let Pat::Tuple(t) = pat {
                    let Some(init) = &local.init else {
                        return err(local, "a `let` in a kernel needs a value");
                    };
                    let names = t.elems.iter().map(|p| self.tuple_name(p)).collect::<R<Vec<_>>>()?;
                    let value = self.call_value(&init.expr)?;
                    return Ok(Some(Stmt { kind: StmtKind::Unpack { names, assign: false, value }, loc, text }));
                }
                let Pat::Ident(id) = pat else {
                    return err(pat, "unsupported pattern: expected `let name` or `let mut name`");
                };
                let Some(init) = &local.init else {
                    return err(local, "a `let` in a kernel needs a value");
                };
                if let Some((_, diverge)) = &init.diverge {
                    return err(diverge, "unsupported Rust construct in a kernel: `let … else`");
                }
                if let SynExpr::MethodCall(m) = &*init.expr {
                    // Statements of their own that bind an i32 (the leader's value, handed out):
                    // a plain `let name`, the call's errors pointing at the call.
                    // (How it binds, whether it is the wait.)
                    let how = match m.method.to_string().as_str() {
                        "wait_nonzero" => {
                            Some(("`wait_nonzero`'s value binds as `let flag = tensor.wait_nonzero([i]);`".to_string(), true))
                        }
                        op @ ("fetch_add" | "fetch_inc") => {
                            Some((format!("`{op}`'s old value binds as `let name = tensor.{op}([i], v);`"), false))
                        }
                        _ => None,
                    };
                    if let Some((how, wait)) = how {
                        if declared.is_some() || id.mutability.is_some() {
                            return err(pat, how);
                        }
                        let (loc, name) = (self.loc(m.span()), id.ident.to_string());
                        let kind = if wait { self.wait_nonzero(m, name)? } else { self.fetch_add(m, Some(name))? };
                        return Ok(Some(Stmt { kind, loc, text }));
                    }
                }
                StmtKind::Let { name: id.ident.to_string(), mutable: id.mutability.is_some(), declared, value: self.expr(&init.expr)? }
            }
            // A stray `;` (Rust allows it; it has no tokens to point an error at).
            SynStmt::Expr(SynExpr::Verbatim(v), _) if v.is_empty() => return Ok(None),
            SynStmt::Expr(e, _) => return self.expr_stmt(e, loc, text),
            SynStmt::Item(item) => return err(item, "unsupported Rust construct in a kernel: an item (fn, struct, use …)"),
            SynStmt::Macro(m) => return err(&m.mac.path, "unsupported Rust construct in a kernel: a macro call"),
        };
        Ok(Some(Stmt { kind, loc, text }))
    }

    fn expr_stmt(&mut self, e: &SynExpr, loc: SourceLoc, text: String) -> R<Option<Stmt>> {
        let kind = match e {
            SynExpr::Assign(a) if matches!(&*a.left, SynExpr::Tuple(_)) => {
                let SynExpr::Tuple(t) = &*a.left else { return Err(unsupported(&a.left)) };
                let names = t.elems.iter().map(|e| assignee(e).map(|n| (n, false))).collect::<R<Vec<_>>>()?;
                StmtKind::Unpack { names, assign: true, value: self.call_value(&a.right)? }
            }
            SynExpr::Assign(a) => StmtKind::Assign { name: assignee(&a.left)?, value: self.expr(&a.right)? },
            SynExpr::Binary(b) if compound_op(&b.op).is_some() => {
                let name = assignee(&b.left)?;
                let op = compound_op(&b.op).unwrap_or(BinOp::Add);
                let lhs_loc = self.loc(b.left.span());
                let lhs = Expr::new(ExprKind::Var(name.clone()), lhs_loc);
                let rhs = self.expr(&b.right)?;
                let op_loc = self.loc(b.span());
                StmtKind::Assign { name, value: Expr::new(ExprKind::Binary(op, Box::new(lhs), Box::new(rhs)), op_loc) }
            }
            SynExpr::Call(c) if self.is_stmt_call(c) => self.stmt_call(c)?,
            SynExpr::Call(c) if self.device_of(c).is_some() => StmtKind::Eval(self.expr(e)?),
            SynExpr::MethodCall(m) if m.method == "commit" || m.method == "release" => {
                let pipe = receiver_name(&m.receiver)?;
                if m.args.len() != 1 {
                    return err(&m.method, format!("`{}` takes the stage: `pipe.{}(s)`", m.method, m.method));
                }
                let stage = self.expr(&m.args[0])?;
                if m.method == "commit" {
                    StmtKind::PipeCommit { pipe, stage }
                } else {
                    StmtKind::PipeRelease { pipe, stage }
                }
            }
            SynExpr::MethodCall(m) if m.method == "store" && m.args.len() == 1 => {
                StmtKind::SmemStore { view: self.expr(&m.receiver)?, value: self.expr(&m.args[0])?, fragments: false }
            }
            SynExpr::MethodCall(m) if m.method == "store_fragments" => {
                if m.args.len() != 1 {
                    return err(m, "`store_fragments` takes an MMA accumulator: `ring.at(s).store_fragments(acc)`");
                }
                StmtKind::SmemStore { view: self.expr(&m.receiver)?, value: self.expr(&m.args[0])?, fragments: true }
            }
            SynExpr::MethodCall(m) if m.method == "store" => {
                let tensor = receiver_name(&m.receiver)?;
                if m.args.len() != 2 {
                    return err(m, "`store` takes an origin and a tile: `tensor.store([i, j], tile)`");
                }
                StmtKind::Store { tensor, index: self.index(&m.args[0])?, value: self.expr(&m.args[1])?, within: None }
            }
            SynExpr::MethodCall(m) if m.method == "atomic_add" || m.method == "atomic_max" => {
                let tensor = receiver_name(&m.receiver)?;
                let op = &m.method;
                if m.args.len() != 2 {
                    return err(m, format!("`{op}` takes an origin and an f32 tile: `tensor.{op}([i, j], tile)`"));
                }
                StmtKind::AtomicAdd { tensor, index: self.index(&m.args[0])?, value: self.expr(&m.args[1])?, max: op == "atomic_max" }
            }
            SynExpr::MethodCall(m) if m.method == "fetch_add" || m.method == "fetch_inc" => self.fetch_add(m, None)?,
            SynExpr::MethodCall(m) if m.method == "prefetch" => {
                let tensor = receiver_name(&m.receiver)?;
                let (Some(tf), 1) = (&m.turbofish, m.args.len()) else {
                    return err(m, "`prefetch` takes the tile type and an origin: `tensor.prefetch::<Tile<T, M, N>>([i, j])`");
                };
                let tile = Some(turbofish_tile(tf)?);
                let load = ExprKind::Load { tensor, index: self.index(&m.args[0])?, fill: None, tile };
                StmtKind::Prefetch(Expr::new(load, loc))
            }
            SynExpr::MethodCall(m) if m.method == "store_within" => {
                let tensor = receiver_name(&m.receiver)?;
                if m.args.len() != 3 {
                    return err(m, "`store_within` takes an origin, a tile and an end per dimension: `tensor.store_within([i, j], tile, [rows, cols])`");
                }
                StmtKind::Store {
                    tensor,
                    index: self.index(&m.args[0])?,
                    value: self.expr(&m.args[1])?,
                    within: Some(self.index(&m.args[2])?),
                }
            }
            SynExpr::ForLoop(f) if f.attrs.iter().any(|a| a.path().is_ident("unroll")) => return self.unrolled(f, loc, text),
            SynExpr::ForLoop(f) => {
                if let Some(a) = f.attrs.first() {
                    return err(a, "unknown loop attribute: expected `#[unroll]`");
                }
                let Pat::Ident(id) = &*f.pat else {
                    return err(&f.pat, "expected a loop variable name");
                };
                let var = id.ident.to_string();
                if let Some((queue, total)) = self.queue_source(&f.expr)? {
                    let body = self.block(&f.body.stmts);
                    StmtKind::QueueFor { var, queue, total, body }
                } else {
                    let (start, end, step) = self.range(&f.expr)?;
                    let body = self.block(&f.body.stmts);
                    StmtKind::For { var, start, end, step, body }
                }
            }
            SynExpr::While(w) if !matches!(&*w.cond, SynExpr::Let(_)) => {
                if let Some(l) = &w.label {
                    return err(l, "a loop label: `break` and `continue` are not supported, so a `while` needs none");
                }
                let cond = self.expr(&w.cond)?;
                let body = self.block(&w.body.stmts);
                StmtKind::While { cond, body }
            }
            SynExpr::If(i) => {
                let kind = self.if_stmt(i)?;
                if const_bool(&i.cond).is_some() {
                    return Ok(Some(Stmt { kind, loc, text: format!("{CONST_IF}{text}") }));
                }
                kind
            }
            SynExpr::Block(b) if b.label.is_none() => {
                let body = self.block(&b.block.stmts);
                let t = self.loc(b.span());
                let always = Expr::new(ExprKind::Bool(true), t);
                StmtKind::If { cond: always, then: body, otherwise: Vec::new() }
            }
            other => return Err(unsupported(other)),
        };
        Ok(Some(Stmt { kind, loc, text }))
    }

    /// `#[unroll] for j in a..b { body }` with constant bounds: the body once per value, with
    /// `j` replaced by the value, each copy in its own scope.
    fn unrolled(&mut self, f: &syn::ExprForLoop, loc: SourceLoc, text: String) -> R<Option<Stmt>> {
        let Pat::Ident(id) = &*f.pat else {
            return err(&f.pat, "expected a loop variable name");
        };
        let SynExpr::Range(r) = strip_paren(&f.expr) else {
            return err(&f.expr, "`#[unroll]` loops run over a constant range `a..b`");
        };
        let bound = |e: &Option<Box<SynExpr>>| e.as_deref().and_then(const_eval);
        let (Some(a), Some(b)) = (bound(&r.start), bound(&r.end)) else {
            return err(r, "`#[unroll]` loops run over a constant range `a..b`");
        };
        if b - a > 64 {
            return err(r, format!("`#[unroll]` expands at most 64 copies, found {}", b - a));
        }
        let mut copies = Vec::new();
        for v in a..b {
            let mut block = f.body.clone();
            syn::visit_mut::VisitMut::visit_block_mut(&mut Substitute { name: id.ident.to_string(), value: v }, &mut block);
            let body = self.block(&block.stmts);
            let always = Expr::new(ExprKind::Bool(true), loc);
            copies.push(Stmt {
                kind: StmtKind::If { cond: always, then: body, otherwise: Vec::new() },
                loc,
                text: format!("{text} [{} = {v}]", id.ident),
            });
        }
        let always = Expr::new(ExprKind::Bool(true), loc);
        Ok(Some(Stmt { kind: StmtKind::If { cond: always, then: copies, otherwise: Vec::new() }, loc, text }))
    }

    fn is_stmt_call(&self, c: &syn::ExprCall) -> bool {
        let SynExpr::Path(p) = &*c.func else { return false };
        let segs: Vec<String> = p.path.segments.iter().map(|s| s.ident.to_string()).collect();
        matches!(
            segs.iter().map(String::as_str).collect::<Vec<_>>().as_slice(),
            ["tma", "load"]
                | ["tma", "store"]
                | ["tma", "reduce_add"]
                | ["tma", "store_flat"]
                | ["tma", "reduce_add_flat"]
                | ["tma", "store_wait"]
                | ["mma_sync"]
                | ["mma_sync_kn"]
                | ["mma_wait"]
                | ["setmaxnreg"]
                | ["warpgroup", "setmaxnreg"]
                | ["barrier", "sync"]
                | ["barrier", "arrive"]
        )
    }

    /// `tma::load(view, tensor, [i, j], pipe)`, `mma_sync(acc, a, b)`, `setmaxnreg(n)`.
    fn stmt_call(&mut self, c: &syn::ExprCall) -> R<StmtKind> {
        let SynExpr::Path(p) = &*c.func else { return Err(unsupported(&c.func)) };
        let last = p.path.segments.last().map(|s| s.ident.to_string()).unwrap_or_default();
        let args: Vec<&SynExpr> = c.args.iter().collect();
        match last.as_str() {
            "store" | "reduce_add" | "store_flat" | "reduce_add_flat" => {
                let flat = last.ends_with("_flat");
                let [tensor, index, src] = args.as_slice() else {
                    let from = if flat { "a first element" } else { "an origin" };
                    return err(c, format!("`tma::{last}` takes a tensor, {from} and a shared view: `tma::{last}(c, [i, j], ring.at(s))`"));
                };
                let add = last.starts_with("reduce_add");
                Ok(StmtKind::TmaStore { tensor: receiver_name(tensor)?, index: self.index(index)?, src: self.expr(src)?, add, flat })
            }
            "store_wait" => {
                let [n] = args.as_slice() else { return err(c, "`tma::store_wait` takes how many stores may still read shared memory") };
                Ok(StmtKind::TmaStoreWait(int_const(n, "`tma::store_wait` takes a constant")?))
            }
            "load" => {
                let [dst, tensor, index, pipe] = args.as_slice() else {
                    return err(
                        c,
                        "`tma::load` takes a shared view, a tensor, an origin and a pipeline: `tma::load(ring.at(s), a, [i, j], pipe)`",
                    );
                };
                Ok(StmtKind::TmaLoad {
                    dst: self.expr(dst)?,
                    tensor: receiver_name(tensor)?,
                    index: self.index(index)?,
                    pipe: receiver_name(pipe)?,
                })
            }
            "mma_sync" | "mma_sync_kn" => {
                let [acc, a, b] = args.as_slice() else {
                    return err(c, format!("`{last}` takes an accumulator and two shared views: `{last}(acc, a, b)`"));
                };
                let acc = match acc {
                    SynExpr::Reference(r) => &*r.expr,
                    other => other,
                };
                // `view.t()` as `a`: the view holds A transposed (K×M, M-major).
                let (a, a_t): (&SynExpr, bool) = match a {
                    SynExpr::MethodCall(m) if m.method == "t" && m.args.is_empty() => (&m.receiver, true),
                    other => (other, false),
                };
                Ok(StmtKind::Mma { acc: assignee(acc)?, a: self.expr(a)?, b: self.expr(b)?, b_kn: last == "mma_sync_kn", a_t })
            }
            "sync" | "arrive" => {
                let [id, warpgroups] = args.as_slice() else {
                    return err(c, format!("`barrier::{last}` takes a barrier id and a warpgroup count: `barrier::{last}(0, 2)`"));
                };
                Ok(StmtKind::NamedBarrier {
                    id: int_const(id, "a named barrier's id is a constant")?,
                    warpgroups: int_const(warpgroups, "a named barrier's warpgroup count is a constant")?,
                    wait: last == "sync",
                    loc: self.loc(id.span()),
                })
            }
            "mma_wait" => {
                let [n] = args.as_slice() else { return err(c, "`mma_wait` takes how many MMA groups may stay in flight") };
                Ok(StmtKind::MmaWait(int_const(n, "`mma_wait` takes a constant")?))
            }
            _ => {
                let [n] = args.as_slice() else { return err(c, "`setmaxnreg` takes a register count") };
                Ok(StmtKind::SetMaxNReg(int_const(n, "`setmaxnreg` takes a constant register count")?))
            }
        }
    }

    fn if_stmt(&mut self, i: &syn::ExprIf) -> R<StmtKind> {
        // A condition on constants alone (a device function's `if KN == 1` once `KN` is bound, a
        // `tune` knob's): only the branch taken is compiled, so the other need not type-check.
        // A conjunction with a constant part (`if D % 64 == 0 && fused == 1`): false when the
        // constant part is, else the rest alone.
        let (cond_expr, known) = const_conjuncts(&i.cond);
        if let Some(taken) = known.or_else(|| const_bool(&i.cond)) {
            let loc = self.loc(i.cond.span());
            let body = match (taken, &i.else_branch) {
                (true, _) => self.block(&i.then_branch.stmts),
                (false, None) => Vec::new(),
                (false, Some((_, e))) => match &**e {
                    SynExpr::Block(b) => self.block(&b.block.stmts),
                    SynExpr::If(nested) => {
                        let kind = self.if_stmt(nested)?;
                        vec![Stmt { kind, loc, text: "else if".into() }]
                    }
                    other => return Err(unsupported(other)),
                },
            };
            return Ok(StmtKind::If { cond: Expr::new(ExprKind::Bool(true), loc), then: body, otherwise: Vec::new() });
        }
        let cond = self.expr(cond_expr)?;
        let then = self.block(&i.then_branch.stmts);
        let otherwise = match &i.else_branch {
            None => Vec::new(),
            Some((_, e)) => match &**e {
                SynExpr::Block(b) => self.block(&b.block.stmts),
                SynExpr::If(nested) => {
                    let loc = self.loc(nested.span());
                    let kind = self.if_stmt(nested)?;
                    vec![Stmt { kind, loc, text: "else if".into() }]
                }
                other => return Err(unsupported(other)),
            },
        };
        Ok(StmtKind::If { cond, then, otherwise })
    }

    /// `a..b` or `(a..b).step_by(k)`.
    /// `queue.fetch(total)` or `queue.take()` as a loop's source: the queue and `Some(total)`
    /// for `fetch`.
    fn queue_source(&mut self, e: &SynExpr) -> R<Option<(String, Option<Expr>)>> {
        let SynExpr::MethodCall(m) = strip_paren(e) else { return Ok(None) };
        match m.method.to_string().as_str() {
            "fetch" if m.args.len() == 1 => Ok(Some((receiver_name(&m.receiver)?, Some(self.expr(&m.args[0])?)))),
            "fetch" => err(&m.method, "`fetch` takes the number of indices: `for t in queue.fetch(total)`"),
            "take" if m.args.is_empty() => Ok(Some((receiver_name(&m.receiver)?, None))),
            "take" => err(&m.method, "`take` takes no arguments: `for t in queue.take()`"),
            _ => Ok(None),
        }
    }

    fn range(&mut self, e: &SynExpr) -> R<(Expr, Expr, Box<Expr>)> {
        let (range, step) = match e {
            SynExpr::MethodCall(m) if m.method == "step_by" && m.args.len() == 1 => {
                if let SynExpr::Lit(syn::ExprLit { lit: syn::Lit::Int(i), .. }) = &m.args[0] {
                    if i.base10_parse::<i64>()? <= 0 {
                        return err(&m.args[0], "`step_by` takes a positive step, found 0");
                    }
                }
                (strip_paren(&m.receiver), self.expr(&m.args[0])?)
            }
            other => {
                let one = Expr::new(ExprKind::Int(1), self.loc(other.span()));
                (strip_paren(other), one)
            }
        };
        match range {
            SynExpr::Range(r) if matches!(r.limits, syn::RangeLimits::HalfOpen(_)) => match (&r.start, &r.end) {
                (Some(a), Some(b)) => Ok((self.expr(a)?, self.expr(b)?, Box::new(step))),
                _ => err(r, "a kernel loop runs over `start..end`, with both bounds"),
            },
            other => err(other, "a kernel loop runs over `start..end` or `(start..end).step_by(k)`"),
        }
    }

    /// `let name = tensor.wait_nonzero([i])`.
    fn wait_nonzero(&mut self, m: &syn::ExprMethodCall, name: String) -> R<StmtKind> {
        let tensor = receiver_name(&m.receiver)?;
        let [index] = m.args.iter().collect::<Vec<_>>()[..] else {
            return err(m, "`wait_nonzero` takes an element's index: `let flag = tensor.wait_nonzero([i]);`");
        };
        Ok(StmtKind::WaitNonzero { name, tensor, index: self.index(index)? })
    }

    /// `tensor.fetch_add([i], v)` or `tensor.fetch_inc([i], limit)`, its old value bound to
    /// `name` where a `let` gives one.
    fn fetch_add(&mut self, m: &syn::ExprMethodCall, name: Option<String>) -> R<StmtKind> {
        let tensor = receiver_name(&m.receiver)?;
        let inc = m.method == "fetch_inc";
        if m.args.len() != 2 {
            let example = if inc { "let ticket = tensor.fetch_inc([i], n - 1);" } else { "let old = tensor.fetch_add([i], 1);" };
            return err(m, format!("`{}` takes an element's index and an i32: `{example}`", m.method));
        }
        Ok(StmtKind::FetchAdd { name, tensor, index: self.index(&m.args[0])?, value: self.expr(&m.args[1])?, inc })
    }

    fn index(&mut self, e: &SynExpr) -> R<Vec<Expr>> {
        match e {
            SynExpr::Array(a) => a.elems.iter().map(|x| self.expr(x)).collect(),
            other => err(other, "expected the tile's origin as an array of indices, e.g. `[row, col]`"),
        }
    }

    pub fn expr(&mut self, e: &SynExpr) -> R<Expr> {
        let loc = self.loc(e.span());
        let kind = match e {
            SynExpr::Lit(l) => match &l.lit {
                syn::Lit::Int(i) => ExprKind::Int(i.base10_parse()?),
                syn::Lit::Float(f) => ExprKind::Float(f.base10_parse()?),
                syn::Lit::Bool(b) => ExprKind::Bool(b.value),
                other => return err(other, "unsupported literal: expected an integer, a float or a bool"),
            },
            SynExpr::Paren(p) => return self.expr(&p.expr),
            SynExpr::Group(g) => return self.expr(&g.expr),
            SynExpr::Path(p) => path_value(&p.path)?,
            SynExpr::Binary(b) => {
                let Some(op) = bin_op(&b.op) else {
                    return err(b.op, "unsupported operator: expected `+ - * / %`, a comparison, `&&` or `||`");
                };
                let (l, r) = (self.expr(&b.left)?, self.expr(&b.right)?);
                ExprKind::Binary(op, Box::new(l), Box::new(r))
            }
            SynExpr::Unary(u) if matches!(u.op, SynUnOp::Deref(_)) => return self.expr(&u.expr),
            SynExpr::Unary(u) => {
                let op = match u.op {
                    SynUnOp::Neg(_) => UnOp::Neg,
                    SynUnOp::Not(_) => UnOp::Not,
                    _ => return err(u.op, "unsupported operator: expected `-` or `!`"),
                };
                // `-1.5` is a literal, not an operation.
                let inner = self.expr(&u.expr)?;
                match (op, &inner.kind) {
                    (UnOp::Neg, ExprKind::Int(v)) => ExprKind::Int(-v),
                    (UnOp::Neg, ExprKind::Float(v)) => ExprKind::Float(-v),
                    _ => ExprKind::Unary(op, Box::new(inner)),
                }
            }
            SynExpr::Cast(c) => {
                let to = scalar_dtype(&c.ty).ok_or_else(|| syn::Error::new_spanned(&c.ty, "`as` converts scalars to `f32` or `i32`"))?;
                ExprKind::Cast { value: Box::new(self.expr(&c.expr)?), to }
            }
            SynExpr::Call(c) => self.call(c, loc)?,
            SynExpr::MethodCall(m) => self.method(m)?,
            other => return Err(unsupported(other)),
        };
        Ok(Expr::new(kind, loc))
    }

    /// The definition a call names, if it calls a device function.
    pub(crate) fn device_of(&self, c: &syn::ExprCall) -> Option<u32> {
        let SynExpr::Path(p) = &*c.func else { return None };
        let key = path_key(&p.path);
        let name = p.path.segments.last().map(|s| s.ident.to_string()).unwrap_or_default();
        self.deps.iter().find(|(k, _)| *k == key).or_else(|| self.by_name.iter().find(|(k, _)| *k == name)).map(|(_, id)| *id)
    }

    /// The definition a bare path names among the functions this code can call.
    fn fn_named(&self, path: &syn::Path) -> Option<u32> {
        let key = path_key(path);
        self.deps.iter().find(|(k, _)| *k == key).map(|(_, id)| *id)
    }

    /// A call of a device function, as the value of a tuple binding.
    fn call_value(&mut self, e: &SynExpr) -> R<Expr> {
        match strip_paren(e) {
            SynExpr::Call(c) if self.device_of(c).is_some() || scan_combine(c).is_some() => self.expr(e),
            other => err(other, "a tuple takes the results of a device function's call: `let (a, b) = f(x);`"),
        }
    }

    /// One name of a tuple pattern: `a`, `mut a`, or `_`.
    fn tuple_name(&mut self, p: &Pat) -> R<(String, bool)> {
        match p {
            Pat::Ident(id) if id.by_ref.is_none() && id.subpat.is_none() => Ok((id.ident.to_string(), id.mutability.is_some())),
            Pat::Wild(_) => Ok((format!("__unused_{}", self.spans.len()), false)),
            other => err(other, "a tuple pattern lists names: `let (a, mut b, _) = f(x);`"),
        }
    }

    /// `tile_scan::<F>(x, axis, identity)`, or of tuples: `tile_scan::<F>((a, b), 1, (1.0, 0.0))`.
    fn scan(&mut self, c: &syn::ExprCall, name: &syn::PathSegment) -> R<ExprKind> {
        let what = name.ident.to_string();
        let Some(f) = scan_combine(c) else {
            return err(name, format!("`{what}` names its combine, a device function: `{what}::<add>(x, 1, 0.0)`"));
        };
        let key = path_key(&f);
        let name = f.segments.last().map(|s| s.ident.to_string()).unwrap_or_default();
        let found = self.deps.iter().find(|(k, _)| *k == key).or_else(|| self.by_name.iter().find(|(k, _)| *k == name));
        let Some(id) = found.map(|(_, id)| *id) else {
            return err(&f, format!("unknown combine `{key}`: expected a `#[tessera::device]` function"));
        };
        let [x, axis, identity] = [0, 1, 2].map(|i| c.args.iter().nth(i));
        let (Some(x), Some(axis), Some(identity), 3) = (x, axis, identity, c.args.len()) else {
            return err(
                c,
                format!("`{what}` takes the tile (or a tuple of tiles), the axis and the combine's identity: `{what}::<add>(x, 1, 0.0)`"),
            );
        };
        let list = |me: &mut Self, e: &SynExpr| -> R<Vec<Expr>> {
            match strip_paren(e) {
                SynExpr::Tuple(t) => t.elems.iter().map(|x| me.expr(x)).collect(),
                other => Ok(vec![me.expr(other)?]),
            }
        };
        let values = list(self, x)?;
        let axis = int_const(axis, "the scan's axis is a constant: 1 (along each row) or 0 (down each column)")?;
        let identity = list(self, identity)?;
        let func = f.segments.last().map(|s| s.ident.to_string()).unwrap_or_default();
        let (exclusive, reverse) = (what.ends_with("exclusive"), what.starts_with("tile_scan_reverse"));
        Ok(ExprKind::Scan { func, id, values, axis, identity, exclusive, reverse })
    }

    /// `f(a, &mut b)` of a device function `id`.
    fn device_call(&mut self, c: &syn::ExprCall, p: &syn::ExprPath, id: u32, loc: SourceLoc) -> R<ExprKind> {
        let (mut args, mut by_ref, mut fns) = (Vec::new(), Vec::new(), Vec::new());
        for (i, a) in c.args.iter().enumerate() {
            match a {
                SynExpr::Closure(cl) => {
                    let at = self.loc(cl.span());
                    self.lambdas.push((cl.clone(), self.deps.clone(), at));
                    fns.push((i, crate::device::FnArg::Lambda(self.lambdas.len() - 1)));
                }
                // A function passed on by the name it is called by here (a function
                // parameter, or a device function this code calls).
                SynExpr::Path(p) if p.path.get_ident().is_some() => match self.fn_named(&p.path) {
                    Some(id) => fns.push((i, crate::device::FnArg::Def(id))),
                    None => {
                        args.push(self.expr(a)?);
                        by_ref.push(false);
                    }
                },
                SynExpr::Reference(r) if r.mutability.is_some() => {
                    args.push(self.expr(&r.expr)?);
                    by_ref.push(true);
                }
                SynExpr::Reference(r) => return err(r, "a device function takes values or `&mut name`, not `&name`"),
                other => {
                    args.push(self.expr(other)?);
                    by_ref.push(false);
                }
            }
        }
        if let Some(last) = p.path.segments.last() {
            if let syn::PathArguments::AngleBracketed(g) = &last.arguments {
                self.explicit.insert(loc.span, g.args.iter().cloned().collect());
            }
        }
        if !fns.is_empty() {
            self.fn_args.insert(loc.span, fns);
        }
        let func = p.path.segments.last().map(|s| s.ident.to_string()).unwrap_or_default();
        Ok(ExprKind::Call { func, id, args, by_ref })
    }

    fn call(&mut self, c: &syn::ExprCall, loc: SourceLoc) -> R<ExprKind> {
        let SynExpr::Path(p) = &*c.func else {
            return Err(unsupported(&c.func));
        };
        if let Some(id) = self.device_of(c) {
            return self.device_call(c, p, id, loc);
        }
        if let Some(last) = p.path.segments.last().filter(|l| SCANS.iter().any(|s| l.ident == s)) {
            return self.scan(c, last);
        }
        let segs: Vec<String> = p.path.segments.iter().map(|s| s.ident.to_string()).collect();
        let names: Vec<&str> = segs.iter().map(String::as_str).collect();
        let nargs = c.args.len();
        let args = |me: &mut Self, n: usize| -> R<Vec<Expr>> {
            if nargs != n {
                return err(c, format!("`{}` takes {n} argument{}, found {nargs}", segs.join("::"), if n == 1 { "" } else { "s" }));
            }
            c.args.iter().map(|a| me.expr(a)).collect()
        };
        let axis = |s: &str| -> u8 {
            match s {
                "id_x" | "dim_x" => 0,
                "id_y" | "dim_y" => 1,
                _ => 2,
            }
        };
        Ok(match names.as_slice() {
            ["block", f @ ("id_x" | "id_y" | "id_z")] => {
                args(self, 0)?;
                ExprKind::Builtin(Builtin::BlockId(axis(f)))
            }
            ["grid", f @ ("dim_x" | "dim_y" | "dim_z")] => {
                args(self, 0)?;
                ExprKind::Builtin(Builtin::GridDim(axis(f)))
            }
            ["warpgroup", "id"] => {
                args(self, 0)?;
                ExprKind::Builtin(Builtin::WarpgroupId)
            }
            [f] if UnOp::function(f).is_some() => {
                let mut a = args(self, 1)?;
                ExprKind::Unary(unary_fn(f), Box::new(a.remove(0)))
            }
            [f @ ("max" | "min")] => {
                let mut a = args(self, 2)?;
                let b = a.remove(1);
                ExprKind::Binary(if *f == "max" { BinOp::Max } else { BinOp::Min }, Box::new(a.remove(0)), Box::new(b))
            }
            ["tile_all"] => {
                let mut a = args(self, 1)?;
                ExprKind::TileAll(Box::new(a.remove(0)))
            }
            [f @ ("block_sum" | "block_max" | "block_min")] => {
                let mut a = args(self, 1)?;
                ExprKind::BlockReduce { op: reduce_op(&f[6..]), value: Box::new(a.remove(0)) }
            }
            [f @ ("row_sum" | "row_max" | "row_min" | "col_sum" | "col_max" | "col_min")] => {
                let mut a = args(self, 1)?;
                let axis = if f.starts_with("row") { 1 } else { 0 };
                ExprKind::Reduce { op: reduce_op(&f[4..]), axis, value: Box::new(a.remove(0)) }
            }
            [t @ ("Smem" | "smem"), ctor @ ("ring" | "ring_swizzled")] => {
                let seg = &p.path.segments[0];
                let ga = generic_args(seg, 3, &format!("`{t}<T, M, N>`"))?;
                let dtype = dtype_of(type_arg(ga[0])?)?;
                let (rows, cols) = (smem_rows(ga[1])?, pow2_or_multiple_of_8(ga[2], "a shared tile's columns are")?);
                let want = if *ctor == "ring" { 1 } else { 2 };
                if nargs != want {
                    return err(
                        c,
                        format!(
                            "`{ctor}` takes {}",
                            if want == 1 { "the number of stages" } else { "the number of stages and the swizzle in bytes" }
                        ),
                    );
                }
                let stages = int_const(&c.args[0], "the number of stages must be a constant")?;
                let row_bytes = cols * dtype.size();
                let swizzle = if want == 2 {
                    int_const(&c.args[1], "the swizzle must be a constant: 128, 64, 32 or 0")?
                } else if matches!(row_bytes, 32 | 64 | 128) {
                    row_bytes
                } else {
                    // Wider rows: panels of the widest span that divides them (128-byte panels;
                    // 64-byte ones for rows of 192 bytes, as head dim 96's).
                    [128, 64, 32].into_iter().find(|s| row_bytes % s == 0).unwrap_or(0)
                };
                // Swizzled rows are one span (a power of two) or whole panels of one span.
                if swizzle != 0 && !cols.is_power_of_two() && row_bytes % swizzle != 0 {
                    return err(
                        ga[2],
                        format!("a swizzled ring's columns are a power of two or whole panels of its {swizzle}-byte span, found {cols}; an unswizzled one (`ring_swizzled(stages, 0)`) takes any multiple of 8"),
                    );
                }
                ExprKind::SmemRing(tessera_ptx::tirh::SmemType { dtype, rows, cols, stages, swizzle })
            }
            ["Pipeline", "new"] => {
                let seg = &p.path.segments[0];
                let ga = generic_args(seg, 1, "`Pipeline<STAGES>`")?;
                let stages = const_arg(ga[0], "the number of stages")?;
                if nargs != 1 {
                    return err(c, "`Pipeline::<STAGES>::new` takes the number of consumer warpgroups");
                }
                let consumers = int_const(&c.args[0], "the number of consumer warpgroups must be a constant")?;
                ExprKind::PipelineNew { stages, consumers }
            }
            ["TileQueue", "new"] => {
                let seg = &p.path.segments[0];
                let ga = generic_args(seg, 1, "`TileQueue<STAGES>`")?;
                let stages = const_arg(ga[0], "the number of slots")?;
                if nargs != 2 {
                    return err(
                        c,
                        "`TileQueue::<STAGES>::new` takes the counter (a `Global<i32, 1>` parameter) and the number of consumer warpgroups",
                    );
                }
                let counter = receiver_name(&c.args[0])?;
                let consumers = int_const(&c.args[1], "the number of consumer warpgroups must be a constant")?;
                ExprKind::QueueNew { stages, consumers, counter }
            }
            [t @ ("Tile" | "tile"), ctor] => {
                let seg = &p.path.segments[0];
                let tile = tile_args(seg, t)?;
                match *ctor {
                    "zeros" => {
                        args(self, 0)?;
                        let l = self.loc(c.span());
                        ExprKind::Full { tile, value: Box::new(Expr::new(ExprKind::Float(0.0), l)) }
                    }
                    "full" => {
                        let mut a = args(self, 1)?;
                        ExprKind::Full { tile, value: Box::new(a.remove(0)) }
                    }
                    axis @ ("col_index" | "row_index") => {
                        args(self, 0)?;
                        ExprKind::Iota { tile, axis: u32::from(axis == "col_index") }
                    }
                    name @ ("uniform" | "uniform8" | "uniform8_t") => {
                        let kind = match name {
                            "uniform" => UniformKind::Words,
                            _ => UniformKind::Bytes { transposed: name == "uniform8_t" },
                        };
                        let n = kind.seed_words();
                        if c.args.len() != n + 1 {
                            let stream = if n == 4 { ", a stream" } else { "" };
                            return err(
                                &p.path.segments[1],
                                format!(
                                    "`{name}` takes the seed's two words, an offset{stream} and an origin `[row, col]`, found {} arguments",
                                    c.args.len()
                                ),
                            );
                        }
                        let seed = c.args.iter().take(n).map(|a| self.expr(a)).collect::<R<Vec<_>>>()?;
                        ExprKind::Uniform { tile, kind, seed, origin: self.index(&c.args[n])? }
                    }
                    other => {
                        return err(
                            &p.path.segments[1],
                            format!(
                                "unknown tile constructor `{other}`: expected `zeros()`, `full(value)`, `col_index()`, `row_index()`, `uniform(seed_lo, seed_hi, offset, [row, col])` or `uniform8(seed_lo, seed_hi, offset, stream, [row, col])` (`uniform8_t`)"
                            ),
                        )
                    }
                }
            }
            _ => {
                return err(
                    &c.func,
                    format!("unknown function `{}`: expected a `#[tessera::device]` function or one of {FUNCTIONS}", segs.join("::")),
                )
            }
        })
    }

    fn method(&mut self, m: &syn::ExprMethodCall) -> R<ExprKind> {
        let name = m.method.to_string();
        let nargs = m.args.len();
        let want = |n: usize| -> R<()> {
            if nargs != n {
                return err(&m.method, format!("`{name}` takes {n} argument{}, found {nargs}", if n == 1 { "" } else { "s" }));
            }
            Ok(())
        };
        let recv = |me: &mut Self| me.expr(&m.receiver).map(Box::new);
        Ok(match name.as_str() {
            // `ring.at(s).load()`: a shared view into registers.
            "load" if nargs == 0 => ExprKind::SmemLoad(recv(self)?),
            "load" | "load_or" => {
                let tensor = receiver_name(&m.receiver)?;
                want(if name == "load" { 1 } else { 2 })?;
                let tile = match &m.turbofish {
                    Some(tf) => Some(turbofish_tile(tf)?),
                    None => None,
                };
                let fill = if name == "load_or" { Some(Box::new(self.expr(&m.args[1])?)) } else { None };
                ExprKind::Load { tensor, index: self.index(&m.args[0])?, fill, tile }
            }
            "load_fragments" => {
                let tensor = receiver_name(&m.receiver)?;
                want(1)?;
                let Some(tf) = &m.turbofish else {
                    return err(
                        &m.method,
                        "`load_fragments` takes the accumulator's type: `tensor.load_fragments::<Tile<f32, 64, N>>([i, j])`",
                    );
                };
                ExprKind::LoadFragments { tensor, index: self.index(&m.args[0])?, tile: turbofish_tile(tf)? }
            }
            "at" => {
                want(1)?;
                ExprKind::SmemAt { ring: receiver_name(&m.receiver)?, stage: Box::new(self.expr(&m.args[0])?) }
            }
            "cols" => {
                want(2)?;
                let start = const_eval(&m.args[0]).filter(|v| *v >= 0).ok_or_else(|| {
                    syn::Error::new_spanned(&m.args[0], "`cols` takes a constant first column (an `#[unroll]` loop variable works)")
                })?;
                let cols = int_const(&m.args[1], "`cols` takes a constant count")?;
                ExprKind::TileCols { value: recv(self)?, start: start as u32, cols }
            }
            "rows" => {
                want(2)?;
                let rows = int_const(&m.args[1], "`rows` takes a first row and a constant count")?;
                ExprKind::SmemRows { view: recv(self)?, start: Box::new(self.expr(&m.args[0])?), rows }
            }
            "acquire" | "wait" => {
                want(0)?;
                ExprKind::PipeStage { pipe: receiver_name(&m.receiver)?, producer: name == "acquire" }
            }
            "get" => {
                want(1)?;
                ExprKind::Get { tensor: receiver_name(&m.receiver)?, index: self.index(&m.args[0])? }
            }
            "fetch_add" | "fetch_inc" => {
                return err(&m.method, format!("`{name}` is a statement of its own: `let old = tensor.{name}([i], v);`"));
            }
            "wait_nonzero" => {
                return err(&m.method, "`wait_nonzero` is a statement of its own: `let flag = tensor.wait_nonzero([i]);`");
            }
            "t" => {
                return err(&m.method, "`.t()` transposes a shared view only as `mma_sync`'s `a`: `mma_sync_kn(acc, ring.at(s).t(), b)`");
            }
            "swap_pairs" => {
                want(0)?;
                ExprKind::SwapPairs(recv(self)?)
            }
            "last_col" | "first_col" => {
                want(0)?;
                ExprKind::EdgeCol { value: recv(self)?, last: name == "last_col" }
            }
            "shift_cols" | "shift_rows" => {
                want(2)?;
                // A negative distance shifts the other way (element `j` takes `j + |k|`).
                let (by, reverse) =
                    const_eval(&m.args[0]).and_then(|v| Some((u32::try_from(v.unsigned_abs()).ok()?, v < 0))).ok_or_else(|| {
                        syn::Error::new_spanned(
                            &m.args[0],
                            format!("`{name}` takes a constant distance (an `#[unroll]` loop variable works)"),
                        )
                    })?;
                let axis = u32::from(name == "shift_cols");
                ExprKind::Shift { value: recv(self)?, axis, by, reverse, fill: Box::new(self.expr(&m.args[1])?) }
            }
            "keep_where" => {
                want(2)?;
                ExprKind::KeepWhere { value: recv(self)?, cond: Box::new(self.expr(&m.args[0])?), fill: Box::new(self.expr(&m.args[1])?) }
            }
            "mask_cols" => {
                want(2)?;
                ExprKind::MaskCols { value: recv(self)?, limit: Box::new(self.expr(&m.args[0])?), fill: Box::new(self.expr(&m.args[1])?) }
            }
            "dim" => {
                want(1)?;
                let axis = int_const(&m.args[0], "`dim` takes a constant axis")?;
                ExprKind::Dim { tensor: receiver_name(&m.receiver)?, axis }
            }
            "cast" => {
                want(0)?;
                let to = m.turbofish.as_ref().and_then(|tf| match tf.args.first() {
                    Some(syn::GenericArgument::Type(t)) => Some(t),
                    _ => None,
                });
                let Some(to) = to else { return err(&m.method, "`cast` names its target: `.cast::<bf16>()`") };
                let dtype = dtype_of(to)?;
                ExprKind::Cast { value: recv(self)?, to: dtype }
            }
            f if UnOp::function(f).is_some() => {
                want(0)?;
                ExprKind::Unary(unary_fn(&name), recv(self)?)
            }
            "max" | "min" => {
                want(1)?;
                let op = if name == "max" { BinOp::Max } else { BinOp::Min };
                ExprKind::Binary(op, recv(self)?, Box::new(self.expr(&m.args[0])?))
            }
            "sum" | "reduce_max" | "reduce_min" => {
                want(1)?;
                let axis = int_const(&m.args[0], "reductions take a constant axis: 0 or 1")?;
                let op = reduce_op(name.trim_start_matches("reduce_"));
                let value = recv(self)?;
                return Ok(ExprKind::Reduce { op, axis, value }).and_then(|k| {
                    // Point a bad axis at the axis itself.
                    if axis > 1 { err(&m.args[0], format!("reduction over axis {axis}: a tile has 2 dimensions, expected axis 0 (down the rows) or 1 (along each row)")) } else { Ok(k) }
                });
            }
            "row_sum" | "row_max" => {
                want(0)?;
                ExprKind::Reduce { op: reduce_op(&name[4..]), axis: 1, value: recv(self)? }
            }
            _ => return err(&m.method, format!("unknown method `{name}`: expected one of {METHODS}")),
        })
    }
}

/// Tokens as a person writes them: `Vec<f32>`, not `Vec < f32 >`.
fn compact(t: &impl ToTokens) -> String {
    t.to_token_stream().to_string().replace(" < ", "<").replace("< ", "<").replace(" >", ">").replace(" ,", ",").replace(" :: ", "::")
}

/// Replaces a loop variable by its value.
struct Substitute {
    name: String,
    value: i64,
}

impl syn::visit_mut::VisitMut for Substitute {
    fn visit_expr_mut(&mut self, e: &mut SynExpr) {
        if let SynExpr::Path(p) = e {
            if p.path.is_ident(&self.name) {
                let lit = syn::LitInt::new(&self.value.to_string(), p.path.segments[0].ident.span());
                *e = SynExpr::Lit(syn::ExprLit { attrs: Vec::new(), lit: syn::Lit::Int(lit) });
                return;
            }
        }
        syn::visit_mut::visit_expr_mut(self, e);
    }
}

/// How the text of a compile-time `if` begins.
const CONST_IF: &str = "(constant) ";

/// A condition `a && b && …` split into what is known at compile time: `(e, Some(false))`
/// when a constant conjunct is false, else `(e, None)` with `e` the condition less its
/// leading constant conjuncts that are true (the condition itself when none is).
fn const_conjuncts(e: &SynExpr) -> (&SynExpr, Option<bool>) {
    match strip_paren(e) {
        SynExpr::Binary(b) if matches!(b.op, SynBinOp::And(_)) => {
            if const_bool(&b.left) == Some(false) || const_conjuncts(&b.right).1 == Some(false) {
                return (e, Some(false));
            }
            match (const_bool(&b.left), const_bool(&b.right)) {
                (Some(true), None) => const_conjuncts(&b.right),
                (None, Some(true)) => (&b.left, None),
                _ => match const_conjuncts(&b.left) {
                    (_, Some(false)) => (e, Some(false)),
                    _ => (e, None),
                },
            }
        }
        _ => (e, None),
    }
}

/// The value of a condition on constants: comparisons of constant integer expressions, `true`,
/// `false`, `!`, `&&`, `||`.
fn const_bool(e: &SynExpr) -> Option<bool> {
    match e {
        SynExpr::Lit(syn::ExprLit { lit: syn::Lit::Bool(b), .. }) => Some(b.value),
        SynExpr::Paren(p) => const_bool(&p.expr),
        SynExpr::Group(g) => const_bool(&g.expr),
        SynExpr::Unary(syn::ExprUnary { op: SynUnOp::Not(_), expr, .. }) => const_bool(expr).map(|b| !b),
        SynExpr::Binary(b) => match b.op {
            SynBinOp::And(_) => Some(const_bool(&b.left)? && const_bool(&b.right)?),
            SynBinOp::Or(_) => Some(const_bool(&b.left)? || const_bool(&b.right)?),
            _ => {
                let (x, y) = (const_eval(&b.left)?, const_eval(&b.right)?);
                match b.op {
                    SynBinOp::Eq(_) => Some(x == y),
                    SynBinOp::Ne(_) => Some(x != y),
                    SynBinOp::Lt(_) => Some(x < y),
                    SynBinOp::Le(_) => Some(x <= y),
                    SynBinOp::Gt(_) => Some(x > y),
                    SynBinOp::Ge(_) => Some(x >= y),
                    _ => None,
                }
            }
        },
        _ => None,
    }
}

/// The value of a constant integer expression: literals, `+ - * / % <<`, parentheses, braces.
pub(crate) fn const_eval_expr(e: &SynExpr) -> Option<i64> {
    const_eval(e)
}

fn const_eval(e: &SynExpr) -> Option<i64> {
    match e {
        SynExpr::Block(b) if b.label.is_none() => match b.block.stmts.as_slice() {
            [SynStmt::Expr(e, None)] => const_eval(e),
            _ => None,
        },
        SynExpr::Lit(syn::ExprLit { lit: syn::Lit::Int(i), .. }) => i.base10_parse().ok(),
        SynExpr::Paren(p) => const_eval(&p.expr),
        SynExpr::Group(g) => const_eval(&g.expr),
        SynExpr::Unary(syn::ExprUnary { op: SynUnOp::Neg(_), expr, .. }) => const_eval(expr).map(|v| -v),
        SynExpr::Binary(b) => {
            let (x, y) = (const_eval(&b.left)?, const_eval(&b.right)?);
            match b.op {
                SynBinOp::Add(_) => x.checked_add(y),
                SynBinOp::Sub(_) => x.checked_sub(y),
                SynBinOp::Mul(_) => x.checked_mul(y),
                SynBinOp::Div(_) if y != 0 => Some(x / y),
                SynBinOp::Rem(_) if y != 0 => Some(x % y),
                SynBinOp::Shl(_) if (0..63).contains(&y) => x.checked_shl(y as u32),
                _ => None,
            }
        }
        _ => None,
    }
}

fn unsupported(e: &SynExpr) -> syn::Error {
    let what = match e {
        SynExpr::Closure(_) => "a closure",
        SynExpr::Match(_) => "`match`",
        SynExpr::While(w) if matches!(&*w.cond, SynExpr::Let(_)) => "`while let`",
        SynExpr::Loop(_) => "`loop`",
        SynExpr::Let(_) => "`if let`",
        SynExpr::Return(_) => "`return`",
        SynExpr::Break(_) | SynExpr::Continue(_) => "`break`/`continue`",
        SynExpr::Index(_) => "indexing (load a tile with `tensor.load([i, j])`)",
        SynExpr::Reference(_) => "a reference",
        SynExpr::Unsafe(_) => "`unsafe`",
        SynExpr::Async(_) | SynExpr::Await(_) => "async",
        SynExpr::Tuple(_) => "a tuple",
        SynExpr::Struct(_) => "a struct literal",
        SynExpr::Field(_) => "a field access",
        SynExpr::Macro(_) => "a macro call",
        _ => "this expression",
    };
    let msg = format!("unsupported Rust construct in a kernel: {what}: expected `let`, an assignment, `store`, `for`, `while` or `if`");
    // Point at the keyword, not the whole block.
    match e {
        SynExpr::Match(m) => syn::Error::new_spanned(m.match_token, msg),
        SynExpr::While(w) => syn::Error::new_spanned(w.while_token, msg),
        SynExpr::Loop(l) => syn::Error::new_spanned(l.loop_token, msg),
        SynExpr::Unsafe(u) => syn::Error::new_spanned(u.unsafe_token, msg),
        _ => syn::Error::new_spanned(e, msg),
    }
}

fn strip_paren(e: &SynExpr) -> &SynExpr {
    match e {
        SynExpr::Paren(p) => strip_paren(&p.expr),
        other => other,
    }
}

fn statement_text(s: &SynStmt) -> String {
    let text = match s {
        SynStmt::Expr(SynExpr::ForLoop(f), _) => format!("for {} in {}", f.pat.to_token_stream(), f.expr.to_token_stream()),
        SynStmt::Expr(SynExpr::If(i), _) => format!("if {}", i.cond.to_token_stream()),
        other => other.to_token_stream().to_string(),
    };
    let mut t: String = text.split_whitespace().collect::<Vec<_>>().join(" ");
    if t.len() > 120 {
        let cut = (0..=117).rev().find(|&i| t.is_char_boundary(i)).unwrap_or(0);
        t.truncate(cut);
        t.push_str("...");
    }
    t
}

/// A call's path as the key its device function is known by: `prelude::online_softmax`,
/// without generic arguments.
pub(crate) fn path_key(p: &syn::Path) -> String {
    let segs: Vec<String> = p.segments.iter().map(|s| s.ident.to_string()).collect();
    format!("{}{}", if p.leading_colon.is_some() { "::" } else { "" }, segs.join("::"))
}

fn assignee(e: &SynExpr) -> R<String> {
    match e {
        // `*acc = …` in a device function: the `&mut` parameter stands for the caller's name.
        SynExpr::Unary(u) if matches!(u.op, SynUnOp::Deref(_)) => assignee(&u.expr),
        SynExpr::Path(p) if p.path.get_ident().is_some() => Ok(p.path.segments[0].ident.to_string()),
        other => err(other, "only a plain name can be assigned"),
    }
}

fn receiver_name(e: &SynExpr) -> R<String> {
    match e {
        SynExpr::Path(p) if p.path.get_ident().is_some() => Ok(p.path.segments[0].ident.to_string()),
        other => err(other, "expected a `Global` parameter's name"),
    }
}

fn compound_op(op: &SynBinOp) -> Option<BinOp> {
    Some(match op {
        SynBinOp::AddAssign(_) => BinOp::Add,
        SynBinOp::SubAssign(_) => BinOp::Sub,
        SynBinOp::MulAssign(_) => BinOp::Mul,
        SynBinOp::DivAssign(_) => BinOp::Div,
        _ => return None,
    })
}

fn bin_op(op: &SynBinOp) -> Option<BinOp> {
    Some(match op {
        SynBinOp::Add(_) => BinOp::Add,
        SynBinOp::Sub(_) => BinOp::Sub,
        SynBinOp::Mul(_) => BinOp::Mul,
        SynBinOp::Div(_) => BinOp::Div,
        SynBinOp::Rem(_) => BinOp::Rem,
        SynBinOp::Lt(_) => BinOp::Lt,
        SynBinOp::Le(_) => BinOp::Le,
        SynBinOp::Gt(_) => BinOp::Gt,
        SynBinOp::Ge(_) => BinOp::Ge,
        SynBinOp::Eq(_) => BinOp::Eq,
        SynBinOp::Ne(_) => BinOp::Ne,
        SynBinOp::And(_) => BinOp::And,
        SynBinOp::Or(_) => BinOp::Or,
        _ => return None,
    })
}

fn unary_fn(name: &str) -> UnOp {
    UnOp::function(name).unwrap_or(UnOp::Rsqrt)
}

fn reduce_op(name: &str) -> ReduceOp {
    match name {
        "sum" => ReduceOp::Sum,
        "max" => ReduceOp::Max,
        _ => ReduceOp::Min,
    }
}

/// A non-negative constant: a literal, or arithmetic on literals (`{ 2 * (128 / 64) }`, as a
/// device function's const generics leave it).
fn int_const(e: &SynExpr, msg: &str) -> R<u32> {
    match e {
        SynExpr::Lit(syn::ExprLit { lit: syn::Lit::Int(i), .. }) => i.base10_parse(),
        other => const_eval(other).and_then(|v| u32::try_from(v).ok()).map_or_else(|| err(other, msg), Ok),
    }
}

fn path_value(p: &syn::Path) -> R<ExprKind> {
    if let Some(id) = p.get_ident() {
        return Ok(ExprKind::Var(id.to_string()));
    }
    let segs: Vec<String> = p.segments.iter().map(|s| s.ident.to_string()).collect();
    let v = match segs.iter().map(String::as_str).collect::<Vec<_>>().as_slice() {
        ["f32", "INFINITY"] => f64::INFINITY,
        ["f32", "NEG_INFINITY"] => f64::NEG_INFINITY,
        ["f32", "MAX"] => f64::from(f32::MAX),
        ["f32", "MIN"] => f64::from(f32::MIN),
        ["std" | "core", "f32", "consts", c] | ["f32", "consts", c] => match *c {
            "LOG2_E" => std::f64::consts::LOG2_E,
            "LN_2" => std::f64::consts::LN_2,
            "PI" => std::f64::consts::PI,
            "E" => std::f64::consts::E,
            "TAU" => std::f64::consts::TAU,
            "FRAC_PI_2" => std::f64::consts::FRAC_PI_2,
            "SQRT_2" => std::f64::consts::SQRT_2,
            "FRAC_1_SQRT_2" => std::f64::consts::FRAC_1_SQRT_2,
            "LN_10" => std::f64::consts::LN_10,
            "LOG10_E" => std::f64::consts::LOG10_E,
            _ => {
                let known = "LOG2_E, LN_2, PI, E, TAU, FRAC_PI_2, SQRT_2, FRAC_1_SQRT_2, LN_10, LOG10_E";
                return err(p, format!("unknown constant `{}`: the `f32::consts` the language knows are {known}", segs.join("::")));
            }
        },
        _ => return err(p, format!("unknown name `{}`: expected a local, a parameter or an `f32` constant", segs.join("::"))),
    };
    Ok(ExprKind::Float(v))
}

fn dtype_of(t: &syn::Type) -> R<DType> {
    let name = t.to_token_stream().to_string();
    match DType::from_name(&name) {
        Some(d) if d.is_float() => Ok(d),
        _ => err(t, format!("unsupported dtype `{name}`: expected `f32`, `bf16` or `f16`")),
    }
}

fn scalar_dtype(t: &syn::Type) -> Option<DType> {
    match t.to_token_stream().to_string().as_str() {
        "f32" => Some(DType::F32),
        "i32" => Some(DType::I32),
        _ => None,
    }
}

fn param_type(t: &syn::Type) -> R<Type> {
    let expected = "expected `Global<T, R>` (T: `f32`, `bf16`, `f16`, or `i32` for a tile queue's counter; R: 1 to 4), `f32` or `i32`";
    if let syn::Type::Path(tp) = t {
        let last = tp.path.segments.last();
        match last.map(|s| s.ident.to_string()).as_deref() {
            Some("f32") if tp.path.segments.len() == 1 => return Ok(Type::Scalar(ScalarType::F32)),
            Some("i32") if tp.path.segments.len() == 1 => return Ok(Type::Scalar(ScalarType::I32)),
            Some("Global") => {
                let seg = last.ok_or_else(|| syn::Error::new_spanned(t, expected))?;
                let args = generic_args(seg, 2, "`Global<T, R>`")?;
                let ta = type_arg(args[0])?;
                // `i32` tensors exist for tile queues' counters.
                let dtype = match DType::from_name(&ta.to_token_stream().to_string()) {
                    Some(d) => d,
                    None => {
                        return err(
                            ta,
                            format!(
                                "unsupported dtype `{}`: expected `f32`, `bf16`, `f16`, or `i32` for a tile queue's counter",
                                compact(ta)
                            ),
                        )
                    }
                };
                let rank = const_arg(args[1], "the rank")?;
                if !(1..=5).contains(&rank) {
                    return err(args[1], format!("unsupported rank {rank}: expected 1 to 5"));
                }
                return Ok(Type::Global { dtype, rank });
            }
            _ => {}
        }
    }
    err(t, format!("unsupported parameter type `{}`: {expected}", compact(t)))
}

/// `Tile<T, M, N>` or `tile<T, M, N>` as a type.
fn tile_type(t: &syn::Type) -> R<TileType> {
    if let syn::Type::Path(tp) = t {
        if let Some(seg) = tp.path.segments.last() {
            let name = seg.ident.to_string();
            if name == "Tile" || name == "tile" {
                return tile_args(seg, &name);
            }
        }
    }
    err(t, format!("unsupported type `{}`: a `let` is annotated with `Tile<T, M, N>`", compact(t)))
}

fn turbofish_tile(tf: &syn::AngleBracketedGenericArguments) -> R<TileType> {
    match tf.args.first() {
        Some(syn::GenericArgument::Type(t)) if tf.args.len() == 1 => tile_type(t),
        _ => err(tf, "expected `::<Tile<T, M, N>>`"),
    }
}

fn tile_args(seg: &syn::PathSegment, name: &str) -> R<TileType> {
    let args = generic_args(seg, 3, &format!("`{name}<T, M, N>`"))?;
    let dtype = dtype_of(type_arg(args[0])?)?;
    let rows = tile_dim(args[1])?;
    let cols = tile_cols(args[2])?;
    Ok(TileType { dtype, rows, cols })
}

/// The largest tile dimension: no block holds more (a row of 16384 f32 is 64 KB), and products
/// of dimensions, element sizes and lane counts stay far inside `u32`.
const MAX_TILE_DIM: u32 = 16384;

fn tile_dim(a: &syn::GenericArgument) -> R<u32> {
    let v = dim_arg(a)?;
    if v == 0 || !v.is_power_of_two() {
        return err(a, format!("tile dimensions are powers of two, found {v}"));
    }
    Ok(v)
}

/// A register tile's column count: a power of two, or a multiple of 8 (8-column runs; a
/// wgmma accumulator `N` wide, e.g. 176 keys, or a row of 2304).
fn tile_cols(a: &syn::GenericArgument) -> R<u32> {
    pow2_or_multiple_of_8(a, "a tile's columns are")
}

/// A shared-memory tile's row count: a power of two, or a multiple of 8 (the swizzle's
/// 8-row atoms; a key block of 176 rows).
fn smem_rows(a: &syn::GenericArgument) -> R<u32> {
    pow2_or_multiple_of_8(a, "shared-memory rows are")
}

/// A dimension that is a power of two or a multiple of 8; `what` begins the error.
fn pow2_or_multiple_of_8(a: &syn::GenericArgument, what: &str) -> R<u32> {
    let v = dim_arg(a)?;
    if v == 0 || !(v.is_power_of_two() || v.is_multiple_of(8)) {
        return err(a, format!("{what} a power of two or a multiple of 8, found {v}"));
    }
    Ok(v)
}

fn generic_args<'a>(seg: &'a syn::PathSegment, n: usize, what: &str) -> R<Vec<&'a syn::GenericArgument>> {
    match &seg.arguments {
        syn::PathArguments::AngleBracketed(a) if a.args.len() == n => Ok(a.args.iter().collect()),
        syn::PathArguments::AngleBracketed(a) => err(a, format!("{what} takes {n} arguments, found {}", a.args.len())),
        _ => err(seg, format!("expected {what}")),
    }
}

fn type_arg(a: &syn::GenericArgument) -> R<&syn::Type> {
    match a {
        syn::GenericArgument::Type(t) => Ok(t),
        other => err(other, "expected a dtype: `f32`, `bf16` or `f16`"),
    }
}

/// A tile dimension: a constant generic argument of at most [`MAX_TILE_DIM`].
fn dim_arg(a: &syn::GenericArgument) -> R<u32> {
    let v = const_arg(a, "a tile dimension")?;
    if v > MAX_TILE_DIM {
        return err(a, format!("a tile dimension is at most {MAX_TILE_DIM}, found {v}"));
    }
    Ok(v)
}

/// A constant integer generic argument: a literal, or a constant expression in braces (`{ 128 / 2 }`,
/// as a device function's `{ N / 2 }` becomes once `N` is bound).
fn const_arg(a: &syn::GenericArgument, what: &str) -> R<u32> {
    let v = match a {
        syn::GenericArgument::Const(SynExpr::Lit(syn::ExprLit { lit: syn::Lit::Int(i), .. })) => Some(i.base10_parse::<i64>()?),
        syn::GenericArgument::Const(e @ SynExpr::Block(_)) => const_eval(e),
        _ => None,
    };
    match v.and_then(|v| u32::try_from(v).ok()) {
        Some(v) => Ok(v),
        None => err(a, format!("{what} must be a constant integer, found `{}`", a.to_token_stream())),
    }
}
