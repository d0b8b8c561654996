//! # flashcore-candle
//!
//! FlashCore's attention kernels as [candle](https://github.com/huggingface/candle) ops on
//! CUDA tensors: forward **and backward** (through candle's autograd: `loss.backward()` runs
//! FlashCore's backward kernels), packed (varlen) batches, KV caches, sliding windows,
//! softcap, ALiBi, GQA/MQA; Hopper kernels on H100/H200 and the Ampere-class kernels
//! elsewhere. Kernels are compiled by NVRTC on first use and cached: no nvcc for FlashCore
//! (candle itself builds its own kernels with nvcc).
//!
//! ```no_run
//! # fn main() -> candle_core::Result<()> {
//! use candle_core::{DType, Device, Tensor};
//! use flashcore_candle::{attention, AttnOptions};
//! let dev = Device::new_cuda(0)?;
//! let q = Tensor::randn(0f32, 1., (2, 1024, 16, 128), &dev)?.to_dtype(DType::BF16)?; // [B, S, H, D]
//! let k = Tensor::randn(0f32, 1., (2, 1024, 4, 128), &dev)?.to_dtype(DType::BF16)?;  // GQA: 4 KV heads
//! let v = Tensor::randn(0f32, 1., (2, 1024, 4, 128), &dev)?.to_dtype(DType::BF16)?;
//! let o = attention(&q, &k, &v, &AttnOptions::causal())?;
//! // candle-flash-attn's spelling works too:
//! let o2 = flashcore_candle::flash_attn(&q, &k, &v, 1.0 / (128f32).sqrt(), true)?;
//! # Ok(()) }
//! ```
//!
//! Shapes are candle-flash-attn's: `q [B, Sq, Hq, D]`, `k, v [B, Sk, Hkv, D]` (packed:
//! `[total, H, D]` with cumulative lengths `[B + 1]`), bf16 or f16 on a CUDA device, any
//! strides with a contiguous last dim. Every call runs on the tensors' candle device and
//! stream (the device's primary context, as candle's), allocates its outputs and scratch
//! from candle's device and never synchronises. Bad input is a candle error naming the
//! argument.
//!
//! The functions named as candle-flash-attn's ([`flash_attn`], [`flash_attn_varlen`], ...)
//! take its arguments with its semantics; [`attention`], [`attention_varlen`] and
//! [`attention_with_kvcache`] take an [`AttnOptions`] instead of a function name per
//! combination. The crate `candle-flash-attn` in this workspace re-exports the former, so
//! that `[patch.crates-io]` runs candle-transformers' models on FlashCore unchanged.
#![deny(missing_docs)]

mod api;
mod check;
pub mod compat;
mod device;
mod kvcache;
mod op;
mod options;

pub use api::{attention, attention_varlen, attention_varlen_with_kvcache, attention_with_kvcache, attention_with_lse, VarlenSeqs};
pub use compat::*;
/// The core crate, built with the CUDA linking mode candle needs: use it from here rather than
/// as a second dependency with its default features (cudarc refuses the two modes in one build).
pub use flashcore;
pub use flashcore::KernelFamily;
pub use kvcache::KvCache;
pub use options::AttnOptions;
