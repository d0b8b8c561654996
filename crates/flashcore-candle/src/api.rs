//! The entry points with an [`AttnOptions`]: dense, packed, with the LSE, over a KV cache.
//! Each checks its arguments (shapes and dtypes, then devices) and applies one op.

use candle_core::{Result, Tensor};

use crate::check;
use crate::kvcache::{CacheOp, KvCache};
use crate::op::{AttnOp, Packing};
use crate::options::AttnOptions;

/// A packed batch's sequence bounds (flash_attn's varlen arguments).
#[derive(Debug, Clone)]
pub struct VarlenSeqs {
    /// `[B + 1]` u32 or i32: the first query row of each sequence, then `total_q`.
    pub cu_seqlens_q: Tensor,
    /// `[B + 1]` u32 or i32: the first key of each sequence, then `total_k`.
    pub cu_seqlens_k: Tensor,
    /// The longest sequence's query count.
    pub max_seqlen_q: usize,
    /// The longest sequence's key count.
    pub max_seqlen_k: usize,
}

/// Whether autograd tracks any of these tensors (then the op keeps its log-sum-exp).
fn tracked(ts: &[&Tensor]) -> bool {
    ts.iter().any(|t| t.track_op())
}

/// Checks the options' tensors against `q` (`batch` sequences, `heads` query heads), then
/// that `q` and `others` are on one CUDA device with them.
fn check_options_and_devices(
    q: &Tensor,
    options: &AttnOptions,
    batch: usize,
    heads: usize,
    others: &[(&str, Option<&Tensor>)],
) -> Result<()> {
    if let Some(slopes) = &options.alibi_slopes {
        check::alibi_slopes(slopes, batch, heads)?;
    }
    if let Some(sinks) = &options.learnable_sink {
        check::learnable_sink(sinks, heads)?;
    }
    let mut all = others.to_vec();
    all.push(("alibi_slopes", options.alibi_slopes.as_ref()));
    all.push(("learnable_sink", options.learnable_sink.as_ref()));
    check::devices(q, &all)
}

/// Attention over dense batches: `q [B, Sq, Hq, D]`, `k, v [B, Sk, Hkv, D]` → `[B, Sq, Hq, D]`,
/// differentiable in `q`, `k` and `v`.
pub fn attention(q: &Tensor, k: &Tensor, v: &Tensor, options: &AttnOptions) -> Result<Tensor> {
    check::qkv(q, k, v, false)?;
    check_options_and_devices(q, options, q.dims()[0], q.dims()[2], &[("k", Some(k)), ("v", Some(v))])?;
    q.apply_op3(k, v, AttnOp::new(options.clone(), Packing::Dense, tracked(&[q, k, v])))
}

/// The forward alone, with its log-sum-exp: `(o [B, Sq, Hq, D], lse [B, Hq, Sq] f32)`, natural
/// log (`-inf` for a row that sees no key). Outside autograd: for merging partial results
/// (split keys, ring attention) by their LSEs.
pub fn attention_with_lse(q: &Tensor, k: &Tensor, v: &Tensor, options: &AttnOptions) -> Result<(Tensor, Tensor)> {
    check::qkv(q, k, v, false)?;
    check_options_and_devices(q, options, q.dims()[0], q.dims()[2], &[("k", Some(k)), ("v", Some(v))])?;
    forward_with_lse(q, k, v, AttnOp::new(options.clone(), Packing::Dense, false))
}

/// Runs `op`'s forward on `(q, k, v)`: its output and log-sum-exp.
fn forward_with_lse(q: &Tensor, k: &Tensor, v: &Tensor, op: AttnOp) -> Result<(Tensor, Tensor)> {
    let (qs, ks, vs) = (q.storage_and_layout(), k.storage_and_layout(), v.storage_and_layout());
    let (candle_core::Storage::Cuda(qc), candle_core::Storage::Cuda(kc), candle_core::Storage::Cuda(vc)) = (&*qs.0, &*ks.0, &*vs.0) else {
        candle_core::bail!("flashcore: `q`, `k` and `v` must be on a CUDA device")
    };
    let (o, shape, lse) = op.forward((qc, qs.1), (kc, ks.1), (vc, vs.1))?;
    let o = Tensor::from_storage(candle_core::Storage::Cuda(o), shape, candle_core::op::BackpropOp::none(), false);
    Ok((o, lse))
}

/// Attention over a packed batch: `q [total_q, Hq, D]`, `k, v [total_k, Hkv, D]`, sequence `b`
/// rows `cu_seqlens_q[b]..cu_seqlens_q[b + 1]` of `q` against rows
/// `cu_seqlens_k[b]..cu_seqlens_k[b + 1]` of `k` and `v`; differentiable in `q`, `k` and `v`.
/// The lengths are device values: a batch that breaks their contract (rising from 0 to the
/// totals, no sequence longer than the maxima) gives wrong output, never an access outside
/// the tensors.
pub fn attention_varlen(q: &Tensor, k: &Tensor, v: &Tensor, seqs: &VarlenSeqs, options: &AttnOptions) -> Result<Tensor> {
    check::qkv(q, k, v, true)?;
    check::index_vector("cu_seqlens_q", &seqs.cu_seqlens_q, None)?;
    let batch = seqs.cu_seqlens_q.dims()[0].saturating_sub(1);
    check::index_vector("cu_seqlens_k", &seqs.cu_seqlens_k, Some(batch + 1))?;
    let others = [("k", Some(k)), ("v", Some(v)), ("cu_seqlens_q", Some(&seqs.cu_seqlens_q)), ("cu_seqlens_k", Some(&seqs.cu_seqlens_k))];
    check_options_and_devices(q, options, batch, q.dims()[1], &others)?;
    let packing = Packing::Varlen {
        cu_seqlens_q: seqs.cu_seqlens_q.clone(),
        cu_seqlens_k: seqs.cu_seqlens_k.clone(),
        max_seqlen_q: seqs.max_seqlen_q,
        max_seqlen_k: seqs.max_seqlen_k,
    };
    q.apply_op3(k, v, AttnOp::new(options.clone(), packing, tracked(&[q, k, v])))
}

/// Attention of `q [B, Sq, Hq, D]` over a KV cache (see [`KvCache`]): `k_cache`, `v_cache` the
/// pools `[num_pages, page_size, Hkv, D]` with a block table, or `[B, S_cache, Hkv, D]`
/// without one. Forward only (the result is outside autograd).
pub fn attention_with_kvcache(q: &Tensor, k_cache: &Tensor, v_cache: &Tensor, cache: &KvCache, options: &AttnOptions) -> Result<Tensor> {
    check::rank("q", q, 4, "[batch, seqlen, heads, head_dim]")?;
    check_cache(q, k_cache, v_cache, cache, q.dims()[0])?;
    check_options_and_devices(q, options, q.dims()[0], q.dims()[2], &cache_tensors(k_cache, v_cache, cache, None))?;
    q.apply_op3_no_bwd(k_cache, v_cache, &CacheOp { options: options.clone(), cache: cache.clone(), packed_queries: None })
}

/// Checks a cache's tensors against `q` (`batch` sequences).
fn check_cache(q: &Tensor, k_cache: &Tensor, v_cache: &Tensor, cache: &KvCache, batch: usize) -> Result<()> {
    check::rank("k_cache", k_cache, 4, "[pages or batch, page_size or seqlen, heads, head_dim]")?;
    if k_cache.dims() != v_cache.dims() {
        candle_core::bail!("flashcore: `v_cache` must be shaped as `k_cache` {:?}, it is {:?}", k_cache.dims(), v_cache.dims())
    }
    for (arg, t) in [("q", q), ("k_cache", k_cache), ("v_cache", v_cache)] {
        check::attention_input(arg, t, q)?;
    }
    if let Some(lengths) = &cache.cache_seqlens {
        check::index_vector("cache_seqlens", lengths, Some(batch))?;
    }
    if let Some(table) = &cache.block_table {
        if !matches!(table.dtype(), candle_core::DType::U32 | candle_core::DType::I32) {
            candle_core::bail!("flashcore: `block_table` must be u32 or i32, got {:?}", table.dtype())
        }
        check::rank("block_table", table, 2, "[batch, max_pages]")?;
        check::last_dim_contiguous("block_table", table)?;
    }
    Ok(())
}

/// A cache call's tensors besides `q`, for the device check.
fn cache_tensors<'a>(
    k_cache: &'a Tensor,
    v_cache: &'a Tensor,
    cache: &'a KvCache,
    cu_seqlens_q: Option<&'a Tensor>,
) -> [(&'static str, Option<&'a Tensor>); 5] {
    [
        ("k_cache", Some(k_cache)),
        ("v_cache", Some(v_cache)),
        ("cache_seqlens", cache.cache_seqlens.as_ref()),
        ("block_table", cache.block_table.as_ref()),
        ("cu_seqlens_q", cu_seqlens_q),
    ]
}

/// Packed queries over a paged cache (chunked prefill and decode rows of a serving batch in one
/// call): `q [total_q, Hq, D]`, sequence `b`'s queries rows `cu_seqlens_q[b]..cu_seqlens_q[b + 1]`,
/// its keys the first `cache.cache_seqlens[b]` of its pages. Forward only.
pub fn attention_varlen_with_kvcache(
    q: &Tensor,
    k_cache: &Tensor,
    v_cache: &Tensor,
    cu_seqlens_q: &Tensor,
    max_seqlen_q: usize,
    cache: &KvCache,
    options: &AttnOptions,
) -> Result<Tensor> {
    check::rank("q", q, 3, "[total_q, heads, head_dim]")?;
    check::index_vector("cu_seqlens_q", cu_seqlens_q, None)?;
    let batch = cu_seqlens_q.dims()[0].saturating_sub(1);
    check_cache(q, k_cache, v_cache, cache, batch)?;
    if cache.block_table.is_none() {
        candle_core::bail!("flashcore: `block_table` is required for packed queries over a cache")
    }
    check_options_and_devices(q, options, batch, q.dims()[1], &cache_tensors(k_cache, v_cache, cache, Some(cu_seqlens_q)))?;
    let op = CacheOp { options: options.clone(), cache: cache.clone(), packed_queries: Some((cu_seqlens_q.clone(), max_seqlen_q)) };
    q.apply_op3_no_bwd(k_cache, v_cache, &op)
}
