// The backward-attention launch ABI shared by every backward kernel.
// Mirrored field for field by `BwdParams` in crates/flashcore/src/kernels/mod.rs:
// change both together.
#pragma once

struct BwdParams {
    // Inputs, BSHD with the last dim contiguous; strides in elements. o and dout are
    // [B, Sq, Hq, D] like q; k and v [B, Sk, Hkv, D].
    const void* q;
    const void* k;
    const void* v;
    const void* o;
    const void* dout;
    const float* lse;  // [B, Hq, Sq] contiguous ([Hq, total_q] packed), natural log, from the forward

    // Outputs: dq like q, dk and dv like k (the query heads of a KV head summed).
    void* dq;
    void* dk;
    void* dv;
    // Workspace: D_i = rowsum(dO ∘ O), [B, Hq, Sq] f32 ([Hq, total_q] packed, as lse); and
    // dQ's f32 accumulator dq_splits x [B, Sq, Hq, D] contiguous ([total_q, Hq, D] packed)
    // (bwd_sm80; unused by the reference).
    float* dsum;
    float* dq_accum;

    long long q_stride_b, q_stride_s, q_stride_h;
    long long k_stride_b, k_stride_s, k_stride_h;
    long long v_stride_b, v_stride_s, v_stride_h;
    long long o_stride_b, o_stride_s, o_stride_h;
    long long do_stride_b, do_stride_s, do_stride_h;
    long long dq_stride_b, dq_stride_s, dq_stride_h;
    long long dk_stride_b, dk_stride_s, dk_stride_h;
    long long dv_stride_b, dv_stride_s, dv_stride_h;

    int batch;
    int seqlen_q;
    int seqlen_k;
    int heads_q;
    int heads_kv;
    int head_dim;
    float softmax_scale;       // applied to q·k
    float softmax_scale_log2;  // softmax_scale * log2(e)
    int causal;                // bottom-right aligned, as the forward
    int deterministic;         // 1: no order-dependent float atomics
    int dq_splits;             // slices of dq_accum (bwd_sm80 deterministic: one per CTA of a head)
    int spread_walks;          // bwd_sm90: 1 when all key blocks of a head fit on the GPU at once (common/bwd_schedule.cuh)

    // Sliding window and logit softcapping, as FwdParams (kernels built with FC_LOCAL=1 and
    // FC_SOFTCAP=1; see common/mask.cuh): causal folded in by the host (window_right <= 0),
    // softcap_scale = softmax_scale / softcap, and then softmax_scale_log2 = log2(e). The
    // reference kernels take them at run time (softcap = 0: off).
    int window_left;
    int window_right;
    float softcap;
    float softcap_scale;

    // Varlen (bwd_sm80 built with FC_VARLEN=1; see common/sequence.cuh), as FwdParams: one
    // packed batch, q, o, dout, dq [total_q, Hq, D], k, v, dk, dv [total_k, Hkv, D], every
    // *_stride_b 0; sequence b is query rows [cu_seqlens_q[b], cu_seqlens_q[b + 1]) and keys
    // [cu_seqlens_k[b], cu_seqlens_k[b] + seqlen_k_b) (seqused_k[b] when set, else the
    // cu_seqlens_k span), int32 on the device; seqlen_q and seqlen_k are the longest
    // (max_seqlen_q / max_seqlen_k: the grid's extent), lse and dsum [Hq, total_q]. Keys a
    // sequence holds past seqused_k get dK = dV = 0.
    const int* cu_seqlens_q;
    const int* cu_seqlens_k;
    const int* seqused_k;  // may be null
    int total_q;
    int total_k;
};
