"""FlashInfer's page indexing in flash_attn's block-table form, on the device."""

from __future__ import annotations

from typing import Optional, Tuple

import torch
from torch import Tensor


def block_table_from_indptr(
    kv_indptr: Tensor, kv_indices: Tensor, kv_last_page_len: Tensor, page_size: int, max_pages: Optional[int] = None
) -> Tuple[Tensor, Tensor]:
    """FlashInfer's paged-cache description as `flash_attn_with_kvcache`'s `(block_table,
    cache_seqlens)`, by torch ops on the tensors' device.

    Args:
        kv_indptr: int32 or int64 `[B + 1]`: sequence b's pages are `kv_indices[kv_indptr[b] :
            kv_indptr[b + 1]]`, in order.
        kv_indices: int `[nnz_pages]`: page numbers in the pool.
        kv_last_page_len: int `[B]`: the keys in sequence b's last page (1..page_size).
        page_size: the pool's page size (a multiple of 16 for FlashCore's kernels).
        max_pages: the block table's columns: at least every sequence's page count (a
            serving engine's per-sequence page limit, say). Given, the call queues O(B ·
            max_pages) device work and never synchronises; None reads the largest page count
            from `kv_indptr` (one device-to-host copy: a synchronisation).

    Returns:
        `block_table` int32 `[B, max_pages]` (`block_table[b, s] = kv_indices[kv_indptr[b] + s]`
        for the sequence's pages, 0 in the slots after them, which are never read) and
        `cache_seqlens` int32 `[B]`: `(pages - 1) * page_size + kv_last_page_len[b]`, 0 for a
        sequence without pages.

    A FlashInfer cache `[num_pages, 2, page_size, H, D]` is `k_cache = cache[:, 0]`, `v_cache =
    cache[:, 1]` (views; no copy). A `max_pages` below some sequence's page count truncates
    its row: `FLASHCORE_CHECK_PAGED=1` then names `cache_seqlens` (beyond the capacity).
    """
    indptr = kv_indptr.long()
    pages = indptr[1:] - indptr[:-1]
    if max_pages is None:
        max_pages = max(int(pages.max()), 1) if pages.numel() else 1
    slots = torch.arange(max_pages, device=indptr.device)
    used = slots[None, :] < pages[:, None]
    if kv_indices.numel() == 0:
        table = torch.zeros(used.shape, dtype=torch.int32, device=indptr.device)
    else:
        at = (indptr[:-1, None] + slots[None, :]).clamp_(max=kv_indices.numel() - 1)
        table = torch.where(used, torch.take(kv_indices, at), 0).to(torch.int32)
    cache_seqlens = torch.where(pages > 0, (pages - 1) * page_size + kv_last_page_len.long(), 0).to(torch.int32)
    return table, cache_seqlens
