//! `flashcore attn` over a dense batch: `q [B, Sq, Hq, D]`, `k [B, Sk, Hkv, D]`, `v [B, Sk, Hkv,
//! Dv]` (`Dv` ≠ `D` in the f64 reference alone: the GPU kernels refuse it by name).

use anyhow::Result;
use flashcore::{reference, AttnParams, BwdInputs, DeviceTensor, FwdInputs, KvLayout, LseView, ProblemShape};

use crate::attn::args::{attn_params, softmax_scale, AttnArgs};
use crate::attn::tensors::{download, gpu_and_dtype, problem_shapes, shape_error, upload, Outputs, ValueHeadDim};
use crate::io::{read_dout, write_tensors, FileDType, HostTensor};

/// Attention over a dense batch: writes `o` like `q` with V's head dim, `lse [B, Hq, Sq]` and,
/// with `do` (shaped like `o`) in the input, the gradients `dq`, `dk`, `dv` like `q`, `k`, `v`.
pub fn run(args: &AttnArgs, q: &HostTensor, k: &HostTensor, v: &HostTensor) -> Result<bool> {
    let ([b, sq, hq, d], [kb, sk, hkv, _], dv) = problem_shapes(q, [("k", k), ("v", v)], ValueHeadDim::Own)?;
    if kb != b {
        return Err(shape_error("k", format!("batch {kb} differs from q's batch {b}")));
    }
    let shape = ProblemShape { batch: b, seqlen_q: sq, seqlen_k: sk, heads_q: hq, heads_kv: hkv, head_dim: d, head_dim_v: dv };
    let params = attn_params(args, d)?;
    let dout = read_dout(&args.input, q, dv)?;
    let out = if args.cpu {
        let (scale, mask) = (softmax_scale(args, d), reference::RefMask::of(&params));
        let r = reference::attention_masked(&q.data, &k.data, &v.data, &shape, scale, &mask);
        let grads = dout.as_ref().map(|g| reference::attention_backward_masked(&q.data, &k.data, &v.data, &g.data, &shape, scale, &mask));
        Outputs { o: r.o, lse: r.lse, grads: grads.map(|g| [g.dq, g.dk, g.dv]) }
    } else {
        gpu(args, q, k, v, dout.as_ref(), &shape, params)?
    };
    let data_dtype = if args.f64_out { FileDType::F64 } else { q.dtype.output() };
    let lse_dtype = if args.f64_out { FileDType::F64 } else { FileDType::F32 };
    let o = HostTensor { shape: vec![b, sq, hq, dv], dtype: data_dtype, data: out.o };
    let lse = HostTensor { shape: vec![b, hq, sq], dtype: lse_dtype, data: out.lse };
    let mut tensors = vec![("o", &o), ("lse", &lse)];
    let grads = out.grads.map(|[dq, dk, dv]| {
        let like = |t: &HostTensor, data| HostTensor { shape: t.shape.clone(), dtype: data_dtype, data };
        [like(q, dq), like(k, dk), like(v, dv)]
    });
    if let Some([dq, dk, dv]) = &grads {
        tensors.extend([("dq", dq), ("dk", dk), ("dv", dv)]);
    }
    write_tensors(&args.output, &tensors)?;
    let names: Vec<&str> = tensors.iter().map(|(n, _)| *n).collect();
    println!("wrote {} to {}", names.join(", "), args.output.display());
    Ok(true)
}

fn gpu(
    args: &AttnArgs,
    q: &HostTensor,
    k: &HostTensor,
    v: &HostTensor,
    dout: Option<&HostTensor>,
    shape: &ProblemShape,
    params: AttnParams,
) -> Result<Outputs> {
    let (ctx, dtype) = gpu_and_dtype(args, q)?;
    let up = |t: &HostTensor| upload(&ctx, t, dtype);
    let (qd, kd, vd) = (up(q)?, up(k)?, up(v)?);
    // A backward family named concerns the backward only (the forward takes its default).
    let forward_kernel = params.kernel.filter(|f| !f.is_backward());
    let out = ctx.attention(&FwdInputs::dense(qd.view(), kd.view(), vd.view()), &AttnParams { kernel: forward_kernel, ..params })?;
    let wide = |t: &DeviceTensor| download(&ctx, t);
    let grads = match dout {
        Some(g) => {
            let gd = up(g)?;
            // The backward's default kernels (bwd_sm90 on Hopper for its head dims, else
            // bwd_sm80), or the family named by `--kernel` if it is a backward one; a forward
            // family named concerns the forward only.
            let (o, lse) = (out.o.view(), LseView::of(&out.lse));
            let inputs = BwdInputs::new(qd.view(), kd.view(), vd.view(), o, lse, gd.view(), KvLayout::Dense);
            let g = ctx.attention_backward(&inputs, &params)?;
            Some([wide(&g.dq)?, wide(&g.dk)?, wide(&g.dv)?])
        }
        None => None,
    };
    let lse = ctx.stream().clone_dtoh(&out.lse)?.into_iter().take(shape.batch * shape.heads_q * shape.seqlen_q).map(f64::from).collect();
    Ok(Outputs { o: wide(&out.o)?, lse, grads })
}
