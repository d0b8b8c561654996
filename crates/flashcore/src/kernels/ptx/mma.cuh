// Warp-level matrix product mma.sync.m16n8k16 (sm_80+): D[16x8] += A[16x16] · B[16x8] with
// 16-bit inputs and f32 accumulators, all operands in registers.
//
// Fragment layout, lane = 4g + t (g = lane / 4, t = lane % 4):
//   A (row-major, 4 regs of 2 halves): a0 (row g,   k 2t..2t+1)  a1 (row g+8, k 2t..2t+1)
//                                      a2 (row g,   k 2t+8..+9)  a3 (row g+8, k 2t+8..+9)
//   B ("col", 2 regs):                 b0 (k 2t..2t+1, col g)    b1 (k 2t+8..+9, col g)
//   C/D (4 f32):                       d0,d1 (row g, cols 2t, 2t+1)  d2,d3 (row g+8, same)
// so the accumulators of two adjacent n-tiles, packed in pairs, are the A operand of the
// next product (how P is fed to P·V without leaving registers).
#pragma once
#include "common/types.cuh"

namespace fc {
namespace mma {

__device__ __forceinline__ void m16n8k16(f16, float (&d)[4], const u32 (&a)[4], u32 b0, u32 b1) {
    asm(
        "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
        "{%0,%1,%2,%3};\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

__device__ __forceinline__ void m16n8k16(bf16, float (&d)[4], const u32 (&a)[4], u32 b0, u32 b1) {
    asm(
        "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
        "{%0,%1,%2,%3};\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// d += a · b for the compile-time element type T (f16 or bf16).
template <typename T>
__device__ __forceinline__ void m16n8k16(float (&d)[4], const u32 (&a)[4], u32 b0, u32 b1) {
    m16n8k16(T{}, d, a, b0, b1);
}

}  // namespace mma
}  // namespace fc
