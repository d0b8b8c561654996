// Global-memory atomics and fences (device scope).
#pragma once
#include "common/types.cuh"

namespace fc {
namespace atomic {

// Returns the old value.
__device__ __forceinline__ u32 add(u32* addr, u32 value) {
    u32 old;
    asm volatile("atom.relaxed.gpu.global.add.u32 %0, [%1], %2;\n" : "=r"(old) : "l"(addr), "r"(value) : "memory");
    return old;
}

// A load that bypasses L1 (cached in L2 only), for data other SMs wrote during this launch:
// L1 is not coherent across SMs.
__device__ __forceinline__ float load_l2(const float* addr) {
    float v;
    asm volatile("ld.global.cg.f32 %0, [%1];\n" : "=f"(v) : "l"(addr) : "memory");
    return v;
}

// Orders this thread's earlier memory operations before its later ones, for every thread
// on the GPU.
__device__ __forceinline__ void fence_gpu() { asm volatile("fence.acq_rel.gpu;\n" ::: "memory"); }

}  // namespace atomic
}  // namespace fc
