//! The Hopper forward kernel (`fwd_sm90.cu` beside this file, sm_90a): tile configurations,
//! its grid, the shape of the TMA boxes it reads Q, K and V through, and its L2 sections.
//! The launch (tensor maps, tile schedule) is `crate::launch`'s.

use super::steps::{Entry, Extra, FwdFacts, MapOver, Step};
use super::{Family, KernelFamily, ScoreMods, Tile, Variant};
use crate::jit::Arch;
use crate::shape::ProblemShape;
use crate::tensor::DType;

/// Head dims with a compiled variant.
pub const HEAD_DIMS: &[usize] = &[64, 96, 128, 192, 256];

/// Elements of one 128-byte swizzle row: the TMA box's inner extent.
pub(crate) const SWIZZLE_ROW_ELEMS: u32 = 64;

/// Query rows of one consumer warpgroup: the rows of O each of its TMA stores writes.
pub(crate) const WARPGROUP_ROWS: u32 = 64;

/// The tile for `head_dim`: consumer warpgroups of 64 query rows plus one producer
/// warpgroup. D64 is bound by the exp unit as much as the tensor cores, so it runs 3
/// consumers (192 rows) and 3 stages; D128's 192-wide key block (the widest whose two K/V
/// stages fit: 226 KB) measured ~7% over 128 (as 176) and +2% over 176 (pooled at 16k);
/// D192 takes FlashAttention-3's 112-wide key block (two stages in 218 KB); D256 needs an
/// 80-wide key block to fit two K/V stages in 227 KB. `short`: few keys, where smaller tiles
/// waste less on the diagonal (causal) and on the last partial tile: D64 128 rows (2
/// consumers), D128 128 keys, D192 and D256 64 keys. D96 runs as D128 (see padded_head_dim).
fn tile(head_dim: usize, short: bool) -> Tile {
    match (head_dim, short) {
        (0..=64, false) => Tile { block_m: 192, block_n: 128, warps: 16, stages: 3 },
        (0..=64, true) => Tile { block_m: 128, block_n: 128, warps: 12, stages: 3 },
        (65..=128, false) => Tile { block_m: 128, block_n: 192, warps: 12, stages: 2 },
        (65..=128, true) => Tile { block_m: 128, block_n: 128, warps: 12, stages: 2 },
        (129..=192, false) => Tile { block_m: 128, block_n: 112, warps: 12, stages: 2 },
        (_, false) => Tile { block_m: 128, block_n: 80, warps: 12, stages: 2 },
        (_, true) => Tile { block_m: 128, block_n: 64, warps: 12, stages: 2 },
    }
}

/// Problems with at most this many keys take the short tiles (0: never). Measured on H100
/// (bf16 TFLOPS, sweep, short / default tile, docs/kernels/fwd_sm90.md): D64 causal S512 217 / 205,
/// 1k 310 / 281, 2k tie, then -5 to -10%; D64 full ties to 1k, then -5 to -10%; D128 causal
/// S512 278 / 236, 1k 440 / 398, 2k 553 / 534, 4k 617 / 567 (median of three rounds),
/// 8k-16k -5 to -8% (against 128 x 176); D128 full S512 513 / 498, 1k 587 / 566, 2k -1%; D256 causal S512
/// 302 / 288, 1k 458 / 469.
fn short_max_keys(head_dim: usize, causal: bool) -> usize {
    match (head_dim, causal) {
        (0..=64, true) => 1024,
        (0..=64, false) => 0,
        (65..=128, true) => 4096,
        (65..=128, false) => 1024,
        (_, true) => 512,
        (_, false) => 0,
    }
}

/// Dynamic shared memory: Q plus `stages` K and V tiles (2 bytes an element; V's
/// `head_dim_v` wide), the barriers (padded to the 1024-byte alignment of the tiles), and 1024
/// bytes of slack to align the base for the 128-byte swizzle. The kernel checks it against
/// its own layout (FC_SMEM_BYTES).
fn smem_bytes(tile: Tile, head_dim: usize, head_dim_v: usize) -> u32 {
    let (d, dv) = (padded_head_dim(head_dim) as u32, padded_head_dim(head_dim_v) as u32);
    2 * (tile.block_m * d + tile.stages * tile.block_n * (d + dv)) + 2 * 1024
}

/// The e4m3 forms' tile (`FC_FP8`): 128 queries x 128 keys, two consumer warpgroups, two
/// stages. V^T's key block is whole 128-key panels (a 128-byte swizzle row), and at 128 keys
/// the scores (64 registers a thread), O (D128: 64) and P's e4m3 operand (32) fit 240.
const E4M3_TILE: Tile = Tile { block_m: 128, block_n: 128, warps: 12, stages: 2 };

/// The e4m3 forms' head dim in the tiles: whole 128-value panels (D64 runs as D128).
fn e4m3_padded_head_dim(head_dim: usize) -> usize {
    head_dim.div_ceil(128) * 128
}

/// [`smem_bytes`] of the e4m3 forms: a byte an element, V's stages holding V^T (Dv rows of the
/// block's keys, the same bytes as V's); O (bf16, 128 x Dv) fits in them.
fn e4m3_smem_bytes(tile: Tile, head_dim: usize) -> u32 {
    let d = e4m3_padded_head_dim(head_dim) as u32;
    tile.block_m * d + tile.stages * tile.block_n * 2 * d + 2 * 1024
}

/// [`smem_bytes`] of a form under `mods`: with `qv`, its tile (`block_m` x Dv) beside Q's.
fn smem_bytes_with(tile: Tile, head_dim: usize, head_dim_v: usize, mods: ScoreMods) -> u32 {
    let qv = if mods.qv { 2 * tile.block_m * padded_head_dim(head_dim_v) as u32 } else { 0 };
    smem_bytes(tile, head_dim, head_dim_v) + qv
}

/// The head dim the kernel's tiles have: whole 64-column panels (D96 runs as D128, its
/// columns past 96 zero-filled by TMA and never stored).
fn padded_head_dim(head_dim: usize) -> usize {
    head_dim.div_ceil(64) * 64
}

/// The variant for one (dtype, head dim, mask) and `seqlen_k` keys.
pub fn variant(dtype: DType, head_dim: usize, causal: bool, seqlen_k: usize) -> Variant {
    make_variant(dtype, head_dim, causal, seqlen_k <= short_max_keys(head_dim, causal))
}

/// The variant for `shape` on a GPU of `sm_count` SMs: [`variant`], or the short tile where
/// the default one would leave SMs idle and the short tile makes more query tiles (one short
/// sequence with few heads: B1 H8 S2k D64 causal is 88 tiles of 192 rows for 132 SMs, but 128
/// tiles of 128 rows; each CTA then runs one tile, and the longest tile sets the time).
pub fn variant_for(dtype: DType, shape: &ProblemShape, causal: bool, sm_count: usize) -> Variant {
    let default = variant(dtype, shape.head_dim, causal, shape.seqlen_k);
    if short_max_keys(shape.head_dim, causal) == 0 || dtype == DType::E4M3 {
        return default;
    }
    let short = make_variant(dtype, shape.head_dim, causal, true);
    let tiles = default.query_tiles(shape);
    if tiles < sm_count && short.query_tiles(shape) > tiles {
        short
    } else {
        default
    }
}

/// `v` under the score policies `mods`: with a softcap and ALiBi both, D64 to D128 take the
/// short tile: their default tiles hold too many scores a thread for the two transforms'
/// temporaries (NVRTC 13.0 spills 32 bytes at D64's 192 x 128, 192 to 240 at D128's 128 x 192;
/// the 128 x 128 tiles none). With dropout, the three-warpgroup tile (D64's 192 x 128, 160
/// registers a consumer) and the 192-key ones (D96-D128) take the short tile too: the mask's
/// generator spilled 292-304 bytes on the first and 1,448 on the second's packed form (NVRTC
/// 13.0), nothing on the others.
/// V's own head dim takes the tiles of the wider of Q's and V's dims (see [`value_variant`]).
/// e4m3 forms keep their one tile.
pub fn with_mods(v: &Variant, mods: ScoreMods) -> Variant {
    if v.dtype == DType::E4M3 {
        return Variant { mods, ..v.clone() };
    }
    let d = v.head_dim.unwrap_or(128);
    let dv = v.head_dim_v.unwrap_or(d);
    let short = (mods.softcap && mods.alibi && d.max(dv) <= 128) || (mods.dropout && (v.tile.warps > 12 || v.tile.block_n > 128));
    let tile = if short { tile(d.max(dv), true) } else { v.tile };
    Variant { mods, tile, smem_bytes: smem_bytes_with(tile, d, dv, mods), ..v.clone() }
}

/// Every variant for one (dtype, head dim, mask): the default tile, and the short one where
/// it is used; then the forms of V's own head dims beside this one ([`VALUE_HEAD_DIMS`]).
pub fn variants(dtype: DType, head_dim: usize, causal: bool) -> Vec<Variant> {
    if dtype == DType::E4M3 {
        // One tile; e4m3 rows are whole 16 bytes (FlashAttention-3's rule).
        return if head_dim.is_multiple_of(16) { vec![make_variant(dtype, head_dim, causal, false)] } else { Vec::new() };
    }
    let mut out = vec![make_variant(dtype, head_dim, causal, false)];
    if short_max_keys(head_dim, causal) > 0 {
        out.push(make_variant(dtype, head_dim, causal, true));
    }
    for &(_, head_dim_v) in VALUE_HEAD_DIMS.iter().filter(|(d, _)| *d == head_dim) {
        let form = value_variant(dtype, head_dim, head_dim_v, causal);
        if QV_HEAD_DIMS.contains(&(head_dim, head_dim_v)) {
            out.push(with_mods(&form, ScoreMods { qv: true, ..ScoreMods::default() }));
        }
        out.push(form);
    }
    out
}

/// The pairs of [`VALUE_HEAD_DIMS`] with a `qv` form (`FC_QV`, FlashAttention-3's absorbed
/// MLA term: `s = scale · (q·kᵀ + qv·vᵀ)`, `qv` `[B, Sq, Hq, Dv]`), over dense keys, forward
/// only (as FlashAttention-3's: its backward takes no `qv`). The Qv tile (`block_m` x Dv, 64 KB
/// at (64, 256)) loads with Q; V of a key block is waited before its scores, read K-major for
/// `qv·vᵀ` as K is for `q·kᵀ`, and MN-major for P·V as always.
pub const QV_HEAD_DIMS: &[(usize, usize)] = &[(64, 256)];

/// The (head dim, V's head dim) pairs with forward forms of their own, over dense and packed
/// keys (`dispatch::value_head_dim_form`): DeepSeek-V3's prefill (Q and K 192, V 128;
/// backward too: `bwd_sm90::VALUE_HEAD_DIMS`) and FlashAttention-3's (64, 256) (Q and K 64, V
/// 256; its backward runs with Q and K zero-padded to 256, as FlashAttention-3's does).
/// Checked against the f64 reference by `flashcore check` (`--value-dim` alone).
pub const VALUE_HEAD_DIMS: &[(usize, usize)] = &[(192, 128), (64, 256)];

/// The form of `head_dim` with V's `head_dim_v` (one of [`VALUE_HEAD_DIMS`]): the tile of the
/// wider of the two, since O's registers (Dv / 2 a thread) and the K and V stages grow with it
/// (D192 / Dv128: D192's 128 x 112, 190 KB; D64 / Dv256: D256's 128 x 80, 118 KB), its V and
/// O tiles Dv wide, Q's and K's D.
pub fn value_variant(dtype: DType, head_dim: usize, head_dim_v: usize, causal: bool) -> Variant {
    let wider = make_variant(dtype, head_dim.max(head_dim_v), causal, false);
    let smem_bytes = smem_bytes(wider.tile, head_dim, head_dim_v);
    Variant { head_dim: Some(head_dim), head_dim_v: Some(head_dim_v), smem_bytes, ..wider }
}

/// The variant of one (dtype, head dim, mask) at the default or short tile (e4m3: its one tile).
fn make_variant(dtype: DType, head_dim: usize, causal: bool, short: bool) -> Variant {
    let (tile, smem_bytes) = match dtype {
        DType::E4M3 => (E4M3_TILE, e4m3_smem_bytes(E4M3_TILE, head_dim)),
        _ => (tile(head_dim, short), smem_bytes(tile(head_dim, short), head_dim, head_dim)),
    };
    Variant {
        family: KernelFamily::FwdSm90,
        dtype,
        head_dim: Some(head_dim),
        head_dim_v: None,
        causal: Some(causal),
        tile,
        smem_bytes,
        split_kv: false,
        mods: ScoreMods::default(),
        varlen: false,
        paged: false,
        spread_pages: false,
    }
}

/// `v`'s paged-KV form (`FC_PAGED`) for pages of `page_size` keys (0: a contiguous cache):
/// where a page cuts a key block into more than 3 TMA boxes (D128's 192-key block at page 16:
/// 12), the `FC_PAGE_SPREAD` form, whose boxes lane 0 of each of the producer warpgroup's four
/// warps issue. H100 chunked prefill (docs/kernels/fwd_sm90.md): one thread issuing
/// them ran at 0.47-0.57 of the contiguous rate at page 16, four at 0.84-0.89 (0.93-1.03
/// timed at the power cap's own clock). At pages of 3 boxes (64, 256) one thread
/// keeps up; those keep the plain form, whose machine code the spread form leaves unchanged
/// (an 8-13% loss the first runs put on the four threads there was the order of
/// the rows under the power cap).
pub fn paged_form(v: &Variant, page_size: usize) -> Variant {
    let boxes = match page_size {
        0 => 1,
        _ => v.tile.block_n / page_box_rows(page_size as u32, v.tile.block_n),
    };
    Variant { paged: true, spread_pages: boxes > 3, ..v.clone() }
}

/// Rows of one TMA box of a paged K or V load (`FwdParams::page_box_rows`): the largest
/// that divides both the page and the key block, so that a box never straddles two pages
/// and a key block is whole boxes (D128's 192-key block: one box at page size 192, 3 of 64
/// rows at 64 or 256, 12 of 16 at 16).
pub fn page_box_rows(page_size: u32, block_n: u32) -> u32 {
    let (mut a, mut b) = (page_size, block_n);
    while b != 0 {
        (a, b) = (b, a % b);
    }
    a
}

/// Grid for `shape`: one CTA per SM (fewer if there are fewer query tiles), each looping
/// over the tiles it claims from the tile counter (`common/tile_scheduler.cuh`).
pub fn grid(variant: &Variant, shape: &ProblemShape, sm_count: u32) -> (u32, u32, u32) {
    (variant.query_tiles(shape).min(sm_count as usize).max(1) as u32, 1, 1)
}

/// Defines beyond the common ones: the consumer warpgroups, and the shared-memory size the
/// launch gives, which the kernel checks against its own layout at compile time.
pub fn extra_defines(variant: &Variant) -> Vec<(String, String)> {
    vec![("FC_CONSUMER_WG".into(), (variant.tile.warps / 4 - 1).to_string()), ("FC_SMEM_BYTES".into(), variant.smem_bytes.to_string())]
}

/// Keys up to which a causal launch takes the smaller L2 section below.
const SHORT_SECTION_MAX_KEYS: usize = 1024;
/// The smaller section's K and V bytes.
const SHORT_SECTION_BYTES: u64 = 8 << 20;

/// Heads per longest-first section (causal): `tile_section` (K and V within 32 MiB of L2),
/// but with few keys and D <= 128 as many as have K and V within 8 MiB, as long as a section
/// still holds one tile for each CTA. With few keys a 32 MiB section spans hundreds of heads,
/// whose K and V do not stay in L2 from a head's longest tile to its shortest (ncu, B32 H32
/// S512 D64: 262 MB read from DRAM for 201 MB of Q, K and V). H100, against 32 MiB
/// (docs/kernels/fwd_sm90.md): S512 D64 +4%, D128 +19%; S1k D64 +6%, D128 +3%. D256 S1k lost 6% (its
/// eight tile lengths need more than a round a section to balance), and from 2k keys on
/// smaller sections lost 1-10%: those keep the launch's section.
/// fwd_sm90's main launch: `main` with the tensor maps (Q and K, V loads, O stores by
/// warpgroup rows) and the tile schedule. Paged with a block table, K and V are the page pools,
/// whose maps take boxes of `facts.page_box_rows` rows.
/// With `qv` (`FC_QV`), a fifth map over the call's fifth view, `qv`, in Q's boxes.
/// e4m3: the third map is over V^T (`launch::forward`'s view of `fc_fp8_transpose_v`'s output),
/// boxes of its padded head dim's rows.
pub(crate) fn main_step(main: Step, variant: &Variant, shape: &ProblemShape, facts: FwdFacts) -> Step {
    let kv_rows = facts.page_box_rows.unwrap_or(variant.tile.block_n);
    let v_rows = if variant.dtype == DType::E4M3 { e4m3_padded_head_dim(shape.head_dim_v) as u32 } else { kv_rows };
    let maps = [(0, variant.tile.block_m), (1, kv_rows), (2, v_rows), (3, WARPGROUP_ROWS)].map(|(view, rows)| MapOver { view, rows });
    let qv = variant.mods.qv.then_some(MapOver { view: 4, rows: variant.tile.block_m });
    let section = section_heads(facts.tile_section, shape, variant.tile.block_m, main.grid.0);
    Step { extra: Extra::MapsAndSchedule { maps, qv, section }, ..main }
}

/// Keys of a V^T row (`FwdParams::vt_keys`): `seqlen_k` rounded up to whole 32-key groups (P's
/// operand order permutes keys within one: `common/fp8.cuh`); its rows then start 16-byte aligned
/// as TMA needs.
pub(crate) fn vt_keys(seqlen_k: usize) -> usize {
    seqlen_k.next_multiple_of(32)
}

/// The e4m3 forms' V transpose (`fc_fp8_transpose_v`, the variant's first aux entry): a CTA of
/// 256 threads a 64-key x 64-column tile of one (batch, KV head).
pub(crate) fn transpose_step(shape: &ProblemShape) -> Step {
    let grid = (vt_keys(shape.seqlen_k).div_ceil(64) as u32, shape.head_dim_v.div_ceil(64) as u32, (shape.batch * shape.heads_kv) as u32);
    Step::plain(Entry::Aux(0), grid, 256, 0, "V transposed")
}

pub(crate) fn section_heads(tile_section: i32, shape: &ProblemShape, block_m: u32, ctas: u32) -> i32 {
    if shape.seqlen_k > SHORT_SECTION_MAX_KEYS || shape.head_dim > 128 {
        return tile_section;
    }
    let m_blocks = (shape.seqlen_q.max(1) as u64).div_ceil(block_m as u64);
    let one_round = (ctas as u64).div_ceil(m_blocks);
    super::heads_within(shape, SHORT_SECTION_BYTES, one_round)
}

/// fwd_sm90 as a [`Family`]: sm_90a, every multiple of 8 up to 256, its tiles for short and
/// long keys, a persistent grid ([`grid`]), its tiles under score policies ([`with_mods`]).
pub(crate) struct Spec;

impl Family for Spec {
    fn needs_sm90a(&self) -> bool {
        true
    }

    fn head_dims(&self) -> &'static [usize] {
        HEAD_DIMS
    }

    fn dtypes(&self) -> &'static [DType] {
        &[DType::F16, DType::BF16, DType::E4M3]
    }

    fn variants_at(&self, _: Arch, dtype: DType, head_dim: usize, causal: bool) -> Vec<Variant> {
        variants(dtype, head_dim, causal)
    }

    fn source(&self, v: &Variant, defines: &mut Vec<(String, String)>) -> (&'static str, &'static str) {
        defines.extend(extra_defines(v));
        ("fwd_sm90.cu", "fc_fwd_sm90")
    }

    fn with_mods(&self, v: &Variant, mods: ScoreMods) -> Variant {
        with_mods(v, mods)
    }

    /// Prefill and chunked prefill on Hopper: pages of 16 keys and whole key blocks (none for
    /// V's own head dim: a cache's pools share one).
    fn paged_forms(&self, _: Arch, v: &Variant) -> Vec<Variant> {
        if v.head_dim_v.is_some() {
            return Vec::new();
        }
        vec![paged_form(v, 16), paged_form(v, 0)]
    }

    fn grid(&self, v: &Variant, shape: &ProblemShape, sm_count: u32, _: u32) -> (u32, u32, u32) {
        grid(v, shape, sm_count)
    }

    fn main_step(&self, main: Step, v: &Variant, shape: &ProblemShape, facts: FwdFacts) -> Step {
        main_step(main, v, shape, facts)
    }

    fn before_main(&self, v: &Variant, shape: &ProblemShape) -> Option<Step> {
        (v.dtype == DType::E4M3).then(|| transpose_step(shape))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kernels::steps::testing::shape;

    #[test]
    fn e4m3_forms_take_one_tile_and_transpose_v_before_the_main_launch() {
        // D64 and D96 run as D128, D192 as D256 (whole 128-value panels); e4m3 rows are whole
        // 16 bytes, so D40 has none.
        for (d, smem) in [(64, 83_968), (96, 83_968), (128, 83_968), (192, 165_888), (256, 165_888)] {
            let forms = variants(DType::E4M3, d, true);
            assert_eq!(forms.len(), 1, "D{d}");
            assert_eq!((forms[0].tile, forms[0].smem_bytes), (E4M3_TILE, smem), "D{d}");
            assert_eq!(with_mods(&forms[0], ScoreMods { local: true, ..ScoreMods::default() }).smem_bytes, smem);
        }
        assert!(variants(DType::E4M3, 40, false).is_empty());
        let v = variant(DType::E4M3, 128, true, 16384);
        let s = ProblemShape { seqlen_k: 1000, ..shape(2, 1000, 1000, 128) };
        let hopper = Arch { major: 9, minor: 0, specific: true };
        let facts = FwdFacts { new_keys: 0, combined: false, page_box_rows: None, tile_section: 16 };
        let launched = crate::kernels::steps::forward(&v, &s, 1, 132, hopper, facts).unwrap();
        assert_eq!(launched.iter().map(|s| s.entry).collect::<Vec<_>>(), [Entry::Aux(0), Entry::Main]);
        // 1000 keys round up to 1024 (32-key groups): 16 tiles of 64 keys, 2 of 64 columns, B·Hkv.
        assert_eq!((launched[0].grid, launched[0].block), ((16, 2, 8), 256));
        let Extra::MapsAndSchedule { maps, .. } = launched[1].extra else { panic!("{:?}", launched[1].extra) };
        assert_eq!((maps[2].view, maps[2].rows), (2, 128), "V^T's boxes are its padded head dim's rows");
        assert_eq!(vt_keys(1000), 1024);
        assert_eq!(v.entries().aux, ["fc_fp8_transpose_v"]);
        let source = v.source();
        assert!(source.defines.contains(&("FC_FP8".into(), "1".into())) && source.defines.contains(&("FC_DTYPE_BF16".into(), "1".into())));
    }

    #[test]
    fn pages_of_more_than_three_boxes_a_block_take_the_spread_form() {
        let d128 = variant(DType::BF16, 128, true, 16384);
        let spread = |page_size| paged_form(&d128, page_size).spread_pages;
        assert_eq!(d128.tile.block_n, 192);
        assert!(spread(16) && spread(32), "12 and 6 boxes of a 192-key block");
        assert!(!spread(64) && !spread(256) && !spread(192) && !spread(0), "3, 3, 1 box; a contiguous cache");
        assert!(paged_form(&d128, 16).name().ends_with("_paged_spread") && paged_form(&d128, 64).name().ends_with("_paged"));
        let d256 = variant(DType::BF16, 256, true, 16384);
        assert!(paged_form(&d256, 64).spread_pages && !paged_form(&d256, 80).spread_pages, "D256's 80-key block: 5 boxes at 64");
    }

    #[test]
    fn short_problems_take_the_small_tiles() {
        assert_eq!(variant(DType::BF16, 128, true, 4096).tile.block_n, 128);
        assert_eq!(variant(DType::BF16, 128, true, 4097).tile.block_n, 192);
        assert_eq!(variant(DType::BF16, 128, false, 1024).tile.block_n, 128);
        assert_eq!(variant(DType::BF16, 128, false, 1025).tile.block_n, 192);
        assert_eq!(variant(DType::BF16, 256, true, 512).tile.block_n, 64);
        assert_eq!(variant(DType::BF16, 256, true, 1024).tile.block_n, 80);
        assert_eq!(variant(DType::BF16, 64, true, 1024).tile.block_m, 128);
        assert_eq!(variant(DType::BF16, 64, false, 512).tile.block_m, 192);
        let d64 = variants(DType::F16, 64, false);
        assert_eq!(d64.len(), 3, "D64 full has one tile, and (64, 256)'s forms with qv and without");
        let (with_qv, fa3) = (&d64[1], &d64[2]);
        assert_eq!((fa3.head_dim_v, fa3.tile, fa3.smem_bytes, fa3.mods.qv), (Some(256), tile(256, false), 120_832, false));
        // qv's tile (128 x 256) beside Q's.
        assert_eq!((with_qv.head_dim_v, with_qv.tile, with_qv.smem_bytes), (Some(256), tile(256, false), 120_832 + 65_536));
        assert!(with_qv.mods.qv && with_qv.name().ends_with("_qv"), "{}", with_qv.name());
        assert_eq!(variants(DType::F16, 256, true).len(), 2);
    }

    #[test]
    fn grids_that_leave_sms_idle_take_the_short_tile_when_it_has_more_tiles() {
        let shape = |batch, heads, s| ProblemShape {
            batch,
            seqlen_q: s,
            seqlen_k: s,
            heads_q: heads,
            heads_kv: heads,
            head_dim: 64,
            head_dim_v: 64,
        };
        // 88 tiles of 192 rows for 132 SMs; 128 of 128 rows.
        assert_eq!(variant_for(DType::BF16, &shape(1, 8, 2048), true, 132).tile.block_m, 128);
        // Enough tiles either way, or no short tile (D64 full): the default.
        assert_eq!(variant_for(DType::BF16, &shape(8, 32, 2048), true, 132).tile.block_m, 192);
        assert_eq!(variant_for(DType::BF16, &shape(1, 8, 2048), false, 132).tile.block_m, 192);
        // Short tiles with the same rows per tile (D128 causal, 128 x 128): nothing gained.
        let d128 = ProblemShape { head_dim: 128, head_dim_v: 128, ..shape(1, 4, 8192) };
        assert_eq!(variant_for(DType::BF16, &d128, true, 132).tile.block_n, 192);
    }

    #[test]
    fn few_keys_take_smaller_l2_sections_that_still_fill_the_gpu() {
        let params = |batch, heads, s, d| ProblemShape {
            batch,
            seqlen_q: s,
            seqlen_k: s,
            heads_q: heads,
            heads_kv: heads,
            head_dim: d,
            head_dim_v: d,
        };
        // D64 S512: 128 KiB of K and V a head, 64 heads in 8 MiB (256 tiles of 128 rows).
        assert_eq!(section_heads(7, &params(32, 32, 512, 64), 128, 132), 64);
        // D128 S512: 32 heads in 8 MiB would be 128 tiles; a round of 132 CTAs needs 33 heads.
        assert_eq!(section_heads(7, &params(32, 16, 512, 128), 128, 132), 33);
        // D256: the launch's own section.
        assert_eq!(section_heads(7, &params(32, 8, 512, 256), 128, 132), 7);
        // Never more heads than there are.
        assert_eq!(section_heads(7, &params(1, 8, 512, 64), 128, 132), 8);
        // From 1025 keys on: the launch's own section.
        assert_eq!(section_heads(7, &params(8, 32, 2048, 64), 192, 132), 7);
    }

    #[test]
    fn d96_runs_as_d128() {
        for causal in [false, true] {
            for sk in [512, 4096] {
                let (d96, d128) = (variant(DType::BF16, 96, causal, sk), variant(DType::BF16, 128, causal, sk));
                assert_eq!((d96.tile, d96.smem_bytes), (d128.tile, d128.smem_bytes));
                assert_eq!(d96.head_dim, Some(96), "the kernel is told the real head dim");
            }
        }
    }

    #[test]
    fn every_variant_fits_hopper_shared_memory() {
        for &d in HEAD_DIMS {
            for v in variants(DType::BF16, d, true).into_iter().chain(variants(DType::BF16, d, false)) {
                assert!(v.smem_bytes <= 227 * 1024, "{}: {}", v.name(), v.smem_bytes);
            }
        }
    }

    #[test]
    fn its_main_launch_passes_the_maps_and_the_schedule() {
        use crate::kernels::steps::{self, Entry};
        let hopper = Arch { major: 9, minor: 0, specific: true };
        let facts = FwdFacts { new_keys: 0, combined: false, page_box_rows: None, tile_section: 16 };
        let v = variant(DType::BF16, 128, false, 4096);
        let s = shape(1, 4096, 4096, 128);
        let launched = steps::forward(&v, &s, 1, 132, hopper, facts).unwrap();
        assert_eq!(launched.iter().map(|s| s.entry).collect::<Vec<_>>(), [Entry::Main]);
        let Extra::MapsAndSchedule { maps, section, qv: None } = launched[0].extra else { panic!("{:?}", launched[0].extra) };
        let rows: Vec<_> = maps.iter().map(|m| (m.view, m.rows)).collect();
        let (m, n) = (v.tile.block_m, v.tile.block_n);
        assert_eq!(rows, [(0, m), (1, n), (2, n), (3, WARPGROUP_ROWS)]);
        assert_eq!(section, section_heads(16, &s, m, launched[0].grid.0));
        let paged = steps::forward(&v, &s, 1, 132, hopper, FwdFacts { page_box_rows: Some(16), ..facts }).unwrap();
        let Extra::MapsAndSchedule { maps, .. } = paged[0].extra else { panic!() };
        assert_eq!((maps[1].rows, maps[2].rows), (16, 16), "K and V boxes of a page pool's rows");
        // qv's form: a fifth map, over the call's fifth view, in Q's boxes.
        let qv = with_mods(&value_variant(DType::BF16, 64, 256, true), ScoreMods { qv: true, ..ScoreMods::default() });
        let s = ProblemShape { head_dim: 64, head_dim_v: 256, ..s };
        let launched = steps::forward(&qv, &s, 1, 132, hopper, facts).unwrap();
        let Extra::MapsAndSchedule { qv: Some(map), .. } = launched[0].extra else { panic!("{:?}", launched[0].extra) };
        assert_eq!((map.view, map.rows), (4, qv.tile.block_m));
    }
}
