//! Launch: every kernel launch of a call, in stream order. The one place that builds a
//! `LaunchConfig` or a `CUlaunchConfig`, launches with programmatic dependent launch (PDL),
//! encodes TMA tensor maps, takes scratch memory and zeroes it. What a call launches is its
//! family's, as data (`kernels::steps`: the forward's append pre-pass, main kernel and
//! split-KV combine; each backward family's sequence); this module runs the list.

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
use crate::kernels::steps::{self, BwdFacts, Entry, Extra, FwdFacts, MapOver, Work};
use crate::kernels::{fwd_sm90, Variant};
use crate::pack::{BwdParams, FwdCall, FwdParams};
use crate::shape::ProblemShape;
use crate::tensor::{DType, Layout, TensorView};
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

    /// Launches with `args`, the kernel's parameters in order.
    ///
    /// # Safety
    /// `args` are the kernel's parameters, of its types, and every pointer among them is
    /// device memory the kernel may use in stream order.
    unsafe fn run<const N: usize>(&self, stream: &CudaStream, args: [Arg; N], what: impl FnOnce() -> String) -> Result<()> {
        if !self.dependent {
            let mut builder = stream.launch_builder(self.function);
            for arg in &args {
                match arg {
                    Arg::Fwd(p) => builder.arg(*p),
                    Arg::Bwd(p) => builder.arg(*p),
                    Arg::Map(m) => builder.arg(*m),
                    Arg::Schedule(s) => builder.arg(*s),
                };
            }
            // SAFETY: this function's contract.
            return unsafe { builder.launch(self.config()) }.map(|_| ()).ctx_with(what);
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
        let mut pointers = args.map(|arg| arg.pointer());
        // SAFETY: `pointers` point at the kernel's parameters (this function's contract) for
        // the call's duration; `config` and `attr` outlive the call.
        unsafe { sys::cuLaunchKernelEx(&config, self.function.cu_function(), pointers.as_mut_ptr(), std::ptr::null_mut()) }
            .result()
            .ctx_with(what)
    }
}

/// One kernel parameter, of the types the kernels take.
#[derive(Clone, Copy)]
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

/// The forward of `call`: the split-KV partials' scratch taken when the plan splits, then the
/// family's launches (`kernels::steps::forward`: the append pre-pass, the main kernel, the combine).
pub(crate) fn forward(lane: &mut Lane, kernel: &LoadedKernel, plan: &Plan, mut call: FwdCall, sm_count: u32, arch: Arch) -> Result<()> {
    if let Some(split) = call.split_scratch {
        let base = lane.take_scratch(split.total_bytes)?;
        call.params.o_accum = base;
        call.params.lse_accum = base + split.o_bytes as u64;
    }
    let variant = &kernel.variant;
    if variant.dtype == DType::E4M3 {
        // fc_fp8_transpose_v writes V^T into scratch; the main kernel's V map is over it.
        let vt = transposed_v(lane, &plan.shape, call.views[2].device)?;
        call.params.v_transposed = vt.ptr;
        call.views[2] = vt;
    }
    let p = &call.params;
    let facts = FwdFacts {
        new_keys: if call.append { p.new_keys as usize } else { 0 },
        combined: call.split_scratch.is_some(),
        page_box_rows: (variant.paged && p.block_table != 0).then_some(p.page_box_rows as u32),
        tile_section: p.tile_section,
    };
    let steps = steps::forward(variant, &plan.shape, plan.splits as u32, sm_count, arch, facts)?;
    let [q, k, v, o] = call.views;
    let with_qv;
    let views: &[TensorView] = match call.qv {
        Some(qv) => {
            with_qv = [q, k, v, o, qv];
            &with_qv
        }
        None => &call.views,
    };
    // SAFETY: `p` is the call's `FwdParams`, built and validated for this variant (`pack::forward`).
    unsafe { run(lane, kernel, steps.into_iter().map(Work::Launch), Arg::Fwd(p), views) }
}

/// Scratch for V^T of an e4m3 call over `shape` (`FwdParams::v_transposed`: `[B, Hkv, Dv,
/// vt_keys]` e4m3), as a view the main kernel's V map reads: BSHD with V's head dim as the
/// sequence, the keys as the head dim.
fn transposed_v<'a>(lane: &mut Lane, shape: &ProblemShape, device: usize) -> Result<TensorView<'a>> {
    let (keys, dv, hkv) = (fwd_sm90::vt_keys(shape.seqlen_k), shape.head_dim_v, shape.heads_kv);
    let layout = Layout { shape: [shape.batch, dv, hkv, keys], strides: [hkv * dv * keys, keys, dv * keys, 1], dtype: DType::E4M3 };
    let base = lane.take_scratch(layout.span().max(1))?;
    // SAFETY: scratch of the layout's span, used in this call's stream order (the transpose
    // writes it, the main kernel reads it).
    Ok(unsafe { TensorView::from_raw(base, layout, device) })
}

/// Runs `work` in stream order: each launch of a non-empty grid with `params` and what its step
/// passes after them (tensor maps over `views`, fwd_sm90's tile schedule), and the memsets.
///
/// # Safety
/// `params` is the parameter struct of every kernel `work` launches, its pointers validated
/// device memory the kernels may use in stream order; `views` the call's validated views (a
/// step's maps name views it has: `pack` puts `qv` fifth where the form reads it).
unsafe fn run(lane: &Lane, kernel: &LoadedKernel, work: impl IntoIterator<Item = Work>, params: Arg, views: &[TensorView]) -> Result<()> {
    for w in work {
        let step = match w {
            Work::ZeroDqAccum(words) => {
                let Arg::Bwd(p) = params else { unreachable!("only a backward zeroes dQ's accumulator") };
                zero(lane.stream, p.dq_accum, words, "zeroing dQ's accumulator")?;
                continue;
            }
            Work::Launch(step) if step.is_empty() => continue,
            Work::Launch(step) => step,
        };
        let function = match step.entry {
            Entry::Main => Some(&kernel.function),
            Entry::Aux(i) => kernel.aux.get(i),
            Entry::Append => kernel.append.as_ref(),
            Entry::Combine => kernel.combine.as_ref(),
        }
        .ok_or_else(|| Error::Unsupported { kernel: kernel.variant.name(), msg: format!("has no {:?} entry point", step.entry) })?;
        let launch = Launch { function, grid: step.grid, block: step.block, smem: step.smem, dependent: step.dependent };
        let what = || format!("launching {} ({})", kernel.variant.name(), step.what);
        let map_of = |map: MapOver| -> Result<TensorMap> {
            let view = views.get(map.view).ok_or_else(|| Error::Unsupported {
                kernel: kernel.variant.name(),
                msg: format!("reads tensor {} of the call, which has {}", map.view, views.len()),
            })?;
            tensor_map(view, map.rows)
        };
        let maps_of =
            |maps: [MapOver; 4]| -> Result<[TensorMap; 4]> { Ok([map_of(maps[0])?, map_of(maps[1])?, map_of(maps[2])?, map_of(maps[3])?]) };
        // SAFETY (each launch): `params` as this function's contract; the maps describe the
        // call's views; the schedule's counter is this lane's (zero between launches).
        match step.extra {
            Extra::None => unsafe { launch.run(lane.stream, [params], what)? },
            Extra::Maps(maps) => {
                let [a, b, c, d] = maps_of(maps)?;
                unsafe { launch.run(lane.stream, [params, Arg::Map(&a), Arg::Map(&b), Arg::Map(&c), Arg::Map(&d)], what)? }
            }
            Extra::MapsAndSchedule { maps, qv, section } => {
                let [a, b, c, d] = maps_of(maps)?;
                let schedule = TileSchedule { counter: lane.tile_counter, section, _pad: 0 };
                match qv {
                    None => {
                        let args = [params, Arg::Map(&a), Arg::Map(&b), Arg::Map(&c), Arg::Map(&d), Arg::Schedule(&schedule)];
                        unsafe { launch.run(lane.stream, args, what)? }
                    }
                    Some(qv) => {
                        let e = map_of(qv)?;
                        let args = [params, Arg::Map(&a), Arg::Map(&b), Arg::Map(&c), Arg::Map(&d), Arg::Map(&e), Arg::Schedule(&schedule)];
                        unsafe { launch.run(lane.stream, args, what)? }
                    }
                }
            }
        }
    }
    Ok(())
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
/// `{64, rows, 1, 1}` and 128-byte swizzle; rows past S read as zeros. An e4m3 view is mapped
/// as 16-bit elements of half its columns (D even: the planner's rule): TMA moves bytes, and
/// the kernel holds e4m3 tiles so (`tile_sm90.cuh`).
fn tensor_map(t: &TensorView, rows: u32) -> Result<TensorMap> {
    let l = t.layout;
    let elem = l.dtype.size_bytes() as u64;
    let (dtype, columns) = match l.dtype {
        DType::F16 => (DataType::CU_TENSOR_MAP_DATA_TYPE_FLOAT16, l.shape[3]),
        DType::BF16 => (DataType::CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, l.shape[3]),
        DType::E4M3 => (DataType::CU_TENSOR_MAP_DATA_TYPE_UINT16, l.shape[3] / 2),
    };
    let dims = [columns, l.shape[1], l.shape[2], l.shape[0]].map(|d| d as u64);
    let strides = [l.strides[1], l.strides[2], l.strides[0]].map(|s| s as u64 * elem);
    let boxes = [fwd_sm90::SWIZZLE_ROW_ELEMS, rows, 1, 1];
    let elem_strides = [1u32; 4];
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
/// pointers set in `p`, then the family's work (`kernels::steps::backward`).
pub(crate) fn backward(lane: &mut Lane, kernel: &LoadedKernel, plan: &BwdPlan, mut p: BwdParams, call: &BwdLaunch) -> Result<()> {
    let total_q = call.packed.then_some(call.tensors.seqlen_q);
    let (dsum_bytes, accum_bytes) = plan.scratch_bytes(&call.shape, &call.tensors, total_q);
    let base = lane.take_scratch(dsum_bytes + accum_bytes)?;
    p.dsum = base;
    p.dq_accum = if accum_bytes > 0 { base + dsum_bytes as u64 } else { 0 };
    let facts = BwdFacts {
        shape: call.shape,
        tensors: call.tensors,
        packed: call.packed,
        dq_splits: p.dq_splits as usize,
        deterministic: p.deterministic != 0,
        sink_grad: p.dsink != 0,
    };
    let work = steps::backward(&kernel.variant, &facts);
    // SAFETY: `p` is the call's `BwdParams`, built and validated for this variant (`pack::backward`).
    unsafe { run(lane, kernel, work, Arg::Bwd(&p), &call.qkv_do) }
}

/// The learnable sinks of a call without (query, key) pairs, for its LSE: their address (f32
/// `[heads]`), and the LSE's `blocks` runs of rows, run `j` of head `j % heads` (dense and
/// KV-cache `[B, Hq, Sq]`: `B·Hq` runs; packed `[Hq, total_q]`: `Hq`).
pub(crate) struct NoPairsSinks {
    pub ptr: u64,
    pub heads: usize,
    pub blocks: usize,
}

/// What a call with no (query, key) pair writes (`ProblemShape::has_no_pairs`): `o = 0` and
/// `lse = -inf` for the forward, or with learnable sinks `lse` = each row's head's sink (a row
/// that sees no key), each a no-op where the tensor has no elements.
pub(crate) fn no_pairs_forward(lane: &Lane, o: &TensorView, lse: Option<(u64, usize)>, sinks: Option<NoPairsSinks>) -> Result<()> {
    zero_tensor(lane.stream, o, "zeroing o (no keys)")?;
    match (lse, sinks) {
        (Some((ptr, len)), Some(sinks)) if len > 0 => lse_of_sinks(lane.stream, ptr, len, &sinks),
        (Some((ptr, len)), None) if len > 0 => {
            // SAFETY: `ptr` is the call's checked lse: `len` f32 of device memory, written in
            // stream order.
            unsafe { sys::cuMemsetD32Async(ptr, f32::NEG_INFINITY.to_bits(), len, lane.stream.cu_stream()) }
                .result()
                .ctx("writing lse = -inf (no keys)")
        }
        _ => Ok(()),
    }
}

/// `lse` (`len` f32 at `ptr`) = the sinks, run by run (see [`NoPairsSinks`]), by the
/// device-to-device copies of [`sink_copies`] in stream order. A call without pairs launches
/// no kernel.
fn lse_of_sinks(stream: &CudaStream, ptr: u64, len: usize, sinks: &NoPairsSinks) -> Result<()> {
    const F32: u64 = std::mem::size_of::<f32>() as u64;
    for c in sink_copies(len, sinks.heads, sinks.blocks) {
        let (dst, src, count) = match c {
            SinkCopy::FromSink { dst, head } => (dst, sinks.ptr + head as u64 * F32, 1),
            SinkCopy::Within { dst, src, count } => (dst, ptr + src as u64 * F32, count),
        };
        // SAFETY: `dst .. dst + count` lies within the call's checked lse (`len` f32 at `ptr`)
        // and the source within it or the checked sinks (`heads` f32) (`sink_copies`); stream
        // order makes each copy see the ones before it.
        unsafe { sys::cuMemcpyDtoDAsync_v2(ptr + dst as u64 * F32, src, count * F32 as usize, stream.cu_stream()) }
            .result()
            .ctx("writing lse = the sinks (no keys)")?;
    }
    Ok(())
}

/// One copy of [`sink_copies`]: f32 elements of the LSE, by index.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum SinkCopy {
    /// `lse[dst] = sinks[head]`.
    FromSink { dst: usize, head: usize },
    /// `lse[dst .. dst + count] = lse[src .. src + count]` (never overlapping).
    Within { dst: usize, src: usize, count: usize },
}

/// The copies that make an LSE of `len` rows, `blocks` runs of them, run `j` of head `j %
/// heads`, hold each row's head's sink, in order: a head's first row from its sink, then the
/// run from itself in doubling spans, then the first `heads` runs over the rest the same way:
/// `heads·(1 + log2 run) + log2(blocks / heads)` copies.
fn sink_copies(len: usize, heads: usize, blocks: usize) -> Vec<SinkCopy> {
    // [start, end) from its first `filled` elements, each copy doubling what is filled.
    fn doubling(start: usize, filled: usize, end: usize, copies: &mut Vec<SinkCopy>) {
        let mut done = filled;
        while start + done < end {
            let count = done.min(end - start - done);
            copies.push(SinkCopy::Within { dst: start + done, src: start, count });
            done += count;
        }
    }
    let run = len / blocks.max(1);
    let first_runs = heads.min(blocks);
    let mut copies = Vec::new();
    if run == 0 {
        return copies;
    }
    for head in 0..first_runs {
        copies.push(SinkCopy::FromSink { dst: head * run, head });
        doubling(head * run, 1, (head + 1) * run, &mut copies);
    }
    doubling(0, first_runs * run, len, &mut copies);
    copies
}

/// The backward's answer with no (query, key) pair: every gradient 0, the sinks' too (`dsink`:
/// its address and length, when wanted; each row's D_i = dO·O is 0 with o = 0).
pub(crate) fn no_pairs_backward(lane: &Lane, grads: [&TensorView; 3], dsink: Option<(u64, usize)>) -> Result<()> {
    for (g, what) in grads.into_iter().zip(["zeroing dq (no pairs)", "zeroing dk (no pairs)", "zeroing dv (no pairs)"]) {
        zero_tensor(lane.stream, g, what)?;
    }
    match dsink {
        Some((ptr, len)) if len > 0 => {
            // SAFETY: `ptr` is the call's checked dsink: `len` f32 of device memory, written in
            // stream order.
            unsafe { sys::cuMemsetD32Async(ptr, 0, len, lane.stream.cu_stream()) }.result().ctx("zeroing dsink (no pairs)")
        }
        _ => Ok(()),
    }
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
        return unsafe { sys::cuMemsetD16Async(t.ptr, 0, elements, cu_stream) }.result().ctx(what);
    }
    // A single row's pitch is unused; CUDA still wants it at least the row's width.
    let pitch = if s == 1 { d } else { seq_stride } * bytes;
    for (bi, hi) in (0..b).flat_map(|bi| (0..h).map(move |hi| (bi, hi))) {
        let row0 = t.ptr + ((bi * batch_stride + hi * head_stride) * bytes) as u64;
        // SAFETY: as above: `s` rows of `d` elements, `seq_stride` apart, of the view.
        unsafe { sys::cuMemsetD2D16Async(row0, pitch, 0, d, s, cu_stream) }.result().ctx(what)?;
    }
    Ok(())
}

/// Zeroes `words` u32 of scratch at `ptr` in stream order.
fn zero(stream: &CudaStream, ptr: u64, words: usize, what: &str) -> Result<()> {
    // SAFETY: `ptr` is scratch memory of at least `words` u32, used in stream order.
    unsafe { sys::cuMemsetD32Async(ptr, 0, words, stream.cu_stream()) }.result().ctx(what)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The copies, replayed on the host, leave every row with its head's sink and never
    /// overlap their source.
    #[test]
    fn sink_copies_give_each_row_its_heads_sink() {
        // (len, blocks): dense [B, Hq, Sq] (B·Hq runs), packed [Hq, total_q] (Hq runs).
        for (b, hq, sq) in [(1, 1, 1), (3, 4, 5), (2, 64, 2048), (5, 3, 1), (1, 8, 7), (4, 2, 16)] {
            for (len, blocks) in [(b * hq * sq, b * hq), (hq * sq, hq)] {
                let sinks: Vec<f32> = (0..hq).map(|h| 10.0 + h as f32).collect();
                let mut lse = vec![f32::NAN; len];
                for c in sink_copies(len, hq, blocks) {
                    match c {
                        SinkCopy::FromSink { dst, head } => lse[dst] = sinks[head],
                        SinkCopy::Within { dst, src, count } => {
                            assert!(src + count <= dst || dst + count <= src, "{c:?} overlaps");
                            let from = lse[src..src + count].to_vec();
                            lse[dst..dst + count].copy_from_slice(&from);
                        }
                    }
                }
                let run = len / blocks;
                for (i, x) in lse.iter().enumerate() {
                    assert_eq!(*x, sinks[(i / run) % hq], "b {b} hq {hq} sq {sq} blocks {blocks}: row {i}");
                }
            }
        }
        assert!(sink_copies(0, 4, 12).is_empty());
    }
}
