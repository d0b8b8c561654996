//! `flashcore check`'s packed (varlen) batches, forward: each against the f64 oracle run per
//! sequence, and bitwise against each sequence run alone through the same kernel (the same
//! split count: the dispatcher picks it from the whole grid; not with dropout, whose mask is
//! a sequence's place in the batch). The backward's: `varlen_bwd.rs`.

use anyhow::Result;
use flashcore::dispatch::KeyLayout;
use flashcore::reference;
use flashcore::{Context, KernelFamily, ProblemShape, Window};

use crate::cases::Inputs;
use crate::check::outcome::{judge, Outcome};
use crate::check::packed::{seqs, sweep, value_dim_spec, Packed, Seq, VarlenSpec};
use crate::check::poison::same_bits;
use crate::check::{slopes_of, wide_slopes, Alibi, ValueDimPoint};

/// The batch (lengths 0, 1, 7, 113, 1000 and 4097 together, Sq ≠ Sk, a sequence with
/// no keys), GQA; serving decode (one query per sequence over keys with slack: seqused_k)
/// at the dispatcher's split count and forced splits; a window, a softcap and ALiBi (per
/// sequence, and with both others) on a packed batch; dropout, alone and with a window and
/// ALiBi.
pub fn specs(family: KernelFamily, quick: bool, smoke: bool) -> Vec<VarlenSpec> {
    if !matches!(family, KernelFamily::FwdSm80 | KernelFamily::FwdSm90) {
        return Vec::new();
    }
    let mixed = seqs(&[(0, 5), (1, 1), (7, 300), (113, 113), (1000, 1200), (3, 0), (250, 90)]);
    let long = seqs(&[(4097, 4097), (1, 17), (113, 1000), (7, 7)]);
    let decode: Vec<Seq> =
        [1, 17, 1000, 4097, 0, 300].iter().enumerate().map(|(i, &keys)| Seq { queries: 1, keys, slack: [0, 3, 40, 1, 9, 0][i] }).collect();
    let policies = seqs(&[(600, 600), (1, 200), (300, 700), (129, 64)]);
    sweep(family, quick, smoke, |p, out| {
        out.push(p.spec(&mixed, (8, 2)));
        out.push(VarlenSpec { seqused: true, ..p.spec(&decode, (8, 2)) });
        out.push(VarlenSpec { alibi: Alibi::PerSequence, ..p.spec(&mixed, (4, 2)) });
        if smoke {
            return;
        }
        out.push(VarlenSpec { alibi: Alibi::PerHead, seqused: true, ..p.spec(&decode, (8, 2)) });
        if p.head_dim == 64 || p.head_dim == 128 {
            out.push(p.spec(&long, (4, 2)));
        }
        out.push(VarlenSpec { window: Window::new(127, 0), ..p.spec(&policies, (4, 2)) });
        out.push(VarlenSpec { softcap: 30.0, inputs: Inputs::LargeLogits, ..p.spec(&policies, (4, 1)) });
        out.push(VarlenSpec { dropout: p.dropout(0.17, 0), ..p.spec(&mixed, (4, 2)) });
        if !quick {
            let windowed = VarlenSpec { window: Window::new(100, 20), alibi: Alibi::PerSequence, ..p.spec(&policies, (4, 2)) };
            out.push(VarlenSpec { dropout: p.dropout(0.5, 7), ..windowed });
            out.push(VarlenSpec { window: Window::new(-1, 64), softcap: 50.0, inputs: Inputs::LargeLogits, ..p.spec(&mixed, (4, 4)) });
            out.push(VarlenSpec { window: Window::new(256, 256), ..p.spec(&long, (2, 1)) });
            let all = VarlenSpec { window: Window::new(-1, 64), softcap: 50.0, inputs: Inputs::LargeLogits, ..p.spec(&policies, (4, 2)) };
            out.push(VarlenSpec { alibi: Alibi::PerSequence, ..all });
        }
        if family == KernelFamily::FwdSm80 {
            out.push(VarlenSpec { seqused: true, splits: Some(5), ..p.spec(&decode, (8, 1)) });
            out.push(VarlenSpec { splits: Some(3), ..p.spec(&mixed, (4, 2)) });
        }
    })
}

/// V's own head dim in packed batches (`check --value-dim`): fwd_sm90's forms of the pairs
/// (`flashcore::kernels::VALUE_HEAD_DIMS`), both dtypes and masks: the mixed batch with GQA,
/// decode over seqused_k, a window.
pub fn value_dim_specs(family: KernelFamily, quick: bool) -> Vec<VarlenSpec> {
    if family != KernelFamily::FwdSm90 {
        return Vec::new();
    }
    let mixed = seqs(&[(0, 5), (1, 1), (7, 300), (113, 113), (1000, 1200), (3, 0), (250, 90)]);
    let decode: Vec<Seq> =
        [1, 17, 1000, 0, 300].iter().enumerate().map(|(i, &keys)| Seq { queries: 1, keys, slack: [0, 3, 40, 9, 0][i] }).collect();
    let policies = seqs(&[(600, 600), (1, 200), (300, 700), (129, 64)]);
    let mut out = Vec::new();
    for v in ValueDimPoint::forward() {
        let spec = |seqs: &[Seq], heads| value_dim_spec(family, v, seqs, heads);
        out.push(spec(&mixed, (8, 2)));
        if !quick {
            out.push(VarlenSpec { seqused: true, ..spec(&decode, (8, 2)) });
            out.push(VarlenSpec { window: Window::new(127, 0), ..spec(&policies, (4, 2)) });
        }
    }
    out
}

pub fn check_one(ctx: &Context, spec: &VarlenSpec) -> Result<Outcome> {
    let (hq, hkv, d, dv) = (spec.heads_q, spec.heads_kv, spec.head_dim, spec.value_dim());
    let scale = 1.0 / (d as f64).sqrt();
    let host = spec.host_inputs();
    let parts: Vec<_> = host.iter().map(|h| (&h.q[..], &h.k[..], &h.v[..])).collect();
    let max = spec.maxima();
    let slopes = spec.slopes();
    let packed = Packed::upload(ctx, spec, &parts, &spec.seqs, &slopes)?;
    let wide_slopes = wide_slopes(&slopes);
    let first = packed.run(ctx, spec, max, None)?;
    let deterministic = same_bits(&first, &packed.run(ctx, spec, max, None)?);
    let (o_bits, lse) = first;
    // Alone, the same variant (the same maxima) and the same split count: the dispatcher
    // picks splits from the whole grid, and another count sums a row's keys in other parts.
    let kernel_shape =
        ProblemShape { batch: spec.seqs.len(), seqlen_q: max.0, seqlen_k: max.1, heads_q: hq, heads_kv: hkv, head_dim: d, head_dim_v: dv };
    let layout = KeyLayout::Varlen { total_k: spec.seqs.iter().map(|s| s.keys + s.slack).sum() };
    let alibi = !slopes.is_empty();
    let splits = flashcore::dispatch::plan_for(
        &ctx.info().device(),
        &kernel_shape,
        spec.dtype,
        &spec.params(),
        layout,
        flashcore::dispatch::ScoreTensors { alibi, ..Default::default() },
    )?
    .splits;

    // The oracle per sequence, and each sequence alone (a batch of one) against its rows of
    // the packed result.
    let (mut ref_o, mut ref_lse) = (Vec::new(), vec![f64::NAN; hq * packed.total_q]);
    let mut failure = None;
    let mut row0 = 0;
    for (b, (s, h)) in spec.seqs.iter().zip(&host).enumerate() {
        let shape =
            ProblemShape { batch: 1, seqlen_q: s.queries, seqlen_k: s.keys, heads_q: hq, heads_kv: hkv, head_dim: d, head_dim_v: dv };
        let wide = |x: &[f32]| x.iter().map(|&v| v as f64).collect::<Vec<f64>>();
        let (used_k, used_v) = (s.keys * hkv * d, s.keys * hkv * dv);
        let (o, l) = if s.keys == 0 {
            (vec![0.0; s.queries * hq * dv], vec![f64::NEG_INFINITY; hq * s.queries])
        } else {
            let mask = spec.mask(&wide_slopes, b);
            let r = reference::attention_masked(&wide(&h.q), &wide(&h.k[..used_k]), &wide(&h.v[..used_v]), &shape, scale, &mask);
            (r.o, r.lse)
        };
        ref_o.extend(o);
        for head in 0..hq {
            for i in 0..s.queries {
                ref_lse[head * packed.total_q + row0 + i] = l[head * s.queries + i];
            }
        }
        // Alone, a sequence without keys would be an empty k (refused): the oracle checks it.
        if s.queries > 0 && s.keys + s.slack > 0 && spec.dropout.is_none() && failure.is_none() {
            let alone = Packed::upload(ctx, spec, &parts[b..b + 1], &spec.seqs[b..b + 1], slopes_of(&slopes, b, hq))?;
            let (o_alone, lse_alone) = alone.run(ctx, spec, max, Some(splits))?;
            let rows = row0 * hq * dv..(row0 + s.queries) * hq * dv;
            let lse_same = (0..hq).all(|head| {
                (0..s.queries).all(|i| lse_alone[head * s.queries + i].to_bits() == lse[head * packed.total_q + row0 + i].to_bits())
            });
            if o_alone != o_bits[rows] || !lse_same {
                failure = Some(format!("sequence {b} differs bitwise from the same sequence run alone"));
            }
        }
        row0 += s.queries;
    }
    let o: Vec<f32> = o_bits.iter().map(|&b| spec.dtype.decode(b)).collect();
    let (rel, max_abs, lse_err, judged) = judge(&o, &ref_o, &lse, &ref_lse, spec.dtype, deterministic);
    let failure = judged.or(failure);
    Ok(Outcome { spec_name: spec.name(), kernel: spec.family, oracle: "cpu-f64", rel, max_abs, lse_err, deterministic, failure })
}
