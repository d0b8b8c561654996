//! `flashcore bench --suite bwd`: the backward alone, and forward + backward, timed as the
//! forward is (CUDA events, warm-up, median of the samples, input sets rotated while they fit
//! in L2). FLOPs: the backward counts 2.5x the forward's, forward + backward 3.5x
//! (FlashAttention's convention), the forward's on the visible pairs (a window, `--window`,
//! counts its own); `tflops` is the backward's. `--window` and `--softcap` reach both passes;
//! a case's learnable sinks (the `bwd-sinks` suite) too, the backward computing their gradient.

use anyhow::Result;
use flashcore::bench::{time, TimingOptions};
use flashcore::{
    AttnOutput, AttnParams, BwdInputs, Context, DeviceTensor, Error, FwdInputs, FwdOutputs, GradsMut, KernelFamily, KvLayout,
    LearnableSinks, LseView, LseViewMut, SinkGradMut,
};

use crate::bench::report::{unsupported, Row};
use crate::cases::{normal, random_qkv, Case, Inputs, Storage, Stored};

/// The backward's FLOPs over the forward's.
pub const BWD_FLOP_FACTOR: f64 = 2.5;

/// One input set: q, k, v, dout, and the forward's o and lse for them.
struct Set {
    q: Stored,
    k: Stored,
    v: Stored,
    dout: Stored,
    fwd: AttnOutput,
}

/// One case; `kernel` names the backward's family (default: the backward's own choice), the
/// forward that makes o and lse (and that forward + backward times) takes its default.
pub fn bench_case(
    ctx: &Context,
    case: &Case,
    samples: usize,
    eager_only: bool,
    inputs: Inputs,
    deterministic: bool,
    kernel: Option<KernelFamily>,
) -> Result<Row> {
    let params = AttnParams { deterministic, kernel: kernel.filter(|f| f.is_backward()), ..case.params() };
    let fwd_params = AttnParams { kernel: None, ..params };
    let kernel = match ctx.backward_variant(&case.shape(), case.dtype, &params) {
        Ok(v) if deterministic => format!("{} deterministic", v.name()),
        Ok(v) => v.name(),
        Err(e) => return Ok(unsupported(case, "unsupported", e.to_string())),
    };
    let shape = case.shape();
    let set_bytes = 2.0 * shape.min_bytes(case.dtype.size_bytes()); // q, k, v, o and dout
    let n_sets = ((4.0 * ctx.info().l2_bytes as f64 / set_bytes).ceil() as usize).clamp(1, 8);
    let sinks = case.sinks(ctx)?;
    let learnable_sink = sinks.as_ref().map(LearnableSinks::of);
    let mut dsink = ctx.stream().alloc_zeros::<f32>(if case.learnable_sink { case.heads_q } else { 0 })?;
    let mut sets = Vec::new();
    for s in 0..n_sets {
        let seed = 2000 + s as u64;
        let h = random_qkv(case, inputs, seed);
        let up = |data: &[f32], sh| Stored::upload(ctx, data, sh, case.dtype, Storage::Bshd);
        let (q, k, v) = (up(&h.q, case.q_shape())?, up(&h.k, case.kv_shape())?, up(&h.v, case.v_shape())?);
        let dout = up(&normal(case.o_shape().iter().product(), 1.0, case.dtype, seed ^ 0xd0), case.o_shape())?;
        let fwd = ctx.attention(&FwdInputs { learnable_sink, ..FwdInputs::dense(q.view(), k.view(), v.view()) }, &fwd_params)?;
        sets.push(Set { q, k, v, dout, fwd });
    }
    let mut dq = DeviceTensor::filled(ctx, 0, case.q_shape(), case.dtype)?;
    let mut dk = DeviceTensor::filled(ctx, 0, case.kv_shape(), case.dtype)?;
    let mut dv = DeviceTensor::filled(ctx, 0, case.v_shape(), case.dtype)?;
    let mut o = DeviceTensor::filled(ctx, 0, case.o_shape(), case.dtype)?;
    let mut lse = ctx.stream().alloc_zeros::<f32>(case.batch * case.heads_q * case.seqlen_q)?;
    let opts = |graph| TimingOptions { samples, graph, ..Default::default() };
    // The backward's inputs and gradients, the sinks' with them when the case has sinks.
    let backward_of = |inputs: BwdInputs<'_>, grads: GradsMut<'_>, dsink: &mut cudarc::driver::CudaSlice<f32>| match learnable_sink {
        Some(sinks) => ctx.attention_backward_into(&inputs.with_learnable_sink(sinks), grads.with_dsink(SinkGradMut::of(dsink)), &params),
        None => ctx.attention_backward_into(&inputs, grads, &params),
    };

    let mut backward = |graph: bool| {
        time(ctx, opts(graph), |i| {
            let s = &sets[i % n_sets];
            let inputs =
                BwdInputs::new(s.q.view(), s.k.view(), s.v.view(), s.fwd.o.view(), LseView::of(&s.fwd.lse), s.dout.view(), KvLayout::Dense);
            backward_of(inputs, GradsMut::new(dq.view_mut(), dk.view_mut(), dv.view_mut()), &mut dsink)
        })
    };
    let timings = backward(!eager_only).and_then(|t| Ok((t, backward(false)?)));
    let (timing, eager) = match timings {
        Ok(t) => t,
        Err(e @ (Error::Unsupported { .. } | Error::HeadDim { .. })) => return Ok(unsupported(case, "unsupported", e.to_string())),
        Err(e) => return Ok(unsupported(case, "error", e.to_string())),
    };
    let fwd_bwd = time(ctx, opts(!eager_only), |i| {
        let s = &sets[i % n_sets];
        ctx.attention_into(
            &FwdInputs { learnable_sink, ..FwdInputs::dense(s.q.view(), s.k.view(), s.v.view()) },
            FwdOutputs { o: o.view_mut(), lse: Some(LseViewMut::of(&mut lse)), probs: None },
            &fwd_params,
        )?;
        let (o, lse) = (o.view(), LseView::of(&lse));
        let inputs = BwdInputs::new(s.q.view(), s.k.view(), s.v.view(), o, lse, s.dout.view(), KvLayout::Dense);
        backward_of(inputs, GradsMut::new(dq.view_mut(), dk.view_mut(), dv.view_mut()), &mut dsink)
    })?;
    let flops = case.flops();
    let tflops = |ms: f64, factor: f64| factor * flops / (ms * 1e-3) * 1e-12;
    Ok(Row {
        case: case.clone(),
        kernel: Some(kernel),
        status: "ok".into(),
        message: Some(format!(
            "forward + backward {:.4} ms, {:.1} TFLOPS at {}x the forward's FLOPs",
            fwd_bwd.median_ms,
            tflops(fwd_bwd.median_ms, 1.0 + BWD_FLOP_FACTOR),
            1.0 + BWD_FLOP_FACTOR
        )),
        median_ms: Some(timing.median_ms),
        min_ms: Some(timing.min_ms),
        max_ms: Some(timing.max_ms),
        samples_ms: timing.samples_ms,
        tflops: Some(tflops(timing.median_ms, BWD_FLOP_FACTOR)),
        gbps: None,
        rel_error: None,
        timing: Some(if eager_only { "eager" } else { "graph" }.into()),
        eager_median_ms: Some(eager.median_ms),
        fwd_bwd_median_ms: Some(fwd_bwd.median_ms),
        round_medians_ms: vec![],
    })
}
