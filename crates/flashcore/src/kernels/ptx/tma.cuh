// Tensor memory accelerator (cp.async.bulk.tensor, sm_90): tile copies between global
// memory, described by a tensor map the host encodes, and shared memory. Loads complete
// on an mbarrier (complete_tx counts the box's bytes, zero-filled out-of-bounds parts
// included); stores complete in bulk groups and clip at the tensor's edges.
#pragma once
#include "common/types.cuh"

namespace fc {

// Bit-compatible with the driver's CUtensorMap (128 opaque bytes, 64-byte aligned);
// named apart from it so that files which do see cuda.h compile too.
struct alignas(64) TmaDescriptor {
    u64 opaque[16];
};

namespace tma {

__device__ __forceinline__ void prefetch_descriptor(const TmaDescriptor* map) {
    asm volatile("prefetch.tensormap [%0];\n" ::"l"(map) : "memory");
}

__device__ __forceinline__ void load_2d(u32 smem_dst, const TmaDescriptor* map, u32 mbar, int c0, int c1) {
    asm volatile(
        "cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes"
        " [%0], [%1, {%2, %3}], [%4];\n"
        ::"r"(smem_dst), "l"(map), "r"(c0), "r"(c1), "r"(mbar) : "memory");
}

__device__ __forceinline__ void load_3d(u32 smem_dst, const TmaDescriptor* map, u32 mbar, int c0, int c1, int c2) {
    asm volatile(
        "cp.async.bulk.tensor.3d.shared::cluster.global.mbarrier::complete_tx::bytes"
        " [%0], [%1, {%2, %3, %4}], [%5];\n"
        ::"r"(smem_dst), "l"(map), "r"(c0), "r"(c1), "r"(c2), "r"(mbar) : "memory");
}

__device__ __forceinline__ void load_4d(u32 smem_dst, const TmaDescriptor* map, u32 mbar,
                                        int c0, int c1, int c2, int c3) {
    asm volatile(
        "cp.async.bulk.tensor.4d.shared::cluster.global.mbarrier::complete_tx::bytes"
        " [%0], [%1, {%2, %3, %4, %5}], [%6];\n"
        ::"r"(smem_dst), "l"(map), "r"(c0), "r"(c1), "r"(c2), "r"(c3), "r"(mbar) : "memory");
}

// A plain (untiled) copy of `bytes` contiguous bytes, both addresses 16-byte aligned and
// bytes a multiple of 16; completes on `mbar` like the tensor loads.
__device__ __forceinline__ void load_bulk(u32 smem_dst, const void* src, u32 bytes, u32 mbar) {
    asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];\n"
                 ::"r"(smem_dst), "l"(src), "r"(bytes), "r"(mbar) : "memory");
}

// dst[i] += src[i] for `bytes` / 4 f32 values (the L2 adds, element by element atomically),
// both addresses 16-byte aligned, bytes a multiple of 16. Issued into the bulk group.
__device__ __forceinline__ void reduce_add_bulk(float* dst, u32 smem_src, u32 bytes) {
    asm volatile("cp.reduce.async.bulk.global.shared::cta.bulk_group.add.f32 [%0], [%1], %2;\n"
                 ::"l"(dst), "r"(smem_src), "r"(bytes) : "memory");
}

__device__ __forceinline__ void store_4d(const TmaDescriptor* map, u32 smem_src, int c0, int c1, int c2, int c3) {
    asm volatile(
        "cp.async.bulk.tensor.4d.global.shared::cta.bulk_group [%0, {%2, %3, %4, %5}], [%1];\n"
        ::"l"(map), "r"(smem_src), "r"(c0), "r"(c1), "r"(c2), "r"(c3) : "memory");
}

// Orders this thread's earlier generic-proxy writes to shared memory before later
// async-proxy reads of it (a TMA store of a tile the threads just wrote).
__device__ __forceinline__ void fence_proxy_async_shared() { asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory"); }

// Orders global-memory accesses between the generic proxy (loads, stores, atomics) and the
// async proxy (bulk copies and reductions) of this thread.
__device__ __forceinline__ void fence_proxy_async_global() { asm volatile("fence.proxy.async.global;\n" ::: "memory"); }

__device__ __forceinline__ void store_commit_group() { asm volatile("cp.async.bulk.commit_group;\n" ::: "memory"); }

// Waits until the stores' shared-memory reads are done (the buffer may be reused).
__device__ __forceinline__ void store_wait_read() { asm volatile("cp.async.bulk.wait_group.read 0;\n" ::: "memory"); }

// Waits until the stores (and reductions) have completed, their writes made.
__device__ __forceinline__ void store_wait_all() { asm volatile("cp.async.bulk.wait_group 0;\n" ::: "memory"); }

}  // namespace tma
}  // namespace fc
