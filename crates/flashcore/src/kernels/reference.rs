//! The naive GPU reference kernel (`kernels/reference.cu`): head dim and mask are run-time
//! arguments, so one binary per dtype serves every problem.

use super::steps::{sink_grad, BwdFacts, Entry, Step, Work};
use super::{Family, KernelFamily, ScoreMods, Tile, Variant};
use crate::jit::Arch;
use crate::tensor::DType;

/// Head dims the reference kernel takes (any multiple of 8 up to 256 works; these are the
/// ones the fast kernels offer, which the reference checks).
pub const HEAD_DIMS: &[usize] = &[32, 64, 96, 128, 192, 256];

/// The reference variant for `dtype`.
pub fn variant(dtype: DType) -> Variant {
    Variant {
        family: KernelFamily::Reference,
        dtype,
        head_dim: None,
        head_dim_v: None,
        causal: None,
        tile: Tile { block_m: 4, block_n: 1, warps: 4, stages: 1 },
        smem_bytes: 0,
        split_kv: false,
        mods: ScoreMods::default(),
        varlen: false,
        paged: false,
        spread_pages: false,
    }
}

/// The naive backward's work: dQ and D_i (a warp per query row), then dK and dV (a warp per
/// key row), 4 warps a block; then the sinks' gradient when wanted (from D_i).
pub(crate) fn backward_steps(facts: &BwdFacts) -> Vec<Work> {
    let shape = &facts.shape;
    let blocks = |rows: usize| rows.div_ceil(4) as u32;
    let dq = Step::plain(Entry::Aux(0), (blocks(shape.seqlen_q), shape.heads_q as u32, shape.batch as u32), 128, 0, "dq");
    let dkv = Step::plain(Entry::Aux(1), (blocks(shape.seqlen_k), shape.heads_kv as u32, shape.batch as u32), 128, 0, "dk, dv");
    let mut work = vec![Work::Launch(dq), Work::Launch(dkv)];
    work.extend(sink_grad(shape, facts, 2));
    work
}

/// The reference as a [`Family`]: every GPU FlashCore runs on, one variant per dtype whatever
/// the head dim and mask (both are run-time arguments).
pub(crate) struct Spec;

impl Family for Spec {
    fn head_dims(&self) -> &'static [usize] {
        HEAD_DIMS
    }

    fn variants_at(&self, _: Arch, dtype: DType, _: usize, _: bool) -> Vec<Variant> {
        vec![variant(dtype)]
    }

    fn variants_of(&self, _: Arch, _: &[usize]) -> Vec<Variant> {
        [DType::F16, DType::BF16].map(variant).to_vec()
    }

    fn source(&self, _: &Variant, _: &mut Vec<(String, String)>) -> (&'static str, &'static str) {
        ("reference.cu", "fc_reference")
    }

    fn aux_entries(&self) -> &'static [&'static str] {
        &["fc_reference_bwd_dq", "fc_reference_bwd_dkv", "fc_reference_bwd_dsink"]
    }

    fn takes_policies(&self) -> bool {
        false
    }

    fn dropout_forms(&self) -> &'static [(bool, bool, bool)] {
        &[]
    }

    fn packs(&self) -> bool {
        false
    }

    fn backward_steps(&self, _: &Variant, facts: &BwdFacts) -> Vec<Work> {
        backward_steps(facts)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kernels::steps::testing::{facts_of, launches};
    use crate::shape::ProblemShape;

    #[test]
    fn its_backward_is_dq_then_dk_dv_four_rows_a_block_and_dsink_last_a_block_a_head() {
        let shape = ProblemShape { batch: 1, seqlen_q: 9, seqlen_k: 7, heads_q: 16, heads_kv: 4, head_dim: 32, head_dim_v: 32 };
        let grids = |facts| launches(&backward_steps(&facts)).iter().map(|s| (s.entry, s.grid)).collect::<Vec<_>>();
        let facts = facts_of(shape, false, false, 1);
        assert_eq!(grids(facts), [(Entry::Aux(0), (3, 16, 1)), (Entry::Aux(1), (2, 4, 1))]);
        let with_dsink = grids(BwdFacts { sink_grad: true, ..facts });
        assert_eq!(with_dsink[2..], [(Entry::Aux(2), (16, 1, 1))]);
    }
}
