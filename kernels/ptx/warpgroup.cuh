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

// `v` as lane 0 has it: ptxas then knows the value is warp-uniform, so what it bounds (loop
// counts, pipeline stages, shared-memory addresses) can live in uniform registers, which
// wgmma descriptors need, instead of per-thread ones moved over with R2UR.
__device__ __forceinline__ int warp_uniform(int v) { return __shfl_sync(0xffffffffu, v, 0); }

// This thread's warpgroup, made warp-uniform so that role branches do not diverge.
__device__ __forceinline__ int index() { return warp_uniform(static_cast<int>(threadIdx.x) / kThreads); }

// The same, read afresh (volatile) rather than shared with an earlier index(): a role
// calls it after setmaxnreg, so that no value is carried across the register
// reallocation, where it must fit the entry budget and ptxas may spill it instead.
__device__ __forceinline__ int index_in_role() {
    u32 tid;
    asm volatile("mov.u32 %0, %%tid.x;\n" : "=r"(tid));
    return warp_uniform(static_cast<int>(tid) / kThreads);
}

}  // namespace warpgroup
}  // namespace fc
