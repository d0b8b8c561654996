// Ampere-class backward attention (sm_80, sm_86, sm_89, sm_90), FlashAttention-2's algorithm.
//
// One CTA per (key block of kBlockN keys, KV head, batch): K and V of the block stay in
// shared memory, and dK, dV in registers, while the CTA walks every query block of every
// query head that shares the KV head (GQA sums there, no atomics), from the first block
// whose rows see the keys under the causal mask (with a sliding window, the query blocks
// whose rows see them: KeyMask::query_blocks). Per query block of kBlockM rows:
//   S = Q·Kᵀ, P = exp2(S·scale·log2e − lse·log2e) masked to 0, dP = dO·Vᵀ,
//   dS = P ∘ (dP − D_i); P and dS to shared memory;
//   (softcapped: S capped first as in the forward, and dS times softcap_grad;)
//   dV += Pᵀ·dO, dK += dSᵀ·Q, and dQ = dS·K added in f32 to p.dq_accum with 16-byte
//   red.add (lane pairs regroup their columns: quad_columns).
// Each product is a warp-tile GEMM (`warp_gemm`; S and dP share one k loop,
// `warp_gemm_pair`) over a grid of warps (`WarpGrid`) chosen per product so every warp tile
// is a whole number of 16x16 fragments, 32 rows where the tile allows (two m16 tiles share
// each B fragment).
// Q, dO and the rows' lse and D_i are loaded with cp.async, kStages query blocks ahead
// (kStages = 2: the next block's loads fly during this block's products).
//
// D_i = rowsum(dO ∘ O) comes from fc_bwd_sm80_dsum (before); fc_bwd_sm80_dq (after) sums
// dq_accum's slices and scales them into dq. Deterministic mode (p.dq_splits > 1, or one
// CTA per head): each CTA walks key blocks blockIdx.x, + gridDim.x, ... and adds dQ into its
// own slice of dq_accum, so every sum has one order; the dQ kernel adds the slices in order.
//
// Shared memory: K, V, kStages x (Q, dO) tiles of rows D + 8 elements (the 16-byte pad puts
// the 8 rows of an ldmatrix in distinct bank groups), P and dS of rows kBlockN + 8, then lse
// and D_i. Tiles per arch and head dim: crates/flashcore/src/kernels/bwd_sm80.rs.
//
// HOST CONTRACT
// fc_bwd_sm80_dsum(BwdParams): grid (ceil(Sq / 4), Hq, B), 128 threads: p.dsum[b, h, i].
// fc_bwd_sm80(BwdParams): grid (key blocks or p.dq_splits, Hkv, B), 32 * FC_NUM_WARPS
//   threads, dynamic smem sizeof(Smem) = FC_SMEM_BYTES; p.dq_accum p.dq_splits x
//   [B, Sq, Hq, D] f32, zeroed.
// fc_bwd_sm80_dq(BwdParams): grid (ceil(B * Sq * Hq * D / 1024)), 256 threads.
// Pointers 16-byte aligned, strides multiples of 8 elements, last dim contiguous; causal is
// the compile-time FC_CAUSAL (bottom-right aligned). FC_LOCAL: a sliding window
// (p.window_left/right, causal folded in); FC_SOFTCAP: logit softcapping (p.softcap,
// p.softcap_scale; p.softmax_scale_log2 = log2 e); FC_ALIBI: ALiBi (p.alibi_slopes,
// p.alibi_scale, p.alibi_batch_stride). See common/mask.cuh. FC_DROPOUT: the forward's
// dropout mask Z regenerated (p.dropout_*; common/dropout.cuh): dV = (P ∘ Z)ᵀ·dO / (1 - p)
// and dS = P ∘ (Z ∘ dP / (1 - p) − D_i), D_i = rowsum(dO ∘ O) of the dropped output as
// always. The 1 / (1 - p) leaves the scores for the outputs' scales: P ∘ Z goes to shared
// memory, dS·(1 - p) = P ∘ (Z ∘ dP − D_i·(1 - p)), and dK, dV and dQ are scaled by 1 / (1 - p)
// at the end (as FlashAttention-2 does), so that the mask costs two selects a score.
// FC_VARLEN=1 (a packed batch, common/sequence.cuh): p.cu_seqlens_q/k (int32 [B + 1], device),
// optional p.seqused_k, p.total_q/k; q, o, dout, dq [total_q, Hq, D], k, v, dk, dv [total_k,
// Hkv, D], every *_stride_b 0; p.seqlen_q / p.seqlen_k the longest sequence's. The main
// kernel's grid as above with those maxima (key blocks of max_seqlen_k, at least 1, by Hkv by
// B sequences): each CTA walks its own sequence's key blocks and query blocks with its own
// lengths (causal diagonal, window), and a CTA past its sequence's key blocks writes nothing
// (with seqused_k, CTA x = 0 writes the zero dK, dV of the keys past the used ones).
// fc_bwd_sm80_dsum: grid (ceil(total_q / 4), Hq, 1), dsum [Hq, total_q] like lse; dq_accum
// p.dq_splits x [total_q, Hq, D]; fc_bwd_sm80_dq: grid (ceil(total_q * Hq * D / 1024)). A
// sequence's dK and dV are bitwise what it gives alone (same tile: they sum in one fixed
// order); its dQ too in deterministic mode at the same p.dq_splits.
#include "common/bwd_params.cuh"
#include "common/dropout.cuh"
#include "common/mask.cuh"
#include "common/sequence.cuh"
#include "common/sinks.cuh"
#include "common/types.cuh"
#include "ptx/atomic.cuh"
#include "ptx/cp_async.cuh"
#include "ptx/ldmatrix.cuh"
#include "ptx/math.cuh"
#include "ptx/mma.cuh"

#ifndef FC_HEAD_DIM
#define FC_HEAD_DIM 128
#endif
#ifndef FC_CAUSAL
#define FC_CAUSAL 0
#endif
#ifndef FC_BLOCK_M
#define FC_BLOCK_M 64
#endif
#ifndef FC_BLOCK_N
#define FC_BLOCK_N 128
#endif
#ifndef FC_NUM_WARPS
#define FC_NUM_WARPS 8
#endif
#ifndef FC_STAGES
#define FC_STAGES 2
#endif

namespace fc {
namespace bwd_sm80 {

constexpr int kD = FC_HEAD_DIM;
constexpr bool kCausal = FC_CAUSAL != 0;
constexpr bool kLocal = FC_LOCAL != 0;      // sliding window (common/mask.cuh)
constexpr bool kSoftcap = FC_SOFTCAP != 0;  // logit softcapping (common/mask.cuh)
constexpr bool kAlibi = FC_ALIBI != 0;      // ALiBi (common/mask.cuh)
constexpr bool kDropout = FC_DROPOUT != 0;  // attention dropout (common/dropout.cuh)
constexpr bool kVarlen = FC_VARLEN != 0;    // a packed batch of sequences (common/sequence.cuh)
using Mask = KeyMask<kCausal, kLocal>;
constexpr int kBlockM = FC_BLOCK_M, kBlockN = FC_BLOCK_N, kWarps = FC_NUM_WARPS, kStages = FC_STAGES;
constexpr int kThreads = 32 * kWarps;
constexpr int kRowD = kD + 8;       // padded row of Q, dO, K, V (elements)
constexpr int kRowN = kBlockN + 8;  // padded row of P and dS
static_assert(kD % 16 == 0 && kBlockM % 16 == 0 && kBlockN % 16 == 0, "whole 16x16 fragments");
static_assert(kStages == 1 || kStages == 2, "one or two query blocks in flight");
static_assert(2 * kBlockM <= kThreads, "a thread per row statistic");

struct Smem {
    elem_t k[kBlockN][kRowD];
    elem_t v[kBlockN][kRowD];
    elem_t q[kStages][kBlockM][kRowD];
    elem_t dout[kStages][kBlockM][kRowD];
    elem_t p[kBlockM][kRowN];
    elem_t ds[kBlockM][kRowN];
    float lse[kStages][kBlockM];
    float dsum[kStages][kBlockM];
};
#ifdef FC_SMEM_BYTES
static_assert(sizeof(Smem) == FC_SMEM_BYTES, "the host's shared-memory size (bwd_sm80::smem_bytes) is out of step");
#endif

// The warps of a CTA as a kWarpsM x kWarpsN grid over a kRows x kCols product: the fewest
// row groups that leave warp tiles of at most 32 rows and whole 16-column fragment pairs.
template <int kRows, int kCols> struct WarpGrid {
    static constexpr int choose() {
        for (int wm = kRows / 32 > 0 ? kRows / 32 : 1; wm <= kWarps; ++wm)
            if (kWarps % wm == 0 && kRows % (16 * wm) == 0 && (kCols / 16) % (kWarps / wm) == 0) return wm;
        return 0;
    }
    static constexpr int kWarpsM = choose();
    static_assert(kWarpsM > 0, "no warp grid fits this tile");
    static constexpr int kWarpsN = kWarps / kWarpsM;
    static constexpr int kRowsPerWarp = kRows / kWarpsM, kColsPerWarp = kCols / kWarpsN;
    static constexpr int kMT = kRowsPerWarp / 16, kNT = kColsPerWarp / 8;  // m16 and n8 tiles
    __device__ static int row0(int warp) { return (warp / kWarpsN) * kRowsPerWarp; }
    __device__ static int col0(int warp) { return (warp % kWarpsN) * kColsPerWarp; }
};
using GridS = WarpGrid<kBlockM, kBlockN>;  // S and dP: query rows x keys
using GridKV = WarpGrid<kBlockN, kD>;      // dK and dV: keys x D
using GridQ = WarpGrid<kBlockM, kD>;       // dQ: query rows x D

// ldmatrix.x4 lane offsets (bytes) into a padded tile of row length kRow. RowsFirst: the
// lane gives row lane%8 of matrix lane/8, matrices ordered (rows 0-7, 8-15) then (cols 0-7,
// 8-15): an A fragment of a [m][k] tile, or with .trans the two B fragments of a [k][n]
// tile. ColsFirst: columns first: the two B fragments of an [n][k] tile, or with .trans the
// A fragment of a [k][m] tile.
template <int kRow> __device__ __forceinline__ u32 rows_first(int lane) {
    return ((lane % 8 + 8 * ((lane >> 3) & 1)) * kRow + 8 * (lane >> 4)) * 2;
}
template <int kRow> __device__ __forceinline__ u32 cols_first(int lane) {
    return ((lane % 8 + 8 * (lane >> 4)) * kRow + 8 * ((lane >> 3) & 1)) * 2;
}
template <int kRow> constexpr u32 at(int row, int col) { return (row * kRow + col) * 2; }

template <bool kTrans> __device__ __forceinline__ void ldsm(u32 (&r)[4], u32 addr) {
    if (kTrans) ldmatrix::x4_trans(r, addr);
    else ldmatrix::x4(r, addr);
}

// An operand of warp_gemm: a tile in shared memory with rows of kRow elements, stored
// [m][k] (A) or [n][k] (B) when !kTrans, [k][m] or [k][n] when kTrans.
template <int kRow, bool kTrans> struct Operand {
    u32 tile;  // address of the warp's first m (or n) at k = 0
    static constexpr int kRowLen = kRow;
    static constexpr bool kIsTrans = kTrans;
};

// The k steps warp_gemm and warp_gemm_pair run before their rolled loop: the first peeled up
// to D64, where the caller zeroed acc, so that its mma.sync take a zero accumulator and the
// zeroing goes: D64 2-3% faster (H100), D128 and D256 1% slower, so not there. (Nor with a
// window and a softcap: D64 spilled 8-12 bytes with NVRTC 13.0.)
constexpr int kPeeledSteps = (kLocal && kSoftcap) || kD > 64 ? 0 : 1;

// acc[kMT][kNT] (+)= A(kMT·16 rows, kK) · B(kK, kNT·8 cols) over kK = 16·kKSteps.
template <int kMT, int kNT, int kKSteps, class A, class B>
__device__ __forceinline__ void warp_gemm(float (&acc)[kMT][kNT][4], A a, B b, int lane) {
    static_assert(kNT % 2 == 0, "B fragments come in pairs of n8 tiles");
    // A [m][k]: rows first; A [k][m] (.trans): columns first. B the other way round.
    const u32 a0 = a.tile + (A::kIsTrans ? cols_first<A::kRowLen>(lane) : rows_first<A::kRowLen>(lane));
    const u32 b0 = b.tile + (B::kIsTrans ? rows_first<B::kRowLen>(lane) : cols_first<B::kRowLen>(lane));
    // Rolled: unrolled by 2 or 4 measured the same on H100 (±3%), and by 4 spilled D128 with
    // PyTorch's NVRTC 13.0.
    auto k_step = [&](int kk) {
        u32 af[kMT][4];
#pragma unroll
        for (int mi = 0; mi < kMT; ++mi)
            ldsm<A::kIsTrans>(af[mi], a0 + (A::kIsTrans ? at<A::kRowLen>(16 * kk, 16 * mi) : at<A::kRowLen>(16 * mi, 16 * kk)));
#pragma unroll
        for (int pair = 0; pair < kNT / 2; ++pair) {
            u32 bf[4];
            ldsm<B::kIsTrans>(bf, b0 + (B::kIsTrans ? at<B::kRowLen>(16 * kk, 16 * pair) : at<B::kRowLen>(16 * pair, 16 * kk)));
#pragma unroll
            for (int mi = 0; mi < kMT; ++mi) {
                mma::m16n8k16<elem_t>(acc[mi][2 * pair], af[mi], bf[0], bf[1]);
                mma::m16n8k16<elem_t>(acc[mi][2 * pair + 1], af[mi], bf[2], bf[3]);
            }
        }
    };
    if constexpr (kPeeledSteps == 1) k_step(0);
#pragma unroll 1
    for (int kk = kPeeledSteps; kk < kKSteps; ++kk) k_step(kk);
}

// Two products of one shape in one k loop, acc1 += A1·B1 and acc2 += A2·B2: twice the
// independent mma.sync between a loop's dependent ones (S and dP).
template <int kMT, int kNT, int kKSteps, class A, class B>
__device__ __forceinline__ void warp_gemm_pair(float (&acc1)[kMT][kNT][4], A a1, B b1, float (&acc2)[kMT][kNT][4], A a2, B b2, int lane) {
    static_assert(kNT % 2 == 0, "B fragments come in pairs of n8 tiles");
    const u32 a_lane = A::kIsTrans ? cols_first<A::kRowLen>(lane) : rows_first<A::kRowLen>(lane);
    const u32 b_lane = B::kIsTrans ? rows_first<B::kRowLen>(lane) : cols_first<B::kRowLen>(lane);
    const u32 a1_0 = a1.tile + a_lane, a2_0 = a2.tile + a_lane, b1_0 = b1.tile + b_lane, b2_0 = b2.tile + b_lane;
    auto k_step = [&](int kk) {
        u32 af1[kMT][4], af2[kMT][4];
#pragma unroll
        for (int mi = 0; mi < kMT; ++mi) {
            const u32 off = A::kIsTrans ? at<A::kRowLen>(16 * kk, 16 * mi) : at<A::kRowLen>(16 * mi, 16 * kk);
            ldsm<A::kIsTrans>(af1[mi], a1_0 + off);
            ldsm<A::kIsTrans>(af2[mi], a2_0 + off);
        }
#pragma unroll
        for (int pair = 0; pair < kNT / 2; ++pair) {
            const u32 off = B::kIsTrans ? at<B::kRowLen>(16 * kk, 16 * pair) : at<B::kRowLen>(16 * pair, 16 * kk);
            u32 bf1[4], bf2[4];
            ldsm<B::kIsTrans>(bf1, b1_0 + off);
            ldsm<B::kIsTrans>(bf2, b2_0 + off);
#pragma unroll
            for (int mi = 0; mi < kMT; ++mi) {
                mma::m16n8k16<elem_t>(acc1[mi][2 * pair], af1[mi], bf1[0], bf1[1]);
                mma::m16n8k16<elem_t>(acc2[mi][2 * pair], af2[mi], bf2[0], bf2[1]);
                mma::m16n8k16<elem_t>(acc1[mi][2 * pair + 1], af1[mi], bf1[2], bf1[3]);
                mma::m16n8k16<elem_t>(acc2[mi][2 * pair + 1], af2[mi], bf2[2], bf2[3]);
            }
        }
    };
    if constexpr (kPeeledSteps == 1) k_step(0);
#pragma unroll 1
    for (int kk = kPeeledSteps; kk < kKSteps; ++kk) k_step(kk);
}

template <int kMT, int kNT> __device__ __forceinline__ void zero(float (&acc)[kMT][kNT][4]) {
#pragma unroll
    for (int mi = 0; mi < kMT; ++mi)
#pragma unroll
        for (int nj = 0; nj < kNT; ++nj) acc[mi][nj][0] = acc[mi][nj][1] = acc[mi][nj][2] = acc[mi][nj][3] = 0.f;
}

// Rows [0, valid) of a [kRows x kD] tile from global memory with cp.async, 16 bytes a copy;
// the rest zero-filled (from row 0's address: nothing is read). A thread copies the same
// 16-byte column of every kThreads / kChunks-th row: its source steps by a precomputed
// 64-bit stride, one 64-bit product a call (a product per row, recomputed every step, was
// ~20 instructions a copy: 350 of a D256 step's 1,650).
template <int kRows> __device__ __forceinline__ void copy_rows(u32 tile, const elem_t* g, i64 row_stride, int valid) {
    constexpr int kChunks = kD / 8, kTotal = kRows * kChunks;
    constexpr int kRowsPerPass = kThreads / kChunks;
    if constexpr (kThreads % kChunks != 0 || kTotal % kThreads != 0) {
        // Passes that do not cover whole rows (D96 and D192: 12 and 24 copies a row).
#pragma unroll
        for (int i0 = 0; i0 < kTotal; i0 += kThreads) {
            const int i = i0 + threadIdx.x;
            if (kTotal % kThreads != 0 && i >= kTotal) break;
            const int r = i / kChunks, c = i % kChunks;
            cp_async::copy16(tile + at<kRowD>(r, 8 * c), g + (r < valid ? r * row_stride : 0) + 8 * c, r < valid);
        }
    } else {
        const int r0 = threadIdx.x / kChunks, c = threadIdx.x % kChunks;
        const elem_t* src = g + r0 * row_stride + 8 * c;
        const i64 pass_stride = kRowsPerPass * row_stride;
        const u32 dst = tile + at<kRowD>(r0, 8 * c);
#pragma unroll
        for (int pass = 0; pass < kTotal / kThreads; ++pass) {
            const int r = r0 + pass * kRowsPerPass;
            cp_async::copy16(dst + at<kRowD>(pass * kRowsPerPass, 0), r < valid ? src : g, r < valid);
            src += pass_stride;
        }
    }
}

// A (query head, query block) step of a key block's walk: heads of the KV head's group in
// turn, each over its query blocks [m_first, m_end). `next` steps on by addition (a division
// of the step's index by the blocks a head took some 30 instructions a step).
struct Step {
    int head, m0;
    __device__ __forceinline__ Step next(int m_first, int m_end) const {
        return m0 + kBlockM < m_end * kBlockM ? Step{head, m0 + kBlockM} : Step{head + 1, m_first * kBlockM};
    }
};

// The mask of one sequence: its own lengths (a varlen batch entry's), the common ones when
// dense, where this is Mask(p).
__device__ __forceinline__ Mask sequence_mask(const Sequence& seq, const BwdParams& p) {
    return Mask(p, seq.seqlen_q, seq.seqlen_k);
}

// Issues the cp.async loads of a step's Q, dO, lse and D_i into stage `stage`.
__device__ __forceinline__ void load_step(Smem& sm, const BwdParams& p, const Sequence& seq, int batch, Step s, int stage) {
    const int valid = min(kBlockM, seq.seqlen_q - s.m0);
    const int row0 = seq.q_start + s.m0;
    copy_rows<kBlockM>(smem_u32(&sm.q[stage][0][0]),
                       static_cast<const elem_t*>(p.q) + batch * p.q_stride_b + row0 * p.q_stride_s + s.head * p.q_stride_h, p.q_stride_s,
                       valid);
    copy_rows<kBlockM>(smem_u32(&sm.dout[stage][0][0]),
                       static_cast<const elem_t*>(p.dout) + batch * p.do_stride_b + row0 * p.do_stride_s + s.head * p.do_stride_h,
                       p.do_stride_s, valid);
    const int r = threadIdx.x % kBlockM;
    const i64 stat = lse_offset<kVarlen>(p, seq, batch, s.head) + s.m0 + (r < valid ? r : 0);
    if (threadIdx.x < kBlockM) cp_async::copy4(smem_u32(&sm.lse[stage][r]), p.lse + stat, r < valid);
    else if (threadIdx.x < 2 * kBlockM) cp_async::copy4(smem_u32(&sm.dsum[stage][r]), p.dsum + stat, r < valid);
}

// P and dS of the warp's S tile: P = exp2(S·scale·log2e − lse·log2e), 0 where the key is
// masked or past Sk and in rows past Sq or that see no key (lse = -inf); dS = P ∘ (dP − D_i).
// Softcapped, S is capped first and dS is times softcap_grad (of the capped score: ALiBi's
// bias, added next as in the forward, is a constant of the score). S and dP come from one k loop
// (warp_gemm_pair); P and dS go to shared memory as elem_t. With a window, `block_masked`
// says whether the query block needs the mask (KeyMask::query_block_masked).
__device__ __forceinline__ void scores_to_p_ds(Smem& sm, const BwdParams& p, const Sequence& seq, int stage, int m0, int n0,
                                               bool block_masked, const AlibiBias& alibi, int bh, int lane, int warp) {
    constexpr int kMT = GridS::kMT, kNT = GridS::kNT;
    const int g = lane / 4, t = lane % 4;
    const int r0 = GridS::row0(warp), c0 = GridS::col0(warp);
    const int offset = seq.seqlen_k - seq.seqlen_q;  // query i sees key j iff j <= i + offset
    const bool masked =
        kLocal ? block_masked : n0 + kBlockN > seq.seqlen_k || (kCausal && n0 + c0 + GridS::kColsPerWarp - 1 > m0 + r0 + offset);
    float lse_log2[kMT][2], dsum[kMT][2];
#pragma unroll
    for (int mi = 0; mi < kMT; ++mi)
#pragma unroll
        for (int half = 0; half < 2; ++half) {
            const int row = r0 + 16 * mi + g + 8 * half;
            const float lse = sm.lse[stage][row];
            const bool sees = m0 + row < seq.seqlen_q && lse != math::neg_inf();
            lse_log2[mi][half] = sees ? lse * kLog2e : math::inf();  // exp2(x - inf) = 0
            dsum[mi][half] = kDropout ? sm.dsum[stage][row] * math::rcp(p.dropout_scale) : sm.dsum[stage][row];  // dropout: D_i·(1 - p)
        }

    float sc[kMT][kNT][4], dp[kMT][kNT][4];
    zero(sc);
    zero(dp);
    warp_gemm_pair<kMT, kNT, kD / 16>(sc, Operand<kRowD, false>{smem_u32(&sm.q[stage][r0][0])}, Operand<kRowD, false>{smem_u32(&sm.k[c0][0])},
                                      dp, Operand<kRowD, false>{smem_u32(&sm.dout[stage][r0][0])}, Operand<kRowD, false>{smem_u32(&sm.v[c0][0])},
                                      lane);
    if constexpr (kSoftcap) softcap_scores(sc, p.softcap, p.softcap_scale);
    const float inv_softcap = kSoftcap ? math::rcp(p.softcap) : 0.f;
    // ALiBi: the (query, key) distance of this lane's first score; the others' differ by constants.
    const float distance0 = kAlibi ? alibi.distance(m0 + r0 + g, n0 + c0 + 2 * t) : 0.f;
    // The elementwise part, compiled twice: without the mask where none of the warp's scores
    // is masked (most tiles), with it on the diagonal and the edges. One copy testing
    // `!masked || visible` made the compiler test every score (two compares and a predicate
    // op a score, and the scale reloaded under the predicate). With Step::next, D64 causal at
    // 8k ran 7.05 -> 5.71 ms (H100). With a window, a softcap and ALiBi at once, one copy:
    // two spilled 16 bytes at D64 on sm_80 (NVRTC 13.0).
    constexpr bool kSplit = !(kLocal && kSoftcap && kAlibi);
    auto p_and_ds = [&](auto masked_tag) {
        constexpr bool kMasked = decltype(masked_tag)::value;
#pragma unroll
        for (int mi = 0; mi < kMT; ++mi) {
            u32x4 cell{};  // dropout: the forward's words for this lane's share of a 16 x 32 cell
            // Chunked: the lane's two rows' key ranges, taken once (their chunk bounds are
            // integer divisions: score by score they were 2.3 times the window form's code)
            // and counted from its first column, n0 + c0 + 2t.
            Mask::Keys row_keys[2] = {};
            if constexpr (kMasked && Mask::kChunked) {
#pragma unroll
                for (int half = 0; half < 2; ++half)
                    row_keys[half] = sequence_mask(seq, p).keys(m0 + r0 + 16 * mi + g + 8 * half).from(n0 + c0 + 2 * t);
            }
#pragma unroll
            for (int nj = 0; nj < kNT; ++nj) {
                // Dropout: a cell's words at its first fragment (a warp's columns start a cell,
                // or, 16 wide, cover half of one), this fragment's word of them.
                const dropout::Mask drop = kDropout ? dropout::Mask(p) : dropout::Mask{};
                if constexpr (kDropout) {
                    if (nj % 4 == 0) cell = drop.cell_words(bh, m0 + r0 + 16 * mi + g, n0 + c0 + 8 * nj + 2 * t);
                }
                const int fragment = GridS::kColsPerWarp % 32 == 0 ? nj % 4 : ((c0 >> 3) + nj) & 3;
                const u32 word = kDropout ? dropout::Mask::fragment_word(cell, fragment) : 0u;
#pragma unroll
                for (int half = 0; half < 2; ++half) {
                    const int row = r0 + 16 * mi + g + 8 * half, col = c0 + 8 * nj + 2 * t;
                    float pv[2], dpv[2] = {dp[mi][nj][2 * half], dp[mi][nj][2 * half + 1]};
#pragma unroll
                    for (int e = 0; e < 2; ++e) {
                        const int key = n0 + col + e;
                        const float s = sc[mi][nj][2 * half + e];
                        const float biased = kAlibi ? s + alibi.at(distance0 + static_cast<float>(16 * mi + 8 * half - 8 * nj - e)) : s;
                        pv[e] = math::ex2(biased * p.softmax_scale_log2 - lse_log2[mi][half]);
                        if constexpr (kMasked) {
                            // (Unsplit, this copy runs unmasked tiles too.)
                            const bool seen = (!kSplit && !masked) ||
                                              (Mask::kChunked ? row_keys[half].sees(8 * nj + e)
                                               : kLocal       ? sequence_mask(seq, p).visible(m0 + row, key)
                                                              : key < seq.seqlen_k && (!kCausal || key <= m0 + row + offset));
                            pv[e] = seen ? pv[e] : 0.f;
                        }
                    }
                    float pz[2] = {pv[0], pv[1]};  // P ∘ Z for dV (P itself for dS)
                    if constexpr (kDropout) drop.zero_dropped(word, half, pz, dpv);
                    float dsv[2];
#pragma unroll
                    for (int e = 0; e < 2; ++e) {
                        dsv[e] = pv[e] * (dpv[e] - dsum[mi][half]);
                        if constexpr (kSoftcap) dsv[e] *= softcap_grad(sc[mi][nj][2 * half + e], inv_softcap);
                    }
                    *reinterpret_cast<u32*>(&sm.p[row][col]) = pack2<elem_t>(pz[0], pz[1]);
                    *reinterpret_cast<u32*>(&sm.ds[row][col]) = pack2<elem_t>(dsv[0], dsv[1]);
                }
            }
        }
    };
    if (masked || !kSplit) p_and_ds(Constant<bool, true>{});
    else p_and_ds(Constant<bool, false>{});
}

// dQ's columns a warp takes at once: its accumulators live beside dK's and dV's.
constexpr int dq_chunk() {
    int c = GridQ::kColsPerWarp;
    while (c > 48) c /= 2;
    return c;
}
constexpr int kDqChunk = dq_chunk();
static_assert(GridQ::kColsPerWarp % kDqChunk == 0 && kDqChunk % 16 == 0, "dQ chunks of whole fragment pairs");

// The accumulators of two adjacent n8 tiles, row half `half`, regrouped across lanes t, t^1:
// the even lane gets columns 2t..2t+3 of the first tile, the odd lane columns 2(t-1)..2t+1 of
// the second. Returns the first column (relative to the first tile's), a multiple of 4.
__device__ __forceinline__ int quad_columns(const float (&a)[4], const float (&b)[4], int half, int t, float (&v)[4]) {
    const bool odd = t & 1;
    const float a0 = a[2 * half], a1 = a[2 * half + 1], b0 = b[2 * half], b1 = b[2 * half + 1];
    const float r0 = __shfl_xor_sync(0xffffffffu, odd ? a0 : b0, 1);
    const float r1 = __shfl_xor_sync(0xffffffffu, odd ? a1 : b1, 1);
    v[0] = odd ? r0 : a0, v[1] = odd ? r1 : a1, v[2] = odd ? b0 : r0, v[3] = odd ? b1 : r1;
    return odd ? 8 + 2 * (t - 1) : 2 * t;
}

// dQ of the warp's rows for this key block (dS·K, unscaled), added to its f32 accumulator.
// `dq_accum` points at the sequence's first row (rows of Hq x D).
__device__ __forceinline__ void add_dq(Smem& sm, const BwdParams& p, float* dq_accum, const Sequence& seq, Step s, int lane, int warp) {
    constexpr int kMT = GridQ::kMT, kNT = kDqChunk / 8;
    const int g = lane / 4, t = lane % 4;
    const int r0 = GridQ::row0(warp), c0 = GridQ::col0(warp);
#pragma unroll
    for (int chunk = 0; chunk < GridQ::kColsPerWarp; chunk += kDqChunk) {
        float acc[kMT][kNT][4];
        zero(acc);
        warp_gemm<kMT, kNT, kBlockN / 16>(acc, Operand<kRowN, false>{smem_u32(&sm.ds[r0][0])},
                                          Operand<kRowD, true>{smem_u32(&sm.k[0][c0 + chunk])}, lane);
#pragma unroll
        for (int mi = 0; mi < kMT; ++mi)
#pragma unroll
            for (int half = 0; half < 2; ++half) {
                const int row = s.m0 + r0 + 16 * mi + g + 8 * half;
                float* out = dq_accum + ((i64)row * p.heads_q + s.head) * kD + c0 + chunk;
#pragma unroll
                for (int nj = 0; nj < kNT; nj += 2) {
                    // Lanes t and t^1 trade halves of their two n8 tiles (columns 2t.. of
                    // tiles nj and nj + 1) so each holds 4 consecutive columns: one 16-byte
                    // reduction instead of two 8-byte ones. All lanes shuffle; the row test
                    // comes after.
                    float v[4];
                    const int col = quad_columns(acc[mi][nj], acc[mi][nj + 1], half, t, v);
                    // D64: predicated in place, not branched around (on sm_90: 1.5-1.8%
                    // faster on the H100); softcapped, the branch (D64 spilled 8-16 bytes
                    // there with NVRTC 13.0), and at the other head dims (not measured).
                    if constexpr (kSoftcap || kD != 64) {
                        if (row < seq.seqlen_q) atomic::red_add4(out + 8 * nj + col, v);
                    } else {
                        atomic::red_add4_if(row < seq.seqlen_q, out + 8 * nj + col, v);
                    }
                }
            }
    }
}

// dK (scaled by the softmax scale) or dV of the warp's keys, to global memory.
__device__ __forceinline__ void store_kv(const float (&acc)[GridKV::kMT][GridKV::kNT][4], elem_t* base, i64 row_stride, int n0, int seqlen_k,
                                         float scale, int lane, int warp) {
    const int g = lane / 4, t = lane % 4;
#pragma unroll
    for (int mi = 0; mi < GridKV::kMT; ++mi)
#pragma unroll
        for (int half = 0; half < 2; ++half) {
            const int key = n0 + GridKV::row0(warp) + 16 * mi + g + 8 * half;
            if (key >= seqlen_k) continue;
            elem_t* row = base + key * row_stride + GridKV::col0(warp) + 2 * t;
#pragma unroll
            for (int nj = 0; nj < GridKV::kNT; ++nj)
                *reinterpret_cast<u32*>(row + 8 * nj) = pack2<elem_t>(acc[mi][nj][2 * half] * scale, acc[mi][nj][2 * half + 1] * scale);
        }
}

}  // namespace bwd_sm80
}  // namespace fc

// Packed, the rows are those of one batch of total_q (rows_q): D_i is laid out as lse.
extern "C" __global__ void __launch_bounds__(128) fc_bwd_sm80_dsum(const BwdParams p) {
    using namespace fc;
    using bwd_sm80::kVarlen;
    const int lane = threadIdx.x % 32, row = blockIdx.x * 4 + threadIdx.x / 32;
    const int head = blockIdx.y, batch = blockIdx.z;
    const int rows = rows_q<kVarlen>(p);
    if (row >= rows) return;
    const elem_t* o = static_cast<const elem_t*>(p.o) + batch * p.o_stride_b + row * p.o_stride_s + head * p.o_stride_h;
    const elem_t* dout = static_cast<const elem_t*>(p.dout) + batch * p.do_stride_b + row * p.do_stride_s + head * p.do_stride_h;
    float sum = 0.f;
    for (int d = lane; d < p.head_dim; d += 32) sum += to_float(o[d]) * to_float(dout[d]);
    for (int offset = 16; offset > 0; offset >>= 1) sum += __shfl_xor_sync(0xffffffffu, sum, offset);
    if (lane == 0) p.dsum[((i64)batch * p.heads_q + head) * rows + row] = sum;
}

extern "C" __global__ void __launch_bounds__(fc::bwd_sm80::kThreads, 1) fc_bwd_sm80(const BwdParams p) {
    using namespace fc;
    using namespace fc::bwd_sm80;
    if constexpr (kDropout) dropout::stage(p);
    extern __shared__ __align__(128) unsigned char smem_raw[];
    Smem& sm = *reinterpret_cast<Smem*>(smem_raw);
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    const int kv_head = blockIdx.y, batch = blockIdx.z;
    const int group = p.heads_q / p.heads_kv;
    // Packed, this sequence's own lengths (a CTA past its key blocks does nothing).
    const Sequence seq = sequence<kVarlen>(p, batch);
    const int offset = seq.seqlen_k - seq.seqlen_q;
    const int n_blocks = (seq.seqlen_k + kBlockN - 1) / kBlockN, m_blocks = (seq.seqlen_q + kBlockM - 1) / kBlockM;
    // Deterministic: this CTA's own slice of the accumulator; from the sequence's first row.
    const i64 accum_rows = (i64)row_batches<kVarlen>(p) * rows_q<kVarlen>(p);
    const i64 accum_row0 = kVarlen ? seq.q_start : (i64)batch * p.seqlen_q;
    float* dq_accum = p.dq_accum + ((p.dq_splits > 1 ? blockIdx.x * accum_rows : 0) + accum_row0) * p.heads_q * kD;
    const elem_t* k = static_cast<const elem_t*>(p.k) + batch * p.k_stride_b + seq.k_start * p.k_stride_s + kv_head * p.k_stride_h;
    const elem_t* v = static_cast<const elem_t*>(p.v) + batch * p.v_stride_b + seq.k_start * p.v_stride_s + kv_head * p.v_stride_h;

#pragma unroll 1
    for (int nb = blockIdx.x; nb < n_blocks; nb += gridDim.x) {
        const int n0 = nb * kBlockN;
        // The query blocks whose rows see the keys: causal, from the first row that sees key
        // n0 (n0 - offset); with a window, KeyMask's.
        int m_first = kCausal ? min(m_blocks, max(0, n0 - offset) / kBlockM) : 0, m_end = m_blocks;
        QueryBlocks blocks;  // with a window: which of them need the mask
        if (kLocal) {
            blocks = sequence_mask(seq, p).query_blocks(n0, n0 + kBlockN, kBlockM);
            m_first = blocks.begin;
            m_end = blocks.end;
        }
        // Opaque to the compiler: a constant 0 let it strength-reduce the steps' addresses
        // into induction variables that spilled (D128-D256, not causal).
        asm volatile("" : "+r"(m_first));
        const int m_steps = m_end - m_first, steps = group * m_steps;
        copy_rows<kBlockN>(smem_u32(&sm.k[0][0]), k + n0 * p.k_stride_s, p.k_stride_s, min(kBlockN, seq.seqlen_k - n0));
        copy_rows<kBlockN>(smem_u32(&sm.v[0][0]), v + n0 * p.v_stride_s, p.v_stride_s, min(kBlockN, seq.seqlen_k - n0));
        Step s = Step{kv_head * group, m_first * kBlockM};  // the step at j (below)
        if (steps > 0) load_step(sm, p, seq, batch, s, 0);
        cp_async::commit();

        float dk[GridKV::kMT][GridKV::kNT][4], dv[GridKV::kMT][GridKV::kNT][4];
        zero(dk);
        zero(dv);
        const int kv_r0 = GridKV::row0(warp), kv_c0 = GridKV::col0(warp);
#pragma unroll 1
        for (int j = 0; j < steps; ++j) {
            const int stage = kStages > 1 ? j % kStages : 0;
            const Step next = s.next(m_first, m_end);
            if (kStages > 1) {
                if (j + 1 < steps) load_step(sm, p, seq, batch, next, (j + 1) % kStages);
                cp_async::commit();
                cp_async::wait<1>();
            } else {
                cp_async::wait<0>();
            }
            __syncthreads();  // this step's Q, dO, lse, D_i (and K, V) are visible

            const bool block_masked = kLocal && Mask::query_block_masked(blocks, s.m0 / kBlockM);
            const AlibiBias alibi = kAlibi ? alibi_of(p, batch, s.head, seq.seqlen_q, seq.seqlen_k) : AlibiBias{};
            scores_to_p_ds(sm, p, seq, stage, s.m0, n0, block_masked, alibi, batch * p.heads_q + s.head, lane, warp);
            __syncthreads();  // P and dS are visible

            constexpr int kKV = kBlockM / 16;
            warp_gemm<GridKV::kMT, GridKV::kNT, kKV>(dv, Operand<kRowN, true>{smem_u32(&sm.p[0][kv_r0])},
                                                     Operand<kRowD, true>{smem_u32(&sm.dout[stage][0][kv_c0])}, lane);
            warp_gemm<GridKV::kMT, GridKV::kNT, kKV>(dk, Operand<kRowN, true>{smem_u32(&sm.ds[0][kv_r0])},
                                                     Operand<kRowD, true>{smem_u32(&sm.q[stage][0][kv_c0])}, lane);
            add_dq(sm, p, dq_accum, seq, s, lane, warp);
            __syncthreads();  // P, dS and this stage's tiles are free
            if (kStages == 1 && j + 1 < steps) {
                load_step(sm, p, seq, batch, next, 0);
                cp_async::commit();
            }
            s = next;
        }
        cp_async::wait<0>();
        __syncthreads();  // K and V are free for the next key block (deterministic walk)

        elem_t* dk_out = static_cast<elem_t*>(p.dk) + batch * p.dk_stride_b + seq.k_start * p.dk_stride_s + kv_head * p.dk_stride_h;
        elem_t* dv_out = static_cast<elem_t*>(p.dv) + batch * p.dv_stride_b + seq.k_start * p.dv_stride_s + kv_head * p.dv_stride_h;
        const float keep_scale = kDropout ? p.dropout_scale : 1.f;  // dropout's 1 / (1 - p), left to the end
        store_kv(dk, dk_out, p.dk_stride_s, n0, seq.seqlen_k, p.softmax_scale * keep_scale, lane, warp);
        store_kv(dv, dv_out, p.dv_stride_s, n0, seq.seqlen_k, keep_scale, lane, warp);
    }
    if (kVarlen && p.seqused_k != nullptr && blockIdx.x == 0) zero_unused_keys<kD, kThreads>(p, seq, batch, kv_head);
}

// dq = softmax_scale * (sum of dq_accum's p.dq_splits slices, in order), 4 elements a thread
// (with dropout, times 1 / (1 - p)).
// Packed, over one batch of total_q rows (rows_q).
extern "C" __global__ void __launch_bounds__(256) fc_bwd_sm80_dq(const BwdParams p) {
    using namespace fc;
    using bwd_sm80::kVarlen;
    const int rows = rows_q<kVarlen>(p);
    const i64 total = (i64)row_batches<kVarlen>(p) * rows * p.heads_q * p.head_dim;  // a multiple of 8
    const i64 idx = 4 * ((i64)blockIdx.x * 256 + threadIdx.x);
    if (idx >= total) return;
    struct alignas(16) F4 {
        float x, y, z, w;
    };
    F4 sum = *reinterpret_cast<const F4*>(p.dq_accum + idx);
    for (int split = 1; split < p.dq_splits; ++split) {
        const F4 x = *reinterpret_cast<const F4*>(p.dq_accum + split * total + idx);
        sum.x += x.x, sum.y += x.y, sum.z += x.z, sum.w += x.w;
    }
    const int d = idx % p.head_dim;
    const i64 row = idx / p.head_dim;  // (b * Sq + s) * Hq + h
    const int h = row % p.heads_q;
    const i64 bs = row / p.heads_q;
    const int s = bs % rows, b = bs / rows;
    elem_t* dq = static_cast<elem_t*>(p.dq) + b * p.dq_stride_b + s * p.dq_stride_s + h * p.dq_stride_h + d;
    const float c = bwd_sm80::kDropout ? p.softmax_scale * p.dropout_scale : p.softmax_scale;  // dropout: dS's 1 / (1 - p)
    struct alignas(8) U2 {
        u32 lo, hi;
    };
    *reinterpret_cast<U2*>(dq) = U2{pack2<elem_t>(sum.x * c, sum.y * c), pack2<elem_t>(sum.z * c, sum.w * c)};
}

// dsink (common/sinks.cuh) from fc_bwd_sm80_dsum's D_i: one block a query head.
extern "C" __global__ void __launch_bounds__(fc::sinks::kGradThreads) fc_bwd_sm80_dsink(const BwdParams p) {
    using namespace fc;
    sinks::grad_over_rows(p, p.dsum, row_batches<bwd_sm80::kVarlen>(p), rows_q<bwd_sm80::kVarlen>(p));
}
