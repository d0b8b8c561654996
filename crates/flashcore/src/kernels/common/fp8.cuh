// e4m3 (FP8) attention's shared pieces: the key order of P's operand and the descales.
//
// 8-bit wgmma reads both operands K-major, so O += P·V needs V with keys along its rows
// (V^T, key-contiguous); and P's registers, packed without moving values between lanes
// (sm90::to_operand_e4m3), hold a 32-key group's keys in the order permuted_key gives.
// fc_fp8_transpose_v writes V^T in that order once a call, so that the main kernel's TMA loads
// it as it loads K.
#pragma once
#include "common/params.cuh"

namespace fc {
namespace fp8 {

// Key (within its 32-key group) of P's operand column l: thread t = lane % 4 holds keys 2t,
// 2t + 1 of each 8-key chunk, packed two chunks to a register (to_operand_e4m3).
__host__ __device__ constexpr int permuted_key(int l) {
    return 16 * (l / 16) + 2 * ((l % 16) / 4) + (l % 2) + 8 * ((l % 4) / 2);
}

// The factor of q·k for (batch, kv_head): q's and k's descales (null: 1), FlashAttention-3's
// [B, Hkv] f32.
__device__ __forceinline__ float qk_descale(const FwdParams& p, int batch, int kv_head) {
    const int i = batch * p.heads_kv + kv_head;
    return (p.q_descale != nullptr ? p.q_descale[i] : 1.f) * (p.k_descale != nullptr ? p.k_descale[i] : 1.f);
}
__device__ __forceinline__ float v_descale(const FwdParams& p, int batch, int kv_head) {
    return p.v_descale != nullptr ? p.v_descale[batch * p.heads_kv + kv_head] : 1.f;
}

}  // namespace fp8
}  // namespace fc
