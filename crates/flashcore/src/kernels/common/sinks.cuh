// Learnable sinks (gpt-oss; FlashAttention-4's `learnable_sink`): one logit a query head that
// joins every row's softmax denominator with no value behind it,
//   o = Σ exp(s − m)·v / (Σ exp(s − m) + exp(sink − m)),   lse = log(Σ exp(s) + exp(sink)),
// the sink neither scaled nor softcapped. A kernel folds it into a row once its keys are all
// seen: from the row's 1 / sum and natural-log LSE (OnlineSoftmax::finish), the new LSE is
// logaddexp(lse, sink) and O's factor shrinks by exp(lse − new lse) ≤ 1, so nothing overflows
// whatever the sink. A row that saw no key (lse −inf, 1 / sum 0) gets lse = sink and o = 0.
// Split-KV partials are not final: the combine (common/split_combine.cuh) takes the sink as
// one more partial with no value. With GQA heads packed as rows (decode), a row's sink is its
// own query head's (sink_of).
//
// The backward: dQ, dK and dV need only the forward's LSE, which holds the sink. The sink's
// own gradient is dsink = −Σ_i P_i(sink)·D_i over a head's rows (every sequence's), with
// P_i(sink) = exp(sink − lse_i) the sink's probability in row i and D_i = dO_i·O_i, the
// statistic the backward's first kernel computes anyway: each backward family's
// `fc_bwd_*_dsink` (one block a head, after the rest) reads D_i and the LSE where that family
// keeps them and sums the rows in a fixed order, so dsink repeats bit for bit.
#pragma once
#include "common/types.cuh"
#include "ptx/math.cuh"

namespace fc {
namespace sinks {

// In the MUFU's base-2 instructions, as the softmax itself: a few registers beside the O
// accumulators of wide heads (expf and log1pf spilled D256's fullest forms).
__device__ __forceinline__ void fold(float sink, float& inv_sum, float& lse) {
    const float gap = -fabsf(lse - sink) * kLog2e;  // lse −inf: −inf, and total = sink
    const float total = fmaxf(lse, sink) + math::lg2(1.f + math::ex2(gap)) * kLn2;  // logaddexp
    inv_sum *= math::ex2((lse - total) * kLog2e);
    lse = total;
}

// The sink of row `row` of head `head` as the kernel holds them (FC_SCORE_MOD_FIELDS): the
// head's, or, with p.sink_group = G query heads packed as a KV head's rows, query head
// head·G + row (a tile's padding rows past G read the last one's, and store nothing).
template <class Params>
__device__ __forceinline__ float sink_of(const Params& p, int head, int row) {
    const int group = p.sink_group;
    return p.learnable_sink[group == 0 ? head : head * group + min(row, group - 1)];
}

// The sinks' gradient kernels: one block of kGradThreads threads a query head.
constexpr int kGradThreads = 256;

// Row i's share of its head's dsink, −P_i(sink)·D_i, from the sink and the LSE in base 2. A
// padded row (lse·log2e = +inf, D_i = 0) gives 0.
__device__ __forceinline__ float grad_share(float sink_log2, float lse_log2, float d) {
    return -math::ex2(sink_log2 - lse_log2) * d;
}

// The block's sum of its threads' `part`s, in one order every run: each warp's by shuffles,
// then thread 0 over the warps' sums, which thread 0 returns.
__device__ __forceinline__ float block_sum(float part) {
    __shared__ float warp_sums[kGradThreads / 32];
#pragma unroll
    for (int offset = 16; offset > 0; offset >>= 1) part += __shfl_xor_sync(0xffffffffu, part, offset);
    if (threadIdx.x % 32 == 0) warp_sums[threadIdx.x / 32] = part;
    __syncthreads();
    float sum = 0.f;
    if (threadIdx.x == 0) {
#pragma unroll
        for (int w = 0; w < kGradThreads / 32; ++w) sum += warp_sums[w];
    }
    return sum;
}

// dsink of head blockIdx.x from D_i and the natural-log LSE laid out row-major by (batch, head)
// as the forward's LSE: `batches` x [Hq, rows] (bwd_sm80's D_i and the reference's; packed,
// one batch of total_q rows).
template <class Params>
__device__ __forceinline__ void grad_over_rows(const Params& p, const float* dsum, int batches, int rows) {
    const int head = blockIdx.x;
    const float sink_log2 = p.learnable_sink[head] * kLog2e;
    float part = 0.f;
    for (int b = 0; b < batches; ++b) {
        const long long at = (static_cast<long long>(b) * p.heads_q + head) * rows;
        for (int r = threadIdx.x; r < rows; r += kGradThreads) part += grad_share(sink_log2, p.lse[at + r] * kLog2e, dsum[at + r]);
    }
    const float sum = block_sum(part);
    if (threadIdx.x == 0) p.dsink[head] = sum;
}

}  // namespace sinks
}  // namespace fc
