// The field groups every pass's launch ABI shares: FwdParams (common/params.cuh) and BwdParams
// (common/bwd_params.cuh) each hold these three groups, at the places where they stand in
// those structs, so a kernel reads p.batch, p.window_left or p.cu_seqlens_q whichever pass it
// is. Mirrored by `ProblemArgs`, `ScoreModArgs` and `VarlenArgs` in
// crates/flashcore/src/pack.rs, each filled by one function there: change both together.
#pragma once

// The problem: shape, scale and the causal flag.
//   heads_kv: heads_q % heads_kv == 0; kv head = q head / (heads_q / heads_kv).
//   head_dim: equals the compile-time FC_HEAD_DIM for specialised kernels.
//   softmax_scale: applied to q·k; softmax_scale_log2 = softmax_scale * log2(e), for the
//     exp2-based softmax (log2(e) alone under a softcap, whose tanh applies the scale), never
//     0: a zero scale is sent as the smallest normal float so that masked (-inf) scores stay
//     -inf rather than -inf * 0 = NaN.
//   causal: bottom-right aligned: key j visible to query i iff j <= i + seqlen_k - seqlen_q.
#define FC_PROBLEM_FIELDS \
    int batch;                \
    int seqlen_q;             \
    int seqlen_k;             \
    int heads_q;              \
    int heads_kv;             \
    int head_dim;             \
    float softmax_scale;      \
    float softmax_scale_log2; \
    int causal;

// Score policies (see common/mask.cuh).
//   Sliding window (kernels built with FC_LOCAL=1): query i sees keys
//     i + Sk - Sq - window_left ... i + Sk - Sq + window_right; -1 = unbounded on that side.
//     The host folds causal in (window_right <= 0).
//   Chunked attention (FC_LOCAL=1 too; attention_chunk > 0, else 0): query i sees only the keys
//     of the chunk [c, c + attention_chunk) that holds its diagonal key i + Sk - Sq (c a
//     multiple of attention_chunk), within the window, whose sides the host caps at a chunk.
//   Logit softcapping (kernels built with FC_SOFTCAP=1): the scores become
//     softcap * tanh(q·k * softcap_scale), softcap_scale = softmax_scale / softcap, before the
//     softmax, whose softmax_scale_log2 is then log2(e). softcap = 0: off.
//   ALiBi (kernels built with FC_ALIBI=1): each score gains -slope · |i + Sk - Sq - j|, slope =
//     alibi_slopes[b * alibi_batch_stride + h] (f32 on the device; stride 0: one slope a head for
//     every sequence), in logit units (after the softcap, before the softmax), as flash_attn;
//     alibi_scale = log2(e) / softmax_scale_log2 converts a slope to the units of the scores the
//     kernels hold (q·k, or the capped score). alibi_slopes is null without ALiBi.
//   Dropout (fwd_sm80 and bwd_sm80 built with FC_DROPOUT=1; common/dropout.cuh): the call's
//     generator state (dropout_seed, dropout_offset), or, where dropout_state is set, the
//     (seed, offset) pair it points to on the device, read by the kernel (so that a CUDA
//     graph's replays draw the pair each replay writes there); the byte below which a
//     probability is dropped (dropout_threshold = round(p · 256)); the keepers' scale 1 / (1 - p).
//   Learnable sinks (forward kernels built with FC_SINKS=1; common/sinks.cuh): learnable_sink[h],
//     f32 on the device, one logit a query head in every row's softmax denominator, folded into
//     each row's 1 / sum and LSE where the row is final (the split-KV combine's, where a split
//     holds a partial row). Null without sinks. sink_group: 0, or G = Hq / Hkv where decode
//     packs a KV head's G query heads as its rows (fwd_sm80; the host never packs fwd_sm90's
//     rows with sinks): row r of KV head h is then query head h·G + r (sinks::sink_of).
//   The reference kernels take the window, softcap, ALiBi and sinks at run time (no dropout). The
//   pointer leads the group, so that the group starts 8-aligned in C as in its Rust mirror.
#define FC_SCORE_MOD_FIELDS                  \
    const float* alibi_slopes;               \
    int window_left;                         \
    int window_right;                        \
    float softcap;                           \
    float softcap_scale;                     \
    float alibi_scale;                       \
    int alibi_batch_stride;                  \
    unsigned long long dropout_seed;         \
    unsigned long long dropout_offset;       \
    const unsigned long long* dropout_state; \
    unsigned int dropout_threshold;          \
    float dropout_scale;                     \
    int attention_chunk;                     \
    int sink_group;                          \
    const float* learnable_sink;

// Varlen (kernels built with FC_VARLEN=1; see common/sequence.cuh): one packed batch of
// sequences, q, o (and dout, dq) [total_q, Hq, D], k, v (and dk, dv) [total_k, Hkv, D], every
// *_stride_b 0. Sequence b is query rows [cu_seqlens_q[b], cu_seqlens_q[b + 1]) and keys
// [cu_seqlens_k[b], cu_seqlens_k[b] + seqlen_k_b), seqlen_k_b = seqused_k[b] when seqused_k is
// set (may be null), else cu_seqlens_k[b + 1] - cu_seqlens_k[b]; all int32, on the device.
// seqlen_q and seqlen_k are then the longest (max_seqlen_q / max_seqlen_k: the grid's extent),
// and lse (and the backward's dsum) is [Hq, total_q]. Offsets are clamped to [0, total): a bad
// cu_seqlens gives wrong output, never an access outside the tensors. The paged forward reuses
// seqused_k as flash_attn's cache_seqlens (common/params.cuh).
#define FC_VARLEN_FIELDS        \
    const int* cu_seqlens_q;    \
    const int* cu_seqlens_k;    \
    const int* seqused_k;       \
    int total_q;                \
    int total_k;
