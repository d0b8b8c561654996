//! A call's launches as data: each family says what its call launches, in order (which entry
//! point, grid, block, dynamic shared memory, whether it is a programmatic dependent of the
//! launch before it, which arguments follow the parameter struct), and `launch.rs` runs the
//! list. So a family's launch sequence lives with the family (`bwd_sm80::steps`,
//! `bwd_sm90::steps`, `fwd_sm90::main_step`, ...), and a plan's launches can be tested
//! without a GPU.

use super::{bwd_sm80, bwd_sm90, fwd_sm90, reference, KernelFamily, Variant};
use crate::error::{Error, Result};
use crate::jit::Arch;
use crate::shape::ProblemShape;

/// Which function of the variant's module a step launches.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Entry {
    /// The variant's main kernel.
    Main,
    /// A backward family's other kernels (`Variant::entries().aux`, in launch order).
    Aux(usize),
    /// The paged append pre-pass (`fc_paged_append`).
    Append,
    /// The split-KV merge (`fc_split_combine`).
    Combine,
}

/// A TMA tensor map a step passes: over the call's view `view` (forward: q, k, v, o;
/// backward: q, k, v, dout), boxes of `rows` rows.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct MapOver {
    pub view: usize,
    pub rows: u32,
}

/// What a launch passes after the parameter struct.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Extra {
    /// Nothing.
    None,
    /// Four tensor maps (`bwd_sm90`).
    Maps([MapOver; 4]),
    /// Four tensor maps and fwd_sm90's tile schedule, whose section holds this many heads.
    MapsAndSchedule([MapOver; 4], i32),
}

/// One launch.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Step {
    pub entry: Entry,
    pub grid: (u32, u32, u32),
    pub block: u32,
    pub smem: u32,
    /// A programmatic dependent of the launch before it (sm_90+): it may start before that
    /// one ends, and waits for it itself.
    pub dependent: bool,
    pub extra: Extra,
    /// What it computes, for errors ("D_i", "dK, dV", ...).
    pub what: &'static str,
}

impl Step {
    /// A launch of `entry` with no argument after the parameters, not dependent.
    pub(crate) fn plain(entry: Entry, grid: (u32, u32, u32), block: u32, smem: u32, what: &'static str) -> Self {
        Step { entry, grid, block, smem, dependent: false, extra: Extra::None, what }
    }

    /// Whether the grid has no block (a launch that is left out).
    pub(crate) fn is_empty(&self) -> bool {
        self.grid.0 == 0 || self.grid.1 == 0 || self.grid.2 == 0
    }
}

/// One piece of a call's work, in stream order.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Work {
    /// A kernel launch.
    Launch(Step),
    /// Zero this many u32 of dQ's f32 accumulator (bwd_sm80; bwd_sm90's prep zeroes its own).
    ZeroDqAccum(usize),
}

/// What the forward's launches depend on besides the variant and the plan.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct FwdFacts {
    /// New keys appended to a KV cache first (a pre-pass), 0 for none.
    pub new_keys: usize,
    /// Whether the main kernel writes split-KV partials that a combine merges.
    pub combined: bool,
    /// Rows of fwd_sm90's K and V boxes over a paged cache's pools (`fwd_sm90::page_box_rows`),
    /// `None` where K and V are not pools.
    pub page_box_rows: Option<u32>,
    /// `FwdParams::tile_section`: heads an L2 section holds.
    pub tile_section: i32,
}

/// The forward's launches for `variant` over `shape` (the kernel's, as planned) in `splits`
/// splits: the paged append pre-pass when keys are appended, the main kernel, the split-KV
/// combine when the plan splits. On sm_90+ the main kernel after an append, and the combine,
/// are programmatic dependents of the launch before them.
pub(crate) fn forward(
    variant: &Variant,
    shape: &ProblemShape,
    splits: u32,
    sm_count: u32,
    arch: Arch,
    facts: FwdFacts,
) -> Result<Vec<Step>> {
    let pdl = arch.major >= 9;
    let overflow = |what: &str, n: u64| Error::Unsupported { kernel: variant.name(), msg: format!("{n} {what} overflow its grid") };
    let mut steps = Vec::with_capacity(3);
    if facts.new_keys > 0 {
        // One 16-byte chunk of k_new or v_new a thread, 128 threads a block.
        let chunks = (shape.batch * facts.new_keys * shape.heads_kv * (shape.head_dim / 8)) as u64;
        let blocks = u32::try_from(chunks.div_ceil(128)).map_err(|_| overflow("appended chunks", chunks))?;
        steps.push(Step::plain(Entry::Append, (blocks, 1, 1), 128, 0, "the append"));
    }
    let (grid, block) = variant.grid(shape, sm_count, splits);
    let main = Step { dependent: pdl && facts.new_keys > 0, ..Step::plain(Entry::Main, grid, block, variant.smem_bytes, "attention") };
    steps.push(match variant.family {
        KernelFamily::FwdSm90 => fwd_sm90::main_step(main, variant, shape, facts),
        _ => main,
    });
    if facts.combined {
        // One warp a (batch, head, query) row, four rows a block.
        let rows = (shape.batch * shape.heads_q * shape.seqlen_q) as u64;
        let blocks = u32::try_from(rows.div_ceil(4)).map_err(|_| overflow("query rows", rows))?;
        steps.push(Step { dependent: pdl, ..Step::plain(Entry::Combine, (blocks, 1, 1), 128, 0, "the combine") });
    }
    Ok(steps)
}

/// What the backward's launches depend on besides the variant.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct BwdFacts {
    /// The kernels' shape (packed: B sequences of the longest lengths).
    pub shape: ProblemShape,
    /// The tensors' own (packed: one batch of `total_q` rows).
    pub tensors: ProblemShape,
    /// A packed batch.
    pub packed: bool,
    /// bwd_sm80's slices of dQ's accumulator (1 unless deterministic).
    pub dq_splits: usize,
    /// Deterministic mode.
    pub deterministic: bool,
}

/// The backward's work for `variant`, its family's sequence (see each family's `steps`).
pub(crate) fn backward(variant: &Variant, facts: &BwdFacts) -> Vec<Work> {
    match variant.family {
        KernelFamily::BwdSm80 => bwd_sm80::steps(variant, facts),
        KernelFamily::BwdSm90 => bwd_sm90::steps(variant, facts),
        _ => reference::backward_steps(&facts.shape),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kernels::fwd_sm80;
    use crate::tensor::DType;

    const HOPPER: Arch = Arch { major: 9, minor: 0, specific: true };
    const AMPERE: Arch = Arch { major: 8, minor: 0, specific: false };

    fn shape(batch: usize, seqlen_q: usize, seqlen_k: usize, head_dim: usize) -> ProblemShape {
        ProblemShape { batch, seqlen_q, seqlen_k, heads_q: 16, heads_kv: 4, head_dim }
    }

    fn facts() -> FwdFacts {
        FwdFacts { new_keys: 0, combined: false, page_box_rows: None, tile_section: 16 }
    }

    #[test]
    fn a_plain_forward_is_one_launch_of_the_main_kernel() {
        let v = fwd_sm80::variant(AMPERE, DType::BF16, 128, true, 1000);
        let s = shape(2, 1000, 1000, 128);
        let steps = forward(&v, &s, 1, 108, AMPERE, facts()).unwrap();
        let (grid, block) = v.grid(&s, 108, 1);
        assert_eq!(steps, [Step::plain(Entry::Main, grid, block, v.smem_bytes, "attention")]);
    }

    #[test]
    fn an_append_comes_first_and_the_main_kernel_depends_on_it_on_hopper() {
        let v = fwd_sm80::split_variant(HOPPER, DType::BF16, 128, false);
        let s = shape(3, 1, 4096, 128);
        let steps = forward(&v, &s, 4, 132, HOPPER, FwdFacts { new_keys: 1, combined: true, ..facts() }).unwrap();
        let entries: Vec<_> = steps.iter().map(|s| (s.entry, s.dependent)).collect();
        assert_eq!(entries, [(Entry::Append, false), (Entry::Main, true), (Entry::Combine, true)]);
        // 3 sequences x 1 key x 4 KV heads x 16 chunks of 8 elements: 192 chunks, 2 blocks.
        assert_eq!(steps[0].grid, (2, 1, 1));
        // 3 x 16 heads x 1 row, four a block.
        assert_eq!(steps[2].grid, (12, 1, 1));
        let ampere = forward(&v, &s, 4, 108, AMPERE, FwdFacts { new_keys: 1, combined: true, ..facts() }).unwrap();
        assert!(ampere.iter().all(|s| !s.dependent), "no programmatic dependents before sm_90");
    }

    #[test]
    fn fwd_sm90_passes_its_maps_and_schedule() {
        let v = fwd_sm90::variant(DType::BF16, 128, false, 4096);
        let s = shape(1, 4096, 4096, 128);
        let steps = forward(&v, &s, 1, 132, HOPPER, facts()).unwrap();
        let Extra::MapsAndSchedule(maps, _) = steps[0].extra else { panic!("{:?}", steps[0].extra) };
        let rows: Vec<_> = maps.iter().map(|m| (m.view, m.rows)).collect();
        let (m, n) = (v.tile.block_m, v.tile.block_n);
        assert_eq!(rows, [(0, m), (1, n), (2, n), (3, fwd_sm90::WARPGROUP_ROWS)]);
        let paged = forward(&v, &s, 1, 132, HOPPER, FwdFacts { page_box_rows: Some(16), ..facts() }).unwrap();
        let Extra::MapsAndSchedule(maps, _) = paged[0].extra else { panic!() };
        assert_eq!((maps[1].rows, maps[2].rows), (16, 16), "K and V boxes of a page pool's rows");
    }

    fn bwd(variant: &Variant, s: ProblemShape, deterministic: bool, dq_splits: usize) -> Vec<Work> {
        backward(variant, &BwdFacts { shape: s, tensors: s, packed: false, dq_splits, deterministic })
    }

    fn launches(work: &[Work]) -> Vec<Step> {
        work.iter().filter_map(|w| if let Work::Launch(s) = w { Some(*s) } else { None }).collect()
    }

    #[test]
    fn bwd_sm80_zeroes_the_accumulator_then_d_i_the_main_kernel_and_dq() {
        let v = bwd_sm80::variant(AMPERE, DType::BF16, 64, false);
        let s = shape(2, 300, 300, 64);
        let work = bwd(&v, s, false, 1);
        assert_eq!(work[0], Work::ZeroDqAccum(2 * 300 * 16 * 64));
        let steps = launches(&work);
        let entries: Vec<_> = steps.iter().map(|s| s.entry).collect();
        assert_eq!(entries, [Entry::Aux(0), Entry::Main, Entry::Aux(1)]);
        assert_eq!(steps[0].grid, (75, 16, 2), "D_i: four rows a block");
        assert_eq!(steps[1].grid, (300usize.div_ceil(v.tile.block_n as usize) as u32, 4, 2), "a CTA a key block");
        assert_eq!(steps[2].grid, ((2 * 300 * 16 * 64usize).div_ceil(1024) as u32, 1, 1));
        let det = bwd(&v, s, true, 3);
        assert_eq!(det[0], Work::ZeroDqAccum(3 * 2 * 300 * 16 * 64), "a slice a CTA");
        assert_eq!(launches(&det)[1].grid.0, 3, "dq_splits CTAs a head");
        assert!(steps.iter().all(|s| !s.dependent));
    }

    #[test]
    fn bwd_sm90_runs_prep_then_the_main_kernel_and_dq_as_dependents_with_its_maps() {
        let v = bwd_sm90::variant(DType::BF16, 128, true);
        let s = shape(2, 1000, 1000, 128);
        let work = bwd(&v, s, false, 1);
        assert!(work.iter().all(|w| matches!(w, Work::Launch(_))), "its prep zeroes the accumulator");
        let steps = launches(&work);
        let plan: Vec<_> = steps.iter().map(|s| (s.entry, s.dependent)).collect();
        assert_eq!(plan, [(Entry::Aux(0), false), (Entry::Main, true), (Entry::Aux(1), true)]);
        let (m, n) = (v.tile.block_m, v.tile.block_n);
        let m_blocks = 1000u32.div_ceil(m);
        assert_eq!(steps[0].grid, (m_blocks * m / bwd_sm90::PREP_ROWS, 16, 2));
        assert_eq!(steps[1].grid, (1000u32.div_ceil(n), 4, 2));
        assert_eq!(steps[1].extra, Extra::Maps([(0, m), (1, n), (2, n), (3, m)].map(|(view, rows)| MapOver { view, rows })));
        assert_eq!(steps[2].grid, (m_blocks * bwd_sm90::dq_slices(v.tile, 128), 16, 2));
    }

    #[test]
    fn a_packed_batch_without_queries_leaves_its_empty_launches_out() {
        let v = bwd_sm90::variant(DType::BF16, 64, false);
        let s = shape(2, 0, 100, 64);
        let steps = launches(&backward(&v, &BwdFacts { shape: s, tensors: s, packed: true, dq_splits: 1, deterministic: false }));
        // Prep and dQ have no query block; key block 0 still runs (it zeroes dK and dV).
        assert!(steps[0].is_empty() && steps[2].is_empty() && !steps[1].is_empty(), "{steps:?}");
    }

    #[test]
    fn the_reference_backward_is_dq_then_dk_dv() {
        let v = reference::variant(DType::BF16);
        let steps = launches(&bwd(&v, shape(1, 9, 7, 32), false, 1));
        let grids: Vec<_> = steps.iter().map(|s| (s.entry, s.grid)).collect();
        assert_eq!(grids, [(Entry::Aux(0), (3, 16, 1)), (Entry::Aux(1), (2, 4, 1))]);
    }
}
