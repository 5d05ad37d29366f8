//! Inlining device-function calls as the checker meets them.
//!
//! A call's arguments are typed first; the [`Callees`] (the frontend) then gives the callee's
//! body for those types — generic parameters bound, locals renamed apart, value parameters
//! bound by `let` or standing for the caller's names — and the checker checks that body in
//! the caller's scope, right before the statement holding the call, which keeps the call's
//! results. Nothing of the call reaches lowering: a kernel written with calls lowers as the
//! same kernel written out by hand.

use super::Checker;
use crate::error::CompileError;
use crate::tirh::{Expr, ExprKind, ScanStep, SourceLoc, Stmt, StmtKind, TileType, Type};

/// A call of a device function, its arguments typed.
pub struct CallSite<'a> {
    /// The function's name as called.
    pub func: &'a str,
    /// The frontend's number for the definition.
    pub id: u32,
    /// The call.
    pub loc: SourceLoc,
    /// The arguments, each with its type (`Expr::ty`).
    pub args: &'a [Expr],
    /// Which arguments are `&mut name`.
    pub by_ref: &'a [bool],
}

/// A device function's body for one call.
pub struct Inlined {
    /// Statements, parameters' `let`s first.
    pub body: Vec<Stmt>,
    /// The result expressions (none for a function returning nothing, several for a tuple).
    pub results: Vec<Expr>,
    /// The declared type of each result, where the signature names a concrete one.
    pub returns: Vec<Option<Type>>,
}

/// Where the checker gets device-function bodies: the frontend, which parses a definition
/// for the argument types of each call.
pub trait Callees {
    /// The body of `call.id` for this call, or why there is none (wrong arity, argument
    /// types that do not fit the signature, a definition that does not parse), at `call.loc`.
    ///
    /// # Errors
    /// A [`CompileError`] that says what the signature expected and what the call gave.
    fn instantiate(&mut self, call: &CallSite<'_>) -> Result<Inlined, CompileError>;
}

impl Checker<'_> {
    /// Inlines the call `e`: its body goes to the pending statements, and its checked results
    /// come back. `expect` is the tile type a `let` annotation asks of a single result.
    pub(super) fn call(&mut self, e: &mut Expr, expect: Option<TileType>) -> Result<Vec<Expr>, CompileError> {
        if matches!(e.kind, ExprKind::Scan { .. }) {
            return self.scan(e);
        }
        let loc = e.loc;
        let ExprKind::Call { func, id, mut args, by_ref } = std::mem::replace(&mut e.kind, ExprKind::Bool(false)) else {
            return Err(CompileError::ty(loc, "expected a call"));
        };
        for a in args.iter_mut() {
            self.expr(a)?;
        }
        self.check_by_ref(&func, &args, &by_ref)?;
        if let Some(at) = self.inlining.iter().position(|(i, _)| *i == id) {
            let chain: Vec<&str> = self.inlining[at..].iter().map(|(_, n)| n.as_str()).chain([func.as_str()]).collect();
            return Err(CompileError::ty(
                loc,
                format!("`{func}` calls itself ({}): device functions are inlined, so they cannot recurse", chain.join(" → ")),
            ));
        }
        let Some(callees) = self.callees.as_deref_mut() else {
            return Err(CompileError::ty(loc, format!("unknown function `{func}`")));
        };
        let inlined = callees.instantiate(&CallSite { func: &func, id, loc, args: &args, by_ref: &by_ref })?;
        self.inlining.push((id, func.clone()));
        let mut body = Vec::new();
        for s in inlined.body {
            self.stmt_into(s, &mut body);
        }
        // The body goes before anything the results' own calls add.
        self.pending.append(&mut body);
        let single = inlined.results.len() == 1;
        let mut results = inlined.results;
        let checked = results.iter_mut().zip(&inlined.returns).try_for_each(|(r, want)| {
            let expect = match want {
                Some(Type::Tile(t)) => Some(*t),
                _ if single => expect,
                _ => None,
            };
            let ty = self.expr_expecting(r, expect)?;
            match want {
                Some(w) if *w != ty => {
                    Err(CompileError::ty(r.loc, format!("`{func}` is declared to return `{w}`, but this result is `{ty}`")))
                }
                _ => Ok(()),
            }
        });
        self.inlining.pop();
        checked.map(|()| results)
    }

    /// `tile_scan::<F>(x, axis, identity)`: binds the inputs, then runs the steps of
    /// [`ScanStep::plan`] where the rows allow it (each a call of `F` on the elements a step
    /// touches, then a pick of those), else for offsets 1, 2, 4, … below the scanned dimension
    /// combines each tile with itself shifted by the offset (identity shifting in). `F` is
    /// inlined as any call is; the results are the last step's tiles (shifted by one more for
    /// an exclusive scan).
    fn scan(&mut self, e: &mut Expr) -> Result<Vec<Expr>, CompileError> {
        let loc = e.loc;
        let ExprKind::Scan { func, id, mut values, axis, mut identity, exclusive, reverse } =
            std::mem::replace(&mut e.kind, ExprKind::Bool(false))
        else {
            return Err(CompileError::ty(loc, "expected a scan"));
        };
        let what = format!("tile_scan{}{}", if reverse { "_reverse" } else { "" }, if exclusive { "_exclusive" } else { "" });
        if values.len() != identity.len() || values.is_empty() {
            return Err(CompileError::ty(
                loc,
                format!("`{what}` takes one identity per tile scanned: {} tile(s), {} identities", values.len(), identity.len()),
            ));
        }
        if axis > 1 {
            return Err(CompileError::ty(loc, format!("`{what}` runs along axis 1 (each row) or 0 (each column), found {axis}")));
        }
        let mut shape: Option<TileType> = None;
        for v in values.iter_mut() {
            let ty = self.expr(v)?;
            match (ty, shape) {
                (Type::Tile(t), None) if t.dtype == crate::dtype::DType::F32 => shape = Some(t),
                (Type::Tile(t), Some(s)) if t == s => {}
                _ => {
                    let want = shape.map_or_else(|| "an f32 tile".to_string(), |s| format!("`{s}`, as the first"));
                    return Err(CompileError::ty(v.loc, format!("`{what}` scans f32 tiles of one shape: expected {want}, found `{ty}`")));
                }
            }
        }
        for i in identity.iter_mut() {
            self.fill_value(i, crate::dtype::DType::F32)?;
        }
        let Some(t) = shape else { return Err(CompileError::ty(loc, "an empty scan")) };
        let n = if axis == 1 { t.cols } else { t.rows };
        let stmt = |kind, text: String| Stmt { kind, loc, text };
        let count = values.len();
        let names = |step: u32| -> Vec<String> { (0..count).map(|i| format!("{func}_scan{}_{step}_{i}", loc.span)).collect() };
        let shifted = |name: &str, by: u32, fill: &Expr| {
            let value = Box::new(Expr::new(ExprKind::Var(name.to_string()), loc));
            Expr::new(ExprKind::Shift { value, axis, by, reverse, fill: Box::new(fill.clone()) }, loc)
        };
        let var = |name: &str| Expr::new(ExprKind::Var(name.to_string()), loc);
        let mut out = Vec::new();
        let mut cur = names(0);
        for (name, value) in cur.iter().zip(values) {
            let kind = StmtKind::Let { name: name.clone(), mutable: false, declared: None, value };
            self.stmt_into(stmt(kind, format!("{what}: the input")), &mut out);
        }
        // The work-efficient steps where each row lies in one warp's lanes (the tile's blocked
        // layout, which the lowering moves it into), else Hillis–Steele: a shift by 1, 2, 4, …
        let plan = if axis == 1 { ScanStep::plan(t.rows, t.cols, reverse) } else { None };
        let steps: Vec<Result<ScanStep, u32>> = match plan {
            Some(p) => p.into_iter().map(Ok).collect(),
            None => std::iter::successors(Some(1u32), |b| Some(b * 2)).take_while(|&b| b < n).map(Err).collect(),
        };
        for (i, s) in steps.into_iter().enumerate() {
            let step = i as u32 + 1;
            let next = names(step);
            let part = |c: &String, fill: &Expr| match s {
                Ok(step) => Expr::new(ExprKind::ScanPart { value: Box::new(var(c)), step, fill: Box::new(fill.clone()) }, loc),
                Err(by) => shifted(c, by, fill),
            };
            let args: Vec<Expr> = cur.iter().zip(&identity).map(|(c, i)| part(c, i)).chain(cur.iter().map(|c| var(c))).collect();
            let by_ref = vec![false; args.len()];
            let call = Expr::new(ExprKind::Call { func: func.clone(), id, by_ref, args }, loc);
            let kind = StmtKind::Unpack { names: next.iter().map(|n| (n.clone(), false)).collect(), assign: false, value: call };
            let text = match s {
                Ok(step) => format!("{what}: {step:?}"),
                Err(by) => format!("{what}: combine with the tiles {by} back"),
            };
            self.stmt_into(stmt(kind, text), &mut out);
            if self.poisoned.iter().any(|p| next.contains(p)) {
                // The combine failed (reported where it did): no more steps.

                self.pending.append(&mut out);
                return Err(CompileError::ty(loc, String::new()));
            }
            cur = match s {
                Ok(step) => {
                    let picked: Vec<String> = next.iter().map(|n| format!("{n}_pick")).collect();
                    for ((p, n), c) in picked.iter().zip(&next).zip(&cur) {
                        let value = Expr::new(ExprKind::ScanPick { updated: Box::new(var(n)), old: Box::new(var(c)), step }, loc);
                        let kind = StmtKind::Let { name: p.clone(), mutable: false, declared: None, value };
                        self.stmt_into(stmt(kind, format!("{what}: the elements {step:?} changes")), &mut out);
                    }
                    picked
                }
                Err(_) => next,
            };
        }
        self.pending.append(&mut out);
        let mut results: Vec<Expr> = cur
            .iter()
            .zip(&identity)
            .map(|(c, i)| if exclusive { shifted(c, 1, i) } else { Expr::new(ExprKind::Var(c.clone()), loc) })
            .collect();
        for r in results.iter_mut() {
            self.expr(r)?;
        }
        Ok(results)
    }

    /// The value of a call in an expression: its one result.
    pub(super) fn call_value(&mut self, e: &mut Expr, expect: Option<TileType>) -> Result<Type, CompileError> {
        let (loc, func) = (e.loc, call_name(e));
        let mut results = self.call(e, expect)?;
        match results.len() {
            1 => {
                *e = results.remove(0);
                e.ty.ok_or_else(|| CompileError::ty(loc, "an untyped result"))
            }
            0 => Err(CompileError::ty(loc, format!("`{func}` returns nothing: call it as a statement, `{func}(…);`"))),
            n => Err(CompileError::ty(loc, format!("`{func}` returns {n} values: bind them with `let (a, b, …) = {func}(…);`"))),
        }
    }

    /// `let (a, b) = f(x);` or `(a, b) = f(x);`: each result bound (or assigned) in order.
    pub(super) fn unpack(
        &mut self, names: Vec<(String, bool)>, assign: bool, value: &mut Expr, loc: SourceLoc, text: &str,
    ) -> Result<(), CompileError> {
        let func = call_name(value);
        let results = self.call(value, None)?;
        if results.len() != names.len() {
            return Err(CompileError::ty(loc, format!("`{func}` returns {} value(s), the pattern takes {}", results.len(), names.len())));
        }
        let stmt = |kind| Stmt { kind, loc, text: text.to_string() };
        let mut out = Vec::new();
        if !assign {
            for ((name, mutable), value) in names.into_iter().zip(results) {
                out.push(stmt(StmtKind::Let { name, mutable, declared: None, value }));
            }
        } else {
            // Every result is computed before any name changes: `(m, l) = f(m, l)`.
            let temps: Vec<String> = (0..names.len()).map(|i| format!("{func}__result{i}_{}", loc.span)).collect();
            for (t, value) in temps.iter().zip(results) {
                out.push(stmt(StmtKind::Let { name: t.clone(), mutable: false, declared: None, value }));
            }
            for ((name, _), t) in names.into_iter().zip(temps) {
                out.push(stmt(StmtKind::Assign { name, value: Expr::new(ExprKind::Var(t), loc) }));
            }
        }
        for mut s in out {
            self.stmt(&mut s)?;
            self.pending.push(s);
        }
        Ok(())
    }

    /// `&mut x` passes a mutable binding, and `x` appears in no other argument (the callee
    /// would see it change under it).
    fn check_by_ref(&self, func: &str, args: &[Expr], by_ref: &[bool]) -> Result<(), CompileError> {
        for (i, (a, _)) in args.iter().zip(by_ref).enumerate().filter(|(_, (_, r))| **r) {
            let ExprKind::Var(name) = &a.kind else {
                return Err(CompileError::ty(a.loc, "`&mut` passes a name: `&mut acc`"));
            };
            if !self.lookup(name).is_some_and(|b| b.mutable) {
                return Err(CompileError::ty(a.loc, format!("`&mut {name}` needs a mutable binding: declare it `let mut {name}`")));
            }
            if let Some(other) = args.iter().enumerate().find(|(j, o)| *j != i && o.uses(name)) {
                return Err(CompileError::ty(
                    other.1.loc,
                    format!("`{name}` is passed to `{func}` as `&mut {name}` and also in another argument"),
                ));
            }
        }
        Ok(())
    }
}

fn call_name(e: &Expr) -> String {
    match &e.kind {
        ExprKind::Call { func, .. } => func.clone(),
        _ => "the call".into(),
    }
}
