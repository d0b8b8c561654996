// The backward-attention launch ABI shared by every backward kernel.
// Mirrored field for field by `BwdParams` in crates/flashcore/src/pack.rs: change both
// together. The groups every pass shares are common/attn_fields.cuh's.
#pragma once
#include "common/attn_fields.cuh"

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
    // The learnable sinks' gradient, f32 [Hq] (null: not wanted): each family's
    // `fc_bwd_*_dsink`, after the rest (common/sinks.cuh).
    float* dsink;
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

    FC_PROBLEM_FIELDS
    int deterministic;         // 1: no order-dependent float atomics
    int dq_splits;             // slices of dq_accum (bwd_sm80 deterministic: one per CTA of a head)
    int spread_walks;          // bwd_sm90: 1 when all key blocks of a head fit on the GPU at once (common/bwd_schedule.cuh)

    // Sliding window and logit softcapping, and a packed batch: as FwdParams
    // (common/attn_fields.cuh). Packed, keys a sequence holds past seqused_k get dK = dV = 0.
    FC_SCORE_MOD_FIELDS
    FC_VARLEN_FIELDS
};
static_assert(sizeof(BwdParams) == 96 + 8 * 24 + 128 + 32, "out of step with pack.rs's BwdParams");
