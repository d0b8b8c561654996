//! How `flashcore check` shows a run: its progress, then the table of outcomes.

use anyhow::Result;
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

    pub fn case(&self, what: &str, run: impl FnOnce() -> Result<Outcome>) -> Result<Outcome> {
        self.bar.set_message(what.to_string());
        let start = std::time::Instant::now();
        let outcome = run()?;
        self.bar.inc(1);
        if self.lines {
            let verdict = if outcome.failure.is_some() { "FAILED" } else { "ok" };
            let (done, all) = (self.bar.position(), self.bar.length().unwrap_or(0));
            eprintln!("[{done}/{all}] {} {} {verdict} ({:.1} s)", outcome.kernel.name(), outcome.spec_name, start.elapsed().as_secs_f64());
        }
        Ok(outcome)
    }
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
