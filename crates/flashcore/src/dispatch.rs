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
