//! The Ampere-class forward kernel (`kernels/fwd_sm80.cu`): tile configurations per head
//! dim and arch family. sm_86/sm_89 (A10, L4, RTX 30/40) give a block at most 99 KB of
//! shared memory; sm_80 163 KB; sm_90 227 KB.

use super::{KernelFamily, Tile, Variant};
use crate::jit::Arch;
use crate::tensor::DType;

/// Head dims with a compiled variant.
pub const HEAD_DIMS: &[usize] = &[32, 64, 96, 128, 256];

/// Dynamic shared memory: the Q tile plus `stages` K and V tiles, 2 bytes an element.
fn smem_bytes(tile: Tile, head_dim: usize) -> u32 {
    (tile.block_m + 2 * tile.stages * tile.block_n) * head_dim as u32 * 2
}

/// The tile for `head_dim` on `arch`.
fn tile(arch: Arch, head_dim: usize) -> Tile {
    let small_smem = arch.major == 8 && arch.minor != 0;
    let t = |block_m, block_n, warps, stages| Tile { block_m, block_n, warps, stages };
    match (head_dim, small_smem) {
        (0..=64, _) => t(128, 64, 4, 2),
        (65..=128, _) => t(128, 64, 4, 2),
        (_, true) => t(64, 32, 4, 2),
        _ => t(128, 32, 8, 2),
    }
}

/// The variant for one (dtype, head dim, mask) on `arch`.
pub fn variant(arch: Arch, dtype: DType, head_dim: usize, causal: bool) -> Variant {
    let tile = tile(arch, head_dim);
    Variant {
        family: KernelFamily::FwdSm80,
        dtype,
        head_dim: Some(head_dim),
        causal: Some(causal),
        tile,
        smem_bytes: smem_bytes(tile, head_dim),
    }
}
