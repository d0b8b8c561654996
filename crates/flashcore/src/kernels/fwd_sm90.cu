// Hopper forward attention (sm_90a), FlashAttention-3 style.
//
// Structure: one producer warpgroup (one thread issues every TMA load; FC_PAGE_SPREAD, paged
// with small pages: lane 0 of each of its warps, see kBoxIssuers) and FC_CONSUMER_WG
// consumer warpgroups of 64 query rows each; K and V flow through separate rings of
// FC_STAGES shared-memory stages guarded by full/empty mbarriers. The consumers (a) take
// turns issuing their matrix products, handed round by named barriers (ping-pong: one
// warpgroup's softmax runs under another's GEMMs), and (b) issue the next block's
// S = Q·K^T before this block's softmax and P·V, so MUFU and tensor cores overlap within a
// warpgroup too (the softmax runs under the block's own P·V: see wait_pv_below_softmax).
// With FC_SKIP_MAX (all head dims but 256) a block after a row's first takes its softmax
// without the block max, at the row's current shift, and falls back only where a
// probability would pass what P's type holds (softmax_under_pv). Key blocks are visited
// from last to first, so the blocks that
// need the causal/seqlen mask come first; a warpgroup passes over the leading blocks its own
// 64 rows do not see (causal diagonal, rows past seqlen_q).
//
// Persistent: one CTA per SM loops over query tiles, claimed one at a time from a global
// counter when the CTA is ready for more (common/tile_scheduler.cuh; causal tiles longest
// first, in L2-sized sections of heads). The producer claims the tiles and announces each
// to the consumers through shared memory and q_full. It loads the next tile's Q as soon as
// the consumers have issued their last Q·K^T, and its first K blocks right away; only its
// first V waits for the epilogue, which stages O in V's shared-memory stages and writes it
// with TMA stores (one per warpgroup and 64-column panel) instead of scattered 4-byte
// register stores.
//
// Variants (per head dim; defaults below, override with -D), smem = kSmemBytes:
//   D=64 : 192 x 128 tile, 3 consumer WGs, 3 stages, setmaxnreg 32/160; smem 122 KB
//          (the exp2 unit bounds D64: a third warpgroup's softmax hides under two GEMMs)
//   D=128: 128 x 192 tile, 2 consumer WGs, 2 stages, setmaxnreg 24/240; smem 226 KB
//          (D=96 runs as D128 with the columns past 96 zero: see kHeadDim)
//   D=192: 128 x 112 tile, 2 consumer WGs, 2 stages, setmaxnreg 24/240; smem 218 KB
//   D=256: 128 x  80 tile, 2 consumer WGs, 2 stages, setmaxnreg 24/240; smem 226 KB
//          (80 is the widest key block whose 2 K + 2 V stages fit beside Q)
//   Few keys (host: D64 causal Sk <= 1024, D96/D128 causal <= 4096 and full <= 1024,
//   D192/D256 causal <= 512): D64 128 x 128 with 2 consumer WGs and 3 stages (114 KB),
//   D96/D128 128 x 128 (166 KB), D192 128 x 64 (146 KB), D256 128 x 64 (199 KB): smaller
//   tiles waste less of the causal diagonal and of the last partial tile (H100: D128
//   causal S512 +18%, S1k +11%; D64 causal S1k +10%).
//   O (kBlockM x D) shares V's stages, so the epilogue costs no shared memory.
//   V's own head dim (FC_HEAD_DIM_V = Dv, D's unless set; dense and packed keys): V's and O's
//   tiles are Dv wide, P·V's N is Dv and O's accumulator Dv / 2 registers a thread. D192 with
//   Dv 128 (DeepSeek) takes D192's tile; D64 with Dv 256 (FlashAttention-3's) D256's.
//   FC_FP8 (e4m3 Q, K and V; O 16-bit, FC_DTYPE_BF16's type; dense keys; common/fp8.cuh):
//   D128 128 x 128, D256 128 x 128 (the key block is whole 128-key panels of V^T), 2 consumer
//   WGs, 2 stages; head dims padded to whole 128-value panels (D64 runs as D128). Q·K^T and
//   P·V are k32 e4m3 wgmmas; V is read as V^T (fc_fp8_transpose_v's, keys in P's operand
//   order), P packed to e4m3 in registers; the descales scale each tile's scores and O.
//   No FC_SKIP_MAX (its fallback recomputes S with 16-bit mma.sync).
//   FC_QV (FlashAttention-3's qv, dense keys): S = Q·K^T + Qv·V^T, Qv (kBlockM x Dv, shaped
//   like O, through tma_qv) loaded with Q, each block's V waited before its scores
//   (gemm_scores), no FC_SKIP_MAX (its fallback recomputes S from Q·K^T alone).
//   ptxas: 0 bytes stack, 0 spills for all (entry cap 168 / 128 regs before setmaxnreg;
//   the producer's tile loop fits 24 registers only with 32-bit barrier/stage addresses
//   and unsigned tile-index division, see bar() and TileOrder).
//
// ---------------------------------------------------------------------------------------
// HOST CONTRACT
// Entry: fc_fwd_sm90(FwdParams p, TmaDescriptor tma_q, tma_k, tma_v, tma_o, [tma_qv: FC_QV
//   alone], TileSchedule schedule), each by value (__grid_constant__; a TmaDescriptor is the
//   128-byte, 64-byte-aligned CUtensorMap; TileSchedule is {u32* counter, int section,
//   int pad}: counter = two u32 that are zero before the launch and are left zero after it,
//   used by no concurrent launch; section = heads per longest-first section, >= 1).
// Tensor maps, cuTensorMapEncodeTiled, one per tensor:
//   dtype      CU_TENSOR_MAP_DATA_TYPE_BFLOAT16 (FC_DTYPE_BF16=1) or _FLOAT16
//   rank       4; dims innermost first: {D, S, H, B}  (S = seqlen_q / seqlen_k,
//              H = heads_q / heads_kv for Q, O / K, V; B = batch)
//   strides    3 byte strides for dims 1..3: {stride_s*2, stride_h*2, stride_b*2}
//              (elements of FwdParams times sizeof(elem) = 2; multiples of 16 bytes)
//   box        Q (and Qv): {64, kBlockM, 1, 1};  K and V: {64, kBlockN, 1, 1};  O: {64, 64, 1, 1}
//              (64 elements = one 128-byte swizzle row; ceil(D/64) boxes per tile, the
//              columns past D (D96) zero-filled on load and clipped on store; O is
//              stored per consumer warpgroup, 64 rows)
//   elem strides {1, 1, 1, 1}
//   interleave CU_TENSOR_MAP_INTERLEAVE_NONE
//   swizzle    CU_TENSOR_MAP_SWIZZLE_128B
//   l2 promo   CU_TENSOR_MAP_L2_PROMOTION_L2_256B
//   oob fill   CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE (zeros: rows past S must read as 0;
//              stores clip there)
//   global address: the tensor's base pointer (16-byte aligned)
// Grid  (ctas, 1, 1), tiles = ceil(seqlen_q / kBlockM) * heads_q * batch:
//   any 1 <= ctas <= tiles (the host takes min(tiles, SMs)); CTA c starts with tile c and
//   claims the rest.   block (kThreads, 1, 1)
//   kBlockM = 64 * FC_CONSUMER_WG, kThreads = 128 * (FC_CONSUMER_WG + 1)
// Dynamic shared memory: kSmemBytes = sizeof(SharedStorage) + 1024 (alignment slack)
//   = 2*(kBlockM*D + 2*FC_STAGES*kBlockN*D) + 2048 bytes, D padded to whole 64-column
//   panels (tiles, then barriers padded to 1 KB, then the slack): D64 124928, D96 and D128
//   231424, D192 223232, D256 231424 with the defaults; with FC_QV, + 2*kBlockM*Dv (Qv's tile);
//   needs cudaFuncSetAttribute(fc_fwd_sm90, cudaFuncAttributeMaxDynamicSharedMemorySize,
//   kSmemBytes) (CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES) when above 48 KB.
//   -DFC_SMEM_BYTES=<the launch's size> makes a mismatch a compile error (the host passes it).
// Output o: BSHD through tma_o (p.o and p.o_stride_* only for tiles with no visible key);
//   lse [B, Hq, Sq] f32 natural log when p.lse != nullptr. Causal is the compile-time
//   FC_CAUSAL, bottom-right aligned; p.causal is ignored. FC_LOCAL: a sliding window
//   (p.window_left/right, causal folded in; key blocks outside it are neither loaded nor
//   computed); FC_SOFTCAP: logit softcapping (p.softcap, p.softcap_scale; softmax_scale_log2
//   = log2 e); FC_ALIBI: ALiBi (p.alibi_slopes, p.alibi_scale, p.alibi_batch_stride). See
//   common/mask.cuh.
//   FC_VARLEN: a packed batch (common/sequence.cuh): the tensor maps are over the packed
//   tensors ({D, total, H, 1}; batch coordinate 0), p.cu_seqlens_q/k (+ seqused_k), total_q/k
//   set, p.seqlen_q/k the longest sequence's (the grid's extent, as above with B sequences),
//   lse [Hq, total_q]; tiles past their sequence are skipped by the producer.
//   FC_PAGED: keys from a KV cache (common/paged.cuh, FwdParams): q, o, lse dense; sequence b
//   has min(seqused_k[b] + new_keys, seqlen_k) keys (the mask bottom-right aligned to them).
//   With p.block_table set, tma_k and tma_v are over the page pools: dims {D, page_size, Hkv,
//   num_pages}, strides {row, head, page} in bytes, box {64, r, 1, 1} with r = gcd(page_size,
//   kBlockN) = p.page_box_rows: a key block is kBlockN / r boxes, each at (column, key %
//   page_size, kv head, its page), into the one stage on the stage's one mbarrier (the
//   expected bytes are the whole tile's). Without a table, over the contiguous caches as
//   above ({D, capacity, Hkv, B}, box {64, kBlockN}). Entry fc_paged_append(FwdParams)
//   writes k_new, v_new first; on sm_90 this kernel is then launched as its programmatic
//   dependent (the producer waits, griddep::wait, before its first K/V load). FC_PAGE_SPREAD
//   (with FC_PAGED; the host's form when kBlockN / r > 3): the same contract; lane 0 of the
//   producer warpgroup's other warps issues part of each block's boxes (kBoxIssuers).
// ---------------------------------------------------------------------------------------
#include "common/dropout.cuh"
#include "common/fp8.cuh"
#include "common/mask.cuh"
#include "common/paged.cuh"
#include "common/params.cuh"
#include "common/pipeline.cuh"
#include "common/sequence.cuh"
#include "common/sinks.cuh"
#include "common/softmax_sm90.cuh"
#include "common/tile_scheduler.cuh"
#include "common/tile_sm90.cuh"
#include "common/types.cuh"
#include "ptx/barrier.cuh"
#include "ptx/mbarrier.cuh"
#include "ptx/tma.cuh"
#include "ptx/warpgroup.cuh"
#include "ptx/wgmma.cuh"

#ifndef FC_HEAD_DIM
#define FC_HEAD_DIM 128
#endif
#ifndef FC_FP8
#define FC_FP8 0
#endif
#ifndef FC_CAUSAL
#define FC_CAUSAL 0
#endif
// Defaults per head dim, from the H100 sweep in docs/kernels/fwd_sm90.md (bf16, 16k tokens).
#ifndef FC_BLOCK_N
#if FC_FP8
#define FC_BLOCK_N 128
#elif FC_HEAD_DIM == 64
#define FC_BLOCK_N 128
#elif FC_HEAD_DIM == 96 || FC_HEAD_DIM == 128
#define FC_BLOCK_N 192
#elif FC_HEAD_DIM == 192
#define FC_BLOCK_N 112
#else
#define FC_BLOCK_N 80
#endif
#endif
#ifndef FC_CONSUMER_WG
#define FC_CONSUMER_WG (FC_HEAD_DIM == 64 && !FC_FP8 ? 3 : 2)
#endif
#ifndef FC_STAGES
#define FC_STAGES (FC_HEAD_DIM == 64 && !FC_FP8 ? 3 : 2)
#endif
// Steady-state blocks take the softmax without their max first (softmax_under_pv). H100,
// against the max in every block: D64 +8-12%, D96 +6-8%, D128 +4-16%, D192 +9-11% (S >= 2k);
// D256 within noise (its softmax is a small part of a block), so it keeps the simpler path.
#ifndef FC_PAGE_SPREAD
#define FC_PAGE_SPREAD 0
#endif
#ifndef FC_HEAD_DIM_V
#define FC_HEAD_DIM_V FC_HEAD_DIM
#endif
#ifndef FC_QV
#define FC_QV 0
#endif
// (Not with FC_QV: its fallback recomputes a block's scores from Q·K^T alone; nor FC_FP8: it
// recomputes them with 16-bit mma.sync.)
#ifndef FC_SKIP_MAX
#define FC_SKIP_MAX (FC_HEAD_DIM != 256 && !FC_QV && !FC_FP8)
#endif

namespace fc {
namespace fwd_sm90 {

// A head dim that is not whole 64-column panels (D96, and any multiple of 8 without a
// variant of its own: D40 as D64, D80 as D128, D160 as D192) runs as the next whole number
// of panels: TMA zero-fills the columns past D on every load (they add 0 to Q·K^T, and give
// O columns that are 0) and clips them on the store of O, so only shared memory and the
// tensor cores see the padding (D96 does 4/3 of its useful work).
// e4m3 (FC_FP8): whole 128-value panels (one 128-byte swizzle row), D64 as D128.
constexpr bool kFp8 = FC_FP8 != 0;
constexpr int kPanelValues = kFp8 ? 128 : 64;
constexpr int kHeadDimReal = FC_HEAD_DIM;
constexpr int kHeadDim = (kHeadDimReal + kPanelValues - 1) / kPanelValues * kPanelValues;
// V's head dim, and O's (FC_HEAD_DIM_V; q's and k's unless set): V and O tiles of their own
// width, P·V's N and O's registers with them (DeepSeek's 192 / 128: Q·K^T over 192 columns,
// O of 128). Padded to whole panels as D is.
constexpr int kHeadDimVReal = FC_HEAD_DIM_V;
constexpr int kHeadDimV = (kHeadDimVReal + kPanelValues - 1) / kPanelValues * kPanelValues;
constexpr int kConsumerWG = FC_CONSUMER_WG;
constexpr int kBlockM = 64 * kConsumerWG;
constexpr int kBlockN = FC_BLOCK_N;
constexpr int kStages = FC_STAGES;
constexpr bool kCausal = FC_CAUSAL != 0;
constexpr bool kLocal = FC_LOCAL != 0;      // sliding window (common/mask.cuh)
constexpr bool kSoftcap = FC_SOFTCAP != 0;  // logit softcapping (common/mask.cuh)
constexpr bool kAlibi = FC_ALIBI != 0;      // ALiBi (common/mask.cuh)
constexpr bool kVarlen = FC_VARLEN != 0;    // a packed batch (common/sequence.cuh)
constexpr bool kPaged = FC_PAGED != 0;      // keys from a paged (or contiguous) cache (common/paged.cuh)
constexpr bool kSpread = FC_PAGE_SPREAD != 0;  // paged: a key block's page boxes from four threads (kBoxIssuers)
constexpr bool kSkipMax = FC_SKIP_MAX != 0;
constexpr bool kDropout = FC_DROPOUT != 0;  // attention dropout (common/dropout.cuh)
constexpr bool kSinks = FC_SINKS != 0;      // learnable sinks, folded in store_output (common/sinks.cuh)
constexpr bool kQv = FC_QV != 0;            // FlashAttention-3's qv: S = Q·K^T + Qv·V^T (gemm_scores)
static_assert(!kQv || !(kPaged || kVarlen), "qv runs over dense keys");
static_assert(!kQv || !kSkipMax, "qv's scores are not recomputed from Q·K^T alone");
static_assert(!(kDropout && kPaged), "dropout runs over dense or packed keys");
static_assert(!(kVarlen && kPaged), "a packed batch over a paged cache is not a form");
static_assert(!kFp8 || !(kQv || kPaged || kVarlen || kDropout || kSoftcap || kAlibi || kSkipMax),
              "e4m3 forms: dense keys, masks and sinks alone");
static_assert(!kFp8 || kBlockN % 128 == 0, "e4m3: V^T's key block is whole 128-key panels");
static_assert(!kSpread || kPaged, "FC_PAGE_SPREAD is a paged form");
constexpr int kThreads = warpgroup::kThreads * (kConsumerWG + 1);
// setmaxnreg budgets: 64K registers per SM shared by one CTA.
// Packed, the producer's tile search (find_tile) does not fit 24 registers and spills (up to
// 112 bytes; local memory of one thread that mostly waits); a larger budget would take the
// consumers', which then spill in the key loop (D128 232 registers: 96 bytes). Paged, the page
// lookups fit in 24 only as written (see per_tile, load_pages and produce's kept claim).
constexpr int kProducerRegs = kConsumerWG == 2 ? 24 : 32;
constexpr int kConsumerRegs = kConsumerWG == 2 ? 240 : 160;
static_assert(kHeadDimReal % 8 == 0 && kHeadDimReal >= 8 && kHeadDimReal <= 256, "head dim: a multiple of 8 up to 256");
static_assert(kHeadDimVReal % 8 == 0 && kHeadDimVReal >= 8 && kHeadDimVReal <= 256, "V's head dim: a multiple of 8 up to 256");
static_assert(!kPaged || kHeadDimV == kHeadDim, "a KV cache's pools share one head dim");
static_assert(kBlockN % 16 == 0 && kBlockN <= 256, "key block: whole k16 steps, one wgmma N");
static_assert(kConsumerWG == 2 || kConsumerWG == 3, "consumer warpgroups");
#ifdef FC_BLOCK_M
static_assert(FC_BLOCK_M == kBlockM, "FC_BLOCK_M must be 64 * FC_CONSUMER_WG");
#endif
#ifdef FC_NUM_WARPS
static_assert(FC_NUM_WARPS * 32 == kThreads, "FC_NUM_WARPS must be 4 * (FC_CONSUMER_WG + 1)");
#endif
// A CTA holds the registers of its launch (the entry cap, whole multiples of 8, times the
// threads) and setmaxnreg only moves them between warpgroups: an increase past what the
// others gave back waits forever.
constexpr int kEntryRegs = 65536 / kThreads / 8 * 8;
static_assert(warpgroup::kThreads * (kProducerRegs + kConsumerWG * kConsumerRegs) <= kThreads * kEntryRegs,
              "register file");

// Named barrier ids (0 is __syncthreads): one per consumer warpgroup for the ping-pong, then
// one per consumer warpgroup for its epilogue.
constexpr u32 kSchedulerBarrier = 1;
constexpr u32 kEpilogueBarrier = kSchedulerBarrier + kConsumerWG;

// Longest first for causal tiles, for windows (the first rows see fewer keys), and for packed
// batches, where the last m blocks exist only for the longest sequences, whose tiles (of the
// most keys) then go out first. (Window: also the order that compiles without spills at the
// default tiles.)
using Order = TileOrder<kCausal || kLocal || kVarlen>;

// Q's and K's tiles in 16-bit columns (an e4m3 tile is held as half as many: tile_sm90.cuh).
constexpr int kQkCols = kFp8 ? kHeadDim / 2 : kHeadDim;
using QTile = sm90::SmemTile<kBlockM, kQkCols>;
using KVTile = sm90::SmemTile<kBlockN, kQkCols>;  // K, and V where its head dim is K's
// V's: e4m3, V^T (Dv rows of the block's keys, fc_fp8_transpose_v's order); else the keys' rows.
template <bool kTransposed> struct VTileOf {
    using type = sm90::SmemTile<kBlockN, kHeadDimV>;
};
template <> struct VTileOf<true> {
    using type = sm90::SmemTile<kHeadDimV, kBlockN / 2>;
};
using VTile = VTileOf<kFp8>::type;
// e4m3 P takes the exact running max (softmax_sm90.cuh's kMaxSlack).
using Softmax = sm90::OnlineSoftmaxOf<kFp8 ? 0 : sm90::kMaxSlack>;
constexpr int kPackedP = kFp8 ? kBlockN / 8 : kBlockN / 4;  // P's operand registers (four or two values each)
using OTile = sm90::SmemTile<kBlockM, kHeadDimV>;
using QvTile = sm90::SmemTile<kBlockM, kHeadDimV>;  // FC_QV: qv's rows of the tile, like O's

// FC_QV's tile, a base of SharedStorage: empty in the other forms, so that their layout (and
// machine code) is what it was. qv() is only called where kQv.
template <bool kHas> struct QvStorage {
    __device__ __forceinline__ const QvTile& qv() const { return *reinterpret_cast<const QvTile*>(this); }
};
template <> struct QvStorage<true> {
    QvTile qv_tile;
    __device__ __forceinline__ const QvTile& qv() const { return qv_tile; }
};

struct SharedStorage : QvStorage<kQv> {
    QTile q;
    KVTile k[kStages];
    union {  // the epilogue stages O where V was (O does not fit beside Q, K and V at D128/256)
        VTile v[kStages];
        OTile o;
    };
    alignas(8) u64 q_full, q_empty;
    u64 k_full[kStages], k_empty[kStages];
    u64 v_full[kStages], v_empty[kStages];
    u64 o_free;      // the TMA store has read O out of V's stages
    WorkTile tile;  // the tile q_full announces (not valid: stop)
    Sequence seq;   // its sequence (varlen, paged: read from cu_seqlens, cache_seqlens by the producer)
    int next;       // paged: the producer's next claim, kept here across the tile's loads (see produce)
    int pages[kPaged ? kStages : 1][kBlockN / 16];  // paged: each K stage's page per box (load_pages)
};
static_assert(sizeof(OTile) <= kStages * sizeof(VTile), "O must fit in V's stages");
constexpr unsigned kSmemBytes = sizeof(SharedStorage) + sm90::kSwizzlePeriod;
static_assert(kSmemBytes <= 227 * 1024, "shared memory per block");
#ifdef FC_SMEM_BYTES
static_assert(kSmemBytes == FC_SMEM_BYTES, "the host's shared-memory size (fwd_sm90.rs smem_bytes)");
#endif

__device__ __forceinline__ SharedStorage& shared_storage() { return sm90::aligned_shared_storage<SharedStorage>(); }
using sm90::bar;

__device__ __forceinline__ int ceil_div(int a, int b) { return (a + b - 1) / b; }

using Mask = KeyMask<kCausal, kLocal>;  // common/mask.cuh

// The mask of one sequence's queries and keys.
__device__ __forceinline__ Mask mask_of(const FwdParams& p, const Sequence& seq) {
    return Mask(p, seq.seqlen_q, seq.seqlen_k);
}

// The key blocks the query rows [m0, m0 + block_m) visit ([begin, end), last to first), and
// which of them need the mask (see KeyBlocks).
__device__ __forceinline__ KeyBlocks key_blocks(const FwdParams& p, const Sequence& seq, int m0, int block_m) {
    return mask_of(p, seq).blocks(m0, min(m0 + block_m, seq.seqlen_q), kBlockN);
}

// This thread's place in its warpgroup's m64 x N accumulator (softmax_sm90.cuh): rows
// row and row + 8, columns col and col + 1 of each 8-column chunk; its warp's rows start at
// warp_row. From a fresh read of threadIdx.x, so that these are computed where used: kept
// live across the tile loop, they cost the D128 consumers a spill.
struct Fragment {
    int warp_row, row, col;
};
__device__ __forceinline__ Fragment fragment() {
    const u32 tid = warpgroup::fresh_thread_index();
    const int warp = (tid / 32) % 4, lane = tid % 32;
    return Fragment{16 * warp, 16 * warp + lane / 4, 2 * (lane % 4)};
}

// Masks the scores of keys the row does not see (past seqlen_k, after its causal diagonal,
// outside its window: Mask); the scores are rows [m0, m0 + 64) x keys [n0, n0 + N) of the
// tile's product.
// Chunked, each of the thread's two rows' key range is taken once (Mask::keys: its chunk
// bounds are integer divisions) and counted from the thread's first column, so that a score
// costs compares with constants; the other forms test visible() score by score, the machine
// code they were measured and checked with.
template <int R>
__device__ __forceinline__ void apply_mask(float (&s)[R], int m0, int n0, const Mask& mask) {
    const Fragment f = fragment();
    const int row0 = m0 + f.row, col0 = n0 + f.col;
    if constexpr (Mask::kChunked) {
        const Mask::Keys rows[2] = {mask.keys(row0).from(col0), mask.keys(row0 + 8).from(col0)};
#pragma unroll
        for (int i = 0; i < R; ++i) {
            if (!rows[(i / 2) % 2].sees(8 * (i / 4) + (i % 2))) s[i] = math::neg_inf();
        }
    } else {
#pragma unroll
        for (int i = 0; i < R; ++i) {
            const int col = col0 + 8 * (i / 4) + (i % 2);
            const int row = row0 + 8 * ((i / 2) % 2);
            if (!mask.visible(row, col)) s[i] = math::neg_inf();
        }
    }
}

// Adds the ALiBi bias to the scores of rows [m0, m0 + 64) x keys [n0, n0 + N) (every key
// block: the bias is not a mask).
template <int R>
__device__ __forceinline__ void add_alibi(float (&s)[R], int m0, int n0, const AlibiBias& bias) {
    const Fragment f = fragment();
    const float distance0 = bias.distance(m0 + f.row, n0 + f.col);
#pragma unroll
    for (int i = 0; i < R; ++i) s[i] += bias.at(distance0 + static_cast<float>(8 * ((i / 2) % 2) - 8 * (i / 4) - (i % 2)));
}

// Packed, the rows of a sequence's last tile past its end hold the next sequence's queries;
// their scores become 0, those of the zero-filled rows a sequence run alone has, so that the
// warp-wide choices of the softmax (softmax_under_pv) and hence every bit of the sequence's
// own rows are the same as alone.
template <int R> __device__ __forceinline__ void zero_rows_past(float (&s)[R], int m0, int seqlen_q) {
    const int row0 = m0 + fragment().row;
#pragma unroll
    for (int i = 0; i < R; ++i) {
        if (row0 + 8 * ((i / 2) % 2) >= seqlen_q) s[i] = 0.f;
    }
}

// One query tile: where it is, its sequence, and the key blocks it visits.
struct Tile {
    int m0, head, kv_head, batch;
    Sequence seq;
    KeyBlocks blocks;
    AlibiBias alibi;  // FC_ALIBI only (unread otherwise, so never loaded)
};

// Dropout on the probabilities s of key block n (rows m0 + the fragment's, keys from
// n·kBlockN): the dropped become 0, the kept keep P (O's normalisation scales them by
// 1 / (1 - p): store_output). wgmma's accumulators lay rows and keys out as mma.sync's m16n8
// fragments do (s[4j + 2h + c]: row g + 8h, key 8j + 2t + c), so the mask is the one
// fwd_sm80 and bwd_sm80 draw (common/dropout.cuh's 16 x 32 cells), bit for bit. A key block
// of other than a multiple of 32 keys (D256 causal's 80) starts some blocks inside a cell:
// fragment j is fragment (phase + j) % 4 of its cell, phase the block's first key's, one
// compiled form per phase.
template <int kPhase, int R>
__device__ __forceinline__ void apply_dropout_from(float (&s)[R], int m0, int n, const FwdParams& p, const Tile& t) {
    const Fragment f = fragment();
    const dropout::Mask drop(p);
    const int bh = t.batch * p.heads_q + t.head;
    u32x4 words{};
#pragma unroll
    for (int j = 0; j < R / 4; ++j) {
        const int k = (kPhase + j) % 4;  // constant: the loop is unrolled
        if (j == 0 || k == 0) words = drop.cell_words(bh, m0 + f.row, n * kBlockN + 8 * j + f.col);
        float fragment_scores[4] = {s[4 * j], s[4 * j + 1], s[4 * j + 2], s[4 * j + 3]};
        drop.zero_dropped(dropout::Mask::fragment_word(words, k), fragment_scores);
        s[4 * j] = fragment_scores[0], s[4 * j + 1] = fragment_scores[1], s[4 * j + 2] = fragment_scores[2], s[4 * j + 3] = fragment_scores[3];
    }
}
template <int R>
__device__ __forceinline__ void apply_dropout(float (&s)[R], int m0, int n, const FwdParams& p, const Tile& t) {
    static_assert(kBlockN % 8 == 0, "whole n8 fragments");
    switch (kBlockN % 32 == 0 ? 0 : (n * kBlockN / 8) % 4) {
        case 0: apply_dropout_from<0>(s, m0, n, p, t); break;
        case 1: apply_dropout_from<1>(s, m0, n, p, t); break;
        case 2: apply_dropout_from<2>(s, m0, n, p, t); break;
        default: apply_dropout_from<3>(s, m0, n, p, t); break;
    }
}

// The scores' transform and mask for key block n (softcapping first: it needs the raw scores;
// then ALiBi's bias, in logit units, then the mask).
template <int R>
__device__ __forceinline__ void finish_scores(float (&s)[R], int m0, int n, bool masked, const FwdParams& p, const Tile& t) {
    if (kVarlen && m0 + 64 > t.seq.seqlen_q) zero_rows_past(s, m0, t.seq.seqlen_q);
    if constexpr (kSoftcap) softcap_scores(s, p);
    if constexpr (kAlibi) add_alibi(s, m0, n * kBlockN, t.alibi);
    if (masked) apply_mask(s, m0, n * kBlockN, mask_of(p, t.seq));
}

// Paged, the producer's page loads take the registers its 24 had kept for the tile order's
// loop invariants (the counts and the reciprocals of their divisions; it spills them): there
// the order and the tile are recomputed each tile from copies of the parameters made opaque,
// which ptxas cannot hoist out of the tile loop.
__device__ __forceinline__ int per_tile(int x) {
    if (kPaged) asm volatile("" : "+r"(x));
    return x;
}
__device__ __forceinline__ Order make_order(const FwdParams& p, const TileSchedule& schedule) {
    return Order{ceil_div(per_tile(p.seqlen_q), kBlockM), per_tile(p.heads_q), per_tile(p.batch), per_tile(schedule.section)};
}
__device__ __forceinline__ Tile make_tile(const FwdParams& p, const WorkTile& w, const Sequence& seq) {
    Tile t;
    t.m0 = w.m_block * kBlockM;
    t.head = w.head;
    t.batch = w.batch;
    t.kv_head = t.head / (per_tile(p.heads_q) / per_tile(p.heads_kv));
    t.seq = seq;
    t.blocks = key_blocks(p, seq, t.m0, kBlockM);
    if (kAlibi) t.alibi = alibi_of(p, t.batch, t.head, seq.seqlen_q, seq.seqlen_k);
    return t;
}
// The tensors' batch coordinate of a tile (packed: one batch entry, the sequences' rows).
__device__ __forceinline__ int batch_coord(const Tile& t) { return kVarlen ? 0 : t.batch; }

// FC_PAGE_SPREAD (the host's form for pages that cut a key block into more than 3 boxes,
// fwd_sm90::paged_form): a key block's boxes are issued by kBoxIssuers threads, lane 0 of each
// warp of the producer warpgroup (the producer, issuer 0, and box_issuers(p) - 1 helpers, see
// help_produce), each a run of box_span(p) keys of whole boxes. At page 16 D128's block is 12
// boxes x 2 panels: the one producer thread, box after box (table entry, R2UR, clamp, page id
// to shared memory, two UTMALDG), fell behind the consumers (0.47-0.57 of the contiguous rate;
// 0.84-0.89 spread over four, H100: docs/kernels/fwd_sm90.md). One warp's lanes would not share the
// work: a TMA load takes its operands from uniform registers, one set a warp, so lanes with
// different boxes issue one after another; the four warps sit on the SM's four
// sub-partitions. A form of its own, so that the plain paged form's machine code stays as it
// was where the producer alone keeps up (pages of 64 and more: at most 3 boxes a block).
constexpr int kBoxIssuers = warpgroup::kThreads / 32;
__device__ __forceinline__ int box_span(const FwdParams& p) {
    return (kBlockN / p.page_box_rows + kBoxIssuers - 1) / kBoxIssuers * p.page_box_rows;
}
__device__ __forceinline__ int box_issuers(const FwdParams& p) {
    return kSpread && p.block_table != nullptr ? ceil_div(kBlockN, box_span(p)) : 1;
}

// Keys [key0 + first, key0 + last) of sequence `batch` (one issuer's run of the key block at
// key0, see kBoxIssuers) through the block table, box by box of p.page_box_rows keys
// (gcd(page_size, kBlockN): a box never straddles two pages, a key block is whole boxes) into
// the stage at `dst`, completing on `full`, on which the producer alone arms the whole block's
// bytes (a helper's boxes may land first: the barrier's transaction count goes below zero
// until then, and the phase waits for the producer's arrival). The entry is clamped to the
// table (keys past a sequence's capacity read the next row's first entries, or the table's
// last) and the page to the pool: a bad entry reads a wrong page, never outside the pool or
// the table. Keys past the sequence's end are whatever the page holds: masked in S, and
// cleared from V by the consumers (clear_keys_past_end). K's loads look the pages up and keep
// them at `ids` (the K stage's entry of SharedStorage::pages, a word per 16 keys); V's of the
// same block, issued by the same thread, read them back from there: K and V of a block take
// the same stage index (both rings advance once a block), and the thread loads K of the block
// kStages later into it only after V of this one.
__device__ __forceinline__ void load_pages(u32 dst, const TmaDescriptor* map, u32 full, const FwdParams& p, int batch,
                                           int kv_head, int key0, u32 first, u32 last, u32 ids, bool is_v) {
    // One division a block: box to box the row within its page and the table entry step on.
    // 32-bit entry offsets (the host keeps the table below 2^31 entries): 64-bit ones spill.
    const int stride = static_cast<int>(p.block_table_stride);
    const int slot = (key0 + static_cast<int>(first)) / p.page_size;
    int row = key0 + static_cast<int>(first) - slot * p.page_size, entry = batch * stride + slot;
    for (u32 r = first; r < last; r += p.page_box_rows) {
        int page;
        if (is_v) {
            page = sm90::ld_shared_u32(ids + r / 4);
        } else {
            page = clamp_to(__ldg(p.block_table + min(entry, (p.batch - 1) * stride + p.max_pages - 1)), 0, p.num_pages - 1);
            sm90::st_shared_u32(ids + r / 4, page);
        }
#pragma unroll
        for (int c = 0; c < KVTile::kPanels; ++c) {
            tma::load_4d(dst + c * KVTile::kPanelBytes + r * sm90::kRowBytes, map, full, c * sm90::kPanelCols, row, kv_head, page);
        }
        row += p.page_box_rows;
        if (row == p.page_size) {
            row = 0;
            ++entry;
        }
    }
}

// One past the last key block one consumer warpgroup's 64 rows need, at most the tile's:
// fewer on the causal diagonal when the tile is taller than a key block (D64 192 x 128: the
// top rows do not see the last block), none (the tile's begin) for rows all past seqlen_q
// (the last, partial tile).
__device__ __forceinline__ int own_key_blocks(const FwdParams& p, const Tile& t, int m0) {
    if (m0 >= t.seq.seqlen_q) return t.blocks.begin;
    const int end = min(t.blocks.end, key_blocks(p, t.seq, m0, 64).end);
    return kLocal ? max(t.blocks.begin, end) : end;
}

// This thread's LSE of its two rows (natural log), rows past seqlen_q skipped; the warpgroup's
// rows start at m0. The (batch, head) index is made opaque first: computed from
// loop-invariant values, ptxas hoists the 64-bit address to the start of the tile and
// keeps it live across the key loop; unsigned, so that no sign word is kept live either.
__device__ __forceinline__ void store_lse(const float (&lse)[2], const FwdParams& p, int m0, const Tile& t) {
    if (p.lse == nullptr || threadIdx.x % 4 != 0) return;
    const int row0 = m0 + fragment().row;
    if constexpr (kVarlen) {
        float* out = p.lse + lse_offset<true>(p, t.seq, t.batch, t.head);
#pragma unroll
        for (int r = 0; r < 2; ++r) {
            if (row0 + 8 * r < t.seq.seqlen_q) out[row0 + 8 * r] = lse[r];
        }
        return;
    }
    int bh = t.batch * p.heads_q + t.head;
    asm volatile("" : "+r"(bh));
#pragma unroll
    for (int r = 0; r < 2; ++r) {
        const int row = row0 + 8 * r;
        if (row < p.seqlen_q) p.lse[static_cast<u64>(static_cast<u32>(bh)) * static_cast<u32>(p.seqlen_q) + row] = lse[r];
    }
}

// Rows [m0, m0 + 64) of O straight from this thread's registers (`value(i)`: the value of
// accumulator register i), rows past the sequence skipped: 4-byte stores, for the tiles
// whose O does not take the TMA store (see store_output and store_empty).
template <class Value>
__device__ __forceinline__ void store_rows(const FwdParams& p, const Tile& t, int m0, Value value) {
    const Fragment f = fragment();
    elem_t* out = static_cast<elem_t*>(p.o) + t.batch * p.o_stride_b + t.head * p.o_stride_h;
#pragma unroll
    for (int r = 0; r < 2; ++r) {
        const int row = m0 + f.row + 8 * r;
        if (row >= t.seq.seqlen_q) continue;
        elem_t* dst = out + (t.seq.q_start + row) * p.o_stride_s + f.col;
#pragma unroll
        for (int j = 0; j < kHeadDimVReal / 8; ++j) {
            *reinterpret_cast<u32*>(dst + 8 * j) = pack2<elem_t>(value(4 * j + 2 * r), value(4 * j + 2 * r + 1));
        }
    }
}

// Epilogue of one consumer warpgroup: normalise O, stage it in shared memory (swizzled, in
// V's stages), and write it with one TMA store per 64-column panel: whole 128-byte rows
// instead of scattered 4-byte stores. `last_v` is the tile's last V stage: once every
// consumer warpgroup has released it, no one reads V's stages until the producer, waiting on
// o_free, refills them for the next tile.
__device__ __forceinline__ void store_output(SharedStorage& smem, float (&o)[kHeadDimV / 2], Softmax& softmax,
                                             const FwdParams& p, const Tile& t, int wg,
                                             const PipelineState<kStages>& last_v, const TmaDescriptor* tma_o) {
    float inv[2], lse[2];
    softmax.finish(inv, lse);
    if constexpr (kDropout) inv[0] *= p.dropout_scale, inv[1] *= p.dropout_scale;  // the kept P's 1 / (1 - p)
    if constexpr (kFp8) {
        const float v_descale = fp8::v_descale(p, t.batch, t.kv_head);
        inv[0] *= v_descale, inv[1] *= v_descale;
    }
    if constexpr (kSinks) {
        const float sink = p.learnable_sink[t.head];
        sinks::fold(sink, inv[0], lse[0]);
        sinks::fold(sink, inv[1], lse[1]);
    }
    const int m0 = t.m0 + 64 * wg;
    if (kVarlen && m0 + 64 > t.seq.seqlen_q) {
        // A sequence's last rows: the TMA store's box would write over the next sequence's
        // first rows. O never goes to V's stages, which are free for the producer at once.
        store_rows(p, t, m0, [&](int i) { return o[i] * inv[(i / 2) % 2]; });
        if (threadIdx.x % warpgroup::kThreads == 0) mbarrier::arrive(bar(smem.o_free));
        store_lse(lse, p, m0, t);
        return;
    }
    mbarrier::wait(bar(smem.v_empty, last_v.stage()), last_v.full_parity());
    sm90::write_accumulator(smem.o, 64 * wg, o, inv);
    tma::fence_proxy_async_shared();
    named_barrier::sync(kEpilogueBarrier + wg, warpgroup::kThreads);
    if (threadIdx.x % warpgroup::kThreads == 0) {
        smem.o.store(tma_o, 64 * wg, t.seq.q_start + m0, t.head, batch_coord(t));
        tma::store_commit_group();
        tma::store_wait_read();
        mbarrier::arrive(bar(smem.o_free));
    }
    store_lse(lse, p, m0, t);
}

// A tile with no visible key (causal with seqlen_q > seqlen_k): O = 0 and LSE = -inf (with
// a sink, the sink: common/sinks.cuh's row that saw no key), stored straight from registers
// so that the O/V hand-over above only counts tiles that loaded V. The warpgroup's rows
// start at m0.
__device__ __forceinline__ void store_empty(const FwdParams& p, const Tile& t, int m0) {
    store_rows(p, t, m0, [](int) { return 0.f; });
    const float none = kSinks ? p.learnable_sink[t.head] : math::neg_inf();
    const float lse[2] = {none, none};
    store_lse(lse, p, m0, t);
}

// The order in which a tile's key blocks [n_begin, n_end) load, last first, the order the
// consumers need them in: K of the last block, then `after_first_k` (the producer's claim of
// its next tile), K of the one before, V of the last once the previous tile's O has left V's
// stages (`wait_o_free`), then V and K alternating, K of the next block before V of this one.
// The producer and (FC_PAGE_SPREAD) its helpers each issue their boxes in this order.
template <class LoadK, class LoadV, class AfterFirstK, class WaitOFree>
__device__ __forceinline__ void for_each_block(int n_begin, int n_end, LoadK load_k, LoadV load_v,
                                               AfterFirstK after_first_k, WaitOFree wait_o_free) {
    int n = n_end - 1;
    load_k(n);
    after_first_k();
    if (n > n_begin) load_k(n - 1);
    wait_o_free();
    load_v(n);
    for (--n; n >= n_begin; --n) {
        if (n > n_begin) load_k(n - 1);
        load_v(n);
    }
}

// Producer: claims tiles and announces each to the consumers through q_full, with Q (a tile
// with no visible key and the stop mark come without data), then loads its key blocks
// (for_each_block). It claims the next tile once this tile's first K load is issued, so the
// atomic's latency hides under this tile. The next tile's announcement waits until the
// consumers have issued their last Q·K^T (q_empty), and its first V until the previous
// tile's O has left V's stages (o_free), so its Q and first K blocks load under the
// previous tile's epilogue.
// The tile of claim `index`, or packed, of the first claim from it on whose tile has rows: the
// last m blocks of all but the longest sequences are past their ends, and are passed over
// here, unannounced, rather than sent through the consumers. `seq` is the tile's sequence.
__device__ __forceinline__ WorkTile find_tile(const FwdParams& p, const Order& order, const TileCounter& counter,
                                              int index, Sequence& seq) {
    if constexpr (kPaged) {  // no loop: the producer's 24 registers do not hold one (ptxas spills)
        const WorkTile w = order.at(index);
        seq = w.valid ? paged::sequence(p, w.batch) : sequence<false>(p, 0);
        return w;
    } else if constexpr (!kVarlen) {
        // This order (the sequence set first) matters: with the tile decoded first, NVRTC
        // 13.0's ptxas spills 16-64 bytes in every windowed variant's producer.
        seq = sequence<false>(p, 0);
        return order.at(index);
    }
    for (;; index = counter.claim()) {
        const WorkTile w = order.at(index);
        if (!w.valid) return w;
        seq = sequence<kVarlen>(p, w.batch);
        if (!kVarlen || w.m_block * kBlockM < seq.seqlen_q) return w;
    }
}

__device__ __forceinline__ void produce(SharedStorage& smem, const FwdParams& p, const TileSchedule& schedule,
                                        const TmaDescriptor* tma_q, const TmaDescriptor* tma_k, const TmaDescriptor* tma_v,
                                        const TmaDescriptor* tma_qv) {
    const Order order = make_order(p, schedule);  // paged: made again each tile (see per_tile)
    const u32 span = kSpread && p.block_table != nullptr ? box_span(p) : kBlockN;  // this thread's keys of a block
    const TileCounter counter{schedule.counter};
    if (kPaged) griddep::wait();  // launched early after fc_paged_append (k_new, v_new): keys written now
    PipelineCounter<kStages> ks, vs;
    PipelineCounter<1> tiles;  // one phase of q_full, q_empty and o_free per announced tile
    // Paged, the next claim waits in shared memory while the tile's pages load: the producer's
    // 24 registers do not hold it beside the page lookups (it spills).
    volatile int& kept = smem.next;
    for (int index = counter.first(), next = 0;; index = kPaged ? static_cast<int>(kept) : next, tiles.advance()) {
        // Decoded before the wait, off the path from q_empty to the Q load.
        Sequence seq;
        const WorkTile w = find_tile(p, kPaged ? make_order(p, schedule) : order, counter, index, seq);
        const Tile t = make_tile(p, w, seq);
        mbarrier::wait(bar(smem.q_empty), tiles.empty_parity());
        smem.tile = w;
        if constexpr (kVarlen || kPaged) smem.seq = seq;
        if (!w.valid) {
            mbarrier::arrive(bar(smem.q_full));
            break;
        }
        const int n_begin = kLocal ? t.blocks.begin : 0, n_end = t.blocks.end;
        if (kLocal ? n_end <= n_begin : n_end == 0) {
            mbarrier::arrive(bar(smem.q_full));
            next = counter.claim();
            if (kPaged) kept = next;
            continue;
        }
        mbarrier::arrive_expect_tx(bar(smem.q_full), QTile::kBytes + (kQv ? QvTile::kBytes : 0));
        smem.q.load(tma_q, bar(smem.q_full), t.seq.q_start + t.m0, t.head, batch_coord(t));
        if constexpr (kQv) smem.qv().load(tma_qv, bar(smem.q_full), t.seq.q_start + t.m0, t.head, batch_coord(t));
        // K's ring or V's (`ring`'s tiles: KVTile or VTile, of their own width).
        auto load = [&](const auto& ring, const u64 (&full)[kStages], const u64 (&empty)[kStages],
                        PipelineCounter<kStages>& st, const TmaDescriptor* map, int n) {
            const u32 bytes = ring[0].kBytes;
            mbarrier::wait(bar(empty, st.stage()), st.empty_parity());
            mbarrier::arrive_expect_tx(bar(full, st.stage()), bytes);
            const u32 dst = smem_u32(ring) + st.stage() * bytes;
            if (kPaged && p.block_table != nullptr) {
                load_pages(dst, map, bar(full, st.stage()), p, t.batch, t.kv_head, n * kBlockN, 0u, span,
                           smem_u32(smem.pages) + st.stage() * sizeof(smem.pages[0]), map == tma_v);
            } else if (kFp8 && map == tma_v) {  // V^T: the block's keys are columns (16-bit units: two keys)
                VTile::load_cols_to(dst, map, bar(full, st.stage()), n * kBlockN / 2, 0, t.kv_head, t.batch);
            } else {
                ring[0].load_to(dst, map, bar(full, st.stage()), t.seq.k_start + n * kBlockN, t.kv_head, batch_coord(t));
            }
            st.advance();
        };
        auto load_k = [&](int n) { load(smem.k, smem.k_full, smem.k_empty, ks, tma_k, n); };
        auto load_v = [&](int n) { load(smem.v, smem.v_full, smem.v_empty, vs, tma_v, n); };
        const auto claim_next = [&] {
            next = counter.claim();  // claimed early: the atomic's latency hides under this tile
            if (kPaged) kept = next;
        };
        for_each_block(n_begin, n_end, load_k, load_v, claim_next,
                       [&] { mbarrier::wait(bar(smem.o_free), tiles.empty_parity()); });
    }
    counter.retire();
}

// FC_PAGE_SPREAD with a block table: issuer `issuer` (1 .. box_issuers(p) - 1; lane 0 of producer warp
// `issuer`) loads its run of every key block's boxes (load_pages), block for block in the
// producer's order, on the producer's barriers; the producer arms them. It takes each tile
// from the producer's announcement (q_full) and arrives on q_empty once it has read it, so
// that the next announcement does not overwrite it first (q_empty counts the helpers).
__device__ __forceinline__ void help_produce(const FwdParams& p, const TmaDescriptor* tma_k, const TmaDescriptor* tma_v,
                                             int issuer) {
    if (issuer >= box_issuers(p)) return;
    griddep::wait();
    const u32 first = issuer * box_span(p), last = min(first + box_span(p), static_cast<u32>(kBlockN));
    PipelineCounter<kStages> ks, vs;
    const SharedStorage& smem = shared_storage();
    for (PipelineCounter<1> tiles;; tiles.advance()) {
        mbarrier::wait(bar(smem.q_full), tiles.full_parity());
        const WorkTile w = smem.tile;
        const Sequence seq = smem.seq;
        mbarrier::arrive(bar(smem.q_empty));
        if (!w.valid) return;
        const Tile t = make_tile(p, w, seq);
        const int n_begin = kLocal ? t.blocks.begin : 0, n_end = t.blocks.end;
        if (kLocal ? n_end <= n_begin : n_end == 0) continue;
        auto load = [&](const auto& ring, const u64 (&full)[kStages], const u64 (&empty)[kStages],
                        PipelineCounter<kStages>& st, const TmaDescriptor* map, int n) {
            mbarrier::wait(bar(empty, st.stage()), st.empty_parity());
            load_pages(smem_u32(ring) + st.stage() * ring[0].kBytes, map, bar(full, st.stage()), p, t.batch, t.kv_head,
                       n * kBlockN, first, last, smem_u32(smem.pages) + st.stage() * sizeof(smem.pages[0]),
                       map == tma_v);
            st.advance();
        };
        auto load_k = [&](int n) { load(smem.k, smem.k_full, smem.k_empty, ks, tma_k, n); };
        auto load_v = [&](int n) { load(smem.v, smem.v_full, smem.v_empty, vs, tma_v, n); };
        for_each_block(n_begin, n_end, load_k, load_v, [] {},
                       [&] { mbarrier::wait(bar(smem.o_free), tiles.empty_parity()); });
    }
}

// Ping-pong hand-off: a consumer warpgroup waits for its turn before issuing its GEMMs and
// passes the turn on after issuing them. Every warpgroup takes the same number of turns per
// tile, so the rotation carries over from tile to tile.
__device__ __forceinline__ void take_turn(int wg) {
    named_barrier::sync(kSchedulerBarrier + wg, 2 * warpgroup::kThreads);
}
__device__ __forceinline__ void pass_turn(int wg) {
    named_barrier::arrive(kSchedulerBarrier + (wg + 1) % kConsumerWG, 2 * warpgroup::kThreads);
}

// A key block this warpgroup's rows do not see: its K and V stages are released once loaded
// (so that every stage gets one arrival per consumer warpgroup, in order) and its ping-pong
// turn is passed on at once.
__device__ __forceinline__ void pass_over_block(SharedStorage& smem, PipelineState<kStages>& ks,
                                                PipelineState<kStages>& vs, int wg) {
    mbarrier::wait(bar(smem.k_full, ks.stage()), ks.full_parity());
    take_turn(wg);
    pass_turn(wg);
    mbarrier::arrive(bar(smem.k_empty, ks.stage()));
    ks.advance();
    mbarrier::wait(bar(smem.v_full, vs.stage()), vs.full_parity());
    mbarrier::arrive(bar(smem.v_empty, vs.stage()));
}

// Paged: the rows of V past the sequence's last key hold whatever the page has there (NaN,
// maybe: a cache's unused rows are the caller's); their P is 0, but 0 · NaN is NaN, where
// the dense tensor maps zero-fill. So before the P·V of key block n, if it reaches past the
// end, the warpgroup zeroes those rows of V's stage `vs` (once a tile: only the last block
// can). Every warpgroup that reads the stage clears it, each before its own P·V; the others'
// stores write the same zeros over zeros, and the stage is refilled only after all have
// released it.
__device__ __forceinline__ void clear_keys_past_end(SharedStorage& smem, const PipelineState<kStages>& vs, const Tile& t,
                                                    int n, int wg) {
    if (!kPaged || (n + 1) * kBlockN <= t.seq.seqlen_k) return;
    mbarrier::wait(bar(smem.v_full, vs.stage()), vs.full_parity());
    smem.v[vs.stage()].clear_rows_from(t.seq.seqlen_k - n * kBlockN, threadIdx.x % warpgroup::kThreads, warpgroup::kThreads);
    tma::fence_proxy_async_shared();  // the generic stores before wgmma's (async-proxy) reads
    named_barrier::sync(kEpilogueBarrier + wg, warpgroup::kThreads);
}

// Waits for this block's P·V after its softmax. The wait is in both arms of a branch on the
// block index's parity: as one straight-line wait, ptxas hoists it above the softmax, to just
// after the S wait (SASS: WARPGROUP.DEPBAR.LE gsb0, 0x0 before the MUFU.EX2s), and the
// block's exp2 work no longer overlaps its P·V; it does not move a wait above a branch. The
// condition must be the same in all four warps (the wait is .aligned over the warpgroup),
// hence the block index and not a softmax result. scripts/sass-check.py checks the placement.
__device__ __forceinline__ void wait_pv_below_softmax(int n) {
    if (n % 2) {
        wgmma::wait<0, 1>();
    } else {
        wgmma::wait<0, 2>();
    }
}

// The softmax of a steady-state block and the wait for the previous block's P·V, which runs
// under it. With kSkipMax, first exp_at_current_max (no block max) when the warp's rows
// have a max; where a p passed the limit, lift() rescales the block's p's exactly; only an
// exp2 that overflowed f32 (a score 128 log2 units over the max; or a NaN) needs the scores
// again: warp_qk recomputes them from the K stage the caller still holds, after the P·V
// wait, so that P's registers are free for it (nothing reads them until to_operand). The
// wait is one instruction for all paths: a wgmma wait is warpgroup-wide, and warps that
// took different paths must reach it at the same pc (compute-sanitizer synccheck: "Warpgroup
// MMA sequence error"). Returns whether O must be rescaled (warp-uniform: every branch is).
__device__ __forceinline__ bool softmax_under_pv(float (&s)[kBlockN / 2], Softmax& softmax,
                                                float (&rescale)[2], float (&o)[kHeadDimV / 2], u32 (&pk)[kPackedP],
                                                const SharedStorage& smem, const PipelineState<kStages>& ks,
                                                int q_row, int m0, bool masked, const FwdParams& p, const Tile& t, int n,
                                                float tile_scale_log2) {
    // The 16-bit forms read the scale from the parameters here, as they were measured: held in
    // a register from the tile's start it moves the paged forms' allocation.
    const float scale_log2 = kFp8 ? tile_scale_log2 : p.softmax_scale_log2;
    bool rescale_o = false, rescore = false;
    if (kSkipMax && __all_sync(0xffffffffu, softmax.has_max())) {
        float block_sum[2];
        if (__all_sync(0xffffffffu, softmax.exp_at_current_max(s, scale_log2, block_sum))) {
            softmax.add_block_sums(block_sum);
        } else if (__all_sync(0xffffffffu, block_sum[0] < math::inf() && block_sum[1] < math::inf())) {  // NaN: no
            rescale_o = __any_sync(0xffffffffu, softmax.lift(s, block_sum, rescale));
        } else {
            rescore = true;
        }
    } else {
        rescale_o = __any_sync(0xffffffffu, softmax.update(s, scale_log2, rescale));
    }
    wait_pv_below_softmax(n);
    wgmma::fence_operands(o);
    wgmma::fence_operands(pk);
    if (rescore) {
        sm90::warp_qk(s, smem.q, q_row + fragment().warp_row, smem.k[ks.stage()]);
        finish_scores(s, m0, n, masked, p, t);
        rescale_o = __any_sync(0xffffffffu, softmax.update(s, scale_log2, rescale));
    }
    return rescale_o;
}

// A key block's products by input type (member templates, so that only the kernel's own
// type's are compiled): 16-bit (Q·K^T, with FC_QV + Qv·V^T; P·V from V's rows) or e4m3
// (tile_sm90.cuh's k32 forms; P·V from V^T, P packed in its key order).
template <bool kE4M3> struct Products {
    template <class S, class Q, class K> static __device__ __forceinline__ void qk(S& s, const Q& q, int q_row, const K& k) {
        sm90::gemm_qk(s, q, q_row, k);
    }
    template <class... A> static __device__ __forceinline__ void qk_qv(A&... a) { sm90::gemm_qk_qv(a...); }
    template <class S, class P> static __device__ __forceinline__ void to_operand(const S& s, P& pk) { sm90::to_operand(s, pk); }
    template <class O, class P, class V> static __device__ __forceinline__ void pv(O& o, P& pk, const V& v) { sm90::gemm_pv(o, pk, v); }
};
template <> struct Products<true> {
    template <class S, class Q, class K> static __device__ __forceinline__ void qk(S& s, const Q& q, int q_row, const K& k) {
        sm90::gemm_qk_e4m3(s, q, q_row, k);
    }
    template <class... A> static __device__ __forceinline__ void qk_qv(A&...) {
        static_assert(sizeof...(A) == 0, "e4m3 forms take no qv");
    }
    template <class S, class P> static __device__ __forceinline__ void to_operand(const S& s, P& pk) { sm90::to_operand_e4m3(s, pk); }
    template <class O, class P, class V> static __device__ __forceinline__ void pv(O& o, P& pk, const V& vt) {
        sm90::gemm_pv_e4m3(o, pk, vt);
    }
};
using Gemms = Products<kFp8>;

// The scores of a key block: Q·K^T from K's stage `ks`; with FC_QV, + Qv·V^T from the block's
// own V stage `v_of_block`, waited here (V arrives after K; its P·V comes a block later).
__device__ __forceinline__ void gemm_scores(float (&s)[kBlockN / 2], SharedStorage& smem, int q_row,
                                            const PipelineState<kStages>& ks, const PipelineState<kStages>& v_of_block) {
    if constexpr (kQv) {
        mbarrier::wait(bar(smem.v_full, v_of_block.stage()), v_of_block.full_parity());
        Gemms::qk_qv(s, smem.q, smem.qv(), q_row, smem.k[ks.stage()], smem.v[v_of_block.stage()]);
    } else {
        Gemms::qk(s, smem.q, q_row, smem.k[ks.stage()]);
    }
}

// One consumer warpgroup: rows [64*wg, 64*wg + 64) of each tile.
__device__ __forceinline__ void consume(SharedStorage& smem, const FwdParams& p, const TmaDescriptor* tma_o, int wg) {
    const int q_row = 64 * wg;  // within the Q tile
    const float scale_log2 = p.softmax_scale_log2;
    PipelineState<kStages> ks, vs;
    PipelineState<1> qs;

    // The last warpgroup hands the first turn to warpgroup 0.
    if (wg == kConsumerWG - 1) named_barrier::arrive(kSchedulerBarrier, 2 * warpgroup::kThreads);

    for (;;) {
        mbarrier::wait(bar(smem.q_full), qs.full_parity());
        qs.advance();
        const WorkTile w = smem.tile;
        // The stop test through a shuffle: ptxas then treats the tile loop as warp-uniform
        // and keeps the pipeline stages, hence the wgmma descriptors, in uniform registers
        // (with the test on the loaded value, 5% slower: descriptors built per thread + R2UR).
        if (!warpgroup::warp_uniform(w.valid)) break;
        const Tile t = make_tile(p, w, kVarlen || kPaged ? smem.seq : sequence<false>(p, 0));
        const int m0 = t.m0 + q_row;  // this warpgroup's first query row
        const int n_begin = kLocal ? t.blocks.begin : 0, n_end = t.blocks.end;
        if (kLocal ? n_end <= n_begin : n_end == 0) {
            mbarrier::arrive(bar(smem.q_empty));
            if (threadIdx.x % warpgroup::kThreads == 0) mbarrier::arrive(bar(smem.o_free));  // O left V's stages alone
            store_empty(p, t, m0);
            continue;
        }
        float o[kHeadDimV / 2];
#pragma unroll
        for (int i = 0; i < kHeadDimV / 2; ++i) o[i] = 0.f;
        Softmax softmax;

        // Blocks this warpgroup's rows do not see come first (last to first): passed over.
        int n = n_end - 1;
        const int n_own = own_key_blocks(p, t, m0);
        PipelineState<kStages> last_v = vs;
        for (; n >= n_own; --n) {
            pass_over_block(smem, ks, vs, wg);
            last_v = vs;
            vs.advance();
        }
        if (n < n_begin) {  // no block of its own: O = 0 (rows past seqlen_q are not stored)
            mbarrier::arrive(bar(smem.q_empty));
        } else {
            float s[kBlockN / 2];
            u32 pk[kPackedP];
            // e4m3: the tile's descales scale its scores (fp8::qk_descale).
            const float tile_scale_log2 = kFp8 ? scale_log2 * fp8::qk_descale(p, t.batch, t.kv_head) : scale_log2;
            float rescale[2];

            mbarrier::wait(bar(smem.k_full, ks.stage()), ks.full_parity());
            take_turn(wg);
            gemm_scores(s, smem, q_row, ks, vs);  // (V's stage of this first block: vs)
            pass_turn(wg);
            wgmma::wait<0>();
            wgmma::fence_operands(s);
            mbarrier::arrive(bar(smem.k_empty, ks.stage()));
            ks.advance();
            finish_scores(s, m0, n, Mask::masked(t.blocks, n), p, t);
            softmax.update(s, tile_scale_log2, rescale);
            if constexpr (kDropout) apply_dropout(s, m0, n, p, t);
            Gemms::to_operand(s, pk);

            for (--n; n >= n_begin; --n) {
                clear_keys_past_end(smem, vs, t, n + 1, wg);
                mbarrier::wait(bar(smem.k_full, ks.stage()), ks.full_parity());
                take_turn(wg);
                PipelineState<kStages> v_of_block = vs;  // vs: V of block n + 1, whose P·V is next
                v_of_block.advance();
                gemm_scores(s, smem, q_row, ks, v_of_block);
                mbarrier::wait(bar(smem.v_full, vs.stage()), vs.full_parity());
                Gemms::pv(o, pk, smem.v[vs.stage()]);
                pass_turn(wg);
                wgmma::wait<1>();  // S done; P·V of the previous block still in flight
                wgmma::fence_operands(s);
                auto release_k = [&] {
                    mbarrier::arrive(bar(smem.k_empty, ks.stage()));
                    ks.advance();
                };
                if (!kSkipMax) release_k();  // else after the softmax: its slow path rereads K
                const bool masked = Mask::masked(t.blocks, n);
                finish_scores(s, m0, n, masked, p, t);
                const bool rescale_o = softmax_under_pv(s, softmax, rescale, o, pk, smem, ks, q_row, m0, masked, p, t, n,
                                                                   tile_scale_log2);
                if (kSkipMax) release_k();
                mbarrier::arrive(bar(smem.v_empty, vs.stage()));
                vs.advance();
                if (rescale_o) sm90::scale_rows(o, rescale);
                if constexpr (kDropout) apply_dropout(s, m0, n, p, t);
                Gemms::to_operand(s, pk);
            }
            // Every Q·K^T of the tile is done: the producer may load the next tile's Q.
            mbarrier::arrive(bar(smem.q_empty));
            clear_keys_past_end(smem, vs, t, n_begin, wg);
            mbarrier::wait(bar(smem.v_full, vs.stage()), vs.full_parity());
            Gemms::pv(o, pk, smem.v[vs.stage()]);
            wgmma::wait<0>();
            wgmma::fence_operands(o);
            wgmma::fence_operands(pk);
            mbarrier::arrive(bar(smem.v_empty, vs.stage()));
            last_v = vs;
            vs.advance();
        }
        store_output(smem, o, softmax, p, t, wg, last_v, tma_o);
    }
    // Warpgroup 0 takes the last turn passed to it, so no barrier is left half-arrived.
    if (wg == 0) named_barrier::sync(kSchedulerBarrier, 2 * warpgroup::kThreads);
}

__device__ __forceinline__ void init_barriers(SharedStorage& smem, const FwdParams& p) {
    constexpr u32 kConsumerThreads = kConsumerWG * warpgroup::kThreads;
    mbarrier::init(bar(smem.q_full), 1);
    mbarrier::init(bar(smem.q_empty), kConsumerThreads + box_issuers(p) - 1);  // FC_PAGE_SPREAD: the helpers
    mbarrier::init(bar(smem.o_free), kConsumerWG);
    for (int i = 0; i < kStages; ++i) {
        mbarrier::init(bar(smem.k_full[i]), 1);
        mbarrier::init(bar(smem.v_full[i]), 1);
        mbarrier::init(bar(smem.k_empty[i]), kConsumerThreads);
        mbarrier::init(bar(smem.v_empty[i]), kConsumerThreads);
    }
    mbarrier::fence_init();
}

}  // namespace fwd_sm90
}  // namespace fc

using namespace fc;
using namespace fc::fwd_sm90;

extern "C" __global__ void __launch_bounds__(kThreads, 1)
fc_fwd_sm90(const __grid_constant__ FwdParams p, const __grid_constant__ TmaDescriptor tma_q,
            const __grid_constant__ TmaDescriptor tma_k, const __grid_constant__ TmaDescriptor tma_v,
            const __grid_constant__ TmaDescriptor tma_o,
#if FC_QV
            const __grid_constant__ TmaDescriptor tma_qv,
#endif
            const __grid_constant__ TileSchedule schedule) {
    if constexpr (kDropout) dropout::stage(p);  // (its own __syncthreads)
    if (threadIdx.x == 0) {
        tma::prefetch_descriptor(&tma_q);
        tma::prefetch_descriptor(&tma_k);
        tma::prefetch_descriptor(&tma_v);
        tma::prefetch_descriptor(&tma_o);
#if FC_QV
        tma::prefetch_descriptor(&tma_qv);
#endif
        init_barriers(shared_storage(), p);
    }
    __syncthreads();
    // Each role sets its register budget before it derives anything (the shared storage
    // address, its warpgroup): a value computed before setmaxnreg and used after it has to
    // fit the entry budget, and ptxas spills it rather than recompute it.
    if (warpgroup::index() == 0) {
        warpgroup::decrease_registers<kProducerRegs>();
        // FC_PAGE_SPREAD: lane 0 of the other warps helps with the page boxes (help_produce). The role
        // is chosen per warp (warp-uniform): each lone thread's loop then keeps its values in
        // uniform registers, as the producer's does (a branch on the thread index in one warp
        // costs both the uniform datapath: they spill 300-700 bytes).
        if constexpr (kSpread) {
            const int warp = warpgroup::warp_uniform(static_cast<int>(warpgroup::fresh_thread_index()) / 32);
            if (warp != 0) {
                if (threadIdx.x % 32 == 0) help_produce(p, &tma_k, &tma_v, warp);
                return;
            }
        }
#if FC_QV
        const TmaDescriptor* qv_map = &tma_qv;
#else
        const TmaDescriptor* qv_map = nullptr;  // no qv: never read
#endif
        if (threadIdx.x == 0) produce(shared_storage(), p, schedule, &tma_q, &tma_k, &tma_v, qv_map);
    } else {
        warpgroup::increase_registers<kConsumerRegs>();
        consume(shared_storage(), p, &tma_o, warpgroup::index_in_role() - 1);
    }
}

#if FC_FP8
// V^T for the e4m3 forms (common/fp8.cuh): v [B, Sk, Hkv, Dv] to p.v_transposed [B, Hkv, Dv,
// vt_keys], column L of each 32-key group holding key fp8::permuted_key(L), keys past seqlen_k
// 0. A CTA a tile of 64 keys x 64 columns of one (batch, KV head): 16-byte loads of V's rows
// into shared memory, 16-byte stores of V^T's. Grid (ceil(vt_keys / 64), ceil(Dv / 64), B *
// Hkv), 256 threads; Dv a multiple of 16, v's rows 16-byte aligned (the host's checks).
extern "C" __global__ void __launch_bounds__(256) fc_fp8_transpose_v(const __grid_constant__ FwdParams p) {
    constexpr int kKeys = 64, kCols = 64;
    __shared__ alignas(16) unsigned char tile[kKeys][kCols + 16];  // a row's pad spreads the column reads' banks
    const int key0 = blockIdx.x * kKeys, col0 = blockIdx.y * kCols;
    const int batch = blockIdx.z / p.heads_kv, head = blockIdx.z % p.heads_kv;
    const int t = threadIdx.x, row = t / 4, chunk = t % 4;  // a row of 4 16-byte chunks
    const unsigned char* v = static_cast<const unsigned char*>(p.v) + batch * p.v_stride_b + head * p.v_stride_h;
    u32x4 in{0u, 0u, 0u, 0u};
    if (key0 + row < p.seqlen_k && col0 + 16 * chunk < kHeadDimVReal)
        in = *reinterpret_cast<const u32x4*>(v + static_cast<long long>(key0 + row) * p.v_stride_s + col0 + 16 * chunk);
    *reinterpret_cast<u32x4*>(&tile[row][16 * chunk]) = in;
    __syncthreads();
    // Thread t writes V^T's row col0 + t / 4 (a column of V), keys key0 + 16 (t % 4) on.
    const int col = col0 + row, l0 = 16 * chunk;
    if (col >= kHeadDimVReal || key0 + l0 >= p.vt_keys) return;
    u32 out[4];
#pragma unroll
    for (int w = 0; w < 4; ++w) {
        u32 word = 0;
#pragma unroll
        for (int b = 0; b < 4; ++b) {
            const int l = l0 + 4 * w + b;
            word |= static_cast<u32>(tile[32 * (l / 32) + fp8::permuted_key(l % 32)][row]) << (8 * b);
        }
        out[w] = word;
    }
    unsigned char* vt = static_cast<unsigned char*>(p.v_transposed) +
                        (static_cast<long long>(blockIdx.z) * kHeadDimVReal + col) * p.vt_keys + key0 + l0;
    *reinterpret_cast<u32x4*>(vt) = u32x4{out[0], out[1], out[2], out[3]};
}
#endif
