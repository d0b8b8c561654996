// Online softmax over mma.sync m16n8 accumulator fragments (see ptx/mma.cuh), for the
// Ampere-class forward. A warp owns kM row tiles of 16 rows; in each, a lane holds rows
// g and g + 8 (g = lane / 4), two adjacent columns per 8-column n-tile, so a row is spread
// over the 4 lanes of a quad and a row reduction is two xor-shuffles.
//
// Numerics:
// - Base 2 with the scale folded: p = 2^(s·c − m·c), c = softmax_scale·log2(e). This is
//   exactly exp(scale·(s − m)), but costs one FFMA and one MUFU.EX2 per element, where
//   expf would add a multiply and range reduction. m is the running max of the raw scores.
// - The -inf guard: a row that has seen no visible key has m = -inf. Its shift is taken
//   as 0, so masked scores give 2^(-inf) = 0 rather than 2^(-inf + inf) = NaN, and its
//   rescale factor 2^(-inf) = 0 multiplies an accumulator that is still 0.
// - Row sums stay per-lane partial until finish(): the rescale factors are equal across
//   a quad, so summing the four partials once at the end is exact (and saves 2 shuffles
//   per row per key block).
// - A row with no visible key at all ends with sum 0: output 0 and lse = -inf, not NaN.
#pragma once
#include "common/quad.cuh"
#include "common/types.cuh"
#include "ptx/math.cuh"

namespace fc {

template <int kM> struct OnlineSoftmax {
    float row_max[kM][2];
    float row_sum[kM][2];

    __device__ __forceinline__ OnlineSoftmax() {
#pragma unroll
        for (int m = 0; m < kM; ++m)
#pragma unroll
            for (int r = 0; r < 2; ++r) {
                row_max[m][r] = math::neg_inf();
                row_sum[m][r] = 0.f;
            }
    }

    // Scores s (kN n-tiles per row tile) become unnormalised probabilities in place;
    // `rescale` gets the factor each output row must be multiplied by.
    template <int kN>
    __device__ __forceinline__ void update(float (&s)[kM][kN][4], float scale_log2, float (&rescale)[kM][2]) {
#pragma unroll
        for (int m = 0; m < kM; ++m)
#pragma unroll
            for (int r = 0; r < 2; ++r) {
                float mx = row_max[m][r];
#pragma unroll
                for (int j = 0; j < kN; ++j) mx = fmaxf(mx, fmaxf(s[m][j][2 * r], s[m][j][2 * r + 1]));
                mx = quad_max(mx);
                const float shift = mx == math::neg_inf() ? 0.f : mx * scale_log2;
                rescale[m][r] = math::ex2(row_max[m][r] * scale_log2 - shift);
                row_max[m][r] = mx;
                float sum = 0.f;
#pragma unroll
                for (int j = 0; j < kN; ++j)
#pragma unroll
                    for (int c = 0; c < 2; ++c) {
                        float& x = s[m][j][2 * r + c];
                        x = math::ex2(fmaf(x, scale_log2, -shift));
                        sum += x;
                    }
                row_sum[m][r] = row_sum[m][r] * rescale[m][r] + sum;
            }
    }

    // 1/rowsum for the output (0 for a row that saw no key) and the natural-log
    // log-sum-exp of the scaled scores, m·scale + ln(sum) (-inf for such a row).
    __device__ __forceinline__ void finish(float scale_log2, float (&inv_sum)[kM][2], float (&lse)[kM][2]) {
#pragma unroll
        for (int m = 0; m < kM; ++m)
#pragma unroll
            for (int r = 0; r < 2; ++r) {
                const float sum = quad_sum(row_sum[m][r]);
                const bool empty = sum == 0.f;
                inv_sum[m][r] = empty ? 0.f : math::rcp(sum);
                lse[m][r] = empty ? math::neg_inf() : (row_max[m][r] * scale_log2 + math::lg2(sum)) * kLn2;
            }
    }
};

}  // namespace fc
