//! Writes the kernel's module: reflection, PTX per target, a typed launcher; or, on errors,
//! the errors at their tokens and nothing else, so one mistake gives one message.

use crate::parse::Frontend;
use proc_macro2::{Span, TokenStream};
use quote::{format_ident, quote, ToTokens};
use std::path::PathBuf;
use syn::spanned::Spanned;
use tessera_ptx::{CompileOptions, CompiledKernel, DType, ParamKind};

/// The macro's expansion of `#[kernel(attr)] item`: a module per kernel (per dtype), or the
/// errors at their tokens. A kernel that calls device functions first asks each for its
/// definition (see [`resume`]).
pub fn kernel(attr: TokenStream, item: TokenStream) -> TokenStream {
    resolve(Kind::Kernel, attr, item, Vec::new())
}

/// The macro's expansion of `#[device] item`: a `macro_rules!` that hands the function's
/// definition (with those of the device functions it calls) to the kernels that call it, the
/// name that calls resolve to, and a host-side stub that makes a call from host code a
/// compile error; or the errors at their tokens.
pub fn device(attr: TokenStream, item: TokenStream) -> TokenStream {
    resolve(Kind::Device, attr, item, Vec::new())
}

/// `tessera::__resume! { kind (attr) {item} [resolved…] (path) @device {definition} }`: where
/// a device function's `macro_rules!` hands back the definition a kernel (or another device
/// function) asked for by `path`. The expansion goes on with the next unresolved call, or, once
/// every call is resolved, is the kernel's (or the device function's).
pub fn resume(input: TokenStream) -> TokenStream {
    let parser = |input: syn::parse::ParseStream| -> syn::Result<TokenStream> {
        let kind: syn::Ident = input.parse()?;
        let kind = match kind.to_string().as_str() {
            "kernel" => Kind::Kernel,
            "device" => Kind::Device,
            _ => return Err(syn::Error::new_spanned(kind, "expected `kernel` or `device`")),
        };
        let attr;
        syn::parenthesized!(attr in input);
        let attr: TokenStream = attr.parse()?;
        let item;
        syn::braced!(item in input);
        let item: TokenStream = item.parse()?;
        let resolved;
        syn::bracketed!(resolved in input);
        let mut entries = Vec::new();
        while !resolved.is_empty() {
            let path;
            syn::parenthesized!(path in resolved);
            let path: syn::Path = path.parse()?;
            let def;
            syn::braced!(def in resolved);
            entries.push((path, def.parse::<TokenStream>()?));
        }
        let path;
        syn::parenthesized!(path in input);
        let path: syn::Path = path.parse()?;
        input.parse::<syn::Token![@]>()?;
        let what: syn::Ident = input.parse()?;
        if what == "kernel" {
            let name = crate::parse::path_key(&path);
            return Err(syn::Error::new_spanned(
                &path,
                format!("`{name}` is a kernel, launched from the host with `{name}::launch(…)`, not called: to share its code, move it into a `#[tessera::device]` function and call that"),
            ));
        }
        let def;
        syn::braced!(def in input);
        entries.push((path, def.parse()?));
        Ok(resolve(kind, attr, item, entries))
    };
    syn::parse::Parser::parse2(parser, input).unwrap_or_else(|e| e.to_compile_error())
}

#[derive(Clone, Copy)]
enum Kind {
    Kernel,
    Device,
}

/// Asks for the definition of the first device function `item` calls that `entries` does
/// not hold yet (by invoking the `macro_rules!` its path names, which calls [`resume`] back);
/// with every one resolved, expands the kernel or the device function.
fn resolve(kind: Kind, attr: TokenStream, item: TokenStream, entries: Vec<(syn::Path, TokenStream)>) -> TokenStream {
    let f = match parse_fn(item.clone()) {
        Ok(f) => f,
        Err(e) => return e.to_compile_error(),
    };
    let mut known: Vec<String> = entries.iter().map(|(p, _)| crate::parse::path_key(p)).collect();
    if let Kind::Device = kind {
        // A device function calling itself is reported by the checker at the call.
        known.push(f.sig.ident.to_string());
    }
    if let Some(path) = device_calls(&f).into_iter().find(|p| !known.contains(&crate::parse::path_key(p))) {
        let kind = match kind {
            Kind::Kernel => quote!(kernel),
            Kind::Device => quote!(device),
        };
        let resolved = entries.iter().map(|(p, d)| quote!((#p) {#d}));
        return quote! {
            #path! { { ::tessera::__resume } { #kind (#attr) {#item} [#(#resolved)*] (#path) } }
        };
    }
    let devices = entries.into_iter().map(|(p, d)| (crate::parse::path_key(&p), d)).collect();
    match kind {
        Kind::Kernel => kernel_with(attr, item, devices),
        Kind::Device => device_with(attr, &f, devices),
    }
}

/// The paths of the calls in a function that name no function of the language: device
/// functions, in the order they first appear, without generic arguments.
fn device_calls(f: &syn::ItemFn) -> Vec<syn::Path> {
    struct Calls(Vec<syn::Path>);
    impl<'a> syn::visit::Visit<'a> for Calls {
        fn visit_expr_call(&mut self, c: &'a syn::ExprCall) {
            // A scan's combine is a device function too.
            if let Some(f) = crate::parse::scan_combine(c) {
                let key = crate::parse::path_key(&f);
                if !self.0.iter().any(|q| crate::parse::path_key(q) == key) {
                    self.0.push(f);
                }
            }
            if let syn::Expr::Path(p) = &*c.func {
                let segs: Vec<String> = p.path.segments.iter().map(|s| s.ident.to_string()).collect();
                let segs: Vec<&str> = segs.iter().map(String::as_str).collect();
                if p.qself.is_none() && !crate::parse::is_builtin(&segs) {
                    let mut path = p.path.clone();
                    path.segments.iter_mut().for_each(|s| s.arguments = syn::PathArguments::None);
                    let key = crate::parse::path_key(&path);
                    if !self.0.iter().any(|q| crate::parse::path_key(q) == key) {
                        self.0.push(path);
                    }
                }
            }
            syn::visit::visit_expr_call(self, c);
        }
    }
    let mut calls = Calls(Vec::new());
    syn::visit::Visit::visit_block(&mut calls, &f.block);
    // Calls of a function parameter call what each call of `f` gives it.
    let params = crate::device::fn_params(&f.sig);
    calls.0.retain(|p| !p.get_ident().is_some_and(|id| params.iter().any(|n| id == n)));
    calls.0
}

/// A definition as the `macro_rules!` hands it on: `{ fn … } [ (path) { … } … ]`.
fn definition(f: &syn::ItemFn, devices: &[(String, TokenStream)]) -> TokenStream {
    let mut bare = f.clone();
    bare.attrs.clear();
    let deps = devices.iter().map(|(k, d)| {
        let path: TokenStream = k.parse().unwrap_or_default();
        quote!((#path) {#d})
    });
    quote!({ #bare } [ #(#deps)* ])
}

/// A name for a `#[macro_export]` macro, unique in its crate: `__tessera_<what>_<name>_<hash>`.
fn export_name(what: &str, f: &syn::ItemFn) -> syn::Ident {
    use std::hash::{Hash, Hasher};
    let mut h = std::collections::hash_map::DefaultHasher::new();
    f.to_token_stream().to_string().hash(&mut h);
    format_ident!("__tessera_{}_{}_{:016x}", what, f.sig.ident, h.finish())
}

/// The `#[device]` expansion once every call in it is resolved.
fn device_with(attr: TokenStream, f: &syn::ItemFn, devices: Vec<(String, TokenStream)>) -> TokenStream {
    let mut errs = crate::device::check_signature(f);
    if !attr.is_empty() {
        errs.push(syn::Error::new(last_span(&attr), "`#[device]` takes no options"));
    }
    let def = definition(f, &devices);
    let mut fe = Frontend::new();
    match fe.load(def.clone()) {
        Ok(id) => {
            fe.deps = Vec::new();
            fe.check_definition(id);
            errs.extend(fe.errors);
        }
        Err(e) => errs.push(e),
    }
    let name = &f.sig.ident;
    let vis = &f.vis;
    let mname = export_name("device", f);
    let docs: Vec<&syn::Attribute> = f.attrs.iter().filter(|a| a.path().is_ident("doc")).collect();
    let sig_text = {
        let mut sig = f.sig.clone();
        sig.ident = name.clone();
        sig.to_token_stream().to_string().split_whitespace().collect::<Vec<_>>().join(" ")
    };
    let stub_doc = format!("\n\n*A device function* (`#[tessera::device]`): `{sig_text}`. Call it from a `#[kernel]` or another `#[device]` function, where it is inlined; from host code it is a compile error.");
    let n = f.sig.inputs.len().max(1);
    let gens: Vec<syn::Ident> = (0..n).map(|i| format_ident!("__Arg{}", i)).collect();
    let params: Vec<TokenStream> = if f.sig.inputs.is_empty() {
        Vec::new()
    } else {
        gens.iter()
            .enumerate()
            .map(|(i, g)| {
                let p = format_ident!("_arg{}", i);
                quote!(#p: #g)
            })
            .collect()
    };
    let errors = errors(errs);
    quote! {
        #errors
        #[doc(hidden)]
        #[macro_export]
        macro_rules! #mname {
            ({ $($cb:tt)* } { $($state:tt)* }) => { $($cb)*! { $($state)* @device { #def } } };
        }
        #[doc(hidden)]
        #[allow(unused_imports)]
        #vis use #mname as #name;
        #(#docs)*
        #[doc = #stub_doc]
        #[allow(dead_code, clippy::too_many_arguments)]
        #vis fn #name<#(#gens),*>(#(#params),*) -> ! where (#(#gens,)*): ::tessera::DeviceFunction {
            ::core::unreachable!("device functions run inside kernels")
        }
    }
}

/// The `#[kernel]` expansion once every call in it is resolved: the kernel's modules, and,
/// per kernel, the name a call of it resolves to (which says that kernels are not called).
fn kernel_with(attr: TokenStream, item: TokenStream, devices: Vec<(String, TokenStream)>) -> TokenStream {
    let mut opts = match parse_attr(attr) {
        Ok(o) => o,
        Err(e) => return e.to_compile_error(),
    };
    opts.devices = devices;
    match per_dtype(item, &opts) {
        Ok(items) => items.into_iter().map(|(body, opts)| compile_one(body, &opts)).collect(),
        Err(e) => e.to_compile_error(),
    }
}

/// What a call of kernel `f` from a kernel or device function resolves to: a macro that
/// answers `@kernel`, which [`resume`] reports at the call.
fn kernel_marker(f: &syn::ItemFn) -> TokenStream {
    let (name, vis, mname) = (&f.sig.ident, &f.vis, export_name("kernel", f));
    quote! {
        #[doc(hidden)]
        #[macro_export]
        macro_rules! #mname {
            ({ $($cb:tt)* } { $($state:tt)* }) => { $($cb)*! { $($state)* @kernel } };
        }
        #[doc(hidden)]
        #[allow(unused_imports)]
        #vis use #mname as #name;
    }
}

/// The frontend and the compiler on `#[kernel(attr)] item`, without the expansion: every
/// kernel it makes (per dtype and `tune` combination; those that do not compile dropped, as
/// the macro drops them), or the errors the macro would report, each at a token of `attr` or
/// `item`. Never panics on any input (the fuzz suite feeds it mutated kernels).
///
/// # Errors
/// The first failing kernel's errors: a bad attribute, syntax the language does not take, a
/// type error, or a `tune` set of which no combination compiles.
pub fn compile(attr: TokenStream, item: TokenStream) -> Result<Vec<CompiledKernel>, Vec<syn::Error>> {
    let opts = parse_attr(attr).map_err(|e| vec![e])?;
    let mut out = Vec::new();
    for (body, opts) in per_dtype(item, &opts).map_err(|e| vec![e])? {
        out.extend(build(&body, &opts)?.1.into_iter().map(|(_, k)| k));
    }
    Ok(out)
}

/// [`compile`] with device functions: `devices` are `#[device]` functions' items (without the
/// attribute), which the kernel — and each other — call by any path that ends in their name.
/// For tools that hand over definitions without the paths a crate would resolve (the fuzz
/// suite); the macro resolves calls by their paths.
///
/// # Errors
/// As [`compile`]'s, and a device item that does not parse.
pub fn compile_with_devices(attr: TokenStream, item: TokenStream, devices: &[TokenStream]) -> Result<Vec<CompiledKernel>, Vec<syn::Error>> {
    let mut opts = parse_attr(attr).map_err(|e| vec![e])?;
    opts.devices = devices.iter().map(|d| (String::new(), quote!({ #d } []))).collect();
    let mut out = Vec::new();
    for (body, opts) in per_dtype(item, &opts).map_err(|e| vec![e])? {
        out.extend(build(&body, &opts)?.1.into_iter().map(|(_, k)| k));
    }
    Ok(out)
}

/// One kernel (one dtype) compiled: its function and every variant that compiles with its
/// knob values (one variant, no knobs, without `tune`), or the errors to report.
#[allow(clippy::type_complexity)]
fn build(item: &TokenStream, opts: &Options) -> Result<(syn::ItemFn, Vec<(Knobs, CompiledKernel)>), Vec<syn::Error>> {
    let f = parse_fn(item.clone()).map_err(|e| vec![e])?;
    let Some(tune) = &opts.tune else {
        let k = compile_fn(&f, opts, &[])?;
        return Ok((f, vec![(Vec::new(), k)]));
    };
    let (built, dropped) = variants(item, &f, tune, opts);
    dump_tune(&f.sig.ident.to_string(), &built, &dropped);
    if built.is_empty() {
        return Err(no_combination(tune, dropped));
    }
    Ok((f, built))
}

/// Parses a function, an error at the end of the input (a cut-short item) placed on the
/// item's last token rather than nowhere.
fn parse_fn(item: TokenStream) -> syn::Result<syn::ItemFn> {
    let last = last_span(&item);
    syn::parse2(item).map_err(|e| at_end(e, last))
}

/// The span of a token stream's last token (the call site for an empty one).
fn last_span(ts: &TokenStream) -> Span {
    ts.clone().into_iter().last().map_or_else(Span::call_site, |t| t.span())
}

/// syn reports running out of input at the call site, which a caller without a compiler
/// (and a reader of a long attribute) cannot place: such an error moves to `at`, the
/// construct that was cut short.
fn at_end(e: syn::Error, at: Span) -> syn::Error {
    let mut out: Option<syn::Error> = None;
    for m in e {
        let m = if m.to_string().starts_with("unexpected end of input") { syn::Error::new(at, m.to_string()) } else { m };
        match &mut out {
            Some(o) => o.combine(m),
            None => out = Some(m),
        }
    }
    out.unwrap_or_else(|| syn::Error::new(at, "unexpected end of input"))
}

/// `dtypes(T = [bf16, f16])`: one kernel per type, named `<fn>_<type>`, with `T` replaced;
/// with a second parameter (`dtypes(T = [bf16, f16], Q = [f8e4m3, f8e5m2])`), one per pair,
/// `<fn>_<t>_<q>`; else the item itself.
fn per_dtype(item: TokenStream, opts: &Options) -> syn::Result<Vec<(TokenStream, Options)>> {
    let mut items = vec![(item, Vec::new())];
    for (param, types) in &opts.dtypes {
        items = items
            .into_iter()
            .flat_map(|(item, chosen): (TokenStream, Vec<(String, String)>)| {
                types.iter().map(move |ty| {
                    let body = substitute(item.clone(), &param.to_string(), &|span| syn::Ident::new(&ty.to_string(), span).into());
                    let mut f = parse_fn(body)?;
                    f.sig.ident = format_ident!("{}_{}", f.sig.ident, ty);
                    let chosen = [chosen.clone(), vec![(param.to_string(), ty.to_string())]].concat();
                    Ok((quote!(#f), chosen))
                })
            })
            .collect::<syn::Result<Vec<_>>>()?;
    }
    // Each kernel's options, its type conditions settled.
    Ok(items
        .into_iter()
        .map(|(item, chosen)| {
            let mut o = opts.clone();
            o.blocks_per_sm = opts.blocks_per_sm.iter().map(|b| b.for_types(&chosen)).collect();
            o.tune = opts.tune.as_ref().map(|t| t.for_types(&chosen));
            (item, o)
        })
        .collect())
}

/// Replaces every identifier `from` in a token stream (groups included) by the token `to`
/// makes from the identifier's span, so that errors point at the use.
fn substitute(ts: TokenStream, from: &str, to: &dyn Fn(Span) -> proc_macro2::TokenTree) -> TokenStream {
    use proc_macro2::{Group, TokenTree};
    ts.into_iter()
        .map(|tt| match tt {
            TokenTree::Ident(i) if i == from => to(i.span()),
            TokenTree::Group(g) => {
                let mut n = Group::new(g.delimiter(), substitute(g.stream(), from, to));
                n.set_span(g.span());
                TokenTree::Group(n)
            }
            other => other,
        })
        .collect()
}

/// Compiles one kernel (one dtype): every combination of its `tune(...)` knobs, or the kernel
/// itself when it has none.
fn compile_one(item: TokenStream, opts: &Options) -> TokenStream {
    match build(&item, opts) {
        Ok((f, built)) => {
            for (knobs, k) in &built {
                // Without `tune`, under the kernel's name; else `<fn>/<knobs>`.
                let rel = if knobs.is_empty() { k.name.clone() } else { format!("{}/{}", f.sig.ident, variant_suffix(knobs)) };
                dump(k, &rel);
            }
            let marker = kernel_marker(&f);
            let module = module(&f, &built);
            quote!(#module #marker)
        }
        Err(errs) => errors(errs),
    }
}

/// Every `tune` combination of a kernel compiled: those that compile, and the others with their
/// errors.
#[allow(clippy::type_complexity)]
fn variants(
    item: &TokenStream, f: &syn::ItemFn, tune: &Tune, opts: &Options,
) -> (Vec<(Knobs, CompiledKernel)>, Vec<(Knobs, Vec<syn::Error>)>) {
    let (mut built, mut dropped) = (Vec::new(), Vec::new());
    for knobs in tune.combinations() {
        let mut body = item.clone();
        for (name, v) in &knobs {
            body = substitute(body, name, &|span| {
                let mut lit = proc_macro2::Literal::i64_unsuffixed(*v);
                lit.set_span(span);
                lit.into()
            });
        }
        let variant = parse_fn(body).map(|mut v| {
            v.sig.ident = format_ident!("{}__{}", f.sig.ident, variant_suffix(&knobs));
            v
        });
        match variant.map_err(|e| vec![e]).and_then(|v| compile_fn(&v, opts, &knobs)) {
            Ok(k) => built.push((knobs, k)),
            Err(errs) => dropped.push((knobs, errs)),
        }
    }
    (built, dropped)
}

/// Every combination failed: said at the attribute, with each one's reason, then the first
/// combination's errors at their tokens.
fn no_combination(tune: &Tune, dropped: Vec<(Knobs, Vec<syn::Error>)>) -> Vec<syn::Error> {
    let why: Vec<String> = dropped.iter().map(|(k, e)| format!("{}: {}", knobs_text(k), first_line(e))).collect();
    let mut out = vec![syn::Error::new(tune.span, format!("no combination of `tune(...)` compiles:\n{}", why.join("\n")))];
    out.extend(dropped.into_iter().next().map(|(_, first)| first).unwrap_or_default());
    out
}

/// Knob values of one variant, in the attribute's order.
type Knobs = Vec<(String, i64)>;

fn knobs_text(k: &Knobs) -> String {
    k.iter().map(|(n, v)| format!("{n}={v}")).collect::<Vec<_>>().join(" ")
}

/// `BN=128, STAGES=4` → `bn128_stages4`: the entry-name suffix of a variant.
fn variant_suffix(k: &Knobs) -> String {
    k.iter().map(|(n, v)| format!("{}{v}", n.to_lowercase())).collect::<Vec<_>>().join("_")
}

fn first_line(errs: &[syn::Error]) -> String {
    errs.first().map(|e| e.to_string().lines().next().unwrap_or("").to_string()).unwrap_or_default()
}

/// Runs the frontend and the compiler on one function (a `tune` variant with its `knobs`);
/// errors at their tokens.
fn compile_fn(f: &syn::ItemFn, opts: &Options, knobs: &[(String, i64)]) -> Result<CompiledKernel, Vec<syn::Error>> {
    let mut fe = Frontend::new();
    for (key, def) in &opts.devices {
        let id = fe.load(def.clone()).map_err(|e| vec![e])?;
        if key.is_empty() {
            // `compile_with_devices`: known by name alone.
            fe.by_name.push((fe.defs[id as usize].name.clone(), id));
        } else {
            fe.deps.push((key.clone(), id));
        }
    }
    let Some(mut ir) = fe.kernel(f, opts.warpgroups) else { return Err(fe.errors) };
    ir.blocks_per_sm = opts.blocks_per_sm.iter().map(|b| b.for_variant(knobs)).find(|&n| n > 0).unwrap_or(0);
    // A diagnostic build (`TESSERA_WAIT_LIMIT=2000000 cargo build`): waits that spin that
    // long name their line to memcheck. Read when this crate is built, so changing it rebuilds
    // the kernels.
    ir.wait_limit = option_env!("TESSERA_WAIT_LIMIT").and_then(|v| v.parse().ok()).unwrap_or(0);
    let compiled = tessera_ptx::compile_with(ir, &CompileOptions { targets: opts.targets.clone() }, &mut fe);
    compiled.map_err(|errs| errs.into_iter().map(|e| fe.place(e.loc().span, &e.to_string())).collect())
}

fn errors(errs: Vec<syn::Error>) -> TokenStream {
    let mut it = errs.into_iter();
    let Some(mut first) = it.next() else { return TokenStream::new() };
    for e in it {
        first.combine(e);
    }
    first.to_compile_error()
}

/// The kernel attribute's options.
#[derive(Clone)]
struct Options {
    warpgroups: u32,
    /// `targets(sm_90a)`: the targets to build (default: every target).
    targets: Vec<tessera_ptx::Target>,
    /// `dtypes(T = [bf16, f16], …)`: each type parameter and its values (none: no `dtypes`).
    dtypes: Vec<(syn::Ident, Vec<syn::Ident>)>,
    /// `blocks_per_sm = N` or `blocks_per_sm(W >= 11264) = N`: occupancy requests, in the
    /// order written; a variant takes the first whose conditions it meets.
    blocks_per_sm: Vec<Occupancy>,
    /// `tune(BN = [256, 128], STAGES = [4, 3])`: knobs and their values.
    tune: Option<Tune>,
    /// The device functions the kernel calls: the path each is called by, and its definition.
    devices: Vec<(String, TokenStream)>,
}

/// `blocks_per_sm`: `blocks` (0: no request) for every variant, or for the variants that meet
/// every condition — on a `tune` knob (`W >= 11264`) or a `dtypes` parameter (`T != f32`):
/// `blocks_per_sm(W >= 11264, T != f32) = 3` caps the registers of the wide 16-bit tiles only,
/// where fitting one more block pays, and leaves the narrow tiles their registers. Several
/// requests are tried in the order written, the first that holds taken:
/// `blocks_per_sm(U == 4) = 2, blocks_per_sm = 8` gives the `U` 4 variants two blocks an SM
/// and every other eight.
#[derive(Clone, Default)]
struct Occupancy {
    blocks: u32,
    when: Vec<Condition>,
}

/// One condition of a conditional `blocks_per_sm`.
#[derive(Clone)]
enum Condition {
    /// `KNOB op VALUE`, the comparison as a function of (knob value, VALUE).
    Knob(syn::Ident, fn(i64, i64) -> bool, i64),
    /// `PARAM == dtype` (`true`) or `PARAM != dtype`.
    Type(syn::Ident, bool, syn::Ident),
}

impl Occupancy {
    /// Parses `= N` or `(condition, ...) = N` after `blocks_per_sm`.
    fn parse(meta: &syn::meta::ParseNestedMeta) -> syn::Result<Occupancy> {
        let mut when = Vec::new();
        if meta.input.peek(syn::token::Paren) {
            let conds;
            syn::parenthesized!(conds in meta.input);
            loop {
                when.push(Condition::parse(&conds)?);
                if conds.is_empty() {
                    break;
                }
                conds.parse::<syn::Token![,]>()?;
            }
        }
        let blocks = int_option(meta, 1..=32, "`blocks_per_sm` is 1 to 32")?;
        Ok(Occupancy { blocks, when })
    }

    /// Each condition names one of the kernel's `tune` knobs or `dtypes` parameters.
    fn check(&self, tune: Option<&Tune>, dtypes: &[(syn::Ident, Vec<syn::Ident>)]) -> syn::Result<()> {
        let knobs: Vec<&str> = tune.map(|t| t.knobs.iter().map(|(n, _)| n.as_str()).collect()).unwrap_or_default();
        for c in &self.when {
            match c {
                Condition::Knob(knob, ..) => {
                    if !knobs.contains(&knob.to_string().as_str()) {
                        let expected = if knobs.is_empty() {
                            "the kernel has no `tune(...)`".to_string()
                        } else {
                            format!("expected one of {}", knobs.join(", "))
                        };
                        return Err(syn::Error::new_spanned(knob, format!("`{knob}` is not a `tune` knob: {expected}")));
                    }
                }
                Condition::Type(param, _, ty) => {
                    let Some((_, types)) = dtypes.iter().find(|(p, _)| p == param) else {
                        return Err(syn::Error::new_spanned(param, format!("`{param}` is not a `dtypes` parameter")));
                    };
                    check_dtype(param, types, ty)?;
                }
            }
        }
        Ok(())
    }

    /// The request with the type conditions settled for one kernel's `types` (parameter, dtype).
    fn for_types(&self, types: &[(String, String)]) -> Occupancy {
        let mut out = Occupancy { blocks: self.blocks, when: Vec::new() };
        for c in &self.when {
            match c {
                Condition::Type(param, eq, ty) => {
                    let holds = types.iter().any(|(p, t)| param == p && (ty == t) == *eq);
                    if !holds {
                        out.blocks = 0;
                    }
                }
                knob => out.when.push(knob.clone()),
            }
        }
        out
    }

    /// The request for one variant with these knob values (0: none).
    fn for_variant(&self, knobs: &[(String, i64)]) -> u32 {
        let meets = |c: &Condition| match c {
            Condition::Knob(knob, holds, value) => knobs.iter().any(|(n, v)| knob == n && holds(*v, *value)),
            // Settled by `for_types` before any variant is built.
            Condition::Type(..) => true,
        };
        if self.when.iter().all(meets) {
            self.blocks
        } else {
            0
        }
    }
}

impl Condition {
    fn parse(input: syn::parse::ParseStream) -> syn::Result<Condition> {
        let name: syn::Ident = input.parse()?;
        let op: syn::BinOp = input.parse()?;
        if input.peek(syn::Ident) {
            let ty: syn::Ident = input.parse()?;
            return match op {
                syn::BinOp::Eq(_) => Ok(Condition::Type(name, true, ty)),
                syn::BinOp::Ne(_) => Ok(Condition::Type(name, false, ty)),
                other => Err(syn::Error::new_spanned(other, "a type is compared with `==` or `!=`")),
            };
        }
        let holds: fn(i64, i64) -> bool = match op {
            syn::BinOp::Lt(_) => |a, b| a < b,
            syn::BinOp::Le(_) => |a, b| a <= b,
            syn::BinOp::Gt(_) => |a, b| a > b,
            syn::BinOp::Ge(_) => |a, b| a >= b,
            syn::BinOp::Eq(_) => |a, b| a == b,
            syn::BinOp::Ne(_) => |a, b| a != b,
            other => return Err(syn::Error::new_spanned(other, "expected a comparison: `<`, `<=`, `>`, `>=`, `==` or `!=`")),
        };
        let lit: syn::LitInt = input.parse()?;
        Ok(Condition::Knob(name, holds, i64::from(lit.base10_parse::<u32>()?)))
    }
}

/// The knobs of `tune(...)`: each name with its values, the first of each the default.
#[derive(Clone)]
struct Tune {
    /// The `tune` path, where an empty set of combinations is reported.
    span: Span,
    knobs: Vec<(String, Vec<i64>)>,
    /// `only(...)`: the combinations built are those where it holds (none: all). Its type
    /// comparisons (`T == f32`) are settled per kernel by [`Tune::for_types`].
    only: Option<syn::Expr>,
}

/// `PARAM == dtype` or `PARAM != dtype` in an `only(...)`: the parameter, whether `==`, the dtype.
fn type_comparison(b: &syn::ExprBinary) -> Option<(&syn::Ident, bool, &syn::Ident)> {
    fn ident(e: &syn::Expr) -> Option<&syn::Ident> {
        match e {
            syn::Expr::Path(p) => p.path.get_ident(),
            _ => None,
        }
    }
    let eq = match b.op {
        syn::BinOp::Eq(_) => true,
        syn::BinOp::Ne(_) => false,
        _ => return None,
    };
    Some((ident(&b.left)?, eq, ident(&b.right)?))
}

/// Replaces the comparisons of a `dtypes` parameter in an `only(...)` by `true` or `false` for
/// one kernel's `types` (parameter, dtype); the knob conditions stay.
struct SettleTypes<'a>(&'a [(String, String)]);

impl syn::visit_mut::VisitMut for SettleTypes<'_> {
    fn visit_expr_mut(&mut self, e: &mut syn::Expr) {
        if let syn::Expr::Binary(b) = e {
            if let Some((param, eq, ty)) = type_comparison(b) {
                if let Some((_, chosen)) = self.0.iter().find(|(p, _)| param == p) {
                    let value = (ty == chosen) == eq;
                    *e = syn::Expr::Lit(syn::ExprLit { attrs: Vec::new(), lit: syn::LitBool::new(value, ty.span()).into() });
                    return;
                }
            }
        }
        syn::visit_mut::visit_expr_mut(self, e);
    }
}

/// Every choice of one dtype per `dtypes` parameter, as (parameter, dtype) pairs.
fn type_choices(dtypes: &[(syn::Ident, Vec<syn::Ident>)]) -> Vec<Vec<(String, String)>> {
    let mut out: Vec<Vec<(String, String)>> = vec![Vec::new()];
    for (param, types) in dtypes {
        out = out
            .into_iter()
            .flat_map(|c| types.iter().map(move |t| [c.clone(), vec![(param.to_string(), t.to_string())]].concat()))
            .collect();
    }
    out
}

/// `ty` is one of the dtypes `types` of the `dtypes` parameter `param` (a type comparison of
/// `blocks_per_sm(...)` or `only(...)`).
fn check_dtype(param: &syn::Ident, types: &[syn::Ident], ty: &syn::Ident) -> syn::Result<()> {
    if types.contains(ty) {
        return Ok(());
    }
    let listed: Vec<String> = types.iter().map(|t| t.to_string()).collect();
    Err(syn::Error::new_spanned(ty, format!("`{param}` is one of {}, never `{ty}`", listed.join(", "))))
}

/// Each type comparison in `only(...)` names a `dtypes` parameter and one of its dtypes.
fn check_type_comparisons(only: &syn::Expr, dtypes: &[(syn::Ident, Vec<syn::Ident>)]) -> syn::Result<()> {
    struct Check<'a>(&'a [(syn::Ident, Vec<syn::Ident>)], Option<syn::Error>);
    impl<'ast> syn::visit::Visit<'ast> for Check<'_> {
        fn visit_expr_binary(&mut self, b: &'ast syn::ExprBinary) {
            if let Some((param, _, ty)) = type_comparison(b) {
                if let Some((_, types)) = self.0.iter().find(|(p, _)| p == param) {
                    if self.1.is_none() {
                        self.1 = check_dtype(param, types, ty).err();
                    }
                    return;
                }
            }
            syn::visit::visit_expr_binary(self, b);
        }
    }
    let mut check = Check(dtypes, None);
    syn::visit::Visit::visit_expr(&mut check, only);
    check.1.map_or(Ok(()), Err)
}

/// At most this many combinations: each is a full compile and a PTX module in the binary.
const MAX_COMBINATIONS: usize = 64;

impl Tune {
    /// The knobs with `only(...)`'s type comparisons settled for one kernel's `types`.
    fn for_types(&self, types: &[(String, String)]) -> Tune {
        let mut out = self.clone();
        if let Some(only) = &mut out.only {
            syn::visit_mut::VisitMut::visit_expr_mut(&mut SettleTypes(types), only);
        }
        out
    }

    /// Every combination, the first knob varying slowest: the first is every knob's first value.
    /// Those where `only(...)` is false are left out.
    fn combinations(&self) -> Vec<Knobs> {
        let mut out: Vec<Knobs> = vec![Vec::new()];
        for (name, values) in &self.knobs {
            out = out.into_iter().flat_map(|k| values.iter().map(move |&v| [k.clone(), vec![(name.clone(), v)]].concat())).collect();
        }
        if let Some(only) = &self.only {
            // Checked at parse: every combination evaluates.
            out.retain(|k| knob_expr(only, k).is_ok_and(|v| v != 0));
        }
        out
    }

    fn parse(meta: &syn::meta::ParseNestedMeta, dtypes: &[(syn::Ident, Vec<syn::Ident>)]) -> syn::Result<Tune> {
        let mut knobs: Vec<(String, Vec<i64>)> = Vec::new();
        let mut only = None;
        meta.parse_nested_meta(|inner| {
            if inner.path.is_ident("only") && inner.input.peek(syn::token::Paren) {
                if only.is_some() {
                    return Err(inner.error("`only(...)` is given twice: join the conditions with `&&`"));
                }
                let body;
                syn::parenthesized!(body in inner.input);
                only = Some(body.parse::<syn::Expr>()?);
                return Ok(());
            }
            let name = inner.path.get_ident().cloned().ok_or_else(|| inner.error("expected a knob name, e.g. `BN = [128, 256]`"))?;
            if knobs.iter().any(|(n, _)| name == n) || dtypes.iter().any(|(p, _)| *p == name) {
                return Err(syn::Error::new_spanned(&name, format!("`{name}` is named twice")));
            }
            let list: syn::ExprArray = inner.value()?.parse()?;
            let mut values = Vec::new();
            for e in &list.elems {
                let v = match e {
                    syn::Expr::Lit(syn::ExprLit { lit: syn::Lit::Int(i), .. }) => i.base10_parse::<u32>().ok(),
                    _ => None,
                };
                match v {
                    Some(v) if !values.contains(&i64::from(v)) => values.push(i64::from(v)),
                    Some(v) => return Err(syn::Error::new_spanned(e, format!("`{name}` lists {v} twice"))),
                    None => return Err(syn::Error::new_spanned(e, format!("`{name}` lists integer literals (0 to 2³²−1)"))),
                }
            }
            if values.is_empty() {
                return Err(syn::Error::new_spanned(&list, format!("`{name}` needs at least one value")));
            }
            knobs.push((name.to_string(), values));
            Ok(())
        })?;
        if knobs.is_empty() {
            return Err(meta.error("`tune` needs at least one knob, e.g. `tune(BN = [128, 256])`"));
        }
        let all = knobs.iter().map(|(_, v)| v.len()).product::<usize>();
        if all > 64 * MAX_COMBINATIONS {
            return Err(meta.error(format!("`tune` makes {all} combinations before `only(...)`, more than {}", 64 * MAX_COMBINATIONS)));
        }
        let mut tune = Tune { span: meta.path.span(), knobs, only: None };
        if let Some(only) = only {
            check_type_comparisons(&only, dtypes)?;
            // Every combination must evaluate for every dtype (unknown names, division by
            // zero, …): said at the token.
            let all = tune.combinations();
            for types in type_choices(dtypes) {
                let mut settled = only.clone();
                syn::visit_mut::VisitMut::visit_expr_mut(&mut SettleTypes(&types), &mut settled);
                for k in &all {
                    knob_expr(&settled, k)?;
                }
            }
            tune.only = Some(only);
        }
        // Each kernel (one per dtype choice) has its own combinations.
        for types in type_choices(dtypes) {
            let count = tune.for_types(&types).combinations().len();
            if count > MAX_COMBINATIONS {
                return Err(meta.error(format!("`tune` makes {count} combinations, more than {MAX_COMBINATIONS}")));
            }
            if count == 0 {
                let which: Vec<String> = types.iter().map(|(p, t)| format!("{p} = {t}")).collect();
                let at = if which.is_empty() { String::new() } else { format!(" for {}", which.join(", ")) };
                return Err(meta.error(format!("`only(...)` leaves no combination of `tune`'s knobs{at}")));
            }
        }
        Ok(tune)
    }
}

/// The value of `tune(..., only(e))`'s `e` for one combination `knobs`: integers, the knobs by
/// name, `+ - * / %`, comparisons and `&& || !` (true is 1, false 0), parentheses; the
/// comparisons of dtypes (`T == f32`) already settled to `true`/`false` ([`Tune::for_types`]).
fn knob_expr(e: &syn::Expr, knobs: &Knobs) -> syn::Result<i64> {
    use syn::BinOp as B;
    match e {
        syn::Expr::Lit(syn::ExprLit { lit: syn::Lit::Int(i), .. }) => i.base10_parse::<i64>(),
        syn::Expr::Lit(syn::ExprLit { lit: syn::Lit::Bool(b), .. }) => Ok(i64::from(b.value)),
        syn::Expr::Path(p) => {
            let name = p.path.get_ident().map(|i| i.to_string()).unwrap_or_default();
            match knobs.iter().find(|(n, _)| *n == name) {
                Some((_, v)) => Ok(*v),
                None => {
                    let names: Vec<&str> = knobs.iter().map(|(n, _)| n.as_str()).collect();
                    Err(syn::Error::new_spanned(p, format!("`only(...)` names the knobs of `tune` (or compares a `dtypes` parameter with a dtype, `T == f32`): expected one of {}", names.join(", "))))
                }
            }
        }
        syn::Expr::Paren(p) => knob_expr(&p.expr, knobs),
        syn::Expr::Group(g) => knob_expr(&g.expr, knobs),
        syn::Expr::Unary(syn::ExprUnary { op: syn::UnOp::Not(_), expr, .. }) => Ok(i64::from(knob_expr(expr, knobs)? == 0)),
        syn::Expr::Unary(syn::ExprUnary { op: syn::UnOp::Neg(_), expr, .. }) => Ok(-knob_expr(expr, knobs)?),
        syn::Expr::Binary(b) => {
            let l = knob_expr(&b.left, knobs)?;
            // `&&` and `||` as Rust's: the right side is still checked, for its names.
            let r = knob_expr(&b.right, knobs)?;
            let zero = || syn::Error::new_spanned(&b.right, "`only(...)` divides by zero for some combination");
            Ok(match b.op {
                B::Add(_) => l.wrapping_add(r),
                B::Sub(_) => l.wrapping_sub(r),
                B::Mul(_) => l.wrapping_mul(r),
                B::Div(_) => l.checked_div(r).ok_or_else(zero)?,
                B::Rem(_) => l.checked_rem(r).ok_or_else(zero)?,
                B::And(_) => i64::from(l != 0 && r != 0),
                B::Or(_) => i64::from(l != 0 || r != 0),
                B::Eq(_) => i64::from(l == r),
                B::Ne(_) => i64::from(l != r),
                B::Lt(_) => i64::from(l < r),
                B::Le(_) => i64::from(l <= r),
                B::Gt(_) => i64::from(l > r),
                B::Ge(_) => i64::from(l >= r),
                ref other => return Err(syn::Error::new_spanned(other, "`only(...)` takes `+ - * / %`, comparisons, `&&`, `||` and `!`")),
            })
        }
        other => Err(syn::Error::new_spanned(
            other,
            "`only(...)` is a condition on the knobs: integers, knob names, arithmetic, comparisons, `&&`, `||`, `!`",
        )),
    }
}

/// An integer option `name = N` with `N` in `range`; `what` states the range in the error.
fn int_option(meta: &syn::meta::ParseNestedMeta, range: std::ops::RangeInclusive<u32>, what: &str) -> syn::Result<u32> {
    let lit: syn::LitInt = meta.value()?.parse()?;
    let v: u32 = lit.base10_parse()?;
    if !range.contains(&v) {
        return Err(syn::Error::new_spanned(lit, format!("{what}, found {v}")));
    }
    Ok(v)
}

fn parse_attr(attr: TokenStream) -> syn::Result<Options> {
    let mut warpgroups = 1;
    let mut blocks_per_sm = Vec::new();
    let mut dtypes: Vec<(syn::Ident, Vec<syn::Ident>)> = Vec::new();
    let mut tune = None;
    let mut targets = tessera_ptx::Target::ALL.to_vec();
    let last = last_span(&attr);
    // One option: `name = value` or `name(...)`.
    let mut option = |meta: &syn::meta::ParseNestedMeta| -> syn::Result<()> {
        // An option without its value or list: said at the option (syn would say it where the
        // input ends, which has no place in a macro's attribute).
        let name = meta.path.get_ident().map(|i| i.to_string()).unwrap_or_default();
        match name.as_str() {
            "warpgroups" if !meta.input.peek(syn::Token![=]) => {
                return Err(meta.error(format!("`{name}` takes a value: `{name} = 2`")));
            }
            "blocks_per_sm" if !meta.input.peek(syn::Token![=]) && !meta.input.peek(syn::token::Paren) => {
                return Err(meta.error("`blocks_per_sm` takes a value: `blocks_per_sm = 2`, or `blocks_per_sm(W >= 8192) = 2`"));
            }
            "targets" | "dtypes" | "tune" if !meta.input.peek(syn::token::Paren) => {
                return Err(meta.error(format!("`{name}` takes a list: `{name}(...)`")));
            }
            _ => {}
        }
        if meta.path.is_ident("targets") {
            targets.clear();
            meta.parse_nested_meta(|inner| {
                let name = inner.path.get_ident().map(|i| i.to_string()).unwrap_or_default();
                match tessera_ptx::Target::ALL.iter().find(|t| t.name() == name) {
                    Some(t) => {
                        targets.push(*t);
                        Ok(())
                    }
                    None => Err(inner.error(format!("unknown target `{name}`: expected `sm_90a` or `sm_80`"))),
                }
            })
        } else if meta.path.is_ident("dtypes") {
            meta.parse_nested_meta(|inner| {
                let param = inner.path.get_ident().cloned().ok_or_else(|| inner.error("expected a type parameter name, e.g. `T`"))?;
                if dtypes.iter().any(|(p, _)| *p == param) {
                    return Err(syn::Error::new_spanned(&param, format!("`{param}` is named twice")));
                }
                if dtypes.len() == 2 {
                    return Err(syn::Error::new_spanned(&param, "`dtypes` takes at most two type parameters"));
                }
                let list: syn::ExprArray = inner.value()?.parse()?;
                let mut types = Vec::new();
                for e in &list.elems {
                    match e {
                        syn::Expr::Path(p)
                            if p.path.get_ident().is_some_and(|i| DType::from_name(&i.to_string()).is_some_and(DType::is_float)) =>
                        {
                            types.push(p.path.segments[0].ident.clone());
                        }
                        other => return Err(syn::Error::new_spanned(other, "`dtypes` lists `f32`, `bf16`, `f16`, `f8e4m3` or `f8e5m2`")),
                    }
                }
                if types.is_empty() {
                    return Err(syn::Error::new_spanned(&list, "`dtypes` needs at least one type"));
                }
                dtypes.push((param, types));
                Ok(())
            })
        } else if meta.path.is_ident("tune") {
            tune = Some(Tune::parse(meta, &dtypes)?);
            Ok(())
        } else if meta.path.is_ident("warpgroups") {
            warpgroups = int_option(meta, 1..=8, "`warpgroups` is 1 to 8 (128 to 1024 threads)")?;
            Ok(())
        } else if meta.path.is_ident("blocks_per_sm") {
            blocks_per_sm.push(Occupancy::parse(meta)?);
            Ok(())
        } else {
            Err(meta.error(
                "unknown kernel option: expected `warpgroups = N`, `blocks_per_sm = N`, `dtypes(T = [bf16, f16])`, `tune(BN = [128, 256])` or `targets(sm_90a, sm_80)`",
            ))
        }
    };
    let parser = syn::meta::parser(|meta| {
        let at = meta.path.span();
        option(&meta).map_err(|e| at_end(e, at))
    });
    syn::parse::Parser::parse2(parser, attr).map_err(|e| at_end(e, last))?;
    for b in &blocks_per_sm {
        b.check(tune.as_ref(), &dtypes)?;
    }
    Ok(Options { warpgroups, targets, dtypes, blocks_per_sm, tune, devices: Vec::new() })
}

fn dtype_tokens(d: DType) -> TokenStream {
    match d {
        DType::F32 => quote!(::tessera::DType::F32),
        DType::BF16 => quote!(::tessera::DType::BF16),
        DType::F16 => quote!(::tessera::DType::F16),
        DType::I32 => quote!(::tessera::DType::I32),
        DType::F8E4M3 => quote!(::tessera::DType::F8E4M3),
        DType::F8E5M2 => quote!(::tessera::DType::F8E5M2),
    }
}

fn rust_elem(d: DType) -> TokenStream {
    match d {
        DType::F32 => quote!(f32),
        DType::BF16 => quote!(::tessera::bf16),
        DType::F16 => quote!(::tessera::f16),
        DType::I32 => quote!(i32),
        DType::F8E4M3 => quote!(::tessera::F8E4M3),
        DType::F8E5M2 => quote!(::tessera::F8E5M2),
    }
}

/// A `tessera::Packed` expression holding `text` compressed: a function returning the bytes,
/// never inlined, so that they stay out of the crate's metadata.
fn packed(text: &str) -> TokenStream {
    let bytes = proc_macro2::Literal::byte_string(&tessera_ptx::pack(text));
    quote!(::tessera::Packed({
        #[inline(never)]
        fn __packed() -> &'static [u8] {
            #bytes
        }
        __packed
    }))
}

/// The `KernelSpec` expression of one compiled variant.
fn spec_tokens(k: &CompiledKernel, knobs: &Knobs) -> TokenStream {
    let name_str = &k.name;
    let params = k.params.iter().map(|(n, kind)| {
        let kind = match kind {
            ParamKind::Global { dtype, rank, writes, tma } => {
                let d = dtype_tokens(*dtype);
                let tma = match tma {
                    Some(b) => {
                        let (r, c, s) = (b.rows, b.cols, b.swizzle);
                        quote!(::core::option::Option::Some(::tessera::TmaBox { rows: #r, cols: #c, swizzle: #s }))
                    }
                    None => quote!(::core::option::Option::None),
                };
                quote!(::tessera::ParamKind::Global { dtype: #d, rank: #rank, writes: #writes, tma: #tma })
            }
            ParamKind::Scalar(d) => {
                let d = dtype_tokens(*d);
                quote!(::tessera::ParamKind::Scalar(#d))
            }
        };
        quote!(::tessera::ParamInfo { name: #n, kind: #kind })
    });
    let variants = k.variants.iter().map(|v| {
        let ptx = &v.ptx;
        let target = match v.target {
            tessera_ptx::Target::Sm90a => quote!(::tessera::Target::Sm90a),
            tessera_ptx::Target::Sm80 => quote!(::tessera::Target::Sm80),
        };
        let ptx = packed(ptx);
        quote!(::tessera::PtxVariant { target: #target, packed: #ptx })
    });
    let (threads, shared, dynamic) = (k.threads, k.shared_bytes, k.dynamic_shared_bytes);
    let tirh = packed(&k.tirh_json);
    let knobs = knobs.iter().map(|(n, v)| quote!((#n, #v)));
    quote! {
        ::tessera::KernelSpec {
            name: #name_str,
            crate_name: ::core::env!("CARGO_PKG_NAME"),
            params: &[#(#params),*],
            threads: #threads,
            shared_bytes: #shared,
            dynamic_shared_bytes: #dynamic,
            variants: &[#(#variants),*],
            tirh_packed: #tirh,
            knobs: &[#(#knobs),*],
        }
    }
}

/// The kernel's module: one `KernelSpec` per variant (the first is `SPEC`, the default), and
/// typed launchers.
fn module(f: &syn::ItemFn, built: &[(Knobs, CompiledKernel)]) -> TokenStream {
    let vis = &f.vis;
    let name = &f.sig.ident;
    let name_str = name.to_string();
    let docs: Vec<&syn::Attribute> = f.attrs.iter().filter(|a| a.path().is_ident("doc")).collect();
    let k = &built[0].1;
    let threads = k.threads;
    let specs: Vec<TokenStream> = built.iter().map(|(knobs, k)| spec_tokens(k, knobs)).collect();
    let default_spec = &specs[0];
    let others: Vec<syn::Ident> = (1..built.len()).map(|i| format_ident!("__VARIANT_{}", i)).collect();
    let other_specs = &specs[1..];
    let mut args = Vec::new();
    let mut pushes = Vec::new();
    let mut names = Vec::new();
    for (i, (pname, kind)) in k.params.iter().enumerate() {
        let id = format_ident!("{}", pname);
        let guard = format_ident!("__guard_{}", pname);
        names.push(id.clone());
        match kind {
            ParamKind::Global { dtype, .. } => {
                let t = rust_elem(*dtype);
                // A knob may leave a store out of one variant: the launcher takes the tensor
                // as written if any variant writes it.
                let writes = built.iter().any(|(_, k)| matches!(k.params[i].1, ParamKind::Global { writes: true, .. }));
                if writes {
                    args.push(quote!(#id: &mut impl ::tessera::GlobalArgMut<#t>));
                    pushes.push(quote!(let #guard = __launch.global_mut(#i, #id)?;));
                } else {
                    args.push(quote!(#id: &impl ::tessera::GlobalArg<#t>));
                    pushes.push(quote!(let #guard = __launch.global(#i, #id)?;));
                }
            }
            ParamKind::Scalar(d) => {
                let t = rust_elem(*d);
                args.push(quote!(#id: #t));
                pushes.push(quote!(__launch.scalar(#i, ::tessera::ScalarArg::from(#id))?;));
            }
        }
    }
    let launch_doc = format!(
        "Launches `{name_str}` (its default variant, [`SPEC`]) on `device` over `grid` blocks of {threads} threads.\n\n# Errors\n\nA [`tessera::Error`] naming the argument when a tensor's rank, dtype, alignment or device does not fit, when no PTX variant runs on the device, or when the driver fails."
    );
    let variant_doc = format!(
        "Launches variant `variant` of [`VARIANTS`] ({} of them) of `{name_str}`.\n\n# Errors\n\nAs [`launch`], and [`tessera::Error::Argument`] for a variant index out of range.",
        built.len()
    );
    quote! {
        #(#docs)*
        #[allow(non_snake_case, clippy::too_many_arguments)]
        #vis mod #name {
            /// Reflection and PTX of this kernel (its default variant), embedded at build time.
            pub static SPEC: ::tessera::KernelSpec = #default_spec;
            #(static #others: ::tessera::KernelSpec = #other_specs;)*
            /// Every variant that compiled, one per combination of the `tune(...)` knobs
            /// (just [`SPEC`] for a kernel without knobs); the first is the default.
            pub static VARIANTS: &[&::tessera::KernelSpec] = &[&SPEC #(, &#others)*];

            #[doc = #launch_doc]
            pub fn launch(device: &::tessera::Device, grid: impl ::core::convert::Into<::tessera::Grid>, #(#args),*) -> ::tessera::Result<()> {
                launch_variant(0, device, grid, #(#names),*)
            }

            #[doc = #variant_doc]
            pub fn launch_variant(variant: usize, device: &::tessera::Device, grid: impl ::core::convert::Into<::tessera::Grid>, #(#args),*) -> ::tessera::Result<()> {
                let spec: &'static ::tessera::KernelSpec = ::tessera::variant_of(VARIANTS, variant)?;
                let mut __launch = ::tessera::Launch::new(spec, device)?;
                #(#pushes)*
                __launch.launch(grid.into())
            }
        }
    }
}

/// The dump folder `target/tessera/<crate>/<rel>/` when `TESSERA_DUMP` is set, with the stages
/// it names.
fn dump_dir(rel: &str) -> Option<(PathBuf, Vec<String>)> {
    let spec = std::env::var("TESSERA_DUMP").ok()?;
    let stages = spec.split(',').map(|s| s.trim().to_string()).collect();
    let krate = std::env::var("CARGO_PKG_NAME").unwrap_or_else(|_| "unknown".into());
    let dir = target_dir().join("tessera").join(krate).join(rel);
    std::fs::create_dir_all(&dir).ok()?;
    Some((dir, stages))
}

/// Writes the stages named in `TESSERA_DUMP` under `target/tessera/<crate>/<rel>/`.
fn dump(k: &CompiledKernel, rel: &str) {
    let Some((dir, stages)) = dump_dir(rel) else { return };
    let want = |s: &str| stages.iter().any(|x| x == s || x == "all");
    if want("tirh") {
        let _ = std::fs::write(dir.join("default.tirh"), &k.tirh);
    }
    for (target, why) in &k.dropped {
        let _ = std::fs::write(dir.join(format!("{}.dropped", target.name())), format!("{why}\n"));
    }
    for v in &k.variants {
        if want("tirt") {
            let _ = std::fs::write(dir.join(format!("{}.tirt", v.target.name())), &v.tirt);
        }
        if want("ptx") {
            let _ = std::fs::write(dir.join(format!("{}.ptx", v.target.name())), &v.ptx);
        }
    }
}

/// Writes `target/tessera/<crate>/<kernel>/tune.txt` (any `TESSERA_DUMP`): one line per
/// combination of the knobs, kept (with its shared memory) or dropped (with why).
fn dump_tune(name: &str, built: &[(Knobs, CompiledKernel)], dropped: &[(Knobs, Vec<syn::Error>)]) {
    let Some((dir, _)) = dump_dir(name) else { return };
    let mut text = String::new();
    for (knobs, k) in built {
        text +=
            &format!("kept    {}: {} ({} bytes of shared memory)\n", knobs_text(knobs), k.name, k.shared_bytes + k.dynamic_shared_bytes);
    }
    for (knobs, errs) in dropped {
        text += &format!("dropped {}: {}\n", knobs_text(knobs), first_line(errs));
    }
    let _ = std::fs::write(dir.join("tune.txt"), text);
}

/// `$CARGO_TARGET_DIR`, or the `target/` beside the workspace's `Cargo.lock`.
fn target_dir() -> PathBuf {
    if let Ok(t) = std::env::var("CARGO_TARGET_DIR") {
        return PathBuf::from(t);
    }
    let manifest = PathBuf::from(std::env::var("CARGO_MANIFEST_DIR").unwrap_or_else(|_| ".".into()));
    let root = manifest.ancestors().find(|d| d.join("Cargo.lock").exists()).unwrap_or(&manifest).to_path_buf();
    root.join("target")
}

#[cfg(test)]
mod tests {
    use super::*;
    use syn::parse_quote;

    fn compile(f: &syn::ItemFn) -> Result<CompiledKernel, Vec<String>> {
        let mut fe = Frontend::new();
        let ir = fe.kernel(f, 1).ok_or_else(|| fe.errors.iter().map(|e| e.to_string()).collect::<Vec<_>>())?;
        tessera_ptx::compile(ir, &CompileOptions::default()).map_err(|es| es.iter().map(|e| e.to_string()).collect())
    }

    fn softmax_like() -> syn::ItemFn {
        parse_quote! {
            fn k(x: Global<f32, 2>, y: Global<bf16, 2>) {
                let r = block::id_x() * 16;
                let mut m = Tile::<f32, 16, 64>::full(f32::NEG_INFINITY);
                for c in (0..x.dim(1)).step_by(64) {
                    let t: Tile<f32, 16, 64> = x.load_or([r, c], f32::NEG_INFINITY);
                    m = max(m, t);
                }
                let t: Tile<f32, 16, 64> = x.load([r, 0]);
                y.store([r, 0], exp2(t - row_max(m)).cast::<bf16>());
            }
        }
    }

    #[test]
    fn same_input_same_bytes() {
        let (a, b) = (compile(&softmax_like()).expect("compiles"), compile(&softmax_like()).expect("compiles"));
        assert_eq!(a.tirh, b.tirh);
        for (x, y) in a.variants.iter().zip(&b.variants) {
            assert_eq!(x.ptx, y.ptx);
            assert_eq!(x.tirt, y.tirt);
        }
    }

    #[test]
    fn reflection_records_what_the_kernel_writes() {
        let k = compile(&softmax_like()).expect("compiles");
        assert_eq!(k.params.len(), 2);
        assert!(matches!(k.params[0].1, ParamKind::Global { writes: false, rank: 2, dtype: DType::F32, tma: None }));
        assert!(matches!(k.params[1].1, ParamKind::Global { writes: true, rank: 2, dtype: DType::BF16, tma: None }));
        assert_eq!(k.threads, 128);
        let ptx = &k.variants[0].ptx;
        assert!(ptx.contains(".version 8.0") && ptx.contains(".target sm_90a") && ptx.contains(".reqntid 128, 1, 1"));
        assert!(ptx.contains("cvt.rn.bf16x2.f32"), "the cast lowers to round-to-nearest-even cvts, two at a time");
        assert!(ptx.contains("shfl.sync.bfly.b32"), "the row reduction crosses lanes");
    }

    #[test]
    fn every_error_is_reported_together() {
        let f: syn::ItemFn = parse_quote! {
            fn k(x: Global<f32, 2>, y: Global<f32, 2>) {
                let a: Tile<f32, 16, 32> = x.load([0]);
                let b = Tile::<f32, 8, 8>::zeros();
                y.store([0, 0], b.cast::<f16>());
                y.store([0, 0], b + Tile::<f32, 4, 4>::zeros());
            }
        };
        let errs = compile(&f).expect_err("three mistakes");
        assert_eq!(errs.len(), 3, "{errs:?}");
        assert!(errs[0].contains("expected 2 indices, found 1"));
        assert!(errs[1].contains("expected a `f32` tile"), "{}", errs[1]);
        assert!(errs[2].contains("shapes do not match"));
    }

    /// Compiles `f` with device functions: each `(path, definition, its own callees)`.
    fn compile_calling(f: &syn::ItemFn, devices: &[(&str, syn::ItemFn, &[&str])]) -> Result<CompiledKernel, Vec<String>> {
        let mut fe = Frontend::new();
        let mut ids: Vec<(String, u32)> = Vec::new();
        for (path, def, callees) in devices {
            let deps = callees.iter().map(|c| {
                let (_, d, _) = devices.iter().find(|(p, ..)| p == c).expect("a listed callee");
                let p: TokenStream = c.parse().expect("a path");
                quote!((#p) {{ #d } []})
            });
            let id = fe.load(quote!({ #def } [ #(#deps)* ])).map_err(|e| vec![e.to_string()])?;
            ids.push((path.to_string(), id));
        }
        fe.deps = ids;
        let ir = fe.kernel(f, 1).ok_or_else(|| fe.errors.iter().map(|e| e.to_string()).collect::<Vec<_>>())?;
        let out = tessera_ptx::compile_with(ir, &CompileOptions::default(), &mut fe);
        out.map_err(|es| es.iter().map(|e| fe.place(e.loc().span, &e.to_string()).to_string()).collect())
    }

    /// PTX with its comments dropped and its registers numbered in order of first use: two
    /// kernels that differ only in names read the same.
    fn normalized(ptx: &str) -> String {
        let mut names: HashMap<String, usize> = HashMap::new();
        let mut out = String::new();
        for line in ptx.lines().map(str::trim).filter(|l| !l.starts_with("//") && !l.starts_with(".visible") && !l.is_empty()) {
            let mut rest = line;
            while let Some(i) = rest.find('%') {
                out.push_str(&rest[..i]);
                let tail = &rest[i + 1..];
                let end = tail.find(|c: char| !(c.is_ascii_alphanumeric() || c == '_')).unwrap_or(tail.len());
                let n = names.len();
                let id = *names.entry(tail[..end].to_string()).or_insert(n);
                out.push_str(&format!("%r{id}"));
                rest = &tail[end..];
            }
            out.push_str(rest);
            out.push('\n');
        }
        out
    }

    use std::collections::HashMap;

    fn online_softmax_defs() -> Vec<(&'static str, syn::ItemFn, &'static [&'static str])> {
        vec![
            (
                "scaled_max",
                parse_quote! {
                    fn scaled_max<const M: usize, const N: usize>(s: Tile<f32, M, N>, m: Tile<f32, M, 1>) -> Tile<f32, M, 1> {
                        max(m, row_max(s))
                    }
                },
                &[],
            ),
            (
                "prelude::online_softmax",
                parse_quote! {
                    fn online_softmax<const M: usize, const N: usize>(s: Tile<f32, M, N>, m: Tile<f32, M, 1>, l: &mut Tile<f32, M, 1>) -> (Tile<f32, M, N>, Tile<f32, M, 1>) {
                        let m_new = scaled_max(s, m);
                        let p = exp2(s - m_new);
                        *l = *l * exp2(m - m_new) + row_sum(p);
                        (p, m_new)
                    }
                },
                &["scaled_max"],
            ),
        ]
    }

    #[test]
    fn a_kernel_with_calls_emits_the_ptx_of_the_kernel_written_out() {
        let with_calls: syn::ItemFn = parse_quote! {
            fn k(x: Global<f32, 2>, y: Global<f32, 2>) {
                let r = block::id_x() * 16;
                let mut m = Tile::<f32, 16, 1>::full(f32::NEG_INFINITY);
                let mut l = Tile::<f32, 16, 1>::zeros();
                for c in (0..x.dim(1)).step_by(64) {
                    let s: Tile<f32, 16, 64> = x.load_or([r, c], f32::NEG_INFINITY);
                    let (p, m_next) = prelude::online_softmax(s, m, &mut l);
                    m = m_next;
                    y.store([r, c], p);
                }
                y.store([r, 0], Tile::<f32, 16, 64>::zeros() + l);
            }
        };
        let written_out: syn::ItemFn = parse_quote! {
            fn k(x: Global<f32, 2>, y: Global<f32, 2>) {
                let r = block::id_x() * 16;
                let mut m = Tile::<f32, 16, 1>::full(f32::NEG_INFINITY);
                let mut l = Tile::<f32, 16, 1>::zeros();
                for c in (0..x.dim(1)).step_by(64) {
                    let s: Tile<f32, 16, 64> = x.load_or([r, c], f32::NEG_INFINITY);
                    let m_new = max(m, row_max(s));
                    let p = exp2(s - m_new);
                    l = l * exp2(m - m_new) + row_sum(p);
                    let p2 = p;
                    let m_next = m_new;
                    m = m_next;
                    y.store([r, c], p2);
                }
                y.store([r, 0], Tile::<f32, 16, 64>::zeros() + l);
            }
        };
        let a = compile_calling(&with_calls, &online_softmax_defs()).expect("compiles");
        let b = compile(&written_out).expect("compiles");
        assert!(!a.tirh.contains("online_softmax("), "the call is inlined:\n{}", a.tirh);
        for (x, y) in a.variants.iter().zip(&b.variants) {
            assert_eq!(normalized(&x.ptx), normalized(&y.ptx), "{}", x.target.name());
        }
    }

    #[test]
    fn an_error_inside_a_device_function_is_placed_at_the_call_with_the_callee_line() {
        let f: syn::ItemFn = parse_quote! {
            fn k(x: Global<f32, 2>) {
                let s: Tile<f32, 16, 64> = x.load([0, 0]);
                let m = Tile::<f32, 32, 1>::zeros();
                let mut l = Tile::<f32, 16, 1>::zeros();
                let (p, m2) = prelude::online_softmax(s, m, &mut l);
                x.store([0, 0], p);
            }
        };
        let errs = compile_calling(&f, &online_softmax_defs()).expect_err("M is 16 from `s` and 32 from `m`");
        assert_eq!(errs.len(), 1, "{errs:?}");
        assert!(
            errs[0].contains("argument 2 of `online_softmax` (`m`): expected `Tile<f32, M, 1>`, found `Tile<f32, 32, 1>`: `M` is 16"),
            "{}",
            errs[0]
        );
        let inner: syn::ItemFn = parse_quote! {
            fn k(x: Global<f32, 2>) {
                let s: Tile<f32, 16, 64> = x.load([0, 0]);
                x.store([0, 0], bad(s));
            }
        };
        let bad: syn::ItemFn = parse_quote! {
            fn bad<const N: usize>(s: Tile<f32, 16, N>) -> Tile<f32, 16, N> {
                let t = Tile::<f32, 8, N>::zeros();
                s + t
            }
        };
        let errs = compile_calling(&inner, &[("bad", bad, &[])]).expect_err("16 rows against 8");
        assert!(errs[0].starts_with("in `bad` (") && errs[0].contains("shapes do not match"), "{}", errs[0]);
    }

    #[test]
    fn misused_calls_are_errors() {
        let defs = online_softmax_defs();
        let cases: [(syn::ItemFn, &str); 5] = [
            (
                parse_quote! { fn k(x: Global<f32, 2>) { let s: Tile<f32, 16, 64> = x.load([0, 0]); x.store([0, 0], scaled_max(s)); } },
                "`scaled_max` takes 2 arguments, found 1",
            ),
            (
                parse_quote! { fn k(x: Global<f32, 2>) {
                    let s: Tile<f32, 16, 64> = x.load([0, 0]);
                    let m = Tile::<f32, 16, 1>::zeros();
                    let l = Tile::<f32, 16, 1>::zeros();
                    let (p, m2) = prelude::online_softmax(s, m, &mut l);
                } },
                "`&mut l` needs a mutable binding",
            ),
            (
                parse_quote! { fn k(x: Global<f32, 2>) {
                    let s: Tile<f32, 16, 64> = x.load([0, 0]);
                    let mut m = Tile::<f32, 16, 1>::zeros();
                    let (p, m2) = prelude::online_softmax(s, m, &mut m);
                } },
                "`m` is passed to `online_softmax` as `&mut m` and also in another argument",
            ),
            (
                parse_quote! { fn k(x: Global<f32, 2>) {
                    let s: Tile<f32, 16, 64> = x.load([0, 0]);
                    let m = Tile::<f32, 16, 1>::zeros();
                    let mut l = Tile::<f32, 16, 1>::zeros();
                    let p = prelude::online_softmax(s, m, &mut l);
                } },
                "`online_softmax` returns 2 values: bind them with `let (a, b, …) = online_softmax(…);`",
            ),
            (
                parse_quote! { fn k(x: Global<f32, 2>) {
                    let s: Tile<f32, 16, 64> = x.load([0, 0]);
                    let m = Tile::<f32, 16, 1>::zeros();
                    let (a, b, c) = prelude::online_softmax(s, m, m);
                } },
                "argument 3 of `online_softmax` (`l`): expected `&mut name`, found a value",
            ),
        ];
        for (f, want) in cases {
            let errs = compile_calling(&f, &defs).expect_err(want);
            assert!(errs.iter().any(|e| e.contains(want)), "want {want:?}, got {errs:?}");
        }
        let rec: syn::ItemFn = parse_quote! { fn again(s: Tile<f32, 16, 16>) -> Tile<f32, 16, 16> { again(s) } };
        let k: syn::ItemFn =
            parse_quote! { fn k(x: Global<f32, 2>) { let s: Tile<f32, 16, 16> = x.load([0, 0]); x.store([0, 0], again(s)); } };
        let mut fe = Frontend::new();
        let id = fe.load(quote!({ #rec } [])).expect("loads");
        fe.defs[id as usize].deps.push(("again".into(), id));
        fe.deps.push(("again".into(), id));
        let ir = fe.kernel(&k, 1).expect("parses");
        let errs = tessera_ptx::compile_with(ir, &CompileOptions::default(), &mut fe).expect_err("recursion");
        assert!(errs[0].to_string().contains("`again` calls itself (again → again)"), "{}", errs[0]);
        let frozen: syn::ItemFn = parse_quote! { fn bump(s: Tile<f32, 16, 16>) { s = s + 1.0; } };
        let k: syn::ItemFn =
            parse_quote! { fn k(x: Global<f32, 2>) { let mut s: Tile<f32, 16, 16> = x.load([0, 0]); bump(s); x.store([0, 0], s); } };
        let errs = compile_calling(&k, &[("bump", frozen, &[])]).expect_err("s is not mut in bump");
        assert!(errs[0].contains("cannot assign to `s`, a parameter not declared `mut`"), "{}", errs[0]);
    }

    #[test]
    fn a_closure_given_to_a_device_function_is_inlined_where_it_is_called() {
        // `rows` applies `f` to each 16-row block: the closure captures `scale` and calls a
        // device function of the caller's; passed on by name to `twice`, it runs twice.
        let defs: Vec<(&str, syn::ItemFn, &[&str])> = vec![
            (
                "twice",
                parse_quote! {
                    fn twice<const N: usize>(t: Tile<f32, 16, N>, g: impl Fn(Tile<f32, 16, N>) -> Tile<f32, 16, N>) -> Tile<f32, 16, N> {
                        g(g(t))
                    }
                },
                &[],
            ),
            (
                "rows",
                parse_quote! {
                    fn rows<const N: usize>(x: Global<f32, 2>, y: Global<f32, 2>, f: impl Fn(Tile<f32, 16, N>, i32) -> Tile<f32, 16, N>) {
                        let r = block::id_x() * 16;
                        let t: Tile<f32, 16, N> = x.load([r, 0]);
                        y.store([r, 0], twice(t, |u| f(u, r)));
                    }
                },
                &["twice"],
            ),
            ("halve", parse_quote! { fn halve<const N: usize>(t: Tile<f32, 16, N>) -> Tile<f32, 16, N> { t * 0.5 } }, &[]),
        ];
        let with_closure: syn::ItemFn = parse_quote! {
            fn k(x: Global<f32, 2>, y: Global<f32, 2>, scale: f32) {
                rows::<64>(x, y, |t, r| halve(t) + scale * (r as f32));
            }
        };
        let written_out: syn::ItemFn = parse_quote! {
            fn k(x: Global<f32, 2>, y: Global<f32, 2>, scale: f32) {
                let r = block::id_x() * 16;
                let t: Tile<f32, 16, 64> = x.load([r, 0]);
                let u1 = t * 0.5 + scale * (r as f32);
                y.store([r, 0], u1 * 0.5 + scale * (r as f32));
            }
        };
        let a = compile_calling(&with_closure, &defs).expect("compiles");
        let b = compile(&written_out).expect("compiles");
        for (x, y) in a.variants.iter().zip(&b.variants) {
            assert_eq!(normalized(&x.ptx), normalized(&y.ptx), "{}", x.target.name());
        }
        let cases: [(syn::ItemFn, &str); 4] = [
            (
                parse_quote! { fn k(x: Global<f32, 2>, y: Global<f32, 2>) { rows::<64>(x, y, |t| t); } },
                "`rows`'s `f` is `impl Fn(Tile<f32, 16, 64>, i32) -> Tile<f32, 16, 64>`, a function of 2 argument(s); the closure takes 1",
            ),
            (
                parse_quote! { fn k(x: Global<f32, 2>, y: Global<f32, 2>) { rows::<64>(x, y, x); } },
                "argument 3 of `rows` (`f`) is a function: pass a closure",
            ),
            (
                parse_quote! { fn k(x: Global<f32, 2>, y: Global<f32, 2>) { rows::<64>(x, |t, r| t, y); } },
                "argument 2 of `rows` (`y`): expected a value of type `Global<f32, 2>`, found a function",
            ),
            (
                parse_quote! { fn k(x: Global<f32, 2>, y: Global<f32, 2>) { rows::<64>(x, y, |t, r| t + Tile::<f32, 8, 64>::zeros()); } },
                "in `rows`'s `f` (",
            ),
        ];
        for (f, want) in cases {
            let errs = compile_calling(&f, &defs).expect_err(want);
            assert!(errs.iter().any(|e| e.contains(want)), "want {want:?}, got {errs:?}");
        }
    }

    #[test]
    fn an_accumulator_tile_stores_to_fp8() {
        // Its pairs of columns are 2 bytes: stored element by element (a run once overran its
        // registers there and the macro panicked).
        let f: syn::ItemFn = parse_quote! {
            fn k8(a: Global<bf16, 2>, c: Global<f8e4m3, 2>) {
                let sa = Smem::<bf16, 64, 64>::ring(1);
                let mut acc = Tile::<f32, 64, 64>::zeros();
                mma_sync(acc, sa.at(0), sa.at(0));
                mma_wait(0);
                c.store([0, 0], acc.cols(16, 16).cast::<f8e4m3>());
            }
        };
        let r = compile(&f);
        assert!(r.is_ok(), "{:?}", r.err());
    }

    #[test]
    fn syntax_errors_are_collected_before_checking() {
        let f: syn::ItemFn = parse_quote! {
            fn k(x: Vec<f32>, n: u64) {
                let f = |v: f32| v;
                loop {}
            }
        };
        let errs = compile(&f).expect_err("four mistakes");
        assert_eq!(errs.len(), 4, "{errs:?}");
    }
}
