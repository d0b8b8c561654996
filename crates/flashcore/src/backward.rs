//! The backward's entry points: `dq`, `dk`, `dv` from `q`, `k`, `v`, the forward's `o` and
//! `lse`, and `dout`, for dense and packed (varlen) batches: [`Context::attention_backward`]
//! (fresh gradients), [`Context::attention_backward_into`] (the caller's buffers) and
//! [`Context::attention_backward_on_stream`] (the caller's stream and scratch). The kernel
//! choice is the planner's (`dispatch::plan_backward`), the launches `launch::backward`'s.
//!
//! A packed batch runs the `_varlen` variants of the dense batch's family: each sequence is
//! its own problem, with its own lengths for the causal diagonal and the window, and its dK
//! and dV are bitwise what it gives alone (its dQ too in deterministic mode: bwd_sm90 always,
//! bwd_sm80 at the same `params.num_splits`). Scratch per call: see
//! [`BwdPlan::scratch_bytes`](crate::dispatch::BwdPlan::scratch_bytes).

use crate::call::{BwdInputs, GradsMut};
use crate::chunks::{CallTraits, ChunkPlan};
use crate::context::Context;
use crate::device_tensor::DeviceTensor;
use crate::dispatch::KeyLayout;
use crate::error::Result;
use crate::external::CallerStream;
use crate::launch::{self, BwdLaunch, Lane};
use crate::pack::{self, BwdViews};
use crate::params::AttnParams;
use crate::shape::ProblemShape;
use crate::tensor::DType;
use crate::{dispatch, Variant};

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
        let dtype = inputs.q.layout.dtype;
        let mut dq = DeviceTensor::filled(self, 0, inputs.q.layout.shape, dtype)?;
        let mut dk = DeviceTensor::filled(self, 0, inputs.k.layout.shape, dtype)?;
        let mut dv = DeviceTensor::filled(self, 0, inputs.v.layout.shape, dtype)?;
        self.attention_backward_into(inputs, GradsMut::new(dq.view_mut(), dk.view_mut(), dv.view_mut()), params)?;
        Ok(AttnGrads { dq, dk, dv })
    }

    /// The backward pass of [`Context::attention_into`] with the same inputs, layout and
    /// `params`: the gradients of a loss `L` with respect to `q`, `k`, `v`, given
    /// `dout = ∂L/∂o`. Every element of the gradients is written: rows that saw no key
    /// (lse = -inf) get zero dq, keys that no query saw (packed: a sequence without queries,
    /// keys past `seqused_k`) zero dk and dv. Queued on the context's stream; scratch comes
    /// from the context's workspace.
    pub fn attention_backward_into(&self, inputs: &BwdInputs, grads: GradsMut, params: &AttnParams) -> Result<()> {
        self.on_own_stream(|lane| self.backward(lane, inputs, grads, params))
    }

    /// [`Context::attention_backward_into`] on a caller's stream with the caller's scratch
    /// memory, under the contract of [`Context::attention_on_stream`].
    ///
    /// # Safety
    /// As [`Context::attention_on_stream`].
    pub unsafe fn attention_backward_on_stream(
        &self,
        caller: CallerStream,
        inputs: &BwdInputs,
        grads: GradsMut,
        params: &AttnParams,
    ) -> Result<()> {
        // SAFETY: this function's contract.
        unsafe { self.on_caller_stream(caller, |lane| self.backward(lane, inputs, grads, params)) }
    }

    /// The kernel variant the backward of a dense `shape` without ALiBi runs (after chunked
    /// attention's plan step, `chunks.rs`: a chunk that cuts nothing dropped, chunked
    /// self-attention as each entry's packed batch of its chunks).
    pub fn backward_variant(&self, shape: &ProblemShape, dtype: DType, params: &AttnParams) -> Result<Variant> {
        let (shape, params, layout) = ChunkPlan::dense_problem(shape, params);
        let packed = layout != KeyLayout::Dense;
        Ok(dispatch::plan_backward(&self.info().device(), &shape, dtype, &params, packed, false)?.variant)
    }

    /// The layers of one backward call on `lane`.
    fn backward(&self, lane: &mut Lane, inputs: &BwdInputs, grads: GradsMut, params: &AttnParams) -> Result<()> {
        let checked = inputs.check(&grads, params, self.ordinal())?;
        let dsink = grads.dsink.as_ref().map(|d| (d.ptr, d.len));
        if checked.tensors.has_no_pairs() {
            return launch::no_pairs_backward(lane, [&grads.dq.as_view(), &grads.dk.as_view(), &grads.dv.as_view()], dsink);
        }
        let traits =
            CallTraits { dense: inputs.batch().is_none(), alibi: checked.alibi.is_some(), dsink: dsink.is_some(), probs: false, qv: false };
        // A chunk that cuts nothing is dropped here, the call not validated again.
        let plan = ChunkPlan::of(&checked.tensors, params, traits);
        if let ChunkPlan::Batch(chunks) = &plan {
            if let Some(offsets) = self.chunk_offsets(lane, chunks)? {
                return chunks.backward(inputs, grads, params, offsets, |entry, entry_grads, entry_params| {
                    self.backward(lane, entry, entry_grads, entry_params)
                });
            }
        }
        let params = plan.params(params);
        let batch = inputs.batch();
        let (dtype, alibi) = (inputs.q.layout.dtype, checked.alibi.is_some());
        let plan = dispatch::plan_backward(&self.info().device(), &checked.shape, dtype, params, batch.is_some(), alibi)?;
        let kernel = self.load(&plan.variant)?;
        let BwdInputs { q, k, v, o, lse, dout, .. } = *inputs;
        let views = BwdViews {
            inputs: [q, k, v, o, dout],
            lse,
            grads: [grads.dq.as_view(), grads.dk.as_view(), grads.dv.as_view()],
            dsink: dsink.map_or(0, |(ptr, _)| ptr),
        };
        let p = pack::backward(&plan, &checked, &views, batch, params);
        let call = BwdLaunch { shape: checked.shape, tensors: checked.tensors, packed: batch.is_some(), qkv_do: [q, k, v, dout] };
        launch::backward(lane, &kernel, &plan, p, &call)
    }
}
