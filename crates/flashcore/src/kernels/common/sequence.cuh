// Where a tile's sequence lies in the tensors: the batch entry's own offsets and lengths, from
// cu_seqlens for a packed (varlen) batch (FC_VARLEN; see FwdParams and BwdParams, which share
// the fields read here), else batch-strided ones of the common lengths.
#pragma once

#include "common/bwd_params.cuh"
#include "common/params.cuh"
#include "common/types.cuh"

#ifndef FC_VARLEN
#define FC_VARLEN 0
#endif

namespace fc {

// Sequence `batch`: its rows start at q_start of q and o and at k_start of k and v (offsets
// added to the batch stride, which is 0 when packed), and it has seqlen_q queries and
// seqlen_k keys.
struct Sequence {
    int q_start, k_start, seqlen_q, seqlen_k;
};

__device__ __forceinline__ int clamp_to(int x, int lo, int hi) { return min(max(x, lo), hi); }

// Params: FwdParams or BwdParams (seqlen_q/k, cu_seqlens_q/k, seqused_k, total_q/k).
template <bool kVarlen, class Params> __device__ __forceinline__ Sequence sequence(const Params& p, int batch) {
    if (!kVarlen) return Sequence{0, 0, p.seqlen_q, p.seqlen_k};
    // Clamped to the tensors (and to the grid's extent), so that a malformed cu_seqlens
    // cannot send a load or a store outside them.
    Sequence s;
    s.q_start = clamp_to(p.cu_seqlens_q[batch], 0, p.total_q);
    s.seqlen_q = min(clamp_to(p.cu_seqlens_q[batch + 1], s.q_start, p.total_q) - s.q_start, p.seqlen_q);
    s.k_start = clamp_to(p.cu_seqlens_k[batch], 0, p.total_k);
    const int used = p.seqused_k != nullptr ? s.k_start + p.seqused_k[batch] : p.cu_seqlens_k[batch + 1];
    s.seqlen_k = min(clamp_to(used, s.k_start, p.total_k) - s.k_start, p.seqlen_k);
    return s;
}

// The offset of row `row` of (batch, head)'s LSE (and of the backward's per-row D_i, laid out
// alike): [B, Hq, Sq], or [Hq, total_q] when packed.
template <bool kVarlen, class Params>
__device__ __forceinline__ long long lse_offset(const Params& p, const Sequence& s, int batch, int head) {
    return kVarlen ? static_cast<long long>(head) * p.total_q + s.q_start
                   : (static_cast<long long>(batch) * p.heads_q + head) * p.seqlen_q;
}

// The query rows of the tensors as one batch sees them (q, o, dout, dq and per-row statistics):
// B batches of seqlen_q rows, or one of total_q rows when packed.
template <bool kVarlen, class Params> __device__ __forceinline__ int row_batches(const Params& p) { return kVarlen ? 1 : p.batch; }
template <bool kVarlen, class Params> __device__ __forceinline__ int rows_q(const Params& p) {
    return kVarlen ? p.total_q : p.seqlen_q;
}

// The backward of a packed batch with seqused_k: zeros for dK and dV of the keys sequence
// `batch` holds past the ones it uses, [k_start + seqlen_k, cu_seqlens_k[batch + 1]) (no query
// sees them), by kThreads threads, 16 bytes a thread (kCols, the head dim, and kColsV, V's,
// multiples of 8).
template <int kCols, int kThreads, int kColsV = kCols>
__device__ __forceinline__ void zero_unused_keys(const BwdParams& p, const Sequence& seq, int batch, int kv_head) {
    const int first = seq.k_start + seq.seqlen_k, end = clamp_to(p.cu_seqlens_k[batch + 1], first, p.total_k);
    constexpr int kChunks = (kCols > kColsV ? kCols : kColsV) / 8;
    struct alignas(16) Zero {
        u32 x[4];
    };
#pragma unroll 1
    for (i64 i = threadIdx.x; i < (i64)(end - first) * kChunks; i += kThreads) {
        const i64 key = first + i / kChunks;
        const int col = 8 * static_cast<int>(i % kChunks);
        if (kCols >= kColsV || col < kCols) {
            *reinterpret_cast<Zero*>(static_cast<elem_t*>(p.dk) + key * p.dk_stride_s + kv_head * p.dk_stride_h + col) = Zero{};
        }
        if (kColsV >= kCols || col < kColsV) {
            *reinterpret_cast<Zero*>(static_cast<elem_t*>(p.dv) + key * p.dv_stride_s + kv_head * p.dv_stride_h + col) = Zero{};
        }
    }
}

}  // namespace fc
