//! The backward's plan: which family runs the gradients, its variant, and the run-time
//! choices that go with it (bwd_sm80's deterministic dQ slices, bwd_sm90's spread walks).
//!
//! On Hopper (sm_90a) `bwd_sm90` (wgmma, TMA, warp specialized) for head dims 64, 96, 128,
//! 192 and 256, and for every multiple of 8 up to 256 that bwd_sm80 has no tile for (run as
//! the next of those sizes, the columns past it zero-filled); else `bwd_sm80`
//! (FlashAttention-2's algorithm, mma.sync), every head dim of its forward; the naive reference kernels (exact f32 gradients, slow) when `params.kernel`
//! names the reference. `params.kernel` may also name bwd_sm80 or bwd_sm90; a forward family
//! named there concerns the forward only. A sliding window and a softcap select the kernels'
//! `_local` and `_softcap` variants (the reference kernels take both at run time). A packed
//! batch runs the `_varlen` form of the dense batch's family (the reference takes none).

use super::Device;
use crate::error::{Error, Result};
use crate::jit::Arch;
use crate::kernels::{bwd_sm80, bwd_sm90, reference, KernelFamily, ScoreMods, Variant};
use crate::params::AttnParams;
use crate::shape::ProblemShape;
use crate::tensor::DType;

/// What runs for one backward problem.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BwdPlan {
    /// The compiled variant (its module holds the pass's other kernels).
    pub variant: Variant,
    /// Slices of dQ's f32 accumulator: bwd_sm80 in deterministic mode (a CTA per slice of a
    /// KV head's key blocks), else 1.
    pub dq_splits: usize,
    /// bwd_sm90: whether the key blocks start their walks spread over the query blocks.
    pub spread_walks: bool,
    /// Deterministic mode (bwd_sm90 keeps an order counter per query block).
    pub deterministic: bool,
}

impl BwdPlan {
    /// Scratch bytes of a call: the per-row statistics (D_i; bwd_sm90 also lse·log2e), then
    /// dQ's f32 accumulator (and bwd_sm90's order counters). `shape` is the kernels' (packed:
    /// B sequences of the longest lengths), `tensors` the tensors' own, `total_q` the packed
    /// rows when the batch is packed.
    ///
    /// - bwd_sm80: D_i, `4·B·Hq·Sq` bytes, and dQ's accumulator, `4·B·Sq·Hq·D` bytes times
    ///   `dq_splits`. Packed, `B·Sq` is `total_q`.
    /// - bwd_sm90: `8·B·Hq·Sq'` bytes and `4·B·Hq·Sq'·D'`, Sq' being Sq rounded up to whole
    ///   query blocks and D' the head dim of the kernel's tiles (D96: 128, D192: 256); in
    ///   deterministic mode also 4 bytes per query block. Its prep kernel zeroes the
    ///   accumulator; bwd_sm80's is zeroed by a memset. Packed, `B·Sq'` is
    ///   `total_q + B·block_m` rounded down to whole blocks.
    pub fn scratch_bytes(&self, shape: &ProblemShape, tensors: &ProblemShape, total_q: Option<usize>) -> (usize, usize) {
        if self.variant.family == KernelFamily::BwdSm90 {
            return bwd_sm90::scratch_layout(&self.variant, shape, total_q, self.deterministic);
        }
        let rows = tensors.batch * tensors.heads_q * tensors.seqlen_q;
        let accum = if self.variant.family == KernelFamily::BwdSm80 { self.dq_splits * rows * shape.head_dim * 4 } else { 0 };
        ((rows * 4).next_multiple_of(256), accum)
    }
}

/// The backward plan for `shape` (packed: `varlen`, B sequences of the longest lengths; with
/// ALiBi: `alibi`).
pub fn plan_backward(
    device: &Device,
    shape: &ProblemShape,
    dtype: DType,
    params: &AttnParams,
    varlen: bool,
    alibi: bool,
) -> Result<BwdPlan> {
    let variant = backward_variant(shape, dtype, params, device.arch, varlen, alibi)?;
    let dq_splits = if variant.family == KernelFamily::BwdSm80 && params.deterministic {
        let key_blocks = shape.seqlen_k.div_ceil(variant.tile.block_n as usize);
        match params.num_splits {
            Some(0) => return Err(Error::Param { arg: "num_splits", msg: "must be at least 1 (None picks it)".into() }),
            Some(n) => n.clamp(1, key_blocks.max(1)),
            None => bwd_sm80::deterministic_splits(device.sm_count as usize, shape.heads_kv, shape.batch, key_blocks),
        }
    } else {
        1
    };
    let spread_walks = variant.family == KernelFamily::BwdSm90 && spread_walks(&variant, shape, device.sm_count);
    Ok(BwdPlan { variant, dq_splits, spread_walks, deterministic: params.deterministic })
}

/// Whether bwd_sm90's key blocks start their walks spread over the query blocks (see
/// `Walk` in `kernels/common/bwd_schedule.cuh`): only when all key blocks of a head fit on
/// the GPU at once (one CTA an SM), since in deterministic mode a key block may then wait for
/// any other key block of its head, the last launched included.
fn spread_walks(variant: &Variant, shape: &ProblemShape, sm_count: u32) -> bool {
    shape.seqlen_k.div_ceil(variant.tile.block_n as usize) <= sm_count as usize
}

/// The variant of the family [`backward_family`] picks, with the score policies of `params`
/// (the forward's choices: a window, causal folded in, is `_local`; a softcap `_softcap`;
/// ALiBi `_alibi`) and, for a packed batch (`varlen`), the `_varlen` form.
pub(crate) fn backward_variant(
    shape: &ProblemShape,
    dtype: DType,
    params: &AttnParams,
    arch: Arch,
    varlen: bool,
    alibi: bool,
) -> Result<Variant> {
    let (causal, window) = params.mask();
    let family = backward_family(shape, params, arch, varlen, alibi)?;
    let own_value_dim = shape.head_dim_v != shape.head_dim;
    if own_value_dim {
        value_head_dim_backward(family, shape, params.dropout.is_some())?;
    }
    let variant = match family {
        KernelFamily::BwdSm80 => bwd_sm80::variant(arch, dtype, shape.head_dim, causal),
        KernelFamily::BwdSm90 if own_value_dim => bwd_sm90::value_variant(dtype, shape.head_dim, shape.head_dim_v, causal),
        KernelFamily::BwdSm90 => bwd_sm90::variant(dtype, shape.head_dim, causal),
        _ => return Ok(reference::variant(dtype)),
    };
    let dropout = params.dropout.is_some();
    let mut variant = crate::kernels::with_mods(
        &variant,
        ScoreMods {
            local: window.is_some(),
            chunk: params.attention_chunk > 0,
            softcap: params.has_softcap(),
            alibi,
            dropout,
            ..ScoreMods::default()
        },
    );
    variant.varlen = varlen;
    Ok(variant)
}

/// Whether `family` runs the backward of V's own head dim in `shape`: bwd_sm90's forms of its
/// pairs (`bwd_sm90::VALUE_HEAD_DIMS`), dense or packed, without dropout; else the error names
/// what runs it (the Python package then pads the narrower of Q's and V's dims to the wider).
/// The one place that decides which `(D, Dv)` the backward takes.
fn value_head_dim_backward(family: KernelFamily, shape: &ProblemShape, dropout: bool) -> Result<()> {
    let (d, dv) = (shape.head_dim, shape.head_dim_v);
    let msg = if family != KernelFamily::BwdSm90 {
        format!("takes V's head dim equal to q's and k's (here {dv} and {d}): bwd_sm90 has forms of V's own on Hopper")
    } else if !bwd_sm90::VALUE_HEAD_DIMS.contains(&(d, dv)) {
        format!("has no form for head dim {d} with V's {dv}: it has {}", super::pairs_text(bwd_sm90::VALUE_HEAD_DIMS))
    } else if dropout {
        "runs V's own head dim without dropout alone (dropout: not yet)".into()
    } else {
        return Ok(());
    };
    Err(Error::Unsupported { kernel: family.name().into(), msg })
}

/// Whether a binding runs the backward of a call with V's own head dim `head_dim_v` (Q's
/// `head_dim`; dense or packed) with the narrower dim's tensors zero-padded to the wider (V, O
/// and dO to Q's; or Q and K to V's, FlashAttention-3's (64, 256)): where no kernel has a
/// backward form of the pair (the planner refuses it, `value_head_dim_backward`, on `arch`'s
/// family, with or without `dropout`). Exact, at the call's own softmax scale: zero columns add
/// nothing to Q·Kᵀ, dP = dO·Vᵀ or rowsum(dO∘O), and the gradients' padded columns are cut off.
/// The Python package asks once per pair.
pub fn backward_pads_value_dim(arch: Arch, head_dim: usize, head_dim_v: usize, dropout: bool) -> bool {
    let shape = ProblemShape { batch: 1, seqlen_q: 1, seqlen_k: 1, heads_q: 1, heads_kv: 1, head_dim, head_dim_v };
    let family = if KernelFamily::BwdSm90.runs_on(arch) { KernelFamily::BwdSm90 } else { KernelFamily::BwdSm80 };
    head_dim_v != head_dim && value_head_dim_backward(family, &shape, dropout).is_err()
}

/// Which kernels run the backward of `shape` (see the module's documentation): bwd_sm90 on
/// Hopper for its head dims, else bwd_sm80, a packed batch (`varlen`) too; a family named in
/// `params.kernel` if it can.
fn backward_family(shape: &ProblemShape, params: &AttnParams, arch: Arch, varlen: bool, alibi: bool) -> Result<KernelFamily> {
    let unsupported = |family: KernelFamily, msg: String| Err(Error::Unsupported { kernel: family.name().into(), msg });
    let takes = |family: KernelFamily| family.takes_head_dim(shape.head_dim);
    let native = |family: KernelFamily| family.head_dims().contains(&shape.head_dim);
    if params.dropout.is_some() {
        // Dropout's mask has a form in both backward kernels (common/dropout.cuh). Unforced,
        // bwd_sm90 on Hopper with no other score policy, dense or packed: its consumers'
        // registers hold the mask's bits beside Sᵀ and dPᵀ (with a window, a softcap and ALiBi
        // besides, D96-D128 spilled 96 bytes; NVRTC 13.0). Else bwd_sm80. The reference has none.
        let policies = params.mask().1.is_some() || params.has_softcap() || alibi;
        let hopper = KernelFamily::BwdSm90.runs_on(arch) && takes(KernelFamily::BwdSm90);
        let unforced_sm90 = hopper && !policies;
        return match params.kernel {
            None if unforced_sm90 => Ok(KernelFamily::BwdSm90),
            Some(KernelFamily::BwdSm90) if hopper => Ok(KernelFamily::BwdSm90),
            Some(KernelFamily::BwdSm90) => unsupported(
                KernelFamily::BwdSm90,
                format!(
                    "runs on sm_90a at head dims {} (this GPU is {arch}, head dim {})",
                    KernelFamily::BwdSm90.head_dims_text(),
                    shape.head_dim
                ),
            ),
            None | Some(KernelFamily::BwdSm80) if takes(KernelFamily::BwdSm80) => Ok(KernelFamily::BwdSm80),
            None | Some(KernelFamily::BwdSm80) => unsupported(
                KernelFamily::BwdSm80,
                format!("runs dropout at head dims {} (head dim {})", KernelFamily::BwdSm80.head_dims_text(), shape.head_dim),
            ),
            Some(family) => unsupported(family, "has no dropout form: bwd_sm80 and bwd_sm90 have".into()),
        };
    }
    match params.kernel {
        Some(KernelFamily::Reference) if varlen => {
            unsupported(KernelFamily::Reference, "takes no packed batch (it is the oracle: run each sequence alone)".into())
        }
        Some(KernelFamily::Reference) => Ok(KernelFamily::Reference),
        Some(family @ (KernelFamily::BwdSm80 | KernelFamily::BwdSm90)) if !takes(family) => {
            unsupported(family, format!("takes head dims {} (head dim {})", family.head_dims_text(), shape.head_dim))
        }
        Some(KernelFamily::BwdSm90) if !KernelFamily::BwdSm90.runs_on(arch) => {
            unsupported(KernelFamily::BwdSm90, format!("needs sm_90a (this GPU is {arch})"))
        }
        Some(KernelFamily::BwdSm80) => Ok(KernelFamily::BwdSm80),
        Some(KernelFamily::BwdSm90) => Ok(KernelFamily::BwdSm90),
        _ if native(KernelFamily::BwdSm90) && KernelFamily::BwdSm90.runs_on(arch) => Ok(KernelFamily::BwdSm90),
        _ if takes(KernelFamily::BwdSm80) => Ok(KernelFamily::BwdSm80),
        _ if takes(KernelFamily::BwdSm90) && KernelFamily::BwdSm90.runs_on(arch) => Ok(KernelFamily::BwdSm90),
        _ => unsupported(
            KernelFamily::BwdSm80,
            format!(
                "takes head dims {} (head dim {}; bwd_sm90 takes the other multiples of 8 on Hopper)",
                KernelFamily::BwdSm80.head_dims_text(),
                shape.head_dim
            ),
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn shape(head_dim: usize) -> ProblemShape {
        ProblemShape { batch: 2, seqlen_q: 300, seqlen_k: 300, heads_q: 8, heads_kv: 2, head_dim, head_dim_v: head_dim }
    }
    const HOPPER: Arch = Arch { major: 9, minor: 0, specific: true };
    const AMPERE: Arch = Arch { major: 8, minor: 0, specific: false };

    #[test]
    fn hopper_takes_bwd_sm90_where_it_has_the_head_dim() {
        for deterministic in [false, true] {
            let params = AttnParams { deterministic, ..AttnParams::default() };
            for d in [64, 96, 128, 192, 256] {
                assert_eq!(backward_family(&shape(d), &params, HOPPER, false, false).unwrap(), KernelFamily::BwdSm90, "D{d}");
                assert_eq!(backward_family(&shape(d), &params, AMPERE, false, false).unwrap(), KernelFamily::BwdSm80, "D{d} on sm_80");
            }
            assert_eq!(backward_family(&shape(32), &params, HOPPER, false, false).unwrap(), KernelFamily::BwdSm80, "D32");
            for d in [8, 40, 80, 104, 160, 224] {
                assert_eq!(backward_family(&shape(d), &params, HOPPER, false, false).unwrap(), KernelFamily::BwdSm90, "D{d}");
                let err = backward_family(&shape(d), &params, AMPERE, false, false).unwrap_err().to_string();
                assert!(err.contains("head dim") && err.contains("bwd_sm80"), "D{d} on sm_80: {err}");
            }
        }
    }

    #[test]
    fn v_s_own_head_dim_runs_bwd_sm90_s_form_or_is_refused_by_name() {
        let deepseek = ProblemShape { head_dim: 192, head_dim_v: 128, ..shape(192) };
        assert!(value_head_dim_backward(KernelFamily::BwdSm90, &deepseek, false).is_ok());
        let refusals = [
            (value_head_dim_backward(KernelFamily::BwdSm90, &deepseek, true), "dropout"),
            (value_head_dim_backward(KernelFamily::BwdSm80, &deepseek, false), "bwd_sm90 has forms"),
            (value_head_dim_backward(KernelFamily::BwdSm90, &ProblemShape { head_dim_v: 64, ..deepseek }, false), "(192, 128)"),
        ];
        for (result, names) in refusals {
            let err = result.unwrap_err().to_string();
            assert!(err.contains(names), "{err}");
        }
        // The planner's answer, dense and packed: bwd_sm90's (192, 128) form, the split layout.
        for varlen in [false, true] {
            let v = backward_variant(&deepseek, DType::BF16, &AttnParams::causal(), HOPPER, varlen, false).unwrap();
            assert_eq!((v.family, v.head_dim, v.head_dim_v, v.varlen), (KernelFamily::BwdSm90, Some(192), Some(128), varlen));
            assert!(v.name().contains("_d192_dv128"), "{}", v.name());
        }
        let err = backward_variant(&deepseek, DType::BF16, &AttnParams::causal(), AMPERE, false, false).unwrap_err().to_string();
        assert!(err.contains("bwd_sm80") && err.contains("bwd_sm90 has forms"), "{err}");
        // What a binding pads: the refusals above, never a call without V's own head dim.
        assert!(!backward_pads_value_dim(HOPPER, 192, 128, false), "bwd_sm90's form");
        assert!(backward_pads_value_dim(HOPPER, 192, 128, true) && backward_pads_value_dim(AMPERE, 192, 128, false));
        assert!(backward_pads_value_dim(HOPPER, 128, 64, false), "no form of the pair");
        assert!(backward_pads_value_dim(HOPPER, 64, 256, false), "FlashAttention-3's (64, 256): forward forms alone");
        let fa3 = ProblemShape { head_dim: 64, head_dim_v: 256, ..shape(64) };
        let err = backward_variant(&fa3, DType::BF16, &AttnParams::causal(), HOPPER, false, false).unwrap_err().to_string();
        assert!(err.contains("head dim 64 with V's 256") && err.contains("(192, 128)"), "{err}");
        assert!(!backward_pads_value_dim(HOPPER, 192, 192, false) && !backward_pads_value_dim(AMPERE, 64, 64, true));
    }

    #[test]
    fn the_reference_runs_only_where_named() {
        // The Python package never names a family: every backward it starts runs on tensor
        // cores or is refused, so it has no slow path to warn of.
        for arch in [HOPPER, AMPERE] {
            for deterministic in [false, true] {
                let params = AttnParams { deterministic, ..AttnParams::default() };
                for d in 1..=crate::kernels::MAX_HEAD_DIM {
                    for varlen in [false, true] {
                        if let Ok(family) = backward_family(&shape(d), &params, arch, varlen, false) {
                            assert_ne!(family, KernelFamily::Reference, "D{d} on {arch}, varlen {varlen}");
                        }
                    }
                }
            }
        }
    }

    #[test]
    fn a_named_backward_family_is_honoured_or_refused() {
        let named = |family| AttnParams { kernel: Some(family), ..AttnParams::default() };
        assert_eq!(backward_family(&shape(128), &named(KernelFamily::BwdSm80), HOPPER, false, false).unwrap(), KernelFamily::BwdSm80);
        assert_eq!(backward_family(&shape(128), &named(KernelFamily::Reference), HOPPER, false, false).unwrap(), KernelFamily::Reference);
        assert_eq!(backward_family(&shape(128), &named(KernelFamily::FwdSm80), HOPPER, false, false).unwrap(), KernelFamily::BwdSm90);
        let refused = |d, arch| match backward_family(&shape(d), &named(KernelFamily::BwdSm90), arch, false, false) {
            Err(Error::Unsupported { kernel, msg }) => format!("{kernel}: {msg}"),
            other => panic!("expected Unsupported, got {other:?}"),
        };
        assert!(refused(36, HOPPER).contains("head dims"), "{}", refused(36, HOPPER));
        assert_eq!(
            backward_family(&shape(32), &named(KernelFamily::BwdSm90), HOPPER, false, false).unwrap(),
            KernelFamily::BwdSm90,
            "D32 as D64"
        );
        assert!(refused(128, AMPERE).contains("sm_90a"), "{}", refused(128, AMPERE));
    }

    #[test]
    fn windows_and_softcaps_pick_the_mods_variants() {
        let pick = |params: AttnParams, arch| backward_variant(&shape(128), DType::BF16, &params, arch, false, false).unwrap();
        for arch in [HOPPER, AMPERE] {
            let local = pick(AttnParams { causal: true, window: crate::params::Window::new(127, 0), ..AttnParams::default() }, arch);
            assert_eq!((local.causal, local.mods), (Some(false), ScoreMods { local: true, ..ScoreMods::default() }), "causal folded in");
            assert!(local.name().ends_with("_local"), "{}", local.name());
            let capped = pick(AttnParams { causal: true, softcap: 30.0, deterministic: true, ..AttnParams::default() }, arch);
            assert_eq!((capped.causal, capped.mods), (Some(true), ScoreMods { softcap: true, ..ScoreMods::default() }));
            let only_causal = pick(AttnParams { window: crate::params::Window::new(-1, 0), ..AttnParams::default() }, arch);
            assert_eq!((only_causal.causal, only_causal.mods), (Some(true), ScoreMods::default()), "(-1, 0) is causal");
        }
        let named = AttnParams { kernel: Some(KernelFamily::Reference), softcap: 30.0, ..AttnParams::default() };
        assert_eq!(pick(named, HOPPER).mods, ScoreMods::default(), "the reference takes both at run time");
        for arch in [HOPPER, AMPERE] {
            let alibi = backward_variant(&shape(128), DType::BF16, &AttnParams::causal(), arch, false, true).unwrap();
            assert_eq!(alibi.mods, ScoreMods { alibi: true, ..ScoreMods::default() });
            assert!(alibi.name().ends_with("_alibi"), "{}", alibi.name());
        }
        let reference = backward_variant(&shape(128), DType::BF16, &named, HOPPER, false, true).unwrap();
        assert_eq!(reference.mods, ScoreMods::default(), "the reference takes the slopes at run time");
    }

    #[test]
    fn packed_batches_take_the_dense_family_or_a_named_refusal() {
        for arch in [HOPPER, AMPERE] {
            for d in [32, 64, 128, 256] {
                let params = AttnParams { deterministic: d == 64, ..AttnParams::default() };
                let want = if arch == HOPPER && d != 32 { KernelFamily::BwdSm90 } else { KernelFamily::BwdSm80 };
                assert_eq!(backward_family(&shape(d), &params, arch, true, false).unwrap(), want, "D{d} on {arch}");
            }
            for family in [KernelFamily::BwdSm80, KernelFamily::BwdSm90].into_iter().filter(|f| f.runs_on(arch)) {
                let named = AttnParams { kernel: Some(family), causal: true, softcap: 30.0, ..AttnParams::default() };
                let v = backward_variant(&shape(128), DType::BF16, &named, arch, true, false).unwrap();
                assert!(v.family == family && v.name().ends_with("_softcap_varlen"), "{}", v.name());
            }
        }
        let named = AttnParams { kernel: Some(KernelFamily::Reference), ..AttnParams::default() };
        match backward_family(&shape(128), &named, HOPPER, true, false) {
            Err(Error::Unsupported { kernel, msg }) => assert!(kernel == "reference" && msg.contains("packed"), "{kernel}: {msg}"),
            other => panic!("expected Unsupported, got {other:?}"),
        }
    }
}
