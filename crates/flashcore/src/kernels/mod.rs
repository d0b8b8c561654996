//! Kernel families: their variants and the compile-time configuration of each, one host
//! file per family beside its CUDA source (`fwd_sm90.rs` and `fwd_sm90.cu`, ...); this one
//! holds what they share. The headers every family includes are in `common/` and `ptx/`.

pub(crate) mod bwd_sm80;
pub(crate) mod bwd_sm90;
pub(crate) mod fwd_sm80;
pub(crate) mod fwd_sm90;
pub(crate) mod reference;
pub(crate) mod steps;

/// V's own head dims with backward forms (bwd_sm90's); the forward's others train padded.
pub use bwd_sm90::VALUE_HEAD_DIMS as BACKWARD_VALUE_HEAD_DIMS;
/// The pairs with FlashAttention-3's `qv` (fwd_sm90's forms, dense keys, forward only).
pub use fwd_sm90::QV_HEAD_DIMS;
/// V's own head dims: the pairs fwd_sm90 has forms for (the forward).
pub use fwd_sm90::VALUE_HEAD_DIMS;

use crate::jit::{Arch, KernelSource};
use crate::shape::ProblemShape;
use crate::tensor::DType;
use steps::{BwdFacts, FwdFacts, Step, Work};

/// Share of L2 the K and V of one longest-first section of heads should fit in (causal
/// order: the CTAs running together work on one section, so they re-read its K and V from
/// L2). 32 MiB of H100's 50 MB measured best (docs/kernels/fwd_sm90.md).
const L2_SECTION_BYTES: u64 = 32 << 20;

/// Heads (x batch) per longest-first section: as many as have K and V within
/// `L2_SECTION_BYTES`, at least one.
pub(crate) fn section_heads(shape: &ProblemShape) -> i32 {
    heads_within(shape, L2_SECTION_BYTES, 1)
}

/// How many heads (x batch) have K and V within `bytes`, at least `min_heads` and at most
/// all of them.
pub(crate) fn heads_within(shape: &ProblemShape, bytes: u64, min_heads: u64) -> i32 {
    let kv_bytes = 4 * shape.head_dim.max(1) as u64 * shape.seqlen_k.max(1) as u64; // K and V, 2 bytes an element
    let heads = (shape.heads_q as u64 * shape.batch as u64).max(1);
    (bytes / kv_bytes).max(min_heads).clamp(1, heads) as i32
}

/// A family of kernels: one algorithm, many compile-time variants.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum KernelFamily {
    /// Naive fp32 GPU reference (one warp per query row): the oracle, not fast.
    Reference,
    /// FlashAttention-2-style forward with mma.sync, for sm_80 and newer.
    FwdSm80,
    /// FlashAttention-3-style forward with wgmma, TMA and warp specialization (sm_90a).
    FwdSm90,
    /// FlashAttention-2-style backward with mma.sync, for sm_80 and newer.
    BwdSm80,
    /// Backward with wgmma, TMA and warp specialization (sm_90a).
    BwdSm90,
}

/// The largest head dim any kernel takes.
pub const MAX_HEAD_DIM: usize = 256;

/// Whether `d` is a head dim the Hopper families run, natively or as the next native size
/// with the columns past `d` zero-filled (a multiple of 8, for 16-byte rows, up to 256).
/// flash_attn pads other sizes to a multiple of 8 itself; the Python package does the same.
pub fn is_head_dim(d: usize) -> bool {
    d.is_multiple_of(8) && (8..=MAX_HEAD_DIM).contains(&d)
}

/// Head dims without a variant of their own that `check` runs on the families that take
/// them: one in each padded range (below 64, 64-128, 128-192, 192-256) and the smallest.
pub const PADDED_CHECK_DIMS: &[usize] = &[8, 40, 80, 104, 160, 224];

impl KernelFamily {
    /// Every family.
    pub const ALL: [KernelFamily; 5] =
        [KernelFamily::Reference, KernelFamily::FwdSm80, KernelFamily::FwdSm90, KernelFamily::BwdSm80, KernelFamily::BwdSm90];

    /// The family's name, as the CLI takes it.
    pub fn name(self) -> &'static str {
        match self {
            KernelFamily::Reference => "reference",
            KernelFamily::FwdSm80 => "fwd_sm80",
            KernelFamily::FwdSm90 => "fwd_sm90",
            KernelFamily::BwdSm80 => "bwd_sm80",
            KernelFamily::BwdSm90 => "bwd_sm90",
        }
    }

    /// Whether the family computes gradients (a backward pass) rather than attention.
    pub fn is_backward(self) -> bool {
        matches!(self, KernelFamily::BwdSm80 | KernelFamily::BwdSm90)
    }

    /// Parses a family name.
    pub fn parse(name: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|f| f.name() == name)
    }

    /// The family's own answers ([`Family`], implemented in its module): the one match over
    /// the families that a new one joins.
    pub(crate) fn spec(self) -> &'static dyn Family {
        match self {
            KernelFamily::Reference => &reference::Spec,
            KernelFamily::FwdSm80 => &fwd_sm80::Spec,
            KernelFamily::FwdSm90 => &fwd_sm90::Spec,
            KernelFamily::BwdSm80 => &bwd_sm80::Spec,
            KernelFamily::BwdSm90 => &bwd_sm90::Spec,
        }
    }

    /// Whether the family can run on `arch` at all.
    pub fn runs_on(self, arch: Arch) -> bool {
        self.spec().runs_on(arch)
    }

    /// Head dims with a compiled variant of their own (D96 and D192 among them on the Hopper
    /// families, which run them as D128 and D256).
    pub fn head_dims(self) -> &'static [usize] {
        self.spec().head_dims()
    }

    /// Whether the family runs head dim `d`: the sizes of [`Self::head_dims`], and on the Hopper
    /// families and the reference every multiple of 8 up to 256 (see [`is_head_dim`]);
    /// the Ampere-class families only their own sizes (their mma.sync tiles take whole
    /// 16-column steps and no zero-filled columns).
    pub fn takes_head_dim(self, d: usize) -> bool {
        self.spec().takes_head_dim(d)
    }

    /// The head dims [`Self::takes_head_dim`] accepts, for an error message.
    pub fn head_dims_text(self) -> String {
        self.spec().head_dims_text()
    }

    /// Every variant the family compiles for `arch`: those of its own head dims.
    pub fn variants(self, arch: Arch) -> Vec<Variant> {
        self.variants_of(arch, self.head_dims())
    }

    /// The family's variants for `arch` at `head_dims` (each one it takes; the reference has
    /// one variant for every head dim).
    pub fn variants_of(self, arch: Arch, head_dims: &[usize]) -> Vec<Variant> {
        self.spec().variants_of(arch, head_dims)
    }
}

/// What a kernel family says of itself, implemented once in its module (`fwd_sm80::Spec`,
/// ...): where it runs, the head dims and variants it has, its source file, entry points and
/// defines, its tiles under score policies and its grid. [`KernelFamily`]'s and [`Variant`]'s
/// methods ask it ([`KernelFamily::spec`]); its launch sequence is its module's too
/// ([`steps`]). The defaults are the common case.
pub(crate) trait Family: Sync {
    /// Whether it needs sm_90a (wgmma, TMA); else it runs on every GPU from sm_80.
    fn needs_sm90a(&self) -> bool {
        false
    }

    /// Whether it can run on `arch` at all.
    fn runs_on(&self, arch: Arch) -> bool {
        if self.needs_sm90a() {
            arch.is_hopper()
        } else {
            arch.major >= 8
        }
    }

    /// Head dims with a compiled variant of their own.
    fn head_dims(&self) -> &'static [usize];

    /// Whether it runs only its own head dims (the Ampere-class families: their mma.sync
    /// tiles take whole 16-column steps and no zero-filled columns); else every multiple of 8
    /// up to 256, the columns past `d` zero-filled.
    fn own_head_dims_only(&self) -> bool {
        false
    }

    /// Whether it runs head dim `d` (see [`Family::own_head_dims_only`]).
    fn takes_head_dim(&self, d: usize) -> bool {
        if self.own_head_dims_only() {
            self.head_dims().contains(&d)
        } else {
            is_head_dim(d)
        }
    }

    /// The head dims it takes, for an error message.
    fn head_dims_text(&self) -> String {
        if self.own_head_dims_only() {
            self.head_dims().iter().map(|d| d.to_string()).collect::<Vec<_>>().join(", ")
        } else {
            format!("multiples of 8 up to {MAX_HEAD_DIM}")
        }
    }

    /// Its variants for `arch` at one (dtype, head dim, mask).
    fn variants_at(&self, arch: Arch, dtype: DType, head_dim: usize, causal: bool) -> Vec<Variant>;

    /// The input dtypes it has variants for (default: the 16-bit ones; fwd_sm90 e4m3 too).
    fn dtypes(&self) -> &'static [DType] {
        &[DType::F16, DType::BF16]
    }

    /// Its variants for `arch` at each of `head_dims` it takes, each of its dtypes, both masks.
    fn variants_of(&self, arch: Arch, head_dims: &[usize]) -> Vec<Variant> {
        let mut out = Vec::new();
        for &head_dim in head_dims.iter().filter(|&&d| self.takes_head_dim(d)) {
            for &dtype in self.dtypes() {
                for causal in [false, true] {
                    out.extend(self.variants_at(arch, dtype, head_dim, causal));
                }
            }
        }
        out
    }

    /// `v`'s source file and main entry point; the defines it needs beyond the shared ones
    /// (`Variant::source`) pushed onto `defines`.
    fn source(&self, v: &Variant, defines: &mut Vec<(String, String)>) -> (&'static str, &'static str);

    /// The entry points after the main one, in launch order (a backward family's).
    fn aux_entries(&self) -> &'static [&'static str] {
        &[]
    }

    /// `v` under the score policies `mods`, as the dispatcher runs it (default: its own tile).
    fn with_mods(&self, v: &Variant, mods: ScoreMods) -> Variant {
        Variant { mods, ..v.clone() }
    }

    /// Whether its variants have compile-time score-policy forms (`FC_LOCAL`, `FC_SOFTCAP`,
    /// `FC_ALIBI`; default yes: the reference takes them at run time).
    fn takes_policies(&self) -> bool {
        true
    }

    /// The (window, softcap, ALiBi) combinations its dropout forms come with (default: dropout
    /// alone and with all three).
    fn dropout_forms(&self) -> &'static [(bool, bool, bool)] {
        &[(false, false, false), (true, true, true)]
    }

    /// `v`'s paged-KV forms on `arch` (`FC_PAGED`), for a dense variant (default: none).
    fn paged_forms(&self, _arch: Arch, _v: &Variant) -> Vec<Variant> {
        Vec::new()
    }

    /// Whether it runs packed batches in a varlen form (`FC_VARLEN`; default yes).
    fn packs(&self) -> bool {
        true
    }

    /// A forward family's main launch, `main` as the common forward builds it (default: as it
    /// is; fwd_sm90 adds its tensor maps and tile schedule).
    fn main_step(&self, main: Step, _v: &Variant, _shape: &ProblemShape, _facts: FwdFacts) -> Step {
        main
    }

    /// A forward family's launch before its main one (after the paged append), if `v` has one
    /// (default: none; fwd_sm90's e4m3 forms transpose V).
    fn before_main(&self, _v: &Variant, _shape: &ProblemShape) -> Option<Step> {
        None
    }

    /// A backward family's work, in stream order (default: none, a forward family).
    fn backward_steps(&self, _v: &Variant, _facts: &BwdFacts) -> Vec<Work> {
        Vec::new()
    }

    /// `v`'s grid for `shape` in `splits` key splits on a device of `sm_count` SMs (default:
    /// one CTA per query tile, key split, head and batch).
    fn grid(&self, v: &Variant, shape: &ProblemShape, _sm_count: u32, splits: u32) -> (u32, u32, u32) {
        query_grid(v, shape, splits)
    }
}

/// One CTA per (query tile, key split, head, batch) of `shape`: the grid of the families
/// that keep no schedule of their own.
pub(crate) fn query_grid(v: &Variant, shape: &ProblemShape, splits: u32) -> (u32, u32, u32) {
    let m_blocks = shape.seqlen_q.div_ceil(v.tile.block_m as usize) as u32;
    (m_blocks * splits, shape.heads_q as u32, shape.batch as u32)
}

impl std::fmt::Display for KernelFamily {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// A tile configuration: the compile-time shape of a kernel's work.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, serde::Serialize)]
pub struct Tile {
    /// Query rows per CTA.
    pub block_m: u32,
    /// Keys per K/V tile.
    pub block_n: u32,
    /// Warps per CTA.
    pub warps: u32,
    /// K/V pipeline stages.
    pub stages: u32,
}

/// One compiled variant of a family.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Variant {
    /// Its family.
    pub family: KernelFamily,
    /// Input dtype (and the output's, but for e4m3, whose output is bf16).
    pub dtype: DType,
    /// Compile-time head dim; `None` when the head dim is a run-time argument.
    pub head_dim: Option<usize>,
    /// `FC_HEAD_DIM_V`: V's (and the output's) compile-time head dim where it is not
    /// `head_dim` (fwd_sm90's dense and packed forms); `None`: V's is `head_dim`.
    pub head_dim_v: Option<usize>,
    /// Compile-time mask; `None` when causal is a run-time argument.
    pub causal: Option<bool>,
    /// Tile configuration.
    pub tile: Tile,
    /// Dynamic shared memory per CTA at this configuration, in bytes.
    pub smem_bytes: u32,
    /// Split-KV: the key range of a query tile can be shared out among several CTAs, whose
    /// partial results a second kernel of the same module (`fc_split_combine`) merges.
    pub split_kv: bool,
    /// The compile-time score policies beyond the causal mask (none for the reference).
    pub mods: ScoreMods,
    /// `FC_VARLEN`: a packed batch of sequences of their own lengths (`cu_seqlens`; fwd_sm80,
    /// fwd_sm90 and bwd_sm80).
    pub varlen: bool,
    /// `FC_PAGED`: keys from a KV cache, paged (a block table) or contiguous, each sequence
    /// of its own length (`cache_seqlens`), with new keys appended by a pre-pass (fwd_sm80
    /// and fwd_sm90; see [`crate::PagedKv`]).
    pub paged: bool,
    /// `FC_PAGE_SPREAD`: fwd_sm90's paged form for pages that cut a key block into more than
    /// 3 TMA boxes, whose boxes four producer threads issue (`fwd_sm90::paged_form`).
    pub spread_pages: bool,
}

/// `v`'s forms with a sliding window, a softcap, both, ALiBi, and all three (and, but for
/// fwd_sm80's split tiles and paged forms, dropout alone and with all three; bwd_sm90
/// dropout alone), where the dispatcher runs them: every tile of the forward and backward
/// kernels; none for the reference (it takes them all at run time). (Any other combination
/// compiles on demand like these; ALiBi alone and with both others bound its cost in
/// registers.)
pub fn mods_forms(v: &Variant) -> Vec<Variant> {
    let spec = v.family.spec();
    // e4m3 forms take the masks alone (fwd_sm90's FC_FP8: `dispatch::e4m3_form`).
    if v.dtype == DType::E4M3 {
        return vec![with_mods(v, ScoreMods { local: true, ..v.mods })];
    }
    // A qv form (`ScoreMods::qv`) takes the policies too, each keeping qv.
    let forms: &[(bool, bool, bool)] = if (ScoreMods { qv: false, ..v.mods }) == ScoreMods::default() && spec.takes_policies() {
        &[(true, false, false), (false, true, false), (true, true, false), (false, false, true), (true, true, true)]
    } else {
        &[]
    };
    // Dropout's forms where it runs (not in split tiles nor paged forms): the family's.
    let dropout_forms = if !v.split_kv && !v.paged && !forms.is_empty() { spec.dropout_forms() } else { &[] };
    let mut out: Vec<Variant> = Vec::new();
    let all = forms.iter().map(|&f| (f, false)).chain(dropout_forms.iter().map(|&f| (f, true)));
    for ((local, softcap, alibi), dropout) in all {
        let form = with_mods(v, ScoreMods { local, softcap, alibi, dropout, qv: v.mods.qv, ..ScoreMods::default() });
        if !out.contains(&form) {
            out.push(form);
        }
    }
    out
}

/// `v` under the score policies `mods`, as the dispatcher runs it: its own tile, except where
/// the policies together take registers the tile lacks and the family has a smaller one
/// (fwd_sm90 with a softcap and ALiBi: `fwd_sm90::with_mods`; fwd_sm80 and bwd_sm80 with
/// dropout: `fwd_sm80::with_mods`, `bwd_sm80::with_mods`).
pub fn with_mods(v: &Variant, mods: ScoreMods) -> Variant {
    v.family.spec().with_mods(v, mods)
}

/// `v`'s paged-KV forms (`FC_PAGED`) on `arch`, where the dispatcher runs them: every fwd_sm80
/// forward variant (decode, and every arch; its split-KV tile over pages smaller than a key
/// block takes a third K/V slot on sm_90, so it has two forms there: `fwd_sm80::paged_form`;
/// its unsplit tiles also the packed-queries form, `FC_VARLEN` with `FC_PAGED`) and every
/// fwd_sm90 variant (prefill and chunked prefill on Hopper); none for a dropout form (a KV
/// cache takes no dropout: `dispatch::plan_for`).
pub fn paged_forms(arch: Arch, v: &Variant) -> Vec<Variant> {
    if v.varlen || v.paged || v.mods.dropout || v.mods.qv || v.dtype == DType::E4M3 {
        return Vec::new();
    }
    v.family.spec().paged_forms(arch, v)
}

/// `v`'s varlen form (a packed batch: `cu_seqlens`), where the dispatcher runs one: every
/// variant of fwd_sm80, fwd_sm90, bwd_sm80 and bwd_sm90 (the backward of a packed batch runs
/// on the family of the dense one), but `qv`'s and e4m3's (dense keys alone).
pub fn varlen_form(v: &Variant) -> Option<Variant> {
    let dense_only = v.mods.qv || v.dtype == DType::E4M3;
    (v.family.spec().packs() && !v.varlen && !v.paged && !dense_only).then(|| Variant { varlen: true, ..v.clone() })
}

/// A variant's entry points besides its main one (see [`Variant::entries`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Entries {
    /// The split-KV merge.
    pub combine: Option<&'static str>,
    /// The paged append pre-pass.
    pub append: Option<&'static str>,
    /// A backward family's other kernels, in launch order; an e4m3 forward's V transpose.
    pub aux: &'static [&'static str],
}

/// Compile-time score policies of a variant (`kernels/common/mask.cuh`): a sliding window
/// (its sides are run-time values), logit softcapping and ALiBi (its slopes are run-time
/// values). The reference kernels take them all at run time and never set them.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
pub struct ScoreMods {
    /// `FC_LOCAL`: the sliding-window mask (causal folded in).
    pub local: bool,
    /// `FC_CHUNK`: chunked attention's bounds beside the window (with `local`: the chunk runs
    /// as a window capped at it). Its own form, so that a window alone compiles as before.
    pub chunk: bool,
    /// `FC_SOFTCAP`: `softcap · tanh(s / softcap)` on every score.
    pub softcap: bool,
    /// `FC_ALIBI`: `-slope · |i + Sk - Sq - j|` added to every score.
    pub alibi: bool,
    /// `FC_DROPOUT`: attention dropout on the probabilities (fwd_sm80 unsplit over dense or
    /// packed keys, bwd_sm80).
    pub dropout: bool,
    /// `FC_SINKS`: learnable sinks folded into each final row's sum and LSE (the forward
    /// families, unsplit; `kernels/common/sinks.cuh`).
    pub sinks: bool,
    /// `FC_QV`: FlashAttention-3's `qv` (absorbed MLA): `qv · vᵀ` added to every score before
    /// the scale, `qv` shaped like the output (fwd_sm90's forms of `fwd_sm90::QV_HEAD_DIMS`).
    pub qv: bool,
}

impl Variant {
    /// A name unique per compiled binary, e.g. `fwd_sm80_bf16_d128_causal_128x64w4s2`
    /// (`_dv128` after the head dim for V's own, `..._splitkv` for a split-KV variant, `_local`, `_chunk`, `_softcap`, `_alibi`, `_dropout`, `_sinks`, `_qv` for [`ScoreMods`], `_varlen`,
    /// `_paged`, `_spread`).
    pub fn name(&self) -> String {
        let mut name = format!("{}_{}", self.family.name(), self.dtype.name());
        if let Some(d) = self.head_dim {
            name += &format!("_d{d}");
        }
        if let Some(dv) = self.head_dim_v {
            name += &format!("_dv{dv}");
        }
        if let Some(c) = self.causal {
            name += if c { "_causal" } else { "_full" };
        }
        let t = self.tile;
        name += &format!("_{}x{}w{}s{}", t.block_m, t.block_n, t.warps, t.stages);
        if self.split_kv {
            name += "_splitkv";
        }
        if self.mods.local {
            name += "_local";
        }
        if self.mods.chunk {
            name += "_chunk";
        }
        if self.mods.softcap {
            name += "_softcap";
        }
        if self.mods.alibi {
            name += "_alibi";
        }
        if self.mods.dropout {
            name += "_dropout";
        }
        if self.mods.sinks {
            name += "_sinks";
        }
        if self.mods.qv {
            name += "_qv";
        }
        if self.varlen {
            name += "_varlen";
        }
        if self.paged {
            name += "_paged";
        }
        if self.spread_pages {
            name += "_spread";
        }
        name
    }

    /// What the JIT compiles.
    pub fn source(&self) -> KernelSource {
        let t = self.tile;
        let mut defines = vec![("FC_DTYPE_BF16".to_string(), u8::from(self.dtype.output() == DType::BF16).to_string())];
        if self.dtype == DType::E4M3 {
            defines.push(("FC_FP8".into(), "1".into()));
        }
        if let Some(d) = self.head_dim {
            defines.push(("FC_HEAD_DIM".into(), d.to_string()));
        }
        if let Some(dv) = self.head_dim_v {
            defines.push(("FC_HEAD_DIM_V".into(), dv.to_string()));
        }
        if let Some(c) = self.causal {
            defines.push(("FC_CAUSAL".into(), u8::from(c).to_string()));
        }
        for (k, v) in [("FC_BLOCK_M", t.block_m), ("FC_BLOCK_N", t.block_n), ("FC_NUM_WARPS", t.warps), ("FC_STAGES", t.stages)] {
            defines.push((k.into(), v.to_string()));
        }
        if self.split_kv {
            defines.push(("FC_SPLIT_KV".into(), "1".into()));
        }
        for (define, on) in [
            ("FC_LOCAL", self.mods.local),
            ("FC_CHUNK", self.mods.chunk),
            ("FC_SOFTCAP", self.mods.softcap),
            ("FC_ALIBI", self.mods.alibi),
            ("FC_DROPOUT", self.mods.dropout),
            ("FC_SINKS", self.mods.sinks),
            ("FC_QV", self.mods.qv),
            ("FC_VARLEN", self.varlen),
            ("FC_PAGED", self.paged),
            ("FC_PAGE_SPREAD", self.spread_pages),
        ] {
            if on {
                defines.push((define.into(), "1".into()));
            }
        }
        let (file, entry) = self.family.spec().source(self, &mut defines);
        KernelSource { name: self.name(), file, entry, defines }
    }

    /// The module's entry points besides the main one: the split-KV combine
    /// (`fc_split_combine`) of a split variant, the paged append pre-pass (`fc_paged_append`)
    /// of a paged one, and a backward family's other kernels in launch order (the
    /// reference's dQ and dK/dV; bwd_sm80's D_i and dQ conversion; bwd_sm90's prep and dQ
    /// conversion); an e4m3 forward's V transpose (`fc_fp8_transpose_v`, launched before the
    /// main one).
    pub fn entries(&self) -> Entries {
        Entries {
            combine: self.split_kv.then_some("fc_split_combine"),
            append: self.paged.then_some("fc_paged_append"),
            aux: if self.dtype == DType::E4M3 { &["fc_fp8_transpose_v"] } else { self.family.spec().aux_entries() },
        }
    }

    /// Grid `(x, y, z)` and threads per block for `shape` on a device of `sm_count` SMs:
    /// one CTA per (query tile, key split, head, batch), or a family's own (fwd_sm90 is
    /// persistent; fwd_sm80's causal tiles may go longest first: its `Family::grid`).
    pub fn grid(&self, shape: &ProblemShape, sm_count: u32, splits: u32) -> ((u32, u32, u32), u32) {
        (self.family.spec().grid(self, shape, sm_count, splits), 32 * self.tile.warps)
    }

    /// Query tiles (query blocks x heads x batch) of `shape`: the CTAs of an unsplit launch,
    /// or the work items of a persistent one.
    pub fn query_tiles(&self, shape: &ProblemShape) -> usize {
        shape.seqlen_q.div_ceil(self.tile.block_m as usize) * shape.heads_q * shape.batch
    }

    /// Whether the kernel takes its tiles longest first from a 1-D grid (fwd_sm80 causal,
    /// unsplit, D > 64, K/V ring of 2+ slots: `FwdParams::tile_section` heads a section, see
    /// `common/tile_scheduler.cuh`).
    pub fn longest_first(&self) -> bool {
        self.family == KernelFamily::FwdSm80
            && self.causal == Some(true)
            && !self.split_kv
            && self.tile.stages > 1
            && self.head_dim.is_some_and(|d| d > 64)
    }
}
