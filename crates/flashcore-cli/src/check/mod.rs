//! `flashcore check`: the correctness suite (docs/design.md §8) for every kernel on this GPU.
//!
//! This file reads the options, gathers each group's cases (`dense`, `varlen`, `paged`,
//! `bwd`, `varlen_bwd`) and runs them; those share `outcome.rs` (a case's result and how it
//! is judged), `poison.rs` (runs into NaN-poisoned buffers) and, for packed batches,
//! `packed.rs`, never this file.

mod bwd;
mod dense;
mod fp8;
mod outcome;
mod packed;
mod paged;
mod paged_packed;
mod part;
mod poison;
mod report;
mod varlen;
mod varlen_bwd;

use anyhow::Result;
use flashcore::{Context, KernelFamily};

pub(crate) use crate::cases::{sink_values, upload_slopes};
use crate::check::packed::VarlenSpec;

/// The head dims without a variant of their own that `family` runs as the next of its sizes
/// (the Hopper families), which its groups check besides its own sizes: D80 in quick runs,
/// D40, D80 and D160 in smoke runs, `flashcore::kernels::PADDED_CHECK_DIMS` in full runs.
pub(crate) fn padded_dims(family: KernelFamily, quick: bool, smoke: bool) -> Vec<usize> {
    if family == KernelFamily::Reference {
        return Vec::new(); // the oracle: its head dim is a run-time argument
    }
    let dims: &[usize] = if quick {
        &[80]
    } else if smoke {
        &[40, 80, 160]
    } else {
        flashcore::kernels::PADDED_CHECK_DIMS
    };
    dims.iter().copied().filter(|&d| family.takes_head_dim(d) && !family.head_dims().contains(&d)).collect()
}
use crate::check::part::{parse_part, Part, PartFilter};
use crate::check::report::{print_table, Progress};

#[derive(clap::Args)]
pub struct CheckArgs {
    /// A few cases per kernel.
    #[arg(long, conflicts_with = "full")]
    quick: bool,
    /// One small case per variant (for compute-sanitizer runs).
    #[arg(long, conflicts_with_all = ["full", "quick"])]
    smoke: bool,
    /// Every case (the default).
    #[arg(long)]
    full: bool,
    /// Only this kernel family (reference, fwd_sm80, ...).
    #[arg(long)]
    kernel: Option<String>,
    /// Only this group of cases: forward (dense), varlen, paged or backward.
    #[arg(long, value_parser = ["forward", "varlen", "paged", "backward"])]
    only: Option<String>,
    /// Only part K of N of the cases (`K/N`, 1 <= K <= N: every N-th case from the K-th), so
    /// that a long run can be split over several calls; parts 1..N of one N are the whole run.
    #[arg(long, value_parser = parse_part)]
    part: Option<Part>,
    /// Only the cases of these head dims (comma-separated), e.g. the padded ones a family runs
    /// as the next size.
    #[arg(long, value_delimiter = ',')]
    head_dims: Vec<usize>,
    /// Only the cases with ALiBi (slopes per head or per sequence).
    #[arg(long)]
    alibi: bool,
    /// Only the cases with dropout (fwd_sm80's, fwd_sm90's, bwd_sm80's and bwd_sm90's forms).
    #[arg(long)]
    dropout: bool,
    /// Only the chunked-attention cases (`attention_chunk`, forward and backward).
    #[arg(long)]
    chunk: bool,
    /// Only the learnable-sinks cases (the forward's output and LSE, the backward's dQ, dK, dV
    /// and the sinks' gradient).
    #[arg(long)]
    sinks: bool,
    /// Only the cases of V's own head dim (fwd_sm90's forms of
    /// `flashcore::kernels::VALUE_HEAD_DIMS` and bwd_sm90's of `BACKWARD_VALUE_HEAD_DIMS`,
    /// dense and packed).
    #[arg(long)]
    value_dim: bool,
    /// Only the e4m3 (FP8) forward cases (fwd_sm90's forms, against an f64 emulation's bound).
    #[arg(long)]
    fp8: bool,
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Depth {
    Smoke,
    Quick,
    Full,
}

pub fn run(args: &CheckArgs) -> Result<bool> {
    let ctx = Context::new(0)?;
    let arch = ctx.info().arch;
    let families: Vec<KernelFamily> = match &args.kernel {
        Some(name) => vec![KernelFamily::parse(name).ok_or_else(|| anyhow::anyhow!("unknown kernel {name:?}; known: {}", family_names()))?],
        None => KernelFamily::ALL.into_iter().filter(|f| f.runs_on(arch)).collect(),
    };
    let depth = match (args.smoke, args.quick) {
        (true, _) => Depth::Smoke,
        (_, true) => Depth::Quick,
        _ => Depth::Full,
    };
    let group = |name: &str| args.only.as_deref().is_none_or(|only| only == name);
    let forward = families.iter().filter(|f| !f.is_backward() && group("forward"));
    let (quick, smoke) = (depth == Depth::Quick, depth == Depth::Smoke);
    // Every depth takes the sinks' and V's own head dims' cases (smoke: the quick ones; their
    // forms are variants too).
    let dense_specs = |f| {
        let own_value_dim = dense::value_dim_specs(f, quick || smoke);
        dense::specs(f, quick, smoke).into_iter().chain(dense::sinks_specs(f, quick || smoke)).chain(own_value_dim)
    };
    let all: Vec<(KernelFamily, dense::Spec)> = forward.flat_map(|&f| dense_specs(f).map(move |s| (f, s))).collect();
    // The backward's kernels: bwd_sm80, bwd_sm90, and the reference (which has both passes).
    let backward: Vec<bwd::BwdSpec> = families
        .iter()
        .filter(|f| (f.is_backward() || **f == KernelFamily::Reference) && group("backward"))
        .flat_map(|&f| {
            let own_value_dim = bwd::value_dim_specs(f, quick || smoke);
            bwd::specs(f, quick, smoke).into_iter().chain(bwd::sinks_specs(f, quick || smoke)).chain(own_value_dim)
        })
        .collect();
    let packed: Vec<VarlenSpec> = families
        .iter()
        .filter(|_| group("varlen"))
        .flat_map(|&f| {
            let (specs, own_value_dim) = if f.is_backward() {
                (varlen_bwd::specs(f, quick, smoke), varlen_bwd::value_dim_specs(f, quick || smoke))
            } else {
                (varlen::specs(f, quick, smoke), varlen::value_dim_specs(f, quick || smoke))
            };
            specs.into_iter().chain(own_value_dim)
        })
        .collect();
    let cached: Vec<paged::PagedSpec> = families.iter().filter(|_| group("paged")).flat_map(|&f| paged::specs(f, quick, smoke)).collect();
    let e4m3: Vec<fp8::Spec> =
        families.iter().filter(|f| !f.is_backward() && group("forward")).flat_map(|&f| fp8::specs(f, quick || smoke)).collect();
    let dim = |d: usize| args.head_dims.is_empty() || args.head_dims.contains(&d);
    let alibi = |a: Alibi| !args.alibi || a != Alibi::Off;
    let dropped = |d: bool| !args.dropout || d;
    let chunked = |chunk: usize| !args.chunk || chunk > 0;
    let sunk = |sinks: bool| !args.sinks || sinks;
    let valued = |own: bool| !args.value_dim || own; // no KV cache has them
    let fp8 = |e4m3: bool| !args.fp8 || e4m3;
    let all: Vec<_> = all
        .into_iter()
        .filter(|(_, s)| {
            let c = &s.case;
            dim(c.head_dim)
                && alibi(s.alibi)
                && dropped(s.dropout.is_some())
                && chunked(s.chunk)
                && sunk(s.sinks)
                && valued(c.head_dim_v.is_some())
                && fp8(false)
        })
        .collect();
    // e4m3 cases take none of the filtered options (they run masks alone).
    let e4m3: Vec<_> = e4m3
        .into_iter()
        .filter(|s| dim(s.case.head_dim) && !(args.alibi || args.dropout || args.chunk || args.sinks || args.value_dim))
        .collect();
    let backward: Vec<_> = backward
        .into_iter()
        .filter(|s| {
            dim(s.head_dim())
                && alibi(s.alibi)
                && dropped(s.has_dropout())
                && chunked(s.chunk)
                && sunk(s.sinks)
                && valued(s.own_value_dim())
                && fp8(false)
        })
        .collect();
    let packed: Vec<_> = packed
        .into_iter()
        .filter(|s| {
            dim(s.head_dim)
                && alibi(s.alibi)
                && dropped(s.dropout.is_some())
                && chunked(0)
                && sunk(s.sinks)
                && valued(s.head_dim_v.is_some())
                && fp8(false)
        })
        .collect();
    let cached: Vec<_> = cached
        .into_iter()
        .filter(|s| dim(s.head_dim) && alibi(s.alibi) && dropped(false) && chunked(s.chunk) && sunk(s.sinks) && valued(false) && fp8(false))
        .collect();
    // In the order they run (below), so that the parts of one N cover the run once.
    let mut part = PartFilter { part: args.part, next: 0 };
    let (all, e4m3, packed, cached, backward) =
        (part.take(all), part.take(e4m3), part.take(packed), part.take(cached), part.take(backward));
    let label = match args.part {
        Some(Part { k, n }) => format!("{} (part {k}/{n})", ["smoke", "quick", "full"][depth as usize]),
        None => ["smoke", "quick", "full"][depth as usize].to_string(),
    };
    println!(
        "{label} check on {} ({arch}): {} forward ({} of them e4m3), {} packed (varlen), {} KV-cache (paged) and {} backward cases",
        ctx.info().name,
        all.len() + e4m3.len(),
        e4m3.len(),
        packed.len(),
        cached.len(),
        backward.len()
    );
    let progress = Progress::new(all.len() + e4m3.len() + packed.len() + cached.len() + backward.len());
    let mut outcomes = Vec::new();
    for (family, spec) in &all {
        outcomes.push(progress.case(&spec.case.name, *family, || dense::check_one(&ctx, *family, spec))?);
    }
    for spec in &e4m3 {
        outcomes.push(progress.case(&spec.case.name, KernelFamily::FwdSm90, || fp8::check_one(&ctx, spec))?);
    }
    for spec in &packed {
        let check_one = if spec.family.is_backward() { varlen_bwd::check_one } else { varlen::check_one };
        outcomes.push(progress.case(&spec.name(), spec.family, || check_one(&ctx, spec))?);
    }
    for spec in &cached {
        let check_one = if spec.packed_queries.is_some() { paged_packed::check_one } else { paged::check_one };
        outcomes.push(progress.case(&spec.name(), spec.kernel, || check_one(&ctx, spec))?);
    }
    for spec in &backward {
        outcomes.push(progress.case(&format!("bwd_{}", spec.case_name()), spec.family(), || bwd::check_one(&ctx, spec))?);
    }
    progress.bar.finish_and_clear();
    print_table(&outcomes);
    let failed = outcomes.iter().filter(|o| o.failure.is_some()).count();
    println!("{} passed, {failed} failed", outcomes.len() - failed);
    Ok(failed == 0)
}

fn family_names() -> String {
    KernelFamily::ALL.map(|f| f.name()).join(", ")
}

/// The case-name suffix of the score options, one spelling for every family's cases:
/// `_w{left},{right}` for a window, then `_cap{x}` for a softcap (empty when both are off).
pub(crate) fn score_suffix(window: flashcore::Window, softcap: f32) -> String {
    let mut suffix = String::new();
    if window != flashcore::Window::UNBOUNDED {
        suffix += &format!("_w{},{}", window.left, window.right);
    }
    if softcap > 0.0 {
        suffix += &format!("_cap{softcap}");
    }
    suffix
}

/// The case-name suffix of chunked attention: `_chunk{n}`, empty when off.
pub(crate) fn chunk_suffix(chunk: usize) -> String {
    if chunk > 0 {
        format!("_chunk{chunk}")
    } else {
        String::new()
    }
}

/// ALiBi in a check case: off, one slope a query head, or one a sequence and query head.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub(crate) enum Alibi {
    #[default]
    Off,
    PerHead,
    PerSequence,
}

impl Alibi {
    /// The slopes of `batch` sequences of `heads` query heads (empty when off): ALiBi's own
    /// geometric ones, `2^(-8 (h + 1) / H)`, per head; per sequence, those times `1 + b / 2`, so
    /// that no two rows are alike.
    pub(crate) fn slopes(self, batch: usize, heads: usize) -> Vec<f32> {
        let geometric = |h: usize| 2f32.powf(-8.0 * (h + 1) as f32 / heads as f32);
        match self {
            Alibi::Off => Vec::new(),
            Alibi::PerHead => (0..heads).map(geometric).collect(),
            Alibi::PerSequence => (0..batch * heads).map(|i| geometric(i % heads) * (1.0 + (i / heads) as f32 / 2.0)).collect(),
        }
    }

    /// The case-name suffix: `_alibi` per head, `_alibi-seq` per sequence.
    pub(crate) fn suffix(self) -> &'static str {
        match self {
            Alibi::Off => "",
            Alibi::PerHead => "_alibi",
            Alibi::PerSequence => "_alibi-seq",
        }
    }
}

/// Sequence `b`'s slopes among `slopes` (`[Hq]`: all of them; `[B, Hq]`: its row), as the
/// sequence alone takes them.
pub(crate) fn slopes_of(slopes: &[f32], b: usize, heads: usize) -> &[f32] {
    if slopes.len() > heads {
        &slopes[b * heads..][..heads]
    } else {
        slopes
    }
}

/// Dropout's `(seed, offset)` on the device, for the kernel under check to read there
/// (`flashcore::DropoutState`) while the oracle draws the host's pair: a state read wrong is
/// a wrong mask, which fails the check.
pub(crate) fn upload_dropout_state(
    ctx: &flashcore::Context,
    dropout: Option<flashcore::Dropout>,
) -> anyhow::Result<Option<cudarc::driver::CudaSlice<u64>>> {
    Ok(match dropout {
        Some(d) => Some(ctx.stream().clone_htod(&[d.seed, d.offset])?),
        None => None,
    })
}

/// A point of V's own head dim's cases (`check --value-dim`): a pair with forms of its own
/// (`flashcore::kernels::VALUE_HEAD_DIMS` forward, `BACKWARD_VALUE_HEAD_DIMS` backward), a
/// dtype and a mask.
#[derive(Debug, Clone, Copy)]
pub(crate) struct ValueDimPoint {
    pub head_dim: usize,
    pub head_dim_v: usize,
    pub dtype: flashcore::DType,
    pub causal: bool,
}

impl ValueDimPoint {
    /// Every pair of the forward's, in bf16 and f16, full and causal.
    pub(crate) fn forward() -> impl Iterator<Item = Self> {
        Self::of(flashcore::kernels::VALUE_HEAD_DIMS)
    }

    /// Every pair of the backward's, in bf16 and f16, full and causal.
    pub(crate) fn backward() -> impl Iterator<Item = Self> {
        Self::of(flashcore::kernels::BACKWARD_VALUE_HEAD_DIMS)
    }

    fn of(pairs: &'static [(usize, usize)]) -> impl Iterator<Item = Self> {
        use flashcore::DType;
        pairs.iter().flat_map(|&(head_dim, head_dim_v)| {
            [DType::BF16, DType::F16]
                .into_iter()
                .flat_map(move |dtype| [false, true].map(|causal| ValueDimPoint { head_dim, head_dim_v, dtype, causal }))
        })
    }

    /// The dense case of this point: B sequences of Sq queries and Sk keys, Hq and Hkv heads.
    pub(crate) fn case(&self, batch: usize, sq: usize, sk: usize, heads_q: usize, heads_kv: usize) -> crate::cases::Case {
        crate::cases::Case::new(batch, sq, sk, heads_q, heads_kv, self.head_dim, self.causal, self.dtype).with_value_dim(self.head_dim_v)
    }
}

/// `slopes` widened for the f64 oracle.
pub(crate) fn wide_slopes(slopes: &[f32]) -> Vec<f64> {
    slopes.iter().map(|&x| x as f64).collect()
}

#[cfg(test)]
mod name_tests {
    use super::score_suffix;
    use flashcore::Window;

    #[test]
    fn alibi_slopes_are_alibis_own_per_head_and_differ_per_sequence() {
        use super::{slopes_of, Alibi};
        assert_eq!(Alibi::PerHead.slopes(3, 4), vec![0.25, 0.0625, 0.015625, 0.00390625]);
        let per_seq = Alibi::PerSequence.slopes(2, 4);
        assert_eq!(slopes_of(&per_seq, 1, 4), &[0.375, 0.09375, 0.0234375, 0.005859375]);
        assert_eq!(slopes_of(&Alibi::PerHead.slopes(2, 4), 1, 4), &Alibi::PerHead.slopes(2, 4)[..]);
        assert!(Alibi::Off.slopes(2, 4).is_empty());
    }

    #[test]
    fn score_options_spell_as_the_case_names_always_have() {
        assert_eq!(score_suffix(Window::UNBOUNDED, 0.0), "");
        assert_eq!(score_suffix(Window::new(4096, 0), 0.0), "_w4096,0");
        assert_eq!(score_suffix(Window::new(-1, 7), 30.0), "_w-1,7_cap30");
        assert_eq!(score_suffix(Window::UNBOUNDED, 1.5), "_cap1.5");
    }
}

#[cfg(test)]
mod value_dim_tests {
    use super::dense::value_dim_specs;
    use flashcore::KernelFamily;

    #[test]
    fn v_s_own_head_dim_cases_are_fwd_sm90_s_pairs_alone() {
        let (full, quick) = (value_dim_specs(KernelFamily::FwdSm90, false), value_dim_specs(KernelFamily::FwdSm90, true));
        assert_eq!((full.len(), quick.len()), (104, 44), "two pairs, two dtypes, two masks: 10 cases each, 4 quick; qv 6, 3");
        let with_qv: Vec<_> = full.iter().filter(|s| s.qv).collect();
        assert_eq!(with_qv.len(), 24);
        assert!(with_qv.iter().all(|s| (s.case.head_dim, s.case.head_dim_v) == (64, Some(256))), "qv: FlashAttention-3's pair alone");
        for s in &full {
            let pair = (s.case.head_dim, s.case.head_dim_v.unwrap());
            assert!(pair == (192, 128) || pair == (64, 256), "{}", s.case.name);
            assert!(s.case.name.contains(&format!("_d{}_dv{}_", pair.0, pair.1)), "{}", s.case.name);
        }
        assert_eq!(full.iter().filter(|s| s.case.head_dim == 64 && !s.qv).count(), 40, "FlashAttention-3's (64, 256)");
        assert!(full.iter().any(|s| s.sinks) && full.iter().any(|s| s.chunk > 0) && full.iter().any(|s| s.case.seqlen_q == 1));
        for family in [KernelFamily::FwdSm80, KernelFamily::Reference, KernelFamily::BwdSm90] {
            assert!(value_dim_specs(family, false).is_empty(), "{family}: no form of its own");
        }
    }

    #[test]
    fn v_s_own_head_dim_backward_cases_are_bwd_sm90_s_alone() {
        use super::bwd::value_dim_specs;
        let (full, quick) = (value_dim_specs(KernelFamily::BwdSm90, false), value_dim_specs(KernelFamily::BwdSm90, true));
        assert_eq!((full.len(), quick.len()), (32, 12), "two dtypes, two masks: 8 cases each, 3 quick");
        assert!(full.iter().all(|s| s.own_value_dim() && s.head_dim() == 192));
        assert!(full.iter().any(|s| s.sinks) && full.iter().any(|s| s.chunk > 0));
        for family in [KernelFamily::BwdSm80, KernelFamily::Reference, KernelFamily::FwdSm90] {
            assert!(value_dim_specs(family, false).is_empty(), "{family}: no backward form of its own");
        }
    }

    #[test]
    fn v_s_own_head_dim_packed_cases_are_the_hopper_families_alone() {
        use super::{varlen, varlen_bwd};
        for (family, specs) in
            [(KernelFamily::FwdSm90, varlen::value_dim_specs as fn(_, _) -> _), (KernelFamily::BwdSm90, varlen_bwd::value_dim_specs)]
        {
            let (full, quick) = (specs(family, false), specs(family, true));
            let pairs = if family.is_backward() { 1 } else { 2 };
            assert_eq!((full.len(), quick.len()), (12 * pairs, 4 * pairs), "{family}: two dtypes, two masks: 3 cases each, 1 quick");
            let deepseek = full.iter().filter(|s| s.head_dim_v == Some(128) && s.head_dim == 192 && s.name().contains("_d192_dv128_"));
            assert_eq!(deepseek.count(), 12, "{family}");
        }
        assert!(varlen::value_dim_specs(KernelFamily::FwdSm80, false).is_empty());
        assert!(varlen_bwd::value_dim_specs(KernelFamily::BwdSm80, false).is_empty());
    }
}
