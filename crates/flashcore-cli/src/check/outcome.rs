//! A case's outcome, and how a result is judged against the oracle's.

use flashcore::{DType, KernelFamily};

use crate::cases::{errors, Inputs};

/// One case's result (every group's: forward, varlen, paged, backward).
pub struct Outcome {
    pub spec_name: String,
    pub kernel: KernelFamily,
    pub oracle: &'static str,
    pub rel: f64,
    pub max_abs: f64,
    pub lse_err: f64,
    pub deterministic: bool,
    pub failure: Option<String>,
}

impl Outcome {
    /// The outcome of case `what` that the library refused with `error`: failed, nothing measured.
    pub fn refused(what: &str, kernel: KernelFamily, error: &anyhow::Error) -> Self {
        Outcome {
            spec_name: what.to_string(),
            kernel,
            oracle: "-",
            rel: f64::NAN,
            max_abs: f64::NAN,
            lse_err: f64::NAN,
            deterministic: false,
            failure: Some(format!("refused: {error}")),
        }
    }
}

/// The forward's bound on the relative L2 error of o (docs/design.md §8); e4m3 inputs are
/// judged against an emulation's error instead (`fp8.rs`), this is their output's (bf16).
pub fn tolerance(dtype: DType) -> f64 {
    match dtype.output() {
        DType::F16 => 2e-3,
        _ => 1e-2,
    }
}

/// The backward's bound on each gradient's relative L2 error (the measurements behind it:
/// `bwd.rs`'s docs).
pub fn grad_tolerance(dtype: DType, inputs: Inputs) -> f64 {
    match (dtype.output(), inputs) {
        (DType::F16, _) => 2e-3,
        (_, Inputs::LargeLogits) => 1.5e-2,
        (_, _) => 1e-2,
    }
}

/// The bound on the sinks' gradient's error a head, against the size of its terms
/// (`ReferenceGrads::dsink_scales`): the kernels' D_i = dO·O read O rounded to the dtype, each
/// product off by at most its unit roundoff (bf16 2⁻⁹, f16 2⁻¹¹), doubled for the f32 sums and
/// the sink's probability from the f32 LSE. A row or a sequence left out is far beyond it.
pub fn dsink_tolerance(dtype: DType) -> f64 {
    match dtype.output() {
        DType::F16 => 2f64.powi(-10),
        _ => 2f64.powi(-8),
    }
}

/// The sinks' gradient against the oracle's: `(error, failure)`, the error the largest over the
/// heads of `|got − want|` over the size of the head's terms (`scales`,
/// `ReferenceGrads::dsink_scales`): the kernels' D_i come from O in bf16 / f16 and dsink is a
/// sum that cancels, so its own relative error would measure the cancellation, while a lost
/// row, sequence or head is an error of the terms' size. Fails on NaN/Inf or beyond
/// [`dsink_tolerance`].
pub fn judge_dsink(got: &[f32], want: &[f64], scales: &[f64], dtype: DType) -> (f64, Option<String>) {
    let r = got.iter().zip(want).zip(scales).map(|((&g, w), s)| (g as f64 - w).abs() / s.max(f64::MIN_POSITIVE)).fold(0f64, f64::max);
    let failure = if got.iter().any(|x| !x.is_finite()) {
        Some("NaN/Inf in dsink (unwritten or overflowed)".to_string())
    } else if r > dsink_tolerance(dtype) {
        Some(format!("dsink error {r:.2e} of its terms' size > {:.1e}", dsink_tolerance(dtype)))
    } else {
        None
    };
    (r, failure)
}

/// Whether two runs' f32 results are the same bits.
pub fn same_bits(a: &[f32], b: &[f32]) -> bool {
    a.iter().map(|x| x.to_bits()).eq(b.iter().map(|x| x.to_bits()))
}

/// A forward result against the oracle's: (relative L2 error, max abs error, max LSE error,
/// the first failure: NaN/Inf in o, o beyond the dtype's tolerance, an LSE not -inf where the
/// oracle's is (a row without keys) or not finite where it is finite, LSE error > 2e-3, two
/// runs not bitwise equal).
pub fn judge(o: &[f32], ref_o: &[f64], lse: &[f32], ref_lse: &[f64], dtype: DType, deterministic: bool) -> (f64, f64, f64, Option<String>) {
    let (rel, max_abs) = errors(o, ref_o);
    let mut lse_err = 0f64;
    let mut lse_failure = None;
    for (i, (&got, &want)) in lse.iter().zip(ref_lse).enumerate() {
        if want == f64::NEG_INFINITY {
            if got != f32::NEG_INFINITY {
                lse_failure = Some(format!("lse[{i}] = {got} for a fully masked row, want -inf"));
            }
        } else if !got.is_finite() {
            lse_failure = Some(format!("lse[{i}] = {got}, want {want:.4}"));
        } else {
            lse_err = lse_err.max((got as f64 - want).abs());
        }
    }
    let failure = if o.iter().any(|x| !x.is_finite()) {
        Some("NaN/Inf in the output (unwritten or overflowed elements)".into())
    } else if rel > tolerance(dtype) {
        Some(format!("rel error {rel:.2e} > {:.0e}", tolerance(dtype)))
    } else if lse_failure.is_some() {
        lse_failure
    } else if lse_err > 2e-3 {
        Some(format!("lse error {lse_err:.2e} > 2e-3"))
    } else if !deterministic {
        Some("two runs differ bitwise".into())
    } else {
        None
    };
    (rel, max_abs, lse_err, failure)
}
