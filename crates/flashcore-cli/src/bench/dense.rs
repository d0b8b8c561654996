//! `flashcore bench`'s dense cases: `Context::attention_into` timed (CUDA-graph replays, or
//! eager launches), input sets rotated while one would stay in L2, then the last
//! `VERIFY_ROWS` query rows checked against the GPU reference kernel.

use anyhow::Result;
use flashcore::bench::{time, TimingOptions};
use flashcore::{AttnParams, Context, DType, DeviceTensor, Error, FwdInputs, FwdOutputs, KernelFamily, LearnableSinks, LseViewMut};

use crate::bench::options::{CaseOptions, VERIFY_ROWS};
use crate::bench::report::{timed_and_eager, unsupported, Row};
use crate::cases::{errors, normal, random_qkv, Case, Storage, Stored};

/// One dense case.
pub fn bench_case(ctx: &Context, case: &Case, family: Option<KernelFamily>, args: &CaseOptions) -> Result<Row> {
    let params = AttnParams { kernel: family, num_splits: args.splits, ..case.params() };
    let plan = match ctx.plan(&case.shape(), case.dtype, &params) {
        Ok(p) => p,
        Err(e @ (Error::HeadDim { .. } | Error::Unsupported { .. })) => return Ok(unsupported(case, "unsupported", e.to_string())),
        Err(e) => return Err(e.into()),
    };
    let shape = case.shape();
    // Rotate input sets while one set would stay resident in L2.
    let set_bytes = shape.min_bytes(case.dtype.size_bytes());
    let sets = ((4.0 * ctx.info().l2_bytes as f64 / set_bytes).ceil() as usize).clamp(1, 8);
    let mut inputs = Vec::new();
    let mut qvs = Vec::new(); // FlashAttention-3's qv, a set's (`Case::qv`)
    for s in 0..sets {
        let h = random_qkv(case, args.inputs, 1000 + s as u64);
        let up = |data: &[f32], sh| Stored::upload(ctx, data, sh, case.dtype, Storage::Bshd);
        inputs.push((up(&h.q, case.q_shape())?, up(&h.k, case.kv_shape())?, up(&h.v, case.v_shape())?));
        if case.qv {
            qvs.push(up(&normal(case.o_shape().iter().product(), 1.0, case.dtype, 2000 + s as u64), case.o_shape())?);
        }
    }
    let mut o = DeviceTensor::filled(ctx, 0x7fc0, case.o_shape(), case.dtype.output())?;
    let mut lse = ctx.stream().alloc_zeros::<f32>(case.batch * case.heads_q * case.seqlen_q)?;
    let sinks = case.sinks(ctx)?;
    let learnable_sink = sinks.as_ref().map(LearnableSinks::of);
    let timed = |graph: bool| {
        let opts = TimingOptions { samples: args.samples, graph, ..Default::default() };
        time(ctx, opts, |i| {
            let (q, k, v) = &inputs[i % sets];
            let qv = qvs.get(i % sets).map(Stored::view);
            ctx.attention_into(
                &FwdInputs { learnable_sink, qv, ..FwdInputs::dense(q.view(), k.view(), v.view()) },
                FwdOutputs { o: o.view_mut(), lse: Some(LseViewMut::of(&mut lse)), probs: None },
                &params,
            )
        })
    };
    let (timing, eager) = match timed_and_eager(case, !args.eager, timed) {
        Ok(t) => t,
        Err(row) => return Ok(*row),
    };
    // V's own head dim and e4m3 inputs have no GPU reference kernel: `check --value-dim` and
    // `check --fp8` are their correctness.
    let verifiable = !args.no_verify && case.head_dim_v.is_none() && case.dtype != DType::E4M3;
    let rel_error = if verifiable { Some(verify(ctx, case, &inputs[0], learnable_sink, &params)?) } else { None };
    let secs = timing.median_ms * 1e-3;
    let decode = case.seqlen_q == 1;
    Ok(Row {
        case: case.clone(),
        kernel: Some(plan.describe()),
        status: "ok".into(),
        message: None,
        median_ms: Some(timing.median_ms),
        min_ms: Some(timing.min_ms),
        max_ms: Some(timing.max_ms),
        samples_ms: timing.samples_ms,
        tflops: Some(case.flops() / secs * 1e-12),
        gbps: decode.then(|| case.kv_bytes() / secs * 1e-9),
        rel_error,
        timing: Some(if args.eager { "eager" } else { "graph" }.into()),
        eager_median_ms: Some(eager.median_ms),
        fwd_bwd_median_ms: None,
        round_medians_ms: vec![],
    })
}

/// Relative error of the last `VERIFY_ROWS` query rows against the GPU reference kernel (with
/// the case's sinks, when it has them).
fn verify(
    ctx: &Context,
    case: &Case,
    (q, k, v): &(Stored, Stored, Stored),
    learnable_sink: Option<LearnableSinks>,
    params: &AttnParams,
) -> Result<f64> {
    let rows = case.seqlen_q.min(VERIFY_ROWS);
    let start = case.seqlen_q - rows;
    let mut o = DeviceTensor::filled(ctx, 0x7fc0, case.q_shape(), case.dtype)?;
    let inputs = FwdInputs { learnable_sink, ..FwdInputs::dense(q.view(), k.view(), v.view()) };
    ctx.attention_into(&inputs, FwdOutputs { o: o.view_mut(), lse: None, probs: None }, params)?;
    let sliced_shape = [case.batch, rows, case.heads_q, case.head_dim];
    let mut o_ref = DeviceTensor::filled(ctx, 0x7fc0, sliced_shape, case.dtype)?;
    let q_rows = q.view().narrow_seq(start, rows).expect("rows are in range");
    let ref_params = AttnParams { kernel: Some(KernelFamily::Reference), ..*params };
    ctx.attention_into(
        &FwdInputs { learnable_sink, ..FwdInputs::dense(q_rows, k.view(), v.view()) },
        FwdOutputs { o: o_ref.view_mut(), lse: None, probs: None },
        &ref_params,
    )?;
    let got = o.to_f32(ctx)?;
    let want: Vec<f64> = o_ref.to_f32(ctx)?.into_iter().map(f64::from).collect();
    let row_len = case.heads_q * case.head_dim;
    let mut picked = Vec::with_capacity(want.len());
    for b in 0..case.batch {
        let base = (b * case.seqlen_q + start) * row_len;
        picked.extend_from_slice(&got[base..base + rows * row_len]);
    }
    Ok(errors(&picked, &want).0)
}
