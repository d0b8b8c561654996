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

/// Arch families by shared memory per block.
#[derive(Clone, Copy, PartialEq, Eq)]
enum SmemClass {
    /// sm_80: 163 KB.
    A100,
    /// sm_86, sm_89: 99 KB; tiles stay near 48 KB so two CTAs share an SM.
    Small,
    /// sm_90: 227 KB.
    Hopper,
}

/// The tile for `head_dim` on `arch` (measured on H100, `docs/perf-log.md`). A warp owns
/// 32 query rows where registers allow, so its two m16 tiles share every K/V fragment.
fn tile(arch: Arch, head_dim: usize) -> Tile {
    let class = match (arch.major, arch.minor) {
        (8, 0) => SmemClass::A100,
        (8, _) => SmemClass::Small,
        _ => SmemClass::Hopper,
    };
    let t = |block_m, block_n, warps| Tile { block_m, block_n, warps, stages: 2 };
    match (head_dim, class) {
        (0..=32, SmemClass::Small) => t(128, 64, 4),
        (0..=32, _) => t(128, 128, 4),
        // The wide tiles (255 registers, one CTA per SM): measured faster on H100 only.
        (33..=64, SmemClass::Hopper) => t(128, 128, 4),
        (33..=64, _) => t(128, 64, 4),
        (65..=96, _) => t(128, 32, 4),
        (97..=128, SmemClass::Small) => t(64, 32, 4),
        (97..=128, SmemClass::Hopper) => t(128, 64, 4),
        (97..=128, _) => t(128, 32, 4),
        (_, SmemClass::Hopper) => t(128, 64, 8),
        _ => t(64, 32, 4),
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
