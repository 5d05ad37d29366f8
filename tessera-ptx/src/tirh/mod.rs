//! TIR-H: the high-level tile IR that the frontend builds from a kernel's Rust body.
//!
//! A [`TileIr`] describes what one thread block does. Values are uniform scalars (the same
//! in every thread of a warpgroup), register tiles (a `Tile<T, M, N>` held by one warpgroup of
//! 128 threads) and global tensors (kernel parameters). Every node carries a [`SourceLoc`] so
//! that errors found in later stages point at the user's token.
//!
//! The frontend leaves [`Expr::ty`](crate::tirh::Expr::ty) empty; [`crate::verify::typecheck`] fills it and checks
//! shapes, dtypes and ranks. Lowering assumes a type-checked kernel.
//!
//! `Display` prints the `tirh` dump.

mod display;

use crate::dtype::{DType, ScalarType};
use serde::{Deserialize, Serialize};

/// Where a node came from in the DSL source.
///
/// `span` indexes the frontend's table of spans; `line`/`col` are 1-based for dumps and
/// PTX comments.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct SourceLoc {
    /// Index into the frontend's span table.
    pub span: u32,
    /// 1-based source line.
    pub line: u32,
    /// 0-based column.
    pub col: u32,
}

/// The shape and element type of a register tile, `Tile<T, M, N>`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct TileType {
    /// Element type.
    pub dtype: DType,
    /// Rows.
    pub rows: u32,
    /// Columns.
    pub cols: u32,
}

impl std::fmt::Display for TileType {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Tile<{}, {}, {}>", self.dtype, self.rows, self.cols)
    }
}

/// A ring of `stages` shared-memory tiles of `rows×cols` elements, swizzled as TMA and wgmma
/// read them.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct SmemType {
    /// Element type.
    pub dtype: DType,
    /// Rows of one stage's tile.
    pub rows: u32,
    /// Columns of one stage's tile.
    pub cols: u32,
    /// Stages in the ring.
    pub stages: u32,
    /// Swizzle span in bytes: 128, 64, 32, or 0 for none.
    pub swizzle: u32,
}

impl SmemType {
    /// Bytes of one stage.
    pub fn stage_bytes(&self) -> u32 {
        self.rows * self.cols * self.dtype.size()
    }

    /// Bytes of one row.
    pub fn row_bytes(&self) -> u32 {
        self.cols * self.dtype.size()
    }

    /// Column panels: a row wider than the swizzle span is stored as panels of one span each
    /// (all rows of panel 0, then all rows of panel 1, …), as TMA boxes and MN-major wgmma
    /// operands want.
    pub fn panels(&self) -> u32 {
        if self.swizzle == 0 {
            1
        } else {
            self.row_bytes().div_ceil(self.swizzle)
        }
    }

    /// Columns in one panel.
    pub fn panel_cols(&self) -> u32 {
        self.cols / self.panels()
    }

    /// Bytes from one row to the next within a panel.
    pub fn pitch(&self) -> u32 {
        self.row_bytes() / self.panels()
    }
}

/// The type of a value in TIR-H.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum Type {
    /// A uniform scalar.
    Scalar(ScalarType),
    /// A register tile.
    Tile(TileType),
    /// A shared-memory ring, `Smem::<T, M, N>::ring(stages)`.
    Smem(SmemType),
    /// One stage of a ring, or some of its rows: an operand of TMA and of `mma_sync`.
    SmemView {
        /// Element type.
        dtype: DType,
        /// Rows seen.
        rows: u32,
        /// Columns.
        cols: u32,
        /// The ring's swizzle span in bytes.
        swizzle: u32,
    },
    /// A ring of full/empty mbarriers, `Pipeline::<STAGES>::new(consumers)`.
    Pipeline {
        /// Stages.
        stages: u32,
        /// Consumer warpgroups that release each stage.
        consumers: u32,
    },
    /// A queue of tile indices fed from a global counter, `TileQueue::<STAGES>::new(counter,
    /// consumers)`.
    Queue {
        /// Slots in flight.
        stages: u32,
        /// Consumer warpgroups that take each index.
        consumers: u32,
    },
    /// A global tensor parameter, `Global<T, R>`.
    Global {
        /// Element type.
        dtype: DType,
        /// Rank.
        rank: u32,
    },
}

impl std::fmt::Display for Type {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Type::Scalar(s) => write!(f, "{s}"),
            Type::Tile(t) => write!(f, "{t}"),
            Type::Global { dtype, rank } => write!(f, "Global<{dtype}, {rank}>"),
            Type::Smem(t) => write!(f, "Smem<{}, {}, {}> x{} (swizzle {})", t.dtype, t.rows, t.cols, t.stages, t.swizzle),
            Type::SmemView { dtype, rows, cols, .. } => write!(f, "SmemView<{dtype}, {rows}, {cols}>"),
            Type::Pipeline { stages, consumers } => write!(f, "Pipeline<{stages}> ({consumers} consumers)"),
            Type::Queue { stages, consumers } => write!(f, "TileQueue<{stages}> ({consumers} consumers)"),
        }
    }
}

/// A kernel parameter.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Param {
    /// The Rust name.
    pub name: String,
    /// Its type: a scalar or a global tensor.
    pub ty: Type,
    /// Where it is declared.
    pub loc: SourceLoc,
}

/// A kernel in TIR-H.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct TileIr {
    /// The kernel's name (the Rust function's).
    pub name: String,
    /// Source file name, for comments in dumps and PTX.
    pub file: String,
    /// Parameters in declaration order.
    pub params: Vec<Param>,
    /// Warpgroups per thread block (128 threads each).
    pub warpgroups: u32,
    /// `blocks_per_sm = N`: blocks each SM should hold at once (ptxas caps the registers to
    /// fit them); 0 for no hint.
    #[serde(default)]
    pub blocks_per_sm: u32,
    /// A diagnostic build's wait watchdog (0: none): every mbarrier wait that spins past this
    /// many tries stores to an address naming its line and side, for compute-sanitizer's
    /// memcheck to report (see [`crate::wait_tag`]); set from `TESSERA_WAIT_LIMIT` when the
    /// kernels are built.
    #[serde(default)]
    pub wait_limit: u32,
    /// The body.
    pub body: Vec<Stmt>,
}

impl TileIr {
    /// The kernel as JSON: the macro embeds it for the CPU interpreter.
    pub fn to_json(&self) -> String {
        // Serializing plain data with string keys cannot fail.
        serde_json::to_string(self).unwrap_or_default()
    }

    /// Reads a kernel back from [`TileIr::to_json`]'s text.
    ///
    /// # Errors
    /// The parser's message, if `text` is not such a kernel (e.g. written by another version).
    pub fn from_json(text: &str) -> Result<TileIr, String> {
        serde_json::from_str(text).map_err(|e| e.to_string())
    }

    /// Whether the kernel stores into the global `name` anywhere.
    pub fn writes(&self, name: &str) -> bool {
        fn any(body: &[Stmt], name: &str) -> bool {
            body.iter().any(|s| match &s.kind {
                StmtKind::Store { tensor, .. }
                | StmtKind::TmaStore { tensor, .. }
                | StmtKind::AtomicAdd { tensor, .. }
                | StmtKind::FetchAdd { tensor, .. } => tensor == name,
                // A tile queue's counter is atomically incremented.
                StmtKind::Let { value: Expr { kind: ExprKind::QueueNew { counter, .. }, .. }, .. } => counter == name,
                StmtKind::For { body, .. } | StmtKind::QueueFor { body, .. } | StmtKind::While { body, .. } => any(body, name),
                StmtKind::If { then, otherwise, .. } => any(then, name) || any(otherwise, name),
                _ => false,
            })
        }
        any(&self.body, name)
    }
}

/// A statement.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Stmt {
    /// What it does.
    pub kind: StmtKind,
    /// Where it is.
    pub loc: SourceLoc,
    /// Its source text, for comments in the PTX.
    pub text: String,
}

/// The kinds of statement.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub enum StmtKind {
    /// `let [mut] name[: ty] = value;`
    Let {
        /// Bound name.
        name: String,
        /// Whether it may be assigned again.
        mutable: bool,
        /// The declared type, if written.
        declared: Option<TileType>,
        /// The value.
        value: Expr,
    },
    /// `name = value;`
    Assign {
        /// Assigned name.
        name: String,
        /// The value.
        value: Expr,
    },
    /// `tensor.store([i, j], value);`: out-of-bounds elements are skipped.
    /// `tensor.store_within([i, j], value, [e0, e1]);` also skips elements whose index along an
    /// axis is `eₖ` or more (a packed sequence's end, say).
    Store {
        /// The global tensor parameter.
        tensor: String,
        /// The origin of the tile in the tensor, one index per dimension.
        index: Vec<Expr>,
        /// The tile to store.
        value: Expr,
        /// Exclusive ends per dimension, tighter than the tensor's (`store_within`).
        within: Option<Vec<Expr>>,
    },
    /// `tensor.atomic_add([i, j], value);`: each in-bounds element of the f32 tile added to the
    /// f32 tensor's element atomically (`red.global.add.f32`), so that blocks may sum into one
    /// place — a gradient shared by many rows, say. The order of the additions is not fixed.
    /// `tensor.atomic_max([i, j], value)` (`max`) keeps the larger of the two instead (an amax
    /// over blocks): on the f32 bits, `red.max.s32` for a value ≥ +0 and `red.min.u32` below —
    /// exact for every float; a positive NaN wins over any number.
    AtomicAdd {
        /// The global tensor parameter (f32).
        tensor: String,
        /// The origin of the tile in the tensor, one index per dimension.
        index: Vec<Expr>,
        /// The f32 tile to add.
        value: Expr,
        /// `atomic_max`.
        max: bool,
    },
    /// `let old = tensor.fetch_add([i], v);` (or without the `let`): one atomic addition of the
    /// i32 `v` to the i32 tensor's element per warpgroup (by its leader), the element's value
    /// before it given to every thread — a ticket, a count of arrivals. It releases what the
    /// warpgroup wrote before it (stores, atomic adds, and TMA stores and reduce-adds, which it
    /// waits to complete) and acquires what the warpgroups whose additions came before it
    /// released, at GPU scope: a warpgroup that finds itself the last of `n` arrivals reads
    /// what the other `n − 1` wrote. Out of bounds: nothing is added and the value is 0.
    /// `tensor.fetch_inc([i], limit)` (`inc`) is the same with CUDA's `atomicInc`: the element
    /// becomes `old + 1`, or 0 once `old ≥ limit` — `n` arrivals with limit `n − 1` draw the
    /// tickets 0 to `n − 1` and leave 0 behind. Without the `let` the old value goes
    /// nowhere: the addition is a release that no thread waits for (a flag raised for other
    /// blocks, which read it with `fetch_add([i], 0)` and acquire what came before it).
    FetchAdd {
        /// The name bound to the old value, if any.
        name: Option<String>,
        /// The global tensor parameter (i32).
        tensor: String,
        /// The element, one index per dimension.
        index: Vec<Expr>,
        /// The i32 scalar added, or the limit (`inc`).
        value: Expr,
        /// `fetch_inc`: wrap to 0 past `value`.
        inc: bool,
    },
    /// `let flag = tensor.wait_nonzero([i]);`: waits until the i32 element is not 0 and gives
    /// it to every thread of the warpgroup (its leader reads it, an acquire at GPU scope, and
    /// sleeps a little between reads), acquiring what the block that raised it released
    /// before (with a `fetch_add` without `let`). Out of bounds: 0 at once. With `while`, a
    /// block's look-back over the flags of the blocks before it.
    WaitNonzero {
        /// The name bound to the value.
        name: String,
        /// The global tensor parameter (i32).
        tensor: String,
        /// The element, one index per dimension.
        index: Vec<Expr>,
    },
    /// `tensor.prefetch::<Tile<T, M, N>>(index)`: asks L2 to fetch the lines of the tile that
    /// the load would read (in-bounds elements only), holding no registers and waiting for
    /// nothing. The expression is that load.
    Prefetch(Expr),
    /// `for var in (start..end).step_by(step) { body }`
    For {
        /// Loop variable (i32).
        var: String,
        /// First value.
        start: Expr,
        /// Exclusive end.
        end: Expr,
        /// Increment: a positive constant, or a uniform `i32` that must be positive at run time.
        step: Box<Expr>,
        /// Body.
        body: Vec<Stmt>,
    },
    /// `while cond { body }`: the body again while the scalar `cond` holds, tested before each
    /// lap. `cond` must be uniform across the warpgroup (a branch of every thread at once): a
    /// value every thread computes alike, or a `fetch_add`'s, which every thread receives —
    /// `fetch_add([i], 0)` reads a flag another block publishes, so a loop on it waits for that
    /// block (a decoupled look-back: a block waits only on blocks of lower index, which the
    /// GPU starts first).
    While {
        /// The condition (bool).
        cond: Expr,
        /// Body.
        body: Vec<Stmt>,
    },
    /// `for var in queue.fetch(total) { body }` (the producer: it draws indices from the
    /// queue's global counter until one reaches `total`, handing each to the consumers) or
    /// `for var in queue.take() { body }` (a consumer: the producer's indices in order, until
    /// the producer runs out). Indices are claimed at run time, so blocks that finish early
    /// take more; the counter must be 0 at launch and is 0 again when the grid ends.
    QueueFor {
        /// Loop variable (i32).
        var: String,
        /// The queue.
        queue: String,
        /// `Some(total)` for `fetch`, `None` for `take`.
        total: Option<Expr>,
        /// Body.
        body: Vec<Stmt>,
    },
    /// `tma::load(view, tensor, [i, j], pipe)`: a TMA copy of the box at `[i, j]` into `view`,
    /// completing on the pipeline's full barrier of the view's stage. Out-of-bounds elements
    /// land as zeros.
    TmaLoad {
        /// The destination view (one stage of a ring).
        dst: Expr,
        /// The global tensor.
        tensor: String,
        /// The box origin, one index per dimension.
        index: Vec<Expr>,
        /// The pipeline whose full barrier counts the bytes.
        pipe: String,
    },
    /// `view.store(tile)`: writes a register tile into a shared view (swizzled as TMA reads it).
    SmemStore {
        /// The shared view.
        view: Expr,
        /// The tile, of the view's shape and dtype.
        value: Expr,
        /// `view.store_fragments(acc)`: an MMA accumulator written in its registers' order
        /// (see [`crate::layout::fragment_offset`]) into an unswizzled view, not by element.
        #[serde(default)]
        fragments: bool,
    },
    /// `tma::store(tensor, [i, j], view)`: a TMA bulk store of a shared view into the tensor at
    /// `[i, j]` (out-of-bounds elements are skipped), issued once every thread's shared writes
    /// are visible to the copy engine.
    TmaStore {
        /// The global tensor.
        tensor: String,
        /// The box origin.
        index: Vec<Expr>,
        /// The shared view to copy from.
        src: Expr,
        /// `tma::reduce_add`: each element added to the tensor's (an f32 tensor; the L2
        /// performs the adds, atomically per element), not written.
        #[serde(default)]
        add: bool,
        /// `tma::store_flat` / `tma::reduce_add_flat`: the view's bytes, unswizzled and
        /// contiguous, copied to consecutive elements from `[i, j]` (a 1-D bulk copy, no tensor
        /// map) rather than as a box.
        #[serde(default)]
        flat: bool,
    },
    /// `tma::store_wait(n)`: waits until at most `n` of this warpgroup's TMA stores still read
    /// shared memory.
    TmaStoreWait(u32),
    /// `pipe.commit(s)`: the producer has issued stage `s`'s copies.
    PipeCommit {
        /// The pipeline.
        pipe: String,
        /// The stage.
        stage: Expr,
    },
    /// `pipe.release(s)`: this consumer warpgroup is done reading stage `s` (which may be
    /// an earlier stage than the one last waited for).
    PipeRelease {
        /// The pipeline.
        pipe: String,
        /// The stage.
        stage: Expr,
    },
    /// `barrier::sync(id, warpgroups)` (`wait`) or `barrier::arrive(id, warpgroups)`: named
    /// barrier `id` (0 to 6) completes when `warpgroups` warpgroups have arrived at it; `sync`
    /// arrives and waits for that, `arrive` only arrives. Two consumers can take turns with
    /// two barriers, each arriving at the other's after its turn (ping-pong scheduling).
    NamedBarrier {
        /// The barrier (0 to 6; the lowering's own barriers use other hardware ids).
        id: u32,
        /// Warpgroups that complete it.
        warpgroups: u32,
        /// `sync` (arrive and wait) rather than `arrive`.
        wait: bool,
        /// Where the id is written, for errors.
        loc: SourceLoc,
    },
    /// `mma_wait(n)`: waits until at most `n` groups of this warpgroup's `mma_sync`s are in
    /// flight (`wgmma.wait_group n`).
    MmaWait(u32),
    /// `mma_sync(acc, a, b)`: `acc += a · bᵀ` with `a` (`M×K`) and `b` (`N×K`) in shared
    /// memory, both K-major; `mma_sync_kn(acc, a, b)`: `acc += a · b` with `b` (`K×N`)
    /// N-major, in 64-column panels.
    Mma {
        /// The accumulator, a mutable `Tile<f32, M, N>`.
        acc: String,
        /// `M×K` operand.
        a: Expr,
        /// `N×K` operand, or `K×N` if `b_kn`.
        b: Expr,
        /// Whether `b` is stored K×N.
        b_kn: bool,
        /// Whether `a` is stored K×M, M-major (`view.t()`: `acc += aᵀ·b`), a shared view only.
        #[serde(default)]
        a_t: bool,
    },
    /// `setmaxnreg(n)`: this warpgroup's register budget from here on.
    SetMaxNReg(u32),
    /// `f(x);`: a device-function call whose results, if any, are dropped. Inlined by the
    /// type checker, which removes the statement.
    Eval(Expr),
    /// `let (a, mut b) = f(x);` (`assign: false`) or `(a, b) = f(x);` (`assign: true`): the
    /// results of a device-function call bound or assigned in order. Inlined by the type
    /// checker, which replaces it by `let`s (or assignments).
    Unpack {
        /// Each name, and whether a `let` binds it mutable.
        names: Vec<(String, bool)>,
        /// Assignments to existing names rather than new bindings.
        assign: bool,
        /// The call.
        value: Expr,
    },
    /// `if cond { then } else { otherwise }`
    If {
        /// A uniform boolean.
        cond: Expr,
        /// Taken when true.
        then: Vec<Stmt>,
        /// Taken when false.
        otherwise: Vec<Stmt>,
    },
}

/// An expression. `ty` is filled by the type checker.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Expr {
    /// What it computes.
    pub kind: ExprKind,
    /// Where it is.
    pub loc: SourceLoc,
    /// Its type, once checked.
    pub ty: Option<Type>,
}

impl Expr {
    /// A new, unchecked expression.
    pub fn new(kind: ExprKind, loc: SourceLoc) -> Self {
        Expr { kind, loc, ty: None }
    }

    /// The sub-expressions of this expression.
    pub fn children(&self) -> Vec<&Expr> {
        use ExprKind as K;
        match &self.kind {
            K::Binary(_, a, b) => vec![a, b],
            K::Unary(_, a)
            | K::Cast { value: a, .. }
            | K::SwapPairs(a)
            | K::SmemLoad(a)
            | K::EdgeCol { value: a, .. }
            | K::TileCols { value: a, .. }
            | K::SmemCols { view: a, .. }
            | K::Reduce { value: a, .. }
            | K::BlockReduce { value: a, .. }
            | K::TileAll(a) => {
                vec![a]
            }
            K::Full { value, .. } => vec![value],
            K::Load { index, fill, .. } => index.iter().chain(fill.as_deref()).collect(),
            K::LoadFragments { index, .. } => index.iter().collect(),
            K::SmemAt { stage, .. } => vec![stage],
            K::SmemRows { view, start, .. } => vec![view, start],
            K::MaskCols { value, limit, fill } => vec![value, limit, fill],
            K::KeepWhere { value, cond, fill } => vec![value, cond, fill],
            K::Uniform { seed, origin, .. } => seed.iter().chain(origin).collect(),
            K::Get { index, .. } | K::Call { args: index, .. } => index.iter().collect(),
            K::Shift { value, fill, .. } | K::ScanPart { value, fill, .. } => vec![value, fill],
            K::ScanPick { updated, old, .. } => vec![updated, old],
            K::Scan { values, identity, .. } => values.iter().chain(identity).collect(),
            K::Var(_)
            | K::Int(_)
            | K::Float(_)
            | K::Bool(_)
            | K::Builtin(_)
            | K::Dim { .. }
            | K::SmemRing(_)
            | K::PipelineNew { .. }
            | K::QueueNew { .. }
            | K::PipeStage { .. }
            | K::Iota { .. } => vec![],
        }
    }

    /// Whether the local `name` is read anywhere in this expression.
    pub fn uses(&self, name: &str) -> bool {
        matches!(&self.kind, ExprKind::Var(n) if n == name) || self.children().iter().any(|c| c.uses(name))
    }

    /// The checked type.
    ///
    /// # Panics
    /// If the expression has not been through [`crate::verify::typecheck`]; lowering only
    /// sees checked kernels.
    pub fn checked_ty(&self) -> Type {
        self.ty.expect("verified TIR-H: every expression has a type")
    }
}

/// Binary operators.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum BinOp {
    /// `+`
    Add,
    /// `-`
    Sub,
    /// `*`
    Mul,
    /// `/`
    Div,
    /// `%` (scalars only)
    Rem,
    /// `max(a, b)`
    Max,
    /// `min(a, b)`
    Min,
    /// `<`
    Lt,
    /// `<=`
    Le,
    /// `>`
    Gt,
    /// `>=`
    Ge,
    /// `==`
    Eq,
    /// `!=`
    Ne,
    /// `&&`
    And,
    /// `||`
    Or,
}

impl BinOp {
    /// Whether the result is a boolean.
    pub fn is_comparison(self) -> bool {
        matches!(self, BinOp::Lt | BinOp::Le | BinOp::Gt | BinOp::Ge | BinOp::Eq | BinOp::Ne)
    }

    /// The operator's spelling.
    pub fn symbol(self) -> &'static str {
        match self {
            BinOp::Add => "+",
            BinOp::Sub => "-",
            BinOp::Mul => "*",
            BinOp::Div => "/",
            BinOp::Rem => "%",
            BinOp::Max => "max",
            BinOp::Min => "min",
            BinOp::Lt => "<",
            BinOp::Le => "<=",
            BinOp::Gt => ">",
            BinOp::Ge => ">=",
            BinOp::Eq => "==",
            BinOp::Ne => "!=",
            BinOp::And => "&&",
            BinOp::Or => "||",
        }
    }
}

/// Unary elementwise functions and operators.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum UnOp {
    /// `-x`
    Neg,
    /// `!x`
    Not,
    /// `exp2(x)` (the hardware's approximation; results below 2⁻¹²⁶ flush to 0)
    Exp2,
    /// `exp2_fma(x)`: 2ˣ without the special-function unit — `x` rounded to an integer `j`
    /// and a fraction `f` in [−½, ½] by float additions, a degree-5 polynomial for 2ᶠ (FMAs,
    /// relative error below 2.2·10⁻⁷), `j` added to its exponent bits; 0 below −126.5 (NaN
    /// too), 2¹²⁷ above 127. For kernels whose MUFU is the bottleneck.
    Exp2Fma,
    /// `exp2_split(x)`: 2ˣ with a tile's elements shared between the two: every other
    /// register a thread holds by the MUFU (`exp2`), the others by `exp2_fma` (a scalar by the
    /// MUFU). Where MUFU throughput bounds a loop and instruction issue does not: the
    /// polynomial's 16 instructions an element cost issue slots (a soft-capped attention's
    /// softmax with it ran 10–15% slower on the H100, its issue the limit: notes, run 223).
    Exp2Split,
    /// `log2(x)` (the hardware's approximation; `log2(0)` is −∞)
    Log2,
    /// `abs(x)`
    Abs,
    /// `sqrt(x)`
    Sqrt,
    /// `rsqrt(x)`
    Rsqrt,
    /// `tanh(x)` (the hardware's approximation, |error| < 2⁻¹⁰·⁹⁹)
    Tanh,
    /// `erf(x)` (Abramowitz–Stegun 7.1.26, |error| < 1.5·10⁻⁷)
    Erf,
    /// `sin(x)` (reduced to [−π, π] in f32, then the hardware's approximation)
    Sin,
    /// `cos(x)` (as `sin`)
    Cos,
    /// `sin_reduced(x)`: the hardware's `sin` alone, for arguments the kernel already keeps in
    /// [−π, π] (absolute error under 4·10⁻⁶ there, `gpu_numerics`; garbage far outside; one MUFU op where
    /// `sin` adds five for the range reduction). The interpreter refuses an argument past
    /// ±1.001π; a literal one is a compile error.
    SinReduced,
    /// `cos_reduced(x)` (as `sin_reduced`)
    CosReduced,
    /// `floor(x)`: the largest integer not above `x`
    Floor,
    /// `step(x)`: 1.0 where `x ≥ 0`, else 0.0 (NaN gives 0.0), e.g. a dropout mask
    /// `step(u - p)` that keeps exactly the draws `u ≥ p`
    Step,
}

impl UnOp {
    /// The elementwise functions the DSL spells by name, as functions (`exp2(x)`) and methods
    /// (`x.exp2()`); `rsqrt` is among them.
    pub const FUNCTIONS: [UnOp; 15] = [
        UnOp::Exp2,
        UnOp::Exp2Fma,
        UnOp::Exp2Split,
        UnOp::Log2,
        UnOp::Abs,
        UnOp::Sqrt,
        UnOp::Rsqrt,
        UnOp::Tanh,
        UnOp::Erf,
        UnOp::Sin,
        UnOp::Cos,
        UnOp::SinReduced,
        UnOp::CosReduced,
        UnOp::Floor,
        UnOp::Step,
    ];

    /// The function spelled `name` (`"exp2"`, `"sin_reduced"`), if there is one.
    pub fn function(name: &str) -> Option<UnOp> {
        UnOp::FUNCTIONS.into_iter().find(|op| op.name() == name)
    }

    /// The spelling in the DSL.
    pub fn name(self) -> &'static str {
        match self {
            UnOp::Neg => "-",
            UnOp::Not => "!",
            UnOp::Exp2 => "exp2",
            UnOp::Exp2Fma => "exp2_fma",
            UnOp::Exp2Split => "exp2_split",
            UnOp::Log2 => "log2",
            UnOp::Abs => "abs",
            UnOp::Sqrt => "sqrt",
            UnOp::Rsqrt => "rsqrt",
            UnOp::Tanh => "tanh",
            UnOp::Erf => "erf",
            UnOp::Sin => "sin",
            UnOp::Cos => "cos",
            UnOp::SinReduced => "sin_reduced",
            UnOp::CosReduced => "cos_reduced",
            UnOp::Floor => "floor",
            UnOp::Step => "step",
        }
    }
}

/// Reductions over one axis of a tile.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum ReduceOp {
    /// Sum.
    Sum,
    /// Maximum.
    Max,
    /// Minimum.
    Min,
}

impl ReduceOp {
    /// The spelling in the DSL.
    pub fn name(self) -> &'static str {
        match self {
            ReduceOp::Sum => "sum",
            ReduceOp::Max => "max",
            ReduceOp::Min => "min",
        }
    }
}

/// Built-in uniform indices.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum Builtin {
    /// `block::id_x()` (`y`, `z`): the block's index in the grid.
    BlockId(u8),
    /// `grid::dim_x()` (`y`, `z`): blocks in the grid.
    GridDim(u8),
    /// `warpgroup::id()`: the warpgroup's index in its block.
    WarpgroupId,
}

/// One step of a row scan in the blocked layout where each thread holds runs of `v`
/// consecutive columns of a row and the row's runs lie in `tc` lanes of one warp: the serial
/// scan of each run, then a Hillis–Steele scan of the runs' totals across the lanes, then
/// each run's other elements combined with the total of the runs before. `n` combines and
/// `log₂ tc` shuffles a row instead of Hillis–Steele's `n·log₂ n` and `v·log₂ tc`; the
/// interpreter and the lowering read the same steps. A row wider than the lanes' `v·tc`
/// columns (a thread holding a run in each of several *segments* of `v·tc` columns) scans its
/// segments side by side, then joins them one after another: each segment takes in the last
/// element of the one before. A reverse scan runs the mirror image: column `j` plays column
/// `cols − 1 − j`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct ScanStep {
    /// Which step.
    pub kind: ScanKind,
    /// The run length.
    pub v: u32,
    /// The row's length.
    pub cols: u32,
    /// A reverse scan's step.
    pub reverse: bool,
    /// The columns of a segment, `v·tc` (`cols` where the lanes cover the row).
    pub seg: u32,
}

/// What a [`ScanStep`] does, in forward order.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum ScanKind {
    /// Run position `k` takes in position `k − 1`.
    Serial(u32),
    /// The last position of each run takes in the last position of the run this many runs
    /// back in its segment.
    Lanes(u32),
    /// Every position but the last of each run takes in the last position of the run before
    /// in its segment.
    Apply,
    /// Every column of this segment takes in the last column of the segment before.
    Segment(u32),
}

impl ScanStep {
    /// The steps of the scan along the rows of a `rows×cols` tile in its canonical blocked
    /// layout ([`crate::layout::Layout::blocked`]), or `None` where a row spans more than one
    /// warp.
    pub fn plan(rows: u32, cols: u32, reverse: bool) -> Option<Vec<ScanStep>> {
        let l = crate::layout::Layout::blocked(rows, cols);
        let crate::layout::LayoutKind::Blocked { v, tc, wc: 1, .. } = l.kind else { return None };
        let seg = v * tc;
        // Up to 8 segments (2048 columns at 256 a segment): each is a step over the whole
        // tile, so a wider row scans by Hillis–Steele's log₂ steps instead.
        if !cols.is_multiple_of(seg) || cols < 2 || cols / seg > 8 {
            return None;
        }
        let step = |kind| ScanStep { kind, v, cols, reverse, seg };
        let mut steps: Vec<ScanStep> = (1..v).map(|k| step(ScanKind::Serial(k))).collect();
        steps.extend(std::iter::successors(Some(1), |s| Some(s * 2)).take_while(|&s| s < tc).map(|s| step(ScanKind::Lanes(s))));
        if tc > 1 {
            steps.push(step(ScanKind::Apply));
        }
        steps.extend((1..cols / seg).map(|j| step(ScanKind::Segment(j))));
        Some(steps)
    }

    /// Column `col` in forward order (mirrored for a reverse scan), and back.
    fn mirror(self, col: u32) -> u32 {
        if self.reverse {
            self.cols - 1 - col
        } else {
            col
        }
    }

    /// Whether the step changes the element at run position `pos` of forward-order segment
    /// `segment`.
    fn touches_at(self, pos: u32, segment: u32) -> bool {
        match self.kind {
            ScanKind::Serial(k) => pos == k,
            ScanKind::Lanes(_) => pos == self.v - 1,
            ScanKind::Apply => pos != self.v - 1,
            ScanKind::Segment(j) => segment == j,
        }
    }

    /// Whether the step changes column `col`.
    pub fn touches(self, col: u32) -> bool {
        let c = self.mirror(col);
        self.touches_at(c % self.v, c / self.seg)
    }

    /// Whether the step changes the slot at offset `dc` from a thread's base column (the
    /// lowering's view: a run's slots in column order, a run a segment).
    pub fn touches_slot(self, dc: u32) -> bool {
        let (k, segment) = (dc % self.seg, dc / self.seg);
        if self.reverse {
            self.touches_at(self.v - 1 - k, self.cols / self.seg - 1 - segment)
        } else {
            self.touches_at(k, segment)
        }
    }

    /// The column that column `col` combines with at this step, if the step touches it and one
    /// lies there.
    pub fn source(self, col: u32) -> Option<u32> {
        if !self.touches(col) {
            return None;
        }
        let (c, v) = (self.mirror(col), self.v);
        // The segment's first column and the column's place in it.
        let (start, cs) = (c / self.seg * self.seg, c % self.seg);
        let from = match self.kind {
            ScanKind::Serial(_) => Some(c - 1),
            ScanKind::Lanes(s) => (cs / v >= s).then(|| c - s * v),
            ScanKind::Apply => (cs >= v).then(|| start + cs / v * v - 1),
            ScanKind::Segment(_) => Some(start - 1),
        };
        from.map(|f| self.mirror(f))
    }
}

/// Which numbers a `Tile::uniform*` constructor draws.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum UniformKind {
    /// `uniform`: 24-bit numbers, a Philox word each.
    Words,
    /// `uniform8` (`transposed` false) or `uniform8_t` (true): bytes, 16 a Philox call.
    Bytes {
        /// The transposed tile's (`uniform8_t`).
        transposed: bool,
    },
}

impl UniformKind {
    /// The constructor's name in the language.
    pub fn name(self) -> &'static str {
        match self {
            UniformKind::Words => "uniform",
            UniformKind::Bytes { transposed: false } => "uniform8",
            UniformKind::Bytes { transposed: true } => "uniform8_t",
        }
    }

    /// The scalars it takes before the origin: the seed's two words, the offset (and the
    /// stream for bytes).
    pub fn seed_words(self) -> usize {
        if self == UniformKind::Words {
            3
        } else {
            4
        }
    }
}

/// The kinds of expression.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub enum ExprKind {
    /// A bound name: a `let`, a loop variable or a parameter.
    Var(String),
    /// An integer literal.
    Int(i64),
    /// A float literal (carried as its bits in JSON, which has no infinities).
    Float(#[serde(with = "f64_bits")] f64),
    /// `true`/`false`.
    Bool(bool),
    /// A binary operator or `max`/`min`.
    Binary(BinOp, Box<Expr>, Box<Expr>),
    /// A unary operator or elementwise function.
    Unary(UnOp, Box<Expr>),
    /// A built-in index.
    Builtin(Builtin),
    /// `tensor.dim(axis)`: a global tensor's extent along an axis.
    Dim {
        /// The global tensor.
        tensor: String,
        /// The axis.
        axis: u32,
    },
    /// `Tile::<T, M, N>::full(value)` (`zeros()` is `full(0.0)`).
    Full {
        /// The tile type.
        tile: TileType,
        /// A scalar fill value.
        value: Box<Expr>,
    },
    /// `tensor.load([i, j])` or `tensor.load_or([i, j], fill)`: a tile from global memory;
    /// out-of-bounds elements read as `fill` (zero by default).
    Load {
        /// The global tensor.
        tensor: String,
        /// The origin, one index per dimension.
        index: Vec<Expr>,
        /// Value for out-of-bounds elements.
        fill: Option<Box<Expr>>,
        /// The tile type, from `let t: Tile<…> =` or a turbofish.
        tile: Option<TileType>,
    },
    /// `tensor.load_fragments::<Tile<f32, M, N>>([i, j])`: an MMA accumulator read from
    /// consecutive elements from `[i, j]` in its registers' order, as `store_fragments` wrote
    /// it (past the tensor's elements the GPU reads zeros; the interpreter stops there).
    LoadFragments {
        /// The global tensor.
        tensor: String,
        /// The first element, one index per dimension.
        index: Vec<Expr>,
        /// The tile type (an f32 accumulator: rows a multiple of 64, columns of 8).
        tile: TileType,
    },
    /// `x.cast::<T>()` or `x as T`.
    Cast {
        /// The value.
        value: Box<Expr>,
        /// The element (tiles) or scalar type to convert to.
        to: DType,
    },
    /// `Smem::<T, M, N>::ring(stages)`: allocates a shared ring.
    SmemRing(SmemType),
    /// `Pipeline::<STAGES>::new(consumers)`: allocates and initializes a barrier ring.
    PipelineNew {
        /// Stages.
        stages: u32,
        /// Consumer warpgroups.
        consumers: u32,
    },
    /// `TileQueue::<STAGES>::new(counter, consumers)`: a ring of `STAGES` index slots with
    /// full and empty barriers; `counter` is a `Global<i32, 1>` parameter.
    QueueNew {
        /// Slots.
        stages: u32,
        /// Consumer warpgroups.
        consumers: u32,
        /// The global counter the producer draws from.
        counter: String,
    },
    /// `ring.at(stage)`: one stage of a ring.
    SmemAt {
        /// The ring.
        ring: String,
        /// The stage (an i32).
        stage: Box<Expr>,
    },
    /// `view.rows(start, n)`: `n` rows of a view from `start` (a multiple of 8).
    SmemRows {
        /// The view.
        view: Box<Expr>,
        /// First row.
        start: Box<Expr>,
        /// Rows.
        rows: u32,
    },
    /// `view.cols(start, n)`: columns `start..start + n` of a view whose rows are stored in
    /// column panels (a swizzled ring wider than its swizzle span), whole panels only: the
    /// panels' rows as a view of their own, e.g. half of K's columns as one warpgroup's
    /// `mma_sync_kn` B operand. Written `.cols` like [`ExprKind::TileCols`]; the verifier
    /// turns a `cols` of a view into this.
    SmemCols {
        /// The view.
        view: Box<Expr>,
        /// First column (a multiple of the panel's columns).
        start: u32,
        /// Columns (a multiple of the panel's columns).
        cols: u32,
    },
    /// `pipe.acquire()` (producer) or `pipe.wait()` (consumer): waits for the current stage
    /// to be empty or full and gives its index.
    PipeStage {
        /// The pipeline.
        pipe: String,
        /// True for the producer's `acquire`, false for the consumer's `wait`.
        producer: bool,
    },
    /// `t.cols(start, n)`: columns `start..start + n` of an MMA accumulator (`start` a
    /// constant multiple of `n`): a view of its registers, no data moves.
    TileCols {
        /// The tile.
        value: Box<Expr>,
        /// First column.
        start: u32,
        /// Columns.
        cols: u32,
    },
    /// `t.mask_cols(limit, fill)`: `t` with every element in a column at or past `limit`
    /// (counted from the tile's first column) replaced by `fill`, e.g. to keep the padding of
    /// a row wider than the tensor out of a sum.
    MaskCols {
        /// The tile.
        value: Box<Expr>,
        /// The first column replaced: an i32 for every row, or a `Tile<f32, M, 1>` of one per
        /// row (columns `0..limit` are kept).
        limit: Box<Expr>,
        /// The value of the replaced elements (a scalar).
        fill: Box<Expr>,
    },
    /// `t.keep_where(cond, fill)`: `t` with every element whose `cond` is below 0 replaced by
    /// `fill` — a mask written as arithmetic on index tiles (`q − k ≥ 0` keeps the causal
    /// part), where `fill` may be −∞ (which no arithmetic on `t` could give).
    KeepWhere {
        /// The tile.
        value: Box<Expr>,
        /// An f32 tile of `t`'s shape, or one that broadcasts to it (`M×1`, `1×N`).
        cond: Box<Expr>,
        /// The value of the replaced elements (a scalar).
        fill: Box<Expr>,
    },
    /// `Tile::<f32, M, N>::col_index()` (`axis` 1) or `row_index()` (`axis` 0): each element
    /// holds its column (row) within the tile, as an f32.
    Iota {
        /// The tile type (f32).
        tile: TileType,
        /// 0 for the row index, 1 for the column index.
        axis: u32,
    },
    /// `Tile::<f32, M, N>::uniform(seed_lo, seed_hi, offset, [row, col])`: Philox4x32-10
    /// numbers in `[0, 1)`, element `(i, j)` word `j % 4` of the counter
    /// `((col >> 2) + (j >> 2), row + i, offset, 0)` under the key `(seed_lo, seed_hi)` (see
    /// [`crate::random`]): a pure function of the seed, the offset and, for `col` a multiple
    /// of 4, the element's place in the tensor.
    ///
    /// `Tile::<f32, M, N>::uniform8(seed_lo, seed_hi, offset, stream, [row, col])`: element
    /// `(i, j)` is [`crate::random::uniform8`] at `[row + i, col + j]` (multiples of 1/256, a
    /// Philox call per 4×4 block); `uniform8_t(…)` the transpose of the `N×M` tile `uniform8`
    /// draws there — element `(i, j)` the number at `[row + j, col + i]`. Origins multiples of
    /// 16 (the interpreter checks it).
    Uniform {
        /// The tile type (f32).
        tile: TileType,
        /// Which numbers.
        kind: UniformKind,
        /// The key's two words, then the offset (and for bytes the stream): `i32` scalars
        /// (their bits).
        seed: Vec<Expr>,
        /// The origin `[row, col]` (i32 scalars).
        origin: Vec<Expr>,
    },
    /// `t.swap_pairs()`: columns `2k` and `2k + 1` exchanged (moves no data: both are in one
    /// thread's registers).
    SwapPairs(Box<Expr>),
    /// `view.load()`: a shared view's elements as a register tile of its shape and dtype (what
    /// TMA, or a warpgroup's `store` behind a barrier, put there).
    SmemLoad(Box<Expr>),
    /// `t.last_col()` (or `t.first_col()`): the last (first) column of an f32 tile, `M×1` (a
    /// chunked scan's carry). One shuffle a row where the row lies in one warp's lanes.
    EdgeCol {
        /// The tile.
        value: Box<Expr>,
        /// The last column rather than the first.
        last: bool,
    },
    /// `tensor.get([i, j])`: one element as a scalar (`i32`, or `f32` for any float tensor), the same in
    /// every thread; 0 out of bounds.
    Get {
        /// The global tensor.
        tensor: String,
        /// One index per dimension.
        index: Vec<Expr>,
    },
    /// `row_sum(t)`, `t.sum(axis)`, …: reduces `axis` to extent 1.
    Reduce {
        /// The combining operator.
        op: ReduceOp,
        /// 0 reduces rows (a `1×N` result), 1 reduces columns (an `M×1` result).
        axis: u32,
        /// The tile.
        value: Box<Expr>,
    },
    /// `let s = block_sum(t);` (`block_max`, `block_min`): `t` combined elementwise over the
    /// block's warpgroups, each holding its own `t` of the same type (one warpgroup's part of
    /// a row, say: `block_sum(row_sum(x))` sums a row spread over the warpgroups). Every
    /// warpgroup reaches it; only as the whole value of a `let`.
    BlockReduce {
        /// The combining operator.
        op: ReduceOp,
        /// The tile.
        value: Box<Expr>,
    },
    /// `tile_all(t)`: whether every element of this warpgroup's `t` (a float tile) is `≥ 0` —
    /// NaN is not —, the same `bool` in all 128 threads (one barrier of the warpgroup: every
    /// thread of it reaches it). A branch for the whole warpgroup on its data: a fast path where
    /// the inputs allow it.
    TileAll(Box<Expr>),
    /// `t.shift_cols(k, fill)` (`axis` 1) or `t.shift_rows(k, fill)` (`axis` 0): element
    /// `j` of each row (column) takes element `j − k`, the first `k` take `fill` — the step of a
    /// scan (`tile_scan`). `t` is an f32 tile, `k` a constant.
    Shift {
        /// The tile.
        value: Box<Expr>,
        /// 1: along each row; 0: down each column.
        axis: u32,
        /// How far.
        by: u32,
        /// The other way: element `j` takes element `j + k`, the last `k` take `fill` (a
        /// reverse scan's step).
        reverse: bool,
        /// What comes in.
        fill: Box<Expr>,
    },
    /// One step of the work-efficient row scan that `tile_scan` becomes where the tile's
    /// blocked layout allows it ([`ScanStep::plan`]): the elements the step touches hold the
    /// element they combine with (`fill` where there is none); the others hold `fill`.
    ScanPart {
        /// The tile (f32).
        value: Box<Expr>,
        /// The step.
        step: ScanStep,
        /// The combine's identity.
        fill: Box<Expr>,
    },
    /// After a scan step's combine: `updated` where the step touches an element, `old`
    /// elsewhere (so that the combines of untouched elements are dead code).
    ScanPick {
        /// The combine's result.
        updated: Box<Expr>,
        /// The tile before the step.
        old: Box<Expr>,
        /// The step.
        step: ScanStep,
    },
    /// `tile_scan::<F>(x, axis, identity)` (or of a tuple of tiles with a tuple of
    /// identities, `tile_scan::<F>((a, b), 1, (1.0, 0.0))`): the inclusive scan of `x` along
    /// `axis` (1: each row, 0: each column) under the associative combine `F`, a device
    /// function taking the earlier elements' tiles, then the later ones', and giving the
    /// combined tiles; `exclusive` shifts the result by one, `identity` first (which must be an
    /// identity of `F` for every input: the steps combine it in only where an element has no
    /// partner, so a stand-in such as −f32::MAX for a maximum over −∞ shows at some elements
    /// and not at others). The type checker
    /// expands it into the steps of [`ScanStep::plan`] where the row lies in one warp's lanes,
    /// else into ⌈log₂ n⌉ shift-and-combine steps (Hillis–Steele).
    Scan {
        /// The combine's name, for messages.
        func: String,
        /// The frontend's number for the combine's definition.
        id: u32,
        /// The tiles scanned together.
        values: Vec<Expr>,
        /// 1: along each row; 0: down each column.
        axis: u32,
        /// The combine's identity, per tile: what shifts in.
        identity: Vec<Expr>,
        /// Exclusive (element j combines elements before j) rather than inclusive.
        exclusive: bool,
        /// From the last element to the first (`tile_scan_reverse`): element j combines the
        /// elements from j on, the later ones taken as the earlier in `F`'s order.
        reverse: bool,
    },
    /// `f(a, &mut b)`: a call of a `#[device]` function, which the type checker inlines (it
    /// never reaches lowering): its statements go before the statement that holds the call,
    /// and the call becomes its result expression.
    Call {
        /// The function's name, for messages.
        func: String,
        /// The frontend's number for the definition the call resolved to.
        id: u32,
        /// The arguments.
        args: Vec<Expr>,
        /// Which arguments are passed `&mut name`.
        by_ref: Vec<bool>,
    },
}

/// `f64` as its IEEE bits, so that infinities and NaN survive JSON.
mod f64_bits {
    use serde::{Deserialize, Deserializer, Serializer};

    pub fn serialize<S: Serializer>(v: &f64, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_u64(v.to_bits())
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<f64, D::Error> {
        u64::deserialize(d).map(f64::from_bits)
    }
}
