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

// 1/x on the FMA pipe, for normal x > 0: the exponent-flip first guess (relative error at
// most 0.051) and kSteps Newton steps, each squaring the error (2 steps: 6.6e-6, i.e.
// 2^-17.2, always from below; 3 steps: float rounding). It leaves the MUFU unit, 16 ops a
// clock per SM against the FMA pipe's 128, to the softmax's exponentials.
template <int kSteps> __device__ __forceinline__ float rcp_newton(float x) {
    float y = __int_as_float(0x7ef311c3 - __float_as_int(x));
#pragma unroll
    for (int i = 0; i < kSteps; ++i) y = fmaf(y, fmaf(-x, y, 1.f), y);
    return y;
}

__device__ __forceinline__ float neg_inf() { return __int_as_float(0xff800000u); }
__device__ __forceinline__ float inf() { return __int_as_float(0x7f800000u); }

}  // namespace math
}  // namespace fc
