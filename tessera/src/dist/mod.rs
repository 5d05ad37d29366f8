//! Collectives across devices: all-reduce, all-gather, reduce-scatter, broadcast and
//! send/recv on Tessera tensors and cudarc buffers, over NCCL on GPUs and over an in-process
//! group on the CPU interpreter.
//!
//! A [`Communicator`] is one rank of a group. On GPUs it wraps an NCCL communicator (NCCL is
//! loaded when first used, as the rest of CUDA is, so that builds need no toolkit) and queues
//! every call on its device's stream, ordered with the kernels there; [`Communicator::with_stream`]
//! puts its calls on a stream of their own so that they overlap the compute stream's work
//! (buffers shared by the two are ordered by cudarc's per-buffer events). On interpreter
//! devices ([`crate::Device::cpu`]) the same calls run in host memory, so that code written
//! for several GPUs runs — and is tested — on one machine without any; and
//! [`Communicator::simulated`] makes a group of ranks that share GPUs (staged through the host,
//! slow) to test such code at several ranks on a machine of one GPU.
//!
//! ```
//! use tessera::dist::{Communicator, ReduceOp};
//! use tessera::{Device, Tensor};
//! // Two ranks in this process, driven from one thread: a group call queues both before
//! // either waits, as NCCL requires when one thread drives several GPUs.
//! let comms = Communicator::for_devices(&[Device::cpu_with_threads(1), Device::cpu_with_threads(1)])?;
//! let mut xs = vec![
//!     Tensor::from_host(comms[0].device(), &[1.0f32, 2.0], &[2])?,
//!     Tensor::from_host(comms[1].device(), &[10.0f32, 20.0], &[2])?,
//! ];
//! tessera::dist::group(|| {
//!     for (c, x) in comms.iter().zip(xs.iter_mut()) {
//!         c.all_reduce_in_place(x, ReduceOp::Sum)?;
//!     }
//!     Ok(())
//! })?;
//! assert_eq!(xs[1].to_host()?, vec![11.0, 22.0]);
//! # Ok::<(), tessera::Error>(())
//! ```
//!
//! Failures are [`Error::Collective`] (the ranks disagree, a rank aborted), [`Error::Timeout`]
//! (a wait outlived [`Communicator::with_timeout`]; the communicator is then aborted, so that
//! the others stop too) and [`Error::Library`] with NCCL's own message.

mod host;
mod nccl;

use crate::tensor::{contiguous_strides, GlobalArg, GlobalArgMut, GlobalDesc};
use crate::{Device, Element, Error, Result};
use std::cell::{Cell, RefCell};
use std::sync::Arc;
use std::time::Duration;

/// How a reduction combines the ranks' elements.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ReduceOp {
    /// The sum (integers wrap, as NCCL's do).
    Sum,
    /// The product.
    Prod,
    /// The largest.
    Max,
    /// The smallest.
    Min,
    /// The mean: the sum divided by the number of ranks.
    Avg,
}

/// Which collective a call is, with what matters to matching it across ranks.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Kind {
    AllReduce(ReduceOp),
    ReduceScatter(ReduceOp),
    AllGather,
    Broadcast(usize),
}

impl Kind {
    pub(crate) fn name(self) -> &'static str {
        match self {
            Kind::AllReduce(_) => "all_reduce",
            Kind::ReduceScatter(_) => "reduce_scatter",
            Kind::AllGather => "all_gather",
            Kind::Broadcast(_) => "broadcast",
        }
    }

    /// A small integer code of the kind and its operand, for cross-rank checks.
    fn code(self) -> i32 {
        let op = |o: ReduceOp| o as i32;
        match self {
            Kind::AllReduce(o) => 100 + op(o),
            Kind::ReduceScatter(o) => 200 + op(o),
            Kind::AllGather => 300,
            Kind::Broadcast(root) => 1000 + i32::try_from(root).unwrap_or(i32::MAX - 1000),
        }
    }
}

/// The 128 bytes by which the ranks of one group find each other: made once (by rank 0) and
/// handed to every rank, as NCCL's unique id is — through [`UniqueId::to_hex`] and an
/// environment variable, or a file ([`UniqueId::publish`], [`UniqueId::wait_for_file`]).
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct UniqueId([u8; 128]);

impl std::fmt::Debug for UniqueId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "UniqueId({}…)", &self.to_hex()[..16])
    }
}

/// The first bytes of an id made by [`UniqueId::local`] (no NCCL id starts so: NCCL's begin
/// with a socket address family, a small integer).
const LOCAL_MAGIC: &[u8; 16] = b"tessera-local-id";

impl UniqueId {
    /// A fresh NCCL id, for a group of GPU ranks (in this process or several).
    ///
    /// # Errors
    /// [`Error::Library`] where NCCL cannot be loaded.
    pub fn new() -> Result<UniqueId> {
        nccl::unique_id().map(UniqueId)
    }

    /// A fresh id for a group of interpreter devices in this process (no NCCL needed).
    pub fn local() -> UniqueId {
        static NEXT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
        let mut b = [0u8; 128];
        b[..16].copy_from_slice(LOCAL_MAGIC);
        b[16..24].copy_from_slice(&NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed).to_le_bytes());
        b[24..28].copy_from_slice(&std::process::id().to_le_bytes());
        UniqueId(b)
    }

    fn is_local(&self) -> bool {
        self.0.starts_with(LOCAL_MAGIC)
    }

    /// The id's bytes.
    pub fn as_bytes(&self) -> &[u8; 128] {
        &self.0
    }

    /// An id from its 128 bytes.
    ///
    /// # Errors
    /// [`Error::Argument`] for another length.
    pub fn from_bytes(bytes: &[u8]) -> Result<UniqueId> {
        let b: [u8; 128] = bytes.try_into().map_err(|_| Error::Argument {
            kernel: "UniqueId::from_bytes",
            arg: "bytes".into(),
            expected: "128 bytes".into(),
            found: format!("{} bytes", bytes.len()),
        })?;
        Ok(UniqueId(b))
    }

    /// The id as 256 hexadecimal digits (for an environment variable or a command line).
    pub fn to_hex(&self) -> String {
        self.0.iter().map(|b| format!("{b:02x}")).collect()
    }

    /// An id from [`UniqueId::to_hex`]'s digits.
    ///
    /// # Errors
    /// [`Error::Argument`] for anything but 256 hexadecimal digits.
    pub fn from_hex(hex: &str) -> Result<UniqueId> {
        let bad = || Error::Argument {
            kernel: "UniqueId::from_hex",
            arg: "hex".into(),
            expected: "256 hexadecimal digits (UniqueId::to_hex)".into(),
            found: format!("{} characters starting {:?}", hex.len(), hex.chars().take(16).collect::<String>()),
        };
        let hex = hex.trim();
        if hex.len() != 256 || !hex.is_ascii() {
            return Err(bad());
        }
        let mut b = [0u8; 128];
        for (i, byte) in b.iter_mut().enumerate() {
            *byte = u8::from_str_radix(&hex[2 * i..2 * i + 2], 16).map_err(|_| bad())?;
        }
        Ok(UniqueId(b))
    }

    /// The id in the environment variable `var` (as [`UniqueId::to_hex`] writes it).
    ///
    /// # Errors
    /// [`Error::Argument`] where `var` is unset or not an id.
    pub fn from_env(var: &str) -> Result<UniqueId> {
        let v = std::env::var(var).map_err(|e| Error::Argument {
            kernel: "UniqueId::from_env",
            arg: var.into(),
            expected: "an environment variable holding UniqueId::to_hex's 256 digits".into(),
            found: e.to_string(),
        })?;
        UniqueId::from_hex(&v)
    }

    /// Writes the id to `path` for the other ranks ([`UniqueId::wait_for_file`]), whole or
    /// not at all (a temporary file renamed into place).
    ///
    /// # Errors
    /// [`Error::Argument`] where the file cannot be written.
    pub fn publish(&self, path: &std::path::Path) -> Result<()> {
        let io = |e: std::io::Error| Error::Argument {
            kernel: "UniqueId::publish",
            arg: "path".into(),
            expected: "a file this process can write".into(),
            found: format!("{}: {e}", path.display()),
        };
        let tmp = path.with_extension(format!("tmp{}", std::process::id()));
        std::fs::write(&tmp, self.to_hex()).map_err(io)?;
        std::fs::rename(&tmp, path).map_err(io)
    }

    /// Waits (up to `timeout`) for the id rank 0 [published](UniqueId::publish) at `path`.
    ///
    /// # Errors
    /// [`Error::Timeout`] if no id appears in time; [`Error::Argument`] if the file holds
    /// something else.
    pub fn wait_for_file(path: &std::path::Path, timeout: Duration) -> Result<UniqueId> {
        let start = std::time::Instant::now();
        loop {
            if let Ok(text) = std::fs::read_to_string(path) {
                return UniqueId::from_hex(&text);
            }
            if start.elapsed() >= timeout {
                return Err(Error::Timeout {
                    op: "UniqueId::wait_for_file",
                    rank: None,
                    waited: timeout,
                    waiting: format!("no id at {}", path.display()),
                });
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

/// The version of the NCCL this process loads, as NCCL encodes it (`22703` for 2.27.3).
///
/// # Errors
/// [`Error::Library`] where NCCL cannot be loaded.
pub fn nccl_version() -> Result<i32> {
    nccl::version()
}

/// Whether NCCL can be loaded on this machine.
pub fn nccl_present() -> bool {
    nccl::present()
}

enum Backend {
    Nccl(Arc<nccl::Comm>),
    /// An in-process group: of interpreter devices, or (`simulated`) of ranks sharing GPUs.
    Host {
        group: Arc<host::Group>,
        seq: Cell<u64>,
        simulated: bool,
    },
}

/// One rank of a group of devices that run collectives together.
///
/// Not `Sync`: a rank's calls are made from one thread at a time (NCCL's rule). Every rank
/// of a group must make the same collective calls in the same order, with the same sizes;
/// where they do not, an interpreter group reports it ([`Error::Collective`]) and an NCCL
/// group with [`Communicator::checked`] on does, before the call (without it NCCL waits or
/// reads past the buffers; [`Communicator::synchronize`]'s timeout then stops it).
pub struct Communicator {
    rank: usize,
    world: usize,
    device: Device,
    timeout: Duration,
    checked: bool,
    backend: Backend,
}

impl std::fmt::Debug for Communicator {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let how = match self.backend {
            Backend::Nccl(_) => "NCCL",
            Backend::Host { simulated: false, .. } => "in-process",
            Backend::Host { simulated: true, .. } => "simulated on GPUs",
        };
        write!(f, "Communicator(rank {} of {}, {how}, {:?})", self.rank, self.world, self.device)
    }
}

/// What a collective reads or writes, checked: where it lives.
#[derive(Clone)]
enum Loc {
    Cuda(u64),
    Host(host::Span),
}

thread_local! {
    /// Inside [`group`]: how deep, and the in-process waits deferred to its end.
    static GROUP: RefCell<(usize, Vec<Deferred>)> = const { RefCell::new((0, Vec::new())) };
}

struct Deferred {
    group: Arc<host::Group>,
    rank: usize,
    ticket: host::Ticket,
    timeout: Duration,
    op: &'static str,
}

/// Runs `f` as one group of calls: nothing `f` queues waits for the other ranks until `f`
/// returns (`ncclGroupStart` / `ncclGroupEnd`, and the same for interpreter groups). One
/// thread that drives several ranks must queue their calls in a group; send/recv pairs
/// between ranks that each send and receive (a ring) must be in one too. Groups nest.
///
/// # Errors
/// `f`'s error, or the first failure of a call it queued.
pub fn group<R>(f: impl FnOnce() -> Result<R>) -> Result<R> {
    let outer = GROUP.with(|g| {
        let mut g = g.borrow_mut();
        g.0 += 1;
        g.0 == 1
    });
    let nccl = outer && nccl::present();
    if nccl {
        nccl::group_start()?;
    }
    let r = f();
    let end = if nccl { nccl::group_end() } else { Ok(()) };
    let deferred = GROUP.with(|g| {
        let mut g = g.borrow_mut();
        g.0 -= 1;
        if g.0 == 0 {
            std::mem::take(&mut g.1)
        } else {
            Vec::new()
        }
    });
    let mut waited = Ok(());
    for d in deferred {
        let w = wait_host(&d.group, d.rank, &d.ticket, d.timeout, d.op);
        if waited.is_ok() {
            waited = w;
        }
    }
    let r = r?;
    end?;
    waited?;
    Ok(r)
}

fn in_group() -> bool {
    GROUP.with(|g| g.borrow().0 > 0)
}

fn wait_host(group: &host::Group, rank: usize, ticket: &host::Ticket, timeout: Duration, op: &'static str) -> Result<()> {
    group.wait(rank, ticket, timeout).map_err(|stop| match stop {
        host::Stop::Timeout(waiting) => {
            group.abort(format!("rank {rank} timed out in {op}: {waiting}"));
            Error::Timeout { op, rank: Some(rank), waited: timeout, waiting }
        }
        host::Stop::Aborted(why) => Error::Collective { op, rank, message: format!("the group was aborted: {why}") },
        host::Stop::Mismatch(message) => Error::Collective { op, rank, message },
    })
}

/// The default time a wait may take before the group is aborted.
const DEFAULT_TIMEOUT: Duration = Duration::from_secs(600);

impl Communicator {
    /// Rank `rank` of `world` on `device`, the defaults set.
    fn new(rank: usize, world: usize, device: &Device, backend: Backend) -> Communicator {
        let checked = cfg!(debug_assertions) || matches!(backend, Backend::Host { .. });
        Communicator { rank, world, device: device.clone(), timeout: DEFAULT_TIMEOUT, checked, backend }
    }

    /// One communicator per device, all in this process: ranks `0..devices.len()` in order.
    /// GPUs join one NCCL group (`ncclCommInitAll`; each GPU once); interpreter devices an
    /// in-process group.
    ///
    /// # Errors
    /// [`Error::Argument`] for no devices, GPUs and interpreter devices mixed, or a GPU given
    /// twice; [`Error::Library`] where NCCL cannot be loaded or fails.
    pub fn for_devices(devices: &[Device]) -> Result<Vec<Communicator>> {
        let arg = |expected: &str, found: String| Error::Argument {
            kernel: "Communicator::for_devices",
            arg: "devices".into(),
            expected: expected.into(),
            found,
        };
        let Some(first) = devices.first() else {
            return Err(arg("at least one device", "none".into()));
        };
        let world = devices.len();
        let make = |rank: usize, device: &Device, backend: Backend| Communicator::new(rank, world, device, backend);
        if first.is_cpu() {
            if let Some(gpu) = devices.iter().find(|d| !d.is_cpu()) {
                return Err(arg("devices all of one kind", format!("the CPU interpreter and {gpu:?}")));
            }
            let group = host::Group::new(world);
            return Ok(devices
                .iter()
                .enumerate()
                .map(|(r, d)| make(r, d, Backend::Host { group: group.clone(), seq: Cell::new(0), simulated: false }))
                .collect());
        }
        let mut ordinals = Vec::with_capacity(world);
        for d in devices {
            let ordinal = d.context()?.ordinal();
            if ordinals.contains(&(ordinal as i32)) {
                return Err(arg("each GPU once (NCCL has one rank a GPU)", format!("GPU {ordinal} twice")));
            }
            ordinals.push(ordinal as i32);
        }
        let comms = nccl::Comm::init_all(&ordinals)?;
        Ok(comms.into_iter().zip(devices).enumerate().map(|(r, (c, d))| make(r, d, Backend::Nccl(Arc::new(c)))).collect())
    }

    /// Rank `rank` of a group of `world` that every rank joins with the same `id` — one
    /// process (or thread) a rank, as torchrun starts them. Blocks until all have joined
    /// (NCCL's `ncclCommInitRank`). A GPU device takes an NCCL id ([`UniqueId::new`]); an
    /// interpreter device a [`UniqueId::local`] one, its group living in this process.
    ///
    /// # Errors
    /// [`Error::Argument`] for a rank past the group or an id of the other kind;
    /// [`Error::Library`] from NCCL; [`Error::Timeout`] where an interpreter group's ranks do
    /// not all join within the default timeout.
    pub fn for_rank(device: &Device, rank: usize, world: usize, id: &UniqueId) -> Result<Communicator> {
        let arg =
            |a: &str, expected: String, found: String| Error::Argument { kernel: "Communicator::for_rank", arg: a.into(), expected, found };
        if world == 0 || rank >= world {
            return Err(arg("rank", format!("a rank below the group's size {world}"), rank.to_string()));
        }
        let backend = if device.is_cpu() {
            if !id.is_local() {
                return Err(arg("id", "a UniqueId::local() id for an interpreter device".into(), "an NCCL id".into()));
            }
            let group = {
                let mut reg = host::registry().lock().unwrap_or_else(|p| p.into_inner());
                reg.entry(id.0).or_insert_with(|| host::Group::new(world)).clone()
            };
            if group.world != world {
                return Err(arg("world", format!("the size {} the group's first rank gave", group.world), world.to_string()));
            }
            Backend::Host { group, seq: Cell::new(0), simulated: false }
        } else {
            if id.is_local() {
                return Err(arg("id", "an NCCL id (UniqueId::new) for a GPU".into(), "a UniqueId::local() id".into()));
            }
            device.context()?.bind_to_thread()?;
            Backend::Nccl(Arc::new(nccl::Comm::init_rank(world, &id.0, rank)?))
        };
        Ok(Communicator::new(rank, world, device, backend))
    }

    /// Ranks that share GPUs — any device any number of times, each rank best on a stream of
    /// its own (`Device::from_stream`) — in one in-process group whose calls are staged through
    /// host memory: each call waits for its rank's stream, copies the data out, and the
    /// results are copied back in. Slow, and meant for that: testing code written for several
    /// GPUs (ring attention, tensor-parallel layers) on a machine of one, with the calls and
    /// errors of a real group.
    ///
    /// # Errors
    /// [`Error::Argument`] for no devices or an interpreter device among them.
    pub fn simulated(devices: &[Device]) -> Result<Vec<Communicator>> {
        let arg = |expected: &str, found: &str| Error::Argument {
            kernel: "Communicator::simulated",
            arg: "devices".into(),
            expected: expected.into(),
            found: found.into(),
        };
        if devices.is_empty() {
            return Err(arg("at least one device", "none"));
        }
        if devices.iter().any(Device::is_cpu) {
            return Err(arg("GPUs (interpreter devices form a group through Communicator::for_devices)", "the CPU interpreter"));
        }
        let group = host::Group::new(devices.len());
        let rank = |(rank, d): (usize, &Device)| {
            Communicator::new(rank, devices.len(), d, Backend::Host { group: group.clone(), seq: Cell::new(0), simulated: true })
        };
        Ok(devices.iter().enumerate().map(rank).collect())
    }

    /// This rank.
    pub fn rank(&self) -> usize {
        self.rank
    }

    /// The number of ranks.
    pub fn world_size(&self) -> usize {
        self.world
    }

    /// The device (and so the stream) the calls run on.
    pub fn device(&self) -> &Device {
        &self.device
    }

    /// How long a wait ([`Communicator::synchronize`], an interpreter group's call) may take
    /// before the communicator is aborted (600 s by default).
    pub fn with_timeout(mut self, timeout: Duration) -> Communicator {
        self.timeout = timeout;
        self
    }

    /// Whether each collective first checks that every rank makes the same call with the same
    /// sizes (a small all-gather and a wait: for debugging; on by default in debug builds).
    /// Interpreter groups always check.
    pub fn checked(mut self, on: bool) -> Communicator {
        self.checked = on;
        self
    }

    /// The calls queued from now on run on `device`'s stream — a stream of the same GPU
    /// (`Device::from_stream(ctx.new_stream()?)`) — so that they overlap the work of the
    /// stream they came from. Tensors used on both are ordered by cudarc's events.
    ///
    /// # Errors
    /// [`Error::Argument`] for a device of another GPU or of another kind.
    pub fn with_stream(mut self, device: &Device) -> Result<Communicator> {
        let same = match (&self.backend, device.is_cpu()) {
            (Backend::Host { simulated: false, .. }, true) => true,
            (Backend::Nccl(_) | Backend::Host { simulated: true, .. }, false) => {
                self.device.context()?.cu_ctx() == device.context()?.cu_ctx()
            }
            _ => false,
        };
        if !same {
            return Err(Error::Argument {
                kernel: "Communicator::with_stream",
                arg: "device".into(),
                expected: format!("a stream of the communicator's own device {:?}", self.device),
                found: format!("{device:?}"),
            });
        }
        self.device = device.clone();
        Ok(self)
    }

    /// Waits until every call queued so far has finished on the device, polling NCCL for
    /// errors; past the timeout the communicator is aborted (its calls on other ranks stop
    /// with an error too).
    ///
    /// # Errors
    /// [`Error::Timeout`], or NCCL's or the driver's error.
    pub fn synchronize(&self) -> Result<()> {
        let Backend::Nccl(comm) = &self.backend else { return Ok(()) };
        let stream = self.device.stream()?;
        let event = stream.record_event(None)?;
        let start = std::time::Instant::now();
        let mut pause = Duration::from_micros(20);
        loop {
            if let Some(e) = comm.async_error() {
                comm.abort();
                return Err(e);
            }
            if event.try_is_complete()? {
                return Ok(());
            }
            if start.elapsed() >= self.timeout {
                comm.abort();
                return Err(Error::Timeout {
                    op: "synchronize",
                    rank: Some(self.rank),
                    waited: self.timeout,
                    waiting: "the queued collectives did not finish (a rank that never made its call?)".into(),
                });
            }
            std::thread::sleep(pause);
            pause = (pause * 2).min(Duration::from_millis(2));
        }
    }

    /// Stops this rank's communicator: what is queued ends with an error, later calls fail.
    pub fn abort(&self) {
        match &self.backend {
            Backend::Nccl(c) => c.abort(),
            Backend::Host { group, .. } => group.abort(format!("rank {} aborted", self.rank)),
        }
    }

    /// `recv = op(send of every rank)`, elementwise; `send` and `recv` hold as many elements.
    ///
    /// # Errors
    /// [`Error::Argument`] for tensors that are not dense, not on this device, or of different
    /// sizes; see also the module's errors.
    pub fn all_reduce<T: Element>(&self, send: &impl GlobalArg<T>, recv: &mut impl GlobalArgMut<T>, op: ReduceOp) -> Result<()> {
        self.two::<T>(Kind::AllReduce(op), send, recv, |s, r| (s == r).then_some(r))
    }

    /// [`Communicator::all_reduce`] with one tensor read and written.
    ///
    /// # Errors
    /// As [`Communicator::all_reduce`].
    pub fn all_reduce_in_place<T: Element>(&self, t: &mut impl GlobalArgMut<T>, op: ReduceOp) -> Result<()> {
        self.one::<T>(Kind::AllReduce(op), t)
    }

    /// `recv = [send of rank 0, send of rank 1, …]`: `recv` holds `world` times `send`'s
    /// elements.
    ///
    /// # Errors
    /// As [`Communicator::all_reduce`].
    pub fn all_gather<T: Element>(&self, send: &impl GlobalArg<T>, recv: &mut impl GlobalArgMut<T>) -> Result<()> {
        let w = self.world;
        self.two::<T>(Kind::AllGather, send, recv, |s, r| (s.checked_mul(w) == Some(r)).then_some(s))
    }

    /// This rank's part of `op(send of every rank)`: `send` holds `world` parts of `recv`'s
    /// size, and rank `i` receives the reduction of the parts `i`.
    ///
    /// # Errors
    /// As [`Communicator::all_reduce`].
    pub fn reduce_scatter<T: Element>(&self, send: &impl GlobalArg<T>, recv: &mut impl GlobalArgMut<T>, op: ReduceOp) -> Result<()> {
        let w = self.world;
        self.two::<T>(Kind::ReduceScatter(op), send, recv, |s, r| (r.checked_mul(w) == Some(s)).then_some(r))
    }

    /// `t = t of rank root`, on every rank.
    ///
    /// # Errors
    /// [`Error::Argument`] for a root past the group; as [`Communicator::all_reduce`].
    pub fn broadcast<T: Element>(&self, t: &mut impl GlobalArgMut<T>, root: usize) -> Result<()> {
        if root >= self.world {
            return Err(self.arg("broadcast", "root", format!("a rank below {}", self.world), root.to_string()));
        }
        self.one::<T>(Kind::Broadcast(root), t)
    }

    /// Sends `t` to rank `peer`, which receives it with [`Communicator::recv`]. Pairs between
    /// ranks that both send and receive go in one [`group`].
    ///
    /// # Errors
    /// [`Error::Argument`] for a peer past the group; as [`Communicator::all_reduce`].
    pub fn send<T: Element>(&self, t: &impl GlobalArg<T>, peer: usize) -> Result<()> {
        self.check_peer("send", peer)?;
        let (d, _guard) = t.global_desc(&self.device)?;
        let (n, loc) = self.locate::<T>("send", "t", &d)?;
        match (&self.backend, loc) {
            // SAFETY: `loc` was checked to be `n` dense elements on this communicator's GPU;
            // the guard orders the stream after their earlier writes.
            (Backend::Nccl(c), Loc::Cuda(ptr)) => unsafe { c.send(T::DTYPE, n, ptr, peer, self.raw_stream()?) },
            (Backend::Host { group, .. }, Loc::Host(span)) => {
                let data = self.snapshot(&span, "send")?;
                group.send(self.rank, peer, T::DTYPE, data);
                Ok(())
            }
            _ => unreachable!("locate checks the tensor's kind"),
        }
    }

    /// Receives into `t` what rank `peer` [sends](Communicator::send) (as many elements).
    ///
    /// # Errors
    /// As [`Communicator::send`]; an interpreter group also reports a message of another size.
    pub fn recv<T: Element>(&self, t: &mut impl GlobalArgMut<T>, peer: usize) -> Result<()> {
        self.check_peer("recv", peer)?;
        let (d, _guard) = t.global_desc_mut(&self.device)?;
        let (n, loc) = self.locate::<T>("recv", "t", &d)?;
        match (&self.backend, loc) {
            // SAFETY: as in `send`.
            (Backend::Nccl(c), Loc::Cuda(ptr)) => unsafe { c.recv(T::DTYPE, n, ptr, peer, self.raw_stream()?) },
            (Backend::Host { group, simulated, .. }, Loc::Host(span)) => {
                if *simulated {
                    // Nothing queued before on this rank's stream may still use the buffer.
                    self.device.synchronize()?;
                }
                self.finish_host(group, host::Ticket::Recv { from: peer, span, dtype: T::DTYPE }, "recv")
            }
            _ => unreachable!("locate checks the tensor's kind"),
        }
    }

    fn check_peer(&self, op: &'static str, peer: usize) -> Result<()> {
        if peer >= self.world {
            return Err(self.arg(op, "peer", format!("a rank below {}", self.world), peer.to_string()));
        }
        Ok(())
    }

    fn arg(&self, op: &'static str, arg: &str, expected: String, found: String) -> Error {
        Error::Argument { kernel: op, arg: arg.into(), expected, found }
    }

    fn raw_stream(&self) -> Result<cudarc::nccl::sys::cudaStream_t> {
        Ok(self.device.stream()?.cu_stream() as cudarc::nccl::sys::cudaStream_t)
    }

    /// Checks a tensor for `op`: dense, on this communicator's device; its element count and
    /// location.
    fn locate<T: Element>(&self, op: &'static str, arg: &str, d: &GlobalDesc) -> Result<(usize, Loc)> {
        let n: usize = d.shape.iter().product();
        let dense = d.shape.iter().zip(&d.strides).zip(contiguous_strides(&d.shape)).all(|((&e, &s), c)| e <= 1 || s == c);
        if !dense {
            return Err(self.arg(op, arg, "a dense row-major tensor".into(), format!("shape {:?} with strides {:?}", d.shape, d.strides)));
        }
        let es = std::mem::size_of::<T>();
        let same_gpu = |this: &Self| -> Result<()> {
            if d.context != this.device.context()?.cu_ctx() as usize {
                let expected = format!("a tensor on the communicator's GPU ({:?})", this.device);
                return Err(this.arg(op, arg, expected, "a tensor of another GPU".into()));
            }
            Ok(())
        };
        let span = |place| Loc::Host(host::Span { place, offset: d.ptr as usize, bytes: n * es });
        match (&self.backend, &d.host) {
            (Backend::Host { simulated: false, .. }, Some(buf)) => Ok((n, span(host::Place::Host(buf.clone())))),
            (Backend::Host { simulated: true, .. }, None) => {
                same_gpu(self)?;
                Ok((n, span(host::Place::Device(self.device.context()?.clone()))))
            }
            (Backend::Nccl(_), None) => {
                same_gpu(self)?;
                Ok((n, Loc::Cuda(d.ptr)))
            }
            (Backend::Host { simulated: false, .. }, None) => {
                Err(self.arg(op, arg, "a tensor of the CPU interpreter (an in-process group)".into(), "a GPU tensor".into()))
            }
            (Backend::Nccl(_) | Backend::Host { simulated: true, .. }, Some(_)) => {
                let expected = format!("a tensor on the communicator's GPU ({:?})", self.device);
                Err(self.arg(op, arg, expected, "a tensor of the CPU interpreter".into()))
            }
        }
    }

    /// A collective of a read and a written tensor; `count(send, recv)` gives NCCL's count
    /// where the sizes fit.
    fn two<T: Element>(
        &self, kind: Kind, send: &impl GlobalArg<T>, recv: &mut impl GlobalArgMut<T>, count: impl Fn(usize, usize) -> Option<usize>,
    ) -> Result<()> {
        let op = kind.name();
        let (sd, _sg) = send.global_desc(&self.device)?;
        let (rd, _rg) = recv.global_desc_mut(&self.device)?;
        let (sn, sl) = self.locate::<T>(op, "send", &sd)?;
        let (rn, rl) = self.locate::<T>(op, "recv", &rd)?;
        let Some(n) = count(sn, rn) else {
            let expected = match kind {
                Kind::AllGather => format!("{} × send's {sn} elements (one part a rank)", self.world),
                Kind::ReduceScatter(_) => format!("send's {sn} elements / {} ranks", self.world),
                _ => format!("send's {sn} elements"),
            };
            return Err(self.arg(op, "recv", expected, format!("{rn} elements")));
        };
        self.run::<T>(kind, n, sl, rl)
    }

    /// A collective in place on one tensor.
    fn one<T: Element>(&self, kind: Kind, t: &mut impl GlobalArgMut<T>) -> Result<()> {
        let op = kind.name();
        let (d, _g) = t.global_desc_mut(&self.device)?;
        let (n, loc) = self.locate::<T>(op, "t", &d)?;
        self.run::<T>(kind, n, loc.clone(), loc)
    }

    fn run<T: Element>(&self, kind: Kind, count: usize, send: Loc, recv: Loc) -> Result<()> {
        match (&self.backend, send, recv) {
            (Backend::Nccl(c), Loc::Cuda(s), Loc::Cuda(r)) => {
                // Over one rank an average is the value itself. NCCL 2.28 runs a one-rank
                // average through a scaling kernel of its own that left elements past the
                // first few unwritten on the H200 (7 and 1003 elements, f32; MEASUREMENTS run
                // 335): sent as a sum (a copy).
                let kind = match kind {
                    Kind::AllReduce(ReduceOp::Avg) if self.world == 1 => Kind::AllReduce(ReduceOp::Sum),
                    Kind::ReduceScatter(ReduceOp::Avg) if self.world == 1 => Kind::ReduceScatter(ReduceOp::Sum),
                    k => k,
                };
                if self.checked {
                    self.check_calls(c, kind, T::DTYPE, count)?;
                }
                // SAFETY: both were checked to be dense tensors of the sizes `kind` and
                // `count` need on this GPU; the caller's guards order the stream after them.
                unsafe { c.call(kind, T::DTYPE, count, s, r, self.raw_stream()?) }
            }
            (Backend::Host { group, seq, .. }, Loc::Host(s), Loc::Host(r)) => {
                let send = self.snapshot(&s, kind.name())?;
                let n = seq.get();
                seq.set(n + 1);
                let ticket = group.post(self.rank, n, host::Post { kind, dtype: T::DTYPE, count, send, recv: r });
                self.finish_host(group, ticket, kind.name())
            }
            _ => unreachable!("locate checks the tensors' kind"),
        }
    }

    /// What an in-process rank sends, copied out now (after its stream's work, on GPUs).
    fn snapshot(&self, span: &host::Span, op: &'static str) -> Result<Vec<u8>> {
        if matches!(span.place, host::Place::Device(_)) {
            self.device.synchronize()?;
        }
        span.read().map_err(|message| Error::Collective { op, rank: self.rank, message })
    }

    /// Waits for an interpreter group's call now, or at the end of the enclosing [`group`].
    fn finish_host(&self, group: &Arc<host::Group>, ticket: host::Ticket, op: &'static str) -> Result<()> {
        if in_group() {
            GROUP.with(|g| g.borrow_mut().1.push(Deferred { group: group.clone(), rank: self.rank, ticket, timeout: self.timeout, op }));
            return Ok(());
        }
        wait_host(group, self.rank, &ticket, self.timeout, op)
    }

    /// [`Communicator::checked`]'s test: the ranks' (call, dtype, count) all-gathered and
    /// compared. Not inside a group (it waits).
    fn check_calls(&self, c: &nccl::Comm, kind: Kind, dtype: crate::DType, count: usize) -> Result<()> {
        if in_group() {
            return Ok(());
        }
        let sig = [kind.code(), dtype as i32, (count & 0x7fff_ffff) as i32, (count >> 31) as i32];
        let stream = self.device.stream()?;
        let mine = stream.clone_htod(&sig)?;
        let mut all = stream.alloc_zeros::<i32>(4 * self.world)?;
        {
            use cudarc::driver::{DevicePtr, DevicePtrMut};
            let (s, _g1) = mine.device_ptr(stream);
            let (r, _g2) = all.device_ptr_mut(stream);
            // SAFETY: 4 i32 sent, 4 × world received, both on this GPU.
            unsafe { c.call(Kind::AllGather, crate::DType::I32, 4, s, r, self.raw_stream()?)? };
        }
        self.synchronize()?;
        let all = stream.clone_dtoh(&all)?;
        for (r, theirs) in all.chunks(4).enumerate() {
            if theirs != sig {
                return Err(Error::Collective {
                    op: kind.name(),
                    rank: self.rank,
                    message: format!(
                        "the ranks disagree: this rank calls {} of {count} {dtype} elements, rank {r} a call of code {} with {} elements of type #{}",
                        kind.name(),
                        theirs[0],
                        i64::from(theirs[2]) | (i64::from(theirs[3]) << 31),
                        theirs[1]
                    ),
                });
            }
        }
        Ok(())
    }
}
