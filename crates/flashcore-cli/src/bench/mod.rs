//! `flashcore bench`: device time of a suite, as a table and JSON (schema 1, shared with
//! `bench/anchors.py`), and the regression guard `--compare`.
//!
//! This file reads the options and sends each case to its kind (`dense`, `varlen`, `bwd`,
//! `paged`); those share `report.rs` (rows, tables, JSON, `--compare`) and `options.rs` (what
//! a dense or packed case takes from the command line), never this file.

mod bwd;
mod dense;
mod options;
mod paged;
mod report;
mod varlen;

use std::path::PathBuf;

use anyhow::{anyhow, Context as _, Result};
use flashcore::{AttnParams, Context, KernelFamily};
use indicatif::{ProgressBar, ProgressStyle};

use crate::attn::args::parse_window;
use crate::bench::options::CaseOptions;
use crate::bench::report::{compare, env, pool_rounds, print_table, read_report, Report, Row};
use crate::cases::{Case, Inputs};
use crate::suites;

#[derive(clap::Args)]
pub struct BenchArgs {
    /// Suite to run: quick, seed, sweep, small, dims; bwd (the sweep's cases, backward alone
    /// and forward + backward), bwd-dims (the same for the dims suite's cases); varlen
    /// (packed batches of mixed lengths, each beside the dense batch
    /// of the same tokens, and a decode batch with seqused_k); paged (decode over a paged KV
    /// cache beside the contiguous decode and the HBM copy ceiling, rows timed in alternating
    /// rounds); chunked, bwd-chunked (chunked attention at 32k and 128k tokens, chunks of 8k,
    /// each beside causal attention of the same shape and the same tokens as a batch of 8k-long
    /// causal sequences); sinks, bwd-sinks (learnable sinks on
    /// gpt-oss's attention, each beside the same call without them); value-dim (V's own head
    /// dim on DeepSeek-V3's prefill, 192 / 128, beside V at 192); value-dim-fa3
    /// (FlashAttention-3's 64 / 256 with and without qv, beside D256); fp8 (the e4m3 forward
    /// beside bf16 at 16k tokens, D64-D256, S 2k-16k).
    #[arg(long, default_value = "quick")]
    suite: String,
    /// Sliding window `LEFT,RIGHT` on every case (keys around each query's bottom-right
    /// diagonal, -1 unbounded; flash_attn's window_size). TFLOPS count the visible pairs, so
    /// a windowed row compares with a causal one per pair. Names gain `_win{L}_{R}`.
    #[arg(long, allow_hyphen_values = true)]
    window: Option<String>,
    /// Logit softcap on every case: scores become softcap·tanh(score/softcap). Names gain
    /// `_cap{X}`.
    #[arg(long)]
    softcap: Option<f32>,
    /// Chunked attention of this many keys on every case (FA3's attention_chunk: query i sees
    /// key j only within the chunk of its diagonal). TFLOPS count the visible pairs. Names gain
    /// `_chunk{N}`. A chunk as long as the keys times the chunked form on the plain mask.
    #[arg(long)]
    attention_chunk: Option<usize>,
    /// Only the cases whose name contains any of these substrings (comma-separated), e.g.
    /// `sk16384,d256_causal`.
    #[arg(long, value_delimiter = ',')]
    filter: Vec<String>,
    /// Print the suite's cases as JSON and exit (no GPU needed).
    #[arg(long)]
    list_json: bool,
    /// Write results to this JSON file.
    #[arg(long)]
    json: Option<PathBuf>,
    /// Force a kernel family (default: the fastest for the device).
    #[arg(long)]
    kernel: Option<String>,
    /// Split-KV: CTAs per query tile's keys (fwd_sm80; default: picked per case, 1 = never).
    #[arg(long)]
    splits: Option<usize>,
    /// Timed samples per case.
    #[arg(long, default_value_t = 30)]
    samples: usize,
    /// Run the whole case list this many times, round-robin, and pool each case's samples
    /// (median of all). Neighbouring rows (a packed batch and its dense partner, a paged
    /// decode and the contiguous one) are then timed interleaved, so a clock step between
    /// rounds moves both alike instead of biasing their ratio.
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..=50))]
    rounds: u32,
    /// Time launches issued one by one instead of CUDA-graph replays (the eager median is
    /// recorded either way).
    #[arg(long)]
    eager: bool,
    /// How q, k and v are drawn. The others than `normal` move a row's running max far and
    /// often, which takes fwd_sm90's softmax fallbacks: their speed, not the usual case's.
    #[arg(long, value_enum, default_value_t = Inputs::Normal)]
    inputs: Inputs,
    /// Suite bwd: the backward in deterministic mode (bitwise reproducible dq).
    #[arg(long)]
    deterministic: bool,
    /// Skip the accuracy check against the GPU reference.
    #[arg(long)]
    no_verify: bool,
    /// Compare with an earlier JSON; non-zero exit when a row is slower than the threshold.
    #[arg(long)]
    compare: Option<PathBuf>,
    /// With --compare: the newer results to compare, instead of running the suite now.
    #[arg(long, requires = "compare")]
    current: Option<PathBuf>,
    /// With --compare: the slowdown (in percent) that fails a row.
    #[arg(long, default_value_t = 5.0)]
    threshold: f64,
}

pub fn run(args: &BenchArgs) -> Result<bool> {
    if let (Some(old), Some(new)) = (&args.compare, &args.current) {
        return compare(&read_report(old)?, &read_report(new)?, args.threshold);
    }
    let suite_name = match &args.compare {
        Some(old) => read_report(old)?.suite,
        None => args.suite.clone(),
    };
    let mut cases =
        suites::suite(&suite_name).ok_or_else(|| anyhow!("unknown suite {suite_name:?}; known: {}", suites::NAMES.join(", ")))?;
    let mods = AttnParams { window: parse_window(args.window.as_deref())?, softcap: args.softcap.unwrap_or(0.0), ..Default::default() };
    mods.check_window_and_softcap()?;
    if args.attention_chunk == Some(0) {
        return Err(anyhow!("--attention-chunk must be > 0 (leave it out for no chunks)"));
    }
    cases = cases
        .into_iter()
        .map(|c| {
            let c = c.with_mods(mods.window, mods.softcap);
            match args.attention_chunk {
                Some(chunk) if c.attention_chunk.is_none() => c.with_chunk(chunk),
                _ => c,
            }
            .with_counts()
        })
        .collect();
    if !args.filter.is_empty() {
        cases.retain(|c| args.filter.iter().any(|f| c.name.contains(f.as_str())));
        if cases.is_empty() {
            return Err(anyhow!("no case of suite {suite_name:?} matches --filter {}", args.filter.join(",")));
        }
    }
    if args.list_json {
        println!("{}", serde_json::to_string_pretty(&serde_json::json!({ "suite": suite_name, "cases": cases }))?);
        return Ok(true);
    }
    let family = match &args.kernel {
        Some(name) => Some(KernelFamily::parse(name).ok_or_else(|| anyhow!("unknown kernel {name:?}"))?),
        None => None,
    };
    let ctx = Context::new(0)?;
    let bar = ProgressBar::new(cases.len() as u64 * u64::from(args.rounds))
        .with_style(ProgressStyle::with_template("{bar:40} {pos}/{len} {msg}").unwrap());
    let mut rounds = Vec::new();
    for _ in 0..args.rounds {
        rounds.push(run_round(&ctx, &cases, &suite_name, family, args, &bar)?);
    }
    let rows = pool_rounds(rounds);
    bar.finish_and_clear();
    let mut env = env(&ctx);
    env["inputs"] = serde_json::to_value(format!("{:?}", args.inputs))?;
    let report = Report { schema: 1, system: "flashcore".into(), suite: suite_name, env, results: rows };
    print_table(&report);
    if let Some(path) = &args.json {
        std::fs::write(path, serde_json::to_string_pretty(&report)?).with_context(|| format!("writing {}", path.display()))?;
        println!("wrote {}", path.display());
    }
    match &args.compare {
        Some(old) => compare(&read_report(old)?, &report, args.threshold),
        None => Ok(report.results.iter().all(|r| r.status != "error")),
    }
}

/// One pass over the cases: a row per case (the paged suite: several per case).
fn run_round(
    ctx: &Context,
    cases: &[Case],
    suite_name: &str,
    family: Option<KernelFamily>,
    args: &BenchArgs,
    bar: &ProgressBar,
) -> Result<Vec<Row>> {
    let options =
        CaseOptions { splits: args.splits, samples: args.samples, eager: args.eager, inputs: args.inputs, no_verify: args.no_verify };
    let mut rows = Vec::new();
    for case in cases {
        bar.set_message(case.name.clone());
        if suite_name == "paged" {
            rows.extend(paged::rows(ctx, case, args.samples)?);
        } else if suites::is_backward(suite_name) {
            rows.push(bwd::bench_case(ctx, case, args.samples, args.eager, args.inputs, args.deterministic, family)?);
        } else if case.packed.is_some() {
            rows.push(varlen::bench_case(ctx, case, family, &options)?);
        } else {
            rows.push(dense::bench_case(ctx, case, family, &options)?);
        }
        bar.inc(1);
    }
    Ok(rows)
}
