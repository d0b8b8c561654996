//! The forward's entry points: [`Context::attention`] (fresh outputs),
//! [`Context::attention_into`] (the caller's buffers, the context's stream) and
//! [`Context::attention_on_stream`] (the caller's stream and scratch). Every call reads as
//! the layers: validate → plan → load → pack → launch.

use cudarc::driver::CudaSlice;

use crate::call::{FwdInputs, FwdOutputs, KvLayout};
use crate::chunks::{CallTraits, ChunkPlan};
use crate::context::Context;
use crate::device_tensor::DeviceTensor;
use crate::error::{DriverContext, Result};
use crate::external::{CallerStream, CurrentContextGuard};
use crate::launch::{self, Lane};
use crate::params::AttnParams;
use crate::tensor::LseViewMut;
use crate::{dispatch, pack, paged, validate, varlen};

/// Output and log-sum-exp of one attention call, in fresh buffers.
#[derive(Debug)]
pub struct AttnOutput {
    /// `o`, shaped like `q`, in the input dtype.
    pub o: DeviceTensor,
    /// `lse [B, Hq, Sq]` (packed: `[Hq, total_q]`), natural log, f32.
    pub lse: CudaSlice<f32>,
}

impl Context {
    /// Attention into fresh buffers: `o` (zeros like `q` with V's head dim, in `q`'s output dtype:
    /// bf16 for e4m3, first) and `lse`. See
    /// [`Context::attention_into`].
    ///
    /// ```no_run
    /// # fn main() -> flashcore::Result<()> {
    /// use flashcore::{AttnParams, Context, DType, DeviceTensor, FwdInputs};
    /// let ctx = Context::new(0)?;
    /// let shape = [2, 1024, 16, 128];
    /// let data: Vec<f32> = (0..shape.iter().product::<usize>()).map(|i| (i as f32).sin()).collect();
    /// let q = DeviceTensor::from_f32(&ctx, &data, shape, DType::BF16)?;
    /// let out = ctx.attention(&FwdInputs::dense(q.view(), q.view(), q.view()), &AttnParams::causal())?;
    /// let o: Vec<f32> = out.o.to_f32(&ctx)?;
    /// # Ok(()) }
    /// ```
    pub fn attention(&self, inputs: &FwdInputs, params: &AttnParams) -> Result<AttnOutput> {
        // [B, Hq, Sq]; packed, [Hq, total_q]: the same count, as q is [1, total_q, Hq, D].
        let [b, sq, hq, _] = inputs.q.layout.shape;
        let head_dim_v = inputs.v.layout.shape[3];
        let mut o = DeviceTensor::filled(self, 0, [b, sq, hq, head_dim_v], inputs.q.layout.dtype.output())?;
        let mut lse = self.stream().alloc_zeros::<f32>((b * hq * sq).max(1)).ctx("allocating lse")?;
        self.attention_into(inputs, FwdOutputs { o: o.view_mut(), lse: Some(LseViewMut::of(&mut lse)), probs: None }, params)?;
        Ok(AttnOutput { o, lse })
    }

    /// Attention `o = softmax(scale · q kᵀ [+ mask]) v` over `inputs` (dense, a packed batch or
    /// a KV cache: [`KvLayout`]), written into `out.o` (shaped like `q`, in its dtype) and,
    /// if given, `out.lse`. Queued on the context's stream; split-KV scratch comes from the
    /// context's workspace.
    ///
    /// Views are BSHD with the last dim contiguous and other strides free (multiples of 8
    /// elements), so a PyTorch BHSD tensor works through its strides.
    pub fn attention_into(&self, inputs: &FwdInputs, out: FwdOutputs, params: &AttnParams) -> Result<()> {
        self.on_own_stream(|lane| self.forward(lane, inputs, out, params))
    }

    /// [`Context::attention_into`] on a stream of the caller's (PyTorch's current stream, say)
    /// with the caller's scratch memory ([`CallerStream`]): the call allocates nothing and does
    /// not synchronise. The calling thread's current CUDA context is left as it was.
    ///
    /// # Safety
    /// - `caller.stream` is a live stream of this device's primary context, and stays live
    ///   until the queued work is done.
    /// - Every pointer (the views, the batch's or cache's vectors, what `caller.scratch`
    ///   returns) is device memory of this device, of the extent its layout describes, that is
    ///   not freed or reused before the work queued on the stream is done.
    /// - Concurrent launches on two streams never share one stream handle (each stream's
    ///   tile counter is its own; a CUDA graph captured on a stream uses that stream's).
    pub unsafe fn attention_on_stream(&self, caller: CallerStream, inputs: &FwdInputs, out: FwdOutputs, params: &AttnParams) -> Result<()> {
        // SAFETY: this function's contract.
        unsafe { self.on_caller_stream(caller, |lane| self.forward(lane, inputs, out, params)) }
    }

    /// The layers of one forward call on `lane`.
    fn forward(&self, lane: &mut Lane, inputs: &FwdInputs, out: FwdOutputs, params: &AttnParams) -> Result<()> {
        let o = out.o.as_view();
        let checked = inputs.check(&o, out.lse.as_ref(), params, self.ordinal())?;
        if checked.tensors.has_no_pairs() {
            let t = &checked.tensors;
            let sinks = (checked.learnable_sink != 0).then(|| launch::NoPairsSinks {
                ptr: checked.learnable_sink,
                heads: t.heads_q,
                blocks: t.batch * t.heads_q,
            });
            return launch::no_pairs_forward(lane, &o, out.lse.as_ref().map(|l| (l.ptr, l.len)), sinks);
        }
        if checked.shape.seqlen_q == 0 {
            return Ok(()); // packed, every sequence empty: nothing to write
        }
        let traits = CallTraits {
            dense: matches!(inputs.kv, KvLayout::Dense),
            alibi: checked.alibi.is_some(),
            dsink: false,
            probs: out.probs.is_some(),
            qv: checked.qv,
        };
        // A chunk that cuts nothing is dropped here, the call not validated again.
        let plan = ChunkPlan::of(&checked.tensors, params, traits);
        if let ChunkPlan::Batch(chunks) = &plan {
            if let Some(offsets) = self.chunk_offsets(lane, chunks)? {
                return chunks.forward(inputs, out, params, offsets, |entry, entry_out, entry_params| {
                    self.forward(lane, entry, entry_out, entry_params)
                });
            }
        }
        let params = plan.params(params);
        let device = self.info().device();
        let (dtype, layout) = (inputs.q.layout.dtype, inputs.kv.geometry(&checked));
        let probs = match &out.probs {
            Some(p) => {
                let (rows, cols) = validate::dropout_probs(&p.as_view(), &checked.shape, dtype, params.dropout.is_some(), self.ordinal())?;
                Some((p.as_view().ptr, rows, cols))
            }
            None => None,
        };
        let params = if probs.is_some() { dispatch::probs_params(params)? } else { *params };
        let plan = dispatch::plan_for(&device, &checked.shape, dtype, &params, layout, checked.score_tensors())?;
        let kernel = self.load(&plan.variant)?;
        let mut call = pack::forward(&plan, &checked, inputs, o, out.lse.map_or(0, |l| l.ptr), &params);
        if let Some((ptr, rows, cols)) = probs {
            (call.params.dropout_probs, call.params.probs_rows, call.params.probs_cols) = (ptr, rows as i32, cols as i32);
        }
        launch::forward(lane, &kernel, &plan, call, device.sm_count, device.arch)
    }

    /// Checks the device values of a packed batch or a KV cache against their contracts (see
    /// [`crate::VarlenBatch`], [`crate::PagedKv`]; the host-visible arguments first, as
    /// [`Context::attention`] would): copies them to the host, so it waits for this context's
    /// stream. A debugging aid; the CLI runs it on every call. The error names the first bad
    /// entry. Dense inputs have none to check.
    pub fn check_values(&self, inputs: &FwdInputs) -> Result<()> {
        let read = |ptr: u64, len: usize, what: &str| -> Result<Vec<i32>> {
            let mut host = vec![0i32; len];
            // SAFETY: `ptr` is `len` int32 values of device memory (the views' contracts).
            unsafe { cudarc::driver::result::memcpy_dtoh_sync(&mut host, ptr) }.ctx(format!("reading {what}"))?;
            Ok(host)
        };
        match &inputs.kv {
            KvLayout::Dense => Ok(()),
            KvLayout::Varlen(batch) => {
                self.synchronize()?;
                let _bind = CurrentContextGuard::bind(self.cuda())?;
                let cu_q = read(batch.cu_seqlens_q.ptr, batch.cu_seqlens_q.len, "cu_seqlens_q")?;
                let cu_k = read(batch.cu_seqlens_k.ptr, batch.cu_seqlens_k.len, "cu_seqlens_k")?;
                let used = batch.seqused_k.map(|u| read(u.ptr, u.len, "seqused_k")).transpose()?;
                let totals = (inputs.q.layout.shape[1], inputs.k.layout.shape[1]);
                varlen::check_values(&cu_q, &cu_k, used.as_deref(), totals, (batch.max_seqlen_q, batch.max_seqlen_k))
            }
            KvLayout::Paged(cache) => {
                let g = cache.validate(&inputs.q, &inputs.k, &inputs.v, &inputs.q, self.ordinal())?;
                self.synchronize()?;
                let _bind = CurrentContextGuard::bind(self.cuda())?;
                let lens = cache.cache_seqlens.map(|l| read(l.ptr, l.len, "cache_seqlens")).transpose()?;
                let table = match cache.block_table {
                    Some(t) => {
                        let span = (t.batch - 1) * t.row_stride + t.max_pages;
                        let all = read(t.ptr, span, "the block table")?;
                        Some(
                            (0..t.batch).flat_map(|b| all[b * t.row_stride..b * t.row_stride + t.max_pages].to_vec()).collect::<Vec<i32>>(),
                        )
                    }
                    None => None,
                };
                if let (Some(queries), Some(total_q)) = (&cache.queries, g.total_q) {
                    let cu = read(queries.cu_seqlens_q.ptr, queries.cu_seqlens_q.len, "cu_seqlens_q")?;
                    varlen::check_offsets("cu_seqlens_q", &cu, total_q, Some(queries.max_seqlen_q))?;
                }
                let pool = if g.page_size > 0 { (g.page_size, g.num_pages) } else { (g.shape.seqlen_k, 0) };
                paged::check_values(table.as_deref(), lens.as_deref(), pool, (g.shape.batch, g.shape.seqlen_k), g.new_keys)
            }
        }
    }
}
