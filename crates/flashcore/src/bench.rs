//! Device timing with CUDA events: warm-up, then samples of back-to-back launches, each
//! sample long enough that launch gaps and event resolution do not dominate.

use cudarc::driver::sys::{CUevent_flags, CUgraphInstantiate_flags, CUstreamCaptureMode};

use crate::context::Context;
use crate::error::{DriverContext, Result};

/// Timing of one launch, in milliseconds per launch.
#[derive(Debug, Clone, serde::Serialize)]
pub struct Timing {
    /// Every sample (each the mean of `launches_per_sample` back-to-back launches).
    pub samples_ms: Vec<f64>,
    /// Launches per sample.
    pub launches_per_sample: usize,
    /// Median sample.
    pub median_ms: f64,
    /// Fastest sample.
    pub min_ms: f64,
    /// Slowest sample.
    pub max_ms: f64,
}

/// How to time.
#[derive(Debug, Clone, Copy)]
pub struct TimingOptions {
    /// Untimed launches first (module load and clocks settle).
    pub warmup: usize,
    /// Samples to take (≥ 20 for reported numbers).
    pub samples: usize,
    /// Target duration of one sample, in ms: sets the launches per sample.
    pub sample_target_ms: f64,
    /// Capture each sample's launches in a CUDA graph and time its replays, which removes
    /// the host's launch cost from the measurement (as the anchors' timing does); `false`
    /// times launches issued one by one, what an eager caller sees.
    pub graph: bool,
    /// Launches run for at least this long (ms) after the warm-up and before the samples, so
    /// that the clock settles where the power cap holds it under this kernel's load: a row
    /// timed straight after a lighter one otherwise runs at the clock that one left (H100,
    /// fwd_sm90 prefill after fwd_sm80 rows: 10-15% fast, docs/kernels/fwd_sm90.md). 0: none.
    pub settle_ms: f64,
}

impl Default for TimingOptions {
    fn default() -> Self {
        Self { warmup: 10, samples: 30, sample_target_ms: 2.0, graph: false, settle_ms: 0.0 }
    }
}

/// Times `launch(i)`, which queues one run on `ctx`'s stream; `i` counts launches, so the
/// caller can rotate input sets (`i % n`) to keep the L2 cache honest.
pub fn time(ctx: &Context, opts: TimingOptions, mut launch: impl FnMut(usize) -> Result<()>) -> Result<Timing> {
    let stream = ctx.stream();
    let event = || ctx.cuda().new_event(Some(CUevent_flags::CU_EVENT_DEFAULT)).ctx("creating a timing event");
    let (start, end) = (event()?, event()?);
    let mut count = 0usize;
    let mut run = |n: usize| -> Result<f64> {
        start.record(stream).ctx("recording an event")?;
        for _ in 0..n {
            launch(count)?;
            count += 1;
        }
        end.record(stream).ctx("recording an event")?;
        end.synchronize().ctx("waiting for the timed launches")?;
        Ok(start.elapsed_ms(&end).ctx("reading an event")? as f64)
    };
    run(opts.warmup.max(1))?;
    let one = run(1)?.max(1e-4);
    let per_sample = ((opts.sample_target_ms / one).ceil() as usize).clamp(1, 1000);
    if opts.settle_ms > 0.0 {
        run(((opts.settle_ms / one).ceil() as usize).clamp(1, 100_000))?;
    }
    let mut samples_ms = Vec::with_capacity(opts.samples);
    if opts.graph {
        stream.begin_capture(CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_THREAD_LOCAL).ctx("starting a graph capture")?;
        let captured = (0..per_sample).try_for_each(&mut launch);
        let graph = stream.end_capture(CUgraphInstantiate_flags(0)).ctx("ending a graph capture");
        captured?;
        let graph =
            graph?.ok_or_else(|| crate::Error::Unsupported { kernel: "bench".into(), msg: "the graph capture recorded nothing".into() })?;
        graph.upload().ctx("uploading the graph")?;
        for i in 0..opts.samples.max(1) + 1 {
            start.record(stream).ctx("recording an event")?;
            graph.launch().ctx("launching the graph")?;
            end.record(stream).ctx("recording an event")?;
            end.synchronize().ctx("waiting for the graph")?;
            // The first replay warms the graph up.
            if i > 0 {
                samples_ms.push(start.elapsed_ms(&end).ctx("reading an event")? as f64 / per_sample as f64);
            }
        }
    } else {
        for _ in 0..opts.samples.max(1) {
            samples_ms.push(run(per_sample)? / per_sample as f64);
        }
    }
    let mut sorted = samples_ms.clone();
    sorted.sort_by(f64::total_cmp);
    Ok(Timing {
        median_ms: sorted[sorted.len() / 2],
        min_ms: sorted[0],
        max_ms: sorted[sorted.len() - 1],
        samples_ms,
        launches_per_sample: per_sample,
    })
}
