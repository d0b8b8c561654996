//! A bench run's report: its rows, pooled over rounds, as a table and JSON (schema 1, shared
//! with `bench/anchors.py`), and the comparison of two reports (`--compare`).

use std::path::PathBuf;

use anyhow::{bail, Context as _, Result};
use flashcore::Context;
use serde::{Deserialize, Serialize};

use crate::cases::Case;

#[derive(Serialize, Deserialize)]
pub struct Report {
    pub schema: u32,
    pub system: String,
    pub suite: String,
    pub env: serde_json::Value,
    pub results: Vec<Row>,
}

#[derive(Serialize, Deserialize, Clone)]
pub struct Row {
    pub case: Case,
    pub kernel: Option<String>,
    pub status: String,
    pub message: Option<String>,
    pub samples_ms: Vec<f64>,
    pub median_ms: Option<f64>,
    pub min_ms: Option<f64>,
    pub max_ms: Option<f64>,
    pub tflops: Option<f64>,
    pub gbps: Option<f64>,
    pub rel_error: Option<f64>,
    /// How `median_ms` was taken: "graph" (CUDA-graph replays) or "eager".
    #[serde(default)]
    pub timing: Option<String>,
    /// Median of launches issued one by one from the host (what an eager caller sees).
    #[serde(default)]
    pub eager_median_ms: Option<f64>,
    /// Suite `bwd`: forward + backward per sample, timed as `median_ms` (which is then the
    /// backward alone).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fwd_bwd_median_ms: Option<f64>,
    /// `--rounds` above 1: each round's median (`median_ms` is then over all samples).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub round_medians_ms: Vec<f64>,
}

/// Each row over the rounds (the same rows in the same order each round): samples pooled,
/// median, min and max over all of them, the rates scaled to the pooled median, and each
/// round's median kept. A row that failed in any round stays failed.
pub fn pool_rounds(mut rounds: Vec<Vec<Row>>) -> Vec<Row> {
    let first = rounds.remove(0);
    if rounds.is_empty() {
        return first;
    }
    let median = |mut v: Vec<f64>| {
        v.sort_by(f64::total_cmp);
        v.get(v.len() / 2).copied()
    };
    first
        .into_iter()
        .enumerate()
        .map(|(i, row)| {
            let all: Vec<&Row> = std::iter::once(&row).chain(rounds.iter().map(|r| &r[i])).collect();
            if let Some(failed) = all.iter().find(|r| r.status != "ok") {
                return (*failed).clone();
            }
            let samples: Vec<f64> = all.iter().flat_map(|r| r.samples_ms.iter().copied()).collect();
            let pooled = median(samples.clone());
            let scale = match (row.median_ms, pooled) {
                (Some(a), Some(b)) if b > 0.0 => a / b,
                _ => 1.0,
            };
            let of = |f: fn(&Row) -> Option<f64>| median(all.iter().filter_map(|r| f(r)).collect());
            Row {
                median_ms: pooled,
                min_ms: samples.iter().copied().reduce(f64::min),
                max_ms: samples.iter().copied().reduce(f64::max),
                tflops: row.tflops.map(|t| t * scale),
                gbps: row.gbps.map(|g| g * scale),
                rel_error: all.iter().filter_map(|r| r.rel_error).reduce(f64::max),
                eager_median_ms: of(|r| r.eager_median_ms),
                fwd_bwd_median_ms: of(|r| r.fwd_bwd_median_ms),
                round_medians_ms: all.iter().filter_map(|r| r.median_ms).collect(),
                samples_ms: samples,
                ..row
            }
        })
        .collect()
}

/// The run's machine and software, for the report.
pub fn env(ctx: &Context) -> serde_json::Value {
    let info = ctx.info();
    let nvrtc = ctx.jit().nvrtc().map(|n| format!("{}.{}", n.version().0, n.version().1)).unwrap_or_else(|e| e.to_string());
    let date = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_secs()).unwrap_or(0);
    // The kernel module's version is the driver's; the CUDA API reports only its CUDA level.
    let driver = std::fs::read_to_string("/proc/driver/nvidia/version").ok().and_then(|t| {
        t.split_whitespace()
            .find(|w| w.chars().filter(|&c| c == '.').count() >= 1 && w.chars().all(|c| c.is_ascii_digit() || c == '.'))
            .map(String::from)
    });
    serde_json::json!({
        "device": info.name,
        "driver": driver,
        "date": utc_date(date),
        "sm": info.arch.to_string(),
        "sm_count": info.sm_count,
        "cuda_driver_api": format!("{}.{}", info.driver_version / 1000, info.driver_version % 1000 / 10),
        "nvrtc": nvrtc,
        "flashcore_commit": env!("FLASHCORE_COMMIT"),
        "date_unix": date,
    })
}

/// `YYYY-MM-DD` of a Unix time (UTC), by the civil-from-days algorithm.
fn utc_date(unix_secs: u64) -> String {
    let z = (unix_secs / 86_400) as i64 + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    format!("{year:04}-{month:02}-{day:02}")
}

/// A forward case timed twice, the way `--eager` asks (`graph`) and eager (the row's
/// `eager_median_ms`), or, where the library refused or failed, the case's row saying so
/// ("unsupported" for what FlashCore does not run, else "error").
pub fn timed_and_eager<T>(case: &Case, graph: bool, mut timed: impl FnMut(bool) -> flashcore::Result<T>) -> Result<(T, T), Box<Row>> {
    timed(graph).and_then(|t| Ok((t, timed(false)?))).map_err(|e| {
        let status = if matches!(e, flashcore::Error::Unsupported { .. }) { "unsupported" } else { "error" };
        Box::new(unsupported(case, status, e.to_string()))
    })
}

/// The row of a case that did not run: `status` ("unsupported" or "error") and why.
pub fn unsupported(case: &Case, status: &str, message: String) -> Row {
    Row {
        case: case.clone(),
        kernel: None,
        status: status.into(),
        message: Some(message),
        samples_ms: vec![],
        median_ms: None,
        min_ms: None,
        max_ms: None,
        tflops: None,
        gbps: None,
        rel_error: None,
        timing: None,
        eager_median_ms: None,
        fwd_bwd_median_ms: None,
        round_medians_ms: vec![],
    }
}

pub fn print_table(report: &Report) {
    println!(
        "{:<44} {:>10} {:>10} {:>10} {:>10} {:>9} {:>9} {:>9}  kernel",
        "case", "median_ms", "min_ms", "max_ms", "eager_ms", "TFLOPS", "GB/s", "rel_err"
    );
    let f = |x: Option<f64>, p: usize| x.map(|v| format!("{v:.p$}")).unwrap_or_else(|| "—".into());
    for r in &report.results {
        if r.status != "ok" {
            println!("{:<44} {}: {}", r.case.name, r.status, r.message.as_deref().unwrap_or(""));
            continue;
        }
        println!(
            "{:<44} {:>10} {:>10} {:>10} {:>10} {:>9} {:>9} {:>9}  {}",
            r.case.name,
            f(r.median_ms, 4),
            f(r.min_ms, 4),
            f(r.max_ms, 4),
            f(r.eager_median_ms, 4),
            f(r.tflops, 1),
            f(r.gbps, 0),
            r.rel_error.map(|e| format!("{e:.1e}")).unwrap_or_else(|| "—".into()),
            r.kernel.as_deref().unwrap_or("")
        );
    }
}

pub fn read_report(path: &PathBuf) -> Result<Report> {
    let text = std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
    serde_json::from_str(&text).with_context(|| format!("parsing {} as a bench report", path.display()))
}

/// Prints the per-row change of `new` against `old`; false when a row slowed by more than
/// `threshold` percent or disappeared.
pub fn compare(old: &Report, new: &Report, threshold: f64) -> Result<bool> {
    if old.suite != new.suite {
        bail!("suites differ: {} vs {}", old.suite, new.suite);
    }
    let mut ok = true;
    let mut compared = 0;
    println!("{:<44} {:>10} {:>10} {:>8}", "case", "old_ms", "new_ms", "change");
    for o in old.results.iter().filter(|r| r.status == "ok") {
        let Some(n) = new.results.iter().find(|r| r.case.name == o.case.name) else { continue };
        compared += 1;
        let (Some(a), Some(b)) = (o.median_ms, n.median_ms) else {
            println!("{:<44} {:>10.4} {:>10} {:>8}  REGRESSION ({})", o.case.name, o.median_ms.unwrap_or(0.0), "—", "", n.status);
            ok = false;
            continue;
        };
        let change = (b / a - 1.0) * 100.0;
        let slow = change > threshold;
        ok &= !slow;
        println!("{:<44} {a:>10.4} {b:>10.4} {change:>+7.1}%{}", o.case.name, if slow { "  REGRESSION" } else { "" });
    }
    if compared == 0 {
        // Different --window or --softcap rename every row: nothing would be compared.
        bail!("no case of the old report is in the new one (the same suite with other --window/--softcap?)");
    }
    println!("{}", if ok { format!("no row slower by more than {threshold}%") } else { format!("rows slower by more than {threshold}%") });
    Ok(ok)
}

#[cfg(test)]
mod tests {
    use super::*;
    use flashcore::DType;

    fn report(ms: &[Option<f64>]) -> Report {
        let results = ms
            .iter()
            .enumerate()
            .map(|(i, &m)| {
                let mut r = unsupported(
                    &Case::new(1, 128 * (i + 1), 128, 1, 1, 64, false, DType::BF16),
                    if m.is_some() { "ok" } else { "error" },
                    String::new(),
                );
                r.median_ms = m;
                r
            })
            .collect();
        Report { schema: 1, system: "flashcore".into(), suite: "quick".into(), env: serde_json::json!({}), results }
    }

    #[test]
    fn compare_flags_rows_slower_than_the_threshold() {
        let old = report(&[Some(1.0), Some(2.0)]);
        assert!(compare(&old, &report(&[Some(1.04), Some(1.5)]), 5.0).unwrap());
        assert!(!compare(&old, &report(&[Some(1.06), Some(2.0)]), 5.0).unwrap());
        assert!(!compare(&old, &report(&[Some(1.0), None]), 5.0).unwrap(), "a row that stopped working fails");
        let mut renamed = report(&[Some(1.0), Some(2.0)]);
        renamed.results.iter_mut().for_each(|r| r.case.name += "_win128_0");
        assert!(compare(&old, &renamed, 5.0).is_err(), "no common row (other --window) is an error, not a pass");
    }

    #[test]
    fn rounds_pool_samples_and_keep_failures() {
        let round = |ms: [f64; 2], status: &str| {
            let mut r = report(&[Some(ms[0]), Some(ms[1])]).results;
            for (row, &m) in r.iter_mut().zip(&ms) {
                row.samples_ms = vec![m, m + 0.5];
                row.tflops = Some(100.0 / m);
            }
            r[1].status = status.into();
            r
        };
        let pooled = pool_rounds(vec![round([1.0, 2.0], "ok"), round([3.0, 4.0], "ok"), round([2.0, 5.0], "error")]);
        let first = &pooled[0];
        assert_eq!(first.samples_ms, vec![1.0, 1.5, 3.0, 3.5, 2.0, 2.5]);
        assert_eq!((first.median_ms, first.min_ms, first.max_ms), (Some(2.5), Some(1.0), Some(3.5)));
        assert_eq!(first.round_medians_ms, vec![1.0, 3.0, 2.0]);
        assert!((first.tflops.unwrap() - 40.0).abs() < 1e-9, "the rate follows the pooled median");
        assert_eq!(pooled[1].status, "error", "a row failed in one round is failed");
        assert_eq!(pool_rounds(vec![round([1.0, 2.0], "ok")])[0].median_ms, Some(1.0), "one round is left as is");
    }

    #[test]
    fn utc_dates() {
        assert_eq!(utc_date(0), "1970-01-01");
        assert_eq!(utc_date(1_795_305_600), "2026-11-22");
        assert_eq!(utc_date(951_782_400), "2000-02-29");
    }

    #[test]
    fn report_json_round_trips() {
        let r = report(&[Some(1.0)]);
        let back: Report = serde_json::from_str(&serde_json::to_string(&r).unwrap()).unwrap();
        assert_eq!(back.results[0].median_ms, Some(1.0));
    }
}
