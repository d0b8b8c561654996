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

// threadIdx.x read afresh (volatile): what is derived from it is computed where it is used,
// not hoisted and kept live (across setmaxnreg, where it must fit the entry budget, or
// across a loop short of registers), where ptxas may spill it instead. index_in_role() is
// the warpgroup from it: a role calls it after setmaxnreg.
__device__ __forceinline__ u32 fresh_thread_index() {
    u32 tid;
    asm volatile("mov.u32 %0, %%tid.x;\n" : "=r"(tid));
    return tid;
}
__device__ __forceinline__ int index_in_role() { return warp_uniform(static_cast<int>(fresh_thread_index()) / kThreads); }

}  // namespace warpgroup
}  // namespace fc
