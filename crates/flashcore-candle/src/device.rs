//! The bridge to candle's CUDA state: one FlashCore [`Context`] per GPU (kernels and their
//! cache; candle's and FlashCore's contexts are both the device's primary context), views of
//! candle's buffers, outputs allocated from candle's device, and every call run on candle's
//! stream with scratch memory from candle's allocator: no synchronisation, no second stream.

use std::sync::Arc;

use candle_core::backend::{BackendDevice, BackendStorage};
use candle_core::cuda_backend::cudarc::driver::{CudaSlice, DevicePtr};
use candle_core::cuda_backend::{CudaDType, CudaDevice, CudaStorage};
use candle_core::{DType, Layout, Result, Shape, Storage, Tensor};
use flashcore::{CallerStream, Context, ExternalStream};

/// A FlashCore error as candle's (its text names the argument).
pub(crate) fn wrap(e: flashcore::Error) -> candle_core::Error {
    candle_core::Error::Msg(format!("flashcore: {e}")).bt()
}

/// What a candle op answers for CPU storage.
pub(crate) fn cpu_refused<T>() -> Result<T> {
    candle_core::bail!("flashcore: `q` must be on a CUDA device (FlashCore's kernels run on NVIDIA GPUs)")
}

/// The FlashCore context of candle's `device` (opened on first use, then kept).
pub(crate) fn context(device: &CudaDevice) -> Result<Arc<Context>> {
    let ordinal = match device.location() {
        candle_core::DeviceLocation::Cuda { gpu_id } => gpu_id,
        other => candle_core::bail!("flashcore: a CUDA device was expected, got {other:?}"),
    };
    Context::shared(ordinal).map_err(wrap)
}

/// FlashCore's element type for candle's (16-bit floats only).
pub(crate) fn fc_dtype(arg: &str, dtype: DType) -> Result<flashcore::DType> {
    match dtype {
        DType::BF16 => Ok(flashcore::DType::BF16),
        DType::F16 => Ok(flashcore::DType::F16),
        other => candle_core::bail!("flashcore: `{arg}` must be bf16 or f16, got {other:?}"),
    }
}

/// The device address of element 0 of `layout` in `storage` (of `dtype`), with the guard that
/// records its use on `stream` when dropped (cudarc's cross-stream tracking).
fn address<'a, T: CudaDType>(
    storage: &'a CudaStorage,
    layout: &Layout,
    stream: &'a candle_core::cuda_backend::cudarc::driver::CudaStream,
) -> Result<u64> {
    let slice: &CudaSlice<T> = storage.as_cuda_slice::<T>()?;
    let (ptr, _record) = slice.device_ptr(stream);
    Ok(ptr + (layout.start_offset() * std::mem::size_of::<T>()) as u64)
}

/// The device address of `layout`'s element 0 in a storage of 16-bit floats, i32/u32 or f32.
pub(crate) fn storage_address(arg: &str, storage: &CudaStorage, layout: &Layout) -> Result<u64> {
    let stream = storage.device().cuda_stream();
    match storage.dtype() {
        DType::BF16 => address::<half::bf16>(storage, layout, &stream),
        DType::F16 => address::<half::f16>(storage, layout, &stream),
        DType::F32 => address::<f32>(storage, layout, &stream),
        DType::U32 => address::<u32>(storage, layout, &stream),
        DType::I32 => address::<i32>(storage, layout, &stream),
        other => candle_core::bail!("flashcore: `{arg}` has dtype {other:?}, which no argument takes"),
    }
}

/// The CUDA storage behind a read guard.
pub(crate) fn cuda<'a>(arg: &str, storage: &'a candle_core::StorageRef<'_>) -> Result<&'a CudaStorage> {
    match &**storage {
        Storage::Cuda(c) => Ok(c),
        _ => candle_core::bail!("flashcore: `{arg}` must be on a CUDA device"),
    }
}

/// An extra tensor of a call (lengths, a block table, ALiBi's slopes), read-locked while held.
pub(crate) struct Held<'a> {
    storage: candle_core::StorageRef<'a>,
    pub layout: &'a Layout,
    pub len: usize,
}

impl<'a> Held<'a> {
    pub(crate) fn of(t: &'a Tensor) -> Self {
        let (storage, layout) = t.storage_and_layout();
        Held { storage, layout, len: t.elem_count() }
    }

    pub(crate) fn address(&self, arg: &str) -> Result<u64> {
        storage_address(arg, cuda(arg, &self.storage)?, self.layout)
    }

    pub(crate) fn vector<T>(&self, arg: &str) -> Result<flashcore::DeviceVec<'_, T>> {
        // SAFETY: the storage holds `len` values from the layout's offset (checked contiguous
        // and of a 4-byte dtype by `check`) and is read-locked while the view lives.
        Ok(unsafe { flashcore::DeviceVec::from_raw(self.address(arg)?, self.len) })
    }
}

/// A 4-D view (`[B, S, H, D]`; a 3-D tensor is `[1, S, H, D]`) of a 16-bit tensor.
pub(crate) fn view<'a>(arg: &str, storage: &'a CudaStorage, layout: &Layout) -> Result<flashcore::TensorView<'a>> {
    let fc = fc_dtype(arg, storage.dtype())?;
    let (shape, strides) = bshd(layout);
    let ptr = storage_address(arg, storage, layout)?;
    let device = ordinal(storage.device());
    // SAFETY: the storage holds the layout's elements and outlives the view (borrowed).
    Ok(unsafe { flashcore::TensorView::from_raw(ptr, flashcore::Layout { shape, strides, dtype: fc }, device) })
}

/// The shape and strides of a rank-3 or rank-4 layout as `[B, S, H, D]`.
pub(crate) fn bshd(layout: &Layout) -> ([usize; 4], [usize; 4]) {
    let (dims, strides) = (layout.dims(), layout.stride());
    match dims.len() {
        3 => ([1, dims[0], dims[1], dims[2]], [dims[0] * strides[0], strides[0], strides[1], strides[2]]),
        _ => ([dims[0], dims[1], dims[2], dims[3]], [strides[0], strides[1], strides[2], strides[3]]),
    }
}

/// candle's ordinal of `device`.
pub(crate) fn ordinal(device: &CudaDevice) -> usize {
    match device.location() {
        candle_core::DeviceLocation::Cuda { gpu_id } => gpu_id,
        _ => usize::MAX,
    }
}

/// A contiguous output of `shape` and `dtype` on `device`: its storage and the address of
/// its first element (written by the call before anyone reads it).
pub(crate) struct Output {
    pub storage: CudaStorage,
    pub ptr: u64,
}

impl Output {
    /// `elems` values of `dtype` (bf16, f16 or f32), uninitialised: the kernels write each.
    pub(crate) fn alloc(device: &CudaDevice, dtype: DType, elems: usize) -> Result<Self> {
        fn make<T: CudaDType + candle_core::cuda_backend::cudarc::driver::DeviceRepr>(device: &CudaDevice, elems: usize) -> Result<Output> {
            // SAFETY: every element is written by the kernels before it is read.
            let slice = unsafe { device.alloc::<T>(elems.max(1))? };
            let stream = device.cuda_stream();
            let ptr = slice.device_ptr(&stream).0;
            Ok(Output { storage: CudaStorage::wrap_cuda_slice(slice, device.clone()), ptr })
        }
        match dtype {
            DType::BF16 => make::<half::bf16>(device, elems),
            DType::F16 => make::<half::f16>(device, elems),
            DType::F32 => make::<f32>(device, elems),
            other => candle_core::bail!("flashcore: no output of dtype {other:?}"),
        }
    }

    /// A writable 4-D contiguous view of this output.
    pub(crate) fn view_mut(&self, shape: [usize; 4], dtype: flashcore::DType, device: usize) -> flashcore::TensorViewMut<'_> {
        // SAFETY: the storage was allocated for `shape`'s elements and is written by this call alone.
        unsafe { flashcore::TensorViewMut::from_raw(self.ptr, flashcore::Layout::contiguous(shape, dtype), device) }
    }

    /// This output as a tensor of `shape` outside the autograd graph.
    pub(crate) fn into_tensor(self, shape: impl Into<Shape>) -> Tensor {
        Tensor::from_storage(Storage::Cuda(self.storage), shape, candle_core::op::BackpropOp::none(), false)
    }
}

/// Runs `call` on `device`'s candle stream, its scratch memory taken from candle's allocator
/// (freed in the stream's order once the call has queued its work).
pub(crate) fn on_candle_stream(device: &CudaDevice, call: impl FnOnce(CallerStream) -> flashcore::Result<()>) -> Result<()> {
    let stream = device.cuda_stream();
    let mut scratch_buffers: Vec<CudaSlice<u8>> = Vec::new();
    let mut alloc_error: Option<candle_core::Error> = None;
    let mut scratch = |bytes: usize| -> flashcore::Result<u64> {
        // SAFETY: FlashCore initialises what it reads of its scratch.
        match unsafe { device.alloc::<u8>(bytes.max(1)) } {
            Ok(slice) => {
                let ptr = slice.device_ptr(&stream).0;
                scratch_buffers.push(slice);
                Ok(ptr)
            }
            Err(e) => {
                let msg = format!("candle's allocator refused {bytes} bytes of scratch: {e}");
                alloc_error = Some(e);
                Err(flashcore::Error::Param { arg: "scratch", msg })
            }
        }
    };
    let caller = CallerStream { stream: ExternalStream::from_raw(stream.cu_stream() as usize), scratch: &mut scratch };
    let result = call(caller);
    drop(scratch_buffers);
    match (result, alloc_error) {
        (Err(_), Some(e)) => Err(e),
        (result, _) => result.map_err(wrap),
    }
}
