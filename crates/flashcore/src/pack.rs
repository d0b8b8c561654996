//! Pack: a validated, planned call turned into the kernels' launch ABI, [`FwdParams`] or
//! [`BwdParams`], each built by one function ([`forward`], [`backward`]). The groups both
//! passes share ([`ProblemArgs`], [`ScoreModArgs`], [`VarlenArgs`]) are filled by one function
//! each, so the forward and the backward cannot drift apart (the scale's log2, say).
//!
//! The structs mirror `kernels/common/params.cuh` and `kernels/common/bwd_params.cuh` field
//! for field, the shared groups `kernels/common/attn_fields.cuh`'s macros: change both sides
//! together. The size assertions below catch a field added on one side only.

use cudarc::driver::DeviceRepr;

use crate::call::{Checked, FwdInputs, KvLayout};
use crate::dispatch::{BwdPlan, Plan};
use crate::kernels::{fwd_sm80, fwd_sm90, section_heads, KernelFamily};
use crate::params::{AttnParams, Window};
use crate::shape::ProblemShape;
use crate::tensor::{DType, LseView, TensorView};
use crate::varlen::VarlenBatch;

/// The problem every pass reads: shape, scale, causal flag (`FC_PROBLEM_FIELDS`).
#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct ProblemArgs {
    pub batch: i32,
    pub seqlen_q: i32,
    pub seqlen_k: i32,
    pub heads_q: i32,
    pub heads_kv: i32,
    pub head_dim: i32,
    pub softmax_scale: f32,
    pub softmax_scale_log2: f32,
    pub causal: i32,
}

/// The score policies' run-time values (`FC_SCORE_MOD_FIELDS`): ALiBi's slopes (first: the
/// group starts 8-aligned on both sides), the window's sides (causal folded in), the softcap,
/// ALiBi's scale and batch stride, dropout's state, the attention chunk.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct ScoreModArgs {
    pub alibi_slopes: u64,
    pub window_left: i32,
    pub window_right: i32,
    pub softcap: f32,
    pub softcap_scale: f32,
    pub alibi_scale: f32,
    pub alibi_batch_stride: i32,
    pub dropout_seed: u64,
    pub dropout_offset: u64,
    pub dropout_state: u64,
    pub dropout_threshold: u32,
    pub dropout_scale: f32,
    /// Chunked attention's chunk in keys, 0 off ([`AttnParams::attention_chunk`]).
    pub attention_chunk: i32,
    /// 0, or the query heads a KV head packs as its rows (decode with GQA packed) where their
    /// sinks are then found (`sinks::sink_of`): row r of KV head h is query head h·G + r.
    pub sink_group: i32,
    /// Learnable sinks, f32 `[Hq]` on the device (0: none; [`crate::LearnableSinks`]).
    pub learnable_sink: u64,
}

/// A packed batch (`FC_VARLEN_FIELDS`); the paged forward reuses `seqused_k` as the cache
/// lengths.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct VarlenArgs {
    pub cu_seqlens_q: u64,
    pub cu_seqlens_k: u64,
    pub seqused_k: u64,
    pub total_q: i32,
    pub total_k: i32,
}

/// The forward-attention launch ABI (`FwdParams` in `kernels/common/params.cuh`).
#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct FwdParams {
    pub q: u64,
    pub k: u64,
    pub v: u64,
    pub o: u64,
    pub lse: u64,
    pub q_strides: [i64; 3],
    pub k_strides: [i64; 3],
    pub v_strides: [i64; 3],
    pub o_strides: [i64; 3],
    pub problem: ProblemArgs,
    pub tile_section: i32,
    pub o_accum: u64,
    pub lse_accum: u64,
    pub num_splits: i32,
    pub split_tiles: i32,
    pub score: ScoreModArgs,
    pub varlen: VarlenArgs,
    /// fwd_sm80 varlen decode with GQA heads packed as rows (see `Plan::packed_gqa`).
    pub gqa_packed: i32,
    /// Varlen: the tokens' stride in q and o (the row stride, unless packed).
    pub q_stride_token: i64,
    pub o_stride_token: i64,
    pub block_table: u64,
    pub k_new: u64,
    pub v_new: u64,
    pub k_new_strides: [i64; 3],
    pub v_new_strides: [i64; 3],
    pub block_table_stride: i64,
    pub page_size: i32,
    pub num_pages: i32,
    pub max_pages: i32,
    pub page_rows: i32,
    pub new_keys: i32,
    /// fwd_sm90 paged with a block table: rows of one K/V TMA box (`fwd_sm90::page_box_rows`).
    pub page_box_rows: i32,
    /// Dropout's probabilities (`FwdOutputs::probs`; 0: not stored) and their extents.
    pub dropout_probs: u64,
    pub probs_rows: i32,
    pub probs_cols: i32,
    /// e4m3 inputs: q's, k's and v's descales (`[B, Hkv]` f32; 0: 1), V^T's scratch
    /// (`launch::forward` takes it) and its rows' keys (`fwd_sm90::vt_keys`).
    pub q_descale: u64,
    pub k_descale: u64,
    pub v_descale: u64,
    pub v_transposed: u64,
    pub vt_keys: i32,
    pub fp8_pad: i32,
}

const _: () = assert!(std::mem::size_of::<ProblemArgs>() == 36 && std::mem::size_of::<ScoreModArgs>() == 80);
const _: () = assert!(std::mem::size_of::<VarlenArgs>() == 32);
const _: () = assert!(std::mem::size_of::<FwdParams>() == 496);

// SAFETY: plain old data with the C layout the kernels expect.
unsafe impl DeviceRepr for FwdParams {}

/// The backward launch ABI (`BwdParams` in `kernels/common/bwd_params.cuh`).
#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct BwdParams {
    pub q: u64,
    pub k: u64,
    pub v: u64,
    pub o: u64,
    pub dout: u64,
    pub lse: u64,
    pub dq: u64,
    pub dk: u64,
    pub dv: u64,
    pub dsink: u64,
    pub dsum: u64,
    pub dq_accum: u64,
    pub q_strides: [i64; 3],
    pub k_strides: [i64; 3],
    pub v_strides: [i64; 3],
    pub o_strides: [i64; 3],
    pub do_strides: [i64; 3],
    pub dq_strides: [i64; 3],
    pub dk_strides: [i64; 3],
    pub dv_strides: [i64; 3],
    pub problem: ProblemArgs,
    pub deterministic: i32,
    pub dq_splits: i32,
    pub spread_walks: i32,
    pub score: ScoreModArgs,
    pub varlen: VarlenArgs,
}

const _: () = assert!(std::mem::size_of::<BwdParams>() == 96 + 8 * 24 + 128 + 32);

// SAFETY: plain old data with the C layout the kernels expect.
unsafe impl DeviceRepr for BwdParams {}

/// The kernel's problem for `shape` under `params`' scale and mask.
fn problem_args(shape: &ProblemShape, params: &AttnParams) -> ProblemArgs {
    let scale = params.scale_for(shape.head_dim);
    ProblemArgs {
        batch: shape.batch as i32,
        seqlen_q: shape.seqlen_q as i32,
        seqlen_k: shape.seqlen_k as i32,
        heads_q: shape.heads_q as i32,
        heads_kv: shape.heads_kv as i32,
        head_dim: shape.head_dim as i32,
        softmax_scale: scale,
        // Softcapped scores come out of the tanh already scaled. Not 0 for a zero scale: the
        // kernels multiply masked (−inf) scores by it, and −inf·0 is NaN. The smallest normal
        // float gives the same softmax (2^(s·c) = 1 for every visible key) and keeps
        // −inf·c = −inf.
        softmax_scale_log2: if params.has_softcap() {
            std::f32::consts::LOG2_E
        } else {
            (scale * std::f32::consts::LOG2_E).max(f32::MIN_POSITIVE)
        },
        causal: i32::from(params.mask().0),
    }
}

/// The window the kernels see (causal folded in: see [`AttnParams::mask`]), the softcap,
/// dropout (its state on the device where `dropout_state` is not 0), and ALiBi's slopes with
/// the factor that takes a slope (in logit units) to the units of the
/// scores the fast kernels hold, which their softmax multiplies by `softmax_scale_log2`:
/// `log2(e) / softmax_scale_log2` (`1 / scale`; 1 under a softcap, whose scores are logits).
fn score_mod_args(shape: &ProblemShape, params: &AttnParams, checked: &Checked) -> ScoreModArgs {
    let (alibi, dropout_state) = (checked.alibi, checked.dropout_state);
    let window = params.mask().1.unwrap_or(Window::UNBOUNDED);
    let scale = params.scale_for(shape.head_dim);
    let scale_log2 = problem_args(shape, params).softmax_scale_log2;
    ScoreModArgs {
        alibi_slopes: alibi.map_or(0, |a| a.ptr),
        window_left: window.left,
        window_right: window.right,
        softcap: params.softcap,
        softcap_scale: if params.has_softcap() { scale / params.softcap } else { 0.0 },
        alibi_scale: std::f32::consts::LOG2_E / scale_log2,
        alibi_batch_stride: alibi.map_or(0, |a| a.batch_stride as i32),
        dropout_seed: params.dropout.map_or(0, |d| d.seed),
        dropout_offset: params.dropout.map_or(0, |d| d.offset),
        dropout_state,
        dropout_threshold: params.dropout.map_or(0, |d| d.threshold()),
        dropout_scale: params.dropout.map_or(1.0, |d| d.scale()),
        attention_chunk: params.attention_chunk as i32, // checked to fit (AttnParams::check)
        sink_group: 0,
        learnable_sink: checked.learnable_sink,
    }
}

/// A packed batch's vectors (zeros when dense) and the tensors' own row counts.
fn varlen_args(batch: Option<&VarlenBatch>, tensors: &ProblemShape) -> VarlenArgs {
    VarlenArgs {
        cu_seqlens_q: batch.map_or(0, |b| b.cu_seqlens_q.ptr),
        cu_seqlens_k: batch.map_or(0, |b| b.cu_seqlens_k.ptr),
        seqused_k: batch.and_then(|b| b.seqused_k.as_ref()).map_or(0, |u| u.ptr),
        total_q: tensors.seqlen_q as i32,
        total_k: tensors.seqlen_k as i32,
    }
}

/// A view's (batch, sequence, head) strides, the batch stride 0 where the kernel finds rows
/// another way (a packed batch's from `cu_seqlens`, a paged cache's from the block table).
fn strides(t: &TensorView, batch_strided: bool) -> [i64; 3] {
    [0, 1, 2].map(|i| t.layout.strides[i] as i64 * if i == 0 && !batch_strided { 0 } else { 1 })
}

/// A forward call ready to launch.
pub(crate) struct FwdCall<'a> {
    pub params: FwdParams,
    /// `q`, `k`, `v`, `o` as the kernel reads them (GQA heads packed as rows when planned).
    pub views: [TensorView<'a>; 4],
    /// FlashAttention-3's `qv` where the form reads it (its fifth tensor map).
    pub qv: Option<TensorView<'a>>,
    /// Whether the paged pre-pass appends `k_new`, `v_new` first.
    pub append: bool,
    /// Bytes of the split-KV partials (O, then LSE), when the plan splits.
    pub split_scratch: Option<SplitScratch>,
}

/// The split-KV partials' scratch: `o_bytes` of partial O, then the LSEs.
#[derive(Debug, Clone, Copy)]
pub(crate) struct SplitScratch {
    pub o_bytes: usize,
    pub total_bytes: usize,
}

/// The forward's launch ABI for `plan` over `inputs` into `o` and `lse` (`0`: not written).
pub(crate) fn forward<'a>(
    plan: &Plan,
    checked: &Checked,
    inputs: &FwdInputs<'a>,
    o: TensorView<'a>,
    lse: u64,
    params: &AttnParams,
) -> FwdCall<'a> {
    let FwdInputs { q, k, v, kv, .. } = *inputs;
    let (varlen, paged) = match kv {
        KvLayout::Dense => (None, None),
        KvLayout::Varlen(batch) => (Some(batch), None),
        KvLayout::Paged(cache) => (None, Some(cache)),
    };
    let gqa = |t: &TensorView<'a>| if plan.packed_gqa { t.with_layout(t.layout.gqa_packed(checked.shape.heads_kv)) } else { *t };
    // A packed batch's tokens step by the tensors' own token stride (packed GQA or not).
    let (q_stride_token, o_stride_token) = (q.layout.strides[1] as i64, o.layout.strides[1] as i64);
    let (q, o) = (gqa(&q), gqa(&o));
    let shape = plan.shape;
    // Packed queries over a paged cache: q's rows as a packed batch's, the keys the cache's.
    let packed_queries = paged.and_then(|cache| cache.queries);
    // Packed, the sequences' rows are found from cu_seqlens, not from a batch stride; paged,
    // the keys' from the block table.
    let dense_rows = varlen.is_none() && packed_queries.is_none();
    let pooled = paged.is_some_and(|cache| cache.block_table.is_some());
    let mut p = FwdParams {
        q: q.ptr,
        k: k.ptr,
        v: v.ptr,
        o: o.ptr,
        lse,
        q_strides: strides(&q, dense_rows),
        k_strides: strides(&k, dense_rows && !pooled),
        v_strides: strides(&v, dense_rows && !pooled),
        o_strides: strides(&o, dense_rows),
        problem: problem_args(&shape, params),
        tile_section: section_heads(&shape),
        num_splits: plan.splits as i32,
        split_tiles: plan.split_tiles as i32,
        score: score_mod_args(&shape, params, checked),
        varlen: varlen_args(varlen.as_ref(), &checked.tensors),
        gqa_packed: i32::from(plan.packed_gqa && !dense_rows),
        q_stride_token,
        o_stride_token,
        ..FwdParams::default()
    };
    if plan.packed_gqa && checked.learnable_sink != 0 {
        p.score.sink_group = shape.seqlen_q as i32; // the packed rows of decode's one token: Hq / Hkv
    }
    let mut append = false;
    if let (Some(cache), Some(g)) = (paged, checked.cache) {
        p.varlen.seqused_k = cache.cache_seqlens.map_or(0, |l| l.ptr);
        if let Some(queries) = &packed_queries {
            p.varlen.cu_seqlens_q = queries.cu_seqlens_q.ptr;
        }
        if let Some(table) = &cache.block_table {
            p.block_table = table.ptr;
            p.block_table_stride = table.row_stride as i64;
            p.max_pages = table.max_pages as i32;
        }
        (p.page_size, p.num_pages, p.page_rows) = (g.page_size as i32, g.num_pages as i32, g.page_rows as i32);
        if g.page_size > 0 {
            p.page_box_rows = fwd_sm90::page_box_rows(g.page_size as u32, plan.variant.tile.block_n) as i32;
        }
        p.new_keys = g.new_keys as i32;
        if let (Some(kn), Some(vn)) = (&cache.k_new, &cache.v_new) {
            (p.k_new, p.v_new) = (kn.ptr, vn.ptr);
            (p.k_new_strides, p.v_new_strides) = (strides(kn, true), strides(vn, true));
            append = true;
        }
    }
    if plan.variant.dtype == DType::E4M3 {
        [p.q_descale, p.k_descale, p.v_descale] = checked.descales;
        p.vt_keys = fwd_sm90::vt_keys(shape.seqlen_k) as i32;
    }
    let qv = inputs.qv.filter(|_| plan.variant.mods.qv);
    FwdCall { params: p, views: [q, k, v, o], qv, append, split_scratch: split_scratch(plan) }
}

/// The split-KV partials `plan` needs, if it splits: `[splits, B, Hq, Sq]` rows of `D + 1`
/// f32, or the paged split tiles' chunked rows, which run the combine at every split count
/// (a sequence may span chunks: [`fwd_sm80::chunked_partial_rows`]).
fn split_scratch(plan: &Plan) -> Option<SplitScratch> {
    let shape = plan.shape;
    let chunked = plan.variant.family == KernelFamily::FwdSm80 && plan.variant.paged && plan.variant.split_kv;
    if plan.splits <= 1 && !chunked {
        return None;
    }
    let rows = if chunked {
        fwd_sm80::chunked_partial_rows(&shape, plan.variant.tile, plan.splits)
    } else {
        plan.splits * shape.batch * shape.heads_q * shape.seqlen_q
    };
    let o_bytes = rows * shape.head_dim * std::mem::size_of::<f32>();
    Some(SplitScratch { o_bytes, total_bytes: o_bytes + rows * std::mem::size_of::<f32>() })
}

/// What the backward reads and writes, as [`backward`] takes them: `q`, `k`, `v`, `o`,
/// `dout`, then `dq`, `dk`, `dv`.
pub(crate) struct BwdViews<'a> {
    pub inputs: [TensorView<'a>; 5],
    pub lse: LseView<'a>,
    pub grads: [TensorView<'a>; 3],
    /// Where the sinks' gradient goes (0: not wanted).
    pub dsink: u64,
}

/// The backward's launch ABI for `plan`; its scratch pointers (`dsum`, `dq_accum`) are the
/// launch's to fill.
pub(crate) fn backward(
    plan: &BwdPlan,
    checked: &Checked,
    views: &BwdViews,
    varlen: Option<&VarlenBatch>,
    params: &AttnParams,
) -> BwdParams {
    let [q, k, v, o, dout] = &views.inputs;
    let [dq, dk, dv] = &views.grads;
    // Packed, the sequences' rows are found from cu_seqlens, not from a batch stride.
    let dense_rows = varlen.is_none();
    let s = |t: &TensorView| strides(t, dense_rows);
    BwdParams {
        q: q.ptr,
        k: k.ptr,
        v: v.ptr,
        o: o.ptr,
        dout: dout.ptr,
        lse: views.lse.ptr,
        dq: dq.ptr,
        dk: dk.ptr,
        dv: dv.ptr,
        dsink: views.dsink,
        dsum: 0,
        dq_accum: 0,
        q_strides: s(q),
        k_strides: s(k),
        v_strides: s(v),
        o_strides: s(o),
        do_strides: s(dout),
        dq_strides: s(dq),
        dk_strides: s(dk),
        dv_strides: s(dv),
        problem: problem_args(&checked.shape, params),
        deterministic: i32::from(params.deterministic),
        dq_splits: plan.dq_splits as i32,
        spread_walks: i32::from(plan.spread_walks),
        score: score_mod_args(&checked.shape, params, checked),
        varlen: varlen_args(varlen, &checked.tensors),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::call::Alibi;

    fn checked(shape: ProblemShape, alibi: Option<Alibi>) -> Checked {
        Checked { alibi, ..Checked::of_shapes(shape, shape, None) }
    }

    #[test]
    fn learnable_sinks_reach_the_kernels_as_given() {
        let shape = ProblemShape { batch: 1, seqlen_q: 4, seqlen_k: 4, heads_q: 8, heads_kv: 1, head_dim: 64, head_dim_v: 64 };
        let sinks = Checked { learnable_sink: 0x2000, ..checked(shape, None) };
        assert_eq!(score_mod_args(&shape, &AttnParams::default(), &sinks).learnable_sink, 0x2000);
        assert_eq!(score_mod_args(&shape, &AttnParams::default(), &checked(shape, None)).learnable_sink, 0);
    }

    #[test]
    fn a_zero_scale_stays_a_normal_float_in_both_passes() {
        let shape = ProblemShape { batch: 1, seqlen_q: 4, seqlen_k: 4, heads_q: 1, heads_kv: 1, head_dim: 64, head_dim_v: 64 };
        let zero = AttnParams { softmax_scale: Some(0.0), ..AttnParams::default() };
        assert_eq!(problem_args(&shape, &zero).softmax_scale_log2, f32::MIN_POSITIVE);
        let capped = AttnParams { softcap: 30.0, ..zero };
        assert_eq!(problem_args(&shape, &capped).softmax_scale_log2, std::f32::consts::LOG2_E);
        assert_eq!(score_mod_args(&shape, &capped, &checked(shape, None)).softcap_scale, 0.0);
    }

    #[test]
    fn alibi_slopes_reach_the_kernels_in_the_units_of_their_scores() {
        let shape = ProblemShape { batch: 2, seqlen_q: 4, seqlen_k: 4, heads_q: 8, heads_kv: 1, head_dim: 64, head_dim_v: 64 };
        let alibi = Some(Alibi { ptr: 0x1000, batch_stride: 8 });
        let plain = score_mod_args(&shape, &AttnParams::default(), &checked(shape, alibi));
        assert_eq!((plain.alibi_slopes, plain.alibi_batch_stride), (0x1000, 8));
        // q·k times alibi_scale·slope, then times softmax_scale_log2: slope·log2(e) a key.
        assert!((plain.alibi_scale - 8.0).abs() < 1e-5, "1 / scale at D64: {}", plain.alibi_scale);
        let capped = score_mod_args(&shape, &AttnParams { softcap: 30.0, ..AttnParams::default() }, &checked(shape, alibi));
        assert_eq!(capped.alibi_scale, 1.0, "capped scores are logits");
        assert_eq!(score_mod_args(&shape, &AttnParams::default(), &checked(shape, None)).alibi_slopes, 0);
    }

    #[test]
    fn causal_is_folded_into_a_window_as_the_kernels_read_it() {
        let p = AttnParams { causal: true, window: Window::new(127, 5), ..AttnParams::default() };
        let shape = ProblemShape { batch: 1, seqlen_q: 4, seqlen_k: 4, heads_q: 1, heads_kv: 1, head_dim: 128, head_dim_v: 128 };
        let score = score_mod_args(&shape, &p, &checked(shape, None));
        assert_eq!((score.window_left, score.window_right), (127, 0));
        assert_eq!(problem_args(&shape, &p).causal, 0, "a window carries the causal side itself");
        assert_eq!(problem_args(&shape, &AttnParams::causal()).causal, 1);
    }
}
