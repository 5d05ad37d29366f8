//! `Device`: a CUDA context and stream, with the module cache of the kernels launched on it.

use crate::{Error, Result};
use cudarc::driver::{sys, CudaContext, CudaStream};
use std::collections::HashMap;
use std::sync::{Arc, Mutex};

/// Where kernels run: a GPU (a CUDA context, a stream, and the kernels loaded into it), or
/// the CPU interpreter of TIR-H ([`Device::cpu`]), which takes the same launcher calls and
/// the same [`Tensor`](crate::Tensor)s.
///
/// Cloning is cheap and shares the stream and the module cache.
///
/// ```no_run
/// let dev = tessera::Device::new(0)?;
/// println!("{} (sm_{}{})", dev.name(), dev.compute_capability().0, dev.compute_capability().1);
/// # Ok::<(), tessera::Error>(())
/// ```
#[derive(Clone)]
pub struct Device {
    inner: Arc<Inner>,
}

struct Inner {
    backend: Backend,
    sm_count: u32,
    name: String,
    tma: crate::tma::TmaDescriptorCache,
    /// A target to load instead of the best one (see [`Device::with_target`]).
    target: Option<tessera_ptx::Target>,
    /// The counter tile queues draw from (see [`Device::tile_counter`]), made on first use.
    counter: Mutex<Option<crate::tensor::ZeroedBuf<i32>>>,
    /// The zeroed f32 workspace (see [`Device::zeroed_workspace`]), grown on demand.
    workspace: Mutex<Option<crate::tensor::ZeroedBuf<f32>>>,
    /// The zeroed arrival counters (see [`Device::zeroed_counters`]), grown on demand.
    counters: Mutex<Option<crate::tensor::ZeroedBuf<i32>>>,
    /// Values kept with the device (see [`Device::local`]), by type and key.
    local: Mutex<HashMap<(std::any::TypeId, u64), Arc<dyn std::any::Any + Send + Sync>>>,
}

impl Inner {
    /// A device's state: nothing loaded, no TMA map, counter or workspace made yet.
    fn new(backend: Backend, sm_count: u32, name: String, target: Option<tessera_ptx::Target>) -> Inner {
        Inner {
            backend,
            sm_count,
            name,
            tma: Default::default(),
            target,
            counter: Mutex::new(None),
            workspace: Mutex::new(None),
            counters: Mutex::new(None),
            local: Mutex::new(HashMap::new()),
        }
    }
}

/// Loaded kernels by the address of their PTX text.
type ModuleCache = Mutex<HashMap<usize, Arc<LoadedKernel>>>;

enum Backend {
    Cuda {
        stream: Arc<CudaStream>,
        cc: (i32, i32),
        modules: Mutex<HashMap<usize, Arc<LoadedKernel>>>,
    },
    /// The interpreter, running blocks on this many threads.
    Cpu {
        threads: usize,
    },
}

impl std::fmt::Debug for Device {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match &self.inner.backend {
            Backend::Cuda { cc, .. } => write!(f, "Device({}, sm_{}{})", self.inner.name, cc.0, cc.1),
            Backend::Cpu { .. } => write!(f, "Device({})", self.inner.name),
        }
    }
}

/// A kernel's function in a loaded module; unloads the module when dropped.
pub(crate) struct LoadedKernel {
    pub module: sys::CUmodule,
    pub function: sys::CUfunction,
    /// The target of the PTX loaded.
    pub target: tessera_ptx::Target,
    ctx: Arc<CudaContext>,
}

// SAFETY: CUmodule and CUfunction are handles the driver allows on any thread once the
// context is bound, which every use does first.
unsafe impl Send for LoadedKernel {}
// SAFETY: as above; the handles are never mutated.
unsafe impl Sync for LoadedKernel {}

impl Drop for LoadedKernel {
    fn drop(&mut self) {
        if self.ctx.bind_to_thread().is_ok() {
            // SAFETY: the module was loaded into this context and nothing uses it any more.
            let r = unsafe { cudarc::driver::result::module::unload(self.module) };
            self.ctx.record_err(r);
        }
    }
}

/// Whether a CUDA driver library can be loaded on this machine (asked of the loader, so that
/// the answer holds however cudarc is linked: candle's `cuda` feature links the driver rather
/// than loading it).
pub fn driver_present() -> bool {
    library_present(if cfg!(windows) { &["nvcuda.dll"][..] } else { &["libcuda.so.1", "libcuda.so"][..] })
}

/// Whether one of the libraries `names` (file names the loader searches for, such as
/// `libcufft.so.12`) can be loaded on this machine, asked of the loader as
/// [`driver_present`] does.
pub fn library_present(names: &[&str]) -> bool {
    names.iter().any(|&name| {
        // SAFETY: opening a CUDA library runs its initializers, as cudarc's own loading does.
        unsafe { libloading::Library::new(name) }.is_ok()
    })
}

impl Device {
    /// The GPU with this ordinal, on its primary context's default stream.
    ///
    /// # Errors
    /// [`Error::NoDriver`] where no CUDA driver is installed, [`Error::NoDevice`] for an
    /// ordinal past the last device.
    pub fn new(ordinal: usize) -> Result<Device> {
        if !driver_present() {
            return Err(Error::NoDriver);
        }
        let count = usize::try_from(CudaContext::device_count()?).unwrap_or(0);
        if ordinal >= count {
            return Err(Error::NoDevice { ordinal, count });
        }
        let ctx = CudaContext::new(ordinal)?;
        Device::from_stream(ctx.default_stream())
    }

    /// Shares a cudarc stream owned by another library (candle, burn): kernels launch on it,
    /// ordered with that library's work.
    pub fn from_stream(stream: Arc<CudaStream>) -> Result<Device> {
        let ctx = stream.context().clone();
        let cc = ctx.compute_capability()?;
        let name = ctx.name()?;
        let sms = ctx.attribute(sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT)?;
        let sm_count = u32::try_from(sms).unwrap_or(1).max(1);
        let backend = Backend::Cuda { stream, cc, modules: Mutex::new(HashMap::new()) };
        Ok(Device { inner: Arc::new(Inner::new(backend, sm_count, name, None)) })
    }

    /// The CPU interpreter of TIR-H, running a grid's blocks on as many threads as the machine
    /// has cores. Kernels launch through the same calls as on a GPU, on tensors in host
    /// memory made on this device; a launch returns when the kernel has finished.
    ///
    /// ```
    /// let cpu = tessera::Device::cpu();
    /// let x = tessera::Tensor::from_host(&cpu, &[1.0f32, 2.0], &[2])?;
    /// assert_eq!(x.to_host()?, vec![1.0, 2.0]);
    /// # Ok::<(), tessera::Error>(())
    /// ```
    pub fn cpu() -> Device {
        Device::cpu_with_threads(std::thread::available_parallelism().map_or(1, |n| n.get()))
    }

    /// The CPU interpreter on `threads` threads (at least one). Results do not depend on it.
    pub fn cpu_with_threads(threads: usize) -> Device {
        let threads = threads.max(1);
        let name = format!("CPU interpreter ({threads} thread{})", if threads == 1 { "" } else { "s" });
        let sm_count = u32::try_from(threads).unwrap_or(u32::MAX);
        Device { inner: Arc::new(Inner::new(Backend::Cpu { threads }, sm_count, name, None)) }
    }

    /// GPU 0 if this machine has a usable one, else the CPU interpreter.
    pub fn gpu_or_cpu() -> Device {
        Device::new(0).unwrap_or_else(|_| Device::cpu())
    }

    /// The target asked for by [`Device::with_target`], if any.
    pub fn asked_target(&self) -> Option<tessera_ptx::Target> {
        self.inner.target
    }

    /// Whether this is the CPU interpreter.
    pub fn is_cpu(&self) -> bool {
        matches!(self.inner.backend, Backend::Cpu { .. })
    }

    /// Threads the interpreter runs blocks on (`None` on a GPU).
    pub(crate) fn cpu_threads(&self) -> Option<usize> {
        match self.inner.backend {
            Backend::Cpu { threads } => Some(threads),
            Backend::Cuda { .. } => None,
        }
    }

    fn cuda(&self, what: &'static str) -> Result<(&Arc<CudaStream>, &ModuleCache)> {
        match &self.inner.backend {
            Backend::Cuda { stream, modules, .. } => Ok((stream, modules)),
            Backend::Cpu { .. } => Err(Error::NotCuda { what }),
        }
    }

    /// A device on the same stream that loads `target`'s PTX wherever a kernel has it, e.g.
    /// the portable `sm_80` PTX on a Hopper GPU (the driver compiles it forward), to test that
    /// path where only newer GPUs are at hand. It has its own module cache.
    ///
    /// # Errors
    /// [`Error::NoVariant`]-style checks happen at launch: a kernel without `target`'s PTX, or
    /// a target that cannot run on this device, is an error then.
    /// On the CPU interpreter, the launchers choose kernels as they would for a GPU that
    /// runs `target` (the interpreter runs any kernel's TIR-H).
    pub fn with_target(&self, target: tessera_ptx::Target) -> Device {
        let i = &self.inner;
        let backend = match &i.backend {
            Backend::Cuda { stream, cc, .. } => Backend::Cuda { stream: stream.clone(), cc: *cc, modules: Mutex::new(HashMap::new()) },
            Backend::Cpu { threads } => Backend::Cpu { threads: *threads },
        };
        Device { inner: Arc::new(Inner::new(backend, i.sm_count, i.name.clone(), Some(target))) }
    }

    /// A zeroed `i32` counter of shape `[1]` for kernels whose `TileQueue` claims tiles at
    /// run time. Such a kernel leaves it at 0 when it finishes, so launches on this device's
    /// stream (which run one after another) share it; the guard keeps other host threads
    /// from passing it to a launch at the same time.
    ///
    /// # Errors
    /// A CUDA error allocating its 4 bytes on first use.
    pub fn tile_counter(&self) -> Result<crate::tensor::Counters<'_>> {
        Ok(crate::tensor::Counters { slot: self.zeroed(&self.inner.counter, 1)?, device: self, len: 1 })
    }

    /// `len` zeroed `i32` counters for kernels that count arrivals with `fetch_add` (split-K's
    /// last arrival finishes a tile) and put each count back to 0 before they finish, so that
    /// no call allocates or clears them: shared by the launches on this device's stream, as
    /// [`Device::zeroed_workspace`] is, and apart from it and from the tile counter (a kernel
    /// may take all three). Passes as a `Global<i32, 1>` of `len` elements.
    ///
    /// # Errors
    /// A CUDA error allocating them.
    pub fn zeroed_counters(&self, len: usize) -> Result<crate::tensor::Counters<'_>> {
        let len = len.max(1);
        Ok(crate::tensor::Counters { slot: self.zeroed(&self.inner.counters, len)?, device: self, len })
    }

    /// The value of type `V` kept with this device under `key`, made by `make` on the first
    /// call: a library's per-device state (plans, pools, tables) that lives as long as the
    /// device and its clones and goes with it (a [`Device::with_target`] device has its own).
    /// `make` runs without the lock held, so it may use the device (and `local` itself);
    /// where two threads make the same value at once, both get the first one stored.
    ///
    /// ```
    /// let dev = tessera::Device::cpu();
    /// let a = dev.local(7, || Ok(vec![1u32, 2, 3]))?;
    /// let b = dev.local(7, || Ok(vec![9u32]))?; // made once: the same value
    /// assert!(std::sync::Arc::ptr_eq(&a, &b));
    /// # Ok::<(), tessera::Error>(())
    /// ```
    ///
    /// # Errors
    /// `make`'s error, and then nothing is kept.
    pub fn local<V: std::any::Any + Send + Sync>(&self, key: u64, make: impl FnOnce() -> Result<V>) -> Result<Arc<V>> {
        let id = (std::any::TypeId::of::<V>(), key);
        let lock = || self.inner.local.lock().unwrap_or_else(|p| p.into_inner());
        let found = lock().get(&id).cloned();
        let kept = match found {
            Some(v) => v,
            None => {
                let made: Arc<dyn std::any::Any + Send + Sync> = Arc::new(make()?);
                lock().entry(id).or_insert(made).clone()
            }
        };
        Ok(kept.downcast::<V>().unwrap_or_else(|_| unreachable!("kept under its own TypeId")))
    }

    /// A kept-zeroed buffer of at least `len` elements, locked: made (or grown, a fresh zeroed
    /// one) here; the interpreter's cleared on every call (its kernels run to the end or fail,
    /// and a failed one may leave it dirty).
    fn zeroed<'d, T: crate::Element + cudarc::driver::DeviceRepr + cudarc::driver::ValidAsZeroBits>(
        &self, slot: &'d Mutex<Option<crate::tensor::ZeroedBuf<T>>>, len: usize,
    ) -> Result<std::sync::MutexGuard<'d, Option<crate::tensor::ZeroedBuf<T>>>> {
        use crate::tensor::ZeroedBuf;
        let mut slot = slot.lock().unwrap_or_else(|p| p.into_inner());
        let have = slot.as_ref().map_or(0, ZeroedBuf::len);
        match (&mut *slot, &self.inner.backend) {
            (Some(ZeroedBuf::Host(h)), _) if have >= len => h.lock().fill(0),
            (Some(_), _) if have >= len => {}
            (_, Backend::Cuda { stream, .. }) => *slot = Some(ZeroedBuf::Cuda(stream.alloc_zeros::<T>(len)?)),
            (_, Backend::Cpu { .. }) => *slot = Some(ZeroedBuf::Host(crate::tensor::HostBuffer::zeroed::<T>(len))),
        }
        Ok(slot)
    }

    /// A zeroed f32 workspace of at least `len` elements, for kernels that add partial results
    /// into it (atomically, from many blocks) and clear what they used before they finish — the
    /// small-M GEMM's split-K sums — so that no call allocates or clears one. Launches on this
    /// device's stream (one after another) share it; the guard keeps other host threads from
    /// passing it to a launch at the same time. It grows (a fresh zeroed buffer) when a call
    /// asks for more; the interpreter's is cleared on every call (a failed kernel may leave it
    /// dirty).
    ///
    /// # Errors
    /// A CUDA error allocating it.
    pub fn zeroed_workspace(&self, len: usize) -> Result<crate::tensor::Workspace<'_>> {
        Ok(crate::tensor::Workspace { slot: self.zeroed(&self.inner.workspace, len.max(1))?, device: self })
    }

    /// The stream kernels launch on.
    ///
    /// # Errors
    /// [`Error::NotCuda`] on the CPU interpreter.
    pub fn stream(&self) -> Result<&Arc<CudaStream>> {
        Ok(self.cuda("a CUDA stream")?.0)
    }

    /// The CUDA context.
    ///
    /// # Errors
    /// [`Error::NotCuda`] on the CPU interpreter.
    pub fn context(&self) -> Result<&Arc<CudaContext>> {
        Ok(self.cuda("a CUDA context")?.0.context())
    }

    /// Compute capability `(major, minor)`; `(0, 0)` on the CPU interpreter.
    pub fn compute_capability(&self) -> (i32, i32) {
        match &self.inner.backend {
            Backend::Cuda { cc, .. } => *cc,
            Backend::Cpu { .. } => (0, 0),
        }
    }

    /// Streaming multiprocessors: the size of a persistent grid (the interpreter's threads on
    /// the CPU).
    pub fn sm_count(&self) -> u32 {
        self.inner.sm_count
    }

    /// The device's name, as the driver reports it.
    pub fn name(&self) -> &str {
        &self.inner.name
    }

    /// Waits for all work on the stream.
    pub fn synchronize(&self) -> Result<()> {
        match &self.inner.backend {
            Backend::Cuda { stream, .. } => Ok(stream.synchronize()?),
            Backend::Cpu { .. } => Ok(()),
        }
    }

    /// The target whose PTX this device loads for `spec`, if any fits.
    ///
    /// On the CPU interpreter: the target asked for by [`Device::with_target`] if the kernel
    /// has it, else the kernel's best.
    pub fn target_for(&self, spec: &tessera_ptx::KernelSpec) -> Option<tessera_ptx::Target> {
        let Backend::Cuda { cc: (major, minor), .. } = self.inner.backend else {
            return match self.inner.target {
                Some(t) => spec.variants.iter().find(|v| v.target == t).map(|v| v.target),
                None => spec.variants.first().map(|v| v.target),
            };
        };
        match self.inner.target {
            Some(t) => spec.variants.iter().find(|v| v.target == t && t.runs_on(major, minor)).map(|v| v.target),
            None => spec.variant_for(major, minor).map(|v| v.target),
        }
    }

    /// The variant [`Device::target_for`] picks, or the error that says why there is none.
    pub(crate) fn variant(&self, spec: &tessera_ptx::KernelSpec) -> Result<&'static tessera_ptx::PtxVariant> {
        let chosen = self.target_for(spec).and_then(|t| spec.variants.iter().find(|v| v.target == t));
        chosen.ok_or_else(|| {
            let available = spec.variants.iter().map(|v| v.target.name()).collect::<Vec<_>>().join(", ");
            match (self.inner.target, self.compute_capability()) {
                (Some(t), _) => Error::TargetUnavailable { kernel: spec.name, target: t.name(), available },
                (None, (major, minor)) => Error::NoVariant { kernel: spec.name, major, minor, available },
            }
        })
    }

    /// The kernel's best variant for this device, loaded once per device.
    pub(crate) fn kernel(&self, spec: &'static tessera_ptx::KernelSpec) -> Result<Arc<LoadedKernel>> {
        let (stream, modules) = self.cuda("loading PTX")?;
        let variant = self.variant(spec)?;
        let key = variant.packed.bytes().as_ptr() as usize;
        let mut cache = modules.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(k) = cache.get(&key) {
            return Ok(k.clone());
        }
        let ctx = stream.context().clone();
        ctx.bind_to_thread()?;
        if std::env::var_os("TESSERA_LOG_KERNELS").is_some() {
            // For `scripts/sanitize.sh`: which kernels a run covered.
            eprintln!("tessera: loading kernel {} ({})", spec.name, variant.target.name());
        }
        let load_err = |source| Error::ModuleLoad { kernel: spec.name, target: variant.target.name(), source };
        let src = std::ffi::CString::new(variant.ptx()).map_err(|_| Error::Tensor {
            what: "loading PTX",
            expected: "PTX text without NUL bytes".into(),
            found: "a NUL byte".into(),
        })?;
        // SAFETY: `src` is a NUL-terminated PTX image that outlives the call.
        let module = unsafe { cudarc::driver::result::module::load_data(src.as_ptr().cast()) }.map_err(load_err)?;
        let name = std::ffi::CString::new(spec.name).map_err(|_| Error::Tensor {
            what: "loading a kernel",
            expected: "a name without NUL bytes".into(),
            found: spec.name.into(),
        })?;
        // SAFETY: the module was just loaded into the bound context.
        let function = match unsafe { cudarc::driver::result::module::get_function(module, name) } {
            Ok(f) => f,
            Err(e) => {
                // SAFETY: nothing else holds the module.
                let _ = unsafe { cudarc::driver::result::module::unload(module) };
                return Err(load_err(e));
            }
        };
        // Static and dynamic shared memory together past 48 KiB need the opt-in, whatever the
        // dynamic part alone (46 KiB dynamic beside a few static bytes failed to launch with
        // CUDA_ERROR_INVALID_VALUE on an H200): set it for every kernel with a dynamic part.
        if spec.dynamic_shared_bytes > 0 {
            // SAFETY: the function belongs to the bound context.
            let r = unsafe {
                cudarc::driver::result::function::set_function_attribute(
                    function,
                    sys::CUfunction_attribute::CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
                    spec.dynamic_shared_bytes as i32,
                )
            };
            if let Err(e) = r {
                // SAFETY: nothing else holds the module.
                let _ = unsafe { cudarc::driver::result::module::unload(module) };
                return Err(load_err(e));
            }
        }
        let k = Arc::new(LoadedKernel { module, function, target: variant.target, ctx });
        cache.insert(key, k.clone());
        Ok(k)
    }

    /// A kernel's resources as the driver reports them for its loaded module (loading it if
    /// it is not yet): registers a thread, static and dynamic shared memory, and how many
    /// blocks fit an SM at once.
    ///
    /// # Errors
    /// [`Error::NotCuda`] on the CPU interpreter; the load's or the driver's errors.
    pub fn launch_figures(&self, spec: &'static tessera_ptx::KernelSpec) -> Result<crate::report::LaunchFigures> {
        use sys::CUfunction_attribute as A;
        let k = self.kernel(spec)?;
        k.ctx.bind_to_thread()?;
        // SAFETY: the function belongs to the context just bound.
        let attr = |a| unsafe { cudarc::driver::result::function::get_function_attribute(k.function, a) };
        let (registers, static_shared) = (attr(A::CU_FUNC_ATTRIBUTE_NUM_REGS)?, attr(A::CU_FUNC_ATTRIBUTE_SHARED_SIZE_BYTES)?);
        // SAFETY: as above.
        let blocks = unsafe {
            cudarc::driver::result::occupancy::max_active_block_per_multiprocessor(
                k.function,
                spec.threads as i32,
                spec.dynamic_shared_bytes as usize,
            )
        }?;
        Ok(crate::report::LaunchFigures {
            entry: spec.name.to_string(),
            threads: spec.threads,
            registers: registers.max(0) as u32,
            static_shared: static_shared.max(0) as u32,
            dynamic_shared: spec.dynamic_shared_bytes,
            blocks_per_sm: blocks.max(0) as u32,
        })
    }

    /// The device's cache of TMA tensor maps.
    pub fn tma_cache(&self) -> &crate::tma::TmaDescriptorCache {
        &self.inner.tma
    }

    /// How many kernel variants this device has loaded.
    pub fn loaded_modules(&self) -> usize {
        match &self.inner.backend {
            Backend::Cuda { modules, .. } => modules.lock().map(|m| m.len()).unwrap_or(0),
            Backend::Cpu { .. } => 0,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::Device;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::Arc;

    /// Counts its drops, to see a kept value go with its device.
    struct Kept(Arc<AtomicUsize>);

    impl Drop for Kept {
        fn drop(&mut self) {
            self.0.fetch_add(1, Ordering::SeqCst);
        }
    }

    #[test]
    fn local_values_are_made_once_per_key_and_type_and_go_with_the_device() {
        let dev = Device::cpu();
        let drops = Arc::new(AtomicUsize::new(0));
        let made = AtomicUsize::new(0);
        let make = || {
            made.fetch_add(1, Ordering::SeqCst);
            Ok(Kept(drops.clone()))
        };
        let a = dev.local(1, make).unwrap();
        let b = dev.clone().local(1, make).unwrap();
        assert!(Arc::ptr_eq(&a, &b), "a clone shares the device's values");
        assert_eq!(made.load(Ordering::SeqCst), 1);
        // Another key, another type under the same key: values of their own.
        let c = dev.local(2, make).unwrap();
        assert!(!Arc::ptr_eq(&a, &c));
        assert_eq!(*dev.local(1, || Ok(5u64)).unwrap(), 5);
        // A failed make keeps nothing: the next call makes it.
        assert!(dev.local(3, || Err::<Kept, _>(crate::Error::NoDriver)).is_err());
        let d = dev.local(3, make).unwrap();
        assert_eq!(made.load(Ordering::SeqCst), 3);
        // The make may use the device's own local values.
        let nested = dev.local(4, || Ok(*dev.local(5, || Ok(41u64))? + 1)).unwrap();
        assert_eq!(*nested, 42);
        // A device for another target has its own.
        let other = dev.with_target(tessera_ptx::Target::Sm80);
        assert!(!Arc::ptr_eq(&a, &other.local(1, make).unwrap()));
        drop((a, b, c, d, other));
        assert_eq!(drops.load(Ordering::SeqCst), 1, "only the other target's value went with it");
        drop(dev);
        assert_eq!(drops.load(Ordering::SeqCst), 4, "the device's values went with it");
    }
}
