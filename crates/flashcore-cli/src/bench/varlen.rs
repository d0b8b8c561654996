//! `flashcore bench`'s packed (varlen) cases: `Context::attention` over a packed batch (`FwdInputs::varlen`) timed as the dense
//! cases are (NaN-poisoned output, fresh random input sets rotated while they fit in L2,
//! warm-up, median of the samples), FLOPs counted per sequence on its visible pairs.

use anyhow::Result;
use cudarc::driver::CudaSlice;
use flashcore::bench::{time, TimingOptions};
use flashcore::dispatch::KeyLayout;
use flashcore::{AttnParams, Context, DeviceTensor, Error, FwdInputs, FwdOutputs, KernelFamily, LseViewMut, SeqLensView, VarlenBatch};

use crate::bench::options::{CaseOptions, VERIFY_ROWS};
use crate::bench::report::{timed_and_eager, unsupported, Row};
use crate::cases::{errors, random_qkv, Case, Packed, Storage, Stored};

/// A packed batch's cu_seqlens (and seqused_k) on the device.
struct SeqLens {
    cu_q: CudaSlice<i32>,
    cu_k: CudaSlice<i32>,
    used: Option<CudaSlice<i32>>,
}

impl SeqLens {
    fn upload(ctx: &Context, p: &Packed) -> Result<Self> {
        let stream = ctx.stream();
        let used = match &p.seqused_k {
            Some(u) => Some(stream.clone_htod(&u.iter().map(|&x| x as i32).collect::<Vec<_>>())?),
            None => None,
        };
        Ok(Self {
            cu_q: stream.clone_htod(&Packed::cumulative(&p.seqlens_q))?,
            cu_k: stream.clone_htod(&Packed::cumulative(&p.seqlens_k))?,
            used,
        })
    }

    fn batch(&self, case: &Case) -> VarlenBatch<'_> {
        VarlenBatch {
            cu_seqlens_q: SeqLensView::of(&self.cu_q),
            cu_seqlens_k: SeqLensView::of(&self.cu_k),
            seqused_k: self.used.as_ref().map(SeqLensView::of),
            max_seqlen_q: case.seqlen_q,
            max_seqlen_k: case.seqlen_k,
        }
    }
}

/// One packed case (`case.packed` is set).
pub fn bench_case(ctx: &Context, case: &Case, family: Option<KernelFamily>, args: &CaseOptions) -> Result<Row> {
    let packed = case.packed.as_ref().expect("a packed case");
    let params = AttnParams { kernel: family, num_splits: args.splits, ..case.params() };
    let layout = KeyLayout::Varlen { total_k: packed.seqlens_k.iter().sum() };
    let plan = match flashcore::dispatch::plan_for(&ctx.info().device(), &case.shape(), case.dtype, &params, layout, Default::default()) {
        Ok(p) => p,
        Err(e @ (Error::HeadDim { .. } | Error::Unsupported { .. })) => return Ok(unsupported(case, "unsupported", e.to_string())),
        Err(e) => return Err(e.into()),
    };
    let lens = SeqLens::upload(ctx, packed)?;
    let batch = lens.batch(case);
    let set_bytes = case.storage_shape().min_bytes(case.dtype.size_bytes());
    let sets = ((4.0 * ctx.info().l2_bytes as f64 / set_bytes).ceil() as usize).clamp(1, 8);
    let mut inputs = Vec::new();
    for s in 0..sets {
        let h = random_qkv(case, args.inputs, 1000 + s as u64);
        let up = |data: &[f32], sh| Stored::upload(ctx, data, sh, case.dtype, Storage::Bshd);
        inputs.push((up(&h.q, case.q_shape())?, up(&h.k, case.kv_shape())?, up(&h.v, case.kv_shape())?));
    }
    let (q, k, v) = &inputs[0];
    ctx.check_values(&FwdInputs::varlen(q.view(), k.view(), v.view(), batch))?;
    let mut o = DeviceTensor::filled(ctx, 0x7fc0, case.q_shape(), case.dtype)?;
    let mut lse = ctx.stream().alloc_zeros::<f32>(case.heads_q * case.q_shape()[1])?;
    let timed = |graph: bool| {
        let opts = TimingOptions { samples: args.samples, graph, ..Default::default() };
        time(ctx, opts, |i| {
            let (q, k, v) = &inputs[i % sets];
            ctx.attention_into(
                &FwdInputs::varlen(q.view(), k.view(), v.view(), batch),
                FwdOutputs { o: o.view_mut(), lse: Some(LseViewMut::of(&mut lse)), probs: None },
                &params,
            )
        })
    };
    let (timing, eager) = match timed_and_eager(case, !args.eager, timed) {
        Ok(t) => t,
        Err(row) => return Ok(*row),
    };
    let rel_error = if args.no_verify { None } else { Some(verify(ctx, case, &inputs[0], &batch, &params)?) };
    let secs = timing.median_ms * 1e-3;
    Ok(Row {
        case: case.clone(),
        kernel: Some(format!("{} varlen", plan.describe())),
        status: "ok".into(),
        message: Some(format!("{} sequences, {} query rows, {} keys", case.batch, case.q_shape()[1], case.kv_shape()[1])),
        median_ms: Some(timing.median_ms),
        min_ms: Some(timing.min_ms),
        max_ms: Some(timing.max_ms),
        samples_ms: timing.samples_ms,
        tflops: Some(case.flops() / secs * 1e-12),
        gbps: (case.seqlen_q == 1).then(|| case.kv_bytes() / secs * 1e-9),
        rel_error,
        timing: Some(if args.eager { "eager" } else { "graph" }.into()),
        eager_median_ms: Some(eager.median_ms),
        fwd_bwd_median_ms: None,
        round_medians_ms: vec![],
    })
}

/// Rows `start..start + len` of a packed tensor.
fn narrow(t: &Stored, start: usize, len: usize) -> flashcore::TensorView<'_> {
    t.view().narrow_seq(start, len).expect("the sequence is in the tensor")
}

/// Relative error of the last `VERIFY_ROWS` query rows of the sequence with the most keys
/// and of the last sequence (what a wrong offset or clipping would break first), each
/// against the GPU reference kernel run on that sequence alone.
fn verify(ctx: &Context, case: &Case, (q, k, v): &(Stored, Stored, Stored), batch: &VarlenBatch, params: &AttnParams) -> Result<f64> {
    let p = case.packed.as_ref().expect("a packed case");
    let mut o = DeviceTensor::filled(ctx, 0x7fc0, case.q_shape(), case.dtype)?;
    ctx.attention_into(
        &FwdInputs::varlen(q.view(), k.view(), v.view(), *batch),
        FwdOutputs { o: o.view_mut(), lse: None, probs: None },
        params,
    )?;
    let got = o.to_f32(ctx)?;
    let (cu_q, cu_k) = (Packed::cumulative(&p.seqlens_q), Packed::cumulative(&p.seqlens_k));
    let n = p.seqlens_q.len();
    let longest = (0..n).max_by_key(|&b| p.used_k(b)).unwrap_or(0);
    let row_len = case.heads_q * case.head_dim;
    let ref_params = AttnParams { kernel: Some(KernelFamily::Reference), num_splits: None, ..*params };
    let (mut picked, mut want) = (Vec::new(), Vec::new());
    for b in if longest == n - 1 { vec![longest] } else { vec![longest, n - 1] } {
        let (lq, used) = (p.seqlens_q[b], p.used_k(b));
        let rows = lq.min(VERIFY_ROWS);
        if rows == 0 || used == 0 {
            continue;
        }
        let first = cu_q[b] as usize + lq - rows;
        let mut o_ref = DeviceTensor::filled(ctx, 0x7fc0, [1, rows, case.heads_q, case.head_dim], case.dtype)?;
        let (kb, vb) = (narrow(k, cu_k[b] as usize, used), narrow(v, cu_k[b] as usize, used));
        ctx.attention_into(
            &FwdInputs::dense(narrow(q, first, rows), kb, vb),
            FwdOutputs { o: o_ref.view_mut(), lse: None, probs: None },
            &ref_params,
        )?;
        want.extend(o_ref.to_f32(ctx)?.into_iter().map(f64::from));
        picked.extend_from_slice(&got[first * row_len..(first + rows) * row_len]);
    }
    Ok(errors(&picked, &want).0)
}
