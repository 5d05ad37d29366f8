//! The CUDA side of the ops: candle's CUDA storage borrowed as Tessera tensors (no copy), the
//! kernels launched on candle's stream, the outputs handed back as candle storage.

use crate::{contiguous, Elem, Input, Side};
use candle_core::backend::{BackendDevice, BackendStorage};
use candle_core::{bail, CudaDevice, CudaStorage, Layout, Shape};
use std::sync::{Arc, Mutex};

/// A candle CUDA device's side: its stream as a Tessera [`tessera::Device`].
pub(crate) struct Cuda {
    candle: CudaDevice,
    device: tessera::Device,
}

impl Cuda {
    /// The side of the device `s` lives on. Tessera's device for each candle stream is made
    /// once (it holds the loaded modules and the tensor-map cache) and kept for the process.
    pub(crate) fn of(s: &CudaStorage) -> candle_core::Result<Cuda> {
        static DEVICES: Mutex<Vec<(usize, usize, tessera::Device)>> = Mutex::new(Vec::new());
        let candle = s.device().clone();
        let stream = candle.cuda_stream();
        let key = (stream.context().cu_ctx() as usize, stream.cu_stream() as usize);
        let mut devices = DEVICES.lock().unwrap_or_else(|p| p.into_inner());
        let device = match devices.iter().find(|(ctx, st, _)| (*ctx, *st) == key) {
            Some((_, _, d)) => d.clone(),
            None => {
                let d = tessera::Device::from_stream(Arc::clone(&stream)).map_err(candle_core::Error::wrap)?;
                devices.push((key.0, key.1, d.clone()));
                d
            }
        };
        Ok(Cuda { candle, device })
    }

    /// candle's device.
    pub(crate) fn candle(&self) -> &CudaDevice {
        &self.candle
    }
}

impl Side for Cuda {
    type Storage = CudaStorage;

    fn device(&self) -> &tessera::Device {
        &self.device
    }

    fn storage_of<'s>(&self, name: &str, s: &'s candle_core::Storage) -> candle_core::Result<&'s CudaStorage> {
        match s {
            candle_core::Storage::Cuda(c) => Ok(c),
            _ => candle_core::bail!("`{name}` must be on the GPU as the op's other tensors are"),
        }
    }

    unsafe fn alloc(&self, shape: &Shape, dtype: candle_core::DType) -> candle_core::Result<CudaStorage> {
        // SAFETY: the caller writes every element first.
        unsafe { self.candle.alloc_uninit(shape, dtype) }
    }

    fn wrap<T: Elem>(&self, t: tessera::Tensor<T>) -> candle_core::Result<(CudaStorage, usize)> {
        let n = t.numel();
        if !t.is_contiguous() || t.offset() != 0 {
            candle_core::bail!("a kernel's result to hand back is not a whole contiguous buffer: {t:?}")
        }
        let slice = t.into_cudarc().map_err(candle_core::Error::wrap)?;
        Ok((T::wrap_cuda_slice(slice, self.candle.clone()), n))
    }

    fn input<'a, T: Elem>(
        &self, op: &str, name: &str, s: &'a CudaStorage, l: &Layout, shape: &[usize],
    ) -> candle_core::Result<Input<'a, T>> {
        let (start, _) = contiguous(op, name, l)?;
        let slice = s.as_cuda_slice::<T>()?;
        Ok(Input::Borrowed(tessera::Tensor::borrow_cudarc(&self.device, slice, start, shape).map_err(candle_core::Error::wrap)?))
    }

    fn output<T: Elem>(
        &self, dims: &[usize], shape: Shape, run: impl FnOnce(&mut tessera::Tensor<T>) -> tessera::Result<()>,
    ) -> candle_core::Result<(CudaStorage, Shape)> {
        let mut y = tessera::Tensor::<T>::scratch(&self.device, dims).map_err(candle_core::Error::wrap)?;
        run(&mut y).map_err(candle_core::Error::wrap)?;
        Ok((T::wrap_cuda_slice(y.into_cudarc().map_err(candle_core::Error::wrap)?, self.candle.clone()), shape))
    }

    fn in_place<R>(
        &self, op: &str, name: &str, s: &mut CudaStorage, l: &Layout, run: impl FnOnce(&mut tessera::Tensor<f32>) -> candle_core::Result<R>,
    ) -> candle_core::Result<R> {
        let (start, end) = contiguous(op, name, l)?;
        if end > s.as_cuda_slice::<f32>()?.len() {
            bail!("{op}: `{name}`'s layout reaches past its buffer")
        }
        let placeholder = self.candle.cuda_stream().null::<f32>().map_err(candle_core::Error::wrap)?;
        // The buffer taken out of candle's storage for the kernel to own while it runs (an empty
        // one stands in), and put back whatever the run gives.
        let slice = std::mem::replace(s.as_cuda_slice_mut::<f32>()?, placeholder);
        let len = slice.len();
        let strides = tessera::contiguous_strides(l.dims());
        let mut t = tessera::Tensor::from_cudarc(&self.device, slice, &[len])
            .and_then(|t| t.restride(start, l.dims(), &strides))
            .map_err(candle_core::Error::wrap)?;
        let r = run(&mut t);
        *s.as_cuda_slice_mut::<f32>()? = t.into_cudarc().map_err(candle_core::Error::wrap)?;
        r
    }

    fn storage(s: CudaStorage) -> candle_core::Storage {
        candle_core::Storage::Cuda(s)
    }
}
