//! [`Context`]: one GPU, one stream, the JIT, and the loaded kernels. Its attention entry
//! points are `forward`'s and `backward`'s.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, OnceLock};

use cudarc::driver::sys::{CUdevice_attribute as Attr, CUfunction_attribute as FnAttr};
use cudarc::driver::{CudaContext, CudaSlice, CudaStream, DevicePtr};
use cudarc::nvrtc::Ptx;

use crate::chunks::{ChunkBatch, ChunkPlan};
use crate::dispatch::{self, Plan};
use crate::error::{DriverContext, Error, Result};
use crate::external::{CallerStream, CurrentContextGuard, StreamCounters};
use crate::jit::{Arch, DiskCache, Jit};
use crate::kernels::Variant;
use crate::launch::{Lane, LoadedKernel};
use crate::params::AttnParams;
use crate::shape::ProblemShape;
use crate::varlen::SeqLensView;

/// What the driver says about the device.
#[derive(Debug, Clone, serde::Serialize)]
pub struct DeviceInfo {
    /// Device ordinal.
    pub ordinal: usize,
    /// Marketing name, e.g. `NVIDIA H100 80GB HBM3`.
    pub name: String,
    /// Compute capability `(major, minor)`.
    pub compute_capability: (u32, u32),
    /// The arch FlashCore compiles for.
    #[serde(serialize_with = "display")]
    pub arch: Arch,
    /// Streaming multiprocessors.
    pub sm_count: u32,
    /// Global memory in bytes.
    pub memory_bytes: usize,
    /// L2 cache in bytes.
    pub l2_bytes: u32,
    /// Most shared memory a block may opt in to.
    pub max_smem_per_block: u32,
    /// The driver's CUDA version, e.g. 13000 for 13.0.
    pub driver_version: i32,
}

impl DeviceInfo {
    /// What the dispatcher needs to know of the device.
    pub fn device(&self) -> dispatch::Device {
        dispatch::Device { arch: self.arch, sm_count: self.sm_count, max_smem_per_block: self.max_smem_per_block }
    }
}

fn display<S: serde::Serializer>(a: &Arch, s: S) -> std::result::Result<S::Ok, S::Error> {
    s.collect_str(a)
}

/// A GPU ready to run attention: CUDA context, stream, JIT and kernel cache.
///
/// Calls on one `Context` are queued on its stream in order; results are ready after
/// [`Context::synchronize`] or a download.
pub struct Context {
    cuda: Arc<CudaContext>,
    stream: Arc<CudaStream>,
    info: DeviceInfo,
    jit: Jit,
    loaded: Mutex<HashMap<Variant, Arc<LoadedKernel>>>,
    /// The fwd_sm90 tile counter: zero between launches, used by one launch at a time (all
    /// launches go to `stream`).
    tile_counter: CudaSlice<u32>,
    /// Scratch of the calls on `stream` (split-KV partials; the backward's D_i and dQ
    /// accumulator), grown on demand; one call at a time uses it, in stream order.
    workspace: Mutex<Option<CudaSlice<f32>>>,
    /// Tile counters of callers' streams ([`Context::attention_on_stream`]).
    stream_counters: StreamCounters,
    /// The chunk offsets of chunked self-attention run as a packed batch (`chunks.rs`), one
    /// device vector per (chunk, sequence length), kept for the context's life.
    chunk_offsets: Mutex<HashMap<ChunkBatch, CudaSlice<i32>>>,
}

impl Context {
    /// The process's one context of GPU `ordinal`, opened (as [`Context::new`]) on first use
    /// and kept: what a layer that calls FlashCore for others (the Python extension, the
    /// candle ops) uses, so that every call on a device shares its loaded kernels, its tile
    /// counters and its stream. An opening that fails is tried again on the next call.
    pub fn shared(ordinal: usize) -> Result<Arc<Context>> {
        static CONTEXTS: OnceLock<Mutex<HashMap<usize, Arc<Context>>>> = OnceLock::new();
        let mut contexts = CONTEXTS.get_or_init(Default::default).lock().unwrap();
        if let Some(ctx) = contexts.get(&ordinal) {
            return Ok(ctx.clone());
        }
        let ctx = Arc::new(Context::new(ordinal)?);
        contexts.insert(ordinal, ctx.clone());
        Ok(ctx)
    }

    /// Opens GPU `ordinal`, caching kernels in [`DiskCache::default_dir`].
    pub fn new(ordinal: usize) -> Result<Self> {
        Self::with_cache(ordinal, DiskCache::new(DiskCache::default_dir()))
    }

    /// Opens GPU `ordinal` with an explicit kernel cache.
    pub fn with_cache(ordinal: usize, cache: DiskCache) -> Result<Self> {
        // SAFETY: only probes whether libcuda can be opened (linked at build time instead
        // under the `dynamic-linking` feature: the loader has opened it already).
        #[cfg(feature = "dynamic-loading")]
        if !unsafe { cudarc::driver::sys::is_culib_present() } {
            return Err(Error::NoGpu("the NVIDIA driver library (libcuda.so) was not found".into()));
        }
        let count = CudaContext::device_count().map_err(|e| Error::NoGpu(format!("the CUDA driver could not start: {e}")))?;
        if ordinal >= count as usize {
            return Err(Error::NoGpu(format!("device {ordinal} requested, {count} present")));
        }
        // The caller's current context (PyTorch's, say) is current again when this returns.
        let _restore = CurrentContextGuard::save()?;
        let cuda = CudaContext::new(ordinal).ctx("creating the CUDA context")?;
        // One stream, so cudarc's cross-stream event tracking is pure overhead. A stream of
        // our own, not the legacy default stream, so its work can be captured in a graph.
        unsafe { cuda.disable_event_tracking() };
        let stream = cuda.new_stream().ctx("creating a stream")?;
        let info = device_info(&cuda)?;
        let tile_counter = stream.alloc_zeros::<u32>(2).ctx("allocating the tile counter")?;
        let stream_counters = StreamCounters::new(&stream)?;
        // The counters are zeroed in this stream's order; other streams use them next.
        stream.synchronize().ctx("zeroing the tile counters")?;
        Ok(Self {
            cuda,
            stream,
            info,
            jit: Jit::new(cache),
            loaded: Mutex::new(HashMap::new()),
            tile_counter,
            workspace: Mutex::new(None),
            stream_counters,
            chunk_offsets: Mutex::new(HashMap::new()),
        })
    }

    /// The device.
    pub fn info(&self) -> &DeviceInfo {
        &self.info
    }

    /// The device ordinal.
    pub fn ordinal(&self) -> usize {
        self.info.ordinal
    }

    /// What [`Context::attention_into`] would run for a dense problem of `shape` and `dtype`
    /// without ALiBi (after chunked attention's plan step, `chunks.rs`: a chunk that cuts
    /// nothing dropped, chunked self-attention as each entry's packed batch of its chunks).
    pub fn plan(&self, shape: &ProblemShape, dtype: crate::DType, params: &AttnParams) -> Result<Plan> {
        let (shape, params, layout) = ChunkPlan::dense_problem(shape, params);
        dispatch::plan_for(&self.info.device(), &shape, dtype, &params, layout, Default::default())
    }

    /// The stream every call is queued on.
    pub fn stream(&self) -> &Arc<CudaStream> {
        &self.stream
    }

    /// The JIT compiler and its cache.
    pub fn jit(&self) -> &Jit {
        &self.jit
    }

    /// The CUDA context.
    pub fn cuda(&self) -> &Arc<CudaContext> {
        &self.cuda
    }

    /// Waits for all queued work.
    pub fn synchronize(&self) -> Result<()> {
        self.stream.synchronize().ctx("synchronizing the stream")
    }

    /// Runs `call` on the context's own stream, its scratch from the context's workspace.
    pub(crate) fn on_own_stream(&self, call: impl FnOnce(&mut Lane) -> Result<()>) -> Result<()> {
        let (tile_counter, _sync) = self.tile_counter.device_ptr(&self.stream);
        let mut workspace = self.workspace.lock().unwrap();
        let mut scratch = |bytes| self.grow_workspace(&mut workspace, bytes);
        call(&mut Lane { stream: &self.stream, tile_counter, scratch: &mut scratch })
    }

    /// Runs `call` on the caller's stream with the caller's scratch, the calling thread's
    /// current context restored afterwards.
    ///
    /// # Safety
    /// As [`Context::attention_on_stream`].
    pub(crate) unsafe fn on_caller_stream(&self, caller: CallerStream, call: impl FnOnce(&mut Lane) -> Result<()>) -> Result<()> {
        let _restore = CurrentContextGuard::bind(&self.cuda)?;
        let tile_counter = self.stream_counters.counter_for(caller.stream, &self.cuda)?;
        let borrowed = self.cuda.wrap_borrowed_stream(caller.stream.raw());
        call(&mut Lane { stream: &borrowed, tile_counter, scratch: caller.scratch })
    }

    /// `plan`'s chunk offsets on the device, uploaded on first use; `None` while `lane`'s stream
    /// is being captured into a CUDA graph and they do not exist yet (an upload there would
    /// break the capture: the call then runs the chunked kernel form instead). The upload is
    /// on the context's own stream, waited for, so that any stream may read them after.
    pub(crate) fn chunk_offsets(&self, lane: &Lane, plan: &ChunkBatch) -> Result<Option<SeqLensView<'_>>> {
        let mut offsets = self.chunk_offsets.lock().unwrap();
        if !offsets.contains_key(plan) {
            let status = lane.stream.capture_status().ctx("asking whether the stream is capturing")?;
            if status != cudarc::driver::sys::CUstreamCaptureStatus::CU_STREAM_CAPTURE_STATUS_NONE {
                return Ok(None);
            }
            let uploaded = self.stream.clone_htod(&plan.offsets()).ctx("uploading the chunk offsets")?;
            self.stream.synchronize().ctx("uploading the chunk offsets")?;
            offsets.insert(*plan, uploaded);
        }
        let slice = &offsets[plan];
        let (ptr, _sync) = slice.device_ptr(&self.stream);
        // SAFETY: the vector stays in `self.chunk_offsets` (never removed) for the context's
        // life, which the view's lifetime is tied to.
        Ok(Some(unsafe { SeqLensView::from_raw(ptr, slice.len()) }))
    }

    /// The device address of the own stream's scratch workspace, grown first to at least
    /// `bytes`. Growing allocates, so it must not happen during a
    /// graph capture: a warm-up call of the same shape before the capture sizes it.
    fn grow_workspace(&self, workspace: &mut Option<CudaSlice<f32>>, bytes: usize) -> Result<u64> {
        let need = bytes.div_ceil(std::mem::size_of::<f32>());
        if workspace.as_ref().is_none_or(|w| w.len() < need) {
            *workspace = None; // freed in stream order before the larger one is taken
            *workspace = Some(self.stream.alloc_zeros::<f32>(need).ctx("allocating the scratch workspace")?);
        }
        Ok(workspace.as_ref().unwrap().device_ptr(&self.stream).0)
    }

    /// Compiles (or fetches from the caches) and loads `variant`.
    pub fn load(&self, variant: &Variant) -> Result<Arc<LoadedKernel>> {
        if let Some(k) = self.loaded.lock().unwrap().get(variant) {
            return Ok(k.clone());
        }
        if variant.smem_bytes > self.info.max_smem_per_block {
            return Err(Error::Unsupported {
                kernel: variant.name(),
                msg: format!("needs {} B of shared memory, the device allows {}", variant.smem_bytes, self.info.max_smem_per_block),
            });
        }
        let source = variant.source();
        let compiled = self.jit.compile(&source, self.info.arch)?;
        let module = self.cuda.load_module(Ptx::from_binary(compiled.cubin.to_vec())).ctx(format!("loading {}", source.name))?;
        let function = module.load_function(source.entry).ctx(format!("finding {} in its module", source.entry))?;
        function
            .set_attribute(FnAttr::CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES, variant.smem_bytes as i32)
            .ctx("raising the dynamic shared memory limit")?;
        let find = |name: &str| module.load_function(name).ctx(format!("finding {name} in {}", source.name));
        let entries = variant.entries();
        let combine = entries.combine.map(find).transpose()?;
        let append = entries.append.map(find).transpose()?;
        let aux = entries.aux.iter().map(|name| find(name)).collect::<Result<Vec<_>>>()?;
        let kernel = Arc::new(LoadedKernel {
            variant: variant.clone(),
            resources: compiled.resources,
            from_cache: compiled.from_cache,
            function,
            combine,
            append,
            aux,
        });
        self.loaded.lock().unwrap().insert(variant.clone(), kernel.clone());
        Ok(kernel)
    }
}

fn device_info(cuda: &Arc<CudaContext>) -> Result<DeviceInfo> {
    let attr = |a| cuda.attribute(a).map(|v| v as u32).ctx("reading a device attribute");
    let (major, minor) = cuda.compute_capability().ctx("reading the compute capability")?;
    let mut driver_version = 0;
    // SAFETY: writes one int.
    unsafe { cudarc::driver::sys::cuDriverGetVersion(&mut driver_version) }.result().ctx("reading the driver version")?;
    Ok(DeviceInfo {
        ordinal: cuda.ordinal(),
        name: cuda.name().ctx("reading the device name")?,
        compute_capability: (major as u32, minor as u32),
        arch: Arch::for_device(major as u32, minor as u32),
        sm_count: attr(Attr::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT)?,
        memory_bytes: cuda.total_mem().ctx("reading the memory size")?,
        l2_bytes: attr(Attr::CU_DEVICE_ATTRIBUTE_L2_CACHE_SIZE)?,
        max_smem_per_block: attr(Attr::CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN)?,
        driver_version,
    })
}
