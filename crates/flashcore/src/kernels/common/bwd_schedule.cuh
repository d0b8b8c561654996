// The schedule of the Hopper backward (kernels/bwd_sm90.cu): which query blocks a CTA (one
// key block of one KV head) visits, in which order, and, in deterministic mode, the order in
// which the key blocks add to each query block's dQ. kBlockM query rows a step, kBlockN keys
// a CTA, bottom-right causal mask when kCausal, a sliding window when kLocal (common/mask.cuh),
// each sequence of a packed batch on its own lengths when kVarlen (common/sequence.cuh).
#pragma once
#include "common/bwd_params.cuh"
#include "common/mask.cuh"
#include "common/sequence.cuh"
#include "common/types.cuh"

namespace fc {
namespace sm90 {

template <int kBlockM, int kBlockN, bool kCausal, bool kLocal, bool kVarlen> struct BwdSchedule {
    using Mask = KeyMask<kCausal, kLocal>;
    static __device__ __forceinline__ int ceil_div(int a, int b) { return (a + b - 1) / b; }

    // The CTA's sequence (batch entry blockIdx.z): packed, its offsets and own lengths; else
    // offsets 0 and p's lengths (constants the compiler reads from the parameters).
    static __device__ __forceinline__ Sequence sequence_of(const BwdParams& p) { return sequence<kVarlen>(p, blockIdx.z); }
    static __device__ __forceinline__ Mask mask(const BwdParams& p, const Sequence& s) {
        return Mask(p, s.seqlen_q, s.seqlen_k);
    }

    // The query blocks one CTA visits: every query head of its KV head, each over the query
    // blocks whose rows see the CTA's keys, blocks = [begin, end) (causal: from the first whose
    // rows see the CTA's first key, to m_blocks; with a window, KeyMask::query_blocks, whose
    // full range says which need the mask), starting at m_start and wrapping round. Without the mask,
    // and when all key blocks of a head fit on the GPU at once (p.spread_walks), the CTAs of a
    // head start spread over the query blocks (m_start = n · m_blocks / n_blocks for key block
    // n), so that at any time they add dQ to different query blocks; in deterministic mode this
    // is also the order in which they come to each query block (dq_order), in which a key block
    // may wait for any other of its head. Otherwise (and causal, and with a window) from
    // blocks.begin up, and a key block waits only for the key blocks right of it, which start
    // first.
    struct Walk {
        int group, m_blocks, m_start, steps;
        QueryBlocks blocks;  // without a window only begin and end are set
    };
    static __device__ __forceinline__ int key_blocks(const Sequence& s) { return ceil_div(s.seqlen_k, kBlockN); }
    // This CTA's key block. Deterministic: the last first. CTAs start in block order, and a CTA
    // waits (dq_order) only for CTAs of later key blocks, which then start first, or, with
    // spread walks, for any CTA of its head, all of which then fit on the GPU at once (one CTA an
    // SM): so every CTA waited for can start.
    static __device__ __forceinline__ int key_block(const BwdParams& p) {
        return p.deterministic ? static_cast<int>(gridDim.x - 1 - blockIdx.x) : static_cast<int>(blockIdx.x);
    }
    static __device__ __forceinline__ Walk walk(const BwdParams& p, const Sequence& s) {
        Walk w;
        w.group = p.heads_q / p.heads_kv;
        w.m_blocks = ceil_div(s.seqlen_q, kBlockM);
        const int n = key_block(p), n0 = n * kBlockN, offset = s.seqlen_k - s.seqlen_q;
        if (kLocal) {
            w.blocks = mask(p, s).query_blocks(n0, n0 + kBlockN, kBlockM);
        } else {
            w.blocks.begin = kCausal ? min(w.m_blocks, max(0, n0 - offset) / kBlockM) : 0;
            w.blocks.end = w.m_blocks;
            w.blocks.full_begin = w.blocks.full_end = 0;  // unused: the consumers test the causal mask themselves
        }
        const bool from_begin = kCausal || kLocal || !p.spread_walks;
        w.m_start = from_begin ? w.blocks.begin : static_cast<int>(static_cast<i64>(n) * w.m_blocks / key_blocks(s));
        w.steps = w.group * (w.blocks.end - w.blocks.begin);
        return w;
    }
    // A position in the walk: query head, query block, that block's index (query_block: dQ's
    // accumulator tile, the statistics' block), and the blocks of this head still to visit;
    // moved by increments (no division per step): after a head's blocks the walk is back at
    // m_start, and the next head's blocks lie head_blocks further on.
    struct Cursor {
        int head, m_block, block, left;

        __device__ __forceinline__ void advance(const BwdParams& p, const Walk& w) {
            ++block;
            if (++m_block == w.blocks.end) {
                m_block = w.blocks.begin;
                block -= w.blocks.end - w.blocks.begin;
            }
            if (--left == 0) {
                ++head;
                block += head_blocks(p, w);
                left = w.blocks.end - w.blocks.begin;
            }
        }
    };
    static __device__ __forceinline__ Cursor walk_start(const BwdParams& p, const Sequence& s, const Walk& w) {
        const int head = static_cast<int>(blockIdx.y) * w.group;
        return Cursor{head, w.m_start, static_cast<int>(query_block(p, s, blockIdx.z, head, w.m_start)), w.blocks.end - w.blocks.begin};
    }

    // How many key blocks add to query block `m_block`'s dQ before this CTA's in deterministic
    // mode: the order in which they come to it (see Walk). Causal: the key blocks that add are
    // 0 .. n_last, the last one its rows see, in descending order; with a window, n_first ..
    // n_last likewise (query_blocks is exact: every key block from the first to the last one
    // the rows see visits the query block, and no other). Otherwise all n_blocks: with
    // spread walks in descending order from n_first, the last whose walk starts at or before
    // the query block, round to n_first + 1; else in descending order from the last.
    static __device__ __forceinline__ int dq_order(const BwdParams& p, const Sequence& s, const Walk& w, int m_block) {
        const int n_blocks = key_blocks(s), n = key_block(p);
        if (kLocal) {
            const int last_row = min((m_block + 1) * kBlockM, s.seqlen_q) - 1;
            return mask(p, s).last(last_row) / kBlockN - n;  // last() is at most Sk - 1
        }
        if (kCausal) {
            const int last_row = min((m_block + 1) * kBlockM, s.seqlen_q) - 1;
            return min(n_blocks - 1, (last_row + s.seqlen_k - s.seqlen_q) / kBlockN) - n;
        }
        if (!p.spread_walks) return n_blocks - 1 - n;
        const int n_first = min(n_blocks - 1, ceil_div((m_block + 1) * n_blocks, w.m_blocks) - 1);
        return (n_first - n + n_blocks) % n_blocks;
    }

    // Query blocks of dQ's accumulator, the statistics and the deterministic counters, by
    // (head, sequence): dense, head_blocks = m_blocks per (batch, head), (batch · Hq + head) ·
    // m_blocks + m_block. Packed (FlashAttention-3's layout), per head (total_q + B · kBlockM) /
    // kBlockM blocks, in which sequence b starts at block (q_start + b · kBlockM) / kBlockM:
    // each sequence padded to whole query blocks (a block's rows past its sequence are the next
    // sequence's in q, but have their own place here), and room for every sequence's padding
    // even with clamped offsets (see sequence()).
    static __device__ __forceinline__ int head_blocks(const BwdParams& p, const Walk& w) {
        return kVarlen ? (p.total_q + p.batch * kBlockM) / kBlockM : w.m_blocks;
    }
    static __device__ __forceinline__ i64 query_block(const BwdParams& p, const Sequence& s, int batch, int head, int m_block) {
        if (kVarlen) return static_cast<i64>(head) * ((p.total_q + p.batch * kBlockM) / kBlockM) + (s.q_start + batch * kBlockM) / kBlockM + m_block;
        return (static_cast<i64>(batch) * p.heads_q + head) * ceil_div(p.seqlen_q, kBlockM) + m_block;
    }
    // Rows of all of them (kBlockM a block).
    static __device__ __forceinline__ i64 padded_rows(const BwdParams& p) {
        const i64 blocks = kVarlen ? static_cast<i64>(p.heads_q) * ((p.total_q + p.batch * kBlockM) / kBlockM)
                                   : static_cast<i64>(p.batch) * p.heads_q * ceil_div(p.seqlen_q, kBlockM);
        return blocks * kBlockM;
    }
    // The per-row statistics of fc_bwd_sm90_prep, by query block (query_block): D_i of its
    // kBlockM rows, then their lse·log2e (one bulk load).
    static __device__ __forceinline__ float* block_stats(const BwdParams& p, i64 block) { return p.dsum + block * 2 * kBlockM; }
};

}  // namespace sm90
}  // namespace fc
