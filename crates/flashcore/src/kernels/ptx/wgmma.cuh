// Warpgroup matrix products (sm_90a): shared-memory descriptors and the async-group
// protocol. The instructions themselves (Mma<N>::ss / ::rs) are in wgmma_ops.cuh.
//
// Protocol, per warpgroup: fence_operands(acc); fence(); Mma...; commit_group();
// ...other work...; wait<N>(); fence_operands(acc). The empty-asm operand fences keep the
// compiler from moving reads or writes of accumulator registers across the asynchronous
// window, which it cannot see.
#pragma once
#include "common/types.cuh"
#include "ptx/wgmma_ops.cuh"

namespace fc {
namespace wgmma {

// Matrix descriptor for a tile stored with the 128-byte swizzle (the layout TMA writes with
// CU_TENSOR_MAP_SWIZZLE_128B). Bits: [0,14) start >> 4, [16,30) leading byte offset >> 4,
// [32,46) stride byte offset >> 4, [62,64) swizzle mode (1 = 128B). The tile base must be
// 1024-byte aligned (the swizzle pattern's period), so the base-offset field stays 0.
// K-major: sbo = 1024 (next 8-row group); lbo unused. MN-major: lbo = next 64-wide panel
// along N, sbo = 1024 (next 8 rows along K).
__device__ __forceinline__ u64 desc_sw128(u32 smem_addr, u32 lbo_bytes, u32 sbo_bytes) {
    return static_cast<u64>((smem_addr & 0x3FFFF) >> 4) |
           (static_cast<u64>(lbo_bytes >> 4) << 16) |
           (static_cast<u64>(sbo_bytes >> 4) << 32) |
           (1ull << 62);
}

__device__ __forceinline__ void fence() { asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory"); }

__device__ __forceinline__ void commit_group() {
    asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory");
}

// Waits until at most N committed groups of this warpgroup are still in flight. kSite only
// tags the instruction (a PTX comment), so that two waits in the two arms of a branch are
// not identical and the compiler does not merge them into one wait above the branch.
template <int N, int kSite = 0> __device__ __forceinline__ void wait() {
    asm volatile("wgmma.wait_group.sync.aligned %0; // site %1\n" ::"n"(N), "n"(kSite) : "memory");
}

template <int R> __device__ __forceinline__ void fence_operands(float (&r)[R]) {
#pragma unroll
    for (int i = 0; i < R; ++i) asm volatile("" : "+f"(r[i])::"memory");
}
template <int R> __device__ __forceinline__ void fence_operands(u32 (&r)[R]) {
#pragma unroll
    for (int i = 0; i < R; ++i) asm volatile("" : "+r"(r[i])::"memory");
}

}  // namespace wgmma
}  // namespace fc
