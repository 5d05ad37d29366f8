//! `Device`: a CUDA context and stream, with the module cache of the kernels launched on it.

use crate::{Error, Result};
use cudarc::driver::{sys, CudaContext, CudaStream};
use std::collections::HashMap;
use std::sync::{Arc, Mutex};

/// A GPU to launch kernels on: a CUDA context, a stream, and the kernels loaded into it.
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
    stream: Arc<CudaStream>,
    cc: (i32, i32),
    sm_count: u32,
    name: String,
    modules: Mutex<HashMap<usize, Arc<LoadedKernel>>>,
    tma: crate::tma::TmaDescriptorCache,
    /// A target to load instead of the best one (see [`Device::with_target`]).
    target: Option<tessera_ptx::Target>,
}

impl std::fmt::Debug for Device {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Device({}, sm_{}{})", self.inner.name, self.inner.cc.0, self.inner.cc.1)
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

/// Whether a CUDA driver library can be loaded on this machine.
pub fn driver_present() -> bool {
    // SAFETY: only tries to open the library.
    unsafe { sys::is_culib_present() }
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
        Ok(Device {
            inner: Arc::new(Inner {
                stream,
                cc,
                sm_count,
                name,
                modules: Mutex::new(HashMap::new()),
                tma: Default::default(),
                target: None,
            }),
        })
    }

    /// A device on the same stream that loads `target`'s PTX wherever a kernel has it, e.g.
    /// the portable `sm_80` PTX on a Hopper GPU (the driver compiles it forward), to test that
    /// path where only newer GPUs are at hand. It has its own module cache.
    ///
    /// # Errors
    /// [`Error::NoVariant`]-style checks happen at launch: a kernel without `target`'s PTX, or
    /// a target that cannot run on this device, is an error then.
    pub fn with_target(&self, target: tessera_ptx::Target) -> Device {
        let i = &self.inner;
        Device {
            inner: Arc::new(Inner {
                stream: i.stream.clone(),
                cc: i.cc,
                sm_count: i.sm_count,
                name: i.name.clone(),
                modules: Mutex::new(HashMap::new()),
                tma: Default::default(),
                target: Some(target),
            }),
        }
    }

    /// The stream kernels launch on.
    pub fn stream(&self) -> &Arc<CudaStream> {
        &self.inner.stream
    }

    /// The CUDA context.
    pub fn context(&self) -> &Arc<CudaContext> {
        self.inner.stream.context()
    }

    /// Compute capability `(major, minor)`.
    pub fn compute_capability(&self) -> (i32, i32) {
        self.inner.cc
    }

    /// Streaming multiprocessors: the size of a persistent grid.
    pub fn sm_count(&self) -> u32 {
        self.inner.sm_count
    }

    /// The device's name, as the driver reports it.
    pub fn name(&self) -> &str {
        &self.inner.name
    }

    /// Waits for all work on the stream.
    pub fn synchronize(&self) -> Result<()> {
        Ok(self.inner.stream.synchronize()?)
    }

    /// The target whose PTX this device loads for `spec`, if any fits.
    pub fn target_for(&self, spec: &tessera_ptx::KernelSpec) -> Option<tessera_ptx::Target> {
        let (major, minor) = self.inner.cc;
        match self.inner.target {
            Some(t) => spec.variants.iter().find(|v| v.target == t && t.runs_on(major, minor)).map(|v| v.target),
            None => spec.variant_for(major, minor).map(|v| v.target),
        }
    }

    /// The kernel's best variant for this device, loaded once per device.
    pub(crate) fn kernel(&self, spec: &'static tessera_ptx::KernelSpec) -> Result<Arc<LoadedKernel>> {
        let (major, minor) = self.inner.cc;
        let chosen = match self.inner.target {
            Some(t) => spec.variants.iter().find(|v| v.target == t && t.runs_on(major, minor)),
            None => spec.variant_for(major, minor),
        };
        let Some(variant) = chosen else {
            let available = spec.variants.iter().map(|v| v.target.name()).collect::<Vec<_>>().join(", ");
            if let Some(t) = self.inner.target {
                return Err(Error::TargetUnavailable { kernel: spec.name, target: t.name(), available });
            }
            return Err(Error::NoVariant { kernel: spec.name, major, minor, available });
        };
        let key = variant.ptx.as_ptr() as usize;
        let mut cache = self.inner.modules.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(k) = cache.get(&key) {
            return Ok(k.clone());
        }
        let ctx = self.context().clone();
        ctx.bind_to_thread()?;
        let load_err = |source| Error::ModuleLoad { kernel: spec.name, target: variant.target.name(), source };
        let src = std::ffi::CString::new(variant.ptx).map_err(|_| Error::Tensor {
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
        if spec.dynamic_shared_bytes > 48 * 1024 {
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

    /// The device's cache of TMA tensor maps.
    pub fn tma_cache(&self) -> &crate::tma::TmaDescriptorCache {
        &self.inner.tma
    }

    /// How many kernel variants this device has loaded.
    pub fn loaded_modules(&self) -> usize {
        self.inner.modules.lock().map(|m| m.len()).unwrap_or(0)
    }
}
