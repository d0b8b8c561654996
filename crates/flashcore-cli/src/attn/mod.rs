//! `flashcore attn`: attention on tensors from a safetensors file, on the GPU or (`--cpu`)
//! with the f64 reference. The file's tensors pick the form: a KV cache (`k_cache`: `paged`),
//! a packed batch (`cu_seqlens_q`: `varlen`), else a dense batch (`dense`).

pub(crate) mod args;
mod dense;
mod paged;
mod tensors;
mod varlen;

use anyhow::{bail, Result};

pub use args::AttnArgs;

use crate::io::{read_kvcache, read_qkv, read_seqlens};

/// Runs the form the input file holds; each form reads `args.rs` (the options, checked as
/// the library's parameters) and `tensors.rs` (shapes, transfers), never this file.
pub fn run(args: &AttnArgs) -> Result<bool> {
    refuse_output_over_input(args)?;
    if let (true, Some(dtype)) = (args.cpu, &args.dtype) {
        bail!("--dtype {dtype} rounds the GPU's inputs, but --cpu computes in f64 from the file's values: drop one of them");
    }
    if let Some(kv) = read_kvcache(&args.input)? {
        return paged::run(args, &kv);
    }
    let (q, k, v) = read_qkv(&args.input)?;
    match read_seqlens(&args.input)? {
        Some(seqlens) => varlen::run(args, &q, &k, &v, &seqlens),
        None => dense::run(args, &q, &k, &v),
    }
}

/// `--output` naming the `--input` file (under any spelling of its path) would overwrite the
/// input with the results: refused before anything is read.
fn refuse_output_over_input(args: &AttnArgs) -> Result<()> {
    if let (Ok(input), Ok(output)) = (args.input.canonicalize(), args.output.canonicalize()) {
        if input == output {
            bail!("--output {} is the --input file: write the results to another path", args.output.display());
        }
    }
    Ok(())
}
