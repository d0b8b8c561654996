//! The backward pass: `dq`, `dk`, `dv` from `q`, `k`, `v`, the forward's `o` and `lse`, and
//! `dout`. Its public calls are methods of [`Context`], beside the forward's.
//!
//! Kernels: on Hopper (sm_90a) `bwd_sm90` (wgmma, TMA, warp specialized) for head dims 64,
//! 96, 128, 192 and 256; else `bwd_sm80` (FlashAttention-2's algorithm, mma.sync), every head dim of the
//! forward; the naive reference kernels (`kernels/reference.cu`: exact f32 gradients, slow)
//! when `params.kernel` names the reference. `params.kernel` may also name bwd_sm80 or
//! bwd_sm90; a forward family named there concerns the forward only. A sliding window and a
//! softcap (`params.window`, `params.softcap`: the forward's) select the kernels' `_local`
//! and `_softcap` variants (the reference kernels take both at run time); deterministic mode
//! works with both.
//!
//! Packed (varlen) batches ([`Context::attention_varlen_backward`], the backward of
//! [`Context::attention_varlen`]) run the `_varlen` variants of the same families: bwd_sm90's
//! on Hopper for its head dims, else bwd_sm80's (the reference kernels take no packed batch):
//! each sequence is its own problem, with its own lengths for the causal diagonal and the
//! window, and its dK and dV are bitwise what it gives alone (its dQ too in deterministic
//! mode: bwd_sm90 always, bwd_sm80 at the same `params.num_splits`).
//!
//! Scratch memory per call:
//! - bwd_sm80: D_i, `4·B·Hq·Sq` bytes, and dQ's f32 accumulator, `4·B·Sq·Hq·D` bytes, times
//!   the deterministic split count in deterministic mode (see
//!   [`bwd_sm80::deterministic_splits`]: about SMs / (B·Hkv) slices, at most one per key
//!   block, or `params.num_splits`). Packed, `B·Sq` is `total_q` (the rows themselves, not B
//!   times the longest), and B in the split count is the number of sequences.
//! - bwd_sm90: D_i and lse·log2e, `8·B·Hq·Sq'` bytes, and dQ's f32 accumulator,
//!   `4·B·Hq·Sq'·D'` bytes, where Sq' is Sq rounded up to whole query blocks (128 rows at D64,
//!   64 above) and D' the head dim of the kernel's tiles (D96: 128, D192: 256); in
//!   deterministic mode also 4 bytes per query block (the order counters). Packed, `B·Sq'` is
//!   `total_q + B·block_m` rounded down to whole blocks (each sequence padded to whole blocks).

use std::sync::Arc;

use cudarc::driver::{CudaStream, LaunchConfig, PushKernelArg};

use crate::context::{Context, LoadedKernel};
use crate::error::{DriverContext, Error, Result};
use crate::external::{CurrentContextGuard, ExternalStream};
use crate::jit::Arch;
use crate::kernels::{bwd_sm80, bwd_sm90, reference, BwdParams, KernelFamily, ScoreMods};
use crate::params::{AttnParams, ProblemShape};
use crate::tensor::{DeviceTensor, LseView, TensorView, TensorViewMut};
use crate::validate;
use crate::varlen::VarlenBatch;

/// What the backward reads: the forward's inputs and outputs and the output's gradient.
/// `o` and `dout` are `[B, Sq, Hq, D]` like `q`; `lse [B, Hq, Sq]` f32 as the forward wrote it.
#[derive(Debug, Clone, Copy)]
pub struct BwdInputs<'a> {
    /// Queries, `[B, Sq, Hq, D]`.
    pub q: TensorView<'a>,
    /// Keys, `[B, Sk, Hkv, D]`.
    pub k: TensorView<'a>,
    /// Values, `[B, Sk, Hkv, D]`.
    pub v: TensorView<'a>,
    /// The forward's output.
    pub o: TensorView<'a>,
    /// The forward's log-sum-exp.
    pub lse: LseView<'a>,
    /// The gradient of the loss with respect to `o`, in `o`'s dtype.
    pub dout: TensorView<'a>,
}

/// Where the gradients go: `dq` shaped like `q`, `dk` and `dv` like `k` (the query heads
/// that share a KV head have their gradients summed). None may overlap an input or another.
#[derive(Debug)]
pub struct GradsMut<'a> {
    /// Gradient with respect to `q`.
    pub dq: TensorViewMut<'a>,
    /// Gradient with respect to `k`.
    pub dk: TensorViewMut<'a>,
    /// Gradient with respect to `v`.
    pub dv: TensorViewMut<'a>,
}

/// Gradients in fresh buffers, contiguous BSHD in the inputs' dtype.
#[derive(Debug)]
pub struct AttnGrads {
    /// Gradient with respect to `q`.
    pub dq: DeviceTensor,
    /// Gradient with respect to `k`.
    pub dk: DeviceTensor,
    /// Gradient with respect to `v`.
    pub dv: DeviceTensor,
}

impl Context {
    /// The backward pass into fresh buffers. See [`Context::attention_backward_into`].
    pub fn attention_backward(&self, inputs: &BwdInputs, params: &AttnParams) -> Result<AttnGrads> {
        self.backward_fresh(inputs, None, params)
    }

    /// The backward pass of a packed batch into fresh buffers. See
    /// [`Context::attention_varlen_backward_into`].
    pub fn attention_varlen_backward(&self, inputs: &BwdInputs, batch: &VarlenBatch, params: &AttnParams) -> Result<AttnGrads> {
        self.backward_fresh(inputs, Some(batch), params)
    }

    fn backward_fresh(&self, inputs: &BwdInputs, varlen: Option<&VarlenBatch>, params: &AttnParams) -> Result<AttnGrads> {
        let dtype = inputs.q.layout.dtype;
        let mut dq = DeviceTensor::filled(self, 0, inputs.q.layout.shape, dtype)?;
        let mut dk = DeviceTensor::filled(self, 0, inputs.k.layout.shape, dtype)?;
        let mut dv = DeviceTensor::filled(self, 0, inputs.v.layout.shape, dtype)?;
        let grads = GradsMut { dq: dq.view_mut(), dk: dk.view_mut(), dv: dv.view_mut() };
        self.backward_on_own_stream(inputs, grads, varlen, params)?;
        Ok(AttnGrads { dq, dk, dv })
    }

    /// The backward pass of [`Context::attention_into`] with the same `params`: the gradients
    /// of a loss `L` with respect to `q`, `k`, `v`, given `dout = ∂L/∂o`. Rows that saw no key
    /// (lse = -inf) get zero gradients. Queued on the context's stream.
    ///
    /// Scratch (see the module's documentation) comes from the context's workspace.
    pub fn attention_backward_into(&self, inputs: &BwdInputs, grads: GradsMut, params: &AttnParams) -> Result<()> {
        self.backward_on_own_stream(inputs, grads, None, params)
    }

    /// The backward pass of [`Context::attention_varlen`] with the same `batch` and `params`:
    /// `q`, `o`, `dout` and `dq` are `[1, total_q, Hq, D]`, `k`, `v`, `dk` and `dv` `[1,
    /// total_k, Hkv, D]`, `lse [Hq, total_q]` as the forward wrote it (see [`VarlenBatch`] for
    /// the layout and the caller's contract). Every element of the gradients is written: rows
    /// that saw no key get zero dq, keys that no query saw (a sequence without queries, keys
    /// past `seqused_k`) zero dk and dv. Queued on the context's stream.
    pub fn attention_varlen_backward_into(
        &self,
        inputs: &BwdInputs,
        grads: GradsMut,
        batch: &VarlenBatch,
        params: &AttnParams,
    ) -> Result<()> {
        self.backward_on_own_stream(inputs, grads, Some(batch), params)
    }

    fn backward_on_own_stream(&self, inputs: &BwdInputs, grads: GradsMut, varlen: Option<&VarlenBatch>, params: &AttnParams) -> Result<()> {
        let mut workspace = self.split_workspace().lock().unwrap();
        let mut scratch = |bytes| self.grow_workspace(&mut workspace, bytes);
        self.run_backward(self.stream(), inputs, grads, &mut scratch, varlen, params)
    }

    /// [`Context::attention_backward_into`] on a caller's stream with the caller's scratch
    /// memory, under the contract of [`Context::attention_on_stream`].
    ///
    /// # Safety
    /// As [`Context::attention_on_stream`].
    pub unsafe fn attention_backward_on_stream(
        &self,
        stream: ExternalStream,
        inputs: &BwdInputs,
        grads: GradsMut,
        scratch: &mut dyn FnMut(usize) -> Result<u64>,
        params: &AttnParams,
    ) -> Result<()> {
        let _restore = CurrentContextGuard::bind(self.cuda())?;
        self.stream_counters().counter_for(stream, self.cuda())?; // checks the stream once
        let borrowed = self.cuda().wrap_borrowed_stream(stream.raw());
        self.run_backward(&borrowed, inputs, grads, scratch, None, params)
    }

    /// [`Context::attention_varlen_backward_into`] on a caller's stream with the caller's
    /// scratch memory, under the contract of [`Context::attention_on_stream`].
    ///
    /// # Safety
    /// As [`Context::attention_on_stream`], and the views of `batch` are device memory of
    /// this device that outlives the queued work.
    pub unsafe fn attention_varlen_backward_on_stream(
        &self,
        stream: ExternalStream,
        inputs: &BwdInputs,
        grads: GradsMut,
        scratch: &mut dyn FnMut(usize) -> Result<u64>,
        batch: &VarlenBatch,
        params: &AttnParams,
    ) -> Result<()> {
        let _restore = CurrentContextGuard::bind(self.cuda())?;
        self.stream_counters().counter_for(stream, self.cuda())?; // checks the stream once
        let borrowed = self.cuda().wrap_borrowed_stream(stream.raw());
        self.run_backward(&borrowed, inputs, grads, scratch, Some(batch), params)
    }

    /// The kernel variant the backward of `shape` runs (see the module's documentation).
    pub fn backward_variant(&self, shape: &ProblemShape, dtype: crate::DType, params: &AttnParams) -> Result<crate::Variant> {
        backward_variant(shape, dtype, params, self.info().arch, false)
    }

    fn run_backward(
        &self,
        stream: &Arc<CudaStream>,
        inputs: &BwdInputs,
        grads: GradsMut,
        scratch: &mut dyn FnMut(usize) -> Result<u64>,
        varlen: Option<&VarlenBatch>,
        params: &AttnParams,
    ) -> Result<()> {
        let BwdInputs { q, k, v, o, lse, dout } = *inputs;
        // The tensors' own shape ([1, total, H, D] when packed) and the kernels' (B sequences
        // of the longest lengths when packed).
        let tensors = validate::problem(&q, &k, &v, &o, self.ordinal())?;
        let shape = match varlen {
            Some(batch) => {
                batch.validate(&tensors)?;
                let shape = batch.kernel_shape(&tensors);
                if shape.batch > u16::MAX as usize {
                    let msg = format!("{} sequences: the backward takes at most {}", shape.batch, u16::MAX);
                    return Err(Error::Shape { arg: "cu_seqlens_q", msg });
                }
                shape
            }
            None => tensors,
        };
        let (dq, dk, dv) = (grads.dq.as_view(), grads.dk.as_view(), grads.dv.as_view());
        validate::backward(
            &[("q", &q), ("k", &k), ("v", &v), ("o", &o), ("dout", &dout)],
            &[("dq", &dq), ("dk", &dk), ("dv", &dv)],
            &shape,
            self.ordinal(),
        )?;
        // Packed, [Hq, total_q]: the shape of one sequence of all the rows.
        validate::lse(lse.len, &tensors)?;
        validate::lse_alignment(lse.ptr)?;
        let scale = params.scale_for(shape.head_dim);
        params.check(shape.head_dim)?;
        let variant = backward_variant(&shape, q.layout.dtype, params, self.info().arch, varlen.is_some())?;
        // The mask the kernels see: causal folded into the window (see AttnParams::mask).
        let (causal, window) = params.mask();
        let window = window.unwrap_or(crate::Window::UNBOUNDED);
        let sm80 = variant.family == KernelFamily::BwdSm80;
        // Packed, the rows of the tensors (bwd_sm90 pads each sequence to whole query blocks).
        let total_q = varlen.map(|_| tensors.seqlen_q);
        // Rows of lse and D_i (and of dQ's accumulator, times D): packed, the rows themselves.
        let rows = tensors.batch * tensors.heads_q * tensors.seqlen_q;
        let splits = if sm80 && params.deterministic {
            let key_blocks = shape.seqlen_k.div_ceil(variant.tile.block_n as usize);
            match params.num_splits {
                Some(0) => return Err(Error::Param { arg: "num_splits", msg: "must be at least 1 (None picks it)".into() }),
                Some(n) => n.clamp(1, key_blocks.max(1)),
                None => bwd_sm80::deterministic_splits(self.info().sm_count as usize, shape.heads_kv, shape.batch, key_blocks),
            }
        } else {
            1
        };
        let (dsum_bytes, dq_accum_bytes) = match variant.family {
            KernelFamily::BwdSm90 => bwd_sm90::scratch_layout(&variant, &shape, total_q, params.deterministic),
            family => {
                let accum = if family == KernelFamily::BwdSm80 { splits * rows * shape.head_dim * 4 } else { 0 };
                ((rows * 4).next_multiple_of(256), accum)
            }
        };
        let dsum = scratch(dsum_bytes + dq_accum_bytes)?;
        validate::scratch_alignment(dsum)?;
        // Packed, the sequences' rows are found from cu_seqlens, not from a batch stride.
        let batch_stride = if varlen.is_some() { 0 } else { 1 };
        let stride = |t: &TensorView| [0, 1, 2].map(|i| t.layout.strides[i] as i64 * if i == 0 { batch_stride } else { 1 });
        let p = BwdParams {
            q: q.ptr,
            k: k.ptr,
            v: v.ptr,
            o: o.ptr,
            dout: dout.ptr,
            lse: lse.ptr,
            dq: dq.ptr,
            dk: dk.ptr,
            dv: dv.ptr,
            dsum,
            dq_accum: if dq_accum_bytes > 0 { dsum + dsum_bytes as u64 } else { 0 },
            q_strides: stride(&q),
            k_strides: stride(&k),
            v_strides: stride(&v),
            o_strides: stride(&o),
            do_strides: stride(&dout),
            dq_strides: stride(&dq),
            dk_strides: stride(&dk),
            dv_strides: stride(&dv),
            batch: shape.batch as i32,
            seqlen_q: shape.seqlen_q as i32,
            seqlen_k: shape.seqlen_k as i32,
            heads_q: shape.heads_q as i32,
            heads_kv: shape.heads_kv as i32,
            head_dim: shape.head_dim as i32,
            softmax_scale: scale,
            // Softcapped scores come out of the tanh already scaled (as in the forward).
            softmax_scale_log2: if params.has_softcap() { std::f32::consts::LOG2_E } else { scale * std::f32::consts::LOG2_E },
            causal: i32::from(causal),
            deterministic: i32::from(params.deterministic),
            dq_splits: splits as i32,
            spread_walks: i32::from(variant.family == KernelFamily::BwdSm90 && spread_walks(&variant, &shape, self.info().sm_count)),
            window_left: window.left,
            window_right: window.right,
            softcap: params.softcap,
            softcap_scale: if params.has_softcap() { scale / params.softcap } else { 0.0 },
            cu_seqlens_q: varlen.map_or(0, |b| b.cu_seqlens_q.ptr),
            cu_seqlens_k: varlen.map_or(0, |b| b.cu_seqlens_k.ptr),
            seqused_k: varlen.and_then(|b| b.seqused_k.as_ref()).map_or(0, |u| u.ptr),
            total_q: tensors.seqlen_q as i32,
            total_k: tensors.seqlen_k as i32,
        };
        let kernel = self.load(&variant)?;
        match variant.family {
            KernelFamily::BwdSm80 => launch_sm80(stream, &kernel, &p, &shape, &tensors),
            KernelFamily::BwdSm90 => {
                let [prep, dq] = kernel.aux() else {
                    return Err(Error::Unsupported { kernel: variant.name(), msg: "lacks its prep and dQ entry points".into() });
                };
                bwd_sm90::launch(stream, [prep, kernel.function(), dq], &variant, &p, &shape, total_q, [&q, &k, &v, &dout])
            }
            _ => launch_reference(stream, &kernel, &p, &shape),
        }
    }
}

/// Whether bwd_sm90's key blocks start their walks spread over the query blocks (see
/// `Walk` in `kernels/common/bwd_schedule.cuh`): only when all key blocks of a head fit on the GPU at
/// once (one CTA an SM), since in deterministic mode a key block may then wait for any other
/// key block of its head, the last launched included.
fn spread_walks(variant: &crate::Variant, shape: &ProblemShape, sm_count: u32) -> bool {
    shape.seqlen_k.div_ceil(variant.tile.block_n as usize) <= sm_count as usize
}

/// The variant of the family [`backward_family`] picks, with the score policies of `params`
/// (the forward's choices: a window, causal folded in, is `_local`; a softcap `_softcap`) and,
/// for a packed batch (`varlen`), the `_varlen` form.
fn backward_variant(shape: &ProblemShape, dtype: crate::DType, params: &AttnParams, arch: Arch, varlen: bool) -> Result<crate::Variant> {
    let (causal, window) = params.mask();
    let mut variant = match backward_family(shape, params, arch, varlen)? {
        KernelFamily::BwdSm80 => bwd_sm80::variant(arch, dtype, shape.head_dim, causal),
        KernelFamily::BwdSm90 => bwd_sm90::variant(dtype, shape.head_dim, causal),
        _ => return Ok(reference::variant(dtype)),
    };
    variant.mods = ScoreMods { local: window.is_some(), softcap: params.has_softcap() };
    variant.varlen = varlen;
    Ok(variant)
}

/// Which kernels run the backward of `shape` (see the module's documentation): bwd_sm90 on
/// Hopper for its head dims, else bwd_sm80, a packed batch (`varlen`) too; a family named in
/// `params.kernel` if it can.
fn backward_family(shape: &ProblemShape, params: &AttnParams, arch: Arch, varlen: bool) -> Result<KernelFamily> {
    let unsupported = |family: KernelFamily, msg: String| Err(Error::Unsupported { kernel: family.name().into(), msg });
    let takes = |family: KernelFamily| family.head_dims().contains(&shape.head_dim);
    match params.kernel {
        Some(KernelFamily::Reference) if varlen => {
            unsupported(KernelFamily::Reference, "takes no packed batch (it is the oracle: run each sequence alone)".into())
        }
        Some(KernelFamily::Reference) => Ok(KernelFamily::Reference),
        Some(family @ (KernelFamily::BwdSm80 | KernelFamily::BwdSm90)) if !takes(family) => {
            unsupported(family, format!("takes head dims {:?} (head dim {})", family.head_dims(), shape.head_dim))
        }
        Some(KernelFamily::BwdSm90) if !KernelFamily::BwdSm90.runs_on(arch) => {
            unsupported(KernelFamily::BwdSm90, format!("needs sm_90a (this GPU is {arch})"))
        }
        Some(KernelFamily::BwdSm80) => Ok(KernelFamily::BwdSm80),
        Some(KernelFamily::BwdSm90) => Ok(KernelFamily::BwdSm90),
        _ if takes(KernelFamily::BwdSm90) && KernelFamily::BwdSm90.runs_on(arch) => Ok(KernelFamily::BwdSm90),
        _ if takes(KernelFamily::BwdSm80) => Ok(KernelFamily::BwdSm80),
        _ => Ok(KernelFamily::Reference),
    }
}

/// D_i, then the main kernel (a CTA per key block, KV head and batch, or `p.dq_splits` CTAs
/// a head walking the key blocks in deterministic mode), then dQ's conversion; dQ's f32
/// accumulator zeroed first. `shape` is the kernels' (packed: B sequences of the longest
/// lengths), `tensors` the tensors' own (packed: one batch of total_q rows), over whose rows
/// D_i and dQ's conversion run. A launch of an empty grid (no rows) is left out.
fn launch_sm80(stream: &CudaStream, kernel: &LoadedKernel, p: &BwdParams, shape: &ProblemShape, tensors: &ProblemShape) -> Result<()> {
    let [dsum_fn, dq_fn] = kernel.aux() else {
        return Err(Error::Unsupported { kernel: kernel.variant.name(), msg: "lacks its D_i and dQ entry points".into() });
    };
    let accum_len = tensors.batch * tensors.seqlen_q * tensors.heads_q * tensors.head_dim;
    // SAFETY: `p.dq_accum` is scratch memory of `dq_splits * accum_len` f32 values, used in
    // stream order.
    unsafe { cudarc::driver::sys::cuMemsetD32Async(p.dq_accum, 0, p.dq_splits as usize * accum_len, stream.cu_stream()) }
        .result()
        .ctx("zeroing dQ's accumulator")?;
    let tile = kernel.variant.tile;
    let key_blocks = shape.seqlen_k.div_ceil(tile.block_n as usize) as u32;
    // At least one CTA a (KV head, sequence): packed, CTA 0 also zeroes dK and dV past seqused_k.
    let ctas = if p.deterministic != 0 { p.dq_splits as u32 } else { key_blocks.max(1) };
    let launches = [
        (dsum_fn, (tensors.seqlen_q.div_ceil(4) as u32, tensors.heads_q as u32, tensors.batch as u32), 128, 0, "D_i"),
        (kernel.function(), (ctas, shape.heads_kv as u32, shape.batch as u32), 32 * tile.warps, kernel.variant.smem_bytes, "dK, dV"),
        (dq_fn, (accum_len.div_ceil(1024) as u32, 1, 1), 256, 0, "dQ"),
    ];
    for (function, grid_dim, threads, smem, what) in launches {
        if grid_dim.0 == 0 || grid_dim.1 == 0 || grid_dim.2 == 0 {
            continue;
        }
        let cfg = LaunchConfig { grid_dim, block_dim: (threads, 1, 1), shared_mem_bytes: smem };
        // SAFETY: `p` matches `BwdParams`; its pointers were validated against their layouts.
        unsafe { stream.launch_builder(function).arg(p).launch(cfg) }.ctx(format!("launching {} ({what})", kernel.variant.name()))?;
    }
    Ok(())
}

/// dQ and D_i (a warp per query row), then dK and dV (a warp per key row): 4 warps a block.
fn launch_reference(stream: &CudaStream, kernel: &LoadedKernel, p: &BwdParams, shape: &ProblemShape) -> Result<()> {
    let [dq_fn, dkv_fn] = kernel.aux() else {
        return Err(Error::Unsupported { kernel: kernel.variant.name(), msg: "has no backward entry points".into() });
    };
    let rows_per_block = 4;
    let grids = [
        (dq_fn, (shape.seqlen_q.div_ceil(rows_per_block) as u32, shape.heads_q as u32, shape.batch as u32), "dq"),
        (dkv_fn, (shape.seqlen_k.div_ceil(rows_per_block) as u32, shape.heads_kv as u32, shape.batch as u32), "dk, dv"),
    ];
    for (function, grid_dim, what) in grids {
        let cfg = LaunchConfig { grid_dim, block_dim: (128, 1, 1), shared_mem_bytes: 0 };
        // SAFETY: `p` matches `BwdParams`; its pointers were validated against their layouts.
        unsafe { stream.launch_builder(function).arg(p).launch(cfg) }.ctx(format!("launching the reference backward ({what})"))?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn shape(head_dim: usize) -> ProblemShape {
        ProblemShape { batch: 2, seqlen_q: 300, seqlen_k: 300, heads_q: 8, heads_kv: 2, head_dim }
    }
    const HOPPER: Arch = Arch { major: 9, minor: 0, specific: true };
    const AMPERE: Arch = Arch { major: 8, minor: 0, specific: false };

    #[test]
    fn hopper_takes_bwd_sm90_where_it_has_the_head_dim() {
        for deterministic in [false, true] {
            let params = AttnParams { deterministic, ..AttnParams::default() };
            for d in [64, 96, 128, 192, 256] {
                assert_eq!(backward_family(&shape(d), &params, HOPPER, false).unwrap(), KernelFamily::BwdSm90, "D{d}");
                assert_eq!(backward_family(&shape(d), &params, AMPERE, false).unwrap(), KernelFamily::BwdSm80, "D{d} on sm_80");
            }
            assert_eq!(backward_family(&shape(32), &params, HOPPER, false).unwrap(), KernelFamily::BwdSm80, "D32");
        }
    }

    #[test]
    fn a_named_backward_family_is_honoured_or_refused() {
        let named = |family| AttnParams { kernel: Some(family), ..AttnParams::default() };
        assert_eq!(backward_family(&shape(128), &named(KernelFamily::BwdSm80), HOPPER, false).unwrap(), KernelFamily::BwdSm80);
        assert_eq!(backward_family(&shape(128), &named(KernelFamily::Reference), HOPPER, false).unwrap(), KernelFamily::Reference);
        assert_eq!(backward_family(&shape(128), &named(KernelFamily::FwdSm80), HOPPER, false).unwrap(), KernelFamily::BwdSm90);
        let refused = |d, arch| match backward_family(&shape(d), &named(KernelFamily::BwdSm90), arch, false) {
            Err(Error::Unsupported { kernel, msg }) => format!("{kernel}: {msg}"),
            other => panic!("expected Unsupported, got {other:?}"),
        };
        assert!(refused(32, HOPPER).contains("head dims"), "{}", refused(32, HOPPER));
        assert!(refused(128, AMPERE).contains("sm_90a"), "{}", refused(128, AMPERE));
    }

    #[test]
    fn windows_and_softcaps_pick_the_mods_variants() {
        let pick = |params: AttnParams, arch| backward_variant(&shape(128), crate::DType::BF16, &params, arch, false).unwrap();
        for arch in [HOPPER, AMPERE] {
            let local = pick(AttnParams { causal: true, window: crate::Window::new(127, 0), ..AttnParams::default() }, arch);
            assert_eq!((local.causal, local.mods), (Some(false), ScoreMods { local: true, softcap: false }), "causal folded in");
            assert!(local.name().ends_with("_local"), "{}", local.name());
            let capped = pick(AttnParams { causal: true, softcap: 30.0, deterministic: true, ..AttnParams::default() }, arch);
            assert_eq!((capped.causal, capped.mods), (Some(true), ScoreMods { local: false, softcap: true }));
            let only_causal = pick(AttnParams { window: crate::Window::new(-1, 0), ..AttnParams::default() }, arch);
            assert_eq!((only_causal.causal, only_causal.mods), (Some(true), ScoreMods::default()), "(-1, 0) is causal");
        }
        let named = AttnParams { kernel: Some(KernelFamily::Reference), softcap: 30.0, ..AttnParams::default() };
        assert_eq!(pick(named, HOPPER).mods, ScoreMods::default(), "the reference takes both at run time");
    }

    #[test]
    fn packed_batches_take_the_dense_family_or_a_named_refusal() {
        for arch in [HOPPER, AMPERE] {
            for d in [32, 64, 128, 256] {
                let params = AttnParams { deterministic: d == 64, ..AttnParams::default() };
                let want = if arch == HOPPER && d != 32 { KernelFamily::BwdSm90 } else { KernelFamily::BwdSm80 };
                assert_eq!(backward_family(&shape(d), &params, arch, true).unwrap(), want, "D{d} on {arch}");
            }
            for family in [KernelFamily::BwdSm80, KernelFamily::BwdSm90].into_iter().filter(|f| f.runs_on(arch)) {
                let named = AttnParams { kernel: Some(family), causal: true, softcap: 30.0, ..AttnParams::default() };
                let v = backward_variant(&shape(128), crate::DType::BF16, &named, arch, true).unwrap();
                assert!(v.family == family && v.name().ends_with("_softcap_varlen"), "{}", v.name());
            }
        }
        let named = AttnParams { kernel: Some(KernelFamily::Reference), ..AttnParams::default() };
        match backward_family(&shape(128), &named, HOPPER, true) {
            Err(Error::Unsupported { kernel, msg }) => assert!(kernel == "reference" && msg.contains("packed"), "{kernel}: {msg}"),
            other => panic!("expected Unsupported, got {other:?}"),
        }
    }
}
