//! The Ampere-class backward (`kernels/bwd_sm80.cu`): FlashAttention-2's algorithm, a CTA
//! per (key block, KV head, batch), dQ added in f32 with atomics. First version: D 64 and
//! 128, one 64 x 64 tile, no pipeline; deterministic gradients run on the reference kernels.

use super::{KernelFamily, Tile, Variant};
use crate::tensor::DType;

/// Head dims bwd_sm80 takes (the others run on the reference backward).
pub const HEAD_DIMS: &[usize] = &[64, 128];

/// Query rows and keys per tile.
pub const BLOCK: u32 = 64;

/// The entry points besides the main one, in launch order around it: D_i before, dQ's
/// conversion after.
pub const DSUM_ENTRY: &str = "fc_bwd_sm80_dsum";
/// See [`DSUM_ENTRY`].
pub const DQ_ENTRY: &str = "fc_bwd_sm80_dq";

/// Dynamic shared memory of the kernel's `Smem`: Q, dO, K and V tiles of rows padded by 8
/// elements, P and dS tiles likewise, then lse and D_i (f32). The kernel static_asserts it.
pub fn smem_bytes(head_dim: usize) -> u32 {
    let b = BLOCK as usize;
    (4 * b * (head_dim + 8) * 2 + 2 * b * (b + 8) * 2 + 2 * b * 4) as u32
}

/// The variant for `dtype`, `head_dim` (one of [`HEAD_DIMS`]) and the mask.
pub fn variant(dtype: DType, head_dim: usize, causal: bool) -> Variant {
    Variant {
        family: KernelFamily::BwdSm80,
        dtype,
        head_dim: Some(head_dim),
        causal: Some(causal),
        tile: Tile { block_m: BLOCK, block_n: BLOCK, warps: 4, stages: 1 },
        smem_bytes: smem_bytes(head_dim),
        split_kv: false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tiles_fit_the_smallest_shared_memory() {
        // sm_86 and sm_89 let a block opt in to 99 KB.
        assert_eq!(smem_bytes(128), 88_576);
        assert!(HEAD_DIMS.iter().all(|&d| smem_bytes(d) <= 99 * 1024));
    }
}
