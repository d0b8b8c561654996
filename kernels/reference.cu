// Naive GPU reference attention: the oracle for shapes too large for the CPU.
// Simple, not fast: one warp per query row, fp32 math throughout, exact expf/logf.
// Tile: 1 query row per warp, 4 warps per block; no shared memory; head dim <= 256
// (each lane owns dims lane, lane+32, ...). Registers: see `flashcore compile`.
// Same semantics as the f64 CPU reference: bottom-right causal, GQA, lse in natural log,
// fully masked rows give o = 0 and lse = -inf.
#include "common/types.cuh"
#include "common/params.cuh"

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

    // Keys 0..last are visible; last < 0 means a fully masked row.
    const int last = p.causal ? min(p.seqlen_k - 1, row + p.seqlen_k - p.seqlen_q) : p.seqlen_k - 1;
    float row_max = -__int_as_float(0x7f800000), row_sum = 0.f;
    for (int j = 0; j <= last; ++j) {
        const elem_t* k_row = row_ptr(p.k, p.k_stride_b, p.k_stride_s, p.k_stride_h, batch, j, kv_head);
        const elem_t* v_row = row_ptr(p.v, p.v_stride_b, p.v_stride_s, p.v_stride_h, batch, j, kv_head);
        float partial = 0.f;
#pragma unroll
        for (int c = 0; c < kRefMaxDimPerLane; ++c) {
            const int d = lane + 32 * c;
            if (d < p.head_dim) partial += q[c] * to_float(k_row[d]);
        }
        const float s = warp_sum(partial);
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

    const float inv_sum = last >= 0 ? 1.f / row_sum : 0.f;
    elem_t* o_row = static_cast<elem_t*>(p.o) + batch * p.o_stride_b + row * p.o_stride_s + head * p.o_stride_h;
#pragma unroll
    for (int c = 0; c < kRefMaxDimPerLane; ++c) {
        const int d = lane + 32 * c;
        if (d < p.head_dim) o_row[d] = from_float<elem_t>(acc[c] * inv_sum);
    }
    if (p.lse != nullptr && lane == 0) {
        p.lse[((long long)batch * p.heads_q + head) * p.seqlen_q + row] =
            last >= 0 ? row_max + logf(row_sum) : row_max;  // row_max is -inf when masked
    }
}
