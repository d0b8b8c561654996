// Hopper backward attention (sm_90a): FlashAttention-2's algorithm on wgmma and TMA, warp
// specialized in the style of FlashAttention-3.
//
// One CTA per (key block, KV head, batch). A producer thread loads K and V once, then walks
// the query blocks of every query head of the KV head (GQA sums in registers), loading Q, dO
// and the rows' lse and D_i into a ring of kStages stages; a thread of a second producer
// warp adds dQ (write_dq). Two consumer warpgroups keep dK and dV in registers. Up to D128
// (consume) each owns 64 keys of a 128-key block and computes the transposed products, so
// that P and dS land in registers already in the A-operand form of the next products:
//   Sᵀ = K·Qᵀ, dPᵀ = V·dOᵀ                      (wgmma, both operands from shared memory)
//   Pᵀ = exp2(Sᵀ·scale·log2e − lse·log2e),  dSᵀ = Pᵀ ∘ (dPᵀ − D_i)   (the rows' lse, D_i
//        are columns here: per-column values from shared memory; softcapped, Sᵀ is capped
//        first and dSᵀ is times softcap_grad: see probabilities)
//   dV += Pᵀ·dO, dK += dSᵀ·Q                     (wgmma, A from registers)
//   dSᵀ to shared memory; both warpgroups meet; dQ = dS·K (A read transposed), each
//   warpgroup 64 x 64 of it, staged in shared memory in its accumulator order and added to
//   p.dq_accum by the writer thread with one bulk reduce-add (cp.reduce.async.bulk) each.
// D256 (consume_wide): both warpgroups on one 64-key block, each half of dK's and dV's
// columns and half of the query block's Sᵀ and dPᵀ; Pᵀ and dSᵀ meet in shared memory.
// D136-D192 (the split layout, FC_PANEL_SPLIT, consume_split): the wide layout's steps with
// Q, K, dK and dQ 192 wide (unpadded), the panels of dK, dV and dQ dealt out unevenly
// (Share), two stages (one with dropout: its static state leaves no room for the second). With V's own head dim
// (FC_HEAD_DIM_V = Dv < D; DeepSeek-V3's Q/K 192 with V 128), V, dO (and O in prep) and dV
// in tiles Dv wide, so that dPᵀ = V·dOᵀ and dV += Pᵀ·dO do Dv's work, not D's.
// fc_bwd_sm90_prep (before) writes D_i and lse·log2e per row, padded to whole query blocks, and
// zeroes dQ's accumulator (and the deterministic counters);
// fc_bwd_sm90_dq (after) scales and converts dq_accum into dq.
//
// Variants (queries x keys a step): D64 128 x 128, D96 and D128 64 x 128 (D96 as D128 with
// the columns past 96 zero, as in the forward), kStages = 2; D192 split 64 x 64, kStages = 2;
// D256 64 x 64, kStages = 1;
// setmaxnreg 24 / 240.
//   smem: K, V (kBlockN x D), kStages x (Q, dO) (kBlockM x D), two dSᵀ buffers (kBlockN x
//   kBlockM; D256 two Pᵀ too), dQ's f32 staging (kBlockM x D), lse and D_i per stage, the
//   dQ hand-over: D64 200704 B, D96 and D128 199680 B, D192 232448 B (V 128: 207872 B), D256
//   231424 B.
//
// HOST CONTRACT
// fc_bwd_sm90_prep(BwdParams): grid (m_blocks * kBlockM / 16, Hq, B), 128 threads; writes
//   per query block t = (b * Hq + h) * m_blocks + m, at p.dsum + 2 * kBlockM * t, D_i of its
//   kBlockM rows then their lse·log2e (+inf where lse = -inf and in the padding rows); zeroes
//   block t's part of p.dq_accum and, deterministic, its counter.
// fc_bwd_sm90(BwdParams, TmaDescriptor tma_q, tma_k, tma_v, tma_do): grid (ceil(Sk /
//   kBlockN), Hkv, B), kThreads threads, dynamic smem FC_SMEM_BYTES (one CTA an SM; with
//   p.spread_walks only if ceil(Sk / kBlockN) <= the SM count); tensor maps as
//   fwd_sm90's (4-D {D, S, H, B}, 128-byte swizzle, box {64, rows}: kBlockM rows for Q and
//   dO, kBlockN for K and V); p.dq_accum [B, Hq, m_blocks, kBlockM * kHeadDim] f32, zeroed by prep,
//   each query block's part in the consumers' accumulator order (see dq_index).
// fc_bwd_sm90_dq(BwdParams): grid (m_blocks * kBlockM * kHeadDim / 1024, Hq, B), 256 threads.
// The main kernel and the conversion are launched as programmatic dependents of the launch
// before them (griddepcontrol.wait where they first read its output).
// Causal is the compile-time FC_CAUSAL (bottom-right aligned). FC_LOCAL: a sliding window
// (p.window_left/right, causal folded in: the walks visit only the query blocks that see the
// CTA's keys, and start unspread); FC_SOFTCAP: logit softcapping (p.softcap,
// p.softcap_scale; p.softmax_scale_log2 = log2 e); FC_ALIBI: ALiBi (p.alibi_slopes,
// p.alibi_scale, p.alibi_batch_stride). See common/mask.cuh.
// FC_VARLEN=1 (a packed batch, common/sequence.cuh): p.cu_seqlens_q/k (int32 [B + 1], device),
// optional p.seqused_k, p.total_q/k; q, o, dout, dq [total_q, Hq, D], k, v, dk, dv [total_k,
// Hkv, D], every *_stride_b 0, lse [Hq, total_q]; p.seqlen_q / p.seqlen_k the longest
// sequence's; tensor maps over the packed tensors (B = 1). Grids as above with B sequences and
// those maxima: prep and fc_bwd_sm90_dq as above, the main kernel (max(1, key blocks), Hkv,
// B); each CTA works on its own sequence's lengths, CTAs past them exit. dq_accum, the
// statistics and the counters by per-sequence padded query blocks: Hq * ((total_q + B *
// kBlockM) / kBlockM) blocks (Schedule::query_block).
#include "common/bwd_params.cuh"
#include "common/bwd_schedule.cuh"
#include "common/dropout.cuh"
#include "common/mask.cuh"
#include "common/pipeline.cuh"
#include "common/sinks.cuh"
#include "common/tile_sm90.cuh"
#include "common/types.cuh"
#include "ptx/atomic.cuh"
#include "ptx/barrier.cuh"
#include "ptx/griddep.cuh"
#include "ptx/math.cuh"
#include "ptx/mbarrier.cuh"
#include "ptx/tma.cuh"
#include "ptx/warpgroup.cuh"
#include "ptx/wgmma.cuh"

#ifndef FC_HEAD_DIM
#define FC_HEAD_DIM 128
#endif
#ifndef FC_CAUSAL
#define FC_CAUSAL 0
#endif
#ifndef FC_BLOCK_M
#define FC_BLOCK_M (FC_HEAD_DIM <= 64 ? 128 : 64)
#endif
#ifndef FC_STAGES
#define FC_STAGES (FC_HEAD_DIM > 128 ? 1 : 2)
#endif
#ifndef FC_HEAD_DIM_V
#define FC_HEAD_DIM_V FC_HEAD_DIM
#endif
#ifndef FC_PANEL_SPLIT
#define FC_PANEL_SPLIT 0
#endif

namespace fc {
namespace bwd_sm90 {

constexpr int kHeadDimReal = FC_HEAD_DIM;
// The split layout (FC_PANEL_SPLIT; Q and K in (128, 192], V 192 like them or 128 of its own,
// DeepSeek-V3's): the wide layout with Q's and K's three panels unpadded, dealt out unevenly
// between the warpgroups (see Share), and two stages of Q and dO.
constexpr bool kSplit = FC_PANEL_SPLIT != 0;
// Whole 64-column panels; past D128 the wide layout, whose two warpgroups split dK's and dV's
// columns into whole panels: D192 runs as D256 (TMA zero-fills the missing columns; they are
// never stored), as D96 runs as D128, and every other multiple of 8 as the next of these
// (D40 as D64, D80 as D128, D224 as D256); the split layout runs D192 as it is (D160 as D192).
constexpr int kHeadDim = kSplit ? 192 : kHeadDimReal <= 128 ? (kHeadDimReal + 63) / 64 * 64 : 256;
static_assert(kHeadDimReal % 8 == 0 && kHeadDimReal >= 8 && kHeadDimReal <= 256, "head dim: a multiple of 8 up to 256");
constexpr bool kCausal = FC_CAUSAL != 0;
constexpr bool kLocal = FC_LOCAL != 0;      // sliding window (common/mask.cuh)
constexpr bool kSoftcap = FC_SOFTCAP != 0;  // logit softcapping (common/mask.cuh)
constexpr bool kAlibi = FC_ALIBI != 0;      // ALiBi (common/mask.cuh)
constexpr bool kVarlen = FC_VARLEN != 0;    // a packed batch of sequences (common/sequence.cuh)
constexpr bool kDropout = FC_DROPOUT != 0;  // attention dropout (common/dropout.cuh; dropout_keep, score_gradients)
constexpr int kConsumerWG = 2;
// Wide heads (D256): a warpgroup's dK and dV over all columns would need 256 registers, so
// both warpgroups hold the CTA's 64 keys and split the columns; each computes Sᵀ and dPᵀ for
// half of the query block, and Pᵀ and dSᵀ meet in shared memory (see consume_wide).
// Otherwise each warpgroup owns 64 keys and all columns (consume).
constexpr bool kWide = kHeadDim > 128;
constexpr int kBlockM = FC_BLOCK_M;
constexpr int kBlockN = kWide ? 64 : 64 * kConsumerWG;
constexpr int kStages = FC_STAGES;
constexpr int kThreads = warpgroup::kThreads * (kConsumerWG + 1);
constexpr int kProducerRegs = 24, kConsumerRegs = 240;
constexpr int kScoreN = kWide ? kBlockM / kConsumerWG : kBlockM;     // queries of a warpgroup's Sᵀ
constexpr int kDkvCols = kWide ? kHeadDim / kConsumerWG : kHeadDim;  // dK (and dV) columns a warpgroup
// V's head dim, and dO's, O's, dV's (FC_HEAD_DIM_V; q's and k's unless set): the split
// layout's, whole panels (Dv 128: one a warpgroup), below Q's.
constexpr int kHeadDimVReal = FC_HEAD_DIM_V;
constexpr int kHeadDimV = kHeadDimVReal == kHeadDimReal ? kHeadDim : (kHeadDimVReal + 63) / 64 * 64;
constexpr int kDvCols = kWide ? kHeadDimV / kConsumerWG : kHeadDimV;  // dV columns a warpgroup
static_assert(kHeadDimVReal == kHeadDimReal || (kSplit && kHeadDimVReal % 8 == 0), "V's own head dim: the split layout");
static_assert(!kSplit || (kHeadDimReal > 128 && kHeadDimReal <= 192 && (kHeadDimV == 128 || kHeadDimV == 192) && FC_STAGES <= 2),
              "the split layout: Q and K up to 192, V 192 or up to 128, two stages (one where dropout's state needs the room)");
// The split layout with V's three panels too (Q, K and V 192).
constexpr bool kSplitV3 = kSplit && kHeadDimV == 192;

// The panels of dK, dV and dQ that consumer warpgroup wg holds (first, count). Wide: half of
// each. Split, V 128: warpgroup 0 dK's panels 0-1, dV's 0 and dQ's 0, warpgroup 1 dK's 2, dV's
// 1 and dQ's 1-2 (each four panels of products a step, besides Sᵀ and dPᵀ of half the
// queries). Split, V 192: warpgroup 0 dK's 0-1, dV's 2 and dQ's 0-1 (five), warpgroup 1 dK's 2,
// dV's 0-1 and dQ's 2 (four); nine panels do not halve. Warpgroup 1's dQ tile sits after
// warpgroup 0's in the block's accumulator and in the staging buffer (kDqOffset floats).
template <int wg> struct Share {
    static constexpr int kDkFirst = kSplit ? 2 * wg : wg * (kHeadDim / 128);
    static constexpr int kDkPanels = kSplit ? 2 - wg : kHeadDim / 128;
    static constexpr int kDvFirst = kSplitV3 ? 2 - 2 * wg : kSplit ? wg : wg * (kHeadDimV / 128);
    static constexpr int kDvPanels = kSplitV3 ? 1 + wg : kSplit ? 1 : kHeadDimV / 128;
    static constexpr int kDqFirst = kSplitV3 ? 2 * wg : kSplit ? wg : wg * (kHeadDim / 128);
    static constexpr int kDqPanels = kSplitV3 ? 2 - wg : kSplit ? 1 + wg : kHeadDim / 128;
    static constexpr int kDqOffset = kBlockM * 64 * kDqFirst;
};
static_assert(Share<0>::kDqFirst == 0 && Share<1>::kDqFirst == Share<0>::kDqPanels, "warpgroup 0's dQ panels, then warpgroup 1's");
// dQ of a query block (kBlockM x kHeadDim) is shared out as one 64-row wgmma tile per
// consumer warpgroup: by rows when the block has 128 (D64), by columns when it has 64.
constexpr bool kDqByRows = kBlockM == 128;
constexpr int kDqTile = kBlockM * kHeadDim / kConsumerWG;  // f32 values of one warpgroup's dQ (split: on average)
constexpr int kDqCols = kDqTile / 64;
static_assert(kSplit || kDqCols == 64 || kDqCols == 128, "dQ: a 64 x 64 or 64 x 128 tile per consumer warpgroup");
// f32 values of warpgroup wg's dQ, and their place in a block's accumulator and in staging.
// (Share's counts as arithmetic in wg: the same code as the split layout's first form, whose
// warpgroups held 1 and 2 panels: (1 + wg).)
constexpr int kDqPanelsStep = Share<1>::kDqPanels - Share<0>::kDqPanels;
__host__ __device__ constexpr int dq_tile_of(int wg) { return kSplit ? kBlockM * 64 * (Share<0>::kDqPanels + kDqPanelsStep * wg) : kDqTile; }
__host__ __device__ constexpr int dq_offset_of(int wg) { return kSplit ? kBlockM * 64 * Share<0>::kDqPanels * wg : wg * kDqTile; }
static_assert(kSplit || (kDkvCols % 64 == 0 && kDvCols % 64 == 0), "whole panels of dK and dV a warpgroup");
static_assert(kScoreN % 16 == 0, "whole k16 steps of queries");
static_assert(kStages >= 2 || kWide, "the next query block loads under this one");
#ifdef FC_BLOCK_N
static_assert(FC_BLOCK_N == kBlockN, "FC_BLOCK_N must be 64 per consumer warpgroup");
#endif
#ifdef FC_NUM_WARPS
static_assert(FC_NUM_WARPS * 32 == kThreads, "FC_NUM_WARPS must be 4 * (consumers + 1)");
#endif
constexpr int kEntryRegs = 65536 / kThreads / 8 * 8;
static_assert(warpgroup::kThreads * (kProducerRegs + kConsumerWG * kConsumerRegs) <= kThreads * kEntryRegs, "register file");

// Named barrier id (0 is __syncthreads): both consumers' dSᵀ written.
constexpr u32 kDsBarrier = 1;

using KVTile = sm90::SmemTile<kBlockN, kHeadDim>;
using QTile = sm90::SmemTile<kBlockM, kHeadDim>;
using VTile = sm90::SmemTile<kBlockN, kHeadDimV>;   // KVTile unless V has its own head dim
using DoTile = sm90::SmemTile<kBlockM, kHeadDimV>;  // QTile likewise
using DsTile = sm90::SmemTile<kBlockN, kBlockM>;  // dSᵀ (and, wide, Pᵀ): keys x queries

// The score tiles in shared memory, in alternate blocks: one warpgroup may write the next
// while the other still reads. Wide heads also pass Pᵀ this way.
template <bool kWithP> struct ScoreTiles {
    DsTile ds[2];
};
template <> struct ScoreTiles<true> {
    DsTile ds[2], pt[2];
};

struct SharedStorage {
    KVTile k;
    VTile v;
    QTile q[kStages];
    DoTile dout[kStages];
    ScoreTiles<kWide> scores;
    alignas(16) float dq[kConsumerWG * kDqTile];  // each warpgroup's staged dQ, at dq_offset_of(wg)
    alignas(16) float stats[kStages][2][kBlockM];  // per stage: D_i, then lse·log2e (see prep)
    float* dq_dst[kConsumerWG];  // where each warpgroup's staged dQ goes (see stage_dq)
    int dq_order[kConsumerWG];   // deterministic: key blocks that add to it first
    alignas(8) u64 kv_full;
    u64 q_full[kStages], q_empty[kStages];
    u64 dq_full[kConsumerWG], dq_empty[kConsumerWG];  // the staging buffers' hand-over
};
constexpr unsigned kSmemBytes = sizeof(SharedStorage) + sm90::kSwizzlePeriod;
static_assert(kSmemBytes <= 227 * 1024, "shared memory per block");
#ifdef FC_SMEM_BYTES
static_assert(kSmemBytes == FC_SMEM_BYTES, "the host's shared-memory size (bwd_sm90.rs smem_bytes)");
#endif

__device__ __forceinline__ SharedStorage& shared_storage() { return sm90::aligned_shared_storage<SharedStorage>(); }
using sm90::bar;

__device__ __forceinline__ int ceil_div(int a, int b) { return (a + b - 1) / b; }

using Schedule = sm90::BwdSchedule<kBlockM, kBlockN, kCausal, kLocal, kVarlen>;  // common/bwd_schedule.cuh
using Mask = Schedule::Mask;
using Walk = Schedule::Walk;
using Cursor = Schedule::Cursor;

// Producer: K and V once, then Q, dO, lse·log2e and D_i of each step into the ring. Its
// few registers hold the walk as increments (no division per step) and shared memory as
// one 32-bit base plus constant offsets. Packed, the tensors are one batch and the sequence
// starts at rows s.q_start and s.k_start: a block's rows past the sequence are the next
// sequence's (TMA stops only at the tensor's end), which the padding rows' +inf lse·log2e
// (prep) and the key mask (s.seqlen_k) leave out.
__device__ __forceinline__ void produce(SharedStorage& smem, const BwdParams& p, const Sequence& s, const TmaDescriptor* tma_q,
                                        const TmaDescriptor* tma_k, const TmaDescriptor* tma_v,
                                        const TmaDescriptor* tma_do) {
    const int n0 = Schedule::key_block(p) * kBlockN, kv_head = blockIdx.y, batch = kVarlen ? 0 : blockIdx.z;
    // A member's address as base + its offset (the offset folds to a constant).
    const u32 base = smem_u32(&smem);
    auto at = [&smem, base](const void* member) {
        return base + static_cast<u32>(static_cast<const char*>(member) - reinterpret_cast<const char*>(&smem));
    };
    const u32 kv_full = at(&smem.kv_full);
    mbarrier::arrive_expect_tx(kv_full, KVTile::kBytes + VTile::kBytes);
    KVTile::load_to(at(&smem.k), tma_k, kv_full, s.k_start + n0, kv_head, batch);
    VTile::load_to(at(&smem.v), tma_v, kv_full, s.k_start + n0, kv_head, batch);
    const Walk w = Schedule::walk(p, s);
    PipelineCounter<kStages> st;
    Cursor c = Schedule::walk_start(p, s, w);
    for (int j = 0; j < w.steps; ++j, st.advance(), c.advance(p, w)) {
        const u32 stage = st.stage(), m0 = s.q_start + c.m_block * kBlockM;
        const u32 full = at(&smem.q_full) + 8 * stage;
        constexpr u32 kStatBytes = 2 * kBlockM * sizeof(float);
        mbarrier::wait(at(&smem.q_empty) + 8 * stage, st.empty_parity());
        mbarrier::arrive_expect_tx(full, QTile::kBytes + DoTile::kBytes + kStatBytes);
        QTile::load_to(at(&smem.q) + stage * QTile::kBytes, tma_q, full, m0, c.head, batch);
        DoTile::load_to(at(&smem.dout) + stage * DoTile::kBytes, tma_do, full, m0, c.head, batch);
        tma::load_bulk(at(&smem.stats) + stage * kStatBytes, Schedule::block_stats(p, c.block), kStatBytes, full);
    }
}

// This thread's place in its warpgroup's m64 x N accumulator (rows row, row + 8; columns
// col, col + 1 of each 8-column chunk), read afresh so that it is computed where used.
struct Fragment {
    int row, col;
};
__device__ __forceinline__ Fragment fragment() {
    const u32 tid = warpgroup::fresh_thread_index();
    const int warp = (tid / 32) % 4, lane = tid % 32;
    return Fragment{16 * warp + lane / 4, 2 * (lane % 4)};
}

// Pᵀ of the warpgroup's keys [k0, k0 + 64) and its queries [m0, m0 + kScoreN), in
// place of Sᵀ (while dPᵀ is still in the tensor cores): P = 0 where the key is past Sk or,
// causal, after the query's diagonal, or outside its window (only where `masked`; `mask`
// holds the sequence's lengths), and in rows past Sq or that see no key (lse·log2e is +inf
// there).
// Softcapped (Sᵀ capped first, as in the forward), P goes straight to `pk`, gemm_pv's
// operand, and `pg` gets P ∘ softcap_grad, what dSᵀ needs (score_gradients), from the capped
// value that P replaces: both 16-bit, so that they take the registers of the f32 Pᵀ they
// replace (D64's 128 queries have none to spare); pg's rounding adds ~2^-9 (bf16) to dSᵀ's.
// With ALiBi, `alibi`'s bias is added after the cap (softcap_grad takes the capped score).
// A hidden score's exponent becomes -inf (ex2 gives 0), a select a score; a block without
// hidden scores (kMasked false: most of them) tests none. As `seen ? ex2(...) : 0.f` the
// compiler predicated each score's FFMA and MUFU, zeroed its register apart and reloaded the
// scale from the constant bank: five instructions a score where this takes two or three.
template <bool kMasked, int kFrom, int kTo>
__device__ __forceinline__ void probabilities_of(float (&s)[kScoreN / 2], u32 (&pk)[kScoreN / 4], u32 (&pg)[kSoftcap ? kScoreN / 4 : 1],
                                                 const float* lse_log2, int k0, int m0, const Mask& mask, const AlibiBias& alibi,
                                                 const BwdParams& p) {
    const Fragment f = fragment();
    // Per key row r, the first column (8c + e, relative to this thread's) that sees it:
    // the query key - offset under the causal mask; none for a key past Sk. Each score then
    // costs one compare with a constant (two with a window: also the last column).
    int first_seen[2], last_seen[2];
#pragma unroll
    for (int r = 0; r < 2; ++r) {
        constexpr int kAll = -(1 << 30), kNone = 1 << 30;
        const int key = k0 + f.row + 8 * r;
        const int causal_first = kCausal ? key - mask.offset - m0 - f.col : kAll;
        const int window_first = kLocal ? mask.first_row(key) - m0 - f.col : kAll;
        first_seen[r] = !kMasked ? kAll : key >= mask.seqlen_k ? kNone : kLocal ? window_first : causal_first;
        last_seen[r] = kLocal && kMasked ? mask.last_row(key) - m0 - f.col : kNone;
    }
    const float inv_softcap = kSoftcap ? math::rcp(p.softcap) : 0.f;
    // ALiBi: the (query, key) distance of this thread's first score; the others' differ by constants.
    const float distance0 = kAlibi ? alibi.distance(m0 + f.col, k0 + f.row) : 0.f;
#pragma unroll
    for (int c = kFrom; c < kTo; ++c) {
        const float2 l = *reinterpret_cast<const float2*>(lse_log2 + 8 * c + f.col);
        float g[4];
#pragma unroll
        for (int i = 0; i < 4; ++i) {
            const int e = i % 2;
            const bool seen = 8 * c + e >= first_seen[i / 2] && (!kLocal || 8 * c + e <= last_seen[i / 2]);
            if constexpr (kSoftcap) {
                softcap_scores(s[4 * c + i], p.softcap, p.softcap_scale);  // a score at a time (the whole tile first: more spills)
                g[i] = softcap_grad(s[4 * c + i], inv_softcap);
            }
            if constexpr (kAlibi) s[4 * c + i] += alibi.at(distance0 + static_cast<float>(8 * c + e - 8 * (i / 2)));
            const float exponent = fmaf(s[4 * c + i], p.softmax_scale_log2, -(e ? l.y : l.x));
            s[4 * c + i] = math::ex2(kMasked && !seen ? math::neg_inf() : exponent);
        }
        if constexpr (kSoftcap) {
#pragma unroll
            for (int h = 0; h < 2; ++h) {
                pk[2 * c + h] = pack2<elem_t>(s[4 * c + 2 * h], s[4 * c + 2 * h + 1]);
                pg[2 * c + h] = pack2<elem_t>(s[4 * c + 2 * h] * g[2 * h], s[4 * c + 2 * h + 1] * g[2 * h + 1]);
            }
        }
    }
}

// Chunks [kFrom, kTo) of 8 queries of Pᵀ (probabilities_of).
template <int kFrom, int kTo>
__device__ __forceinline__ void probabilities(float (&s)[kScoreN / 2], u32 (&pk)[kScoreN / 4], u32 (&pg)[kSoftcap ? kScoreN / 4 : 1],
                                              const float* lse_log2, int k0, int m0, bool masked, const Mask& mask, const AlibiBias& alibi,
                                              const BwdParams& p) {
    if (masked) {
        probabilities_of<true, kFrom, kTo>(s, pk, pg, lse_log2, k0, m0, mask, alibi, p);
    } else {
        probabilities_of<false, kFrom, kTo>(s, pk, pg, lse_log2, k0, m0, mask, alibi, p);
    }
}

// Chunks of Pᵀ exponentiated while dPᵀ is in the tensor cores; the rest come after its wait,
// where the compiler can interleave their exponentials (the MUFU pipe) with dSᵀ's arithmetic
// (the FMA pipe) chunk by chunk (late_scores). Dropout takes them all under dPᵀ, as before the
// interleave: its dSᵀ needs Pᵀ packed whole first (dropout_operands).
#ifndef FC_EARLY_CHUNKS
#define FC_EARLY_CHUNKS (kScoreN / 32)
#endif
#ifndef FC_LEAD_CHUNKS
#define FC_LEAD_CHUNKS 2
#endif
constexpr int kScoreChunks = kScoreN / 8, kEarlyChunks = kDropout ? kScoreChunks : FC_EARLY_CHUNKS, kLeadChunks = FC_LEAD_CHUNKS;
static_assert(kEarlyChunks >= 0 && kEarlyChunks <= kScoreChunks && kLeadChunks >= 0, "early chunks");

// Score i of chunk c (8 queries) of Pᵀ in f32, or of pg packed in pairs (probabilities).
__device__ __forceinline__ float score_at(const float (&s)[kScoreN / 2], int c, int i) { return s[4 * c + i]; }
__device__ __forceinline__ float score_at(const u32 (&packed)[kScoreN / 4], int c, int i) {
    const u32 x = packed[2 * c + i / 2];
    return to_float(elem_t{static_cast<u16>(i % 2 ? x >> 16 : x & 0xffff)});
}

// Dropout's bytes for this lane's scores of the 16 queries [q0, q0 + 16) (q0 a multiple of
// 16) and its keys key, key + 8 (key = k0 + f.row, k0 a multiple of 16), as the forward
// drew them (common/dropout.cuh). The forward's lane holds query rows i, i + 8 and keys 8t +
// 2c + {0, 1} of a 16 x 32 cell, one Philox call; this one holds Sᵀ's transpose, keys k, k + 8
// and queries 8n + 2t' + {0, 1}: of a call's 16 bytes it needs 4 (word t = the key's 8-key
// group in the cell, byte 2h + key parity, for query halves h = 0, 1), and for its 16
// queries two calls (query rows of parity e = 0, 1). The lanes whose keys differ in parity
// (lane ^ 4) need the same two calls' other bytes: each draws the call of its own key parity
// and hands its partner that call's other 4 bytes, one shuffle. Returns, for query parity e,
// word e: byte 2r + h for key row r, query half h.
struct DropBytes {
    u32 by_query_parity[2];
};
__device__ __forceinline__ DropBytes dropout_bytes(const dropout::Mask& drop, int bh, int key, int q0, int col) {
    const u32 own = key & 1;
    const u32x4 w = drop.cell_words(bh, q0 + col + static_cast<int>(own), key);
    const bool upper = (key >> 4) & 1;  // keys 16-31 of the cell: words 2, 3
    const u32 a = upper ? w.z : w.x, b = upper ? w.w : w.y;
    const u32 mine = __byte_perm(a, b, own ? 0x7531u : 0x6420u), theirs = __byte_perm(a, b, own ? 0x6420u : 0x7531u);
    const u32 other = __shfl_xor_sync(0xffffffffu, theirs, 4);
    return own ? DropBytes{{other, mine}} : DropBytes{{mine, other}};
}

// Dropout's keep bits for this lane's kScoreN / 2 scores of Sᵀ (keys k0 + f.row + {0, 8},
// queries [m0, m0 + kScoreN)): score 4c + i (query chunk c, i = 2r + e: key row r, query
// parity e) is bit 8 (2r + c % 2) + 2 ((c / 2) % 4) + e of word c / 8. Drawn first in a
// step, before its products: while the tensor cores hold Sᵀ and dPᵀ, D64's 128 queries left
// the generator's temporaries no registers (it spilled 248-452 bytes drawing there; at D128 and
// D256 either place measured the same). As bits, so that little stays live across the step.
constexpr int kKeepWords = (kScoreN / 16 + 3) / 4;
__device__ __forceinline__ void dropout_keep(u32 (&keep)[kKeepWords], const BwdParams& p, int bh, int k0, int m0) {
    const Fragment f = fragment();
    const dropout::Mask drop(p);
    // A byte is kept at or above the threshold (0-256): compared four at a time, with 256
    // (nothing kept) as 255 and a guard.
    const u32 threshold = p.dropout_threshold, bytes4 = (threshold > 255u ? 255u : threshold) * 0x01010101u;
#pragma unroll
    for (int w = 0; w < kKeepWords; ++w) keep[w] = 0u;
#pragma unroll
    for (int qb = 0; qb < kScoreN / 16; ++qb) {
        const DropBytes b = dropout_bytes(drop, bh, k0 + f.row, m0 + 16 * qb, f.col);
        const u32 even = __vcmpgeu4(b.by_query_parity[0], bytes4) & 0x01010101u;
        const u32 odd = __vcmpgeu4(b.by_query_parity[1], bytes4) & 0x01010101u;
        keep[qb / 4] |= (even | odd << 1) << (2 * (qb % 4));
    }
#pragma unroll
    for (int w = 0; w < kKeepWords; ++w) keep[w] = threshold > 255u ? 0u : keep[w];
}
__device__ __forceinline__ bool kept_at(const u32 (&keep)[kKeepWords], int c, int i) {
    return (keep[c / 8] >> (8 * (2 * (i / 2) + c % 2) + 2 * ((c / 2) % 4) + i % 2)) & 1u;
}

// The mask as score_gradients applies it: none (every score kept; D_i times 1), or, with
// dropout, the call's keep bits Z (dropout_keep) and the packed Pᵀ for dV, `pk`, zeroed where
// dropped; D_i times 1 − p, since 1 / (1 − p) is left to dK's, dV's and dQ's final scales, as
// in bwd_sm80.
struct NoDropout {
    __device__ __forceinline__ bool kept(int, int) const { return true; }
    __device__ __forceinline__ float keep_prob() const { return 1.f; }
    __device__ __forceinline__ void drop(int, int, bool) const {}
};
struct Dropout {
    const u32 (&keep)[kKeepWords];
    u32 (&pk)[kScoreN / 4];
    float keep_probability;
    __device__ __forceinline__ bool kept(int c, int i) const { return kept_at(keep, c, i); }
    __device__ __forceinline__ float keep_prob() const { return keep_probability; }
    __device__ __forceinline__ void drop(int c, int i, bool k) const {
        pk[2 * c + i / 2] &= k ? 0xffffffffu : (i % 2 ? 0x0000ffffu : 0xffff0000u);
    }
};

// dSᵀ = Pᵀ ∘ (dPᵀ ∘ Z − D_i·(1 − p)) (without dropout Pᵀ ∘ (dPᵀ − D_i)), packed into the A
// operand of dK's product chunk by chunk, so that the f32 values die as they are packed.
// Softcapped, from pg = Pᵀ ∘ softcap_grad (16-bit: see probabilities) instead of the f32 Pᵀ.
// With dropout, `z` then zeroes the dropped scores of the packed Pᵀ.
// Chunks [kFrom, kTo) of 8 queries.
template <int kFrom, int kTo, class Probs, class DropoutMask = NoDropout>
__device__ __forceinline__ void score_gradients(const Probs& pf, const float (&dp)[kScoreN / 2], u32 (&dsk)[kScoreN / 4], const float* dsum,
                                                const DropoutMask& z = {}) {
    const Fragment f = fragment();
#pragma unroll
    for (int c = kFrom; c < kTo; ++c) {
        const float2 d = *reinterpret_cast<const float2*>(dsum + 8 * c + f.col);
        float ds[4];
#pragma unroll
        for (int i = 0; i < 4; ++i) {
            const bool k = z.kept(c, i);
            ds[i] = score_at(pf, c, i) * ((k ? dp[4 * c + i] : 0.f) - (i % 2 ? d.y : d.x) * z.keep_prob());
            z.drop(c, i, k);
        }
        dsk[2 * c] = pack2<elem_t>(ds[0], ds[1]);
        dsk[2 * c + 1] = pack2<elem_t>(ds[2], ds[3]);
    }
}

// The Pᵀ that dSᵀ is formed from: the f32 tile, or softcapped pg (see probabilities).
__device__ __forceinline__ const auto& gradient_probs(const float (&sc)[kScoreN / 2], const u32 (&pg)[kSoftcap ? kScoreN / 4 : 1]) {
    if constexpr (kSoftcap) {
        return pg;
    } else {
        return sc;
    }
}

// Dropout's two A operands from registers: Pᵀ for dV packed into `pk` first (probabilities
// packed it already when softcapped), the mask zeroing the dropped scores there, then dSᵀ into
// `dsk` (score_gradients). Zeroed in f32, the masked and the unmasked tile were live at once
// (D64's 128 queries spilled 208-452 bytes). Without dropout: late_scores.
__device__ __forceinline__ void dropout_operands(float (&sc)[kScoreN / 2], u32 (&pk)[kScoreN / 4], const u32 (&pg)[kSoftcap ? kScoreN / 4 : 1],
                                                 const float (&dp)[kScoreN / 2], u32 (&dsk)[kScoreN / 4], const float* dsum,
                                                 const u32 (&keep)[kKeepWords], const BwdParams& p) {
    if constexpr (!kSoftcap) sm90::to_operand(sc, pk);
    score_gradients<0, kScoreChunks>(gradient_probs(sc, pg), dp, dsk, dsum, Dropout{keep, pk, math::rcp(p.dropout_scale)});
}

// The exponentials of chunk c + kLeadChunks of Pᵀ beside dSᵀ's arithmetic of chunk c, for c
// from kChunk on: in source order the compiler keeps them apart (every exponential, then every
// dSᵀ), the MUFU pipe busy while the FMA pipe idles and then the reverse. Chunks below
// kEarlyChunks were exponentiated under dPᵀ.
template <bool kMasked, int kChunk>
__device__ __forceinline__ void interleave_late_scores(float (&sc)[kScoreN / 2], u32 (&pk)[kScoreN / 4], u32 (&pg)[kSoftcap ? kScoreN / 4 : 1],
                                                       const float (&dp)[kScoreN / 2], u32 (&dsk)[kScoreN / 4], const float* lse_log2,
                                                       const float* dsum, int k0, int m0, const Mask& mask, const AlibiBias& alibi,
                                                       const BwdParams& p) {
    if constexpr (kChunk < kScoreChunks) {
        constexpr int kNext = kChunk + kLeadChunks;
        if constexpr (kNext >= kEarlyChunks && kNext < kScoreChunks)  // else early, or done
            probabilities_of<kMasked, kNext, kNext + 1>(sc, pk, pg, lse_log2, k0, m0, mask, alibi, p);
        score_gradients<kChunk, kChunk + 1>(gradient_probs(sc, pg), dp, dsk, dsum);
        interleave_late_scores<kMasked, kChunk + 1>(sc, pk, pg, dp, dsk, lse_log2, dsum, k0, m0, mask, alibi, p);
    }
}

// After dPᵀ's wait: Pᵀ's chunks from kEarlyChunks on and the step's two A operands (dSᵀ into
// `dsk`, the Pᵀ for dV into `pk`), the exponentials interleaved with dSᵀ
// (interleave_late_scores); without dropout dSᵀ first, Pᵀ packed after from the f32 tile, which
// dies as it goes. With dropout (every exponential early): dropout_operands.
__device__ __forceinline__ void late_scores(float (&sc)[kScoreN / 2], u32 (&pk)[kScoreN / 4], u32 (&pg)[kSoftcap ? kScoreN / 4 : 1],
                                            const float (&dp)[kScoreN / 2], u32 (&dsk)[kScoreN / 4], const float* lse_log2, const float* dsum,
                                            const u32 (&keep)[kKeepWords], int k0, int m0, bool masked, const Mask& mask,
                                            const AlibiBias& alibi, const BwdParams& p) {
    if constexpr (kDropout) {
        dropout_operands(sc, pk, pg, dp, dsk, dsum, keep, p);
    } else {
        constexpr int kFirst = kEarlyChunks > kLeadChunks ? kEarlyChunks : kLeadChunks;
        if (masked) {
            probabilities_of<true, kEarlyChunks, kFirst>(sc, pk, pg, lse_log2, k0, m0, mask, alibi, p);
            interleave_late_scores<true, 0>(sc, pk, pg, dp, dsk, lse_log2, dsum, k0, m0, mask, alibi, p);
        } else {
            probabilities_of<false, kEarlyChunks, kFirst>(sc, pk, pg, lse_log2, k0, m0, mask, alibi, p);
            interleave_late_scores<false, 0>(sc, pk, pg, dp, dsk, lse_log2, dsum, k0, m0, mask, alibi, p);
        }
        if constexpr (!kSoftcap) sm90::to_operand(sc, pk);
    }
}

// Split layout: dQ's kCols columns from K's panel `panel0` on = dS·K over the block's keys.
template <int kCols>
__device__ __forceinline__ void gemm_dq_panels(float (&dq)[kCols / 2], const DsTile& ds, const KVTile& k, int panel0) {
    wgmma::fence_operands(dq);
    wgmma::fence();
#pragma unroll
    for (int kk = 0; kk < kBlockN / 16; ++kk) wgmma::Mma<kCols>::ss<1, 1>(dq, ds.mnmajor_desc(kk, 0), k.mnmajor_desc(kk, panel0), kk > 0 ? 1 : 0);
    wgmma::commit_group();
    wgmma::fence_operands(dq);
}

// dQ of this warpgroup (64 x 64: its query rows or its head-dim columns of the block) =
// dS·K over the block's keys, with dS read transposed from the dSᵀ tile.
__device__ __forceinline__ void gemm_dq(float (&dq)[kDqCols / 2], const DsTile& ds, const KVTile& k, int wg) {
    constexpr int kPanels = kDqCols / sm90::kPanelCols;
    wgmma::fence_operands(dq);
    wgmma::fence();
#pragma unroll
    for (int kk = 0; kk < kBlockN / 16; ++kk)
        wgmma::Mma<kDqCols>::ss<1, 1>(dq, ds.mnmajor_desc(kk, kDqByRows ? wg : 0), k.mnmajor_desc(kk, kDqByRows ? 0 : kPanels * wg),
                                      kk > 0 ? 1 : 0);
    wgmma::commit_group();
    wgmma::fence_operands(dq);
}

// Wide heads: acc[64 keys x kCols] += Aᵀ · B over the query block, Aᵀ (Pᵀ or dSᵀ, keys x
// queries) read K-major from shared memory, B (dO or Q) this warpgroup's kCols columns, MN-major.
// `gemm_dkv_panels` takes B's columns from panel `panel0` on (the split layout's uneven share).
template <int kCols, int kTileCols>
__device__ __forceinline__ void gemm_dkv_panels(float (&acc)[kCols / 2], const DsTile& at, const sm90::SmemTile<kBlockM, kTileCols>& b,
                                                int panel0) {
    wgmma::fence_operands(acc);
    wgmma::fence();
#pragma unroll
    for (int kk = 0; kk < kBlockM / 16; ++kk) wgmma::Mma<kCols>::ss<1>(acc, at.kmajor_desc(0, kk), b.mnmajor_desc(kk, panel0), 1);
    wgmma::commit_group();
    wgmma::fence_operands(acc);
}
template <int kCols, int kTileCols>
__device__ __forceinline__ void gemm_dkv(float (&acc)[kCols / 2], const DsTile& at, const sm90::SmemTile<kBlockM, kTileCols>& b, int wg) {
    gemm_dkv_panels<kCols>(acc, at, b, kCols / sm90::kPanelCols * wg);
}

// Wide heads: Sᵀ = K·Qᵀ (or dPᵀ = V·dOᵀ, over V's head dim) of the CTA's 64 keys and
// queries [q0, q0 + kScoreN) of the block.
template <int kCols>
__device__ __forceinline__ void gemm_scores(float (&s)[kScoreN / 2], const sm90::SmemTile<kBlockN, kCols>& k,
                                            const sm90::SmemTile<kBlockM, kCols>& q, int q0) {
    wgmma::fence_operands(s);
    wgmma::fence();
#pragma unroll
    for (int kk = 0; kk < kCols / 16; ++kk) wgmma::Mma<kScoreN>::ss<0>(s, k.kmajor_desc(0, kk), q.kmajor_desc(q0, kk), kk > 0 ? 1 : 0);
    wgmma::commit_group();
    wgmma::fence_operands(s);
}

// Hands this warpgroup's dQ to the dQ writer, with where it goes (`dst`; nullptr: no
// more) and, deterministic, after how many other key blocks' (`order`, see dq_order in
// common/bwd_schedule.cuh): staged in shared memory in accumulator order (register pair j of
// thread t at float2 index 128 j + t: consecutive lanes write consecutive 8 bytes, no bank
// conflict) once the writer has read the previous one out.
template <int kValues>
__device__ __forceinline__ void stage_dq(SharedStorage& smem, PipelineState<1>& handover, const float (&dq)[kValues], float* dst,
                                         int order, int wg) {
    const u32 t = warpgroup::fresh_thread_index() % warpgroup::kThreads;
    mbarrier::wait(bar(smem.dq_empty[wg]), handover.empty_parity());
    if (t == 0) {
        smem.dq_dst[wg] = dst;
        smem.dq_order[wg] = order;  // one per warpgroup: each written only under its own hand-over
    }
    if (dst != nullptr) {
        float2* stage = reinterpret_cast<float2*>(smem.dq + dq_offset_of(wg));
#pragma unroll
        for (int j = 0; j < kValues / 2; ++j) stage[128 * j + t] = make_float2(dq[2 * j], dq[2 * j + 1]);
        tma::fence_proxy_async_shared();
    }
    mbarrier::arrive(bar(smem.dq_full[wg]));
    handover.advance();
}

// The dQ writer (one thread of warp 1): per step and consumer warpgroup, adds the staged dQ
// to its query block's f32 accumulator with one bulk reduce-add (the L2 adds), and frees the
// staging buffer once the reduce has read it; stops at the consumers' nullptr. Off the
// consumers' path: they only wait for a free buffer. One thread, not a warp: the thread that
// reads the hand-over (dq_dst, dq_order) is the one whose arrival on dq_empty lets a consumer
// overwrite it (with a whole warp reading it, compute-sanitizer's racecheck reported the
// other lanes' reads against the consumers' next write).
//
// Deterministic (p.deterministic): the key blocks add to a query block in a fixed order
// (dq_order: the order in which their walks come to it), so every sum has one order. A
// counter per query block (after the accumulator, zeroed by prep) says how many key blocks have
// added; this CTA adds once it reads its order, waits for its reduces to complete, and
// counts itself. Every CTA a query block waits for comes to it earlier in its own walk and
// waits only for CTAs that come earlier still, and can start (see key_block in
// common/bwd_schedule.cuh).
__device__ __forceinline__ void write_dq(SharedStorage& smem, const BwdParams& p) {
    constexpr int kTile = kBlockM * kHeadDim;
    u32* const counters = reinterpret_cast<u32*>(p.dq_accum + Schedule::padded_rows(p) * kHeadDim);
    PipelineState<1> handover;
    for (bool more = true; more; handover.advance()) {
        u32* counter = nullptr;
#pragma unroll
        for (int wg = 0; wg < kConsumerWG; ++wg) {
            mbarrier::wait_sleeping(bar(smem.dq_full[wg]), handover.full_parity());
            float* dst = smem.dq_dst[wg];
            more = dst != nullptr;
            if (more) {
                if (p.deterministic && wg == 0) {
                    counter = counters + (dst - p.dq_accum) / kTile;
                    const u32 order = smem.dq_order[wg];
                    // Never past `order` unless a malformed cu_seqlens overlaps two sequences'
                    // blocks; then `<` still ends the wait.
                    while (atomic::load_acquire(counter) < order) {
                    }
                    tma::fence_proxy_async_global();
                }
                tma::reduce_add_bulk(dst, smem_u32(smem.dq + dq_offset_of(wg)), dq_tile_of(wg) * sizeof(float));
                tma::store_commit_group();
                tma::store_wait_read();
            }
            mbarrier::arrive(bar(smem.dq_empty[wg]));
        }
        if (counter != nullptr) {
            tma::store_wait_all();
            tma::fence_proxy_async_global();
            atomic::red_release_add(counter, 1);
        }
    }
    tma::store_wait_all();
}

// Key row 0 of sequence s's KV head `kv_head` in dK or dV (packed: batch stride 0, the
// sequence at row s.k_start).
__device__ __forceinline__ elem_t* kv_rows(void* t, i64 stride_b, i64 stride_s, i64 stride_h, const Sequence& s, int batch, int kv_head) {
    return static_cast<elem_t*>(t) + batch * stride_b + s.k_start * stride_s + kv_head * stride_h;
}

// dK (times the softmax scale) or dV of the warpgroup's keys [k0, k0 + 64) and columns
// [col0, col0 + kCols), from registers; the padding columns past kRealCols (the tensor's head
// dim) are not stored.
template <int kCols, int kRealCols>
__device__ __forceinline__ void store_kv(const float (&acc)[kCols / 2], elem_t* base, i64 row_stride, int k0, int seqlen_k, int col0,
                                         float scale) {
    const Fragment f = fragment();
#pragma unroll
    for (int r = 0; r < 2; ++r) {
        const int key = k0 + f.row + 8 * r;
        if (key >= seqlen_k) continue;
        elem_t* row = base + key * row_stride + col0 + f.col;
#pragma unroll
        for (int c = 0; c < kCols / 8; ++c)
            if (col0 + 8 * c < kRealCols)
                *reinterpret_cast<u32*>(row + 8 * c) = pack2<elem_t>(acc[4 * c + 2 * r] * scale, acc[4 * c + 2 * r + 1] * scale);
    }
}

// One consumer warpgroup: keys [64 wg, 64 wg + 64) of the block.
template <class Smem> __device__ __forceinline__ void consume(Smem& smem, const BwdParams& p, const Sequence& s, int wg) {
    const int n0 = Schedule::key_block(p) * kBlockN, k0 = n0 + 64 * wg, batch = blockIdx.z;
    const int offset = s.seqlen_k - s.seqlen_q;
    const Walk w = Schedule::walk(p, s);
    float dk[kDkvCols / 2], dv[kDkvCols / 2];
#pragma unroll
    for (int i = 0; i < kDkvCols / 2; ++i) dk[i] = dv[i] = 0.f;
    mbarrier::wait(bar(smem.kv_full), 0);
    PipelineState<kStages> st;
    PipelineState<1> handover;  // of this warpgroup's dQ staging buffer
    Cursor c = Schedule::walk_start(p, s, w);
    for (int j = 0; j < w.steps; ++j, c.advance(p, w)) {
        const int stage = st.stage(), m0 = c.m_block * kBlockM;
        u32 keep[kKeepWords];  // dropout's bits (unused otherwise): see dropout_keep
        if constexpr (kDropout) dropout_keep(keep, p, batch * p.heads_q + c.head, k0, m0);
        mbarrier::wait(bar(smem.q_full, stage), st.full_parity());
        float sc[kBlockM / 2], dp[kBlockM / 2];
        sm90::gemm_qk(sc, smem.k, 64 * wg, smem.q[stage]);
        sm90::gemm_qk(dp, smem.v, 64 * wg, smem.dout[stage]);
        wgmma::wait<1>();  // Sᵀ; the exponentials run under dPᵀ
        wgmma::fence_operands(sc);
        const bool masked =
            kLocal ? Mask::query_block_masked(w.blocks, c.m_block) : k0 + 64 > s.seqlen_k || (kCausal && k0 + 63 > m0 + offset);
        u32 pk[kBlockM / 4], dsk[kBlockM / 4], pg[kSoftcap ? kBlockM / 4 : 1];
        const AlibiBias alibi = kAlibi ? alibi_of(p, batch, c.head, s.seqlen_q, s.seqlen_k) : AlibiBias{};
        probabilities<0, kEarlyChunks>(sc, pk, pg, smem.stats[stage][1], k0, m0, masked, Schedule::mask(p, s), alibi, p);
        wgmma::wait<0>();
        wgmma::fence_operands(dp);
        late_scores(sc, pk, pg, dp, dsk, smem.stats[stage][1], smem.stats[stage][0], keep, k0, m0, masked, Schedule::mask(p, s), alibi, p);
        sm90::gemm_pv(dv, pk, smem.dout[stage]);
        const DsTile& ds = smem.scores.ds[j % 2];
        sm90::write_operand(ds, 64 * wg, dsk);
        tma::fence_proxy_async_shared();
        named_barrier::sync(kDsBarrier, kConsumerWG * warpgroup::kThreads);
        float dq[kDqCols / 2];
        gemm_dq(dq, ds, smem.k, wg);
        sm90::gemm_pv(dk, dsk, smem.q[stage]);
        wgmma::wait<1>();  // dQ (and dV before it); dK runs under dQ's staging
        wgmma::fence_operands(dq);
        const int order = p.deterministic ? Schedule::dq_order(p, s, w, c.m_block) : 0;
        stage_dq(smem, handover, dq, p.dq_accum + static_cast<i64>(c.block) * kBlockM * kHeadDim + wg * kDqTile, order, wg);
        wgmma::wait<0>();
        wgmma::fence_operands(dv);
        wgmma::fence_operands(dk);
        wgmma::fence_operands(pk);
        wgmma::fence_operands(dsk);
        mbarrier::arrive(bar(smem.q_empty, stage));
        st.advance();
    }
    {
        float none[kDqCols / 2];
        stage_dq(smem, handover, none, nullptr, 0, wg);  // the writer's stop mark
    }
    const int kv_head = blockIdx.y;
    const float keep_scale = kDropout ? p.dropout_scale : 1.f;  // dropout's 1 / (1 - p), left to the end
    store_kv<kDkvCols, kHeadDimReal>(dv, kv_rows(p.dv, p.dv_stride_b, p.dv_stride_s, p.dv_stride_h, s, batch, kv_head), p.dv_stride_s, k0,
                                     s.seqlen_k, 0, keep_scale);
    store_kv<kDkvCols, kHeadDimReal>(dk, kv_rows(p.dk, p.dk_stride_b, p.dk_stride_s, p.dk_stride_h, s, batch, kv_head), p.dk_stride_s, k0,
                                     s.seqlen_k, 0, p.softmax_scale * keep_scale);
}

// Wide and split layouts, one step: Sᵀ = K·Qᵀ and dPᵀ = V·dOᵀ of the CTA's 64 keys [n0, n0 +
// 64) and this warpgroup's queries [m0 + q0, m0 + q0 + kScoreN) of the query block at `c`
// (stage `stage` of the ring), Pᵀ and dSᵀ from them, written to step j's Pᵀ and dSᵀ tiles in
// shared memory; returns once both warpgroups have written theirs. `offset` = Sk − Sq.
// consume_wide keeps these steps inline: called from there, the helper schedules its forms'
// code differently (8 instructions fewer at D256, cubin-diff), and those forms are checked and
// measured as they are; it moves to the helper with its next check and measurement.
template <class Smem>
__device__ __forceinline__ void wide_scores(Smem& smem, const BwdParams& p, const Sequence& s, const Walk& w, const Cursor& c,
                                            const u32 (&keep)[kKeepWords], int stage, int j, int n0, int m0, int q0, int batch,
                                            int offset) {
    float sc[kScoreN / 2], dp[kScoreN / 2];
    gemm_scores(sc, smem.k, smem.q[stage], q0);
    gemm_scores(dp, smem.v, smem.dout[stage], q0);
    wgmma::wait<1>();
    wgmma::fence_operands(sc);
    const bool masked =
        kLocal ? Mask::query_block_masked(w.blocks, c.m_block) : n0 + 64 > s.seqlen_k || (kCausal && n0 + 63 > m0 + q0 + offset);
    u32 pk[kScoreN / 4], dsk[kScoreN / 4], pg[kSoftcap ? kScoreN / 4 : 1];
    const AlibiBias alibi = kAlibi ? alibi_of(p, batch, c.head, s.seqlen_q, s.seqlen_k) : AlibiBias{};
    probabilities<0, kEarlyChunks>(sc, pk, pg, smem.stats[stage][1] + q0, n0, m0 + q0, masked, Schedule::mask(p, s), alibi, p);
    wgmma::wait<0>();
    wgmma::fence_operands(dp);
    late_scores(sc, pk, pg, dp, dsk, smem.stats[stage][1] + q0, smem.stats[stage][0] + q0, keep, n0, m0 + q0, masked, Schedule::mask(p, s),
                alibi, p);
    sm90::write_operand(smem.scores.pt[j % 2], 0, pk, q0 / 8);
    sm90::write_operand(smem.scores.ds[j % 2], 0, dsk, q0 / 8);
    tma::fence_proxy_async_shared();
    named_barrier::sync(kDsBarrier, kConsumerWG * warpgroup::kThreads);
}

// Wide heads (D256): both consumer warpgroups hold the CTA's 64 keys, warpgroup wg columns
// [kDkvCols wg, kDkvCols (wg + 1)) of dK and [kDvCols wg, kDvCols (wg + 1)) of dV, and
// computes Sᵀ and dPᵀ for queries [kScoreN wg, kScoreN (wg + 1)) of the block. Pᵀ and dSᵀ meet in shared memory, from which both take
// them as the A operands of dV's and dK's products; dQ = dS·K as in consume, its columns
// split. Q and dO have one stage (four 32 KB tiles of K, V, Q and dO, and 64 KB of dQ staging
// leave no room for a second): their stage is freed as soon as dV's and dK's products are done.
template <class Smem> __device__ __forceinline__ void consume_wide(Smem& smem, const BwdParams& p, const Sequence& s, int wg) {
    const int n0 = Schedule::key_block(p) * kBlockN, batch = blockIdx.z, q0 = kScoreN * wg;
    const int offset = s.seqlen_k - s.seqlen_q;
    const Walk w = Schedule::walk(p, s);
    float dk[kDkvCols / 2], dv[kDvCols / 2];
#pragma unroll
    for (int i = 0; i < kDkvCols / 2; ++i) dk[i] = 0.f;
#pragma unroll
    for (int i = 0; i < kDvCols / 2; ++i) dv[i] = 0.f;
    mbarrier::wait(bar(smem.kv_full), 0);
    PipelineState<kStages> st;
    PipelineState<1> handover;
    Cursor c = Schedule::walk_start(p, s, w);
    for (int j = 0; j < w.steps; ++j, c.advance(p, w)) {
        const int stage = st.stage(), m0 = c.m_block * kBlockM;
        u32 keep[kKeepWords];  // dropout's bits (unused otherwise): see dropout_keep
        if constexpr (kDropout) dropout_keep(keep, p, batch * p.heads_q + c.head, n0, m0 + q0);
        mbarrier::wait(bar(smem.q_full, stage), st.full_parity());
        float sc[kScoreN / 2], dp[kScoreN / 2];
        gemm_scores(sc, smem.k, smem.q[stage], q0);
        gemm_scores(dp, smem.v, smem.dout[stage], q0);
        wgmma::wait<1>();
        wgmma::fence_operands(sc);
        const bool masked =
            kLocal ? Mask::query_block_masked(w.blocks, c.m_block) : n0 + 64 > s.seqlen_k || (kCausal && n0 + 63 > m0 + q0 + offset);
        u32 pk[kScoreN / 4], dsk[kScoreN / 4], pg[kSoftcap ? kScoreN / 4 : 1];
        const AlibiBias alibi = kAlibi ? alibi_of(p, batch, c.head, s.seqlen_q, s.seqlen_k) : AlibiBias{};
        probabilities<0, kEarlyChunks>(sc, pk, pg, smem.stats[stage][1] + q0, n0, m0 + q0, masked, Schedule::mask(p, s), alibi, p);
        wgmma::wait<0>();
        wgmma::fence_operands(dp);
        late_scores(sc, pk, pg, dp, dsk, smem.stats[stage][1] + q0, smem.stats[stage][0] + q0, keep, n0, m0 + q0, masked, Schedule::mask(p, s),
                    alibi, p);
        const DsTile &pt = smem.scores.pt[j % 2], &ds = smem.scores.ds[j % 2];
        sm90::write_operand(pt, 0, pk, q0 / 8);
        sm90::write_operand(ds, 0, dsk, q0 / 8);
        tma::fence_proxy_async_shared();
        named_barrier::sync(kDsBarrier, kConsumerWG * warpgroup::kThreads);
        gemm_dkv<kDvCols>(dv, pt, smem.dout[stage], wg);
        gemm_dkv<kDkvCols>(dk, ds, smem.q[stage], wg);
        float dq[kDqCols / 2];
        gemm_dq(dq, ds, smem.k, wg);
        wgmma::wait<1>();  // dV and dK: Q and dO may go
        mbarrier::arrive(bar(smem.q_empty, stage));
        st.advance();
        wgmma::wait<0>();
        wgmma::fence_operands(dv);
        wgmma::fence_operands(dk);
        wgmma::fence_operands(dq);
        const int order = p.deterministic ? Schedule::dq_order(p, s, w, c.m_block) : 0;
        stage_dq(smem, handover, dq, p.dq_accum + static_cast<i64>(c.block) * kBlockM * kHeadDim + wg * kDqTile, order, wg);
    }
    {
        float none[kDqCols / 2];
        stage_dq(smem, handover, none, nullptr, 0, wg);  // the writer's stop mark
    }
    const int kv_head = blockIdx.y;
    const float keep_scale = kDropout ? p.dropout_scale : 1.f;  // dropout's 1 / (1 - p), left to the end
    store_kv<kDvCols, kHeadDimVReal>(dv, kv_rows(p.dv, p.dv_stride_b, p.dv_stride_s, p.dv_stride_h, s, batch, kv_head), p.dv_stride_s, n0,
                                     s.seqlen_k, kDvCols * wg, keep_scale);
    store_kv<kDkvCols, kHeadDimReal>(dk, kv_rows(p.dk, p.dk_stride_b, p.dk_stride_s, p.dk_stride_h, s, batch, kv_head), p.dk_stride_s, n0,
                                     s.seqlen_k, kDkvCols * wg, p.softmax_scale * keep_scale);
}

// The split layout (Q and K 192, V 192 or 128): consume_wide's steps with warpgroup wg's uneven
// share of dK's, dV's and dQ's panels (Share) and two stages of Q and dO, whose stage is freed
// once dV's and dK's products are done, as in consume_wide.
template <int wg, class Smem> __device__ __forceinline__ void consume_split(Smem& smem, const BwdParams& p, const Sequence& s) {
    using Own = Share<wg>;
    constexpr int kDkCols = 64 * Own::kDkPanels, kDvOwnCols = 64 * Own::kDvPanels, kDqOwnCols = 64 * Own::kDqPanels;
    const int n0 = Schedule::key_block(p) * kBlockN, batch = blockIdx.z, q0 = kScoreN * wg;
    const int offset = s.seqlen_k - s.seqlen_q;
    const Walk w = Schedule::walk(p, s);
    float dk[kDkCols / 2], dv[kDvOwnCols / 2];
#pragma unroll
    for (int i = 0; i < kDkCols / 2; ++i) dk[i] = 0.f;
#pragma unroll
    for (int i = 0; i < kDvOwnCols / 2; ++i) dv[i] = 0.f;
    mbarrier::wait(bar(smem.kv_full), 0);
    PipelineState<kStages> st;
    PipelineState<1> handover;
    Cursor c = Schedule::walk_start(p, s, w);
    for (int j = 0; j < w.steps; ++j, c.advance(p, w)) {
        const int stage = st.stage(), m0 = c.m_block * kBlockM;
        u32 keep[kKeepWords];  // dropout's bits (unused otherwise): see dropout_keep
        if constexpr (kDropout) dropout_keep(keep, p, batch * p.heads_q + c.head, n0, m0 + q0);
        mbarrier::wait(bar(smem.q_full, stage), st.full_parity());
        wide_scores(smem, p, s, w, c, keep, stage, j, n0, m0, q0, batch, offset);
        const DsTile &pt = smem.scores.pt[j % 2], &ds = smem.scores.ds[j % 2];
        gemm_dkv_panels<kDvOwnCols>(dv, pt, smem.dout[stage], Own::kDvFirst);
        gemm_dkv_panels<kDkCols>(dk, ds, smem.q[stage], Own::kDkFirst);
        float dq[kDqOwnCols / 2];
        gemm_dq_panels<kDqOwnCols>(dq, ds, smem.k, Own::kDqFirst);
        wgmma::wait<1>();  // dV and dK: Q and dO may go
        mbarrier::arrive(bar(smem.q_empty, stage));
        st.advance();
        wgmma::wait<0>();
        wgmma::fence_operands(dv);
        wgmma::fence_operands(dk);
        wgmma::fence_operands(dq);
        const int order = p.deterministic ? Schedule::dq_order(p, s, w, c.m_block) : 0;
        stage_dq(smem, handover, dq, p.dq_accum + static_cast<i64>(c.block) * kBlockM * kHeadDim + Own::kDqOffset, order, wg);
    }
    {
        float none[kDqOwnCols / 2];
        stage_dq(smem, handover, none, nullptr, 0, wg);  // the writer's stop mark
    }
    const int kv_head = blockIdx.y;
    const float keep_scale = kDropout ? p.dropout_scale : 1.f;  // dropout's 1 / (1 - p), left to the end
    store_kv<kDvOwnCols, kHeadDimVReal>(dv, kv_rows(p.dv, p.dv_stride_b, p.dv_stride_s, p.dv_stride_h, s, batch, kv_head), p.dv_stride_s,
                                        n0, s.seqlen_k, 64 * Own::kDvFirst, keep_scale);
    store_kv<kDkCols, kHeadDimReal>(dk, kv_rows(p.dk, p.dk_stride_b, p.dk_stride_s, p.dk_stride_h, s, batch, kv_head), p.dk_stride_s, n0,
                                    s.seqlen_k, 64 * Own::kDkFirst, p.softmax_scale * keep_scale);
}

// The consumer of this head dim's layout (a template, so that only it is instantiated).
template <bool kIsWide, class Smem> __device__ __forceinline__ void run_consumer(Smem& smem, const BwdParams& p, const Sequence& s, int wg) {
    if constexpr (kSplit) {
        if (wg == 0) {
            consume_split<0>(smem, p, s);
        } else {
            consume_split<1>(smem, p, s);
        }
    } else if constexpr (kIsWide) {
        consume_wide(smem, p, s, wg);
    } else {
        consume(smem, p, s, wg);
    }
}

__device__ __forceinline__ void init_barriers(SharedStorage& smem) {
    constexpr u32 kConsumerThreads = kConsumerWG * warpgroup::kThreads;
    mbarrier::init(bar(smem.kv_full), 1);
    for (int i = 0; i < kStages; ++i) {
        mbarrier::init(bar(smem.q_full[i]), 1);
        mbarrier::init(bar(smem.q_empty[i]), kConsumerThreads);
    }
    for (int wg = 0; wg < kConsumerWG; ++wg) {
        mbarrier::init(bar(smem.dq_full[wg]), warpgroup::kThreads);
        mbarrier::init(bar(smem.dq_empty[wg]), 1);
    }
    mbarrier::fence_init();
}

// Where element pair j of consumer thread t of warpgroup wg lies in the block's dQ (see
// add_dq): row and column within the kBlockM x kHeadDim block.
__device__ __forceinline__ void dq_index(int wg, int j, int t, int& row, int& col) {
    const int warp = t / 32, lane = t % 32;
    row = 16 * warp + lane / 4 + 8 * (j % 2) + (kDqByRows ? 64 * wg : 0);
    col = 8 * (j / 2) + 2 * (lane % 4) + (kDqByRows ? 0 : kSplit ? 64 * Share<0>::kDqPanels * wg : kDqCols * wg);
}

// Prep's threads: kPrepLanes of them a row, each on 8 columns (one 16-byte load of o and one
// of dO, over V's head dim), kPrepRows rows a CTA of 128 threads (all in one query block), in
// kPrepPasses passes whose loads are all issued before the first sum. It was a warp a row on
// 2-byte loads: 95 us at B16 S1k H16 D128 and 134 at H32 D64 on an H100, against cuDNN's 95
// for the same work.
// (A power of two, for the reduction: V's 192 columns take 32 lanes, the last 8 idle.)
constexpr int kPrepLanes = kHeadDimV == 192 ? 32 : kHeadDimV / 8;
constexpr int kPrepRows = 16;
constexpr int kPrepPasses = kPrepRows * kPrepLanes / 128;
static_assert(kPrepPasses >= 1 && kBlockM % kPrepRows == 0, "a prep CTA's rows lie in one query block");

// dQ's accumulator starts at zero: the lanes of row r of query block `block` zero the r-th
// kHeadDim floats of the block's part (the kBlockM rows cover it whole; the order inside a
// block does not matter for zeros), and row 0's first lane the block's deterministic counter.
// In place of a memset of the whole accumulator: its bytes are written alongside prep's own
// traffic, one launch fewer.
__device__ __forceinline__ void zero_dq_share(const BwdParams& p, i64 block, int row_in_block, int lane) {
    constexpr int kVectors = kHeadDim / 4;  // 16-byte stores of a row's share
    float4* share = reinterpret_cast<float4*>(p.dq_accum + (block * kBlockM + row_in_block) * kHeadDim);
#pragma unroll
    for (int i = lane; i < kVectors; i += kPrepLanes) share[i] = make_float4(0.f, 0.f, 0.f, 0.f);
    if (p.deterministic && row_in_block == 0 && lane == 0) {
        reinterpret_cast<u32*>(p.dq_accum + Schedule::padded_rows(p) * kHeadDim)[block] = 0;
    }
}

// The dot product of 8 elements of o and 8 of dO, in f32.
__device__ __forceinline__ float dot8(const u32x4& a, const u32x4& b) {
    const elem_t* x = reinterpret_cast<const elem_t*>(&a);
    const elem_t* y = reinterpret_cast<const elem_t*>(&b);
    float sum = 0.f;
#pragma unroll
    for (int i = 0; i < 8; ++i) sum += to_float(x[i]) * to_float(y[i]);
    return sum;
}

// Packed, rows are the sequence's own (prep's and the dQ conversion's grids run over the
// longest sequence's query blocks); blocks past the sequence's own are left alone (they are
// the next sequence's, or padding: the main kernel and the conversion never touch them).

// Where run `vec` of a query block's accumulator (four floats, 16 bytes) lands in its
// kBlockM x kHeadDim dQ: dq_index puts an even element pair and the next one at lanes 2i and
// 2i + 1 of a quad, the same row and columns col .. col + 3.
__device__ __forceinline__ void dq_run_index(int vec, int& row, int& col) {
    const int pair = 2 * vec;
    if constexpr (kSplit) {  // warpgroup 0's panels, then warpgroup 1's (Share)
        const int wg = pair < dq_tile_of(0) / 2 ? 0 : 1, own = pair - dq_offset_of(wg) / 2;
        dq_index(wg, own / 128, own % 128, row, col);
    } else {
        constexpr int kPairsPerWg = kDqTile / 2;
        dq_index(pair / kPairsPerWg, (pair % kPairsPerWg) / 128, pair % 128, row, col);
    }
}

}  // namespace bwd_sm90
}  // namespace fc

using namespace fc;
using namespace fc::bwd_sm90;

extern "C" __global__ void __launch_bounds__(128) fc_bwd_sm90_prep(const BwdParams p) {
    const int lane = threadIdx.x % kPrepLanes, first = blockIdx.x * kPrepRows;
    const int head = blockIdx.y, batch = blockIdx.z;
    const Sequence s = Schedule::sequence_of(p);
    if (kVarlen && first >= ceil_div(s.seqlen_q, kBlockM) * kBlockM) return;  // the whole CTA: one query block
    const i64 o_head = batch * p.o_stride_b + s.q_start * p.o_stride_s + head * p.o_stride_h;
    const i64 do_head = batch * p.do_stride_b + s.q_start * p.do_stride_s + head * p.do_stride_h;
    u32x4 o[kPrepPasses], dout[kPrepPasses];
#pragma unroll
    for (int pass = 0; pass < kPrepPasses; ++pass) {
        const int row = first + pass * (128 / kPrepLanes) + threadIdx.x / kPrepLanes, col = 8 * lane;
        o[pass] = dout[pass] = u32x4{0, 0, 0, 0};
        if (row < s.seqlen_q && col < kHeadDimVReal) {
            o[pass] = *reinterpret_cast<const u32x4*>(static_cast<const elem_t*>(p.o) + o_head + row * p.o_stride_s + col);
            dout[pass] = *reinterpret_cast<const u32x4*>(static_cast<const elem_t*>(p.dout) + do_head + row * p.do_stride_s + col);
        }
    }
    const i64 block = Schedule::query_block(p, s, batch, head, first / kBlockM);
    float* stats = Schedule::block_stats(p, block);
#pragma unroll
    for (int pass = 0; pass < kPrepPasses; ++pass) {
        const int row = first + pass * (128 / kPrepLanes) + threadIdx.x / kPrepLanes;
        float sum = dot8(o[pass], dout[pass]);
#pragma unroll
        for (int offset = kPrepLanes / 2; offset > 0; offset >>= 1) sum += __shfl_xor_sync(0xffffffffu, sum, offset);
        if (lane == 0) {
            float lse_log2 = math::inf();  // padding rows: P = exp2(-inf) = 0
            if (row < s.seqlen_q) {
                const float lse = p.lse[lse_offset<kVarlen>(p, s, batch, head) + row];
                if (lse != math::neg_inf()) lse_log2 = lse * kLog2e;  // a row with no key: P = 0
            }
            stats[row % kBlockM] = sum;  // 0 past the rows: their loads were zeros
            stats[kBlockM + row % kBlockM] = lse_log2;
        }
        zero_dq_share(p, block, row % kBlockM, lane);
    }
}

extern "C" __global__ void __launch_bounds__(kThreads, 1)
fc_bwd_sm90(const __grid_constant__ BwdParams p, const __grid_constant__ TmaDescriptor tma_q,
            const __grid_constant__ TmaDescriptor tma_k, const __grid_constant__ TmaDescriptor tma_v,
            const __grid_constant__ TmaDescriptor tma_do) {
    const Sequence s = Schedule::sequence_of(p);
    if (kVarlen) {
        // The grid spans the longest sequence's key blocks: the others' CTAs past their own
        // exit (key block 0's first zeroes dK and dV of the keys past seqused_k).
        if (p.seqused_k != nullptr && blockIdx.x == 0) zero_unused_keys<kHeadDimReal, kThreads, kHeadDimVReal>(p, s, blockIdx.z, blockIdx.y);
        if (Schedule::key_block(p) * kBlockN >= s.seqlen_k) return;
    }
    if (threadIdx.x == 0) {
        tma::prefetch_descriptor(&tma_q);
        tma::prefetch_descriptor(&tma_k);
        tma::prefetch_descriptor(&tma_v);
        tma::prefetch_descriptor(&tma_do);
        init_barriers(shared_storage());
        if constexpr (kDropout) dropout::staged_state() = dropout::state_of(p);  // (dropout::stage, on this sync)
    }
    __syncthreads();
    if (warpgroup::index() == 0) {
        warpgroup::decrease_registers<kProducerRegs>();
        // Launched early after prep (programmatic dependent launch): the two threads that touch
        // its output (the statistics; the zeroed accumulator) wait for it here.
        if (threadIdx.x == 0) {
            griddep::wait();
            produce(shared_storage(), p, s, &tma_q, &tma_k, &tma_v, &tma_do);
        }
        if (threadIdx.x == 32) {
            griddep::wait();
            write_dq(shared_storage(), p);
        }
    } else {
        warpgroup::increase_registers<kConsumerRegs>();
        run_consumer<kWide>(shared_storage(), p, s, warpgroup::index_in_role() - 1);
    }
}

// kDqSlices CTAs of 256 threads a (query block, head, batch; packed: query block of the
// longest sequence, those past the sequence's own exit), a thread a run of four floats. The
// 256 runs of a CTA are a 64-row x 16-column tile of dQ (dq_index: the two j that differ in
// bit 1, all 128 threads of a warpgroup): each thread converts its run into shared memory,
// then 128 threads store the tile's rows, 32 bytes each, whole 32-byte sectors. Stored
// straight from the registers (8 bytes a thread, half sectors) it took 87.5 us at B16 S1k H16
// D128 on an H100, restaged 66.6 (ncu; DRAM writes 56 MB either way: dQ's 33.5 and the
// accumulator's dirty lines leaving L2).
constexpr int kDqVectors = kBlockM * kHeadDim / 4, kDqSlices = kDqVectors / 256;
static_assert(kDqVectors % 256 == 0 && kDqTile % 1024 == 0, "a query block is whole CTAs of 64 x 16 tiles");
extern "C" __global__ void __launch_bounds__(256) fc_bwd_sm90_dq(const BwdParams p) {
    __shared__ uint2 tile[64][4];  // 64 rows of 16 columns, four elements an entry
    griddep::wait();  // launched early after the main kernel: its sums are complete now
    const Sequence s = Schedule::sequence_of(p);
    const int m_block = blockIdx.x / kDqSlices, head = blockIdx.y, batch = blockIdx.z;
    if (kVarlen && m_block * kBlockM >= s.seqlen_q) return;
    const int vec = blockIdx.x % kDqSlices * 256 + threadIdx.x;
    const float4 v = reinterpret_cast<const float4*>(p.dq_accum)[Schedule::query_block(p, s, batch, head, m_block) * kDqVectors + vec];
    int row, col;
    dq_run_index(vec, row, col);
    const float scale = kDropout ? p.softmax_scale * p.dropout_scale : p.softmax_scale;  // dropout: dS's 1 / (1 - p)
    tile[row % 64][col % 16 / 4] = make_uint2(pack2<elem_t>(v.x * scale, v.y * scale), pack2<elem_t>(v.z * scale, v.w * scale));
    __syncthreads();
    if (threadIdx.x >= 128) return;
    // The tile's corner is every thread's (row, col) rounded down; a thread a half row.
    const int out_row = m_block * kBlockM + row / 64 * 64 + threadIdx.x / 2, out_col = col / 16 * 16 + 8 * (threadIdx.x % 2);
    if (out_row >= s.seqlen_q || out_col >= kHeadDimReal) return;
    elem_t* rows = static_cast<elem_t*>(p.dq) + batch * p.dq_stride_b + s.q_start * p.dq_stride_s + head * p.dq_stride_h;
    const uint2 lo = tile[threadIdx.x / 2][2 * (threadIdx.x % 2)], hi = tile[threadIdx.x / 2][2 * (threadIdx.x % 2) + 1];
    *reinterpret_cast<u32x4*>(rows + static_cast<i64>(out_row) * p.dq_stride_s + out_col) = u32x4{lo.x, lo.y, hi.x, hi.y};
}

// dsink (common/sinks.cuh) from fc_bwd_sm90_prep's statistics, by query block (D_i, then
// lse·log2e; the rows past a sequence's end 0 and +inf): one block a query head.
extern "C" __global__ void __launch_bounds__(sinks::kGradThreads) fc_bwd_sm90_dsink(const BwdParams p) {
    const int head = blockIdx.x;
    const float sink_log2 = p.learnable_sink[head] * kLog2e;
    float part = 0.f;
    for (int batch = 0; batch < p.batch; ++batch) {
        const Sequence s = sequence<kVarlen>(p, batch);
        const int rows = ceil_div(s.seqlen_q, kBlockM) * kBlockM;
        for (int r = threadIdx.x; r < rows; r += sinks::kGradThreads) {
            const float* stats = Schedule::block_stats(p, Schedule::query_block(p, s, batch, head, r / kBlockM));
            part += sinks::grad_share(sink_log2, stats[kBlockM + r % kBlockM], stats[r % kBlockM]);
        }
    }
    const float sum = sinks::block_sum(part);
    if (threadIdx.x == 0) p.dsink[head] = sum;
}
