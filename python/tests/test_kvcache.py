"""flash_attn_with_kvcache: paged caches (shuffled, non-contiguous, non-monotonic page tables,
page sizes 16/64/256) and contiguous ones, appends across page boundaries, decode and
chunked prefill, against the float64 reference per sequence (gather, then attend); bitwise
against the same data in a contiguous cache; torch.compile; bad input (named errors)."""

from __future__ import annotations

import pytest
import torch

import flashcore
from helpers import check_against_reference, randn, reference

LENGTHS = [1, 15, 16, 17, 1000, 4097]


class Cache:
    """Sequences' keys and values in a paged pool (pages shuffled, the rest NaN) and in a
    contiguous cache of the same capacity (max_pages * page_size)."""

    def __init__(self, lens, new, hkv, d, page, dtype, seed=0):
        self.lens, self.new, self.page = lens, new, page
        total = [n + new for n in lens]
        self.keys = [randn(1, t, hkv, d, dtype=dtype, seed=seed + 2 * i) for i, t in enumerate(total)]
        self.values = [randn(1, t, hkv, d, dtype=dtype, seed=seed + 2 * i + 1) for i, t in enumerate(total)]
        used = [-(-t // page) for t in total]
        self.max_pages = max(used) + 1
        num_pages = sum(used) + 3
        ids = torch.randperm(num_pages, generator=torch.Generator().manual_seed(seed + page)).tolist()
        table = torch.full((len(lens), self.max_pages), -1, dtype=torch.int32)
        for b, n in enumerate(used):
            table[b, :n] = torch.tensor(ids[:n], dtype=torch.int32)
            ids = ids[n:]
        self.block_table = table.cuda()
        nan = float("nan")
        self.k_pool = torch.full((num_pages, page, hkv, d), nan, dtype=dtype, device="cuda")
        self.v_pool = torch.full_like(self.k_pool, nan)
        cap = self.max_pages * page
        self.k_flat = torch.full((len(lens), cap, hkv, d), nan, dtype=dtype, device="cuda")
        self.v_flat = torch.full_like(self.k_flat, nan)
        for b, n in enumerate(lens):
            for j in range(n):
                p = table[b, j // page].item()
                self.k_pool[p, j % page] = self.keys[b][0, j]
                self.v_pool[p, j % page] = self.values[b][0, j]
            self.k_flat[b, :n] = self.keys[b][0, :n]
            self.v_flat[b, :n] = self.values[b][0, :n]
        self.cache_seqlens = torch.tensor(lens, dtype=torch.int32, device="cuda")
        self.k_new = torch.cat([k[:, n:] for k, n in zip(self.keys, lens)]) if new else None
        self.v_new = torch.cat([v[:, n:] for v, n in zip(self.values, lens)]) if new else None


@pytest.mark.parametrize("page", [16, 64, 256])
@pytest.mark.parametrize("d", [64, 128])
@pytest.mark.parametrize("sq,new,causal", [(1, 0, False), (1, 1, True), (4, 4, True), (300, 300, True)])
def test_paged_cache_against_float64_and_the_contiguous_cache(page, d, sq, new, causal):
    dtype, hq, hkv = torch.bfloat16, 8, 2
    cache = Cache(LENGTHS, new, hkv, d, page, dtype)
    q = randn(len(LENGTHS), sq, hq, d, dtype=dtype, seed=99)
    out, lse = flashcore.flash_attn_with_kvcache(
        q, cache.k_pool, cache.v_pool, cache.k_new, cache.v_new, cache_seqlens=cache.cache_seqlens,
        block_table=cache.block_table, causal=causal, return_softmax_lse=True,
    )
    assert out.shape == q.shape and lse.shape == (len(LENGTHS), hq, sq)
    flat, flat_lse = flashcore.flash_attn_with_kvcache(
        q, cache.k_flat, cache.v_flat, cache.k_new, cache.v_new, cache_seqlens=cache.cache_seqlens, causal=causal, return_softmax_lse=True
    )
    assert torch.equal(out, flat) and torch.equal(lse, flat_lse), "paged and contiguous differ bitwise"
    for b, n in enumerate(LENGTHS):
        k, v = cache.keys[b], cache.values[b]
        check_against_reference(q[b : b + 1], k, v, out[b : b + 1], lse[b : b + 1], d**-0.5, causal)
        # The appended keys landed in their pages (and the contiguous cache's rows).
        for j in range(n, n + new):
            p = cache.block_table[b, j // page].item()
            assert torch.equal(cache.k_pool[p, j % page], k[0, j]) and torch.equal(cache.v_pool[p, j % page], v[0, j])
            assert torch.equal(cache.k_flat[b, j], k[0, j])
    # cache_seqlens is the caller's to advance.
    assert cache.cache_seqlens.tolist() == LENGTHS


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_contiguous_cache_with_an_int_length_and_gqa_8(dtype):
    q = randn(3, 1, 16, 128, dtype=dtype)
    k_cache, v_cache = randn(3, 700, 2, 128, dtype=dtype, seed=1), randn(3, 700, 2, 128, dtype=dtype, seed=2)
    out = flashcore.flash_attn_with_kvcache(q, k_cache, v_cache, cache_seqlens=513)
    ref_o, _ = reference(q, k_cache[:, :513], v_cache[:, :513], 128**-0.5, False)
    assert (out.double() - ref_o).norm() / ref_o.norm() < (1e-2 if dtype == torch.bfloat16 else 2e-3)
    # No cache_seqlens: the whole cache.
    full = flashcore.flash_attn_with_kvcache(q, k_cache, v_cache)
    assert torch.equal(full, flashcore.flash_attn_func(q, k_cache, v_cache))


def test_window_and_softcap_over_a_paged_cache():
    cache = Cache([300, 1000, 17], 5, 2, 128, 64, torch.bfloat16, seed=7)
    q = randn(3, 5, 8, 128, scale=30**0.5 / 2, seed=8)
    out, lse = flashcore.flash_attn_with_kvcache(
        q, cache.k_pool, cache.v_pool, cache.k_new, cache.v_new, cache_seqlens=cache.cache_seqlens, block_table=cache.block_table,
        causal=True, window_size=(127, 0), softcap=30.0, return_softmax_lse=True,
    )
    for b in range(3):
        check_against_reference(q[b : b + 1], cache.keys[b], cache.values[b], out[b : b + 1], lse[b : b + 1], 128**-0.5, True, window=(127, 0), softcap=30.0)


def test_torch_compile_traces_the_op_and_orders_the_append():
    cache = Cache([40, 100], 1, 2, 64, 16, torch.bfloat16, seed=3)
    q = randn(2, 1, 8, 64, seed=4)

    def step(q, k_pool, v_pool, k, v, lens, table):
        return flashcore.flash_attn_with_kvcache(q, k_pool, v_pool, k, v, cache_seqlens=lens, block_table=table, causal=True) * 2

    eager = step(q, cache.k_pool.clone(), cache.v_pool.clone(), cache.k_new, cache.v_new, cache.cache_seqlens, cache.block_table)
    compiled = torch.compile(step, fullgraph=True)(q, cache.k_pool, cache.v_pool, cache.k_new, cache.v_new, cache.cache_seqlens, cache.block_table)
    assert torch.equal(eager, compiled)
    p = cache.block_table[1, 100 // 16].item()
    assert torch.equal(cache.k_pool[p, 100 % 16], cache.keys[1][0, 100]), "the compiled call wrote the cache"


def flashinfer_form(table, lens, page):
    """FlashInfer's (kv_indptr, kv_indices, kv_last_page_len) of a block table and lengths,
    by a loop on the host."""
    indptr, indices, last = [0], [], []
    for row, n in zip(table.tolist(), lens):
        pages = -(-n // page)
        indices += row[:pages]
        indptr.append(len(indices))
        last.append(n - (pages - 1) * page if pages else 0)
    return (torch.tensor(x, dtype=torch.int32, device="cuda") for x in (indptr, indices, last))


def test_flashinfer_page_indexing_converts_on_the_device_without_a_sync():
    page, lens = 16, [1, 15, 16, 17, 300]
    cache = Cache(lens, 0, 2, 64, page, torch.bfloat16, seed=11)
    indptr, indices, last = flashinfer_form(cache.block_table, lens, page)
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")  # any synchronising op raises
    try:
        table, seqlens = flashcore.block_table_from_indptr(indptr, indices, last, page, max_pages=cache.max_pages)
    finally:
        torch.cuda.set_sync_debug_mode(0)
    assert table.dtype == seqlens.dtype == torch.int32 and table.shape == cache.block_table.shape
    assert seqlens.tolist() == lens
    for b, n in enumerate(lens):
        used = -(-n // page)
        assert table[b, :used].tolist() == cache.block_table[b, :used].tolist()
        assert (table[b, used:] == 0).all(), "slots after a sequence's pages hold 0"
    # The same attention as through the hand-built table, bit for bit.
    q = randn(len(lens), 1, 8, 64, seed=12)
    ours = flashcore.flash_attn_with_kvcache(q, cache.k_pool, cache.v_pool, cache_seqlens=seqlens, block_table=table)
    assert torch.equal(ours, flashcore.flash_attn_with_kvcache(q, cache.k_pool, cache.v_pool, cache_seqlens=cache.cache_seqlens, block_table=cache.block_table))
    # Without max_pages (read from kv_indptr), int64 indices, and sequences without pages.
    table, seqlens = flashcore.block_table_from_indptr(indptr.long(), indices.long(), last, page)
    assert table.shape == (len(lens), max(-(-n // page) for n in lens))
    empty = torch.zeros(3, dtype=torch.int32, device="cuda")
    table, seqlens = flashcore.block_table_from_indptr(empty, indices[:0], empty[:2], page)
    assert table.tolist() == [[0], [0]] and seqlens.tolist() == [0, 0]


@pytest.mark.parametrize("sq,new", [(1, 1), (300, 300)])
def test_flashinfer_hnd_pages_pass_as_a_transposed_view(sq, new):
    """FlashInfer's other layout, HND (`[num_pages, Hkv, page_size, D]`), passes as its
    `transpose(1, 2)` view: bit for bit the output of the NHD pool of the same data, decode
    (fwd_sm80) and chunked prefill (fwd_sm90 on Hopper), and the appended keys land in the
    HND pages."""
    cache = Cache([300, 1000, 17], new, 2, 128, 64, torch.bfloat16, seed=13)
    q = randn(3, sq, 8, 128, seed=14)
    hnd_k, hnd_v = cache.k_pool.transpose(1, 2).contiguous(), cache.v_pool.transpose(1, 2).contiguous()
    args = dict(cache_seqlens=cache.cache_seqlens, block_table=cache.block_table, causal=True, return_softmax_lse=True)
    nhd_out, nhd_lse = flashcore.flash_attn_with_kvcache(q, cache.k_pool, cache.v_pool, cache.k_new, cache.v_new, **args)
    hnd_out, hnd_lse = flashcore.flash_attn_with_kvcache(q, hnd_k.transpose(1, 2), hnd_v.transpose(1, 2), cache.k_new, cache.v_new, **args)
    assert not hnd_out.isnan().any()
    assert torch.equal(hnd_out, nhd_out) and torch.equal(hnd_lse, nhd_lse), "HND and NHD pools differ"
    # Both pools hold the same keys after the append (NaN where no sequence has written).
    torch.testing.assert_close(hnd_k.transpose(1, 2), cache.k_pool, rtol=0, atol=0, equal_nan=True)
    torch.testing.assert_close(hnd_v.transpose(1, 2), cache.v_pool, rtol=0, atol=0, equal_nan=True)


def test_bad_input_is_named(monkeypatch):
    cache = Cache([20, 33], 1, 2, 64, 16, torch.bfloat16, seed=5)
    q = randn(2, 1, 8, 64, seed=6)
    args = (q, cache.k_pool, cache.v_pool)
    kw = dict(cache_seqlens=cache.cache_seqlens, block_table=cache.block_table)
    with pytest.raises(ValueError, match="pass `k` and `v`"):
        flashcore.flash_attn_with_kvcache(*args, rotary_cos=q[0, 0], rotary_sin=q[0, 0], **kw)
    cos = torch.ones(64, 4, device="cuda")  # rotary dim 8
    with pytest.raises(ValueError, match="multiple of 16"):
        flashcore.flash_attn_with_kvcache(*args, cache.k_new, cache.v_new, rotary_cos=cos, rotary_sin=cos, **kw)
    with pytest.raises(TypeError, match="block_table"):
        flashcore.flash_attn_with_kvcache(*args, cache_seqlens=cache.cache_seqlens, block_table=cache.block_table.long())
    with pytest.raises(TypeError, match="cache_seqlens"):
        flashcore.flash_attn_with_kvcache(*args, cache_seqlens=cache.cache_seqlens.float(), block_table=cache.block_table)
    with pytest.raises(TypeError, match="`k`"):
        flashcore.flash_attn_with_kvcache(*args, cache.k_new.half(), cache.v_new, **kw)
    with pytest.raises(ValueError, match="`k` and `v`"):
        flashcore.flash_attn_with_kvcache(*args, cache.k_new, None, **kw)
    with pytest.raises(ValueError, match="page_size"):
        pool = torch.zeros(8, 24, 2, 64, dtype=torch.bfloat16, device="cuda")
        flashcore.flash_attn_with_kvcache(q, pool, pool, **kw)
    with pytest.raises(ValueError, match="cache_seqlens"):
        flashcore.flash_attn_with_kvcache(*args, cache_seqlens=cache.cache_seqlens[:1], block_table=cache.block_table)
    with pytest.raises(ValueError, match="block_table"):
        flashcore.flash_attn_with_kvcache(*args, cache_seqlens=cache.cache_seqlens, block_table=cache.block_table[:1])
    with pytest.raises(ValueError, match="cache_seqlens"):
        flashcore.flash_attn_with_kvcache(*args, cache.k_new, cache.v_new, block_table=cache.block_table)
    # Device values: checked on request (FLASHCORE_CHECK_PAGED), the first bad entry named; the
    # kernels clamp it (wrong output, no fault).
    bad = cache.block_table.clone()
    bad[1, 1] = 10_000
    monkeypatch.setenv("FLASHCORE_CHECK_PAGED", "1")
    with pytest.raises(ValueError, match=r"block_table.*\[1, 1\]"):
        flashcore.flash_attn_with_kvcache(*args, cache_seqlens=cache.cache_seqlens, block_table=bad)
    with pytest.raises(ValueError, match="cache_seqlens"):
        flashcore.flash_attn_with_kvcache(*args, cache_seqlens=torch.tensor([20, 1000], dtype=torch.int32, device="cuda"), block_table=cache.block_table)
    monkeypatch.delenv("FLASHCORE_CHECK_PAGED")
    out = flashcore.flash_attn_with_kvcache(*args, cache_seqlens=cache.cache_seqlens, block_table=bad)
    torch.cuda.synchronize()
    assert torch.isfinite(out[0]).all()


@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("interleaved", [False, True])
def test_rotary_rotates_q_and_the_appended_keys_at_their_cache_positions(interleaved, causal):
    """flash_attn's rotary_cos / rotary_sin: the call equals rotating q and the new keys first
    (flashcore.rotary, tested against the textbook rotation in test_compat) at positions
    cache_seqlens + j (q: + i when causal, else every query at cache_seqlens), then the call
    without them; the cache holds the rotated keys."""
    from flashcore.rotary import apply_rotary_emb

    lens = [20, 33]
    rotary_dim, table = 32, 64
    angles = torch.arange(table, device="cuda", dtype=torch.float32)[:, None] * torch.rand(rotary_dim // 2, device="cuda")
    cos, sin = angles.cos(), angles.sin()
    outs, pools = [], []
    for rotate_first in (False, True):
        cache = Cache(lens, 3, 2, 64, 16, torch.bfloat16, seed=7)
        q = randn(2, 3, 4, 64, seed=8)
        k_new, v_new = cache.k_new, cache.v_new
        kw = dict(cache_seqlens=cache.cache_seqlens, block_table=cache.block_table, causal=causal)
        if rotate_first:
            offsets = cache.cache_seqlens
            k_new = apply_rotary_emb(k_new, cos, sin, interleaved=interleaved, seqlen_offsets=offsets)
            if causal:
                q = apply_rotary_emb(q, cos, sin, interleaved=interleaved, seqlen_offsets=offsets)
            else:
                q = apply_rotary_emb(q.reshape(2, 1, 12, 64), cos, sin, interleaved=interleaved, seqlen_offsets=offsets).reshape(2, 3, 4, 64)
            outs.append(flashcore.flash_attn_with_kvcache(q, cache.k_pool, cache.v_pool, k_new, v_new, **kw))
        else:
            outs.append(flashcore.flash_attn_with_kvcache(q, cache.k_pool, cache.v_pool, k_new, v_new, rotary_cos=cos, rotary_sin=sin, rotary_interleaved=interleaved, **kw))
        pools.append(cache.k_pool)
    assert not outs[0].isnan().any() and torch.equal(outs[0], outs[1])
    torch.testing.assert_close(pools[0], pools[1], rtol=0, atol=0, equal_nan=True)


def test_an_odd_head_dim_runs_padded_and_appends_into_the_callers_cache():
    """flash_attn's way with a head dim that is not a multiple of 8 (here 59, with rotary):
    the same output as the call on caches padded by hand, and the new keys in the caller's
    cache."""
    cache = Cache([20, 33], 3, 2, 64, 16, torch.bfloat16, seed=9)
    k_pool, v_pool = (t[..., :59].contiguous() for t in (cache.k_pool, cache.v_pool))
    k_new, v_new = cache.k_new[..., :59], cache.v_new[..., :59]
    q = randn(2, 3, 4, 59, seed=10)
    angles = torch.arange(64, device="cuda", dtype=torch.float32)[:, None] * torch.rand(24, device="cuda")
    kw = dict(cache_seqlens=cache.cache_seqlens, block_table=cache.block_table, causal=True, rotary_cos=angles.cos(), rotary_sin=angles.sin())
    out = flashcore.flash_attn_with_kvcache(q, k_pool, v_pool, k_new, v_new, **kw)
    pad = lambda t: torch.nn.functional.pad(t, (0, 5))  # noqa: E731
    k_ref, v_ref = pad(k_pool), pad(v_pool)
    ref = flashcore.flash_attn_with_kvcache(pad(q), k_ref, v_ref, pad(k_new), pad(v_new), softmax_scale=59**-0.5, **kw)
    assert out.shape == q.shape and not out.isnan().any()
    assert torch.equal(out, ref[..., :59])
    torch.testing.assert_close(k_pool, k_ref[..., :59], rtol=0, atol=0, equal_nan=True)


@pytest.mark.parametrize("sq,new,causal", [(1, 1, True), (1, 0, False), (5, 5, True), (200, 200, True)])
@pytest.mark.parametrize("alibi", [False, True], ids=["plain", "alibi"])
def test_left_padding_and_batch_indices_attend_to_each_sequences_own_rows(sq, new, causal, alibi):
    # Sequence b is entry idx[b] of a 5-entry cache, its keys rows [leftpad[b], lens[b] + new):
    # masks, ALiBi and the bottom-right alignment count from its first key; the new keys go
    # in at lens[b]; other entries and rows are untouched.
    dtype, hq, hkv, d, capacity = torch.bfloat16, 8, 2, 128, 1200
    lens, leftpad, idx = [600, 3, 1000], [100, 0, 999], [4, 0, 2]
    k_cache = randn(5, capacity, hkv, d, dtype=dtype, seed=31)
    v_cache = randn(5, capacity, hkv, d, dtype=dtype, seed=32)
    k_new = randn(3, new, hkv, d, dtype=dtype, seed=33) if new else None
    v_new = randn(3, new, hkv, d, dtype=dtype, seed=34) if new else None
    q = randn(3, sq, hq, d, dtype=dtype, seed=35)
    slopes = torch.rand(3, hq, device="cuda") * 0.3 if alibi else None
    before = (k_cache.clone(), v_cache.clone())
    int32 = lambda x: torch.tensor(x, dtype=torch.int32, device="cuda")  # noqa: E731
    out, lse = flashcore.flash_attn_with_kvcache(
        q, k_cache, v_cache, k_new, v_new, cache_seqlens=int32(lens), cache_batch_idx=int32(idx), cache_leftpad=int32(leftpad),
        causal=causal, alibi_slopes=slopes, return_softmax_lse=True,
    )
    assert lse.shape == (3, hq, sq) and lse.is_contiguous()
    want_k, want_v = before[0].clone(), before[1].clone()
    for b in range(3):
        if new:
            want_k[idx[b], lens[b] : lens[b] + new] = k_new[b]
            want_v[idx[b], lens[b] : lens[b] + new] = v_new[b]
        keys = slice(leftpad[b], lens[b] + new)
        alibi_b = None if slopes is None else slopes[b]
        check_against_reference(
            q[b : b + 1], want_k[idx[b] : idx[b] + 1, keys], want_v[idx[b] : idx[b] + 1, keys], out[b : b + 1].contiguous(),
            lse[b : b + 1], d**-0.5, causal, alibi=alibi_b,
        )
    assert torch.equal(k_cache, want_k) and torch.equal(v_cache, want_v), "the new keys, and nothing else, were written"
    # Without padding or indices: the plain call's result, bitwise the same kernel or not, close.
    plain = flashcore.flash_attn_with_kvcache(q, k_cache[[4, 0, 2]], v_cache[[4, 0, 2]], cache_seqlens=int32([n + new for n in lens]), causal=causal)
    rows = flashcore.flash_attn_with_kvcache(
        q, k_cache, v_cache, cache_seqlens=int32([n + new for n in lens]), cache_batch_idx=int32(idx), causal=causal
    )
    assert (plain.float() - rows.float()).abs().max().item() < 2e-2


def test_left_padding_and_batch_indices_are_refused_with_a_block_table_and_checked():
    cache = Cache([20, 33], 1, 2, 64, 16, torch.bfloat16, seed=5)
    q = randn(2, 1, 8, 64, seed=6)
    lens = cache.cache_seqlens
    for name in ("cache_leftpad", "cache_batch_idx"):
        with pytest.raises(NotImplementedError, match=name):
            flashcore.flash_attn_with_kvcache(q, cache.k_pool, cache.v_pool, cache_seqlens=lens, block_table=cache.block_table, **{name: torch.zeros_like(lens)})
        with pytest.raises(TypeError, match=name):
            flashcore.flash_attn_with_kvcache(q, cache.k_flat, cache.v_flat, cache_seqlens=lens, **{name: lens.long()})
        with pytest.raises(ValueError, match=name):
            flashcore.flash_attn_with_kvcache(q, cache.k_flat, cache.v_flat, cache_seqlens=lens, **{name: lens[:1]})


@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("page,d", [(16, 128), (256, 128), (64, 80)])
def test_packed_queries_over_a_paged_cache(page, d, causal):
    # flash_attn_varlen_func with a block table: chunked prefill and decode rows in one call,
    # each sequence against float64 over its own keys (from key 0 of its table row); D80 runs
    # zero-padded to fwd_sm80's D96.
    dtype, hq, hkv = torch.bfloat16, 8, 2
    cache = Cache(LENGTHS, 0, hkv, d, page, dtype, seed=41)
    queries = [1, 15, 1, 17, 300, 1]
    q = randn(1, sum(queries), hq, d, dtype=dtype, seed=42)[0]
    cu_q = torch.tensor([0] + list(torch.tensor(queries).cumsum(0)), dtype=torch.int32, device="cuda")
    cu_k = torch.tensor([0] + list(torch.tensor(LENGTHS).cumsum(0)), dtype=torch.int32, device="cuda")
    out, lse, _ = flashcore.flash_attn_varlen_func(
        q, cache.k_pool, cache.v_pool, cu_q, cu_k, max(queries), max(LENGTHS), causal=causal, return_attn_probs=True, block_table=cache.block_table
    )
    assert out.shape == q.shape and lse.shape == (hq, q.shape[0])
    row = 0
    for b, n in enumerate(queries):
        q_b = q[row : row + n][None]
        lse_b = lse[:, row : row + n][None]
        check_against_reference(q_b, cache.keys[b], cache.values[b], out[row : row + n][None].contiguous(), lse_b, d**-0.5, causal)
        row += n
    # seqused_k instead of the cu_seqlens_k spans: the same keys, the same bits.
    used = flashcore.flash_attn_varlen_func(
        q, cache.k_pool, cache.v_pool, cu_q, torch.zeros_like(cu_k), max(queries), max(LENGTHS), causal=causal,
        seqused_k=cache.cache_seqlens, block_table=cache.block_table,
    )
    assert torch.equal(used, out)
    # flash-attn's low-level call and the compat namespace's argument order give the same.
    from flashcore import flash_attn_interface

    low, low_lse, *_ = flash_attn_interface._flash_attn_varlen_forward(
        q, cache.k_pool, cache.v_pool, cu_q, cu_k, max(queries), max(LENGTHS), 0.0, d**-0.5, causal, block_table=cache.block_table
    )
    assert torch.equal(low, out) and torch.equal(low_lse, lse)


def test_a_cache_too_small_for_the_appended_rows_is_refused_by_name():
    # flash_attn's host-side refusal: appending, q's rows must fit the cache's capacity.
    cache = Cache([20, 33], 1, 2, 64, 16, torch.bfloat16, seed=5)  # 4 pages of 16 a sequence
    q = randn(2, 65, 8, 64, seed=6)
    new = randn(2, 2, 2, 64, seed=7)  # two new keys a sequence: within the capacity, q's 65 rows not
    with pytest.raises(ValueError, match="block_table"):
        flashcore.flash_attn_with_kvcache(q, cache.k_pool, cache.v_pool, new, new, cache_seqlens=cache.cache_seqlens, block_table=cache.block_table)
    with pytest.raises(ValueError, match="k_cache"):
        flashcore.flash_attn_with_kvcache(q, cache.k_flat, cache.v_flat, new, new, cache_seqlens=cache.cache_seqlens)
