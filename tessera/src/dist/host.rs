//! The in-process group of interpreter devices: the collectives' meaning, run on host memory.
//!
//! Each rank's `n`-th collective is matched with every other rank's `n`-th, as NCCL matches
//! them; the last rank to post one runs it for all (every buffer is host memory, shared
//! behind its lock) and wakes the others. Sends are eager (the data is copied out when posted,
//! as the interpreter has run everything before it); a receive takes the oldest message from
//! its peer. Inside [`super::group`] nothing waits until the group ends, so one thread can
//! drive every rank, as with NCCL.

use super::{Kind, ReduceOp};
use crate::tensor::HostBuffer;
use crate::DType;
use std::collections::{BTreeMap, HashMap, VecDeque};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};

/// Where a span's bytes live: host memory (the interpreter's), or a GPU's (a simulated group,
/// its ranks sharing GPUs, every call staged through the host).
#[derive(Clone)]
pub(crate) enum Place {
    Host(HostBuffer),
    Device(Arc<cudarc::driver::CudaContext>),
}

/// A stretch of a tensor: where it lives and the byte range of its elements (for a GPU
/// tensor, `offset` is its device address).
#[derive(Clone)]
pub(crate) struct Span {
    pub place: Place,
    pub offset: usize,
    pub bytes: usize,
}

impl std::fmt::Debug for Span {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let at = if matches!(self.place, Place::Host(_)) { "host" } else { "device" };
        write!(f, "Span({at}, {} bytes)", self.bytes)
    }
}

impl Span {
    /// The bytes (for a GPU span, copied once its rank's stream has finished writing them,
    /// which the caller waited for).
    pub fn read(&self) -> Result<Vec<u8>, String> {
        match &self.place {
            Place::Host(buf) => Ok(buf.lock()[self.offset..self.offset + self.bytes].to_vec()),
            Place::Device(ctx) => {
                let mut out = vec![0u8; self.bytes];
                ctx.bind_to_thread().map_err(|e| e.to_string())?;
                // SAFETY: the span was checked to lie in a live buffer of this context.
                unsafe { cudarc::driver::result::memcpy_dtoh_sync(&mut out, self.offset as u64) }.map_err(|e| e.to_string())?;
                Ok(out)
            }
        }
    }

    fn write(&self, data: &[u8]) -> Result<(), String> {
        match &self.place {
            Place::Host(buf) => {
                buf.lock()[self.offset..self.offset + data.len()].copy_from_slice(data);
                Ok(())
            }
            Place::Device(ctx) => {
                ctx.bind_to_thread().map_err(|e| e.to_string())?;
                // SAFETY: as in `read`; `data` is no longer than the span.
                unsafe { cudarc::driver::result::memcpy_htod_sync(self.offset as u64, data) }.map_err(|e| e.to_string())
            }
        }
    }
}

/// One rank's part of a collective.
#[derive(Debug)]
pub(crate) struct Post {
    pub kind: Kind,
    pub dtype: DType,
    /// Elements per rank, as NCCL counts them (a reduce-scatter's received count).
    pub count: usize,
    /// What the rank sends, copied out when it posted.
    pub send: Vec<u8>,
    pub recv: Span,
}

/// The outcome of a collective: `Ok` or the message every rank reports.
type Outcome = Result<(), String>;

/// A message in flight: its element type and bytes.
type Message = (DType, Vec<u8>);

#[derive(Default)]
struct State {
    /// Per collective sequence number, each rank's post.
    pending: BTreeMap<u64, Vec<Option<Post>>>,
    /// Outcomes not yet collected, and by how many ranks still to collect them.
    done: HashMap<u64, (Outcome, usize)>,
    /// Messages in flight, by (from, to).
    messages: HashMap<(usize, usize), VecDeque<Message>>,
    /// Why the group stopped, once a rank aborted it.
    aborted: Option<String>,
}

/// The shared half of an in-process group.
pub(crate) struct Group {
    pub world: usize,
    state: Mutex<State>,
    cv: Condvar,
}

/// What a rank waits for at the end of a call or a group.
#[derive(Debug)]
pub(crate) enum Ticket {
    Collective(u64),
    Recv { from: usize, span: Span, dtype: DType },
}

impl Group {
    pub fn new(world: usize) -> Arc<Group> {
        Arc::new(Group { world, state: Mutex::new(State::default()), cv: Condvar::new() })
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Stops the group: every rank's waits return `why`.
    pub fn abort(&self, why: String) {
        self.lock().aborted.get_or_insert(why);
        self.cv.notify_all();
    }

    /// Posts rank `rank`'s part of its `seq`-th collective; the last rank's post runs it.
    pub fn post(&self, rank: usize, seq: u64, post: Post) -> Ticket {
        let mut st = self.lock();
        let world = self.world;
        let slots = st.pending.entry(seq).or_insert_with(|| (0..world).map(|_| None).collect());
        slots[rank] = Some(post);
        if slots.iter().all(Option::is_some) {
            let posts: Vec<Post> = st.pending.remove(&seq).unwrap_or_default().into_iter().flatten().collect();
            let outcome = run(&posts);
            st.done.insert(seq, (outcome, world));
            self.cv.notify_all();
        }
        Ticket::Collective(seq)
    }

    /// Sends `data` from `from` to `to` (copied now).
    pub fn send(&self, from: usize, to: usize, dtype: DType, data: Vec<u8>) {
        self.lock().messages.entry((from, to)).or_default().push_back((dtype, data));
        self.cv.notify_all();
    }

    /// Waits until `ticket` is done (or `timeout` passes, or the group is aborted), for rank
    /// `rank`.
    pub fn wait(&self, rank: usize, ticket: &Ticket, timeout: Duration) -> Result<(), Stop> {
        let deadline = Instant::now() + timeout;
        let mut st = self.lock();
        loop {
            if let Some(why) = &st.aborted {
                return Err(Stop::Aborted(why.clone()));
            }
            match ticket {
                Ticket::Collective(seq) => {
                    if let Some((outcome, left)) = st.done.get_mut(seq) {
                        let outcome = outcome.clone();
                        *left -= 1;
                        if *left == 0 {
                            st.done.remove(seq);
                        }
                        return outcome.map_err(Stop::Mismatch);
                    }
                }
                Ticket::Recv { from, span, dtype } => {
                    if let Some(q) = st.messages.get_mut(&(*from, rank)) {
                        if let Some((sent, data)) = q.pop_front() {
                            if sent != *dtype || data.len() != span.bytes {
                                let es = dtype.size() as usize;
                                return Err(Stop::Mismatch(format!(
                                    "rank {rank} receives {} {dtype} elements from rank {from}, which sent {} {sent}",
                                    span.bytes / es,
                                    data.len() / (sent.size() as usize).max(1)
                                )));
                            }
                            return span.write(&data).map_err(Stop::Mismatch);
                        }
                    }
                }
            }
            let now = Instant::now();
            if now >= deadline {
                return Err(Stop::Timeout(self.missing(&st, rank, ticket)));
            }
            st = self.cv.wait_timeout(st, deadline - now).unwrap_or_else(|p| p.into_inner()).0;
        }
    }

    /// Who has not arrived for `ticket`.
    fn missing(&self, st: &State, rank: usize, ticket: &Ticket) -> String {
        match ticket {
            Ticket::Collective(seq) => {
                let absent: Vec<usize> = st
                    .pending
                    .get(seq)
                    .map(|slots| slots.iter().enumerate().filter(|(_, p)| p.is_none()).map(|(r, _)| r).collect())
                    .unwrap_or_default();
                format!("collective #{seq} still waits for rank(s) {absent:?}")
            }
            Ticket::Recv { from, .. } => format!("rank {rank} waits for a message from rank {from}"),
        }
    }
}

/// Why a wait stopped.
#[derive(Debug)]
pub(crate) enum Stop {
    Timeout(String),
    Aborted(String),
    Mismatch(String),
}

/// Runs one collective over every rank's post (in rank order).
fn run(posts: &[Post]) -> Outcome {
    let first = &posts[0];
    for (r, p) in posts.iter().enumerate() {
        if p.kind != first.kind || p.dtype != first.dtype || p.count != first.count {
            return Err(format!(
                "the ranks disagree: rank 0 calls {} of {} {} elements, rank {r} {} of {} {}",
                first.kind.name(),
                first.count,
                first.dtype,
                p.kind.name(),
                p.count,
                p.dtype
            ));
        }
    }
    let es = first.dtype.size() as usize;
    let sends: Vec<&[u8]> = posts.iter().map(|p| p.send.as_slice()).collect();
    let mut writes: Vec<(&Span, Vec<u8>)> = Vec::new();
    match first.kind {
        Kind::AllReduce(op) => {
            let out = reduce(first.dtype, op, &sends);
            writes.extend(posts.iter().map(|p| (&p.recv, out.clone())));
        }
        Kind::ReduceScatter(op) => {
            let out = reduce(first.dtype, op, &sends);
            let part = first.count * es;
            writes.extend(posts.iter().enumerate().map(|(r, p)| (&p.recv, out[r * part..(r + 1) * part].to_vec())));
        }
        Kind::AllGather => {
            let all: Vec<u8> = sends.concat();
            writes.extend(posts.iter().map(|p| (&p.recv, all.clone())));
        }
        Kind::Broadcast(root) => {
            let Some(data) = sends.get(root) else {
                return Err(format!("broadcast from rank {root} in a group of {}", posts.len()));
            };
            writes.extend(posts.iter().map(|p| (&p.recv, data.to_vec())));
        }
    }
    writes.into_iter().try_for_each(|(span, data)| span.write(&data))
}

/// Elementwise `op` over equal-length byte buffers of `dtype`, in rank order, in f64 (i64 for
/// integers), rounded once to `dtype`.
fn reduce(dtype: DType, op: ReduceOp, parts: &[&[u8]]) -> Vec<u8> {
    let es = dtype.size() as usize;
    let n = parts[0].len() / es;
    let mut out = vec![0u8; n * es];
    let ranks = parts.len() as f64;
    for i in 0..n {
        fn at(p: &[u8], i: usize, es: usize) -> &[u8] {
            &p[i * es..(i + 1) * es]
        }
        if dtype == DType::I32 {
            let v = parts.iter().map(|p| i64::from(i32::from_le_bytes(at(p, i, es).try_into().unwrap_or([0; 4]))));
            let r = match op {
                ReduceOp::Sum => v.sum::<i64>(),
                ReduceOp::Prod => v.product::<i64>(),
                ReduceOp::Max => v.max().unwrap_or(0),
                ReduceOp::Min => v.min().unwrap_or(0),
                ReduceOp::Avg => v.sum::<i64>() / parts.len() as i64,
            };
            // NCCL's integer sums wrap.
            out[i * es..(i + 1) * es].copy_from_slice(&(r as i32).to_le_bytes());
            continue;
        }
        let v = parts.iter().map(|p| decode(dtype, at(p, i, es)));
        let r = match op {
            ReduceOp::Sum => v.sum::<f64>(),
            ReduceOp::Prod => v.product::<f64>(),
            ReduceOp::Max => v.fold(f64::NEG_INFINITY, f64::max),
            ReduceOp::Min => v.fold(f64::INFINITY, f64::min),
            ReduceOp::Avg => v.sum::<f64>() / ranks,
        };
        encode(dtype, r, &mut out[i * es..(i + 1) * es]);
    }
    out
}

fn decode(dtype: DType, b: &[u8]) -> f64 {
    let u16_of = |b: &[u8]| u16::from_le_bytes([b[0], b[1]]);
    match dtype {
        DType::F32 => f64::from(f32::from_le_bytes([b[0], b[1], b[2], b[3]])),
        DType::BF16 => f64::from(half::bf16::from_bits(u16_of(b)).to_f32()),
        DType::F16 => f64::from(half::f16::from_bits(u16_of(b)).to_f32()),
        DType::F8E4M3 => f64::from(crate::F8E4M3::from_bits(b[0]).to_f32()),
        DType::F8E5M2 => f64::from(crate::F8E5M2::from_bits(b[0]).to_f32()),
        DType::I32 => f64::from(i32::from_le_bytes([b[0], b[1], b[2], b[3]])),
    }
}

fn encode(dtype: DType, v: f64, out: &mut [u8]) {
    let x = v as f32;
    match dtype {
        DType::F32 => out.copy_from_slice(&x.to_le_bytes()),
        DType::BF16 => out.copy_from_slice(&half::bf16::from_f64(v).to_bits().to_le_bytes()),
        DType::F16 => out.copy_from_slice(&half::f16::from_f64(v).to_bits().to_le_bytes()),
        DType::F8E4M3 => out[0] = crate::F8E4M3::from_f32(x).to_bits(),
        DType::F8E5M2 => out[0] = crate::F8E5M2::from_f32(x).to_bits(),
        DType::I32 => out.copy_from_slice(&(v as i32).to_le_bytes()),
    }
}

/// In-process groups made by `Communicator::for_rank` on interpreter devices, by id.
pub(crate) fn registry() -> &'static Mutex<HashMap<[u8; 128], Arc<Group>>> {
    static GROUPS: std::sync::OnceLock<Mutex<HashMap<[u8; 128], Arc<Group>>>> = std::sync::OnceLock::new();
    GROUPS.get_or_init(Default::default)
}
