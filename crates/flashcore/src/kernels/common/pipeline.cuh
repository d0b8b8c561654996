// Position in a ring of shared-memory stages: which stage, and which parity of that stage's
// barriers to wait on. Producer and consumer each keep one and advance it in step; the
// producer waits on "empty" with the opposite parity (a fresh barrier counts as having
// completed the phase before phase 0, so the first pass over the ring does not block).
#pragma once
#include "common/types.cuh"

namespace fc {

// Stage and phase in two registers: nothing to compute per use (the consumers' form).
template <int kStages> struct PipelineState {
    int stage_ = 0;
    u32 phase = 0;

    __device__ __forceinline__ void advance() {
        if (++stage_ == kStages) {
            stage_ = 0;
            phase ^= 1;
        }
    }
    __device__ __forceinline__ int stage() const { return stage_; }
    __device__ __forceinline__ u32 full_parity() const { return phase; }
    __device__ __forceinline__ u32 empty_parity() const { return phase ^ 1; }
};

// The same position as one count of stages passed: one register instead of two, for the
// producer's 24-register budget; stage and parity cost a shift and a mask per use (a
// multiply-high for a ring that is not a power of two).
template <int kStages> struct PipelineCounter {
    u32 count = 0;

    __device__ __forceinline__ void advance() { ++count; }
    __device__ __forceinline__ int stage() const { return static_cast<int>(count % kStages); }
    __device__ __forceinline__ u32 full_parity() const { return (count / kStages) & 1; }
    __device__ __forceinline__ u32 empty_parity() const { return full_parity() ^ 1; }
};

}  // namespace fc
