// Ampere-class backward attention (sm_80, sm_86, sm_89, sm_90), FlashAttention-2's algorithm:
// first version, correct before fast (no cp.async pipeline, no swizzle: padded rows instead).
//
// One CTA per (key block of kBlockN keys, KV head, batch): K and V of the block stay in
// shared memory, and dK, dV in registers, while the CTA walks every query block of every
// query head that shares the KV head (GQA sums there, no atomics), from the first block
// whose rows see the keys under the causal mask. Per query block:
//   S = Q·Kᵀ and dP = dO·Vᵀ (warp w: query rows 16w..16w+15, all kBlockN keys);
//   P = exp2(S·scale·log2e − lse·log2e), masked to 0; dS = P ∘ (dP − D_i); both to smem;
//   dV += Pᵀ·dO and dK += dSᵀ·Q (warp w: keys 16w..16w+15, all D columns);
//   dQ += dS·K (warp w: query rows 16w..), added in f32 to p.dq_accum with red.add.
// D_i = rowsum(dO ∘ O) comes from fc_bwd_sm80_dsum (before); fc_bwd_sm80_dq (after) scales
// dq_accum into dq. dQ's atomics make the sum order vary: not deterministic (the host runs
// the reference kernels when p.deterministic is asked for).
//
// Tile: kBlockM = kBlockN = 64, 4 warps. Shared memory: Q, dO, K, V rows of D + 8 elements
// (the 16-byte pad puts the 8 rows of an ldmatrix in distinct bank groups), P and dS rows of
// 72, lse and D_i: D64 56 KB, D128 88 KB (under sm_86/89's 99 KB). Registers (NVRTC 13.0,
// fp16 = bf16, 0 spills on sm_80/86/89/90a, and none with 13.5): D64 180-183, D128 244-247;
// two CTAs an SM. The products' k loops stay rolled (`#pragma unroll 1`): unrolled, ptxas
// hoisted every fragment load and spilled 8-40 bytes with NVRTC 13.0, PyTorch's, for a gain
// of 3-6%. dQ is taken 64 columns at a time (kDqCols): all 128 of D128's at once spilled.
//
// HOST CONTRACT
// fc_bwd_sm80_dsum(BwdParams): grid (ceil(Sq / 4), Hq, B), 128 threads: p.dsum[b, h, i].
// fc_bwd_sm80(BwdParams): grid (ceil(Sk / 64), Hkv, B), 128 threads, dynamic smem
//   sizeof(Smem) = FC_SMEM_BYTES (cudaFuncSetAttribute over 48 KB); p.dq_accum
//   [B, Sq, Hq, D] f32 zeroed.
// fc_bwd_sm80_dq(BwdParams): grid (ceil(B * Sq * Hq * D / 256)), 256 threads.
// Pointers 16-byte aligned, strides multiples of 8 elements, last dim contiguous; causal is
// the compile-time FC_CAUSAL (bottom-right aligned).
#include "common/bwd_params.cuh"
#include "common/types.cuh"
#include "ptx/atomic.cuh"
#include "ptx/ldmatrix.cuh"
#include "ptx/math.cuh"
#include "ptx/mma.cuh"

#ifndef FC_HEAD_DIM
#define FC_HEAD_DIM 128
#endif
#ifndef FC_CAUSAL
#define FC_CAUSAL 0
#endif

namespace fc {
namespace bwd_sm80 {

constexpr int kD = FC_HEAD_DIM;
constexpr bool kCausal = FC_CAUSAL != 0;
constexpr int kBlockM = 64, kBlockN = 64, kWarps = 4, kThreads = 32 * kWarps;
constexpr int kRowD = kD + 8;        // padded row of Q, dO, K, V (elements)
constexpr int kRowN = kBlockN + 8;   // padded row of P and dS
constexpr int kDTiles = kD / 8;      // n-tiles of 8 columns across D
constexpr int kNTiles = kBlockN / 8; // n-tiles of 8 keys
static_assert(kBlockM == 16 * kWarps && kBlockN == 16 * kWarps, "a warp owns 16 rows of each product");
static_assert(kD % 16 == 0 && kD <= 128, "bwd_sm80 takes D 64 and 128 for now");

struct Smem {
    elem_t q[kBlockM][kRowD];
    elem_t dout[kBlockM][kRowD];
    elem_t k[kBlockN][kRowD];
    elem_t v[kBlockN][kRowD];
    elem_t p[kBlockM][kRowN];
    elem_t ds[kBlockM][kRowN];
    float lse_log2[kBlockM];  // +inf for rows that see nothing: P = exp2(-inf) = 0
    float dsum[kBlockM];
};
#ifdef FC_SMEM_BYTES
static_assert(sizeof(Smem) == FC_SMEM_BYTES, "the host's shared-memory size (bwd_sm80::smem_bytes) is out of step");
#endif

// ldmatrix lane offsets (bytes) into a padded tile of row length kRow. RowsFirst: the lane
// gives row lane%8 of matrix lane/8, matrices ordered (rows 0-7, 8-15) then (cols 0-7, 8-15):
// the A fragment of a row-major tile, or with .trans the two B fragments of a [k][n] tile.
// ColsFirst: matrices ordered by columns first: the two B fragments of an [n][k] tile, or
// with .trans the A fragment of a [k][m] tile. A block at (row0, col0) is then one constant
// further, which ptxas folds into the instruction when row0 and col0 are unrolled constants.
template <int kRow> __device__ __forceinline__ u32 rows_first(int lane) {
    return ((lane % 8 + 8 * ((lane >> 3) & 1)) * kRow + 8 * (lane >> 4)) * 2;
}
template <int kRow> __device__ __forceinline__ u32 cols_first(int lane) {
    return ((lane % 8 + 8 * (lane >> 4)) * kRow + 8 * ((lane >> 3) & 1)) * 2;
}
template <int kRow> constexpr u32 at(int row, int col) { return (row * kRow + col) * 2; }

struct alignas(16) Chunk {
    u32 x, y, z, w;
};

// Rows [0, valid) of a [rows x kD] tile from global memory, 16 bytes a copy; the rest
// zero-filled.
template <int kRows> __device__ __forceinline__ void load_tile(elem_t (*tile)[kRowD], const elem_t* g, i64 row_stride, int valid) {
    constexpr int kChunks = kD / 8;
    for (int i = threadIdx.x; i < kRows * kChunks; i += kThreads) {
        const int r = i / kChunks, c = i % kChunks;
        Chunk x{0, 0, 0, 0};
        if (r < valid) x = *reinterpret_cast<const Chunk*>(g + r * row_stride + c * 8);
        *reinterpret_cast<Chunk*>(&tile[r][c * 8]) = x;
    }
}

__device__ __forceinline__ void zero(float (&acc)[4]) { acc[0] = acc[1] = acc[2] = acc[3] = 0.f; }

// S (or dP) of the warp's 16 query rows = A(rows, :) · B(keys, :)ᵀ over D. `a`: the A
// tile's address at the warp's first row plus the lane's rows_first offset; `b`: the B
// tile's address plus its cols_first offset.
__device__ __forceinline__ void gemm_rows_keys(float (&acc)[kNTiles][4], u32 a, u32 b) {
#pragma unroll
    for (int j = 0; j < kNTiles; ++j) zero(acc[j]);
#pragma unroll 1
    for (int kk = 0; kk < kD / 16; ++kk) {
        u32 af[4];
        ldmatrix::x4(af, a + at<kRowD>(0, 16 * kk));
#pragma unroll
        for (int j = 0; j < kNTiles; j += 2) {
            u32 bf[4];
            ldmatrix::x4(bf, b + at<kRowD>(8 * j, 16 * kk));
            mma::m16n8k16<elem_t>(acc[j], af, bf[0], bf[1]);
            mma::m16n8k16<elem_t>(acc[j + 1], af, bf[2], bf[3]);
        }
    }
}

// acc(warp's 16 keys, D) += A(queries, keys)ᵀ · B(queries, D): Pᵀ·dO or dSᵀ·Q. `a`: the P or
// dS tile at the warp's first key column plus cols_first; `b`: the dO or Q tile plus
// rows_first.
__device__ __forceinline__ void gemm_keys_cols(float (&acc)[kDTiles][4], u32 a, u32 b) {
#pragma unroll 1
    for (int kk = 0; kk < kBlockM / 16; ++kk) {
        u32 af[4];
        ldmatrix::x4_trans(af, a + at<kRowN>(16 * kk, 0));
#pragma unroll
        for (int j = 0; j < kDTiles; j += 2) {
            u32 bf[4];
            ldmatrix::x4_trans(bf, b + at<kRowD>(16 * kk, 8 * j));
            mma::m16n8k16<elem_t>(acc[j], af, bf[0], bf[1]);
            mma::m16n8k16<elem_t>(acc[j + 1], af, bf[2], bf[3]);
        }
    }
}

// dQ is taken kDqCols columns at a time: its accumulators live beside dK's and dV's, and
// all of D128's at once spilled.
constexpr int kDqCols = kD > 64 ? 64 : kD;
constexpr int kDqTiles = kDqCols / 8;

// acc(warp's 16 query rows, columns col0..col0 + kDqCols) = dS(rows, keys) · K(keys, cols).
// `a`: the dS tile at the warp's first row plus rows_first; `b`: the K tile plus rows_first.
__device__ __forceinline__ void gemm_rows_cols(float (&acc)[kDqTiles][4], u32 a, u32 b, int col0) {
#pragma unroll
    for (int j = 0; j < kDqTiles; ++j) zero(acc[j]);
#pragma unroll 1
    for (int kk = 0; kk < kBlockN / 16; ++kk) {
        u32 af[4];
        ldmatrix::x4(af, a + at<kRowN>(0, 16 * kk));
#pragma unroll
        for (int j = 0; j < kDqTiles; j += 2) {
            u32 bf[4];
            ldmatrix::x4_trans(bf, b + at<kRowD>(16 * kk, col0 + 8 * j));
            mma::m16n8k16<elem_t>(acc[j], af, bf[0], bf[1]);
            mma::m16n8k16<elem_t>(acc[j + 1], af, bf[2], bf[3]);
        }
    }
}

}  // namespace bwd_sm80
}  // namespace fc

extern "C" __global__ void __launch_bounds__(128) fc_bwd_sm80_dsum(const BwdParams p) {
    using namespace fc;
    const int lane = threadIdx.x % 32, row = blockIdx.x * 4 + threadIdx.x / 32;
    const int head = blockIdx.y, batch = blockIdx.z;
    if (row >= p.seqlen_q) return;
    const elem_t* o = static_cast<const elem_t*>(p.o) + batch * p.o_stride_b + row * p.o_stride_s + head * p.o_stride_h;
    const elem_t* dout = static_cast<const elem_t*>(p.dout) + batch * p.do_stride_b + row * p.do_stride_s + head * p.do_stride_h;
    float sum = 0.f;
    for (int d = lane; d < p.head_dim; d += 32) sum += to_float(o[d]) * to_float(dout[d]);
    for (int offset = 16; offset > 0; offset >>= 1) sum += __shfl_xor_sync(0xffffffffu, sum, offset);
    if (lane == 0) p.dsum[((i64)batch * p.heads_q + head) * p.seqlen_q + row] = sum;
}

extern "C" __global__ void __launch_bounds__(fc::bwd_sm80::kThreads, 1) fc_bwd_sm80(const BwdParams p) {
    using namespace fc;
    using namespace fc::bwd_sm80;
    extern __shared__ __align__(128) unsigned char smem_raw[];
    Smem& sm = *reinterpret_cast<Smem*>(smem_raw);
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
    const int n0 = blockIdx.x * kBlockN, kv_head = blockIdx.y, batch = blockIdx.z;
    const int group = p.heads_q / p.heads_kv;
    const int offset = p.seqlen_k - p.seqlen_q;  // query i sees key j iff j <= i + offset
    const float scale_log2 = p.softmax_scale_log2;

    load_tile<kBlockN>(sm.k, static_cast<const elem_t*>(p.k) + batch * p.k_stride_b + n0 * p.k_stride_s + kv_head * p.k_stride_h,
                       p.k_stride_s, min(kBlockN, p.seqlen_k - n0));
    load_tile<kBlockN>(sm.v, static_cast<const elem_t*>(p.v) + batch * p.v_stride_b + n0 * p.v_stride_s + kv_head * p.v_stride_h,
                       p.v_stride_s, min(kBlockN, p.seqlen_k - n0));
    // Each lane's ldmatrix addresses, fixed for the kernel (see rows_first, cols_first).
    const u32 q_rows = smem_u32(&sm.q[16 * warp][0]) + rows_first<kRowD>(lane);
    const u32 dout_rows = smem_u32(&sm.dout[16 * warp][0]) + rows_first<kRowD>(lane);
    const u32 k_keys = smem_u32(&sm.k[0][0]) + cols_first<kRowD>(lane);
    const u32 v_keys = smem_u32(&sm.v[0][0]) + cols_first<kRowD>(lane);
    const u32 p_keys = smem_u32(&sm.p[0][16 * warp]) + cols_first<kRowN>(lane);
    const u32 ds_keys = smem_u32(&sm.ds[0][16 * warp]) + cols_first<kRowN>(lane);
    const u32 dout_cols = smem_u32(&sm.dout[0][0]) + rows_first<kRowD>(lane);
    const u32 q_cols = smem_u32(&sm.q[0][0]) + rows_first<kRowD>(lane);
    const u32 ds_rows = smem_u32(&sm.ds[16 * warp][0]) + rows_first<kRowN>(lane);
    const u32 k_cols = smem_u32(&sm.k[0][0]) + rows_first<kRowD>(lane);
    float dk[kDTiles][4], dv[kDTiles][4];
#pragma unroll
    for (int j = 0; j < kDTiles; ++j) zero(dk[j]), zero(dv[j]);

    // The first query row that sees key n0 is n0 - offset.
    const int m_first = kCausal ? max(0, n0 - offset) / kBlockM : 0;
    const int m_blocks = (p.seqlen_q + kBlockM - 1) / kBlockM;
    for (int head = kv_head * group; head < (kv_head + 1) * group; ++head) {
        for (int mb = m_first; mb < m_blocks; ++mb) {
            const int m0 = mb * kBlockM, valid = min(kBlockM, p.seqlen_q - m0);
            __syncthreads();  // the last block's readers of Q, dO, P and dS are done
            load_tile<kBlockM>(sm.q, static_cast<const elem_t*>(p.q) + batch * p.q_stride_b + m0 * p.q_stride_s + head * p.q_stride_h,
                               p.q_stride_s, valid);
            load_tile<kBlockM>(sm.dout,
                               static_cast<const elem_t*>(p.dout) + batch * p.do_stride_b + m0 * p.do_stride_s + head * p.do_stride_h,
                               p.do_stride_s, valid);
            if (threadIdx.x < kBlockM) {
                const i64 stat = ((i64)batch * p.heads_q + head) * p.seqlen_q + m0 + threadIdx.x;
                const float lse = threadIdx.x < valid ? p.lse[stat] : math::neg_inf();
                // A row that sees no key (lse = -inf) or lies past Sq gets P = 0.
                sm.lse_log2[threadIdx.x] = lse == math::neg_inf() ? math::inf() : lse * kLog2e;
                sm.dsum[threadIdx.x] = threadIdx.x < valid ? p.dsum[stat] : 0.f;
            }
            __syncthreads();

            // S, dP; then P and dS into shared memory.
            {
                float s[kNTiles][4], dp[kNTiles][4];
                gemm_rows_keys(s, q_rows, k_keys);
                gemm_rows_keys(dp, dout_rows, v_keys);
#pragma unroll
                for (int j = 0; j < kNTiles; ++j) {
#pragma unroll
                    for (int half = 0; half < 2; ++half) {
                        const int row = 16 * warp + g + 8 * half, col = 8 * j + 2 * t;
                        const int qi = m0 + row;
                        float pv[2], dsv[2];
#pragma unroll
                        for (int e = 0; e < 2; ++e) {
                            const int kj = n0 + col + e;
                            const bool seen = kj < p.seqlen_k && (!kCausal || kj <= qi + offset);
                            pv[e] = seen ? math::ex2(s[j][2 * half + e] * scale_log2 - sm.lse_log2[row]) : 0.f;
                            dsv[e] = pv[e] * (dp[j][2 * half + e] - sm.dsum[row]);
                        }
                        *reinterpret_cast<u32*>(&sm.p[row][col]) = pack2<elem_t>(pv[0], pv[1]);
                        *reinterpret_cast<u32*>(&sm.ds[row][col]) = pack2<elem_t>(dsv[0], dsv[1]);
                    }
                }
            }
            __syncthreads();

            gemm_keys_cols(dv, p_keys, dout_cols);
            gemm_keys_cols(dk, ds_keys, q_cols);

            // dQ of the warp's rows for this key block, added to the f32 accumulator.
#pragma unroll
            for (int col0 = 0; col0 < kD; col0 += kDqCols) {
                float dq[kDqTiles][4];
                gemm_rows_cols(dq, ds_rows, k_cols, col0);
#pragma unroll
                for (int half = 0; half < 2; ++half) {
                    const int row = 16 * warp + g + 8 * half;
                    if (row >= valid) continue;
                    float* acc = p.dq_accum + (((i64)batch * p.seqlen_q + m0 + row) * p.heads_q + head) * kD + col0;
#pragma unroll
                    for (int j = 0; j < kDqTiles; ++j) {
                        atomic::red_add(acc + 8 * j + 2 * t, dq[j][2 * half]);
                        atomic::red_add(acc + 8 * j + 2 * t + 1, dq[j][2 * half + 1]);
                    }
                }
            }
        }
    }

    // dK (scaled) and dV of the warp's 16 keys.
#pragma unroll
    for (int half = 0; half < 2; ++half) {
        const int key = n0 + 16 * warp + g + 8 * half;
        if (key >= p.seqlen_k) continue;
        elem_t* dk_row = static_cast<elem_t*>(p.dk) + batch * p.dk_stride_b + key * p.dk_stride_s + kv_head * p.dk_stride_h;
        elem_t* dv_row = static_cast<elem_t*>(p.dv) + batch * p.dv_stride_b + key * p.dv_stride_s + kv_head * p.dv_stride_h;
#pragma unroll
        for (int j = 0; j < kDTiles; ++j) {
            const int col = 8 * j + 2 * t;
            *reinterpret_cast<u32*>(dk_row + col) = pack2<elem_t>(dk[j][2 * half] * p.softmax_scale, dk[j][2 * half + 1] * p.softmax_scale);
            *reinterpret_cast<u32*>(dv_row + col) = pack2<elem_t>(dv[j][2 * half], dv[j][2 * half + 1]);
        }
    }
}

extern "C" __global__ void __launch_bounds__(256) fc_bwd_sm80_dq(const BwdParams p) {
    using namespace fc;
    const i64 n = (i64)p.batch * p.seqlen_q * p.heads_q * p.head_dim;
    const i64 idx = (i64)blockIdx.x * 256 + threadIdx.x;
    if (idx >= n) return;
    const int d = idx % p.head_dim;
    const i64 row = idx / p.head_dim;  // (b * Sq + s) * Hq + h
    const int h = row % p.heads_q;
    const i64 bs = row / p.heads_q;
    const int s = bs % p.seqlen_q, b = bs / p.seqlen_q;
    elem_t* dq = static_cast<elem_t*>(p.dq) + b * p.dq_stride_b + s * p.dq_stride_s + h * p.dq_stride_h;
    dq[d] = from_float<elem_t>(p.dq_accum[idx] * p.softmax_scale);
}
