//! Times a Llama-style model from candle-transformers (random weights, 4 layers, hidden 2048,
//! 16 query heads and 4 KV heads of D128, bf16) with FlashCore's attention and with candle's
//! own, and the attention alone at that shape (candle's as the model runs it, in f32; candle's
//! in bf16 throughout; FlashCore's), for prompts of 512 to 8192 tokens:
//!
//! ```sh
//! cargo run --release --example llama [-- 512,2048,8192]
//! ```
//!
//! Method: each row is the mean of `reps` calls queued back to back after 3 warm-up calls,
//! between two device synchronisations (host wall time; the two sides alternate in rounds).

use std::time::Instant;

use candle_core::{DType, Device, Result, Tensor};
use candle_transformers::models::llama::Cache;
use flashcore_candle::AttnOptions;
use flashcore_candle_llama::{config, Weights};

/// The mean time of `f` in milliseconds over `reps` calls after 3 warm-up calls.
fn time_ms(dev: &Device, reps: usize, mut f: impl FnMut() -> Result<Tensor>) -> Result<f64> {
    for _ in 0..3 {
        f()?;
    }
    dev.synchronize()?;
    let start = Instant::now();
    for _ in 0..reps {
        f()?;
    }
    dev.synchronize()?;
    Ok(start.elapsed().as_secs_f64() * 1e3 / reps as f64)
}

/// Attention as candle-transformers' Llama computes it without flash attention: KV heads
/// repeated, f32 matmul, causal mask, softmax, matmul, back to bf16 (`q` `[B, H, S, D]`).
fn candle_llama_attention(q: &Tensor, k: &Tensor, v: &Tensor, mask: &Tensor) -> Result<Tensor> {
    let (b, hq, s, d) = q.dims4()?;
    let hkv = k.dim(1)?;
    let repeat = |t: &Tensor| t.unsqueeze(2)?.broadcast_as((b, hkv, hq / hkv, s, d))?.reshape((b, hq, s, d));
    let (q, k, v) = (q.to_dtype(DType::F32)?, repeat(k)?.to_dtype(DType::F32)?, repeat(v)?.to_dtype(DType::F32)?);
    let att = (q.matmul(&k.t()?)? / (d as f64).sqrt())?;
    let neg = Tensor::new(f32::NEG_INFINITY, q.device())?.broadcast_as(att.shape())?;
    let att = mask.broadcast_as(att.shape())?.where_cond(&neg, &att)?;
    candle_nn::ops::softmax_last_dim(&att)?.matmul(&v.contiguous()?)?.to_dtype(DType::BF16)
}

/// The same in bf16 throughout (no f32 upcast): candle's fastest plain attention.
fn candle_bf16_attention(q: &Tensor, k: &Tensor, v: &Tensor, mask: &Tensor) -> Result<Tensor> {
    let (b, hq, s, d) = q.dims4()?;
    let hkv = k.dim(1)?;
    let repeat = |t: &Tensor| t.unsqueeze(2)?.broadcast_as((b, hkv, hq / hkv, s, d))?.reshape((b, hq, s, d));
    let (k, v) = (repeat(k)?, repeat(v)?);
    let att = (q.matmul(&k.t()?)? / (d as f64).sqrt())?;
    let neg = Tensor::new(f32::NEG_INFINITY, q.device())?.to_dtype(DType::BF16)?.broadcast_as(att.shape())?;
    let att = mask.broadcast_as(att.shape())?.where_cond(&neg, &att)?;
    candle_nn::ops::softmax_last_dim(&att)?.matmul(&v)
}

fn main() -> Result<()> {
    let lengths: Vec<usize> = match std::env::args().nth(1) {
        Some(arg) => arg.split(',').map(|s| s.parse().expect("comma-separated lengths")).collect(),
        None => vec![512, 1024, 2048, 4096, 8192],
    };
    let dev = Device::new_cuda(0)?;
    let (hidden, layers, heads, kv_heads) = (2048, 4, 16, 4);
    let (cfg_plain, cfg_flash) = (config(hidden, layers, heads, kv_heads, false), config(hidden, layers, heads, kv_heads, true));
    let weights = Weights::random(&cfg_plain, &dev, 1)?;
    let plain = weights.load(&cfg_plain, DType::BF16, &dev)?;
    let flash = weights.load(&cfg_flash, DType::BF16, &dev)?;
    let d = hidden / heads;
    println!(
        "Llama-style: {layers} layers, hidden {hidden}, {heads} query heads / {kv_heads} KV heads, D{d}, bf16, batch 1, causal prefill"
    );
    println!(
        "{:>6} | {:>12} {:>12} {:>12} {:>7} | {:>12} {:>12} {:>7}",
        "S", "attn f32 ms", "attn bf16 ms", "attn fc ms", "x bf16", "model ms", "model fc ms", "x"
    );
    for &s in &lengths {
        let reps = (16384 / s).clamp(3, 20);
        let q = Tensor::randn(0f32, 1.0, (1, heads, s, d), &dev)?.to_dtype(DType::BF16)?;
        let k = Tensor::randn(0f32, 1.0, (1, kv_heads, s, d), &dev)?.to_dtype(DType::BF16)?;
        let v = Tensor::randn(0f32, 1.0, (1, kv_heads, s, d), &dev)?.to_dtype(DType::BF16)?;
        let mask: Vec<u8> = (0..s).flat_map(|i| (0..s).map(move |j| u8::from(j > i))).collect();
        let mask = Tensor::from_vec(mask, (s, s), &dev)?;
        // FlashCore reads [B, S, H, D] views of the same tensors (no copy), as the model passes them.
        let (qt, kt, vt) = (q.transpose(1, 2)?, k.transpose(1, 2)?, v.transpose(1, 2)?);
        let prompt = Tensor::rand(0f32, 1024.0, (1, s), &dev)?.to_dtype(DType::U32)?;
        let forward = |model: &candle_transformers::models::llama::Llama, cfg| -> Result<Tensor> {
            let mut cache = Cache::new(false, DType::BF16, cfg, &dev)?;
            model.forward(&prompt, 0, &mut cache)
        };
        let (mut attn, mut model) = ([0.0f64; 3], [0.0f64; 2]);
        for _round in 0..2 {
            attn[0] += time_ms(&dev, reps, || candle_llama_attention(&q, &k, &v, &mask))?;
            attn[1] += time_ms(&dev, reps, || candle_bf16_attention(&q, &k, &v, &mask))?;
            attn[2] += time_ms(&dev, reps, || flashcore_candle::attention(&qt, &kt, &vt, &AttnOptions::causal()))?;
            model[0] += time_ms(&dev, reps.min(5), || forward(&plain, &cfg_plain))?;
            model[1] += time_ms(&dev, reps.min(5), || forward(&flash, &cfg_flash))?;
        }
        let (attn, model) = (attn.map(|t| t / 2.0), model.map(|t| t / 2.0));
        println!(
            "{s:>6} | {:>12.3} {:>12.3} {:>12.3} {:>6.1}x | {:>12.3} {:>12.3} {:>6.2}x",
            attn[0],
            attn[1],
            attn[2],
            attn[1] / attn[2],
            model[0],
            model[1],
            model[0] / model[1]
        );
    }
    Ok(())
}
