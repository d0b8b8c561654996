// Which keys each query row sees, and the transform of its scores: the policy pieces the
// forward and backward kernels share. A kernel holds one KeyMask<kCausal, kLocal> (its
// compile-time FC_CAUSAL and FC_LOCAL) and calls softcap_scores (the backward also
// softcap_grad) when FC_SOFTCAP is set, and adds an AlibiBias when FC_ALIBI is; none of its
// loops changes with the policy, only their bounds and which blocks are masked. The forward
// walks the key blocks of a query block (blocks); the backward the query blocks of a key
// block (query_blocks).
#pragma once

#include "ptx/math.cuh"
#include "common/params.cuh"
#include "common/bwd_params.cuh"

// The policy switches of a kernel variant (the host's ScoreMods): off unless set with -D.
#ifndef FC_LOCAL
#define FC_LOCAL 0
#endif
#ifndef FC_CHUNK
#define FC_CHUNK 0
#endif
#ifndef FC_SOFTCAP
#define FC_SOFTCAP 0
#endif
#ifndef FC_ALIBI
#define FC_ALIBI 0
#endif
#ifndef FC_SINKS
#define FC_SINKS 0
#endif

namespace fc {

// Key blocks (of `block` keys) a group of query rows visits: [begin, end) hold a key some
// row sees (empty when end <= begin); every row sees every key of [full_begin, full_end),
// so only the blocks outside that range need the mask.
struct KeyBlocks {
    int begin, end, full_begin, full_end;  // begin = full_begin = 0 without a window
};
// The same split the other way round (the backward): query blocks [begin, end) hold a row
// that sees a key of the group of keys; every row of [full_begin, full_end) sees all of them.
using QueryBlocks = KeyBlocks;

// Query row `row` sees keys [first(row), last(row)] within [0, Sk), bottom-right aligned
// (offset = Sk - Sq, as flash_attn): causal, last = row + offset; local (a sliding window, with
// causal folded in by the host as window_right = 0), first = row + offset - window_left and
// last = row + offset + window_right, -1 meaning unbounded. Chunked attention (local too, the
// window's sides capped at a chunk by the host) also keeps first and last within the chunk
// of the row's diagonal key. Rows whose range is empty see no key: their output is 0 and
// their LSE -inf. first and last never decrease from one row to the next: the block ranges
// below rely on it.
template <bool kCausal, bool kLocal> struct KeyMask {
    static constexpr int kUnbounded = 1 << 30;  // a window side of -1; row + offset stays far from overflow
    // Chunked attention's bounds (FC_CHUNK, with FC_LOCAL): a form of its own, so that a window
    // alone compiles to the code it had before chunks (the bounds cost registers: with them,
    // fwd_sm90's window-and-softcap forms spilled under NVRTC 13.0).
    static constexpr bool kChunked = kLocal && FC_CHUNK;
    int offset, seqlen_k, left, right, chunk;

    // One sequence of seqlen_q queries and seqlen_k keys (a varlen batch's own lengths).
    __device__ __forceinline__ KeyMask(int seqlen_q, int seqlen_k, int window_left, int window_right, int attention_chunk)
        : offset(seqlen_k - seqlen_q),
          seqlen_k(seqlen_k),
          left(kLocal && window_left >= 0 ? window_left : kUnbounded),
          right(kLocal && window_right >= 0 ? window_right : kUnbounded),
          chunk(kChunked ? attention_chunk : 0) {}
    template <class Params>  // FwdParams or BwdParams: one sequence's lengths, the call's policies
    __device__ __forceinline__ KeyMask(const Params& p, int seqlen_q, int seqlen_k)
        : KeyMask(seqlen_q, seqlen_k, p.window_left, p.window_right, p.attention_chunk) {}
    __device__ __forceinline__ explicit KeyMask(const FwdParams& p) : KeyMask(p, p.seqlen_q, p.seqlen_k) {}
    __device__ __forceinline__ explicit KeyMask(const BwdParams& p) : KeyMask(p, p.seqlen_q, p.seqlen_k) {}

    // The first and last key of the chunk that holds key `key` (floored, so a diagonal left of
    // key 0 has its own chunk); without chunks, unbounded both ways.
    __device__ __forceinline__ int chunk_first(int key) const {
        if (chunk <= 0) return -kUnbounded;
        const int q = key / chunk;                    // truncated: one step down for a negative
        return (q - (q * chunk > key ? 1 : 0)) * chunk;  // key off a chunk's start (floored)
    }
    __device__ __forceinline__ int chunk_last(int key) const { return chunk <= 0 ? kUnbounded : chunk_first(key) + chunk - 1; }

    // First visible key (may be < 0: from key 0) and last (at most Sk - 1; < first: none).
    __device__ __forceinline__ int first(int row) const {
        if (kChunked) return max(row + offset - left, chunk_first(row + offset));
        return kLocal ? row + offset - left : 0;
    }
    __device__ __forceinline__ int last(int row) const {
        const int diagonal = row + offset;
        if (kChunked) return min(seqlen_k - 1, min(diagonal + right, chunk_last(diagonal)));
        return kLocal ? min(seqlen_k - 1, diagonal + right) : kCausal ? min(seqlen_k - 1, diagonal) : seqlen_k - 1;
    }
    // A row's visible keys [first, last], taken once for a loop over the row's keys. With
    // chunks, first and last each take a floored modulo (an integer division): tested score by
    // score through visible(), they made fwd_sm90's chunked forms 5.5 times the machine code
    // of the window's (20,648 SASS instructions against 3,728, a third of them IMAD).
    struct Keys {
        int first, last;
        __device__ __forceinline__ bool sees(int key) const { return key >= first && key <= last; }
        // The range with keys counted from `key0` (then sees() takes key - key0).
        __device__ __forceinline__ Keys from(int key0) const { return Keys{first - key0, last - key0}; }
    };
    __device__ __forceinline__ Keys keys(int row) const { return Keys{first(row), last(row)}; }
    // Keys are >= 0: without a window only the upper bound is tested.
    // Whether key block n of `b` needs the mask (without a window only the upper end can).
    __device__ __forceinline__ static bool masked(const KeyBlocks& b, int n) {
        return n >= b.full_end || (kLocal && n < b.full_begin);
    }
    // Whether query block m of `b` (query_blocks) needs the mask: on either side, since the
    // causal diagonal bounds a key block's rows from below.
    __device__ __forceinline__ static bool query_block_masked(const QueryBlocks& b, int m) {
        return m < b.full_begin || m >= b.full_end;
    }
    __device__ __forceinline__ bool visible(int row, int key) const {
        if (kLocal) return key <= last(row) && key >= first(row);
        return !(key >= seqlen_k || (kCausal && key > row + offset));
    }

    // Rows [row0, row_end) (row_end > row0; rows past Sq may be included: they only widen the
    // masked range).
    __device__ __forceinline__ KeyBlocks blocks(int row0, int row_end, int block) const {
        if (!kLocal) {  // from key 0: only the ends, as the kernels computed them before windows
            KeyBlocks b{0, (seqlen_k + block - 1) / block, 0, seqlen_k / block};
            if (kCausal) {
                b.end = min(b.end, max(0, (row_end + offset + block - 1) / block));
                b.full_end = min(b.full_end, max(0, row0 + offset) / block);
            }
            return b;
        }
        const int first_key = max(0, first(row0)), end_key = last(row_end - 1) + 1;
        KeyBlocks b;
        b.begin = first_key / block;
        b.end = end_key > first_key ? (end_key + block - 1) / block : b.begin;
        b.full_begin = (max(0, first(row_end - 1)) + block - 1) / block;
        b.full_end = max(0, last(row0) + 1) / block;
        return b;
    }

    // The transposed view (the backward, which walks queries per key): the rows that see key
    // `key` (< Sk) are [first_row(key), last_row(key)], not clamped to [0, Sq). From
    // first(i) <= key <= last(i): the diagonal i + offset lies within [key - right, key +
    // left] and, with chunks, in key's chunk.
    __device__ __forceinline__ int first_row(int key) const {
        if (kChunked) return max(key - right, chunk_first(key)) - offset;
        return kLocal || !kCausal ? key - offset - right : key - offset;
    }
    __device__ __forceinline__ int last_row(int key) const {
        if (kChunked) return min(key + left, chunk_last(key)) - offset;
        return key - offset + left;
    }

    // Query blocks (of `block` rows) that see keys [key0, key_end) (a key block: key_end may
    // pass Sk, whose keys no row sees, and then no block is full). Exact: a block outside
    // [begin, end) has no row that sees a key of the group, and every block inside one (the
    // backward's deterministic order relies on it; see common/bwd_schedule.cuh). Rows see
    // contiguous key ranges that move right with the row, so the rows that see a key of the
    // group are [first_row(key0), last_row(last key)] within [0, Sq), and a row sees all of
    // them when first(row) <= key0 and last(row) >= key_end - 1.
    __device__ __forceinline__ QueryBlocks query_blocks(int key0, int key_end, int block) const {
        const int seqlen_q = seqlen_k - offset;
        const int row_begin = max(0, first_row(key0)), row_end = min(seqlen_q, last_row(min(key_end, seqlen_k) - 1) + 1);
        QueryBlocks b;
        b.begin = row_begin / block;
        b.end = row_end > row_begin ? (row_end + block - 1) / block : b.begin;
        b.full_begin = key_end <= seqlen_k ? (max(0, first_row(key_end - 1)) + block - 1) / block : b.end;
        b.full_end = max(0, last_row(key0) + 1) / block;
        return b;
    }
};

// Logit softcapping: s = softcap * tanh(s * softcap_scale) for every score of a tile held as
// any array of floats (softcap_scale = softmax_scale / softcap: see FwdParams), as
// tanh(y) = 1 - 2 / (e^(2y) + 1). One MUFU operation a score (the exponential; the kernels'
// softmax adds its own), since at D128 the MUFU unit is as busy as the tensor cores already:
// the reciprocal runs on the FMA pipe (rcp_newton, 2 steps: relative error < 2^-17, so the
// capped score is within 2·softcap·6.6e-6 of exact: 6.6e-4 at softcap 50). tanh.approx (one
// MUFU op too, FlashAttention's choice) errs by 2^-11 relative: up to 0.024 on a capped
// logit of 50, past the LSE and fp16 bounds. 2y·log2(e) is clamped to 26 (|y| <= 9, where
// tanh is 1 to within 2^-24) so that the reciprocal's operand stays finite; below, e^(2y)
// goes to +0 and the capped score to -softcap.
template <class Scores> __device__ __forceinline__ void softcap_scores(Scores& s, float softcap, float softcap_scale) {
    constexpr int kCount = sizeof(Scores) / sizeof(float);
    float* x = reinterpret_cast<float*>(&s);
    const float to_exp2 = 2.f * 1.4426950408889634f * softcap_scale, cap = softcap;
#pragma unroll
    for (int i = 0; i < kCount; ++i) {
        const float e = math::ex2(fminf(x[i] * to_exp2, 26.f));
        x[i] = fmaf(-2.f * cap, math::rcp_newton<2>(e + 1.f), cap);
    }
}
template <class Scores> __device__ __forceinline__ void softcap_scores(Scores& s, const FwdParams& p) {
    softcap_scores(s, p.softcap, p.softcap_scale);
}

// The backward's factor for a softcapped score, from its capped value c = softcap_scores'
// output. The forward computes c = cap·tanh(u), u = s·softcap_scale, s = q·k and
// softcap_scale = softmax_scale / cap, so
//   dc/ds = cap · (1 − tanh²(u)) · softcap_scale = softmax_scale · (1 − (c / cap)²).
// The backward's dS = P ∘ (dP − D_i) is the gradient with respect to c (P = exp(c − lse));
// times this factor it is the gradient with respect to s·softmax_scale, and the kernels'
// final softmax_scale (dQ = scale·dS·K, dK = scale·dSᵀ·Q, as without a softcap) supplies the
// rest. tanh from c: no second tanh. Near |tanh| = 1 the factor is a small difference of
// numbers near 1 (absolute error ~2^-24), where it multiplies a gradient it makes negligible.
__device__ __forceinline__ float softcap_grad(float capped, float inv_softcap) {
    const float t = capped * inv_softcap;
    return fmaf(-t, t, 1.f);
}

// ALiBi (FC_ALIBI): score (row, key) gains -slope · |row + offset - key|, its distance from the
// row's bottom-right-aligned diagonal (offset = Sk - Sq of the sequence, as KeyMask's), added
// after the softcap and before the softmax, on every key block (not only the masked ones).
// The slope is in the units of the scores the kernel holds (alibi_of). Under a causal mask the
// visible keys are left of the diagonal, where this is flash_attn's causal bias up to a
// constant per row (flash_attn adds slope · key): the same softmax, an LSE that differs by that
// constant (here the LSE is the one of the scores with this bias, causal or not).
struct AlibiBias {
    float slope;
    int offset;
    __device__ __forceinline__ float operator()(int row, int key) const { return at(distance(row, key)); }
    // Row (row + offset) minus key, as a float: exact below 2^24. A kernel takes it once for a
    // fragment's first score and adds the constant offsets of the others (one FADD a score,
    // no integer work or conversion, one register live across the tile).
    __device__ __forceinline__ float distance(int row, int key) const { return static_cast<float>(row + offset - key); }
    // The bias at a (row, key) distance from the diagonal.
    __device__ __forceinline__ float at(float distance) const { return -slope * fabsf(distance); }
};
// The bias of (sequence `batch`, query head `head`), a sequence of seqlen_q queries over
// seqlen_k keys. Params: FwdParams or BwdParams.
template <class Params>
__device__ __forceinline__ AlibiBias alibi_of(const Params& p, int batch, int head, int seqlen_q, int seqlen_k) {
    return AlibiBias{p.alibi_slopes[static_cast<long long>(batch) * p.alibi_batch_stride + head] * p.alibi_scale, seqlen_k - seqlen_q};
}

}  // namespace fc
