//! KV caches for serving: a paged cache (a block table over a pool of pages, as vLLM and
//! flash_attn's `flash_attn_with_kvcache`) or a contiguous one, each sequence with its own
//! cached length, and new keys appended before attention.
//!
//! # Layout
//! - `q [B, Sq, Hq, D]` and the output as for dense attention; `lse [B, Hq, Sq]`.
//! - Paged: `k_cache, v_cache [num_pages, page_size, Hkv, D]` (pages of `page_size` keys;
//!   other strides free as for dense tensors, the page stride a multiple of the row stride
//!   and the same in rows for both), `block_table [B, max_pages]` int32 on the device: key
//!   `j` of sequence `b` is row `j % page_size` of page `block_table[b, j / page_size]`.
//!   **Page sizes: every multiple of 16** (16, 32, 48, ..., 256 and beyond; the capacity
//!   `max_pages * page_size` and the pool's rows below 2^31).
//! - Contiguous (no block table): `k_cache, v_cache [B, S_cache, Hkv, D]`.
//! - `cache_seqlens [B]` int32 on the device: the keys each sequence holds before this call
//!   (flash_attn's `cache_seqlens`; the kernels read it as varlen's `seqused_k`). Absent, every
//!   sequence holds the whole capacity.
//! - Optional `k_new, v_new [B, S_new, Hkv, D]`: written into the caches at positions
//!   `cache_seqlens[b] .. cache_seqlens[b] + S_new` (through the block table) by a pre-pass on
//!   the same stream; attention then sees `cache_seqlens[b] + S_new` keys, and the causal mask
//!   and window are bottom-right aligned to them (query `i` of `Sq` sees key `j` iff `j <= i +
//!   cache_seqlens[b] + S_new - Sq`): chunked prefill with `Sq = S_new`, decode with `Sq = 1`.
//!   `cache_seqlens` is not modified: the caller advances it, as with flash_attn.
//!
//! Decode runs on fwd_sm80's paged forms (its split-KV kernel) on every arch; prefill and
//! chunked prefill on Hopper run on fwd_sm90's (TMA loads per page), elsewhere on fwd_sm80's:
//! the family a dense problem of the cache's capacity would take.
//!
//! # Speed, and where to put the pages
//! Decode is bound by DRAM bandwidth, and pages scattered over the pool cost some of it. On
//! the H100 (B8 Hq32/Hkv8 D128, 4k-128k keys, pages shuffled over the whole pool), decode
//! reads 0.93-0.96 of the contiguous cache's bandwidth at page 16, 0.95-0.96 at 64 and
//! 0.97-0.99 at 256. An allocator that hands out runs of consecutive pool pages recovers part
//! of the loss: runs of 16 measured 0.975 (page 16), 0.968 (64) and 0.989 (256). Larger pages
//! are faster to read; smaller ones waste less memory. Chunked prefill is bound by compute
//! and runs at 0.92-1.05 of the contiguous rate at every page size (the spread is the power
//! cap's clock). Measurements: `docs/kernels/fwd_sm80.md` (decode) and `docs/kernels/fwd_sm90.md` (chunked prefill).
//!
//! Decode shares out the key tiles of the whole batch in equal chunks, one a CTA, from the
//! lengths on the device (the host never reads `cache_seqlens`: that would synchronise), so a
//! batch of mixed lengths decodes about as fast as one of equal lengths. H100, Hq32/Hkv8 D128,
//! capacity 32k, lengths spread up to it: B16 2.88 TB/s (equal lengths 2.93), B32 2.97, B64
//! 3.02. [`crate::AttnParams::num_splits`] sets the chunks: B x query blocks x splits.
//!
//! # The caller's contract
//! The table and the lengths live on the device; reading them would synchronise. Every table
//! entry a sequence uses (slots `0 .. ceil((cache_seqlens[b] + S_new) / page_size)`) is in
//! `0 .. num_pages`, and `cache_seqlens[b] + S_new` is at most the capacity. The kernels
//! clamp both, so bad values give wrong output, never an access outside the pools or the
//! table. [`crate::Context::check_values`] checks them on the host (a debugging aid: it
//! copies them and synchronises) and names the first bad entry.
//!
//! # FlashInfer's page indexing
//! FlashInfer describes pages by `kv_indptr [B + 1]`, `kv_indices [nnz_pages]` and
//! `kv_last_page_len [B]`. The block-table form of the same cache: `block_table[b, s] =
//! kv_indices[kv_indptr[b] + s]` for `s < kv_indptr[b + 1] - kv_indptr[b]` (other entries
//! unused: fill with 0), `max_pages = max_b (kv_indptr[b + 1] - kv_indptr[b])`, and
//! `cache_seqlens[b] = (kv_indptr[b + 1] - kv_indptr[b] - 1) * page_size +
//! kv_last_page_len[b]` (0 for a sequence without pages). On the device that is one gather
//! (`torch.gather` of `kv_indices` at `kv_indptr[:-1, None] + arange(max_pages)`, clamped) and
//! O(B) arithmetic, with no synchronisation (Python: `flashcore.block_table_from_indptr`); FlashInfer's `[num_pages, 2, page_size, H, D]`
//! cache is `k_cache = cache[:, 0]`, `v_cache = cache[:, 1]` (page stride `2 * page_size`
//! rows). Its page size must be one of ours (a multiple of 16). FlashInfer's HND layout
//! (`[num_pages, Hkv, page_size, D]`) is the strided view `k_cache.transpose(1, 2)` (page
//! stride `Hkv * page_size` rows, head stride `page_size` rows): the kernels read it as they
//! read NHD, bit for bit the same output, and decode runs as fast over it (H100, within 1%).

use std::marker::PhantomData;

use cudarc::driver::{CudaSlice, DevicePtr};

use crate::error::{Error, Result};
use crate::shape::ProblemShape;
use crate::tensor::TensorView;
use crate::validate;
use crate::varlen::SeqLensView;

/// Page sizes are multiples of this (a kernel's 16-key groups never straddle two pages).
pub const PAGE_SIZE_MULTIPLE: usize = 16;

/// A borrowed `[B, max_pages]` int32 block table on the device (rows `row_stride` apart).
#[derive(Debug, Clone, Copy)]
pub struct BlockTableView<'a> {
    pub(crate) ptr: u64,
    pub(crate) batch: usize,
    pub(crate) max_pages: usize,
    pub(crate) row_stride: usize,
    _borrow: PhantomData<&'a ()>,
}

impl<'a> BlockTableView<'a> {
    /// `slice` as a contiguous `[batch, max_pages]` table.
    pub fn of(slice: &'a CudaSlice<i32>, batch: usize, max_pages: usize) -> Result<Self> {
        if batch * max_pages > slice.len() {
            let msg = format!("[{batch}, {max_pages}] needs {} entries, the slice has {}", batch * max_pages, slice.len());
            return Err(Error::Shape { arg: "block_table", msg });
        }
        let (ptr, _sync) = slice.device_ptr(slice.stream());
        Ok(Self { ptr, batch, max_pages, row_stride: max_pages, _borrow: PhantomData })
    }

    /// A view of caller-owned memory: `batch` rows of `max_pages` int32 entries, `row_stride`
    /// entries apart.
    ///
    /// # Safety
    /// `ptr` is device memory holding that many entries, which outlives the view's use.
    pub unsafe fn from_raw(ptr: u64, batch: usize, max_pages: usize, row_stride: usize) -> Self {
        Self { ptr, batch, max_pages, row_stride, _borrow: PhantomData }
    }

    /// Rows (sequences).
    pub fn batch(&self) -> usize {
        self.batch
    }

    /// Columns (page slots per sequence).
    pub fn max_pages(&self) -> usize {
        self.max_pages
    }
}

/// Packed queries over a paged cache (flash_attn's `flash_attn_varlen_func` with a
/// `block_table`: chunked prefill and decode rows of a serving batch in one launch): `q` and
/// the output `[1, total_q, Hq, D]`, sequence `b`'s queries rows `cu_seqlens_q[b] ..
/// cu_seqlens_q[b + 1]`, `lse [Hq, total_q]`; its keys the cache's (`cache_seqlens[b]` of them,
/// from key 0 of its table row). Runs on fwd_sm80's packed paged form (unsplit).
#[derive(Debug, Clone, Copy)]
pub struct PackedQueries<'a> {
    /// `[B + 1]` int32 on the device, from 0, rising, to `total_q`.
    pub cu_seqlens_q: SeqLensView<'a>,
    /// The longest sequence's queries (the grid's extent).
    pub max_seqlen_q: usize,
}

/// A KV cache as attention reads it (see the module's layout and contract): paged with a
/// block table, or contiguous without one; each sequence's cached length; new keys to
/// append first; or packed queries over it ([`PackedQueries`]).
#[derive(Debug, Clone, Copy, Default)]
pub struct PagedKv<'a> {
    /// The block table; `None`: `k_cache` and `v_cache` are contiguous `[B, S_cache, Hkv, D]`.
    pub block_table: Option<BlockTableView<'a>>,
    /// `[B]` int32: keys cached per sequence before this call; `None`: the whole capacity.
    pub cache_seqlens: Option<SeqLensView<'a>>,
    /// `[B, S_new, Hkv, D]`: keys appended at `cache_seqlens[b]..` before attention.
    pub k_new: Option<TensorView<'a>>,
    /// `[B, S_new, Hkv, D]`: the values of `k_new`'s keys.
    pub v_new: Option<TensorView<'a>>,
    /// Packed queries (a block table, and no new keys, with them); `None`: dense `q`.
    pub queries: Option<PackedQueries<'a>>,
}

/// A validated cache: the problem as the kernels see it (`seqlen_k` the capacity) and the
/// pool's geometry.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct CacheGeometry {
    pub shape: ProblemShape,
    /// 0 without a block table.
    pub page_size: usize,
    pub num_pages: usize,
    /// Pool rows from one page to the next.
    pub page_rows: usize,
    pub new_keys: usize,
    /// With packed queries, the rows of `q` (`shape` then has B sequences of the longest).
    pub total_q: Option<usize>,
}

impl PagedKv<'_> {
    /// Checks what the host can see (shapes, strides, dtypes, devices, alignment, page size,
    /// capacities) of the cache and its arguments against `q` and `o`.
    pub(crate) fn validate(&self, q: &TensorView, k: &TensorView, v: &TensorView, o: &TensorView, device: usize) -> Result<CacheGeometry> {
        for (arg, t) in [("q", q), ("o", o), ("k_cache", k), ("v_cache", v)] {
            validate::tensor(arg, t, device)?;
        }
        let [q_batch, q_rows, hq, d] = q.layout.shape;
        let [pages, rows, hkv, kd] = k.layout.shape;
        // (A call without queries never gets here: `FwdInputs::check`.)
        if let Some((arg, t)) = [("k_cache", k), ("v_cache", v)].into_iter().find(|(_, t)| t.layout.shape.contains(&0)) {
            return Err(shape_err(arg, format!("{:?} is empty: a cache holds at least one page of one row", t.layout.shape)));
        }
        // Packed queries: B sequences (the table's rows) of at most max_seqlen_q.
        let (b, sq, total_q) = match &self.queries {
            None => (q_batch, q_rows, None),
            Some(packed) => {
                let Some(table) = &self.block_table else {
                    let msg = "packed queries read a paged cache: a block table is required (without one, a packed batch)".into();
                    return Err(Error::Param { arg: "block_table", msg });
                };
                if q_batch != 1 {
                    return Err(shape_err("q", format!("{:?}: packed queries are [1, total_q, Hq, D]", q.layout.shape)));
                }
                if self.k_new.is_some() || self.v_new.is_some() {
                    return Err(Error::Param { arg: "k_new", msg: "packed queries append no keys".into() });
                }
                let cu = &packed.cu_seqlens_q;
                if cu.len != table.batch + 1 {
                    return Err(shape_err(
                        "cu_seqlens_q",
                        format!("{} entries, need B + 1 = {} (the block table's rows + 1)", cu.len, table.batch + 1),
                    ));
                }
                if cu.ptr == 0 || cu.ptr % 4 != 0 {
                    return Err(Error::Alignment { arg: "cu_seqlens_q", ptr: cu.ptr });
                }
                if packed.max_seqlen_q > i32::MAX as usize {
                    return Err(Error::Param { arg: "max_seqlen_q", msg: format!("{} does not fit int32", packed.max_seqlen_q) });
                }
                (table.batch, packed.max_seqlen_q, Some(q_rows))
            }
        };
        // Checked before `o`, which callers allocate with v_cache's head dim: the pools share
        // one (V's own head dim runs over dense keys alone).
        if v.layout.shape != k.layout.shape {
            return Err(shape_err(
                "v_cache",
                format!("{:?} differs from k_cache's {:?}: the pools share one geometry", v.layout.shape, k.layout.shape),
            ));
        }
        if o.layout.shape != q.layout.shape {
            return Err(shape_err("o", format!("{:?} differs from q's {:?}", o.layout.shape, q.layout.shape)));
        }
        if kd != d {
            return Err(shape_err("k_cache", format!("head dim {kd} differs from q's head dim {d}")));
        }
        if hq % hkv != 0 {
            return Err(shape_err("k_cache", format!("q heads ({hq}) are not a multiple of k/v heads ({hkv})")));
        }
        let dtype = q.layout.dtype;
        for (arg, t) in [("o", o), ("k_cache", k), ("v_cache", v)] {
            if t.layout.dtype != dtype {
                return Err(Error::DType { arg, msg: format!("{} differs from q's {dtype}", t.layout.dtype) });
            }
        }
        if b > 65535 || hq > 65535 || sq > i32::MAX as usize {
            return Err(shape_err("q", format!("batch {b} and heads {hq} must each be at most 65535, Sq below 2^31")));
        }
        let (capacity, page_size, page_rows) = match &self.block_table {
            Some(table) => {
                if table.batch != b {
                    return Err(shape_err("block_table", format!("{} rows, q's batch is {b}", table.batch)));
                }
                if table.max_pages == 0 {
                    return Err(shape_err("block_table", "has no columns".into()));
                }
                if table.ptr == 0 || table.ptr % 4 != 0 {
                    return Err(Error::Alignment { arg: "block_table", ptr: table.ptr });
                }
                if table.row_stride < table.max_pages && b > 1 {
                    return Err(Error::Stride {
                        arg: "block_table",
                        msg: format!("rows {} apart overlap {} columns", table.row_stride, table.max_pages),
                    });
                }
                if table.row_stride.max(table.max_pages).checked_mul(b).is_none_or(|n| n > i32::MAX as usize) {
                    return Err(shape_err("block_table", format!("{b} rows {} entries apart: over 2^31 entries", table.row_stride)));
                }
                if rows % PAGE_SIZE_MULTIPLE != 0 {
                    let msg = format!("page size {rows} (k_cache's dim 1) is not supported: every multiple of {PAGE_SIZE_MULTIPLE} is");
                    return Err(Error::Param { arg: "page_size", msg });
                }
                let [page_stride, row_stride, _, _] = k.layout.strides;
                let page_rows = |t: &TensorView| {
                    let [ps, rs, _, _] = t.layout.strides;
                    (rs > 0 && ps % rs == 0).then_some(ps / rs)
                };
                let Some(k_rows) = page_rows(k).filter(|_| pages == 1 || page_stride > 0) else {
                    let msg = format!("the page stride {page_stride} must be a multiple of the row stride {row_stride}");
                    return Err(Error::Stride { arg: "k_cache", msg });
                };
                if pages > 1 && page_rows(v) != Some(k_rows) {
                    let msg = format!("pages {:?} rows apart, k_cache's {k_rows}: the two pools must share one geometry", page_rows(v));
                    return Err(Error::Stride { arg: "v_cache", msg });
                }
                let capacity = table.max_pages.checked_mul(rows).filter(|&c| c <= i32::MAX as usize);
                let pool_rows = pages.checked_mul(k_rows.max(rows)).filter(|&r| r <= i32::MAX as usize);
                let (Some(capacity), Some(_)) = (capacity, pool_rows) else {
                    let msg = format!("{} pages of {rows} keys a sequence, {pages} pages in the pool: over 2^31 rows", table.max_pages);
                    return Err(shape_err("block_table", msg));
                };
                (capacity, rows, k_rows)
            }
            None => {
                if pages != b {
                    return Err(shape_err(
                        "k_cache",
                        format!("batch {pages} differs from q's batch {b} (a contiguous cache: no block table)"),
                    ));
                }
                if rows > i32::MAX as usize {
                    return Err(shape_err("k_cache", "cache length must be below 2^31".into()));
                }
                (rows, 0, 0)
            }
        };
        if let Some(lens) = &self.cache_seqlens {
            if lens.len != b {
                return Err(shape_err("cache_seqlens", format!("{} entries, need B = {b}", lens.len)));
            }
            if lens.ptr == 0 || lens.ptr % 4 != 0 {
                return Err(Error::Alignment { arg: "cache_seqlens", ptr: lens.ptr });
            }
        }
        let new_keys = match (&self.k_new, &self.v_new) {
            (None, None) => 0,
            (Some(_), None) => return Err(Error::Param { arg: "v_new", msg: "missing: k_new and v_new come together".into() }),
            (None, Some(_)) => return Err(Error::Param { arg: "k_new", msg: "missing: k_new and v_new come together".into() }),
            (Some(kn), Some(vn)) => {
                for (arg, t) in [("k_new", kn), ("v_new", vn)] {
                    validate::tensor(arg, t, device)?;
                    if t.layout.shape.contains(&0) {
                        return Err(shape_err(arg, format!("{:?} is empty: pass no new keys instead", t.layout.shape)));
                    }
                    if t.layout.dtype != dtype {
                        return Err(Error::DType { arg, msg: format!("{} differs from the cache's {dtype}", t.layout.dtype) });
                    }
                }
                let [nb, s_new, nh, nd] = kn.layout.shape;
                if [nb, nh, nd] != [b, hkv, d] {
                    return Err(shape_err("k_new", format!("{:?}, need [B, S_new, Hkv, D] = [{b}, S_new, {hkv}, {d}]", kn.layout.shape)));
                }
                if vn.layout.shape != kn.layout.shape {
                    return Err(shape_err("v_new", format!("{:?} differs from k_new's {:?}", vn.layout.shape, kn.layout.shape)));
                }
                if s_new > capacity {
                    return Err(shape_err("k_new", format!("{s_new} new keys, the cache holds at most {capacity} a sequence")));
                }
                // flash_attn's refusal of a cache too small for the call (host-visible, no
                // synchronisation): appending, q's rows must fit the capacity. Whether
                // cache_seqlens[b] + S_new fits is a device value: `Context::check_values`.
                if sq > capacity {
                    let (arg, what) =
                        if self.block_table.is_some() { ("block_table", "max_pages · page_size") } else { ("k_cache", "its length") };
                    return Err(shape_err(
                        arg,
                        format!("holds {capacity} keys a sequence ({what}), fewer than q's {sq} rows with keys appended"),
                    ));
                }
                if self.cache_seqlens.is_none() {
                    return Err(Error::Param { arg: "cache_seqlens", msg: "required with k_new: where the new keys go".into() });
                }
                s_new
            }
        };
        let shape = ProblemShape { batch: b, seqlen_q: sq, seqlen_k: capacity, heads_q: hq, heads_kv: hkv, head_dim: d, head_dim_v: d };
        Ok(CacheGeometry { shape, page_size, num_pages: pages, page_rows, new_keys, total_q })
    }
}

/// Checks a cache's device values held on the host (see the module's contract): `table`
/// `[B, max_pages]` row-major (`None` for a contiguous cache), `cache_seqlens` `[B]` (`None`:
/// every sequence full), for a pool of `num_pages` pages of `page_size` keys (a contiguous
/// cache: 0 pages of its length), a capacity of `capacity` keys a sequence and `new_keys`
/// appended. The error names the argument and the first bad entry.
pub fn check_values(
    table: Option<&[i32]>,
    cache_seqlens: Option<&[i32]>,
    (page_size, num_pages): (usize, usize),
    (batch, capacity): (usize, usize),
    new_keys: usize,
) -> Result<()> {
    let lens: Vec<i64> = match cache_seqlens {
        Some(l) => l.iter().map(|&x| x as i64).collect(),
        None => vec![capacity as i64 - new_keys as i64; batch],
    };
    for (b, &len) in lens.iter().enumerate() {
        if len < 0 || len + new_keys as i64 > capacity as i64 {
            let msg = format!("entry {b} is {len}: with {new_keys} new keys the cache holds at most {capacity}");
            return Err(Error::Param { arg: "cache_seqlens", msg });
        }
    }
    let Some(table) = table else { return Ok(()) };
    let max_pages = capacity / page_size.max(1);
    for (b, &len) in lens.iter().enumerate() {
        let used = (len as usize + new_keys).div_ceil(page_size);
        let row = &table[b * max_pages..b * max_pages + used];
        if let Some((s, &page)) = row.iter().enumerate().find(|&(_, &p)| p < 0 || p as usize >= num_pages) {
            let msg = format!("entry [{b}, {s}] is {page}: a used slot must name a page in 0..{num_pages}");
            return Err(Error::Param { arg: "block_table", msg });
        }
    }
    Ok(())
}

fn shape_err(arg: &'static str, msg: String) -> Error {
    Error::Shape { arg, msg }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tensor::{DType, Layout};

    fn view(shape: [usize; 4]) -> TensorView<'static> {
        // SAFETY: never dereferenced (validation reads layouts and addresses only).
        unsafe { TensorView::from_raw(0x10000, Layout::contiguous(shape, DType::BF16), 0) }
    }

    fn table(batch: usize, max_pages: usize) -> BlockTableView<'static> {
        // SAFETY: never dereferenced.
        unsafe { BlockTableView::from_raw(0x2000, batch, max_pages, max_pages) }
    }

    fn lens(n: usize) -> SeqLensView<'static> {
        // SAFETY: never dereferenced.
        unsafe { SeqLensView::from_raw(0x3000, n) }
    }

    fn arg(r: Result<CacheGeometry>) -> &'static str {
        match r {
            Err(Error::Shape { arg, .. } | Error::Param { arg, .. } | Error::DType { arg, .. } | Error::Stride { arg, .. }) => arg,
            Err(Error::Alignment { arg, .. }) => arg,
            other => panic!("expected a named error, got {other:?}"),
        }
    }

    #[test]
    fn a_paged_decode_problem_has_the_capacity_as_its_key_count() {
        let q = view([3, 1, 8, 128]);
        let pool = view([40, 16, 2, 128]);
        let kv = PagedKv { block_table: Some(table(3, 10)), cache_seqlens: Some(lens(3)), ..PagedKv::default() };
        let g = kv.validate(&q, &pool, &pool, &q, 0).unwrap();
        assert_eq!(g.shape, ProblemShape { batch: 3, seqlen_q: 1, seqlen_k: 160, heads_q: 8, heads_kv: 2, head_dim: 128, head_dim_v: 128 });
        assert_eq!((g.page_size, g.num_pages, g.page_rows, g.new_keys), (16, 40, 16, 0));
        // Contiguous: the cache's own length.
        let cache = view([3, 1000, 2, 128]);
        let g = PagedKv { block_table: None, ..kv }.validate(&q, &cache, &cache, &q, 0).unwrap();
        assert_eq!(g.shape.seqlen_k, 1000);
    }

    #[test]
    fn bad_arguments_are_named() {
        let q = view([3, 4, 8, 64]);
        let pool = view([40, 16, 2, 64]);
        let kv = PagedKv { block_table: Some(table(3, 10)), cache_seqlens: Some(lens(3)), ..PagedKv::default() };
        let check = |kv: PagedKv, k: &TensorView| arg(kv.validate(&q, k, k, &q, 0));
        assert_eq!(check(PagedKv { block_table: Some(table(2, 10)), ..kv }, &pool), "block_table");
        assert_eq!(check(kv, &view([40, 24, 2, 64])), "page_size");
        assert_eq!(check(PagedKv { cache_seqlens: Some(lens(4)), ..kv }, &pool), "cache_seqlens");
        assert_eq!(check(kv, &view([40, 16, 3, 64])), "k_cache");
        let new = view([3, 5, 2, 64]);
        assert_eq!(check(PagedKv { k_new: Some(new), ..kv }, &pool), "v_new");
        assert_eq!(check(PagedKv { k_new: Some(view([3, 5, 1, 64])), v_new: Some(new), ..kv }, &pool), "k_new");
        assert_eq!(check(PagedKv { k_new: Some(new), v_new: Some(view([3, 6, 2, 64])), ..kv }, &pool), "v_new");
        assert_eq!(check(PagedKv { k_new: Some(view([3, 161, 2, 64])), v_new: Some(view([3, 161, 2, 64])), ..kv }, &pool), "k_new");
        assert_eq!(check(PagedKv { k_new: Some(new), v_new: Some(new), cache_seqlens: None, ..kv }, &pool), "cache_seqlens");
        // Appending, q's rows must fit the cache's capacity (flash_attn refuses it as well).
        let (tall, short_table) =
            (view([3, 40, 8, 64]), PagedKv { block_table: Some(table(3, 2)), k_new: Some(new), v_new: Some(new), ..kv });
        assert_eq!(arg(short_table.validate(&tall, &pool, &pool, &tall, 0)), "block_table");
        let short_cache = view([3, 32, 2, 64]);
        assert_eq!(arg(PagedKv { block_table: None, ..short_table }.validate(&tall, &short_cache, &short_cache, &tall, 0)), "k_cache");
        // SAFETY: never dereferenced.
        let f16 = unsafe { TensorView::from_raw(0x10000, Layout::contiguous([3, 5, 2, 64], DType::F16), 0) };
        assert!(matches!(
            PagedKv { k_new: Some(f16), v_new: Some(new), ..kv }.validate(&q, &pool, &pool, &q, 0),
            Err(Error::DType { arg: "k_new", .. })
        ));
        assert!(PagedKv { k_new: Some(new), v_new: Some(new), ..kv }.validate(&q, &pool, &pool, &q, 0).is_ok());
        // Contiguous: the cache's batch is q's.
        assert_eq!(check(PagedKv { block_table: None, ..kv }, &view([2, 100, 2, 64])), "k_cache");
    }

    #[test]
    fn every_multiple_of_16_is_a_page_size() {
        let q = view([1, 1, 8, 128]);
        let kv = PagedKv { block_table: Some(table(1, 4)), ..PagedKv::default() };
        for page in (16..=512).step_by(16) {
            let pool = view([8, page, 2, 128]);
            assert_eq!(kv.validate(&q, &pool, &pool, &q, 0).unwrap().page_size, page);
        }
        for page in [8, 17, 100, 250] {
            let pool = view([8, page, 2, 128]);
            assert_eq!(arg(kv.validate(&q, &pool, &pool, &q, 0)), "page_size");
        }
    }

    #[test]
    fn device_values_are_checked_and_the_first_bad_entry_named() {
        let param = |r: Result<()>| match r {
            Err(Error::Param { arg, msg }) => (arg, msg),
            other => panic!("expected a parameter error, got {other:?}"),
        };
        // 2 sequences, 3 slots of 16 keys, a pool of 5 pages; unused slots may hold anything.
        let table = [4, 0, -7, 2, 3, 99];
        assert!(check_values(Some(&table), Some(&[20, 31]), (16, 5), (2, 48), 1).is_ok());
        let (arg, msg) = param(check_values(Some(&table), Some(&[33, 47]), (16, 5), (2, 48), 0));
        assert!(arg == "block_table" && msg.contains("[0, 2]"), "{msg}");
        let (arg, msg) = param(check_values(Some(&[4, 0, 1, 2, 5, 1]), Some(&[1, 20]), (16, 5), (2, 48), 0));
        assert!(arg == "block_table" && msg.contains("[1, 1]"), "{msg}");
        assert_eq!(param(check_values(Some(&table), Some(&[20, 48]), (16, 5), (2, 48), 1)).0, "cache_seqlens");
        assert_eq!(param(check_values(None, Some(&[-1, 3]), (0, 0), (2, 100), 0)).0, "cache_seqlens");
        assert!(check_values(None, None, (0, 0), (2, 100), 0).is_ok());
    }
}
