// Online softmax over a wgmma accumulator tile (m64nN, f32), for the Hopper forward.
//
// Layout: in a warpgroup, thread t (warp w = t/32, lane l) holds rows 16w + l/4 and
// 16w + l/4 + 8; for each 8-column chunk j it holds s[4j+0..1] (first row) and s[4j+2..3]
// (second row), columns 8j + 2(l%4) + {0,1}. A row is spread over the 4 lanes of a quad,
// so row reductions are two xor-shuffles. (The sm80 helper's softmax works on mma.m16n8
// fragments of one warp; this is the same numerics on the warpgroup layout.)
//
// Numerics: base 2 with the softmax scale folded in, p = 2^(s·scale_log2 − m·scale_log2),
// one FFMA and one MUFU.EX2 per element. m is the running max of the raw scores. A row
// with no visible key so far has m = −inf; its shift is taken as 0 so that 2^(−inf) = 0
// instead of 2^(−inf + inf) = NaN. Row sums stay per-thread partial until finish(): the
// rescale factors are equal across a quad, so summing late is exact.
#pragma once
#include "common/quad.cuh"
#include "common/types.cuh"
#include "ptx/math.cuh"

namespace fc {
namespace sm90 {

// Pairwise reductions of an array (unrolled: log2(N) dependent steps instead of N).
template <int N> __device__ __forceinline__ float tree_max(float (&v)[N]) {
#pragma unroll
    for (int w = 1; w < N; w *= 2)
#pragma unroll
        for (int i = 0; i + w < N; i += 2 * w) v[i] = fmaxf(v[i], v[i + w]);
    return v[0];
}
template <int N> __device__ __forceinline__ float tree_sum(float (&v)[N]) {
#pragma unroll
    for (int w = 1; w < N; w *= 2)
#pragma unroll
        for (int i = 0; i + w < N; i += 2 * w) v[i] += v[i + w];
    return v[0];
}

// How far (log2 units) a row's running max may lag its true max before it is moved.
constexpr float kMaxSlack = 8.f;

struct OnlineSoftmax {
    float row_max[2];
    float row_sum[2];

    __device__ __forceinline__ OnlineSoftmax() {
        row_max[0] = row_max[1] = math::neg_inf();
        row_sum[0] = row_sum[1] = 0.f;
    }

    // Turns scores s into unnormalised probabilities in place; returns in `rescale` the
    // factor the output accumulator rows must be multiplied by (0 on the first block of a
    // row whose max was −inf, which is harmless: the accumulator is still 0 then), and
    // whether either factor differs from 1 (when none does, scaling O can be skipped).
    //
    // Lazy max: the running max moves only when a block's max exceeds it by more than
    // kMaxSlack (in log2 units). Until then p = 2^(s·c − m·c) may reach 2^kMaxSlack = 256,
    // harmless for the f32 sums and for P in bf16/f16, and the factor is exactly 1, so
    // after the first blocks of a row the O rescale (one FMUL per accumulator: D128 64 per
    // thread per block) is mostly skipped. The reductions are trees: the max and sum of a
    // row are chains of 4-cycle dependent adds otherwise.
    template <int R>
    __device__ __forceinline__ bool update(float (&s)[R], float scale_log2, float (&rescale)[2]) {
        constexpr int kChunks = R / 4;  // 8-column chunks; per row, 2 scores in each
        bool moved = false;
#pragma unroll
        for (int r = 0; r < 2; ++r) {
            float part[kChunks];
#pragma unroll
            for (int j = 0; j < kChunks; ++j) part[j] = fmaxf(s[4 * j + 2 * r], s[4 * j + 2 * r + 1]);
            const float old = row_max[r];
            const float m = fmaxf(old, quad_max(tree_max(part)));
            const bool first = old == math::neg_inf();  // no visible key before this block
            const bool move = first ? m != math::neg_inf() : (m - old) * scale_log2 > kMaxSlack;
            if (move) row_max[r] = m;
            const float shift = (row_max[r] == math::neg_inf()) ? 0.f : row_max[r] * scale_log2;
            // -inf·scale is NaN for a zero scale: the first factor is 0 without it.
            rescale[r] = !move ? 1.f : first ? 0.f : math::ex2(old * scale_log2 - shift);
            moved |= move;
#pragma unroll
            for (int j = 0; j < kChunks; ++j) {
                float& x0 = s[4 * j + 2 * r];
                float& x1 = s[4 * j + 2 * r + 1];
                x0 = math::ex2(fmaf(x0, scale_log2, -shift));
                x1 = math::ex2(fmaf(x1, scale_log2, -shift));
                part[j] = x0 + x1;
            }
            row_sum[r] = row_sum[r] * rescale[r] + tree_sum(part);
        }
        return moved;
    }

    // Final 1/rowsum for the output (0 for a row that saw no key, so o = 0, never NaN) and
    // the natural-log log-sum-exp (−inf for such a row).
    __device__ __forceinline__ void finish(float scale_log2, float (&inv_sum)[2], float (&lse)[2]) {
#pragma unroll
        for (int r = 0; r < 2; ++r) {
            const float sum = quad_sum(row_sum[r]);
            const bool empty = (sum == 0.f);
            inv_sum[r] = empty ? 0.f : 1.f / sum;
            lse[r] = empty ? math::neg_inf() : (row_max[r] * scale_log2 + __log2f(sum)) * kLn2;
        }
    }
};

// Multiplies each accumulator row by its factor (rows as in the layout above).
template <int R> __device__ __forceinline__ void scale_rows(float (&acc)[R], const float (&f)[2]) {
#pragma unroll
    for (int i = 0; i < R; ++i) acc[i] *= f[(i >> 1) & 1];
}

}  // namespace sm90
}  // namespace fc
