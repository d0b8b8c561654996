// Hopper forward attention (sm_90a), step 1: one warpgroup, TMA loads + wgmma, no overlap.
// Tile 64 x FC_BLOCK_N, one stage, 128 threads. Correctness baseline for the pipelined kernel.
#include "common/params.cuh"
#include "common/softmax_sm90.cuh"
#include "common/tile_sm90.cuh"
#include "common/types.cuh"
#include "ptx/mbarrier.cuh"
#include "ptx/tma.cuh"
#include "ptx/wgmma.cuh"

#ifndef FC_HEAD_DIM
#define FC_HEAD_DIM 128
#endif
#ifndef FC_CAUSAL
#define FC_CAUSAL 0
#endif
#ifndef FC_BLOCK_N
#define FC_BLOCK_N 128
#endif

namespace fc {
namespace fwd_sm90 {

constexpr int kHeadDim = FC_HEAD_DIM;
constexpr int kBlockM = 64;
constexpr int kBlockN = FC_BLOCK_N;
constexpr bool kCausal = FC_CAUSAL != 0;
constexpr int kThreads = 128;

struct SharedStorage {
    sm90::SmemTile<kBlockM, kHeadDim> q;
    sm90::SmemTile<kBlockN, kHeadDim> k;
    sm90::SmemTile<kBlockN, kHeadDim> v;
    alignas(8) u64 q_full;
    alignas(8) u64 kv_full;
};
constexpr unsigned kSmemBytes = sizeof(SharedStorage) + sm90::kSwizzlePeriod;

__device__ __forceinline__ SharedStorage& shared_storage() {
    extern __shared__ unsigned char smem_raw[];
    const u32 a = sm90::smem_addr(smem_raw);
    const u32 pad = (sm90::kSwizzlePeriod - (a % sm90::kSwizzlePeriod)) % sm90::kSwizzlePeriod;
    return *reinterpret_cast<SharedStorage*>(smem_raw + pad);
}

__device__ __forceinline__ int ceil_div(int a, int b) { return (a + b - 1) / b; }

// The key blocks one query tile visits, and from which block on masking is needed.
struct BlockRange {
    int n_end;        // blocks [0, n_end)
    int n_mask_from;  // blocks >= this need the seqlen or causal mask
};
__device__ __forceinline__ BlockRange key_blocks(const FwdParams& p, int m0, int block_m) {
    const int off = p.seqlen_k - p.seqlen_q;  // bottom-right alignment
    BlockRange r{ceil_div(p.seqlen_k, kBlockN), p.seqlen_k / kBlockN};
    if (kCausal) {
        const int last_row = min(m0 + block_m, p.seqlen_q) - 1;
        r.n_end = min(r.n_end, max(0, ceil_div(last_row + off + 1, kBlockN)));
        r.n_mask_from = min(r.n_mask_from, max(0, m0 + off) / kBlockN);
    }
    return r;
}

// Masks scores of keys past seqlen_k and, when causal, keys after the query's diagonal.
template <int R>
__device__ __forceinline__ void apply_mask(float (&s)[R], int row0, int col0, const FwdParams& p) {
    const int off = p.seqlen_k - p.seqlen_q;
#pragma unroll
    for (int i = 0; i < R; ++i) {
        const int col = col0 + 8 * (i / 4) + (i % 2);
        const int row = row0 + 8 * ((i / 2) % 2);
        if (col >= p.seqlen_k || (kCausal && col > row + off)) s[i] = sm90::neg_inf();
    }
}

// Normalises and writes this thread's two rows of O (and their LSE), rows past seqlen_q
// skipped.
__device__ __forceinline__ void store_output(float (&o)[kHeadDim / 2], sm90::OnlineSoftmax& softmax,
                                             const FwdParams& p, int row0, int head, int batch) {
    float inv[2], lse[2];
    softmax.finish(p.softmax_scale_log2, inv, lse);
    const int lane = threadIdx.x % 32;
    elem_t* out = static_cast<elem_t*>(p.o) + batch * p.o_stride_b + head * p.o_stride_h;
#pragma unroll
    for (int r = 0; r < 2; ++r) {
        const int row = row0 + 8 * r;
        if (row >= p.seqlen_q) continue;
        elem_t* dst = out + row * p.o_stride_s + 2 * (lane % 4);
#pragma unroll
        for (int j = 0; j < kHeadDim / 8; ++j)
            *reinterpret_cast<u32*>(dst + 8 * j) = pack2<elem_t>(o[4 * j + 2 * r] * inv[r], o[4 * j + 2 * r + 1] * inv[r]);
        if (p.lse != nullptr && lane % 4 == 0)
            p.lse[(static_cast<i64>(batch) * p.heads_q + head) * p.seqlen_q + row] = lse[r];
    }
}

}  // namespace fwd_sm90
}  // namespace fc

using namespace fc;
using namespace fc::fwd_sm90;

extern "C" __global__ void __launch_bounds__(kThreads, 1)
fc_fwd_sm90(const __grid_constant__ FwdParams p, const __grid_constant__ TmaDescriptor tma_q,
            const __grid_constant__ TmaDescriptor tma_k, const __grid_constant__ TmaDescriptor tma_v) {
    SharedStorage& smem = shared_storage();
    const int m_block = blockIdx.x, head = blockIdx.y, batch = blockIdx.z;
    const int kv_head = head / (p.heads_q / p.heads_kv);
    const int m0 = m_block * kBlockM;
    const BlockRange blocks = key_blocks(p, m0, kBlockM);
    const u32 q_full = sm90::smem_addr(&smem.q_full), kv_full = sm90::smem_addr(&smem.kv_full);
    const bool leader = threadIdx.x == 0;

    if (leader) {
        mbarrier::init(q_full, 1);
        mbarrier::init(kv_full, 1);
        mbarrier::fence_init();
    }
    __syncthreads();
    if (leader) {
        mbarrier::arrive_expect_tx(q_full, decltype(smem.q)::kBytes);
        smem.q.load(&tma_q, q_full, m0, head, batch);
    }

    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    const int row0 = m0 + 16 * warp + lane / 4;
    float o[kHeadDim / 2];
#pragma unroll
    for (int i = 0; i < kHeadDim / 2; ++i) o[i] = 0.f;
    sm90::OnlineSoftmax softmax;
    u32 phase = 0;

    mbarrier::wait(q_full, 0);
    for (int n = blocks.n_end - 1; n >= 0; --n) {
        if (leader) {
            mbarrier::arrive_expect_tx(kv_full, 2 * decltype(smem.k)::kBytes);
            smem.k.load(&tma_k, kv_full, n * kBlockN, kv_head, batch);
            smem.v.load(&tma_v, kv_full, n * kBlockN, kv_head, batch);
        }
        mbarrier::wait(kv_full, phase);
        phase ^= 1;

        float s[kBlockN / 2];
        sm90::gemm_qk(s, smem.q, 0, smem.k);
        wgmma::wait<0>();
        wgmma::fence_operands(s);
        if (n >= blocks.n_mask_from) apply_mask(s, row0, n * kBlockN + 2 * (lane % 4), p);
        float rescale[2];
        softmax.update(s, p.softmax_scale_log2, rescale);
        sm90::scale_rows(o, rescale);
        u32 pk[kBlockN / 4];
        sm90::to_operand(s, pk);
        sm90::gemm_pv(o, pk, smem.v);
        wgmma::wait<0>();
        wgmma::fence_operands(o);
        wgmma::fence_operands(pk);
        __syncthreads();  // K and V are overwritten next iteration
    }
    store_output(o, softmax, p, row0, head, batch);
}
