//! Hopper pieces: dynamic shared memory, mbarrier pipelines, TMA loads, `wgmma` and
//! `setmaxnreg`. Instruction forms follow the device-verified examples in
//! `shared/ptx-examples` (`mbarrier_ring.ptx`'s `ring_gemm`, `tma_load_128B.ptx`).
//!
//! Shared memory: rings are placed in order from a 1024-aligned base (the dynamic window's
//! start rounded up at run time, with 1 KiB requested extra), each 1024-aligned; mbarriers
//! follow. Thread 0 initializes every barrier in the prologue, then the block syncs.
//!
//! Pipelines: each role keeps `(stage, phase)` in registers, starting at `(0, 0)`. The producer's
//! `acquire` waits on `empty[stage]` with parity `phase ^ 1` (its first lap passes), a consumer's
//! `wait` on `full[stage]` with parity `phase`; both advance. `commit(s)` arrives on stage `s`'s
//! full barrier: one thread per warpgroup (its thread 0) issues TMA, `expect_tx` and that
//! arrival. `release(s)` arrives on its empty barrier once per consumer *warp* (lane 0, after
//! the warp's `bar.warp.sync`), the barrier counting four a consumer warpgroup: consumers that
//! read a stage with plain loads keep no warpgroup in step, and a leader's lone arrival let a
//! slower warp read a stage already refilled, or poll a parity passed twice (session 40's
//! selective-scan backward, H200).
//!
//! For sm_80 each statement here defers to the `ampere` lowering: cp.async instead of TMA,
//! `mma.sync` instead of wgmma, `test_wait` instead of `try_wait`.

use super::{Lowerer, TileVal, Value};
use crate::error::CompileError;
use crate::layout::{Layout, Slot};
use crate::tirh::{Expr, ExprKind, SmemType, SourceLoc, Stmt, StmtKind, TileType, Type};
use crate::tirt::{Inst, Operand, Reg, RegClass};

/// The dynamic shared-memory symbol.
pub const DYN_SMEM: &str = "tessera_dyn";

pub use crate::tirt::TmaUse;

/// A ring of full and empty mbarriers (a pipeline's, a tile queue's) and the thread's
/// `(stage, phase)` in it.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Ring {
    /// Byte offsets of the full and empty barriers from the dynamic base.
    pub full: u32,
    pub empty: u32,
    pub stages: u32,
    pub stage: Reg,
    pub phase: Reg,
}

/// A shared view: its shared address and the ring stage it belongs to.
#[derive(Clone, Debug)]
pub(crate) struct ViewVal {
    pub addr: Reg,
    pub stage: Operand,
    pub ty: SmemType,
    pub rows: u32,
}

/// The A operand of an `mma_sync`: a shared view, or register fragments (per 64-row block
/// and k16 step, four packed registers).
pub(crate) enum MmaA {
    Smem(ViewVal),
    Regs(Vec<[Reg; 4]>),
}

/// The encoded descriptor advance (bytes / 16) of k16 step `kk` along a K-major tile of
/// `ty` whose panels hold `rows` rows: 32 bytes a step, the next panel every span.
fn k_major_step(ty: &SmemType, kk: u32, rows: u32) -> i64 {
    i64::from(k_major_bytes(ty, kk, rows) / 16)
}

/// The byte offset of k16 step `kk` along a K-major tile of `ty` whose panels hold `rows`
/// rows.
pub(crate) fn k_major_bytes(ty: &SmemType, kk: u32, rows: u32) -> u32 {
    let per_panel = ty.pitch() / 32;
    (kk / per_panel) * rows * ty.pitch() + 32 * (kk % per_panel)
}

/// What the kernel uses, found before lowering.
#[derive(Default)]
pub(crate) struct HopperScan {
    pub tma: Vec<(String, TmaUse, SourceLoc)>,
    pub mma_accs: Vec<String>,
    pub any_mma: bool,
    /// The rings an `mma_sync` reads: a register tile stored into one is fenced for the async
    /// proxy and the warpgroup synced before anything else runs.
    pub mma_rings: Vec<String>,
}

/// The ring a shared view expression names (`ring.at(s)`, `ring.at(s).rows(r, n)`).
pub(crate) fn ring_of(e: &Expr) -> Option<&str> {
    match &e.kind {
        ExprKind::SmemAt { ring, .. } => Some(ring),
        ExprKind::SmemRows { view, .. } | ExprKind::SmemCols { view, .. } => ring_of(view),
        _ => None,
    }
}

/// The columns of each box a `tma::load` into an unswizzled view whose rows are wider than a
/// TMA box's 256 elements copies it in: the widest divisor of the row of at most 256 elements
/// and a multiple of 16 bytes, each box one row (a box of several rows would land box-major,
/// not in the view's row-major order). `None` for rows that fit one box, and for swizzled
/// views (their panels are the boxes).
pub fn wide_row_box(cols: u32, swizzle: u32, dtype: crate::DType) -> Option<u32> {
    if swizzle > 0 || cols <= 256 {
        return None;
    }
    (1..=256).rev().find(|&c| cols.is_multiple_of(c) && (c * dtype.size()).is_multiple_of(16))
}

pub(crate) fn scan(body: &[Stmt], out: &mut HopperScan) {
    for s in body {
        match &s.kind {
            StmtKind::TmaLoad { dst, tensor, .. } => {
                if let Some(Type::SmemView { rows, cols, swizzle, dtype }) = dst.ty {
                    // One box per 128-byte panel of a wide row; an unswizzled row wider than a
                    // box's 256 elements as boxes of one row ([`wide_row_box`]).
                    let (rows, cols) = match wide_row_box(cols, swizzle, dtype) {
                        Some(bc) => (1, bc),
                        None if swizzle > 0 => (rows, cols.min(swizzle / dtype.size())),
                        None => (rows, cols),
                    };
                    out.tma.push((tensor.clone(), TmaUse { rows, cols, swizzle }, s.loc));
                }
            }
            StmtKind::TmaStore { tensor, src, flat: false, .. } => {
                if let Some(Type::SmemView { rows, cols, swizzle, dtype }) = src.ty {
                    let cols = if swizzle > 0 { cols.min(swizzle / dtype.size()) } else { cols };
                    out.tma.push((tensor.clone(), TmaUse { rows, cols, swizzle }, s.loc));
                }
            }
            StmtKind::Mma { acc, a, b, .. } => {
                out.mma_accs.push(acc.clone());
                out.any_mma = true;
                out.mma_rings.extend([a, b].into_iter().filter_map(ring_of).map(str::to_string));
            }
            StmtKind::For { body, .. } | StmtKind::QueueFor { body, .. } | StmtKind::While { body, .. } => scan(body, out),
            StmtKind::If { then, otherwise, .. } => {
                scan(then, out);
                scan(otherwise, out);
            }
            _ => {}
        }
    }
}

/// The names bound or assigned from values computed from an accumulator (`mma_accs`), directly
/// or through other such names: a per-row vector among them (the running max of an online
/// softmax, say) lives in the accumulator's row layout, so that it meets its accumulator
/// without moving.
pub(crate) fn acc_derived(body: &[Stmt], accs: &[String]) -> Vec<String> {
    fn defs<'a>(body: &'a [Stmt], out: &mut Vec<(&'a str, &'a Expr)>) {
        for s in body {
            match &s.kind {
                StmtKind::Let { name, value, .. } | StmtKind::Assign { name, value } => out.push((name, value)),
                StmtKind::For { body, .. } | StmtKind::QueueFor { body, .. } | StmtKind::While { body, .. } => defs(body, out),
                StmtKind::If { then, otherwise, .. } => {
                    defs(then, out);
                    defs(otherwise, out);
                }
                _ => {}
            }
        }
    }
    let mut all = Vec::new();
    defs(body, &mut all);
    let mut derived: Vec<String> = accs.to_vec();
    loop {
        let before = derived.len();
        for &(name, value) in &all {
            if !derived.iter().any(|d| d == name) && derived.iter().any(|d| value.uses(d)) {
                derived.push(name.to_string());
            }
        }
        if derived.len() == before {
            return derived;
        }
    }
}

/// The names bound by `let` to a layout-free value (a load, say: [`super::tile::layout_free`])
/// that a value computed from an accumulator (`derived`, from [`acc_derived`]) uses: a per-row
/// vector among them (a row's log-sum-exp loaded before a loop, say) is loaded straight into the
/// accumulator's row layout, so that it meets the accumulator without moving through shared
/// memory at each use.
pub(crate) fn acc_partners(body: &[Stmt], derived: &[String]) -> Vec<String> {
    fn walk<'a>(body: &'a [Stmt], lets: &mut Vec<&'a str>, defs: &mut Vec<&'a Expr>) {
        for s in body {
            match &s.kind {
                StmtKind::Let { name, value, .. } => {
                    if super::tile::layout_free(value) {
                        lets.push(name);
                    }
                    defs.push(value);
                }
                StmtKind::Assign { value, .. } => defs.push(value),
                // A register A operand computed in place: `mma_sync_kn(dq, (p * (dp − d)).cast(), …)`.
                StmtKind::Mma { a, .. } => defs.push(a),
                StmtKind::For { body, .. } | StmtKind::QueueFor { body, .. } | StmtKind::While { body, .. } => walk(body, lets, defs),
                StmtKind::If { then, otherwise, .. } => {
                    walk(then, lets, defs);
                    walk(otherwise, lets, defs);
                }
                _ => {}
            }
        }
    }
    let (mut lets, mut defs) = (Vec::new(), Vec::new());
    walk(body, &mut lets, &mut defs);
    let computed: Vec<&Expr> = defs.into_iter().filter(|v| derived.iter().any(|d| v.uses(d))).collect();
    lets.into_iter().filter(|l| !derived.iter().any(|d| d == l) && computed.iter().any(|v| v.uses(l))).map(str::to_string).collect()
}

fn align(x: u32, a: u32) -> u32 {
    x.div_ceil(a) * a
}

impl Lowerer<'_> {
    /// The 1024-aligned base of dynamic shared memory, computed once in the prologue.
    pub(crate) fn dyn_base(&mut self) -> Reg {
        if let Some(b) = self.dyn_base {
            return b;
        }
        use Operand::{Imm, Reg as R, Sym};
        let b = self.reg(RegClass::B32, "smem");
        self.pro("mov.u32", vec![R(b), Sym(DYN_SMEM.into())]);
        self.pro("add.u32", vec![R(b), R(b), Imm(1023)]);
        self.pro("and.b32", vec![R(b), R(b), Imm(-1024)]);
        self.dyn_base = Some(b);
        b
    }

    /// Lowers a Hopper expression, or gives `None` for other expressions.
    pub(crate) fn hopper_expr(&mut self, e: &Expr) -> Option<Result<Value, CompileError>> {
        use Operand::{Imm, Reg as R};
        Some(Ok(match &e.kind {
            ExprKind::SmemRing(t) => {
                // 1024-aligned, swizzled or not (unswizzled rings at 128 moved the fast backward's
                // `sdsum` and mbarriers 512 bytes and it ran 2-7% slower, runs 233-234).
                let off = align(self.dyn_bytes, 1024);
                self.dyn_bytes = off + t.stage_bytes() * t.stages;
                Value::Smem(off, *t)
            }
            ExprKind::PipelineNew { stages, consumers } => {
                // sm_90a: the producer's leader arrives once (TMA counts bytes); sm_80: each of
                // the producer's 128 threads arrives when its cp.async copies land.
                // The empty barrier: each consumer warp's lane 0 arrives (`release`).
                let full_count = if self.sm90() { 1 } else { 128 };
                Value::Pipe(self.barrier_ring(*stages, full_count, 4 * *consumers))
            }
            ExprKind::QueueNew { stages, consumers, counter } => self.queue_new(*stages, *consumers, counter),
            ExprKind::SmemAt { ring, stage } => {
                let Value::Smem(off, ty) = self.lookup(ring) else { unreachable!("verified TIR-H: `{ring}` is a ring") };
                let st = match self.scalar(stage) {
                    Ok(s) => s,
                    Err(err) => return Some(Err(err)),
                };
                let base = self.dyn_base();
                let addr = self.reg(RegClass::B32, &format!("{ring}_at"));
                let st_reg = self.in_reg(st.clone(), crate::dtype::ScalarType::I32, "stage");
                self.op("mad.lo.u32", vec![R(addr), R(st_reg), Imm(i64::from(ty.stage_bytes())), R(base)]);
                self.op("add.u32", vec![R(addr), R(addr), Imm(i64::from(off))]);
                Value::View(ViewVal { addr, stage: st, ty, rows: ty.rows })
            }
            ExprKind::SmemRows { view, start, rows } => {
                let v = match self.expr(view) {
                    Ok(Value::View(v)) => v,
                    Ok(_) => unreachable!("verified TIR-H: a view"),
                    Err(err) => return Some(Err(err)),
                };
                let s = match self.scalar(start) {
                    Ok(s) => s,
                    Err(err) => return Some(Err(err)),
                };
                let s = self.in_reg(s, crate::dtype::ScalarType::I32, "row0");
                let addr = self.reg(RegClass::B32, "rows_at");
                self.op("mad.lo.u32", vec![R(addr), R(s), Imm(i64::from(v.ty.pitch())), R(v.addr)]);
                Value::View(ViewVal { addr, rows: *rows, ..v })
            }
            ExprKind::SmemCols { view, start, cols } => {
                let v = match self.expr(view) {
                    Ok(Value::View(v)) => v,
                    Ok(_) => unreachable!("verified TIR-H: a view"),
                    Err(err) => return Some(Err(err)),
                };
                // Whole panels (verified): panel p starts p × rows × pitch bytes in, and the
                // panels from `start` on are laid out as a ring `cols` wide. Unswizzled: a run
                // of one row's columns (verified), `start` elements in.
                let off = if v.ty.swizzle == 0 { start * v.ty.dtype.size() } else { start / v.ty.panel_cols() * v.ty.rows * v.ty.pitch() };
                let addr = self.reg(RegClass::B32, "cols_at");
                self.op("add.u32", vec![R(addr), R(v.addr), Imm(i64::from(off))]);
                Value::View(ViewVal { addr, ty: SmemType { cols: *cols, ..v.ty }, ..v })
            }
            ExprKind::PipeStage { pipe, producer } => {
                let Value::Pipe(p) = self.lookup(pipe) else { unreachable!("verified TIR-H: `{pipe}` is a pipeline") };
                self.ring_wait(p, *producer);
                let s = self.reg(RegClass::B32, "s");
                self.op("mov.b32", vec![R(s), R(p.stage)]);
                self.ring_advance(p);
                Value::Scalar(R(s), crate::dtype::ScalarType::I32)
            }
            _ => return None,
        }))
    }

    /// Allocates `stages` full barriers expecting `full_count` arrivals and as many empty ones
    /// expecting `empty_count`, initialized in the prologue; the thread's state starts at
    /// `(0, 0)`.
    pub(crate) fn barrier_ring(&mut self, stages: u32, full_count: u32, empty_count: u32) -> Ring {
        use Operand::{Imm, Reg as R};
        let full = align(self.dyn_bytes, 8);
        let empty = full + 8 * stages;
        self.dyn_bytes = empty + 8 * stages;
        let base = self.dyn_base();
        self.barrier_inits.push((base, full, stages, full_count));
        self.barrier_inits.push((base, empty, stages, empty_count));
        let (stage, phase) = (self.reg(RegClass::B32, "stage"), self.reg(RegClass::B32, "phase"));
        self.pro("mov.u32", vec![R(stage), Imm(0)]);
        self.pro("mov.u32", vec![R(phase), Imm(0)]);
        Ring { full, empty, stages, stage, phase }
    }

    /// Spins until the current stage is empty (`producer`: parity `phase ^ 1`, so the first
    /// lap passes) or full (parity `phase`).
    pub(crate) fn ring_wait(&mut self, p: Ring, producer: bool) {
        use Operand::{Imm, Reg as R};
        let (bar_off, parity) = if producer {
            let par = self.reg(RegClass::B32, "parity");
            self.op("xor.b32", vec![R(par), R(p.phase), Imm(1)]);
            (p.empty, par)
        } else {
            (p.full, p.phase)
        };
        let bar = self.barrier_addr(bar_off, p.stage);
        let (spin, ok) = (self.label("wait"), self.reg(RegClass::Pred, "ready"));
        let limit = self.ir.wait_limit;
        let tries = (limit > 0).then(|| self.reg(RegClass::B32, "tries"));
        if let Some(t) = tries {
            self.op("mov.u32", vec![R(t), Imm(0)]);
        }
        self.body.push(Inst::Label(spin.clone()));
        let wait = if self.sm90() { "mbarrier.try_wait.parity.shared::cta.b64" } else { "mbarrier.test_wait.parity.shared.b64" };
        self.op(wait, vec![R(ok), Operand::Addr(bar, 0), R(parity)]);
        if let Some(tries) = tries {
            // The watchdog: past `limit` tries, a store to the tag address (memcheck reports
            // it, with the thread and block), then on spinning.
            let (done, more, at) = (self.label("waited"), self.reg(RegClass::Pred, "more"), self.reg(RegClass::B64, "tag"));
            self.op_if(ok, false, "bra", vec![Operand::Sym(done.clone())]);
            self.op("add.u32", vec![R(tries), R(tries), Imm(1)]);
            self.op("setp.lt.u32", vec![R(more), R(tries), Imm(i64::from(limit))]);
            self.op_if(more, false, "bra", vec![Operand::Sym(spin.clone())]);
            self.op("mul.wide.u32", vec![R(at), R(p.stage), Imm(crate::WAIT_TAG_STAGE as i64)]);
            self.op("add.u64", vec![R(at), R(at), Imm(crate::wait_tag(self.line, producer, 0) as i64)]);
            self.op("st.global.u32", vec![Operand::Addr(at, 0), R(tries)]);
            self.op("bra", vec![Operand::Sym(spin)]);
            self.body.push(Inst::Label(done));
        } else {
            // `bra`, not `bra.uni`: each thread's `try_wait` answers for itself, and the threads
            // of a warp may see the phase complete at different times; a warp parting at a
            // `.uni` branch is undefined (no change in speed: run 108).
            self.op_if(ok, true, "bra", vec![Operand::Sym(spin)]);
        }
        if producer {
            // Every thread must have seen the phase complete before any goes on: the leader's
            // next step (a TMA load, a queue slot published) lets the consumers complete the
            // barrier's next phase, of the same parity as the one a slower warp still polls for,
            // which then waits for good while the leader waits for it at the warpgroup's next
            // barrier (run 115: memcheck's stall, a producer warp stuck at the tile queue's
            // empty barrier, the consumers racing through empty query tiles).
            self.warpgroup_barrier();
        }
    }

    /// The warpgroup leader's arrival on the barrier at `off` of `stage` (a release of the
    /// warpgroup's earlier shared writes).
    pub(crate) fn ring_arrive(&mut self, off: u32, stage: Reg) {
        let bar = self.barrier_addr(off, stage);
        let leader = self.leader;
        self.arrive_if(leader, bar);
    }

    /// An arrival on the barrier at shared address `bar` by the threads where `who` holds.
    fn arrive_if(&mut self, who: Reg, bar: Reg) {
        if self.sm90() {
            self.op_if(who, false, "mbarrier.arrive.shared::cta.b64", vec![Operand::Sym("_".into()), Operand::Addr(bar, 0)]);
        } else {
            let state = self.reg(RegClass::B64, "state");
            self.op_if(who, false, "mbarrier.arrive.shared.b64", vec![Operand::Reg(state), Operand::Addr(bar, 0)]);
        }
    }

    /// Each warp's release of a pipeline stage: the warp's lanes sync (their reads of the
    /// stage ordered before the arrival), then lane 0 arrives on the stage's empty barrier.
    fn warp_release(&mut self, off: u32, stage: Reg) {
        let bar = self.barrier_addr(off, stage);
        self.op("bar.warp.sync", vec![Operand::Imm(-1)]);
        let lane0 = self.reg(RegClass::Pred, "lane0");
        let lane = self.lane;
        self.op("setp.eq.u32", vec![Operand::Reg(lane0), Operand::Reg(lane), Operand::Imm(0)]);
        self.arrive_if(lane0, bar);
    }

    fn barrier_addr(&mut self, off: u32, stage: Reg) -> Reg {
        use Operand::{Imm, Reg as R};
        let base = self.dyn_base();
        let a = self.reg(RegClass::B32, "bar");
        self.op("mad.lo.u32", vec![R(a), R(stage), Imm(8), R(base)]);
        self.op("add.u32", vec![R(a), R(a), Imm(i64::from(off))]);
        a
    }

    pub(crate) fn ring_advance(&mut self, p: Ring) {
        use Operand::{Imm, Reg as R};
        let wrap = self.reg(RegClass::Pred, "wrap");
        self.op("add.u32", vec![R(p.stage), R(p.stage), Imm(1)]);
        self.op("setp.eq.u32", vec![R(wrap), R(p.stage), Imm(i64::from(p.stages))]);
        self.op_if(wrap, false, "mov.u32", vec![R(p.stage), Imm(0)]);
        self.op_if(wrap, false, "xor.b32", vec![R(p.phase), R(p.phase), Imm(1)]);
    }

    /// Lowers a Hopper statement, or gives `None` for other statements.
    pub(crate) fn hopper_stmt(&mut self, s: &Stmt) -> Option<Result<(), CompileError>> {
        Some(match &s.kind {
            StmtKind::TmaLoad { dst, tensor, index, pipe } => self.tma_load(dst, tensor, index, pipe),
            StmtKind::PipeCommit { pipe, stage } | StmtKind::PipeRelease { pipe, stage } => {
                let Value::Pipe(p) = self.lookup(pipe) else { unreachable!("verified TIR-H: `{pipe}` is a pipeline") };
                let release = matches!(s.kind, StmtKind::PipeRelease { .. });
                if release && !self.pending_accs.is_empty() && self.sm90() {
                    // The stage's operands are read by wgmma until its group completes; an
                    // explicit `mma_wait` before the release says which groups may still run.
                    self.op("wgmma.wait_group.sync.aligned", vec![Operand::Imm(0)]);
                    self.pending_accs.clear();
                }
                let st = match self.scalar(stage) {
                    Ok(v) => v,
                    Err(e) => return Some(Err(e)),
                };
                let st = self.in_reg(st, crate::dtype::ScalarType::I32, "stage");
                if release {
                    self.warp_release(p.empty, st);
                } else if self.sm90() {
                    self.ring_arrive(p.full, st);
                } else {
                    let bar = self.barrier_addr(p.full, st);
                    self.op("cp.async.mbarrier.arrive.noinc.shared.b64", vec![Operand::Addr(bar, 0)]);
                }
                Ok(())
            }
            StmtKind::MmaWait(n) => {
                if self.sm90() {
                    self.op("wgmma.wait_group.sync.aligned", vec![Operand::Imm(i64::from(*n))]);
                }
                // With n > 0 the kernel says that what it reads next is done.
                self.pending_accs.clear();
                Ok(())
            }
            StmtKind::Mma { acc, a, b, b_kn, a_t } => self.mma(acc, a, b, *b_kn, *a_t),
            StmtKind::SmemStore { view, value, fragments: false } => self.smem_store(view, value),
            StmtKind::SmemStore { view, value, fragments: true } => self.smem_store_fragments(view, value),
            StmtKind::TmaStore { .. } | StmtKind::TmaStoreWait(_) if !self.sm90() => Err(CompileError::Lower {
                message: "`tma::store` needs sm_90a: build the kernel with `targets(sm_90a)`".into(),
                loc: s.loc,
            }),
            StmtKind::TmaStore { tensor, index, src, add, flat: false } => self.tma_store(tensor, index, src, *add),
            StmtKind::TmaStore { tensor, index, src, add, flat: true } => self.bulk_store(tensor, index, src, *add),
            StmtKind::TmaStoreWait(n) => {
                let leader = self.leader;
                self.op_if(leader, false, "cp.async.bulk.wait_group.read", vec![Operand::Imm(i64::from(*n))]);
                // Nobody writes the staging buffer before its store has read it.
                self.warpgroup_barrier();
                Ok(())
            }
            StmtKind::NamedBarrier { id, warpgroups, wait, .. } => {
                // Hardware barriers 9..15: 0 is the block's, 1..=8 the warpgroups' own.
                let op = if *wait { "bar.sync" } else { "bar.arrive" };
                self.op(op, vec![Operand::Imm(i64::from(9 + id)), Operand::Imm(i64::from(warpgroups * 128))]);
                Ok(())
            }
            StmtKind::SetMaxNReg(_) if !self.sm90() => Ok(()),
            StmtKind::SetMaxNReg(n) => {
                let cap = (65536 / (self.ir.warpgroups * 128)).min(255) / 8 * 8;
                let dir = if *n > cap { "inc" } else { "dec" };
                self.op(&format!("setmaxnreg.{dir}.sync.aligned.u32"), vec![Operand::Imm(i64::from(*n))]);
                self.uses_setmaxnreg = true;
                Ok(())
            }
            _ => return None,
        })
    }

    fn view(&mut self, e: &Expr) -> Result<ViewVal, CompileError> {
        match self.expr(e)? {
            Value::View(v) => Ok(v),
            _ => unreachable!("verified TIR-H: a shared view"),
        }
    }

    fn tma_load(&mut self, dst: &Expr, tensor: &str, index: &[Expr], pipe: &str) -> Result<(), CompileError> {
        use Operand::Imm;
        let v = self.view(dst)?;
        let Value::Pipe(p) = self.lookup(pipe) else { unreachable!("verified TIR-H: `{pipe}` is a pipeline") };
        let map = self.tma_map(tensor);
        let idx = index.iter().map(|i| self.scalar(i)).collect::<Result<Vec<_>, _>>()?;
        if !self.sm90() {
            if v.ty.swizzle == 0 && v.ty.row_bytes() > 128 * 16 {
                return Err(CompileError::Lower {
                    message: format!(
                        "`tma::load` on sm_80 copies unswizzled rows of at most 2048 bytes (a warpgroup's 16-byte copies a row), found {}",
                        v.ty.row_bytes()
                    ),
                    loc: dst.loc,
                });
            }
            self.tma_load_sm80(&v, tensor, &idx);
            return Ok(());
        }
        let stage = self.in_reg(v.stage.clone(), crate::dtype::ScalarType::I32, "stage");
        let bar = self.barrier_addr(p.full, stage);
        let leader = self.leader;
        // Coordinates go innermost first; one box per panel of a wide row. A panel whose first
        // column lies past the tensor is not issued (nor counted): a box entirely out of bounds
        // is not relied on to complete.
        let mut coords: Vec<Reg> = idx.iter().rev().map(|i| self.in_reg(i.clone(), crate::dtype::ScalarType::I32, "coord")).collect();
        let dim = coords.len();
        let col0 = coords[0];
        let box_bytes = v.rows * v.ty.panel_cols() * v.ty.dtype.size();
        let g = self.global(tensor);
        let cols_dim = self.global_regs(&g).dims[dim - 1];
        if let Some(bc) = wide_row_box(v.ty.cols, v.ty.swizzle, v.ty.dtype) {
            self.tma_load_row_boxes(&v, map, bar, &mut coords, cols_dim, bc, &g);
            return Ok(());
        }
        for p in 0..v.ty.panels() {
            let (dst, issue) = if p == 0 {
                (v.addr, leader)
            } else {
                let d = self.reg(RegClass::B32, "panel");
                self.op("add.u32", vec![Operand::Reg(d), Operand::Reg(v.addr), Imm(i64::from(p * v.ty.rows * v.ty.swizzle))]);
                let c = self.reg(RegClass::B32, "coord");
                self.op("add.s32", vec![Operand::Reg(c), Operand::Reg(col0), Imm(i64::from(p * v.ty.panel_cols()))]);
                coords[0] = c;
                let q = self.reg(RegClass::Pred, "issue");
                self.op("setp.lt.and.s32", vec![Operand::Reg(q), Operand::Reg(c), Operand::Reg(cols_dim), Operand::Reg(leader)]);
                (d, q)
            };
            self.op_if(
                issue,
                false,
                "mbarrier.expect_tx.relaxed.cta.shared::cta.b64",
                vec![Operand::Addr(bar, 0), Imm(i64::from(box_bytes))],
            );
            let names = coords.iter().map(|r| self.reg_name(*r)).collect::<Vec<_>>().join(", ");
            self.body.push(Inst::Op {
                pred: Some((issue, false)),
                op: format!("cp.async.bulk.tensor.{dim}d.shared::cluster.global.tile.mbarrier::complete_tx::bytes"),
                args: vec![Operand::Addr(dst, 0), Operand::Sym(format!("[{}, {{{names}}}]", self.reg_name(map))), Operand::Addr(bar, 0)],
            });
        }
        Ok(())
    }

    /// `tma::load` of an unswizzled view whose rows are wider than one box: a box of `bc`
    /// columns and one row at a time, each landing at its place in the view's row-major rows;
    /// a box past the tensor's rows or columns is not issued (nor counted).
    #[allow(clippy::too_many_arguments)]
    fn tma_load_row_boxes(&mut self, v: &ViewVal, map: Reg, bar: Reg, coords: &mut [Reg], cols_dim: Reg, bc: u32, g: &super::GlobalVal) {
        use Operand::{Imm, Reg as R};
        let dim = coords.len();
        let (col0, row0) = (coords[0], coords[1]);
        let rows_dim = self.global_regs(g).dims[dim - 2];
        let es = v.ty.dtype.size();
        let box_bytes = bc * es;
        let leader = self.leader;
        for r in 0..v.rows {
            let row = self.reg(RegClass::B32, "coord");
            self.op("add.s32", vec![R(row), R(row0), Imm(i64::from(r))]);
            let row_in = self.reg(RegClass::Pred, "issue");
            self.op("setp.lt.and.s32", vec![R(row_in), R(row), R(rows_dim), R(leader)]);
            coords[1] = row;
            for b in 0..v.ty.cols / bc {
                let d = self.reg(RegClass::B32, "box");
                self.op("add.u32", vec![R(d), R(v.addr), Imm(i64::from(r * v.ty.row_bytes() + b * box_bytes))]);
                let c = self.reg(RegClass::B32, "coord");
                self.op("add.s32", vec![R(c), R(col0), Imm(i64::from(b * bc))]);
                coords[0] = c;
                let q = self.reg(RegClass::Pred, "issue");
                self.op("setp.lt.and.s32", vec![R(q), R(c), R(cols_dim), R(row_in)]);
                self.op_if(
                    q,
                    false,
                    "mbarrier.expect_tx.relaxed.cta.shared::cta.b64",
                    vec![Operand::Addr(bar, 0), Imm(i64::from(box_bytes))],
                );
                let names = coords.iter().map(|r| self.reg_name(*r)).collect::<Vec<_>>().join(", ");
                self.body.push(Inst::Op {
                    pred: Some((q, false)),
                    op: format!("cp.async.bulk.tensor.{dim}d.shared::cluster.global.tile.mbarrier::complete_tx::bytes"),
                    args: vec![Operand::Addr(d, 0), Operand::Sym(format!("[{}, {{{names}}}]", self.reg_name(map))), Operand::Addr(bar, 0)],
                });
            }
        }
    }

    /// Writes a register tile into a shared view, swizzled as TMA and wgmma read it: each
    /// owner writes its elements, 16-bit pairs packed into one 32-bit store.
    fn smem_store(&mut self, view: &Expr, value: &Expr) -> Result<(), CompileError> {
        use Operand::{Imm, Reg as R};
        let v = self.view(view)?;
        let t = self.tile(value)?;
        let es = t.ty.dtype.size();
        if self.sm90() && es == 2 && v.ty.swizzle == 128 && v.ty.row_bytes() == 128 && t.layout == Layout::wgmma(t.ty.rows, 64) {
            if let Some(frags) = stmatrix_fragments(&t) {
                self.smem_store_stmatrix(&v, &frags);
                self.fence_for_mma(view);
                return Ok(());
            }
        }
        let lr = self.layout_regs(t.layout);
        if v.ty.swizzle > 0 && v.ty.row_bytes() > v.ty.swizzle {
            // Rows in panels of one span: each element's address as `view.load()` reads it.
            let slots = t.layout.slots();
            let pair = es <= 2 && t.layout.run_len() >= 2;
            let mut i = 0;
            while i < slots.len() {
                let addr = self.panel_address(&v, lr.row, lr.col, slots[i].dr, slots[i].dc, es);
                if pair {
                    let (w, op) = self.pack_pair(t.regs[i], t.regs[i + 1], es);
                    self.op_if(lr.owner, false, op, vec![Operand::Addr(addr, 0), R(w)]);
                    i += 2;
                } else {
                    self.op_if(lr.owner, false, &format!("st.shared.b{}", es * 8), vec![Operand::Addr(addr, 0), R(t.regs[i])]);
                    i += 1;
                }
            }
            self.fence_for_mma(view);
            return Ok(());
        }
        let base = self.reg(RegClass::B32, "soff");
        // base = row·row_bytes + col·es
        self.op("mul.lo.u32", vec![R(base), R(lr.row), Imm(i64::from(v.ty.row_bytes()))]);
        let c = self.reg(RegClass::B32, "scol");
        self.op("mul.lo.u32", vec![R(c), R(lr.col), Imm(i64::from(es))]);
        self.op("add.u32", vec![R(base), R(base), R(c)]);
        let slots = t.layout.slots();
        let rb = v.ty.row_bytes();
        let pair = t.layout.run_len() >= 2 && (es <= 2 || (es == 4 && rb % 8 == 0));
        let step = if pair { 2 } else { 1 };
        // Rows a multiple of 8 swizzle rows apart (1024 bytes: every swizzle's period) share
        // the swizzled column offset: one address a column, the rows as immediate offsets.
        let hoist = slots.iter().all(|sl| (sl.dr * rb) % 1024 == 0);
        let mut by_col: Vec<(u32, Reg)> = Vec::new();
        // An unswizzled view's rows are contiguous: a thread's 16-byte runs (the layout's runs
        // start on multiples of their length) store as one vector each, at immediate offsets
        // from the thread's first element (as `view.load()` reads them).
        let vec_len = vector_len(&v.ty, t.layout, es);
        let first = (vec_len > 0).then(|| {
            let a = self.reg(RegClass::B32, "saddr");
            self.op("add.u32", vec![R(a), R(v.addr), R(base)]);
            a
        });
        let mut i = 0;
        while i < slots.len() {
            let (dr, dc) = (slots[i].dr, slots[i].dc);
            if let (Some(a), true) = (first, vector_run(&slots, i, vec_len)) {
                let words: Vec<Reg> = if es == 4 {
                    t.regs[i..i + 4].to_vec()
                } else {
                    (0..4)
                        .map(|j| {
                            let w = self.reg(RegClass::B32, "pack");
                            self.op("mov.b32", vec![R(w), Operand::Vec(vec![t.regs[i + 2 * j], t.regs[i + 2 * j + 1]])]);
                            w
                        })
                        .collect()
                };
                let at = Operand::Addr(a, i64::from(dr * rb + dc * es));
                self.op_if(lr.owner, false, "st.shared.v4.b32", vec![at, Operand::Vec(words)]);
                i += vec_len;
                continue;
            }
            let (addr, imm) = match by_col.iter().find(|(c, _)| hoist && *c == dc) {
                Some(&(_, a)) => (a, dr * rb),
                None => {
                    let row_off = if hoist { 0 } else { dr * rb };
                    let off = self.reg(RegClass::B32, "soff");
                    self.op("add.u32", vec![R(off), R(base), Imm(i64::from(row_off + dc * es))]);
                    let off = self.swizzled_offset(off, v.ty.swizzle);
                    let addr = self.reg(RegClass::B32, "saddr");
                    self.op("add.u32", vec![R(addr), R(v.addr), R(off)]);
                    if hoist {
                        by_col.push((dc, addr));
                    }
                    (addr, dr * rb - row_off)
                }
            };
            let at = Operand::Addr(addr, i64::from(imm));
            match (pair, es) {
                (true, 1 | 2) => {
                    let (w, op) = self.pack_pair(t.regs[i], t.regs[i + 1], es);
                    self.op_if(lr.owner, false, op, vec![at, R(w)]);
                }
                // f32 pairs (an accumulator's) in one 8-byte store.
                (true, _) => self.op_if(lr.owner, false, "st.shared.v2.b32", vec![at, Operand::Vec(vec![t.regs[i], t.regs[i + 1]])]),
                _ => self.op_if(lr.owner, false, &format!("st.shared.b{}", es * 8), vec![at, R(t.regs[i])]),
            }
            i += step;
        }
        self.fence_for_mma(view);
        Ok(())
    }

    /// Two adjacent 8- or 16-bit elements (`lo` first in memory) as one register, and the
    /// shared store that writes it: fp8 codes (each in the low byte of a 16-bit register) as
    /// one 16-bit word, 16-bit elements as one 32-bit word.
    fn pack_pair(&mut self, lo: Reg, hi: Reg, es: u32) -> (Reg, &'static str) {
        use Operand::{Imm, Reg as R};
        if es == 1 {
            let (l, w) = (self.reg(RegClass::B16, "lo8"), self.reg(RegClass::B16, "pack8"));
            self.op("and.b16", vec![R(l), R(lo), Imm(0xff)]);
            self.op("shl.b16", vec![R(w), R(hi), Imm(8)]);
            self.op("or.b16", vec![R(w), R(w), R(l)]);
            return (w, "st.shared.b16");
        }
        let w = self.reg(RegClass::B32, "pack");
        self.op("mov.b32", vec![R(w), Operand::Vec(vec![lo, hi])]);
        (w, "st.shared.b32")
    }

    /// The shared address of element (`row + dr`, `col + dc`) of a view whose rows lie in
    /// panels of one swizzle span `ty.rows · span` bytes apart (as TMA writes rows wider than
    /// the span), swizzled within each panel.
    fn panel_address(&mut self, v: &ViewVal, row: Reg, col: Reg, dr: u32, dc: u32, es: u32) -> Reg {
        use Operand::{Imm, Reg as R};
        let r = self.reg(RegClass::B32, "prow");
        self.op("add.u32", vec![R(r), R(row), Imm(i64::from(dr))]);
        let cb = self.reg(RegClass::B32, "pcol");
        self.op("add.u32", vec![R(cb), R(col), Imm(i64::from(dc))]);
        self.op("mul.lo.u32", vec![R(cb), R(cb), Imm(i64::from(es))]);
        // panel · rows · span + row · span + (the byte within the panel)
        let span = v.ty.pitch();
        let panel = self.reg(RegClass::B32, "panel");
        self.op("shr.u32", vec![R(panel), R(cb), Imm(i64::from(span.trailing_zeros()))]);
        self.op("and.b32", vec![R(cb), R(cb), Imm(i64::from(span - 1))]);
        let off = self.reg(RegClass::B32, "poff");
        self.op("mad.lo.u32", vec![R(off), R(panel), Imm(i64::from(v.ty.rows * span)), R(cb)]);
        self.op("mad.lo.u32", vec![R(off), R(r), Imm(i64::from(span)), R(off)]);
        let off = self.swizzled_offset(off, v.ty.swizzle);
        let addr = self.reg(RegClass::B32, "paddr");
        self.op("add.u32", vec![R(addr), R(v.addr), R(off)]);
        addr
    }

    /// `view.load()`: each thread reads its elements (its replicas' too) from the view's
    /// swizzled layout (rows wider than the span in panels, as [`Self::panel_address`]);
    /// 16-bit pairs one 32-bit word at a time.
    pub(crate) fn smem_load(&mut self, view: &Expr, ty: TileType, layout: Layout) -> Result<TileVal, CompileError> {
        use Operand::{Imm, Reg as R};
        let v = self.view(view)?;
        let lr = self.layout_regs(layout);
        let es = ty.dtype.size();
        let panelled = v.ty.swizzle > 0 && v.ty.row_bytes() > v.ty.swizzle;
        let slots = layout.slots();
        let pair = es == 2 && layout.run_len() >= 2;
        let mut regs = Vec::with_capacity(slots.len());
        // An unswizzled view's rows are contiguous: a thread's 16-byte runs (the layout's runs
        // start on multiples of their length) load as one vector each.
        let vec_len = vector_len(&v.ty, layout, es);
        let mut i = 0;
        while i < slots.len() {
            if vector_run(&slots, i, vec_len) {
                let off = self.reg(RegClass::B32, "loff");
                let cb = self.reg(RegClass::B32, "lcol");
                self.op("add.u32", vec![R(cb), R(lr.col), Imm(i64::from(slots[i].dc))]);
                self.op("mul.lo.u32", vec![R(cb), R(cb), Imm(i64::from(es))]);
                let r = self.reg(RegClass::B32, "lrow");
                self.op("add.u32", vec![R(r), R(lr.row), Imm(i64::from(slots[i].dr))]);
                self.op("mad.lo.u32", vec![R(off), R(r), Imm(i64::from(v.ty.row_bytes())), R(cb)]);
                let addr = self.reg(RegClass::B32, "laddr");
                self.op("add.u32", vec![R(addr), R(v.addr), R(off)]);
                if es == 4 {
                    let rs: Vec<Reg> = (0..4).map(|_| self.reg(super::elem_class(ty.dtype), "ld")).collect();
                    self.op("ld.shared.v4.b32", vec![Operand::Vec(rs.clone()), Operand::Addr(addr, 0)]);
                    regs.extend(rs);
                } else {
                    let ws: Vec<Reg> = (0..4).map(|_| self.reg(RegClass::B32, "lpair")).collect();
                    self.op("ld.shared.v4.b32", vec![Operand::Vec(ws.clone()), Operand::Addr(addr, 0)]);
                    for w in ws {
                        let (a, b) = (self.reg(super::elem_class(ty.dtype), "lo"), self.reg(super::elem_class(ty.dtype), "hi"));
                        self.op("mov.b32", vec![Operand::Vec(vec![a, b]), R(w)]);
                        regs.extend([a, b]);
                    }
                }
                i += vec_len;
                continue;
            }
            let addr = if panelled {
                self.panel_address(&v, lr.row, lr.col, slots[i].dr, slots[i].dc, es)
            } else {
                // row · row_bytes + col · es, swizzled
                let off = self.reg(RegClass::B32, "loff");
                let cb = self.reg(RegClass::B32, "lcol");
                self.op("add.u32", vec![R(cb), R(lr.col), Imm(i64::from(slots[i].dc))]);
                self.op("mul.lo.u32", vec![R(cb), R(cb), Imm(i64::from(es))]);
                let r = self.reg(RegClass::B32, "lrow");
                self.op("add.u32", vec![R(r), R(lr.row), Imm(i64::from(slots[i].dr))]);
                self.op("mad.lo.u32", vec![R(off), R(r), Imm(i64::from(v.ty.row_bytes())), R(cb)]);
                let off = self.swizzled_offset(off, v.ty.swizzle);
                let addr = self.reg(RegClass::B32, "laddr");
                self.op("add.u32", vec![R(addr), R(v.addr), R(off)]);
                addr
            };
            if pair {
                let w = self.reg(RegClass::B32, "lpair");
                self.op("ld.shared.b32", vec![R(w), Operand::Addr(addr, 0)]);
                let (a, b) = (self.reg(super::elem_class(ty.dtype), "lo"), self.reg(super::elem_class(ty.dtype), "hi"));
                self.op("mov.b32", vec![Operand::Vec(vec![a, b]), R(w)]);
                regs.extend([a, b]);
                i += 2;
            } else {
                let r = self.reg(super::elem_class(ty.dtype), "ld");
                let op = if es == 4 { "ld.shared.b32" } else { "ld.shared.b16" };
                self.op(op, vec![R(r), Operand::Addr(addr, 0)]);
                regs.push(r);
                i += 1;
            }
        }
        Ok(TileVal { ty, layout, regs })
    }

    /// After a store into a ring that an `mma_sync` reads: each writer fences its writes for
    /// the async proxy (wgmma reads shared memory through it) and the warpgroup syncs, so that
    /// its next MMA sees every thread's part. A ring written by another warpgroup needs a
    /// barrier between the two as well (`barrier::sync`).
    fn fence_for_mma(&mut self, view: &Expr) {
        if ring_of(view).is_some_and(|r| self.mma_rings.iter().any(|m| m == r)) {
            self.op("fence.proxy.async.shared::cta", vec![]);
            if !self.named_sync_follows {
                self.warpgroup_barrier();
            }
        }
    }

    /// [`Self::smem_store`] of a 16-bit accumulator-layout tile 64 columns wide into 128-byte
    /// swizzled rows: one `stmatrix.x4` per 64 rows and 16 columns, whose 8×8 fragments are
    /// the accumulator's (lane `l` holds row `l/4`, columns `2(l%4)`, `+1`). Lane `l` names
    /// row `l%8` of matrix `l/8`: matrices 0 and 1 are rows 0–7 and 8–15 of the warp's 16 at
    /// columns 0–7 of the group, 2 and 3 the same rows at columns 8–15. A 16-byte chunk never
    /// straddles the swizzle, so each row's address takes the XOR whole: chunk ^ (row % 8).
    fn smem_store_stmatrix(&mut self, v: &ViewVal, frags: &[[[Reg; 2]; 4]]) {
        use Operand::{Imm, Reg as R};
        let (lane, warp) = (self.lane, self.warp);
        let q = self.reg(RegClass::B32, "stm_q");
        self.op("shr.u32", vec![R(q), R(lane), Imm(3)]);
        // row = 16·warp + 8·(q & 1) + lane % 8
        let row = self.reg(RegClass::B32, "stm_row");
        self.op("and.b32", vec![R(row), R(q), Imm(1)]);
        self.op("shl.b32", vec![R(row), R(row), Imm(3)]);
        let l8 = self.reg(RegClass::B32, "stm_l8");
        self.op("and.b32", vec![R(l8), R(lane), Imm(7)]);
        self.op("add.u32", vec![R(row), R(row), R(l8)]);
        self.op("mad.lo.u32", vec![R(row), R(warp), Imm(16), R(row)]);
        let rowa = self.reg(RegClass::B32, "stm_rowa");
        self.op("mad.lo.u32", vec![R(rowa), R(row), Imm(128), R(v.addr)]);
        // The swizzle term (row % 8)·16 and the lane's 8-column half of a group, in bytes.
        let sw = self.reg(RegClass::B32, "stm_sw");
        self.op("and.b32", vec![R(sw), R(row), Imm(7)]);
        self.op("shl.b32", vec![R(sw), R(sw), Imm(4)]);
        let half = self.reg(RegClass::B32, "stm_half");
        self.op("shr.u32", vec![R(half), R(q), Imm(1)]);
        self.op("shl.b32", vec![R(half), R(half), Imm(4)]);
        for (g, frag) in frags.iter().enumerate() {
            let (mb, c) = (g as i64 / 4, g as i64 % 4);
            let regs: Vec<Reg> = frag
                .iter()
                .map(|&[lo, hi]| {
                    let w = self.reg(RegClass::B32, "stm_pack");
                    self.op("mov.b32", vec![R(w), Operand::Vec(vec![lo, hi])]);
                    w
                })
                .collect();
            let x = self.reg(RegClass::B32, "stm_x");
            self.op("add.u32", vec![R(x), R(half), Imm(32 * c)]);
            self.op("xor.b32", vec![R(x), R(x), R(sw)]);
            let addr = self.reg(RegClass::B32, "stm_addr");
            self.op("add.u32", vec![R(addr), R(rowa), R(x)]);
            self.op("stmatrix.sync.aligned.m8n8.x4.shared.b16", vec![Operand::Addr(addr, mb * 64 * 128), Operand::Vec(regs)]);
        }
    }

    /// Before a bulk copy of shared memory: every writer fences its shared writes for the async
    /// proxy and the warpgroup syncs (a store straight after another: the first's fence and
    /// barrier cover this one's view).
    fn fence_for_bulk(&mut self) {
        if !self.tma_store_chained {
            self.op("fence.proxy.async.shared::cta", vec![]);
            self.warpgroup_barrier();
        }
    }

    /// A TMA bulk store of a shared view (or, `add`, a bulk reduce-add into the tensor): every
    /// writer fences its shared writes for the async proxy, the warpgroup syncs, and its leader
    /// issues and commits the copy.
    fn tma_store(&mut self, tensor: &str, index: &[Expr], src: &Expr, add: bool) -> Result<(), CompileError> {
        let v = self.view(src)?;
        let idx = index.iter().map(|i| self.scalar(i)).collect::<Result<Vec<_>, _>>()?;
        let map = self.tma_map(tensor);
        self.fence_for_bulk();
        let coords: Vec<Reg> = idx.iter().rev().map(|i| self.in_reg(i.clone(), crate::dtype::ScalarType::I32, "coord")).collect();
        let names = coords.iter().map(|r| self.reg_name(*r)).collect::<Vec<_>>().join(", ");
        let leader = self.leader;
        self.body.push(Inst::Op {
            pred: Some((leader, false)),
            op: if add {
                format!("cp.reduce.async.bulk.tensor.{}d.global.shared::cta.add.tile.bulk_group", coords.len())
            } else {
                format!("cp.async.bulk.tensor.{}d.global.shared::cta.tile.bulk_group", coords.len())
            },
            args: vec![Operand::Sym(format!("[{}, {{{names}}}]", self.reg_name(map))), Operand::Addr(v.addr, 0)],
        });
        self.op_if(leader, false, "cp.async.bulk.commit_group", vec![]);
        Ok(())
    }

    /// `tma::store_flat` / `tma::reduce_add_flat` (`add`): a 1-D bulk copy of the view's bytes
    /// to the tensor's consecutive elements from `index`, issued by the warpgroup's leader once
    /// every thread's shared writes are visible to the copy engine; not issued if it would run
    /// past the tensor's last element (the interpreter says so).
    fn bulk_store(&mut self, tensor: &str, index: &[Expr], src: &Expr, add: bool) -> Result<(), CompileError> {
        use Operand::{Imm, Reg as R};
        let v = self.view(src)?;
        let idx = index.iter().map(|i| self.scalar(i)).collect::<Result<Vec<_>, _>>()?;
        self.fence_for_bulk();
        let g = self.global(tensor);
        let bytes = v.rows * v.ty.cols * g.dtype.size();
        let (addr, room, ok) = self.flat_address(&g, &idx, None);
        let leader = self.leader;
        let issue = self.flat_fits(room, leader, bytes);
        self.op("and.pred", vec![R(issue), R(issue), R(ok)]);
        let op = if add {
            "cp.reduce.async.bulk.global.shared::cta.bulk_group.add.f32".to_string()
        } else {
            "cp.async.bulk.global.shared::cta.bulk_group".to_string()
        };
        self.op_if(issue, false, &op, vec![Operand::Addr(addr, 0), Operand::Addr(v.addr, 0), Imm(i64::from(bytes))]);
        self.op_if(leader, false, "cp.async.bulk.commit_group", vec![]);
        Ok(())
    }

    /// `view.store_fragments(acc)`: each thread's accumulator registers, four at a time, at
    /// `((i / 4)·128 + t)·16` bytes into the view (`t` its index in the warpgroup) — one
    /// `st.shared.v4` a quad, a warp's 512 bytes contiguous.
    fn smem_store_fragments(&mut self, view: &Expr, value: &Expr) -> Result<(), CompileError> {
        let v = self.view(view)?;
        let t = self.tile(value)?;
        if !matches!(t.layout.kind, crate::layout::LayoutKind::Wgmma { .. }) || !t.layout.keep_rows || !t.layout.keep_cols {
            return Err(CompileError::Lower {
                message: "`store_fragments` takes an MMA accumulator (a tile that `mma_sync` wrote)".into(),
                loc: value.loc,
            });
        }
        let addr = self.fragment_thread_offset(v.addr, 16);
        for (j, quad) in t.regs.chunks(4).enumerate() {
            let regs = quad.iter().map(|r| self.reg_name(*r)).collect::<Vec<_>>().join(", ");
            self.op("st.shared.v4.f32", vec![Operand::Addr(addr, (j * 2048) as i64), Operand::Sym(format!("{{{regs}}}"))]);
        }
        Ok(())
    }

    /// This thread's index in its warpgroup.
    fn warpgroup_thread(&mut self) -> Reg {
        use Operand::{Imm, Reg as R};
        let t = self.reg(RegClass::B32, "frag_t");
        self.op("and.b32", vec![R(t), R(self.tid), Imm(127)]);
        t
    }

    /// `base + t·scale` for this thread's index `t` in its warpgroup (a shared address).
    fn fragment_thread_offset(&mut self, base: Reg, scale: u32) -> Reg {
        use Operand::{Imm, Reg as R};
        let t = self.warpgroup_thread();
        let a = self.reg(RegClass::B32, "frag_at");
        self.op("mad.lo.u32", vec![R(a), R(t), Imm(i64::from(scale)), R(base)]);
        a
    }

    /// The global address of element `idx` of `g` (plus this thread's `t·scale` bytes with
    /// `thread`), the bytes left in the tensor from there (its elements are `dims[0]·strides[0]`)
    /// and whether every index is at least 0.
    pub(crate) fn flat_address(&mut self, g: &super::GlobalVal, idx: &[Operand], thread: Option<u32>) -> (Reg, Reg, Reg) {
        use Operand::{Imm, Reg as R};
        let gr = self.global_regs(g);
        let es = i64::from(g.dtype.size());
        let off = self.reg(RegClass::B64, "flat_off");
        self.op("mov.b64", vec![R(off), Imm(0)]);
        let ok = self.reg(RegClass::Pred, "flat_ok");
        self.op("setp.eq.u32", vec![R(ok), R(self.lane), R(self.lane)]);
        for (k, i) in idx.iter().enumerate() {
            let ir = self.reg(RegClass::B32, "idx");
            self.op("mov.b32", vec![R(ir), i.clone()]);
            self.op("setp.ge.and.s32", vec![R(ok), R(ir), Imm(0), R(ok)]);
            self.term(off, ir, gr.strides[k], es);
        }
        if let Some(scale) = thread {
            let t = self.warpgroup_thread();
            let tb = self.reg(RegClass::B64, "frag_tb");
            self.op("mul.wide.u32", vec![R(tb), R(t), Imm(i64::from(scale))]);
            self.op("add.s64", vec![R(off), R(off), R(tb)]);
        }
        let sb = self.reg(RegClass::B32, "sbytes");
        self.op("mul.lo.s32", vec![R(sb), R(gr.strides[0]), Imm(es)]);
        let room = self.reg(RegClass::B64, "flat_room");
        self.op("mul.wide.u32", vec![R(room), R(gr.dims[0]), R(sb)]);
        self.op("sub.s64", vec![R(room), R(room), R(off)]);
        let addr = self.reg(RegClass::B64, "flat_at");
        self.op("add.s64", vec![R(addr), R(gr.ptr), R(off)]);
        (addr, room, ok)
    }

    /// `ok` and `end ≤ room`: an access ending `end` bytes past a flat address fits.
    pub(crate) fn flat_fits(&mut self, room: Reg, ok: Reg, end: u32) -> Reg {
        use Operand::{Imm, Reg as R};
        let p = self.reg(RegClass::Pred, "fits");
        self.op("setp.le.and.s64", vec![R(p), Imm(i64::from(end)), R(room), R(ok)]);
        p
    }

    /// A wgmma shared-memory descriptor for a tile at `addr` swizzled by `swizzle` bytes, its
    /// leading byte offset `lbo`: unused for K-major tiles (16, encoded 1), the panel stride of
    /// an MN-major one whose N spans panels (16 when it fits one).
    fn descriptor(&mut self, addr: Reg, swizzle: u32, lbo: u32) -> Reg {
        use Operand::{Imm, Reg as R};
        // bits 0-13: address >> 4; 16-29: LBO >> 4; 32-45: SBO = 8 rows of one swizzle span
        // (8 K-rows MN-major); 62-63: swizzle mode (1: 128B, 2: 64B, 3: 32B).
        let (mode, sbo) = match swizzle {
            128 => (1u64, 1024u64),
            64 => (2, 512),
            _ => (3, 256),
        };
        let hi = (mode << 30) | (sbo >> 4);
        let lo = self.reg(RegClass::B32, "desc_lo");
        self.op("shr.u32", vec![R(lo), R(addr), Imm(4)]);
        self.op("and.b32", vec![R(lo), R(lo), Imm(0x3FFF)]);
        self.op("or.b32", vec![R(lo), R(lo), Imm(i64::from(((lbo >> 4) & 0x3FFF) << 16))]);
        let d = self.reg(RegClass::B64, "desc");
        self.op("mov.b64", vec![R(d), Operand::Sym(format!("{{{}, {}}}", self.reg_name(lo), hi as i64))]);
        d
    }

    fn mma(&mut self, acc: &str, a: &Expr, b: &Expr, b_kn: bool, a_t: bool) -> Result<(), CompileError> {
        use Operand::{Imm, Reg as R};
        let Value::Tile(t) = self.lookup(acc) else { unreachable!("verified TIR-H: `{acc}` is a tile") };
        let want = Layout::wgmma(t.ty.rows, t.ty.cols);
        let t = if t.layout == want { t } else { self.adopt(acc, t, want) };
        let a_op = match a.checked_ty() {
            Type::Tile(_) => MmaA::Regs(self.a_fragments(a)?),
            _ => MmaA::Smem(self.view(a)?),
        };
        let vb = self.view(b)?;
        let (a_dtype, k) = match (&a_op, a.checked_ty()) {
            (MmaA::Smem(va), _) if a_t => (va.ty.dtype, va.ty.rows),
            (MmaA::Smem(va), _) => (va.ty.dtype, va.ty.cols),
            (MmaA::Regs(_), Type::Tile(ta)) => (ta.dtype, ta.cols),
            _ => unreachable!("verified TIR-H: a tile operand"),
        };
        let b_dtype = vb.ty.dtype;
        let ab = match (a_dtype.fp8_cvt_name(), b_dtype.fp8_cvt_name()) {
            (Some(x), Some(y)) => format!("{x}.{y}"),
            _ if a_dtype == crate::dtype::DType::F16 => "f16.f16".to_string(),
            _ => "bf16.bf16".to_string(),
        };
        // One instruction's K: 32 bytes of a row (k16 of a 16-bit type, k32 of fp8).
        let k_inst = 32 / a_dtype.size();
        let n = t.ty.cols;
        if !self.sm90() && a_dtype.is_fp8() {
            return Err(CompileError::Lower { message: "`mma_sync` on fp8 operands needs sm_90a (wgmma)".into(), loc: a.loc });
        }
        if !self.sm90() {
            if a_t {
                return Err(CompileError::Lower {
                    message: "`mma_sync` with `a.t()` needs sm_90a (wgmma's transposed A)".into(),
                    loc: a.loc,
                });
            }
            if n % 16 != 0 {
                return Err(CompileError::Lower {
                    message: format!("`mma_sync` on sm_80 needs N a multiple of 16, found {n}"),
                    loc: a.loc,
                });
            }
            self.mma_sm80(&t.regs, t.ty.rows / 64, n, k, &a_op, &vb, b_kn, &ab);
            return Ok(());
        }
        let per_block = (n / 2) as usize;
        let k_steps = k / k_inst;
        let zero = std::mem::take(&mut self.mma_zero);
        let desc_b = if b_kn {
            let lbo = if vb.ty.panels() > 1 { vb.ty.rows * vb.ty.pitch() } else { 16 };
            self.descriptor(vb.addr, vb.ty.pitch(), lbo)
        } else {
            self.descriptor(vb.addr, vb.ty.swizzle, 16)
        };
        self.op("wgmma.fence.sync.aligned", vec![]);
        for mb in 0..(t.ty.rows / 64) {
            let desc_a = match &a_op {
                // Aᵀ stored K×M in panels: a 64-row slab of A is one 128-byte panel, or two
                // 64-byte ones.
                MmaA::Smem(va) if a_t => {
                    let a_addr = self.reg(RegClass::B32, "a_slab");
                    let span = va.ty.pitch();
                    let panel = va.ty.rows * span;
                    let per_slab = 64 * va.ty.dtype.size() / span;
                    self.op("add.u32", vec![R(a_addr), R(va.addr), Imm(i64::from(mb * per_slab * panel))]);
                    Some(self.descriptor(a_addr, span, if per_slab > 1 { panel } else { 16 }))
                }
                MmaA::Smem(va) => {
                    let a_addr = self.reg(RegClass::B32, "a_slab");
                    self.op("add.u32", vec![R(a_addr), R(va.addr), Imm(i64::from(mb * 64 * va.ty.pitch()))]);
                    Some(self.descriptor(a_addr, va.ty.swizzle, 16))
                }
                MmaA::Regs(_) => None,
            };
            let regs = t.regs[mb as usize * per_block..(mb as usize + 1) * per_block].to_vec();
            for kk in 0..k_steps {
                let db = if kk == 0 {
                    desc_b
                } else {
                    // A k16 step: 16 rows of one span down an N-major panel (+span encoded), or
                    // 32 bytes along a K-major row, into the next panel every span.
                    let step = if b_kn { i64::from(vb.ty.pitch() * kk) } else { k_major_step(&vb.ty, kk, vb.ty.rows) };
                    let db = self.reg(RegClass::B64, "desc_b");
                    self.op("add.s64", vec![R(db), R(desc_b), Imm(step)]);
                    db
                };
                let tnsp_b = Imm(i64::from(b_kn));
                // scale-d: 0 on the first step of an accumulator that starts from zero.
                let scale_d = Imm(i64::from(!(zero && kk == 0)));
                let args = match (&a_op, desc_a) {
                    (MmaA::Smem(va), Some(desc_a)) => {
                        let da = if kk == 0 {
                            desc_a
                        } else {
                            let step = if a_t { i64::from(va.ty.pitch() * kk) } else { k_major_step(&va.ty, kk, va.ty.rows) };
                            let da = self.reg(RegClass::B64, "desc_a");
                            self.op("add.s64", vec![R(da), R(desc_a), Imm(step)]);
                            da
                        };
                        let mut args = vec![Operand::Vec(regs.clone()), R(da), R(db), scale_d, Imm(1), Imm(1)];
                        // (fp8 is K-major only: no transpose operands.)
                        if !a_dtype.is_fp8() {
                            args.extend([Imm(i64::from(a_t)), tnsp_b]);
                        }
                        args
                    }
                    (MmaA::Regs(frags), _) => {
                        let f = frags[(mb * k_steps + kk) as usize].to_vec();
                        vec![Operand::Vec(regs.clone()), Operand::Vec(f), R(db), scale_d, Imm(1), Imm(1), tnsp_b]
                    }
                    _ => unreachable!("a shared A has a descriptor"),
                };
                self.op(&format!("wgmma.mma_async.sync.aligned.m64n{n}k{k_inst}.f32.{ab}"), args);
            }
        }
        self.op("wgmma.commit_group.sync.aligned", vec![]);
        self.pending_accs.extend(t.regs.iter().copied());
        Ok(())
    }

    /// A register A operand in fragments: for each 64-row block and k16 step, the four
    /// 32-bit registers of `wgmma`'s (and `mma.sync`'s) A, each two 16-bit elements. That
    /// fragment is the accumulator layout of a 64×16 tile, so the tile moves into the
    /// accumulator layout (a renaming for a tile computed from an accumulator) and its pairs
    /// are packed; an f32 tile under `.cast` packs with one `cvt` per pair.
    fn a_fragments(&mut self, a: &Expr) -> Result<Vec<[Reg; 4]>, CompileError> {
        use Operand::Reg as R;
        let (src, to) = match &a.kind {
            ExprKind::Cast { value, to } if matches!(value.checked_ty(), Type::Tile(t) if t.dtype == crate::dtype::DType::F32) => {
                (value.as_ref(), Some(*to))
            }
            _ => (a, None),
        };
        let t = self.tile(src)?;
        let want = Layout::wgmma(t.ty.rows, t.ty.cols);
        let t = self.convert(t, want);
        let mut frags = Vec::new();
        for chunk in t.regs.chunks(8) {
            let mut f = [chunk[0]; 4];
            for (r, slot) in f.iter_mut().enumerate() {
                let (lo, hi) = (chunk[2 * r], chunk[2 * r + 1]);
                let w = self.reg(RegClass::B32, "afrag");
                match to {
                    Some(crate::dtype::DType::F16) => self.op("cvt.rn.f16x2.f32", vec![R(w), R(hi), R(lo)]),
                    Some(_) => self.op("cvt.rn.bf16x2.f32", vec![R(w), R(hi), R(lo)]),
                    None => self.op("mov.b32", vec![R(w), Operand::Vec(vec![lo, hi])]),
                }
                *slot = w;
            }
            frags.push(f);
        }
        Ok(frags)
    }

    /// Rebinds a mutable tile in another layout (moving its value), so that `mma_sync` can
    /// accumulate into it.
    fn adopt(&mut self, name: &str, t: TileVal, layout: Layout) -> TileVal {
        let moved = self.convert(t, layout);
        let regs = moved
            .regs
            .iter()
            .map(|&r| {
                let n = self.reg(r.class, name);
                self.op(super::mov_for(r.class), vec![Operand::Reg(n), Operand::Reg(r)]);
                n
            })
            .collect();
        let v = TileVal { regs, ..moved };
        self.rebind(name, Value::Tile(v.clone()));
        v
    }

    /// Whether the target is Hopper's (else the sm_80 lowering applies).
    pub(crate) fn sm90(&self) -> bool {
        self.target == crate::reflect::Target::Sm90a
    }

    /// Waits for outstanding wgmma groups before an accumulator they write is read (any
    /// accumulator after a loop that issued some).
    pub(crate) fn before_tile_read(&mut self, t: &TileVal) {
        let written = t.regs.iter().any(|r| self.pending_accs.contains(r));
        if self.sm90() && written && matches!(t.layout.kind, crate::layout::LayoutKind::Wgmma { .. }) {
            self.op("wgmma.wait_group.sync.aligned", vec![Operand::Imm(0)]);
            self.pending_accs.clear();
        }
    }

    /// The layout a `let` of `name` = `Full` gets: the wgmma accumulator's if `name` feeds
    /// `mma_sync` or is computed from an accumulator (a vector: the accumulator's rows).
    pub(crate) fn full_layout(&self, name: Option<&str>, ty: TileType) -> Layout {
        match name {
            Some(n) if self.mma_accs.iter().any(|a| a == n) && ty.rows.is_multiple_of(64) && ty.cols.is_multiple_of(8) => {
                Layout::wgmma(ty.rows, ty.cols)
            }
            Some(n) if self.acc_derived.iter().chain(&self.acc_partners).any(|a| a == n) && ty.rows.is_multiple_of(64) && ty.cols == 1 => {
                Layout::wgmma(ty.rows, 8).reduced(1)
            }
            Some(n) if self.acc_derived.iter().any(|a| a == n) && ty.rows.is_multiple_of(64) && ty.cols.is_multiple_of(8) => {
                Layout::wgmma(ty.rows, ty.cols)
            }
            _ => Layout::blocked(ty.rows, ty.cols),
        }
    }

    /// Barrier initialization by thread 0, then a block-wide barrier: appended to the prologue.
    pub(crate) fn finish_hopper(&mut self) {
        use Operand::{Imm, Reg as R};
        if self.barrier_inits.is_empty() {
            return;
        }
        let done = self.label("init_done");
        let t0 = self.reg(RegClass::Pred, "thread0");
        let tid = self.tid;
        self.pro("setp.ne.u32", vec![R(t0), R(tid), Imm(0)]);
        // `bra`, not `bra.uni`: the threads of warp 0 part here (thread 0 alone initializes).
        self.prologue.push(Inst::Op { pred: Some((t0, false)), op: "bra".into(), args: vec![Operand::Sym(done.clone())] });
        for (base, off, stages, count) in std::mem::take(&mut self.barrier_inits) {
            for s in 0..stages {
                self.pro("mbarrier.init.shared::cta.b64", vec![Operand::Addr(base, i64::from(off + 8 * s)), Imm(i64::from(count))]);
            }
        }
        if self.sm90() {
            // TMA (the async proxy) writes where the barriers live.
            self.pro("fence.proxy.async.shared::cta", vec![]);
        }
        self.prologue.push(Inst::Label(done));
        self.pro("bar.sync", vec![Imm(0)]);
    }
}

/// The `stmatrix.x4` operands of an accumulator-layout tile 64 columns wide, per 64 rows and
/// 16-column group: the element pairs of rows 0–7 and 8–15 of the warp's at columns 0–7 of
/// the group, then the same at columns 8–15 (`None` if a pair is not two adjacent slots).
fn stmatrix_fragments(t: &TileVal) -> Option<Vec<[[Reg; 2]; 4]>> {
    let slots = t.layout.slots();
    let pair = |dr: u32, dc: u32| -> Option<[Reg; 2]> {
        let i = slots.iter().position(|s| s.dr == dr && s.dc == dc)?;
        let next = slots.get(i + 1)?;
        (next.dr == dr && next.dc == dc + 1).then(|| [t.regs[i], t.regs[i + 1]])
    };
    let mut out = Vec::new();
    for mb in 0..t.ty.rows / 64 {
        for c in 0..4 {
            let [a, b, c2, d] = [(0, 0), (8, 0), (0, 8), (8, 8)].map(|(dr, dc)| pair(64 * mb + dr, 16 * c + dc));
            out.push([a?, b?, c2?, d?]);
        }
    }
    Some(out)
}

/// The elements a 16-byte vector access of a shared view holds, or 0 where none applies: an
/// unswizzled view (its rows contiguous) of 16-byte-multiple rows, 16- or 32-bit elements, and
/// a layout whose runs are whole vectors (runs start on multiples of their length).
fn vector_len(view: &SmemType, layout: Layout, es: u32) -> usize {
    let len = (16 / es.max(1)) as usize;
    let fits =
        matches!(es, 2 | 4) && view.swizzle == 0 && (layout.run_len() as usize).is_multiple_of(len) && view.row_bytes().is_multiple_of(16);
    if fits {
        len
    } else {
        0
    }
}

/// Whether `slots[i..]` starts one vector of `len` elements ([`vector_len`]; 0: none): one
/// row, consecutive columns from a multiple of `len`.
fn vector_run(slots: &[Slot], i: usize, len: usize) -> bool {
    len > 0
        && i + len <= slots.len()
        && (slots[i].dc as usize).is_multiple_of(len)
        && (1..len).all(|j| slots[i + j].dr == slots[i].dr && slots[i + j].dc == slots[i].dc + j as u32)
}
