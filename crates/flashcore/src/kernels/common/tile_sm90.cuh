// Shared-memory tiles in the 128-byte-swizzled layout that TMA writes and wgmma reads, and
// the two warpgroup matrix products of attention built on them.
//
// A tile of kRows x kCols 16-bit elements is stored as kCols/64 panels, each kRows rows of
// 128 bytes (64 elements): the 128-byte swizzle spans one 128-byte row, so a wider row is
// split into panels, loaded by one TMA box each. Panels are 1024-byte multiples (kRows % 8
// == 0), so every panel starts on the swizzle's 1024-byte period.
#pragma once
#include "common/types.cuh"
#include "ptx/ldmatrix.cuh"
#include "ptx/mma.cuh"
#include "ptx/tma.cuh"
#include "ptx/wgmma.cuh"

namespace fc {
namespace sm90 {

__device__ __forceinline__ void st_shared_u32(u32 addr, u32 v) {
    asm volatile("st.shared.u32 [%0], %1;\n" ::"r"(addr), "r"(v) : "memory");
}

__device__ __forceinline__ u32 ld_shared_u32(u32 addr) {
    u32 v;
    asm volatile("ld.shared.u32 %0, [%1];\n" : "=r"(v) : "r"(addr) : "memory");
    return v;
}

__device__ __forceinline__ void st_shared_zero16(u32 addr) {
    asm volatile("st.shared.v4.u32 [%0], {%1, %1, %1, %1};\n" ::"r"(addr), "r"(0u) : "memory");
}

constexpr int kPanelCols = 64;     // 16-bit elements in one 128-byte swizzle row
constexpr u32 kRowBytes = 128;
constexpr u32 kSwizzlePeriod = 1024;  // 8 rows of 128 bytes

// The kernel's dynamic shared memory as a T at its first kSwizzlePeriod-aligned address (the
// swizzled tiles start on the swizzle's period; the launch gives kSwizzlePeriod bytes of
// slack for this).
template <class T> __device__ __forceinline__ T& aligned_shared_storage() {
    extern __shared__ unsigned char smem_raw[];
    const u32 a = smem_u32(smem_raw);
    const u32 pad = (kSwizzlePeriod - (a % kSwizzlePeriod)) % kSwizzlePeriod;
    return *reinterpret_cast<T*>(smem_raw + pad);
}

// Shared addresses of a barrier and of stage `i` of a barrier ring, in 32-bit arithmetic
// (through &ring[i] a producer would keep 64-bit generic addresses live).
__device__ __forceinline__ u32 bar(const u64& b) { return smem_u32(&b); }
template <int N> __device__ __forceinline__ u32 bar(const u64 (&ring)[N], int i) { return smem_u32(ring) + 8 * i; }

template <int kRows, int kCols> struct SmemTile {
    static_assert(kCols % kPanelCols == 0, "tile width must be whole 64-element panels");
    static_assert(kRows % 8 == 0 && kRows <= 256, "tile rows: multiple of 8, one TMA box");
    static constexpr int kPanels = kCols / kPanelCols;
    static constexpr u32 kPanelBytes = kRows * kRowBytes;
    static constexpr u32 kBytes = kPanels * kPanelBytes;

    alignas(kSwizzlePeriod) elem_t data[kRows * kCols];

    __device__ __forceinline__ u32 addr() const { return smem_u32(data); }

    // TMA: rows [row, row + kRows) of (head, batch); all panels complete on `bar`.
    __device__ __forceinline__ void load(const TmaDescriptor* map, u32 bar, int row, int head, int batch) const {
        load_to(addr(), map, bar, row, head, batch);
    }
    // The same into the tile at shared address `dst` (stage `i` of a ring is at
    // smem_u32(ring) + i * kBytes: 32-bit arithmetic, where &ring[i] would be 64-bit).
    static __device__ __forceinline__ void load_to(u32 dst, const TmaDescriptor* map, u32 bar, int row, int head, int batch) {
#pragma unroll
        for (int p = 0; p < kPanels; ++p) tma::load_4d(dst + p * kPanelBytes, map, bar, p * kPanelCols, row, head, batch);
    }

    // The same from column `col0` (of the map's 16-bit units) and row `row`: panel p's box at
    // column col0 + 64p (an e4m3 V^T tile takes its key block's columns, every row).
    static __device__ __forceinline__ void load_cols_to(u32 dst, const TmaDescriptor* map, u32 bar, int col0, int row, int head,
                                                        int batch) {
#pragma unroll
        for (int p = 0; p < kPanels; ++p) tma::load_4d(dst + p * kPanelBytes, map, bar, col0 + p * kPanelCols, row, head, batch);
    }

    // TMA store: rows [row0, row0 + box rows) of every panel to rows [row, ...) of (head,
    // batch); the map's box is {64, box rows}. Issued, not committed; clips at the tensor's
    // edges, so rows past the sequence are not written.
    __device__ __forceinline__ void store(const TmaDescriptor* map, int row0, int row, int head, int batch) const {
#pragma unroll
        for (int p = 0; p < kPanels; ++p)
            tma::store_4d(map, addr() + p * kPanelBytes + row0 * kRowBytes, p * kPanelCols, row, head, batch);
    }

    // Zeroes rows [row0, kRows) of every panel, 16 bytes a store, shared out among `threads`
    // threads (this one is `thread`). Whole 128-byte rows: the swizzle only permutes within one.
    __device__ __forceinline__ void clear_rows_from(int row0, u32 thread, u32 threads) const {
#pragma unroll
        for (int p = 0; p < kPanels; ++p) {
            for (u32 i = max(row0, 0) * (kRowBytes / 16) + thread; i < kRows * (kRowBytes / 16); i += threads)
                st_shared_zero16(addr() + p * kPanelBytes + i * 16);
        }
    }

    // Shared address of 16-byte chunk `c` (8 elements, c < kCols / 8) of row `row`, where the
    // 128-byte swizzle put it: chunk c % 8 of a panel row moves to (c % 8) ^ (row % 8).
    __device__ __forceinline__ u32 chunk_addr(int row, int c) const {
        return addr() + (c / 8) * kPanelBytes + row * kRowBytes + (((c % 8) ^ (row % 8)) * 16);
    }

    // K-major operand (rows are M or N, columns are K): 64 or N rows from `row0`, the
    // 16-column step `kk`. Steps within a panel move the start 32 bytes along the row; the
    // hardware applies the swizzle to the final address.
    __device__ __forceinline__ u64 kmajor_desc(int row0, int kk) const {
        const u32 a = addr() + (kk / 4) * kPanelBytes + row0 * kRowBytes + (kk % 4) * 32;
        return wgmma::desc_sw128(a, 16, kSwizzlePeriod);
    }

    // MN-major operand (rows are K, columns are M or N): the 16-row step `kk`, the columns
    // from panel `panel` on; the descriptor steps panel to panel along M or N by kPanelBytes.
    __device__ __forceinline__ u64 mnmajor_desc(int kk, int panel = 0) const {
        const u32 a = addr() + panel * kPanelBytes + kk * 16 * kRowBytes;
        return wgmma::desc_sw128(a, kPanelBytes, kSwizzlePeriod);
    }
};

// S[64 x N] = Q[q_row0 .. q_row0+64, :] · K^T. Issued and committed, not waited for.
template <int kM, int kN, int kD>
__device__ __forceinline__ void gemm_qk(float (&s)[kN / 2], const SmemTile<kM, kD>& q, int q_row0,
                                        const SmemTile<kN, kD>& k) {
    wgmma::fence_operands(s);
    wgmma::fence();
#pragma unroll
    for (int kk = 0; kk < kD / 16; ++kk)
        wgmma::Mma<kN>::template ss<0>(s, q.kmajor_desc(q_row0, kk), k.kmajor_desc(0, kk), kk > 0 ? 1 : 0);
    wgmma::commit_group();
    wgmma::fence_operands(s);
}

// S = Q·K^T + Qv·V^T (FlashAttention-3's qv, absorbed MLA): gemm_qk's product, then Qv·V^T
// accumulated into it in the same commit group. V's rows are keys, as K's are, so it is read
// K-major here (P·V reads it MN-major).
template <int kM, int kN, int kD, int kDv>
__device__ __forceinline__ void gemm_qk_qv(float (&s)[kN / 2], const SmemTile<kM, kD>& q, const SmemTile<kM, kDv>& qv, int q_row0,
                                           const SmemTile<kN, kD>& k, const SmemTile<kN, kDv>& v) {
    wgmma::fence_operands(s);
    wgmma::fence();
#pragma unroll
    for (int kk = 0; kk < kD / 16; ++kk)
        wgmma::Mma<kN>::template ss<0>(s, q.kmajor_desc(q_row0, kk), k.kmajor_desc(0, kk), kk > 0 ? 1 : 0);
#pragma unroll
    for (int kk = 0; kk < kDv / 16; ++kk) wgmma::Mma<kN>::template ss<0>(s, qv.kmajor_desc(q_row0, kk), v.kmajor_desc(0, kk), 1);
    wgmma::commit_group();
    wgmma::fence_operands(s);
}

// One 16-key group of warp_qk: keys 16J + (0..15) at one k16 step, group 0's ldmatrix
// address in k_addr (rows 16J + r have r's swizzle, so group J is 16J rows further on).
template <int J, int kN>
__device__ __forceinline__ void warp_qk_keys(float (&s)[kN / 2], const u32 (&a)[4], u32 k_addr) {
    u32 b[4];  // keys 0-7 at k 0-7 / 8-15, then keys 8-15 at k 0-7 / 8-15
    ldmatrix::x4<J * 16 * kRowBytes>(b, k_addr);
    mma::m16n8k16<elem_t>(*reinterpret_cast<float(*)[4]>(&s[8 * J]), a, b[0], b[1]);
    mma::m16n8k16<elem_t>(*reinterpret_cast<float(*)[4]>(&s[8 * J + 4]), a, b[2], b[3]);
}
template <int kN, int J0, int... J>
__device__ __forceinline__ void warp_qk_keys(float (&s)[kN / 2], const u32 (&a)[4], u32 k_addr, IntSeq<J...>) {
    (warp_qk_keys<J0 + J, kN>(s, a, k_addr), ...);
}

// Keys [16 J0, 16 (J0 + kGroups)) of warp_qk, over the whole depth.
template <int J0, int kGroups, int kM, int kN, int kD>
__device__ __forceinline__ void warp_qk_part(float (&s)[kN / 2], const SmemTile<kM, kD>& q, int q_row0,
                                             const SmemTile<kN, kD>& k, u32 lane) {
#pragma unroll 1
    for (int kk = 0; kk < kD / 16; ++kk) {
        u32 a[4];  // ldmatrix x4: rows 0-7 / 8-15 of k 0-7, then of k 8-15
        ldmatrix::x4(a, q.chunk_addr(q_row0 + lane % 16, 2 * kk + lane / 16));
        const u32 k_addr = k.chunk_addr(lane % 8 + 8 * (lane / 16), 2 * kk + (lane / 8) % 2);
        warp_qk_keys<kN, J0>(s, a, k_addr, typename MakeIntSeq<kGroups>::type{});
    }
}
template <int kM, int kN, int kD, int... P>
__device__ __forceinline__ void warp_qk_parts(float (&s)[kN / 2], const SmemTile<kM, kD>& q, int q_row0,
                                              const SmemTile<kN, kD>& k, u32 lane, IntSeq<P...>) {
    constexpr int kGroups = kN / 16, kPer = 4;  // 4 key groups a pass: ptxas loads a pass's
                                                // B fragments at once, 16 registers
    (warp_qk_part<P * kPer, (kGroups - P * kPer < kPer ? kGroups - P * kPer : kPer)>(s, q, q_row0, k, lane), ...);
}

// S[16 x N] = Q[q_row0 .. q_row0+16, :] · K^T for one warp, by mma.sync from the same
// shared tiles as gemm_qk: the slow path of a softmax that needs its scores again after
// overwriting them (see OnlineSoftmax::exp_at_current_max). The result lands in gemm_qk's
// layout: a warp's part of an m64nN wgmma accumulator is m16n8 fragments, chunk j (8 keys)
// in s[4j .. 4j+3]. In passes of 4 key groups: with all of them at once, ptxas issues
// every ldmatrix of a k step first, 48 registers at D128 that the loop does not have.
template <int kM, int kN, int kD>
__device__ __forceinline__ void warp_qk(float (&s)[kN / 2], const SmemTile<kM, kD>& q, int q_row0,
                                        const SmemTile<kN, kD>& k) {
    // The lane read afresh (volatile): derived from threadIdx.x, ptxas hoists the lane's
    // addresses out of the key loop and keeps them live across it, where registers are short.
    u32 lane;
    asm volatile("mov.u32 %0, %%laneid;\n" : "=r"(lane));
#pragma unroll
    for (int i = 0; i < kN / 2; ++i) s[i] = 0.f;
    warp_qk_parts(s, q, q_row0, k, lane, typename MakeIntSeq<(kN / 16 + 3) / 4>::type{});
}

// O[64 x D] += P[64 x N] · V, P in registers (packed pairs in the accumulator's order,
// which is the register-A layout of wgmma for 16-bit types). Issued and committed.
template <int kN, int kD>
__device__ __forceinline__ void gemm_pv(float (&o)[kD / 2], u32 (&p)[kN / 4], const SmemTile<kN, kD>& v) {
    wgmma::fence_operands(o);
    wgmma::fence_operands(p);
    wgmma::fence();
#pragma unroll
    for (int kk = 0; kk < kN / 16; ++kk) {
        const u32 a[4] = {p[4 * kk], p[4 * kk + 1], p[4 * kk + 2], p[4 * kk + 3]};
        wgmma::Mma<kD>::template rs<1>(o, a, v.mnmajor_desc(kk), 1);
    }
    wgmma::commit_group();
    wgmma::fence_operands(o);
}

// Writes a warpgroup's m64 x kCols f32 accumulator (layout: softmax_sm90.cuh), each row
// times its factor, as 16-bit values into rows [row0, row0 + 64) of `t` (row0 % 8 == 0), in
// the 128-byte swizzle TMA reads: 16-byte chunk c of row r lies at chunk c ^ (r % 8), so the
// 8 rows a warp writes at once fall in 8 different chunks and no two lanes share a bank.
template <int kRows, int kCols>
__device__ __forceinline__ void write_accumulator(const SmemTile<kRows, kCols>& t, int row0, const float (&acc)[kCols / 2],
                                                  const float (&f)[2]) {
    const int warp = (threadIdx.x / 32) % 4, lane = threadIdx.x % 32;
#pragma unroll
    for (int r = 0; r < 2; ++r) {
        const u32 row_addr = t.addr() + (row0 + 16 * warp + lane / 4 + 8 * r) * kRowBytes + (lane % 4) * 4;
#pragma unroll
        for (int j = 0; j < kCols / 8; ++j) {
            const u32 a = row_addr + (j / 8) * SmemTile<kRows, kCols>::kPanelBytes + (((j % 8) ^ (lane / 4)) * 16);
            st_shared_u32(a, pack2<elem_t>(acc[4 * j + 2 * r] * f[r], acc[4 * j + 2 * r + 1] * f[r]));
        }
    }
}

// Writes a warpgroup's m64 x N accumulator already packed into 16-bit pairs (the operand
// form of to_operand) into rows [row0, row0 + 64) of `t` (row0 % 8 == 0), from its 8-column
// chunk `chunk0` on (N = 8 x the chunks, within the tile's width), swizzled as above, with
// stmatrix: packed[2j + r] is the fragment of the 8 x 8 matrix at chunk j, rows 8r of the
// warp's 16, so four registers (two chunks, both halves) are one stmatrix.x4, lane 8i + k
// giving row k of matrix i. A quarter of the store instructions of st.shared.b32 each
// (bwd_sm90's dSᵀ at D64: 8 for 32 a thread), before the barrier both consumers wait on.
template <int kPacked, int kRows, int kCols>
__device__ __forceinline__ void write_operand(const SmemTile<kRows, kCols>& t, int row0, const u32 (&packed)[kPacked], int chunk0 = 0) {
    static_assert(4 * kPacked <= kCols, "the accumulator fits the tile's width");
    static_assert(kPacked % 4 == 0, "whole pairs of chunks");
    const int warp = (threadIdx.x / 32) % 4, lane = threadIdx.x % 32;
    const int matrix = lane / 8, row = lane % 8;
    const u32 row_addr = t.addr() + (row0 + 16 * warp + 8 * (matrix % 2) + row) * kRowBytes;
#pragma unroll
    for (int j = 0; j < kPacked / 4; ++j) {
        const int c = chunk0 + 2 * j + matrix / 2;
        const u32 a = row_addr + (c / 8) * SmemTile<kRows, kCols>::kPanelBytes + (((c % 8) ^ row) * 16);
        stmatrix::x4(a, packed[4 * j], packed[4 * j + 1], packed[4 * j + 2], packed[4 * j + 3]);
    }
}

// Scores (f32 accumulator) to the 16-bit P operand of gemm_pv.
template <int R> __device__ __forceinline__ void to_operand(const float (&s)[R], u32 (&p)[R / 2]) {
#pragma unroll
    for (int i = 0; i < R / 2; ++i) p[i] = pack2<elem_t>(s[2 * i], s[2 * i + 1]);
}

// ---- e4m3 (FP8) operands: fwd_sm90's FC_FP8 forms ----
// An e4m3 tile is held as a tile of half as many 16-bit columns: a 128-byte swizzle row is 128
// e4m3 values, and one k32 step of an 8-bit wgmma is 32 bytes, as a k16 step of 16-bit values
// is, so SmemTile's layout, TMA loads and K-major descriptors serve unchanged (the tensor maps
// see e4m3 tensors as 16-bit ones of half the columns). 8-bit wgmma reads both operands
// K-major, so P·V takes V transposed (common/fp8.cuh).

// S[64 x N] = Q·K^T over e4m3 tiles of kC 16-bit columns (2 kC values of depth).
template <int kM, int kN, int kC>
__device__ __forceinline__ void gemm_qk_e4m3(float (&s)[kN / 2], const SmemTile<kM, kC>& q, int q_row0, const SmemTile<kN, kC>& k) {
    wgmma::fence_operands(s);
    wgmma::fence();
#pragma unroll
    for (int kk = 0; kk < kC / 16; ++kk) wgmma::MmaE4M3<kN>::ss(s, q.kmajor_desc(q_row0, kk), k.kmajor_desc(0, kk), kk > 0 ? 1 : 0);
    wgmma::commit_group();
    wgmma::fence_operands(s);
}

// O[64 x Dv] += P[64 x N] · V, V given as V^T (`vt`: Dv rows of N keys, K-major) with its keys
// in the order to_operand_e4m3 leaves P's (fp8::permuted_key), P in registers. Issued and
// committed.
// (kC: V^T's 16-bit columns, two keys each.)
template <int kDv, int kC>
__device__ __forceinline__ void gemm_pv_e4m3(float (&o)[kDv / 2], u32 (&p)[kC / 4], const SmemTile<kDv, kC>& vt) {
    wgmma::fence_operands(o);
    wgmma::fence_operands(p);
    wgmma::fence();
#pragma unroll
    for (int kk = 0; kk < kC / 16; ++kk) {
        const u32 a[4] = {p[4 * kk], p[4 * kk + 1], p[4 * kk + 2], p[4 * kk + 3]};
        wgmma::MmaE4M3<kDv>::rs(o, a, vt.kmajor_desc(0, kk), 1);
    }
    wgmma::commit_group();
    wgmma::fence_operands(o);
}

// Probabilities (f32 accumulator) to the e4m3 A operand of gemm_pv_e4m3, with no exchange
// between lanes. The accumulator gives a thread keys 2t, 2t+1 of each 8-key chunk (t = lane %
// 4) of rows g and g + 8; the k32 A operand wants keys 4t .. 4t+3 and 16+4t .. 16+4t+3 of a
// 32-key group. Rather than move values between lanes, each register takes the thread's own
// keys of two chunks, {2t, 2t+1, 8+2t, 8+2t+1} (and 16 on), so operand column L of a group is
// key fp8::permuted_key(L), and V^T's columns are written in that order (fc_fp8_transpose_v).
template <int R> __device__ __forceinline__ void to_operand_e4m3(const float (&s)[R], u32 (&p)[R / 4]) {
    static_assert(R % 16 == 0, "whole 32-key groups");
#pragma unroll
    for (int g = 0; g < R / 16; ++g) {
        const float* x = s + 16 * g;  // chunks 4g .. 4g+3: [4j, 4j+1] row g, [4j+2, 4j+3] row g + 8
        p[4 * g] = pack4_e4m3(x[0], x[1], x[4], x[5]);
        p[4 * g + 1] = pack4_e4m3(x[2], x[3], x[6], x[7]);
        p[4 * g + 2] = pack4_e4m3(x[8], x[9], x[12], x[13]);
        p[4 * g + 3] = pack4_e4m3(x[10], x[11], x[14], x[15]);
    }
}

}  // namespace sm90
}  // namespace fc
