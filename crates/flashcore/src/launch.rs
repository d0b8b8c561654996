//! Launch: every kernel launch of a call, in stream order. The one place that builds a
//! `LaunchConfig` or a `CUlaunchConfig`, launches with programmatic dependent launch (PDL),
//! encodes TMA tensor maps, takes scratch memory and zeroes it: the forward (the paged append
//! pre-pass, the main kernel, the split-KV combine) and the backward (each family's sequence
//! of kernels).

use std::ffi::c_void;
use std::sync::Arc;

use cudarc::driver::sys::{
    self, CUtensorMap, CUtensorMapDataType as DataType, CUtensorMapFloatOOBfill as OobFill, CUtensorMapInterleave as Interleave,
    CUtensorMapL2promotion as L2Promotion, CUtensorMapSwizzle as Swizzle,
};
use cudarc::driver::{CudaFunction, CudaStream, DeviceRepr, LaunchConfig, PushKernelArg};

use crate::dispatch::{BwdPlan, Plan};
use crate::error::{DriverContext, Error, Result};
use crate::jit::{Arch, ResourceReport};
use crate::kernels::{bwd_sm90, fwd_sm90, KernelFamily, Variant};
use crate::pack::{BwdParams, FwdCall, FwdParams};
use crate::shape::ProblemShape;
use crate::tensor::{DType, TensorView};
use crate::validate;

/// Where one call runs: a stream, the fwd_sm90 tile counter only that stream uses, and where
/// the call's scratch memory comes from.
pub(crate) struct Lane<'a> {
    pub stream: &'a Arc<CudaStream>,
    pub tile_counter: u64,
    /// Returns the device address of at least the given number of bytes, 16-byte aligned,
    /// usable in the stream's order until the call returns.
    pub scratch: &'a mut dyn FnMut(usize) -> Result<u64>,
}

impl Lane<'_> {
    /// `bytes` of scratch memory, checked for the kernels' alignment.
    fn take_scratch(&mut self, bytes: usize) -> Result<u64> {
        let base = (self.scratch)(bytes)?;
        validate::scratch_alignment(base)?;
        Ok(base)
    }
}

/// A loaded kernel variant: its module's entry points.
#[derive(Debug)]
pub struct LoadedKernel {
    /// The variant.
    pub variant: Variant,
    /// What ptxas reported for it.
    pub resources: ResourceReport,
    /// Whether the CUBIN came from the disk cache.
    pub from_cache: bool,
    pub(crate) function: CudaFunction,
    /// `fc_split_combine`, for split-KV variants.
    pub(crate) combine: Option<CudaFunction>,
    /// `fc_paged_append`, for paged-KV variants.
    pub(crate) append: Option<CudaFunction>,
    /// The module's other backward entry points (see `Variant::aux_entries`).
    pub(crate) aux: Vec<CudaFunction>,
}

/// One launch: the function, its grid, block and dynamic shared memory, and whether it is a
/// programmatic dependent of the launch before it on the stream (sm_90+: it may start before
/// that one ends, and waits for it itself with `griddepcontrol.wait`).
struct Launch<'a> {
    function: &'a CudaFunction,
    grid: (u32, u32, u32),
    block: u32,
    smem: u32,
    dependent: bool,
}

impl Launch<'_> {
    fn config(&self) -> LaunchConfig {
        LaunchConfig { grid_dim: self.grid, block_dim: (self.block, 1, 1), shared_mem_bytes: self.smem }
    }

    fn is_empty(&self) -> bool {
        self.grid.0 == 0 || self.grid.1 == 0 || self.grid.2 == 0
    }

    /// Launches with `args`, the kernel's parameters in order.
    ///
    /// # Safety
    /// `args` are the kernel's parameters, of its types, and every pointer among them is
    /// device memory the kernel may use in stream order.
    unsafe fn run(&self, stream: &CudaStream, args: &[Arg], what: impl FnOnce() -> String) -> Result<()> {
        if !self.dependent {
            let mut builder = stream.launch_builder(self.function);
            for arg in args {
                match arg {
                    Arg::Fwd(p) => builder.arg(*p),
                    Arg::Bwd(p) => builder.arg(*p),
                    Arg::Map(m) => builder.arg(*m),
                    Arg::Schedule(s) => builder.arg(*s),
                };
            }
            // SAFETY: this function's contract.
            return unsafe { builder.launch(self.config()) }.map(|_| ()).ctx(what());
        }
        // SAFETY: a plain C struct (an id and a union of plain values); all zeros is valid.
        let mut attr: sys::CUlaunchAttribute = unsafe { std::mem::zeroed() };
        attr.id = sys::CUlaunchAttributeID::CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION;
        attr.value.programmaticStreamSerializationAllowed = 1;
        let config = sys::CUlaunchConfig {
            gridDimX: self.grid.0,
            gridDimY: self.grid.1,
            gridDimZ: self.grid.2,
            blockDimX: self.block,
            blockDimY: 1,
            blockDimZ: 1,
            sharedMemBytes: self.smem,
            hStream: stream.cu_stream(),
            attrs: &mut attr,
            numAttrs: 1,
        };
        let mut pointers: Vec<*mut c_void> = args.iter().map(Arg::pointer).collect();
        // SAFETY: `pointers` point at the kernel's parameters (this function's contract) for
        // the call's duration; `config` and `attr` outlive the call.
        unsafe { sys::cuLaunchKernelEx(&config, self.function.cu_function(), pointers.as_mut_ptr(), std::ptr::null_mut()) }
            .result()
            .ctx(what())
    }
}

/// One kernel parameter, of the types the kernels take.
enum Arg<'a> {
    Fwd(&'a FwdParams),
    Bwd(&'a BwdParams),
    Map(&'a TensorMap),
    Schedule(&'a TileSchedule),
}

impl Arg<'_> {
    /// The parameter's address, as the driver takes it.
    fn pointer(&self) -> *mut c_void {
        fn at<T>(x: &T) -> *mut c_void {
            (x as *const T).cast::<c_void>().cast_mut()
        }
        match self {
            Arg::Fwd(p) => at(*p),
            Arg::Bwd(p) => at(*p),
            Arg::Map(m) => at(*m),
            Arg::Schedule(s) => at(*s),
        }
    }
}

/// The forward of `call`: the paged append pre-pass when it has new keys, the main kernel
/// (into the split-KV partials when the plan splits), then the combine. On sm_90+ the main
/// kernel after an append, and the combine, are programmatic dependents of the launch before
/// them, so their launches overlap its last CTAs.
pub(crate) fn forward(lane: &mut Lane, kernel: &LoadedKernel, plan: &Plan, mut call: FwdCall, sm_count: u32, arch: Arch) -> Result<()> {
    let pdl = arch.major >= 9;
    if call.append {
        append(lane.stream, kernel, &call.params)?;
    }
    if let Some(split) = call.split_scratch {
        let base = lane.take_scratch(split.total_bytes)?;
        call.params.o_accum = base;
        call.params.lse_accum = base + split.o_bytes as u64;
    }
    let p = &call.params;
    let (grid, threads) = kernel.variant.grid(&plan.shape, sm_count, plan.splits as u32);
    let main =
        Launch { function: &kernel.function, grid, block: threads, smem: kernel.variant.smem_bytes, dependent: pdl && p.new_keys > 0 };
    let what = || format!("launching {}", kernel.variant.name());
    if kernel.variant.family == KernelFamily::FwdSm90 {
        fwd_sm90_main(lane, &main, &kernel.variant, p, &call.views, &plan.shape)?;
    } else {
        // SAFETY: `p` matches the kernel's `FwdParams` ABI and its pointers were validated.
        unsafe { main.run(lane.stream, &[Arg::Fwd(p)], what)? };
    }
    if call.split_scratch.is_some() {
        combine(lane.stream, kernel, p, pdl)?;
    }
    Ok(())
}

/// fwd_sm90's launch: the tensor maps (Q, K, V loads; O stores) and the tile schedule beside
/// the parameters. Paged with a block table, K and V are the page pools, whose maps take boxes
/// of [`fwd_sm90::page_box_rows`]; after an append pre-pass it waits for the keys itself.
fn fwd_sm90_main(
    lane: &Lane,
    main: &Launch,
    variant: &Variant,
    p: &FwdParams,
    [q, k, v, o]: &[TensorView; 4],
    shape: &ProblemShape,
) -> Result<()> {
    let kv_rows = if variant.paged && p.block_table != 0 { p.page_box_rows as u32 } else { variant.tile.block_n };
    let maps =
        [tensor_map(q, variant.tile.block_m)?, tensor_map(k, kv_rows)?, tensor_map(v, kv_rows)?, tensor_map(o, fwd_sm90::WARPGROUP_ROWS)?];
    let section = fwd_sm90::section_heads(p.tile_section, shape, variant.tile.block_m, main.grid.0);
    let schedule = TileSchedule { counter: lane.tile_counter, section, _pad: 0 };
    let [tq, tk, tv, to] = &maps;
    // SAFETY: the arguments match `fc_fwd_sm90(FwdParams, CUtensorMap x4, TileSchedule)`.
    unsafe {
        main.run(lane.stream, &[Arg::Fwd(p), Arg::Map(tq), Arg::Map(tk), Arg::Map(tv), Arg::Map(to), Arg::Schedule(&schedule)], || {
            format!("launching {}", variant.name())
        })
    }
}

/// The paged pre-pass: `k_new`, `v_new` into the caches, one 16-byte chunk a thread.
fn append(stream: &CudaStream, kernel: &LoadedKernel, p: &FwdParams) -> Result<()> {
    let function = kernel
        .append
        .as_ref()
        .ok_or_else(|| Error::Unsupported { kernel: kernel.variant.name(), msg: "has no paged append entry".into() })?;
    let a = &p.problem;
    let chunks = a.batch as u64 * p.new_keys as u64 * a.heads_kv as u64 * (a.head_dim as u64 / 8);
    let blocks = u32::try_from(chunks.div_ceil(128))
        .map_err(|_| Error::Param { arg: "k_new", msg: format!("{chunks} chunks overflow the append grid") })?;
    let launch = Launch { function, grid: (blocks, 1, 1), block: 128, smem: 0, dependent: false };
    // SAFETY: `fc_paged_append(FwdParams)`; k_new, v_new and the caches were validated.
    unsafe { launch.run(stream, &[Arg::Fwd(p)], || format!("launching the append of {}", kernel.variant.name())) }
}

/// The split-KV merge: one warp per (batch, head, query) row, four rows a block; on sm_90+ a
/// programmatic dependent of the split kernel (it waits for the partials itself).
fn combine(stream: &CudaStream, kernel: &LoadedKernel, p: &FwdParams, pdl: bool) -> Result<()> {
    let function = kernel
        .combine
        .as_ref()
        .ok_or_else(|| Error::Unsupported { kernel: kernel.variant.name(), msg: "has no split-KV combine entry".into() })?;
    let a = &p.problem;
    let rows = a.batch as u64 * a.heads_q as u64 * a.seqlen_q as u64;
    let blocks = u32::try_from(rows.div_ceil(4))
        .map_err(|_| Error::Unsupported { kernel: kernel.variant.name(), msg: format!("{rows} query rows overflow the combine grid") })?;
    let launch = Launch { function, grid: (blocks, 1, 1), block: 128, smem: 0, dependent: pdl };
    // SAFETY: `fc_split_combine(FwdParams)`; the partials were written by the launch before it.
    unsafe { launch.run(stream, &[Arg::Fwd(p)], || format!("launching the combine of {}", kernel.variant.name())) }
}

/// fwd_sm90's `TileSchedule` parameter.
#[repr(C)]
#[derive(Clone, Copy)]
struct TileSchedule {
    /// Two `u32`, zero between launches (the kernel's last CTA re-zeroes them).
    counter: u64,
    section: i32,
    _pad: i32,
}

// SAFETY: plain old data matching the kernel's struct.
unsafe impl DeviceRepr for TileSchedule {}

/// A `CUtensorMap` passed by value as a `__grid_constant__` kernel parameter.
#[repr(transparent)]
#[derive(Clone, Copy)]
struct TensorMap(CUtensorMap);

// SAFETY: an opaque 128-byte POD the driver filled in.
unsafe impl DeviceRepr for TensorMap {}

/// A 4-D tensor map over a BSHD view, dims innermost first `{D, S, H, B}`, with a box of
/// `{64, rows, 1, 1}` and 128-byte swizzle; rows past S read as zeros.
fn tensor_map(t: &TensorView, rows: u32) -> Result<TensorMap> {
    let l = t.layout;
    let elem = l.dtype.size_bytes() as u64;
    let dims = [l.shape[3], l.shape[1], l.shape[2], l.shape[0]].map(|d| d as u64);
    let strides = [l.strides[1], l.strides[2], l.strides[0]].map(|s| s as u64 * elem);
    let boxes = [fwd_sm90::SWIZZLE_ROW_ELEMS, rows, 1, 1];
    let elem_strides = [1u32; 4];
    let dtype = match l.dtype {
        DType::F16 => DataType::CU_TENSOR_MAP_DATA_TYPE_FLOAT16,
        DType::BF16 => DataType::CU_TENSOR_MAP_DATA_TYPE_BFLOAT16,
    };
    let mut map = std::mem::MaybeUninit::<CUtensorMap>::uninit();
    // SAFETY: every array has the rank's length; the address is a validated device pointer.
    unsafe {
        sys::cuTensorMapEncodeTiled(
            map.as_mut_ptr(),
            dtype,
            4,
            t.ptr as *mut c_void,
            dims.as_ptr(),
            strides.as_ptr(),
            boxes.as_ptr(),
            elem_strides.as_ptr(),
            Interleave::CU_TENSOR_MAP_INTERLEAVE_NONE,
            Swizzle::CU_TENSOR_MAP_SWIZZLE_128B,
            L2Promotion::CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
            OobFill::CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE,
        )
        .result()
        .ctx("encoding a TMA tensor map")?;
        Ok(TensorMap(map.assume_init()))
    }
}

/// What the backward's launches read besides the parameters: the kernels' shape (packed: B
/// sequences of the longest lengths), the tensors' own (packed: one batch of `total_q` rows),
/// whether the batch is packed, and `q`, `k`, `v`, `dout` for bwd_sm90's tensor maps.
pub(crate) struct BwdLaunch<'a> {
    pub shape: ProblemShape,
    pub tensors: ProblemShape,
    pub packed: bool,
    pub qkv_do: [TensorView<'a>; 4],
}

/// The backward: scratch taken (D_i and the like, then dQ's f32 accumulator) and its
/// pointers set in `p`, then the family's kernels.
pub(crate) fn backward(lane: &mut Lane, kernel: &LoadedKernel, plan: &BwdPlan, mut p: BwdParams, call: &BwdLaunch) -> Result<()> {
    let total_q = call.packed.then_some(call.tensors.seqlen_q);
    let (dsum_bytes, accum_bytes) = plan.scratch_bytes(&call.shape, &call.tensors, total_q);
    let base = lane.take_scratch(dsum_bytes + accum_bytes)?;
    p.dsum = base;
    p.dq_accum = if accum_bytes > 0 { base + dsum_bytes as u64 } else { 0 };
    match kernel.variant.family {
        KernelFamily::BwdSm80 => backward_sm80(lane.stream, kernel, &p, call),
        KernelFamily::BwdSm90 => backward_sm90(lane.stream, kernel, &p, call),
        _ => backward_reference(lane.stream, kernel, &p, &call.shape),
    }
}

/// What a call with no (query, key) pair writes (`ProblemShape::has_no_pairs`): `o = 0` and
/// `lse = -inf` for the forward, each a no-op where the tensor has no elements.
pub(crate) fn no_pairs_forward(lane: &Lane, o: &TensorView, lse: Option<(u64, usize)>) -> Result<()> {
    zero_tensor(lane.stream, o, "zeroing o (no keys)")?;
    match lse {
        Some((ptr, len)) if len > 0 => {
            // SAFETY: `ptr` is the call's checked lse: `len` f32 of device memory, written in
            // stream order.
            unsafe { sys::cuMemsetD32Async(ptr, f32::NEG_INFINITY.to_bits(), len, lane.stream.cu_stream()) }
                .result()
                .ctx("writing lse = -inf (no keys)")
        }
        _ => Ok(()),
    }
}

/// The backward's answer with no (query, key) pair: every gradient 0.
pub(crate) fn no_pairs_backward(lane: &Lane, grads: [&TensorView; 3]) -> Result<()> {
    for (g, what) in grads.into_iter().zip(["zeroing dq (no pairs)", "zeroing dk (no pairs)", "zeroing dv (no pairs)"]) {
        zero_tensor(lane.stream, g, what)?;
    }
    Ok(())
}

/// Zeroes every element of `t` (BSHD, 2-byte elements, D contiguous, other strides free) in
/// stream order: one memset where the elements fill their span, else a 2-D memset down the
/// sequence for each (batch, head) (a BHSD tensor seen as BSHD, say): only calls without
/// (query, key) pairs take this, so the launches per head do not matter.
fn zero_tensor(stream: &CudaStream, t: &TensorView, what: &str) -> Result<()> {
    let [b, s, h, d] = t.layout.shape;
    let elements = b * s * h * d;
    if elements == 0 {
        return Ok(());
    }
    let bytes = t.layout.dtype.size_bytes();
    let [batch_stride, seq_stride, head_stride, _] = t.layout.strides;
    let cu_stream = stream.cu_stream();
    if t.layout.span() == elements {
        // SAFETY: `t` is a checked output view: `elements` 2-byte elements from `t.ptr`, the
        // span they fill, written in stream order.
        return unsafe { sys::cuMemsetD16Async(t.ptr, 0, elements, cu_stream) }.result().ctx(what.to_string());
    }
    // A single row's pitch is unused; CUDA still wants it at least the row's width.
    let pitch = if s == 1 { d } else { seq_stride } * bytes;
    for (bi, hi) in (0..b).flat_map(|bi| (0..h).map(move |hi| (bi, hi))) {
        let row0 = t.ptr + ((bi * batch_stride + hi * head_stride) * bytes) as u64;
        // SAFETY: as above: `s` rows of `d` elements, `seq_stride` apart, of the view.
        unsafe { sys::cuMemsetD2D16Async(row0, pitch, 0, d, s, cu_stream) }.result().ctx(what.to_string())?;
    }
    Ok(())
}

/// Zeroes `words` u32 of scratch at `ptr` in stream order.
fn zero(stream: &CudaStream, ptr: u64, words: usize, what: &str) -> Result<()> {
    // SAFETY: `ptr` is scratch memory of at least `words` u32, used in stream order.
    unsafe { sys::cuMemsetD32Async(ptr, 0, words, stream.cu_stream()) }.result().ctx(what.to_string())
}

/// D_i, then the main kernel (a CTA per key block, KV head and batch, or `p.dq_splits` CTAs
/// a head walking the key blocks in deterministic mode), then dQ's conversion, over the
/// tensors' rows; dQ's f32 accumulator zeroed first. A launch of an empty grid is left out.
fn backward_sm80(stream: &CudaStream, kernel: &LoadedKernel, p: &BwdParams, call: &BwdLaunch) -> Result<()> {
    let [dsum_fn, dq_fn] = kernel.aux.as_slice() else {
        return Err(Error::Unsupported { kernel: kernel.variant.name(), msg: "lacks its D_i and dQ entry points".into() });
    };
    let (shape, tensors) = (&call.shape, &call.tensors);
    let accum_len = tensors.batch * tensors.seqlen_q * tensors.heads_q * tensors.head_dim;
    zero(stream, p.dq_accum, p.dq_splits as usize * accum_len, "zeroing dQ's accumulator")?;
    let tile = kernel.variant.tile;
    let key_blocks = shape.seqlen_k.div_ceil(tile.block_n as usize) as u32;
    // At least one CTA a (KV head, sequence): packed, CTA 0 also zeroes dK and dV past seqused_k.
    let ctas = if p.deterministic != 0 { p.dq_splits as u32 } else { key_blocks.max(1) };
    let launch = |function, grid, block, smem| Launch { function, grid, block, smem, dependent: false };
    let launches = [
        (launch(dsum_fn, (tensors.seqlen_q.div_ceil(4) as u32, tensors.heads_q as u32, tensors.batch as u32), 128, 0), "D_i"),
        (launch(&kernel.function, (ctas, shape.heads_kv as u32, shape.batch as u32), 32 * tile.warps, kernel.variant.smem_bytes), "dK, dV"),
        (launch(dq_fn, (accum_len.div_ceil(1024) as u32, 1, 1), 256, 0), "dQ"),
    ];
    for (launch, what) in launches.iter().filter(|(l, _)| !l.is_empty()) {
        // SAFETY: `p` matches `BwdParams`; its pointers were validated against their layouts.
        unsafe { launch.run(stream, &[Arg::Bwd(p)], || format!("launching {} ({what})", kernel.variant.name()))? };
    }
    Ok(())
}

/// The prep kernel (D_i and lse·log2e; it zeroes dQ's accumulator too), the main one and the
/// dQ conversion, the last two programmatic dependents of the launch before them (they wait
/// for it where they first read its output, so their launches overlap its tail). Prep and the
/// conversion run over the query blocks (packed: the longest sequence's), the main kernel over
/// at least one key block (packed, key block 0's CTAs zero dK and dV past seqused_k). A launch
/// of an empty grid (a packed batch without queries) is left out.
fn backward_sm90(stream: &CudaStream, kernel: &LoadedKernel, p: &BwdParams, call: &BwdLaunch) -> Result<()> {
    let [prep, dq] = kernel.aux.as_slice() else {
        return Err(Error::Unsupported { kernel: kernel.variant.name(), msg: "lacks its prep and dQ entry points".into() });
    };
    let (variant, shape) = (&kernel.variant, &call.shape);
    let tile = variant.tile;
    let (m, seqs, heads_q) = (tile.block_m as usize, shape.batch as u32, shape.heads_q as u32);
    let m_blocks = shape.seqlen_q.div_ceil(m) as u32;
    let what = |w: &'static str| move || format!("launching {} ({w})", variant.name());
    let launch = |function, grid, block, smem| Launch { function, grid, block, smem, dependent: false };
    let prep_launch = launch(prep, (m_blocks * m as u32 / bwd_sm90::PREP_ROWS, heads_q, seqs), 128, 0);
    if !prep_launch.is_empty() {
        // SAFETY: `fc_bwd_sm90_prep(BwdParams)`; the pointers were validated against their layouts.
        unsafe { prep_launch.run(stream, &[Arg::Bwd(p)], what("D_i"))? };
    }
    let [q, k, v, dout] = &call.qkv_do;
    let maps = [tensor_map(q, tile.block_m)?, tensor_map(k, tile.block_n)?, tensor_map(v, tile.block_n)?, tensor_map(dout, tile.block_m)?];
    let key_blocks = shape.seqlen_k.div_ceil(tile.block_n as usize).max(usize::from(call.packed)) as u32;
    let dependent = |function, grid, block, smem| Launch { function, grid, block, smem, dependent: true };
    let main = dependent(&kernel.function, (key_blocks, shape.heads_kv as u32, seqs), 32 * tile.warps, variant.smem_bytes);
    if !main.is_empty() {
        let [tq, tk, tv, tdo] = &maps;
        // SAFETY: the arguments match `fc_bwd_sm90(BwdParams, CUtensorMap x4)`.
        unsafe { main.run(stream, &[Arg::Bwd(p), Arg::Map(tq), Arg::Map(tk), Arg::Map(tv), Arg::Map(tdo)], what("dK, dV"))? };
    }
    let dq_launch = dependent(dq, (m_blocks * bwd_sm90::dq_slices(tile, shape.head_dim), heads_q, seqs), 256, 0);
    if !dq_launch.is_empty() {
        // SAFETY: `fc_bwd_sm90_dq(BwdParams)`, after the main kernel in stream order.
        unsafe { dq_launch.run(stream, &[Arg::Bwd(p)], what("dQ"))? };
    }
    Ok(())
}

/// dQ and D_i (a warp per query row), then dK and dV (a warp per key row): 4 warps a block.
fn backward_reference(stream: &CudaStream, kernel: &LoadedKernel, p: &BwdParams, shape: &ProblemShape) -> Result<()> {
    let [dq_fn, dkv_fn] = kernel.aux.as_slice() else {
        return Err(Error::Unsupported { kernel: kernel.variant.name(), msg: "has no backward entry points".into() });
    };
    let rows_per_block = 4;
    let grids = [
        (dq_fn, (shape.seqlen_q.div_ceil(rows_per_block) as u32, shape.heads_q as u32, shape.batch as u32), "dq"),
        (dkv_fn, (shape.seqlen_k.div_ceil(rows_per_block) as u32, shape.heads_kv as u32, shape.batch as u32), "dk, dv"),
    ];
    for (function, grid, what) in grids {
        let launch = Launch { function, grid, block: 128, smem: 0, dependent: false };
        // SAFETY: `p` matches `BwdParams`; its pointers were validated against their layouts.
        unsafe { launch.run(stream, &[Arg::Bwd(p)], || format!("launching the reference backward ({what})"))? };
    }
    Ok(())
}
