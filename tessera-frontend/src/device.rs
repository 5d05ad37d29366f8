//! Device functions: `#[tessera::device] fn f<const N: usize>(x: Tile<f32, 16, N>) -> …`.
//!
//! A device function is never compiled on its own. Each call is inlined while the kernel is
//! type-checked ([`tessera_ptx::verify::Callees`]): the checker types the arguments, and
//! [`Frontend::instantiate`] binds the function's generic parameters from those types,
//! substitutes them in its tokens (as `tune` knobs are), renames its locals apart, binds each
//! value parameter by a `let` (or lets it stand for the caller's name), and parses the body
//! into TIR-H in the caller's place. Errors inside the body are reported at the outermost call,
//! naming the function and its line.
//!
//! The definitions come to the macro as tokens: each `#[device]` function exports a
//! `macro_rules!` that hands its own tokens, and those of the device functions it calls, to
//! whoever asks (see `expand`), so a kernel in one crate calls a device function of another.

use crate::parse::{is_builtin, path_key, Frontend};
use proc_macro2::{Span, TokenStream};
use quote::ToTokens;
use std::collections::HashMap;
use syn::visit_mut::VisitMut;
use tessera_ptx::tirh::{ExprKind, Stmt, StmtKind, TileType, Type};
use tessera_ptx::verify::{CallSite, Callees, Inlined};
use tessera_ptx::{CompileError, DType, ScalarType};

/// One device function's definition, and the definitions its calls resolve to (where it was
/// defined, by the paths its body calls them by).
#[derive(Clone)]
pub struct DeviceDef {
    pub name: String,
    pub item: syn::ItemFn,
    pub deps: Vec<(String, u32)>,
}

/// A function given to a device function's `impl Fn(…)` parameter at one call.
#[derive(Clone, Debug)]
pub enum FnArg {
    /// A closure written at the call (an index into `Frontend::lambdas`).
    Lambda(usize),
    /// A function passed on by name (a function parameter, or a device function the caller
    /// calls): its definition.
    Def(u32),
}

/// A parameter of function type, `impl Fn(A, B) -> C`: its argument types and its result
/// type (`None`: it returns nothing).
fn fn_type(t: &syn::Type) -> Option<(Vec<&syn::Type>, Option<&syn::Type>)> {
    let syn::Type::ImplTrait(it) = t else { return None };
    it.bounds.iter().find_map(|b| {
        let syn::TypeParamBound::Trait(tb) = b else { return None };
        let seg = tb.path.segments.last().filter(|s| s.ident == "Fn")?;
        let syn::PathArguments::Parenthesized(pa) = &seg.arguments else { return None };
        let ret = match &pa.output {
            syn::ReturnType::Default => None,
            syn::ReturnType::Type(_, t) => Some(&**t),
        };
        Some((pa.inputs.iter().collect(), ret))
    })
}

/// The names of a signature's function parameters (`epilogue: impl Fn(…) -> …`, and any other
/// `impl` type, which the signature's check reports).
pub(crate) fn fn_params(sig: &syn::Signature) -> Vec<String> {
    sig.inputs
        .iter()
        .filter_map(|i| match i {
            syn::FnArg::Typed(pt) if matches!(&*pt.ty, syn::Type::ImplTrait(_)) => match &*pt.pat {
                Pat::Ident(id) => Some(id.ident.to_string()),
                _ => None,
            },
            _ => None,
        })
        .collect()
}

/// A generic parameter's value at one call.
#[derive(Clone, Copy, PartialEq, Debug)]
enum Bound {
    Int(i64),
    Dtype(DType),
}

impl Bound {
    fn tokens(self, span: Span) -> proc_macro2::TokenTree {
        match self {
            Bound::Int(v) => {
                let mut lit = proc_macro2::Literal::i64_unsuffixed(v);
                lit.set_span(span);
                lit.into()
            }
            Bound::Dtype(d) => syn::Ident::new(d.name(), span).into(),
        }
    }
}

/// The generic parameters of a signature: each name, and whether it is a dtype (`T`) rather
/// than a constant (`const N: usize`).
fn generic_params(sig: &syn::Signature) -> Vec<(String, bool)> {
    sig.generics
        .params
        .iter()
        .filter_map(|p| match p {
            syn::GenericParam::Type(t) => Some((t.ident.to_string(), true)),
            syn::GenericParam::Const(c) => Some((c.ident.to_string(), false)),
            syn::GenericParam::Lifetime(_) => None,
        })
        .collect()
}

/// Checks a device function's signature where it is defined: what the language can bind.
pub fn check_signature(f: &syn::ItemFn) -> Vec<syn::Error> {
    let mut errs = Vec::new();
    let sig = &f.sig;
    let name = sig.ident.to_string();
    if is_builtin(&[name.as_str()]) {
        errs.push(syn::Error::new_spanned(
            &sig.ident,
            format!("`{name}` is a function of the language: a device function cannot shadow it"),
        ));
    }
    for (what, present) in [
        ("`async`", sig.asyncness.is_some()),
        ("`unsafe`", sig.unsafety.is_some()),
        ("`const`", sig.constness.is_some()),
        ("an `extern` ABI", sig.abi.is_some()),
        ("variadic arguments", sig.variadic.is_some()),
    ] {
        if present {
            errs.push(syn::Error::new_spanned(sig, format!("a device function cannot be {what}")));
        }
    }
    for p in &sig.generics.params {
        match p {
            syn::GenericParam::Lifetime(l) => errs.push(syn::Error::new_spanned(
                l,
                "a device function takes dtype (`T`) and constant (`const N: usize`) parameters, not lifetimes",
            )),
            syn::GenericParam::Const(c) => {
                let ty = c.ty.to_token_stream().to_string();
                if !matches!(ty.as_str(), "usize" | "u32" | "i32" | "i64" | "u64" | "isize") {
                    errs.push(syn::Error::new_spanned(
                        &c.ty,
                        format!("a constant parameter is an integer (`usize`, `u32`, `i32`), found `{ty}`"),
                    ));
                }
            }
            syn::GenericParam::Type(_) => {}
        }
    }
    let generics = generic_params(sig);
    for input in &sig.inputs {
        let syn::FnArg::Typed(pt) = input else {
            errs.push(syn::Error::new_spanned(input, "device functions are free functions: `self` is not a parameter"));
            continue;
        };
        if !matches!(&*pt.pat, Pat::Ident(_)) {
            errs.push(syn::Error::new_spanned(&pt.pat, "expected a parameter name"));
        }
        if let Some((args, ret)) = fn_type(&pt.ty) {
            for t in args.into_iter().chain(ret) {
                let parts: Vec<&syn::Type> = match t {
                    syn::Type::Tuple(tt) => tt.elems.iter().collect(),
                    other => vec![other],
                };
                for part in parts {
                    if let Err(e) = pattern(part, &generics) {
                        errs.push(e);
                    }
                }
            }
            continue;
        }
        if matches!(&*pt.ty, syn::Type::ImplTrait(_)) {
            errs.push(syn::Error::new_spanned(
                &pt.ty,
                "a function parameter is written `impl Fn(A, B) -> C`, its types those the language binds",
            ));
            continue;
        }
        let ty = match &*pt.ty {
            syn::Type::Reference(r) if r.mutability.is_some() => &*r.elem,
            syn::Type::Reference(r) => {
                errs.push(syn::Error::new_spanned(r, "a device function takes values or `&mut` references, not `&`"));
                continue;
            }
            other => other,
        };
        if let Err(e) = pattern(ty, &generics) {
            errs.push(e);
        }
    }
    if let syn::ReturnType::Type(_, ty) = &sig.output {
        let parts: Vec<&syn::Type> = match &**ty {
            syn::Type::Tuple(t) => t.elems.iter().collect(),
            other => vec![other],
        };
        for t in parts {
            if let Err(e) = pattern(t, &generics) {
                errs.push(e);
            }
        }
    }
    errs
}

use syn::Pat;

/// A parameter or result type the language binds: its constructor and generic arguments.
struct Pattern<'a> {
    ctor: &'static str,
    args: Vec<&'a syn::GenericArgument>,
}

const TYPES: &str =
    "`Tile<T, M, N>`, `Global<T, R>`, `Smem<T, M, N>`, `SmemView<T, M, N>`, `Pipeline<S>`, `TileQueue<S>`, `f32`, `i32` or `bool`";

fn pattern<'a>(t: &'a syn::Type, generics: &[(String, bool)]) -> syn::Result<Pattern<'a>> {
    let bad = || syn::Error::new_spanned(t, format!("unsupported type `{}` for a device function: expected {TYPES}", compact(t)));
    let syn::Type::Path(tp) = t else { return Err(bad()) };
    let (Some(seg), None) = (tp.path.segments.last(), tp.qself.as_ref()) else { return Err(bad()) };
    let name = seg.ident.to_string();
    let (ctor, n): (&'static str, usize) = match name.as_str() {
        "f32" => ("f32", 0),
        "i32" => ("i32", 0),
        "bool" => ("bool", 0),
        "Tile" | "tile" => ("Tile", 3),
        "Global" => ("Global", 2),
        "Smem" | "smem" => ("Smem", 3),
        "SmemView" => ("SmemView", 3),
        "Pipeline" => ("Pipeline", 1),
        "TileQueue" => ("TileQueue", 1),
        _ => return Err(bad()),
    };
    let args: Vec<&syn::GenericArgument> = match &seg.arguments {
        syn::PathArguments::None => Vec::new(),
        syn::PathArguments::AngleBracketed(a) => a.args.iter().collect(),
        syn::PathArguments::Parenthesized(_) => return Err(bad()),
    };
    if args.len() != n {
        return Err(syn::Error::new_spanned(t, format!("`{name}` takes {n} generic argument(s), found {}", args.len())));
    }
    // The dtype comes first where there is one; every other argument is a constant.
    let has_dtype = matches!(ctor, "Tile" | "Global" | "Smem" | "SmemView");
    for (i, a) in args.iter().enumerate() {
        let ok = if has_dtype && i == 0 { dtype_arg(a, generics).is_some() } else { int_arg(a, generics).is_some() };
        if !ok {
            let what = if has_dtype && i == 0 { "a dtype or a dtype parameter" } else { "a constant or a constant parameter" };
            return Err(syn::Error::new_spanned(a, format!("expected {what}, found `{}`", a.to_token_stream())));
        }
    }
    Ok(Pattern { ctor, args })
}

/// A dtype argument: a dtype, a dtype parameter (`Err(name)`), or `_`.
fn dtype_arg(a: &syn::GenericArgument, generics: &[(String, bool)]) -> Option<Result<Option<DType>, String>> {
    let syn::GenericArgument::Type(t) = a else { return None };
    if matches!(t, syn::Type::Infer(_)) {
        return Some(Ok(None));
    }
    let name = t.to_token_stream().to_string();
    if generics.iter().any(|(g, ty)| *ty && *g == name) {
        return Some(Err(name));
    }
    DType::from_name(&name).map(|d| Ok(Some(d)))
}

/// A constant argument: a value, a constant parameter (`Err(name)`), or `_`.
fn int_arg(a: &syn::GenericArgument, generics: &[(String, bool)]) -> Option<Result<Option<i64>, String>> {
    match a {
        syn::GenericArgument::Type(syn::Type::Infer(_)) => Some(Ok(None)),
        syn::GenericArgument::Type(syn::Type::Path(p)) if p.path.get_ident().is_some() => {
            let name = p.path.segments[0].ident.to_string();
            generics.iter().any(|(g, ty)| !*ty && *g == name).then_some(Err(name))
        }
        syn::GenericArgument::Const(e) => match crate::parse::const_eval_expr(e) {
            Some(v) => Some(Ok(Some(v))),
            // An expression of constant parameters (`{ 64 - D % 64 }`): known once they are
            // substituted, so it binds nothing and matches anything here.
            None => only_params(e.to_token_stream(), generics).then_some(Ok(None)),
        },
        _ => None,
    }
}

/// Whether every identifier in `ts` is one of the constant parameters in `generics`.
fn only_params(ts: TokenStream, generics: &[(String, bool)]) -> bool {
    ts.into_iter().all(|t| match t {
        proc_macro2::TokenTree::Ident(i) => generics.iter().any(|(g, ty)| !*ty && i == g),
        proc_macro2::TokenTree::Group(g) => only_params(g.stream(), generics),
        _ => true,
    })
}

/// Binds the generic parameters in `t` to what the argument's type `ty` holds; an error says
/// how they differ.
fn unify(t: &syn::Type, ty: Type, generics: &[(String, bool)], bound: &mut HashMap<String, Bound>) -> Result<(), String> {
    let p = pattern(t, generics).map_err(|e| e.to_string())?;
    let mismatch = || format!("expected `{}`, found `{ty}`", compact(t));
    let (dtype, ints): (Option<DType>, Vec<u32>) = match (p.ctor, ty) {
        ("f32", Type::Scalar(ScalarType::F32)) | ("i32", Type::Scalar(ScalarType::I32)) | ("bool", Type::Scalar(ScalarType::Bool)) => {
            (None, vec![])
        }
        ("Tile", Type::Tile(t)) => (Some(t.dtype), vec![t.rows, t.cols]),
        ("Global", Type::Global { dtype, rank }) => (Some(dtype), vec![rank]),
        ("Smem", Type::Smem(s)) => (Some(s.dtype), vec![s.rows, s.cols]),
        ("SmemView", Type::SmemView { dtype, rows, cols, .. }) => (Some(dtype), vec![rows, cols]),
        ("Pipeline", Type::Pipeline { stages, .. }) | ("TileQueue", Type::Queue { stages, .. }) => (None, vec![stages]),
        _ => return Err(mismatch()),
    };
    let mut args = p.args.iter();
    let bind = |name: String, v: Bound, bound: &mut HashMap<String, Bound>| -> Result<(), String> {
        match bound.get(&name) {
            Some(&old) if old != v => Err(format!("{}: `{name}` is {} from an earlier argument", mismatch(), show(old))),
            _ => {
                bound.insert(name, v);
                Ok(())
            }
        }
    };
    if let Some(d) = dtype {
        let a = args.next().ok_or_else(mismatch)?;
        match dtype_arg(a, generics) {
            Some(Ok(Some(want))) if want != d => return Err(mismatch()),
            Some(Err(name)) => bind(name, Bound::Dtype(d), bound)?,
            _ => {}
        }
    }
    for (a, v) in args.zip(ints) {
        match int_arg(a, generics) {
            Some(Ok(Some(want))) if want != i64::from(v) => return Err(mismatch()),
            Some(Err(name)) => bind(name, Bound::Int(i64::from(v)), bound)?,
            _ => {}
        }
    }
    Ok(())
}

fn show(b: Bound) -> String {
    match b {
        Bound::Int(v) => v.to_string(),
        Bound::Dtype(d) => format!("`{}`", d.name()),
    }
}

/// A result type with its generic parameters bound, if it names one concrete type.
fn concrete(t: &syn::Type) -> Option<Type> {
    let p = pattern(t, &[]).ok()?;
    let ints = |i: usize| int_arg(p.args[i], &[]).and_then(|r| r.ok().flatten());
    Some(match p.ctor {
        "f32" => Type::Scalar(ScalarType::F32),
        "i32" => Type::Scalar(ScalarType::I32),
        "bool" => Type::Scalar(ScalarType::Bool),
        "Tile" => {
            let dtype = dtype_arg(p.args[0], &[])?.ok().flatten()?;
            Type::Tile(TileType { dtype, rows: u32::try_from(ints(1)?).ok()?, cols: u32::try_from(ints(2)?).ok()? })
        }
        _ => return None,
    })
}

/// Whether a value of this type is a name the body uses in place (a tensor, a ring, a
/// pipeline, a queue) rather than a value it may copy.
fn is_handle(t: Type) -> bool {
    matches!(t, Type::Global { .. } | Type::Smem(_) | Type::Pipeline { .. } | Type::Queue { .. })
}

/// The function's tokens without its generic parameters, which substitution replaces.
fn without_generics(f: &syn::ItemFn) -> TokenStream {
    let mut f = f.clone();
    f.sig.generics = syn::Generics::default();
    f.to_token_stream()
}

/// Replaces every identifier bound in `bound` by its value, keeping the spans.
fn substitute(ts: TokenStream, bound: &HashMap<String, Bound>) -> TokenStream {
    use proc_macro2::{Group, TokenTree};
    ts.into_iter()
        .map(|tt| match tt {
            TokenTree::Ident(i) => match bound.get(&i.to_string()) {
                Some(b) => b.tokens(i.span()),
                None => TokenTree::Ident(i),
            },
            TokenTree::Group(g) => {
                let mut n = Group::new(g.delimiter(), substitute(g.stream(), bound));
                n.set_span(g.span());
                TokenTree::Group(n)
            }
            other => other,
        })
        .collect()
}

/// Renames a body's bindings apart from the caller's: each `let` and loop variable `x`
/// becomes `x_<k>` (shadowing kept, scope by scope), and parameters become what the call
/// binds them to. Assigning to a parameter not declared `mut` is an error.
struct Renamer {
    scopes: Vec<HashMap<String, (String, bool)>>,
    suffix: u32,
    errors: Vec<syn::Error>,
}

impl Renamer {
    fn lookup(&self, name: &str) -> Option<&(String, bool)> {
        self.scopes.iter().rev().find_map(|s| s.get(name))
    }

    fn bind(&mut self, p: &mut Pat) {
        match p {
            Pat::Ident(id) => {
                let new = format!("{}_{}", id.ident, self.suffix);
                if let Some(s) = self.scopes.last_mut() {
                    s.insert(id.ident.to_string(), (new.clone(), false));
                }
                id.ident = syn::Ident::new(&new, id.ident.span());
            }
            Pat::Type(pt) => self.bind(&mut pt.pat),
            Pat::Tuple(t) => t.elems.iter_mut().for_each(|e| self.bind(e)),
            _ => {}
        }
    }

    fn check_assign(&mut self, target: &syn::Expr) {
        let target = match target {
            syn::Expr::Unary(u) if matches!(u.op, syn::UnOp::Deref(_)) => &*u.expr,
            other => other,
        };
        if let syn::Expr::Path(p) = target {
            if let Some(id) = p.path.get_ident() {
                if self.lookup(&id.to_string()).is_some_and(|(_, frozen)| *frozen) {
                    self.errors.push(syn::Error::new_spanned(id, format!("cannot assign to `{id}`, a parameter not declared `mut`")));
                }
            }
        }
    }
}

impl VisitMut for Renamer {
    fn visit_block_mut(&mut self, b: &mut syn::Block) {
        self.scopes.push(HashMap::new());
        for s in &mut b.stmts {
            self.visit_stmt_mut(s);
        }
        self.scopes.pop();
    }

    fn visit_local_mut(&mut self, l: &mut syn::Local) {
        if let Some(init) = &mut l.init {
            self.visit_expr_mut(&mut init.expr);
        }
        self.bind(&mut l.pat);
    }

    fn visit_expr_mut(&mut self, e: &mut syn::Expr) {
        match e {
            syn::Expr::Path(p) if p.qself.is_none() && p.path.get_ident().is_some() => {
                let id = &mut p.path.segments[0].ident;
                if let Some((new, _)) = self.lookup(&id.to_string()) {
                    *id = syn::Ident::new(new, id.span());
                }
            }
            syn::Expr::Closure(c) => {
                self.scopes.push(HashMap::new());
                c.inputs.iter_mut().for_each(|p| self.bind(p));
                self.visit_expr_mut(&mut c.body);
                self.scopes.pop();
            }
            syn::Expr::ForLoop(f) => {
                self.visit_expr_mut(&mut f.expr);
                self.scopes.push(HashMap::new());
                self.bind(&mut f.pat);
                self.visit_block_mut(&mut f.body);
                self.scopes.pop();
            }
            syn::Expr::Assign(a) => {
                self.check_assign(&a.left);
                syn::visit_mut::visit_expr_assign_mut(self, a);
            }
            syn::Expr::Binary(b)
                if matches!(
                    b.op,
                    syn::BinOp::AddAssign(_) | syn::BinOp::SubAssign(_) | syn::BinOp::MulAssign(_) | syn::BinOp::DivAssign(_)
                ) =>
            {
                self.check_assign(&b.left);
                syn::visit_mut::visit_expr_binary_mut(self, b);
            }
            syn::Expr::Reference(r) if r.mutability.is_some() => {
                self.check_assign(&r.expr);
                syn::visit_mut::visit_expr_reference_mut(self, r);
            }
            syn::Expr::Call(c) if is_mma(c) => {
                if let Some(acc) = c.args.first() {
                    let acc = match acc {
                        syn::Expr::Reference(r) => &*r.expr,
                        other => other,
                    };
                    self.check_assign(&acc.clone());
                }
                syn::visit_mut::visit_expr_call_mut(self, c);
            }
            _ => syn::visit_mut::visit_expr_mut(self, e),
        }
    }

    // Types hold no bindings (their generic parameters are already substituted).
    fn visit_type_mut(&mut self, _: &mut syn::Type) {}
}

fn is_mma(c: &syn::ExprCall) -> bool {
    matches!(&*c.func, syn::Expr::Path(p) if p.path.is_ident("mma_sync") || p.path.is_ident("mma_sync_kn"))
}

/// A body's statements and its result expressions (the tail: one, a tuple's, or none).
fn split_tail(block: &syn::Block) -> (Vec<syn::Stmt>, Vec<syn::Expr>) {
    let mut stmts = block.stmts.clone();
    match stmts.last() {
        Some(syn::Stmt::Expr(e, None))
            if !matches!(e, syn::Expr::ForLoop(_) | syn::Expr::While(_) | syn::Expr::If(_) | syn::Expr::Block(_)) =>
        {
            let results = match e {
                syn::Expr::Tuple(t) => t.elems.iter().cloned().collect(),
                other => vec![other.clone()],
            };
            stmts.pop();
            (stmts, results)
        }
        _ => (stmts, Vec::new()),
    }
}

/// `Vec<f32>`, not `Vec < f32 >`.
fn compact(t: &impl ToTokens) -> String {
    t.to_token_stream()
        .to_string()
        .replace("Fn (", "Fn(")
        .replace(" < ", "<")
        .replace("< ", "<")
        .replace(" >", ">")
        .replace(" ,", ",")
        .replace(" :: ", "::")
}

impl Frontend {
    /// Loads a definition handed to the macro (`{ fn … } [ (path) { … } … ]`, its callees'
    /// definitions nested) and those it calls; returns its number.
    pub fn load(&mut self, closure: TokenStream) -> syn::Result<u32> {
        let parser = |input: syn::parse::ParseStream| -> syn::Result<(syn::ItemFn, Vec<(syn::Path, TokenStream)>)> {
            let item;
            syn::braced!(item in input);
            let item: syn::ItemFn = item.parse()?;
            let deps;
            syn::bracketed!(deps in input);
            let mut out = Vec::new();
            while !deps.is_empty() {
                let path;
                syn::parenthesized!(path in deps);
                let path: syn::Path = path.parse()?;
                let body;
                syn::braced!(body in deps);
                out.push((path, body.parse()?));
            }
            Ok((item, out))
        };
        let (item, deps) = syn::parse::Parser::parse2(parser, closure)?;
        let mut ids = Vec::new();
        for (path, body) in deps {
            ids.push((path_key(&path), self.load(body)?));
        }
        let name = item.sig.ident.to_string();
        let id = self.defs.len() as u32;
        // A call of itself by its own name resolves to itself, for the checker to report.
        if !ids.iter().any(|(k, _)| *k == name) {
            ids.push((name.clone(), id));
        }
        self.defs.push(DeviceDef { name, item, deps: ids });
        Ok(id)
    }

    /// Parses a device function's body once where it is defined, with placeholder values for
    /// its generic parameters (64 for constants, `f32` for dtypes), to report syntax errors at
    /// their tokens; shapes and types are checked at each call.
    pub fn check_definition(&mut self, id: u32) {
        let Some(def) = self.defs.get(id as usize).cloned() else { return };
        let bound: HashMap<String, Bound> = generic_params(&def.item.sig)
            .into_iter()
            .map(|(n, is_type)| (n, if is_type { Bound::Dtype(DType::F32) } else { Bound::Int(64) }))
            .collect();
        let Ok(item) = syn::parse2::<syn::ItemFn>(substitute(without_generics(&def.item), &bound)) else { return };
        let saved = std::mem::replace(&mut self.deps, def.deps.clone());
        // Calls of a function parameter parse as calls; what they call is known at each call.
        self.deps.extend(fn_params(&item.sig).into_iter().map(|n| (n, u32::MAX)));
        let (stmts, results) = split_tail(&item.block);
        self.block(&stmts);
        for r in &results {
            if let Err(e) = self.expr(r) {
                self.errors.push(e);
            }
        }
        self.deps = saved;
    }

    /// The definition of closure `l` given to parameter `i` of `sig` (its generic parameters
    /// bound): a function named `fname` whose parameters take the types `impl Fn(…)` names,
    /// its body the closure's, its calls resolved where the closure was written. Names the
    /// closure does not bind are the caller's, as the body is inlined in the caller's place.
    fn closure_def(&mut self, sig: &syn::Signature, i: usize, l: usize, fname: &str, what: &str) -> Result<u32, String> {
        let Some((cl, deps, _)) = self.lambdas.get(l).cloned() else { return Err(format!("`{what}`: no closure")) };
        let ty = match sig.inputs.iter().nth(i) {
            Some(syn::FnArg::Typed(pt)) => &*pt.ty,
            _ => return Err(format!("`{what}`: not a function parameter")),
        };
        let Some((arg_tys, ret)) = fn_type(ty) else { return Err(format!("`{what}`: not a function parameter")) };
        if cl.inputs.len() != arg_tys.len() {
            return Err(format!(
                "`{what}` is `{}`, a function of {} argument(s); the closure takes {}",
                compact(ty),
                arg_tys.len(),
                cl.inputs.len()
            ));
        }
        let mut params = Vec::new();
        for (j, (p, t)) in cl.inputs.iter().zip(&arg_tys).enumerate() {
            let id = match p {
                Pat::Ident(id) => id.ident.clone(),
                Pat::Type(pt) => match &*pt.pat {
                    Pat::Ident(id) => id.ident.clone(),
                    _ => return Err(format!("`{what}`: a closure's parameters are names")),
                },
                Pat::Wild(_) => quote::format_ident!("__unused_{}", j),
                _ => return Err(format!("`{what}`: a closure's parameters are names")),
            };
            params.push(quote::quote!(#id: #t));
        }
        let ret = ret.map(|r| quote::quote!(-> #r));
        let body = match &*cl.body {
            syn::Expr::Block(b) => b.block.to_token_stream(),
            other => quote::quote!({ #other }),
        };
        let name = syn::Ident::new(fname, Span::call_site());
        let item: syn::ItemFn = syn::parse2(quote::quote!(fn #name(#(#params),*) #ret #body)).map_err(|e| format!("`{what}`: {e}"))?;
        self.defs.push(DeviceDef { name: what.to_string(), item, deps });
        Ok(self.defs.len() as u32 - 1)
    }

    /// The syntax error `e` (at a token of the body of the call `site`'s callee) as a compile
    /// error whose place the macro maps back through the call.
    fn in_site(&mut self, e: &syn::Error) -> CompileError {
        let loc = self.loc(e.span());
        CompileError::Type { message: e.to_string(), loc }
    }

    /// The error for `message` at span index `idx`, placed at the outermost call when `idx`
    /// is inside an inlined body: "in `g` (file.rs:12): …", outer calls first.
    pub fn place(&self, idx: u32, message: &str) -> syn::Error {
        let mut idx = idx as usize;
        let mut message = message.to_string();
        while let Some(Some(site)) = self.origins.get(idx) {
            let Some((call, callee)) = self.sites.get(*site as usize) else { break };
            let span = self.spans.get(idx).copied().unwrap_or_else(Span::call_site);
            let file = span.file();
            let file = std::path::Path::new(&file).file_name().map(|f| f.to_string_lossy().into_owned()).unwrap_or_default();
            message = format!("in `{callee}` ({file}:{}): {message}", span.start().line);
            idx = *call as usize;
        }
        syn::Error::new(self.spans.get(idx).copied().unwrap_or_else(Span::call_site), message)
    }
}

impl Callees for Frontend {
    fn instantiate(&mut self, call: &CallSite<'_>) -> Result<Inlined, CompileError> {
        let at = |message: String| CompileError::Type { message, loc: call.loc };
        let Some(def) = self.defs.get(call.id as usize).cloned() else {
            return Err(at(format!("unknown function `{}`", call.func)));
        };
        let name = &def.name;
        let sig = &def.item.sig;
        let nparams = sig.inputs.len();
        let fns = self.fn_args.get(&call.loc.span).cloned().unwrap_or_default();
        let given = call.args.len() + fns.len();
        if nparams != given {
            return Err(at(format!("`{name}` takes {nparams} argument{}, found {given}", if nparams == 1 { "" } else { "s" })));
        }
        let generics = generic_params(sig);
        let mut bound = HashMap::new();
        if let Some(explicit) = self.explicit.get(&call.loc.span) {
            if explicit.len() > generics.len() {
                return Err(at(format!("`{name}` takes {} generic argument(s), found {}", generics.len(), explicit.len())));
            }
            for ((g, is_type), a) in generics.iter().zip(explicit) {
                let v = if *is_type {
                    dtype_arg(a, &[]).and_then(|r| r.ok().flatten()).map(Bound::Dtype)
                } else {
                    int_arg(a, &[]).and_then(|r| r.ok().flatten()).map(Bound::Int)
                };
                let v = v.ok_or_else(|| {
                    at(format!("`{name}`'s `{g}` takes a {}, found `{}`", if *is_type { "dtype" } else { "constant" }, a.to_token_stream()))
                })?;
                bound.insert(g.clone(), v);
            }
        }
        // Parameters: each one's name, whether it is `mut`, and whether it is `&mut`.
        let mut params = Vec::new();
        // Function parameters: each one's name, position, and the function given.
        let mut functions = Vec::new();
        let mut next = 0;
        for (i, input) in sig.inputs.iter().enumerate() {
            let syn::FnArg::Typed(pt) = input else { return Err(at(format!("`{name}` takes `self`"))) };
            let Pat::Ident(pid) = &*pt.pat else { return Err(at(format!("`{name}`: a parameter pattern"))) };
            let nth = format!("argument {} of `{name}` (`{}`)", i + 1, pid.ident);
            let given = fns.iter().find(|(p, _)| *p == i).map(|(_, f)| f.clone());
            match (fn_type(&pt.ty).is_some(), given) {
                (true, Some(f)) => {
                    functions.push((pid.ident.to_string(), i, f));
                    continue;
                }
                (true, None) => {
                    let loc = call.args.get(next).map_or(call.loc, |a| a.loc);
                    return Err(CompileError::Type { message: format!("{nth} is a function: pass a closure, `|x, …| …`"), loc });
                }
                (false, Some(f)) => {
                    let loc = match f {
                        FnArg::Lambda(l) => self.lambdas.get(l).map_or(call.loc, |x| x.2),
                        FnArg::Def(_) => call.loc,
                    };
                    let message = format!("{nth}: expected a value of type `{}`, found a function", compact(&pt.ty));
                    return Err(CompileError::Type { message, loc });
                }
                (false, None) => {}
            }
            let Some(arg) = call.args.get(next) else { return Err(at(format!("{nth}: missing"))) };
            let arg_by_ref = call.by_ref.get(next).copied().unwrap_or(false);
            next += 1;
            let (by_ref, ty) = match &*pt.ty {
                syn::Type::Reference(r) => (true, &*r.elem),
                other => (false, other),
            };
            if by_ref != arg_by_ref {
                return Err(at(if by_ref {
                    format!("{nth}: expected `&mut name`, found a value")
                } else {
                    format!("{nth}: expected a value, found `&mut`")
                }));
            }
            let arg_ty = arg.ty.ok_or_else(|| at(format!("{nth}: an untyped argument")))?;
            unify(ty, arg_ty, &generics, &mut bound).map_err(|e| CompileError::Type { message: format!("{nth}: {e}"), loc: arg.loc })?;
            params.push((pid.ident.to_string(), pid.mutability.is_some(), by_ref, arg_ty));
        }
        if let Some((g, _)) = generics.iter().find(|(g, _)| !bound.contains_key(g)) {
            return Err(at(format!("cannot infer `{g}` of `{name}` from the arguments: name it, `{name}::<…>(…)`")));
        }
        let tokens = substitute(without_generics(&def.item), &bound);
        let item: syn::ItemFn = syn::parse2(tokens).map_err(|e| at(format!("`{name}`: {e}")))?;
        self.instances += 1;
        let k = self.instances;
        // How each parameter is bound: the caller's name itself (tensors, rings, pipelines,
        // `&mut`, and values the body only reads), or a `let` of the argument.
        let mut scope = HashMap::new();
        let mut lets = Vec::new();
        for ((pname, mutable, by_ref, ty), arg) in params.iter().zip(call.args) {
            let caller_name = match &arg.kind {
                ExprKind::Var(n) => Some(n.clone()),
                _ => None,
            };
            match caller_name {
                Some(n) if *by_ref || is_handle(*ty) || !mutable => {
                    scope.insert(pname.clone(), (n, !by_ref && !mutable));
                }
                _ if is_handle(*ty) => {
                    return Err(CompileError::Type {
                        message: format!("`{name}`'s `{pname}` is a `{ty}`: pass it by its name"),
                        loc: arg.loc,
                    })
                }
                _ => {
                    let fresh = format!("{pname}_{k}");
                    let text = format!("{name}: let {pname} = (argument)");
                    lets.push(Stmt {
                        kind: StmtKind::Let { name: fresh.clone(), mutable: *mutable, declared: None, value: arg.clone() },
                        loc: arg.loc,
                        text,
                    });
                    scope.insert(pname.clone(), (fresh, false));
                }
            }
        }
        // Each function argument becomes a definition of its own, called by a fresh name.
        let mut extra = Vec::new();
        for (pname, i, f) in functions {
            let fname = format!("__fn_{pname}_{k}");
            let id = match f {
                FnArg::Def(id) => id,
                FnArg::Lambda(l) => {
                    let loc = self.lambdas.get(l).map_or(call.loc, |x| x.2);
                    let what = format!("{name}`'s `{pname}");
                    self.closure_def(&item.sig, i, l, &fname, &what).map_err(|message| CompileError::Type { message, loc })?
                }
            };
            scope.insert(pname, (fname.clone(), true));
            extra.push((fname, id));
        }
        let mut block = (*item.block).clone();
        let mut renamer = Renamer { scopes: vec![scope], suffix: k, errors: Vec::new() };
        renamer.visit_block_mut(&mut block);
        // The tail reads the body's bindings: rename it in the body's scope.
        // A function that returns nothing ends with statements only (`{ f(x) }` is `f(x);`).
        let (stmts, mut results) = match item.sig.output {
            syn::ReturnType::Default => (block.stmts.clone(), Vec::new()),
            _ => split_tail(&block),
        };
        let returns: Vec<Option<Type>> = match &item.sig.output {
            syn::ReturnType::Default => Vec::new(),
            syn::ReturnType::Type(_, t) => match &**t {
                syn::Type::Tuple(tt) => tt.elems.iter().map(concrete).collect(),
                other => vec![concrete(other)],
            },
        };
        // A body that ends with a call of a function returning the tuple (`|q| keys(q, n)`):
        // its results bound by a `let` of the tuple, and those returned.
        let mut stmts = stmts;
        if let ([syn::Expr::Call(c)], true) = (results.as_slice(), returns.len() > 1) {
            let names: Vec<syn::Ident> = (0..returns.len()).map(|i| quote::format_ident!("__tail{}_{}", i, k)).collect();
            let c = c.clone();
            stmts.push(syn::parse_quote!(let (#(#names),*) = #c;));
            results = names.iter().map(|n| syn::parse_quote!(#n)).collect();
        }
        let site = self.sites.len() as u32;
        self.sites.push((call.loc.span, name.clone()));
        let deps = def.deps.iter().cloned().chain(extra).collect();
        let (saved_site, saved_deps) = (self.site.replace(site), std::mem::replace(&mut self.deps, deps));
        let first_error = self.errors.len();
        let body = self.block(&stmts);
        let mut exprs = Vec::new();
        for r in &mut results {
            match self.expr(r) {
                Ok(e) => exprs.push(e),
                Err(e) => self.errors.push(e),
            }
        }
        let mut errors: Vec<syn::Error> = self.errors.drain(first_error..).collect();
        errors.extend(renamer.errors);
        let outcome = match errors.first() {
            Some(e) => Err(self.in_site(e)),
            None if exprs.len() != returns.len() => {
                let said = if returns.is_empty() { "nothing".to_string() } else { format!("{} value(s)", returns.len()) };
                Err(at(format!("`{name}` is declared to return {said}, but its body ends with {} result(s)", exprs.len())))
            }
            None => Ok(Inlined { body: lets.into_iter().chain(body).collect(), results: exprs, returns }),
        };
        self.site = saved_site;
        self.deps = saved_deps;
        outcome
    }
}
