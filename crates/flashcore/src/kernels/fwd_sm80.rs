//! The Ampere-class forward kernel (`kernels/fwd_sm80.cu`): tile configurations per head
//! dim and arch family. sm_86/sm_89 (A10, L4, RTX 30/40) give a block at most 99 KB of
//! shared memory; sm_80 163 KB; sm_90 227 KB.

use super::{Family, KernelFamily, ScoreMods, Tile, Variant};
use crate::jit::Arch;
use crate::shape::ProblemShape;
use crate::tensor::DType;

/// Head dims with a compiled variant.
pub const HEAD_DIMS: &[usize] = &[32, 64, 96, 128, 192, 256];

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

/// The tile for `head_dim` on `arch` (measured on H100, `docs/kernels/fwd_sm80.md`). A warp owns
/// 32 query rows where registers allow, so its two m16 tiles share every K/V fragment.
fn tile(arch: Arch, head_dim: usize) -> Tile {
    let class = smem_class(arch);
    let t = |block_m, block_n, warps| Tile { block_m, block_n, warps, stages: 2 };
    match (head_dim, class) {
        (0..=32, SmemClass::Small) => t(128, 64, 4),
        (0..=32, _) => t(128, 128, 4),
        // The wide tiles (255 registers, one CTA per SM): measured faster on H100 only.
        (33..=64, SmemClass::Hopper) => t(128, 128, 4),
        (33..=64, _) => t(128, 64, 4),
        // D96 on H100 (dims suite, bf16 TFLOPS, 128x64 / 128x32): S2k 311 / 285, 8k 323 / 299,
        // causal 231 / 200, 262 / 222; 64x64 slower still (256-263 full). (fwd_sm90, D96 as
        // D128, is the default there: ~500.)
        (65..=96, SmemClass::Hopper) => t(128, 64, 4),
        (65..=96, _) => t(128, 32, 4),
        (97..=128, SmemClass::Small) => t(64, 32, 4),
        (97..=128, SmemClass::Hopper) => t(128, 64, 4),
        (97..=128, _) => t(128, 32, 4),
        // D192 as FlashAttention-2 runs it: 128x64 with 8 warps, one K and one V slot where
        // only 99 KB are available (not measured on those GPUs here).
        (129..=192, SmemClass::Small) => Tile { block_m: 128, block_n: 64, warps: 8, stages: 1 },
        (129..=192, _) => t(128, 64, 8),
        (_, SmemClass::Hopper) => t(128, 64, 8),
        _ => t(64, 32, 4),
    }
}

/// Problems with at most this many keys take [`short_tile`] (0: never).
fn short_max_keys(arch: Arch, head_dim: usize, causal: bool) -> usize {
    match (head_dim, causal, smem_class(arch)) {
        (193.., _, SmemClass::Hopper) => 1024,
        _ => 0,
    }
}

/// The tile for few keys: FlashAttention-2's D256 64x64 w4 with one K and one V slot (96 KB,
/// two CTAs an SM, each hiding the other's loads and epilogue; 64-row tiles waste less on
/// the causal diagonal than 128-row ones). Measured on H100 (bf16 TFLOPS, sweep, short /
/// default tile, docs/kernels/fwd_sm80.md): causal S512 217 / 191, 1k 255 / 242, 2k 276 / 278;
/// full S512 285 / 281, 1k 315 / 312, 2k even (326 / 327).
fn short_tile() -> Tile {
    Tile { block_m: 64, block_n: 64, warps: 4, stages: 1 }
}

fn smem_class(arch: Arch) -> SmemClass {
    match (arch.major, arch.minor) {
        (8, 0) => SmemClass::A100,
        (8, _) => SmemClass::Small,
        _ => SmemClass::Hopper,
    }
}

/// The split-KV tile: 64 query rows (16 a warp), since decode has few rows, and key tiles
/// as wide as shared memory allows (D256 64x64 needs 160 KB, so 64x32 on sm_86/89).
fn split_tile(arch: Arch, head_dim: usize) -> Tile {
    let t = |block_n| Tile { block_m: 64, block_n, warps: 4, stages: 2 };
    match (head_dim, smem_class(arch)) {
        (0..=64, _) => t(128),
        (65..=96, _) => t(64),
        (97..=128, SmemClass::Small) => t(64),
        (97..=128, _) => t(128),
        (_, SmemClass::Small) => t(32),
        _ => t(64),
    }
}

fn make_variant(dtype: DType, head_dim: usize, causal: bool, tile: Tile, split_kv: bool) -> Variant {
    Variant {
        family: KernelFamily::FwdSm80,
        dtype,
        head_dim: Some(head_dim),
        head_dim_v: None,
        causal: Some(causal),
        tile,
        smem_bytes: smem_bytes(tile, head_dim),
        split_kv,
        mods: ScoreMods::default(),
        varlen: false,
        paged: false,
        spread_pages: false,
    }
}

/// The variant for one (dtype, head dim, mask) and `seqlen_k` keys on `arch`.
pub fn variant(arch: Arch, dtype: DType, head_dim: usize, causal: bool, seqlen_k: usize) -> Variant {
    let short = seqlen_k <= short_max_keys(arch, head_dim, causal);
    make_variant(dtype, head_dim, causal, if short { short_tile() } else { tile(arch, head_dim) }, false)
}

/// Every unsplit variant for one (dtype, head dim, mask) on `arch`: the default tile, and
/// the short one where it is used.
pub fn variants(arch: Arch, dtype: DType, head_dim: usize, causal: bool) -> Vec<Variant> {
    let mut out = vec![make_variant(dtype, head_dim, causal, tile(arch, head_dim), false)];
    if short_max_keys(arch, head_dim, causal) > 0 {
        out.push(make_variant(dtype, head_dim, causal, short_tile(), false));
    }
    out
}

/// The split-KV variant for one (dtype, head dim, mask) on `arch`.
pub fn split_variant(arch: Arch, dtype: DType, head_dim: usize, causal: bool) -> Variant {
    make_variant(dtype, head_dim, causal, split_tile(arch, head_dim), true)
}

/// `v`'s paged-KV form (`FC_PAGED`) on `arch` for pages of `page_size` keys (0: a contiguous
/// cache): the same tile, but for the split-KV tile on sm_90 over pages smaller than its key
/// block, which takes a third K and V slot (D128 64x128: 208 KB of 227; every head dim fits and
/// keeps its CTAs per SM) so that two tiles' copies are in flight while one computes: the
/// latency of a tile's several scattered pages and the prologue's chain (cache_seqlens, then
/// the block table, then the first copies) hide behind them. Measured on the H100 (docs/
/// kernels/fwd_sm80.md, the paged decode's third slot): +1-1.5% at page 16 and +1% at 64, but
/// -2% at page 256, where a tile lies in one page: there, and for contiguous caches, the dense
/// tile's two slots. sm_80 (163 KB) and sm_86/89 (99 KB) keep two slots: D128 would need
/// 208 KB / 112 KB there.
pub fn paged_form(arch: Arch, v: &Variant, page_size: usize) -> Variant {
    let spans_pages = page_size > 0 && page_size < v.tile.block_n as usize;
    let stages = if v.split_kv && spans_pages && smem_class(arch) == SmemClass::Hopper { 3 } else { v.tile.stages };
    let tile = Tile { stages, ..v.tile };
    let head_dim = v.head_dim.unwrap_or(128);
    Variant { paged: true, tile, smem_bytes: smem_bytes(tile, head_dim), ..v.clone() }
}

/// `v` under the score policies `mods`: with dropout, 4 warps and a tile the mask's generator
/// (seven Philox rounds a 16-score cell, common/dropout.cuh) leaves registers for (NVRTC 13.0,
/// sm_80 to sm_90a, spill-free): 64 x 64 (one m16 tile a warp), past D128 with one K/V slot
/// (the short tile's, which fits every GPU's shared memory); at D65-D128 128 x 32 (two m16
/// tiles a warp share each K/V fragment), 5% faster than 64 x 64 on the H100 (B2 S8k H16
/// D128, p = 0.1: 4.39 against 4.61 ms). 128 x 64 at D64 measured level with 64 x 64 (5.36
/// against 5.34 ms) and spilled 8-16 bytes causal or with every policy; 128 rows spilled
/// 300-2500 bytes past D128.
pub fn with_mods(v: &Variant, mods: ScoreMods) -> Variant {
    let head_dim = v.head_dim.unwrap_or(128);
    let narrow = mods.dropout && !v.split_kv;
    let stages = if head_dim > 128 { 1 } else { v.tile.stages };
    let (block_m, block_n) = if (65..=128).contains(&head_dim) { (128, 32) } else { (64, 64.min(v.tile.block_n)) };
    let tile = if narrow { Tile { block_m, block_n, warps: 4, stages } } else { v.tile };
    Variant { mods, tile, smem_bytes: smem_bytes(tile, v.head_dim.unwrap_or(128)), ..v.clone() }
}

/// `v`'s (unsplit) packed-queries form (`FC_VARLEN` with `FC_PAGED`: packed queries over a
/// paged cache) on `arch`: the same tile, but at D33-D64 on Hopper 128x64 instead of the wide
/// 128x128, whose 255 registers hold no room for both forms' indexing (NVRTC 13.0 spills 68
/// bytes there; 128x64 none).
pub fn packed_paged_form(arch: Arch, v: &Variant) -> Variant {
    let head_dim = v.head_dim.unwrap_or(128);
    let narrow = (33..=64).contains(&head_dim) && smem_class(arch) == SmemClass::Hopper && v.tile.block_n == 128;
    let tile = if narrow { Tile { block_n: 64, ..v.tile } } else { v.tile };
    Variant { paged: true, varlen: true, tile, smem_bytes: smem_bytes(tile, head_dim), ..v.clone() }
}

/// Query rows (after GQA packing) up to which the split-KV variant runs: decode and short
/// speculative-decode chunks, one 64-row tile.
pub const SPLIT_KV_MAX_ROWS: usize = 64;

/// How close to the best wave efficiency the split count must come. FlashAttention-2 takes
/// 85%, trading idle SMs for fewer partial results; split grids here are mostly decode,
/// bound by memory bandwidth, where an idle SM is bandwidth lost: H100, B1 S128k decode
/// ran at 2.94 TB/s with 14 splits (112 of 132 SMs busy at 85%).
const SPLIT_EFFICIENCY: f64 = 0.95;

/// Most splits of one query tile's keys.
pub const MAX_SPLITS: usize = 128;

/// How many CTAs share a query tile's `key_tiles` key tiles when `base_ctas` CTAs (query
/// tiles x heads x batch) would run unsplit and a full wave is `wave` CTAs. Unsplit when
/// the base grid fills most of a wave; else the fewest splits whose wave efficiency (work
/// in the last wave over a full one) is within `SPLIT_EFFICIENCY` of the best possible.
/// Counts that give the same tiles per split as a smaller count are skipped.
pub fn num_splits(base_ctas: usize, key_tiles: usize, wave: usize) -> usize {
    if base_ctas == 0 || key_tiles < 2 || 5 * base_ctas >= 4 * wave {
        return 1;
    }
    let efficiency = |splits: usize| {
        let waves = (base_ctas * splits) as f64 / wave as f64;
        waves / waves.ceil()
    };
    let candidates: Vec<usize> = (1..=key_tiles.min(MAX_SPLITS)).filter(|&s| effective_splits(key_tiles, s) == s).collect();
    let best = candidates.iter().map(|&s| efficiency(s)).fold(0.0, f64::max);
    candidates.into_iter().find(|&s| efficiency(s) >= SPLIT_EFFICIENCY * best).unwrap_or(1)
}

/// The split count of a packed batch whose longest sequence has `max_tiles` key tiles and
/// whose sequences have `mean_tiles` on average. Every sequence's tiles are shared out among
/// the same count (the kernel's split_tiles), so CTAs differ in length as the sequences do:
/// equal sequences split as a dense batch; unequal ones as a batch of average sequences would
/// be, times 3 max / mean, so that the longest sequence's CTAs hold a third of an average
/// sequence's keys and CTAs of unequal lengths pack evenly onto the SMs. H100, decode B16
/// Hq32/Hkv8 D128 over 1k..32k keys (mean 15k, the longest 2.2x): 1.11 TB/s unsplit (the
/// dense rule's count), 2.60 / 2.76 / 2.83 / 2.91 / 2.93 / 2.85 TB/s at 2 / 3 / 4 / 6 / 8 / 12
/// splits, against 3.10 for the dense batch of 15k keys each; this rule takes 7.
pub fn num_splits_varlen(base_ctas: usize, max_tiles: usize, mean_tiles: usize, wave: usize) -> usize {
    let mean_tiles = mean_tiles.clamp(1, max_tiles.max(1));
    let per_mean = if max_tiles > mean_tiles { (3 * max_tiles).div_ceil(mean_tiles) } else { 1 };
    (num_splits(base_ctas, mean_tiles, wave) * per_mean).clamp(1, max_tiles.clamp(1, MAX_SPLITS))
}

/// Partial rows of a paged split-KV launch of `shape` (GQA-packed) at `splits`. Its CTAs
/// share out the key tiles of every query tile of a head, laid end to end, in equal chunks,
/// one a CTA (`fwd_sm80.cu`, `start_chunk`): batch x m blocks x splits chunks. A chunk's first
/// and last segments may each be part of a query tile, so each chunk has two partial slots of
/// a query tile's rows per head, and the combine merges a tile's chunks.
pub fn chunked_partial_rows(shape: &ProblemShape, tile: Tile, splits: usize) -> usize {
    let rows = shape.seqlen_q.min(tile.block_m as usize);
    let chunks = shape.batch * shape.seqlen_q.div_ceil(tile.block_m as usize) * splits;
    2 * chunks * shape.heads_q * rows
}

/// Key tiles per split when `key_tiles` are shared out among `splits`.
pub fn tiles_per_split(key_tiles: usize, splits: usize) -> usize {
    key_tiles.div_ceil(splits.max(1))
}

/// Splits that actually get key tiles when `key_tiles` are dealt `tiles_per_split` at a time.
pub fn effective_splits(key_tiles: usize, splits: usize) -> usize {
    key_tiles.div_ceil(tiles_per_split(key_tiles, splits)).max(1)
}

/// fwd_sm80 as a [`Family`]: every GPU from sm_80, its own head dims, the unsplit tiles and
/// the split-KV tile of each (dtype, head dim, mask); causal tiles longest first from a 1-D
/// grid where they take them ([`Variant::longest_first`]).
pub(crate) struct Spec;

impl Family for Spec {
    fn head_dims(&self) -> &'static [usize] {
        HEAD_DIMS
    }

    fn own_head_dims_only(&self) -> bool {
        true
    }

    fn variants_at(&self, arch: Arch, dtype: DType, head_dim: usize, causal: bool) -> Vec<Variant> {
        let mut out = variants(arch, dtype, head_dim, causal);
        out.push(split_variant(arch, dtype, head_dim, causal));
        out
    }

    fn source(&self, _: &Variant, _: &mut Vec<(String, String)>) -> (&'static str, &'static str) {
        ("fwd_sm80.cu", "fc_fwd_sm80")
    }

    fn with_mods(&self, v: &Variant, mods: ScoreMods) -> Variant {
        with_mods(v, mods)
    }

    /// Decode, every arch: its split-KV tile over pages smaller than a key block takes a third
    /// K/V slot on sm_90, so two forms there ([`paged_form`]); its unsplit tiles also the
    /// packed-queries form ([`packed_paged_form`]).
    fn paged_forms(&self, arch: Arch, v: &Variant) -> Vec<Variant> {
        let (small_pages, whole_blocks) = (paged_form(arch, v, 16), paged_form(arch, v, 0));
        let mut forms = vec![small_pages.clone()];
        if small_pages != whole_blocks {
            forms.push(whole_blocks);
        }
        if !v.split_kv {
            forms.push(packed_paged_form(arch, v));
        }
        forms
    }

    fn grid(&self, v: &Variant, shape: &ProblemShape, _: u32, splits: u32) -> (u32, u32, u32) {
        if v.longest_first() {
            return (v.query_tiles(shape) as u32, 1, 1);
        }
        super::query_grid(v, shape, splits)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_packed_batch_splits_its_longest_sequence_to_the_mean() {
        // Equal lengths: as dense.
        assert_eq!(num_splits_varlen(128, 117, 117, 132), num_splits(128, 117, 132));
        // The longest 2.2x the mean: 7 splits where dense would run unsplit.
        assert_eq!(num_splits_varlen(128, 256, 117, 132), 7);
        // Never more splits than the longest has tiles, nor than MAX_SPLITS; an empty batch once.
        assert_eq!(num_splits_varlen(8, 4, 1, 132), 4);
        assert_eq!(num_splits_varlen(1, 100_000, 1, 132), MAX_SPLITS);
        assert_eq!(num_splits_varlen(8, 0, 0, 132), 1);
    }

    /// A chunk's segment: item, first tile, end tile, partial slot (None: the whole item).
    type ChunkSegment = (usize, usize, usize, Option<usize>);

    /// The chunked schedule of the paged split tiles as fwd_sm80.cu runs it (start_chunk,
    /// next_segment, and the combine's lookup), for items of `tiles` key tiles in `chunks`:
    /// per chunk, its segments.
    fn chunk_schedule(tiles: &[usize], chunks: usize) -> Vec<Vec<ChunkSegment>> {
        let total: usize = tiles.iter().sum();
        let per = total.div_ceil(chunks);
        (0..chunks)
            .map(|c| {
                let (lo, hi) = ((c * per).min(total), ((c * per).min(total) + per).min(total));
                let mut before = 0;
                let mut segments = Vec::new();
                for (item, &t) in tiles.iter().enumerate() {
                    if t > 0 && before < hi && before + t > lo {
                        let (from, to) = (lo.max(before) - before, hi.min(before + t) - before);
                        let slot = if before <= lo { 0 } else { 1 };
                        segments.push((item, from, to, if from == 0 && to == t { None } else { Some(slot) }));
                    }
                    before += t;
                }
                segments
            })
            .collect()
    }

    #[test]
    fn chunks_visit_every_key_tile_once_and_the_combine_finds_every_partial() {
        for tiles in [vec![5, 0, 17, 1, 300], vec![64; 8], vec![0, 0], vec![1000, 3, 3, 3], vec![7, 7, 7]] {
            for chunks in [1, 2, 3, 5, 8, 16, 40] {
                let schedule = chunk_schedule(&tiles, chunks);
                let mut seen: Vec<Vec<u32>> = tiles.iter().map(|&t| vec![0; t]).collect();
                let mut written = std::collections::HashMap::new(); // (chunk, slot) -> item
                for (c, segments) in schedule.iter().enumerate() {
                    for &(item, from, to, slot) in segments {
                        assert!(from < to, "{tiles:?} / {chunks}: an empty segment");
                        seen[item][from..to].iter_mut().for_each(|n| *n += 1);
                        if let Some(slot) = slot {
                            assert!(written.insert((c, slot), item).is_none(), "{tiles:?} / {chunks}: chunk {c} slot {slot} twice");
                        }
                    }
                }
                assert!(seen.iter().flatten().all(|&n| n == 1), "{tiles:?} / {chunks}: a tile not visited once");
                // The combine's view: an item's parts are the chunks its tiles span.
                let per = tiles.iter().sum::<usize>().div_ceil(chunks).max(1);
                let mut before = 0;
                for (item, &t) in tiles.iter().enumerate() {
                    if t > 0 {
                        let (first, last) = (before / per, (before + t - 1) / per);
                        for (c, segments) in schedule.iter().enumerate().take(last + 1).skip(first) {
                            let slot = usize::from(c == first && before % per != 0);
                            let whole = segments.iter().any(|&(i, _, _, s)| i == item && s.is_none());
                            assert_eq!(whole, first == last, "{tiles:?} / {chunks}: item {item}");
                            if first != last {
                                assert_eq!(written.get(&(c, slot)), Some(&item), "{tiles:?} / {chunks}: item {item} chunk {c}");
                            }
                        }
                    }
                    before += t;
                }
            }
        }
        // Two slots of a query tile's rows per chunk and head: B8 decode, Hkv8 heads of 4 rows.
        let shape = ProblemShape { batch: 8, seqlen_q: 4, seqlen_k: 4096, heads_q: 8, heads_kv: 8, head_dim: 128, head_dim_v: 128 };
        assert_eq!(chunked_partial_rows(&shape, Tile { block_m: 64, block_n: 128, warps: 4, stages: 3 }, 2), 2 * 16 * 8 * 4);
    }

    #[test]
    fn a_full_grid_is_not_split() {
        assert_eq!(num_splits(264, 64, 264), 1);
        assert_eq!(num_splits(1000, 64, 264), 1);
        assert_eq!(num_splits(8, 1, 264), 1, "one key tile cannot be split");
    }

    #[test]
    fn decode_grids_are_split_to_fill_a_wave() {
        // B8 Hkv8 decode at 2 CTAs a SM on 132 SMs: 4 splits fill 256 of 264 slots.
        assert_eq!(num_splits(64, 32, 264), 4);
        // B1: many splits, each with the same number of key tiles.
        let s = num_splits(8, 1024, 264);
        assert!((26..=33).contains(&s), "{s}");
        assert_eq!(effective_splits(1024, s), s);
        // Never more splits than key tiles.
        assert!(num_splits(1, 3, 264) <= 3);
    }

    #[test]
    fn splits_cover_every_key_tile_once_and_none_is_empty() {
        // As the kernel deals them: split s takes tiles [s * per, min(tiles, (s + 1) * per)).
        for key_tiles in 1..300 {
            for wanted in 1..=key_tiles.min(MAX_SPLITS) {
                let splits = effective_splits(key_tiles, wanted);
                let per = tiles_per_split(key_tiles, splits);
                let mut seen = vec![0; key_tiles];
                for s in 0..splits {
                    let (begin, end) = ((s * per).min(key_tiles), ((s + 1) * per).min(key_tiles));
                    assert!(begin < end, "split {s} of {splits} empty for {key_tiles} tiles");
                    seen[begin..end].iter_mut().for_each(|n| *n += 1);
                }
                assert!(seen.iter().all(|&n| n == 1), "{key_tiles} tiles, {wanted} splits");
            }
        }
    }

    /// One arch of each shared-memory class, with the most dynamic shared memory a block gets.
    fn archs_and_smem_limits() -> Vec<(Arch, u32)> {
        ["sm_80", "sm_86", "sm_89", "sm_90a"]
            .map(|a| {
                let arch = Arch::parse(a).unwrap();
                let limit = match smem_class(arch) {
                    SmemClass::A100 => 163 * 1024,
                    SmemClass::Small => 99 * 1024,
                    SmemClass::Hopper => 227 * 1024,
                };
                (arch, limit)
            })
            .to_vec()
    }

    #[test]
    fn every_unsplit_tile_fits_its_arch() {
        for (arch, limit) in archs_and_smem_limits() {
            for &d in HEAD_DIMS {
                for causal in [false, true] {
                    for v in variants(arch, DType::BF16, d, causal) {
                        assert!(v.smem_bytes <= limit, "{} on {arch}: {} B", v.name(), v.smem_bytes);
                        assert_eq!(v.tile.block_m % (16 * v.tile.warps), 0, "{}: whole 16-row mma tiles a warp", v.name());
                    }
                }
            }
        }
    }

    #[test]
    fn dropout_tiles_hold_whole_mask_cells_and_fit_every_arch() {
        let dropout = ScoreMods { dropout: true, ..ScoreMods::default() };
        for (arch, limit) in archs_and_smem_limits() {
            for &d in HEAD_DIMS {
                let v = with_mods(&variant(arch, DType::BF16, d, false, 4096), dropout);
                let want = if (65..=128).contains(&d) { (128, 32) } else { (64, 64.min(v.tile.block_n)) };
                assert_eq!((v.tile.block_m, v.tile.block_n, v.tile.warps), (want.0, want.1, 4), "{}", v.name());
                assert_eq!(v.tile.block_n % 32, 0, "{}: whole 32-key cells of the mask", v.name());
                assert!(v.smem_bytes <= limit, "{} on {arch}: {} B", v.name(), v.smem_bytes);
            }
        }
    }

    #[test]
    fn every_split_tile_fits_its_arch() {
        for (arch, limit) in archs_and_smem_limits() {
            for &d in HEAD_DIMS {
                let v = split_variant(arch, DType::BF16, d, false);
                assert!(v.smem_bytes <= limit, "{} on {arch}: {} B", v.name(), v.smem_bytes);
                assert!(v.split_kv && v.name().ends_with("_splitkv"));
            }
        }
    }

    #[test]
    fn paged_split_tiles_over_small_pages_take_a_third_slot_on_hopper_only_and_fit() {
        for (arch, limit) in archs_and_smem_limits() {
            for &d in HEAD_DIMS {
                let split = split_variant(arch, DType::BF16, d, false);
                let paged = paged_form(arch, &split, 16);
                let deeper = smem_class(arch) == SmemClass::Hopper;
                assert_eq!(paged.tile.stages, if deeper { 3 } else { 2 }, "{}", paged.name());
                assert_eq!(paged.smem_bytes, smem_bytes(paged.tile, d));
                assert!(paged.smem_bytes <= limit, "{} on {arch}: {} B", paged.name(), paged.smem_bytes);
                assert_eq!(Variant { paged: false, tile: split.tile, smem_bytes: split.smem_bytes, ..paged.clone() }, split);
                // Pages holding whole key blocks, and contiguous caches, keep the dense ring.
                for page_size in [split.tile.block_n as usize, 256, 0] {
                    assert_eq!(paged_form(arch, &split, page_size), Variant { paged: true, ..split.clone() }, "page {page_size}");
                }
                // Unsplit tiles keep their ring.
                let whole = variant(arch, DType::BF16, d, false, 4096);
                assert_eq!(paged_form(arch, &whole, 16), Variant { paged: true, ..whole });
            }
        }
    }

    #[test]
    fn hopper_d256_takes_the_single_buffer_tile_up_to_1k_keys() {
        let h100 = Arch::parse("sm_90a").unwrap();
        for causal in [false, true] {
            let short = variant(h100, DType::BF16, 256, causal, 1024);
            assert_eq!((short.tile.block_m, short.tile.block_n, short.tile.warps, short.tile.stages), (64, 64, 4, 1));
            assert_eq!(short.smem_bytes, 96 * 1024, "two CTAs an SM");
            assert!(!short.longest_first(), "single-buffer tiles keep the 3-D grid");
            let long = variant(h100, DType::BF16, 256, causal, 1025);
            assert_eq!((long.tile.block_m, long.tile.stages), (128, 2));
            assert_eq!(long.longest_first(), causal);
            let all = variants(h100, DType::BF16, 256, causal);
            assert!(all.contains(&short) && all.contains(&long) && all.len() == 2);
        }
        // Other head dims and archs have one unsplit tile whatever the key count.
        for arch in ["sm_80", "sm_86", "sm_89", "sm_90a"] {
            let arch = Arch::parse(arch).unwrap();
            for &d in HEAD_DIMS {
                if d == 256 && smem_class(arch) == SmemClass::Hopper {
                    continue;
                }
                assert_eq!(variant(arch, DType::F16, d, true, 1), variant(arch, DType::F16, d, true, 1 << 20));
                assert_eq!(variants(arch, DType::F16, d, true).len(), 1);
            }
        }
    }
}
