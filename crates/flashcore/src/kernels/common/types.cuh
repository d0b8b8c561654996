// Numeric storage types without CUDA headers: fp16 and bf16 are 16-bit payloads, and
// conversions go through single PTX instructions (sm_80+).
#pragma once

namespace fc {

typedef unsigned short u16;
typedef unsigned int u32;
typedef unsigned long long u64;
typedef long long i64;

struct f16 { u16 bits; };
struct bf16 { u16 bits; };

// 16-byte vector, the unit of every coalesced global load and store.
struct alignas(16) u32x4 { u32 x, y, z, w; };

__device__ __forceinline__ float to_float(f16 h) {
    float f;
    asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(h.bits));
    return f;
}
__device__ __forceinline__ float to_float(bf16 h) {
    return __uint_as_float(static_cast<u32>(h.bits) << 16);
}

template <typename T> __device__ __forceinline__ T from_float(float f);
template <> __device__ __forceinline__ f16 from_float<f16>(float f) {
    f16 h;
    asm("cvt.rn.f16.f32 %0, %1;" : "=h"(h.bits) : "f"(f));
    return h;
}
template <> __device__ __forceinline__ bf16 from_float<bf16>(float f) {
    bf16 h;
    asm("cvt.rn.bf16.f32 %0, %1;" : "=h"(h.bits) : "f"(f));
    return h;
}

// Two floats packed into one 32-bit register of two 16-bit values, `lo` in the low half:
// the operand format of mma/wgmma A fragments.
template <typename T> __device__ __forceinline__ u32 pack2(float lo, float hi);
template <> __device__ __forceinline__ u32 pack2<f16>(float lo, float hi) {
    u32 r;
    asm("cvt.rn.f16x2.f32 %0, %1, %2;" : "=r"(r) : "f"(hi), "f"(lo));
    return r;
}
template <> __device__ __forceinline__ u32 pack2<bf16>(float lo, float hi) {
    u32 r;
    asm("cvt.rn.bf16x2.f32 %0, %1, %2;" : "=r"(r) : "f"(hi), "f"(lo));
    return r;
}

// Four floats as four e4m3 values of one 32-bit register, `a` in the low byte (the operand
// format of 8-bit wgmma A fragments), rounded to nearest and saturated to ±448 (no inf: P never
// needs one). cvt's e4m3x2 puts its first source in the upper byte.
__device__ __forceinline__ u32 pack4_e4m3(float a, float b, float c, float d) {
    u32 r;
    asm("{\n.reg .b16 lo, hi;\n"
        "cvt.rn.satfinite.e4m3x2.f32 lo, %2, %1;\n"
        "cvt.rn.satfinite.e4m3x2.f32 hi, %4, %3;\n"
        "mov.b32 %0, {lo, hi};\n}\n"
        : "=r"(r)
        : "f"(a), "f"(b), "f"(c), "f"(d));
    return r;
}

// Compile-time dtype selection: FC_DTYPE_BF16=1 picks bf16, else fp16.
#if defined(FC_DTYPE_BF16) && FC_DTYPE_BF16
typedef bf16 elem_t;
#else
typedef f16 elem_t;
#endif

// 0, 1, ..., N-1 as a parameter pack (std::make_integer_sequence without the header): a
// fold over it unrolls a loop whose index must be a constant expression.
template <int... I> struct IntSeq {};
template <int N, int... I> struct MakeIntSeq : MakeIntSeq<N - 1, N - 1, I...> {};
template <int... I> struct MakeIntSeq<0, I...> { using type = IntSeq<I...>; };

// A value as a type (std::integral_constant without the header): a generic lambda given one
// is compiled once per value, so a runtime choice picks between two specialised copies.
template <typename T, T V> struct Constant {
    static constexpr T value = V;
};

constexpr float kLog2e = 1.4426950408889634f;
constexpr float kLn2 = 0.6931471805599453f;

// The 32-bit shared-space address of a pointer into shared memory (the operand form of
// ldmatrix, cp.async and the other shared-memory PTX instructions).
__device__ __forceinline__ u32 smem_u32(const void* p) {
    u32 a;
    asm("{\n.reg .u64 t;\ncvta.to.shared.u64 t, %1;\ncvt.u32.u64 %0, t;\n}\n" : "=r"(a) : "l"(p));
    return a;
}

}  // namespace fc
