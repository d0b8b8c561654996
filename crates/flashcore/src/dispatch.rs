//! Problem + device → kernel variant. The one place where run-time choices become
//! compile-time ones.

use crate::error::{Error, Result};
use crate::jit::Arch;
use crate::kernels::{fwd_sm80, reference, KernelFamily, Variant};
use crate::params::{AttnParams, ProblemShape};
use crate::tensor::DType;

/// The family FlashCore runs on `arch` when the caller does not force one.
pub fn default_family(arch: Arch) -> KernelFamily {
    let _ = arch;
    KernelFamily::FwdSm80
}

/// Picks the variant for a validated problem.
pub fn select(arch: Arch, shape: &ProblemShape, dtype: DType, params: &AttnParams) -> Result<Variant> {
    let family = params.kernel.unwrap_or_else(|| default_family(arch));
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
