// cp.async (sm_80+): asynchronous 16-byte global -> shared copies, tracked per thread in
// commit groups. A copy with src-size 0 reads nothing and zero-fills its 16 bytes: how
// tiles are predicated at the end of a sequence without a branch around the copy.
#pragma once
#include "common/types.cuh"

namespace fc {
namespace cp_async {

// 16 bytes, cached in L2 only (.cg: K and V tiles are reread by other CTAs, not this one).
__device__ __forceinline__ void copy16(u32 smem, const void* gmem, bool valid) {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(smem), "l"(gmem),
                 "r"(valid ? 16 : 0)
                 : "memory");
}

// 4 bytes through L1 (.ca: the only form below 16 bytes), zero-filled when !valid: the
// per-row statistics, whose rows need not be 16-byte aligned.
__device__ __forceinline__ void copy4(u32 smem, const void* gmem, bool valid) {
    asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;\n" ::"r"(smem), "l"(gmem),
                 "r"(valid ? 4 : 0)
                 : "memory");
}

// Closes the group of copies issued since the last commit (an empty group is fine).
__device__ __forceinline__ void commit() { asm volatile("cp.async.commit_group;\n" ::: "memory"); }

// Blocks until at most N of this thread's groups are still in flight.
template <int N> __device__ __forceinline__ void wait() {
    asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory");
}

}  // namespace cp_async
}  // namespace fc
