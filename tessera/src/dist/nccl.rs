//! The NCCL backend: a communicator per GPU rank through cudarc's `nccl` bindings (NCCL is
//! loaded when first used, so that builds need no toolkit), collectives queued on a stream.

use super::{Kind, ReduceOp};
use crate::{DType, Error, Result};
use cudarc::nccl::sys;
use std::ffi::c_void;

/// Whether NCCL can be used here: linked into the process (cudarc's `dynamic-linking`, which
/// candle's `cuda` feature selects: the symbols are then in the process's global scope), or
/// loadable under the name cudarc's own loading asks for first, `libnccl.so` — not NCCL's
/// soname `libnccl.so.2`: where only that is installed (pip's `nvidia-nccl-cu12`/`-cu13`, as
/// PyTorch uses), a `libnccl.so` link to it on `LD_LIBRARY_PATH` is needed.
pub(crate) fn present() -> bool {
    static PRESENT: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *PRESENT.get_or_init(|| {
        #[cfg(unix)]
        {
            // SAFETY: looks a symbol up in the process's global scope; nothing is called.
            let linked = unsafe { libloading::os::unix::Library::this().get::<unsafe extern "C" fn()>(b"ncclGetVersion\0").is_ok() };
            linked || crate::library_present(&["libnccl.so"])
        }
        #[cfg(not(unix))]
        {
            false
        }
    })
}

/// An error from NCCL with its message: the last error NCCL recorded for `comm` where there is
/// one, else the result code's description.
pub(crate) fn error(op: &'static str, comm: sys::ncclComm_t, code: sys::ncclResult_t) -> Error {
    // SAFETY: NCCL returns static, NUL-terminated strings (or null).
    let text = |p: *const std::ffi::c_char| (!p.is_null()).then(|| unsafe { std::ffi::CStr::from_ptr(p) }.to_string_lossy().into_owned());
    let last = if comm.is_null() { None } else { text(unsafe { sys::ncclGetLastError(comm) }).filter(|s| !s.is_empty()) };
    let what = text(unsafe { sys::ncclGetErrorString(code) }).unwrap_or_else(|| format!("{code:?}"));
    let message = match last {
        Some(last) => format!("{what}: {last}"),
        None => what,
    };
    Error::Library { library: "libnccl", message: format!("{op}: {message}") }
}

fn check(op: &'static str, comm: sys::ncclComm_t, r: sys::ncclResult_t) -> Result<()> {
    match r {
        sys::ncclResult_t::ncclSuccess | sys::ncclResult_t::ncclInProgress => Ok(()),
        code => Err(error(op, comm, code)),
    }
}

fn missing() -> Error {
    Error::Library {
        library: "libnccl",
        message: "could not be loaded: cudarc asks the loader for `libnccl.so`; put it (or a link of that name to `libnccl.so.2`, as pip's nvidia-nccl packages ship it) on LD_LIBRARY_PATH".into(),
    }
}

/// A fresh NCCL unique id (rank 0 makes it and hands it to the others).
pub(crate) fn unique_id() -> Result<[u8; 128]> {
    if !present() {
        return Err(missing());
    }
    let mut id = sys::ncclUniqueId { internal: [0; 128] };
    // SAFETY: `id` is a valid out-pointer.
    check("ncclGetUniqueId", std::ptr::null_mut(), unsafe { sys::ncclGetUniqueId(&mut id) })?;
    Ok(id.internal.map(|c| c as u8))
}

/// The version of the NCCL loaded, as NCCL encodes it (`22703` for 2.27.3).
pub(crate) fn version() -> Result<i32> {
    if !present() {
        return Err(missing());
    }
    let mut v = 0;
    // SAFETY: `v` is a valid out-pointer.
    check("ncclGetVersion", std::ptr::null_mut(), unsafe { sys::ncclGetVersion(&mut v) })?;
    Ok(v)
}

/// An NCCL communicator; destroyed (or, after a failure, aborted) when dropped.
#[derive(Debug)]
pub(crate) struct Comm {
    pub raw: sys::ncclComm_t,
    /// Set once the communicator was aborted: nothing more may be queued on it.
    pub aborted: std::sync::atomic::AtomicBool,
}

// SAFETY: an NCCL communicator may be used from any thread, one call at a time; `Communicator`
// (which is not `Sync`) makes the calls.
unsafe impl Send for Comm {}
// SAFETY: the only call made through a shared reference from another thread is
// `ncclCommAbort`, which NCCL allows concurrently with the communicator's other calls.
unsafe impl Sync for Comm {}

impl Drop for Comm {
    fn drop(&mut self) {
        // SAFETY: the communicator is not used after this.
        unsafe {
            if self.aborted.load(std::sync::atomic::Ordering::SeqCst) || sys::ncclCommDestroy(self.raw) != sys::ncclResult_t::ncclSuccess {
                let _ = sys::ncclCommAbort(self.raw);
            }
        }
    }
}

impl Comm {
    /// Communicators for the GPUs `ordinals`, all in this process (`ncclCommInitAll`).
    pub fn init_all(ordinals: &[i32]) -> Result<Vec<Comm>> {
        if !present() {
            return Err(missing());
        }
        let n = i32::try_from(ordinals.len()).map_err(|_| Error::Argument {
            kernel: "Communicator::for_devices",
            arg: "devices".into(),
            expected: "fewer than 2^31 devices".into(),
            found: ordinals.len().to_string(),
        })?;
        let mut raw = vec![std::ptr::null_mut(); ordinals.len()];
        // SAFETY: `raw` has room for `n` communicators and `ordinals` holds `n` devices.
        check("ncclCommInitAll", std::ptr::null_mut(), unsafe { sys::ncclCommInitAll(raw.as_mut_ptr(), n, ordinals.as_ptr()) })?;
        Ok(raw.into_iter().map(|raw| Comm { raw, aborted: false.into() }).collect())
    }

    /// Rank `rank` of `world`, joining the others that use `id` (blocks until all have).
    pub fn init_rank(world: usize, id: &[u8; 128], rank: usize) -> Result<Comm> {
        if !present() {
            return Err(missing());
        }
        let (world, rank) = (i32::try_from(world).unwrap_or(i32::MAX), i32::try_from(rank).unwrap_or(i32::MAX));
        let id = sys::ncclUniqueId { internal: id.map(|b| b as std::ffi::c_char) };
        let mut raw = std::ptr::null_mut();
        // SAFETY: `raw` is a valid out-pointer; the id is one NCCL made.
        check("ncclCommInitRank", std::ptr::null_mut(), unsafe { sys::ncclCommInitRank(&mut raw, world, id, rank) })?;
        Ok(Comm { raw, aborted: false.into() })
    }

    /// NCCL's asynchronous error for this communicator, if it has one.
    pub fn async_error(&self) -> Option<Error> {
        let mut r = sys::ncclResult_t::ncclSuccess;
        // SAFETY: a live communicator and a valid out-pointer.
        let q = unsafe { sys::ncclCommGetAsyncError(self.raw, &mut r) };
        [q, r]
            .into_iter()
            .find(|c| !matches!(c, sys::ncclResult_t::ncclSuccess | sys::ncclResult_t::ncclInProgress))
            .map(|c| error("async", self.raw, c))
    }

    /// Stops everything queued on the communicator; it cannot be used afterwards.
    pub fn abort(&self) {
        if !self.aborted.swap(true, std::sync::atomic::Ordering::SeqCst) {
            // SAFETY: a live communicator; NCCL allows an abort from any thread.
            unsafe {
                let _ = sys::ncclCommAbort(self.raw);
            }
        }
    }

    /// Queues one collective (or one side of a send/recv) on `stream`.
    ///
    /// # Safety
    /// `send` and `recv` address at least the elements `kind` and `count` say, on the
    /// communicator's device, and stay valid until the stream has run the call.
    pub unsafe fn call(&self, kind: Kind, dtype: DType, count: usize, send: u64, recv: u64, stream: sys::cudaStream_t) -> Result<()> {
        if self.aborted.load(std::sync::atomic::Ordering::SeqCst) {
            return Err(Error::Library { library: "libnccl", message: format!("{}: the communicator was aborted", kind.name()) });
        }
        let (s, r) = (send as *const c_void, recv as *mut c_void);
        let ty = datatype(dtype);
        let code = match kind {
            Kind::AllReduce(op) => sys::ncclAllReduce(s, r, count, ty, red_op(op), self.raw, stream),
            Kind::ReduceScatter(op) => sys::ncclReduceScatter(s, r, count, ty, red_op(op), self.raw, stream),
            Kind::AllGather => sys::ncclAllGather(s, r, count, ty, self.raw, stream),
            Kind::Broadcast(root) => sys::ncclBroadcast(s, r, count, ty, i32::try_from(root).unwrap_or(i32::MAX), self.raw, stream),
        };
        check(kind.name(), self.raw, code)
    }

    /// Queues a send of `count` elements at `buf` to `peer` on `stream`.
    ///
    /// # Safety
    /// As [`Comm::call`].
    pub unsafe fn send(&self, dtype: DType, count: usize, buf: u64, peer: usize, stream: sys::cudaStream_t) -> Result<()> {
        let peer = i32::try_from(peer).unwrap_or(i32::MAX);
        check("send", self.raw, sys::ncclSend(buf as *const c_void, count, datatype(dtype), peer, self.raw, stream))
    }

    /// Queues a receive of `count` elements into `buf` from `peer` on `stream`.
    ///
    /// # Safety
    /// As [`Comm::call`].
    pub unsafe fn recv(&self, dtype: DType, count: usize, buf: u64, peer: usize, stream: sys::cudaStream_t) -> Result<()> {
        let peer = i32::try_from(peer).unwrap_or(i32::MAX);
        check("recv", self.raw, sys::ncclRecv(buf as *mut c_void, count, datatype(dtype), peer, self.raw, stream))
    }
}

/// `ncclGroupStart`.
pub(crate) fn group_start() -> Result<()> {
    // SAFETY: no arguments.
    check("ncclGroupStart", std::ptr::null_mut(), unsafe { sys::ncclGroupStart() })
}

/// `ncclGroupEnd`.
pub(crate) fn group_end() -> Result<()> {
    // SAFETY: no arguments.
    check("ncclGroupEnd", std::ptr::null_mut(), unsafe { sys::ncclGroupEnd() })
}

fn datatype(d: DType) -> sys::ncclDataType_t {
    use sys::ncclDataType_t as T;
    match d {
        DType::F32 => T::ncclFloat32,
        DType::BF16 => T::ncclBfloat16,
        DType::F16 => T::ncclFloat16,
        DType::I32 => T::ncclInt32,
        DType::F8E4M3 => T::ncclFloat8e4m3,
        DType::F8E5M2 => T::ncclFloat8e5m2,
    }
}

fn red_op(op: ReduceOp) -> sys::ncclRedOp_t {
    use sys::ncclRedOp_t as R;
    match op {
        ReduceOp::Sum => R::ncclSum,
        ReduceOp::Prod => R::ncclProd,
        ReduceOp::Max => R::ncclMax,
        ReduceOp::Min => R::ncclMin,
        ReduceOp::Avg => R::ncclAvg,
    }
}
