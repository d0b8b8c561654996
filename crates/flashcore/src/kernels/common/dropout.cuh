// Attention dropout (FC_DROPOUT; fwd_sm80, fwd_sm90, bwd_sm80 and bwd_sm90): each
// probability P_ij is kept with probability 1 - p and scaled by 1 / (1 - p), else zeroed,
// the mask drawn from a counter-based generator, so that the backward regenerates exactly the
// forward's mask from the same (seed, offset) without storing it, and any kernel, tile or
// launch order draws the same mask for the same call.
//
// The generator is Philox4x32-7 (Salmon et al., "Parallel random numbers: as easy as 1, 2,
// 3", SC 2011: seven rounds already pass BigCrush; ten is Random123's default margin, and
// FlashAttention-2 runs seven), one call for 16 scores, a byte each (as FlashAttention-2
// draws them): the
// scores one lane holds of a 16-row x 32-key cell of mma.sync m16n8 fragments, rows i and
// i + 8 (i % 16 < 8) and keys j + 8t + {0, 1}, t = 0..3 (j the cell's first key plus twice
// the lane's column pair). Key: the seed's two words (the offset's high word folded in);
// counter: x the cell's key block j / 32 times 4 plus the column pair, y the row i, z batch ·
// Hq + head, w the offset's low word. Word t holds n8 fragment t's four scores, byte 2h + e
// the score at row i + 8h, key j + 8t + e. Score (i, j) is kept when its byte is at least
// round(p · 256) (`threshold`; p is thus quantised to 1/256, as in FlashAttention-2). The mask
// is a function of (seed, offset, batch, head, row, key) alone, rows and keys counted within
// the sequence (a packed batch's sequence b is batch b); a tile narrower than a cell (16-key
// warp columns) uses half a call's words. The host twin (crate::dropout) draws the same bytes
// for the f64 oracle.
#pragma once

#include "common/types.cuh"

#ifndef FC_DROPOUT
#define FC_DROPOUT 0
#endif

namespace fc {
namespace dropout {

// Philox4x32-7: seven rounds of two 32 x 32 -> 64-bit products and xors, the key bumped by
// the Weyl constants between rounds. Ten rounds cost the backward 3-4% more instructions.
constexpr int kRounds = 7;
__device__ __forceinline__ u32x4 philox(u32 key0, u32 key1, u32x4 c) {
    constexpr u32 kM0 = 0xD2511F53u, kM1 = 0xCD9E8D57u, kW0 = 0x9E3779B9u, kW1 = 0xBB67AE85u;
#pragma unroll
    for (int round = 0; round < kRounds; ++round) {
        const u32 hi0 = __umulhi(kM0, c.x), lo0 = kM0 * c.x;
        const u32 hi1 = __umulhi(kM1, c.z), lo1 = kM1 * c.z;
        c = u32x4{hi1 ^ c.y ^ key0, lo1, hi0 ^ c.w ^ key1, lo0};
        key0 += kW0;
        key1 += kW1;
    }
    return c;
}

// One call's generator state: (dropout_seed, dropout_offset), or the pair dropout_state points
// to when set, as the Philox key and the counter's last word (see the header); 16 bytes, so
// that one shared-memory load reads it.
struct alignas(16) State {
    u32 key0, key1, offset, unused;
};
template <class Params> __device__ __forceinline__ State state_of(const Params& p) {
    const bool on_device = p.dropout_state != nullptr;
    const unsigned long long seed = on_device ? p.dropout_state[0] : p.dropout_seed;
    const unsigned long long offset = on_device ? p.dropout_state[1] : p.dropout_offset;
    return State{static_cast<u32>(seed), static_cast<u32>(seed >> 32) ^ static_cast<u32>(offset >> 32), static_cast<u32>(offset), 0u};
}

// The state as the CTA reads it: staged in shared memory once, at the kernel's start
// (`stage`), and read back with one 16-byte load at each generator call (`staged`). A global
// load there cost 4-12% of the kernels' time on the H100; held in registers across the loop,
// the state spilled bwd_sm80.
__device__ __forceinline__ State& staged_state() {
    __shared__ State slot;
    return slot;
}
template <class Params> __device__ __forceinline__ void stage(const Params& p) {
    if (threadIdx.x == 0) staged_state() = state_of(p);
    __syncthreads();
}
// (Volatile: a load where it is used, rather than the compiler holding it in registers.)
__device__ __forceinline__ State staged() {
    State s;
    asm volatile("ld.volatile.shared.v4.u32 {%0, %1, %2, %3}, [%4];"
                 : "=r"(s.key0), "=r"(s.key1), "=r"(s.offset), "=r"(s.unused)
                 : "r"(smem_u32(&staged_state())));
    return s;
}

// One call's mask: the threshold below which a score is dropped (in both 16-bit halves of
// `threshold2`) and the keepers' scale 1 / (1 - p); the generator state is the staged one.
// Params: FwdParams or BwdParams.
struct Mask {
    u32 threshold2;
    float scale;
    Mask() = default;
    template <class Params>
    __device__ __forceinline__ explicit Mask(const Params& p) : threshold2(p.dropout_threshold * 0x10001u), scale(p.dropout_scale) {}

    // The words of the cell holding rows (row0, row0 + 8) and key `key` (row0 % 16 < 8), for
    // the lane whose column pair is (key / 2) % 4, of (batch, head) `bh`: word t for the
    // n8 fragment t of the cell's 32 keys (see the header).
    __device__ __forceinline__ u32x4 cell_words(int bh, int row0, int key) const {
        const State s = staged();
        const u32 x = ((static_cast<u32>(key) >> 5) << 2) | ((static_cast<u32>(key) >> 1) & 3u);
        return philox(s.key0, s.key1, u32x4{x, static_cast<u32>(row0), static_cast<u32>(bh), s.offset});
    }
    // Fragment t's word (t in 0..3; constant where the caller's loop is unrolled).
    __device__ __forceinline__ static u32 fragment_word(const u32x4& w, int t) { return t == 0 ? w.x : t == 1 ? w.y : t == 2 ? w.z : w.w; }
    // Whether score e (2 · half + column) of a fragment's word is kept.
    __device__ __forceinline__ bool keep(u32 word, int e) const { return ((word >> (8 * e)) & 0xffu) >= (threshold2 & 0xffffu); }
    // Zeroes a[c] and b[c] (c = 0, 1) where score 2 · half + c of a fragment's word is dropped.
    // On sm_90, the two bytes, widened to the 16-bit halves of a word, are compared at once as
    // f16x2 (integers below 2^10 are f16 subnormals, ordered as the integers; no flush to
    // zero): a byte permute, one compare and four selects, where a byte at a time takes a
    // shift and a compare each. (On sm_80 with NVRTC 13.0 that form spilled bwd_sm80 D128:
    // there, a byte at a time.)
    __device__ __forceinline__ void zero_dropped(u32 word, int half, float (&a)[2], float (&b)[2]) const {
#if __CUDA_ARCH__ >= 900
        const u32 pair = __byte_perm(word, 0u, half ? 0x4342u : 0x4140u);
        asm("{\n\t.reg .pred k0, k1;\n\t"
            "setp.ge.f16x2 k0|k1, %4, %5;\n\t"
            "selp.f32 %0, %0, 0f00000000, k0;\n\t"
            "selp.f32 %1, %1, 0f00000000, k1;\n\t"
            "selp.f32 %2, %2, 0f00000000, k0;\n\t"
            "selp.f32 %3, %3, 0f00000000, k1;\n\t}"
            : "+f"(a[0]), "+f"(a[1]), "+f"(b[0]), "+f"(b[1])
            : "r"(pair), "r"(threshold2));
#else
#pragma unroll
        for (int c = 0; c < 2; ++c) {
            const bool kept = keep(word, 2 * half + c);
            a[c] = kept ? a[c] : 0.f;
            b[c] = kept ? b[c] : 0.f;
        }
#endif
    }
    // A fragment's four scores x[e] (the forward's P), zeroed where dropped. (A byte at a
    // time: the f16x2 compare above spilled fwd_sm80 D128 with every policy on sm_90a, 168
    // bytes with NVRTC 13.0.)
    __device__ __forceinline__ void zero_dropped(u32 word, float (&x)[4]) const {
#pragma unroll
        for (int e = 0; e < 4; ++e) x[e] = keep(word, e) ? x[e] : 0.f;
    }
};

}  // namespace dropout
}  // namespace fc
