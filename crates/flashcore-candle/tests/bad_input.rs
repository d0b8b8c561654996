//! Bad input is a candle error naming the argument, before any GPU work: these run without a
//! GPU (CI's machine), on CPU tensors where the shape or dtype is wrong before the device is.

use candle_core::{DType, Device, Tensor};
use flashcore_candle::{attention, attention_varlen, attention_with_kvcache, flash_attn, AttnOptions, KvCache, VarlenSeqs};

fn zeros(shape: &[usize], dtype: DType) -> Tensor {
    Tensor::zeros(shape, dtype, &Device::Cpu).unwrap()
}

/// Asserts that `result` is an error whose text names `arg`.
fn names<T: std::fmt::Debug>(result: candle_core::Result<T>, arg: &str) {
    let err = result.expect_err("bad input must be an error").to_string();
    assert!(err.contains(&format!("`{arg}`")), "the error should name `{arg}`: {err}");
}

#[test]
fn cpu_tensors_are_refused_naming_q() {
    let t = zeros(&[1, 8, 2, 64], DType::BF16);
    names(attention(&t, &t, &t, &AttnOptions::default()), "q");
    names(flash_attn(&t, &t, &t, 0.125, true), "q");
}

#[test]
fn f32_inputs_are_refused_naming_the_argument() {
    let q = zeros(&[1, 8, 2, 64], DType::F32);
    names(attention(&q, &q, &q, &AttnOptions::default()), "q");
    let (q16, k32) = (zeros(&[1, 8, 2, 64], DType::BF16), zeros(&[1, 8, 2, 64], DType::F32));
    names(attention(&q16, &k32, &q16, &AttnOptions::default()), "k");
}

#[test]
fn mismatched_shapes_are_refused_naming_the_argument() {
    let q = zeros(&[2, 8, 4, 64], DType::BF16);
    names(attention(&q, &zeros(&[2, 8, 4, 32], DType::BF16), &zeros(&[2, 8, 4, 32], DType::BF16), &AttnOptions::default()), "k");
    names(attention(&q, &zeros(&[2, 8, 3, 64], DType::BF16), &zeros(&[2, 8, 3, 64], DType::BF16), &AttnOptions::default()), "k");
    names(attention(&q, &zeros(&[1, 8, 4, 64], DType::BF16), &zeros(&[1, 8, 4, 64], DType::BF16), &AttnOptions::default()), "k");
    names(attention(&q, &q, &zeros(&[2, 9, 4, 64], DType::BF16), &AttnOptions::default()), "v");
    names(attention(&zeros(&[8, 4, 64], DType::BF16), &q, &q, &AttnOptions::default()), "q");
}

#[test]
fn a_non_contiguous_last_dim_is_refused_naming_the_argument() {
    let q = zeros(&[1, 8, 4, 64], DType::BF16);
    let k = zeros(&[1, 8, 64, 4], DType::BF16).transpose(2, 3).unwrap(); // last-dim stride 4
    names(attention(&q, &k, &k, &AttnOptions::default()), "k");
}

#[test]
fn varlen_and_cache_arguments_are_checked_by_name() {
    let q = zeros(&[10, 4, 64], DType::BF16);
    let cu = Tensor::new(&[0u32, 4, 10], &Device::Cpu).unwrap();
    let seqs = |cu_k: Tensor| VarlenSeqs { cu_seqlens_q: cu.clone(), cu_seqlens_k: cu_k, max_seqlen_q: 6, max_seqlen_k: 6 };
    names(attention_varlen(&q, &q, &q, &seqs(Tensor::new(&[0u32, 10], &Device::Cpu).unwrap()), &AttnOptions::default()), "cu_seqlens_k");
    names(
        attention_varlen(&q, &q, &q, &seqs(Tensor::new(&[0f32, 4., 10.], &Device::Cpu).unwrap()), &AttnOptions::default()),
        "cu_seqlens_k",
    );
    let q4 = zeros(&[2, 1, 4, 64], DType::BF16);
    let pool = zeros(&[4, 16, 4, 64], DType::BF16);
    let cache = KvCache { cache_seqlens: Some(Tensor::new(&[3u32], &Device::Cpu).unwrap()), block_table: None };
    names(attention_with_kvcache(&q4, &pool, &pool, &cache, &AttnOptions::default()), "cache_seqlens");
    names(
        attention_with_kvcache(&q4, &pool, &zeros(&[4, 16, 2, 64], DType::BF16), &KvCache::default(), &AttnOptions::default()),
        "v_cache",
    );
}

#[test]
fn alibi_slopes_are_checked_by_name() {
    let q = zeros(&[2, 8, 4, 64], DType::BF16);
    let options = AttnOptions { alibi_slopes: Some(zeros(&[3], DType::F32)), ..AttnOptions::default() };
    names(attention(&q, &q, &q, &options), "alibi_slopes");
    let options = AttnOptions { alibi_slopes: Some(zeros(&[4], DType::BF16)), ..AttnOptions::default() };
    names(attention(&q, &q, &q, &options), "alibi_slopes");
}

#[test]
fn learnable_sinks_are_checked_by_name() {
    let q = zeros(&[2, 8, 4, 64], DType::BF16);
    for sinks in [zeros(&[3], DType::F32), zeros(&[2, 4], DType::F32), zeros(&[4], DType::BF16)] {
        let options = AttnOptions { learnable_sink: Some(sinks), ..AttnOptions::default() };
        names(attention(&q, &q, &q, &options), "learnable_sink");
    }
}
