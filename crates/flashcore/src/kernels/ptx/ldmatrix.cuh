// ldmatrix (sm_75+): a warp loads 8x8 matrices of 16-bit elements from shared memory into
// mma fragments. Lane 8i + r gives the address of row r of matrix i (16 contiguous bytes);
// each lane receives, per matrix, the pair at (row lane/4, cols 2(lane%4)..+1), or with
// .trans the pair at (rows 2(lane%4)..+1, col lane/4). The 8 row addresses of a matrix
// are read in one shared-memory wavefront when they fall in 8 distinct 16-byte bank
// groups (see common/swizzle.cuh).
#pragma once
#include "common/types.cuh"

namespace fc {
namespace ldmatrix {

__device__ __forceinline__ void x4(u32 (&r)[4], u32 addr) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(addr));
}

// The same at addr + kOffset, the offset an immediate of the instruction (ptxas otherwise
// may keep one register per offset live across a loop).
template <int kOffset> __device__ __forceinline__ void x4(u32 (&r)[4], u32 addr) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4+%5];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(addr), "n"(kOffset));
}

__device__ __forceinline__ void x4_trans(u32 (&r)[4], u32 addr) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(addr));
}

}  // namespace ldmatrix

// stmatrix (sm_90+): the converse, a warp stores four 8x8 matrices of 16-bit elements, each
// lane giving the pair at (row lane/4, cols 2(lane%4)..+1) of matrix i in r[i] (an mma
// accumulator's fragment, packed) and lane 8i + r the address of row r of matrix i.
namespace stmatrix {

__device__ __forceinline__ void x4(u32 addr, u32 r0, u32 r1, u32 r2, u32 r3) {
    asm volatile("stmatrix.sync.aligned.m8n8.x4.shared.b16 [%0], {%1,%2,%3,%4};\n" ::"r"(addr), "r"(r0), "r"(r1), "r"(r2), "r"(r3)
                 : "memory");
}

}  // namespace stmatrix
}  // namespace fc
