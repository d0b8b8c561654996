// Merging the partial results of split-KV attention (FlashDecoding). Split s of a query
// row saw a subset of the keys and left O_s, normalised over those keys, and their
// log-sum-exp L_s. Over all keys L = log Σ_s e^(L_s) and O = Σ_s e^(L_s − L) · O_s,
// computed with the largest L_s subtracted first so no term overflows. A split that saw
// no visible key has L_s = −inf and weight 0; a row that every split found empty (fully
// masked) ends with O = 0 and L = −inf, never NaN. A learnable sink (common/sinks.cuh) joins
// as one more partial whose O is 0: L = log(Σ_s e^(L_s) + e^sink), the weights e^(L_s − L)
// shrink by its share, and a row no split saw ends with O = 0 and L = sink.
//
// Partial layout (row = (batch · Hq + head) · Sq + query, the LSE index of the output):
// lse_accum[s · rows + row], o_accum[(s · rows + row) · D + column], f32. Varlen (a packed
// batch, common/sequence.cuh): the same layout with Sq the longest sequence's length
// (p.seqlen_q), so rows past a sequence's own queries hold nothing and are skipped; the
// output row is then the packed one, q_start + query, and the LSE index lse_offset's (with
// GQA packed, Sq and Hq are the packed ones: fwd_sm80's row_offset and lse_at map them back).
#pragma once
#include "common/quad.cuh"
#include "common/types.cuh"
#include "ptx/math.cuh"

namespace fc {
namespace split_kv {

// One warp merges the partials of one row, partial s (of num_splits) being partial row
// at(s) of o_accum and lse_accum, and with kSink the row's `sink`: every lane reduces the
// LSEs, then owns kD / 32 columns.
template <int kD, bool kSink, class PartialRow>
__device__ __forceinline__ void combine_partials(const float* o_accum, const float* lse_accum, PartialRow at,
                                                 int num_splits, float sink, elem_t* out, float* lse_out, int lane) {
    static_assert(kD % 32 == 0, "whole columns per lane");
    constexpr int kCols = kD / 32;
    float mx = math::neg_inf();
    for (int s = lane; s < num_splits; s += 32) mx = fmaxf(mx, lse_accum[at(s)]);
    mx = warp_max(mx);
    if constexpr (kSink) mx = fmaxf(mx, sink);
    float acc[kCols];
#pragma unroll
    for (int c = 0; c < kCols; ++c) acc[c] = 0.f;
    float lse = math::neg_inf();
    if (mx != math::neg_inf()) {
        float sum = 0.f;
        for (int s = lane; s < num_splits; s += 32) sum += math::ex2((lse_accum[at(s)] - mx) * kLog2e);
        sum = warp_sum(sum);
        if constexpr (kSink) sum += math::ex2((sink - mx) * kLog2e);
        lse = mx + math::lg2(sum) * kLn2;
        for (int s = 0; s < num_splits; ++s) {
            const float w = math::ex2((lse_accum[at(s)] - lse) * kLog2e);
            const float* o_s = o_accum + at(s) * kD + lane * kCols;
#pragma unroll
            for (int c = 0; c < kCols; ++c) acc[c] = fmaf(w, o_s[c], acc[c]);
        }
    }
#pragma unroll
    for (int c = 0; c < kCols; ++c) out[lane * kCols + c] = from_float<elem_t>(acc[c]);
    if (lse_out != nullptr && lane == 0) *lse_out = lse;
}

// The partials of split s at s * rows + row (the layout above).
template <int kD, bool kSink>
__device__ __forceinline__ void combine_row(const float* o_accum, const float* lse_accum, i64 rows, i64 row,
                                            int num_splits, float sink, elem_t* out, float* lse_out, int lane) {
    combine_partials<kD, kSink>(o_accum, lse_accum, [=](int s) { return s * rows + row; }, num_splits, sink, out, lse_out, lane);
}

}  // namespace split_kv
}  // namespace fc
