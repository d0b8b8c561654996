//! `flashcore attn`: attention on tensors from a safetensors file, on the GPU or (`--cpu`)
//! with the f64 reference.

mod paged;

use std::path::PathBuf;

use anyhow::{bail, Result};
use flashcore::{
    reference, AttnParams, BwdInputs, Context, DType, DeviceTensor, KernelFamily, LseView, ProblemShape, SeqLensView, VarlenBatch, Window,
};

use crate::io::{read_dout, read_kvcache, read_qkv, read_seqlens, write_tensors, FileDType, HostSeqlens, HostTensor};

#[derive(clap::Args)]
pub struct AttnArgs {
    /// safetensors file with `q`, `k`, `v` (BSHD; f16, bf16 or f32) and optionally `do`, the
    /// gradient of a loss with respect to `o` (shaped and typed like `q`). A packed (varlen)
    /// batch: `q [total_q, Hq, D]`, `k, v [total_k, Hkv, D]` with int32 `cu_seqlens_q`,
    /// `cu_seqlens_k` (`[B + 1]`) and optionally `seqused_k` (`[B]`); it writes `o` like `q`
    /// and `lse [Hq, total_q]` (and, with `do`, `dq` like `q`, `dk`, `dv` like `k`). A KV cache
    /// (flash_attn's `flash_attn_with_kvcache`): `q [B, Sq, Hq, D]`, `k_cache`, `v_cache` pools
    /// `[num_pages, page_size, Hkv, D]` with an int32 `block_table [B, max_pages]` (without it,
    /// contiguous caches `[B, S_cache, Hkv, D]`), optionally int32 `cache_seqlens [B]` and
    /// `k_new`, `v_new [B, S_new, Hkv, D]` appended at `cache_seqlens[b]..` first; it writes `o`,
    /// `lse [B, Hq, Sq]` and, after an append, the caches `k_cache`, `v_cache`.
    #[arg(long)]
    pub(crate) input: PathBuf,
    /// safetensors file to write `o` (input dtype) and `lse` (f32) into, and `dq`, `dk`, `dv`
    /// (input dtype) when the input has `do`, `k_cache`, `v_cache` (input dtype) after a KV
    /// cache's append.
    #[arg(long)]
    pub(crate) output: PathBuf,
    /// Causal mask (bottom-right aligned).
    #[arg(long)]
    pub(crate) causal: bool,
    /// Softmax scale (default 1/sqrt(D)).
    #[arg(long)]
    pub(crate) scale: Option<f64>,
    /// Sliding window `LEFT,RIGHT` in keys around each query's (bottom-right aligned)
    /// diagonal, -1 for an unbounded side (flash_attn's window_size).
    #[arg(long, allow_hyphen_values = true)]
    pub(crate) window: Option<String>,
    /// Logit softcap: scores become softcap * tanh(score / softcap).
    #[arg(long, allow_hyphen_values = true)]
    pub(crate) softcap: Option<f32>,
    /// Force a kernel family on the GPU.
    #[arg(long, conflicts_with = "cpu")]
    pub(crate) kernel: Option<String>,
    /// Use the f64 CPU reference (no GPU needed).
    #[arg(long)]
    pub(crate) cpu: bool,
    /// Write every output as f64 (with --cpu: the reference's full precision).
    #[arg(long)]
    pub(crate) f64_out: bool,
    /// On the GPU, round f32 inputs to this dtype (f16 or bf16).
    #[arg(long)]
    pub(crate) dtype: Option<String>,
}

/// `--window LEFT,RIGHT` (none: unbounded).
pub(crate) fn window(args: &AttnArgs) -> Result<Window> {
    parse_window(args.window.as_deref())
}

/// A `--window LEFT,RIGHT` argument (`attn`, `bench`); none is unbounded.
pub fn parse_window(text: Option<&str>) -> Result<Window> {
    let Some(text) = text else { return Ok(Window::UNBOUNDED) };
    match text.split(',').map(|x| x.trim().parse::<i32>()).collect::<Vec<_>>()[..] {
        [Ok(left), Ok(right)] => Ok(Window::new(left, right)),
        _ => bail!("--window takes LEFT,RIGHT (integers, -1 unbounded), got {text:?}"),
    }
}

pub(crate) fn shape4(t: &HostTensor, name: &str) -> Result<[usize; 4]> {
    match t.shape[..] {
        [b, s, h, d] => Ok([b, s, h, d]),
        _ => bail!("`{name}` must be rank 4 [B, S, H, D], got {:?}", t.shape),
    }
}

pub fn run(args: &AttnArgs) -> Result<bool> {
    if let Some(kv) = read_kvcache(&args.input)? {
        return paged::run(args, &kv);
    }
    let (q, k, v) = read_qkv(&args.input)?;
    if let Some(seqlens) = read_seqlens(&args.input)? {
        return run_packed(args, &q, &k, &v, &seqlens);
    }
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
    let mods = mods(args)?;
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
    let dtype = gpu_dtype(args, q)?;
    let ctx = Context::new(0)?;
    let up = |t: &HostTensor| upload(&ctx, t, dtype);
    let (qd, kd, vd) = (up(q)?, up(k)?, up(v)?);
    let params = gpu_params(args, scale)?;
    // A backward family named concerns the backward only (the forward takes its default).
    let forward_kernel = params.kernel.filter(|f| !f.is_backward());
    let out = ctx.attention(qd.view(), kd.view(), vd.view(), &AttnParams { kernel: forward_kernel, ..params })?;
    let wide = |t: &DeviceTensor| download(&ctx, t);
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

/// A packed batch (`cu_seqlens_q`, `cu_seqlens_k` and optionally `seqused_k` in the file,
/// int32; `q [total_q, Hq, D]`, `k, v [total_k, Hkv, D]`): `o` like `q` and `lse [Hq,
/// total_q]`, and with `do` the gradients (zero for keys no query sees, past seqused_k
/// included). The vectors are checked first (`Context::check_varlen`'s checks; on the host
/// with `--cpu`), by name.
fn run_packed(args: &AttnArgs, q: &HostTensor, k: &HostTensor, v: &HostTensor, seqlens: &HostSeqlens) -> Result<bool> {
    let ([qb, total_q, hq, d], [kb, total_k, hkv, kd]) = (shape4(q, "q")?, shape4(k, "k")?);
    if k.shape != v.shape || qb != 1 || kb != 1 || kd != d || hkv == 0 || hq % hkv != 0 {
        bail!(
            "shapes do not form a packed problem: q {:?}, k {:?}, v {:?} (need [total, H, D], k = v, same D, Hq % Hkv == 0)",
            q.shape,
            k.shape,
            v.shape
        );
    }
    let dout = read_dout(&args.input, q)?;
    let (cu_q, cu_k) = (&seqlens.cu_seqlens_q, &seqlens.cu_seqlens_k);
    let keys: Vec<usize> = match &seqlens.seqused_k {
        Some(used) => used.iter().map(|&u| u.max(0) as usize).collect(),
        None => cu_k.windows(2).map(|w| (w[1] - w[0]).max(0) as usize).collect(),
    };
    let queries: Vec<usize> = cu_q.windows(2).map(|w| (w[1] - w[0]).max(0) as usize).collect();
    let max = (queries.iter().copied().max().unwrap_or(0), keys.iter().copied().max().unwrap_or(0));
    let scale = args.scale.unwrap_or(1.0 / (d as f64).sqrt());
    let mods = mods(args)?;
    let out = if args.cpu {
        flashcore::check_varlen_values(cu_q, cu_k, seqlens.seqused_k.as_deref(), (total_q, total_k), max)?;
        let mask = reference::RefMask::of(&mods);
        let mut o = Vec::with_capacity(total_q * hq * d);
        let mut lse = vec![f64::NEG_INFINITY; hq * total_q];
        let mut grads = dout.as_ref().map(|_| [vec![0.0; total_q * hq * d], vec![0.0; total_k * hkv * d], vec![0.0; total_k * hkv * d]]);
        for (b, (&sq, &sk)) in queries.iter().zip(&keys).enumerate() {
            let (q0, k0) = (cu_q[b] as usize, cu_k[b] as usize);
            let shape = ProblemShape { batch: 1, seqlen_q: sq, seqlen_k: sk, heads_q: hq, heads_kv: hkv, head_dim: d };
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
        gpu_packed(args, [q, k, v], dout.as_ref(), seqlens, max, scale)?
    };
    let data_dtype = if args.f64_out { FileDType::F64 } else { q.dtype };
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

fn gpu_packed(
    args: &AttnArgs,
    [q, k, v]: [&HostTensor; 3],
    dout: Option<&HostTensor>,
    seqlens: &HostSeqlens,
    max: (usize, usize),
    scale: f64,
) -> Result<Outputs> {
    let dtype = gpu_dtype(args, q)?;
    let ctx = Context::new(0)?;
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
    ctx.check_varlen(&batch, q.shape[1], k.shape[1])?;
    let params = gpu_params(args, scale)?;
    // As `gpu`: a backward family named concerns the backward only.
    let out = ctx.attention_varlen(
        qd.view(),
        kd.view(),
        vd.view(),
        &batch,
        &AttnParams { kernel: params.kernel.filter(|f| !f.is_backward()), ..params },
    )?;
    let wide = |t: &DeviceTensor| download(&ctx, t);
    let grads = match dout {
        Some(g) => {
            let gd = up(g)?;
            let inputs =
                BwdInputs { q: qd.view(), k: kd.view(), v: vd.view(), o: out.o.view(), lse: LseView::of(&out.lse), dout: gd.view() };
            let g = ctx.attention_varlen_backward(&inputs, &batch, &params)?;
            Some([wide(&g.dq)?, wide(&g.dk)?, wide(&g.dv)?])
        }
        None => None,
    };
    let lse = ctx.stream().clone_dtoh(&out.lse)?.into_iter().take(q.shape[2] * q.shape[1]).map(f64::from).collect();
    Ok(Outputs { o: wide(&out.o)?, lse, grads })
}

/// The mask and score options (`--causal`, `--window`, `--softcap`), checked.
pub(crate) fn mods(args: &AttnArgs) -> Result<AttnParams> {
    let mods = AttnParams { causal: args.causal, window: window(args)?, softcap: args.softcap.unwrap_or(0.0), ..AttnParams::default() };
    mods.check_window_and_softcap()?;
    Ok(mods)
}

/// A GPU run's parameters: the options, `scale`, and the family `--kernel` names.
pub(crate) fn gpu_params(args: &AttnArgs, scale: f64) -> Result<AttnParams> {
    Ok(AttnParams { softmax_scale: Some(scale as f32), kernel: kernel(args)?, ..mods(args)? })
}

/// `t` on the GPU in `dtype` (its values rounded to nearest).
pub(crate) fn upload(ctx: &Context, t: &HostTensor, dtype: DType) -> Result<DeviceTensor> {
    let data: Vec<f32> = t.data.iter().map(|&x| x as f32).collect();
    Ok(DeviceTensor::from_f32(ctx, &data, shape4(t, "tensor")?, dtype)?)
}

/// `t`'s values, widened to f64.
pub(crate) fn download(ctx: &Context, t: &DeviceTensor) -> Result<Vec<f64>> {
    Ok(t.to_f32(ctx)?.into_iter().map(f64::from).collect())
}

/// The dtype the GPU runs: `--dtype`, else the file's (f16 or bf16).
pub(crate) fn gpu_dtype(args: &AttnArgs, q: &HostTensor) -> Result<DType> {
    Ok(match (q.dtype, args.dtype.as_deref()) {
        (_, Some("bf16")) => DType::BF16,
        (_, Some("f16")) => DType::F16,
        (_, Some(other)) => bail!("--dtype must be f16 or bf16, got {other:?}"),
        (FileDType::F16, None) => DType::F16,
        (FileDType::BF16, None) => DType::BF16,
        (other, None) => bail!("the GPU kernels take f16 or bf16; the inputs are {other:?} (pass --dtype bf16, or --cpu)"),
    })
}

pub(crate) fn kernel(args: &AttnArgs) -> Result<Option<KernelFamily>> {
    match &args.kernel {
        Some(n) => Ok(Some(KernelFamily::parse(n).ok_or_else(|| anyhow::anyhow!("unknown kernel {n:?}"))?)),
        None => Ok(None),
    }
}
