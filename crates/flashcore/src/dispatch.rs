//! Problem + device → kernel variant. The one place where run-time choices become
//! compile-time ones.

use crate::error::{Error, Result};
use crate::jit::Arch;
use crate::kernels::{fwd_sm80, fwd_sm90, reference, KernelFamily, Variant};
use crate::params::{AttnParams, ProblemShape};
use crate::tensor::DType;

/// The family FlashCore runs on `arch` for `head_dim` when the caller does not force one:
/// the Hopper kernel where it exists for the head dim, else the Ampere-class one.
pub fn default_family(arch: Arch, head_dim: usize) -> KernelFamily {
    if KernelFamily::FwdSm90.runs_on(arch) && fwd_sm90::HEAD_DIMS.contains(&head_dim) {
        KernelFamily::FwdSm90
    } else {
        KernelFamily::FwdSm80
    }
}

/// Picks the variant for a validated problem.
pub fn select(arch: Arch, shape: &ProblemShape, dtype: DType, params: &AttnParams) -> Result<Variant> {
    let family = params.kernel.unwrap_or_else(|| default_family(arch, shape.head_dim));
    if !family.runs_on(arch) {
        return Err(Error::Unsupported { kernel: family.name().into(), msg: format!("does not run on {arch}") });
    }
    let d = shape.head_dim;
    if !family.head_dims().contains(&d) {
        let supported = family.head_dims().iter().map(|d| d.to_string()).collect::<Vec<_>>().join(", ");
        return Err(Error::HeadDim { head_dim: d, supported: format!("{supported} for {family}") });
    }
    Ok(match family {
        KernelFamily::Reference => reference::variant(dtype),
        KernelFamily::FwdSm80 => fwd_sm80::variant(arch, dtype, d, params.causal),
        KernelFamily::FwdSm90 => fwd_sm90::variant(dtype, d, params.causal),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn shape(head_dim: usize) -> ProblemShape {
        ProblemShape { batch: 1, seqlen_q: 10, seqlen_k: 10, heads_q: 2, heads_kv: 1, head_dim }
    }

    #[test]
    fn unsupported_head_dim_is_a_head_dim_error() {
        let arch = Arch::parse("sm_80").unwrap();
        let err = select(arch, &shape(72), DType::BF16, &AttnParams::default()).unwrap_err();
        assert!(matches!(err, Error::HeadDim { head_dim: 72, .. }), "{err}");
        assert!(err.to_string().contains("128"), "lists the supported dims: {err}");
    }

    #[test]
    fn hopper_defaults_to_the_hopper_kernel_where_it_has_the_head_dim() {
        let hopper = Arch::parse("sm_90a").unwrap();
        let pick = |arch, d| select(arch, &shape(d), DType::BF16, &AttnParams::default()).unwrap().family;
        assert_eq!(pick(hopper, 128), KernelFamily::FwdSm90);
        assert_eq!(pick(hopper, 96), KernelFamily::FwdSm80);
        assert_eq!(pick(Arch::parse("sm_89").unwrap(), 128), KernelFamily::FwdSm80);
    }

    #[test]
    fn forcing_a_family_picks_it() {
        let arch = Arch::parse("sm_90a").unwrap();
        let p = AttnParams { kernel: Some(KernelFamily::Reference), ..AttnParams::default() };
        assert_eq!(select(arch, &shape(64), DType::F16, &p).unwrap().family, KernelFamily::Reference);
    }

    #[test]
    fn pre_ampere_is_unsupported() {
        let arch = Arch::parse("sm_75").unwrap();
        assert!(matches!(select(arch, &shape(64), DType::F16, &AttnParams::default()), Err(Error::Unsupported { .. })));
    }
}
