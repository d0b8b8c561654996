//! The Ampere-class backward (`kernels/bwd_sm80.cu`): FlashAttention-2's algorithm, a CTA
//! per (key block, KV head, batch), dQ added in f32 with atomics (or, deterministic, into a
//! slice of the accumulator per CTA). Tiles per head dim and arch's shared memory.

use super::steps::{sink_grad, BwdFacts, Entry, Step, Work};
use super::{Family, KernelFamily, ScoreMods, Tile, Variant};
use crate::jit::Arch;
use crate::tensor::DType;

/// Head dims with a compiled variant.
pub const HEAD_DIMS: &[usize] = &[32, 64, 96, 128, 192, 256];

/// The entry points besides the main one, in launch order around it: D_i before, dQ's
/// conversion after, and the learnable sinks' gradient last when wanted.
pub const DSUM_ENTRY: &str = "fc_bwd_sm80_dsum";
/// See [`DSUM_ENTRY`].
pub const DQ_ENTRY: &str = "fc_bwd_sm80_dq";
/// See [`DSUM_ENTRY`].
pub const DSINK_ENTRY: &str = "fc_bwd_sm80_dsink";

/// The tile for `head_dim` on `arch`: `block_m` query rows a step, `block_n` keys a CTA,
/// `stages` query blocks in flight. FlashAttention-2's shapes where they fit, 8 warps: 128 x
/// 128 at D64 (measured 15% faster than 64 x 128 on H100, docs/kernels/bwd_sm80.md), 64 x 128 at D32,
/// D96 and D128, 64 x 64 above. sm_86/sm_89 give a block 99 KB: 64 x 64 (4 warps) up to D128,
/// 64 x 32 for D192, and 32 x 32 for D256 (K, V, Q and dO of 32 rows: 72 KB), so every head
/// dim runs there (not measured on those GPUs).
pub fn tile(arch: Arch, head_dim: usize) -> Tile {
    let t = |block_m, block_n, warps, stages| Tile { block_m, block_n, warps, stages };
    // 99 KB a block: sm_86, sm_89 and the consumer Blackwells (sm_120).
    let small = (arch.major == 8 && arch.minor > 0) || arch.major == 12;
    let big = arch.major >= 9 && !small; // 227 KB (sm_90, sm_100); else sm_80's 163 KB
    match (head_dim, small) {
        (0..=64, true) => t(64, 64, 4, 2),
        (65..=128, true) => t(64, 64, 4, 1),
        (129..=192, true) => t(64, 32, 4, 1),
        (_, true) => t(32, 32, 4, 1),
        (0..=32, false) => t(64, 128, 8, 2),
        (33..=64, false) => t(128, 128, 8, if big { 2 } else { 1 }),
        (65..=128, false) => t(64, 128, 8, if big || head_dim <= 96 { 2 } else { 1 }),
        _ => t(64, 64, 8, if big { 2 } else { 1 }),
    }
}

/// Dynamic shared memory of the kernel's `Smem`: K and V tiles and `stages` Q and dO tiles
/// of rows padded by 8 elements, P and dS tiles likewise, then lse and D_i (f32) per stage.
/// The kernel static_asserts it.
pub fn smem_bytes(tile: Tile, head_dim: usize) -> u32 {
    let (m, n, s) = (tile.block_m as usize, tile.block_n as usize, tile.stages as usize);
    let row_d = (head_dim + 8) * 2;
    (2 * n * row_d + 2 * s * m * row_d + 2 * m * (n + 8) * 2 + 2 * s * m * 4) as u32
}

/// The variant for `dtype`, `head_dim` (one of [`HEAD_DIMS`]) and the mask on `arch`.
pub fn variant(arch: Arch, dtype: DType, head_dim: usize, causal: bool) -> Variant {
    let tile = tile(arch, head_dim);
    Variant {
        family: KernelFamily::BwdSm80,
        dtype,
        head_dim: Some(head_dim),
        head_dim_v: None,
        causal: Some(causal),
        tile,
        smem_bytes: smem_bytes(tile, head_dim),
        split_kv: false,
        mods: ScoreMods::default(),
        varlen: false,
        paged: false,
        spread_pages: false,
    }
}

/// `v` under the score policies `mods`, as the dispatcher runs it. With dropout, its tile,
/// except with dropout, no causal mask and another score policy besides (a window, a softcap
/// or ALiBi), or with dropout and all three under the causal mask too, where the two-stage
/// 128 x 128 tile (D33-D64 on sm_90) becomes 64 x 128: with all three policies 128 rows
/// spilled 24 bytes (NVRTC 13.0, sm_90a), and 32 causal once `copy_rows` stepped its
/// sources. With dropout alone, 128 x 128 spills nothing since the generator draws 16
/// scores a call, and ran 11% faster than 64 x 128 (H100, B2 S8k H32 D64 bf16, p = 0.1:
/// 13.0 against 14.7 ms). sm_80's one-stage 128 x 128 stays (64 x 128 there spilled 20 bytes
/// with every policy). At D96-D128 a 64 x 64 tile ran 13-32% slower than 64 x 128.
pub fn with_mods(v: &Variant, mods: ScoreMods) -> Variant {
    let with_policies = mods.local || mods.softcap || mods.alibi;
    let every_policy = mods.local && mods.softcap && mods.alibi;
    let narrow = mods.dropout && with_policies && (v.causal == Some(false) || every_policy) && v.tile.block_m == 128 && v.tile.stages == 2;
    let tile = if narrow { Tile { block_m: 64, ..v.tile } } else { v.tile };
    Variant { mods, tile, smem_bytes: smem_bytes(tile, v.head_dim.unwrap_or(128)), ..v.clone() }
}

/// Slices of dQ's accumulator in deterministic mode: each CTA of a (KV head, batch) walks
/// key blocks `x, x + splits, ...` and adds into its own slice. As many CTAs as fit in one
/// wave (one CTA an SM: a second, partial wave would double the time), at most one per key
/// block.
pub fn deterministic_splits(sm_count: usize, heads_kv: usize, batch: usize, key_blocks: usize) -> usize {
    (sm_count / (heads_kv * batch).max(1)).clamp(1, key_blocks.max(1))
}

/// A backward call's work: dQ's f32 accumulator zeroed (every slice of it), D_i over the
/// tensors' rows, the main kernel (a CTA per key block, KV head and batch, or `dq_splits` CTAs
/// a head walking the key blocks in deterministic mode; at least one a head: packed, CTA 0
/// also zeroes dK and dV past seqused_k), then dQ's conversion over the tensors' rows, and
/// the sinks' gradient when wanted (from D_i).
pub(crate) fn steps(variant: &Variant, facts: &BwdFacts) -> Vec<Work> {
    let (shape, tensors, tile) = (&facts.shape, &facts.tensors, variant.tile);
    let accum_len = tensors.batch * tensors.seqlen_q * tensors.heads_q * tensors.head_dim;
    let key_blocks = shape.seqlen_k.div_ceil(tile.block_n as usize) as u32;
    let ctas = if facts.deterministic { facts.dq_splits as u32 } else { key_blocks.max(1) };
    let rows_grid = (tensors.seqlen_q.div_ceil(4) as u32, tensors.heads_q as u32, tensors.batch as u32);
    let mut work = vec![
        Work::ZeroDqAccum(facts.dq_splits * accum_len),
        Work::Launch(Step::plain(Entry::Aux(0), rows_grid, 128, 0, "D_i")),
        Work::Launch(Step::plain(
            Entry::Main,
            (ctas, shape.heads_kv as u32, shape.batch as u32),
            32 * tile.warps,
            variant.smem_bytes,
            "dK, dV",
        )),
        Work::Launch(Step::plain(Entry::Aux(1), (accum_len.div_ceil(1024) as u32, 1, 1), 256, 0, "dQ")),
    ];
    work.extend(sink_grad(shape, facts, 2));
    work
}

/// bwd_sm80 as a [`Family`]: every GPU from sm_80, its own head dims, a tile per arch's shared
/// memory (smaller under dropout: [`with_mods`]), D_i and dQ's conversion around it.
pub(crate) struct Spec;

impl Family for Spec {
    fn head_dims(&self) -> &'static [usize] {
        HEAD_DIMS
    }

    fn own_head_dims_only(&self) -> bool {
        true
    }

    fn variants_at(&self, arch: Arch, dtype: DType, head_dim: usize, causal: bool) -> Vec<Variant> {
        vec![variant(arch, dtype, head_dim, causal)]
    }

    fn source(&self, v: &Variant, defines: &mut Vec<(String, String)>) -> (&'static str, &'static str) {
        defines.push(("FC_SMEM_BYTES".into(), v.smem_bytes.to_string()));
        ("bwd_sm80.cu", "fc_bwd_sm80")
    }

    fn aux_entries(&self) -> &'static [&'static str] {
        &[DSUM_ENTRY, DQ_ENTRY, DSINK_ENTRY]
    }

    fn with_mods(&self, v: &Variant, mods: ScoreMods) -> Variant {
        with_mods(v, mods)
    }

    fn backward_steps(&self, v: &Variant, facts: &BwdFacts) -> Vec<Work> {
        steps(v, facts)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kernels::steps::testing::{facts_of, launches, shape};

    fn arch(major: u32, minor: u32) -> Arch {
        Arch { major, minor, specific: false }
    }

    #[test]
    fn tiles_fit_each_arch_class() {
        // Opt-in shared memory per block: sm_80 163 KB, sm_86/89 99 KB, sm_90 227 KB.
        for (a, limit) in
            [(arch(8, 0), 166_912), (arch(8, 6), 101_376), (arch(8, 9), 101_376), (arch(9, 0), 232_448), (arch(12, 0), 101_376)]
        {
            for &d in HEAD_DIMS {
                let bytes = smem_bytes(tile(a, d), d);
                assert!(bytes <= limit, "sm_{}{} D{d}: {bytes} B over {limit}", a.major, a.minor);
            }
        }
        assert_eq!(smem_bytes(Tile { block_m: 64, block_n: 64, warps: 4, stages: 1 }, 128), 88_576);
    }

    #[test]
    fn dropout_with_other_policies_narrows_only_sm90s_two_stage_tile_without_a_causal_mask_or_with_every_policy() {
        let dropout = ScoreMods { dropout: true, ..ScoreMods::default() };
        let all = ScoreMods { local: true, softcap: true, alibi: true, dropout: true, ..ScoreMods::default() };
        let tile_of = |a: Arch, d: usize, causal: bool, mods| with_mods(&variant(a, DType::BF16, d, causal), mods).tile;
        assert_eq!(tile_of(arch(9, 0), 64, false, dropout), tile(arch(9, 0), 64), "dropout alone keeps the tile");
        let narrow = tile_of(arch(9, 0), 64, false, all);
        assert_eq!((narrow.block_m, narrow.block_n, narrow.stages), (64, 128, 2));
        let window_only = ScoreMods { local: true, dropout: true, ..ScoreMods::default() };
        assert_eq!(tile_of(arch(9, 0), 64, true, window_only), tile(arch(9, 0), 64), "causal keeps its tile");
        assert_eq!(tile_of(arch(9, 0), 64, true, all).block_m, 64, "but not with every policy");
        assert_eq!(tile_of(arch(8, 0), 64, false, all), tile(arch(8, 0), 64), "sm_80's one-stage tile stays");
        assert_eq!(tile_of(arch(9, 0), 128, false, all), tile(arch(9, 0), 128), "D128 keeps its tile");
        let v = with_mods(&variant(arch(9, 0), DType::BF16, 64, false), all);
        assert_eq!(v.smem_bytes, smem_bytes(v.tile, 64), "shared memory follows the tile");
    }

    #[test]
    fn deterministic_splits_fill_the_gpu_once() {
        assert_eq!(deterministic_splits(132, 16, 1, 128), 8);
        assert_eq!(deterministic_splits(132, 32, 2, 128), 2);
        assert_eq!(deterministic_splits(132, 16, 16, 8), 1);
        assert_eq!(deterministic_splits(132, 1, 1, 4), 4);
    }

    #[test]
    fn its_work_zeroes_the_accumulator_then_d_i_the_main_kernel_and_dq() {
        let v = variant(arch(8, 0), DType::BF16, 64, false);
        let s = shape(2, 300, 300, 64);
        let work = steps(&v, &facts_of(s, false, false, 1));
        assert_eq!(work[0], Work::ZeroDqAccum(2 * 300 * 16 * 64));
        let launched = launches(&work);
        assert_eq!(launched.iter().map(|s| s.entry).collect::<Vec<_>>(), [Entry::Aux(0), Entry::Main, Entry::Aux(1)]);
        assert_eq!(launched[0].grid, (75, 16, 2), "D_i: four rows a block");
        assert_eq!(launched[1].grid, (300usize.div_ceil(v.tile.block_n as usize) as u32, 4, 2), "a CTA a key block");
        assert_eq!(launched[2].grid, ((2 * 300 * 16 * 64usize).div_ceil(1024) as u32, 1, 1));
        assert!(launched.iter().all(|s| !s.dependent));
        let det = steps(&v, &facts_of(s, false, true, 3));
        assert_eq!(det[0], Work::ZeroDqAccum(3 * 2 * 300 * 16 * 64), "a slice a CTA");
        assert_eq!(launches(&det)[1].grid.0, 3, "dq_splits CTAs a head");
        let with_dsink = launches(&steps(&v, &BwdFacts { sink_grad: true, ..facts_of(s, false, false, 1) }));
        assert_eq!((with_dsink.len(), with_dsink[3].entry, with_dsink[3].grid), (4, Entry::Aux(2), (16, 1, 1)), "dsink last");
    }
}
