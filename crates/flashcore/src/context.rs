//! [`Context`]: one GPU, one stream, the JIT, and the loaded kernels. The public API.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use cudarc::driver::sys::{CUdevice_attribute as Attr, CUfunction_attribute as FnAttr};
use cudarc::driver::{CudaContext, CudaFunction, CudaSlice, CudaStream, DevicePtr, DevicePtrMut, LaunchConfig, PushKernelArg};
use cudarc::nvrtc::Ptx;

use crate::dispatch::{self, Plan};
use crate::error::{DriverContext, Error, Result};
use crate::external::{CurrentContextGuard, ExternalStream, StreamCounters};
use crate::jit::{Arch, DiskCache, Jit, ResourceReport};
use crate::kernels::{fwd_sm80, fwd_sm90, FwdParams, KernelFamily, Variant};
use crate::paged::{self, PagedKv};
use crate::params::{AttnParams, ProblemShape};
use crate::tensor::{DeviceTensor, TensorView, TensorViewMut};
use crate::validate;
use crate::varlen::{self, SeqLensView, VarlenBatch};

/// How the keys of one call are laid out (see [`dispatch::KeyLayout`]), with their arguments.
#[derive(Clone, Copy)]
enum Keys<'a, 'b> {
    Dense,
    Varlen(&'a VarlenBatch<'b>),
    Paged(&'a PagedKv<'b>),
}

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

/// A loaded kernel variant.
#[derive(Debug)]
pub struct LoadedKernel {
    /// The variant.
    pub variant: Variant,
    /// What ptxas reported for it.
    pub resources: ResourceReport,
    /// Whether the CUBIN came from the disk cache.
    pub from_cache: bool,
    function: CudaFunction,
    /// `fc_split_combine`, for split-KV variants.
    combine: Option<CudaFunction>,
    /// `fc_paged_append`, for paged-KV variants.
    append: Option<CudaFunction>,
    /// The module's other backward entry points (see `aux_entries`).
    aux: Vec<CudaFunction>,
}

impl LoadedKernel {
    /// The main entry point.
    pub(crate) fn function(&self) -> &CudaFunction {
        &self.function
    }

    /// The backward entry points besides the main one, in the order of `aux_entries`.
    pub(crate) fn aux(&self) -> &[CudaFunction] {
        &self.aux
    }
}

/// Entry points a family's module has besides its main one, for the backward: the
/// reference's dQ and dK/dV kernels; bwd_sm80's D_i and dQ conversion kernels.
fn aux_entries(family: KernelFamily) -> &'static [&'static str] {
    match family {
        KernelFamily::Reference => &REFERENCE_BWD_ENTRIES,
        KernelFamily::BwdSm80 => &[crate::kernels::bwd_sm80::DSUM_ENTRY, crate::kernels::bwd_sm80::DQ_ENTRY],
        KernelFamily::BwdSm90 => &[crate::kernels::bwd_sm90::PREP_ENTRY, crate::kernels::bwd_sm90::DQ_ENTRY],
        KernelFamily::FwdSm80 | KernelFamily::FwdSm90 => &[],
    }
}

/// Log-sum-exp and output of one attention call.
#[derive(Debug)]
pub struct AttnOutput {
    /// `o [B, Sq, Hq, D]` in the input dtype.
    pub o: DeviceTensor,
    /// `lse [B, Hq, Sq]`, natural log, f32.
    pub lse: CudaSlice<f32>,
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
    /// Split-KV partial results (O, then LSE), grown on demand; one launch at a time uses
    /// it, in stream order.
    split_workspace: Mutex<Option<CudaSlice<f32>>>,
    /// Tile counters of callers' streams ([`Context::attention_on_stream`]).
    stream_counters: StreamCounters,
}

/// Where one call runs: a stream, the tile counter only that stream uses, and where the
/// call's scratch memory comes from.
struct Lane<'a> {
    stream: &'a Arc<CudaStream>,
    tile_counter: u64,
    /// Returns the device address of at least the given number of bytes, 16-byte aligned,
    /// usable in the stream's order until the call returns.
    scratch: &'a mut dyn FnMut(usize) -> Result<u64>,
}

impl Context {
    /// Opens GPU `ordinal`, caching kernels in [`DiskCache::default_dir`].
    pub fn new(ordinal: usize) -> Result<Self> {
        Self::with_cache(ordinal, DiskCache::new(DiskCache::default_dir()))
    }

    /// Opens GPU `ordinal` with an explicit kernel cache.
    pub fn with_cache(ordinal: usize, cache: DiskCache) -> Result<Self> {
        // SAFETY: only probes whether libcuda can be opened.
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
            split_workspace: Mutex::new(None),
            stream_counters,
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

    /// What [`Context::attention_into`] would run for a problem of `shape` and `dtype`.
    pub fn plan(&self, shape: &ProblemShape, dtype: crate::DType, params: &AttnParams) -> Result<Plan> {
        dispatch::plan(&self.info.device(), shape, dtype, params)
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

    /// The own stream's scratch memory (split-KV partials, the backward's D_i).
    pub(crate) fn split_workspace(&self) -> &Mutex<Option<CudaSlice<f32>>> {
        &self.split_workspace
    }

    pub(crate) fn stream_counters(&self) -> &StreamCounters {
        &self.stream_counters
    }

    /// Waits for all queued work.
    pub fn synchronize(&self) -> Result<()> {
        self.stream.synchronize().ctx("synchronizing the stream")
    }

    /// Attention into fresh buffers. See [`Context::attention_into`].
    ///
    /// ```no_run
    /// # fn main() -> flashcore::Result<()> {
    /// use flashcore::{AttnParams, Context, DType, DeviceTensor};
    /// let ctx = Context::new(0)?;
    /// let shape = [2, 1024, 16, 128];
    /// let data: Vec<f32> = (0..shape.iter().product::<usize>()).map(|i| (i as f32).sin()).collect();
    /// let q = DeviceTensor::from_f32(&ctx, &data, shape, DType::BF16)?;
    /// let out = ctx.attention(q.view(), q.view(), q.view(), &AttnParams::causal())?;
    /// let o: Vec<f32> = out.o.to_f32(&ctx)?;
    /// # Ok(()) }
    /// ```
    pub fn attention(&self, q: TensorView, k: TensorView, v: TensorView, params: &AttnParams) -> Result<AttnOutput> {
        self.run_into_fresh(q, k, v, Keys::Dense, params)
    }

    /// Attention `o = softmax(scale · q kᵀ [+ mask]) v`, written into `o` (same shape and
    /// dtype as `q`) and, if given, `lse [B, Hq, Sq]` (natural log, f32).
    ///
    /// Shapes are BSHD: `q [B, Sq, Hq, D]`, `k, v [B, Sk, Hkv, D]` with `Hq % Hkv == 0`;
    /// the last dim contiguous, other strides free (multiples of 8 elements), so a
    /// PyTorch BHSD tensor works through its strides. The call is queued on the stream.
    pub fn attention_into(
        &self,
        q: TensorView,
        k: TensorView,
        v: TensorView,
        o: TensorViewMut,
        lse: Option<&mut CudaSlice<f32>>,
        params: &AttnParams,
    ) -> Result<()> {
        self.run_on_own_stream(q, k, v, o, lse, Keys::Dense, params)
    }

    /// Attention over a packed batch of sequences of their own lengths (flash_attn's
    /// `flash_attn_varlen_func`; see [`VarlenBatch`] for the layout and the caller's
    /// contract): `q [1, total_q, Hq, D]`, `k, v [1, total_k, Hkv, D]`; returns `o` like `q`
    /// and `lse [Hq, total_q]`.
    pub fn attention_varlen(
        &self,
        q: TensorView,
        k: TensorView,
        v: TensorView,
        batch: &VarlenBatch,
        params: &AttnParams,
    ) -> Result<AttnOutput> {
        self.run_into_fresh(q, k, v, Keys::Varlen(batch), params)
    }

    /// [`Context::attention_varlen`] into `o` and, if given, `lse [Hq, total_q]`.
    #[allow(clippy::too_many_arguments)]
    pub fn attention_varlen_into(
        &self,
        q: TensorView,
        k: TensorView,
        v: TensorView,
        o: TensorViewMut,
        lse: Option<&mut CudaSlice<f32>>,
        batch: &VarlenBatch,
        params: &AttnParams,
    ) -> Result<()> {
        self.run_on_own_stream(q, k, v, o, lse, Keys::Varlen(batch), params)
    }

    /// [`Context::attention_varlen`] on the caller's stream with the caller's memory, as
    /// [`Context::attention_on_stream`] (`lse`: `(address, elements)` of `[Hq, total_q]`).
    ///
    /// # Safety
    /// As [`Context::attention_on_stream`], and the views of `batch` are device memory of
    /// this device that outlives the queued work.
    #[allow(clippy::too_many_arguments)]
    pub unsafe fn attention_varlen_on_stream(
        &self,
        stream: ExternalStream,
        q: TensorView,
        k: TensorView,
        v: TensorView,
        o: TensorViewMut,
        lse: Option<(u64, usize)>,
        scratch: &mut dyn FnMut(usize) -> Result<u64>,
        batch: &VarlenBatch,
        params: &AttnParams,
    ) -> Result<()> {
        // SAFETY: the caller's contract is this function's (see `run_on_external_stream`).
        unsafe { self.run_on_external_stream(stream, q, k, v, o, lse, scratch, Keys::Varlen(batch), params) }
    }

    /// Checks a packed batch's device values against [`VarlenBatch`]'s contract for
    /// `total_q` query rows and `total_k` keys: copies them to the host, so it waits for
    /// this context's stream (a debugging aid, and what the CLI runs on every call).
    pub fn check_varlen(&self, batch: &VarlenBatch, total_q: usize, total_k: usize) -> Result<()> {
        let read = |v: &SeqLensView| -> Result<Vec<i32>> {
            let mut host = vec![0i32; v.len];
            // SAFETY: `v` is `len` int32 values of device memory (its constructor's contract).
            unsafe { cudarc::driver::result::memcpy_dtoh_sync(&mut host, v.ptr) }.ctx("reading a cu_seqlens vector")?;
            Ok(host)
        };
        self.synchronize()?;
        let _bind = CurrentContextGuard::bind(&self.cuda)?;
        let (cu_q, cu_k) = (read(&batch.cu_seqlens_q)?, read(&batch.cu_seqlens_k)?);
        let used = batch.seqused_k.as_ref().map(read).transpose()?;
        let maxima = (batch.max_seqlen_q, batch.max_seqlen_k);
        varlen::check_values(&cu_q, &cu_k, used.as_deref(), (total_q, total_k), maxima)
    }

    /// Attention on `stream`, a stream of the caller's (PyTorch's current stream, say), with
    /// the caller's memory: the call allocates nothing, does not synchronise, and takes the
    /// scratch memory it needs (split-KV partials, `[splits, B, Hq, Sq, D + 1]` f32) from
    /// `scratch`, which is called at most once with a byte count and returns the device
    /// address of at least that many bytes, 16-byte aligned. `lse` is `(address, elements)`
    /// of an f32 buffer `[B, Hq, Sq]`. Otherwise as [`Context::attention_into`].
    ///
    /// The calling thread's current CUDA context is left as it was.
    ///
    /// # Safety
    /// - `stream` is a live stream of this device's primary context, and stays live until the
    ///   queued work is done.
    /// - Every pointer (the views, `lse`, what `scratch` returns) is device memory of this
    ///   device, of the extent its layout describes, that is not freed or reused before the
    ///   work queued on `stream` is done.
    /// - Concurrent launches on two streams never share one stream handle (each stream's
    ///   tile counter is its own; a CUDA graph captured on a stream uses that stream's).
    #[allow(clippy::too_many_arguments)]
    pub unsafe fn attention_on_stream(
        &self,
        stream: ExternalStream,
        q: TensorView,
        k: TensorView,
        v: TensorView,
        o: TensorViewMut,
        lse: Option<(u64, usize)>,
        scratch: &mut dyn FnMut(usize) -> Result<u64>,
        params: &AttnParams,
    ) -> Result<()> {
        // SAFETY: the caller's contract is this function's (see `run_on_external_stream`).
        unsafe { self.run_on_external_stream(stream, q, k, v, o, lse, scratch, Keys::Dense, params) }
    }

    /// Attention over a KV cache (flash_attn's `flash_attn_with_kvcache`; see [`PagedKv`] for
    /// the layouts and the caller's contract): `q [B, Sq, Hq, D]`, `k_cache`, `v_cache` the
    /// pools `[num_pages, page_size, Hkv, D]` (with a block table) or `[B, S_cache, Hkv, D]`;
    /// `kv.k_new`, `kv.v_new` are appended first. Returns `o` like `q` and `lse [B, Hq, Sq]`.
    pub fn attention_paged(
        &self,
        q: TensorView,
        k_cache: TensorView,
        v_cache: TensorView,
        kv: &PagedKv,
        params: &AttnParams,
    ) -> Result<AttnOutput> {
        self.run_into_fresh(q, k_cache, v_cache, Keys::Paged(kv), params)
    }

    /// [`Context::attention_paged`] into `o` and, if given, `lse [B, Hq, Sq]`.
    #[allow(clippy::too_many_arguments)]
    pub fn attention_paged_into(
        &self,
        q: TensorView,
        k_cache: TensorView,
        v_cache: TensorView,
        o: TensorViewMut,
        lse: Option<&mut CudaSlice<f32>>,
        kv: &PagedKv,
        params: &AttnParams,
    ) -> Result<()> {
        self.run_on_own_stream(q, k_cache, v_cache, o, lse, Keys::Paged(kv), params)
    }

    /// [`Context::attention_paged`] on the caller's stream with the caller's memory, as
    /// [`Context::attention_on_stream`].
    ///
    /// # Safety
    /// As [`Context::attention_on_stream`], and `kv`'s views are device memory of this
    /// device that outlives the queued work.
    #[allow(clippy::too_many_arguments)]
    pub unsafe fn attention_paged_on_stream(
        &self,
        stream: ExternalStream,
        q: TensorView,
        k_cache: TensorView,
        v_cache: TensorView,
        o: TensorViewMut,
        lse: Option<(u64, usize)>,
        scratch: &mut dyn FnMut(usize) -> Result<u64>,
        kv: &PagedKv,
        params: &AttnParams,
    ) -> Result<()> {
        // SAFETY: the caller's contract is this function's (see `run_on_external_stream`).
        unsafe { self.run_on_external_stream(stream, q, k_cache, v_cache, o, lse, scratch, Keys::Paged(kv), params) }
    }

    /// Checks a cache's device values (the block table's used entries, `cache_seqlens`)
    /// against [`PagedKv`]'s contract for these caches (the host-visible arguments first, as
    /// [`Context::attention_paged`] would): copies them to the host, so it waits for this
    /// context's stream (a debugging aid; `flashcore check` runs it on every paged case). The error names the
    /// first bad entry.
    pub fn check_paged(&self, q: TensorView, k_cache: TensorView, v_cache: TensorView, kv: &PagedKv) -> Result<()> {
        let g = kv.validate(&q, &k_cache, &v_cache, &q, self.ordinal())?;
        self.synchronize()?;
        let _bind = CurrentContextGuard::bind(&self.cuda)?;
        let read = |ptr: u64, len: usize, what: &str| -> Result<Vec<i32>> {
            let mut host = vec![0i32; len];
            // SAFETY: `ptr` is `len` int32 values of device memory (the views' contracts).
            unsafe { cudarc::driver::result::memcpy_dtoh_sync(&mut host, ptr) }.ctx(format!("reading {what}"))?;
            Ok(host)
        };
        let lens = kv.cache_seqlens.map(|l| read(l.ptr, l.len, "cache_seqlens")).transpose()?;
        let table = match kv.block_table {
            Some(t) => {
                let span = (t.batch - 1) * t.row_stride + t.max_pages;
                let all = read(t.ptr, span, "the block table")?;
                Some((0..t.batch).flat_map(|b| all[b * t.row_stride..b * t.row_stride + t.max_pages].to_vec()).collect::<Vec<i32>>())
            }
            None => None,
        };
        let pool = if g.page_size > 0 { (g.page_size, g.num_pages) } else { (g.shape.seqlen_k, 0) };
        paged::check_values(table.as_deref(), lens.as_deref(), pool, (g.shape.batch, g.shape.seqlen_k), g.new_keys)
    }

    /// `run_on_own_stream` into a fresh `o` (zeros like `q`) and `lse` (`[B, Hq, Sq]`; packed,
    /// `[Hq, total_q]`: the same count, as `q` is `[1, total_q, Hq, D]`), returned.
    fn run_into_fresh(&self, q: TensorView, k: TensorView, v: TensorView, keys: Keys, params: &AttnParams) -> Result<AttnOutput> {
        let mut o = DeviceTensor::filled(self, 0, q.layout.shape, q.layout.dtype)?;
        let [b, sq, hq, _] = q.layout.shape;
        let mut lse = self.stream.alloc_zeros::<f32>((b * hq * sq).max(1)).ctx("allocating lse")?;
        self.run_on_own_stream(q, k, v, o.view_mut(), Some(&mut lse), keys, params)?;
        Ok(AttnOutput { o, lse })
    }

    /// `run` on this context's stream, the split-KV scratch from the context's workspace
    /// (the `_into` entry points).
    #[allow(clippy::too_many_arguments)]
    fn run_on_own_stream(
        &self,
        q: TensorView,
        k: TensorView,
        v: TensorView,
        o: TensorViewMut,
        lse: Option<&mut CudaSlice<f32>>,
        keys: Keys,
        params: &AttnParams,
    ) -> Result<()> {
        let lse = lse.map(|buf| {
            let len = buf.len();
            (buf.device_ptr_mut(&self.stream).0, len)
        });
        let (tile_counter, _sync) = self.tile_counter.device_ptr(&self.stream);
        let mut workspace = self.split_workspace.lock().unwrap();
        let mut scratch = |bytes| self.grow_workspace(&mut workspace, bytes);
        let mut lane = Lane { stream: &self.stream, tile_counter, scratch: &mut scratch };
        self.run(&mut lane, q, k, v, o, lse, keys, params)
    }

    /// `run` on the caller's stream with the caller's scratch (the `_on_stream` entry points),
    /// the calling thread's current context restored afterwards.
    ///
    /// # Safety
    /// As [`Context::attention_on_stream`] (and the batch's or cache's views are device memory
    /// of this device that outlives the queued work).
    #[allow(clippy::too_many_arguments)]
    unsafe fn run_on_external_stream(
        &self,
        stream: ExternalStream,
        q: TensorView,
        k: TensorView,
        v: TensorView,
        o: TensorViewMut,
        lse: Option<(u64, usize)>,
        scratch: &mut dyn FnMut(usize) -> Result<u64>,
        keys: Keys,
        params: &AttnParams,
    ) -> Result<()> {
        let _restore = CurrentContextGuard::bind(&self.cuda)?;
        let tile_counter = self.stream_counters.counter_for(stream, &self.cuda)?;
        let borrowed = self.cuda.wrap_borrowed_stream(stream.raw());
        let mut lane = Lane { stream: &borrowed, tile_counter, scratch };
        self.run(&mut lane, q, k, v, o, lse, keys, params)
    }

    #[allow(clippy::too_many_arguments)]
    fn run(
        &self,
        lane: &mut Lane,
        q: TensorView,
        k: TensorView,
        v: TensorView,
        o: TensorViewMut,
        lse: Option<(u64, usize)>,
        keys: Keys,
        params: &AttnParams,
    ) -> Result<()> {
        let varlen = match keys {
            Keys::Varlen(batch) => Some(batch),
            _ => None,
        };
        let paged = match keys {
            Keys::Paged(kv) => Some((kv, kv.validate(&q, &k, &v, &o.as_view(), self.ordinal())?)),
            _ => None,
        };
        let (tensors, shape) = match (keys, &paged) {
            (Keys::Paged(_), Some((_, g))) => (g.shape, g.shape),
            (Keys::Varlen(batch), _) => {
                let tensors = validate::problem(&q, &k, &v, &o.as_view(), self.ordinal())?;
                batch.validate(&tensors)?;
                (tensors, batch.kernel_shape(&tensors))
            }
            _ => {
                let tensors = validate::problem(&q, &k, &v, &o.as_view(), self.ordinal())?;
                (tensors, tensors)
            }
        };
        let scale = params.scale_for(shape.head_dim);
        params.check(shape.head_dim)?;
        let lse_ptr = match lse {
            Some((ptr, len)) => {
                // Packed, [Hq, total_q]: the shape of one sequence of all the rows.
                validate::lse(len, if varlen.is_some() { &tensors } else { &shape })?;
                validate::lse_alignment(ptr)?;
                ptr
            }
            None => 0,
        };
        if shape.seqlen_q == 0 {
            return Ok(()); // packed, every sequence empty: nothing to write
        }
        let layout = match (&paged, varlen) {
            (Some((_, g)), _) => dispatch::KeyLayout::Paged { page_size: g.page_size },
            (None, Some(_)) => dispatch::KeyLayout::Varlen { total_k: tensors.seqlen_k },
            (None, None) => dispatch::KeyLayout::Dense,
        };
        let plan = dispatch::plan_for(&self.info.device(), &shape, q.layout.dtype, params, layout)?;
        let kernel = self.load(&plan.variant)?;
        let o = o.as_view();
        let pack = |t: &TensorView<'_>| if plan.packed_gqa { t.layout.gqa_packed(shape.heads_kv) } else { t.layout };
        // A packed batch's tokens step by the tensors' own token stride (packed GQA or not).
        let (q_stride_token, o_stride_token) = (q.layout.strides[1] as i64, o.layout.strides[1] as i64);
        let (q, o): (TensorView, TensorView) = (q.with_layout(pack(&q)), o.with_layout(pack(&o)));
        let shape = plan.shape;
        // The window the kernels see: causal folded in (see AttnParams::mask); the reference
        // kernel reads p.causal besides.
        let window = params.mask().1.unwrap_or(crate::Window::UNBOUNDED);
        // Packed, the sequences' rows are found from cu_seqlens, not from a batch stride; paged,
        // the keys' from the block table.
        let batch_stride = |keys_of_a_table: bool| if varlen.is_some() || keys_of_a_table { 0 } else { 1 };
        let strided =
            |t: &TensorView, table: bool| [0, 1, 2].map(|i| t.layout.strides[i] as i64 * if i == 0 { batch_stride(table) } else { 1 });
        let stride = |t: &TensorView| strided(t, false);
        let pooled = paged.as_ref().is_some_and(|(kv, _)| kv.block_table.is_some());
        let mut p = FwdParams {
            q: q.ptr,
            k: k.ptr,
            v: v.ptr,
            o: o.ptr,
            lse: lse_ptr,
            q_strides: stride(&q),
            k_strides: strided(&k, pooled),
            v_strides: strided(&v, pooled),
            o_strides: stride(&o),
            batch: shape.batch as i32,
            seqlen_q: shape.seqlen_q as i32,
            seqlen_k: shape.seqlen_k as i32,
            heads_q: shape.heads_q as i32,
            heads_kv: shape.heads_kv as i32,
            head_dim: shape.head_dim as i32,
            softmax_scale: scale,
            // Not 0 for a zero scale: the kernels multiply masked (−inf) scores by it, and
            // −inf·0 is NaN. The smallest normal float gives the same softmax (2^(s·c) = 1
            // for every visible key) and keeps −inf·c = −inf. Softcapped scores come out
            // of the tanh already scaled.
            softmax_scale_log2: if params.has_softcap() {
                std::f32::consts::LOG2_E
            } else {
                (scale * std::f32::consts::LOG2_E).max(f32::MIN_POSITIVE)
            },
            causal: i32::from(params.mask().0),
            tile_section: 0,
            o_accum: 0,
            lse_accum: 0,
            num_splits: plan.splits as i32,
            split_tiles: plan.split_tiles as i32,
            window_left: window.left,
            window_right: window.right,
            softcap: params.softcap,
            softcap_scale: if params.has_softcap() { scale / params.softcap } else { 0.0 },
            cu_seqlens_q: varlen.map_or(0, |b| b.cu_seqlens_q.ptr),
            cu_seqlens_k: varlen.map_or(0, |b| b.cu_seqlens_k.ptr),
            seqused_k: varlen.and_then(|b| b.seqused_k.as_ref()).map_or(0, |u| u.ptr),
            total_q: tensors.seqlen_q as i32,
            total_k: tensors.seqlen_k as i32,
            gqa_packed: i32::from(plan.packed_gqa && varlen.is_some()),
            q_stride_token,
            o_stride_token,
            ..FwdParams::default()
        };
        p.tile_section = crate::kernels::section_heads(&p);
        if let Some((kv, g)) = &paged {
            p.seqused_k = kv.cache_seqlens.map_or(0, |l| l.ptr);
            if let Some(table) = &kv.block_table {
                p.block_table = table.ptr;
                p.block_table_stride = table.row_stride as i64;
                p.max_pages = table.max_pages as i32;
            }
            (p.page_size, p.num_pages, p.page_rows) = (g.page_size as i32, g.num_pages as i32, g.page_rows as i32);
            if g.page_size > 0 {
                p.page_box_rows = fwd_sm90::page_box_rows(g.page_size as u32, plan.variant.tile.block_n) as i32;
            }
            p.new_keys = g.new_keys as i32;
            if let (Some(kn), Some(vn)) = (&kv.k_new, &kv.v_new) {
                (p.k_new, p.v_new) = (kn.ptr, vn.ptr);
                (p.k_new_strides, p.v_new_strides) = (strided(kn, false), strided(vn, false));
                self.launch_append(lane.stream, &kernel, &p)?;
            }
        }
        // The paged split tiles share key tiles out by chunks of the whole batch's
        // (fwd_sm80::chunked_partial_rows): a sequence may span chunks at any split count.
        let chunked = plan.variant.family == KernelFamily::FwdSm80 && plan.variant.paged && plan.variant.split_kv;
        if plan.splits > 1 || chunked {
            let rows = if chunked {
                fwd_sm80::chunked_partial_rows(&shape, plan.variant.tile, plan.splits)
            } else {
                plan.splits * shape.batch * shape.heads_q * shape.seqlen_q
            };
            let o_bytes = rows * shape.head_dim * std::mem::size_of::<f32>();
            let base = (lane.scratch)(o_bytes + rows * std::mem::size_of::<f32>())?;
            validate::scratch_alignment(base)?;
            p.o_accum = base;
            p.lse_accum = base + o_bytes as u64;
            self.launch(lane, &kernel, &plan, &p, [&q, &k, &v, &o])?;
            return self.launch_combine(lane.stream, &kernel, &p);
        }
        self.launch(lane, &kernel, &plan, &p, [&q, &k, &v, &o])
    }

    /// The device address of the own stream's split-KV workspace (partial O then LSE, f32),
    /// grown first to at least `bytes`. Growing allocates, so it must not happen during a
    /// graph capture: a warm-up call of the same shape before the capture sizes it.
    pub(crate) fn grow_workspace(&self, workspace: &mut Option<CudaSlice<f32>>, bytes: usize) -> Result<u64> {
        let need = bytes.div_ceil(std::mem::size_of::<f32>());
        if workspace.as_ref().map_or(true, |w| w.len() < need) {
            *workspace = None; // freed in stream order before the larger one is taken
            *workspace = Some(self.stream.alloc_zeros::<f32>(need).ctx("allocating the split-KV workspace")?);
        }
        Ok(workspace.as_ref().unwrap().device_ptr(&self.stream).0)
    }

    fn launch(&self, lane: &Lane, kernel: &LoadedKernel, plan: &Plan, p: &FwdParams, qkvo: [&TensorView; 4]) -> Result<()> {
        let (grid, threads) = kernel.variant.grid(&plan.shape, self.info.sm_count, plan.splits as u32);
        let cfg = LaunchConfig { grid_dim: grid, block_dim: (threads, 1, 1), shared_mem_bytes: kernel.variant.smem_bytes };
        if kernel.variant.family == KernelFamily::FwdSm90 {
            return fwd_sm90::launch(lane.stream, &kernel.function, cfg, &kernel.variant, p, qkvo, lane.tile_counter);
        }
        if p.new_keys > 0 && self.info.arch.major >= 9 {
            // After fc_paged_append, which lets it launch early; it waits for the keys itself.
            return launch_dependent(lane.stream, &kernel.function, (grid, (threads, 1, 1), cfg.shared_mem_bytes), p)
                .ctx(format!("launching {}", kernel.variant.name()));
        }
        // SAFETY: `p` matches the kernel's `FwdParams` ABI and its pointers were validated.
        unsafe { lane.stream.launch_builder(&kernel.function).arg(p).launch(cfg) }.ctx(format!("launching {}", kernel.variant.name()))?;
        Ok(())
    }

    /// The paged pre-pass: `k_new`, `v_new` into the caches, one 16-byte chunk a thread.
    fn launch_append(&self, stream: &CudaStream, kernel: &LoadedKernel, p: &FwdParams) -> Result<()> {
        let append = kernel
            .append
            .as_ref()
            .ok_or_else(|| Error::Unsupported { kernel: kernel.variant.name(), msg: "has no paged append entry".into() })?;
        let chunks = p.batch as u64 * p.new_keys as u64 * p.heads_kv as u64 * (p.head_dim as u64 / 8);
        let blocks = u32::try_from(chunks.div_ceil(128))
            .map_err(|_| Error::Param { arg: "k_new", msg: format!("{chunks} chunks overflow the append grid") })?;
        let cfg = LaunchConfig { grid_dim: (blocks, 1, 1), block_dim: (128, 1, 1), shared_mem_bytes: 0 };
        // SAFETY: `fc_paged_append(FwdParams)`; k_new, v_new and the caches were validated.
        unsafe { stream.launch_builder(append).arg(p).launch(cfg) }.ctx(format!("launching the append of {}", kernel.variant.name()))?;
        Ok(())
    }

    /// The split-KV merge: one warp per (batch, head, query) row, four rows a block. On
    /// sm_90+ it is launched as a programmatic dependent of the split kernel, so its launch
    /// overlaps the split kernel's last CTAs (it waits for their partials itself).
    fn launch_combine(&self, stream: &CudaStream, kernel: &LoadedKernel, p: &FwdParams) -> Result<()> {
        let combine = kernel
            .combine
            .as_ref()
            .ok_or_else(|| Error::Unsupported { kernel: kernel.variant.name(), msg: "has no split-KV combine entry".into() })?;
        let rows = p.batch as u64 * p.heads_q as u64 * p.seqlen_q as u64;
        let blocks = u32::try_from(rows.div_ceil(4)).map_err(|_| Error::Unsupported {
            kernel: kernel.variant.name(),
            msg: format!("{rows} query rows overflow the combine grid"),
        })?;
        let what = || format!("launching the combine of {}", kernel.variant.name());
        if self.info.arch.major >= 9 {
            return launch_dependent(stream, combine, ((blocks, 1, 1), (128, 1, 1), 0), p).ctx(what());
        }
        let cfg = LaunchConfig { grid_dim: (blocks, 1, 1), block_dim: (128, 1, 1), shared_mem_bytes: 0 };
        // SAFETY: `fc_split_combine(FwdParams)`; the partials were written by the launch before it.
        unsafe { stream.launch_builder(combine).arg(p).launch(cfg) }.ctx(what())?;
        Ok(())
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
        let combine = match variant.split_kv {
            true => Some(module.load_function(SPLIT_COMBINE_ENTRY).ctx(format!("finding {SPLIT_COMBINE_ENTRY} in {}", source.name))?),
            false => None,
        };
        let append = match variant.paged {
            true => Some(module.load_function(PAGED_APPEND_ENTRY).ctx(format!("finding {PAGED_APPEND_ENTRY} in {}", source.name))?),
            false => None,
        };
        let aux = aux_entries(variant.family)
            .iter()
            .map(|name| module.load_function(name).ctx(format!("finding {name} in {}", source.name)))
            .collect::<Result<Vec<_>>>()?;
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

/// Launches `function(p)` on `stream` with programmatic stream serialization (sm_90+): it
/// may start before the previous kernel on the stream ends, and must wait for it itself
/// (`griddepcontrol.wait`). `(grid, block, dynamic shared memory bytes)`.
#[allow(clippy::type_complexity)]
fn launch_dependent(
    stream: &CudaStream,
    function: &CudaFunction,
    (grid, block, smem): ((u32, u32, u32), (u32, u32, u32), u32),
    p: &FwdParams,
) -> std::result::Result<(), cudarc::driver::DriverError> {
    use cudarc::driver::sys;
    // SAFETY: a plain C struct (an id and a union of plain values); all zeros is valid.
    let mut attr: sys::CUlaunchAttribute = unsafe { std::mem::zeroed() };
    attr.id = sys::CUlaunchAttributeID::CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION;
    attr.value.programmaticStreamSerializationAllowed = 1;
    let config = sys::CUlaunchConfig {
        gridDimX: grid.0,
        gridDimY: grid.1,
        gridDimZ: grid.2,
        blockDimX: block.0,
        blockDimY: block.1,
        blockDimZ: block.2,
        sharedMemBytes: smem,
        hStream: stream.cu_stream(),
        attrs: &mut attr,
        numAttrs: 1,
    };
    let mut args = [p as *const FwdParams as *mut std::ffi::c_void];
    // SAFETY: `function` takes one `FwdParams` by value; `args` points at it for the call's
    // duration; `config` and `attr` outlive the call.
    unsafe { sys::cuLaunchKernelEx(&config, function.cu_function(), args.as_mut_ptr(), std::ptr::null_mut()) }.result()
}

/// The split-KV merge entry point in a split variant's module.
const SPLIT_COMBINE_ENTRY: &str = "fc_split_combine";

/// The pre-pass that appends new keys to a cache, in a paged variant's module.
const PAGED_APPEND_ENTRY: &str = "fc_paged_append";

/// The backward entry points in the reference kernel's module, in launch order.
const REFERENCE_BWD_ENTRIES: [&str; 2] = ["fc_reference_bwd_dq", "fc_reference_bwd_dkv"];

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
