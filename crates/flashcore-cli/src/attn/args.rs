//! `flashcore attn`'s options, and the attention parameters and dtype they make.

use std::path::PathBuf;

use anyhow::{bail, Result};
use flashcore::{AttnParams, DType, KernelFamily, Window};

use crate::io::{FileDType, HostTensor};

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
    /// safetensors file to write `o` (input dtype; bf16 for F8_E4M3 inputs) and `lse` (f32)
    /// into, and `dq`, `dk`, `dv` (input dtype) when the input has `do`, `k_cache`, `v_cache`
    /// (input dtype) after a KV cache's append.
    #[arg(long)]
    pub(crate) output: PathBuf,
    /// Causal mask (bottom-right aligned).
    #[arg(long)]
    pub(crate) causal: bool,
    /// Softmax scale (default 1/sqrt(D)).
    #[arg(long, allow_hyphen_values = true)]
    pub(crate) scale: Option<f64>,
    /// Sliding window `LEFT,RIGHT` in keys around each query's (bottom-right aligned)
    /// diagonal, -1 for an unbounded side (flash_attn's window_size).
    #[arg(long, allow_hyphen_values = true)]
    pub(crate) window: Option<String>,
    /// Chunked attention (Llama 4, FlashAttention-3's attention_chunk): each query sees only
    /// the keys of the chunk of this many that holds its diagonal key (every GPU family, forward
    /// and backward, and the CPU reference).
    #[arg(long)]
    pub(crate) attention_chunk: Option<usize>,
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
    /// On the GPU, round the inputs to this dtype (f16, bf16, or e4m3: FP8, the forward on
    /// Hopper, its output bf16). Not with `--cpu`, whose reference computes in f64 from the
    /// file's values (an F8_E4M3 file's are exact).
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

/// The softmax scale: `--scale`, else 1/sqrt(D).
pub(crate) fn softmax_scale(args: &AttnArgs, head_dim: usize) -> f64 {
    args.scale.unwrap_or(1.0 / (head_dim as f64).sqrt())
}

/// The options as the library's parameters for head dim `head_dim` (`--causal`, `--window`,
/// `--attention-chunk`, `--softcap`, the scale and the family `--kernel` names), checked as every library call
/// checks them (`AttnParams::check`: the scale finite and >= 0, the window's sides, the
/// softcap), the error naming the flag typed. The f64 reference takes a scale and a mask
/// unchecked, so this check is what makes `--cpu` refuse what the GPU refuses (`--scale nan`
/// would write NaNs).
pub(crate) fn attn_params(args: &AttnArgs, head_dim: usize) -> Result<AttnParams> {
    let params = AttnParams {
        softmax_scale: Some(softmax_scale(args, head_dim) as f32),
        causal: args.causal,
        window: window(args)?,
        attention_chunk: args.attention_chunk.unwrap_or(0),
        softcap: args.softcap.unwrap_or(0.0),
        kernel: kernel(args)?,
        ..AttnParams::default()
    };
    params.check(head_dim).map_err(|e| match e {
        flashcore::Error::Param { arg, msg } => anyhow::anyhow!("{}: {msg}", flag_of_param(arg)),
        e => e.into(),
    })?;
    Ok(params)
}

/// The flag that sets the library parameter `arg` (as `AttnParams::check` names it).
fn flag_of_param(arg: &str) -> String {
    match arg {
        "softmax_scale" => "--scale".into(),
        "attention_chunk" => "--attention-chunk".into(),
        other => format!("--{other}"),
    }
}

/// The dtype the GPU runs: `--dtype`, else the file's (f16, bf16 or e4m3: FP8, the forward on
/// Hopper, its output bf16).
pub(crate) fn gpu_dtype(args: &AttnArgs, q: &HostTensor) -> Result<DType> {
    Ok(match (q.dtype, args.dtype.as_deref()) {
        (_, Some(name)) => DType::parse(name).ok_or_else(|| anyhow::anyhow!("--dtype must be f16, bf16 or e4m3, got {name:?}"))?,
        (FileDType::F16, None) => DType::F16,
        (FileDType::BF16, None) => DType::BF16,
        (FileDType::E4M3, None) => DType::E4M3,
        (other, None) => bail!("the GPU kernels take f16, bf16 or e4m3; the inputs are {other:?} (pass --dtype bf16, or --cpu)"),
    })
}

pub(crate) fn kernel(args: &AttnArgs) -> Result<Option<KernelFamily>> {
    match &args.kernel {
        Some(n) => Ok(Some(KernelFamily::parse(n).ok_or_else(|| anyhow::anyhow!("unknown kernel {n:?}"))?)),
        None => Ok(None),
    }
}
