"""flashcore.compat's FlashAttention-3 `flash_attn_interface` (`compat/flash_attn_3.py`): the
module under FA3's name (and not over a real one), each function bitwise FlashCore's own call
with FA3's return values, the packed and KV-cache forms, `flash_attn_combine` against FA3's
reference, and the arguments FlashCore does not run yet refused by name."""

from __future__ import annotations

import sys

import pytest
import torch

import flashcore
import flashcore.compat
from helpers import REL_BOUND, check_against_reference, randn, reference, reference_autograd, rel_l2


@pytest.fixture
def fa3(monkeypatch):
    """`flash_attn_interface` registered for one test, sys.modules restored afterwards."""
    monkeypatch.delitem(sys.modules, "flash_attn_interface", raising=False)
    find_spec = __import__("importlib.util").util.find_spec
    monkeypatch.setattr("importlib.util.find_spec", lambda name, *a, **k: None if name == "flash_attn_interface" else find_spec(name, *a, **k))
    flashcore.compat.use_as_flash_attn_interface()
    import flash_attn_interface

    yield flash_attn_interface
    sys.modules.pop("flash_attn_interface", None)


def test_the_module_is_flashcores_under_fa3s_name(fa3):
    assert fa3.__name__ == "flashcore.compat.flash_attn_3"
    flashcore.compat.use_as_flash_attn_interface()  # again: harmless
    for name in ("flash_attn_func", "flash_attn_varlen_func", "flash_attn_combine", "flash_attn_with_kvcache", "get_scheduler_metadata"):
        assert callable(getattr(fa3, name)), name


def test_a_real_flash_attn_interface_is_not_shadowed(monkeypatch, tmp_path):
    (tmp_path / "flash_attn_interface.py").write_text("REAL = True\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, "flash_attn_interface", raising=False)
    with pytest.raises(RuntimeError, match="a flash_attn_interface module is installed"):
        flashcore.compat.use_as_flash_attn_interface()
    assert "flash_attn_interface" not in sys.modules


def test_dense_and_packed_calls_are_flashcores_with_fa3s_returns(fa3):
    q, k, v = randn(2, 77, 8, 128, seed=1), randn(2, 90, 2, 128, seed=2), randn(2, 90, 2, 128, seed=3)
    args = dict(causal=True, window_size=(40, 0), softcap=20.0)
    # num_splits=0: FlashCore's choice, as its own call makes it (FA3's default 1 runs unsplit).
    out = fa3.flash_attn_func(q, k, v, num_splits=0, pack_gqa=True, sm_margin=4, **args)
    out_lse = fa3.flash_attn_func(q, k, v, num_splits=0, return_attn_probs=True, **args)
    mine, lse, _ = flashcore.flash_attn_func(q, k, v, return_attn_probs=True, **args)
    assert isinstance(out_lse, tuple) and len(out_lse) == 2
    assert torch.equal(out, mine) and torch.equal(out_lse[0], mine) and torch.equal(out_lse[1], lse)
    unsplit = fa3.flash_attn_func(q, k, v, **args)
    assert (unsplit.float() - mine.float()).abs().max() < 2e-2 and not unsplit.isnan().any()
    qkv = torch.stack((q, q, q), dim=2)
    assert torch.equal(fa3.flash_attn_qkvpacked_func(qkv, causal=True), flashcore.flash_attn_func(q, q, q, causal=True))
    gqa = torch.cat((q, k[:, :77], v[:, :77]), dim=2)
    want = flashcore.flash_attn_func(q, k[:, :77], v[:, :77])
    assert torch.equal(fa3.flash_attn_qkvpacked_func(gqa, num_heads_q=8), want)
    lens = [30, 47]
    cu = torch.tensor([0, 30, 77], dtype=torch.int32, device="cuda")
    qp, kp = q[0], k[0, :77]
    got, got_lse = fa3.flash_attn_varlen_func(qp, kp, kp, cu, cu, max(lens), max(lens), causal=True, return_attn_probs=True)
    want, want_lse, _ = flashcore.flash_attn_varlen_func(qp, kp, kp, cu, cu, max(lens), max(lens), causal=True, return_attn_probs=True)
    assert torch.equal(got, want) and torch.equal(got_lse, want_lse)


def test_gradients_flow_through_the_fa3_names(fa3):
    q, k, v = (randn(1, 65, 4, 64, seed=s).requires_grad_() for s in (1, 2, 3))
    do = randn(1, 65, 4, 64, seed=4)
    grads = torch.autograd.grad(fa3.flash_attn_func(q, k, v, causal=True, deterministic=True), (q, k, v), do)
    want = torch.autograd.grad(flashcore.flash_attn_func(q, k, v, causal=True, deterministic=True), (q, k, v), do)
    for g, w in zip(grads, want):
        assert torch.equal(g, w) and not g.isnan().any()


# Chunked attention (B, Sq, Sk, Hq, Hkv, D, chunk): chunks aligned to the key blocks and not,
# Sq < Sk and Sq > Sk (the diagonal below key 0), GQA, a chunk of one key, one past the keys.
CHUNKED = [(2, 300, 300, 4, 2, 64, 64), (1, 257, 1000, 4, 1, 128, 100), (1, 500, 200, 2, 2, 128, 96), (1, 65, 65, 2, 1, 64, 1), (1, 200, 120, 2, 2, 96, 4096)]


@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("shape", CHUNKED, ids=lambda s: "x".join(map(str, s)))
def test_chunked_attention_against_the_float64_oracle(fa3, shape, causal):
    """FA3's `construct_chunk_mask`: query i at p = i + Sk - Sq sees key j iff floor(j / C) ==
    floor(p / C), with the causal mask and a window; forward and gradients (FA3's backward
    refuses chunks; FlashCore's takes them)."""
    b, sq, sk, hq, hkv, d, chunk = shape
    q, k, v = (randn(b, s, h, d, seed=i).requires_grad_() for i, (s, h) in enumerate(((sq, hq), (sk, hkv), (sk, hkv))))
    window = (150, 0 if causal else 40)
    for win in ((-1, -1), window):
        out, lse = fa3.flash_attn_func(q, k, v, causal=causal, window_size=win, attention_chunk=chunk, return_attn_probs=True)
        check_against_reference(q.detach(), k.detach(), v.detach(), out, lse, d**-0.5, causal, window=win, chunk=chunk)
    do = randn(b, sq, hq, d, seed=7)
    grads = torch.autograd.grad(fa3.flash_attn_func(q, k, v, causal=causal, attention_chunk=chunk), (q, k, v), do)
    wide = [t.detach().double().requires_grad_() for t in (q, k, v)]
    want = torch.autograd.grad(reference_autograd(*wide, d**-0.5, causal, chunk=chunk), wide, do.double())
    floor = 1e-3 * do.double().norm().item()
    for name, g, r in zip(("dq", "dk", "dv"), grads, want):
        assert rel_l2(g, r, floor) <= REL_BOUND[torch.bfloat16], f"{name}: rel L2 error {rel_l2(g, r, floor):.3g}"


def test_chunked_attention_in_packed_batches_is_each_sequences_own(fa3):
    """Chunks count from each sequence's own first key (flash_attn_varlen_func): each sequence
    against the float64 oracle on that sequence alone."""
    lens_q, lens_k = [130, 1, 300], [200, 77, 300]
    cu_q, cu_k = (torch.tensor([0, *torch.tensor(n).cumsum(0).tolist()], dtype=torch.int32, device="cuda") for n in (lens_q, lens_k))
    q, k, v = randn(sum(lens_q), 4, 64, seed=1), randn(sum(lens_k), 2, 64, seed=2), randn(sum(lens_k), 2, 64, seed=3)
    out = fa3.flash_attn_varlen_func(q, k, v, cu_q, cu_k, max(lens_q), max(lens_k), causal=True, attention_chunk=48)
    for i in range(3):
        rows, keys = slice(cu_q[i], cu_q[i + 1]), slice(cu_k[i], cu_k[i + 1])
        want, _ = reference(q[None, rows], k[None, keys], v[None, keys], 64**-0.5, True, chunk=48)
        assert rel_l2(out[None, rows], want) <= REL_BOUND[torch.bfloat16], f"sequence {i}"


def test_kvcache_calls_are_flashcores(fa3):
    b, hq, hkv, d = 2, 8, 2, 128
    q, k_new = randn(b, 1, hq, d, seed=1), randn(b, 1, hkv, d, seed=2)
    caches = [randn(b, 64, hkv, d, seed=s) for s in (3, 4)]
    mine = [c.clone() for c in caches]
    lens = torch.tensor([5, 40], dtype=torch.int32, device="cuda")
    out, lse, *rest = fa3.flash_attn_with_kvcache(q, *caches, k=k_new, v=k_new, cache_seqlens=lens, causal=True, return_softmax_lse=True, scheduler_metadata=fa3.get_scheduler_metadata(b, 1, 64))
    want, want_lse = flashcore.flash_attn_with_kvcache(q, *mine, k=k_new, v=k_new, cache_seqlens=lens, causal=True, return_softmax_lse=True)
    assert not rest and torch.equal(out, want) and torch.equal(lse, want_lse)
    assert all(torch.equal(c, m) for c, m in zip(caches, mine)), "the new keys appended alike"
    # Packed queries over a paged cache (FA3's cu_seqlens_q): FlashCore's paged varlen call.
    pools = [randn(8, 16, hkv, d, seed=s) for s in (5, 6)]
    table = torch.tensor([[0, 1, 2, 3], [4, 5, 6, 7]], dtype=torch.int32, device="cuda")
    qp, cu = randn(7, hq, d, seed=7), torch.tensor([0, 3, 7], dtype=torch.int32, device="cuda")
    got = fa3.flash_attn_with_kvcache(qp, *pools, cache_seqlens=lens, page_table=table, cu_seqlens_q=cu, max_seqlen_q=4, causal=True)
    want = flashcore.flash_attn_varlen_func(qp, *pools, cu, torch.zeros_like(cu), 4, 0, causal=True, seqused_k=lens, block_table=table)
    assert torch.equal(got, want) and not got.isnan().any()


@pytest.mark.parametrize("rows", ["entries-in-order", "cache_batch_idx", "cache_leftpad"])
def test_packed_queries_over_a_contiguous_cache_are_each_sequences_own_call(fa3, rows):
    """FA3's `cu_seqlens_q` over a contiguous cache (a packed batch over its rows, with
    `cache_batch_idx` picking entries and `cache_leftpad` their first keys): each sequence's
    rows as its own dense KV-cache call gives them, within bf16's error of that other kernel.
    The capacity, 90, is no multiple of a key block."""
    b, hq, hkv, d, capacity = 3, 8, 2, 128, 90
    entries = 5 if rows == "cache_batch_idx" else b
    caches = [randn(entries, capacity, hkv, d, seed=s) for s in (1, 2)]
    index = torch.tensor([4, 0, 2], dtype=torch.int32, device="cuda") if rows == "cache_batch_idx" else None
    leftpad = torch.tensor([3, 0, 20], dtype=torch.int32, device="cuda") if rows == "cache_leftpad" else None
    lens = torch.tensor([17, 90, 40], dtype=torch.int32, device="cuda")
    cu = torch.tensor([0, 5, 6, 13], dtype=torch.int32, device="cuda")
    qp = randn(13, hq, d, seed=3)
    got, lse = fa3.flash_attn_with_kvcache(
        qp, *caches, cache_seqlens=lens, cache_batch_idx=index, cache_leftpad=leftpad, cu_seqlens_q=cu, max_seqlen_q=7, causal=True,
        return_softmax_lse=True,
    )  # fmt: skip
    assert got.shape == qp.shape and lse.shape == (hq, 13)
    for i in range(b):
        span, entry = slice(int(cu[i]), int(cu[i + 1])), int(index[i]) if index is not None else i
        one = [c[entry : entry + 1] for c in caches]
        pad = dict(cache_leftpad=leftpad[i : i + 1]) if leftpad is not None else {}
        want, want_lse = flashcore.flash_attn_with_kvcache(qp[span][None], *one, cache_seqlens=lens[i : i + 1], causal=True, return_softmax_lse=True, **pad)
        assert rel_l2(got[span], want[0]) < REL_BOUND[torch.bfloat16], i
        assert torch.allclose(lse[:, span], want_lse[0], atol=1e-3), i


@pytest.mark.parametrize("paged", [False, True], ids=["contiguous", "paged"])
def test_packed_new_keys_append_as_each_sequences_own_call(fa3, paged):
    """FA3's `cu_seqlens_k_new`: packed new keys written at each sequence's `cache_seqlens`
    (through the page table, or into entry `cache_batch_idx[b]`), then packed queries attend
    over the lengths after: each sequence's rows and cache as its own dense KV-cache call with
    its new keys appended gives them (outputs within bf16's error of that other kernel, caches
    bitwise). Paged, sequence b's pages are consecutive, so the pool is also the contiguous
    caches the reference appends to."""
    b, hq, hkv, d, pages, page_size = 3, 8, 2, 64, 4, 16
    capacity = pages * page_size
    pools = [randn(b * pages, page_size, hkv, d, seed=s) for s in (1, 2)]
    mine = [p.clone().view(b, capacity, hkv, d) for p in pools]
    table = torch.arange(b * pages, dtype=torch.int32, device="cuda").view(b, pages)
    lens = torch.tensor([10, 0, 30], dtype=torch.int32, device="cuda")
    cu_new = torch.tensor([0, 3, 8, 8], dtype=torch.int32, device="cuda")
    cu_q = torch.tensor([0, 3, 8, 9], dtype=torch.int32, device="cuda")
    k_new, v_new, qp = randn(8, hkv, d, seed=3), randn(8, hkv, d, seed=4), randn(9, hq, d, seed=5)
    caches = pools if paged else [p.view(b, capacity, hkv, d) for p in pools]
    where = dict(page_table=table) if paged else dict(cache_batch_idx=torch.arange(b, dtype=torch.int32, device="cuda"))
    got = fa3.flash_attn_with_kvcache(qp, *caches, k=k_new, v=v_new, cache_seqlens=lens, cu_seqlens_k_new=cu_new, cu_seqlens_q=cu_q, max_seqlen_q=5, causal=True, **where)
    for i in range(b):
        rows, new = slice(int(cu_q[i]), int(cu_q[i + 1])), slice(int(cu_new[i]), int(cu_new[i + 1]))
        one = [c[i : i + 1] for c in mine]
        want = flashcore.flash_attn_with_kvcache(qp[rows][None], *one, k=k_new[new][None], v=v_new[new][None], cache_seqlens=lens[i : i + 1], causal=True)
        assert rel_l2(got[rows], want[0]) < REL_BOUND[torch.bfloat16], i
    for c, m in zip(pools, mine):
        assert torch.equal(c.view(b, capacity, hkv, d), m), "the new keys written where the reference wrote them"


def test_cache_batch_idx_with_a_page_table_picks_the_tables_rows(fa3):
    """FA3's `cache_batch_idx` beside a page table: sequence b's cache is the one table row
    `cache_batch_idx[b]` holds, its new keys written there. Against flashcore's dense call with
    `cache_batch_idx` over the same caches laid out contiguously (pages shuffled in the pool):
    outputs within bf16's error, the caches after bitwise the same."""
    entries, b, pages, page_size, hq, hkv, d = 4, 2, 4, 16, 8, 2, 64
    capacity = pages * page_size
    pools = [randn(entries * pages, page_size, hkv, d, seed=s) for s in (1, 2)]
    table = torch.randperm(entries * pages, generator=torch.Generator().manual_seed(3)).to("cuda", torch.int32).view(entries, pages)
    contiguous = [pool[table.long()].reshape(entries, capacity, hkv, d) for pool in pools]
    idx = torch.tensor([3, 1], dtype=torch.int32, device="cuda")
    lens = torch.tensor([20, 5], dtype=torch.int32, device="cuda")
    q, k_new, v_new = randn(b, 2, hq, d, seed=4), randn(b, 2, hkv, d, seed=5), randn(b, 2, hkv, d, seed=6)
    got = fa3.flash_attn_with_kvcache(q, *pools, k=k_new, v=v_new, cache_seqlens=lens, cache_batch_idx=idx, page_table=table, causal=True)
    want = flashcore.flash_attn_with_kvcache(q, *contiguous, k_new, v_new, cache_seqlens=lens, cache_batch_idx=idx, causal=True)
    assert rel_l2(got, want.double()) < REL_BOUND[torch.bfloat16]
    for pool, c in zip(pools, contiguous):
        assert torch.equal(pool[table.long()].reshape(entries, capacity, hkv, d), c), "new keys written into the picked rows' pages"
    other = fa3.flash_attn_with_kvcache(q, *pools, cache_seqlens=lens + 2, cache_batch_idx=idx.flip(0), page_table=table, causal=True)
    assert rel_l2(got, other.double()) > 1e-2, "the index picks the rows"


@pytest.mark.parametrize("causal", [True, False], ids=["causal", "full"])
def test_rotary_with_packed_queries_and_new_keys_is_each_sequences_own_call(fa3, causal):
    """Rotary beside packed queries and packed new keys (FA3's varlen KV-cache call): each new
    key rotated at its cache position, and each query at its own (causal; full attention: every
    query of a sequence at its first new position, flash_attn's rule), as sequence b's own
    dense call with rotary rotates them: outputs within bf16's error of it, caches bitwise."""
    b, cap, hq, hkv, d = 3, 64, 8, 2, 64
    caches = [randn(b, cap, hkv, d, seed=s) for s in (1, 2)]
    mine = [c.clone() for c in caches]
    lens = torch.tensor([10, 0, 30], dtype=torch.int32, device="cuda")
    cu_new = torch.tensor([0, 3, 8, 8], dtype=torch.int32, device="cuda")
    cu_q = torch.tensor([0, 3, 8, 9], dtype=torch.int32, device="cuda")
    k_new, v_new, qp = randn(8, hkv, d, seed=3), randn(8, hkv, d, seed=4), randn(9, hq, d, seed=5)
    angle = torch.rand(cap, d // 4, device="cuda", generator=torch.Generator(device="cuda").manual_seed(6)) * 6.28
    cos, sin = torch.cos(angle).to(qp.dtype), torch.sin(angle).to(qp.dtype)
    rotary = dict(rotary_cos=cos, rotary_sin=sin)
    got = fa3.flash_attn_with_kvcache(qp, *caches, k=k_new, v=v_new, cache_seqlens=lens, cu_seqlens_k_new=cu_new, cu_seqlens_q=cu_q, max_seqlen_q=5, causal=causal, **rotary)
    for i in range(b):
        rows, new = slice(int(cu_q[i]), int(cu_q[i + 1])), slice(int(cu_new[i]), int(cu_new[i + 1]))
        one = [c[i : i + 1] for c in mine]
        appended = dict(k=k_new[new][None], v=v_new[new][None]) if new.stop > new.start else {}
        if not appended:  # FA2's dense call rotates only beside new keys: rotate this q alone
            from flashcore.rotary import apply_rotary_emb

            q_one = apply_rotary_emb(qp[rows][None], cos, sin, interleaved=True, seqlen_offsets=lens[i : i + 1]) if causal else apply_rotary_emb(
                qp[rows].reshape(1, 1, -1, d), cos, sin, interleaved=True, seqlen_offsets=lens[i : i + 1]
            ).reshape(1, -1, hq, d)
            want = flashcore.flash_attn_with_kvcache(q_one, *one, cache_seqlens=lens[i : i + 1], causal=causal)
        else:
            want = flashcore.flash_attn_with_kvcache(qp[rows][None], *one, cache_seqlens=lens[i : i + 1], causal=causal, **appended, **rotary)
        assert rel_l2(got[rows], want[0]) < REL_BOUND[torch.bfloat16], i
    for c, m in zip(caches, mine):
        assert torch.equal(c, m), "the new keys written rotated, where the reference wrote them"
    plain = fa3.flash_attn_with_kvcache(qp, *[c.clone() for c in mine], k=k_new, v=v_new, cache_seqlens=lens, cu_seqlens_k_new=cu_new, cu_seqlens_q=cu_q, max_seqlen_q=5, causal=causal)
    assert rel_l2(got, plain.double()) > 1e-2, "the rotation changes the result"


@pytest.mark.parametrize("sq,new", [(1, 1), (300, 300)], ids=["decode", "prefill"])
def test_chunked_attention_over_a_kv_cache(fa3, sq, new):
    """Chunks over a paged cache and a contiguous one (query row i at its cache position
    cache_seqlens[b] + S_new - Sq + i, FA3's rule), decode and chunked prefill, each sequence
    against the float64 oracle; and packed queries over the pages (cu_seqlens_q)."""
    from test_kvcache import Cache

    lens, d, chunk = [1, 15, 1000, 4097], 128, 256
    cache = Cache(lens, new, 2, d, 64, torch.bfloat16)
    q = randn(len(lens), sq, 8, d, seed=99)
    args = dict(cache_seqlens=cache.cache_seqlens, causal=True, attention_chunk=chunk, return_softmax_lse=True)
    out, lse = fa3.flash_attn_with_kvcache(q, cache.k_pool, cache.v_pool, cache.k_new, cache.v_new, page_table=cache.block_table, **args)
    flat, flat_lse = fa3.flash_attn_with_kvcache(q, cache.k_flat, cache.v_flat, cache.k_new, cache.v_new, **args)
    assert torch.equal(out, flat) and torch.equal(lse, flat_lse), "paged and contiguous differ bitwise"
    for b in range(len(lens)):
        check_against_reference(q[b : b + 1], cache.keys[b], cache.values[b], out[b : b + 1], lse[b : b + 1], d**-0.5, True, chunk=chunk)
    if new == 0 or sq == 1:
        return
    # The keys are in the pages now: packed queries, the last 7 and 1 rows of two sequences.
    rows = [7, 1]
    qp = torch.cat([q[2, -rows[0]:], q[3, -rows[1]:]])
    cu = torch.tensor([0, rows[0], sum(rows)], dtype=torch.int32, device="cuda")
    used = cache.cache_seqlens[2:] + new
    got, _ = fa3.flash_attn_with_kvcache(
        qp, cache.k_pool, cache.v_pool, cache_seqlens=used, page_table=cache.block_table[2:], cu_seqlens_q=cu, max_seqlen_q=7,
        causal=True, attention_chunk=chunk, return_softmax_lse=True,
    )  # fmt: skip
    for i, b in enumerate((2, 3)):
        want, _ = reference(q[b : b + 1, -rows[i]:], cache.keys[b], cache.values[b], d**-0.5, True, chunk=chunk)
        assert rel_l2(got[None, cu[i] : cu[i + 1]], want) <= REL_BOUND[torch.bfloat16], f"packed sequence {i}"


def combine_reference(out_partial, lse_partial):
    """FA3's test_flash_attn.py's `attention_combine_ref`, spelled out."""
    lse = torch.logsumexp(lse_partial, dim=0)
    scale = torch.exp(lse_partial - lse)
    scale = torch.where(torch.isinf(scale) | torch.isnan(scale), torch.zeros_like(scale), scale)
    return (scale.unsqueeze(-1) * out_partial).sum(0), lse


@pytest.mark.parametrize("num_splits", [1, 2, 5, 33])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_flash_attn_combine_is_fa3s_merge(fa3, num_splits, dtype):
    torch.manual_seed(num_splits)
    out_partial = torch.randn(2 * num_splits, 5, 16, 37, 64, device="cuda").transpose(2, 3)[:num_splits]  # strided, as FA3's test
    lse_partial = torch.randn(num_splits, 5, 32, 37, device="cuda").transpose(-1, -2)[:, :, :, :16]
    lse_partial[num_splits // 2 :, :1] = -float("inf")  # every split -inf for some rows when num_splits is 1
    out, lse = fa3.flash_attn_combine(out_partial, lse_partial, out_dtype=dtype)
    want, want_lse = combine_reference(out_partial, lse_partial)
    assert out.dtype == dtype and out.shape == want.shape and not out.isnan().any()
    assert torch.allclose(lse, want_lse, atol=1e-5, rtol=1e-5)
    assert (out.float() - want).abs().max() <= 2 * (want.to(dtype).float() - want).abs().max() + 1e-6
    into = torch.empty_like(want, dtype=dtype)
    assert fa3.flash_attn_combine(out_partial, lse_partial, out=into)[0] is into and torch.equal(into, out)


def test_seqused_q_runs_each_sequences_used_rows_alone(fa3):
    # Sequence b's first seqused_q[b] rows are its queries (0, some, all of them); the rest give
    # o = 0, lse = -inf and no gradient, and add nothing to dk, dv.
    lengths, used, hq, hkv, d = [(37, 100), (64, 64), (5, 300)], [20, 0, 5], 8, 2, 64
    cu_q = torch.tensor([0, 37, 101, 106], dtype=torch.int32, device="cuda")
    cu_k = torch.tensor([0, 100, 164, 464], dtype=torch.int32, device="cuda")
    q, k, v = (randn(n, h, d, seed=i).requires_grad_() for i, (n, h) in enumerate([(106, hq), (464, hkv), (464, hkv)]))
    seqused_q = torch.tensor(used, dtype=torch.int32, device="cuda")
    out, lse = fa3.flash_attn_varlen_func(q, k, v, cu_q, cu_k, 64, 300, seqused_q=seqused_q, causal=True, return_attn_probs=True)
    dout = randn(*out.shape, seed=9)
    out.backward(dout)
    grads = [t.grad.clone() for t in (q, k, v)]
    # Each sequence's used rows alone, through flashcore's own call.
    dk, dv = torch.zeros_like(k), torch.zeros_like(v)
    for b, ((_, nk), n) in enumerate(zip(lengths, used)):
        q0, k0 = cu_q[b].item(), cu_k[b].item()
        rows = slice(q0 + n, cu_q[b + 1].item())
        assert (out[rows] == 0).all() and (lse[:, rows] == float("-inf")).all() and (grads[0][rows] == 0).all(), f"sequence {b}'s unused rows"
        if n == 0:
            continue
        qs, ks, vs = (t.detach()[a : a + m].unsqueeze(0).requires_grad_() for t, a, m in ((q, q0, n), (k, k0, nk), (v, k0, nk)))
        alone, alone_lse, _ = flashcore.flash_attn_func(qs, ks, vs, causal=True, return_attn_probs=True)
        alone.backward(dout[q0 : q0 + n].unsqueeze(0))
        assert rel_l2(out[q0 : q0 + n], alone[0].double()) < 1e-3, f"sequence {b}"
        assert torch.allclose(lse[:, q0 : q0 + n], alone_lse[0], atol=1e-4), f"sequence {b}'s lse"
        assert rel_l2(grads[0][q0 : q0 + n], qs.grad[0].double()) < 1e-3
        dk[k0 : k0 + nk], dv[k0 : k0 + nk] = ks.grad[0], vs.grad[0]
    assert rel_l2(grads[1], dk.double()) < 1e-3 and rel_l2(grads[2], dv.double()) < 1e-3, "dk, dv from the used rows alone"


def test_rotary_seqlens_rotates_at_those_positions(fa3):
    # FA3's rotary positions apart from cache_seqlens: the same as rotating q and the new keys
    # at those positions first and calling without rotary.
    from flashcore.rotary import apply_rotary_emb

    b, cap, hq, hkv, d, new = 2, 128, 4, 2, 64, 3
    lens = torch.tensor([40, 7], dtype=torch.int32, device="cuda")
    positions = lens // 2
    q, k_new, v_new = randn(b, new, hq, d, seed=1), randn(b, new, hkv, d, seed=2), randn(b, new, hkv, d, seed=3)
    angle = torch.rand(cap, d // 4, device="cuda", generator=torch.Generator(device="cuda").manual_seed(4)) * 6.28
    cos, sin = torch.cos(angle).to(q.dtype), torch.sin(angle).to(q.dtype)
    caches = [randn(b, cap, hkv, d, seed=5), randn(b, cap, hkv, d, seed=6)]
    want_caches = [t.clone() for t in caches]
    got = fa3.flash_attn_with_kvcache(q, *caches, k=k_new, v=v_new, rotary_cos=cos, rotary_sin=sin, cache_seqlens=lens, rotary_seqlens=positions, causal=True)
    q_rot = apply_rotary_emb(q, cos, sin, interleaved=True, seqlen_offsets=positions)  # FA3's default
    k_rot = apply_rotary_emb(k_new, cos, sin, interleaved=True, seqlen_offsets=positions)
    want = flashcore.flash_attn_with_kvcache(q_rot, *want_caches, k_rot, v_new, cache_seqlens=lens, causal=True)
    assert torch.equal(got, want) and torch.equal(caches[0], want_caches[0]) and torch.equal(caches[1], want_caches[1])
    plain = fa3.flash_attn_with_kvcache(q, *[t.clone() for t in caches], k=k_new, v=v_new, rotary_cos=cos, rotary_sin=sin, cache_seqlens=lens, causal=True)
    assert rel_l2(got, plain.double()) > 1e-2, "positions apart from cache_seqlens change the result"


def test_what_flashcore_does_not_run_yet_is_refused_by_name(fa3):
    q = randn(1, 16, 4, 64)
    cu = torch.tensor([0, 16], dtype=torch.int32, device="cuda")
    # FP8's descales go with e4m3 inputs (test_fp8.py runs them); the packed call has none yet.
    for kwargs in (dict(q_descale=q), dict(v_descale=q)):
        with pytest.raises(TypeError, match="`q` must be a torch.float8_e4m3fn"):
            fa3.flash_attn_func(q, q, q, **kwargs)
    with pytest.raises(NotImplementedError, match="`k_descale`"):
        fa3.flash_attn_varlen_func(q[0], q[0], q[0], cu, cu, 16, 16, k_descale=q)
    with pytest.raises(NotImplementedError, match="`qv`"):
        fa3.flash_attn_varlen_func(q[0], q[0], q[0], cu, cu, 16, 16, qv=q[0])
    for chunk, error in ((-1, ValueError), (2.5, TypeError), (True, TypeError)):
        with pytest.raises(error, match="`attention_chunk`"):
            fa3.flash_attn_func(q, q, q, attention_chunk=chunk)
    # Packed new keys are [total_new, Hkv, D]; rotary beside them checks its tables by name.
    with pytest.raises(ValueError, match="`cu_seqlens_k_new`.*packed new keys"):
        fa3.flash_attn_with_kvcache(q, q.clone(), q.clone(), k=q[:, :1], v=q[:, :1], cache_seqlens=8, cu_seqlens_k_new=cu[:2])
    lengths = torch.full((1,), 8, dtype=torch.int32, device="cuda")
    with pytest.raises(ValueError, match="`rotary_cos` must be a 2-D tensor"):
        fa3.flash_attn_with_kvcache(q, q.clone(), q.clone(), k=q[0, :1], v=q[0, :1], cache_seqlens=lengths, cu_seqlens_k_new=cu[:2], rotary_cos=q, rotary_sin=q)
    with pytest.raises(ValueError, match="pass `k` and `v` too"):
        fa3.flash_attn_with_kvcache(q[0], q.clone(), q.clone(), cache_seqlens=lengths, cu_seqlens_q=cu, max_seqlen_q=16, rotary_cos=q, rotary_sin=q)
    # Without new keys FA3 ignores it (serving code passes it anyway): the same call as without.
    lengths = torch.full((1,), 16, dtype=torch.int32, device="cuda")
    assert torch.equal(fa3.flash_attn_with_kvcache(q, q, q, cache_seqlens=lengths, cu_seqlens_k_new=cu), fa3.flash_attn_with_kvcache(q, q, q, cache_seqlens=lengths))
    with pytest.raises(TypeError, match="`num_splits`"):
        fa3.flash_attn_func(q, q, q, num_splits=1.5)


def test_qv_adds_qv_times_v_to_the_scores_forward_only(fa3):
    """FA3's `qv` (q and k 64, v 256): the output and lse against float64 at FA3's default
    scale (D + Dv)^-1/2, through the identity q·kᵀ + qv·vᵀ = [q, qv]·[k, v]ᵀ; causal with
    Sq < Sk and GQA; refused with gradients, for other pairs and when it is not a tensor."""
    b, sq, sk, hq, hkv, d, dv = 2, 300, 700, 8, 2, 64, 256
    q, k, v = randn(b, sq, hq, d, seed=1), randn(b, sk, hkv, d, seed=2), randn(b, sk, hkv, dv, seed=3)
    qv = randn(b, sq, hq, dv, seed=4)
    scale = (d + dv) ** -0.5
    with torch.no_grad():
        out, lse = fa3.flash_attn_func(q, k, v, causal=True, qv=qv, return_attn_probs=True)
        explicit = fa3.flash_attn_func(q, k, v, softmax_scale=scale, causal=True, qv=qv)
        plain = fa3.flash_attn_func(q, k, v, causal=True)
    ref_o, ref_lse = reference(torch.cat([q, qv], dim=-1), torch.cat([k, v], dim=-1), v, scale, True)
    assert out.shape == (b, sq, hq, dv) and rel_l2(out, ref_o) <= REL_BOUND[q.dtype], rel_l2(out, ref_o)
    assert (lse.double() - ref_lse).abs().max().item() <= 2e-3 * ref_lse.abs().max().item()
    assert torch.equal(out, explicit), "the default scale is (D + Dv)^-1/2"
    assert rel_l2(plain, ref_o) > 1e-2, "qv changes the output"
    with pytest.raises(NotImplementedError, match="`qv`"):
        fa3.flash_attn_func(q.requires_grad_(), k, v, qv=qv)
    with torch.no_grad(), pytest.raises(ValueError, match="`qv`.*head dim 64 with V's 64"):
        fa3.flash_attn_func(q, k, k, qv=q)
    with torch.no_grad(), pytest.raises(TypeError, match="`qv`"):
        fa3.flash_attn_func(q, k, v, qv=1.0)

