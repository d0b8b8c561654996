//! How `flashcore check` shows a run: its progress, then the table of outcomes.

use anyhow::Result;
use flashcore::KernelFamily;
use indicatif::{ProgressBar, ProgressStyle};
use std::io::IsTerminal;

use crate::check::outcome::Outcome;

/// The run's progress: a bar on a terminal; else (a log) a line on stderr as each case ends,
/// with its time, so that a long or stopped run's log says where it was.
pub struct Progress {
    pub bar: ProgressBar,
    lines: bool,
}

impl Progress {
    pub fn new(cases: usize) -> Self {
        let bar = ProgressBar::new(cases as u64).with_style(ProgressStyle::with_template("{bar:40} {pos}/{len} {msg}").unwrap());
        Self { lines: !std::io::stderr().is_terminal(), bar }
    }

    /// Runs the case `what` of `kernel`: its outcome, or where the library refused it (an
    /// argument, a form the kernels do not take, a variant that would not compile) a failed
    /// outcome naming the refusal, so that the run goes on and reports every case. Any other
    /// error (a driver error may have lost the context) ends the run.
    pub fn case(&self, what: &str, kernel: KernelFamily, run: impl FnOnce() -> Result<Outcome>) -> Result<Outcome> {
        self.bar.set_message(what.to_string());
        let start = std::time::Instant::now();
        let outcome = match run() {
            Ok(outcome) => outcome,
            Err(e) if is_refusal(&e) => Outcome::refused(what, kernel, &e),
            Err(e) => return Err(e),
        };
        self.bar.inc(1);
        if self.lines {
            let verdict = if outcome.failure.is_some() { "FAILED" } else { "ok" };
            let (done, all) = (self.bar.position(), self.bar.length().unwrap_or(0));
            eprintln!("[{done}/{all}] {} {} {verdict} ({:.1} s)", outcome.kernel.name(), outcome.spec_name, start.elapsed().as_secs_f64());
        }
        Ok(outcome)
    }
}

/// Whether a case's error is the library refusing it (the GPU's context is unharmed).
fn is_refusal(e: &anyhow::Error) -> bool {
    use flashcore::Error;
    e.downcast_ref::<Error>().is_some_and(|e| {
        matches!(
            e,
            Error::Shape { .. }
                | Error::DType { .. }
                | Error::Stride { .. }
                | Error::Alignment { .. }
                | Error::HeadDim { .. }
                | Error::Param { .. }
                | Error::Unsupported { .. }
                | Error::Compile { .. }
        )
    })
}

/// The outcomes, one row each.
pub fn print_table(outcomes: &[Outcome]) {
    println!("{:<10} {:<48} {:<8} {:>9} {:>9} {:>9} {:>5}  result", "kernel", "case", "oracle", "rel_err", "max_abs", "lse_err", "det");
    for o in outcomes {
        println!(
            "{:<10} {:<48} {:<8} {:>9.2e} {:>9.2e} {:>9.2e} {:>5}  {}",
            o.kernel.name(),
            o.spec_name,
            o.oracle,
            o.rel,
            o.max_abs,
            o.lse_err,
            if o.deterministic { "yes" } else { "NO" },
            o.failure.as_deref().unwrap_or("ok")
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_refused_case_fails_and_the_run_goes_on_while_a_lost_gpu_ends_it() {
        let refused =
            anyhow::Error::new(flashcore::Error::Unsupported { kernel: "fwd_sm90".into(), msg: "packed batches: not yet".into() });
        assert!(is_refusal(&refused));
        let outcome = Outcome::refused("b1_sq8_sk8_h1_d192_dv128_full_bf16", KernelFamily::FwdSm90, &refused);
        assert!(outcome.failure.as_deref().is_some_and(|f| f.starts_with("refused: ") && f.contains("packed batches")));
        assert!(outcome.rel.is_nan() && !outcome.deterministic);
        assert!(!is_refusal(&anyhow::Error::new(flashcore::Error::NoGpu("no driver".into()))));
        assert!(!is_refusal(&anyhow::anyhow!("a harness error")));
        let progress = Progress::new(2);
        let ran = progress.case("refused", KernelFamily::FwdSm90, || Err(refused));
        assert!(ran.is_ok_and(|o| o.failure.is_some()), "recorded as a failure, not an error");
        assert!(progress.case("lost", KernelFamily::FwdSm90, || Err(anyhow::anyhow!("context lost"))).is_err());
    }
}
