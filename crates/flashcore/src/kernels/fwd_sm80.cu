// Ampere-class forward attention (sm_80, sm_86, sm_89, sm_90), FlashAttention-2 style.
//
// One CTA per (query tile of kBlockM rows, head, batch); each warp owns kBlockM / kWarps
// query rows. The Q tile is loaded once; K and V tiles stream through a ring of kStages
// shared-memory slots filled by cp.async (one commit group per tile), so the next tiles
// load while this one is computed. Per key tile: S = Q·Kᵀ (ldmatrix + mma.sync, f32),
// mask where needed, online softmax in registers (base 2), then O += P·V with P converted
// in registers into the A operand. Key tiles are visited from last to first, so the tiles
// that need the causal / sequence-end mask come first; fully masked tiles are never loaded.
//
// Configurations (BLOCK_M x BLOCK_N, warps, stages; the host passes them as -D). Dynamic
// smem = 2 * (BLOCK_M + 2 * STAGES * BLOCK_N) * D bytes (Q tile, then the K and V slots; the
// epilogue reuses the Q tile). STAGES = 1 is FlashAttention-2's single K and V buffer (see
// kSingleBuffer). Registers from ptxas (CUDA 13 NVRTC), fp16/bf16 alike,
// full/causal; 0 bytes stack and 0 spills on sm_80, sm_86, sm_89 and sm_90a for all of them:
//   D    sm_80 (163 KB)            sm_86 / sm_89 (99 KB)     sm_90 (227 KB)
//   32   128x128 w4 s2  40 KB      128x64 w4 s2  24 KB       128x128 w4 s2  40 KB
//   64   128x64  w4 s2  48 KB      128x64 w4 s2  48 KB       128x128 w4 s2  80 KB
//   96   128x32  w4 s2  48 KB      128x32 w4 s2  48 KB       128x64  w4 s2  72 KB
//   128  128x32  w4 s2  64 KB      64x32  w4 s2  48 KB       128x64  w4 s2  96 KB
//   192  128x64  w8 s2 144 KB      128x64 w8 s1  96 KB       128x64  w8 s2 144 KB
//   256  64x32   w4 s2  96 KB      64x32  w4 s2  96 KB       128x64  w8 s2 192 KB
//   256, Sk <= 1024 (sm_90 only)                              64x64   w4 s1  96 KB
// Registers (full / causal; fp16 = bf16):
//   D    sm_80      sm_86, sm_89   sm_90a
//   32   234 / 236  156 / 158      233 / 237
//   64   215 / 218  215 / 218      255 / 255
//   96   217 / 216  217 / 216      252 / 252
//   128  237 / 237  152 / 153      255 / 255
//   192  207 / 207  213 / 214      208 / 209
//   256  228 / 228  228 / 228      239 / 239;  64x64 s1: 246 / 254
// Why these: a warp owns 32 query rows where registers allow (its two m16 tiles share every
// K/V fragment, halving shared-memory reads per mma); on sm_86/89 tiles stay at or under
// ~48 KB so that two CTAs share an SM. On H100 the wide tiles D64 128x128 and D128 128x64
// (255 registers, no spill thanks to after_softmax) measured +3% and +11% over 128x64 /
// 128x32, and D96 128x64 +9-18% over 128x32 (docs/kernels/fwd_sm80.md); sm_80 keeps the narrower
// ones until measured on an A100. D192 is FlashAttention-2's 128x64 w8 tile. With
// few keys, D256 on H100 runs 64x64 with one K and one V slot, two CTAs an SM: 64-row tiles
// waste less of the causal diagonal and the second CTA hides each one's prologue (S512
// causal 217 vs 191 TFLOPS); from 2k keys the 128-row tile's halved K/V traffic wins.
//
// Split-KV (FC_SPLIT_KV=1, for decode and other grids too small to fill the GPU): the
// key tiles of a query tile are shared out among p.num_splits CTAs, each writing a partial
// O and LSE in f32 (common/params.cuh), which fc_split_combine merges. Its tiles have 64
// query rows (16 per warp): decode has few rows (GQA heads packed as rows by the host).
// BLOCK_M x BLOCK_N w4 s2, dynamic smem, registers (full / causal; fp16 = bf16; 0 spills):
//   D    sm_80, sm_90 tile   sm_86/89 tile    sm_80      sm_86, sm_89   sm_90a
//   32   64x128   36 KB      64x128  36 KB    148 / 147  148 / 147      154 / 158
//   64   64x128   72 KB      64x128  72 KB    190 / 194  190 / 194      198 / 196
//   96   64x64    60 KB      64x64   60 KB    168 / 168  168 / 168      168 / 172
//   128  64x128  144 KB      64x64   80 KB    219 / 218  174 / 174      222 / 225
//   192  64x64   120 KB      64x32   72 KB    211 / 212  197 / 199      210 / 213
//   256  64x64   160 KB      64x32   96 KB    245 / 235  231 / 230      244 / 255
//
// HOST CONTRACT
// Entry fc_fwd_sm80(FwdParams p). Grid (ceil(seqlen_q / BLOCK_M) * S, heads_q, batch) with
// S = p.num_splits for FC_SPLIT_KV=1 (CTA x is query tile x / S, split x % S), else S = 1;
// but for kLongestFirst (causal, unsplit, D > 64, STAGES > 1): grid (ceil(seqlen_q /
// BLOCK_M) * heads_q * batch), tiles in TileOrder<true> order with p.tile_section heads a
// section (common/tile_scheduler.cuh);
// block 32 * NUM_WARPS threads, dynamic smem as above (cudaFuncSetAttribute over 48 KB).
// Pointers 16-byte aligned, strides multiples of 8 elements, last dim contiguous. Causal is
// the compile-time FC_CAUSAL (bottom-right aligned); p.causal is ignored. FC_LOCAL: a
// sliding window (p.window_left/right, causal folded in; key tiles outside it are skipped,
// and the splits of FC_SPLIT_KV share out the window's tiles); FC_SOFTCAP: logit softcapping
// (p.softcap, p.softcap_scale; softmax_scale_log2 = log2 e); FC_ALIBI: ALiBi (p.alibi_slopes,
// p.alibi_scale, p.alibi_batch_stride; never with GQA packed as rows). See common/mask.cuh.
// FC_DROPOUT (unsplit, never GQA-packed or paged): attention dropout (p.dropout_*;
// common/dropout.cuh) on P after the softmax's update, the kept ones scaled at the end (the
// row sums are the undropped P's); with p.dropout_probs, each visited score's P (relative to
// the running max at its key tile, tiles walked last to first) is stored there, negated where
// dropped: [B, Hq, p.probs_rows, p.probs_cols] in q's dtype, flash_attn's S_dmask (rows and
// keys past those extents are not stored).
// lse [B, Hq, Sq] f32, natural log, written when p.lse != nullptr.
// Entry fc_split_combine(FwdParams p) (FC_SPLIT_KV=1 only; after fc_fwd_sm80 when
// p.num_splits > 1): grid (ceil(B * Hq * Sq / 4)), block 128 threads, no shared memory; on
// sm_90+ it may be launched with programmatic stream serialization (it waits for
// fc_fwd_sm80's completion itself, griddepcontrol.wait). o_accum / lse_accum hold
// num_splits * B * Hq * Sq rows (common/split_combine.cuh).
// FC_VARLEN=1 (a packed batch, common/sequence.cuh): p.cu_seqlens_q/k (int32 [B + 1], device),
// optional p.seqused_k, p.total_q/k; q, o [total_q, Hq, D], k, v [total_k, Hkv, D], every
// *_stride_b 0; p.seqlen_q / p.seqlen_k the longest sequence's (max_seqlen_q / k). Grids and
// split buffers exactly as above with those maxima as Sq and Sk (so B * Hq * max Sq partial
// rows); tiles past their sequence's queries exit at once. Each sequence is its own problem
// (its own lengths for the causal diagonal, the window and the key tiles), and its output is
// bitwise the dense kernel's for it alone. lse [Hq, total_q]. Split-KV shares out each
// sequence's own key tiles (split_tiles: p.split_tiles is not read) among p.num_splits.
// Decode (max_seqlen_q 1, no window) packs GQA heads as rows as dense does, with
// p.gqa_packed (common/params.cuh): Sq and Hq are then Hq / Hkv and Hkv, each sequence's token
// Hq / Hkv rows of a KV head, found at cu_seqlens_q[b] * p.q/o_stride_token. Registers of the
// varlen forms (CUDA 13 NVRTC, sm_80/sm_86 every tile above, split or not): 0 spills, within
// -8 / +12 of the dense form's (most within 4); dense SASS unchanged. sm_90a: 0 spills but for
// D128 128x64 full (255 registers, 4 B spilled; its causal form none).
// FC_PAGED=1 (a KV cache, common/paged.cuh; the only kernel with this form: the host runs paged
// and contiguous caches here on every arch): k, v are the caches (pools of pages through
// p.block_table, *_stride_b 0; or contiguous [B, capacity, Hkv, D] when p.block_table is null),
// q, o, lse dense; sequence b has min(p.seqused_k[b] + p.new_keys, p.seqlen_k) keys, p.seqlen_k
// the capacity (the grid's and the split count's extent). The split tiles share out the key
// tiles of every query tile of a head in equal chunks, whatever the sequences' lengths, since
// the host cannot see them (start_chunk; the unsplit tiles take each sequence's own, as
// varlen's). Key tiles are loaded by 16-key groups: lane g of each warp looks up the pool row
// offset of a group ahead of the copies (split tiles: group g % (BLOCK_N / 16) of the tile
// g / (BLOCK_N / 16) after the current lookup's, 4 tiles of 128 keys a table read, with the
// next read in flight; unsplit: group g of the next tile), and each 16-byte copy adds its
// row's group offset, taken from that lane by a shuffle (once a group before the copies where
// the loader's rows make the group known at compile time: D64, D128 and D256; per copy for
// D32, D96 and D192); GQA decode packs heads as rows as dense. On sm_90 the paged split tiles
// have three K/V slots (D128 64x128: 208 KB; D256 64x64: 224 KB; the host's Variant says so):
// two tiles of scattered pages in flight while one computes. Entry fc_paged_append(FwdParams p)
// (common/paged.cuh) writes p.k_new, p.v_new first; on sm_90 this kernel is launched as its
// programmatic dependent and waits (griddep::wait) before its first K/V copy. Registers (CUDA
// 13.0 NVRTC, bf16 = f16, 0 spills at every tile, sm_80/86/90a): on sm_90a the unsplit tiles
// within -2 / +8 of the dense form's, the split tiles with their third slot +0 to +16 (D128
// 64x128: 238 / 240 against 222 / 225; D256 64x64: 252 / 255 against 244 / 255).
// FC_VARLEN with FC_PAGED (unsplit only): packed queries over a paged cache (flash_attn's
// varlen call with a block table): q, o, lse as FC_VARLEN's (cu_seqlens_q, total_q; p.seqlen_q
// the longest), keys as FC_PAGED's (pools through p.block_table, p.seqused_k the key counts,
// no append; p.cu_seqlens_k unread): paged::packed_sequence.
#include "common/dropout.cuh"
#include "common/mask.cuh"
#include "common/paged.cuh"
#include "common/params.cuh"
#include "common/sequence.cuh"
#include "common/sinks.cuh"
#include "common/softmax.cuh"
#include "common/split_combine.cuh"
#include "common/swizzle.cuh"
#include "common/tile_scheduler.cuh"
#include "common/types.cuh"
#include "ptx/cp_async.cuh"
#include "ptx/griddep.cuh"
#include "ptx/ldmatrix.cuh"
#include "ptx/mma.cuh"

#ifndef FC_HEAD_DIM
#define FC_HEAD_DIM 128
#endif
#ifndef FC_CAUSAL
#define FC_CAUSAL 0
#endif
// Defaults: the sm_90 column above (the host always passes all four).
#ifndef FC_BLOCK_M
#define FC_BLOCK_M 128
#endif
#ifndef FC_BLOCK_N
#define FC_BLOCK_N (FC_HEAD_DIM == 32 ? 128 : FC_HEAD_DIM == 64 ? 64 : FC_HEAD_DIM == 256 ? 64 : 32)
#endif
#ifndef FC_NUM_WARPS
#define FC_NUM_WARPS (FC_HEAD_DIM == 256 ? 8 : 4)
#endif
#ifndef FC_STAGES
#define FC_STAGES 2
#endif
#ifndef FC_SPLIT_KV
#define FC_SPLIT_KV 0
#endif

namespace fc {
namespace fwd_sm80 {

constexpr int kD = FC_HEAD_DIM;
constexpr int kBlockM = FC_BLOCK_M;
constexpr int kBlockN = FC_BLOCK_N;
constexpr int kWarps = FC_NUM_WARPS;
constexpr int kStages = FC_STAGES;
constexpr bool kCausal = FC_CAUSAL != 0;
constexpr bool kLocal = FC_LOCAL != 0;      // sliding window (common/mask.cuh)
constexpr bool kSoftcap = FC_SOFTCAP != 0;  // logit softcapping (common/mask.cuh)
constexpr bool kAlibi = FC_ALIBI != 0;      // ALiBi (common/mask.cuh)
constexpr bool kDropout = FC_DROPOUT != 0;  // attention dropout (common/dropout.cuh)
// Learnable sinks (common/sinks.cuh), folded where a row is final: in the epilogue of an
// unsplit tile, else in the combine (split-KV, the paged split tiles' chunks); dense, packed
// or paged keys, GQA heads packed as rows or not (sinks::sink_of).
constexpr bool kSinks = FC_SINKS != 0;
// The forms whose rows may be GQA heads packed as rows, each with its own sink: the host packs
// none under a window, ALiBi or dropout (dispatch::plan_for), whose forms read the tile's.
constexpr bool kRowSinks = kSinks && !kLocal && !kAlibi && !kDropout;
constexpr bool kSplitKv = FC_SPLIT_KV != 0;
constexpr bool kVarlen = FC_VARLEN != 0;  // a packed batch of sequences (common/sequence.cuh)
constexpr bool kPaged = FC_PAGED != 0;    // keys from a paged (or contiguous) cache (common/paged.cuh)
// Each batch entry has keys of its own count (a packed batch's, or a cache's cache_seqlens).
constexpr bool kPerSequenceKeys = kVarlen || kPaged;
// The paged split tiles share out key tiles by chunks of the whole batch's (start_chunk): the
// host cannot see a cache's lengths, so it cannot size each sequence's splits to them.
constexpr bool kChunked = kPaged && kSplitKv;
// A packed batch over a paged cache (FC_VARLEN with FC_PAGED: paged::packed_sequence) is a
// form unsplit only: the chunked split tiles share a head's query tiles by the dense count.
static_assert(!(kVarlen && kPaged && kSplitKv), "a packed batch over a paged cache is not a split form");
static_assert(!(kDropout && (kSplitKv || kPaged)), "dropout runs unsplit over dense or packed keys");
// Causal tiles differ in length: taken longest first (in L2-sized sections of heads) the
// last wave is not left with a few long tiles. Measured on H100 (docs/kernels/fwd_sm80.md): +4-10%
// at D128/D256 from S = 1k, but -5% at D64 S <= 1k and -5% with the single-buffer D256
// 64x64 tile at S512 (two CTAs an SM), where m blocks innermost share K/V.
constexpr bool kLongestFirst = kCausal && !kSplitKv && kD > 64 && kStages > 1;
constexpr int kThreads = 32 * kWarps;

constexpr int kWarpRows = kBlockM / kWarps;
constexpr int kMTiles = kWarpRows / 16;  // 16-row mma tiles per warp
constexpr int kNTiles = kBlockN / 8;     // 8-key n-tiles of S
constexpr int kDTiles = kD / 8;          // 8-column n-tiles of O
constexpr int kAccumulators = 4 * kMTiles * (kNTiles + kDTiles);  // f32 registers of S and O

static_assert(kD % 32 == 0 && kD <= 256, "head dim: 32, 64, 96, 128, 192 or 256");
static_assert(kWarpRows % 16 == 0, "each warp owns whole 16-row mma tiles");
static_assert(kBlockN % 16 == 0, "key tile: whole 16-key steps of P·V");
static_assert(kStages >= 1, "at least one K and one V slot");
// One K and one V slot (FlashAttention-2's layout and order): V's copy overlaps Q·Kᵀ, the
// next K's copy the softmax and P·V (H100, D256 causal S512: 217 TFLOPS, against 209 with
// the V wait after the softmax). Half the shared memory of a two-slot ring, so a 96 KB
// D256 64x64 tile leaves room for a second CTA on the SM, whose math hides this one's
// waits.
constexpr bool kSingleBuffer = kStages == 1;
static_assert(!(kSingleBuffer && FC_SPLIT_KV), "split-KV tiles use a ring");
// Copy groups (one per tile) a ring may leave in flight when tile i is needed.
constexpr int kRingInFlight = kSingleBuffer ? 0 : kStages - 2;

using QTile = SwizzledTile<kBlockM, kD>;
using KVTile = SwizzledTile<kBlockN, kD>;
constexpr int kSmemBytes = QTile::kBytes + 2 * kStages * KVTile::kBytes;

// Hides a value's origin from the optimiser, so that what is derived from it is recomputed
// where it is used instead of hoisted out of the main loop, where it would stay live beside
// the accumulators and spill (a few integer instructions per key tile are the cheaper side).
template <typename T> __device__ __forceinline__ T recomputed(T x) {
    asm volatile("" : "+r"(x));
    return x;
}

// Rows [0, valid) of a tile from global memory (row stride in elements); rows past
// `valid` are zero-filled so that they contribute nothing (and never NaN) downstream:
// their copies read no byte (src-size 0), so their out-of-range addresses are never used.
// A thread copies chunk c of rows r0, r0 + kRowsPerPass, ... The swizzle repeats every 8
// rows, so when kRowsPerPass divides 8 or is a multiple of it, kKeys base offsets (one per
// residue of the row mod 8) serve every copy and little stays live across the main loop:
// a per-copy offset for each of D256's 16 copies a thread (4 warps) held 48 registers.
template <class Tile> struct TileLoader {
    static constexpr int kCopies = Tile::kBytes / 16 / kThreads;
    static constexpr int kRowsPerPass = kThreads / Tile::kChunks;
    static constexpr bool kRegular =
        kThreads % Tile::kChunks == 0 && (kRowsPerPass % 8 == 0 || 8 % kRowsPerPass == 0);
    static constexpr int kKeys = kRegular && kRowsPerPass < 8 ? 8 / kRowsPerPass : 1;
    // Rows whose chunk count the threads do not divide (D192: 24 chunks) go by 8-chunk
    // swizzle groups instead: a thread copies chunk c of every group of rows r0, r0 +
    // kGroupRows, ...; the swizzle only permutes within a group, so group g of a row lies
    // 128 * g bytes after group 0 and one base offset again serves every copy.
    static constexpr int kGroupRows = kThreads / 8;
    static constexpr int kRows = Tile::kBytes / Tile::kRowBytes;
    static constexpr bool kGroupwise = !kRegular && Tile::kChunks == Tile::kFullChunks && kGroupRows % 8 == 0 &&
                                       kRows % kGroupRows == 0;
    static_assert(Tile::kBytes / 16 % kThreads == 0, "whole 16-byte chunks per thread");
    static_assert(kCopies % kKeys == 0 || kCopies < kKeys, "copies cover whole 8-row groups");
    // Paged: a regular loader's copy i is row r0 + i * kRowsPerPass with r0 < kRowsPerPass, so
    // when kRowsPerPass divides 16 its 16-key group is i * kRowsPerPass / 16 at compile time.
    static constexpr bool kExactGroups = kRegular && 16 % kRowsPerPass == 0;
    static constexpr int kGroups = kRows / 16;

    int tid;
    __device__ __forceinline__ explicit TileLoader(int t) : tid(t) {}

    // Paged (kPagedRows): row r of the tile lies row_delta rows further, row_delta of its
    // group of 16 keys (common/paged.cuh) held by lane delta_lane + r / 16 of the warp in `delta`.
    template <bool kPagedRows = false>
    __device__ __forceinline__ void operator()(u32 smem, const elem_t* g, i64 row_stride, int valid, int delta = 0,
                                               int delta_lane = 0) const {
        const int tid = recomputed(this->tid);
        auto paged = [&](const elem_t* src, int row) {
            if constexpr (!kPagedRows) return src;
            return src + static_cast<i64>(__shfl_sync(0xffffffffu, delta, delta_lane + row / paged::kGroupKeys)) * row_stride;
        };
        if constexpr (kRegular && kPagedRows && kExactGroups) {
            // Each group's offset fetched once, all before the first copy: the copies then
            // issue back to back, as the dense loads do (a shuffle on each copy's path held
            // up the burst).
            const int r0 = tid / Tile::kChunks, c = tid % Tile::kChunks;
            u32 dst[kKeys];
#pragma unroll
            for (int k = 0; k < kKeys; ++k) dst[k] = smem + Tile::offset(r0 + k * kRowsPerPass, c);
            int group_delta[kGroups];
#pragma unroll
            for (int group = 0; group < kGroups; ++group) group_delta[group] = __shfl_sync(0xffffffffu, delta, delta_lane + group);
            const elem_t* src = g + r0 * row_stride + c * 8;
#pragma unroll
            for (int i = 0; i < kCopies; ++i) {
                const u32 row_group = static_cast<u32>(i / kKeys * kRowsPerPass * kKeys) * Tile::kRowBytes;
                const elem_t* row = src + static_cast<i64>(group_delta[i * kRowsPerPass / paged::kGroupKeys]) * row_stride;
                cp_async::copy16(dst[i % kKeys] + row_group, row, r0 + i * kRowsPerPass < valid);
                src += kRowsPerPass * row_stride;
            }
        } else if constexpr (kRegular) {
            const int r0 = tid / Tile::kChunks, c = tid % Tile::kChunks;
            u32 dst[kKeys];
#pragma unroll
            for (int k = 0; k < kKeys; ++k) dst[k] = smem + Tile::offset(r0 + k * kRowsPerPass, c);
            const elem_t* src = g + r0 * row_stride + c * 8;
#pragma unroll
            for (int i = 0; i < kCopies; ++i) {
                // copy i is row r0 + i * kRowsPerPass: 8-row group i / kKeys, residue key i % kKeys
                const u32 row_group = static_cast<u32>(i / kKeys * kRowsPerPass * kKeys) * Tile::kRowBytes;
                cp_async::copy16(dst[i % kKeys] + row_group, paged(src, r0 + i * kRowsPerPass), r0 + i * kRowsPerPass < valid);
                src += kRowsPerPass * row_stride;  // a running pointer: no per-copy offsets live
            }
        } else if constexpr (kGroupwise) {
            const int r0 = tid / 8, c = tid % 8;
            const u32 dst = smem + Tile::offset(r0, c);
            const elem_t* src = g + r0 * row_stride + c * 8;
#pragma unroll
            for (int i = 0; i < kRows / kGroupRows; ++i) {
#pragma unroll
                for (int group = 0; group < Tile::kChunks / 8; ++group)
                    cp_async::copy16(dst + (i * kGroupRows * Tile::kRowBytes + 128 * group),
                                     paged(src, r0 + i * kGroupRows) + 64 * group, r0 + i * kGroupRows < valid);
                src += kGroupRows * row_stride;
            }
        } else {
#pragma unroll
            for (int i = 0; i < kCopies; ++i) {
                const int id = tid + i * kThreads;
                const int r = id / Tile::kChunks, c = id % Tile::kChunks;
                const bool ok = r < valid;
                cp_async::copy16(smem + Tile::offset(r, c), paged(g + r * row_stride + c * 8, r), ok);
            }
        }
    }
};

// The widest tiles hold 192+ accumulator registers; only there does ptxas, left free to
// overlap the softmax with P·V, spill (see after_softmax), and so do 160-accumulator tiles
// whose loader is irregular (D96: 12 chunks a row; per-copy offsets stay live across the
// loop; D96 128x64 spilled 16-36 B on sm_90a). Elsewhere the overlap is kept: forcing the
// order there cost 7-8% on H100 (D64 128x64, D256 128x64 w8).
constexpr bool kPvAfterSoftmax =
    kAccumulators >= 192 || (kAccumulators >= 160 && !TileLoader<KVTile>::kRegular && !TileLoader<KVTile>::kGroupwise);

// S[kMTiles x kNTiles] = Q(warp rows) · Kᵀ. A from the Q tile, B from the K tile, both by
// ldmatrix; each B fragment is reused by the warp's kMTiles row tiles.
__device__ __forceinline__ void gemm_qk(float (&s)[kMTiles][kNTiles][4], const FragAddr<QTile>& q, int q_row0,
                                        const FragAddr<KVTile>& k) {
#pragma unroll
    for (int m = 0; m < kMTiles; ++m)
#pragma unroll
        for (int j = 0; j < kNTiles; ++j) s[m][j][0] = s[m][j][1] = s[m][j][2] = s[m][j][3] = 0.f;
#pragma unroll
    for (int kk = 0; kk < kD / 16; ++kk) {
        u32 a[kMTiles][4];
#pragma unroll
        for (int m = 0; m < kMTiles; ++m) ldmatrix::x4(a[m], q(q_row0 + 16 * m, 2 * kk));
#pragma unroll
        for (int j = 0; j < kNTiles; j += 2) {
            u32 b[4];  // keys 8j..8j+7 (b0, b1) and 8j+8..8j+15 (b2, b3), d 16kk..16kk+15
            ldmatrix::x4(b, k(8 * j, 2 * kk));
#pragma unroll
            for (int m = 0; m < kMTiles; ++m) {
                mma::m16n8k16<elem_t>(s[m][j], a[m], b[0], b[1]);
                mma::m16n8k16<elem_t>(s[m][j + 1], a[m], b[2], b[3]);
            }
        }
    }
}

// O += P · V with P the softmax output still in S's registers: the accumulators of
// n-tiles 2kk and 2kk+1, packed to 16 bits, are the A fragment of key step kk.
__device__ __forceinline__ void gemm_pv(float (&o)[kMTiles][kDTiles][4], const float (&p)[kMTiles][kNTiles][4],
                                        const FragAddr<KVTile>& v) {
#pragma unroll
    for (int kk = 0; kk < kBlockN / 16; ++kk) {
        u32 a[kMTiles][4];
#pragma unroll
        for (int m = 0; m < kMTiles; ++m) {
            a[m][0] = pack2<elem_t>(p[m][2 * kk][0], p[m][2 * kk][1]);
            a[m][1] = pack2<elem_t>(p[m][2 * kk][2], p[m][2 * kk][3]);
            a[m][2] = pack2<elem_t>(p[m][2 * kk + 1][0], p[m][2 * kk + 1][1]);
            a[m][3] = pack2<elem_t>(p[m][2 * kk + 1][2], p[m][2 * kk + 1][3]);
        }
#pragma unroll
        for (int j = 0; j < kDTiles; j += 2) {
            u32 b[4];  // keys 16kk..+15 by columns 8j..8j+15, transposed into B fragments
            ldmatrix::x4_trans(b, v(16 * kk, j));
#pragma unroll
            for (int m = 0; m < kMTiles; ++m) {
                mma::m16n8k16<elem_t>(o[m][j], a[m], b[0], b[1]);
                mma::m16n8k16<elem_t>(o[m][j + 1], a[m], b[2], b[3]);
            }
        }
    }
}

// `addr` unchanged, but computed (for ptxas) from every row sum, so that no load through it
// can issue before the softmax has produced every probability of the key tile. Given the
// freedom, ptxas defers exponentials into P·V and hoists the V fragment loads up into the
// softmax to hide their latency; on the widest tiles (D=128 128x64, D=64 128x128) that kept
// the f32 scores, O and the early V fragments live together and spilled. The added term,
// bit 31 of (row-sum bits & seqlen_k), is 0 because seqlen_k >= 0, which neither compiler
// can prove, so the dependency stays; it costs a few integer instructions per key tile.
__device__ __forceinline__ u32 after_softmax(u32 addr, const OnlineSoftmax<kMTiles>& softmax, int seqlen_k) {
    u32 bits = 0;
#pragma unroll
    for (int m = 0; m < kMTiles; ++m)
        bits |= __float_as_uint(softmax.row_sum[m][0]) | __float_as_uint(softmax.row_sum[m][1]);
    return addr + ((bits & static_cast<u32>(seqlen_k)) >> 31);
}

// Varlen decode with GQA packed (FwdParams::gqa_packed): a sequence's one query token is
// p.seqlen_q rows of each KV head.
__device__ __forceinline__ bool packs_gqa(const FwdParams& p) { return kVarlen && p.gqa_packed != 0; }

// Batch entry `batch`'s lengths and offsets (common/sequence.cuh, common/paged.cuh); packed
// GQA, its query rows are its token's heads of a KV head.
__device__ __forceinline__ Sequence sequence_at(const FwdParams& p, int batch) {
    Sequence s = kPaged ? (kVarlen ? paged::packed_sequence(p, batch) : paged::sequence(p, batch)) : sequence<kVarlen>(p, batch);
    if (packs_gqa(p)) s.seqlen_q = s.seqlen_q > 0 ? p.seqlen_q : 0;
    return s;
}

// Query row `row` of sequence s in q or o (elements from the head's row 0 of the batch entry):
// packed, the sequence's first token lies q_start tokens in, and rows step by stride_s.
__device__ __forceinline__ i64 row_offset(const Sequence& s, int row, i64 stride_s, i64 stride_token) {
    return kVarlen ? s.q_start * stride_token + row * stride_s : (s.q_start + row) * stride_s;
}

// Where the LSE of query row `row` of (batch, head) goes (common/sequence.cuh's lse_offset);
// packed GQA, row r of KV head h is query head h * G + r of the sequence's token.
__device__ __forceinline__ i64 lse_at(const FwdParams& p, const Sequence& s, int batch, int head, int row) {
    if (packs_gqa(p)) return lse_offset<true>(p, s, batch, head * p.seqlen_q + row);
    return lse_offset<kVarlen>(p, s, batch, head) + row;
}
// The step between consecutive query rows' LSE (lse_at).
__device__ __forceinline__ i64 lse_row_step(const FwdParams& p) { return packs_gqa(p) ? p.total_q : 1; }

// The query tile a CTA computes, and its key split.
struct QueryTile {
    int m0, head, batch, kv_head, split;
};

// Learnable sinks folded into this thread's final rows (common/sinks.cuh). With GQA heads
// packed as rows (decode) each row has its own head's sink: lane l reads the sink of the
// warp's row l (and l + 32, ...) once, and each row takes it by a shuffle. Loads per row took
// registers the widest tiles lack (D64 128x128 causal, paged, spilled); the forms never
// packed read the tile's head's alone (the shuffles spilled D64 128x128's windowed varlen form).
__device__ __forceinline__ void fold_sinks(const FwdParams& p, const QueryTile& t, int q_row0, float (&inv_sum)[kMTiles][2],
                                           float (&lse)[kMTiles][2], int lane) {
    if constexpr (!kRowSinks) {
        const float sink = p.learnable_sink[t.head];
#pragma unroll
        for (int m = 0; m < kMTiles; ++m) sinks::fold(sink, inv_sum[m][0], lse[m][0]), sinks::fold(sink, inv_sum[m][1], lse[m][1]);
        return;
    }
    constexpr int kLoads = (16 * kMTiles + 31) / 32;
    float mine[kLoads];
#pragma unroll
    for (int j = 0; j < kLoads; ++j) {
        mine[j] = p.sink_group == 0 ? p.learnable_sink[t.head] : sinks::sink_of(p, t.head, t.m0 + q_row0 + 32 * j + lane);
    }
#pragma unroll
    for (int m = 0; m < kMTiles; ++m)
#pragma unroll
        for (int r = 0; r < 2; ++r) {
            const int row = 16 * m + 8 * r + lane / 4;  // in the warp's rows
            sinks::fold(__shfl_sync(0xffffffffu, mine[row / 32], row % 32), inv_sum[m][r], lse[m][r]);
        }
}

__device__ __forceinline__ QueryTile query_tile(const FwdParams& p) {
    const int splits = kSplitKv ? p.num_splits : 1;
    QueryTile t;
    t.split = blockIdx.x % splits;
    int m_block = blockIdx.x / splits;
    t.head = blockIdx.y;
    t.batch = blockIdx.z;
    if (kLongestFirst) {
        const int m_blocks = (p.seqlen_q + kBlockM - 1) / kBlockM;
        const WorkTile w = TileOrder<true>{m_blocks, p.heads_q, p.batch, p.tile_section}.at(recomputed(blockIdx.x));
        m_block = w.m_block, t.head = w.head, t.batch = w.batch;
    }
    t.m0 = m_block * kBlockM;
    t.kv_head = t.head / (p.heads_q / p.heads_kv);
    return t;
}

using Mask = KeyMask<kCausal, kLocal>;  // common/mask.cuh

// The mask of one sequence: its own lengths (a varlen batch entry's), the common ones when
// dense, where this is Mask(p).
__device__ __forceinline__ Mask sequence_mask(const Sequence& seq, const FwdParams& p) {
    return Mask(p, seq.seqlen_q, seq.seqlen_k);
}

// Key tiles the query tile at m0 of `seq` visits ([begin, end)), and which need the mask.
// Without a window, from tile 0 with this kernel's own bounds (rows past Sq included, exact
// full tiles: its register allocation is tuned to them; Mask's equivalent bounds spill D64
// causal).
__device__ __forceinline__ KeyBlocks key_range(int m0, const Sequence& seq, const FwdParams& p) {
    if (kLocal) return sequence_mask(seq, p).blocks(m0, min(m0 + kBlockM, seq.seqlen_q), kBlockN);
    int end = seq.seqlen_k;   // one past the last visible key of the tile
    int full = seq.seqlen_k;  // keys below this are visible to every row
    if (kCausal) {
        const int shift = seq.seqlen_k - seq.seqlen_q;  // bottom-right alignment
        end = min(end, max(0, m0 + kBlockM + shift));
        full = min(full, max(0, m0 + 1 + shift));
    }
    return {0, (end + kBlockN - 1) / kBlockN, 0, full / kBlockN};
}

// Split-KV: key tiles per split. Dense, the host's p.split_tiles. Varlen or paged, each sequence's
// own: the key tiles one of its query tiles visits at most, shared out among p.num_splits
// exactly as the host shares out a dense problem's (dispatch.rs, sm80_plan: tiles_per_split
// of min(ceil(keys / BLOCK_N) + 1, ceil(Sk / BLOCK_N)), keys = min(Sk, window span +
// BLOCK_M)). So a short sequence's keys are spread over every split rather than crowded into
// the first ones by the longest sequence's count, and each sequence is split as it would be
// alone with the same split count. Splits past a sequence's tiles visit none (LSE -inf).
__device__ __forceinline__ int split_tiles(const Sequence& seq, const FwdParams& p) {
    if (!kPerSequenceKeys) return p.split_tiles;
    int tiles = (seq.seqlen_k + kBlockN - 1) / kBlockN;
    if (kLocal && p.window_left >= 0 && p.window_right >= 0) {
        // The window's span clamped term by term: left + right may not fit an int.
        const int span = min(seq.seqlen_k, min(p.window_left, seq.seqlen_k) + min(p.window_right, seq.seqlen_k) + kBlockM);
        tiles = min(tiles, (span + kBlockN - 1) / kBlockN + 1);
    }
    return (tiles + p.num_splits - 1) / p.num_splits;
}

// Chunked split-KV (kChunked): the items are the query tiles of one head, batch entry b's m
// block m being item b * M + m (M = ceil(Sq / BLOCK_M)), and their key tiles (key_range) are
// laid end to end in item order: the line. It is cut into p.batch * M * p.num_splits chunks
// of ceil(line / chunks) tiles, one a CTA, so that every CTA visits as many key tiles whatever
// the lengths (a long sequence's tiles spread over several CTAs, short ones share one).
__device__ __forceinline__ int m_blocks_of(const FwdParams& p) { return (p.seqlen_q + kBlockM - 1) / kBlockM; }
__device__ __forceinline__ KeyBlocks item_keys(const FwdParams& p, int item) {
    const int m_blocks = m_blocks_of(p);
    return key_range(item % m_blocks * kBlockM, sequence_at(p, item / m_blocks), p);
}
__device__ __forceinline__ int item_tiles(const FwdParams& p, int item) {
    const KeyBlocks k = item_keys(p, item);
    return k.end - k.begin;
}
// The line's length and, of item `item`, the tiles before it, by one warp (lanes take every
// 32nd item).
struct LinePosition {
    int total, before;
};
__device__ __forceinline__ LinePosition line_position(const FwdParams& p, int items, int item, int lane) {
    int total = 0, before = 0;
    for (int i = lane; i < items; i += 32) {
        const int t = item_tiles(p, i);
        total += t;
        before += i < item ? t : 0;
    }
    return {warp_sum(total), warp_sum(before)};
}
__device__ __forceinline__ int line_chunks(const FwdParams& p) { return p.batch * m_blocks_of(p) * p.num_splits; }
// Rows of one partial slot: a query tile's (chunked partials are [chunks, 2, Hq, rows, D]).
__device__ __forceinline__ int slot_rows(const FwdParams& p) { return min(kBlockM, p.seqlen_q); }

// Sets to -inf the scores of keys the row does not see (past its sequence's Sk, after its
// causal diagonal, outside its window: Mask).
__device__ __forceinline__ void apply_mask(float (&s)[kMTiles][kNTiles][4], int key0, int row0, const Sequence& seq,
                                           const FwdParams& p, int lane) {
    const Mask mask = sequence_mask(seq, p);
#pragma unroll
    for (int m = 0; m < kMTiles; ++m)
#pragma unroll
        for (int r = 0; r < 2; ++r) {
            const int row = row0 + 16 * m + 8 * r + lane / 4;
            // In-tile columns of the lane's pair that the row sees: [first, last].
            const int lane_key0 = key0 + 2 * (lane % 4);
            const int last = mask.last(row) - lane_key0, first = mask.first(row) - lane_key0;
#pragma unroll
            for (int j = 0; j < kNTiles; ++j)
#pragma unroll
                for (int c = 0; c < 2; ++c)
                    if (8 * j + c > last || (kLocal && 8 * j + c < first)) s[m][j][2 * r + c] = math::neg_inf();
        }
}

// Adds the ALiBi bias to the scores of rows row0... x keys key0... (every key tile: the bias
// is not a mask), laid out as apply_mask's.
__device__ __forceinline__ void add_alibi(float (&s)[kMTiles][kNTiles][4], int key0, int row0, const AlibiBias& bias, int lane) {
    const float distance0 = bias.distance(row0 + lane / 4, key0 + 2 * (lane % 4));
#pragma unroll
    for (int m = 0; m < kMTiles; ++m)
#pragma unroll
        for (int r = 0; r < 2; ++r)
#pragma unroll
            for (int j = 0; j < kNTiles; ++j)
#pragma unroll
                for (int c = 0; c < 2; ++c)
                    s[m][j][2 * r + c] += bias.at(distance0 + static_cast<float>(16 * m + 8 * r - 8 * j - c));
}

// Dropout on the probabilities s (rows row0..., keys key0..., laid out as apply_mask's) of
// (batch, head) `bh`: the dropped become 0; with p.dropout_probs, each stored there, negated
// where dropped (see the header).
__device__ __forceinline__ void apply_dropout(float (&s)[kMTiles][kNTiles][4], const FwdParams& p, int bh, int row0, int key0, int lane) {
    static_assert(kNTiles % 4 == 0, "whole 32-key cells of the mask (common/dropout.cuh)");
    const dropout::Mask drop(p);
    elem_t* probs = static_cast<elem_t*>(p.dropout_probs);
#pragma unroll
    for (int m = 0; m < kMTiles; ++m)
#pragma unroll
        for (int cell = 0; cell < kNTiles / 4; ++cell) {
            const int row = row0 + 16 * m + lane / 4;
            const u32x4 words = drop.cell_words(bh, row, key0 + 32 * cell + 2 * (lane % 4));
#pragma unroll
            for (int t = 0; t < 4; ++t) {
                const int j = 4 * cell + t, key = key0 + 2 * (lane % 4) + 8 * j;
                const u32 word = dropout::Mask::fragment_word(words, t);
                if (probs != nullptr && key < p.probs_cols) {
#pragma unroll
                    for (int r = 0; r < 2; ++r) {
                        if (row + 8 * r >= p.probs_rows) continue;
                        float signed_p[2];
#pragma unroll
                        for (int c = 0; c < 2; ++c) signed_p[c] = drop.keep(word, 2 * r + c) ? s[m][j][2 * r + c] : -s[m][j][2 * r + c];
                        const i64 at = (static_cast<i64>(bh) * p.probs_rows + row + 8 * r) * p.probs_cols + key;
                        *reinterpret_cast<u32*>(probs + at) = pack2<elem_t>(signed_p[0], signed_p[1]);
                    }
                }
                drop.zero_dropped(word, s[m][j]);
            }
        }
}

template <int R, int C>
__device__ __forceinline__ void scale_rows(float (&o)[R][C][4], const float (&f)[R][2]) {
#pragma unroll
    for (int m = 0; m < R; ++m)
#pragma unroll
        for (int j = 0; j < C; ++j) {
            o[m][j][0] *= f[m][0];
            o[m][j][1] *= f[m][0];
            o[m][j][2] *= f[m][1];
            o[m][j][3] *= f[m][1];
        }
}

// Normalised O of the warp's rows to global memory: fragments into the warp's own rows of
// the Q tile (only this warp ever read them), then 16-byte row-contiguous stores.
__device__ __forceinline__ void store_output(const FwdParams& p, float (&o)[kMTiles][kDTiles][4],
                                             const float (&inv_sum)[kMTiles][2], u32 q_smem, elem_t* out,
                                             int rows_valid, int warp, int lane) {
    const int row0 = warp * kWarpRows;
#pragma unroll
    for (int m = 0; m < kMTiles; ++m)
#pragma unroll
        for (int r = 0; r < 2; ++r) {
            const int row = row0 + 16 * m + 8 * r + lane / 4;
#pragma unroll
            for (int j = 0; j < kDTiles; ++j) {
                const u32 v = pack2<elem_t>(o[m][j][2 * r] * inv_sum[m][r], o[m][j][2 * r + 1] * inv_sum[m][r]);
                const u32 addr = q_smem + QTile::offset(row, j) + 4 * (lane % 4);
                asm volatile("st.shared.b32 [%0], %1;\n" ::"r"(addr), "r"(v) : "memory");
            }
        }
    __syncwarp();
    constexpr int kWarpChunks = kWarpRows * QTile::kChunks;
#pragma unroll
    for (int i = 0; i < kWarpChunks / 32; ++i) {
        const int id = lane + 32 * i;
        const int row = row0 + id / QTile::kChunks, c = id % QTile::kChunks;
        u32x4 v;
        asm volatile("ld.shared.v4.b32 {%0,%1,%2,%3}, [%4];\n"
                     : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
                     : "r"(q_smem + QTile::offset(row, c))
                     : "memory");
        if (row < rows_valid) *reinterpret_cast<u32x4*>(out + row * p.o_stride_s + c * 8) = v;
    }
}

// Split-KV: this split's normalised O and LSE of the warp's rows, f32, straight from the
// fragments (8-byte stores; the partials are small beside K and V).
__device__ __forceinline__ void store_partial(const FwdParams& p, float (&o)[kMTiles][kDTiles][4],
                                              const float (&inv_sum)[kMTiles][2], const float (&lse)[kMTiles][2],
                                              i64 base, int rows_valid, int q_row0, int lane) {
#pragma unroll
    for (int m = 0; m < kMTiles; ++m)
#pragma unroll
        for (int r = 0; r < 2; ++r) {
            const int row = q_row0 + 16 * m + 8 * r + lane / 4;
            if (row >= rows_valid) continue;
            if (lane % 4 == 0) p.lse_accum[base + row] = lse[m][r];
            float* dst = p.o_accum + (base + row) * kD + 2 * (lane % 4);
#pragma unroll
            for (int j = 0; j < kDTiles; ++j) {
                float2 v;
                v.x = o[m][j][2 * r] * inv_sum[m][r];
                v.y = o[m][j][2 * r + 1] * inv_sum[m][r];
                *reinterpret_cast<float2*>(dst + 8 * j) = v;
            }
        }
}

// What one pass of the kernel's body computes: a query tile, and (chunked, below) which of its
// key tiles and where its result goes.
struct Segment {
    QueryTile tile;
    int tile_begin, tile_end;  // chunked: the key tiles [begin, end); else the split's, from p
    i64 partial;               // chunked: the first partial row, or -1 for the output itself
};

// Chunked split-KV: this CTA's chunk of the line (see item_keys), [lo, hi), is attended as
// one segment of each item it overlaps, in line order (the kernel's loop: start_chunk, then
// next_segment and end_segment around each pass). A segment that is a whole item writes the
// output; one that is not writes partial slot 0 of the chunk if it starts at the chunk's
// start, else slot 1 (it then ends at the chunk's end), which fc_split_combine merges. Items
// without key tiles are the combine's to write (O = 0, LSE = -inf). The cursor lives in shared
// memory, so that no register of the loop stays live across a pass.
__device__ __forceinline__ int* chunk_cursor() {
    // The next item, the tiles before it, the chunk's [lo, hi), the item's first key tile and
    // its key tile count (so that a pass starts without a load of its own).
    __shared__ int cursor[6];
    return cursor;
}
__device__ __forceinline__ int chunk_index() { return blockIdx.z * gridDim.x + blockIdx.x; }

// Warp 0 finds the chunk's first item (the first to end past lo) and the tiles before it: one
// pass over the items' lengths for the line's total, one to find the item (with at most 32
// items, the lanes keep their item's key tiles from the first pass).
__device__ __forceinline__ void start_chunk(const FwdParams& p) {
    // The combine may launch now: its own pass over the lengths then runs beside this grid,
    // and its rows that one chunk writes whole leave before this grid ends.
    griddep::launch_dependents();
    if (threadIdx.x >= 32) return;
    const int lane = threadIdx.x, items = p.batch * m_blocks_of(p);
    const KeyBlocks keys0 = item_keys(p, min(lane, items - 1));
    int total = lane < items ? keys0.end - keys0.begin : 0;
    for (int i = lane + 32; i < items; i += 32) total += item_tiles(p, i);
    total = warp_sum(total);
    const int chunks = line_chunks(p), per = (total + chunks - 1) / chunks;
    const int lo = min(total, chunk_index() * per), hi = min(total, lo + per);
    int before = 0, first = items, first_lane = 0;
    KeyBlocks keys = keys0;
    for (int i0 = 0; i0 < items && first == items; i0 += 32) {
        const int i = i0 + lane;
        if (i0 > 0) keys = item_keys(p, min(i, items - 1));
        const int t = i < items ? keys.end - keys.begin : 0;
        int ends = t;  // inclusive scan: the lane's item ends `before + ends` into the line
#pragma unroll
        for (int d = 1; d < 32; d *= 2) {
            const int y = __shfl_up_sync(0xffffffffu, ends, d);
            if (lane >= d) ends += y;
        }
        const unsigned past = __ballot_sync(0xffffffffu, i < items && before + ends > lo);
        if (past != 0) {
            first_lane = __ffs(past) - 1;
            first = i0 + first_lane;
            before += __shfl_sync(0xffffffffu, ends - t, first_lane);
        } else {
            before += __shfl_sync(0xffffffffu, ends, 31);
        }
    }
    int* cursor = chunk_cursor();
    if (lane == first_lane) {
        cursor[0] = first, cursor[1] = before, cursor[2] = lo, cursor[3] = hi;
        cursor[4] = keys.begin, cursor[5] = keys.end - keys.begin;
    }
}

// Past the cursor's item (thread 0; from the cursor again, so that nothing of the item stays
// live across its pass).
__device__ __forceinline__ void advance_cursor(const FwdParams& p) {
    int* cursor = chunk_cursor();
    if (threadIdx.x == 0) {
        const int next = cursor[0] + 1;
        const KeyBlocks keys = item_keys(p, min(next, p.batch * m_blocks_of(p) - 1));
        cursor[0] = next, cursor[1] += cursor[5];
        cursor[4] = keys.begin, cursor[5] = keys.end - keys.begin;
    }
}

// The next segment of the chunk with key tiles into `seg`; false past the chunk's end.
__device__ __forceinline__ bool next_segment(const FwdParams& p, Segment& seg) {
    const int* cursor = chunk_cursor();
    const int m_blocks = m_blocks_of(p), items = p.batch * m_blocks;
    for (;;) {
        __syncthreads();  // the cursor is set, and every warp is past the previous pass
        const int item = cursor[0], before = cursor[1], lo = cursor[2], hi = cursor[3];
        const int begin = cursor[4], tiles = cursor[5];
        if (item >= items || before >= hi) return false;
        if (tiles > 0) {
            const int from = max(lo, before) - before, to = min(hi, before + tiles) - before;
            seg.tile.m0 = item % m_blocks * kBlockM;
            seg.tile.head = blockIdx.y;
            seg.tile.batch = item / m_blocks;
            seg.tile.kv_head = blockIdx.y / (p.heads_q / p.heads_kv);
            seg.tile.split = 0;
            seg.tile_begin = begin + from;
            seg.tile_end = begin + to;
            const int slot = before <= lo ? 0 : 1;
            seg.partial = from == 0 && to == tiles ? -1 : ((static_cast<i64>(chunk_index()) * 2 + slot) * p.heads_q + blockIdx.y) * slot_rows(p);
            return true;
        }
        __syncthreads();  // every thread has read the cursor
        advance_cursor(p);
    }
}

// After a segment's pass: on to the next item.
__device__ __forceinline__ void end_segment(const FwdParams& p) {
    __syncthreads();  // every thread has read the cursor
    advance_cursor(p);
}

}  // namespace fwd_sm80
}  // namespace fc

extern "C" __global__ void __launch_bounds__(fc::fwd_sm80::kThreads, 1) fc_fwd_sm80(const FwdParams p) {
    using namespace fc;
    using namespace fc::fwd_sm80;
    if constexpr (kChunked) start_chunk(p);
    if constexpr (kDropout) dropout::stage(p);
    for (;;) {  // chunked: once a segment of the CTA's chunk (next_segment); else once
        Segment seg{query_tile(p), 0, 0, -1};
        if constexpr (kChunked) {
            if (!next_segment(p, seg)) return;
        }
        extern __shared__ __align__(128) unsigned char smem[];

        // Chunked, a pass runs once a segment: the thread index is hidden from the optimiser,
        // so that what the pass derives from it is not hoisted out of the segment loop and held
        // across it (D128's split tiles: +16 registers and spills; D256's: 200 bytes spilled).
        const int tid = kChunked ? recomputed(static_cast<int>(threadIdx.x)) : threadIdx.x, warp = tid / 32, lane = tid % 32;
        const int splits = kSplitKv ? p.num_splits : 1;
        // (query_tile again, not seg.tile, where not chunked: the copy changed ptxas's code
        // for every other form.)
        const QueryTile tile0 = kChunked ? seg.tile : query_tile(p);
        // The tile's coordinates where the main loop and the epilogue need them: decoded again
        // there when longest first, since kept live across the loop they spill the widest tiles.
        auto where = [&]() { return kLongestFirst ? query_tile(p) : tile0; };
        const int m0 = tile0.m0, head = tile0.head, batch = tile0.batch, split = tile0.split;
        // Tile t's sequence (common/sequence.cuh). Varlen: read once, and again (like the tile)
        // where needed when longest first. Dense: the lengths read from p where they are used, as
        // before varlen, so that the code stays the same instruction for instruction.
        const Sequence seq0 = sequence_at(p, batch);
        auto sequence_of = [&](const QueryTile& t) { return kPerSequenceKeys && !kLongestFirst ? seq0 : sequence_at(p, t.batch); };
        if (kVarlen && m0 >= seq0.seqlen_q) return;  // past its sequence's queries (the grid is the longest one's)
        const int rows_valid = sequence_of(tile0).seqlen_q - m0;

        const elem_t* q = static_cast<const elem_t*>(p.q) + batch * p.q_stride_b + head * p.q_stride_h +
                          row_offset(sequence_of(tile0), m0, p.q_stride_s, p.q_stride_token);

        const u32 q_smem = smem_u32(smem);
        const u32 k_smem = q_smem + QTile::kBytes;
        const u32 v_smem = k_smem + kStages * KVTile::kBytes;

        const KeyBlocks keys = key_range(m0, sequence_of(tile0), p);
        // This CTA's key tiles: [tile_begin, tile_end), all of the query tile's unless split.
        int tile_begin = keys.begin, tile_end = keys.end;
        if (kChunked) {
            tile_begin = seg.tile_begin, tile_end = seg.tile_end;
        } else if (kSplitKv) {
            const int per_split = split_tiles(sequence_of(tile0), p);
            tile_begin = min(keys.end, keys.begin + split * per_split);
            tile_end = min(keys.end, tile_begin + per_split);
        }
        const int n_tiles = tile_end - tile_begin;  // >= 0: begin <= end (KeyBlocks)
        // Paged: the pool row offsets (row_delta) of the key tiles' 16-key groups, looked up
        // kLookupTiles tiles at a time: lane g holds group g % kTileGroups of tile i0 + g /
        // kTileGroups. Two lookups are held, the current tiles' and the next ones', so a table
        // read is in flight at least one tile before its first copy, and the split tiles'
        // prologue (kStages - 1 tiles) waits on one read, not on a chain of them. The unsplit
        // tiles look up one tile at a time (the one after the tile being loaded): at 255
        // registers, a lookup held across tiles spills (D128 128x64, D64 128x128 causal).
        constexpr int kTileGroups = kBlockN / paged::kGroupKeys;
        constexpr int kLookupTiles = kSplitKv ? 32 / kTileGroups : 1;
        static_assert(32 % kTileGroups == 0, "a warp's lanes hold whole tiles' groups");
        auto page_deltas = [&](int i0) {
            // One tile a lookup: lane g's group g (the lanes past the tile's groups look past it,
            // clamped to the table, unused); in this form D64 128x128 causal does not spill.
            if constexpr (kLookupTiles == 1) {
                const int key0 = (tile_end - 1 - i0) * kBlockN;
                return i0 < n_tiles ? paged::row_delta(p, where().batch, key0 + paged::kGroupKeys * lane) : 0;
            }
            const int i = i0 + lane / kTileGroups;
            const int key = (tile_end - 1 - i) * kBlockN + paged::kGroupKeys * (lane % kTileGroups);
            return i < n_tiles ? paged::row_delta(p, where().batch, key) : 0;
        };
        int deltas = 0, deltas_ahead = kPaged ? page_deltas(0) : 0;
        // Tile i's first lane in `deltas`; called once a tile, in load order (0, 1, ...), before
        // its first copy: at each kLookupTiles-th tile the held lookups move on.
        auto take_deltas = [&](int i) {
            if constexpr (kLookupTiles == 1) {
                deltas = deltas_ahead;
                if (kPaged) deltas_ahead = page_deltas(i + 1);
                return 0;
            }
            if (kPaged && i % kLookupTiles == 0) {
                deltas = deltas_ahead;
                deltas_ahead = page_deltas(i + kLookupTiles);
            }
            return i % kLookupTiles * kTileGroups;
        };
        // Iteration i visits key tile tile_end - 1 - i, in ring slot i % kStages.
        const TileLoader<KVTile> load_kv_tile(tid);
        auto load_kv = [&](int i) {
            const int key0 = (tile_end - 1 - i) * kBlockN;
            const u32 slot = (i % kStages) * KVTile::kBytes;
            const QueryTile t = where();
            const int b = recomputed(t.batch), h = recomputed(t.kv_head);
            const elem_t* k = static_cast<const elem_t*>(p.k) + b * p.k_stride_b + h * p.k_stride_h;
            const elem_t* v = static_cast<const elem_t*>(p.v) + b * p.v_stride_b + h * p.v_stride_h;
            const int row = kVarlen ? sequence_of(t).k_start + key0 : key0;  // of the sequence's keys in K and V
            const int delta_lane = take_deltas(i);
            const int valid = sequence_of(t).seqlen_k - key0;
            load_kv_tile.template operator()<kPaged>(k_smem + slot, k + row * p.k_stride_s, p.k_stride_s, valid, deltas, delta_lane);
            load_kv_tile.template operator()<kPaged>(v_smem + slot, v + row * p.v_stride_s, p.v_stride_s, valid, deltas, delta_lane);
        };
        // The single-buffer pipeline loads K and V of a tile separately (into slot 0).
        auto load_k_or_v = [&](int i, bool is_v) {
            const int key0 = (tile_end - 1 - i) * kBlockN;
            const QueryTile t = where();
            const int b = recomputed(t.batch), h = recomputed(t.kv_head);
            const elem_t* base = static_cast<const elem_t*>(is_v ? p.v : p.k);
            const i64 stride_s = is_v ? p.v_stride_s : p.k_stride_s;
            const elem_t* src = base + b * (is_v ? p.v_stride_b : p.k_stride_b) + h * (is_v ? p.v_stride_h : p.k_stride_h);
            const int row = kVarlen ? sequence_of(t).k_start + key0 : key0;
            const int delta_lane = is_v ? i % kLookupTiles * kTileGroups : take_deltas(i);  // K then V of each tile
            load_kv_tile.template operator()<kPaged>(is_v ? v_smem : k_smem, src + row * stride_s, stride_s,
                                                     sequence_of(t).seqlen_k - key0, deltas, delta_lane);
        };

        TileLoader<QTile>{tid}(q_smem, q, p.q_stride_s, rows_valid);
        if (kPaged) griddep::wait();  // launched early after fc_paged_append (k_new, v_new): keys written now
        if (kSingleBuffer) {
            if (n_tiles > 0) load_k_or_v(0, false);
            cp_async::commit();  // Q and the first K
        }
    #pragma unroll
        for (int i = 0; i < kStages - 1; ++i) {
            if (i < n_tiles) load_kv(i);
            cp_async::commit();  // group i (group 0 also holds Q)
        }

        // Per-lane ldmatrix addresses. Q (A operand) and V (B operand, transposed): lanes 0-15
        // give rows 0-15 at the even chunk, lanes 16-31 the same rows at the odd one. K (B
        // operand): lanes 0-7 / 8-15 give keys 0-7 at the even / odd chunk, lanes 16-31 keys 8-15.
        const FragAddr<QTile> q_frag(q_smem, lane % 16, lane / 16);
        const FragAddr<KVTile> k_frag(k_smem, lane % 8 + 8 * (lane / 16), (lane / 8) % 2);
        const FragAddr<KVTile> v_frag(v_smem, lane % 16, lane / 16);
        const int q_row0 = warp * kWarpRows;

        float o[kMTiles][kDTiles][4];
    #pragma unroll
        for (int m = 0; m < kMTiles; ++m)
    #pragma unroll
            for (int j = 0; j < kDTiles; ++j) o[m][j][0] = o[m][j][1] = o[m][j][2] = o[m][j][3] = 0.f;
        OnlineSoftmax<kMTiles> softmax;

        for (int i = 0; i < n_tiles; ++i) {
            const int tile = tile_end - 1 - i;
            if (kSingleBuffer) {
                cp_async::wait<0>();  // K of tile i (and Q) landed for this thread ...
                __syncthreads();      // ... and for all; every warp is past P·V of tile i - 1
                load_k_or_v(i, true);
            } else {
                cp_async::wait<kRingInFlight>();  // tile i (and Q) landed for this thread ...
                __syncthreads();                   // ... and for all; slot (i - 1) % kStages is free
                if (i + kStages - 1 < n_tiles) load_kv(i + kStages - 1);
            }
            cp_async::commit();

            const u32 slot = (i % kStages) * KVTile::kBytes;
            FragAddr<QTile> q_i = q_frag;
            FragAddr<KVTile> k_i = k_frag, v_i = v_frag;
            q_i.base = recomputed(q_i.base);
            k_i.base += slot;
            v_i.base += slot;

            float s[kMTiles][kNTiles][4];
            gemm_qk(s, q_i, q_row0, k_i);
            if constexpr (kSoftcap) softcap_scores(s, p);
            if constexpr (kAlibi) {  // the slope read again each tile (an L1 hit): held, it would take a register
                const QueryTile t = where();
                const Sequence seq = sequence_of(t);
                add_alibi(s, tile * kBlockN, t.m0 + q_row0, alibi_of(p, t.batch, t.head, seq.seqlen_q, seq.seqlen_k), lane);
            }
            if (Mask::masked(keys, tile)) {
                const QueryTile t = where();
                apply_mask(s, tile * kBlockN, t.m0 + q_row0, sequence_of(t), p, lane);
            }
            if (kSingleBuffer) {
                cp_async::wait<0>();  // V of tile i landed for this thread ...
                __syncthreads();      // ... and for all; every warp is past Q·Kᵀ, K's slot is free
                if (i + 1 < n_tiles) load_k_or_v(i + 1, false);
                cp_async::commit();
            }
            float rescale[kMTiles][2];
            softmax.update(s, p.softmax_scale_log2, rescale);
            if constexpr (kDropout) {
                const QueryTile t = where();
                apply_dropout(s, p, t.batch * p.heads_q + t.head, t.m0 + q_row0, tile * kBlockN, lane);
            }
            scale_rows(o, rescale);
            if (kPvAfterSoftmax) v_i.base = after_softmax(v_i.base, softmax, p.seqlen_k);
            gemm_pv(o, s, v_i);
        }

        float inv_sum[kMTiles][2], lse[kMTiles][2];
        softmax.finish(p.softmax_scale_log2, inv_sum, lse);
        if constexpr (kDropout) {  // the kept probabilities' 1 / (1 - p)
#pragma unroll
            for (int m = 0; m < kMTiles; ++m) inv_sum[m][0] *= p.dropout_scale, inv_sum[m][1] *= p.dropout_scale;
        }
        const QueryTile t = where();
        const Sequence seq = sequence_of(t);
        const int rows_left = kLongestFirst ? seq.seqlen_q - t.m0 : rows_valid;
        if (kChunked ? seg.partial >= 0 : kSplitKv && splits > 1) {
            griddep::launch_dependents();  // the combine may launch now; it waits for the partials
            cp_async::wait<0>();           // with no key tile, the Q copies may still be in flight
            const i64 first_row = (static_cast<i64>(t.batch) * p.heads_q + t.head) * p.seqlen_q + t.m0;
            const i64 rows = static_cast<i64>(p.batch) * p.heads_q * p.seqlen_q;
            store_partial(p, o, inv_sum, lse, kChunked ? seg.partial : t.split * rows + first_row, rows_left, q_row0, lane);
            if constexpr (!kChunked) return;
        } else {
            if constexpr (kSinks) fold_sinks(p, t, q_row0, inv_sum, lse, lane);  // final rows only: a split's in the combine
            if (p.lse != nullptr && lane % 4 == 0) {
                float* lse_row = p.lse + lse_at(p, seq, t.batch, t.head, t.m0);
                const i64 step = lse_row_step(p);
        #pragma unroll
                for (int m = 0; m < kMTiles; ++m)
        #pragma unroll
                    for (int r = 0; r < 2; ++r) {
                        const int row = q_row0 + 16 * m + 8 * r + lane / 4;
                        if (row < rows_left) lse_row[row * step] = lse[m][r];
                    }
            }

            cp_async::wait<0>();  // with no key tile, the Q copies may still be in flight
            __syncthreads();
            elem_t* out = static_cast<elem_t*>(p.o) + t.batch * p.o_stride_b + t.head * p.o_stride_h +
                          row_offset(seq, t.m0, p.o_stride_s, p.o_stride_token);
            store_output(p, o, inv_sum, q_smem, out, rows_left, warp, lane);
        }
        if constexpr (!kChunked) return;
        end_segment(p);
    }
}

#if FC_SPLIT_KV
extern "C" __global__ void __launch_bounds__(128) fc_split_combine(const FwdParams p) {
    using namespace fc;
    using namespace fc::fwd_sm80;
    const int lane = threadIdx.x % 32;
    const i64 rows = static_cast<i64>(p.batch) * p.heads_q * p.seqlen_q;
    const i64 row = static_cast<i64>(blockIdx.x) * 4 + threadIdx.x / 32;  // (batch * Hq + head) * Sq + query
    if (row >= rows) return;
    const int query = static_cast<int>(row % p.seqlen_q);
    const int head = static_cast<int>(row / p.seqlen_q % p.heads_q);
    const int batch = static_cast<int>(row / p.seqlen_q / p.heads_q);
    // Varlen: partial rows are laid out by the longest sequence (p.seqlen_q); this one's end
    // past its own rows, where fc_fwd_sm80 wrote nothing. cu_seqlens are read before the wait:
    // the split kernel does not write them.
    const Sequence seq = kVarlen ? sequence_at(p, batch) : sequence<false>(p, batch);
    if (kVarlen && query >= seq.seqlen_q) return;
    elem_t* out = static_cast<elem_t*>(p.o) + batch * p.o_stride_b + row_offset(seq, query, p.o_stride_s, p.o_stride_token) +
                  head * p.o_stride_h;
    // Dense, the LSE index is the partial row (lse_offset's (batch * Hq + head) * Sq + query).
    const i64 lse_index = kVarlen ? lse_at(p, seq, batch, head, query) : row;
    float* lse_out = p.lse == nullptr ? nullptr : p.lse + lse_index;
    const float sink = kSinks ? sinks::sink_of(p, head, query) : 0.f;  // read with kSinks alone
    if constexpr (kChunked) {
        // Row `query` of item batch * M + query / BLOCK_M (start_chunk): merged from the
        // partials of the chunks its key tiles span; written by its chunk when one holds them
        // all; O = 0 and LSE = -inf when it has none.
        const int m_blocks = m_blocks_of(p), item = batch * m_blocks + query / kBlockM;
        const LinePosition line = line_position(p, p.batch * m_blocks, item, lane);
        const int tiles = item_tiles(p, item), chunks = line_chunks(p);
        const int per = max(1, (line.total + chunks - 1) / chunks);
        const int first = line.before / per, parts = tiles > 0 ? (line.before + tiles - 1) / per - first + 1 : 0;
        if (parts == 1) return;
        // The first chunk's segment is its slot 1 unless the item starts at that chunk's start.
        const bool first_in_slot_1 = line.before % per != 0;
        const int heads = p.heads_q, slot_row = query % kBlockM, rows_per_slot = slot_rows(p);
        const auto partial_row = [=](int j) {
            return ((static_cast<i64>(first + j) * 2 + (j == 0 && first_in_slot_1)) * heads + head) * rows_per_slot + slot_row;
        };
        griddep::wait();  // launched early (programmatic dependent launch): the partials are ready now
        split_kv::combine_partials<FC_HEAD_DIM, kSinks>(p.o_accum, p.lse_accum, partial_row, parts, sink, out, lse_out, lane);
    } else {
        griddep::wait();  // launched early (programmatic dependent launch): the partials are ready now
        split_kv::combine_row<FC_HEAD_DIM, kSinks>(p.o_accum, p.lse_accum, rows, row, p.num_splits, sink, out, lse_out, lane);
    }
}
#endif
