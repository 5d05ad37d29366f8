//! The CPU interpreter of TIR-H: what [`Device::cpu`](crate::Device::cpu) runs kernels on.
//!
//! A kernel's checked TIR-H travels in its [`KernelSpec`] as JSON; the first launch parses it
//! once. The semantics are the GPU's, at the granularity TIR-H speaks of:
//!
//! - **Blocks** of the grid are independent; they run on a pool of threads, taking block
//!   indices in order. Results do not depend on the number of threads (a kernel whose blocks
//!   write the same element races on the GPU too), except where a block reads what blocks
//!   running beside it publish (`wait_nonzero` in a `while`: a look-back may meet a block's
//!   total or its running total, as on the GPU). `wait_nonzero` reads its element under the
//!   buffer's lock until it is not 0, yielding the core between reads; after 60 s the launch
//!   fails (no block raises it).
//! - **Warpgroups** of a block run concurrently as coroutines: each runs until it must wait
//!   on a pipeline barrier, then the next one runs. If every live warpgroup waits and none
//!   can arrive, the launch ends with [`Error::Kernel`] naming the barrier, its stage and
//!   phase, and each warpgroup's statement — where the GPU would hang.
//! - **Pipelines** are mbarriers as the hardware keeps them: a pending-arrival count, a
//!   transaction-byte count and a phase. `acquire` waits on the stage's empty barrier with
//!   parity `phase ^ 1`, `wait` on its full barrier with parity `phase`; each warpgroup keeps
//!   its own `(stage, phase)`, as each thread does in registers on the GPU. A TMA load
//!   expects and completes its bytes on the stage's full barrier at once (a schedule the
//!   hardware may take); a panel of a wide box that starts past the tensor is not copied
//!   (nor counted), as on the GPU.
//! - **Values**: scalars are `i32` (wrapping), `f32` and `bool`; tile elements are kept in
//!   their dtype (bf16 and f16 rounded to nearest even, saturating to infinity, as `cvt.rn`
//!   does) and computed in f32. `mma_sync` multiplies exactly and accumulates in f32.
//!   `exp2`, `tanh` and `rsqrt` are exact here where the GPU uses approximations (a few ulp).
//!   An f32 product under an add or subtract is fused (one rounding), as ptxas contracts
//!   `mul.f32` + `add.f32` into `fma.rn.f32`.
//! - **Shared memory** is kept unswizzled (swizzle is a physical layout TIR-H never sees)
//!   with a written flag per element. An MMA that reads an element nothing wrote taints the
//!   accumulator entries it feeds; storing a tainted entry to global memory, or TMA-storing a
//!   shared element nothing wrote, is an error naming the ring and the line that read it.
//!   (Tainted entries that are never stored are fine: on the GPU they are the garbage columns
//!   past a tensor's edge.) Writing a shared view while a TMA store still reads it — before
//!   `tma::store_wait` — is an error too.
//! - **Global memory** accesses are masked as on the GPU (loads fill, stores skip); an access
//!   that still falls outside a tensor's buffer is an error naming the tensor and the line.

mod value;

use crate::tensor::{GlobalDesc, HostBuffer};
use crate::{Device, Error, Grid, Result};
use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use tessera_ptx::tirh::{BinOp, Builtin, Expr, ExprKind, SmemType, Stmt, StmtKind, TileIr, Type, UniformKind};
use tessera_ptx::{DType, KernelSpec};
use value::{Poison, Tile, Val};

/// A launch argument, in parameter order.
pub(crate) enum Arg {
    F32(f32),
    I32(i32),
    Global(GlobalDesc),
}

/// A kernel parsed for the interpreter: its TIR-H and the shared objects it allocates.
struct Program {
    ir: TileIr,
    /// `(name, type)` of each `Smem::ring`, in the order the body mentions them.
    rings: Vec<(String, SmemType)>,
    /// `(name, stages, consumers)` of each `Pipeline::new` and `TileQueue::new`.
    pipes: Vec<(String, u32, u32)>,
    /// The counter of each pipeline that is a tile queue, by pipeline index.
    counters: HashMap<usize, String>,
    /// The ring or pipeline index of each allocating expression, by its address in `ir`.
    slots: HashMap<usize, usize>,
}

fn program(spec: &'static KernelSpec) -> Result<Arc<Program>> {
    static PROGRAMS: OnceLock<Mutex<HashMap<usize, Arc<Program>>>> = OnceLock::new();
    let key = spec.tirh_packed.bytes().as_ptr() as usize;
    let mut cache = PROGRAMS.get_or_init(Default::default).lock().unwrap_or_else(|p| p.into_inner());
    if let Some(p) = cache.get(&key) {
        return Ok(p.clone());
    }
    let ir = TileIr::from_json(spec.tirh()).map_err(|why| Error::Tensor {
        what: "reading a kernel's TIR-H for the CPU interpreter",
        expected: format!("the JSON that this version of tessera embeds (kernel `{}`)", spec.name),
        found: why,
    })?;
    // Box the IR first, so that the addresses scanned stay valid.
    let mut p = Arc::new(Program { ir, rings: Vec::new(), pipes: Vec::new(), counters: HashMap::new(), slots: HashMap::new() });
    let scanned = scan(&p.ir);
    if let Some(p) = Arc::get_mut(&mut p) {
        (p.rings, p.pipes, p.slots, p.counters) = scanned;
    }
    cache.insert(key, p.clone());
    Ok(p)
}

type Scanned = (Vec<(String, SmemType)>, Vec<(String, u32, u32)>, HashMap<usize, usize>, HashMap<usize, String>);

fn scan(ir: &TileIr) -> Scanned {
    fn walk(body: &[Stmt], out: &mut Scanned) {
        for s in body {
            match &s.kind {
                StmtKind::Let { name, value, .. } => match &value.kind {
                    ExprKind::SmemRing(t) => {
                        out.2.insert(value as *const Expr as usize, out.0.len());
                        out.0.push((name.clone(), *t));
                    }
                    ExprKind::PipelineNew { stages, consumers } => {
                        out.2.insert(value as *const Expr as usize, out.1.len());
                        out.1.push((name.clone(), *stages, *consumers));
                    }
                    ExprKind::QueueNew { stages, consumers, counter } => {
                        out.2.insert(value as *const Expr as usize, out.1.len());
                        out.3.insert(out.1.len(), counter.clone());
                        out.1.push((name.clone(), *stages, *consumers));
                    }
                    _ => {}
                },
                StmtKind::For { body, .. } | StmtKind::QueueFor { body, .. } | StmtKind::While { body, .. } => walk(body, out),
                StmtKind::If { then, otherwise, .. } => {
                    walk(then, out);
                    walk(otherwise, out);
                }
                _ => {}
            }
        }
    }
    let mut out = Scanned::default();
    walk(&ir.body, &mut out);
    out
}

/// A global tensor argument.
struct Global {
    name: String,
    dtype: DType,
    shape: Vec<i64>,
    strides: Vec<i64>,
    /// Element offset of `[0, …, 0]` in the buffer.
    base: i64,
    buf: HostBuffer,
}

/// Everything a launch shares between its blocks.
struct Kernel<'p> {
    name: &'static str,
    prog: &'p Program,
    args: Vec<Val>,
    globals: Vec<Global>,
    grid: [u32; 3],
}

/// Runs `spec` over `grid` on the CPU; returns when every block has finished.
pub(crate) fn launch(spec: &'static KernelSpec, device: &Device, grid: Grid, args: Vec<Arg>) -> Result<()> {
    let prog = program(spec)?;
    let mut k = Kernel { name: spec.name, prog: &prog, args: Vec::new(), globals: Vec::new(), grid: [grid.x, grid.y, grid.z] };
    for (p, a) in prog.ir.params.iter().zip(args) {
        let v = match a {
            Arg::F32(x) => Val::F(x),
            Arg::I32(x) => Val::I(x),
            Arg::Global(d) => {
                let (Type::Global { dtype, .. }, Some(buf)) = (p.ty, d.host) else {
                    return Err(Error::Argument {
                        kernel: spec.name,
                        arg: p.name.clone(),
                        expected: "a tensor in host memory".into(),
                        found: "another argument".into(),
                    });
                };
                let to_i64 = |v: &[usize]| v.iter().map(|&x| x as i64).collect::<Vec<_>>();
                k.globals.push(Global {
                    name: p.name.clone(),
                    dtype,
                    shape: to_i64(&d.shape),
                    strides: to_i64(&d.strides),
                    base: (d.ptr / u64::from(dtype.size())) as i64,
                    buf,
                });
                Val::Global(k.globals.len() - 1)
            }
        };
        k.args.push(v);
    }
    let total = grid.x as usize * grid.y as usize * grid.z as usize;
    let workers = device.cpu_threads().unwrap_or(1).min(total).max(1);
    let next = AtomicUsize::new(0);
    // The failure of the lowest-numbered block, so that the error does not depend on timing.
    let failure: Mutex<Option<(usize, Error)>> = Mutex::new(None);
    let work = || loop {
        let b = next.fetch_add(1, Ordering::Relaxed);
        if b >= total || failure.lock().map(|f| f.is_some()).unwrap_or(true) {
            return;
        }
        if let Err(e) = k.run_block(b) {
            let mut f = failure.lock().unwrap_or_else(|p| p.into_inner());
            if f.as_ref().is_none_or(|(at, _)| b < *at) {
                *f = Some((b, e));
            }
        }
    };
    if workers == 1 {
        work();
    } else {
        std::thread::scope(|s| {
            for _ in 0..workers {
                s.spawn(work);
            }
        });
    }
    match failure.into_inner().unwrap_or_else(|p| p.into_inner()) {
        Some((_, e)) => Err(e),
        None => Ok(()),
    }
}

/// An mbarrier: arrivals still expected in this phase, transaction bytes outstanding, and
/// phases completed.
#[derive(Clone, Copy, Debug)]
struct Barrier {
    count: u32,
    pending: u32,
    tx: i64,
    phase: u32,
}

impl Barrier {
    fn new(count: u32) -> Barrier {
        Barrier { count, pending: count, tx: 0, phase: 0 }
    }

    fn settle(&mut self) {
        if self.pending == 0 && self.tx == 0 {
            self.phase += 1;
            self.pending = self.count;
        }
    }

    fn arrive(&mut self) {
        self.pending = self.pending.saturating_sub(1);
        self.settle();
    }

    /// `try_wait.parity`: whether the phase of this parity has completed.
    fn passed(&self, parity: u32) -> bool {
        self.phase % 2 != parity
    }
}

struct Ring {
    data: Vec<f32>,
    written: Vec<bool>,
}

struct Pipe {
    full: Vec<Barrier>,
    empty: Vec<Barrier>,
    /// A tile queue's slots (empty for a pipeline).
    slots: Vec<i32>,
}

/// A shared view: rows `row0..row0 + rows` and columns `col0..col0 + cols` of one stage of a
/// ring.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(crate) struct View {
    ring: usize,
    stage: u32,
    row0: u32,
    rows: u32,
    col0: u32,
    cols: u32,
}

/// The A operand of an `mma_sync`: a shared view or a register tile.
enum MmaA {
    View(View),
    Tile(Tile),
}

/// A TMA store whose shared source may still be read (until `tma::store_wait`).
struct PendingStore {
    view: View,
    line: u32,
}

/// Why a statement did not complete.
enum Flow {
    /// A pipeline wait that is not satisfied yet: the statement runs again later.
    Blocked(Wait),
    /// An error, to be reported with the statement's line.
    Fail(String),
}

impl From<String> for Flow {
    fn from(s: String) -> Flow {
        Flow::Fail(s)
    }
}

/// What a blocked warpgroup waits for.
#[derive(Clone, Copy, Debug)]
enum Wait {
    /// A pipeline's full (consumer) or empty (producer) barrier of `stage` to reach `parity`.
    Pipe { pipe: usize, producer: bool, stage: u32, parity: u32 },
    /// A named barrier's next phase.
    Named(u32),
    /// The block exchange (`block_sum`…): the other warpgroups' parts, or the previous
    /// exchange's last readers.
    Exchange,
}

type Flowing<T> = std::result::Result<T, Flow>;

enum Frame<'p> {
    Body {
        stmts: &'p [Stmt],
        pc: usize,
        mark: usize,
    },
    Loop {
        var: &'p str,
        next: i64,
        end: i64,
        step: i64,
        body: &'p [Stmt],
        mark: usize,
    },
    /// A `while`: each lap tests its condition first.
    While {
        stmt: &'p Stmt,
        mark: usize,
    },
    /// A `for` over a tile queue: each lap draws (or takes) the next index first.
    Queue {
        stmt: &'p Stmt,
        mark: usize,
    },
}

/// One warpgroup's execution state.
struct Wg<'p> {
    id: u32,
    env: Vec<(&'p str, Val)>,
    frames: Vec<Frame<'p>>,
    /// `(stage, phase)` per pipeline.
    pipe_state: Vec<(u32, u32)>,
    stores: VecDeque<PendingStore>,
    /// The statement it waits at, and on what.
    waiting: Option<(&'p Stmt, Wait)>,
    /// `(pipeline, state before)` of each wait the current statement passed: undone if a
    /// later wait in the same statement blocks, so that the statement can run again.
    undo: Vec<(usize, (u32, u32))>,
    /// Per named barrier, the phase this warpgroup waits for after arriving.
    named: [Option<u32>; 7],
    /// Whether its part of the current block exchange is in.
    deposited: bool,
}

/// One block: its shared memory and barriers.
struct Block {
    id: [u32; 3],
    rings: Vec<Ring>,
    pipes: Vec<Pipe>,
    /// Named barriers: `(warpgroups arrived, phases completed)`.
    named: [(u32, u32); 7],
    /// The block exchange: each warpgroup's part, and how many have taken the result.
    parts: Vec<Option<Tile>>,
    taken: u32,
}

enum Step {
    Ran,
    Blocked,
    Done,
}

impl<'p> Kernel<'p> {
    fn fail(&self, s: &Stmt, message: String) -> Error {
        Error::Kernel { kernel: self.name, line: s.loc.line, text: s.text.clone(), message }
    }

    fn run_block(&self, b: usize) -> Result<()> {
        let [gx, gy, _] = self.grid.map(|g| g as usize);
        let id = [(b % gx) as u32, ((b / gx) % gy) as u32, (b / (gx * gy)) as u32];
        let prog = self.prog;
        let mut blk = Block {
            id,
            rings: prog
                .rings
                .iter()
                .map(|(_, t)| {
                    let n = (t.rows * t.cols * t.stages) as usize;
                    Ring { data: vec![0.0; n], written: vec![false; n] }
                })
                .collect(),
            pipes: prog
                .pipes
                .iter()
                .map(|&(_, stages, consumers)| Pipe {
                    // sm_90a: the producer's commit is the one arrival; TMA counts the bytes.
                    full: vec![Barrier::new(1); stages as usize],
                    empty: vec![Barrier::new(consumers); stages as usize],
                    slots: vec![0; stages as usize],
                })
                .collect(),
            named: [(0, 0); 7],
            parts: vec![None; prog.ir.warpgroups as usize],
            taken: 0,
        };
        let mut wgs: Vec<Wg<'p>> = (0..prog.ir.warpgroups)
            .map(|id| Wg {
                id,
                env: prog.ir.params.iter().map(|p| p.name.as_str()).zip(self.args.iter().cloned()).collect(),
                frames: vec![Frame::Body { stmts: &prog.ir.body, pc: 0, mark: self.args.len() }],
                pipe_state: vec![(0, 0); prog.pipes.len()],
                stores: VecDeque::new(),
                waiting: None,
                undo: Vec::new(),
                named: [None; 7],
                deposited: false,
            })
            .collect();
        let mut live = wgs.len();
        while live > 0 {
            let mut progress = false;
            for wg in wgs.iter_mut().filter(|w| !w.frames.is_empty()) {
                loop {
                    match self.step(wg, &mut blk)? {
                        Step::Ran => progress = true,
                        Step::Blocked => break,
                        Step::Done => {
                            progress = true;
                            live -= 1;
                            break;
                        }
                    }
                }
            }
            if !progress && live > 0 {
                return Err(self.deadlock(&wgs, &blk));
            }
        }
        Ok(())
    }

    fn deadlock(&self, wgs: &[Wg<'p>], blk: &Block) -> Error {
        let mut first = None;
        let mut parts = Vec::new();
        for wg in wgs {
            match wg.waiting {
                Some((s, Wait::Named(id))) if !wg.frames.is_empty() => {
                    let (arrived, phase) = blk.named[id as usize];
                    parts.push(format!(
                        "warpgroup {} waits at line {} at named barrier {id} (it has completed {phase} phase(s); {arrived} warpgroup(s) have arrived since)",
                        wg.id, s.loc.line
                    ));
                    first.get_or_insert(s);
                }
                Some((s, Wait::Pipe { pipe, producer, stage, parity })) if !wg.frames.is_empty() => {
                    let (name, _, _) = &self.prog.pipes[pipe];
                    let p = &blk.pipes[pipe];
                    let (kind, bar) = if producer { ("empty", p.empty[stage as usize]) } else { ("full", p.full[stage as usize]) };
                    parts.push(format!(
                        "warpgroup {} waits at line {} for the {kind} barrier of stage {stage} of pipeline `{name}` (parity {parity}; the barrier has completed {} phase(s) and still expects {} arrival(s))",
                        wg.id, s.loc.line, bar.phase, bar.pending
                    ));
                    first.get_or_insert(s);
                }
                Some((s, Wait::Exchange)) if !wg.frames.is_empty() => {
                    let arrived = blk.parts.iter().filter(|p| p.is_some()).count();
                    parts.push(format!(
                        "warpgroup {} waits at line {} at a block exchange ({arrived} of {} warpgroups' parts in)",
                        wg.id,
                        s.loc.line,
                        blk.parts.len()
                    ));
                    first.get_or_insert(s);
                }
                _ => parts.push(format!("warpgroup {} has finished", wg.id)),
            }
        }
        let [x, y, z] = blk.id;
        let message = format!("deadlock in block ({x}, {y}, {z}): {}; nothing left can arrive", parts.join("; "));
        match first {
            Some(s) => self.fail(s, message),
            None => Error::Kernel { kernel: self.name, line: 0, text: String::new(), message },
        }
    }

    /// Runs one statement of `wg` (or enters or leaves a loop or branch).
    fn step(&self, wg: &mut Wg<'p>, blk: &mut Block) -> Result<Step> {
        let Some(frame) = wg.frames.last_mut() else {
            return Ok(Step::Done);
        };
        match frame {
            Frame::Body { stmts, pc, mark } => {
                let (stmts, pc, mark): (&'p [Stmt], usize, usize) = (stmts, *pc, *mark);
                let Some(s) = stmts.get(pc) else {
                    wg.env.truncate(mark);
                    wg.frames.pop();
                    if wg.frames.is_empty() {
                        // The kernel's end: bulk stores complete.
                        wg.stores.clear();
                        return Ok(Step::Done);
                    }
                    return Ok(Step::Ran);
                };
                let s: &'p Stmt = s;
                let depth = wg.frames.len();
                wg.undo.clear();
                match self.exec(s, wg, blk) {
                    Ok(()) => {
                        wg.waiting = None;
                        // `exec` may have pushed a frame above the one that holds `s`.
                        if let Some(Frame::Body { pc, .. }) = wg.frames.get_mut(depth - 1) {
                            *pc += 1;
                        }
                        Ok(Step::Ran)
                    }
                    Err(Flow::Blocked(w)) => {
                        while let Some((p, state)) = wg.undo.pop() {
                            wg.pipe_state[p] = state;
                        }
                        wg.waiting = Some((s, w));
                        Ok(Step::Blocked)
                    }
                    Err(Flow::Fail(m)) => Err(self.fail(s, m)),
                }
            }
            Frame::Queue { stmt, mark } => {
                let (stmt, mark) = (*stmt, *mark);
                let StmtKind::QueueFor { var, body, .. } = &stmt.kind else { return Ok(Step::Done) };
                wg.env.truncate(mark);
                wg.undo.clear();
                match self.queue_next(stmt, wg, blk) {
                    Ok(Some(v)) => {
                        wg.waiting = None;
                        wg.env.push((var.as_str(), Val::I(v)));
                        let inner = wg.env.len();
                        wg.frames.push(Frame::Body { stmts: body, pc: 0, mark: inner });
                    }
                    Ok(None) => {
                        wg.waiting = None;
                        wg.frames.pop();
                    }
                    Err(Flow::Blocked(w)) => {
                        wg.waiting = Some((stmt, w));
                        return Ok(Step::Blocked);
                    }
                    Err(Flow::Fail(m)) => return Err(self.fail(stmt, m)),
                }
                Ok(Step::Ran)
            }
            Frame::While { stmt, mark } => {
                let (stmt, mark) = (*stmt, *mark);
                let StmtKind::While { cond, body } = &stmt.kind else { return Ok(Step::Done) };
                wg.env.truncate(mark);
                // No yield here: a lap that waits on another block does so in `wait_nonzero`,
                // which gives that block's thread the core while it waits.
                match self.eval(cond, wg, blk) {
                    Ok(Val::B(true)) => wg.frames.push(Frame::Body { stmts: body, pc: 0, mark }),
                    Ok(Val::B(false)) => {
                        wg.frames.pop();
                    }
                    Ok(_) => return Err(self.fail(stmt, "`while` takes a bool".to_string())),
                    Err(Flow::Fail(m)) => return Err(self.fail(stmt, m)),
                    Err(Flow::Blocked(_)) => return Err(self.fail(stmt, "a `while` condition cannot wait".to_string())),
                }
                Ok(Step::Ran)
            }
            Frame::Loop { var, next, end, step, body, mark } => {
                if *next < *end {
                    let (var, body, mark, v) = (*var, *body, *mark, *next);
                    *next += *step;
                    wg.env.truncate(mark);
                    wg.env.push((var, Val::I(v as i32)));
                    let inner = wg.env.len();
                    wg.frames.push(Frame::Body { stmts: body, pc: 0, mark: inner });
                } else {
                    let mark = *mark;
                    wg.env.truncate(mark);
                    wg.frames.pop();
                }
                Ok(Step::Ran)
            }
        }
    }

    /// `let s = block_sum(t);`: puts this warpgroup's `t` in (once: the statement runs again
    /// while it waits), waits for every warpgroup's, and combines them in warpgroup order. The
    /// last to take the result empties the exchange; a warpgroup that comes to the next one
    /// before then waits.
    fn block_reduce(&self, op: tessera_ptx::tirh::ReduceOp, value: &'p Expr, wg: &mut Wg<'p>, blk: &mut Block) -> Flowing<Val> {
        if !wg.deposited {
            if blk.parts[wg.id as usize].is_some() {
                return Err(Flow::Blocked(Wait::Exchange));
            }
            let Val::T(t) = self.eval(value, wg, blk)? else { return Err("`block_sum` combines a tile".to_string().into()) };
            blk.parts[wg.id as usize] = Some(t);
            wg.deposited = true;
        }
        if blk.parts.iter().any(Option::is_none) {
            return Err(Flow::Blocked(Wait::Exchange));
        }
        let parts: Vec<Tile> = blk.parts.iter().flatten().cloned().collect();
        wg.deposited = false;
        blk.taken += 1;
        if blk.taken as usize == blk.parts.len() {
            blk.parts.iter_mut().for_each(|p| *p = None);
            blk.taken = 0;
        }
        Ok(Val::T(Tile::combine(&parts, op)))
    }

    fn exec(&self, s: &'p Stmt, wg: &mut Wg<'p>, blk: &mut Block) -> Flowing<()> {
        match &s.kind {
            StmtKind::Let { name, value, .. } => {
                let v = match &value.kind {
                    ExprKind::BlockReduce { op, value } => self.block_reduce(*op, value, wg, blk)?,
                    _ => self.eval(value, wg, blk)?,
                };
                wg.env.push((name.as_str(), v));
            }
            StmtKind::Assign { name, value } => {
                let v = self.eval(value, wg, blk)?;
                match wg.env.iter_mut().rev().find(|(n, _)| *n == name.as_str()) {
                    Some(slot) => slot.1 = v,
                    None => return Err(format!("assigns `{name}`, which is not bound").into()),
                }
            }
            // A hint to the memory system: nothing to do here.
            StmtKind::Prefetch(_) => {}
            StmtKind::Store { tensor, index, value, within } => {
                let g = self.global(tensor, wg)?;
                let idx = self.indices(index, wg, blk)?;
                let Val::T(t) = self.eval(value, wg, blk)? else { return Err("stores a tile".to_string().into()) };
                let ends = match within {
                    Some(e) => Some(self.indices(e, wg, blk)?),
                    None => None,
                };
                self.store_tile(g, &idx, &t, ends.as_deref())?;
            }
            StmtKind::FetchAdd { name, tensor, index, value, inc } => {
                let idx = self.indices(index, wg, blk)?;
                let v = self.int(value, wg, blk)?;
                let g = self.global(tensor, wg)?;
                // The warpgroup's TMA stores complete first (the interpreter's writes are
                // immediate: only their reads of shared memory were pending).
                wg.stores.clear();
                // Under the buffer's lock: blocks on other threads add without losing any, and
                // every earlier write is already there.
                let mut bytes = g.buf.lock();
                let old = match Self::offset(g, &idx) {
                    Some(at) => {
                        if let Some(m) = Self::outside(g, at, g.buf.len) {
                            return Err(format!("adds into {m}").into());
                        }
                        let old = value::read(&bytes, g.dtype, at as usize).to_bits() as i32;
                        // `fetch_inc` compares as `atom.inc.u32` does, unsigned.
                        let new = if !*inc {
                            old.wrapping_add(v)
                        } else if old as u32 >= v as u32 {
                            0
                        } else {
                            old.wrapping_add(1)
                        };
                        value::write(&mut bytes, g.dtype, at as usize, f32::from_bits(new as u32));
                        old
                    }
                    None => 0,
                };
                if let Some(name) = name {
                    wg.env.push((name.as_str(), Val::I(old)));
                }
            }
            StmtKind::WaitNonzero { name, tensor, index } => {
                let idx = self.indices(index, wg, blk)?;
                let g = self.global(tensor, wg)?;
                let flag = match Self::offset(g, &idx) {
                    Some(at) => {
                        if let Some(m) = Self::outside(g, at, g.buf.len) {
                            return Err(format!("waits on {m}").into());
                        }
                        // Raised by a block of lower index, which another thread runs (or ran):
                        // read under the buffer's lock until it is, giving that thread the core.
                        let start = std::time::Instant::now();
                        loop {
                            let v = value::read(&g.buf.lock(), g.dtype, at as usize).to_bits() as i32;
                            if v != 0 {
                                break v;
                            }
                            if start.elapsed() > std::time::Duration::from_secs(60) {
                                return Err(format!("`{tensor}.wait_nonzero` waited 60 s: no block raises the flag").into());
                            }
                            std::thread::yield_now();
                        }
                    }
                    None => 0,
                };
                wg.env.push((name.as_str(), Val::I(flag)));
            }
            StmtKind::AtomicAdd { tensor, index, value, max } => {
                let g = self.global(tensor, wg)?;
                let idx = self.indices(index, wg, blk)?;
                let Val::T(t) = self.eval(value, wg, blk)? else { return Err("adds a tile".to_string().into()) };
                self.add_tile(g, &idx, &t, *max)?;
            }
            StmtKind::For { var, start, end, step, body } => {
                let start = i64::from(self.int(start, wg, blk)?);
                let end = i64::from(self.int(end, wg, blk)?);
                let step = i64::from(self.int(step, wg, blk)?);
                if step <= 0 {
                    return Err(format!("`step_by` must be positive, found {step}").into());
                }
                let mark = wg.env.len();
                wg.frames.push(Frame::Loop { var: var.as_str(), next: start, end, step, body, mark });
            }
            StmtKind::While { .. } => {
                let mark = wg.env.len();
                wg.frames.push(Frame::While { stmt: s, mark });
            }
            StmtKind::QueueFor { .. } => {
                let mark = wg.env.len();
                wg.frames.push(Frame::Queue { stmt: s, mark });
            }
            StmtKind::If { cond, then, otherwise } => {
                let Val::B(c) = self.eval(cond, wg, blk)? else { return Err("`if` takes a bool".to_string().into()) };
                let body = if c { then } else { otherwise };
                let mark = wg.env.len();
                wg.frames.push(Frame::Body { stmts: body, pc: 0, mark });
            }
            StmtKind::TmaLoad { dst, tensor, index, pipe } => {
                let view = self.view(dst, wg, blk)?;
                let g = self.global(tensor, wg)?;
                let idx = self.indices(index, wg, blk)?;
                let p = self.pipe(pipe, wg)?;
                self.tma_load(view, g, &idx, p, blk)?;
            }
            StmtKind::SmemStore { view, value, fragments } => {
                let view = self.view(view, wg, blk)?;
                let Val::T(t) = self.eval(value, wg, blk)? else { return Err("stores a tile".to_string().into()) };
                if let Some(st) = wg.stores.iter().find(|st| overlaps(st.view, view)) {
                    return Err(format!(
                        "writes stage {} of ring `{}` while the TMA store issued at line {} still reads it: `tma::store_wait` first",
                        view.stage, self.prog.rings[view.ring].0, st.line
                    )
                    .into());
                }
                let ty = self.prog.rings[view.ring].1;
                let ring = &mut blk.rings[view.ring];
                for r in 0..t.ty.rows {
                    for c in 0..t.ty.cols {
                        // In fragment order: the element's place in the view's bytes.
                        let (vr, vc) = if *fragments {
                            let p = tessera_ptx::layout::fragment_offset(t.ty.cols, r, c);
                            (p / view.cols, p % view.cols)
                        } else {
                            (r, c)
                        };
                        let at = ring_index(ty, view, vr, vc);
                        let i = (r * t.ty.cols + c) as usize;
                        ring.data[at] = t.v[i];
                        ring.written[at] = !t.poisoned(i);
                    }
                }
            }
            StmtKind::TmaStore { tensor, index, src, add, flat } => {
                let view = self.view(src, wg, blk)?;
                let g = self.global(tensor, wg)?;
                let idx = self.indices(index, wg, blk)?;
                if *flat {
                    self.bulk_store(g, &idx, view, blk, *add)?;
                } else {
                    self.tma_store(g, &idx, view, blk, *add)?;
                }
                wg.stores.push_back(PendingStore { view, line: s.loc.line });
            }
            StmtKind::NamedBarrier { id, warpgroups, wait, .. } => {
                let i = *id as usize;
                if i >= blk.named.len() {
                    return Err(format!("named barrier {id} does not exist (0 to 6)").into());
                }
                // Arrive once (a blocked `sync` runs again: it has arrived already).
                let target = match wg.named[i] {
                    Some(t) => t,
                    None => {
                        let (arrived, phase) = &mut blk.named[i];
                        *arrived += 1;
                        let target = *phase + 1;
                        if *arrived >= *warpgroups {
                            *arrived = 0;
                            *phase += 1;
                        }
                        target
                    }
                };
                if *wait && blk.named[i].1 < target {
                    wg.named[i] = Some(target);
                    return Err(Flow::Blocked(Wait::Named(*id)));
                }
                wg.named[i] = None;
            }
            StmtKind::TmaStoreWait(n) => {
                while wg.stores.len() > *n as usize {
                    wg.stores.pop_front();
                }
            }
            StmtKind::PipeCommit { pipe, stage } | StmtKind::PipeRelease { pipe, stage } => {
                let p = self.pipe(pipe, wg)?;
                let st = self.int(stage, wg, blk)?;
                let (name, stages, _) = &self.prog.pipes[p];
                if st < 0 || st as u32 >= *stages {
                    return Err(format!("stage {st} of pipeline `{name}`, which has {stages}").into());
                }
                let pipe = &mut blk.pipes[p];
                let bars = if matches!(s.kind, StmtKind::PipeCommit { .. }) { &mut pipe.full } else { &mut pipe.empty };
                bars[st as usize].arrive();
            }
            StmtKind::MmaWait(_) | StmtKind::SetMaxNReg(_) => {}
            // The type checker inlines device-function calls; a checked kernel holds none.
            StmtKind::Eval(_) | StmtKind::Unpack { .. } => return Err("a device-function call that was not inlined".to_string().into()),
            StmtKind::Mma { acc, a, b, b_kn, a_t } => {
                let va = match self.eval(a, wg, blk)? {
                    Val::View(v) => MmaA::View(v),
                    Val::T(t) => MmaA::Tile(t),
                    _ => return Err("`mma_sync`: `a` must be a shared view or a register tile".to_string().into()),
                };
                let vb = self.view(b, wg, blk)?;
                let line = s.loc.line;
                let prod = self.mma_product(va, vb, *b_kn, *a_t, blk, line);
                let Some((_, Val::T(t))) = wg.env.iter_mut().rev().find(|(n, _)| *n == acc.as_str()) else {
                    return Err(format!("`{acc}` is not a tile").into());
                };
                let (m, ab_poison) = prod;
                for (x, y) in t.v.iter_mut().zip(&m) {
                    *x = (f64::from(*x) + *y) as f32;
                }
                if let Some(p) = ab_poison {
                    t.merge_poison(p);
                }
            }
        }
        Ok(())
    }

    /// The next index of a `for` over a tile queue, or `None` when the producer has run out.
    /// The producer draws from the global counter (and puts it back to 0 on the grid's last
    /// draw), as the lowering does; both sides wait on the queue's barriers like a pipeline.
    fn queue_next(&self, s: &'p Stmt, wg: &mut Wg<'p>, blk: &mut Block) -> Flowing<Option<i32>> {
        let StmtKind::QueueFor { queue, total, .. } = &s.kind else { return Ok(None) };
        let p = self.pipe(queue, wg)?;
        let stage = self.ring_wait(p, total.is_some(), wg, blk)?;
        let value = match total {
            Some(total) => {
                let total = self.int(total, wg, blk)?;
                let counter = self.prog.counters.get(&p).ok_or_else(|| format!("`{queue}` is not a tile queue"))?;
                let g = self.global(counter, wg)?;
                let drawn = {
                    let mut bytes = g.buf.lock();
                    let at = usize::try_from(g.base).unwrap_or(usize::MAX).saturating_mul(4);
                    let Some(word) = bytes.get_mut(at..at + 4) else {
                        return Err(format!("the counter `{counter}` of tile queue `{queue}` has no element 0").into());
                    };
                    let drawn = i32::from_le_bytes([word[0], word[1], word[2], word[3]]);
                    let blocks = self.grid.iter().map(|&g| i64::from(g)).product::<i64>();
                    let next = if i64::from(drawn) == i64::from(total) + blocks - 1 { 0 } else { drawn.wrapping_add(1) };
                    word.copy_from_slice(&next.to_le_bytes());
                    drawn
                };
                let publish = if drawn < total { drawn } else { -1 };
                let pipe = &mut blk.pipes[p];
                pipe.slots[stage as usize] = publish;
                pipe.full[stage as usize].arrive();
                publish
            }
            None => {
                let pipe = &mut blk.pipes[p];
                pipe.empty[stage as usize].arrive();
                pipe.slots[stage as usize]
            }
        };
        Ok((value >= 0).then_some(value))
    }

    /// Waits for the current stage of barrier ring `p` to be empty (`producer`) or full, and
    /// advances the warpgroup's `(stage, phase)` past it (undone if the statement blocks
    /// later); gives the stage.
    fn ring_wait(&self, p: usize, producer: bool, wg: &mut Wg<'p>, blk: &Block) -> Flowing<u32> {
        let (stage, phase) = wg.pipe_state[p];
        let ring = &blk.pipes[p];
        let (bar, parity) = if producer { (ring.empty[stage as usize], phase ^ 1) } else { (ring.full[stage as usize], phase) };
        if !bar.passed(parity) {
            return Err(Flow::Blocked(Wait::Pipe { pipe: p, producer, stage, parity }));
        }
        let stages = self.prog.pipes[p].1;
        wg.undo.push((p, (stage, phase)));
        wg.pipe_state[p] = if stage + 1 == stages { (0, phase ^ 1) } else { (stage + 1, phase) };
        Ok(stage)
    }

    fn global(&self, name: &str, wg: &Wg<'p>) -> Flowing<&Global> {
        match lookup(wg, name)? {
            Val::Global(i) => Ok(&self.globals[*i]),
            _ => Err(format!("`{name}` is not a tensor").into()),
        }
    }

    fn pipe(&self, name: &str, wg: &Wg<'p>) -> Flowing<usize> {
        match lookup(wg, name)? {
            Val::Pipe(i) => Ok(*i),
            _ => Err(format!("`{name}` is not a pipeline").into()),
        }
    }

    fn int(&self, e: &Expr, wg: &mut Wg<'p>, blk: &mut Block) -> Flowing<i32> {
        match self.eval(e, wg, blk)? {
            Val::I(i) => Ok(i),
            _ => Err("expected an i32".to_string().into()),
        }
    }

    fn indices(&self, index: &[Expr], wg: &mut Wg<'p>, blk: &mut Block) -> Flowing<Vec<i64>> {
        index.iter().map(|e| self.int(e, wg, blk).map(i64::from)).collect()
    }

    fn view(&self, e: &Expr, wg: &mut Wg<'p>, blk: &mut Block) -> Flowing<View> {
        match self.eval(e, wg, blk)? {
            Val::View(v) => Ok(v),
            _ => Err("expected a shared view".to_string().into()),
        }
    }

    fn eval(&self, e: &Expr, wg: &mut Wg<'p>, blk: &mut Block) -> Flowing<Val> {
        Ok(match &e.kind {
            ExprKind::Var(n) => lookup(wg, n)?.clone(),
            ExprKind::Int(v) => Val::I(*v as i32),
            ExprKind::Float(v) => Val::F(*v as f32),
            ExprKind::Bool(b) => Val::B(*b),
            ExprKind::Builtin(b) => Val::I(match b {
                Builtin::BlockId(a) => blk.id[usize::from(*a).min(2)] as i32,
                Builtin::GridDim(a) => self.grid[usize::from(*a).min(2)] as i32,
                Builtin::WarpgroupId => wg.id as i32,
            }),
            ExprKind::Dim { tensor, axis } => {
                let g = self.global(tensor, wg)?;
                Val::I(g.shape.get(*axis as usize).copied().unwrap_or(0) as i32)
            }
            ExprKind::Full { tile, value } => {
                let v = self.eval(value, wg, blk)?;
                Val::T(Tile::full(*tile, value::element_of(&v, tile.dtype)))
            }
            ExprKind::Load { tensor, index, fill, tile } => {
                let Some(ty) = tile else { return Err("a load without a shape".to_string().into()) };
                let idx = self.indices(index, wg, blk)?;
                let fill = match fill {
                    Some(f) => {
                        let v = self.eval(f, wg, blk)?;
                        value::element_of(&v, ty.dtype)
                    }
                    None => 0.0,
                };
                let g = self.global(tensor, wg)?;
                Val::T(self.load_tile(g, &idx, *ty, fill)?)
            }
            ExprKind::LoadFragments { tensor, index, tile } => {
                let idx = self.indices(index, wg, blk)?;
                let g = self.global(tensor, wg)?;
                Val::T(self.load_fragments(g, &idx, *tile)?)
            }
            ExprKind::Cast { value, to } => value::cast(self.eval(value, wg, blk)?, *to)?,
            ExprKind::Unary(op, a) => value::unary(*op, self.eval(a, wg, blk)?)?,
            ExprKind::Binary(op @ (BinOp::Add | BinOp::Sub), a, b) if f32_product(a).is_some() || f32_product(b).is_some() => {
                let (product_left, (px, py), other) = match f32_product(a) {
                    Some(p) => (true, p, b),
                    None => (false, f32_product(b).unwrap_or((a, b)), a),
                };
                let x = self.eval(px, wg, blk)?;
                let y = self.eval(py, wg, blk)?;
                let z = self.eval(other, wg, blk)?;
                value::fused(*op, product_left, x, y, z)?
            }
            ExprKind::Binary(op, a, b) => {
                let x = self.eval(a, wg, blk)?;
                let y = self.eval(b, wg, blk)?;
                value::binary(*op, x, y)?
            }
            ExprKind::MaskCols { value, limit, fill } => {
                let Val::T(mut t) = self.eval(value, wg, blk)? else { return Err("`mask_cols` takes a tile".to_string().into()) };
                // One limit for every row, or one per row (an f32 column tile).
                let limits: Vec<f64> = match self.eval(limit, wg, blk)? {
                    Val::I(l) => vec![f64::from(l); t.ty.rows as usize],
                    Val::T(l) => l.v.iter().map(|&v| f64::from(v)).collect(),
                    _ => return Err("`mask_cols` takes an i32 or a column tile".to_string().into()),
                };
                let fill = value::element_of(&self.eval(fill, wg, blk)?, t.ty.dtype);
                let cols = t.ty.cols as usize;
                for (i, x) in t.v.iter_mut().enumerate() {
                    if (i % cols) as f64 >= limits[i / cols] {
                        *x = fill;
                        // A masked element no longer comes from what it read.
                        if let Some(p) = t.poison.as_mut() {
                            p.mask[i] = false;
                        }
                    }
                }
                if t.poison.as_ref().is_some_and(|p| !p.mask.contains(&true)) {
                    t.poison = None;
                }
                Val::T(t)
            }
            ExprKind::KeepWhere { value, cond, fill } => {
                let Val::T(mut t) = self.eval(value, wg, blk)? else { return Err("`keep_where` takes a tile".to_string().into()) };
                let Val::T(c) = self.eval(cond, wg, blk)? else { return Err("`keep_where` takes a tile condition".to_string().into()) };
                let fill = value::element_of(&self.eval(fill, wg, blk)?, t.ty.dtype);
                let (cols, c_rows, c_cols) = (t.ty.cols as usize, c.ty.rows as usize, c.ty.cols as usize);
                for (i, x) in t.v.iter_mut().enumerate() {
                    let (r, k) = (i / cols, i % cols);
                    // A 1-wide or 1-high condition broadcasts.
                    let at = (r % c_rows) * c_cols + k % c_cols;
                    if c.v[at] < 0.0 || c.v[at].is_nan() {
                        *x = fill;
                    }
                }
                Val::T(t)
            }
            ExprKind::Iota { tile, axis } => {
                let mut t = Tile::full(*tile, 0.0);
                let cols = tile.cols as usize;
                for (i, x) in t.v.iter_mut().enumerate() {
                    *x = if *axis == 1 { (i % cols) as f32 } else { (i / cols) as f32 };
                }
                Val::T(t)
            }
            ExprKind::Uniform { tile, kind, seed, origin } => {
                let mut w = Vec::new();
                for e in seed.iter().chain(origin) {
                    let Val::I(v) = self.eval(e, wg, blk)? else { return Err(format!("`{}` takes i32 scalars", kind.name()).into()) };
                    w.push(v as u32);
                }
                let mut t = Tile::full(*tile, 0.0);
                let cols = tile.cols as usize;
                if let UniformKind::Bytes { transposed } = *kind {
                    let [lo, hi, offset, stream, row, col] = w[..] else { return Err("`uniform8` takes six scalars".to_string().into()) };
                    if row % 16 != 0 || col % 16 != 0 {
                        let msg = format!(
                            "`{}`'s origin must be multiples of 16 (a Philox call per 4×4 block), found [{row}, {col}]",
                            kind.name()
                        );
                        return Err(msg.into());
                    }
                    let seed = u64::from(lo) | u64::from(hi) << 32;
                    for (i, x) in t.v.iter_mut().enumerate() {
                        let (mut r, mut c) = ((i / cols) as u32, (i % cols) as u32);
                        if transposed {
                            (r, c) = (c, r);
                        }
                        *x = tessera_ptx::random::uniform8(seed, offset, stream, row.wrapping_add(r), col.wrapping_add(c));
                    }
                } else {
                    let [lo, hi, offset, row, col] = w[..] else { return Err("`uniform` takes five scalars".to_string().into()) };
                    for (i, x) in t.v.iter_mut().enumerate() {
                        let (r, c) = ((i / cols) as u32, (i % cols) as u32);
                        *x = tessera_ptx::random::uniform_at([lo, hi], offset, row as i32, col as i32, r, c);
                    }
                }
                Val::T(t)
            }
            ExprKind::SmemLoad(view) => {
                let v = self.view(view, wg, blk)?;
                let rt = self.prog.rings[v.ring].1;
                let ring = &blk.rings[v.ring];
                let ty = tessera_ptx::tirh::TileType { dtype: rt.dtype, rows: v.rows, cols: v.cols };
                let mut t = Tile::full(ty, 0.0);
                let mut bad = vec![false; t.v.len()];
                for r in 0..v.rows {
                    for c in 0..v.cols {
                        let at = ring_index(rt, v, r, c);
                        let i = (r * v.cols + c) as usize;
                        t.v[i] = ring.data[at];
                        bad[i] = !ring.written[at];
                    }
                }
                if bad.contains(&true) {
                    t.poison =
                        Some(Box::new(Poison { mask: bad, what: format!("stage {} of ring `{}`", v.stage, self.prog.rings[v.ring].0) }));
                }
                Val::T(t)
            }
            ExprKind::SwapPairs(value) => match self.eval(value, wg, blk)? {
                Val::T(mut t) => {
                    for pair in t.v.chunks_exact_mut(2) {
                        pair.swap(0, 1);
                    }
                    if let Some(p) = t.poison.as_mut() {
                        for pair in p.mask.chunks_exact_mut(2) {
                            pair.swap(0, 1);
                        }
                    }
                    Val::T(t)
                }
                _ => return Err("`swap_pairs` takes a tile".to_string().into()),
            },
            ExprKind::EdgeCol { value, last } => match self.eval(value, wg, blk)? {
                Val::T(t) => Val::T(t.cols(if *last { t.ty.cols - 1 } else { 0 }, 1)),
                _ => return Err("`last_col` and `first_col` take a tile".to_string().into()),
            },
            ExprKind::Get { tensor, index } => {
                let idx = self.indices(index, wg, blk)?;
                let g = self.global(tensor, wg)?;
                let bytes = g.buf.lock();
                let x = match Self::offset(g, &idx) {
                    Some(at) => {
                        if let Some(m) = Self::outside(g, at, g.buf.len) {
                            return Err(format!("reads {m}").into());
                        }
                        value::read(&bytes, g.dtype, at as usize)
                    }
                    None => 0.0,
                };
                if g.dtype == tessera_ptx::DType::I32 {
                    Val::I(x.to_bits() as i32)
                } else {
                    Val::F(x)
                }
            }
            ExprKind::TileCols { value, start, cols } => match self.eval(value, wg, blk)? {
                Val::T(t) => Val::T(t.cols(*start, *cols)),
                _ => return Err("`cols` takes a tile".to_string().into()),
            },
            ExprKind::BlockReduce { .. } => return Err("`block_sum` is the whole value of a `let`".to_string().into()),
            // A warpgroup holds its whole tile here: the GPU's join over its 128 threads is
            // this test over every element (`≥ 0` is false for NaN).
            ExprKind::TileAll(value) => match self.eval(value, wg, blk)? {
                Val::T(t) => {
                    if let Some(p) = t.poison.as_ref().filter(|p| p.mask.contains(&true)) {
                        return Err(format!("`tile_all` tests a value computed from shared memory nothing wrote ({})", p.what).into());
                    }
                    Val::B(t.v.iter().all(|&x| x >= 0.0))
                }
                _ => return Err("`tile_all` tests a tile".to_string().into()),
            },
            ExprKind::Call { func, .. } | ExprKind::Scan { func, .. } => {
                return Err(format!("`{func}`: a device-function call that was not inlined").into())
            }
            ExprKind::Shift { value, axis, by, reverse, fill } => match (self.eval(value, wg, blk)?, self.eval(fill, wg, blk)?) {
                (Val::T(t), Val::F(f)) => Val::T(t.shift(*axis, *by, *reverse, f)),
                (Val::T(t), Val::T(from)) if from.ty == t.ty => Val::T(t.shift_from(*axis, *by, *reverse, &from)),
                _ => return Err("`shift_cols` takes an f32 tile and an f32 fill or a tile of its type".to_string().into()),
            },
            ExprKind::ScanPart { value, step, fill } => match (self.eval(value, wg, blk)?, self.eval(fill, wg, blk)?) {
                (Val::T(t), Val::F(f)) => Val::T(t.scan_part(*step, f)),
                _ => return Err("a scan step takes an f32 tile and an f32 identity".to_string().into()),
            },
            ExprKind::ScanPick { updated, old, step } => match (self.eval(updated, wg, blk)?, self.eval(old, wg, blk)?) {
                (Val::T(u), Val::T(o)) => Val::T(u.scan_pick(&o, *step)),
                _ => return Err("a scan step picks between two tiles".to_string().into()),
            },
            ExprKind::Reduce { op, axis, value } => match self.eval(value, wg, blk)? {
                Val::T(t) => Val::T(t.reduce(*op, *axis)),
                _ => return Err("reductions take a tile".to_string().into()),
            },
            ExprKind::SmemRing(_) | ExprKind::PipelineNew { .. } | ExprKind::QueueNew { .. } => {
                let slot = self.prog.slots.get(&(e as *const Expr as usize)).copied();
                match (slot, &e.kind) {
                    (Some(i), ExprKind::SmemRing(_)) => Val::Ring(i),
                    (Some(i), _) => Val::Pipe(i),
                    (None, _) => return Err("a ring or pipeline is allocated by a `let` of its own".to_string().into()),
                }
            }
            ExprKind::SmemAt { ring, stage } => {
                let Val::Ring(r) = lookup(wg, ring)?.clone() else { return Err(format!("`{ring}` is not a ring").into()) };
                let st = self.int(stage, wg, blk)?;
                let (name, ty) = &self.prog.rings[r];
                if st < 0 || st as u32 >= ty.stages {
                    return Err(format!("stage {st} of ring `{name}`, which has {} stages", ty.stages).into());
                }
                Val::View(View { ring: r, stage: st as u32, row0: 0, rows: ty.rows, col0: 0, cols: ty.cols })
            }
            ExprKind::SmemRows { view, start, rows } => {
                let v = self.view(view, wg, blk)?;
                let st = self.int(start, wg, blk)?;
                if st < 0 || st as u32 + rows > v.rows {
                    return Err(format!("rows {st}..{} of a view of {} rows", i64::from(st) + i64::from(*rows), v.rows).into());
                }
                Val::View(View { row0: v.row0 + st as u32, rows: *rows, ..v })
            }
            ExprKind::SmemCols { view, start, cols } => {
                let v = self.view(view, wg, blk)?;
                if start + cols > v.cols {
                    return Err(format!("columns {start}..{} of a view of {} columns", start + cols, v.cols).into());
                }
                Val::View(View { col0: v.col0 + start, cols: *cols, ..v })
            }
            ExprKind::PipeStage { pipe, producer } => {
                let p = self.pipe(pipe, wg)?;
                Val::I(self.ring_wait(p, *producer, wg, blk)? as i32)
            }
        })
    }

    /// The element offset of `coords` in `g`'s buffer, or `None` out of bounds.
    fn offset(g: &Global, coords: &[i64]) -> Option<i64> {
        let mut at = g.base;
        for ((&c, &d), &s) in coords.iter().zip(&g.shape).zip(&g.strides) {
            if c < 0 || c >= d {
                return None;
            }
            at += c * s;
        }
        Some(at)
    }

    /// Coordinates of tile element `(r, c)` from origin `idx`, as `load` and `store` place it.
    fn coords(idx: &[i64], rank: usize, cols: u32, r: u32, c: u32, out: &mut Vec<i64>) {
        out.clear();
        out.extend_from_slice(idx);
        if rank >= 2 {
            out[rank - 2] += i64::from(r);
            out[rank - 1] += i64::from(c);
        } else if cols == 1 {
            out[0] += i64::from(r);
        } else {
            out[0] += i64::from(c);
        }
    }

    fn outside(g: &Global, at: i64, len: usize) -> Option<String> {
        (at < 0 || at as usize >= len).then(|| format!("`{}` at element {at}, outside its buffer of {len} elements", g.name))
    }

    fn load_tile(&self, g: &Global, idx: &[i64], ty: tessera_ptx::tirh::TileType, fill: f32) -> Flowing<Tile> {
        let bytes = g.buf.lock();
        let len = g.buf.len;
        let mut t = Tile::full(ty, fill);
        let mut co = Vec::with_capacity(idx.len());
        for r in 0..ty.rows {
            for c in 0..ty.cols {
                Self::coords(idx, g.shape.len(), ty.cols, r, c, &mut co);
                if let Some(at) = Self::offset(g, &co) {
                    if let Some(m) = Self::outside(g, at, len) {
                        return Err(format!("reads {m}").into());
                    }
                    t.v[(r * ty.cols + c) as usize] = value::read(&bytes, g.dtype, at as usize);
                }
            }
        }
        Ok(t)
    }

    /// The first element of a flat access of `n` elements from `idx` (every index inside the
    /// tensor), which must end within the tensor's elements (`shape[0]·strides[0]`) and its
    /// buffer, and start 16-byte aligned as the GPU's bulk copies and vector loads do.
    fn flat_start(what: &str, g: &Global, idx: &[i64], n: i64) -> Flowing<i64> {
        let Some(at) = Self::offset(g, idx) else {
            return Err(format!("`{what}` at {idx:?}, outside `{}` of shape {:?}", g.name, g.shape).into());
        };
        let end = g.base + g.shape.first().copied().unwrap_or(1) * g.strides.first().copied().unwrap_or(1);
        if at + n > end.min(g.buf.len as i64) {
            return Err(format!("`{what}` of {n} elements from {idx:?} runs past the end of `{}` (shape {:?})", g.name, g.shape).into());
        }
        if (at * i64::from(g.dtype.size())) % 16 != 0 {
            return Err(format!(
                "`{what}` from {idx:?} of `{}`: the first element must lie 16-byte aligned, or the GPU stops on a misaligned address",
                g.name
            )
            .into());
        }
        Ok(at)
    }

    /// `tma::store_flat` / `tma::reduce_add_flat` (`add`): the view's elements, in its memory
    /// order, into the tensor's consecutive elements from `idx`.
    fn bulk_store(&self, g: &Global, idx: &[i64], view: View, blk: &Block, add: bool) -> Flowing<()> {
        let what = if add { "tma::reduce_add_flat" } else { "tma::store_flat" };
        let (name, ty) = &self.prog.rings[view.ring];
        let n = view.rows * view.cols;
        let at = Self::flat_start(what, g, idx, i64::from(n))?;
        let ring = &blk.rings[view.ring];
        let mut bytes = g.buf.lock();
        for p in 0..n {
            let s = ring_index(*ty, view, p / view.cols, p % view.cols);
            if !ring.written[s] {
                return Err(format!(
                    "`{what}` into `{}` reads element {p} of stage {} of ring `{name}`, which nothing wrote",
                    g.name, view.stage
                )
                .into());
            }
            let dst = (at + i64::from(p)) as usize;
            let x = if add { value::read(&bytes, g.dtype, dst) + ring.data[s] } else { ring.data[s] };
            value::write(&mut bytes, g.dtype, dst, x);
        }
        Ok(())
    }

    /// `tensor.load_fragments::<ty>(idx)`: an accumulator from consecutive elements in
    /// fragment order.
    fn load_fragments(&self, g: &Global, idx: &[i64], ty: tessera_ptx::tirh::TileType) -> Flowing<Tile> {
        let at = Self::flat_start("load_fragments", g, idx, i64::from(ty.rows * ty.cols))?;
        let bytes = g.buf.lock();
        let mut t = Tile::full(ty, 0.0);
        for r in 0..ty.rows {
            for c in 0..ty.cols {
                let p = tessera_ptx::layout::fragment_offset(ty.cols, r, c);
                t.v[(r * ty.cols + c) as usize] = value::read(&bytes, g.dtype, (at + i64::from(p)) as usize);
            }
        }
        Ok(t)
    }

    fn store_tile(&self, g: &Global, idx: &[i64], t: &Tile, ends: Option<&[i64]>) -> Flowing<()> {
        Self::each_element(g, idx, t, ends, ("writes", "stores into"), |bytes, at, v| value::write(bytes, g.dtype, at, v))
    }

    /// `atomic_add`: each in-bounds element added to the f32 tensor's (under the buffer's lock,
    /// so blocks on other threads add without losing any); `max` (`atomic_max`): the larger
    /// kept, compared as the GPU's bit operations compare them (a positive NaN wins).
    fn add_tile(&self, g: &Global, idx: &[i64], t: &Tile, max: bool) -> Flowing<()> {
        Self::each_element(g, idx, t, None, ("adds", "adds into"), |bytes, at, v| {
            let old = value::read(bytes, g.dtype, at);
            let new = match max {
                false => old + v,
                true if (v.to_bits() as i32) >= 0 => f32::from_bits((old.to_bits() as i32).max(v.to_bits() as i32) as u32),
                true => f32::from_bits(old.to_bits().min(v.to_bits())),
            };
            value::write(bytes, g.dtype, at, new);
        })
    }

    /// `put(bytes, offset, value)` for each element of `t` at origin `idx` inside the tensor
    /// (and the `ends`), under the buffer's lock; an element past the buffer or computed from
    /// shared memory nothing wrote is an error, said with `verbs`.
    fn each_element(
        g: &Global, idx: &[i64], t: &Tile, ends: Option<&[i64]>, (verb, into): (&str, &str), mut put: impl FnMut(&mut [u8], usize, f32),
    ) -> Flowing<()> {
        let mut bytes = g.buf.lock();
        let len = g.buf.len;
        let mut co = Vec::with_capacity(idx.len());
        for r in 0..t.ty.rows {
            for c in 0..t.ty.cols {
                Self::coords(idx, g.shape.len(), t.ty.cols, r, c, &mut co);
                if ends.is_some_and(|e| co.iter().zip(e).any(|(x, end)| x >= end)) {
                    continue;
                }
                if let Some(at) = Self::offset(g, &co) {
                    if let Some(m) = Self::outside(g, at, len) {
                        return Err(format!("{verb} {m}").into());
                    }
                    let i = (r * t.ty.cols + c) as usize;
                    if t.poisoned(i) {
                        let what = t.poison.as_ref().map_or(String::new(), |p| p.what.clone());
                        return Err(format!("{into} `{}` a value computed from shared memory nothing wrote ({what})", g.name).into());
                    }
                    put(&mut bytes, at as usize, t.v[i]);
                }
            }
        }
        Ok(())
    }

    fn tma_load(&self, view: View, g: &Global, idx: &[i64], pipe: usize, blk: &mut Block) -> Flowing<()> {
        let (name, ty) = &self.prog.rings[view.ring];
        let rank = g.shape.len();
        Self::tma_box_aligned("tma::load", g, idx)?;
        let col_dim = g.shape[rank - 1];
        // The view's own panels (whole panels of the ring's, a `cols` view fewer of them).
        let pcols = ty.panel_cols();
        let panels = view.cols / pcols;
        let bytes = g.buf.lock();
        let len = g.buf.len;
        let ring = &mut blk.rings[view.ring];
        let bar = &mut blk.pipes[pipe].full[view.stage as usize];
        let mut co = Vec::with_capacity(rank);
        if let Some(bc) = tessera_ptx::lower::hopper::wide_row_box(ty.cols, ty.swizzle, ty.dtype) {
            // An unswizzled row wider than a box: boxes of one row and `bc` columns, one past
            // the tensor's rows or columns not issued (nor counted), as the GPU's.
            let row_dim = g.shape[rank - 2];
            for r in 0..view.rows {
                for b in 0..view.cols / bc {
                    let c0 = b * bc;
                    if idx[rank - 2] + i64::from(r) >= row_dim || idx[rank - 1] + i64::from(c0) >= col_dim {
                        continue;
                    }
                    for c in c0..c0 + bc {
                        Self::coords(idx, rank, 2, r, c, &mut co);
                        let v = match Self::offset(g, &co) {
                            Some(at) => {
                                if let Some(m) = Self::outside(g, at, len) {
                                    return Err(format!("TMA reads {m} (ring `{name}`)").into());
                                }
                                value::read(&bytes, g.dtype, at as usize)
                            }
                            None => 0.0,
                        };
                        let at = ring_index(*ty, view, r, c);
                        ring.data[at] = v;
                        ring.written[at] = true;
                    }
                    bar.settle();
                }
            }
            return Ok(());
        }
        for p in 0..panels {
            let c0 = p * pcols;
            // A panel starting past the tensor's columns is not issued (nor counted).
            if p > 0 && (idx[rank - 1] + i64::from(c0) >= col_dim) {
                continue;
            }
            let box_bytes = i64::from(view.rows * pcols * ty.dtype.size());
            bar.tx += box_bytes;
            for r in 0..view.rows {
                for c in c0..c0 + pcols {
                    Self::coords(idx, rank, 2, r, c, &mut co);
                    let v = match Self::offset(g, &co) {
                        Some(at) => {
                            if let Some(m) = Self::outside(g, at, len) {
                                return Err(format!("TMA reads {m} (ring `{name}`)").into());
                            }
                            value::read(&bytes, g.dtype, at as usize)
                        }
                        None => 0.0,
                    };
                    let at = ring_index(*ty, view, r, c);
                    ring.data[at] = v;
                    ring.written[at] = true;
                }
            }
            bar.tx -= box_bytes;
            bar.settle();
        }
        Ok(())
    }

    /// A TMA box must start on 16 bytes along the tensor's rows (its tensor map's base and
    /// strides are): elsewhere the GPU stops on an illegal instruction.
    fn tma_box_aligned(what: &str, g: &Global, idx: &[i64]) -> Flowing<()> {
        let col = idx.last().copied().unwrap_or(0);
        let es = i64::from(g.dtype.size());
        if (col * es).rem_euclid(16) != 0 {
            return Err(format!(
                "`{what}` of `{}` at column {col} ({} bytes into a row): a TMA box starts 16-byte aligned along the rows, or the GPU stops on an illegal instruction",
                g.name,
                col * es
            )
            .into());
        }
        Ok(())
    }

    /// `tma::store` (or `tma::reduce_add`, `add`: each element added to the tensor's) of a
    /// shared view into `g` at `idx`, out-of-bounds elements skipped.
    fn tma_store(&self, g: &Global, idx: &[i64], view: View, blk: &Block, add: bool) -> Flowing<()> {
        let (name, ty) = &self.prog.rings[view.ring];
        Self::tma_box_aligned(if add { "tma::reduce_add" } else { "tma::store" }, g, idx)?;
        if ty.swizzle > 0 && view.cols * ty.dtype.size() > ty.swizzle {
            return Err(format!(
                "`tma::store` of a view of ring `{name}`, whose rows ({} bytes) are wider than its {}-byte swizzle span: the GPU stores one box of one span",
                view.cols * ty.dtype.size(),
                ty.swizzle
            )
            .into());
        }
        let rank = g.shape.len();
        let ring = &blk.rings[view.ring];
        let mut bytes = g.buf.lock();
        let len = g.buf.len;
        let mut co = Vec::with_capacity(rank);
        for r in 0..view.rows {
            for c in 0..view.cols {
                Self::coords(idx, rank, 2, r, c, &mut co);
                if let Some(at) = Self::offset(g, &co) {
                    if let Some(m) = Self::outside(g, at, len) {
                        return Err(format!("TMA writes {m}").into());
                    }
                    let s = ring_index(*ty, view, r, c);
                    if !ring.written[s] {
                        return Err(format!(
                            "TMA-stores into `{}` row {} column {c} of stage {} of ring `{name}`, which nothing wrote",
                            g.name,
                            view.row0 + r,
                            view.stage
                        )
                        .into());
                    }
                    let x = if add { value::read(&bytes, g.dtype, at as usize) + ring.data[s] } else { ring.data[s] };
                    value::write(&mut bytes, g.dtype, at as usize, x);
                }
            }
        }
        Ok(())
    }

    /// `a · bᵀ` (or `a · b` when `b` is K×N) in f64, and the taint of entries fed by shared
    /// elements nothing wrote.
    #[allow(clippy::too_many_arguments)]
    fn mma_product(&self, a: MmaA, b: View, b_kn: bool, a_t: bool, blk: &Block, line: u32) -> (Vec<f64>, Option<Poison>) {
        let tb = self.prog.rings[b.ring].1;
        let (m, k) = match &a {
            MmaA::View(a) if a_t => (a.cols, a.rows),
            MmaA::View(a) => (a.rows, a.cols),
            MmaA::Tile(t) => (t.ty.rows, t.ty.cols),
        };
        let n = if b_kn { b.cols } else { b.rows };
        let rb = &blk.rings[b.ring];
        let b_el = |j: u32, kk: u32| if b_kn { ring_index(tb, b, kk, j) } else { ring_index(tb, b, j, kk) };
        // Gather the operands densely (rows of A and rows of Bᵀ, K contiguous), noting the
        // rows that hold an element nothing wrote.
        let gather = |ring: &Ring, rows: u32, el: &dyn Fn(u32, u32) -> usize| {
            let mut v = vec![0f64; (rows * k) as usize];
            let mut bad = vec![false; rows as usize];
            for i in 0..rows {
                for kk in 0..k {
                    let at = el(i, kk);
                    v[(i * k + kk) as usize] = f64::from(ring.data[at]);
                    bad[i as usize] |= !ring.written[at];
                }
            }
            (v, bad)
        };
        let (av, bad_rows, a_what) = match &a {
            MmaA::View(a) => {
                let ta = self.prog.rings[a.ring].1;
                let (v, bad) =
                    gather(&blk.rings[a.ring], m, &|i, kk| if a_t { ring_index(ta, *a, kk, i) } else { ring_index(ta, *a, i, kk) });
                (v, bad, format!("stage {} of ring `{}`", a.stage, self.prog.rings[a.ring].0))
            }
            MmaA::Tile(t) => {
                let bad = (0..m as usize)
                    .map(|i| t.poison.as_ref().is_some_and(|p| p.mask[i * k as usize..(i + 1) * k as usize].contains(&true)))
                    .collect();
                let what = t.poison.as_ref().map_or_else(String::new, |p| p.what.clone());
                (t.v.iter().map(|&x| f64::from(x)).collect(), bad, what)
            }
        };
        let (bv, bad_cols) = gather(rb, n, &b_el);
        let first_bad = if bad_rows.contains(&true) {
            Some(a_what)
        } else if bad_cols.contains(&true) {
            Some(format!("stage {} of ring `{}`", b.stage, self.prog.rings[b.ring].0))
        } else {
            None
        };
        let mut out = vec![0f64; (m * n) as usize];
        for i in 0..m as usize {
            let arow = &av[i * k as usize..(i + 1) * k as usize];
            for j in 0..n as usize {
                let brow = &bv[j * k as usize..(j + 1) * k as usize];
                out[i * n as usize + j] = arow.iter().zip(brow).map(|(x, y)| x * y).sum();
            }
        }
        let poison = first_bad.map(|what| Poison {
            mask: (0..m as usize).flat_map(|i| (0..n as usize).map(move |j| (i, j))).map(|(i, j)| bad_rows[i] || bad_cols[j]).collect(),
            what: format!("{what}, read by `mma_sync` at line {line}"),
        });
        (out, poison)
    }
}

/// The operands of `e` if it is an f32 product (scalar or tile), which ptxas fuses with an
/// add or subtract around it.
fn f32_product(e: &Expr) -> Option<(&Expr, &Expr)> {
    let f32_typed = match e.ty {
        Some(Type::Scalar(tessera_ptx::ScalarType::F32)) => true,
        Some(Type::Tile(t)) => t.dtype == DType::F32,
        _ => false,
    };
    match &e.kind {
        ExprKind::Binary(BinOp::Mul, x, y) if f32_typed => Some((x, y)),
        _ => None,
    }
}

fn lookup<'a>(wg: &'a Wg<'_>, name: &str) -> Flowing<&'a Val> {
    match wg.env.iter().rev().find(|(n, _)| *n == name) {
        Some((_, v)) => Ok(v),
        None => Err(format!("`{name}` is not bound").into()),
    }
}

/// The element index of view row `r`, column `c` in its ring.
fn ring_index(ty: SmemType, v: View, r: u32, c: u32) -> usize {
    ((v.stage * ty.rows + v.row0 + r) * ty.cols + v.col0 + c) as usize
}

fn overlaps(a: View, b: View) -> bool {
    a.ring == b.ring
        && a.stage == b.stage
        && a.row0 < b.row0 + b.rows
        && b.row0 < a.row0 + a.rows
        && a.col0 < b.col0 + b.cols
        && b.col0 < a.col0 + a.cols
}
