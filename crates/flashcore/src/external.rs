//! Running on a caller's stream: what a framework (PyTorch, through the Python package)
//! needs so that FlashCore neither synchronises nor allocates behind its back, and leaves
//! the thread's CUDA context as it found it. See [`crate::Context::attention_on_stream`].

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use cudarc::driver::sys;
use cudarc::driver::{CudaContext, CudaSlice, CudaStream, DevicePtr};

use crate::error::{DriverContext, Error, Result};

/// Where a call on a caller's stream runs, and where its scratch memory comes from: the
/// stream (PyTorch's current stream, say) and an allocator that is called at most once with
/// a byte count and returns the device address of at least that many bytes, 16-byte aligned,
/// usable in the stream's order until the call returns (split-KV partials, the backward's
/// D_i and dQ accumulator). See [`crate::Context::attention_on_stream`].
pub struct CallerStream<'a> {
    /// The stream.
    pub stream: ExternalStream,
    /// The scratch allocator.
    pub scratch: &'a mut dyn FnMut(usize) -> Result<u64>,
}

/// A CUDA stream owned by the caller, e.g. `torch.cuda.current_stream().cuda_stream`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct ExternalStream(usize);

impl ExternalStream {
    /// Wraps a raw `CUstream` / `cudaStream_t` handle; `0` is the legacy default stream.
    pub fn from_raw(handle: usize) -> Self {
        Self(handle)
    }

    pub(crate) fn raw(self) -> sys::CUstream {
        self.0 as sys::CUstream
    }

    /// Checks that the stream belongs to `cuda` (a stream of another device's context
    /// would run the kernels there, on pointers of this device).
    pub(crate) fn check_context(self, cuda: &CudaContext) -> Result<()> {
        let mut owner: sys::CUcontext = std::ptr::null_mut();
        // SAFETY: writes one handle; the caller vouches that the stream is live.
        unsafe { sys::cuStreamGetCtx(self.raw(), &mut owner) }.result().ctx("reading the stream's context")?;
        if owner != cuda.cu_ctx() {
            return Err(Error::Param {
                arg: "stream",
                msg: format!("stream {:#x} belongs to another CUDA context than device {}'s primary context", self.0, cuda.ordinal()),
            });
        }
        Ok(())
    }
}

/// Tile counters for callers' streams: two `u32` each, zero between launches (the kernel
/// that uses one leaves it zero), assigned to a stream at its first call and kept. A counter
/// must never serve two launches at once, and launches on one stream are ordered, so one
/// counter per stream is safe without a memset per call. Preallocated, so that a stream
/// seen first during a CUDA graph capture (PyTorch captures on a stream of its own) needs
/// no allocation.
pub(crate) struct StreamCounters {
    pool: CudaSlice<u32>,
    slots: Mutex<HashMap<StreamKey, usize>>,
}

/// What names one stream: its handle, and for CUDA's per-thread default stream (one handle,
/// a stream per thread: candle's stream) the thread too.
type StreamKey = (ExternalStream, Option<std::thread::ThreadId>);

/// `CU_STREAM_PER_THREAD`: each host thread's own default stream.
const PER_THREAD_STREAM: usize = 0x2;

impl ExternalStream {
    /// The counter's key of this stream on the calling thread.
    fn key(self) -> StreamKey {
        (self, (self.0 == PER_THREAD_STREAM).then(|| std::thread::current().id()))
    }
}

/// How many distinct caller streams one context serves (PyTorch's pools hold 32 streams of
/// each priority per device; the default and capture streams come on top).
const MAX_STREAMS: usize = 512;

impl StreamCounters {
    /// Zeroed in `stream`'s order: synchronise before another stream uses them.
    pub(crate) fn new(stream: &Arc<CudaStream>) -> Result<Self> {
        let pool = stream.alloc_zeros::<u32>(2 * MAX_STREAMS).ctx("allocating the per-stream tile counters")?;
        Ok(Self { pool, slots: Mutex::new(HashMap::new()) })
    }

    /// The device address of `stream`'s counter. A stream seen for the first time is checked
    /// to belong to `cuda` (once: the check is a driver call).
    pub(crate) fn counter_for(&self, stream: ExternalStream, cuda: &CudaContext) -> Result<u64> {
        let mut slots = self.slots.lock().unwrap();
        let slot = match slots.get(&stream.key()) {
            Some(&slot) => slot,
            None => {
                stream.check_context(cuda)?;
                if slots.len() >= MAX_STREAMS {
                    return Err(Error::Param {
                        arg: "stream",
                        msg: format!("more than {MAX_STREAMS} distinct streams used with one context"),
                    });
                }
                let slot = slots.len();
                slots.insert(stream.key(), slot);
                slot
            }
        };
        let (base, _sync) = self.pool.device_ptr(self.pool.stream());
        Ok(base + (slot * 2 * std::mem::size_of::<u32>()) as u64)
    }
}

/// Makes `cuda` the thread's current context and puts the previous one back on drop, so a
/// call on device 1 does not move the caller's (PyTorch's) current device.
pub(crate) struct CurrentContextGuard {
    previous: sys::CUcontext,
    /// The context made current, if any: nothing to restore when it was already current.
    bound: sys::CUcontext,
}

impl CurrentContextGuard {
    /// Remembers the thread's current context (the driver must be initialised).
    pub(crate) fn save() -> Result<Self> {
        let mut previous: sys::CUcontext = std::ptr::null_mut();
        // SAFETY: writes one handle.
        unsafe { sys::cuCtxGetCurrent(&mut previous) }.result().ctx("reading the current CUDA context")?;
        Ok(Self { previous, bound: std::ptr::null_mut() })
    }

    /// Remembers the thread's current context, then makes `cuda` current.
    pub(crate) fn bind(cuda: &CudaContext) -> Result<Self> {
        let mut guard = Self::save()?;
        cuda.bind_to_thread().ctx("making the device's context current")?;
        guard.bound = cuda.cu_ctx();
        Ok(guard)
    }
}

impl Drop for CurrentContextGuard {
    fn drop(&mut self) {
        // Nothing to restore to on a thread that had no context; a failure here can only mean
        // the previous context was destroyed meanwhile, and then there is nothing to restore.
        if !self.previous.is_null() && self.previous != self.bound {
            // SAFETY: sets the thread's current context to a handle the driver gave us.
            let _ = unsafe { sys::cuCtxSetCurrent(self.previous) };
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_per_thread_default_stream_is_a_stream_per_thread_and_others_one_stream() {
        let per_thread = ExternalStream::from_raw(PER_THREAD_STREAM);
        let other = ExternalStream::from_raw(0x7f00_1234);
        let (here, there) = (per_thread.key(), std::thread::spawn(move || per_thread.key()).join().unwrap());
        assert_ne!(here, there, "two threads' default streams must not share a tile counter");
        assert_eq!(per_thread.key(), here, "one thread's default stream keeps its key");
        assert_eq!(other.key(), std::thread::spawn(move || other.key()).join().unwrap(), "a stream handle is one stream on every thread");
    }
}
