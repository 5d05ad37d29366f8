//! `Tensor<T>`: a device buffer with a shape and strides; and the traits through which a
//! kernel takes tensors and raw cudarc buffers.

use crate::{Device, Error, Result};
use cudarc::driver::{CudaSlice, CudaStream, DevicePtr, DevicePtrMut, DeviceRepr, SyncOnDrop, ValidAsZeroBits};
use tessera_ptx::DType;

/// An element type a kernel can read and write.
pub trait Element: DeviceRepr + ValidAsZeroBits + bytemuck::Pod + Default + std::fmt::Debug + Send + Sync + 'static {
    /// Its dtype in the DSL.
    const DTYPE: DType;
}

impl Element for f32 {
    const DTYPE: DType = DType::F32;
}
impl Element for half::bf16 {
    const DTYPE: DType = DType::BF16;
}
impl Element for half::f16 {
    const DTYPE: DType = DType::F16;
}
impl Element for i32 {
    const DTYPE: DType = DType::I32;
}

/// A tensor on a [`Device`]: a cudarc buffer, an element offset into it, a shape and strides
/// (in elements, row-major by default).
///
/// ```no_run
/// use tessera::{Device, Tensor};
/// let dev = Device::new(0)?;
/// let x = Tensor::from_host(&dev, &[1.0f32, 2.0, 3.0, 4.0, 5.0, 6.0], &[2, 3])?;
/// assert_eq!(x.shape(), &[2, 3]);
/// assert_eq!(x.to_host()?, vec![1.0, 2.0, 3.0, 4.0, 5.0, 6.0]);
/// # Ok::<(), tessera::Error>(())
/// ```
pub struct Tensor<T: Element> {
    buf: Storage<T>,
    offset: usize,
    shape: Vec<usize>,
    strides: Vec<usize>,
    device: Device,
}

impl<T: Element> std::fmt::Debug for Tensor<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Tensor<{}>(shape {:?}, strides {:?}, offset {})", T::DTYPE, self.shape, self.strides, self.offset)
    }
}

/// Where a tensor's elements live.
enum Storage<T> {
    Cuda(CudaSlice<T>),
    Host(HostBuffer),
}

impl<T> Storage<T> {
    fn len(&self) -> usize {
        match self {
            Storage::Cuda(b) => b.len(),
            Storage::Host(h) => h.len,
        }
    }
}

/// A tensor's elements in host memory, for the CPU interpreter: bytes behind a lock, shared
/// by the tensor and the launches that use it.
#[derive(Clone)]
pub struct HostBuffer {
    pub(crate) bytes: std::sync::Arc<std::sync::Mutex<Vec<u8>>>,
    /// Elements.
    pub(crate) len: usize,
}

impl std::fmt::Debug for HostBuffer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "HostBuffer({} elements)", self.len)
    }
}

impl HostBuffer {
    fn new<T: Element>(data: &[T]) -> HostBuffer {
        HostBuffer { bytes: std::sync::Arc::new(std::sync::Mutex::new(bytemuck::cast_slice(data).to_vec())), len: data.len() }
    }

    pub(crate) fn zeroed<T: Element>(n: usize) -> HostBuffer {
        HostBuffer::new(&vec![T::zeroed(); n])
    }

    pub(crate) fn lock(&self) -> std::sync::MutexGuard<'_, Vec<u8>> {
        // A panic elsewhere while holding the lock leaves plain bytes: still usable.
        self.bytes.lock().unwrap_or_else(|p| p.into_inner())
    }
}

/// Row-major strides of `shape`.
pub fn contiguous_strides(shape: &[usize]) -> Vec<usize> {
    let mut strides = vec![1; shape.len()];
    for i in (0..shape.len().saturating_sub(1)).rev() {
        strides[i] = strides[i + 1] * shape[i + 1];
    }
    strides
}

fn numel(shape: &[usize]) -> Result<usize> {
    shape.iter().try_fold(1usize, |a, &d| a.checked_mul(d)).ok_or_else(|| Error::Tensor {
        what: "tensor shape",
        expected: "a number of elements that fits in usize".into(),
        found: format!("{shape:?}"),
    })
}

impl<T: Element> Tensor<T> {
    /// Uploads `data` as a row-major tensor of `shape`.
    ///
    /// # Errors
    /// [`Error::Tensor`] if `data.len()` is not the product of `shape`.
    pub fn from_host(device: &Device, data: &[T], shape: &[usize]) -> Result<Tensor<T>> {
        let n = numel(shape)?;
        if data.len() != n {
            return Err(Error::Tensor {
                what: "Tensor::from_host",
                expected: format!("{n} elements for shape {shape:?}"),
                found: format!("{} elements", data.len()),
            });
        }
        let buf = if device.is_cpu() { Storage::Host(HostBuffer::new(data)) } else { Storage::Cuda(device.stream()?.clone_htod(data)?) };
        Ok(Tensor { buf, offset: 0, shape: shape.to_vec(), strides: contiguous_strides(shape), device: device.clone() })
    }

    /// A row-major tensor of `shape` filled with zeros.
    pub fn zeros(device: &Device, shape: &[usize]) -> Result<Tensor<T>> {
        Tensor::allocated(device, shape, true)
    }

    /// A row-major tensor of `shape` whose elements are unspecified until written (on the
    /// device nothing is cleared; the interpreter's are zeros): a workspace that a kernel
    /// writes whole before it is read, without the clearing pass of [`Tensor::zeros`].
    pub fn scratch(device: &Device, shape: &[usize]) -> Result<Tensor<T>> {
        Tensor::allocated(device, shape, false)
    }

    /// A fresh row-major tensor of `shape`, its device buffer cleared or not.
    fn allocated(device: &Device, shape: &[usize], clear: bool) -> Result<Tensor<T>> {
        let n = numel(shape)?.max(1);
        let buf = if device.is_cpu() {
            Storage::Host(HostBuffer::new(&vec![T::zeroed(); n]))
        } else if clear {
            Storage::Cuda(device.stream()?.alloc_zeros::<T>(n)?)
        } else {
            // SAFETY: the elements are plain data (`Element`), so any bits a read finds are a
            // value; what the buffer held before is all it can show.
            Storage::Cuda(unsafe { device.stream()?.alloc::<T>(n) }?)
        };
        Ok(Tensor { buf, offset: 0, shape: shape.to_vec(), strides: contiguous_strides(shape), device: device.clone() })
    }

    /// A row-major tensor of `shape` with every element `value` (tests poison outputs so).
    pub fn full(device: &Device, shape: &[usize], value: T) -> Result<Tensor<T>> {
        Tensor::from_host(device, &vec![value; numel(shape)?], shape)
    }

    /// Wraps a cudarc buffer as a row-major tensor of `shape`.
    ///
    /// # Errors
    /// [`Error::Tensor`] if the buffer holds fewer elements than `shape` needs;
    /// [`Error::NotCuda`] if `device` is the CPU interpreter.
    pub fn from_cudarc(device: &Device, buf: CudaSlice<T>, shape: &[usize]) -> Result<Tensor<T>> {
        device.stream()?;
        Tensor { buf: Storage::Cuda(buf), offset: 0, shape: Vec::new(), strides: Vec::new(), device: device.clone() }.restride(
            0,
            shape,
            &contiguous_strides(shape),
        )
    }

    /// The same buffer seen with another offset, shape and strides (elements).
    ///
    /// # Errors
    /// [`Error::Tensor`] if the view reaches past the buffer or the ranks differ.
    pub fn restride(mut self, offset: usize, shape: &[usize], strides: &[usize]) -> Result<Tensor<T>> {
        check_view("Tensor::restride", self.buf.len(), offset, shape, strides)?;
        self.offset = offset;
        self.shape = shape.to_vec();
        self.strides = strides.to_vec();
        Ok(self)
    }

    /// A row-major tensor of `shape` starting `offset` elements into a cudarc buffer that
    /// another library owns (a candle or burn tensor's storage): no copy, and the buffer is
    /// left to its owner when the borrow ends. The result reads as a `&Tensor<T>` (it derefs to
    /// one), so that any of the library's kernels takes it as an input.
    ///
    /// ```no_run
    /// use tessera::{Device, Tensor};
    /// let dev = Device::new(0)?;
    /// let owned = dev.stream()?.clone_htod(&[1.0f32, 2.0, 3.0, 4.0])?; // another library's buffer
    /// let x = Tensor::borrow_cudarc(&dev, &owned, 1, &[3])?;
    /// assert_eq!(x.to_host()?, vec![2.0, 3.0, 4.0]);
    /// # Ok::<(), tessera::Error>(())
    /// ```
    ///
    /// # Errors
    /// [`Error::Tensor`] if the buffer holds fewer than `offset` + the shape's elements or
    /// lives in another CUDA context than `device`'s stream; [`Error::NotCuda`] if `device` is
    /// the CPU interpreter.
    pub fn borrow_cudarc<'a>(device: &Device, buf: &'a CudaSlice<T>, offset: usize, shape: &[usize]) -> Result<BorrowedTensor<'a, T>> {
        Self::borrow_cudarc_as(device, buf, offset, shape)
    }

    /// As [`Tensor::borrow_cudarc`] over a buffer of another element type `U` of `T`'s size,
    /// its bits read as `T`'s: another crate's type for the same format (candle's
    /// `float8::F8E4M3` as [`crate::F8E4M3`], say). `offset` and `shape` count elements.
    ///
    /// # Errors
    /// As [`Tensor::borrow_cudarc`]'s; [`Error::Tensor`] if `U` is not `T`'s size.
    pub fn borrow_cudarc_as<'a, U: DeviceRepr + bytemuck::Pod>(
        device: &Device, buf: &'a CudaSlice<U>, offset: usize, shape: &[usize],
    ) -> Result<BorrowedTensor<'a, T>> {
        let stream = device.stream()?;
        same_size::<T, U>("Tensor::borrow_cudarc_as")?;
        if buf.stream().context().cu_ctx() != stream.context().cu_ctx() {
            return Err(Error::Tensor {
                what: "Tensor::borrow_cudarc",
                expected: "a buffer of the device's CUDA context".into(),
                found: "a buffer of another context".into(),
            });
        }
        // Checked before the alias exists: an alias dropped on an error would free the
        // owner's buffer.
        let strides = contiguous_strides(shape);
        check_view("Tensor::borrow_cudarc", buf.len(), offset, shape, &strides)?;
        let ptr = {
            let (ptr, _record) = buf.device_ptr(stream);
            ptr
        };
        // SAFETY: `ptr` is `buf`'s allocation of `buf.len()` elements of `U`, which are as many
        // of `T` (one size, and any bits are a valid `T`: both `Pod`), valid for `'a`; the
        // tensor made of it never frees it (`BorrowedTensor`'s drop leaks it back) and is only
        // ever handed out as `&Tensor<T>`, so nothing writes through it.
        let alias = unsafe { stream.upgrade_device_ptr::<T>(ptr, buf.len()) };
        let tensor = Tensor { buf: Storage::Cuda(alias), offset, shape: shape.to_vec(), strides, device: device.clone() };
        Ok(BorrowedTensor { tensor: std::mem::ManuallyDrop::new(tensor), _owner: std::marker::PhantomData })
    }

    /// The underlying cudarc buffer (the view's offset, shape and strides are dropped).
    ///
    /// # Errors
    /// [`Error::NotCuda`] for a tensor of the CPU interpreter.
    pub fn into_cudarc(self) -> Result<CudaSlice<T>> {
        match self.buf {
            Storage::Cuda(b) => Ok(b),
            Storage::Host(_) => Err(Error::NotCuda { what: "Tensor::into_cudarc" }),
        }
    }

    /// As [`Tensor::into_cudarc`], the buffer's elements as another type `U` of `T`'s size
    /// (their bits as they are): a result handed to a library that names the format with a type
    /// of its own (candle's `float8::F8E4M3` for [`crate::F8E4M3`], say).
    ///
    /// # Errors
    /// As [`Tensor::into_cudarc`]'s; [`Error::Tensor`] if `U` is not `T`'s size.
    pub fn into_cudarc_as<U: DeviceRepr + bytemuck::Pod>(self) -> Result<CudaSlice<U>> {
        same_size::<T, U>("Tensor::into_cudarc_as")?;
        let buf = self.into_cudarc()?;
        let (len, stream) = (buf.len(), buf.stream().clone());
        let ptr = buf.leak();
        // SAFETY: `ptr` is the allocation `buf` owned (leaked, so freed only by the slice made
        // here), `len` elements of `T`, as many of `U` (one size; any bits are a valid `U`).
        Ok(unsafe { stream.upgrade_device_ptr::<U>(ptr, len) })
    }

    /// The shape.
    pub fn shape(&self) -> &[usize] {
        &self.shape
    }

    /// The strides, in elements.
    pub fn strides(&self) -> &[usize] {
        &self.strides
    }

    /// The element offset into the buffer.
    pub fn offset(&self) -> usize {
        self.offset
    }

    /// Elements in the view.
    pub fn numel(&self) -> usize {
        self.shape.iter().product()
    }

    /// The device holding it.
    pub fn device(&self) -> &Device {
        &self.device
    }

    /// Whether the view is row-major and dense.
    pub fn is_contiguous(&self) -> bool {
        self.strides == contiguous_strides(&self.shape)
    }

    /// Downloads the view's elements in row-major order.
    pub fn to_host(&self) -> Result<Vec<T>> {
        let all: Vec<T> = match &self.buf {
            Storage::Cuda(b) => self.device.stream()?.clone_dtoh(b)?,
            Storage::Host(h) => bytemuck::pod_collect_to_vec(&h.lock()),
        };
        if self.is_contiguous() {
            return Ok(all[self.offset..self.offset + self.numel()].to_vec());
        }
        let mut out = Vec::with_capacity(self.numel());
        let mut idx = vec![0usize; self.shape.len()];
        for _ in 0..self.numel() {
            let at = self.offset + idx.iter().zip(&self.strides).map(|(i, s)| i * s).sum::<usize>();
            out.push(all[at]);
            for d in (0..idx.len()).rev() {
                idx[d] += 1;
                if idx[d] < self.shape[d] {
                    break;
                }
                idx[d] = 0;
            }
        }
        Ok(out)
    }

    /// Overwrites a contiguous tensor (or view, at any offset into its buffer) with `data`.
    ///
    /// # Errors
    /// [`Error::Tensor`] if the tensor is strided or `data` holds another number of elements.
    pub fn copy_from_host(&mut self, data: &[T]) -> Result<()> {
        let n = self.numel();
        if !self.is_contiguous() || data.len() != n {
            return Err(Error::Tensor {
                what: "Tensor::copy_from_host",
                expected: format!("{n} elements into a contiguous tensor"),
                found: format!("{} elements, strides {:?}", data.len(), self.strides),
            });
        }
        let range = self.offset..self.offset + n;
        match &mut self.buf {
            Storage::Cuda(b) => self.device.stream()?.clone().memcpy_htod(data, &mut b.slice_mut(range))?,
            Storage::Host(h) => {
                let es = std::mem::size_of::<T>();
                h.lock()[range.start * es..range.end * es].copy_from_slice(bytemuck::cast_slice(data));
            }
        }
        Ok(())
    }
}

impl<T: Element> Tensor<T> {
    /// Sets every element of a contiguous tensor (or view, at any offset into its buffer) to
    /// zero, on the device's stream (no host sync; a memset, capturable in a CUDA graph).
    ///
    /// # Errors
    /// [`Error::Tensor`] if the tensor is strided.
    pub fn fill_zeros(&mut self) -> Result<()> {
        let n = self.numel();
        if !self.is_contiguous() {
            return Err(Error::Tensor {
                what: "Tensor::fill_zeros",
                expected: "a contiguous tensor".into(),
                found: format!("strides {:?}", self.strides),
            });
        }
        let range = self.offset..self.offset + n;
        match &mut self.buf {
            Storage::Cuda(b) => self.device.stream()?.clone().memset_zeros(&mut b.slice_mut(range))?,
            Storage::Host(h) => {
                let es = std::mem::size_of::<T>();
                h.lock()[range.start * es..range.end * es].fill(0);
            }
        }
        Ok(())
    }
}

/// Checks that a view of `len` elements' buffer stays inside it.
fn check_view(what: &'static str, len: usize, offset: usize, shape: &[usize], strides: &[usize]) -> Result<()> {
    if shape.len() != strides.len() {
        return Err(Error::Tensor {
            what,
            expected: format!("{} strides for shape {shape:?}", shape.len()),
            found: format!("{strides:?}"),
        });
    }
    let last = shape
        .iter()
        .zip(strides)
        .try_fold(offset, |acc, (&d, &s)| if d == 0 { Some(acc) } else { acc.checked_add((d - 1).checked_mul(s)?) });
    match last {
        Some(last) if shape.contains(&0) || last < len => Ok(()),
        _ => Err(Error::Tensor {
            what,
            expected: format!("a view inside the buffer of {len} elements"),
            found: format!("offset {offset}, shape {shape:?}, strides {strides:?}"),
        }),
    }
}

impl<T: Element> Tensor<T> {
    /// A borrowed view of the same elements with another shape and strides (elements), from
    /// the tensor's offset: e.g. a matrix as a batch of one.
    ///
    /// # Errors
    /// [`Error::Tensor`] if the view reaches past the buffer.
    pub fn view(&self, shape: &[usize], strides: &[usize]) -> Result<TensorView<'_, T>> {
        check_view("Tensor::view", self.buf.len(), self.offset, shape, strides)?;
        Ok(TensorView { t: self, shape: shape.to_vec(), strides: strides.to_vec() })
    }

    /// As [`Tensor::view`], for a kernel that writes it.
    ///
    /// # Errors
    /// [`Error::Tensor`] if the view reaches past the buffer.
    pub fn view_mut(&mut self, shape: &[usize], strides: &[usize]) -> Result<TensorViewMut<'_, T>> {
        check_view("Tensor::view_mut", self.buf.len(), self.offset, shape, strides)?;
        Ok(TensorViewMut { t: self, shape: shape.to_vec(), strides: strides.to_vec() })
    }
}

/// A borrowed view of a [`Tensor`] with its own shape and strides.
#[derive(Debug)]
pub struct TensorView<'a, T: Element> {
    t: &'a Tensor<T>,
    shape: Vec<usize>,
    strides: Vec<usize>,
}

/// A mutably borrowed view of a [`Tensor`] with its own shape and strides.
#[derive(Debug)]
pub struct TensorViewMut<'a, T: Element> {
    t: &'a mut Tensor<T>,
    shape: Vec<usize>,
    strides: Vec<usize>,
}

impl<T: Element> TensorView<'_, T> {
    /// The view's shape.
    pub fn shape(&self) -> &[usize] {
        &self.shape
    }

    /// The view's strides.
    pub fn strides(&self) -> &[usize] {
        &self.strides
    }
}

impl<T: Element> TensorViewMut<'_, T> {
    /// The view's shape.
    pub fn shape(&self) -> &[usize] {
        &self.shape
    }

    /// The view's strides.
    pub fn strides(&self) -> &[usize] {
        &self.strides
    }
}

impl<T: Element> GlobalArg<T> for TensorView<'_, T> {
    fn global_desc<'a>(&'a self, device: &'a Device) -> Result<(GlobalDesc, ArgGuard<'a>)> {
        let (mut d, g) = self.t.global_desc(device)?;
        d.shape.clone_from(&self.shape);
        d.strides.clone_from(&self.strides);
        Ok((d, g))
    }
}

impl<T: Element> GlobalArgMut<T> for TensorViewMut<'_, T> {
    fn global_desc_mut<'a>(&'a mut self, device: &'a Device) -> Result<(GlobalDesc, ArgGuard<'a>)> {
        let (mut d, g) = self.t.global_desc_mut(device)?;
        d.shape.clone_from(&self.shape);
        d.strides.clone_from(&self.strides);
        Ok((d, g))
    }
}

/// What a kernel needs to know of a tensor argument.
#[derive(Clone, Debug)]
pub struct GlobalDesc {
    /// Address of element `[0, …, 0]`.
    pub ptr: u64,
    /// Extent per dimension.
    pub shape: Vec<usize>,
    /// Stride per dimension, in elements.
    pub strides: Vec<usize>,
    /// The CUDA context that owns the memory (0 for host memory).
    pub context: usize,
    /// The host buffer, for a tensor of the CPU interpreter (`ptr` is then a byte offset
    /// into it).
    pub host: Option<HostBuffer>,
}

/// Keeps a launch ordered after the stream's earlier use of a buffer (cudarc's event guard);
/// nothing for host memory. Hold it until the launch is queued.
pub struct ArgGuard<'a>(#[allow(dead_code)] Option<SyncOnDrop<'a>>);

/// A tensor a kernel reads: [`Tensor`], or a cudarc buffer through [`global`].
pub trait GlobalArg<T: Element> {
    /// The tensor's address, shape and strides, ordered after earlier writes on `device`'s
    /// stream. Keep the guard until the launch is queued.
    ///
    /// # Errors
    /// A cudarc buffer given to the CPU interpreter.
    fn global_desc<'a>(&'a self, device: &'a Device) -> Result<(GlobalDesc, ArgGuard<'a>)>;
}

/// A tensor a kernel writes: [`Tensor`], or a cudarc buffer through [`global_mut`].
pub trait GlobalArgMut<T: Element> {
    /// As [`GlobalArg::global_desc`], ordered after earlier reads and writes.
    ///
    /// # Errors
    /// A cudarc buffer given to the CPU interpreter.
    fn global_desc_mut<'a>(&'a mut self, device: &'a Device) -> Result<(GlobalDesc, ArgGuard<'a>)>;
}

fn desc(ptr: u64, offset: usize, size: usize, shape: &[usize], strides: &[usize], ctx: usize) -> GlobalDesc {
    GlobalDesc { ptr: ptr + (offset * size) as u64, shape: shape.to_vec(), strides: strides.to_vec(), context: ctx, host: None }
}

/// The stream that orders a GPU buffer's use: the launch device's, or the buffer's own
/// device's when the launch is on the CPU (the launch then rejects the tensor).
fn order_on<'a>(launch: &'a Device, own: &'a Device) -> Result<&'a CudaStream> {
    Ok(launch.stream().or_else(|_| own.stream())?.as_ref())
}

impl<T: Element> GlobalArg<T> for Tensor<T> {
    fn global_desc<'a>(&'a self, device: &'a Device) -> Result<(GlobalDesc, ArgGuard<'a>)> {
        let size = std::mem::size_of::<T>();
        match &self.buf {
            Storage::Cuda(buf) => {
                let ctx = buf.context().cu_ctx() as usize;
                let (ptr, guard) = buf.device_ptr(order_on(device, &self.device)?);
                Ok((desc(ptr, self.offset, size, &self.shape, &self.strides, ctx), ArgGuard(Some(guard))))
            }
            Storage::Host(h) => {
                let d = GlobalDesc { host: Some(h.clone()), ..desc(0, self.offset, size, &self.shape, &self.strides, 0) };
                Ok((d, ArgGuard(None)))
            }
        }
    }
}

impl<T: Element> GlobalArgMut<T> for Tensor<T> {
    fn global_desc_mut<'a>(&'a mut self, device: &'a Device) -> Result<(GlobalDesc, ArgGuard<'a>)> {
        let size = std::mem::size_of::<T>();
        let (offset, shape, strides) = (self.offset, self.shape.clone(), self.strides.clone());
        match &mut self.buf {
            Storage::Cuda(buf) => {
                let ctx = buf.context().cu_ctx() as usize;
                let (ptr, guard) = buf.device_ptr_mut(order_on(device, &self.device)?);
                Ok((desc(ptr, offset, size, &shape, &strides, ctx), ArgGuard(Some(guard))))
            }
            Storage::Host(h) => Ok((GlobalDesc { host: Some(h.clone()), ..desc(0, offset, size, &shape, &strides, 0) }, ArgGuard(None))),
        }
    }
}

/// A cudarc buffer seen as a row-major tensor of some shape: see [`global`] and
/// [`global_mut`].
pub struct CudaGlobal<S> {
    buf: S,
    shape: Vec<usize>,
}

/// Passes a cudarc buffer to a kernel as a row-major tensor of `shape`.
///
/// The launch checks that the buffer holds the shape's elements.
pub fn global<'b, T: Element>(buf: &'b CudaSlice<T>, shape: &[usize]) -> CudaGlobal<&'b CudaSlice<T>> {
    CudaGlobal { buf, shape: shape.to_vec() }
}

/// Passes a cudarc buffer to a kernel that writes it, as a row-major tensor of `shape`.
pub fn global_mut<'b, T: Element>(buf: &'b mut CudaSlice<T>, shape: &[usize]) -> CudaGlobal<&'b mut CudaSlice<T>> {
    CudaGlobal { buf, shape: shape.to_vec() }
}

/// A shape whose element count exceeds the buffer; the launch rejects it by its dims.
fn clamp_shape(shape: &[usize], len: usize) -> Vec<usize> {
    if shape.iter().product::<usize>() <= len {
        shape.to_vec()
    } else {
        // Reported by the launch as a mismatch: the buffer is too small for the shape.
        vec![usize::MAX; shape.len()]
    }
}

impl<T: Element> GlobalArg<T> for CudaGlobal<&CudaSlice<T>> {
    fn global_desc<'a>(&'a self, device: &'a Device) -> Result<(GlobalDesc, ArgGuard<'a>)> {
        let ctx = self.buf.context().cu_ctx() as usize;
        let shape = clamp_shape(&self.shape, self.buf.len());
        let strides = contiguous_strides(&self.shape);
        let (ptr, guard) = self.buf.device_ptr(device.stream()?);
        Ok((desc(ptr, 0, 0, &shape, &strides, ctx), ArgGuard(Some(guard))))
    }
}

impl<T: Element> GlobalArgMut<T> for CudaGlobal<&mut CudaSlice<T>> {
    fn global_desc_mut<'a>(&'a mut self, device: &'a Device) -> Result<(GlobalDesc, ArgGuard<'a>)> {
        let ctx = self.buf.context().cu_ctx() as usize;
        let shape = clamp_shape(&self.shape, self.buf.len());
        let strides = contiguous_strides(&self.shape);
        let (ptr, guard) = self.buf.device_ptr_mut(device.stream()?);
        Ok((desc(ptr, 0, 0, &shape, &strides, ctx), ArgGuard(Some(guard))))
    }
}

/// One part of a tensor along its first axis (`t[i]`), written by a kernel beside the other
/// parts: e.g. a norm's output and its residual sum as the two halves of one `[2, rows, hidden]`
/// buffer. Made by [`split_outer`]; the guard it comes with orders the launch after the
/// tensor's earlier uses, so keep it until the launch is queued. The parts share no element.
#[derive(Clone, Debug)]
pub struct Part(GlobalDesc);

/// `t`'s parts along its first axis (`t[0]`, `t[1]`, …), each of rank one less, for one
/// launch on `device` that writes them as separate parameters.
///
/// ```
/// use tessera::{split_outer, Device, GlobalArg, Tensor};
/// let dev = Device::cpu();
/// let mut t = Tensor::<f32>::zeros(&dev, &[2, 3, 4])?;
/// let (parts, _guard) = split_outer(&mut t, &dev)?;
/// let (d, _) = GlobalArg::<f32>::global_desc(&parts[1], &dev)?;
/// assert_eq!((parts.len(), d.shape), (2, vec![3, 4]));
/// # Ok::<(), tessera::Error>(())
/// ```
///
/// # Errors
/// [`Error::Tensor`] for a tensor of rank 0 or one whose parts overlap (a first axis of
/// stride 0 over more than one part, as a broadcast gives); as [`GlobalArgMut::global_desc_mut`].
pub fn split_outer<'a, T: Element>(t: &'a mut impl GlobalArgMut<T>, device: &'a Device) -> Result<(Vec<Part>, ArgGuard<'a>)> {
    let (d, g) = t.global_desc_mut(device)?;
    let (Some(&n), Some(&stride)) = (d.shape.first(), d.strides.first()) else {
        return Err(Error::Tensor { what: "split_outer", expected: "a tensor of rank 1 or more".into(), found: "rank 0".into() });
    };
    let inner: usize = d.shape[1..].iter().zip(&d.strides[1..]).map(|(&e, &s)| e.saturating_sub(1) * s).sum::<usize>() + 1;
    if n > 1 && stride < inner {
        return Err(Error::Tensor {
            what: "split_outer",
            expected: format!("parts that do not overlap: a first-axis stride of at least {inner} elements"),
            found: format!("shape {:?}, strides {:?}", d.shape, d.strides),
        });
    }
    let size = std::mem::size_of::<T>() as u64;
    let parts = (0..n)
        .map(|i| {
            Part(GlobalDesc {
                ptr: d.ptr + (i * stride) as u64 * size,
                shape: d.shape[1..].to_vec(),
                strides: d.strides[1..].to_vec(),
                ..d.clone()
            })
        })
        .collect();
    Ok((parts, g))
}

/// One tensor passed to a kernel as two parameters, one read and one written: an update in
/// place. Made by [`in_place`]; the guard it comes with orders the launch after the tensor's
/// earlier uses, so keep it until the launch is queued.
///
/// Sound only for kernels in which each element is read, if at all, before it is written and
/// by the thread that writes it (elementwise updates such as RoPE); the read parameter may take
/// the read-only cache path.
#[derive(Clone, Debug)]
pub struct InPlace(GlobalDesc);

/// `t` as an [`InPlace`] pair of parameters for a launch on `device`.
///
/// # Errors
/// As [`GlobalArgMut::global_desc_mut`].
pub fn in_place<'a, T: Element>(t: &'a mut impl GlobalArgMut<T>, device: &'a Device) -> Result<(InPlace, ArgGuard<'a>)> {
    let (d, g) = t.global_desc_mut(device)?;
    Ok((InPlace(d), g))
}

/// A descriptor taken once ([`Part`], [`InPlace`]) as a read and a written parameter: the
/// guard that orders the launch came with it.
macro_rules! desc_arg {
    ($($t:ty),*) => {$(
        impl<T: Element> GlobalArg<T> for $t {
            fn global_desc<'a>(&'a self, _device: &'a Device) -> Result<(GlobalDesc, ArgGuard<'a>)> {
                Ok((self.0.clone(), ArgGuard(None)))
            }
        }

        impl<T: Element> GlobalArgMut<T> for $t {
            fn global_desc_mut<'a>(&'a mut self, _device: &'a Device) -> Result<(GlobalDesc, ArgGuard<'a>)> {
                Ok((self.0.clone(), ArgGuard(None)))
            }
        }
    )*};
}

desc_arg!(Part, InPlace);

/// An empty tensor of some rank: stands in for an optional tensor parameter the kernel does
/// not read (a flag tells it so). Every access to it is out of bounds, so a kernel that does
/// read it reads zeros and writes nothing.
#[derive(Clone, Copy, Debug)]
pub struct Absent(pub usize);

impl Absent {
    fn desc<T: Element>(self, device: &Device) -> Result<GlobalDesc> {
        let (context, host) =
            if device.is_cpu() { (0, Some(HostBuffer::zeroed::<T>(0))) } else { (device.context()?.cu_ctx() as usize, None) };
        Ok(GlobalDesc { ptr: 0, shape: vec![0; self.0], strides: vec![0; self.0], context, host })
    }
}

impl<T: Element> GlobalArg<T> for Absent {
    fn global_desc<'a>(&'a self, device: &'a Device) -> Result<(GlobalDesc, ArgGuard<'a>)> {
        Ok((self.desc::<T>(device)?, ArgGuard(None)))
    }
}

impl<T: Element> GlobalArgMut<T> for Absent {
    fn global_desc_mut<'a>(&'a mut self, device: &'a Device) -> Result<(GlobalDesc, ArgGuard<'a>)> {
        Ok((self.desc::<T>(device)?, ArgGuard(None)))
    }
}

/// An optional tensor argument of rank `.1`: the tensor, or an [`Absent`] one for `None`.
pub struct Optional<'t, A>(pub Option<&'t A>, pub usize);

impl<T: Element, A: GlobalArg<T>> GlobalArg<T> for Optional<'_, A> {
    fn global_desc<'a>(&'a self, device: &'a Device) -> Result<(GlobalDesc, ArgGuard<'a>)> {
        match self.0 {
            Some(a) => a.global_desc(device),
            None => Ok((Absent(self.1).desc::<T>(device)?, ArgGuard(None))),
        }
    }
}

/// An optional output of rank `.1`: the tensor, or an [`Absent`] one (nothing written) for
/// `None`.
pub struct OptionalMut<'t, A>(pub Option<&'t mut A>, pub usize);

impl<T: Element, A: GlobalArgMut<T>> GlobalArgMut<T> for OptionalMut<'_, A> {
    fn global_desc_mut<'a>(&'a mut self, device: &'a Device) -> Result<(GlobalDesc, ArgGuard<'a>)> {
        match &mut self.0 {
            Some(a) => a.global_desc_mut(device),
            None => Ok((Absent(self.1).desc::<T>(device)?, ArgGuard(None))),
        }
    }
}

/// A device's kept-zeroed buffer: its tile counter, its f32 workspace.
pub(crate) enum ZeroedBuf<T> {
    Cuda(CudaSlice<T>),
    Host(HostBuffer),
}

impl<T: Element> ZeroedBuf<T> {
    /// Elements.
    pub(crate) fn len(&self) -> usize {
        match self {
            ZeroedBuf::Cuda(b) => b.len(),
            ZeroedBuf::Host(h) => h.len,
        }
    }

    /// The buffer as a kernel's tensor of `shape` and `strides` (`own` its device; `what` names
    /// it in the error a missing buffer gives).
    fn desc_mut<'a>(
        buf: Option<&'a mut Self>, launch: &'a Device, own: &'a Device, shape: &[usize], strides: &[usize], what: &'static str,
    ) -> Result<(GlobalDesc, ArgGuard<'a>)> {
        let size = std::mem::size_of::<T>();
        match buf {
            Some(ZeroedBuf::Cuda(buf)) => {
                let ctx = buf.context().cu_ctx() as usize;
                let (ptr, guard) = buf.device_ptr_mut(order_on(launch, own)?);
                Ok((desc(ptr, 0, size, shape, strides, ctx), ArgGuard(Some(guard))))
            }
            Some(ZeroedBuf::Host(h)) => Ok((GlobalDesc { host: Some(h.clone()), ..desc(0, 0, size, shape, strides, 0) }, ArgGuard(None))),
            None => Err(Error::Tensor { what, expected: format!("a {what} made by its `Device` call"), found: "none".into() }),
        }
    }
}

/// A device's zeroed f32 workspace, held for a few launches: [`Device::zeroed_workspace`].
pub struct Workspace<'d> {
    pub(crate) slot: std::sync::MutexGuard<'d, Option<ZeroedBuf<f32>>>,
    pub(crate) device: &'d Device,
}

impl<'d> Workspace<'d> {
    /// The workspace seen as a tensor of `shape` and `strides` (in elements) from its first
    /// element, passed as a `Global<f32, N>` a kernel writes.
    ///
    /// # Errors
    /// [`Error::Tensor`] when the view reaches past the workspace.
    pub fn view<'w>(&'w mut self, shape: &[usize], strides: &[usize]) -> Result<WorkspaceView<'w, 'd>> {
        let len = self.slot.as_ref().map_or(0, ZeroedBuf::len);
        let last = shape.iter().zip(strides).map(|(&d, &s)| d.saturating_sub(1).saturating_mul(s)).sum::<usize>();
        if shape.len() != strides.len() || shape.contains(&0) || last >= len {
            return Err(Error::Tensor {
                what: "workspace view",
                expected: format!("a view within the workspace's {len} elements"),
                found: format!("shape {shape:?}, strides {strides:?}"),
            });
        }
        Ok(WorkspaceView { ws: self, shape: shape.to_vec(), strides: strides.to_vec() })
    }
}

/// A view of a [`Workspace`] for one launch.
pub struct WorkspaceView<'w, 'd> {
    ws: &'w mut Workspace<'d>,
    shape: Vec<usize>,
    strides: Vec<usize>,
}

impl GlobalArgMut<f32> for WorkspaceView<'_, '_> {
    fn global_desc_mut<'a>(&'a mut self, device: &'a Device) -> Result<(GlobalDesc, ArgGuard<'a>)> {
        let own = self.ws.device;
        ZeroedBuf::desc_mut(self.ws.slot.as_mut(), device, own, &self.shape, &self.strides, "workspace")
    }
}

/// A device's kept-zeroed counters, held for one launch: [`Device::tile_counter`] (one),
/// [`Device::zeroed_counters`]. Passes as a `Global<i32, 1>` of `len` elements.
pub struct Counters<'d> {
    pub(crate) slot: std::sync::MutexGuard<'d, Option<ZeroedBuf<i32>>>,
    pub(crate) device: &'d Device,
    pub(crate) len: usize,
}

impl GlobalArgMut<i32> for Counters<'_> {
    fn global_desc_mut<'a>(&'a mut self, device: &'a Device) -> Result<(GlobalDesc, ArgGuard<'a>)> {
        let own = self.device;
        ZeroedBuf::desc_mut(self.slot.as_mut(), device, own, &[self.len], &[1], "counters")
    }
}

/// A [`Tensor`] over a buffer another library owns, from [`Tensor::borrow_cudarc`]: it derefs
/// to `&Tensor<T>` for as long as the buffer is borrowed, and leaves the buffer allocated when
/// dropped.
pub struct BorrowedTensor<'a, T: Element> {
    tensor: std::mem::ManuallyDrop<Tensor<T>>,
    _owner: std::marker::PhantomData<&'a CudaSlice<T>>,
}

impl<T: Element> std::ops::Deref for BorrowedTensor<'_, T> {
    type Target = Tensor<T>;

    fn deref(&self) -> &Tensor<T> {
        &self.tensor
    }
}

impl<T: Element> std::fmt::Debug for BorrowedTensor<'_, T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Borrowed{:?}", *self.tensor)
    }
}

impl<T: Element> Drop for BorrowedTensor<'_, T> {
    fn drop(&mut self) {
        // SAFETY: taken once, here; the field is not used again.
        let t = unsafe { std::mem::ManuallyDrop::take(&mut self.tensor) };
        if let Storage::Cuda(alias) = t.buf {
            // The owner frees the allocation, not this alias of it.
            alias.leak();
        }
    }
}

/// `Ok` where `U` has `T`'s size (a buffer of one read as the other), else an error for `what`.
fn same_size<T, U>(what: &'static str) -> Result<()> {
    if std::mem::size_of::<T>() == std::mem::size_of::<U>() {
        return Ok(());
    }
    Err(Error::Tensor {
        what,
        expected: format!("an element type of {} bytes ({})", std::mem::size_of::<T>(), std::any::type_name::<T>()),
        found: format!("{} of {} bytes", std::any::type_name::<U>(), std::mem::size_of::<U>()),
    })
}
