//! `flashcore attn`: attention on tensors from a safetensors file, on the GPU or (`--cpu`)
//! with the f64 reference.

use std::path::PathBuf;

use anyhow::{bail, Result};
use flashcore::{reference, AttnParams, BwdInputs, Context, DType, DeviceTensor, KernelFamily, LseView, ProblemShape, Window};

use crate::io::{read_dout, read_qkv, write_tensors, FileDType, HostTensor};

#[derive(clap::Args)]
pub struct AttnArgs {
    /// safetensors file with `q`, `k`, `v` (BSHD; f16, bf16 or f32) and optionally `do`, the
    /// gradient of a loss with respect to `o` (shaped and typed like `q`).
    #[arg(long)]
    input: PathBuf,
    /// safetensors file to write `o` (input dtype) and `lse` (f32) into, and `dq`, `dk`, `dv`
    /// (input dtype) when the input has `do`.
    #[arg(long)]
    output: PathBuf,
    /// Causal mask (bottom-right aligned).
    #[arg(long)]
    causal: bool,
    /// Softmax scale (default 1/sqrt(D)).
    #[arg(long)]
    scale: Option<f64>,
    /// Sliding window `LEFT,RIGHT` in keys around each query's (bottom-right aligned)
    /// diagonal, -1 for an unbounded side (flash_attn's window_size).
    #[arg(long, allow_hyphen_values = true)]
    window: Option<String>,
    /// Logit softcap: scores become softcap * tanh(score / softcap).
    #[arg(long, allow_hyphen_values = true)]
    softcap: Option<f32>,
    /// Force a kernel family on the GPU.
    #[arg(long, conflicts_with = "cpu")]
    kernel: Option<String>,
    /// Use the f64 CPU reference (no GPU needed).
    #[arg(long)]
    cpu: bool,
    /// Write every output as f64 (with --cpu: the reference's full precision).
    #[arg(long)]
    f64_out: bool,
    /// On the GPU, round f32 inputs to this dtype (f16 or bf16).
    #[arg(long)]
    dtype: Option<String>,
}

/// `--window LEFT,RIGHT` (none: unbounded).
fn window(args: &AttnArgs) -> Result<Window> {
    let Some(text) = args.window.as_deref() else { return Ok(Window::UNBOUNDED) };
    match text.split(',').map(|x| x.trim().parse::<i32>()).collect::<Vec<_>>()[..] {
        [Ok(left), Ok(right)] => Ok(Window::new(left, right)),
        _ => bail!("--window takes LEFT,RIGHT (integers, -1 unbounded), got {text:?}"),
    }
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
    let dout = read_dout(&args.input, &q)?;
    let mods = AttnParams { causal: args.causal, window: window(args)?, softcap: args.softcap.unwrap_or(0.0), ..AttnParams::default() };
    mods.check_window_and_softcap()?;
    let out = if args.cpu {
        let mask = reference::RefMask::of(&mods);
        let r = reference::attention_masked(&q.data, &k.data, &v.data, &shape, scale, &mask);
        let grads = dout.as_ref().map(|g| reference::attention_backward_masked(&q.data, &k.data, &v.data, &g.data, &shape, scale, &mask));
        Outputs { o: r.o, lse: r.lse, grads: grads.map(|g| [g.dq, g.dk, g.dv]) }
    } else {
        gpu(args, &q, &k, &v, dout.as_ref(), &shape, scale)?
    };
    let data_dtype = if args.f64_out { FileDType::F64 } else { q.dtype };
    let lse_dtype = if args.f64_out { FileDType::F64 } else { FileDType::F32 };
    let o = HostTensor { shape: q.shape.clone(), dtype: data_dtype, data: out.o };
    let lse = HostTensor { shape: vec![b, hq, sq], dtype: lse_dtype, data: out.lse };
    let mut tensors = vec![("o", &o), ("lse", &lse)];
    let grads = out.grads.map(|[dq, dk, dv]| {
        let like = |t: &HostTensor, data| HostTensor { shape: t.shape.clone(), dtype: data_dtype, data };
        [like(&q, dq), like(&k, dk), like(&v, dv)]
    });
    if let Some([dq, dk, dv]) = &grads {
        tensors.extend([("dq", dq), ("dk", dk), ("dv", dv)]);
    }
    write_tensors(&args.output, &tensors)?;
    let names: Vec<&str> = tensors.iter().map(|(n, _)| *n).collect();
    println!("wrote {} to {}", names.join(", "), args.output.display());
    Ok(true)
}

/// What `attn` writes: o, lse and, with `do` in the input, the gradients dq, dk, dv.
struct Outputs {
    o: Vec<f64>,
    lse: Vec<f64>,
    grads: Option<[Vec<f64>; 3]>,
}

fn gpu(
    args: &AttnArgs,
    q: &HostTensor,
    k: &HostTensor,
    v: &HostTensor,
    dout: Option<&HostTensor>,
    shape: &ProblemShape,
    scale: f64,
) -> Result<Outputs> {
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
    let params = AttnParams {
        softmax_scale: Some(scale as f32),
        causal: args.causal,
        kernel,
        window: window(args)?,
        softcap: args.softcap.unwrap_or(0.0),
        ..AttnParams::default()
    };
    // A backward family named concerns the backward only (the forward takes its default).
    let forward_kernel = kernel.filter(|f| !f.is_backward());
    let out = ctx.attention(qd.view(), kd.view(), vd.view(), &AttnParams { kernel: forward_kernel, ..params })?;
    let wide = |t: &DeviceTensor| -> Result<Vec<f64>> { Ok(t.to_f32(&ctx)?.into_iter().map(f64::from).collect()) };
    let grads = match dout {
        Some(g) => {
            let gd = up(g)?;
            // The backward's default kernels (bwd_sm90 on Hopper for its head dims, else
            // bwd_sm80), or the family named by `--kernel` if it is a backward one; a forward
            // family named concerns the forward only.
            let inputs =
                BwdInputs { q: qd.view(), k: kd.view(), v: vd.view(), o: out.o.view(), lse: LseView::of(&out.lse), dout: gd.view() };
            let g = ctx.attention_backward(&inputs, &params)?;
            Some([wide(&g.dq)?, wide(&g.dk)?, wide(&g.dv)?])
        }
        None => None,
    };
    let lse = ctx.stream().clone_dtoh(&out.lse)?.into_iter().take(shape.batch * shape.heads_q * shape.seqlen_q).map(f64::from).collect();
    Ok(Outputs { o: wide(&out.o)?, lse, grads })
}
