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

// *addr += value, no result (a reduction: the memory system adds, the thread goes on). No
// memory clobber: it orders nothing else; callers that read the sum synchronise otherwise.
__device__ __forceinline__ void red_add(float* addr, float value) {
    asm volatile("red.relaxed.gpu.global.add.f32 [%0], %1;\n" ::"l"(addr), "f"(value));
}

// addr[0] += a, addr[1] += b (addr 8-byte aligned): one vector reduction on sm_90 (half
// the instructions, and whole 32-byte sectors when the lanes cover them), two before.
__device__ __forceinline__ void red_add2(float* addr, float a, float b) {
#if __CUDA_ARCH__ >= 900
    asm volatile("red.relaxed.gpu.global.add.v2.f32 [%0], {%1, %2};\n" ::"l"(addr), "f"(a), "f"(b));
#else
    red_add(addr, a);
    red_add(addr + 1, b);
#endif
}

// addr[0..3] += v[0..3] (addr 16-byte aligned): one vector reduction on sm_90, else four.
__device__ __forceinline__ void red_add4(float* addr, const float (&v)[4]) {
#if __CUDA_ARCH__ >= 900
    asm volatile("red.relaxed.gpu.global.add.v4.f32 [%0], {%1, %2, %3, %4};\n" ::"l"(addr), "f"(v[0]), "f"(v[1]), "f"(v[2]), "f"(v[3]));
#else
    for (int i = 0; i < 4; ++i) red_add(addr + i, v[i]);
#endif
}

// red_add4 where `pred` holds: the reduction predicated in place, rather than branched
// around (a branch, a convergence barrier and its sync each on sm_90).
__device__ __forceinline__ void red_add4_if(bool pred, float* addr, const float (&v)[4]) {
#if __CUDA_ARCH__ >= 900
    asm volatile(
        "{\n\t.reg .pred p;\n\tsetp.ne.b32 p, %5, 0;\n\t@p red.relaxed.gpu.global.add.v4.f32 [%0], {%1, %2, %3, %4};\n\t}" ::"l"(addr),
        "f"(v[0]), "f"(v[1]), "f"(v[2]), "f"(v[3]), "r"(static_cast<int>(pred)));
#else
    if (pred) red_add4(addr, v);
#endif
}

// *addr, with acquire semantics at GPU scope: what the releasing thread wrote before its
// release (red_release_add) is visible after this load sees the released value.
__device__ __forceinline__ u32 load_acquire(const u32* addr) {
    u32 v;
    asm volatile("ld.acquire.gpu.global.u32 %0, [%1];\n" : "=r"(v) : "l"(addr) : "memory");
    return v;
}

// *addr += value with release semantics at GPU scope (see load_acquire).
__device__ __forceinline__ void red_release_add(u32* addr, u32 value) {
    asm volatile("red.release.gpu.global.add.u32 [%0], %1;\n" ::"l"(addr), "r"(value) : "memory");
}

// Orders this thread's earlier memory operations before its later ones, for every thread
// on the GPU.
__device__ __forceinline__ void fence_gpu() { asm volatile("fence.acq_rel.gpu;\n" ::: "memory"); }

}  // namespace atomic
}  // namespace fc
