// Programmatic dependent launch (griddepcontrol, sm_90+): a kernel launched after this one
// with programmatic stream serialization may start before this one ends, and waits inside
// for it. Both are no-ops before sm_90, where the host launches dependents normally.
#pragma once

namespace fc {
namespace griddep {

// Lets the dependent grid launch once every CTA of this grid has called this or exited.
__device__ __forceinline__ void launch_dependents() {
#if __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.launch_dependents;\n" ::: "memory");
#endif
}

// Blocks until the grid this one depends on has completed and its writes are visible.
__device__ __forceinline__ void wait() {
#if __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.wait;\n" ::: "memory");
#endif
}

}  // namespace griddep
}  // namespace fc
