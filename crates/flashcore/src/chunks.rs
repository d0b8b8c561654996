//! Chunked attention's plan step: a chunk that cuts nothing is dropped, and chunked
//! self-attention runs as a packed batch of its chunks.
//!
//! A dense call whose keys all lie in the first chunk (`attention_chunk` ≥ Sk) with no query
//! before key 0 (Sq ≤ Sk; such a query would have a chunk of its own) sees exactly what the
//! same call without the chunk sees, so it runs without it: the chunked kernel forms cost
//! 7% there (H200, B2 S8k H32 D64 causal, chunk 8192: 550 TFLOPS against causal's 590), and
//! Llama 4's chunked layers take a chunk of 8192 on every shorter sequence.
//!
//! With as many queries as keys, chunked attention (`AttnParams::attention_chunk` = C) is a
//! packed batch whose sequences are the chunks: row i sees keys of its own chunk only, and
//! within it the causal mask, the window and ALiBi are those of a sequence that starts at the
//! chunk (they depend on i - j alone when Sq = Sk). The kernels' chunked forms instead tile
//! the whole sequence, with query tiles that straddle a chunk's start (their rows see two
//! chunks, so every key block of the earlier one is masked) and one longest-first order over
//! all of a head's tiles; measured on an H200 (4264fa2, chunk 8192, causal, TFLOPS per visible
//! pair), they ran at 0.86-1.01 of causal attention's rate forward and 0.88-0.90 backward,
//! while a batch of 8k-long causal sequences ran above causal at 32k and 128k.
//!
//! So a dense call whose chunk is shorter than its keys runs as one packed call per batch
//! entry: entry b's rows are a packed batch's `[1, S, H, D]` (a view, no copy), its lse rows
//! `[Hq, S]` as the packed layout has them, over offsets `[0, C, 2C, .., S]` on the device
//! (made once per (C, S) by the context: [`crate::Context`]'s `chunk_offsets`). Not taken:
//! dropout (its mask is keyed by the batch entry and row, which the packed batch renumbers),
//! ALiBi (kept simple: its per-sequence slopes would need slicing), the CPU/GPU reference
//! (it takes no packed batch), the backward of more than one entry with the sinks' gradient
//! (each launch would write the whole of it), and calls under a CUDA graph capture before
//! their offsets exist (the chunked form runs them: the offsets are uploaded outside any
//! capture).

use std::marker::PhantomData;

use crate::call::{BwdInputs, FwdInputs, FwdOutputs, GradsMut, KvLayout};
use crate::dispatch::KeyLayout;
use crate::kernels::KernelFamily;
use crate::params::AttnParams;
use crate::shape::ProblemShape;
use crate::tensor::{DeviceVec, DeviceVecMut, TensorView, TensorViewMut};
use crate::varlen::{SeqLensView, VarlenBatch};

/// What a call's chunk makes of it (see the module).
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) enum ChunkPlan {
    /// Run as it is (no chunk, or one the kernels' chunked forms take).
    AsIs,
    /// The chunk cuts none of the keys: run with these parameters, the chunk dropped.
    Uncut(AttnParams),
    /// Run as a packed batch of the chunks.
    Batch(ChunkBatch),
}

impl ChunkPlan {
    /// The plan for a call over `tensors` with `params`.
    pub(crate) fn of(tensors: &ProblemShape, params: &AttnParams, traits: CallTraits) -> Self {
        let cuts_nothing = traits.dense && params.attention_chunk >= tensors.seqlen_k && tensors.seqlen_q <= tensors.seqlen_k;
        if params.attention_chunk > 0 && cuts_nothing {
            return Self::Uncut(AttnParams { attention_chunk: 0, ..*params });
        }
        ChunkBatch::of(tensors, params, traits).map_or(Self::AsIs, Self::Batch)
    }

    /// The parameters the kernels run a call under this plan with, unless it runs as a batch of
    /// its chunks: `params` as they are, or without the chunk when it cuts nothing.
    pub(crate) fn params<'a>(&'a self, params: &'a AttnParams) -> &'a AttnParams {
        match self {
            Self::Uncut(without_chunk) => without_chunk,
            Self::AsIs | Self::Batch(_) => params,
        }
    }

    /// What the planner sees of a dense call of `shape` without ALiBi under this plan: the
    /// kernels' shape, the parameters and the key layout (`Context::plan` reports it).
    pub(crate) fn dense_problem(shape: &ProblemShape, params: &AttnParams) -> (ProblemShape, AttnParams, KeyLayout) {
        match Self::of(shape, params, CallTraits { dense: true, ..CallTraits::default() }) {
            Self::AsIs => (*shape, *params, KeyLayout::Dense),
            Self::Uncut(uncut) => (*shape, uncut, KeyLayout::Dense),
            Self::Batch(chunks) => {
                let (entry, layout) = chunks.entry_problem(shape);
                (entry, chunks.params(params), layout)
            }
        }
    }
}

/// A dense call with Sq = Sk = `seqlen` and chunks of `chunk` < `seqlen` keys, run as a packed
/// batch of its `ceil(seqlen / chunk)` chunks per batch entry.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(crate) struct ChunkBatch {
    pub chunk: usize,
    pub seqlen: usize,
}

/// What besides the shape and the parameters decides whether a call runs as a [`ChunkBatch`].
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct CallTraits {
    /// The keys are dense (not a packed batch, not a KV cache).
    pub dense: bool,
    /// ALiBi slopes are given.
    pub alibi: bool,
    /// The backward writes the sinks' gradient.
    pub dsink: bool,
    /// The forward stores dropout's probabilities.
    pub probs: bool,
    /// FlashAttention-3's `qv` is given (its rows would need the chunks' slicing too: the
    /// kernel runs the chunk mask instead).
    pub qv: bool,
}

impl ChunkBatch {
    /// The packed plan for a call over `tensors`, or none (see the module).
    fn of(tensors: &ProblemShape, params: &AttnParams, traits: CallTraits) -> Option<Self> {
        let (chunk, seqlen) = (params.attention_chunk, tensors.seqlen_k);
        let chunked_self_attention = chunk > 0 && chunk < seqlen && tensors.seqlen_q == seqlen;
        let policies_allow = !traits.alibi && !traits.probs && !traits.qv && params.dropout.is_none();
        // V's own head dim runs over dense keys alone (`dispatch::value_head_dim_form`).
        let kernels_allow = params.kernel != Some(KernelFamily::Reference) && tensors.head_dim_v == tensors.head_dim;
        let gradient_allows = !(traits.dsink && tensors.batch > 1);
        (traits.dense && chunked_self_attention && policies_allow && kernels_allow && gradient_allows).then_some(Self { chunk, seqlen })
    }

    /// The chunks' first rows, then `seqlen`: `[0, C, 2C, .., seqlen]`.
    pub(crate) fn offsets(&self) -> Vec<i32> {
        let chunks = self.seqlen.div_ceil(self.chunk);
        (0..=chunks).map(|c| (c * self.chunk).min(self.seqlen) as i32).collect()
    }

    /// The parameters of each entry's packed call: the chunks are its sequences.
    pub(crate) fn params(&self, params: &AttnParams) -> AttnParams {
        AttnParams { attention_chunk: 0, ..*params }
    }

    /// The kernels' shape of each entry's packed call (its chunks, of the longest length) and
    /// its key layout: what the planner sees of it.
    pub(crate) fn entry_problem(&self, tensors: &ProblemShape) -> (ProblemShape, KeyLayout) {
        let longest = self.chunk.min(self.seqlen);
        let shape = ProblemShape { batch: self.seqlen.div_ceil(self.chunk), seqlen_q: longest, seqlen_k: longest, ..*tensors };
        (shape, KeyLayout::Varlen { total_k: self.seqlen })
    }

    /// Each entry's packed batch over `offsets` (the device copy of [`ChunkBatch::offsets`]).
    fn batch<'a>(&self, offsets: SeqLensView<'a>) -> VarlenBatch<'a> {
        let longest = self.chunk.min(self.seqlen);
        VarlenBatch { cu_seqlens_q: offsets, cu_seqlens_k: offsets, seqused_k: None, max_seqlen_q: longest, max_seqlen_k: longest }
    }

    /// The forward of every batch entry in turn, `run` taking each entry's packed call.
    pub(crate) fn forward(
        &self,
        inputs: &FwdInputs,
        out: FwdOutputs,
        params: &AttnParams,
        offsets: SeqLensView,
        mut run: impl FnMut(&FwdInputs, FwdOutputs, &AttnParams) -> crate::Result<()>,
    ) -> crate::Result<()> {
        let params = self.params(params);
        let rows = self.lse_rows(&inputs.q);
        for b in 0..inputs.q.layout.shape[0] {
            let entry = FwdInputs {
                q: entry(&inputs.q, b),
                k: entry(&inputs.k, b),
                v: entry(&inputs.v, b),
                kv: KvLayout::Varlen(self.batch(offsets)),
                ..*inputs
            };
            let lse = out.lse.as_ref().map(|l| lse_entry_mut(l.ptr, rows, b));
            run(&entry, FwdOutputs { o: entry_mut(&out.o, b), lse, probs: None }, &params)?;
        }
        Ok(())
    }

    /// The backward of every batch entry in turn, `run` taking each entry's packed call.
    pub(crate) fn backward(
        &self,
        inputs: &BwdInputs,
        grads: GradsMut,
        params: &AttnParams,
        offsets: SeqLensView,
        mut run: impl FnMut(&BwdInputs, GradsMut, &AttnParams) -> crate::Result<()>,
    ) -> crate::Result<()> {
        let params = self.params(params);
        let rows = self.lse_rows(&inputs.q);
        for b in 0..inputs.q.layout.shape[0] {
            let entry_inputs = BwdInputs {
                q: entry(&inputs.q, b),
                k: entry(&inputs.k, b),
                v: entry(&inputs.v, b),
                o: entry(&inputs.o, b),
                // SAFETY: entry b's rows of the caller's lse view, within it.
                lse: unsafe { DeviceVec::from_raw(lse_at(inputs.lse.ptr, rows, b), rows) },
                dout: entry(&inputs.dout, b),
                kv: KvLayout::Varlen(self.batch(offsets)),
                ..*inputs
            };
            // SAFETY: the caller's dsink view, which one launch at a time writes (one entry: see `of`).
            let dsink = grads.dsink.as_ref().map(|d| unsafe { DeviceVecMut::from_raw(d.ptr, d.len) });
            let entry_grads = GradsMut { dq: entry_mut(&grads.dq, b), dk: entry_mut(&grads.dk, b), dv: entry_mut(&grads.dv, b), dsink };
            run(&entry_inputs, entry_grads, &params)?;
        }
        Ok(())
    }

    /// One entry's log-sum-exp values: `[Hq, S]`.
    fn lse_rows(&self, q: &TensorView) -> usize {
        q.layout.shape[2] * self.seqlen
    }
}

/// Batch entry `b` of a dense view as a packed batch's rows, `[1, S, H, D]` (a view).
fn entry<'a>(view: &TensorView<'a>, b: usize) -> TensorView<'a> {
    let mut layout = view.layout;
    layout.shape[0] = 1;
    let ptr = view.ptr + (b * view.layout.strides[0] * view.layout.dtype.size_bytes()) as u64;
    TensorView { ptr, layout, device: view.device, _borrow: PhantomData }
}

/// As [`entry`], writable. The entries of one view do not overlap, and each is used by one
/// launch at a time, in stream order.
fn entry_mut<'a>(view: &TensorViewMut<'a>, b: usize) -> TensorViewMut<'a> {
    let mut layout = view.layout;
    layout.shape[0] = 1;
    let ptr = view.ptr + (b * view.layout.strides[0] * view.layout.dtype.size_bytes()) as u64;
    TensorViewMut { ptr, layout, device: view.device, _borrow: PhantomData }
}

/// The address of entry `b`'s `rows` log-sum-exp values (f32) from `base`.
fn lse_at(base: u64, rows: usize, b: usize) -> u64 {
    base + (b * rows * std::mem::size_of::<f32>()) as u64
}

fn lse_entry_mut<'a>(base: u64, rows: usize, b: usize) -> DeviceVecMut<'a, f32> {
    // SAFETY: entry b's rows of the caller's lse buffer (validated as [B, Hq, S]), within it.
    unsafe { DeviceVecMut::from_raw(lse_at(base, rows, b), rows) }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::params::Window;
    use crate::tensor::{DType, Layout};

    fn shape(batch: usize, sq: usize, sk: usize) -> ProblemShape {
        ProblemShape { batch, seqlen_q: sq, seqlen_k: sk, heads_q: 8, heads_kv: 2, head_dim: 64, head_dim_v: 64 }
    }

    fn chunked(chunk: usize) -> AttnParams {
        AttnParams { attention_chunk: chunk, ..AttnParams::causal() }
    }

    const DENSE: CallTraits = CallTraits { dense: true, alibi: false, dsink: false, probs: false, qv: false };

    #[test]
    fn dense_self_attention_with_a_shorter_chunk_runs_as_its_chunks() {
        let plan = ChunkBatch::of(&shape(2, 1000, 1000), &chunked(300), DENSE).unwrap();
        assert_eq!(plan, ChunkBatch { chunk: 300, seqlen: 1000 });
        assert_eq!(plan.offsets(), vec![0, 300, 600, 900, 1000], "the last chunk short");
        assert_eq!(ChunkBatch { chunk: 250, seqlen: 1000 }.offsets(), vec![0, 250, 500, 750, 1000]);
        assert_eq!(ChunkBatch { chunk: 1, seqlen: 3 }.offsets(), vec![0, 1, 2, 3]);
        let p = plan.params(&AttnParams { window: Window::new(100, 0), ..chunked(300) });
        assert_eq!((p.attention_chunk, p.causal, p.window), (0, true, Window::new(100, 0)), "the chunk goes, the rest stays");
        // SAFETY: never dereferenced (the batch's host-side fields alone are read).
        let b = plan.batch(unsafe { DeviceVec::from_raw(256, 5) });
        assert_eq!((b.max_seqlen_q, b.max_seqlen_k, b.batch(), b.seqused_k.is_none()), (300, 300, 4, true));
        let (kernels, layout) = plan.entry_problem(&shape(2, 1000, 1000));
        assert_eq!((kernels.batch, kernels.seqlen_q, kernels.seqlen_k, kernels.heads_q), (4, 300, 300, 8), "an entry's chunks");
        assert_eq!(layout, KeyLayout::Varlen { total_k: 1000 });
    }

    #[test]
    fn what_the_packed_batch_cannot_be_runs_as_it_is() {
        let s = shape(2, 1000, 1000);
        assert!(ChunkBatch::of(&s, &chunked(0), DENSE).is_none(), "no chunk");
        assert!(ChunkBatch::of(&s, &chunked(1000), DENSE).is_none(), "one chunk: the plain mask's call");
        assert!(ChunkBatch::of(&shape(2, 999, 1000), &chunked(300), DENSE).is_none(), "Sq != Sk: chunks off the diagonal");
        assert!(ChunkBatch::of(&s, &chunked(300), CallTraits { dense: false, ..DENSE }).is_none(), "packed or a cache already");
        assert!(ChunkBatch::of(&s, &chunked(300), CallTraits { alibi: true, ..DENSE }).is_none());
        assert!(ChunkBatch::of(&s, &chunked(300), CallTraits { probs: true, ..DENSE }).is_none());
        assert!(ChunkBatch::of(&s, &chunked(300), CallTraits { qv: true, ..DENSE }).is_none());
        let dropout = AttnParams { dropout: Some(crate::Dropout { p: 0.1, seed: 1, offset: 2 }), ..chunked(300) };
        assert!(ChunkBatch::of(&s, &dropout, DENSE).is_none(), "dropout's mask is keyed by entry and row");
        let oracle = AttnParams { kernel: Some(KernelFamily::Reference), ..chunked(300) };
        assert!(ChunkBatch::of(&s, &oracle, DENSE).is_none(), "the reference takes no packed batch");
        let own_value_dim = ProblemShape { head_dim: 192, head_dim_v: 128, ..s };
        assert!(ChunkBatch::of(&own_value_dim, &chunked(300), DENSE).is_none(), "V's own head dim: dense keys alone");
        assert!(ChunkBatch::of(&s, &chunked(300), CallTraits { dsink: true, ..DENSE }).is_none(), "each launch would write all of dsink");
        assert!(
            ChunkBatch::of(&shape(1, 1000, 1000), &chunked(300), CallTraits { dsink: true, ..DENSE }).is_some(),
            "one entry: one launch"
        );
    }

    #[test]
    fn a_chunk_that_cuts_no_key_is_dropped() {
        let uncut = ChunkPlan::Uncut(AttnParams::causal());
        assert_eq!(ChunkPlan::of(&shape(2, 1000, 1000), &chunked(1000), DENSE), uncut, "as long as the keys");
        assert_eq!(ChunkPlan::of(&shape(2, 1000, 1000), &chunked(8192), DENSE), uncut, "longer");
        assert_eq!(ChunkPlan::of(&shape(2, 1, 1000), &chunked(1000), DENSE), uncut, "decode: the query is the last key's");
        let full = AttnParams { attention_chunk: 4096, ..AttnParams::default() };
        assert_eq!(ChunkPlan::of(&shape(2, 999, 1000), &full, DENSE), ChunkPlan::Uncut(AttnParams::default()));
        assert_eq!(ChunkPlan::of(&shape(2, 1001, 1000), &full, DENSE), ChunkPlan::AsIs, "a query before key 0 has a chunk of its own");
        assert_eq!(
            ChunkPlan::of(&shape(2, 1000, 1000), &chunked(1000), CallTraits { dense: false, ..DENSE }),
            ChunkPlan::AsIs,
            "packed: the sequences' lengths are on the device"
        );
        assert_eq!(ChunkPlan::of(&shape(2, 1000, 1000), &chunked(0), DENSE), ChunkPlan::AsIs, "no chunk");
        assert_eq!(ChunkPlan::of(&shape(2, 1000, 1000), &chunked(300), DENSE), ChunkPlan::Batch(ChunkBatch { chunk: 300, seqlen: 1000 }));
        assert_eq!(ChunkPlan::of(&shape(2, 999, 1000), &chunked(300), DENSE), ChunkPlan::AsIs, "the kernels' chunked forms");
        let (kernels, params, layout) = ChunkPlan::dense_problem(&shape(2, 1000, 1000), &chunked(300));
        assert_eq!((kernels.batch, kernels.seqlen_q, params.attention_chunk, layout), (4, 300, 0, KeyLayout::Varlen { total_k: 1000 }));
        let (kernels, params, layout) = ChunkPlan::dense_problem(&shape(2, 1000, 1000), &chunked(8192));
        assert_eq!((kernels.batch, kernels.seqlen_q, params.attention_chunk, layout), (2, 1000, 0, KeyLayout::Dense));
    }

    #[test]
    fn each_entry_is_its_rows_and_its_lse_rows() {
        let layout = Layout { shape: [3, 1000, 8, 64], strides: [1000 * 8 * 64 + 64, 8 * 64, 64, 1], dtype: DType::BF16 };
        let view = TensorView { ptr: 1 << 20, layout, device: 0, _borrow: PhantomData };
        let e = entry(&view, 2);
        assert_eq!(e.ptr, (1 << 20) + 2 * (1000 * 8 * 64 + 64) * 2);
        assert_eq!((e.layout.shape, e.layout.strides), ([1, 1000, 8, 64], layout.strides));
        let plan = ChunkBatch { chunk: 300, seqlen: 1000 };
        assert_eq!(plan.lse_rows(&view), 8 * 1000, "[Hq, S]: the packed layout of one entry's [1, Hq, S]");
        assert_eq!(lse_at(4096, 8000, 2), 4096 + 2 * 8000 * 4);
    }
}
