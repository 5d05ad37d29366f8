//! The `tirh` dump.

use super::*;
use std::fmt::{self, Write};

impl fmt::Display for TileIr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "kernel {}(", self.name)?;
        for (i, p) in self.params.iter().enumerate() {
            if i > 0 {
                f.write_str(", ")?;
            }
            write!(f, "{}: {}", p.name, p.ty)?;
        }
        writeln!(f, ") warpgroups={} {{", self.warpgroups)?;
        write_block(f, &self.body, 1)?;
        f.write_str("}\n")
    }
}

fn write_block(f: &mut fmt::Formatter<'_>, body: &[Stmt], depth: usize) -> fmt::Result {
    for s in body {
        write_stmt(f, s, depth)?;
    }
    Ok(())
}

fn write_stmt(f: &mut fmt::Formatter<'_>, s: &Stmt, depth: usize) -> fmt::Result {
    let pad = "    ".repeat(depth);
    match &s.kind {
        StmtKind::Let { name, mutable, value, .. } => {
            let m = if *mutable { "mut " } else { "" };
            writeln!(f, "{pad}let {m}{name}: {} = {};  // line {}", ty(value), value, s.loc.line)
        }
        StmtKind::Assign { name, value } => {
            writeln!(f, "{pad}{name} = {};  // line {}", value, s.loc.line)
        }
        StmtKind::AtomicAdd { tensor, index, value, max } => {
            let idx = index.iter().map(|e| e.to_string()).collect::<Vec<_>>().join(", ");
            let op = if *max { "atomic_max" } else { "atomic_add" };
            writeln!(f, "{pad}{tensor}.{op}([{idx}], {value});  // line {}", s.loc.line)
        }
        StmtKind::FetchAdd { name, tensor, index, value, inc } => {
            let bind = name.as_ref().map_or(String::new(), |n| format!("let {n}: i32 = "));
            let op = if *inc { "fetch_inc" } else { "fetch_add" };
            writeln!(f, "{pad}{bind}{tensor}.{op}([{}], {value});  // line {}", list(index), s.loc.line)
        }
        StmtKind::WaitNonzero { name, tensor, index } => {
            writeln!(f, "{pad}let {name}: i32 = {tensor}.wait_nonzero([{}]);  // line {}", list(index), s.loc.line)
        }
        StmtKind::Store { tensor, index, value, within: None } => {
            writeln!(f, "{pad}store {tensor}[{}] <- {};  // line {}", list(index), value, s.loc.line)
        }
        StmtKind::Store { tensor, index, value, within: Some(ends) } => {
            writeln!(f, "{pad}store {tensor}[{}] <- {} within [{}];  // line {}", list(index), value, list(ends), s.loc.line)
        }
        StmtKind::Prefetch(load) => writeln!(f, "{pad}prefetch {load};  // line {}", s.loc.line),
        StmtKind::For { var, start, end, step, body } => {
            writeln!(f, "{pad}for {var} in {start}..{end} step {step} {{  // line {}", s.loc.line)?;
            write_block(f, body, depth + 1)?;
            writeln!(f, "{pad}}}")
        }
        StmtKind::While { cond, body } => {
            writeln!(f, "{pad}while {cond} {{  // line {}", s.loc.line)?;
            write_block(f, body, depth + 1)?;
            writeln!(f, "{pad}}}")
        }
        StmtKind::QueueFor { var, queue, total, body } => {
            match total {
                Some(t) => writeln!(f, "{pad}for {var} in {queue}.fetch({t}) {{  // line {}", s.loc.line)?,
                None => writeln!(f, "{pad}for {var} in {queue}.take() {{  // line {}", s.loc.line)?,
            }
            write_block(f, body, depth + 1)?;
            writeln!(f, "{pad}}}")
        }
        StmtKind::TmaLoad { dst, tensor, index, pipe } => {
            writeln!(f, "{pad}tma.load {dst} <- {tensor}[{}] on {pipe};  // line {}", list(index), s.loc.line)
        }
        StmtKind::PipeCommit { pipe, stage } => writeln!(f, "{pad}{pipe}.commit({stage});  // line {}", s.loc.line),
        StmtKind::PipeRelease { pipe, stage } => writeln!(f, "{pad}{pipe}.release({stage});  // line {}", s.loc.line),
        StmtKind::SmemStore { view, value, fragments } => {
            let how = if *fragments { " fragments" } else { "" };
            writeln!(f, "{pad}{view} <-{how} {value};  // line {}", s.loc.line)
        }
        StmtKind::TmaStore { tensor, index, src, add, flat } => {
            let op = match (*add, *flat) {
                (true, true) => "reduce_add_flat",
                (true, false) => "reduce_add",
                (false, true) => "store_flat",
                (false, false) => "store",
            };
            writeln!(f, "{pad}tma.{op} {tensor}[{}] <- {src};  // line {}", list(index), s.loc.line)
        }
        StmtKind::TmaStoreWait(n) => writeln!(f, "{pad}tma.store_wait {n};  // line {}", s.loc.line),
        StmtKind::NamedBarrier { id, warpgroups, wait, .. } => {
            writeln!(f, "{pad}barrier.{} {id}, {warpgroups};  // line {}", if *wait { "sync" } else { "arrive" }, s.loc.line)
        }
        StmtKind::MmaWait(n) => writeln!(f, "{pad}mma_wait {n};  // line {}", s.loc.line),
        StmtKind::Mma { acc, a, b, b_kn, a_t } => {
            let (ta, tb) = (if *a_t { "^T" } else { "" }, if *b_kn { "" } else { "^T" });
            writeln!(f, "{pad}mma {acc} += {a}{ta} * {b}{tb};  // line {}", s.loc.line)
        }
        StmtKind::SetMaxNReg(n) => writeln!(f, "{pad}setmaxnreg {n};  // line {}", s.loc.line),
        StmtKind::Eval(call) => writeln!(f, "{pad}{call};  // line {}", s.loc.line),
        StmtKind::Unpack { names, assign, value } => {
            let names: Vec<String> = names.iter().map(|(n, m)| if *m && !*assign { format!("mut {n}") } else { n.clone() }).collect();
            let kw = if *assign { "" } else { "let " };
            writeln!(f, "{pad}{kw}({}) = {value};  // line {}", names.join(", "), s.loc.line)
        }
        StmtKind::If { cond, then, otherwise } => {
            writeln!(f, "{pad}if {cond} {{  // line {}", s.loc.line)?;
            write_block(f, then, depth + 1)?;
            if !otherwise.is_empty() {
                writeln!(f, "{pad}}} else {{")?;
                write_block(f, otherwise, depth + 1)?;
            }
            writeln!(f, "{pad}}}")
        }
    }
}

fn ty(e: &Expr) -> String {
    e.ty.map_or_else(|| "?".to_string(), |t| t.to_string())
}

fn list(items: &[Expr]) -> String {
    let mut s = String::new();
    for (i, e) in items.iter().enumerate() {
        if i > 0 {
            s.push_str(", ");
        }
        let _ = write!(s, "{e}");
    }
    s
}

impl fmt::Display for Expr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.kind {
            ExprKind::Var(n) => f.write_str(n),
            ExprKind::Int(v) => write!(f, "{v}"),
            ExprKind::Float(v) => write!(f, "{v:?}"),
            ExprKind::Bool(v) => write!(f, "{v}"),
            ExprKind::Binary(op @ (BinOp::Max | BinOp::Min), a, b) => {
                write!(f, "{}({a}, {b})", op.symbol())
            }
            ExprKind::Binary(op, a, b) => write!(f, "({a} {} {b})", op.symbol()),
            ExprKind::Unary(UnOp::Neg, a) => write!(f, "-{a}"),
            ExprKind::Unary(UnOp::Not, a) => write!(f, "!{a}"),
            ExprKind::Unary(op, a) => write!(f, "{}({a})", op.name()),
            ExprKind::Builtin(Builtin::BlockId(a)) => write!(f, "block.id.{}", axis_name(*a)),
            ExprKind::Builtin(Builtin::GridDim(a)) => write!(f, "grid.dim.{}", axis_name(*a)),
            ExprKind::Builtin(Builtin::WarpgroupId) => f.write_str("warpgroup.id"),
            ExprKind::Dim { tensor, axis } => write!(f, "{tensor}.dim({axis})"),
            ExprKind::Full { tile, value } => write!(f, "full<{tile}>({value})"),
            ExprKind::LoadFragments { tensor, index, tile } => write!(f, "load_fragments<{tile}> {tensor}[{}]", list(index)),
            ExprKind::Load { tensor, index, fill, tile } => {
                let t = tile.map_or_else(|| "?".to_string(), |t| t.to_string());
                write!(f, "load<{t}> {tensor}[{}]", list(index))?;
                if let Some(fill) = fill {
                    write!(f, " or {fill}")?;
                }
                Ok(())
            }
            ExprKind::Cast { value, to } => write!(f, "cast<{to}>({value})"),
            ExprKind::TileCols { value, start, cols } => write!(f, "{value}.cols({start}, {cols})"),
            ExprKind::SmemRing(t) => {
                write!(f, "smem_ring<{}, {}, {}>(stages={}, swizzle={})", t.dtype, t.rows, t.cols, t.stages, t.swizzle)
            }
            ExprKind::PipelineNew { stages, consumers } => write!(f, "pipeline<{stages}>(consumers={consumers})"),
            ExprKind::QueueNew { stages, consumers, counter } => write!(f, "tile_queue<{stages}>({counter}, consumers={consumers})"),
            ExprKind::SmemAt { ring, stage } => write!(f, "{ring}[{stage}]"),
            ExprKind::SmemRows { view, start, rows } => write!(f, "{view}.rows({start}, {rows})"),
            ExprKind::SmemCols { view, start, cols } => write!(f, "{view}.cols({start}, {cols})"),
            ExprKind::SmemLoad(view) => write!(f, "{view}.load()"),
            ExprKind::PipeStage { pipe, producer: true } => write!(f, "{pipe}.acquire()"),
            ExprKind::PipeStage { pipe, producer: false } => write!(f, "{pipe}.wait()"),
            ExprKind::MaskCols { value, limit, fill } => write!(f, "{value}.mask_cols({limit}, {fill})"),
            ExprKind::KeepWhere { value, cond, fill } => write!(f, "{value}.keep_where({cond}, {fill})"),
            ExprKind::Iota { tile, axis } => write!(f, "{}<{tile}>()", if *axis == 1 { "col_index" } else { "row_index" }),
            ExprKind::Uniform { tile, kind, seed, origin } => {
                write!(f, "{}<{tile}>(", kind.name())?;
                for s in seed {
                    write!(f, "{s}, ")?;
                }
                write!(f, "[{}, {}])", origin[0], origin[1])
            }
            ExprKind::SwapPairs(value) => write!(f, "{value}.swap_pairs()"),
            ExprKind::EdgeCol { value, last } => write!(f, "{value}.{}_col()", if *last { "last" } else { "first" }),
            ExprKind::Shift { value, axis, by, reverse, fill } => {
                let by = if *reverse { -i64::from(*by) } else { i64::from(*by) };
                write!(f, "{value}.shift_{}({by}, {fill})", if *axis == 1 { "cols" } else { "rows" })
            }
            ExprKind::ScanPart { value, step, fill } => write!(f, "scan_part({value}, {step:?}, {fill})"),
            ExprKind::ScanPick { updated, old, step } => write!(f, "scan_pick({updated}, {old}, {step:?})"),
            ExprKind::Scan { func, values, axis, identity, exclusive, reverse, .. } => {
                let list = |v: &[Expr]| v.iter().map(|e| e.to_string()).collect::<Vec<_>>().join(", ");
                let kind = format!("tile_scan{}{}", if *reverse { "_reverse" } else { "" }, if *exclusive { "_exclusive" } else { "" });
                write!(f, "{kind}::<{func}>(({}), {axis}, ({}))", list(values), list(identity))
            }
            ExprKind::Call { func, args, by_ref, .. } => {
                let args: Vec<String> =
                    args.iter().zip(by_ref).map(|(a, r)| if *r { format!("&mut {a}") } else { a.to_string() }).collect();
                write!(f, "{func}({})", args.join(", "))
            }
            ExprKind::Get { tensor, index } => write!(f, "{tensor}.get[{}]", list(index)),
            ExprKind::Reduce { op, axis, value } => write!(f, "reduce_{}<axis={axis}>({value})", op.name()),
            ExprKind::BlockReduce { op, value } => write!(f, "block_{}({value})", op.name()),
            ExprKind::TileAll(value) => write!(f, "tile_all({value})"),
        }
    }
}

fn axis_name(a: u8) -> char {
    ['x', 'y', 'z'][usize::from(a.min(2))]
}
