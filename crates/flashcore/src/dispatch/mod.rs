//! Plan: problem + device → kernel variant + launch plan, for the forward (here) and the
//! backward (`dispatch::backward`: [`plan_backward`]). The one place where run-time choices become compile-time ones.

mod backward;
mod head_dim;

pub use backward::{backward_pads_value_dim, plan_backward, BwdPlan};
pub use head_dim::{head_dims_run_as_they_are, run_head_dim, HeadDimUse};

use crate::error::{Error, Result};
use crate::jit::Arch;
use crate::kernels::{fwd_sm80, fwd_sm90, reference, KernelFamily, ScoreMods, Variant};
use crate::params::AttnParams;
use crate::shape::ProblemShape;
use crate::tensor::DType;

/// What the dispatcher needs to know of the device.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Device {
    /// The arch kernels are compiled for.
    pub arch: Arch,
    /// Streaming multiprocessors.
    pub sm_count: u32,
    /// Most shared memory a block may opt in to (a proxy for shared memory per SM).
    pub max_smem_per_block: u32,
}

/// What runs for one problem.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Plan {
    /// The compiled variant.
    pub variant: Variant,
    /// The problem as the kernel sees it (GQA heads packed as query rows, see
    /// [`packs_gqa`]).
    pub shape: ProblemShape,
    /// Whether `q` and `o` are viewed with each KV head's query heads as query rows.
    pub packed_gqa: bool,
    /// CTAs that share each query tile's keys; 1 means unsplit (no combine pass).
    pub splits: usize,
    /// Key tiles each split visits (all of them when unsplit).
    pub split_tiles: usize,
}

impl Plan {
    /// The variant's name, with the split count when split.
    pub fn describe(&self) -> String {
        let mut s = self.variant.name();
        if self.splits > 1 {
            s += &format!(" x{} splits", self.splits);
        }
        if self.packed_gqa {
            s += " (gqa packed)";
        }
        s
    }
}

/// Whether decode with GQA/MQA runs with the query heads of each KV head packed as query
/// rows (`q [B, 1, Hq, D]` viewed as `[B, Hq/Hkv, Hkv, D]`): each K/V head is then read
/// once for all its query heads, and its rows fill one tile together. Exact for `Sq = 1`,
/// where the causal mask hides nothing. The reference kernel is never packed: it stays an
/// independent oracle.
pub fn packs_gqa(shape: &ProblemShape, family: KernelFamily) -> bool {
    shape.seqlen_q == 1 && shape.heads_q > shape.heads_kv && family != KernelFamily::Reference
}

/// `shape` with GQA heads packed as query rows (see [`packs_gqa`]).
pub fn packed(shape: &ProblemShape) -> ProblemShape {
    ProblemShape { seqlen_q: shape.seqlen_q * (shape.heads_q / shape.heads_kv), heads_q: shape.heads_kv, ..*shape }
}

/// Query rows per KV head, as the kernel will see them.
fn kernel_rows(shape: &ProblemShape) -> usize {
    if shape.seqlen_q == 1 {
        packed(shape).seqlen_q
    } else {
        shape.seqlen_q
    }
}

/// The family FlashCore runs on `device` for `shape` when the caller does not force one:
/// the Hopper kernel where it has a variant for the head dim, except for decode and, up to
/// D128, where its grid would leave most SMs idle and the split-KV kernel can spread the keys
/// over the GPU instead; else the Ampere-class one, or, on Hopper, for a head dim it lacks
/// (which the Hopper kernel runs zero-filled to its next size), the Hopper kernel for every
/// shape. Measured on H100
/// (`bench --suite small`): B1 H8 S512 D64 8.5 us split vs 9.8, B1 H4 S1k D128 14.3 vs 15.9;
/// but D256's split tile is slower than the Hopper kernel (B2 H8 S512: 21.4 us with 64x64,
/// vs 17.1).
pub fn default_family(device: &Device, shape: &ProblemShape) -> KernelFamily {
    let arch = device.arch;
    let d = shape.head_dim;
    if !KernelFamily::FwdSm90.runs_on(arch) || !fwd_sm90::HEAD_DIMS.contains(&d) {
        // On Hopper a head dim fwd_sm80 lacks goes to fwd_sm90, which runs it or says what it takes.
        let hopper_only = KernelFamily::FwdSm90.runs_on(arch) && !KernelFamily::FwdSm80.takes_head_dim(d);
        return if hopper_only { KernelFamily::FwdSm90 } else { KernelFamily::FwdSm80 };
    }
    let decode_like = kernel_rows(shape) <= fwd_sm80::SPLIT_KV_MAX_ROWS;
    let hopper = fwd_sm90::variant(DType::BF16, shape.head_dim, false, shape.seqlen_k);
    let small_grid = hopper.query_tiles(shape) < device.sm_count as usize / 2 && shape.head_dim <= 128;
    if decode_like || (small_grid && sm80_plan(device, shape, DType::BF16, false, None, KeyLayout::Dense, |_| shape.seqlen_k).splits > 1) {
        KernelFamily::FwdSm80
    } else {
        KernelFamily::FwdSm90
    }
}

/// `params` for a call that writes dropout's probabilities: fwd_sm80 alone writes them (the
/// layout `probs` describes; fwd_sm90 draws the same mask but keeps no scores), so the call
/// runs there unless another family is forced, which is refused by name.
pub fn probs_params(params: &AttnParams) -> Result<AttnParams> {
    match params.kernel {
        None => Ok(AttnParams { kernel: Some(KernelFamily::FwdSm80), ..*params }),
        Some(KernelFamily::FwdSm80) => Ok(*params),
        Some(family) => {
            Err(Error::Unsupported { kernel: family.name().into(), msg: "writes no dropout probabilities: fwd_sm80 does".into() })
        }
    }
}

/// Picks the variant and launch plan for a validated dense problem without ALiBi.
pub fn plan(device: &Device, shape: &ProblemShape, dtype: DType, params: &AttnParams) -> Result<Plan> {
    plan_for(device, shape, dtype, params, KeyLayout::Dense, ScoreTensors::default())
}

/// How a problem's keys are laid out, beyond the dense `[B, Sk, Hkv, D]`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum KeyLayout {
    /// Dense tensors.
    Dense,
    /// A packed batch (`cu_seqlens`): [`crate::VarlenBatch`].
    Varlen {
        /// Keys of all its sequences (k's rows, `cu_seqlens_k`'s last entry): with the
        /// longest's, how unequal its sequences are (fwd_sm80's split count, see
        /// `fwd_sm80::num_splits_varlen`).
        total_k: usize,
    },
    /// A KV cache, paged or contiguous, each sequence of its own length: [`crate::PagedKv`].
    Paged {
        /// Keys a page (0: a contiguous cache); sets the depth of fwd_sm80's K/V ring on
        /// Hopper (`fwd_sm80::paged_form`) and fwd_sm90's form (`fwd_sm90::paged_form`).
        page_size: usize,
        /// Packed queries over the cache ([`crate::PackedQueries`]): fwd_sm80's packed paged
        /// form, unsplit.
        packed_queries: bool,
    },
}

/// The score policies a call gives as tensors, as the planner needs them (present or not).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ScoreTensors {
    /// ALiBi's slopes (the `_alibi` form; the reference takes them at run time): GQA heads of
    /// a decode step are then not packed as rows (each row would need its own head's slope).
    pub alibi: bool,
    /// Learnable sinks (the `_sinks` form): folded where a row is final (the epilogue, or the
    /// split-KV combine), so every plan takes them: split or not, dense, packed or paged keys,
    /// GQA heads packed as rows (each row then finds its own head's sink).
    pub learnable_sink: bool,
    /// FlashAttention-3's `qv` (the `_qv` form; fwd_sm90's pairs in `fwd_sm90::QV_HEAD_DIMS`,
    /// dense keys).
    pub qv: bool,
}

/// [`plan`] for keys laid out as `layout` says. A packed batch (`shape` its kernel shape:
/// `shape.batch` sequences of at most `shape.seqlen_q` / `seqlen_k`) runs the varlen form of
/// the same variant, GQA-packed on fwd_sm80 for decode (`max_seqlen_q` 1) as a dense batch
/// is: each sequence's token is then its own rows of each KV head. A paged cache
/// (`shape.seqlen_k` its capacity) runs the paged form of the family a dense problem of that
/// many keys would: on Hopper fwd_sm90 for prefill and chunked prefill, fwd_sm80's split-KV
/// kernel for decode (and small grids), with GQA heads packed as rows for decode as dense;
/// fwd_sm80 elsewhere. Packed queries over a paged cache run fwd_sm80's form with both (varlen
/// and paged), unsplit (its chunked split tiles count a head's query tiles as a dense batch's),
/// GQA-packed for decode. `tensors`: the score policies the call gives as tensors (see
/// [`ScoreTensors`]).
pub fn plan_for(
    device: &Device,
    shape: &ProblemShape,
    dtype: DType,
    params: &AttnParams,
    layout: KeyLayout,
    tensors: ScoreTensors,
) -> Result<Plan> {
    let ScoreTensors { alibi, learnable_sink: sinks, qv } = tensors;
    let (page_size, packed_queries) = match layout {
        KeyLayout::Paged { page_size, packed_queries } => (Some(page_size), packed_queries),
        _ => (None, false),
    };
    let varlen = matches!(layout, KeyLayout::Varlen { .. }) || packed_queries;
    let paged = page_size.is_some();
    let arch = device.arch;
    let dropout = params.dropout.is_some();
    // Dropout: fwd_sm90 where it runs (its accumulators hold the mask's cells as fwd_sm80's
    // do: the same mask, bit for bit), dense or packed, else fwd_sm80; unsplit either way.
    let dropout_on_sm90 = KernelFamily::FwdSm90.runs_on(arch) && KernelFamily::FwdSm90.takes_head_dim(shape.head_dim);
    // V's own head dim: fwd_sm90's forms for the pairs it has (fwd_sm90::VALUE_HEAD_DIMS); qv
    // too (fwd_sm90::QV_HEAD_DIMS).
    let own_value_dim = shape.head_dim_v != shape.head_dim;
    // e4m3 inputs: fwd_sm90's FC_FP8 forms alone (e4m3_form says what they take).
    let e4m3 = dtype == DType::E4M3;
    let family = match params.kernel {
        Some(family) => family,
        None if (own_value_dim || qv || e4m3) && KernelFamily::FwdSm90.runs_on(arch) => KernelFamily::FwdSm90,
        None if packed_queries => KernelFamily::FwdSm80,
        None if dropout && dropout_on_sm90 => KernelFamily::FwdSm90,
        None if dropout => KernelFamily::FwdSm80,
        None => default_family(device, shape),
    };
    if dropout {
        // Dropout's mask has a form in fwd_sm80 (unsplit) and fwd_sm90, over dense or packed keys.
        if paged {
            return Err(Error::Param { arg: "dropout_p", msg: "a KV cache takes no dropout (as flash_attn's)".into() });
        }
        if !matches!(family, KernelFamily::FwdSm80 | KernelFamily::FwdSm90) {
            return Err(Error::Unsupported { kernel: family.name().into(), msg: "has no dropout form: fwd_sm80 and fwd_sm90 have".into() });
        }
        if params.num_splits.is_some_and(|n| n > 1) {
            return Err(Error::Param { arg: "num_splits", msg: "dropout runs unsplit: None or 1".into() });
        }
    }
    if packed_queries && family != KernelFamily::FwdSm80 {
        let msg = "takes no packed queries over a paged cache: fwd_sm80 does".into();
        return Err(Error::Unsupported { kernel: family.name().into(), msg });
    }
    if packed_queries && params.num_splits.is_some_and(|n| n > 1) {
        let msg = "packed queries over a paged cache run unsplit: None or 1".into();
        return Err(Error::Param { arg: "num_splits", msg });
    }
    let num_splits = if packed_queries || dropout { Some(1) } else { params.num_splits };
    if paged && family == KernelFamily::Reference {
        return Err(Error::Unsupported {
            kernel: family.name().into(),
            msg: "takes no KV cache: fwd_sm80 and fwd_sm90 run paged and contiguous caches".into(),
        });
    }
    if family.is_backward() {
        return Err(not_a_forward(family));
    }
    if !family.runs_on(arch) {
        return Err(Error::Unsupported { kernel: family.name().into(), msg: format!("does not run on {arch}") });
    }
    let d = shape.head_dim;
    if !family.takes_head_dim(d) {
        return Err(Error::HeadDim { head_dim: d, supported: format!("{} for {family}", family.head_dims_text()) });
    }
    if own_value_dim {
        value_head_dim_form(family, shape, layout)?;
    }
    if qv {
        qv_form(family, shape, layout)?;
    }
    if e4m3 {
        e4m3_form(family, shape, layout, params, tensors)?;
    }
    if params.num_splits == Some(0) {
        return Err(Error::Param { arg: "num_splits", msg: "must be at least 1 (None picks it)".into() });
    }
    let (causal, window) = params.mask();
    // Packed rows of one query position would each take their own row's window: not packed.
    // A packed batch packs on fwd_sm80 alone (the only kernel with the row mapping for it).
    // Nor under ALiBi or dropout, whose slope and mask are a head's and a row's.
    // Learnable sinks: fwd_sm80 finds each packed row's own head (`sink_group`); fwd_sm90 reads
    // its tile's head's alone (a row's cost registers its widest forms lack). V's own head
    // dim: its forms are checked with heads as heads.
    let rows_keep_their_heads = own_value_dim
        || window.is_some()
        || alibi
        || dropout
        || (sinks && family == KernelFamily::FwdSm90)
        || (varlen && family != KernelFamily::FwdSm80);
    let packed_gqa = packs_gqa(shape, family) && !rows_keep_their_heads;
    if varlen && family == KernelFamily::Reference {
        return Err(Error::Unsupported {
            kernel: family.name().into(),
            msg: "takes no packed batch (it is the oracle: run each sequence alone)".into(),
        });
    }
    let kshape = if packed_gqa { packed(shape) } else { *shape };
    let causal = causal && !packed_gqa;
    let chunk = params.attention_chunk > 0;
    let mods = ScoreMods { local: window.is_some(), chunk, softcap: params.has_softcap(), alibi, dropout, sinks, qv };
    // Keys one query tile visits at most: the window's span and the tile's height, or all.
    let visited = |block_m: u32| match window {
        Some(w) if w.left >= 0 && w.right >= 0 => kshape.seqlen_k.min(w.left as usize + w.right as usize + block_m as usize),
        _ => kshape.seqlen_k,
    };
    let mut plan = match family {
        KernelFamily::Reference => unsplit(reference::variant(dtype), &kshape),
        KernelFamily::FwdSm90 if own_value_dim => unsplit(fwd_sm90::value_variant(dtype, d, shape.head_dim_v, causal), &kshape),
        // A window's tiles by the keys a query tile visits (its cost scales with them).
        KernelFamily::FwdSm90 if window.is_some() => unsplit(fwd_sm90::variant(dtype, kshape.head_dim, causal, visited(128)), &kshape),
        KernelFamily::FwdSm90 => unsplit(fwd_sm90::variant_for(dtype, &kshape, causal, device.sm_count as usize), &kshape),
        KernelFamily::FwdSm80 => sm80_plan(device, &kshape, dtype, causal, num_splits, layout, visited),
        KernelFamily::BwdSm80 | KernelFamily::BwdSm90 => return Err(not_a_forward(family)),
    };
    if family != KernelFamily::Reference {
        // The policies may take a smaller tile (fwd_sm90, never split: its key tiles again).
        plan.variant = crate::kernels::with_mods(&plan.variant, mods);
        if packed_queries {
            plan.variant = fwd_sm80::packed_paged_form(arch, &plan.variant);
        }
        if plan.splits == 1 {
            plan.split_tiles = kshape.seqlen_k.div_ceil(plan.variant.tile.block_n as usize);
        }
        plan.variant.varlen = varlen;
        plan.variant.paged = paged;
    }
    if let (KernelFamily::FwdSm90, Some(page_size)) = (family, page_size) {
        plan.variant = fwd_sm90::paged_form(&plan.variant, page_size);
    }
    plan.packed_gqa = packed_gqa;
    Ok(plan)
}

/// Whether `family` runs V's own head dim in `shape` over keys laid out as `layout`: fwd_sm90's
/// forms of the pairs in [`fwd_sm90::VALUE_HEAD_DIMS`] over dense and packed keys; never over
/// a KV cache (its pools share one head dim); else the error names what runs it. The one place
/// that decides which `(D, Dv)` the forward takes (validation checks the shapes alone).
fn value_head_dim_form(family: KernelFamily, shape: &ProblemShape, layout: KeyLayout) -> Result<()> {
    let (d, dv) = (shape.head_dim, shape.head_dim_v);
    let pairs = || pairs_text(fwd_sm90::VALUE_HEAD_DIMS);
    let msg = if family != KernelFamily::FwdSm90 {
        format!("takes V's head dim equal to q's and k's (here {dv} and {d}): fwd_sm90 has forms for {} on Hopper", pairs())
    } else if matches!(layout, KeyLayout::Paged { .. }) {
        "runs V's own head dim over dense or packed keys, not a KV cache (its pools share one head dim)".into()
    } else if !fwd_sm90::VALUE_HEAD_DIMS.contains(&(d, dv)) {
        format!("has no form for head dim {d} with V's {dv}: it has {}", pairs())
    } else {
        return Ok(());
    };
    Err(Error::Unsupported { kernel: family.name().into(), msg })
}

/// Whether `family` runs e4m3 inputs (`DType::E4M3`) in `shape` over keys laid out as
/// `layout` with `params` and the score tensors `tensors`: fwd_sm90's FC_FP8 forms (Hopper)
/// over dense keys, head dims that are multiples of 16 (e4m3 rows of whole 16 bytes, as
/// FlashAttention-3's) with V's equal, with a causal mask or a sliding window, GQA, unsplit.
/// Else the error names the argument (or the kernel) that e4m3 does not take yet.
fn e4m3_form(family: KernelFamily, shape: &ProblemShape, layout: KeyLayout, params: &AttnParams, tensors: ScoreTensors) -> Result<()> {
    if family != KernelFamily::FwdSm90 {
        return Err(Error::Unsupported { kernel: family.name().into(), msg: "takes no e4m3 inputs: fwd_sm90 does, on Hopper".into() });
    }
    let d = shape.head_dim;
    if !d.is_multiple_of(16) {
        return Err(Error::HeadDim { head_dim: d, supported: "multiples of 16 up to 256 for e4m3 inputs (rows of whole 16 bytes)".into() });
    }
    let not_yet = |arg: &'static str, what: &str| {
        Err(Error::Param {
            arg,
            msg: format!("{what} with e4m3 inputs: not yet (they run dense keys with a causal mask or a window, GQA)"),
        })
    };
    match () {
        _ if !matches!(layout, KeyLayout::Dense) => not_yet("kv", "a packed batch or a KV cache"),
        _ if shape.head_dim_v != d => not_yet("v", "V's own head dim"),
        _ if params.has_softcap() => not_yet("softcap", "a softcap"),
        _ if params.dropout.is_some() => not_yet("dropout_p", "dropout"),
        _ if params.attention_chunk > 0 => not_yet("attention_chunk", "chunked attention"),
        _ if params.num_splits.is_some_and(|n| n > 1) => not_yet("num_splits", "split keys"),
        _ if tensors.alibi => not_yet("alibi_slopes", "ALiBi"),
        _ if tensors.learnable_sink => not_yet("learnable_sink", "learnable sinks"),
        _ if tensors.qv => not_yet("qv", "qv"),
        _ => Ok(()),
    }
}

/// Whether `family` runs FlashAttention-3's `qv` in `shape` over keys laid out as `layout`:
/// fwd_sm90's forms of the pairs in [`fwd_sm90::QV_HEAD_DIMS`] over dense keys; else the
/// error names `qv` and what takes it.
fn qv_form(family: KernelFamily, shape: &ProblemShape, layout: KeyLayout) -> Result<()> {
    let (d, dv) = (shape.head_dim, shape.head_dim_v);
    let pairs = pairs_text(fwd_sm90::QV_HEAD_DIMS);
    let msg = if family != KernelFamily::FwdSm90 {
        format!("{family} takes none: fwd_sm90 has forms for (head dim, V's) {pairs} on Hopper")
    } else if !matches!(layout, KeyLayout::Dense) {
        "runs over dense keys alone (packed batches and KV caches: not yet)".into()
    } else if !fwd_sm90::QV_HEAD_DIMS.contains(&(d, dv)) {
        format!("has no form for head dim {d} with V's {dv}: fwd_sm90 has {pairs}")
    } else {
        return Ok(());
    };
    Err(Error::Param { arg: "qv", msg })
}

/// `(D, Dv)` pairs as the planner's errors list them: `(192, 128), (64, 256)`.
fn pairs_text(pairs: &[(usize, usize)]) -> String {
    pairs.iter().map(|(d, dv)| format!("({d}, {dv})")).collect::<Vec<_>>().join(", ")
}

fn not_a_forward(family: KernelFamily) -> Error {
    Error::Unsupported { kernel: family.name().into(), msg: "is a backward kernel: see Context::attention_backward".into() }
}

fn unsplit(variant: Variant, shape: &ProblemShape) -> Plan {
    let split_tiles = shape.seqlen_k.div_ceil(variant.tile.block_n as usize);
    Plan { variant, shape: *shape, packed_gqa: false, splits: 1, split_tiles }
}

/// The fwd_sm80 plan for `shape` (already packed): the split-KV variant for a few query
/// rows or a grid under half the SMs, split as `num_splits` says or to fill a wave. A query
/// tile of `block_m` rows visits at most `keys(block_m)` keys (fewer than Sk under a sliding
/// window): the splits share out those. A KV cache's split tile is its paged form
/// ([`fwd_sm80::paged_form`]: a deeper ring on sm_90 over pages smaller than a key block); a
/// packed batch's sequences are split alike, so its count follows its longest
/// ([`fwd_sm80::num_splits_varlen`]).
fn sm80_plan(
    device: &Device,
    shape: &ProblemShape,
    dtype: DType,
    causal: bool,
    num_splits: Option<usize>,
    layout: KeyLayout,
    keys: impl Fn(u32) -> usize,
) -> Plan {
    let d = shape.head_dim;
    let whole = fwd_sm80::variant(device.arch, dtype, d, causal, shape.seqlen_k);
    let use_split = match num_splits {
        Some(n) => n > 1,
        None => shape.seqlen_q <= fwd_sm80::SPLIT_KV_MAX_ROWS || whole.query_tiles(shape) < device.sm_count as usize / 2,
    };
    if !use_split {
        return unsplit(whole, shape);
    }
    let split = fwd_sm80::split_variant(device.arch, dtype, d, causal);
    let variant = match layout {
        KeyLayout::Paged { page_size, .. } => fwd_sm80::paged_form(device.arch, &split, page_size),
        _ => split,
    };
    let block_n = variant.tile.block_n as usize;
    // + 1: a window's keys may start mid-tile.
    let key_tiles = (keys(variant.tile.block_m).div_ceil(block_n) + 1).min(shape.seqlen_k.div_ceil(block_n));
    let wanted = num_splits.unwrap_or_else(|| {
        let wave = device.sm_count as usize * ctas_per_sm(&variant, device);
        let base_ctas = variant.query_tiles(shape);
        match layout {
            KeyLayout::Varlen { total_k } => {
                let mean_tiles = total_k.div_ceil(shape.batch.max(1)).div_ceil(block_n);
                fwd_sm80::num_splits_varlen(base_ctas, key_tiles, mean_tiles, wave)
            }
            _ => fwd_sm80::num_splits(base_ctas, key_tiles, wave),
        }
    });
    let splits = fwd_sm80::effective_splits(key_tiles, wanted.min(fwd_sm80::MAX_SPLITS));
    Plan { variant, shape: *shape, packed_gqa: false, splits, split_tiles: fwd_sm80::tiles_per_split(key_tiles, splits) }
}

/// CTAs of `variant` one SM holds, by shared memory, at most two (a 128-thread CTA of up
/// to 255 registers takes half the register file).
fn ctas_per_sm(variant: &Variant, device: &Device) -> usize {
    const RESERVED: u32 = 1024; // per CTA, by the hardware
    ((device.max_smem_per_block + RESERVED) / (variant.smem_bytes + RESERVED)).clamp(1, 2) as usize
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::params::Window;

    fn h100() -> Device {
        Device { arch: Arch::parse("sm_90a").unwrap(), sm_count: 132, max_smem_per_block: 227 * 1024 }
    }

    fn on(arch: &str) -> Device {
        Device { arch: Arch::parse(arch).unwrap(), ..h100() }
    }

    fn shape(head_dim: usize) -> ProblemShape {
        ProblemShape { batch: 8, seqlen_q: 1000, seqlen_k: 1000, heads_q: 16, heads_kv: 4, head_dim, head_dim_v: head_dim }
    }

    fn decode(batch: usize, seqlen_k: usize) -> ProblemShape {
        ProblemShape { batch, seqlen_q: 1, seqlen_k, heads_q: 32, heads_kv: 8, head_dim: 128, head_dim_v: 128 }
    }

    fn pick(device: &Device, s: &ProblemShape, p: &AttnParams) -> Plan {
        plan(device, s, DType::BF16, p).unwrap()
    }

    #[test]
    fn learnable_sinks_plan_as_the_call_without_them() {
        let sinks = ScoreTensors { learnable_sink: true, ..ScoreTensors::default() };
        let plans = |s: &ProblemShape, p: &AttnParams, layout| {
            let with = plan_for(&h100(), s, DType::BF16, p, layout, sinks).unwrap();
            let without = plan_for(&h100(), s, DType::BF16, p, layout, ScoreTensors::default()).unwrap();
            (with, without)
        };
        let paged = KeyLayout::Paged { page_size: 16, packed_queries: false };
        let split = AttnParams { num_splits: Some(4), ..AttnParams::default() };
        let mut packed_and_split = 0;
        for family in [None, Some(KernelFamily::FwdSm90), Some(KernelFamily::FwdSm80), Some(KernelFamily::Reference)] {
            for (s, p, layout) in [
                (shape(64), AttnParams { kernel: family, ..AttnParams::causal() }, KeyLayout::Dense),
                (decode(8, 4096), AttnParams { kernel: family, ..AttnParams::default() }, KeyLayout::Dense),
                (decode(8, 4096), AttnParams { kernel: family, ..split }, KeyLayout::Dense),
                (decode(8, 4096), AttnParams { kernel: family, ..AttnParams::default() }, paged),
            ] {
                if family == Some(KernelFamily::Reference) && layout != KeyLayout::Dense {
                    continue; // the reference takes no KV cache
                }
                let (with, without) = plans(&s, &p, layout);
                assert_eq!(with.variant.mods.sinks, family != Some(KernelFamily::Reference), "the reference takes them at run time");
                assert_eq!(with.splits, without.splits, "{family:?} {p:?}");
                if with.variant.family == KernelFamily::FwdSm90 {
                    assert!(!with.packed_gqa, "fwd_sm90 reads its tile's head's sink: GQA heads stay heads");
                } else {
                    assert_eq!((with.packed_gqa, with.shape), (without.packed_gqa, without.shape), "{family:?} {p:?}");
                }
                packed_and_split += usize::from(with.packed_gqa && with.splits > 1);
            }
        }
        assert!(packed_and_split > 0, "some decode plan packs GQA heads as rows and splits the keys");
    }

    #[test]
    fn v_s_own_head_dim_runs_fwd_sm90_s_form_of_the_pair_or_is_refused_by_name() {
        let deepseek = ProblemShape { head_dim: 192, head_dim_v: 128, ..shape(192) };
        assert!(value_head_dim_form(KernelFamily::FwdSm90, &deepseek, KeyLayout::Dense).is_ok());
        assert!(value_head_dim_form(KernelFamily::FwdSm90, &deepseek, KeyLayout::Varlen { total_k: 8000 }).is_ok(), "packed");
        let cache = KeyLayout::Paged { page_size: 16, packed_queries: false };
        let err = value_head_dim_form(KernelFamily::FwdSm90, &deepseek, cache).unwrap_err().to_string();
        assert!(err.contains("KV cache"), "{err}");
        let refusals = [
            (plan(&on("sm_80"), &deepseek, DType::BF16, &AttnParams::default()), "fwd_sm80"),
            (
                plan(&h100(), &deepseek, DType::BF16, &AttnParams { kernel: Some(KernelFamily::FwdSm80), ..AttnParams::default() }),
                "fwd_sm80",
            ),
            (
                plan(&h100(), &deepseek, DType::BF16, &AttnParams { kernel: Some(KernelFamily::Reference), ..AttnParams::default() }),
                "reference",
            ),
            (
                plan(&h100(), &ProblemShape { head_dim_v: 64, ..deepseek }, DType::BF16, &AttnParams::default()),
                "no form for head dim 192 with V's 64",
            ),
            (
                plan_for(
                    &h100(),
                    &deepseek,
                    DType::BF16,
                    &AttnParams::default(),
                    KeyLayout::Paged { page_size: 16, packed_queries: false },
                    ScoreTensors::default(),
                ),
                "not a KV cache",
            ),
        ];
        for (result, names) in refusals {
            let err = result.unwrap_err().to_string();
            assert!(err.contains(names), "{err}");
        }
        // The planner's own answer: fwd_sm90's form, unsplit, heads unpacked.
        for params in [AttnParams::causal(), AttnParams { window: crate::Window::new(128, 0), softcap: 30.0, ..AttnParams::causal() }] {
            let p = plan(&h100(), &deepseek, DType::BF16, &params).unwrap();
            assert_eq!(
                (p.variant.family, p.variant.head_dim, p.variant.head_dim_v, p.splits),
                (KernelFamily::FwdSm90, Some(192), Some(128), 1)
            );
            assert!(p.variant.name().contains("_d192_dv128_"), "{}", p.variant.name());
        }
        let packed = KeyLayout::Varlen { total_k: 8000 };
        let p = plan_for(&h100(), &deepseek, DType::BF16, &AttnParams::causal(), packed, ScoreTensors::default()).unwrap();
        assert!(p.variant.varlen && p.variant.head_dim_v == Some(128) && !p.packed_gqa, "{}", p.describe());
        let decode = ProblemShape { head_dim: 192, head_dim_v: 128, ..decode(8, 4096) };
        let p = plan(&h100(), &decode, DType::BF16, &AttnParams::default()).unwrap();
        assert!(!p.packed_gqa && p.variant.head_dim_v == Some(128), "decode runs the same form, heads unpacked");

        // FlashAttention-3's qv: fwd_sm90's (64, 256) form over dense keys, else refused naming qv.
        let fa3 = ProblemShape { head_dim: 64, head_dim_v: 256, ..shape(64) };
        let qv = ScoreTensors { qv: true, ..ScoreTensors::default() };
        let p = plan_for(&h100(), &fa3, DType::BF16, &AttnParams::causal(), KeyLayout::Dense, qv).unwrap();
        assert!(p.variant.mods.qv && p.variant.name().ends_with("_qv") && p.splits == 1, "{}", p.describe());
        let forced = AttnParams { kernel: Some(KernelFamily::FwdSm80), ..AttnParams::default() };
        for (shape, params, layout, names) in [
            (&fa3, AttnParams::default(), KeyLayout::Varlen { total_k: 8000 }, "dense keys"),
            (&fa3, AttnParams::default(), KeyLayout::Paged { page_size: 16, packed_queries: false }, "KV cache"),
            (&deepseek, AttnParams::default(), KeyLayout::Dense, "head dim 192 with V's 128"),
            (&fa3, forced, KeyLayout::Dense, "fwd_sm80"),
        ] {
            let err = plan_for(&h100(), shape, DType::BF16, &params, layout, qv).unwrap_err();
            assert!(matches!(err, Error::Param { arg: "qv", .. }) || err.to_string().contains(names), "{err}");
            assert!(err.to_string().contains(names), "{err}");
        }
        // FlashAttention-3's (64, 256): D256's tile (O's 128 registers a thread), Q and K 64 wide;
        // softcap with ALiBi keeps it (D64's short tile would not hold V's stages).
        let fa3 = ProblemShape { head_dim: 64, head_dim_v: 256, ..shape(64) };
        let capped = AttnParams { softcap: 30.0, ..AttnParams::causal() };
        for (params, alibi) in [(AttnParams::causal(), false), (capped, true)] {
            let tensors = ScoreTensors { alibi, ..ScoreTensors::default() };
            let p = plan_for(&h100(), &fa3, DType::BF16, &params, KeyLayout::Dense, tensors).unwrap();
            let v = &p.variant;
            assert_eq!((v.head_dim, v.head_dim_v, v.tile.block_m, v.tile.block_n), (Some(64), Some(256), 128, 80), "{}", p.describe());
            assert!(v.name().contains("_d64_dv256_") && v.smem_bytes <= 227 * 1024, "{}: {} B", v.name(), v.smem_bytes);
        }
    }

    #[test]
    fn e4m3_runs_fwd_sm90_s_fp8_form_with_masks_alone_and_is_refused_by_name_elsewhere() {
        for (d, params) in [
            (128, AttnParams::causal()),
            (64, AttnParams::default()),
            (256, AttnParams { window: crate::Window::new(100, 0), ..AttnParams::causal() }),
        ] {
            let p = plan(&h100(), &ProblemShape { heads_kv: 2, ..shape(d) }, DType::E4M3, &params).unwrap();
            let v = &p.variant;
            assert_eq!((v.family, v.dtype, v.tile.block_m, v.tile.block_n, p.splits), (KernelFamily::FwdSm90, DType::E4M3, 128, 128, 1));
            assert!(v.name().starts_with(&format!("fwd_sm90_e4m3_d{d}_")) && !p.packed_gqa, "{}", p.describe());
            assert_eq!(v.mods.local, params.window != crate::Window::UNBOUNDED, "{}", v.name());
        }
        let tensors = |alibi, learnable_sink, qv| ScoreTensors { alibi, learnable_sink, qv };
        let none = tensors(false, false, false);
        let dense = KeyLayout::Dense;
        let refusals = [
            (on("sm_80"), shape(128), AttnParams::default(), dense, none, "takes no e4m3 inputs"),
            (h100(), shape(72), AttnParams::default(), dense, none, "multiples of 16"),
            (h100(), shape(128), AttnParams::default(), KeyLayout::Varlen { total_k: 8000 }, none, "`kv`"),
            (h100(), shape(128), AttnParams::default(), KeyLayout::Paged { page_size: 16, packed_queries: false }, none, "`kv`"),
            (h100(), ProblemShape { head_dim: 192, head_dim_v: 128, ..shape(192) }, AttnParams::default(), dense, none, "`v`"),
            (h100(), shape(128), AttnParams { softcap: 30.0, ..AttnParams::default() }, dense, none, "`softcap`"),
            (h100(), shape(128), AttnParams { attention_chunk: 256, ..AttnParams::causal() }, dense, none, "`attention_chunk`"),
            (h100(), shape(128), AttnParams { num_splits: Some(2), ..AttnParams::default() }, dense, none, "`num_splits`"),
            (h100(), shape(128), AttnParams::default(), dense, tensors(true, false, false), "`alibi_slopes`"),
            (h100(), shape(128), AttnParams::default(), dense, tensors(false, true, false), "`learnable_sink`"),
            (h100(), shape(128), AttnParams { kernel: Some(KernelFamily::Reference), ..AttnParams::default() }, dense, none, "reference"),
        ];
        for (device, shape, params, layout, tensors, names) in refusals {
            let err = plan_for(&device, &shape, DType::E4M3, &params, layout, tensors).unwrap_err().to_string();
            assert!(err.contains(names), "{names}: {err}");
        }
        let dropout = AttnParams { dropout: Some(crate::Dropout { p: 0.1, seed: 1, offset: 0 }), ..AttnParams::default() };
        let err = plan(&h100(), &shape(128), DType::E4M3, &dropout).unwrap_err().to_string();
        assert!(err.contains("`dropout_p`"), "{err}");
    }

    #[test]
    fn unsupported_head_dim_is_a_head_dim_error() {
        let err = plan(&on("sm_80"), &shape(72), DType::BF16, &AttnParams::default()).unwrap_err();
        assert!(matches!(err, Error::HeadDim { head_dim: 72, .. }), "{err}");
        assert!(err.to_string().contains("128"), "lists the supported dims: {err}");
    }

    #[test]
    fn hopper_defaults_to_the_hopper_kernel_where_it_has_the_head_dim() {
        let family = |dev: &Device, d| pick(dev, &shape(d), &AttnParams::default()).variant.family;
        assert_eq!(family(&h100(), 128), KernelFamily::FwdSm90);
        assert_eq!(family(&h100(), 96), KernelFamily::FwdSm90, "as D128, padded");
        assert_eq!(family(&h100(), 32), KernelFamily::FwdSm80);
        assert_eq!(family(&on("sm_89"), 128), KernelFamily::FwdSm80);
    }

    #[test]
    fn head_dims_without_a_variant_run_on_hopper_as_the_next_size() {
        for d in [8, 40, 80, 104, 160, 224] {
            for s in [shape(d), ProblemShape { head_dim: d, head_dim_v: d, ..decode(8, 4096) }] {
                let p = pick(&h100(), &s, &AttnParams::default());
                assert_eq!((p.variant.family, p.variant.head_dim), (KernelFamily::FwdSm90, Some(d)), "D{d}: {}", p.describe());
            }
            let err = plan(&on("sm_80"), &shape(d), DType::BF16, &AttnParams::default()).unwrap_err();
            assert!(matches!(err, Error::HeadDim { head_dim, .. } if head_dim == d), "{err}");
            let forced = AttnParams { kernel: Some(KernelFamily::FwdSm80), ..AttnParams::default() };
            assert!(matches!(plan(&h100(), &shape(d), DType::BF16, &forced), Err(Error::HeadDim { .. })), "fwd_sm80 has no D{d}");
        }
        let err = plan(&h100(), &shape(264), DType::BF16, &AttnParams::default()).unwrap_err();
        assert!(err.to_string().contains("multiples of 8 up to 256"), "{err}");
    }

    #[test]
    fn decode_runs_split_with_gqa_heads_packed_as_rows() {
        let p = pick(&h100(), &decode(8, 4096), &AttnParams::causal());
        assert_eq!(p.variant.family, KernelFamily::FwdSm80);
        assert!(p.variant.split_kv && p.packed_gqa);
        assert_eq!(p.variant.causal, Some(false), "causal hides nothing at Sq = 1");
        assert_eq!((p.shape.seqlen_q, p.shape.heads_q), (4, 8));
        assert!(p.splits > 1, "{}", p.describe());
        let tiles = 4096usize.div_ceil(p.variant.tile.block_n as usize);
        assert!(p.splits * p.split_tiles >= tiles && (p.splits - 1) * p.split_tiles < tiles);
        // A big batch fills the GPU unsplit.
        assert_eq!(pick(&h100(), &decode(512, 4096), &AttnParams::default()).splits, 1);
    }

    #[test]
    fn varlen_decode_packs_gqa_heads_as_rows_on_fwd_sm80_alone() {
        let varlen = |shape: &ProblemShape, params: &AttnParams| {
            plan_for(&h100(), shape, DType::BF16, params, KeyLayout::Varlen { total_k: 8 * 4096 }, ScoreTensors::default()).unwrap()
        };
        // B 8 sequences of one query token over at most 4096 keys (max_seqlen_q 1).
        let p = varlen(&decode(8, 4096), &AttnParams::causal());
        assert_eq!(p.variant.family, KernelFamily::FwdSm80);
        assert!(p.variant.varlen && p.variant.split_kv && p.packed_gqa, "{}", p.describe());
        assert_eq!((p.shape.seqlen_q, p.shape.heads_q, p.variant.causal), (4, 8, Some(false)));
        // Not with a window (each row its own), more than one query a sequence, or fwd_sm90.
        assert!(!varlen(&decode(8, 4096), &AttnParams { window: Window::new(64, 0), ..AttnParams::default() }).packed_gqa);
        assert!(!varlen(&ProblemShape { seqlen_q: 2, ..decode(8, 4096) }, &AttnParams::default()).packed_gqa);
        let hopper = AttnParams { kernel: Some(KernelFamily::FwdSm90), ..AttnParams::default() };
        assert!(!varlen(&decode(8, 4096), &hopper).packed_gqa);
    }

    #[test]
    fn small_prefill_grids_on_hopper_run_split_where_splitting_fills_the_gpu() {
        let small = ProblemShape { batch: 1, seqlen_q: 512, seqlen_k: 512, heads_q: 8, heads_kv: 8, head_dim: 64, head_dim_v: 64 };
        let p = pick(&h100(), &small, &AttnParams::default());
        assert_eq!(p.variant.family, KernelFamily::FwdSm80);
        assert!(p.variant.split_kv && p.splits > 1 && !p.packed_gqa, "{}", p.describe());
        let big = ProblemShape { batch: 8, seqlen_q: 2048, seqlen_k: 2048, heads_q: 16, heads_kv: 16, head_dim: 64, head_dim_v: 64 };
        assert_eq!(pick(&h100(), &big, &AttnParams::default()).variant.family, KernelFamily::FwdSm90);
        let d256 = ProblemShape { batch: 2, head_dim: 256, head_dim_v: 256, ..small };
        assert_eq!(pick(&h100(), &d256, &AttnParams::default()).variant.family, KernelFamily::FwdSm90);
    }

    #[test]
    fn the_reference_kernel_is_never_packed_or_split() {
        let p = AttnParams { kernel: Some(KernelFamily::Reference), ..AttnParams::default() };
        let plan = pick(&h100(), &decode(1, 4096), &p);
        assert!(!plan.packed_gqa && plan.splits == 1);
        assert_eq!(plan.shape, decode(1, 4096));
    }

    #[test]
    fn forced_split_counts_are_honoured_within_the_key_tiles() {
        let force = |n| AttnParams { kernel: Some(KernelFamily::FwdSm80), num_splits: Some(n), ..AttnParams::default() };
        let big = shape(128);
        assert!(!pick(&h100(), &big, &force(1)).variant.split_kv);
        let p = pick(&h100(), &big, &force(3));
        assert!(p.variant.split_kv && p.splits == 3);
        let tiny = ProblemShape { seqlen_k: 10, ..big };
        assert_eq!(pick(&h100(), &tiny, &force(7)).splits, 1, "one key tile");
        assert!(matches!(plan(&h100(), &big, DType::BF16, &force(0)), Err(Error::Param { .. })));
    }

    #[test]
    fn forcing_a_family_picks_it() {
        let p = AttnParams { kernel: Some(KernelFamily::Reference), ..AttnParams::default() };
        assert_eq!(plan(&h100(), &shape(64), DType::F16, &p).unwrap().variant.family, KernelFamily::Reference);
    }

    #[test]
    fn a_kv_cache_decodes_on_fwd_sm80_split_and_prefills_on_fwd_sm90_as_dense() {
        let paged16 = KeyLayout::Paged { page_size: 16, packed_queries: false };
        let paged = plan_for(&h100(), &decode(8, 4096), DType::BF16, &AttnParams::default(), paged16, ScoreTensors::default()).unwrap();
        let dense = pick(&h100(), &decode(8, 4096), &AttnParams::default());
        assert!(paged.variant.paged && paged.variant.name().ends_with("_paged"));
        assert_eq!(paged.variant.family, KernelFamily::FwdSm80);
        // The dense split tile with a third K/V slot on sm_90 (fwd_sm80::paged_form).
        assert_eq!(paged.variant, fwd_sm80::paged_form(h100().arch, &dense.variant, 16));
        assert_eq!(paged.variant.tile.stages, 3);
        // Pages holding whole key blocks: the dense ring.
        let paged256 = plan_for(
            &h100(),
            &decode(8, 4096),
            DType::BF16,
            &AttnParams::default(),
            KeyLayout::Paged { page_size: 256, packed_queries: false },
            ScoreTensors::default(),
        );
        assert_eq!(paged256.unwrap().variant, Variant { paged: true, ..dense.variant.clone() });
        assert_eq!((paged.splits, paged.split_tiles, paged.packed_gqa), (dense.splits, dense.split_tiles, true));
        // Chunked prefill on Hopper: fwd_sm90's paged form of the dense tile, its boxes spread
        // over four producer threads at page 16 (12 boxes a block), not at 64 (3).
        let prefill = ProblemShape { batch: 4, seqlen_q: 2048, seqlen_k: 16384, heads_q: 32, heads_kv: 8, head_dim: 128, head_dim_v: 128 };
        let p = plan_for(&h100(), &prefill, DType::BF16, &AttnParams::causal(), paged16, ScoreTensors::default()).unwrap();
        assert!(p.variant.paged && p.variant.spread_pages && p.variant.family == KernelFamily::FwdSm90);
        let dense_prefill = pick(&h100(), &prefill, &AttnParams::causal()).variant;
        assert_eq!(Variant { paged: false, spread_pages: false, ..p.variant.clone() }, dense_prefill);
        let p64 = plan_for(
            &h100(),
            &prefill,
            DType::BF16,
            &AttnParams::causal(),
            KeyLayout::Paged { page_size: 64, packed_queries: false },
            ScoreTensors::default(),
        )
        .unwrap();
        assert_eq!(p64.variant, Variant { paged: true, ..dense_prefill });
        // Elsewhere fwd_sm80, unsplit; forced, either; the reference takes no cache.
        let p = plan_for(&on("sm_89"), &prefill, DType::BF16, &AttnParams::causal(), paged16, ScoreTensors::default()).unwrap();
        assert!(p.variant.paged && !p.variant.split_kv && p.variant.family == KernelFamily::FwdSm80);
        let force = |kernel| AttnParams { kernel: Some(kernel), ..AttnParams::default() };
        let p = plan_for(&h100(), &decode(8, 4096), DType::BF16, &force(KernelFamily::FwdSm90), paged16, ScoreTensors::default()).unwrap();
        assert!(p.variant.paged && p.variant.family == KernelFamily::FwdSm90 && p.packed_gqa);
        let reference = plan_for(&h100(), &prefill, DType::BF16, &force(KernelFamily::Reference), paged16, ScoreTensors::default());
        assert!(matches!(reference, Err(Error::Unsupported { .. })));
    }

    #[test]
    fn alibi_picks_the_alibi_form_and_never_packs_gqa_heads_as_rows() {
        for layout in [KeyLayout::Dense, KeyLayout::Paged { page_size: 16, packed_queries: false }, KeyLayout::Varlen { total_k: 8 * 4096 }]
        {
            let plain = plan_for(&h100(), &decode(8, 4096), DType::BF16, &AttnParams::default(), layout, ScoreTensors::default()).unwrap();
            let alibi = plan_for(
                &h100(),
                &decode(8, 4096),
                DType::BF16,
                &AttnParams::default(),
                layout,
                ScoreTensors { alibi: true, ..ScoreTensors::default() },
            )
            .unwrap();
            assert!(plain.packed_gqa && !alibi.packed_gqa, "{layout:?}: rows of one head each take its slope");
            assert!(alibi.variant.mods.alibi && alibi.variant.name().contains("_alibi"), "{}", alibi.variant.name());
        }
        // With a softcap too, fwd_sm90 takes its short tile (the default one spills).
        let prefill = ProblemShape { batch: 4, seqlen_q: 8192, seqlen_k: 8192, heads_q: 16, heads_kv: 16, head_dim: 128, head_dim_v: 128 };
        let capped = AttnParams { softcap: 30.0, ..AttnParams::default() };
        let plain = plan_for(&h100(), &prefill, DType::BF16, &capped, KeyLayout::Dense, ScoreTensors::default()).unwrap();
        let both =
            plan_for(&h100(), &prefill, DType::BF16, &capped, KeyLayout::Dense, ScoreTensors { alibi: true, ..ScoreTensors::default() })
                .unwrap();
        assert_eq!(plain.variant.family, KernelFamily::FwdSm90);
        assert_eq!((plain.variant.tile.block_n, both.variant.tile.block_n), (192, 128));
        assert_eq!(both.split_tiles, 8192 / 128, "the key tiles of the tile that runs");
        let force = AttnParams { kernel: Some(KernelFamily::Reference), ..AttnParams::default() };
        let reference =
            plan_for(&h100(), &shape(64), DType::BF16, &force, KeyLayout::Dense, ScoreTensors { alibi: true, ..ScoreTensors::default() })
                .unwrap();
        assert!(!reference.variant.mods.alibi, "the reference takes the slopes at run time");
    }

    #[test]
    fn packed_queries_over_a_paged_cache_run_fwd_sm80s_packed_paged_form_unsplit() {
        let layout = KeyLayout::Paged { page_size: 16, packed_queries: true };
        for shape in [
            decode(8, 4096),
            ProblemShape { batch: 4, seqlen_q: 2048, seqlen_k: 16384, heads_q: 32, heads_kv: 8, head_dim: 128, head_dim_v: 128 },
        ] {
            let p = plan_for(&h100(), &shape, DType::BF16, &AttnParams::causal(), layout, ScoreTensors::default()).unwrap();
            assert_eq!(
                (p.variant.family, p.variant.varlen, p.variant.paged, p.variant.split_kv),
                (KernelFamily::FwdSm80, true, true, false)
            );
            assert!(p.variant.name().ends_with("_varlen_paged"), "{}", p.variant.name());
            assert_eq!((p.splits, p.packed_gqa), (1, shape.seqlen_q == 1), "decode packs GQA heads as rows");
        }
        let force = |kernel| AttnParams { kernel: Some(kernel), ..AttnParams::default() };
        let hopper = plan_for(&h100(), &decode(8, 4096), DType::BF16, &force(KernelFamily::FwdSm90), layout, ScoreTensors::default());
        assert!(matches!(hopper, Err(Error::Unsupported { .. })), "{hopper:?}");
        let split = AttnParams { num_splits: Some(4), ..AttnParams::default() };
        assert!(matches!(
            plan_for(&h100(), &decode(8, 4096), DType::BF16, &split, layout, ScoreTensors::default()),
            Err(Error::Param { arg: "num_splits", .. })
        ));
    }

    #[test]
    fn dropout_runs_fwd_sm90_on_hopper_and_fwd_sm80_unsplit_unpacked_elsewhere() {
        let dropout = AttnParams { dropout: Some(crate::Dropout { p: 0.1, seed: 1, offset: 0 }), ..AttnParams::default() };
        for (device, family) in [(h100(), KernelFamily::FwdSm90), (on("sm_80"), KernelFamily::FwdSm80)] {
            for shape in [decode(8, 4096), shape(128)] {
                let p = plan(&device, &shape, DType::BF16, &dropout).unwrap();
                assert_eq!((p.variant.family, p.splits, p.packed_gqa), (family, 1, false));
                assert!(p.variant.mods.dropout && !p.variant.split_kv && p.variant.name().ends_with("_dropout"), "{}", p.variant.name());
            }
        }
        let forced = AttnParams { kernel: Some(KernelFamily::FwdSm80), ..dropout };
        assert_eq!(plan(&h100(), &shape(128), DType::BF16, &forced).unwrap().variant.family, KernelFamily::FwdSm80);
        let packed =
            plan_for(&h100(), &shape(128), DType::BF16, &dropout, KeyLayout::Varlen { total_k: 256 }, ScoreTensors::default()).unwrap();
        assert_eq!((packed.variant.family, packed.variant.varlen), (KernelFamily::FwdSm90, true), "a packed batch");
        let reference = AttnParams { kernel: Some(KernelFamily::Reference), ..dropout };
        assert!(matches!(plan(&h100(), &shape(128), DType::BF16, &reference), Err(Error::Unsupported { .. })));
        // A call writing the probabilities runs fwd_sm80 (the layout they have), forced or not.
        assert_eq!(
            plan(&h100(), &shape(128), DType::BF16, &probs_params(&dropout).unwrap()).unwrap().variant.family,
            KernelFamily::FwdSm80
        );
        assert!(matches!(probs_params(&AttnParams { kernel: Some(KernelFamily::FwdSm90), ..dropout }), Err(Error::Unsupported { .. })));
        let split = AttnParams { num_splits: Some(3), ..dropout };
        assert!(matches!(plan(&h100(), &shape(128), DType::BF16, &split), Err(Error::Param { arg: "num_splits", .. })));
        let paged = KeyLayout::Paged { page_size: 16, packed_queries: false };
        assert!(matches!(
            plan_for(&h100(), &shape(128), DType::BF16, &dropout, paged, ScoreTensors::default()),
            Err(Error::Param { arg: "dropout_p", .. })
        ));
        // The backward: bwd_sm90 on Hopper with dropout alone; bwd_sm80 with another score
        // policy, and elsewhere.
        let backward = |device: &Device, d: usize, params: &AttnParams, alibi: bool| {
            let b = crate::dispatch::plan_backward(device, &shape(d), DType::BF16, params, false, alibi).unwrap();
            assert!(b.variant.mods.dropout, "{}", b.variant.name());
            b.variant.family
        };
        assert_eq!(backward(&h100(), 128, &dropout, false), KernelFamily::BwdSm90);
        assert_eq!(backward(&h100(), 256, &dropout, false), KernelFamily::BwdSm90);
        assert_eq!(backward(&h100(), 64, &dropout, false), KernelFamily::BwdSm90);
        assert_eq!(backward(&h100(), 32, &dropout, false), KernelFamily::BwdSm90);
        let forced = AttnParams { kernel: Some(KernelFamily::BwdSm80), ..dropout };
        assert_eq!(backward(&h100(), 64, &forced, false), KernelFamily::BwdSm80, "forced");
        assert_eq!(backward(&h100(), 128, &dropout, true), KernelFamily::BwdSm80, "with ALiBi");
        assert_eq!(backward(&h100(), 128, &AttnParams { softcap: 30.0, ..dropout }, false), KernelFamily::BwdSm80, "softcapped");
        assert_eq!(backward(&on("sm_80"), 128, &dropout, false), KernelFamily::BwdSm80);
        let packed = crate::dispatch::plan_backward(&h100(), &shape(128), DType::BF16, &dropout, true, false).unwrap();
        assert_eq!((packed.variant.family, packed.variant.varlen), (KernelFamily::BwdSm90, true), "a packed batch");
        let forced = AttnParams { kernel: Some(KernelFamily::BwdSm90), ..dropout };
        assert_eq!(backward(&h100(), 128, &AttnParams { softcap: 30.0, ..forced }, false), KernelFamily::BwdSm90, "forced");
    }

    #[test]
    fn pre_ampere_is_unsupported() {
        assert!(matches!(plan(&on("sm_75"), &shape(64), DType::F16, &AttnParams::default()), Err(Error::Unsupported { .. })));
    }
}
