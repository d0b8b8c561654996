//! `flashcore attn`: attention on tensors from a safetensors file, on the GPU or (`--cpu`)
//! with the f64 reference. The file's tensors pick the form: a KV cache (`k_cache`: `paged`),
//! a packed batch (`cu_seqlens_q`: `varlen`), else a dense batch (`dense`).

pub(crate) mod args;
mod dense;
mod paged;
mod tensors;
mod varlen;

use anyhow::Result;

pub use args::AttnArgs;

use crate::io::{read_kvcache, read_qkv, read_seqlens};

/// Runs the form the input file holds; each form reads `args.rs` (the options, checked as
/// the library's parameters) and `tensors.rs` (shapes, transfers), never this file.
pub fn run(args: &AttnArgs) -> Result<bool> {
    if let Some(kv) = read_kvcache(&args.input)? {
        return paged::run(args, &kv);
    }
    let (q, k, v) = read_qkv(&args.input)?;
    match read_seqlens(&args.input)? {
        Some(seqlens) => varlen::run(args, &q, &k, &v, &seqlens),
        None => dense::run(args, &q, &k, &v),
    }
}
