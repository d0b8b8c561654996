//! Attention over a KV cache (decode and chunked prefill): a paged pool with a block table,
//! or contiguous `[B, S_cache, Hkv, D]` caches, each sequence using its first
//! `cache_seqlens[b]` keys. Forward only, as in FlashAttention. New keys are written into the
//! cache by the caller beforehand (candle's `slice_set`, or the pages' own writes): candle
//! tensors are not written in place by an op.

use candle_core::backend::BackendStorage;
use candle_core::cuda_backend::CudaStorage;
use candle_core::{CpuStorage, DType, Layout, Result, Shape, Tensor};
use flashcore::{BlockTableView, FwdInputs, FwdOutputs, PackedQueries, PagedKv};

use crate::device::{self, Held, Output};
use crate::options::AttnOptions;

/// Where a cached sequence's keys are: see [`crate::attention_with_kvcache`].
#[derive(Debug, Clone, Default)]
pub struct KvCache {
    /// `[B]` u32 or i32: the keys each sequence has in the cache (`None`: the whole capacity).
    pub cache_seqlens: Option<Tensor>,
    /// `[B, max_pages]` u32 or i32: the pages of each sequence, in order (`None`: the caches
    /// are contiguous `[B, S_cache, Hkv, D]`); the pool is `[num_pages, page_size, Hkv, D]`
    /// with `page_size` a multiple of 16.
    pub block_table: Option<Tensor>,
}

/// The forward over a cache, as a candle op on `(q, k_cache, v_cache)`.
pub(crate) struct CacheOp {
    pub options: AttnOptions,
    pub cache: KvCache,
    /// Packed queries `[total_q, Hq, D]`: their cumulative lengths and the longest.
    pub packed_queries: Option<(Tensor, usize)>,
}

impl candle_core::CustomOp3 for CacheOp {
    fn name(&self) -> &'static str {
        "flashcore-attention-kvcache"
    }

    fn cpu_fwd(&self, _: &CpuStorage, _: &Layout, _: &CpuStorage, _: &Layout, _: &CpuStorage, _: &Layout) -> Result<(CpuStorage, Shape)> {
        crate::device::cpu_refused()
    }

    fn cuda_fwd(
        &self,
        q: &CudaStorage,
        q_l: &Layout,
        k: &CudaStorage,
        k_l: &Layout,
        v: &CudaStorage,
        v_l: &Layout,
    ) -> Result<(CudaStorage, Shape)> {
        let device = q.device();
        let ctx = device::context(device)?;
        let shape = q_l.shape().clone();
        let (qv, kv, vv) = (device::view("q", q, q_l)?, device::view("k_cache", k, k_l)?, device::view("v_cache", v, v_l)?);
        let seqlens = self.cache.cache_seqlens.as_ref().map(Held::of);
        let table = self.cache.block_table.as_ref().map(Held::of);
        let cu_q = self.packed_queries.as_ref().map(|(t, _)| Held::of(t));
        let alibi = self.options.alibi_slopes.as_ref().map(Held::of);
        let mut cache = PagedKv::default();
        if let (Some(h), Some(t)) = (&seqlens, &self.cache.cache_seqlens) {
            // SAFETY: a contiguous vector of `len` 4-byte values, read-locked for the call.
            cache.cache_seqlens = Some(unsafe { flashcore::SeqLensView::from_raw(h.address("cache_seqlens")?, t.elem_count()) });
        }
        if let (Some(h), Some(t)) = (&table, &self.cache.block_table) {
            let (rows, cols) = t.dims2()?;
            // SAFETY: `rows` rows of `cols` 4-byte entries, `stride[0]` apart, read-locked.
            cache.block_table = Some(unsafe { BlockTableView::from_raw(h.address("block_table")?, rows, cols, h.layout.stride()[0]) });
        }
        if let (Some(h), Some((t, max_seqlen_q))) = (&cu_q, &self.packed_queries) {
            // SAFETY: as `cache_seqlens`.
            let cu_seqlens_q = unsafe { flashcore::SeqLensView::from_raw(h.address("cu_seqlens_q")?, t.elem_count()) };
            cache.queries = Some(PackedQueries { cu_seqlens_q, max_seqlen_q: *max_seqlen_q });
        }
        let o = Output::alloc(device, q.dtype(), shape.elem_count())?;
        let o_view = o.view_mut(qv.layout().shape, qv.layout().dtype, qv.device());
        let alibi_slopes = match (&alibi, &self.options.alibi_slopes) {
            // SAFETY: a contiguous f32 vector, read-locked for the call.
            (Some(h), Some(t)) => Some(unsafe { flashcore::AlibiSlopes::from_raw(h.address("alibi_slopes")?, t.elem_count()) }),
            _ => None,
        };
        let inputs = FwdInputs { alibi_slopes, ..FwdInputs::paged(qv, kv, vv, cache) };
        let params = self.options.params(false);
        device::on_candle_stream(device, |caller| {
            // SAFETY: candle memory of this device, alive (borrowed, locked or owned here) until
            // the stream has run the call; the stream is candle's.
            unsafe { ctx.attention_on_stream(caller, &inputs, FwdOutputs { o: o_view, lse: None, probs: None }, &params) }
        })?;
        Ok((o.storage, shape))
    }
}

/// candle's cumulative key lengths `[B + 1]` as the lengths `[B]` a cache takes.
pub(crate) fn lengths_of(cu_seqlens: &Tensor) -> Result<Tensor> {
    let n = cu_seqlens.dim(0)?.saturating_sub(1);
    let lengths = (cu_seqlens.narrow(0, 1, n)? - cu_seqlens.narrow(0, 0, n)?)?;
    match lengths.dtype() {
        DType::U32 | DType::I32 => lengths.contiguous(),
        other => candle_core::bail!("flashcore: `seqlens_k` must be u32 or i32, got {other:?}"),
    }
}
