//! Launching a kernel: argument checks against its reflection, then `cuLaunchKernel`.

use crate::device::LoadedKernel;
use crate::tensor::{ArgGuard, Element, GlobalArg, GlobalArgMut, GlobalDesc};
use crate::{Device, Error, Result};
use std::ffi::c_void;
use std::sync::Arc;
use tessera_ptx::{DType, KernelSpec, ParamKind};

/// The grid: how many thread blocks along x, y and z.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Grid {
    /// Blocks along x.
    pub x: u32,
    /// Blocks along y.
    pub y: u32,
    /// Blocks along z.
    pub z: u32,
}

impl Grid {
    /// `ceil(extent / tile)` blocks: enough tiles to cover `extent`.
    pub fn tiles(extent: usize, tile: usize) -> u32 {
        u32::try_from(extent.div_ceil(tile.max(1))).unwrap_or(u32::MAX)
    }
}

impl From<u32> for Grid {
    fn from(x: u32) -> Grid {
        Grid { x, y: 1, z: 1 }
    }
}
impl From<(u32, u32)> for Grid {
    fn from((x, y): (u32, u32)) -> Grid {
        Grid { x, y, z: 1 }
    }
}
impl From<(u32, u32, u32)> for Grid {
    fn from((x, y, z): (u32, u32, u32)) -> Grid {
        Grid { x, y, z }
    }
}

/// A scalar kernel argument.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum ScalarArg {
    /// An `f32`.
    F32(f32),
    /// An `i32`.
    I32(i32),
}

impl From<f32> for ScalarArg {
    fn from(v: f32) -> Self {
        ScalarArg::F32(v)
    }
}
impl From<i32> for ScalarArg {
    fn from(v: i32) -> Self {
        ScalarArg::I32(v)
    }
}

enum Word {
    U64(u64),
    U32(u32),
    F32(f32),
    I32(i32),
    Map(Box<crate::tma::TensorMap>),
    /// A tensor in host memory, for the CPU interpreter.
    Host(GlobalDesc),
}

/// A launch being assembled: the typed launchers that `#[kernel]` generates use it.
pub struct Launch<'d> {
    spec: &'static KernelSpec,
    device: &'d Device,
    /// The loaded function; `None` on the CPU interpreter.
    kernel: Option<Arc<LoadedKernel>>,
    words: Vec<Word>,
    /// The tensors' parameter names and shapes, for the launch's NVTX range (kept only while
    /// ranges are on).
    shapes: Vec<(&'static str, Vec<usize>)>,
}

impl<'d> Launch<'d> {
    /// Starts a launch of `spec` on `device`, loading its module on first use.
    ///
    /// # Errors
    /// No PTX variant for the device, a driver failure loading it; on the CPU interpreter, a
    /// target asked for by [`Device::with_target`] that the kernel lacks.
    pub fn new(spec: &'static KernelSpec, device: &'d Device) -> Result<Self> {
        let kernel = if device.is_cpu() {
            device.variant(spec)?;
            None
        } else {
            Some(device.kernel(spec)?)
        };
        Ok(Launch { spec, device, kernel, words: Vec::new(), shapes: Vec::new() })
    }

    fn arg_err(&self, index: usize, expected: impl Into<String>, found: impl Into<String>) -> Error {
        let arg = self.spec.params.get(index).map_or_else(|| format!("#{index}"), |p| p.name.to_string());
        Error::Argument { kernel: self.spec.name, arg, expected: expected.into(), found: found.into() }
    }

    /// Adds a scalar argument.
    pub fn scalar(&mut self, index: usize, v: ScalarArg) -> Result<()> {
        match (self.spec.params.get(index).map(|p| p.kind), v) {
            (Some(ParamKind::Scalar(DType::F32)), ScalarArg::F32(x)) => self.words.push(Word::F32(x)),
            (Some(ParamKind::Scalar(DType::I32)), ScalarArg::I32(x)) => self.words.push(Word::I32(x)),
            (kind, v) => return Err(self.arg_err(index, format!("{kind:?}"), format!("{v:?}"))),
        }
        Ok(())
    }

    /// Adds a tensor the kernel reads. Keep the returned guard until [`Launch::launch`].
    pub fn global<'a, T: Element>(&mut self, index: usize, arg: &'a impl GlobalArg<T>) -> Result<ArgGuard<'a>>
    where
        'd: 'a,
    {
        let (desc, guard) =
            arg.global_desc(self.device).map_err(|e| self.arg_err(index, "a tensor this device can read", e.to_string()))?;
        self.push_global::<T>(index, desc)?;
        Ok(guard)
    }

    /// Adds a tensor the kernel writes. Keep the returned guard until [`Launch::launch`].
    pub fn global_mut<'a, T: Element>(&mut self, index: usize, arg: &'a mut impl GlobalArgMut<T>) -> Result<ArgGuard<'a>>
    where
        'd: 'a,
    {
        let (desc, guard) =
            arg.global_desc_mut(self.device).map_err(|e| self.arg_err(index, "a tensor this device can write", e.to_string()))?;
        self.push_global::<T>(index, desc)?;
        Ok(guard)
    }

    fn push_global<T: Element>(&mut self, index: usize, d: GlobalDesc) -> Result<()> {
        let Some(ParamKind::Global { dtype, rank, tma, .. }) = self.spec.params.get(index).map(|p| p.kind) else {
            return Err(self.arg_err(index, "a scalar", format!("a tensor of {}", T::DTYPE)));
        };
        if T::DTYPE != dtype {
            return Err(self.arg_err(index, format!("a {dtype} tensor"), format!("a {} tensor", T::DTYPE)));
        }
        if d.shape.len() != rank as usize {
            return Err(self.arg_err(index, format!("a rank-{rank} tensor"), format!("shape {:?} (rank {})", d.shape, d.shape.len())));
        }
        if crate::nvtx::enabled() {
            let name = self.spec.params.get(index).map_or("?", |p| p.name);
            self.shapes.push((name, d.shape.clone()));
        }
        match (self.kernel.is_none(), d.host.is_some()) {
            (true, false) => return Err(self.arg_err(index, "a tensor in host memory, made on the CPU interpreter", "a GPU tensor")),
            (false, true) => {
                return Err(self.arg_err(index, format!("a tensor on {}", self.device.name()), "a tensor of the CPU interpreter"))
            }
            (false, false) if d.context != self.device.context()?.cu_ctx() as usize => {
                return Err(self.arg_err(index, format!("a tensor on {}", self.device.name()), "a tensor from another device or context"))
            }
            _ => {}
        }
        let size = dtype.size() as u64;
        if !d.ptr.is_multiple_of(size) {
            return Err(self.arg_err(index, format!("an address aligned to {size} bytes"), format!("{:#x}", d.ptr)));
        }
        let limit = (i32::MAX as usize) / size as usize;

        if let Some(bad) = d.shape.iter().chain(&d.strides).find(|&&x| x > limit) {
            return Err(self.arg_err(
                index,
                format!("dims and strides below {limit}"),
                format!("{bad} (shape {:?}, strides {:?})", d.shape, d.strides),
            ));
        }
        let Some(kernel) = &self.kernel else {
            // The interpreter runs the Hopper schedule: a tensor its TMA copies must be one
            // the GPU's TMA could.
            if let Some(why) = tma.and_then(|_| crate::tma::tma_unfit(d.ptr, dtype, &d.shape, &d.strides)) {
                return Err(self.arg_err(
                    index,
                    "a tensor TMA can copy (16-byte aligned, unit last stride, other strides multiples of 16 bytes)",
                    why,
                ));
            }
            self.words.push(Word::Host(d));
            return Ok(());
        };
        let sm80 = kernel.target == tessera_ptx::Target::Sm80;
        self.words.push(Word::U64(d.ptr));
        // `limit` above keeps every value in u32.
        self.words.extend(d.shape.iter().map(|&x| Word::U32(x as u32)));
        self.words.extend(d.strides.iter().map(|&x| Word::U32(x as u32)));
        if tma.is_some() && sm80 {
            // The sm_80 lowering copies with cp.async: the map is passed but never read.
            self.words.push(Word::Map(Box::new(crate::tma::TensorMap([0; 16]))));
        } else if let Some(b) = tma {
            let map = self.device.tma_cache().get(d.ptr, dtype, &d.shape, &d.strides, b).map_err(|why| {
                self.arg_err(index, "a tensor TMA can copy (16-byte aligned, unit last stride, other strides multiples of 16 bytes)", why)
            })?;
            self.words.push(Word::Map(Box::new(map)));
        }
        Ok(())
    }

    /// Queues the kernel on the device's stream.
    pub fn launch(mut self, grid: Grid) -> Result<()> {
        if grid.x == 0 || grid.y == 0 || grid.z == 0 {
            return Err(Error::Argument {
                kernel: self.spec.name,
                arg: "grid".into(),
                expected: "at least one block along x, y and z".into(),
                found: format!("{grid:?}"),
            });
        }
        if grid.y > 65535 || grid.z > 65535 {
            return Err(Error::Argument {
                kernel: self.spec.name,
                arg: "grid".into(),
                expected: "y and z below 65536".into(),
                found: format!("{grid:?}"),
            });
        }
        let expected_words: usize = self
            .spec
            .params
            .iter()
            .map(|p| match p.kind {
                ParamKind::Global { .. } if self.kernel.is_none() => 1,
                ParamKind::Global { rank, tma, .. } => 1 + 2 * rank as usize + usize::from(tma.is_some()),
                ParamKind::Scalar(_) => 1,
            })
            .sum();
        if self.words.len() != expected_words {
            return Err(Error::Argument {
                kernel: self.spec.name,
                arg: "arguments".into(),
                expected: format!("{} parameters", self.spec.params.len()),
                found: "fewer".into(),
            });
        }
        crate::report::note_launch(self.spec);
        let _range = crate::nvtx::range(|| {
            let mut name = self.spec.name.to_string();
            for (arg, shape) in &self.shapes {
                name += &format!(" {arg}{shape:?}");
            }
            name + &format!(" grid {}×{}×{}", grid.x, grid.y, grid.z)
        });
        let Some(kernel) = self.kernel.clone() else {
            let args = self
                .words
                .into_iter()
                .map(|w| match w {
                    Word::F32(x) => crate::interp::Arg::F32(x),
                    Word::I32(x) => crate::interp::Arg::I32(x),
                    Word::Host(d) => crate::interp::Arg::Global(d),
                    // Only scalars and host tensors are pushed for the interpreter.
                    Word::U64(_) | Word::U32(_) | Word::Map(_) => crate::interp::Arg::I32(0),
                })
                .collect();
            return crate::interp::launch(self.spec, self.device, grid, args);
        };
        let mut ptrs: Vec<*mut c_void> = self
            .words
            .iter_mut()
            .map(|w| match w {
                Word::U64(x) => (x as *mut u64).cast(),
                Word::U32(x) => (x as *mut u32).cast(),
                Word::F32(x) => (x as *mut f32).cast(),
                Word::I32(x) => (x as *mut i32).cast(),
                Word::Map(m) => (&mut **m as *mut crate::tma::TensorMap).cast(),
                Word::Host(d) => (&mut d.ptr as *mut u64).cast(),
            })
            .collect();
        let stream = self.device.stream()?;
        stream.context().bind_to_thread()?;
        // SAFETY: the function was loaded into this context; `ptrs` point at one value per
        // PTX parameter, in order and of the declared sizes (checked above against the
        // reflection the compiler wrote); tensors are bounds-masked in the kernel by the dims
        // passed, which were checked against their buffers.
        unsafe {
            cudarc::driver::result::launch_kernel(
                kernel.function,
                (grid.x, grid.y, grid.z),
                (self.spec.threads, 1, 1),
                self.spec.dynamic_shared_bytes,
                stream.cu_stream(),
                &mut ptrs,
            )
        }?;
        Ok(())
    }
}

/// Variant `index` of a kernel's `VARIANTS` (what a `#[kernel]` module's `launch_variant`
/// uses).
///
/// # Errors
/// [`Error::Argument`] when `index` is out of range.
pub fn variant_of(variants: &'static [&'static KernelSpec], index: usize) -> Result<&'static KernelSpec> {
    variants.get(index).copied().ok_or_else(|| Error::Argument {
        kernel: variants.first().map_or("kernel", |s| s.name),
        arg: "variant".into(),
        expected: format!("a variant index below {}", variants.len()),
        found: index.to_string(),
    })
}
