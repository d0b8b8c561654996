//! A call's inputs and outputs, as every entry point takes them, and their checks (the
//! validate step): [`FwdInputs`] and [`FwdOutputs`] for the forward, [`BwdInputs`] and
//! [`GradsMut`] for the backward, and [`KvLayout`], the one description of how the keys are
//! laid out (dense, a packed batch, a KV cache).

use crate::dispatch::KeyLayout;
use crate::error::{Error, Result};
use crate::paged::{CacheGeometry, PagedKv};
use crate::params::AttnParams;
use crate::shape::ProblemShape;
use crate::tensor::{DeviceVec, DeviceVecMut, LseView, LseViewMut, TensorView, TensorViewMut};
use crate::validate;
use crate::varlen::VarlenBatch;

/// ALiBi slopes (flash_attn's `alibi_slopes`): f32 on the device, one a query head (`[Hq]`,
/// every sequence's) or one a sequence and query head (`[B, Hq]` row-major; packed, B is the
/// sequences). Score `(i, j)` of head `h` gains `-slope · |i + Sk - Sq - j|` (bottom-right
/// aligned as the causal mask), after the softcap and before the softmax; the backward takes
/// the same slopes. Under a causal mask this is flash_attn's bias up to a constant per row
/// (flash_attn's causal kernels add `slope · j`): the same output, an LSE that differs by it.
pub type AlibiSlopes<'a> = DeviceVec<'a, f32>;

/// Learnable sinks (gpt-oss; FlashAttention-4's `learnable_sink`): f32 on the device, one logit
/// a query head (`[Hq]`), in every row's softmax denominator beside the visible keys' scores,
/// with no value: `o = Σ exp(s − m)·v / (Σ exp(s − m) + exp(sink − m))`, the LSE including it.
/// Neither scaled by the softmax scale nor softcapped; a row that sees no key gives `o = 0` and
/// `lse = sink`. The forward takes them; the backward's dQ, dK and dV need only the forward's
/// LSE (which holds the sink), and the sinks' own gradient is `-Σ_i exp(sink - lse_i)·D_i`
/// over a head's rows, `D_i = dO_i·O_i` ([`crate::reference::ReferenceGrads::dsinks`]).
pub type LearnableSinks<'a> = DeviceVec<'a, f32>;

/// Where the backward writes the learnable sinks' gradient ([`GradsMut::dsink`]): f32 on the
/// device, `[Hq]`, every row of every sequence of a head summed, in a fixed order (the same
/// bits every run).
pub type SinkGradMut<'a> = DeviceVecMut<'a, f32>;

/// FlashAttention-3's FP8 descales (`q_descale`, `k_descale`, `v_descale`): f32 on the device,
/// one a (sequence, KV head), `[B, Hkv]` row-major, each optional (none: 1). With e4m3 inputs
/// (`DType::E4M3`) the scores are `scale · (q·k) · q_descale · k_descale` and the output
/// `(P·V) · v_descale` (the values the e4m3 tensors hold times their descales are the real
/// ones). A device tensor's values are the caller's contract: not read on the host.
#[derive(Debug, Clone, Copy, Default)]
pub struct Fp8Descales<'a> {
    /// `q`'s descales.
    pub q: Option<DeviceVec<'a, f32>>,
    /// `k`'s descales.
    pub k: Option<DeviceVec<'a, f32>>,
    /// `v`'s descales.
    pub v: Option<DeviceVec<'a, f32>>,
}

/// How a call's keys (and, packed, its queries) are laid out.
#[derive(Debug, Clone, Copy, Default)]
pub enum KvLayout<'a> {
    /// Dense BSHD tensors: `q [B, Sq, Hq, D]`, `k, v [B, Sk, Hkv, D]`.
    #[default]
    Dense,
    /// A packed batch of sequences of their own lengths (flash_attn's varlen functions):
    /// `q [1, total_q, Hq, D]`, `k, v [1, total_k, Hkv, D]`; see [`VarlenBatch`].
    Varlen(VarlenBatch<'a>),
    /// A KV cache, paged or contiguous, with new keys appended first (flash_attn's
    /// `flash_attn_with_kvcache`): `k` and `v` are the caches; see [`PagedKv`]. Forward only.
    Paged(PagedKv<'a>),
}

impl KvLayout<'_> {
    /// What the planner needs to know of the layout (sizes, not device memory).
    pub(crate) fn geometry(&self, checked: &Checked) -> KeyLayout {
        match (self, checked.cache) {
            (KvLayout::Paged(_), Some(g)) => KeyLayout::Paged { page_size: g.page_size, packed_queries: g.total_q.is_some() },
            (KvLayout::Varlen(_), _) => KeyLayout::Varlen { total_k: checked.tensors.seqlen_k },
            _ => KeyLayout::Dense,
        }
    }

    fn batch(&self) -> Option<&VarlenBatch<'_>> {
        match self {
            KvLayout::Varlen(batch) => Some(batch),
            _ => None,
        }
    }
}

/// Dropout's generator state on the device (flash_attn's `rng_state`): two u64, the seed and
/// the offset, which the kernels read in place of [`Dropout`](crate::Dropout)'s `seed` and
/// `offset`. A CUDA graph fixes the host's values at capture, while a captured kernel can
/// write a fresh pair here before each replay (the Python package draws it from PyTorch's
/// generator): the masks then differ from replay to replay as from call to call. The
/// backward takes the forward's pair.
pub type DropoutState<'a> = DeviceVec<'a, u64>;

/// What the forward reads.
#[derive(Debug, Clone, Copy)]
pub struct FwdInputs<'a> {
    /// Queries, `[B, Sq, Hq, D]` (packed: `[1, total_q, Hq, D]`).
    pub q: TensorView<'a>,
    /// Keys, `[B, Sk, Hkv, D]` (packed: `[1, total_k, Hkv, D]`; a cache: its pages).
    pub k: TensorView<'a>,
    /// Values, shaped like `k`.
    pub v: TensorView<'a>,
    /// How the keys are laid out.
    pub kv: KvLayout<'a>,
    /// ALiBi's slopes, or none.
    pub alibi_slopes: Option<AlibiSlopes<'a>>,
    /// Dropout's generator state on the device, or none (then `Dropout`'s own).
    pub dropout_state: Option<DropoutState<'a>>,
    /// Learnable sinks, or none.
    pub learnable_sink: Option<LearnableSinks<'a>>,
    /// FlashAttention-3's `qv` (absorbed MLA), shaped like the output, or none: the scores
    /// become `scale · (q·kᵀ + qv·vᵀ)` (see [`FwdInputs::with_qv`]).
    pub qv: Option<TensorView<'a>>,
    /// e4m3 inputs' descales (see [`Fp8Descales`]; none: all 1).
    pub descales: Fp8Descales<'a>,
}

impl<'a> FwdInputs<'a> {
    /// Dense tensors: `q [B, Sq, Hq, D]`, `k, v [B, Sk, Hkv, D]`.
    pub fn dense(q: TensorView<'a>, k: TensorView<'a>, v: TensorView<'a>) -> Self {
        Self {
            q,
            k,
            v,
            kv: KvLayout::Dense,
            alibi_slopes: None,
            dropout_state: None,
            learnable_sink: None,
            qv: None,
            descales: Fp8Descales::default(),
        }
    }

    /// A packed batch: `q [1, total_q, Hq, D]`, `k, v [1, total_k, Hkv, D]` (see [`VarlenBatch`]).
    pub fn varlen(q: TensorView<'a>, k: TensorView<'a>, v: TensorView<'a>, batch: VarlenBatch<'a>) -> Self {
        Self {
            q,
            k,
            v,
            kv: KvLayout::Varlen(batch),
            alibi_slopes: None,
            dropout_state: None,
            learnable_sink: None,
            qv: None,
            descales: Fp8Descales::default(),
        }
    }

    /// These inputs with ALiBi `slopes` (see [`AlibiSlopes`]).
    pub fn with_alibi(self, slopes: AlibiSlopes<'a>) -> Self {
        Self { alibi_slopes: Some(slopes), ..self }
    }

    /// These inputs with dropout's generator `state` on the device (see [`DropoutState`]).
    pub fn with_dropout_state(self, state: DropoutState<'a>) -> Self {
        Self { dropout_state: Some(state), ..self }
    }

    /// These inputs with learnable `sinks` (see [`LearnableSinks`]).
    pub fn with_learnable_sink(self, sinks: LearnableSinks<'a>) -> Self {
        Self { learnable_sink: Some(sinks), ..self }
    }

    /// These inputs with FlashAttention-3's `qv` (absorbed MLA's extra term), `[B, Sq, Hq,
    /// Dv]` like the output, in q's dtype: score `(i, j)` becomes `scale · (q_i·k_j + qv_i·v_j)`
    /// before the softcap, bias and mask. Forward only (as FlashAttention-3's), over dense
    /// keys, on the pairs `fwd_sm90::QV_HEAD_DIMS` has forms for (Q and K 64, V 256); else an
    /// error names `qv`. The default scale stays `D^-½`: FlashAttention-3's `(D + Dv)^-½`
    /// with `qv` is its interface's (`flashcore.compat.flash_attn_3` sets it).
    pub fn with_qv(self, qv: TensorView<'a>) -> Self {
        Self { qv: Some(qv), ..self }
    }

    /// A KV cache: `q [B, Sq, Hq, D]`, `k_cache`, `v_cache` the pools `[num_pages, page_size,
    /// Hkv, D]` (with a block table) or `[B, S_cache, Hkv, D]`; `cache.k_new`, `cache.v_new`
    /// are appended first (see [`PagedKv`]).
    pub fn paged(q: TensorView<'a>, k_cache: TensorView<'a>, v_cache: TensorView<'a>, cache: PagedKv<'a>) -> Self {
        Self {
            q,
            k: k_cache,
            v: v_cache,
            kv: KvLayout::Paged(cache),
            alibi_slopes: None,
            dropout_state: None,
            learnable_sink: None,
            qv: None,
            descales: Fp8Descales::default(),
        }
    }

    /// These inputs with FP8 `descales` (e4m3 `q`, `k`, `v`; see [`Fp8Descales`]): forward
    /// only, dense keys, on Hopper (fwd_sm90); else an error names the dtype or the argument.
    pub fn with_descales(self, descales: Fp8Descales<'a>) -> Self {
        Self { descales, ..self }
    }
}

/// Where the forward writes: `o` shaped like `q`, in its dtype, and if given the
/// log-sum-exp, `[B, Hq, Sq]` f32 (packed: `[Hq, total_q]`), natural log.
#[derive(Debug)]
pub struct FwdOutputs<'a> {
    /// The attention output.
    pub o: TensorViewMut<'a>,
    /// The log-sum-exp, when wanted (the backward needs it).
    pub lse: Option<LseViewMut<'a>>,
    /// With dropout, where to store each visited probability, negated where dropped
    /// (flash_attn's `S_dmask`): `[B, Hq, rows, cols]` in q's dtype, contiguous, `rows >= Sq`,
    /// `cols >= Sk` (flash_attn's: both rounded up to 128), relative to the running row max
    /// at each key tile (fwd_sm80's, walking its key tiles last to first: see
    /// `kernels::fwd_sm80::DROPOUT_BLOCK_N`); elements no tile visits are not written.
    pub probs: Option<TensorViewMut<'a>>,
}

/// What the backward reads: the forward's inputs and outputs and the output's gradient.
/// `o` and `dout` are shaped like `q`; `lse` as the forward wrote it. `kv` is the forward's
/// layout: dense or a packed batch (a KV cache has no backward).
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
    /// How the keys are laid out: as the forward's.
    pub kv: KvLayout<'a>,
    /// ALiBi's slopes, as the forward's.
    pub alibi_slopes: Option<AlibiSlopes<'a>>,
    /// Dropout's generator state on the device, as the forward's (or none).
    pub dropout_state: Option<DropoutState<'a>>,
    /// The forward's learnable sinks: read only for their gradient ([`GradsMut::dsink`]);
    /// dQ, dK and dV need only the forward's LSE, which holds them.
    pub learnable_sink: Option<LearnableSinks<'a>>,
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
    /// Where the learnable sinks' gradient goes, when wanted (the inputs' `learnable_sink`
    /// given): `[Hq]` f32.
    pub dsink: Option<SinkGradMut<'a>>,
}

impl<'a> GradsMut<'a> {
    /// `dq`, `dk` and `dv`; no sinks' gradient (see [`GradsMut::with_dsink`]).
    pub fn new(dq: TensorViewMut<'a>, dk: TensorViewMut<'a>, dv: TensorViewMut<'a>) -> Self {
        Self { dq, dk, dv, dsink: None }
    }

    /// These gradients and the learnable sinks' into `dsink`.
    pub fn with_dsink(self, dsink: SinkGradMut<'a>) -> Self {
        Self { dsink: Some(dsink), ..self }
    }
}

/// A checked call: the tensors' own shape (packed: `[1, total, H, D]`; a cache: `Sk` its
/// capacity), the kernels' (packed: B sequences of the longest lengths), a cache's geometry,
/// ALiBi's slopes (their address and batch stride), dropout's state on the device (its
/// address, 0 for none), the learnable sinks (their address, 0 for none), whether `qv` is given.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Checked {
    pub tensors: ProblemShape,
    pub shape: ProblemShape,
    pub cache: Option<CacheGeometry>,
    pub alibi: Option<Alibi>,
    pub dropout_state: u64,
    /// The learnable sinks' address, 0 for none.
    pub learnable_sink: u64,
    /// FlashAttention-3's `qv`, checked against the output (`FwdInputs::qv`).
    pub qv: bool,
    /// e4m3 inputs' descales (q's, k's, v's addresses; 0: 1).
    pub descales: [u64; 3],
}

impl Checked {
    /// A call of these shapes (and a cache's geometry) with no score policy or FP8 descale given
    /// as tensors yet (`FwdInputs::check` adds them).
    pub(crate) fn of_shapes(tensors: ProblemShape, shape: ProblemShape, cache: Option<CacheGeometry>) -> Self {
        Checked { tensors, shape, cache, alibi: None, dropout_state: 0, learnable_sink: 0, qv: false, descales: [0; 3] }
    }

    /// What the planner needs to know of the score policies given as tensors.
    pub(crate) fn score_tensors(&self) -> crate::dispatch::ScoreTensors {
        crate::dispatch::ScoreTensors { alibi: self.alibi.is_some(), learnable_sink: self.learnable_sink != 0, qv: self.qv }
    }
}

/// Checked ALiBi slopes: their address and batch stride (0: one slope a head for every
/// sequence).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Alibi {
    pub ptr: u64,
    pub batch_stride: usize,
}

/// Checks `slopes` against the kernels' `shape` (see [`AlibiSlopes`]).
fn check_alibi(slopes: Option<&AlibiSlopes>, shape: &ProblemShape) -> Result<Option<Alibi>> {
    slopes.map(|s| Ok(Alibi { ptr: s.ptr, batch_stride: validate::alibi_slopes(s.ptr, s.len, shape)? })).transpose()
}

/// Checks dropout's `state` (see [`DropoutState`]): two 8-byte-aligned values, and dropout on.
/// Returns its address, 0 for none.
fn check_dropout_state(state: Option<&DropoutState>, params: &AttnParams) -> Result<u64> {
    let Some(state) = state else { return Ok(0) };
    if params.dropout.is_none() {
        return Err(Error::Param { arg: "dropout_state", msg: "given without dropout (dropout_p is 0)".into() });
    }
    if state.len != 2 {
        return Err(Error::Shape { arg: "dropout_state", msg: format!("{} values: need 2 (seed, offset)", state.len) });
    }
    if state.ptr % 8 != 0 {
        return Err(Error::Param { arg: "dropout_state", msg: format!("device pointer {:#x} is not 8-byte aligned", state.ptr) });
    }
    Ok(state.ptr)
}

impl FwdInputs<'_> {
    /// Checks everything the host can see of a forward call into `o` and `lse` on `device`.
    pub(crate) fn check(&self, o: &TensorView, lse: Option<&LseViewMut>, params: &AttnParams, device: usize) -> Result<Checked> {
        let (q, k, v) = (&self.q, &self.k, &self.v);
        let checked = match &self.kv {
            // No queries: nothing to compute and nothing appended, whatever the cache holds.
            KvLayout::Paged(_) if q.layout.shape[0] == 0 || q.layout.shape[1] == 0 => {
                let tensors = validate::queries_only(q, o, device)?;
                Checked::of_shapes(tensors, tensors, None)
            }
            KvLayout::Paged(cache) => {
                let g = cache.validate(q, k, v, o, device)?;
                // Packed queries: the tensors are one batch of all the rows.
                let tensors = g.total_q.map_or(g.shape, |total_q| ProblemShape { batch: 1, seqlen_q: total_q, ..g.shape });
                Checked::of_shapes(tensors, g.shape, Some(g))
            }
            KvLayout::Varlen(batch) => {
                let tensors = validate::problem(q, k, v, o, device)?;
                batch.validate(&tensors)?;
                Checked::of_shapes(tensors, batch.kernel_shape(&tensors), None)
            }
            KvLayout::Dense => {
                let tensors = validate::problem(q, k, v, o, device)?;
                Checked::of_shapes(tensors, tensors, None)
            }
        };
        params.check(checked.shape.head_dim)?;
        let alibi = check_alibi(self.alibi_slopes.as_ref(), &checked.shape)?;
        let dropout_state = check_dropout_state(self.dropout_state.as_ref(), params)?;
        let learnable_sink =
            self.learnable_sink.map_or(Ok(0), |s| validate::learnable_sink(s.ptr, s.len, &checked.shape).map(|()| s.ptr))?;
        if let Some(qv) = &self.qv {
            validate::qv(qv, o, device)?;
        }
        let d = &self.descales;
        let descales = validate::descales([d.q, d.k, d.v].map(|v| v.map(|v| (v.ptr, v.len))), q.layout.dtype, &checked.shape)?;
        let checked = Checked { alibi, dropout_state, learnable_sink, qv: self.qv.is_some(), descales, ..checked };
        if let Some(lse) = lse {
            // [B, Hq, Sq] as the tensors are shaped; packed, [Hq, total_q]: one sequence of all
            // the rows (a cache's tensors are its kernels' shape, packed queries aside).
            validate::lse(lse.len, &checked.tensors)?;
            validate::lse_alignment(lse.ptr)?;
        }
        Ok(checked)
    }
}

impl<'a> BwdInputs<'a> {
    /// The backward of a forward over `kv` (dense or a packed batch) that read `q`, `k`, `v`
    /// and wrote `o` and `lse`, given `dout`; no ALiBi, no dropout state (see the `with_`
    /// methods).
    pub fn new(
        q: TensorView<'a>,
        k: TensorView<'a>,
        v: TensorView<'a>,
        o: TensorView<'a>,
        lse: LseView<'a>,
        dout: TensorView<'a>,
        kv: KvLayout<'a>,
    ) -> Self {
        Self { q, k, v, o, lse, dout, kv, alibi_slopes: None, dropout_state: None, learnable_sink: None }
    }

    /// These inputs with the forward's ALiBi `slopes`.
    pub fn with_alibi(self, slopes: AlibiSlopes<'a>) -> Self {
        Self { alibi_slopes: Some(slopes), ..self }
    }

    /// These inputs with the forward's dropout `state` on the device (see [`DropoutState`]).
    pub fn with_dropout_state(self, state: DropoutState<'a>) -> Self {
        Self { dropout_state: Some(state), ..self }
    }

    /// These inputs with the forward's learnable `sinks`, for their gradient.
    pub fn with_learnable_sink(self, sinks: LearnableSinks<'a>) -> Self {
        Self { learnable_sink: Some(sinks), ..self }
    }
}

impl BwdInputs<'_> {
    /// The packed batch, if the call is over one.
    pub(crate) fn batch(&self) -> Option<&VarlenBatch<'_>> {
        self.kv.batch()
    }

    /// Checks everything the host can see of a backward call into `grads` on `device`.
    pub(crate) fn check(&self, grads: &GradsMut, params: &AttnParams, device: usize) -> Result<Checked> {
        let BwdInputs { q, k, v, o, lse, dout, kv, alibi_slopes, dropout_state, learnable_sink } = self;
        if q.layout.dtype == crate::tensor::DType::E4M3 {
            let msg = "e4m3 has no backward: FP8 runs the forward alone (as FlashAttention-3's)".into();
            return Err(Error::DType { arg: "q", msg });
        }
        if let KvLayout::Paged(_) = kv {
            return Err(Error::Param { arg: "kv", msg: "a KV cache has no backward: dense or packed (varlen) batches do".into() });
        }
        // The tensors' own shape ([1, total, H, D] when packed) and the kernels' (B sequences
        // of the longest lengths when packed).
        let tensors = validate::problem(q, k, v, o, device)?;
        let shape = match kv.batch() {
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
            &[("q", q), ("k", k), ("v", v), ("o", o), ("dout", dout)],
            &[("dq", &dq), ("dk", &dk), ("dv", &dv)],
            &shape,
            device,
        )?;
        // Packed, [Hq, total_q]: the shape of one sequence of all the rows.
        validate::lse(lse.len, &tensors)?;
        validate::lse_alignment(lse.ptr)?;
        params.check(shape.head_dim)?;
        let alibi = check_alibi(alibi_slopes.as_ref(), &shape)?;
        let dropout_state = check_dropout_state(dropout_state.as_ref(), params)?;
        let learnable_sink = match (learnable_sink, &grads.dsink) {
            (Some(sinks), Some(dsink)) => {
                validate::learnable_sink(sinks.ptr, sinks.len, &shape)?;
                validate::sink_grad(dsink.ptr, dsink.len, &shape)?;
                sinks.ptr
            }
            (None, Some(_)) => {
                return Err(Error::Param { arg: "dsink", msg: "the sinks' gradient needs the forward's learnable_sink".into() })
            }
            (Some(sinks), None) => validate::learnable_sink(sinks.ptr, sinks.len, &shape).map(|()| 0)?,
            (None, None) => 0,
        };
        Ok(Checked { alibi, dropout_state, learnable_sink, ..Checked::of_shapes(tensors, shape, None) })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tensor::{DType, Layout};
    use crate::varlen::SeqLensView;

    fn view(shape: [usize; 4], at: u64) -> TensorView<'static> {
        // SAFETY: the checks never dereference the pointers.
        unsafe { TensorView::from_raw(at, Layout::contiguous(shape, DType::BF16), 0) }
    }

    fn view_mut(shape: [usize; 4], at: u64) -> TensorViewMut<'static> {
        // SAFETY: as above.
        unsafe { TensorViewMut::from_raw(at, Layout::contiguous(shape, DType::BF16), 0) }
    }

    fn packed_batch() -> VarlenBatch<'static> {
        // SAFETY: as above; three sequences.
        let seqlens = |at| unsafe { SeqLensView::from_raw(at, 4) };
        VarlenBatch { cu_seqlens_q: seqlens(0x9000), cu_seqlens_k: seqlens(0xa000), seqused_k: None, max_seqlen_q: 40, max_seqlen_k: 70 }
    }

    #[test]
    fn a_packed_batch_is_checked_on_its_tensors_and_planned_on_its_longest_sequence() {
        let (q, kv) = ([1, 100, 8, 64], [1, 150, 2, 64]);
        let inputs = FwdInputs::varlen(view(q, 0x1000), view(kv, 0x100000), view(kv, 0x200000), packed_batch());
        // SAFETY: as above: [Hq, total_q] f32.
        let lse = unsafe { LseViewMut::from_raw(0x300000, 8 * 100) };
        let checked = inputs.check(&view(q, 0x400000), Some(&lse), &AttnParams::default(), 0).unwrap();
        assert_eq!((checked.tensors.batch, checked.tensors.seqlen_q, checked.tensors.seqlen_k), (1, 100, 150));
        assert_eq!((checked.shape.batch, checked.shape.seqlen_q, checked.shape.seqlen_k), (3, 40, 70));
        assert_eq!(inputs.kv.geometry(&checked), KeyLayout::Varlen { total_k: 150 });
        // SAFETY: as above, one short.
        let short = unsafe { LseViewMut::from_raw(0x300000, 8 * 100 - 1) };
        let err = inputs.check(&view(q, 0x400000), Some(&short), &AttnParams::default(), 0).unwrap_err();
        assert!(matches!(err, Error::Shape { arg: "lse", .. }), "{err}");
    }

    #[test]
    fn alibi_slopes_are_one_a_head_or_one_a_sequence_and_head() {
        let (q, kv) = ([2, 16, 8, 64], [2, 64, 2, 64]);
        let inputs = FwdInputs::dense(view(q, 0x1000), view(kv, 0x100000), view(kv, 0x200000));
        // SAFETY: as above.
        let slopes = |at, len| unsafe { AlibiSlopes::from_raw(at, len) };
        let check = |s| inputs.with_alibi(s).check(&view(q, 0x400000), None, &AttnParams::default(), 0);
        assert_eq!(check(slopes(0x9000, 8)).unwrap().alibi, Some(Alibi { ptr: 0x9000, batch_stride: 0 }));
        assert_eq!(check(slopes(0x9000, 16)).unwrap().alibi, Some(Alibi { ptr: 0x9000, batch_stride: 8 }));
        for (at, len) in [(0x9000, 4), (0x9000, 24), (0x9002, 8)] {
            let err = check(slopes(at, len)).unwrap_err();
            assert!(err.to_string().contains("alibi_slopes"), "{err}");
        }
        // Packed, one row a sequence: three sequences.
        let (q, kv) = ([1, 100, 8, 64], [1, 150, 2, 64]);
        let packed = FwdInputs::varlen(view(q, 0x1000), view(kv, 0x100000), view(kv, 0x200000), packed_batch());
        let checked = packed.with_alibi(slopes(0x9000, 24)).check(&view(q, 0x400000), None, &AttnParams::default(), 0).unwrap();
        assert_eq!(checked.alibi, Some(Alibi { ptr: 0x9000, batch_stride: 8 }));
        assert!(packed.with_alibi(slopes(0x9000, 16)).check(&view(q, 0x400000), None, &AttnParams::default(), 0).is_err());
        assert!(inputs.check(&view([2, 16, 8, 64], 0x400000), None, &AttnParams::default(), 0).unwrap().alibi.is_none());
    }

    #[test]
    fn learnable_sinks_are_one_a_query_head() {
        let (q, kv) = ([2, 16, 8, 64], [2, 64, 2, 64]);
        let inputs = FwdInputs::dense(view(q, 0x1000), view(kv, 0x100000), view(kv, 0x200000));
        // SAFETY: as above.
        let sinks = |at, len| unsafe { LearnableSinks::from_raw(at, len) };
        let check = |s| inputs.with_learnable_sink(s).check(&view(q, 0x400000), None, &AttnParams::default(), 0);
        let checked = check(sinks(0x9000, 8)).unwrap();
        assert_eq!(checked.learnable_sink, 0x9000);
        assert!(checked.score_tensors().learnable_sink && !checked.score_tensors().alibi);
        for (at, len) in [(0x9000, 2), (0x9000, 16), (0x9002, 8)] {
            let err = check(sinks(at, len)).unwrap_err();
            assert!(err.to_string().contains("learnable_sink"), "{err}");
        }
        assert_eq!(inputs.check(&view(q, 0x400000), None, &AttnParams::default(), 0).unwrap().learnable_sink, 0);
    }

    #[test]
    fn dropout_state_is_two_aligned_values_and_needs_dropout() {
        let (q, kv) = ([2, 16, 8, 64], [2, 64, 2, 64]);
        let inputs = FwdInputs::dense(view(q, 0x1000), view(kv, 0x100000), view(kv, 0x200000));
        let dropout = AttnParams { dropout: Some(crate::Dropout { p: 0.1, seed: 1, offset: 0 }), ..AttnParams::default() };
        // SAFETY: as above.
        let state = |at, len| unsafe { DropoutState::from_raw(at, len) };
        let check = |s, params: &AttnParams| inputs.with_dropout_state(s).check(&view(q, 0x400000), None, params, 0);
        assert_eq!(check(state(0x9000, 2), &dropout).unwrap().dropout_state, 0x9000);
        assert_eq!(inputs.check(&view(q, 0x400000), None, &dropout, 0).unwrap().dropout_state, 0, "none: the host's pair");
        for (at, len, params) in [(0x9000, 1, &dropout), (0x9000, 3, &dropout), (0x9004, 2, &dropout), (0x9000, 2, &AttnParams::default())]
        {
            let err = check(state(at, len), params).unwrap_err();
            assert!(err.to_string().contains("dropout_state"), "{err}");
        }
    }

    #[test]
    fn calls_without_pairs_pass_the_checks_for_every_layout() {
        let none = AttnParams::default();
        // Dense: no sequences, no rows, no keys (the pointers of empty tensors may be 0).
        for (q, kv) in [([0, 16, 8, 64], [0, 64, 2, 64]), ([2, 0, 8, 64], [2, 64, 2, 64]), ([2, 16, 8, 64], [2, 0, 2, 64])] {
            let inputs = FwdInputs::dense(view(q, 0), view(kv, 0x100000), view(kv, 0x200000));
            // SAFETY: as above.
            let lse = unsafe { LseViewMut::from_raw(0x300000, q[0] * q[1] * q[2]) };
            let checked = inputs.check(&view(q, 0x400000), Some(&lse), &none, 0).unwrap();
            assert!(checked.tensors.has_no_pairs(), "{q:?} {kv:?}");
        }
        // Packed: a batch of no sequences (cu_seqlens of one entry) and no rows, or rows and no keys.
        // SAFETY: as above.
        let seqlens = |at, n| unsafe { SeqLensView::from_raw(at, n) };
        let batch = |n| VarlenBatch {
            cu_seqlens_q: seqlens(0x9000, n),
            cu_seqlens_k: seqlens(0xa000, n),
            seqused_k: None,
            max_seqlen_q: 0,
            max_seqlen_k: 0,
        };
        for (n, q, kv) in [(1, [1, 0, 8, 64], [1, 0, 2, 64]), (4, [1, 100, 8, 64], [1, 0, 2, 64])] {
            let inputs = FwdInputs::varlen(view(q, 0x1000), view(kv, 0), view(kv, 0), batch(n));
            assert!(inputs.check(&view(q, 0x400000), None, &none, 0).unwrap().tensors.has_no_pairs());
        }
        let rows_without_sequences =
            FwdInputs::varlen(view([1, 5, 8, 64], 0x1000), view([1, 0, 2, 64], 0), view([1, 0, 2, 64], 0), batch(1));
        let err = rows_without_sequences.check(&view([1, 5, 8, 64], 0x400000), None, &none, 0).unwrap_err();
        assert!(matches!(err, Error::Shape { arg: "cu_seqlens_q", .. }), "{err}");
        // A KV cache without queries: the cache and its arguments are not read.
        let (q, pool) = ([0, 1, 8, 64], [4, 16, 2, 64]);
        let cache = FwdInputs::paged(view(q, 0), view(pool, 0x100000), view(pool, 0x200000), PagedKv::default());
        assert!(cache.check(&view(q, 0), None, &none, 0).unwrap().tensors.has_no_pairs());
        // No heads is no problem at all.
        let no_heads = FwdInputs::dense(view([2, 16, 0, 64], 0x1000), view([2, 64, 2, 64], 0x100000), view([2, 64, 2, 64], 0x200000));
        assert!(no_heads.check(&view([2, 16, 0, 64], 0x400000), None, &none, 0).is_err());
    }

    #[test]
    fn a_kv_cache_has_no_backward() {
        let (q, kv) = ([2, 16, 8, 64], [2, 64, 2, 64]);
        let inputs = BwdInputs {
            q: view(q, 0x1000),
            k: view(kv, 0x100000),
            v: view(kv, 0x200000),
            o: view(q, 0x300000),
            // SAFETY: as above.
            lse: unsafe { LseView::from_raw(0x400000, 2 * 8 * 16) },
            dout: view(q, 0x500000),
            kv: KvLayout::Paged(PagedKv::default()),
            alibi_slopes: None,
            dropout_state: None,
            learnable_sink: None,
        };
        let grads = GradsMut::new(view_mut(q, 0x600000), view_mut(kv, 0x700000), view_mut(kv, 0x800000));
        let err = inputs.check(&grads, &AttnParams::default(), 0).unwrap_err();
        assert!(matches!(err, Error::Param { arg: "kv", .. }), "{err}");
        let dense = BwdInputs { kv: KvLayout::Dense, ..inputs };
        assert!(dense.check(&grads, &AttnParams::default(), 0).is_ok());
    }

    #[test]
    fn the_sinks_gradient_needs_the_sinks_and_one_value_a_query_head() {
        let (q, kv) = ([2, 16, 8, 64], [2, 64, 2, 64]);
        // SAFETY: as above.
        let (lse, sinks) = unsafe { (LseView::from_raw(0x400000, 2 * 8 * 16), LearnableSinks::from_raw(0x9000, 8)) };
        let inputs = BwdInputs::new(
            view(q, 0x1000),
            view(kv, 0x100000),
            view(kv, 0x200000),
            view(q, 0x300000),
            lse,
            view(q, 0x500000),
            KvLayout::Dense,
        );
        let grads = || GradsMut::new(view_mut(q, 0x600000), view_mut(kv, 0x700000), view_mut(kv, 0x800000));
        // SAFETY: as above.
        let dsink = |at, len| unsafe { SinkGradMut::from_raw(at, len) };
        let check = |inputs: BwdInputs, grads: GradsMut| inputs.check(&grads, &AttnParams::default(), 0);
        let sinks_in = inputs.with_learnable_sink(sinks);
        assert_eq!(check(sinks_in, grads().with_dsink(dsink(0xa000, 8))).unwrap().learnable_sink, 0x9000);
        assert_eq!(check(sinks_in, grads()).unwrap().learnable_sink, 0, "dQ, dK and dV alone do not read the sinks");
        let err = check(inputs, grads().with_dsink(dsink(0xa000, 8))).unwrap_err();
        assert!(matches!(err, Error::Param { arg: "dsink", .. }), "{err}");
        for (at, len) in [(0xa000, 16), (0xa002, 8)] {
            let err = check(sinks_in, grads().with_dsink(dsink(at, len))).unwrap_err();
            assert!(err.to_string().contains("dsink"), "{err}");
        }
        // SAFETY: as above.
        let short = inputs.with_learnable_sink(unsafe { LearnableSinks::from_raw(0x9000, 4) });
        assert!(check(short, grads().with_dsink(dsink(0xa000, 8))).unwrap_err().to_string().contains("learnable_sink"));
    }
}
