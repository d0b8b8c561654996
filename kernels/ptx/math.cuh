// Special-function unit (MUFU) approximations. ex2.approx is one MUFU.EX2 instruction
// (relative error ~2^-22); .ftz flushes subnormal results to 0. ex2(-inf) = +0.
#pragma once

namespace fc {
namespace math {

__device__ __forceinline__ float ex2(float x) {
    float y;
    asm("ex2.approx.ftz.f32 %0, %1;\n" : "=f"(y) : "f"(x));
    return y;
}

__device__ __forceinline__ float lg2(float x) {
    float y;
    asm("lg2.approx.ftz.f32 %0, %1;\n" : "=f"(y) : "f"(x));
    return y;
}

// 1/x to within 1 ulp, without the IEEE-division slow-path call (its calling convention
// costs registers in a kernel already at the limit).
__device__ __forceinline__ float rcp(float x) {
    float y;
    asm("rcp.approx.ftz.f32 %0, %1;\n" : "=f"(y) : "f"(x));
    return y;
}

__device__ __forceinline__ float neg_inf() { return __int_as_float(0xff800000u); }
__device__ __forceinline__ float inf() { return __int_as_float(0x7f800000u); }

}  // namespace math
}  // namespace fc
