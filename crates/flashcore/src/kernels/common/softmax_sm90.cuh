// Online softmax over a wgmma accumulator tile (m64nN, f32), for the Hopper forward.
//
// Layout: in a warpgroup, thread t (warp w = t/32, lane l) holds rows 16w + l/4 and
// 16w + l/4 + 8; for each 8-column chunk j it holds s[4j+0..1] (first row) and s[4j+2..3]
// (second row), columns 8j + 2(l%4) + {0,1}. A row is spread over the 4 lanes of a quad,
// so row reductions are two xor-shuffles. (The sm80 helper's softmax works on mma.m16n8
// fragments of one warp; this is the same numerics on the warpgroup layout.)
//
// Numerics: base 2 with the softmax scale folded in, p = 2^(s·scale_log2 − shift), one
// FFMA and one MUFU.EX2 per element; the shift is the running max of the scores times
// scale_log2, kept in log2 units (lift() moves it by whole powers of 2). A row with no
// visible key so far has shift −inf; it is taken as 0 so that 2^(−inf) = 0 instead of
// 2^(−inf + inf) = NaN. Row sums stay per-thread partial until finish(): the rescale
// factors are equal across a quad, so summing late is exact.
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

// How far (log2 units) a row's running max may lag its true max before it is moved: 8 for
// 16-bit P; 0 for e4m3 P (fwd_sm90's FC_FP8), whose 3-bit mantissa makes every p but an
// exact power of two off by up to 2^-4: at the exact max a row's largest p is 1, exact, where
// with slack it could be any value up to 256 and carry that error into a row that one key
// dominates.
constexpr int kMaxSlack = 8;

template <int kSlack = kMaxSlack> struct OnlineSoftmaxOf {
    static constexpr float kMaxSlack = static_cast<float>(kSlack);
    float row_shift[2];  // the running max times scale_log2 (log2 units); −inf: no key yet
    float row_sum[2];

    __device__ __forceinline__ OnlineSoftmaxOf() {
        row_shift[0] = row_shift[1] = math::neg_inf();
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
            const float block_max = quad_max(tree_max(part));
            // −inf·scale is NaN for a zero scale: a row with no visible key stays at −inf.
            const float m = block_max == math::neg_inf() ? block_max : block_max * scale_log2;
            const float old = row_shift[r];
            const bool first = old == math::neg_inf();  // no visible key before this block
            const bool move = first ? m != math::neg_inf() : m - old > kMaxSlack;
            if (move) row_shift[r] = m;
            const float shift = row_shift[r] == math::neg_inf() ? 0.f : row_shift[r];
            rescale[r] = !move ? 1.f : first ? 0.f : math::ex2(old - shift);
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

    // Whether both rows have a running max (a row with none takes update()).
    __device__ __forceinline__ bool has_max() const {
        return row_shift[0] != math::neg_inf() && row_shift[1] != math::neg_inf();
    }

    // update() without the block max, for rows that have one: p = 2^(s·scale_log2 − shift)
    // at the rows' current shift, and the block's partial row sums in `block_sum`. This
    // saves update()'s FMNMX tree and shuffles (one instruction per score, a fifth of the
    // softmax) and lets the first exp2 start as soon as the scores land. Done (returns
    // true, O needs no rescale) when every p stays <= kFastLimit, which the partial sums
    // bound (each p is <= its row's sum); the caller adds the sums. Otherwise the caller
    // takes lift() when every sum is finite, or else recomputes the overwritten scores
    // (an exp2 that overflowed lost its score) and takes update().
    //
    // kFastLimit is what P's type holds: f16 up to 65504, so 2^15; bf16 has f32's
    // exponents, and 2^64 leaves the f32 sums and O far from overflow (a row would need
    // 2^63 keys at the limit). It is above any partial sum of p <= 2^kMaxSlack (BN/4 <= 64
    // scores a thread per row), so a block within update()'s slack never falls back.
#if defined(FC_DTYPE_BF16) && FC_DTYPE_BF16
    static constexpr float kFastLimit = 18446744073709551616.f;  // 2^64
#else
    static constexpr float kFastLimit = 32768.f;
#endif
    template <int R>
    __device__ __forceinline__ bool exp_at_current_max(float (&s)[R], float scale_log2, float (&block_sum)[2]) const {
        constexpr int kChunks = R / 4;
        static_assert(R / 2 * (1 << kSlack) <= kFastLimit, "block too wide for the limit");
        bool ok = true;
#pragma unroll
        for (int r = 0; r < 2; ++r) {
            float part[kChunks];
#pragma unroll
            for (int j = 0; j < kChunks; ++j) {
                float& x0 = s[4 * j + 2 * r];
                float& x1 = s[4 * j + 2 * r + 1];
                x0 = math::ex2(fmaf(x0, scale_log2, -row_shift[r]));
                x1 = math::ex2(fmaf(x1, scale_log2, -row_shift[r]));
                part[j] = x0 + x1;
            }
            block_sum[r] = tree_sum(part);
            ok = ok && block_sum[r] <= kFastLimit;
        }
        return ok;
    }
    __device__ __forceinline__ void add_block_sums(const float (&block_sum)[2]) {
        row_sum[0] += block_sum[0];
        row_sum[1] += block_sum[1];
    }

    // After exp_at_current_max fell back with finite sums: a row whose largest p passed
    // kFastLimit moves its shift up by that p's binary exponent less one, e, and its p's,
    // sums and O rows are multiplied by 2^-e: exact, so no score is needed again and its
    // p's land in [2, 4). Returns whether any row moved, with O's factors in `rescale`,
    // and adds the sums.
    template <int R>
    __device__ __forceinline__ bool lift(float (&s)[R], const float (&block_sum)[2], float (&rescale)[2]) {
        constexpr int kChunks = R / 4;
        bool moved = false;
#pragma unroll
        for (int r = 0; r < 2; ++r) {
            // A serial max, not a tree: this slow path runs where registers are short.
            float p_max = 0.f;
#pragma unroll
            for (int j = 0; j < kChunks; ++j) p_max = fmaxf(p_max, fmaxf(s[4 * j + 2 * r], s[4 * j + 2 * r + 1]));
            p_max = quad_max(p_max);  // finite: the sums were
            const bool move = p_max > kFastLimit;
            // p_max < 2^128, so e <= 126 and 2^-e is a normal float.
            const int e = move ? static_cast<int>((__float_as_uint(p_max) >> 23) & 0xff) - 128 : 0;
            const float f = __uint_as_float(static_cast<unsigned>(127 - e) << 23);
            if (move) {
                row_shift[r] += static_cast<float>(e);
#pragma unroll
                for (int j = 0; j < kChunks; ++j) s[4 * j + 2 * r] *= f, s[4 * j + 2 * r + 1] *= f;
            }
            rescale[r] = f;
            row_sum[r] = (row_sum[r] + block_sum[r]) * f;
            moved |= move;
        }
        return moved;
    }

    // Final 1/rowsum for the output (0 for a row that saw no key, so o = 0, never NaN) and
    // the natural-log log-sum-exp (−inf for such a row).
    __device__ __forceinline__ void finish(float (&inv_sum)[2], float (&lse)[2]) {
#pragma unroll
        for (int r = 0; r < 2; ++r) {
            const float sum = quad_sum(row_sum[r]);
            const bool empty = (sum == 0.f);
            inv_sum[r] = empty ? 0.f : 1.f / sum;
            lse[r] = empty ? math::neg_inf() : (row_shift[r] + __log2f(sum)) * kLn2;
        }
    }
};

using OnlineSoftmax = OnlineSoftmaxOf<>;

// Multiplies each accumulator row by its factor (rows as in the layout above).
template <int R> __device__ __forceinline__ void scale_rows(float (&acc)[R], const float (&f)[2]) {
#pragma unroll
    for (int i = 0; i < R; ++i) acc[i] *= f[(i >> 1) & 1];
}

}  // namespace sm90
}  // namespace fc
