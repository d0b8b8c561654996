// The paged KV cache (FC_PAGED; see FwdParams): where key j of sequence b lies in the K and V
// pools, each sequence's key count, and the append pre-pass that writes new keys there.
//
// Keys are located by groups of kGroupKeys: page sizes are multiples of 16 and key tiles start
// at multiples of 16, so a group never straddles two pages, and one table lookup serves its
// 16 rows. The pool row of key j is j + row_delta(group of j): the page's first row minus the
// first key the page holds. With no block table (a contiguous cache) the delta is 0 and the
// rows are the batch-strided cache's own.
#pragma once

#include "common/params.cuh"
#include "common/sequence.cuh"
#include "common/types.cuh"
#include "ptx/griddep.cuh"

#ifndef FC_PAGED
#define FC_PAGED 0
#endif

namespace fc {
namespace paged {

constexpr int kGroupKeys = 16;

// Sequence `batch`'s cached keys (cache_seqlens) before this call's appended ones, clamped to
// the capacity.
__device__ __forceinline__ int cached_keys(const FwdParams& p, int batch) {
    return p.seqused_k != nullptr ? clamp_to(p.seqused_k[batch], 0, p.seqlen_k) : p.seqlen_k;
}

// Sequence `batch` of a paged (or contiguous-cache) problem: dense queries, and the cached
// keys plus the appended ones, at most the capacity.
__device__ __forceinline__ Sequence sequence(const FwdParams& p, int batch) {
    return Sequence{0, 0, p.seqlen_q, min(cached_keys(p, batch) + p.new_keys, p.seqlen_k)};
}

// Sequence `batch` of packed queries over a paged cache (FC_VARLEN with FC_PAGED, flash_attn's
// varlen call with a block table): its queries a packed batch's (cu_seqlens_q, clamped to
// total_q and the longest), its keys its cache's cached ones (seqused_k; none appended), from
// key 0 of its table row.
__device__ __forceinline__ Sequence packed_sequence(const FwdParams& p, int batch) {
    Sequence s;
    s.q_start = clamp_to(p.cu_seqlens_q[batch], 0, p.total_q);
    s.seqlen_q = min(clamp_to(p.cu_seqlens_q[batch + 1], s.q_start, p.total_q) - s.q_start, p.seqlen_q);
    s.k_start = 0;
    s.seqlen_k = cached_keys(p, batch);
    return s;
}

// Pool row of key `key` of sequence `batch` minus `key`, for the kGroupKeys keys of its
// group. Slot and page are clamped to the table's columns and to the pool: a bad entry reads
// (or, appending, writes) a wrong page, never outside the pool.
__device__ __forceinline__ int row_delta(const FwdParams& p, int batch, int key) {
    if (p.block_table == nullptr) return 0;
    const int slot = clamp_to(key / p.page_size, 0, p.max_pages - 1);
    const int page = clamp_to(__ldg(p.block_table + batch * p.block_table_stride + slot), 0, p.num_pages - 1);
    return page * p.page_rows - slot * p.page_size;
}

}  // namespace paged
}  // namespace fc

#if FC_PAGED
// Appends k_new, v_new [B, new_keys, Hkv, D] to the caches at positions cached_keys(b) ...
// (through the block table), one 16-byte chunk a thread; positions past the capacity are
// dropped. Grid (ceil(B * new_keys * Hkv * D / 8 / 128)), block 128 threads. Lets the
// attention kernel, launched after it as a programmatic dependent on sm_90+, start at once:
// that kernel waits (griddep::wait) before it reads a key.
extern "C" __global__ void __launch_bounds__(128) fc_paged_append(const FwdParams p) {
    using namespace fc;
    griddep::launch_dependents();
    const int chunks = p.head_dim / 8;
    const long long id = static_cast<long long>(blockIdx.x) * blockDim.x + threadIdx.x;
    if (id >= static_cast<long long>(p.batch) * p.new_keys * p.heads_kv * chunks) return;
    const int c = static_cast<int>(id % chunks);
    const int h = static_cast<int>(id / chunks % p.heads_kv);
    const int j = static_cast<int>(id / chunks / p.heads_kv % p.new_keys);
    const int b = static_cast<int>(id / chunks / p.heads_kv / p.new_keys);
    const int key = paged::cached_keys(p, b) + j;
    if (key >= p.seqlen_k) return;
    const long long row = key + paged::row_delta(p, b, key);
    const long long dst_k = b * p.k_stride_b + row * p.k_stride_s + h * p.k_stride_h + 8 * c;
    const long long dst_v = b * p.v_stride_b + row * p.v_stride_s + h * p.v_stride_h + 8 * c;
    const long long src_k = b * p.knew_stride_b + j * p.knew_stride_s + h * p.knew_stride_h + 8 * c;
    const long long src_v = b * p.vnew_stride_b + j * p.vnew_stride_s + h * p.vnew_stride_h + 8 * c;
    // The caches are written through const pointers: FwdParams holds them as the attention
    // kernel reads them; this pre-pass is the one writer.
    *reinterpret_cast<u32x4*>(const_cast<elem_t*>(static_cast<const elem_t*>(p.k)) + dst_k) =
        *reinterpret_cast<const u32x4*>(static_cast<const elem_t*>(p.k_new) + src_k);
    *reinterpret_cast<u32x4*>(const_cast<elem_t*>(static_cast<const elem_t*>(p.v)) + dst_v) =
        *reinterpret_cast<const u32x4*>(static_cast<const elem_t*>(p.v_new) + src_v);
}
#endif
