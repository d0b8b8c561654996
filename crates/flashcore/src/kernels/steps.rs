//! A call's launches as data: each family says what its call launches, in order (which entry
//! point, grid, block, dynamic shared memory, whether it is a programmatic dependent of the
//! launch before it, which arguments follow the parameter struct), and `launch.rs` runs the
//! list. So a family's launch sequence lives with the family (`Family::backward_steps`,
//! `Family::main_step`: `bwd_sm80::steps`, `bwd_sm90::steps`, `fwd_sm90::main_step`, ...),
//! and a plan's launches can be tested without a GPU.

use super::Variant;
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

/// A TMA tensor map a step passes: over the call's view `view` (forward: q, k, v, o, and
/// `qv` where given; backward: q, k, v, dout), boxes of `rows` rows.
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
    /// Four tensor maps (a fifth, `qv`'s, for `FC_QV` forms) and fwd_sm90's tile schedule,
    /// whose section holds `section` heads.
    MapsAndSchedule { maps: [MapOver; 4], qv: Option<MapOver>, section: i32 },
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
/// splits: the paged append pre-pass when keys are appended, the family's launch before the
/// main one where it has one (`Family::before_main`), the main kernel, the split-KV
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
    steps.extend(variant.family.spec().before_main(variant, shape));
    let (grid, block) = variant.grid(shape, sm_count, splits);
    let main = Step { dependent: pdl && facts.new_keys > 0, ..Step::plain(Entry::Main, grid, block, variant.smem_bytes, "attention") };
    steps.push(variant.family.spec().main_step(main, variant, shape, facts));
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
    /// Whether the learnable sinks' gradient is wanted (`BwdParams::dsink` set).
    pub sink_grad: bool,
}

/// Threads of a block of the families' sinks' gradient kernels (`sinks::kGradThreads`).
pub(crate) const SINK_GRAD_THREADS: u32 = 256;

/// The sinks' gradient, when wanted: entry `Aux(entry)` of the family, one block a query head,
/// after the rest (it reads the statistics the backward's first kernel wrote).
pub(crate) fn sink_grad(shape: &ProblemShape, facts: &BwdFacts, entry: usize) -> Option<Work> {
    facts.sink_grad.then(|| Work::Launch(Step::plain(Entry::Aux(entry), (shape.heads_q as u32, 1, 1), SINK_GRAD_THREADS, 0, "dsink")))
}

/// The backward's work for `variant`, its family's sequence (`Family::backward_steps`).
pub(crate) fn backward(variant: &Variant, facts: &BwdFacts) -> Vec<Work> {
    variant.family.spec().backward_steps(variant, facts)
}

/// What the families' step tests share.
#[cfg(test)]
pub(crate) mod testing {
    use super::*;

    /// `batch` sequences of `seqlen_q` queries and `seqlen_k` keys, 16 query heads, 4 KV heads.
    pub(crate) fn shape(batch: usize, seqlen_q: usize, seqlen_k: usize, head_dim: usize) -> ProblemShape {
        ProblemShape { batch, seqlen_q, seqlen_k, heads_q: 16, heads_kv: 4, head_dim, head_dim_v: head_dim }
    }

    /// The launches of `work`, its memsets left out.
    pub(crate) fn launches(work: &[Work]) -> Vec<Step> {
        work.iter().filter_map(|w| if let Work::Launch(s) = w { Some(*s) } else { None }).collect()
    }

    /// A backward over `s` (the tensors' shape too).
    pub(crate) fn facts_of(s: ProblemShape, packed: bool, deterministic: bool, dq_splits: usize) -> BwdFacts {
        BwdFacts { shape: s, tensors: s, packed, dq_splits, deterministic, sink_grad: false }
    }
}

#[cfg(test)]
mod tests {
    use super::testing::shape;
    use super::*;
    use crate::kernels::fwd_sm80;
    use crate::tensor::DType;

    const HOPPER: Arch = Arch { major: 9, minor: 0, specific: true };
    const AMPERE: Arch = Arch { major: 8, minor: 0, specific: false };

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
}
