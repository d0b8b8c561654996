// Naive GPU reference attention, forward and backward: the oracle for shapes too large for
// the CPU. Simple, not fast: one warp per query row (per key row for dK, dV), fp32 math
// throughout, exact expf/logf.
// Tile: 1 query row per warp, 4 warps per block; no shared memory; head dim <= 256
// (each lane owns dims lane, lane+32, ...). Registers: see `flashcore compile`.
// Same semantics as the f64 CPU reference: bottom-right causal, GQA, lse in natural log,
// fully masked rows give o = 0 and lse = -inf (with learnable sinks, lse = the sink).
#include "common/types.cuh"
#include "common/params.cuh"
#include "common/bwd_params.cuh"
#include "common/sinks.cuh"

namespace fc {

constexpr int kRefWarps = 4;
constexpr int kRefMaxDimPerLane = 8;  // 8 * 32 lanes = head dim 256

__device__ __forceinline__ float warp_sum(float x) {
    for (int offset = 16; offset > 0; offset >>= 1) x += __shfl_xor_sync(0xffffffffu, x, offset);
    return x;
}

__device__ __forceinline__ const elem_t* row_ptr(const void* base, long long sb, long long ss, long long sh,
                                                 int b, int s, int h) {
    return static_cast<const elem_t*>(base) + b * sb + s * ss + h * sh;
}

// The keys query row `row` sees: [visible_first, visible_last] (bottom-right aligned; see
// common/mask.cuh for the same rule in the fast kernels). Params: FwdParams or BwdParams.
// With chunked attention (p.attention_chunk > 0) the keys of the chunk that holds the
// diagonal key only: [chunk_start(diagonal), chunk_start(diagonal) + attention_chunk).
template <class Params> __device__ __forceinline__ int chunk_start(const Params& p, int key) {
    const int c = p.attention_chunk;
    return key - (key % c + c) % c;  // floored, for diagonals left of key 0 too
}
template <class Params> __device__ __forceinline__ int visible_first(const Params& p, int row) {
    const int diagonal = row + p.seqlen_k - p.seqlen_q;
    int first = p.window_left >= 0 ? max(0, diagonal - p.window_left) : 0;
    if (p.attention_chunk > 0) first = max(first, chunk_start(p, diagonal));
    return first;
}
template <class Params> __device__ __forceinline__ int visible_last(const Params& p, int row) {
    const int diagonal = row + p.seqlen_k - p.seqlen_q;
    int last = p.seqlen_k - 1;
    if (p.causal) last = min(last, diagonal);
    if (p.window_right >= 0) last = min(last, diagonal + p.window_right);
    if (p.attention_chunk > 0) last = min(last, chunk_start(p, diagonal) + p.attention_chunk - 1);
    return last;
}

// A score (q·k times the softmax scale) after logit softcapping, when p.softcap > 0.
template <class Params> __device__ __forceinline__ float softcapped(const Params& p, float s) {
    return p.softcap > 0.f ? p.softcap * tanhf(s / p.softcap) : s;
}

// ALiBi's bias of score (row, key) in logit units, after the softcap: -slope · |row + Sk - Sq -
// key|, 0 without slopes (p.alibi_slopes null). The slope as given (p.alibi_scale converts it
// to the fast kernels' units; these scores are already logits).
template <class Params> __device__ __forceinline__ float alibi_bias(const Params& p, int batch, int head, int row, int key) {
    if (p.alibi_slopes == nullptr) return 0.f;
    const float slope = p.alibi_slopes[(long long)batch * p.alibi_batch_stride + head];
    return -slope * fabsf(static_cast<float>(row + p.seqlen_k - p.seqlen_q - key));
}

}  // namespace fc

extern "C" __global__ void __launch_bounds__(32 * fc::kRefWarps) fc_reference(const FwdParams p) {
    using namespace fc;
    const int lane = threadIdx.x % 32;
    const int row = blockIdx.x * kRefWarps + threadIdx.x / 32;
    const int head = blockIdx.y, batch = blockIdx.z;
    if (row >= p.seqlen_q) return;
    const int kv_head = head / (p.heads_q / p.heads_kv);

    float q[kRefMaxDimPerLane], acc[kRefMaxDimPerLane];
    const elem_t* q_row = row_ptr(p.q, p.q_stride_b, p.q_stride_s, p.q_stride_h, batch, row, head);
#pragma unroll
    for (int c = 0; c < kRefMaxDimPerLane; ++c) {
        const int d = lane + 32 * c;
        q[c] = d < p.head_dim ? to_float(q_row[d]) * p.softmax_scale : 0.f;
        acc[c] = 0.f;
    }

    // Keys first..last are visible (first > last: a fully masked row); the mask, the softcap
    // and ALiBi are run-time here (p.causal, p.window_left/right, p.softcap, p.alibi_slopes),
    // exact tanhf.
    const int first = visible_first(p, row), last = visible_last(p, row);
    float row_max = -__int_as_float(0x7f800000), row_sum = 0.f;
    for (int j = first; j <= last; ++j) {
        const elem_t* k_row = row_ptr(p.k, p.k_stride_b, p.k_stride_s, p.k_stride_h, batch, j, kv_head);
        const elem_t* v_row = row_ptr(p.v, p.v_stride_b, p.v_stride_s, p.v_stride_h, batch, j, kv_head);
        float partial = 0.f;
#pragma unroll
        for (int c = 0; c < kRefMaxDimPerLane; ++c) {
            const int d = lane + 32 * c;
            if (d < p.head_dim) partial += q[c] * to_float(k_row[d]);
        }
        const float s = softcapped(p, warp_sum(partial)) + alibi_bias(p, batch, head, row, j);
        const float new_max = fmaxf(row_max, s);
        const float correction = expf(row_max - new_max);  // expf(-inf) = 0 on the first key
        const float weight = expf(s - new_max);
        row_sum = row_sum * correction + weight;
#pragma unroll
        for (int c = 0; c < kRefMaxDimPerLane; ++c) {
            const int d = lane + 32 * c;
            if (d < p.head_dim) acc[c] = acc[c] * correction + weight * to_float(v_row[d]);
        }
        row_max = new_max;
    }

    float inv_sum = last >= first ? 1.f / row_sum : 0.f;
    float lse = last >= first ? row_max + logf(row_sum) : -__int_as_float(0x7f800000);
    if (p.learnable_sink != nullptr) sinks::fold(p.learnable_sink[head], inv_sum, lse);  // run-time here
    elem_t* o_row = static_cast<elem_t*>(p.o) + batch * p.o_stride_b + row * p.o_stride_s + head * p.o_stride_h;
#pragma unroll
    for (int c = 0; c < kRefMaxDimPerLane; ++c) {
        const int d = lane + 32 * c;
        if (d < p.head_dim) o_row[d] = from_float<elem_t>(acc[c] * inv_sum);
    }
    if (p.lse != nullptr && lane == 0) {
        p.lse[((long long)batch * p.heads_q + head) * p.seqlen_q + row] = lse;
    }
}

// Backward, in two launches on one stream (HOST CONTRACT: block 128 threads, no shared
// memory; fc_reference_bwd_dq first, grid (ceil(Sq / 4), Hq, B); then fc_reference_bwd_dkv,
// grid (ceil(Sk / 4), Hkv, B)). The first writes dQ and D_i = rowsum(dO ∘ O) to p.dsum; the
// second reads D_i and writes dK and dV, looping over every query of the query heads that
// share the KV head (no atomics: deterministic). P is recomputed from q, k and the saved
// lse; a row with lse = -inf saw no key and contributes nothing. The window (p.causal and
// p.window_left/right), the softcap and ALiBi are run-time, as in the forward: dS of a
// softcapped score is P ∘ (dP − D_i) times 1 − tanh² (see softcap_grad in common/mask.cuh),
// ALiBi's bias (a constant of the score) changes P alone.
namespace fc {

// The gradient factor of a softcapped score c = capped(s) with respect to s (1 without).
__device__ __forceinline__ float capped_grad(const BwdParams& p, float c) {
    if (p.softcap <= 0.f) return 1.f;
    const float t = c / p.softcap;
    return 1.f - t * t;
}

// The queries that see key `key`: [first, last] within [0, Sq) (the transpose of
// visible_first/last).
__device__ __forceinline__ int seeing_first(const BwdParams& p, int key) {
    const int offset = p.seqlen_k - p.seqlen_q;
    const int right = p.causal ? 0 : p.window_right;
    int first = right >= 0 ? max(0, key - offset - right) : 0;
    if (p.attention_chunk > 0) first = max(first, chunk_start(p, key) - offset);
    return first;
}
__device__ __forceinline__ int seeing_last(const BwdParams& p, int key) {
    const int offset = p.seqlen_k - p.seqlen_q;
    int last = p.window_left >= 0 ? min(p.seqlen_q - 1, key - offset + p.window_left) : p.seqlen_q - 1;
    if (p.attention_chunk > 0) last = min(last, chunk_start(p, key) + p.attention_chunk - 1 - offset);
    return last;
}

__device__ __forceinline__ elem_t* mut_row_ptr(void* base, long long sb, long long ss, long long sh, int b, int s, int h) {
    return static_cast<elem_t*>(base) + b * sb + s * ss + h * sh;
}

// Loads row `r` (head_dim values, this lane's dims lane, lane + 32, ...) as f32.
__device__ __forceinline__ void load_row(float (&x)[kRefMaxDimPerLane], const elem_t* r, int head_dim, int lane) {
#pragma unroll
    for (int c = 0; c < kRefMaxDimPerLane; ++c) {
        const int d = lane + 32 * c;
        x[c] = d < head_dim ? to_float(r[d]) : 0.f;
    }
}

__device__ __forceinline__ float row_dot(const float (&a)[kRefMaxDimPerLane], const float (&b)[kRefMaxDimPerLane]) {
    float partial = 0.f;
#pragma unroll
    for (int c = 0; c < kRefMaxDimPerLane; ++c) partial += a[c] * b[c];
    return warp_sum(partial);
}

__device__ __forceinline__ void store_row(elem_t* r, const float (&x)[kRefMaxDimPerLane], float scale, int head_dim, int lane) {
#pragma unroll
    for (int c = 0; c < kRefMaxDimPerLane; ++c) {
        const int d = lane + 32 * c;
        if (d < head_dim) r[d] = from_float<elem_t>(x[c] * scale);
    }
}

}  // namespace fc

extern "C" __global__ void __launch_bounds__(32 * fc::kRefWarps) fc_reference_bwd_dq(const BwdParams p) {
    using namespace fc;
    const int lane = threadIdx.x % 32;
    const int row = blockIdx.x * kRefWarps + threadIdx.x / 32;
    const int head = blockIdx.y, batch = blockIdx.z;
    if (row >= p.seqlen_q) return;
    const int kv_head = head / (p.heads_q / p.heads_kv);

    float q[kRefMaxDimPerLane], dout[kRefMaxDimPerLane], dq[kRefMaxDimPerLane];
    load_row(q, row_ptr(p.q, p.q_stride_b, p.q_stride_s, p.q_stride_h, batch, row, head), p.head_dim, lane);
    load_row(dout, row_ptr(p.dout, p.do_stride_b, p.do_stride_s, p.do_stride_h, batch, row, head), p.head_dim, lane);
    const long long stat = ((long long)batch * p.heads_q + head) * p.seqlen_q + row;
    const float lse = p.lse[stat];
    const bool sees_keys = lse != -__int_as_float(0x7f800000);
    const int first = visible_first(p, row), last = !sees_keys ? -1 : visible_last(p, row);

    // D_i = rowsum(dO ∘ O) = Σ_j P_ij dP_ij, taken here from P and dP in f32 rather than from
    // the stored O: where the softmax is nearly one-hot, dP_ij − D_i cancels, and O's bf16
    // rounding alone would cost ~1% of dQ (measured: D192 with large logits). The reference
    // stays as exact as f32 allows; p.o is not read.
    float dsum = 0.f;
    for (int j = first; j <= last; ++j) {
        float k[kRefMaxDimPerLane], v[kRefMaxDimPerLane];
        load_row(k, row_ptr(p.k, p.k_stride_b, p.k_stride_s, p.k_stride_h, batch, j, kv_head), p.head_dim, lane);
        load_row(v, row_ptr(p.v, p.v_stride_b, p.v_stride_s, p.v_stride_h, batch, j, kv_head), p.head_dim, lane);
        dsum += expf(softcapped(p, p.softmax_scale * row_dot(q, k)) + alibi_bias(p, batch, head, row, j) - lse) * row_dot(dout, v);
    }
    if (lane == 0) p.dsum[stat] = dsum;

#pragma unroll
    for (int c = 0; c < kRefMaxDimPerLane; ++c) dq[c] = 0.f;
    for (int j = first; j <= last; ++j) {
        float k[kRefMaxDimPerLane], v[kRefMaxDimPerLane];
        load_row(k, row_ptr(p.k, p.k_stride_b, p.k_stride_s, p.k_stride_h, batch, j, kv_head), p.head_dim, lane);
        load_row(v, row_ptr(p.v, p.v_stride_b, p.v_stride_s, p.v_stride_h, batch, j, kv_head), p.head_dim, lane);
        const float c = softcapped(p, p.softmax_scale * row_dot(q, k));
        const float prob = expf(c + alibi_bias(p, batch, head, row, j) - lse);
        const float ds = prob * (row_dot(dout, v) - dsum) * capped_grad(p, c);
#pragma unroll
        for (int c = 0; c < kRefMaxDimPerLane; ++c) dq[c] += ds * k[c];
    }
    store_row(mut_row_ptr(p.dq, p.dq_stride_b, p.dq_stride_s, p.dq_stride_h, batch, row, head), dq, p.softmax_scale, p.head_dim, lane);
}

extern "C" __global__ void __launch_bounds__(32 * fc::kRefWarps) fc_reference_bwd_dkv(const BwdParams p) {
    using namespace fc;
    const int lane = threadIdx.x % 32;
    const int key = blockIdx.x * kRefWarps + threadIdx.x / 32;
    const int kv_head = blockIdx.y, batch = blockIdx.z;
    if (key >= p.seqlen_k) return;
    const int group = p.heads_q / p.heads_kv;

    float k[kRefMaxDimPerLane], v[kRefMaxDimPerLane], dk[kRefMaxDimPerLane], dv[kRefMaxDimPerLane];
    load_row(k, row_ptr(p.k, p.k_stride_b, p.k_stride_s, p.k_stride_h, batch, key, kv_head), p.head_dim, lane);
    load_row(v, row_ptr(p.v, p.v_stride_b, p.v_stride_s, p.v_stride_h, batch, key, kv_head), p.head_dim, lane);
#pragma unroll
    for (int c = 0; c < kRefMaxDimPerLane; ++c) dk[c] = dv[c] = 0.f;
    const int first = seeing_first(p, key), last = seeing_last(p, key);
    for (int head = kv_head * group; head < (kv_head + 1) * group; ++head) {
        for (int i = first; i <= last; ++i) {
            const long long stat = ((long long)batch * p.heads_q + head) * p.seqlen_q + i;
            const float lse = p.lse[stat];
            if (lse == -__int_as_float(0x7f800000)) continue;
            float q[kRefMaxDimPerLane], dout[kRefMaxDimPerLane];
            load_row(q, row_ptr(p.q, p.q_stride_b, p.q_stride_s, p.q_stride_h, batch, i, head), p.head_dim, lane);
            load_row(dout, row_ptr(p.dout, p.do_stride_b, p.do_stride_s, p.do_stride_h, batch, i, head), p.head_dim, lane);
            const float c = softcapped(p, p.softmax_scale * row_dot(q, k));
            const float prob = expf(c + alibi_bias(p, batch, head, i, key) - lse);
            const float ds = prob * (row_dot(dout, v) - p.dsum[stat]) * capped_grad(p, c);
#pragma unroll
            for (int c = 0; c < kRefMaxDimPerLane; ++c) {
                dv[c] += prob * dout[c];
                dk[c] += ds * q[c];
            }
        }
    }
    store_row(mut_row_ptr(p.dk, p.dk_stride_b, p.dk_stride_s, p.dk_stride_h, batch, key, kv_head), dk, p.softmax_scale, p.head_dim, lane);
    store_row(mut_row_ptr(p.dv, p.dv_stride_b, p.dv_stride_s, p.dv_stride_h, batch, key, kv_head), dv, 1.f, p.head_dim, lane);
}

// dsink (common/sinks.cuh) from fc_reference_bwd_dq's D_i: one block a query head.
extern "C" __global__ void __launch_bounds__(fc::sinks::kGradThreads) fc_reference_bwd_dsink(const BwdParams p) {
    fc::sinks::grad_over_rows(p, p.dsum, p.batch, p.seqlen_q);
}
