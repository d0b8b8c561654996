//! `flashcore bench --suite paged`: decode over a paged KV cache against the contiguous
//! decode of the same shape in the same run (GB/s of K and V), at page sizes 16 and 64 with
//! shuffled page tables, and with one new key appended per sequence (the pre-pass) against
//! the same cache without; the run's HBM ceiling, a device-to-device copy of as many bytes;
//! and chunked prefill (a chunk of queries over a cache that ends with it, bottom-right
//! causal) against the dense attention of the same shape (TFLOPS).

use anyhow::Result;
use cudarc::driver::DevicePtr;
use flashcore::bench::{time, Timing, TimingOptions};
use flashcore::dispatch::KeyLayout;
use flashcore::{
    AttnParams, BlockTableView, Context, DeviceTensor, FwdInputs, FwdOutputs, KernelFamily, Layout, LseViewMut, PagedKv, SeqLensView,
    TensorView,
};
use rand::seq::SliceRandom;
use rand::SeedableRng;

use crate::bench::report::{unsupported, Row};
use crate::cases::Case;

/// Page sizes timed, and whether the table is shuffled (ordered: page `i` of sequence `b` is
/// pool page `b * pages + i`, the contiguous cache's own layout, which isolates the kernel's
/// cost from the scattered pages').
const PAGES: [(usize, bool); 4] = [(16, true), (64, true), (256, true), (16, false)];

/// Each row's samples are taken in this many rounds, the rows alternating within a round, so
/// that a drift of the GPU's clock over the case shows in every row alike, not in the ratios.
const ROUNDS: usize = 3;

/// What a row times.
enum Run {
    /// The HBM ceiling of this run: a device-to-device copy of K, whose bytes read and
    /// written are the bytes of K and V that the decode reads.
    Copy,
    /// Our contiguous decode.
    Dense,
    /// The same keys in a paged cache: page size, a shuffled table, one key appended.
    Paged { page: usize, shuffled: bool, append: bool },
}

/// Rows for one decode `case` (`Sq = 1`): `hbm-copy` (the ceiling), `dense` (our contiguous
/// decode), then per page size `paged{P}` and `paged{P}+append` (S - 1 cached keys and one
/// appended: the same keys read), and `paged16-ordered` (an unshuffled table).
/// K and V hold one value everywhere (the speed of these memory-bound kernels does not depend
/// on it; `check` covers correctness); one buffer serves every layout.
pub fn rows(ctx: &Context, case: &Case, samples: usize) -> Result<Vec<Row>> {
    if case.seqlen_q > 1 {
        return prefill_rows(ctx, case, samples);
    }
    let (b, s, hkv, d, dtype) = (case.batch, case.seqlen_k, case.heads_kv, case.head_dim, case.dtype);
    let one = dtype.encode(0.05);
    let q = DeviceTensor::filled(ctx, one, case.q_shape(), dtype)?;
    let k = DeviceTensor::filled(ctx, one, case.kv_shape(), dtype)?;
    let v = DeviceTensor::filled(ctx, one, case.kv_shape(), dtype)?;
    let new = DeviceTensor::filled(ctx, one, [b, 1, hkv, d], dtype)?;
    let mut o = DeviceTensor::filled(ctx, 0, case.q_shape(), dtype)?;
    let mut lse = ctx.stream().alloc_zeros::<f32>(b * case.heads_q)?;
    let params = AttnParams::default();
    let opts = TimingOptions { samples: samples.div_ceil(ROUNDS), graph: true, ..Default::default() };
    let bytes = case.shape().kv_bytes(dtype.size_bytes());
    let elems = b * s * hkv * d;
    let copy_dst = ctx.stream().alloc_zeros::<u16>(elems)?;
    let (dst, src, stream) = (copy_dst.device_ptr(ctx.stream()).0, k.view().ptr(), ctx.stream().cu_stream());
    let full = ctx.stream().clone_htod(&vec![s as i32; b])?;
    let short = ctx.stream().clone_htod(&vec![s as i32 - 1; b])?;
    let mut out = Vec::new();
    let mut runs = vec![Run::Copy, Run::Dense];
    let mut tables = Vec::new();
    for (page, shuffled) in PAGES {
        if s % page != 0 {
            out.push(unsupported(case, "unsupported", format!("S {s} is not a multiple of page size {page}")));
            continue;
        }
        let mut ids: Vec<i32> = (0..(b * s / page) as i32).collect();
        if shuffled {
            ids.shuffle(&mut rand::rngs::StdRng::seed_from_u64(page as u64));
        }
        tables.push((page, shuffled, ctx.stream().clone_htod(&ids)?));
        runs.extend([false, true].into_iter().filter(|&a| shuffled || !a).map(|append| Run::Paged { page, shuffled, append }));
    }
    let time_run = |run: &Run| -> Result<Timing> {
        Ok(match *run {
            Run::Copy => time(ctx, opts, |_| {
                // SAFETY: both buffers hold `elems` elements and outlive the timing.
                unsafe { cudarc::driver::result::memcpy_dtod_async(dst, src, elems * dtype.size_bytes(), stream) }
                    .map_err(|source| flashcore::Error::Driver { context: "copying K (the HBM ceiling)".into(), source })
            })?,
            Run::Dense => time(ctx, opts, |_| {
                ctx.attention_into(
                    &FwdInputs::dense(q.view(), k.view(), v.view()),
                    FwdOutputs { o: o.view_mut(), lse: Some(LseViewMut::of(&mut lse)), probs: None },
                    &params,
                )
            })?,
            Run::Paged { page, shuffled, append } => {
                let table = &tables.iter().find(|t| (t.0, t.1) == (page, shuffled)).expect("a table per page size").2;
                let pages = b * s / page;
                // SAFETY: the pools are k's and v's buffers (b * s * hkv * d elements) seen as pages.
                let pool =
                    |t: &DeviceTensor| unsafe { TensorView::from_raw(t.view().ptr(), Layout::contiguous([pages, page, hkv, d], dtype), 0) };
                let kv = PagedKv {
                    block_table: Some(BlockTableView::of(table, b, s / page)?),
                    cache_seqlens: Some(SeqLensView::of(if append { &short } else { &full })),
                    k_new: append.then(|| new.view()),
                    v_new: append.then(|| new.view()),
                    queries: None,
                };
                time(ctx, opts, |_| {
                    ctx.attention_into(
                        &FwdInputs::paged(q.view(), pool(&k), pool(&v), kv),
                        FwdOutputs { o: o.view_mut(), lse: Some(LseViewMut::of(&mut lse)), probs: None },
                        &params,
                    )
                })?
            }
        })
    };
    let timings = in_rounds(&runs, time_run)?;
    let plan = ctx.plan(&case.shape(), dtype, &params)?.describe();
    for (run, taken) in runs.iter().zip(timings) {
        let (name, kernel) = match *run {
            Run::Copy => ("hbm-copy".to_string(), "cuMemcpyDtoDAsync of K: read + write = the bytes of K + V".to_string()),
            Run::Dense => ("dense".to_string(), plan.clone()),
            Run::Paged { page, shuffled, append } => (
                format!("paged{page}{}{}", if shuffled { "" } else { "-ordered" }, if append { "+append" } else { "" }),
                paged_plan(ctx, case, &params, page)?,
            ),
        };
        out.push(pooled_row(case, &name, kernel, taken, Rate::Gbps(bytes)));
    }
    Ok(out)
}

/// What a paged row of `case` runs: the plan of a cache of `page`-key pages (the paged form the
/// page size picks: fwd_sm80's ring depth, fwd_sm90's page-box spread).
fn paged_plan(ctx: &Context, case: &Case, params: &AttnParams, page: usize) -> Result<String> {
    let layout = KeyLayout::Paged { page_size: page, packed_queries: false };
    Ok(flashcore::dispatch::plan_for(&ctx.info().device(), &case.shape(), case.dtype, params, layout, Default::default())?.describe())
}

/// The chunked-prefill rows after the dense anchor: page size (shuffled tables), whether the
/// chunk's keys are appended first, and a forced kernel family (None: the dispatcher's).
const PREFILL_ROWS: [(usize, bool, Option<KernelFamily>); 6] = [
    (16, false, None),
    (64, false, None),
    (256, false, None),
    (64, true, None),
    (16, false, Some(KernelFamily::FwdSm80)),
    (64, false, Some(KernelFamily::FwdSm80)),
];

/// How long each prefill row runs before its samples in each round (TimingOptions::settle_ms),
/// twenty times a round's ~15 ms of samples. Without it the dense anchor, timed after the
/// forced fwd_sm80 rows (half the power), ran at the clock they left and read 10-15% fast
/// against the paged rows (H100, ninth session: paged / dense 0.84-0.91; settled, 0.93-1.05,
/// as ncu and PyTorch at the cap's clock read it: 0.97-0.98; docs/kernels/fwd_sm80.md).
const PREFILL_SETTLE_MS: f64 = 300.0;

/// Rows for one chunked-prefill `case` (`Sq` queries, the last `Sq` of `Sk` keys, causal
/// bottom-right): `dense` (the same shape from contiguous tensors: the anchor), then
/// `paged{P}` (the whole cache already written: `cache_seqlens = Sk`), `paged64+append` (the
/// chunk's keys appended by the pre-pass first: `cache_seqlens = Sk - Sq`) and
/// `paged{P}-fwd_sm80` (the Ampere-class kernel's paged form, forced, for comparison). The
/// rows alternate in ROUNDS rounds, as the decode rows do: timed one after the other, a row's
/// ratio to the anchor moved with the clock under the power cap, by what ran before it.
/// Random inputs; one buffer serves every layout.
fn prefill_rows(ctx: &Context, case: &Case, samples: usize) -> Result<Vec<Row>> {
    let (b, sq, s, hkv, d, dtype) = (case.batch, case.seqlen_q, case.seqlen_k, case.heads_kv, case.head_dim, case.dtype);
    let q = DeviceTensor::from_f32(ctx, &crate::cases::normal(b * sq * case.heads_q * d, 1.0, dtype, 1), case.q_shape(), dtype)?;
    let k = DeviceTensor::from_f32(ctx, &crate::cases::normal(b * s * hkv * d, 1.0, dtype, 2), case.kv_shape(), dtype)?;
    let v = DeviceTensor::from_f32(ctx, &crate::cases::normal(b * s * hkv * d, 1.0, dtype, 3), case.kv_shape(), dtype)?;
    let new = DeviceTensor::from_f32(ctx, &crate::cases::normal(b * sq * hkv * d, 1.0, dtype, 4), [b, sq, hkv, d], dtype)?;
    let mut o = DeviceTensor::filled(ctx, 0, case.q_shape(), dtype)?;
    let mut lse = ctx.stream().alloc_zeros::<f32>(b * case.heads_q * sq)?;
    let params = AttnParams { causal: case.causal, ..AttnParams::default() };
    let opts = TimingOptions { samples: samples.div_ceil(ROUNDS), graph: true, settle_ms: PREFILL_SETTLE_MS, ..Default::default() };
    let full = ctx.stream().clone_htod(&vec![s as i32; b])?;
    let before = ctx.stream().clone_htod(&vec![(s - sq) as i32; b])?;
    let mut out = Vec::new();
    // None: the dense anchor; Some((page, append, family, table)): a paged row.
    let mut runs = vec![None];
    for (page, append, family) in PREFILL_ROWS {
        if s % page != 0 {
            out.push(unsupported(case, "unsupported", format!("S {s} is not a multiple of page size {page}")));
            continue;
        }
        let mut ids: Vec<i32> = (0..(b * s / page) as i32).collect();
        ids.shuffle(&mut rand::rngs::StdRng::seed_from_u64(page as u64));
        runs.push(Some((page, append, family, ctx.stream().clone_htod(&ids)?)));
    }
    let time_run = |run: &Option<(usize, bool, Option<KernelFamily>, cudarc::driver::CudaSlice<i32>)>| -> Result<Timing> {
        let Some((page, append, family, table)) = run else {
            return Ok(time(ctx, opts, |_| {
                ctx.attention_into(
                    &FwdInputs::dense(q.view(), k.view(), v.view()),
                    FwdOutputs { o: o.view_mut(), lse: Some(LseViewMut::of(&mut lse)), probs: None },
                    &params,
                )
            })?);
        };
        let pages = b * s / page;
        // SAFETY: the pools are k's and v's buffers (b * s * hkv * d elements) seen as pages.
        let pool = |t: &DeviceTensor| unsafe { TensorView::from_raw(t.view().ptr(), Layout::contiguous([pages, *page, hkv, d], dtype), 0) };
        let kv = PagedKv {
            block_table: Some(BlockTableView::of(table, b, s / page)?),
            cache_seqlens: Some(SeqLensView::of(if *append { &before } else { &full })),
            k_new: append.then(|| new.view()),
            v_new: append.then(|| new.view()),
            queries: None,
        };
        let params = AttnParams { kernel: *family, ..params };
        Ok(time(ctx, opts, |_| {
            ctx.attention_into(
                &FwdInputs::paged(q.view(), pool(&k), pool(&v), kv),
                FwdOutputs { o: o.view_mut(), lse: Some(LseViewMut::of(&mut lse)), probs: None },
                &params,
            )
        })?)
    };
    let timings = in_rounds(&runs, time_run)?;
    let flops = case.flops();
    for (run, taken) in runs.iter().zip(timings) {
        let (name, kernel) = match run {
            None => ("dense".to_string(), ctx.plan(&case.shape(), dtype, &params)?.describe()),
            Some((page, append, family, _)) => {
                let suffix = match (append, family) {
                    (true, _) => "+append".to_string(),
                    (false, Some(f)) => format!("-{f}"),
                    (false, None) => String::new(),
                };
                let params = AttnParams { kernel: *family, ..params };
                (format!("paged{page}{suffix}"), paged_plan(ctx, case, &params, *page)?)
            }
        };
        out.push(pooled_row(case, &name, kernel, taken, Rate::Tflops(flops)));
    }
    Ok(out)
}

/// Times every run ROUNDS times, the runs alternating within a round: each run's timings in
/// round order.
fn in_rounds<R>(runs: &[R], mut time_run: impl FnMut(&R) -> Result<Timing>) -> Result<Vec<Vec<Timing>>> {
    let mut timings: Vec<Vec<Timing>> = runs.iter().map(|_| Vec::new()).collect();
    for _ in 0..ROUNDS {
        for (run, taken) in runs.iter().zip(&mut timings) {
            taken.push(time_run(run)?);
        }
    }
    Ok(timings)
}

/// What a row's rate counts: FLOPs (TFLOPS) or bytes (GB/s) a launch.
enum Rate {
    Tflops(f64),
    Gbps(f64),
}

/// The row `{case}_{name}` of one run's rounds: their samples pooled (median, min, max over
/// all), each round's median kept.
fn pooled_row(case: &Case, name: &str, kernel: String, rounds: Vec<Timing>, rate: Rate) -> Row {
    let round_medians_ms = rounds.iter().map(|t| t.median_ms).collect();
    let samples_ms: Vec<f64> = rounds.into_iter().flat_map(|t| t.samples_ms).collect();
    let mut sorted = samples_ms.clone();
    sorted.sort_by(f64::total_cmp);
    let median = sorted[sorted.len() / 2];
    let (tflops, gbps) = match rate {
        Rate::Tflops(flops) => (Some(flops / (median * 1e-3) * 1e-12), None),
        Rate::Gbps(bytes) => (None, Some(bytes / (median * 1e-3) * 1e-9)),
    };
    Row {
        case: Case { name: format!("{}_{name}", case.name), ..case.clone() },
        kernel: Some(kernel),
        status: "ok".into(),
        message: None,
        median_ms: Some(median),
        min_ms: Some(sorted[0]),
        max_ms: Some(sorted[sorted.len() - 1]),
        samples_ms,
        tflops,
        gbps,
        rel_error: None,
        timing: Some("graph".into()),
        eager_median_ms: None,
        fwd_bwd_median_ms: None,
        round_medians_ms,
    }
}
