//! The Hopper backward (`kernels/bwd_sm90.cu`, sm_90a): FlashAttention-2's algorithm on
//! wgmma and TMA, a producer warpgroup (with a dQ writer warp) and two consumer warpgroups, a
//! CTA per (key block, KV head, batch): 128 keys, 64 a consumer, up to D128; 64 keys shared by
//! both consumers, dK and dV split by columns, at D192 (the split layout: three panels a tile
//! dealt out unevenly between the consumers; V's own head dim too) and D256. dQ is added in
//! f32 with bulk reduce-adds, in a fixed key-block order in deterministic mode. The varlen
//! form (`FC_VARLEN`) runs a packed batch: a CTA per (key block of the longest sequence, KV
//! head, sequence), each sequence on its own lengths, with dQ's accumulator and the per-row
//! statistics padded to whole query blocks per sequence (see [`padded_rows`]).

use super::steps::{sink_grad, BwdFacts, Entry, Extra, MapOver, Step, Work};
use super::{Family, KernelFamily, ScoreMods, Tile, Variant};
use crate::jit::Arch;
use crate::shape::ProblemShape;
use crate::tensor::DType;

/// Head dims with a compiled variant. D96 runs as D128, D160 as D192 (the split layout) and
/// D224 as D256, with the columns past them zero (see [`padded_head_dim`]).
pub const HEAD_DIMS: &[usize] = &[64, 96, 128, 192, 256];

/// The entry points besides the main one, in launch order around it: D_i and lse·log2e
/// before, dQ's conversion after, and the learnable sinks' gradient last when wanted.
pub const PREP_ENTRY: &str = "fc_bwd_sm90_prep";
/// See [`PREP_ENTRY`].
pub const DQ_ENTRY: &str = "fc_bwd_sm90_dq";
/// See [`PREP_ENTRY`].
pub const DSINK_ENTRY: &str = "fc_bwd_sm90_dsink";
/// Query rows a CTA of [`PREP_ENTRY`] takes (`kPrepRows`; 128 threads).
pub const PREP_ROWS: u32 = 16;

/// CTAs of [`DQ_ENTRY`] a query block (`kDqSlices`: 256 threads, four floats a thread).
pub fn dq_slices(variant: &Variant) -> u32 {
    variant.tile.block_m * tile_head_dim(variant) as u32 / 1024
}

/// Whether `v` is the split layout's form (`FC_PANEL_SPLIT`): Q's and K's tiles 192 wide.
fn is_split(v: &Variant) -> bool {
    tile_head_dim(v) == 192
}

/// The head dim of `v`'s Q, K and dQ tiles (the kernel's `kHeadDim`).
fn tile_head_dim(v: &Variant) -> usize {
    let d = v.head_dim.unwrap_or(128);
    tile_dims(d, v.head_dim_v.unwrap_or(d)).0
}

/// The head dims of the kernel's (Q and K, V) tiles: [`padded_head_dim`] for both, but V's own
/// head dim ([`value_variant`]) takes the split layout, Q and K 192, V its own whole panels.
fn tile_dims(head_dim: usize, head_dim_v: usize) -> (usize, usize) {
    if head_dim_v == head_dim {
        (padded_head_dim(head_dim), padded_head_dim(head_dim))
    } else {
        (192, head_dim_v.div_ceil(64) * 64)
    }
}

/// The head dim of the kernel's tiles: whole 64-column panels; past D128 (the wide layout,
/// whose two consumer warpgroups split dK's, dV's and dQ's columns into whole panels) 192, the
/// split layout's three panels dealt out unevenly (1.22-1.28x faster than D192 as D256 on an
/// H200), or 256. TMA zero-fills the padding columns.
fn padded_head_dim(head_dim: usize) -> usize {
    if head_dim <= 192 {
        head_dim.div_ceil(64) * 64
    } else {
        256
    }
}

/// The tile for `head_dim`, 3 warpgroups: up to D128, 128 keys (64 per consumer warpgroup)
/// and 128 query rows a step at D64, 64 at D96/D128 (each consumer's share of dQ is one 64 x
/// 64 tile), 2 stages of Q and dO; past D128 ("wide": both consumers on the same keys, dK and
/// dV split by columns), 64 keys, 64 query rows, two stages at D192 (the split layout), one
/// at D256 (the shared memory holds no second).
pub fn tile(head_dim: usize) -> Tile {
    match head_dim {
        0..=64 => Tile { block_m: 128, block_n: 128, warps: 12, stages: 2 },
        65..=128 => Tile { block_m: 64, block_n: 128, warps: 12, stages: 2 },
        129..=192 => Tile { block_m: 64, block_n: 64, warps: 12, stages: 2 },
        _ => Tile { block_m: 64, block_n: 64, warps: 12, stages: 1 },
    }
}

/// Whether `head_dim` takes the wide layout (see [`tile`]): P passes through shared memory too.
fn wide(head_dim: usize) -> bool {
    padded_head_dim(head_dim) > 128
}

/// Dynamic shared memory of the kernel's `SharedStorage` plus 1024 bytes to align it: K and
/// V, `stages` Q and dO tiles (V and dO `head_dim_v`'s panels), two dSᵀ tiles (and, wide, two
/// Pᵀ tiles; 2 bytes an element), dQ's f32 staging; then lse and D_i per stage, the dQ
/// hand-over (a pointer and an order per consumer warpgroup) and the barriers, padded to 1024
/// bytes. The kernel checks it.
pub fn smem_bytes(tile: Tile, head_dim: usize, head_dim_v: usize) -> u32 {
    let (m, n, s) = (tile.block_m as usize, tile.block_n as usize, tile.stages as usize);
    let (d, dv) = tile_dims(head_dim, head_dim_v);
    let consumers = 2usize;
    let score_tiles = if wide(head_dim) { 4 } else { 2 };
    let tiles = 2 * (n * (d + dv) + s * m * (d + dv) + score_tiles * n * m) + 4 * m * d;
    let handover = (12 * consumers).next_multiple_of(8);
    let barriers = 8 * (1 + 2 * s + 2 * consumers);
    let small = (2 * s * m * 4 + handover + barriers).next_multiple_of(1024);
    (tiles + small + 1024) as u32
}

/// The variant for `dtype`, `head_dim` (one of [`HEAD_DIMS`], or any other multiple of 8 up to
/// 256, run as the next of them, the columns past it zero) and the mask.
pub fn variant(dtype: DType, head_dim: usize, causal: bool) -> Variant {
    let tile = tile(head_dim);
    Variant {
        family: KernelFamily::BwdSm90,
        dtype,
        head_dim: Some(head_dim),
        head_dim_v: None,
        causal: Some(causal),
        tile,
        smem_bytes: smem_bytes(tile, head_dim, head_dim),
        split_kv: false,
        mods: ScoreMods::default(),
        varlen: false,
        paged: false,
        spread_pages: false,
    }
}

/// The (head dim, V's head dim) pairs with backward forms of their own (the split layout:
/// Q and K up to 192, V up to 128): DeepSeek-V3's prefill. The forward's other pairs
/// (`fwd_sm90::VALUE_HEAD_DIMS`) have none: the bindings run their backward with the narrower
/// of Q's and V's dims zero-padded to the wider (`dispatch::backward_pads_value_dim`).
pub const VALUE_HEAD_DIMS: &[(usize, usize)] = &[(192, 128)];

/// The form of `head_dim` with V's `head_dim_v` (a pair of [`VALUE_HEAD_DIMS`]): the split layout (`FC_PANEL_SPLIT`) with V, dO and dV tiles of
/// V's panels, two stages (203 KB). It took 36.1 ms at DeepSeek-V3's B2 S8k where the wide
/// layout with V 128 wide (Q and K as 256) took 44.1 ms (H200; docs/kernels/bwd_sm90.md).
pub fn value_variant(dtype: DType, head_dim: usize, head_dim_v: usize, causal: bool) -> Variant {
    let plain = variant(dtype, head_dim, causal);
    let tile = Tile { stages: 2, ..plain.tile };
    Variant { head_dim_v: Some(head_dim_v), tile, smem_bytes: smem_bytes(tile, head_dim, head_dim_v), ..plain }
}

/// The most shared memory a CTA may have on Hopper, dynamic and static together (227 KB).
const SMEM_LIMIT: u32 = 232_448;

/// Static shared memory of a dropout form (its generator's staged state, `common/dropout.cuh`).
const DROPOUT_STATIC_SMEM: u32 = 16;

/// `v` under the score policies `mods`: its own tile, but a dropout form whose dynamic shared
/// memory leaves no room for the generator's static state (D192's two stages take all 227 KB)
/// takes one stage of Q and dO (the launch was refused: CUDA_ERROR_INVALID_VALUE).
pub fn with_mods(v: &Variant, mods: ScoreMods) -> Variant {
    let full = mods.dropout && v.smem_bytes + DROPOUT_STATIC_SMEM > SMEM_LIMIT;
    let tile = if full { Tile { stages: 1, ..v.tile } } else { v.tile };
    let d = v.head_dim.unwrap_or(128);
    Variant { mods, tile, smem_bytes: smem_bytes(tile, d, v.head_dim_v.unwrap_or(d)), ..v.clone() }
}

/// Rows of the padded per-row arrays (D_i, lse·log2e) and of dQ's accumulator: whole query
/// blocks per (batch, head); packed (`total_q`: the packed rows, `shape` the kernel's: B
/// sequences of the longest lengths), `(total_q + B·block_m) / block_m` blocks per head,
/// room for each sequence padded to whole blocks (FlashAttention-3's layout; see
/// `query_block` in `kernels/common/bwd_schedule.cuh`, which must agree).
pub fn padded_rows(variant: &Variant, shape: &ProblemShape, total_q: Option<usize>) -> usize {
    let m = variant.tile.block_m as usize;
    match total_q {
        Some(total) => shape.heads_q * (total + shape.batch * m) / m * m,
        None => shape.batch * shape.heads_q * shape.seqlen_q.div_ceil(m) * m,
    }
}

/// Scratch bytes: D_i and lse·log2e (f32 per padded row); then dQ's f32 accumulator, and in
/// deterministic mode a `u32` counter per query block after it (zeroed with it). `total_q`
/// as in [`padded_rows`].
pub fn scratch_layout(variant: &Variant, shape: &ProblemShape, total_q: Option<usize>, deterministic: bool) -> (usize, usize) {
    let rows = padded_rows(variant, shape, total_q);
    let head_dim = tile_head_dim(variant);
    let counters = if deterministic { rows / variant.tile.block_m as usize * 4 } else { 0 };
    ((2 * rows * 4).next_multiple_of(256), rows * head_dim * 4 + counters)
}

/// A backward call's work: the prep kernel (D_i and lse·log2e; it zeroes dQ's accumulator
/// too), the main one and the dQ conversion, the last two programmatic dependents of the
/// launch before them (they wait for it where they first read its output, so their launches
/// overlap its tail). Prep and the conversion run over the query blocks (packed: the longest
/// sequence's), the main kernel over at least one key block (packed, key block 0's CTAs zero
/// dK and dV past seqused_k), with the tensor maps of Q, K, V and dO; then the sinks'
/// gradient when wanted (from prep's statistics; not a dependent: it reads no dQ).
pub(crate) fn steps(variant: &Variant, facts: &BwdFacts) -> Vec<Work> {
    let (shape, tile) = (&facts.shape, variant.tile);
    let (seqs, heads_q) = (shape.batch as u32, shape.heads_q as u32);
    let m_blocks = shape.seqlen_q.div_ceil(tile.block_m as usize) as u32;
    let key_blocks = shape.seqlen_k.div_ceil(tile.block_n as usize).max(usize::from(facts.packed)) as u32;
    let maps = [(0, tile.block_m), (1, tile.block_n), (2, tile.block_n), (3, tile.block_m)].map(|(view, rows)| MapOver { view, rows });
    let prep = Step::plain(Entry::Aux(0), (m_blocks * tile.block_m / PREP_ROWS, heads_q, seqs), 128, 0, "D_i");
    let main = Step::plain(Entry::Main, (key_blocks, shape.heads_kv as u32, seqs), 32 * tile.warps, variant.smem_bytes, "dK, dV");
    let dq = Step::plain(Entry::Aux(1), (m_blocks * dq_slices(variant), heads_q, seqs), 256, 0, "dQ");
    let mut work = vec![
        Work::Launch(prep),
        Work::Launch(Step { dependent: true, extra: Extra::Maps(maps), ..main }),
        Work::Launch(Step { dependent: true, ..dq }),
    ];
    work.extend(sink_grad(shape, facts, 2));
    work
}

/// bwd_sm90 as a [`Family`]: sm_90a, every multiple of 8 up to 256, its prep and dQ
/// conversion around the main kernel.
pub(crate) struct Spec;

impl Family for Spec {
    fn needs_sm90a(&self) -> bool {
        true
    }

    fn head_dims(&self) -> &'static [usize] {
        HEAD_DIMS
    }

    /// The head dim's form, then its forms with V's own head dims ([`VALUE_HEAD_DIMS`]).
    fn variants_at(&self, _: Arch, dtype: DType, head_dim: usize, causal: bool) -> Vec<Variant> {
        let own_value_dims = VALUE_HEAD_DIMS.iter().filter(|(d, _)| *d == head_dim);
        let form = |&(d, dv): &(usize, usize)| value_variant(dtype, d, dv, causal);
        std::iter::once(variant(dtype, head_dim, causal)).chain(own_value_dims.map(form)).collect()
    }

    fn source(&self, v: &Variant, defines: &mut Vec<(String, String)>) -> (&'static str, &'static str) {
        defines.push(("FC_SMEM_BYTES".into(), v.smem_bytes.to_string()));
        if is_split(v) {
            defines.push(("FC_PANEL_SPLIT".into(), "1".into()));
        }
        ("bwd_sm90.cu", "fc_bwd_sm90")
    }

    fn aux_entries(&self) -> &'static [&'static str] {
        &[PREP_ENTRY, DQ_ENTRY, DSINK_ENTRY]
    }

    fn with_mods(&self, v: &Variant, mods: ScoreMods) -> Variant {
        with_mods(v, mods)
    }

    /// Dropout alone (`dispatch::backward`: its forms with the other policies spill).
    fn dropout_forms(&self) -> &'static [(bool, bool, bool)] {
        &[(false, false, false)]
    }

    fn backward_steps(&self, v: &Variant, facts: &BwdFacts) -> Vec<Work> {
        steps(v, facts)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kernels::steps::testing::{facts_of, launches, shape};

    #[test]
    fn tiles_fit_hopper() {
        for d in (8..=256).step_by(8) {
            let bytes = smem_bytes(tile(d), d, d);
            assert!(bytes <= SMEM_LIMIT, "D{d}: {bytes} B");
            let dropout = with_mods(&variant(DType::BF16, d, true), ScoreMods { dropout: true, ..ScoreMods::default() });
            assert!(dropout.smem_bytes + DROPOUT_STATIC_SMEM <= SMEM_LIMIT, "D{d} with dropout: {} B", dropout.smem_bytes);
            let split = d > 128 && d <= 192;
            assert_eq!(dropout.tile.stages, if split { 1 } else { tile(d).stages }, "D{d} with dropout");
        }
        for &(d, dv) in VALUE_HEAD_DIMS {
            let split = value_variant(DType::BF16, d, dv, true);
            assert!(wide(d) && d <= 192 && dv <= 128, "({d}, {dv}): the split layout's sizes");
            assert_eq!((split.tile.stages, is_split(&split), tile_head_dim(&split), dq_slices(&split)), (2, true, 192, 12));
            assert!(split.smem_bytes <= 232_448, "{}: {} B", split.name(), split.smem_bytes);
        }
        for (d, split) in [(128, false), (136, true), (160, true), (192, true), (200, false), (256, false)] {
            let v = variant(DType::BF16, d, true);
            assert_eq!((is_split(&v), tile_head_dim(&v)), (split, padded_head_dim(d)), "D{d}");
        }
        assert_eq!(tile(64).block_m, 128);
        assert_eq!(tile(96).block_m, 64);
        assert_eq!((tile(192).block_n, tile(192).stages), (64, 2));
        assert_eq!((tile(256).block_n, tile(256).stages), (64, 1));
        assert_eq!(smem_bytes(tile(256), 256, 256), 231_424);
        // The split layout at D192: K and V 24 KB each, two stages of Q and dO (24 each), four
        // score tiles (32), dQ staging (48), then 2 KB of statistics, hand-over and barriers, 1
        // to align: the most a CTA may have. V 128: V 16 KB, dO 16 a stage.
        let two = Tile { stages: 2, ..tile(256) };
        assert_eq!(smem_bytes(two, 192, 192), (48 + 2 * 48 + 32 + 48 + 2 + 1) * 1024);
        assert_eq!(smem_bytes(two, 192, 192), SMEM_LIMIT);
        assert_eq!(smem_bytes(two, 192, 128), (24 + 16 + 2 * 40 + 32 + 48 + 2 + 1) * 1024);
        assert_eq!((padded_head_dim(96), padded_head_dim(200)), (128, 256));
        assert_eq!(padded_head_dim(160), 192);
    }

    /// The packed layout of `query_block` (kernels/common/bwd_schedule.cuh): sequence b's
    /// blocks start at (q_start + b·m) / m; they never overlap the previous sequence's and all
    /// lie within the head's (total_q + B·m) / m blocks, for every length (0 and 1 included).
    #[test]
    fn packed_query_blocks_are_disjoint_and_fit() {
        for (m, lens) in [(64, vec![0, 1, 7, 113, 1000, 4097, 3, 250]), (128, vec![1, 1, 1, 128, 129, 0, 255]), (64, vec![64; 5])] {
            let v = variant(DType::BF16, if m == 128 { 64 } else { 128 }, false);
            assert_eq!(v.tile.block_m as usize, m);
            let total: usize = lens.iter().sum();
            let shape =
                ProblemShape { batch: lens.len(), seqlen_q: 4097, seqlen_k: 1, heads_q: 3, heads_kv: 1, head_dim: 128, head_dim_v: 128 };
            let per_head = padded_rows(&v, &shape, Some(total)) / shape.heads_q / m;
            let (mut start, mut end_before) = (0, 0);
            for (b, &len) in lens.iter().enumerate() {
                let first = (start + b * m) / m;
                assert!(first >= end_before, "sequence {b} overlaps the previous one");
                end_before = first + len.div_ceil(m);
                assert!(end_before <= per_head, "sequence {b} ends past the head's blocks");
                start += len;
            }
        }
    }

    #[test]
    fn its_work_is_prep_then_the_main_kernel_and_dq_as_dependents_with_its_maps() {
        let v = variant(DType::BF16, 128, true);
        let s = shape(2, 1000, 1000, 128);
        let work = steps(&v, &facts_of(s, false, false, 1));
        assert!(work.iter().all(|w| matches!(w, Work::Launch(_))), "its prep zeroes the accumulator");
        let launched = launches(&work);
        let order: Vec<_> = launched.iter().map(|s| (s.entry, s.dependent)).collect();
        assert_eq!(order, [(Entry::Aux(0), false), (Entry::Main, true), (Entry::Aux(1), true)]);
        let (m, n) = (v.tile.block_m, v.tile.block_n);
        let m_blocks = 1000u32.div_ceil(m);
        assert_eq!(launched[0].grid, (m_blocks * m / PREP_ROWS, 16, 2));
        assert_eq!(launched[1].grid, (1000u32.div_ceil(n), 4, 2));
        assert_eq!(launched[1].extra, Extra::Maps([(0, m), (1, n), (2, n), (3, m)].map(|(view, rows)| MapOver { view, rows })));
        assert_eq!(launched[2].grid, (m_blocks * dq_slices(&v), 16, 2));
        // The sinks' gradient, when wanted, last and not a dependent: a block a query head.
        let with_dsink = launches(&steps(&v, &BwdFacts { sink_grad: true, ..facts_of(s, false, false, 1) }));
        assert_eq!(with_dsink[..3], launched[..]);
        assert_eq!((with_dsink[3].entry, with_dsink[3].grid, with_dsink[3].dependent), (Entry::Aux(2), (16, 1, 1), false));
    }

    #[test]
    fn a_packed_batch_without_queries_leaves_its_empty_launches_out() {
        let v = variant(DType::BF16, 64, false);
        let launched = launches(&steps(&v, &facts_of(shape(2, 0, 100, 64), true, false, 1)));
        // Prep and dQ have no query block; key block 0 still runs (it zeroes dK and dV).
        assert!(launched[0].is_empty() && launched[2].is_empty() && !launched[1].is_empty(), "{launched:?}");
    }
}
