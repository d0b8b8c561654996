//! A small Llama from candle-transformers with random weights (config in code, nothing
//! downloaded), loadable with FlashCore's attention (candle-transformers' `flash-attn`
//! feature, answered by this workspace's candle-flash-attn stand-in) or with candle's own
//! (matmul + masked softmax), on the same weights in bf16 or f32; and plain attention as
//! candle computes it, the reference the ops are checked against.

use std::collections::HashMap;

use candle_core::{DType, Device, Result, Tensor, D};
use candle_nn::{VarBuilder, VarMap};
use candle_transformers::models::llama::{Cache, Config, Llama};

/// A Llama-style config: GQA (`heads / kv_heads` query heads a KV head), head dim
/// `hidden / heads`.
pub fn config(hidden: usize, layers: usize, heads: usize, kv_heads: usize, use_flash_attn: bool) -> Config {
    Config {
        hidden_size: hidden,
        intermediate_size: hidden * 8 / 3 / 64 * 64,
        vocab_size: 1024,
        num_hidden_layers: layers,
        num_attention_heads: heads,
        num_key_value_heads: kv_heads,
        use_flash_attn,
        rms_norm_eps: 1e-5,
        rope_theta: 10_000.0,
        bos_token_id: None,
        eos_token_id: None,
        rope_scaling: None,
        max_position_embeddings: 16_384,
        tie_word_embeddings: false,
    }
}

/// One set of random weights (f32, seeded on the device), to load as either model in any dtype.
pub struct Weights {
    tensors: HashMap<String, Tensor>,
}

impl Weights {
    /// Random weights for `cfg` on `device` (candle's default initialisers: Kaiming-normal
    /// linears, unit-normal embeddings, unit norms).
    pub fn random(cfg: &Config, device: &Device, seed: u64) -> Result<Self> {
        device.set_seed(seed)?;
        let varmap = VarMap::new();
        Llama::load(VarBuilder::from_varmap(&varmap, DType::F32, device), cfg)?;
        let tensors = varmap.data().lock().unwrap().iter().map(|(name, var)| (name.clone(), var.as_tensor().clone())).collect();
        Ok(Self { tensors })
    }

    /// The model of `cfg` (its `use_flash_attn` picks the attention) on these weights in `dtype`.
    pub fn load(&self, cfg: &Config, dtype: DType, device: &Device) -> Result<Llama> {
        let tensors = self.tensors.iter().map(|(n, t)| Ok((n.clone(), t.to_dtype(dtype)?))).collect::<Result<HashMap<_, _>>>()?;
        Llama::load(VarBuilder::from_tensors(tensors, dtype, device), cfg)
    }
}

/// Greedy decoding: the prompt's next-token logits (f32, `[B, vocab]`), then `steps` tokens a
/// step with a KV cache; returns each step's logits and the tokens picked.
pub fn greedy(model: &Llama, cfg: &Config, prompt: &Tensor, steps: usize, dtype: DType) -> Result<(Vec<Tensor>, Vec<Vec<u32>>)> {
    let mut cache = Cache::new(true, dtype, cfg, prompt.device())?;
    let mut logits = model.forward(prompt, 0, &mut cache)?;
    let (mut all_logits, mut tokens) = (Vec::new(), Vec::new());
    let prompt_len = prompt.dim(1)?;
    for step in 0..steps {
        let next = logits.argmax(D::Minus1)?;
        tokens.push(next.to_vec1::<u32>()?);
        all_logits.push(logits.clone());
        logits = model.forward(&next.unsqueeze(1)?, prompt_len + step, &mut cache)?;
    }
    Ok((all_logits, tokens))
}

/// What plain attention computes: the scale, masks and score transforms of an
/// [`flashcore_candle::AttnOptions`], spelled out for candle's own ops.
#[derive(Debug, Clone, Default)]
pub struct Plain {
    /// Multiplies `q·k`.
    pub scale: f64,
    /// Causal mask, bottom-right aligned.
    pub causal: bool,
    /// Sliding window `(left, right)` around the bottom-right diagonal (`None`: unbounded).
    pub window: (Option<usize>, Option<usize>),
    /// Logit softcap.
    pub softcap: Option<f64>,
    /// ALiBi slopes, one a query head.
    pub alibi: Option<Vec<f32>>,
}

/// Attention as candle computes it without FlashCore (matmul, mask, softmax, matmul; GQA by
/// repeating the KV heads) in the inputs' dtype: `q [B, Sq, Hq, D]`, `k, v [B, Sk, Hkv, D]`.
/// Every query row must see a key (a row that sees none is NaN here, 0 in FlashCore).
pub fn plain_attention(q: &Tensor, k: &Tensor, v: &Tensor, p: &Plain) -> Result<Tensor> {
    let (_, sq, hq, _) = q.dims4()?;
    let (_, sk, hkv, _) = k.dims4()?;
    let dev = q.device();
    let repeat = |t: &Tensor| -> Result<Tensor> {
        let t = t.transpose(1, 2)?.contiguous()?; // [B, Hkv, S, D]
        let (b, h, s, d) = t.dims4()?;
        t.unsqueeze(2)?.broadcast_as((b, h, hq / hkv, s, d))?.reshape((b, hq, s, d))
    };
    let q = q.transpose(1, 2)?.contiguous()?;
    let (k, v) = (repeat(k)?, repeat(v)?);
    let mut scores = (q.matmul(&k.t()?)? * p.scale)?;
    if let Some(cap) = p.softcap {
        scores = ((scores / cap)?.tanh()? * cap)?;
    }
    // Key j relative to query i's bottom-right diagonal.
    let rel = |i: usize, j: usize| j as i64 - (i + sk) as i64 + sq as i64;
    if let Some(slopes) = &p.alibi {
        let bias: Vec<f32> =
            (0..hq).flat_map(|h| (0..sq).flat_map(move |i| (0..sk).map(move |j| -slopes[h] * rel(i, j).abs() as f32))).collect();
        let bias = Tensor::from_vec(bias, (1, hq, sq, sk), dev)?.to_dtype(scores.dtype())?;
        scores = scores.broadcast_add(&bias)?;
    }
    let (left, right) = (p.window.0.map(|n| n as i64), if p.causal { Some(0) } else { p.window.1.map(|n| n as i64) });
    if left.is_some() || right.is_some() {
        let hidden = |r: i64| left.is_some_and(|l| r < -l) || right.is_some_and(|rt| r > rt);
        let mask: Vec<u8> = (0..sq).flat_map(|i| (0..sk).map(move |j| u8::from(hidden(rel(i, j))))).collect();
        let mask = Tensor::from_vec(mask, (sq, sk), dev)?.broadcast_as(scores.shape())?;
        let neg = Tensor::new(f32::NEG_INFINITY, dev)?.to_dtype(scores.dtype())?.broadcast_as(scores.shape())?;
        scores = mask.where_cond(&neg, &scores)?;
    }
    // candle_nn's softmax with a backward (softmax_last_dim has none).
    let probs = candle_nn::ops::softmax(&scores, D::Minus1)?;
    probs.matmul(&v)?.transpose(1, 2)?.contiguous()
}

/// The largest absolute difference between two tensors, in f32.
pub fn max_abs_diff(a: &Tensor, b: &Tensor) -> Result<f32> {
    (a.to_dtype(DType::F32)? - b.to_dtype(DType::F32)?)?.abs()?.flatten_all()?.max(0)?.to_scalar::<f32>()
}

/// The root-mean-square difference between two tensors, in f32.
pub fn rms_diff(a: &Tensor, b: &Tensor) -> Result<f32> {
    (a.to_dtype(DType::F32)? - b.to_dtype(DType::F32)?)?.sqr()?.mean_all()?.sqrt()?.to_scalar::<f32>()
}
