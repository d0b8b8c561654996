//! `flashcore attn` over a packed (varlen) batch: `q [total_q, Hq, D]`, `k, v [total_k, Hkv,
//! D]` with the file's `cu_seqlens_q`, `cu_seqlens_k` and optionally `seqused_k`.

use anyhow::Result;
use flashcore::{reference, AttnParams, BwdInputs, DeviceTensor, FwdInputs, KvLayout, LseView, ProblemShape, SeqLensView, VarlenBatch};

use crate::attn::args::{attn_params, softmax_scale, AttnArgs};
use crate::attn::tensors::{download, gpu_and_dtype, problem_shapes, shape_error, upload, Outputs, ValueHeadDim};
use crate::io::{read_dout, write_tensors, FileDType, HostSeqlens, HostTensor};

/// A packed batch (`cu_seqlens_q`, `cu_seqlens_k` and optionally `seqused_k` in the file,
/// int32; `q [total_q, Hq, D]`, `k, v [total_k, Hkv, D]`): `o` like `q` and `lse [Hq,
/// total_q]`, and with `do` the gradients (zero for keys no query sees, past seqused_k
/// included). The vectors are checked first (`Context::check_values`' checks; on the host
/// with `--cpu`), by name.
pub fn run(args: &AttnArgs, q: &HostTensor, k: &HostTensor, v: &HostTensor, seqlens: &HostSeqlens) -> Result<bool> {
    let ([qb, total_q, hq, d], [kb, total_k, hkv, _], _) = problem_shapes(q, [("k", k), ("v", v)], ValueHeadDim::AsKeys)?;
    if let Some((arg, batch)) = [("q", qb), ("k", kb)].into_iter().find(|&(_, batch)| batch != 1) {
        return Err(shape_error(arg, format!("a packed batch is [1, total, H, D] (or [total, H, D]); got batch {batch}")));
    }
    let dout = read_dout(&args.input, q, d)?;
    let (cu_q, cu_k) = (&seqlens.cu_seqlens_q, &seqlens.cu_seqlens_k);
    let keys: Vec<usize> = match &seqlens.seqused_k {
        Some(used) => used.iter().map(|&u| u.max(0) as usize).collect(),
        None => cu_k.windows(2).map(|w| (w[1] - w[0]).max(0) as usize).collect(),
    };
    let queries: Vec<usize> = cu_q.windows(2).map(|w| (w[1] - w[0]).max(0) as usize).collect();
    let max = (queries.iter().copied().max().unwrap_or(0), keys.iter().copied().max().unwrap_or(0));
    let params = attn_params(args, d)?;
    let out = if args.cpu {
        flashcore::check_varlen_values(cu_q, cu_k, seqlens.seqused_k.as_deref(), (total_q, total_k), max)?;
        let (scale, mask) = (softmax_scale(args, d), reference::RefMask::of(&params));
        let mut o = Vec::with_capacity(total_q * hq * d);
        let mut lse = vec![f64::NEG_INFINITY; hq * total_q];
        let mut grads = dout.as_ref().map(|_| [vec![0.0; total_q * hq * d], vec![0.0; total_k * hkv * d], vec![0.0; total_k * hkv * d]]);
        for (b, (&sq, &sk)) in queries.iter().zip(&keys).enumerate() {
            let (q0, k0) = (cu_q[b] as usize, cu_k[b] as usize);
            let shape = ProblemShape { batch: 1, seqlen_q: sq, seqlen_k: sk, heads_q: hq, heads_kv: hkv, head_dim: d, head_dim_v: d };
            let rows = |t: &HostTensor, start: usize, n: usize, h: usize| t.data[start * h * d..(start + n) * h * d].to_vec();
            let (qs, ks, vs) = (rows(q, q0, sq, hq), rows(k, k0, sk, hkv), rows(v, k0, sk, hkv));
            let r = reference::attention_masked(&qs, &ks, &vs, &shape, scale, &mask);
            o.extend(r.o);
            for h in 0..hq {
                lse[h * total_q + q0..h * total_q + q0 + sq].copy_from_slice(&r.lse[h * sq..(h + 1) * sq]);
            }
            if let (Some([dq, dk, dv]), Some(g)) = (grads.as_mut(), dout.as_ref()) {
                if sq > 0 && sk > 0 {
                    let r = reference::attention_backward_masked(&qs, &ks, &vs, &rows(g, q0, sq, hq), &shape, scale, &mask);
                    dq[q0 * hq * d..][..r.dq.len()].copy_from_slice(&r.dq);
                    dk[k0 * hkv * d..][..r.dk.len()].copy_from_slice(&r.dk);
                    dv[k0 * hkv * d..][..r.dv.len()].copy_from_slice(&r.dv);
                }
            }
        }
        Outputs { o, lse, grads }
    } else {
        gpu(args, [q, k, v], dout.as_ref(), seqlens, max, params)?
    };
    let data_dtype = if args.f64_out { FileDType::F64 } else { q.dtype.output() };
    let lse_dtype = if args.f64_out { FileDType::F64 } else { FileDType::F32 };
    let packed = |rows, heads, data| HostTensor { shape: vec![rows, heads, d], dtype: data_dtype, data };
    let o = packed(total_q, hq, out.o);
    let lse = HostTensor { shape: vec![hq, total_q], dtype: lse_dtype, data: out.lse };
    let grads = out.grads.map(|[dq, dk, dv]| [packed(total_q, hq, dq), packed(total_k, hkv, dk), packed(total_k, hkv, dv)]);
    let mut tensors = vec![("o", &o), ("lse", &lse)];
    if let Some([dq, dk, dv]) = &grads {
        tensors.extend([("dq", dq), ("dk", dk), ("dv", dv)]);
    }
    write_tensors(&args.output, &tensors)?;
    let names: Vec<&str> = tensors.iter().map(|(n, _)| *n).collect();
    println!("wrote {} (a packed batch of {} sequences) to {}", names.join(", "), queries.len(), args.output.display());
    Ok(true)
}

fn gpu(
    args: &AttnArgs,
    [q, k, v]: [&HostTensor; 3],
    dout: Option<&HostTensor>,
    seqlens: &HostSeqlens,
    max: (usize, usize),
    params: AttnParams,
) -> Result<Outputs> {
    let (ctx, dtype) = gpu_and_dtype(args, q)?;
    let up = |t: &HostTensor| upload(&ctx, t, dtype);
    let (qd, kd, vd) = (up(q)?, up(k)?, up(v)?);
    let cu_q = ctx.stream().clone_htod(&seqlens.cu_seqlens_q)?;
    let cu_k = ctx.stream().clone_htod(&seqlens.cu_seqlens_k)?;
    let used = seqlens.seqused_k.as_ref().map(|u| ctx.stream().clone_htod(u)).transpose()?;
    let batch = VarlenBatch {
        cu_seqlens_q: SeqLensView::of(&cu_q),
        cu_seqlens_k: SeqLensView::of(&cu_k),
        seqused_k: used.as_ref().map(SeqLensView::of),
        max_seqlen_q: max.0,
        max_seqlen_k: max.1,
    };
    let inputs = FwdInputs::varlen(qd.view(), kd.view(), vd.view(), batch);
    ctx.check_values(&inputs)?;
    // As `gpu`: a backward family named concerns the backward only.
    let out = ctx.attention(&inputs, &AttnParams { kernel: params.kernel.filter(|f| !f.is_backward()), ..params })?;
    let wide = |t: &DeviceTensor| download(&ctx, t);
    let grads = match dout {
        Some(g) => {
            let gd = up(g)?;
            let (o, lse) = (out.o.view(), LseView::of(&out.lse));
            let inputs = BwdInputs::new(qd.view(), kd.view(), vd.view(), o, lse, gd.view(), KvLayout::Varlen(batch));
            let g = ctx.attention_backward(&inputs, &params)?;
            Some([wide(&g.dq)?, wide(&g.dk)?, wide(&g.dv)?])
        }
        None => None,
    };
    let lse = ctx.stream().clone_dtoh(&out.lse)?.into_iter().take(q.shape[2] * q.shape[1]).map(f64::from).collect();
    Ok(Outputs { o: wide(&out.o)?, lse, grads })
}
