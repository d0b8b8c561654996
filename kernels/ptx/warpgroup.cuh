// Warpgroup-scope helpers (sm_90a): register reallocation between warpgroups.
// setmaxnreg only takes effect when the kernel has a register cap at entry
// (__launch_bounds__(threads, 1)) and each role is one branch of an if/else.
#pragma once
#include "common/types.cuh"

namespace fc {
namespace warpgroup {

constexpr int kThreads = 128;

template <int kRegs> __device__ __forceinline__ void increase_registers() {
    static_assert(kRegs % 8 == 0 && kRegs >= 24 && kRegs <= 256, "setmaxnreg range");
    asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(kRegs));
}

template <int kRegs> __device__ __forceinline__ void decrease_registers() {
    static_assert(kRegs % 8 == 0 && kRegs >= 24 && kRegs <= 256, "setmaxnreg range");
    asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(kRegs));
}

// This thread's warpgroup, made warp-uniform so that role branches do not diverge.
__device__ __forceinline__ int index() {
    return __shfl_sync(0xffffffffu, static_cast<int>(threadIdx.x) / kThreads, 0);
}

}  // namespace warpgroup
}  // namespace fc
