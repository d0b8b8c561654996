// Named CTA barriers (bar.sync / bar.arrive): sub-block synchronisation between warps.
// Id 0 is __syncthreads'; `threads` counts every participant (syncers and arrivers) and
// must be a multiple of 32.
#pragma once
#include "common/types.cuh"

namespace fc {
namespace named_barrier {

__device__ __forceinline__ void sync(u32 id, u32 threads) {
    asm volatile("bar.sync %0, %1;\n" ::"r"(id), "r"(threads) : "memory");
}

// Signals without waiting: lets another warp's sync on `id` proceed.
__device__ __forceinline__ void arrive(u32 id, u32 threads) {
    asm volatile("bar.arrive %0, %1;\n" ::"r"(id), "r"(threads) : "memory");
}

}  // namespace named_barrier
}  // namespace fc
