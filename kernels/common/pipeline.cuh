// Position in a ring of shared-memory stages: which stage, and which parity of that stage's
// barriers to wait on. Producer and consumer each keep one and advance it in step; the
// producer waits on "empty" with the opposite parity (a fresh barrier counts as having
// completed the phase before phase 0, so the first pass over the ring does not block).
#pragma once
#include "common/types.cuh"

namespace fc {

template <int kStages> struct PipelineState {
    int stage = 0;
    u32 phase = 0;

    __device__ __forceinline__ void advance() {
        if (++stage == kStages) {
            stage = 0;
            phase ^= 1;
        }
    }
    __device__ __forceinline__ u32 full_parity() const { return phase; }
    __device__ __forceinline__ u32 empty_parity() const { return phase ^ 1; }
};

}  // namespace fc
