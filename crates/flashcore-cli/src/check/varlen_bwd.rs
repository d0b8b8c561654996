//! `flashcore check`'s backward of packed (varlen) batches (bwd_sm80, bwd_sm90): the forward
//! by the dispatcher's kernel, then the gradients twice into NaN-poisoned buffers; against the
//! f64 oracle run per sequence (zero where a sequence has no queries or no keys, and for the
//! keys past seqused_k); and each sequence run alone as a batch of one, from the packed
//! forward's own o and lse rows: dk and dv bitwise always (a CTA sums them in one fixed order),
//! dq bitwise in deterministic mode: bwd_sm90's order depends only on the sequence's own
//! lengths; bwd_sm80's at a forced split count (at the dispatcher's count, which depends on the
//! number of sequences, a sequence alone sums its dQ in other slices). Without deterministic
//! mode dQ's additions come in a varying order. With dropout no sequence runs alone (its mask
//! is its place's in the batch; the oracle keeps the place).

use anyhow::Result;
use cudarc::driver::CudaSlice;
use flashcore::reference::RefMask;
use flashcore::{
    reference, BwdInputs, Context, DType, DeviceTensor, DropoutState, FwdInputs, GradsMut, KernelFamily, KvLayout, LseView, ProblemShape,
    SinkGradMut, VarlenBatch, Window,
};

use crate::cases::{errors, normal, Inputs};
use crate::check::outcome::{grad_tolerance, judge_dsink, same_bits, Outcome};
use crate::check::packed::{seqs, sweep, value_dim_spec, Packed, Seq, VarlenSpec};
use crate::check::poison::nan_bits;
use crate::check::{slopes_of, upload_dropout_state, wide_slopes, Alibi, ValueDimPoint};

/// The issue's lengths 0, 1, 7, 113, 1000 and 4097 in one batch (Sq ≠ Sk both ways, a
/// sequence with keys but no queries and one with queries but no keys), at D64 and D128 (the
/// oracle's time); a mixed batch with GQA 4, also deterministic at a forced and at the
/// dispatcher's split count (bwd_sm80; bwd_sm90 has no split count); keys past seqused_k; a
/// window, a softcap, both; ALiBi per sequence (deterministic: each sequence bitwise alone,
/// with its row of slopes), and with a window and a softcap; dropout, alone and deterministic
/// (forced splits on bwd_sm80); learnable sinks, their gradient summed over every sequence
/// (deterministic). Every head dim of `family` in a full check; D64 and D128 otherwise.
pub fn specs(family: KernelFamily, quick: bool, smoke: bool) -> Vec<VarlenSpec> {
    let issue = seqs(&[(0, 5), (1, 1), (7, 300), (113, 113), (1000, 1200), (4097, 4097), (3, 0), (250, 90)]);
    let mixed = seqs(&[(0, 5), (1, 1), (7, 300), (113, 113), (1000, 1200), (3, 0), (250, 90)]);
    let slacked = [(7, 300, 5), (113, 113, 0), (0, 20, 4), (50, 0, 9), (200, 150, 1)]
        .map(|(queries, keys, slack)| Seq { queries, keys, slack })
        .to_vec();
    let policies = seqs(&[(600, 600), (1, 200), (300, 700), (129, 64)]);
    let forced = |n: usize| (family == KernelFamily::BwdSm80).then_some(n);
    sweep(family, quick, smoke, |p, out| {
        out.push(p.spec(&mixed, (8, 2)));
        out.push(VarlenSpec { deterministic: true, splits: forced(3), ..p.spec(&mixed, (4, 2)) });
        out.push(VarlenSpec { alibi: Alibi::PerSequence, deterministic: true, splits: forced(3), ..p.spec(&mixed, (4, 2)) });
        if smoke {
            return;
        }
        out.push(VarlenSpec { seqused: true, ..p.spec(&slacked, (4, 1)) });
        out.push(VarlenSpec { sinks: true, deterministic: true, ..p.spec(&mixed, (8, 2)) });
        out.push(VarlenSpec { window: Window::new(127, 0), deterministic: true, ..p.spec(&policies, (4, 2)) });
        out.push(VarlenSpec { softcap: 30.0, inputs: Inputs::LargeLogits, ..p.spec(&policies, (4, 1)) });
        out.push(VarlenSpec { dropout: p.dropout(0.17, 0), ..p.spec(&mixed, (8, 2)) });
        if !quick {
            out.push(VarlenSpec { dropout: p.dropout(0.5, 9), deterministic: true, splits: forced(3), ..p.spec(&policies, (4, 2)) });
        }
        if (p.head_dim == 64 || p.head_dim == 128) && (p.dtype == DType::BF16 || !quick) {
            out.push(p.spec(&issue, (2, 1)));
        }
        if !quick {
            out.push(VarlenSpec { window: Window::new(-1, 64), softcap: 50.0, inputs: Inputs::LargeLogits, ..p.spec(&mixed, (4, 4)) });
            out.push(VarlenSpec { window: Window::new(256, 256), deterministic: true, splits: forced(2), ..p.spec(&policies, (2, 1)) });
            let all = VarlenSpec { window: Window::new(-1, 64), softcap: 50.0, inputs: Inputs::LargeLogits, ..p.spec(&policies, (4, 2)) };
            out.push(VarlenSpec { alibi: Alibi::PerHead, ..all });
        }
    })
}

/// What a backward reads besides q, k and v: the forward's o and lse, the loss's dout, and
/// dropout's generator state on the device (None without dropout).
struct Saved<'a> {
    o: &'a DeviceTensor,
    lse: &'a CudaSlice<f32>,
    dout: &'a DeviceTensor,
    dropout_state: Option<DropoutState<'a>>,
}

/// The gradients (dq, dk, dv bits) of a packed problem into NaN-poisoned buffers, and with
/// sinks their gradient (f32 `[Hq]`; empty without).
fn gradients(ctx: &Context, spec: &VarlenSpec, packed: &Packed, batch: &VarlenBatch, saved: &Saved) -> Result<([Vec<u16>; 3], Vec<f32>)> {
    let nan = nan_bits(spec.dtype);
    let mut dq = DeviceTensor::filled(ctx, nan, packed.q.layout().shape, spec.dtype)?;
    let mut dk = DeviceTensor::filled(ctx, nan, packed.k.layout().shape, spec.dtype)?;
    let mut dv = DeviceTensor::filled(ctx, nan, packed.v.layout().shape, spec.dtype)?;
    let inputs = BwdInputs {
        q: packed.q.view(),
        k: packed.k.view(),
        v: packed.v.view(),
        o: saved.o.view(),
        lse: LseView::of(saved.lse),
        dout: saved.dout.view(),
        kv: KvLayout::Varlen(*batch),
        alibi_slopes: packed.alibi_slopes(),
        dropout_state: saved.dropout_state,
        learnable_sink: packed.learnable_sink(),
    };
    let mut dsink = ctx.stream().clone_htod(&vec![f32::NAN; if spec.sinks { spec.heads_q } else { 0 }])?;
    let grads = GradsMut::new(dq.view_mut(), dk.view_mut(), dv.view_mut());
    let grads = if spec.sinks { grads.with_dsink(SinkGradMut::of(&mut dsink)) } else { grads };
    ctx.attention_backward_into(&inputs, grads, &spec.params())?;
    Ok(([dq.to_bits(ctx)?, dk.to_bits(ctx)?, dv.to_bits(ctx)?], ctx.stream().clone_dtoh(&dsink)?))
}

/// V's own head dim in packed batches' backward (`check --value-dim`): bwd_sm90's forms of the
/// pairs (`flashcore::kernels::VALUE_HEAD_DIMS`), both dtypes and masks: the mixed batch with
/// GQA, deterministic (each sequence bitwise alone, dq too), keys past seqused_k, sinks.
pub fn value_dim_specs(family: KernelFamily, quick: bool) -> Vec<VarlenSpec> {
    if family != KernelFamily::BwdSm90 {
        return Vec::new();
    }
    let mixed = seqs(&[(0, 5), (1, 1), (7, 300), (113, 113), (1000, 1200), (3, 0), (250, 90)]);
    let slacked = [(7, 300, 5), (113, 113, 0), (0, 20, 4), (50, 0, 9), (200, 150, 1)]
        .map(|(queries, keys, slack)| Seq { queries, keys, slack })
        .to_vec();
    let mut out = Vec::new();
    for v in ValueDimPoint::backward() {
        let spec = |seqs: &[Seq], heads| value_dim_spec(family, v, seqs, heads);
        out.push(VarlenSpec { deterministic: true, ..spec(&mixed, (4, 2)) });
        if !quick {
            out.push(VarlenSpec { seqused: true, ..spec(&slacked, (4, 1)) });
            out.push(VarlenSpec { sinks: true, deterministic: true, ..spec(&mixed, (8, 2)) });
        }
    }
    out
}

pub fn check_one(ctx: &Context, spec: &VarlenSpec) -> Result<Outcome> {
    let (hq, hkv, d, dv, dtype) = (spec.heads_q, spec.heads_kv, spec.head_dim, spec.value_dim(), spec.dtype);
    let host = spec.host_inputs();
    let douts: Vec<Vec<f32>> =
        spec.seqs.iter().enumerate().map(|(i, s)| normal(s.queries * hq * dv, 1.0, dtype, 0xd0 ^ (i as u64) << 8 ^ d as u64)).collect();
    let parts: Vec<_> = host.iter().map(|h| (&h.q[..], &h.k[..], &h.v[..])).collect();
    let max = spec.maxima();
    let slopes = spec.slopes();
    let wide_slopes = wide_slopes(&slopes);
    let packed = Packed::upload(ctx, spec, &parts, &spec.seqs, &slopes)?;
    let batch = packed.batch(ctx, max)?;
    let dout = DeviceTensor::from_f32(ctx, &douts.concat(), [1, packed.total_q, hq, dv], dtype)?;
    let forward = flashcore::AttnParams { kernel: None, num_splits: None, deterministic: false, ..spec.params() };
    let inputs = FwdInputs {
        alibi_slopes: packed.alibi_slopes(),
        learnable_sink: packed.learnable_sink(),
        ..FwdInputs::varlen(packed.q.view(), packed.k.view(), packed.v.view(), batch)
    };
    let fwd = ctx.attention(&inputs, &forward)?;
    // The forward drew its mask from the host's pair; the backward reads it on the device.
    let state = upload_dropout_state(ctx, spec.dropout)?;
    let saved = Saved { o: &fwd.o, lse: &fwd.lse, dout: &dout, dropout_state: state.as_ref().map(DropoutState::of) };
    let (first, first_dsink) = gradients(ctx, spec, &packed, &batch, &saved)?;
    let (second, second_dsink) = gradients(ctx, spec, &packed, &batch, &saved)?;
    // dq adds with atomics in a varying order unless deterministic; dk, dv and dsink never do.
    let repeats = usize::from(!spec.deterministic);
    let deterministic = first[repeats..] == second[repeats..] && same_bits(&first_dsink, &second_dsink);
    let sinks = super::sink_values(spec.sinks, hq);
    let wide_sinks = super::wide_slopes(&sinks);
    // The sinks' gradient and the size of its terms, summed over the sequences' oracles.
    let (mut want_dsink, mut dsink_scale) = (vec![0f64; sinks.len()], vec![0f64; sinks.len()]);

    let (o_bits, lse) = (fwd.o.to_bits(ctx)?, ctx.stream().clone_dtoh(&fwd.lse)?);
    let total_k: usize = spec.seqs.iter().map(|s| s.keys + s.slack).sum();
    let mut want = [vec![0f64; packed.total_q * hq * d], vec![0f64; total_k * hkv * d], vec![0f64; total_k * hkv * dv]];
    let mut failure = None;
    let (mut q0, mut k0) = (0, 0);
    let wide = |x: &[f32]| x.iter().map(|&v| v as f64).collect::<Vec<f64>>();
    for (b, (s, h)) in spec.seqs.iter().zip(&host).enumerate() {
        let (q_rows, k_rows) = (q0 * hq * d..(q0 + s.queries) * hq * d, k0 * hkv * d..(k0 + s.keys + s.slack) * hkv * d);
        let (o_rows, v_rows) = (q0 * hq * dv..(q0 + s.queries) * hq * dv, k0 * hkv * dv..(k0 + s.keys + s.slack) * hkv * dv);
        if s.queries > 0 && s.keys > 0 {
            let shape =
                ProblemShape { batch: 1, seqlen_q: s.queries, seqlen_k: s.keys, heads_q: hq, heads_kv: hkv, head_dim: d, head_dim_v: dv };
            let (used, used_v) = (s.keys * hkv * d, s.keys * hkv * dv);
            let (k, v) = (wide(&h.k[..used]), wide(&h.v[..used_v]));
            let (scale, mask) = (1.0 / (d as f64).sqrt(), RefMask { sinks: &wide_sinks, ..spec.mask(&wide_slopes, b) });
            let r = reference::attention_backward_masked(&wide(&h.q), &k, &v, &wide(&douts[b]), &shape, scale, &mask);
            for (h, (g, s)) in r.dsinks.iter().zip(&r.dsink_scales).enumerate() {
                want_dsink[h] += g;
                dsink_scale[h] += s;
            }
            want[0][q_rows.clone()].copy_from_slice(&r.dq);
            want[1][k_rows.start..][..used].copy_from_slice(&r.dk);
            want[2][v_rows.start..][..used_v].copy_from_slice(&r.dv);
        }
        // Alone: a batch of one at the same maxima, from the packed forward's rows (a sequence
        // without queries or keys would be an empty tensor: the oracle's zeros check it).
        if s.queries > 0 && s.keys + s.slack > 0 && spec.dropout.is_none() && failure.is_none() {
            let alone = Packed::upload(ctx, spec, &parts[b..b + 1], &spec.seqs[b..b + 1], slopes_of(&slopes, b, hq))?;
            let o = DeviceTensor::from_bits(ctx, &o_bits[o_rows], [1, s.queries, hq, dv], dtype)?;
            let rows: Vec<f32> = (0..hq).flat_map(|head| lse[head * packed.total_q + q0..][..s.queries].iter().copied()).collect();
            let lse_alone = ctx.stream().clone_htod(&rows)?;
            let dout_alone = DeviceTensor::from_f32(ctx, &douts[b], [1, s.queries, hq, dv], dtype)?;
            let saved = Saved { o: &o, lse: &lse_alone, dout: &dout_alone, dropout_state: None };
            let (got, _) = gradients(ctx, spec, &alone, &alone.batch(ctx, max)?, &saved)?;
            let dq_too = spec.deterministic && (spec.splits.is_some() || spec.family == KernelFamily::BwdSm90);
            if got[1] != first[1][k_rows.clone()] || got[2] != first[2][v_rows] {
                failure = Some(format!("sequence {b}: dk or dv differs bitwise from the same sequence run alone"));
            } else if dq_too && got[0] != first[0][q_rows] {
                failure = Some(format!("sequence {b}: dq differs bitwise from the same sequence run alone (deterministic)"));
            }
        }
        q0 += s.queries;
        k0 += s.keys + s.slack;
    }
    let (mut rel, mut max_abs) = (0f64, 0f64);
    let bound = grad_tolerance(dtype, spec.inputs);
    for ((name, bits), want) in ["dq", "dk", "dv"].iter().zip(&first).zip(&want) {
        let got: Vec<f32> = bits.iter().map(|&b| dtype.decode(b)).collect();
        let (r, m) = errors(&got, want);
        if got.iter().any(|x| !x.is_finite()) {
            failure = Some(format!("NaN/Inf in {name} (unwritten or overflowed elements)"));
        } else if r > bound {
            failure.get_or_insert(format!("{name} rel error {r:.2e} > {bound:.1e}"));
        }
        rel = rel.max(r);
        max_abs = max_abs.max(m);
    }
    if spec.sinks {
        let (r, judged) = judge_dsink(&first_dsink, &want_dsink, &dsink_scale, dtype);
        failure = failure.or(judged);
        rel = rel.max(r);
    }
    if !deterministic {
        failure
            .get_or_insert(format!("{} differ bitwise between two runs", if repeats == 1 { "dk, dv or dsink" } else { "the gradients" }));
    }
    Ok(Outcome { spec_name: spec.name(), kernel: spec.family, oracle: "cpu-f64", rel, max_abs, lse_err: 0.0, deterministic, failure })
}
