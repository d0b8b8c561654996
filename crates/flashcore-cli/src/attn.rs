//! `flashcore attn`: attention on tensors from a safetensors file, on the GPU or (`--cpu`)
//! with the f64 reference.

use std::path::PathBuf;

use anyhow::{bail, Result};
use flashcore::{reference, AttnParams, Context, DType, DeviceTensor, KernelFamily, ProblemShape};

use crate::io::{read_qkv, write_outputs, FileDType, HostTensor};

#[derive(clap::Args)]
pub struct AttnArgs {
    /// safetensors file with `q`, `k`, `v` (BSHD; f16, bf16 or f32).
    #[arg(long)]
    input: PathBuf,
    /// safetensors file to write `o` (input dtype) and `lse` (f32) into.
    #[arg(long)]
    output: PathBuf,
    /// Causal mask (bottom-right aligned).
    #[arg(long)]
    causal: bool,
    /// Softmax scale (default 1/sqrt(D)).
    #[arg(long)]
    scale: Option<f64>,
    /// Force a kernel family on the GPU.
    #[arg(long, conflicts_with = "cpu")]
    kernel: Option<String>,
    /// Use the f64 CPU reference (no GPU needed).
    #[arg(long)]
    cpu: bool,
    /// Write `o` and `lse` as f64 (with --cpu: the reference's full precision).
    #[arg(long)]
    f64_out: bool,
    /// On the GPU, round f32 inputs to this dtype (f16 or bf16).
    #[arg(long)]
    dtype: Option<String>,
}

fn shape4(t: &HostTensor, name: &str) -> Result<[usize; 4]> {
    match t.shape[..] {
        [b, s, h, d] => Ok([b, s, h, d]),
        _ => bail!("`{name}` must be rank 4 [B, S, H, D], got {:?}", t.shape),
    }
}

pub fn run(args: &AttnArgs) -> Result<bool> {
    let (q, k, v) = read_qkv(&args.input)?;
    let ([b, sq, hq, d], [kb, sk, hkv, kd]) = (shape4(&q, "q")?, shape4(&k, "k")?);
    if k.shape != v.shape || kb != b || kd != d || hkv == 0 || hq % hkv != 0 {
        bail!(
            "shapes do not form an attention problem: q {:?}, k {:?}, v {:?} (need k = v, same B and D, Hq % Hkv == 0)",
            q.shape,
            k.shape,
            v.shape
        );
    }
    let shape = ProblemShape { batch: b, seqlen_q: sq, seqlen_k: sk, heads_q: hq, heads_kv: hkv, head_dim: d };
    let scale = args.scale.unwrap_or(1.0 / (d as f64).sqrt());
    let (o, lse) = if args.cpu {
        let r = reference::attention(&q.data, &k.data, &v.data, &shape, scale, args.causal);
        (r.o, r.lse)
    } else {
        gpu(args, &q, &k, &v, &shape, scale)?
    };
    let out_dtype = if args.f64_out { FileDType::F64 } else { q.dtype };
    let lse_dtype = if args.f64_out { FileDType::F64 } else { FileDType::F32 };
    write_outputs(
        &args.output,
        &HostTensor { shape: q.shape.clone(), dtype: out_dtype, data: o },
        &HostTensor { shape: vec![b, hq, sq], dtype: lse_dtype, data: lse },
    )?;
    println!("wrote o {:?} and lse [{b}, {hq}, {sq}] to {}", q.shape, args.output.display());
    Ok(true)
}

fn gpu(args: &AttnArgs, q: &HostTensor, k: &HostTensor, v: &HostTensor, shape: &ProblemShape, scale: f64) -> Result<(Vec<f64>, Vec<f64>)> {
    let dtype = match (q.dtype, args.dtype.as_deref()) {
        (_, Some("bf16")) => DType::BF16,
        (_, Some("f16")) => DType::F16,
        (_, Some(other)) => bail!("--dtype must be f16 or bf16, got {other:?}"),
        (FileDType::F16, None) => DType::F16,
        (FileDType::BF16, None) => DType::BF16,
        (other, None) => bail!("the GPU kernels take f16 or bf16; the inputs are {other:?} (pass --dtype bf16, or --cpu)"),
    };
    let kernel = match &args.kernel {
        Some(n) => Some(KernelFamily::parse(n).ok_or_else(|| anyhow::anyhow!("unknown kernel {n:?}"))?),
        None => None,
    };
    let ctx = Context::new(0)?;
    let up = |t: &HostTensor| {
        let data: Vec<f32> = t.data.iter().map(|&x| x as f32).collect();
        DeviceTensor::from_f32(&ctx, &data, shape4(t, "tensor")?, dtype).map_err(anyhow::Error::from)
    };
    let (qd, kd, vd) = (up(q)?, up(k)?, up(v)?);
    let params = AttnParams { softmax_scale: Some(scale as f32), causal: args.causal, kernel, ..AttnParams::default() };
    let out = ctx.attention(qd.view(), kd.view(), vd.view(), &params)?;
    let o = out.o.to_f32(&ctx)?.into_iter().map(f64::from).collect();
    let lse = ctx.stream().clone_dtoh(&out.lse)?.into_iter().take(shape.batch * shape.heads_q * shape.seqlen_q).map(f64::from).collect();
    Ok((o, lse))
}
