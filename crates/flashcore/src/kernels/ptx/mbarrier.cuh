// Shared-memory transaction barriers (mbarrier, sm_90 forms). A phase completes when its
// expected arrivals have arrived and its expected transaction bytes have landed; waiters
// name the phase by its parity (0, 1, 0, ...). All addresses are shared-space (u32).
#pragma once
#include "common/types.cuh"

namespace fc {
namespace mbarrier {

__device__ __forceinline__ void init(u32 bar, u32 arrivals) {
    asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(bar), "r"(arrivals) : "memory");
}

// Makes initialised barriers visible to the async proxy (TMA) and other threads.
__device__ __forceinline__ void fence_init() { asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory"); }

__device__ __forceinline__ void arrive(u32 bar) {
    asm volatile("{\n.reg .b64 state;\nmbarrier.arrive.shared::cta.b64 state, [%0];\n}\n" ::"r"(bar) : "memory");
}

// One arrival, and `bytes` more transaction bytes expected in the current phase.
__device__ __forceinline__ void arrive_expect_tx(u32 bar, u32 bytes) {
    asm volatile("{\n.reg .b64 state;\nmbarrier.arrive.expect_tx.shared::cta.b64 state, [%0], %1;\n}\n"
                 ::"r"(bar), "r"(bytes) : "memory");
}

__device__ __forceinline__ bool try_wait(u32 bar, u32 parity) {
    u32 done;
    asm volatile(
        "{\n.reg .pred p;\nmbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\nselp.u32 %0, 1, 0, p;\n}\n"
        : "=r"(done) : "r"(bar), "r"(parity) : "memory");
    return done != 0;
}

// try_wait with a suspend-time hint: the thread may sleep up to `hint_ns` until the phase
// completes instead of returning at once (see wait_sleeping).
__device__ __forceinline__ bool try_wait_suspending(u32 bar, u32 parity, u32 hint_ns) {
    u32 done;
    asm volatile(
        "{\n.reg .pred p;\nmbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2, %3;\nselp.u32 %0, 1, 0, p;\n}\n"
        : "=r"(done) : "r"(bar), "r"(parity), "r"(hint_ns) : "memory");
    return done != 0;
}

// Blocks until the phase of this parity has completed.
__device__ __forceinline__ void wait(u32 bar, u32 parity) {
    while (!try_wait(bar, parity)) {
    }
}

// How long a sleeping wait may hold its thread, in nanoseconds (it resumes as the phase
// completes): CUTLASS's 10 ms.
constexpr u32 kSuspendTimeHintNs = 10000000;

// As wait, for a thread that waits most of the time: try_wait with a suspend-time hint puts it
// to sleep (NANOSLEEP.SYNCS) instead of returning at once to spin. bwd_sm90's dQ writer, one
// thread waiting on its consumers most of each step, spun ~660 times a step in `wait`: a fifth
// of the kernel's instructions (ncu, D64 S16k), on a scheduler it shares with two consumer
// warps. Every other wait spins: with the hint on all of them fwd_sm90's D128 full S8k row ran
// 4-8% slower in two rounds (the rest of its S2k/S8k rows within 2%), not yet explained.
__device__ __forceinline__ void wait_sleeping(u32 bar, u32 parity) {
    while (!try_wait_suspending(bar, parity, kSuspendTimeHintNs)) {
    }
}

}  // namespace mbarrier
}  // namespace fc
