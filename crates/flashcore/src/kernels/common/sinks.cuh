// Learnable sinks (gpt-oss; FlashAttention-4's `learnable_sink`): one logit a query head that
// joins every row's softmax denominator with no value behind it,
//   o = Σ exp(s − m)·v / (Σ exp(s − m) + exp(sink − m)),   lse = log(Σ exp(s) + exp(sink)),
// the sink neither scaled nor softcapped. A kernel folds it into a row once its keys are all
// seen: from the row's 1 / sum and natural-log LSE (OnlineSoftmax::finish), the new LSE is
// logaddexp(lse, sink) and O's factor shrinks by exp(lse − new lse) ≤ 1, so nothing overflows
// whatever the sink. A row that saw no key (lse −inf, 1 / sum 0) gets lse = sink and o = 0.
// Split-KV partials are not final and the combine does not fold it yet: the host runs sinks
// unsplit.
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

}  // namespace sinks
}  // namespace fc
