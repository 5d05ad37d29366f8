//! TIR-H → TIR-T: registers, tile layouts, memory operations and control flow.
//!
//! Assumes a type-checked kernel ([`crate::verify::typecheck`]). Every scalar is uniform
//! across a warpgroup, so branches are `bra.uni`. Tiles get a [`Layout`] here: loads and
//! constructors take the canonical blocked layout of their shape, elementwise results take
//! their larger operand's, reductions collapse an axis of their input's. Where two layouts
//! meet that differ, the value moves through the warpgroup's shared-memory scratch.
//!
//! Everything that depends only on the thread index (a layout's base row and column, owner
//! predicates, the scratch address) is computed once in the prologue, so it dominates every
//! use whatever the control flow.

mod ampere;
pub mod hopper;
mod memory;
mod queue;
mod scalar;
pub use scalar::EXP2_POLY;
mod tile;

use crate::dtype::{DType, ScalarType};
use crate::error::CompileError;
use crate::layout::{Layout, LayoutKind};
use crate::tirh::{Stmt, StmtKind, TileIr, TileType, Type};
use crate::tirt::{Inst, Operand, PtxKernel, PtxParam, Reg, RegClass};
use std::collections::HashMap;

/// The symbol of the per-block shared scratch array.
pub const SCRATCH: &str = "tessera_scratch";

/// Lowers a type-checked kernel to TIR-T for `target`.
///
/// # Errors
/// [`CompileError::Lower`] when one tensor is copied by TMA with two different boxes, or an
/// `mma_sync` shape has no sm_80 form (N not a multiple of 16).
pub fn lower(ir: &TileIr, target: crate::reflect::Target) -> Result<PtxKernel, CompileError> {
    let mut scan = hopper::HopperScan::default();
    hopper::scan(&ir.body, &mut scan);
    let mut tma: Vec<(String, hopper::TmaUse)> = Vec::new();
    for (name, use_, loc) in &scan.tma {
        match tma.iter().find(|(n, _)| n == name) {
            Some((_, u)) if u != use_ => {
                return Err(CompileError::Lower {
                    message: format!("`{name}` is already copied by TMA with a {}x{} box; one box per tensor", u.rows, u.cols),
                    loc: *loc,
                })
            }
            Some(_) => {}
            None => tma.push((name.clone(), *use_)),
        }
    }
    let mut lw = Lowerer::new(ir);
    lw.target = target;
    lw.acc_derived = hopper::acc_derived(&ir.body, &scan.mma_accs);
    lw.acc_partners = hopper::acc_partners(&ir.body, &lw.acc_derived);
    lw.mma_accs = scan.mma_accs;
    lw.any_mma = scan.any_mma;
    lw.mma_rings = scan.mma_rings;
    lw.params(&tma);
    lw.block(&ir.body)?;
    if lw.uses_fp8 && target == crate::reflect::Target::Sm80 {
        let loc = ir.body.first().map(|s| s.loc).unwrap_or_default();
        return Err(CompileError::Lower { message: "fp8 conversions need sm_89 or later; sm_80 has none".into(), loc });
    }
    let mut k = lw.finish();
    k.tma = tma;
    Ok(k)
}

/// A lowered value.
#[derive(Clone, Debug)]
pub(crate) enum Value {
    Scalar(Operand, ScalarType),
    Tile(TileVal),
    Global(GlobalVal),
    /// A shared ring: its byte offset from the dynamic base, and its type.
    Smem(u32, crate::tirh::SmemType),
    View(hopper::ViewVal),
    Pipe(hopper::Ring),
    Queue(queue::QueueVal),
}

/// A tile in registers: one register per slot of its layout.
#[derive(Clone, Debug)]
pub(crate) struct TileVal {
    pub ty: TileType,
    pub layout: Layout,
    pub regs: Vec<Reg>,
}

/// A global tensor parameter. Its pointer, dims and strides are loaded from the parameter
/// space where a statement needs them ([`Lowerer::global_regs`]): kept in registers from the
/// prologue on, a dozen tensors' worth would stay live through every loop.
#[derive(Clone, Debug)]
pub(crate) struct GlobalVal {
    pub name: String,
    /// Whether the kernel stores into it (else loads may take the read-only path).
    pub written: bool,
    pub rank: usize,
    /// The element type.
    pub dtype: DType,
}

/// A global tensor's parameters in registers, for one statement.
#[derive(Clone, Debug)]
pub(crate) struct GlobalRegs {
    pub ptr: Reg,
    pub dims: Vec<Reg>,
    pub strides: Vec<Reg>,
}

/// Per-thread registers of a layout, computed in the prologue.
#[derive(Clone, Copy, Debug)]
pub(crate) struct LayoutRegs {
    /// The thread's base row (0 if rows are collapsed).
    pub row: Reg,
    /// The thread's base column.
    pub col: Reg,
    /// Lane index along columns (`lane % tc`) and rows (`lane / tc`).
    pub lc: Reg,
    pub lr: Reg,
    /// Warp index along columns and rows.
    pub wc: Reg,
    pub wr: Reg,
    /// Whether this thread owns (stores, counts) its rows; its columns; both.
    pub row_owner: Reg,
    pub col_owner: Reg,
    pub owner: Reg,
}

pub(crate) struct Lowerer<'a> {
    /// The source line of the statement being lowered (the wait watchdog's tag).
    pub line: u32,
    pub ir: &'a TileIr,
    regs: Vec<(RegClass, String)>,
    names: HashMap<(RegClass, String), u32>,
    pub prologue: Vec<Inst>,
    pub body: Vec<Inst>,
    pub params: Vec<PtxParam>,
    scopes: Vec<HashMap<String, Value>>,
    /// Names bound by a `let mut` anywhere so far (see `copy_let`).
    mutable_names: std::collections::HashSet<String>,
    /// The statement lowered next is `let t = v;` of a mutable `v` that a later statement of
    /// the block writes: `t` takes a copy, or the write would move into registers they share.
    copy_let: bool,
    labels: u32,
    /// Bytes of scratch each warpgroup needs.
    pub scratch_bytes: u32,
    /// Whether the statement lowered last was a TMA store (so that the next one, if it follows
    /// straight on, needs no fence and barrier of its own: nothing was written in between).
    pub(crate) after_tma_store: bool,
    /// Whether the TMA store being lowered follows another straight on.
    pub(crate) tma_store_chained: bool,
    /// The block-wide exchange (`block_sum`…), after the warpgroups' scratch: its base
    /// (set in the prologue once the scratch size is known) and the bytes it needs.
    pub xchg: Option<Reg>,
    pub xchg_bytes: u32,
    pub lane: Reg,
    pub warp: Reg,
    pub wg: Reg,
    pub barid: Reg,
    pub scratch: Reg,
    layouts: Vec<(Layout, LayoutRegs)>,
    pub tid: Reg,
    /// Thread 0 of each warpgroup: it issues TMA and arrives on barriers.
    pub leader: Reg,
    pub dyn_base: Option<Reg>,
    pub dyn_bytes: u32,
    /// (base, offset, stages, arrival count) of each barrier ring, initialized at entry.
    pub barrier_inits: Vec<(Reg, u32, u32, u32)>,
    pub tma_maps: HashMap<String, String>,
    /// Parameters loaded in the current statement.
    param_cache: HashMap<String, Reg>,
    pub mma_accs: Vec<String>,
    /// The rings an `mma_sync` reads.
    pub mma_rings: Vec<String>,
    /// The statement being lowered is followed by a named barrier's `sync`.
    pub named_sync_follows: bool,
    /// Names computed from accumulators (see [`hopper::acc_derived`]).
    pub acc_derived: Vec<String>,
    /// Layout-free names used with accumulators (see [`hopper::acc_partners`]).
    pub acc_partners: Vec<String>,
    /// Immutable `let`s of index tiles (`Tile::row_index() + q`, see [`tile::index_like`]),
    /// each with its value: lowered again, in the layout a use needs, wherever that differs
    /// from the binding's (an index tile passed to a device function's `impl Fn` parameter is
    /// bound by a `let` before it meets the accumulator it masks). Dropped when a name the
    /// value reads is bound again.
    pub deferred: Vec<(String, std::rc::Rc<crate::tirh::Expr>)>,
    pub any_mma: bool,
    /// A `store_within`'s clamped dims for its tensor, while it is lowered.
    pub dims_within: Option<(String, Vec<Reg>)>,
    /// Registers of accumulators that issued wgmma groups may still write.
    pub pending_accs: Vec<Reg>,
    /// The next `mma_sync` starts from zero (scale-d = 0 on its first step).
    pub mma_zero: bool,
    pub uses_setmaxnreg: bool,
    /// The layout the next load should take (set while lowering an elementwise operand).
    pub layout_hint: Option<Layout>,
    /// The target being lowered for.
    pub target: crate::reflect::Target,
    /// Whether an fp8 conversion was emitted (`cvt` to or from e4m3/e5m2 needs sm_89).
    pub uses_fp8: bool,
}

impl<'a> Lowerer<'a> {
    fn new(ir: &'a TileIr) -> Self {
        let placeholder = Reg { class: RegClass::B32, id: 0 };
        let mut lw = Lowerer {
            line: 0,
            ir,
            regs: Vec::new(),
            names: HashMap::new(),
            prologue: Vec::new(),
            body: Vec::new(),
            params: Vec::new(),
            scopes: vec![HashMap::new()],
            mutable_names: std::collections::HashSet::new(),
            copy_let: false,
            labels: 0,
            scratch_bytes: 0,
            after_tma_store: false,
            tma_store_chained: false,
            xchg: None,
            xchg_bytes: 0,
            lane: placeholder,
            warp: placeholder,
            wg: placeholder,
            barid: placeholder,
            scratch: placeholder,
            layouts: Vec::new(),
            tid: placeholder,
            leader: placeholder,
            dyn_base: None,
            dyn_bytes: 0,
            barrier_inits: Vec::new(),
            tma_maps: HashMap::new(),
            param_cache: HashMap::new(),
            mma_accs: Vec::new(),
            mma_rings: Vec::new(),
            named_sync_follows: false,
            acc_derived: Vec::new(),
            acc_partners: Vec::new(),
            deferred: Vec::new(),
            any_mma: false,
            dims_within: None,
            pending_accs: Vec::new(),
            mma_zero: false,
            uses_setmaxnreg: false,
            layout_hint: None,
            target: crate::reflect::Target::Sm90a,
            uses_fp8: false,
        };
        lw.thread_indices();
        lw
    }

    /// A fresh register named after `hint` (`%f_acc_3`).
    pub fn reg(&mut self, class: RegClass, hint: &str) -> Reg {
        let base: String = hint.chars().map(|c| if c.is_ascii_alphanumeric() { c } else { '_' }).collect();
        let n = self.names.entry((class, base.clone())).or_insert(0);
        let name = format!("{}_{}_{}", class.prefix(), base, n);
        *n += 1;
        self.regs.push((class, name));
        Reg { class, id: (self.regs.len() - 1) as u32 }
    }

    /// Appends `op args` to the body.
    pub fn op(&mut self, op: &str, args: Vec<Operand>) {
        self.body.push(Inst::Op { pred: None, op: op.to_string(), args });
    }

    /// Appends `@[!]p op args` to the body.
    pub fn op_if(&mut self, pred: Reg, negate: bool, op: &str, args: Vec<Operand>) {
        self.body.push(Inst::Op { pred: Some((pred, negate)), op: op.to_string(), args });
    }

    /// Appends `op args` to the prologue.
    pub fn pro(&mut self, op: &str, args: Vec<Operand>) {
        self.prologue.push(Inst::Op { pred: None, op: op.to_string(), args });
    }

    pub fn label(&mut self, hint: &str) -> String {
        self.labels += 1;
        format!("$L_{hint}_{}", self.labels)
    }

    /// Reserves `bytes` of the warpgroup's scratch.
    pub fn need_scratch(&mut self, bytes: u32) {
        self.scratch_bytes = self.scratch_bytes.max(bytes.next_multiple_of(16));
    }

    /// A barrier over this warpgroup's 128 threads.
    pub fn warpgroup_barrier(&mut self) {
        let id = self.warpgroup_barid();
        self.op("bar.sync", vec![id, Operand::Imm(128)]);
    }

    /// This warpgroup's barrier id: a constant in a kernel of one warpgroup (ptxas then counts
    /// the barriers it uses; with an id in a register it reserves all 16).
    pub fn warpgroup_barid(&mut self) -> Operand {
        if self.ir.warpgroups == 1 {
            Operand::Imm(1)
        } else {
            Operand::Reg(self.barid)
        }
    }

    fn thread_indices(&mut self) {
        use Operand::{Imm, Reg as R, Sym};
        let tid = self.reg(RegClass::B32, "tid");
        let t = self.reg(RegClass::B32, "t");
        self.wg = self.reg(RegClass::B32, "wg");
        self.lane = self.reg(RegClass::B32, "lane");
        self.warp = self.reg(RegClass::B32, "warp");
        self.barid = self.reg(RegClass::B32, "barid");
        self.scratch = self.reg(RegClass::B32, "scratch");
        self.pro("mov.u32", vec![R(tid), Sym("%tid.x".into())]);
        self.pro("shr.u32", vec![R(self.wg), R(tid), Imm(7)]);
        self.pro("and.b32", vec![R(t), R(tid), Imm(127)]);
        self.pro("and.b32", vec![R(self.lane), R(t), Imm(31)]);
        self.pro("shr.u32", vec![R(self.warp), R(t), Imm(5)]);
        // Barrier 0 is left for whole-block barriers; warpgroup w uses barrier w + 1.
        self.pro("add.u32", vec![R(self.barid), R(self.wg), Imm(1)]);
        self.tid = tid;
        self.leader = self.reg(RegClass::Pred, "leader");
        self.pro("setp.eq.u32", vec![R(self.leader), R(t), Imm(0)]);
    }

    fn params(&mut self, tma: &[(String, hopper::TmaUse)]) {
        use Operand::{Reg as R, SymAddr};
        for p in &self.ir.params {
            match p.ty {
                Type::Global { rank, dtype } => {
                    self.params.push(PtxParam { name: format!("{}_ptr", p.name), ty: ".u64", bytes: None });
                    for kind in ["dim", "stride"] {
                        for i in 0..rank {
                            self.params.push(PtxParam { name: format!("{}_{kind}{i}", p.name), ty: ".u32", bytes: None });
                        }
                    }
                    if tma.iter().any(|(n, _)| *n == p.name) {
                        // The tensor map, used in place: TMA takes its generic address.
                        let sym = format!("{}_tmap", p.name);
                        self.params.push(PtxParam { name: sym.clone(), ty: ".align 64 .b8", bytes: Some(128) });
                        self.tma_maps.insert(p.name.clone(), sym);
                    }
                    let g = GlobalVal { name: p.name.clone(), written: self.ir.writes(&p.name), rank: rank as usize, dtype };
                    self.bind(&p.name, Value::Global(g));
                }
                Type::Scalar(s) => {
                    let (class, ty) = match s {
                        ScalarType::F32 => (RegClass::F32, ".f32"),
                        _ => (RegClass::B32, ".s32"),
                    };
                    let r = self.reg(class, &p.name);
                    self.params.push(PtxParam { name: p.name.clone(), ty, bytes: None });
                    self.pro(&format!("ld.param{ty}"), vec![R(r), SymAddr(p.name.clone())]);
                    self.bind(&p.name, Value::Scalar(R(r), s));
                }
                _ => {}
            }
        }
    }

    pub fn bind(&mut self, name: &str, v: Value) {
        self.forget_deferred(name);
        if let Some(s) = self.scopes.last_mut() {
            s.insert(name.to_string(), v);
        }
    }

    pub fn lookup(&self, name: &str) -> Value {
        self.scopes.iter().rev().find_map(|s| s.get(name).cloned()).expect("verified TIR-H: every name is bound")
    }

    /// A parameter of the kernel in a register, loaded once per statement.
    fn param_reg(&mut self, sym: &str, class: RegClass, load: &[&str]) -> Reg {
        if let Some(r) = self.param_cache.get(sym) {
            return *r;
        }
        let r = self.reg(class, sym);
        for (i, op) in load.iter().enumerate() {
            let src = if i == 0 { Operand::SymAddr(sym.to_string()) } else { Operand::Reg(r) };
            let src = if op.starts_with("mov") || op.starts_with("cvta.param") {
                if i == 0 {
                    Operand::Sym(sym.to_string())
                } else {
                    Operand::Reg(r)
                }
            } else {
                src
            };
            self.op(op, vec![Operand::Reg(r), src]);
        }
        self.param_cache.insert(sym.to_string(), r);
        r
    }

    /// A global tensor's pointer, dims and strides, for this statement.
    pub(crate) fn global_regs(&mut self, g: &GlobalVal) -> GlobalRegs {
        let ptr = self.param_reg(&format!("{}_ptr", g.name), RegClass::B64, &["ld.param.u64", "cvta.to.global.u64"]);
        let field = |lw: &mut Self, kind: &str| -> Vec<Reg> {
            (0..g.rank).map(|i| lw.param_reg(&format!("{}_{kind}{i}", g.name), RegClass::B32, &["ld.param.u32"])).collect()
        };
        let dims = match &self.dims_within {
            Some((name, dims)) if *name == g.name => dims.clone(),
            _ => field(self, "dim"),
        };
        let strides = field(self, "stride");
        GlobalRegs { ptr, dims, strides }
    }

    /// The generic address of a tensor's TMA map.
    pub(crate) fn tma_map(&mut self, tensor: &str) -> Reg {
        let sym = self.tma_maps.get(tensor).cloned().expect("scanned: every TMA tensor has a map");
        self.param_reg(&sym, RegClass::B64, &["mov.u64", "cvta.param.u64"])
    }

    /// Drops the deferred index tiles named `name` or reading it: `name` is bound anew.
    fn forget_deferred(&mut self, name: &str) {
        if !self.deferred.is_empty() {
            self.deferred.retain(|(n, e)| n != name && !e.uses(name));
        }
    }

    /// Replaces the binding of `name` where it is bound.
    pub fn rebind(&mut self, name: &str, v: Value) {
        self.forget_deferred(name);
        if let Some(scope) = self.scopes.iter_mut().rev().find(|s| s.contains_key(name)) {
            scope.insert(name.to_string(), v);
        }
    }

    /// The PTX name of a register.
    pub fn reg_name(&self, r: Reg) -> String {
        self.regs[r.id as usize].1.clone()
    }

    pub fn global(&self, name: &str) -> GlobalVal {
        match self.lookup(name) {
            Value::Global(g) => g,
            _ => unreachable!("verified TIR-H: `{name}` is a global tensor"),
        }
    }

    fn block(&mut self, body: &[Stmt]) -> Result<(), CompileError> {
        self.scopes.push(HashMap::new());
        let mut i = 0;
        while i < body.len() {
            let (loads, reductions) = (load_run(&body[i..]), reduction_run(&body[i..]));
            // The runs below are lowered without `stmt`: nothing follows a TMA store across them.
            self.after_tma_store &= loads <= 1 && reductions <= 1;
            let n = if self.zero_then_mma(&body[i..]) {
                self.stmt_start(&body[i]);
                self.stmt(&body[i + 1])?;
                2
            } else if loads > 1 {
                self.loads(&body[i..i + loads])?;
                loads
            } else if reductions > 1 {
                self.reductions(&body[i..i + reductions])?;
                reductions
            } else {
                if let StmtKind::Let { mutable: false, value, .. } = &body[i].kind {
                    if let crate::tirh::ExprKind::Var(n) = &value.kind {
                        self.copy_let = self.mutable_names.contains(n) && writes(&body[i + 1..], n);
                    }
                }
                // A store right before a named barrier's sync needs no warpgroup barrier of its
                // own (`fence_for_mma`): the named one waits for this warpgroup's threads too.
                self.named_sync_follows = matches!(body.get(i + 1).map(|s| &s.kind), Some(StmtKind::NamedBarrier { wait: true, .. }));
                let r = self.stmt(&body[i]);
                self.named_sync_follows = false;
                r?;
                1
            };
            i += n;
        }
        self.scopes.pop();
        Ok(())
    }

    /// On sm_90a, `let mut acc = Tile::zeros();` (or `acc = Tile::zeros();`) right before
    /// `mma_sync(acc, …)`: the accumulator is not filled; the MMA's first step ignores it
    /// instead (wgmma's scale-d = 0). Binds a `let`'s registers and tells `mma` so.
    fn zero_then_mma(&mut self, run: &[Stmt]) -> bool {
        let [first, StmtKind::Mma { acc, .. }, ..] = run.iter().map(|s| &s.kind).collect::<Vec<_>>()[..] else { return false };
        let (name, value) = match first {
            StmtKind::Let { name, mutable: true, value, .. } | StmtKind::Assign { name, value } => (name, value),
            _ => return false,
        };
        let zero =
            matches!(&value.kind, crate::tirh::ExprKind::Full { value, .. } if matches!(value.kind, crate::tirh::ExprKind::Float(0.0)));
        if !self.sm90() || name != acc || !zero {
            return false;
        }
        let Type::Tile(ty) = value.checked_ty() else { return false };
        if !ty.rows.is_multiple_of(64) || !ty.cols.is_multiple_of(8) {
            return false;
        }
        if matches!(first, StmtKind::Let { .. }) {
            let layout = Layout::wgmma(ty.rows, ty.cols);
            let regs = (0..layout.len()).map(|_| self.reg(RegClass::F32, name)).collect();
            self.bind(name, Value::Tile(TileVal { ty, layout, regs }));
        }
        self.mma_zero = true;
        true
    }

    /// Around a loop that issues `mma_sync`s, the accumulators it writes may still be written
    /// (by the last iteration's groups, or by earlier ones on the way back to the loop's head):
    /// a read of one waits first.
    /// Gives the loop's accumulator names (scanned once: pass them back after the loop).
    fn loop_pending(&mut self, body: &[Stmt], accs: Option<Vec<String>>) -> Vec<String> {
        let accs = accs.unwrap_or_else(|| {
            let mut scan = hopper::HopperScan::default();
            hopper::scan(body, &mut scan);
            scan.mma_accs
        });
        for acc in &accs {
            if let Some(Value::Tile(t)) = self.scopes.iter().rev().find_map(|s| s.get(acc.as_str())).cloned() {
                self.pending_accs.extend(t.regs);
            }
        }
        accs
    }

    /// `let`s of independent reductions, reduced in one exchange across warps.
    fn reductions(&mut self, run: &[Stmt]) -> Result<(), CompileError> {
        self.lets_together(
            run,
            |lw, _, value| {
                let crate::tirh::ExprKind::Reduce { op, axis, value } = &value.kind else { unreachable!("a reduction run reduces") };
                Ok((lw.tile(value)?, *op, *axis))
            },
            |lw, tiles| lw.reduce_many(tiles),
        )
    }

    /// `let`s of independent tile loads (each maybe cast), issued together.
    fn loads(&mut self, run: &[Stmt]) -> Result<(), CompileError> {
        self.lets_together(
            run,
            |lw, name, value| {
                // A per-row vector for an accumulator's rows loads in their layout, and so does a
                // whole tile of the accumulator's shape that meets it (a spectrum's factors).
                if let (true, Type::Tile(ty)) = (lw.acc_partners.iter().any(|p| p == name), value.checked_ty()) {
                    lw.layout_hint = Some(if ty.rows.is_multiple_of(64) && ty.cols.is_multiple_of(8) {
                        crate::layout::Layout::wgmma(ty.rows, ty.cols)
                    } else {
                        lw.full_layout(Some(name), ty)
                    });
                }
                let args = lw.load_args(loaded(value).expect("a load run loads"));
                lw.layout_hint = None;
                args
            },
            |lw, args| {
                let tiles = lw.load_group(args);
                run.iter()
                    .zip(tiles)
                    .map(|(s, t)| match &let_parts(s).1.kind {
                        crate::tirh::ExprKind::Cast { to, .. } => lw.cast(t, *to),
                        _ => t,
                    })
                    .collect()
            },
        )
    }

    /// Lowers a run of `let`s together: `each` takes a value's operands (after its statement's
    /// comment), `all` the whole run's; each result is bound to its name.
    fn lets_together<A>(
        &mut self, run: &[Stmt], each: impl Fn(&mut Self, &str, &crate::tirh::Expr) -> Result<A, CompileError>,
        all: impl FnOnce(&mut Self, Vec<A>) -> Vec<TileVal>,
    ) -> Result<(), CompileError> {
        let mut parts = Vec::with_capacity(run.len());
        for s in run {
            self.stmt_start(s);
            let (name, value) = let_parts(s);
            parts.push(each(self, name, value)?);
        }
        for (s, t) in run.iter().zip(all(self, parts)) {
            self.bind(let_parts(s).0, Value::Tile(t));
        }
        Ok(())
    }

    /// What every statement starts with: its source line as a comment, fresh caches.
    fn stmt_start(&mut self, s: &Stmt) {
        let file = self.ir.file.rsplit('/').next().unwrap_or(&self.ir.file).to_string();
        self.layouts.clear();
        self.param_cache.clear();
        self.body.push(Inst::Comment(format!("{file}:{}  {}", s.loc.line, s.text)));
        self.line = s.loc.line;
    }

    fn stmt(&mut self, s: &Stmt) -> Result<(), CompileError> {
        // An `#[unroll]` copy (a scope always entered) runs straight on from what came before.
        // (So is a branch on literals alone that holds, as an unrolled loop's guard.)
        let scope = matches!(&s.kind, StmtKind::If { cond, otherwise, .. }
            if scalar::literal_value(cond) == Some(1) && otherwise.is_empty());
        if scope {
            return self.stmt_kind(s);
        }
        let tma_store = matches!(s.kind, StmtKind::TmaStore { .. });
        self.tma_store_chained = tma_store && self.after_tma_store;
        self.after_tma_store = false;
        let r = self.stmt_kind(s);
        // After a compound statement (a loop that may run no times, a branch) nothing follows
        // straight on.
        self.after_tma_store = tma_store;
        r
    }

    fn stmt_kind(&mut self, s: &Stmt) -> Result<(), CompileError> {
        self.stmt_start(s);
        if let Some(r) = self.hopper_stmt(s) {
            return r;
        }
        match &s.kind {
            StmtKind::Let { name, mutable, value, .. } => {
                let mut v = match (&value.kind, value.checked_ty()) {
                    (crate::tirh::ExprKind::Full { .. }, Type::Tile(ty)) => {
                        let layout = self.full_layout(Some(name), ty);
                        Value::Tile(self.full(value, ty, layout)?)
                    }
                    // A per-row vector loaded for an accumulator's rows: in their layout; so is
                    // a whole tile of the accumulator's shape read from shared memory to meet it
                    // (a spectrum's factors kept there).
                    (_, Type::Tile(ty)) if self.acc_partners.iter().any(|p| p == name) => {
                        let whole = ty.rows.is_multiple_of(64) && ty.cols.is_multiple_of(8);
                        self.layout_hint = Some(if whole && smem_loaded(value) {
                            crate::layout::Layout::wgmma(ty.rows, ty.cols)
                        } else {
                            self.full_layout(Some(name), ty)
                        });
                        let v = self.expr(value);
                        self.layout_hint = None;
                        v?
                    }
                    _ => self.expr(value)?,
                };
                if *mutable || std::mem::take(&mut self.copy_let) {
                    v = self.copy(&v, name);
                }
                if *mutable {
                    self.mutable_names.insert(name.clone());
                }
                self.bind(name, v);
                if !*mutable && matches!(value.checked_ty(), Type::Tile(_)) && tile::index_like(value, &self.deferred) {
                    self.deferred.push((name.clone(), std::rc::Rc::new(value.clone())));
                }
            }
            StmtKind::Assign { name, value } => {
                let target = self.lookup(name);
                // `acc = Tile::zeros()` fills the binding's registers in its own layout.
                let v = match (&value.kind, &target) {
                    (crate::tirh::ExprKind::Full { .. }, Value::Tile(t)) => Value::Tile(self.full(value, t.ty, t.layout)?),
                    _ => self.expr(value)?,
                };
                self.assign(&target, v);
            }
            StmtKind::Prefetch(load) => {
                let (g, idx, ty, _, _) = self.load_args(load)?;
                self.prefetch(&g, &idx, ty, crate::layout::Layout::blocked(ty.rows, ty.cols));
            }
            StmtKind::FetchAdd { name, tensor, index, value, inc } => {
                let g = self.global(tensor);
                let idx = index.iter().map(|e| self.scalar(e)).collect::<Result<Vec<_>, _>>()?;
                let v = self.scalar(value)?;
                match name {
                    Some(name) => {
                        let old = self.fetch_add(&g, &idx, v, *inc);
                        self.bind(name, Value::Scalar(Operand::Reg(old), crate::dtype::ScalarType::I32));
                    }
                    None => self.add_release(&g, &idx, v, *inc),
                }
            }
            StmtKind::WaitNonzero { name, tensor, index } => {
                let g = self.global(tensor);
                let idx = index.iter().map(|e| self.scalar(e)).collect::<Result<Vec<_>, _>>()?;
                let v = self.wait_nonzero(&g, &idx);
                self.bind(name, Value::Scalar(Operand::Reg(v), crate::dtype::ScalarType::I32));
            }
            StmtKind::AtomicAdd { tensor, index, value, max } => {
                let g = self.global(tensor);
                let idx = index.iter().map(|e| self.scalar(e)).collect::<Result<Vec<_>, _>>()?;
                // `atomic_add(…, col_sum(x))`, `atomic_max(…, col_max(x))`: the atomic combines
                // as the reduction does, so each warp's partial goes to it as it is — no
                // exchange across the warps (two barriers) first.
                let want = if *max { crate::tirh::ReduceOp::Max } else { crate::tirh::ReduceOp::Sum };
                if let crate::tirh::ExprKind::Reduce { op, axis: 0, value: inner } = &value.kind {
                    if *op == want {
                        let t = self.tile(inner)?;
                        let t = match self.reduce_scatter(t, *op) {
                            Ok(sc) => {
                                self.atomic_add_scattered(&g, &idx, &sc, *max);
                                return Ok(());
                            }
                            Err(t) => t,
                        };
                        let (t, writers) = self.reduce_per_warp(t, *op);
                        self.atomic_add(&g, &idx, &t, *max, writers);
                        return Ok(());
                    }
                }
                let t = self.tile(value)?;
                self.atomic_add(&g, &idx, &t, *max, None);
            }
            StmtKind::Store { tensor, index, value, within } => {
                let g = self.global(tensor);
                let idx = index.iter().map(|e| self.scalar(e)).collect::<Result<Vec<_>, _>>()?;
                let t = self.tile(value)?;
                if let Some(ends) = within {
                    // The tensor's dims, clamped to [0, end], stand in for it in this store.
                    let gr = self.global_regs(&g);
                    let mut dims = Vec::with_capacity(ends.len());
                    for (e, &d) in ends.iter().zip(&gr.dims) {
                        let v = self.scalar(e)?;
                        let v = self.in_reg(v, ScalarType::I32, "end");
                        let r = self.reg(RegClass::B32, "within");
                        self.op("min.s32", vec![Operand::Reg(r), Operand::Reg(d), Operand::Reg(v)]);
                        self.op("max.s32", vec![Operand::Reg(r), Operand::Reg(r), Operand::Imm(0)]);
                        dims.push(r);
                    }
                    self.dims_within = Some((g.name.clone(), dims));
                }
                self.store(&g, &idx, &t);
                self.dims_within = None;
            }
            StmtKind::For { var, start, end, step, body } => {
                let accs = self.loop_pending(body, None);
                self.for_loop(var, start, end, step, body)?;
                self.loop_pending(body, Some(accs));
            }
            StmtKind::QueueFor { var, queue, total, body } => {
                let accs = self.loop_pending(body, None);
                self.queue_for(var, queue, total.as_ref(), body)?;
                self.loop_pending(body, Some(accs));
            }
            StmtKind::While { cond, body } => {
                let accs = self.loop_pending(body, None);
                self.while_loop(cond, body)?;
                self.loop_pending(body, Some(accs));
            }
            StmtKind::If { cond, then, otherwise } => {
                if let Some(c) = scalar::literal_value(cond) {
                    // Literals alone (an unrolled loop's guard, a scope): the way taken, alone.
                    return self.block(if c != 0 { then } else { otherwise });
                }
                // (A variable bound to a constant is branched on: lowered one way only, the
                // reverse scan's chunk index became affine in its loop counter and ptxas
                // spilled it.)
                let p = self.scalar(cond)?;
                let p = self.in_reg(p, ScalarType::Bool, "cond");
                let (l_else, l_end) = (self.label("else"), self.label("endif"));
                self.op_if(p, true, "bra.uni", vec![Operand::Sym(l_else.clone())]);
                self.block(then)?;
                self.op("bra.uni", vec![Operand::Sym(l_end.clone())]);
                self.body.push(Inst::Label(l_else));
                self.block(otherwise)?;
                self.body.push(Inst::Label(l_end));
            }
            _ => unreachable!("Hopper statements are lowered by hopper_stmt"),
        }
        Ok(())
    }

    /// `while cond { body }`: the test at the head, a uniform branch out.
    fn while_loop(&mut self, cond: &crate::tirh::Expr, body: &[Stmt]) -> Result<(), CompileError> {
        use Operand::Sym;
        let (head, exit) = (self.label("while"), self.label("endwhile"));
        self.body.push(Inst::Label(head.clone()));
        let p = self.scalar(cond)?;
        let p = self.in_reg(p, ScalarType::Bool, "cond");
        self.op_if(p, true, "bra.uni", vec![Sym(exit.clone())]);
        self.scopes.push(HashMap::new());
        self.block(body)?;
        self.scopes.pop();
        self.op("bra.uni", vec![Sym(head)]);
        self.body.push(Inst::Label(exit));
        Ok(())
    }

    fn for_loop(
        &mut self, var: &str, start: &crate::tirh::Expr, end: &crate::tirh::Expr, step: &crate::tirh::Expr, body: &[Stmt],
    ) -> Result<(), CompileError> {
        use Operand::{Reg as R, Sym};
        let i = self.reg(RegClass::B32, var);
        let s = self.scalar(start)?;
        self.op("mov.b32", vec![R(i), s]);
        let e = self.scalar(end)?;
        let e = self.in_reg(e, ScalarType::I32, "end");
        let step = self.scalar(step)?;
        let step = match step {
            Operand::Imm(v) => Operand::Imm(v),
            other => Operand::Reg(self.in_reg(other, ScalarType::I32, "step")),
        };
        let (head, exit) = (self.label("for"), self.label("endfor"));
        let p = self.reg(RegClass::Pred, "done");
        self.body.push(Inst::Label(head.clone()));
        self.op("setp.ge.s32", vec![R(p), R(i), R(e)]);
        self.op_if(p, false, "bra.uni", vec![Sym(exit.clone())]);
        self.scopes.push(HashMap::new());
        self.bind(var, Value::Scalar(R(i), ScalarType::I32));
        self.block(body)?;
        self.scopes.pop();
        self.op("add.s32", vec![R(i), R(i), step]);
        self.op("bra.uni", vec![Sym(head)]);
        self.body.push(Inst::Label(exit));
        Ok(())
    }

    /// A copy of `v` in fresh registers, for a mutable binding.
    fn copy(&mut self, v: &Value, name: &str) -> Value {
        match v {
            Value::Scalar(op, s) => {
                let class = scalar_class(*s);
                let r = self.reg(class, name);
                self.op(mov_for(class), vec![Operand::Reg(r), op.clone()]);
                Value::Scalar(Operand::Reg(r), *s)
            }
            Value::Tile(t) => {
                let regs: Vec<Reg> = t
                    .regs
                    .iter()
                    .map(|&src| {
                        let r = self.reg(src.class, name);
                        self.op(mov_for(src.class), vec![Operand::Reg(r), Operand::Reg(src)]);
                        r
                    })
                    .collect();
                Value::Tile(TileVal { regs, ..t.clone() })
            }
            _ => v.clone(),
        }
    }

    /// Moves `v` into the registers of the mutable binding `target`.
    fn assign(&mut self, target: &Value, v: Value) {
        match (target, v) {
            (Value::Scalar(Operand::Reg(dst), s), Value::Scalar(src, _)) => {
                self.op(mov_for(scalar_class(*s)), vec![Operand::Reg(*dst), src]);
            }
            (Value::Tile(dst), Value::Tile(src)) => {
                let src = self.convert(src, dst.layout);
                for (&d, &s) in dst.regs.iter().zip(&src.regs) {
                    self.op(mov_for(d.class), vec![Operand::Reg(d), Operand::Reg(s)]);
                }
            }
            _ => unreachable!("verified TIR-H: assignments keep their binding's type"),
        }
    }

    /// The per-thread registers of `layout`, computed where first needed in a statement and
    /// reused within it. Computing them at the point of use keeps them out of every other
    /// warpgroup's live ranges (a producer at 40 registers would spill them); ptxas hoists them
    /// out of loops.
    pub fn layout_regs(&mut self, l: Layout) -> LayoutRegs {
        if let Some((_, r)) = self.layouts.iter().find(|(k, _)| *k == l) {
            return *r;
        }
        use Operand::{Imm, Reg as R};
        let log2 = |x: u32| i64::from(x.trailing_zeros());
        let b = |lw: &mut Self, h: &str| lw.reg(RegClass::B32, h);
        let (lc, lr, wc, wr) = (b(self, "lc"), b(self, "lr"), b(self, "wc"), b(self, "wr"));
        let (urow, ucol) = (b(self, "urow"), b(self, "ucol"));
        let (lane, warp) = (self.lane, self.warp);
        match l.kind {
            LayoutKind::Blocked { v, tc, tr, wc: nwc, .. } => {
                self.op("and.b32", vec![R(lc), R(lane), Imm(i64::from(tc - 1))]);
                self.op("shr.u32", vec![R(lr), R(lane), Imm(log2(tc))]);
                self.op("and.b32", vec![R(wc), R(warp), Imm(i64::from(nwc - 1))]);
                self.op("shr.u32", vec![R(wr), R(warp), Imm(log2(nwc))]);
                // urow = lr + wr * tr;  ucol = (lc + wc * tc) * v
                self.op("shl.b32", vec![R(urow), R(wr), Imm(log2(tr))]);
                self.op("add.u32", vec![R(urow), R(urow), R(lr)]);
                self.op("shl.b32", vec![R(ucol), R(wc), Imm(log2(tc))]);
                self.op("add.u32", vec![R(ucol), R(ucol), R(lc)]);
                self.op("shl.b32", vec![R(ucol), R(ucol), Imm(log2(v))]);
            }
            LayoutKind::Wgmma { .. } => {
                // Thread (w, g, t) holds row 16w + g and columns 2t, 2t + 1 of each 8.
                self.op("and.b32", vec![R(lc), R(lane), Imm(3)]);
                self.op("shr.u32", vec![R(lr), R(lane), Imm(2)]);
                self.op("mov.u32", vec![R(wc), Imm(0)]);
                self.op("mov.u32", vec![R(wr), R(warp)]);
                self.op("shl.b32", vec![R(urow), R(warp), Imm(4)]);
                self.op("add.u32", vec![R(urow), R(urow), R(lr)]);
                self.op("shl.b32", vec![R(ucol), R(lc), Imm(1)]);
            }
        }
        let (row, col) = (b(self, "row"), b(self, "col"));
        // The base modulo the extent, a power of two where the footprint replicates the tile;
        // a width that is not a power of two is a multiple of the footprint: no modulo.
        let (fr, fc) = (l.footprint_rows(), l.footprint_cols());
        for (dst, u, keep, extent, foot) in [(row, urow, l.keep_rows, l.parent_rows, fr), (col, ucol, l.keep_cols, l.parent_cols, fc)] {
            if !keep {
                self.op("mov.u32", vec![R(dst), Imm(0)]);
            } else if foot > extent || extent.is_power_of_two() {
                self.op("and.b32", vec![R(dst), R(u), Imm(i64::from(extent - 1))]);
            } else {
                self.op("mov.u32", vec![R(dst), R(u)]);
            }
        }
        let p = |lw: &mut Self, h: &str| lw.reg(RegClass::Pred, h);
        let (row_owner, col_owner, owner) = (p(self, "row_owner"), p(self, "col_owner"), p(self, "owner"));
        for (dst, u, keep, extent) in [(row_owner, urow, l.keep_rows, l.parent_rows), (col_owner, ucol, l.keep_cols, l.parent_cols)] {
            let bound = if keep { extent } else { 1 };
            self.op("setp.lt.u32", vec![R(dst), R(u), Imm(i64::from(bound))]);
        }
        self.op("and.pred", vec![R(owner), R(row_owner), R(col_owner)]);
        let regs = LayoutRegs { row, col, lc, lr, wc, wr, row_owner, col_owner, owner };
        self.layouts.push((l, regs));
        regs
    }

    fn finish(mut self) -> PtxKernel {
        use Operand::{Imm, Reg as R, Sym};
        self.finish_hopper();
        let bytes = self.scratch_bytes;
        let (scratch, wg) = (self.scratch, self.wg);
        if bytes > 0 {
            self.pro("mov.u32", vec![R(scratch), Sym(SCRATCH.into())]);
            self.pro("mad.lo.u32", vec![R(scratch), R(wg), Imm(i64::from(bytes)), R(scratch)]);
        } else {
            self.pro("mov.u32", vec![R(scratch), Imm(0)]);
        }
        if let Some(x) = self.xchg {
            self.pro("mov.u32", vec![R(x), Sym(SCRATCH.into())]);
            self.pro("add.u32", vec![R(x), R(x), Imm(i64::from(bytes * self.ir.warpgroups))]);
        }
        let mut body = std::mem::take(&mut self.prologue);
        body.insert(0, Inst::Comment("prologue: thread indices, parameters, layouts".into()));
        body.append(&mut self.body);
        body.push(Inst::Op { pred: None, op: "ret".into(), args: vec![] });
        PtxKernel {
            name: self.ir.name.clone(),
            params: self.params,
            threads: self.ir.warpgroups * 128,
            shared_bytes: bytes * self.ir.warpgroups + self.xchg_bytes,
            // The base is rounded up to 1024 at run time: ask for that much more.
            dynamic_shared_bytes: if self.dyn_bytes > 0 { self.dyn_bytes + 1024 } else { 0 },
            min_ctas_per_sm: self.ir.blocks_per_sm.max(u32::from(self.uses_setmaxnreg)),
            tma: Vec::new(),
            regs: self.regs,
            body,
        }
    }
}

/// The register class holding a scalar type.
pub(crate) fn scalar_class(s: ScalarType) -> RegClass {
    match s {
        ScalarType::F32 => RegClass::F32,
        ScalarType::I32 => RegClass::B32,
        ScalarType::Bool => RegClass::Pred,
    }
}

/// The register class holding a tile element.
pub(crate) fn elem_class(d: DType) -> RegClass {
    match d {
        DType::F32 => RegClass::F32,
        // An fp8 code sits in the low byte of a 16-bit register, the high byte 0.
        DType::BF16 | DType::F16 | DType::F8E4M3 | DType::F8E5M2 => RegClass::B16,
        DType::I32 => RegClass::B32,
    }
}

/// The type suffix that moves one element of `es` bytes: `b16`, `b32`; a byte as `u8`, loaded
/// zero-extended into its 16-bit register.
pub(crate) fn bits(es: u32) -> String {
    if es == 1 {
        "u8".into()
    } else {
        format!("b{}", es * 8)
    }
}

/// The `mov` for a register class.
pub(crate) fn mov_for(c: RegClass) -> &'static str {
    match c {
        RegClass::Pred => "mov.pred",
        RegClass::B16 => "mov.b16",
        RegClass::B32 => "mov.b32",
        RegClass::F32 => "mov.f32",
        RegClass::B64 => "mov.b64",
    }
}

/// The name and value of a `let` in a run (runs hold only `let`s).
fn let_parts(s: &Stmt) -> (&str, &crate::tirh::Expr) {
    let StmtKind::Let { name, value, .. } = &s.kind else { unreachable!("a run holds `let`s") };
    (name, value)
}

/// The load of `let x = load` or `let x = load.cast()`.
fn loaded(e: &crate::tirh::Expr) -> Option<&crate::tirh::Expr> {
    use crate::tirh::ExprKind;
    match &e.kind {
        ExprKind::Load { .. } => Some(e),
        ExprKind::Cast { value, .. } if matches!(value.kind, ExprKind::Load { .. }) => Some(value),
        _ => None,
    }
}

/// Whether `e` reads shared memory (`view.load()`, maybe cast).
fn smem_loaded(e: &crate::tirh::Expr) -> bool {
    use crate::tirh::ExprKind;
    match &e.kind {
        ExprKind::SmemLoad(_) => true,
        ExprKind::Cast { value, .. } => matches!(value.kind, ExprKind::SmemLoad(_)),
        _ => false,
    }
}

/// How many statements from the first are `let`s of tile loads (maybe cast) whose indices do
/// not use the names the earlier ones bind: those can be issued together.
fn load_run(body: &[Stmt]) -> usize {
    independent_run(body, loaded)
}

/// How many statements from the first are `let`s of reductions (`let a = row_sum(x);`) whose
/// operands do not use the names the earlier ones bind: those can share one exchange.
fn reduction_run(body: &[Stmt]) -> usize {
    independent_run(body, |value| match &value.kind {
        crate::tirh::ExprKind::Reduce { value, .. } => Some(value),
        _ => None,
    })
}

/// How many statements from the first are immutable `let`s whose value `pick` accepts, the
/// part it picks using none of the names the earlier ones bind.
fn independent_run(body: &[Stmt], pick: impl Fn(&crate::tirh::Expr) -> Option<&crate::tirh::Expr>) -> usize {
    let mut bound: Vec<String> = Vec::new();
    for s in body {
        let StmtKind::Let { name, mutable: false, value, .. } = &s.kind else { break };
        let Some(operand) = pick(value) else { break };
        if bound.iter().any(|b| operand.uses(b)) {
            break;
        }
        bound.push(name.clone());
    }
    bound.len()
}

/// Whether a statement of `body` (or of a block inside one) writes the binding `n` in place:
/// an assignment, an MMA into it, a tuple assigned to it.
fn writes(body: &[Stmt], n: &str) -> bool {
    body.iter().any(|s| match &s.kind {
        StmtKind::Assign { name, .. } => name == n,
        StmtKind::Mma { acc, .. } => acc == n,
        StmtKind::Unpack { names, assign: true, .. } => names.iter().any(|(m, _)| m == n),
        StmtKind::For { body, .. } | StmtKind::QueueFor { body, .. } | StmtKind::While { body, .. } => writes(body, n),
        StmtKind::If { then, otherwise, .. } => writes(then, n) || writes(otherwise, n),
        _ => false,
    })
}
