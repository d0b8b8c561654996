"""FlashAttention-3's `flash_attn_interface` (its `hopper/` module, at flash-attention
0251105a) on FlashCore: `flash_attn_func`, `flash_attn_varlen_func`,
`flash_attn_qkvpacked_func`, `flash_attn_with_kvcache`, `flash_attn_combine` and
`get_scheduler_metadata`, with FA3's signatures and return values.

    import flashcore.compat
    flashcore.compat.use_as_flash_attn_interface()   # before anything imports flash_attn_interface
    from flash_attn_interface import flash_attn_func  # FlashCore's

Every call runs FlashCore's kernels (`flashcore.interface`). `qv` (absorbed MLA's extra q·vᵀ
term) runs in `flash_attn_func` where FA3 has it, q and k 64 with v 256 (Hopper), forward only
as in FA3 (inputs that require grad raise naming it), at FA3's default scale `(D + Dv)^-1/2`,
eagerly (not through the registered ops: torch.compile does not trace it). FP8 runs in
`flash_attn_func` as in FA3: `torch.float8_e4m3fn` q, k, v with the optional descales
`q_descale`, `k_descale`, `v_descale` (`[B, Hkv]`), a bf16 output, forward only, dense keys
with a causal mask or a window (Hopper; eagerly, as `qv`). What FA3 has and FlashCore does not
yet raises `NotImplementedError` naming the argument: `qv` and the FP8 descales in the packed
and KV-cache calls, and in the
KV-cache call `cache_leftpad` with a page table (packed new keys, `cu_seqlens_k_new`, are written into the
caches by PyTorch first; packed queries over a contiguous cache run as a packed batch over its
rows; `cache_batch_idx` with a page table picks the table's rows, gathered on the device).
`seqused_q` runs by gathers in PyTorch around the kernels (no host synchronisation). Rotary
embeddings beside packed queries or packed new keys, and at `rotary_seqlens`, are applied by
PyTorch before the call (the new keys as they are written, q after its checks): each new token
at its sequence's first new position plus its index, and without a causal mask or window every
query at that first position (flash_attn's rule). FA3's tuning hints are taken and left to
FlashCore's planner: `pack_gqa` (FlashCore packs GQA heads for decode itself), `sm_margin`,
`scheduler_metadata` (`get_scheduler_metadata` returns None, which every call takes);
`num_splits` is honoured where FlashCore splits (the dense and KV-cache calls: 1 unsplit, 0 or
less FlashCore's choice) and a hint for a packed batch. `attention_chunk` runs in every call,
forward and backward (FA3's backward refuses it). Differences: a row that sees no key has lse
-inf (FA3: +inf), and outputs are FlashCore's numerics (docs/flash-attn-compat.md).
"""

from __future__ import annotations

import numbers
from typing import Callable, Optional, Tuple, Union

import torch
from torch import Tensor

from .. import _ops, interface
from .._args import _check, _check_int32, _check_packed, _check_paged_varlen, _num_splits, _options
from .._paths import _attention

__all__ = [
    "flash_attn_func",
    "flash_attn_varlen_func",
    "flash_attn_qkvpacked_func",
    "flash_attn_with_kvcache",
    "flash_attn_combine",
    "get_scheduler_metadata",
]


def _not_yet(name: str, what: str) -> NotImplementedError:
    return NotImplementedError(f"flashcore: `{name}` ({what}) is not supported yet")


DESCALES = ("q_descale", "k_descale", "v_descale")
_E4M3 = torch.float8_e4m3fn


def _refuse_fa3_only(qv: object, descales: Tuple[object, object, object]) -> None:
    """NotImplementedError naming the first FA3 argument FlashCore does not run yet (the packed
    and KV-cache calls')."""
    if qv is not None:
        raise _not_yet("qv", "absorbed MLA's q·vᵀ term: flash_attn_func takes it; the packed and KV-cache calls not yet")
    for name, descale in zip(DESCALES, descales):
        if descale is not None:
            raise _not_yet(name, "FP8 inputs: flash_attn_func takes them; the packed and KV-cache calls not yet")


def _fp8_forward(
    q: object, k: object, v: object, qv: object, descales: Tuple[object, object, object], options: Callable[[Tensor], _ops.Options], want_lse: bool
) -> Tuple[Tensor, Optional[Tensor]]:
    """FA3's FP8 call: e4m3 q, k, v (`[B, S, H, D]`, one CUDA device) with its descales, each
    None (1) or a `[B, Hkv]` tensor on q's device (made f32 and contiguous, as FA3 reads
    them), into a bf16 output; forward only (FA3's FP8 path has no backward). The core checks
    the rest and names what e4m3 does not take yet (`dispatch::e4m3_form`). `options(q)` makes
    the call's options once q is known to be a tensor."""
    for name, t in (("q", q), ("k", k), ("v", v)):
        if not isinstance(t, Tensor) or t.dtype is not _E4M3:
            got = t.dtype if isinstance(t, Tensor) else type(t).__name__
            raise TypeError(f"`{name}` must be a torch.float8_e4m3fn tensor with FP8 inputs (the descales or q's dtype say so), got {got}")
        if t.dim() != 4 or not t.is_cuda or t.device != q.device:
            raise ValueError(f"`{name}` must be a 4-D CUDA tensor [B, S, H, D] on q's device, got {tuple(t.shape)} on {t.device}")
    if qv is not None:
        raise _not_yet("qv", "with FP8 inputs")
    if torch.is_grad_enabled() and any(t.requires_grad for t in (q, k, v)):
        raise _not_yet("q", "FP8 inputs' gradient: FlashAttention-3's FP8 path has none either; call under torch.no_grad()")
    want = (q.shape[0], k.shape[2])
    checked = []
    for name, d in zip(DESCALES, descales):
        if d is not None:
            if not isinstance(d, Tensor) or tuple(d.shape) != want or d.device != q.device:
                got = f"{tuple(d.shape)} on {d.device}" if isinstance(d, Tensor) else type(d).__name__
                raise ValueError(f"`{name}` must be a tensor [B, Hkv] = {list(want)} on q's device, got {got}")
            d = d.to(torch.float32).contiguous()
        checked.append(d)
    return _ops.fp8_forward(q, k, v, options(q), tuple(checked), want_lse)


def _qv_forward(q: Tensor, k: Tensor, v: Tensor, qv: object, options: _ops.Options, want_lse: bool) -> Tuple[Tensor, Optional[Tensor]]:
    """FA3's `qv` call: `_ops.forward` with qv (checked by the core against the output's
    shape, q's dtype and the pairs it has forms for; its errors name `qv`). No gradient, as
    FA3's backward takes no qv."""
    if not isinstance(qv, Tensor):
        raise TypeError(f"`qv` must be a torch.Tensor [B, Sq, Hq, Dv], got {type(qv).__name__}")
    if torch.is_grad_enabled() and any(t.requires_grad for t in (q, k, v, qv)):
        raise _not_yet("qv", "its gradient: FlashAttention-3's backward has none either; call under torch.no_grad()")
    return _ops.forward(q, k, v, options, want_lse, qv=qv)


def _chunk(attention_chunk: object) -> int:
    """FA3's `attention_chunk` (0 or None: off), checked: an int >= 0, else the error naming it."""
    if type(attention_chunk) is int and attention_chunk >= 0:  # the usual call's path: no ABC check
        return attention_chunk
    if attention_chunk is None:
        return 0
    if not isinstance(attention_chunk, numbers.Integral) or isinstance(attention_chunk, bool):
        raise TypeError(f"`attention_chunk` must be an int, got {attention_chunk!r}")
    if attention_chunk < 0:
        raise ValueError(f"`attention_chunk` must be >= 0 (0: off), got {attention_chunk}")
    return int(attention_chunk)


def flash_attn_func(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    softmax_scale: Optional[float] = None,
    causal: bool = False,
    qv: Optional[Tensor] = None,
    q_descale: Optional[Tensor] = None,
    k_descale: Optional[Tensor] = None,
    v_descale: Optional[Tensor] = None,
    window_size: Tuple[int, int] = (-1, -1),
    attention_chunk: int = 0,
    softcap: float = 0.0,
    num_splits: int = 1,
    pack_gqa: Optional[bool] = None,
    deterministic: bool = False,
    sm_margin: int = 0,
    return_attn_probs: bool = False,
) -> Union[Tensor, Tuple[Tensor, Tensor]]:
    """FA3's `flash_attn_func`: `q [B, Sq, Hq, D]`, `k, v [B, Sk, Hkv, D]` → `out`, or `(out,
    softmax_lse [B, Hq, Sq])` with `return_attn_probs` (FA3 returns no probabilities either).
    Semantics as `flashcore.flash_attn_func`; `num_splits` as the module says; `pack_gqa` and
    `sm_margin` hints. Differentiable, but with `qv` (`[B, Sq, Hq, Dv]`, forward only; see the
    module) and with FP8 inputs (`torch.float8_e4m3fn` q, k, v and the descales `[B, Hkv]`,
    each optional: forward only, a bf16 `out`)."""
    splits, chunk = _num_splits(num_splits), _chunk(attention_chunk)
    if q_descale is not None or k_descale is not None or v_descale is not None or getattr(q, "dtype", None) is _E4M3:

        def options(q: Tensor) -> _ops.Options:
            return _options(q, (softmax_scale, causal, window_size, softcap), None, deterministic, num_splits=splits, attention_chunk=chunk)

        out, lse = _fp8_forward(q, k, v, qv, (q_descale, k_descale, v_descale), options, return_attn_probs)
        return (out, lse) if return_attn_probs else out
    _check((("q", q), ("k", k), ("v", v)), "[B, S, H, D]")
    if qv is not None and softmax_scale is None:
        softmax_scale = (q.shape[-1] + v.shape[-1]) ** -0.5  # FA3's default with qv
    options = _options(q, (softmax_scale, causal, window_size, softcap), None, deterministic, num_splits=splits, attention_chunk=chunk)
    if qv is not None:
        out, lse = _qv_forward(q, k, v, qv, options, return_attn_probs)
    else:
        out, lse = _attention(q, k, v, options, return_attn_probs)
    return (out, lse) if return_attn_probs else out


def flash_attn_varlen_func(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    cu_seqlens_q: Tensor,
    cu_seqlens_k: Tensor,
    max_seqlen_q: int,
    max_seqlen_k: int,
    seqused_q: Optional[Tensor] = None,
    seqused_k: Optional[Tensor] = None,
    softmax_scale: Optional[float] = None,
    causal: bool = False,
    qv: Optional[Tensor] = None,
    q_descale: Optional[Tensor] = None,
    k_descale: Optional[Tensor] = None,
    v_descale: Optional[Tensor] = None,
    window_size: Tuple[int, int] = (-1, -1),
    attention_chunk: int = 0,
    softcap: float = 0.0,
    num_splits: int = 1,
    pack_gqa: Optional[bool] = None,
    deterministic: bool = False,
    sm_margin: int = 0,
    return_attn_probs: bool = False,
) -> Union[Tensor, Tuple[Tensor, Tensor]]:
    """FA3's `flash_attn_varlen_func`: a packed batch (`flashcore.flash_attn_varlen_func`'s
    semantics, `seqused_k` included) → `out [total_q, Hq, D]`, or `(out, softmax_lse [Hq,
    total_q])` with `return_attn_probs`. `seqused_q` (int32 `[B]`): sequence b's first
    `seqused_q[b]` rows are its queries, the rest padding that gives out = 0, lse = -inf and no
    gradient (see `_used_queries`). `num_splits`, `pack_gqa` and `sm_margin` are hints.
    Differentiable."""
    _refuse_fa3_only(qv, (q_descale, k_descale, v_descale))
    _num_splits(num_splits)
    _check_packed(q, k, v, cu_seqlens_q, cu_seqlens_k, seqused_k)
    options = _options(q, (softmax_scale, causal, window_size, softcap), None, deterministic, attention_chunk=_chunk(attention_chunk))
    max_seqlens = (max_seqlen_q, max_seqlen_k)
    if seqused_q is not None:
        _check_int32("seqused_q", seqused_q, q, 1)
        if seqused_q.shape[0] != cu_seqlens_q.shape[0] - 1:
            raise ValueError(f"`seqused_q` has {seqused_q.shape[0]} entries, cu_seqlens_q {cu_seqlens_q.shape[0] - 1} sequences")
        return _used_queries(q, (k, v), (cu_seqlens_q, cu_seqlens_k, seqused_k, seqused_q), max_seqlens, options, return_attn_probs)
    vectors = (cu_seqlens_q, cu_seqlens_k, seqused_k)
    out, lse, _ = interface._packed_batch(q, k, v, vectors, max_seqlens, options, return_attn_probs)
    return (out, lse) if return_attn_probs else out


def _used_queries(
    q: Tensor, kv: Tuple[Tensor, Tensor], vectors: tuple, max_seqlens: tuple, options, want_lse: bool
) -> Union[Tensor, Tuple[Tensor, Tensor]]:
    """FA3's `seqused_q` on FlashCore's packed batch, which has none: the used rows (row i of
    sequence b with i < seqused_q[b], clamped to its length) gathered into a packed batch of
    their own (`cu_seqlens_q` the prefix sums of the used counts), run, and gathered back; the
    other rows give out = 0 and lse = -inf, and no gradient to q, k or v. All on the device:
    no host synchronisation; differentiable (index_copy and index_select)."""
    cu_seqlens_q, cu_seqlens_k, seqused_k, seqused_q = vectors
    total_q = q.shape[0]
    rows = torch.arange(total_q, device=q.device)
    lengths = cu_seqlens_q[1:] - cu_seqlens_q[:-1]
    counts = torch.minimum(seqused_q.clamp(min=0), lengths)
    sequence = torch.searchsorted(cu_seqlens_q[1:].long(), rows, right=True).clamp(max=max(lengths.shape[0] - 1, 0))
    offset = rows - cu_seqlens_q.long()[sequence]
    used = offset < counts.long()[sequence]
    cu_used = torch.nn.functional.pad(counts.cumsum(0), (1, 0)).to(torch.int32)
    compact = cu_used.long()[sequence] + offset  # a used row's place in the gathered batch
    dump = torch.full_like(compact, total_q)  # the other rows go to one spare row, dropped
    q_used = q.new_zeros((total_q + 1, *q.shape[1:])).index_copy(0, torch.where(used, compact, dump), q)[:total_q]
    out_used, lse_used, _ = interface._packed_batch(q_used, *kv, (cu_used, cu_seqlens_k, seqused_k), max_seqlens, options, want_lse)
    back = torch.where(used, compact, 0)
    out = torch.where(used[:, None, None], out_used.index_select(0, back), 0)
    if not want_lse:
        return out
    return out, torch.where(used[None, :], lse_used.index_select(1, back), float("-inf"))


def flash_attn_qkvpacked_func(
    qkv: Tensor,
    softmax_scale: Optional[float] = None,
    causal: bool = False,
    q_descale: Optional[Tensor] = None,
    k_descale: Optional[Tensor] = None,
    v_descale: Optional[Tensor] = None,
    window_size: Tuple[int, int] = (-1, -1),
    attention_chunk: int = 0,
    softcap: float = 0.0,
    deterministic: bool = False,
    num_heads_q: Optional[int] = None,
    sm_margin: int = 0,
    return_attn_probs: bool = False,
) -> Union[Tensor, Tuple[Tensor, Tensor]]:
    """FA3's `flash_attn_qkvpacked_func`: `qkv [B, S, 3, H, D]`, or with `num_heads_q` the
    GQA layout `[B, S, Hq + 2·Hkv, D]` (q's heads, then k's, then v's), split into views (no
    copy; autograd adds the gradients back into `qkv`); then `flash_attn_func`."""
    if not isinstance(qkv, Tensor) or qkv.dim() != (4 if num_heads_q is not None else 5):
        layout = "[B, S, Hq + 2 Hkv, D] with num_heads_q" if num_heads_q is not None else "[B, S, 3, H, D]"
        raise ValueError(f"`qkv` must be {layout}, got {getattr(qkv, 'shape', type(qkv).__name__)}")
    if num_heads_q is None:
        q, k, v = qkv.unbind(dim=2)
    else:
        heads_kv, odd = divmod(qkv.shape[2] - int(num_heads_q), 2)
        if odd or heads_kv <= 0:
            raise ValueError(f"`qkv` has {qkv.shape[2]} heads: not num_heads_q = {num_heads_q} plus twice the KV heads")
        q, k, v = qkv.split([int(num_heads_q), heads_kv, heads_kv], dim=2)
    return flash_attn_func(
        q, k, v, softmax_scale, causal, None, q_descale, k_descale, v_descale, window_size, attention_chunk, softcap,
        deterministic=deterministic, sm_margin=sm_margin, return_attn_probs=return_attn_probs,
    )  # fmt: skip


def flash_attn_with_kvcache(
    q: Tensor,
    k_cache: Tensor,
    v_cache: Tensor,
    k: Optional[Tensor] = None,
    v: Optional[Tensor] = None,
    qv: Optional[Tensor] = None,
    rotary_cos: Optional[Tensor] = None,
    rotary_sin: Optional[Tensor] = None,
    cache_seqlens: Optional[Union[int, Tensor]] = None,
    cache_batch_idx: Optional[Tensor] = None,
    cache_leftpad: Optional[Tensor] = None,
    page_table: Optional[Tensor] = None,
    cu_seqlens_q: Optional[Tensor] = None,
    cu_seqlens_k_new: Optional[Tensor] = None,
    max_seqlen_q: Optional[int] = None,
    rotary_seqlens: Optional[Tensor] = None,
    q_descale: Optional[Tensor] = None,
    k_descale: Optional[Tensor] = None,
    v_descale: Optional[Tensor] = None,
    softmax_scale: Optional[float] = None,
    causal: bool = False,
    window_size: Tuple[int, int] = (-1, -1),
    attention_chunk: int = 0,
    softcap: float = 0.0,
    rotary_interleaved: bool = True,
    scheduler_metadata: Optional[Tensor] = None,
    num_splits: int = 0,
    pack_gqa: Optional[bool] = None,
    sm_margin: int = 0,
    return_softmax_lse: bool = False,
) -> Union[Tensor, Tuple[Tensor, Tensor]]:
    """FA3's `flash_attn_with_kvcache`: `flashcore.flash_attn_with_kvcache` (FA2's semantics:
    new keys appended first, rotary, `cache_batch_idx`, `cache_leftpad`) with `page_table` as
    its block table; with `cu_seqlens_q`, packed queries `[total_q, Hq, D]` over a paged
    cache (`flashcore.flash_attn_varlen_func` with a block table), or over a contiguous one
    (`cache_batch_idx`, `cache_leftpad` as in the dense call); with `cu_seqlens_k_new`, packed
    new keys `[total_new, Hkv, D]` written into the caches first (`_append_packed_keys`).
    Returns `out`, or `(out, softmax_lse)` with `return_softmax_lse`. `scheduler_metadata`,
    `pack_gqa` and `sm_margin` are hints; `cu_seqlens_k_new` without new keys is ignored, as
    FA3 ignores it."""
    _refuse_fa3_only(qv, (q_descale, k_descale, v_descale))
    rotary = None  # (cos, sin, interleaved, each sequence's first new position)
    if rotary_cos is not None or rotary_sin is not None:
        if k is None:
            raise ValueError("`rotary_cos` and `rotary_sin` rotate the appended keys: pass `k` and `v` too")
        first = rotary_seqlens if rotary_seqlens is not None else cache_seqlens  # before new keys
        rotary = (rotary_cos, rotary_sin, bool(rotary_interleaved), 0 if first is None else first)
        if isinstance(q, Tensor):  # else q's own check names it first
            interface._check_rotary(q, rotary_cos, rotary_sin)
            if rotary_seqlens is not None:
                _check_int32("rotary_seqlens", rotary_seqlens, q, 1)
    if page_table is not None and cache_batch_idx is not None and isinstance(q, Tensor):
        page_table, cache_batch_idx = _pages_of_entries(q, page_table, cache_batch_idx), None
    # FA3 reads cu_seqlens_k_new only when keys are appended (its AppendKV path): without `k`
    # it is ignored, as serving code passes it (SGLang's FA3 backend does).
    packed_new = cu_seqlens_k_new if k is not None or v is not None else None
    if packed_new is not None:
        lengths = (cache_seqlens, cache_batch_idx, cache_leftpad, page_table)
        cache_seqlens = _append_packed_keys(q, (k_cache, v_cache), (k, v), packed_new, lengths, rotary)
        k = v = None
    splits, chunk = _num_splits(num_splits), _chunk(attention_chunk)
    scores = (softmax_scale, causal, window_size, softcap)
    if cu_seqlens_q is not None:
        layout = (cu_seqlens_q, max_seqlen_q, cache_seqlens, page_table)
        extra = (k, rotary, cache_batch_idx, cache_leftpad)
        return _packed_queries(q, (k_cache, v_cache), layout, extra, scores, chunk, return_softmax_lse)
    new, lengths = interface._checked_kvcache_call(q, (k_cache, v_cache), (k, v), (cache_seqlens, cache_batch_idx, cache_leftpad, page_table))
    options = _options(q, scores, num_splits=splits, attention_chunk=chunk)
    args = (rotary_cos, rotary_sin, rotary_interleaved)
    if rotary is not None and (packed_new is not None or rotary_seqlens is not None):
        # q (and dense new keys) rotated here at FA3's positions (rotary_seqlens, or the cache's
        # lengths before the packed keys, which were rotated as they were written), then the
        # call without rotary.
        q = interface._rotated_queries(q, rotary, options)
        new, args = (None if new is None else (interface._rotated_keys(new[0], rotary), new[1])), (None, None, False)
    return interface._kvcache(q, (k_cache, v_cache), new, args, lengths, options, return_softmax_lse)


def _pages_of_entries(q: Tensor, page_table: Tensor, cache_batch_idx: Tensor) -> Tensor:
    """FA3's `cache_batch_idx` with a page table: sequence b's cache is the table's row
    `cache_batch_idx[b]`, so those rows, gathered on the device (no host synchronisation), are
    the call's page table and the call runs without the index. The index is clamped to the
    table's rows first, as the kernels clamp table entries: a bad one gives wrong output, never
    a read outside the table."""
    _check_int32("page_table", page_table, q, 2)
    _check_int32("cache_batch_idx", cache_batch_idx, q, 1)
    if page_table.shape[0] == 0:
        raise ValueError("`page_table` has no rows for `cache_batch_idx` to pick")
    return page_table.index_select(0, cache_batch_idx.clamp(0, page_table.shape[0] - 1))


def _append_packed_keys(
    q: Tensor, caches: Tuple[Tensor, Tensor], new: Tuple[Tensor, Tensor], cu_seqlens_k_new: Tensor, lengths: tuple, rotary: Optional[tuple]
) -> Tensor:
    """FA3's packed new keys: `k`, `v` `[total_new, Hkv, D]`, sequence b's rows
    `cu_seqlens_k_new[b] .. [b + 1]`, checked, then written at its positions `cache_seqlens[b] +
    i` (through `page_table`, or of entry `cache_batch_idx[b]` of a contiguous cache,
    `cache_leftpad` not moving them: as flash_attn 2 appends; `interface._write_new_keys`).
    Returns the lengths after, which the call then attends over with no keys to append.
    `lengths`: `(cache_seqlens, cache_batch_idx, cache_leftpad, page_table)`; `rotary` the call's
    checked record (None: none): the keys written rotated from its positions
    (`interface._rotated_keys`)."""
    (k_cache, v_cache), (k, v) = caches, new
    cache_seqlens, cache_batch_idx, cache_leftpad, page_table = lengths
    if page_table is not None:
        for name, value in (("cache_batch_idx", cache_batch_idx), ("cache_leftpad", cache_leftpad)):
            if value is not None:
                raise _not_yet(name, "with a page_table")
    if (k is None) != (v is None):
        raise ValueError("`k` and `v` come together: pass both or neither")
    if not all(isinstance(t, Tensor) and t.dim() == 3 for t in (k, v)):
        shapes = [tuple(t.shape) if isinstance(t, Tensor) else type(t).__name__ for t in (k, v)]
        raise ValueError(f"with `cu_seqlens_k_new`, `k` and `v` are packed new keys [total_new, Hkv, D], got {shapes[0]} and {shapes[1]}")
    _check((("k", k.unsqueeze(0)), ("v", v.unsqueeze(0)), ("k_cache", k_cache), ("v_cache", v_cache)), "packed new keys [total_new, Hkv, D] and the caches")
    if k.shape != v.shape or k.shape[1:] != k_cache.shape[2:]:
        raise ValueError(f"`k` {tuple(k.shape)} and `v` {tuple(v.shape)} must be [total_new, Hkv, D] with k_cache's {tuple(k_cache.shape[2:])}")
    _check_int32("cu_seqlens_k_new", cu_seqlens_k_new, q, 1)
    batch = cu_seqlens_k_new.shape[0] - 1
    if batch < 1:
        raise ValueError("`cu_seqlens_k_new` needs B + 1 >= 2 entries")
    if not isinstance(cache_seqlens, Tensor):
        raise ValueError("packed new keys (cu_seqlens_k_new) need `cache_seqlens` as an int32 tensor [B]")
    _check_int32("cache_seqlens", cache_seqlens, q, 1)
    if cache_seqlens.shape[0] != batch:
        raise ValueError(f"`cu_seqlens_k_new` has {batch + 1} entries, `cache_seqlens` {cache_seqlens.shape[0]}: need B + 1 and B")
    if cache_batch_idx is not None:
        _check_int32("cache_batch_idx", cache_batch_idx, q, 1)
        if cache_batch_idx.shape[0] != batch:
            raise ValueError(f"`cache_batch_idx` has {cache_batch_idx.shape[0]} entries, `cu_seqlens_k_new` {batch + 1}: need B and B + 1")
    if page_table is not None:
        _check_int32("page_table", page_table, q, 2)
    index = interface._entries(cache_batch_idx, batch, q.device)
    if rotary is not None:
        k = interface._rotated_keys(k, rotary, cu_seqlens_k_new)
    interface._write_new_keys(caches, (k, v), cu_seqlens_k_new, cache_seqlens, index, page_table)
    return (cache_seqlens + cu_seqlens_k_new.diff()).to(torch.int32)


def _packed_queries(
    q: Tensor, caches: Tuple[Tensor, Tensor], layout: tuple, extra: tuple, scores: tuple, chunk: int, return_softmax_lse: bool
) -> Union[Tensor, Tuple[Tensor, Tensor]]:
    """`flash_attn_with_kvcache` with `cu_seqlens_q`: packed queries over a paged cache, FlashCore's
    `flash_attn_varlen_func` with a block table, or over a contiguous one
    (`_over_contiguous_entries`). `layout` = (cu_seqlens_q, max_seqlen_q, cache_seqlens,
    page_table); `extra` = (k, rotary, cache_batch_idx, cache_leftpad): `k` refused with
    packed queries (new keys come packed, appended before: `_append_packed_keys`), `rotary`
    the call's checked record (None: none) rotating q from its positions, the last two refused
    with a page table; `scores` (softmax_scale, causal, window_size, softcap) and `chunk` the
    options'."""
    cu_seqlens_q, max_seqlen_q, cache_seqlens, page_table = layout
    k, rotary, cache_batch_idx, cache_leftpad = extra
    if k is not None:
        raise _not_yet("k", "dense new keys with packed queries (cu_seqlens_q): pass them packed, with cu_seqlens_k_new")
    if page_table is not None:
        for name, value in (("cache_batch_idx", cache_batch_idx), ("cache_leftpad", cache_leftpad)):
            if value is not None:
                raise _not_yet(name, "with a page_table")
    if not isinstance(cache_seqlens, Tensor) or max_seqlen_q is None:
        raise ValueError("packed queries (cu_seqlens_q) need `cache_seqlens` as an int32 tensor [B] and `max_seqlen_q`")
    zeros = torch.zeros_like(cu_seqlens_q)  # cu_seqlens_k: unused where seqused_k gives each sequence's keys
    vectors = (cu_seqlens_q, zeros, cache_seqlens)
    options = _options(q, scores, attention_chunk=chunk)
    if rotary is not None:
        _check_int32("cu_seqlens_q", cu_seqlens_q, q, 1)
        q = interface._rotated_queries(q, rotary, options, cu_seqlens_q)
    if page_table is None:
        out, lse = _over_contiguous_entries(q, caches, vectors, (cache_batch_idx, cache_leftpad), int(max_seqlen_q), options)
    else:
        _check_paged_varlen(q, caches, vectors, page_table, max_seqlen_q)
        out, lse = interface._paged_varlen(q, caches, vectors, (page_table, int(max_seqlen_q)), options)
    return (out, lse) if return_softmax_lse else out


def _over_contiguous_entries(
    q: Tensor, caches: Tuple[Tensor, Tensor], vectors: tuple, rows: Tuple[Optional[Tensor], Optional[Tensor]], max_seqlen_q: int, options
) -> Tuple[Tensor, Tensor]:
    """Packed queries `q [total_q, Hq, D]` over a contiguous cache `[entries, S_cache, Hkv, D]`:
    sequence b's keys rows `cache_leftpad[b] ... cache_seqlens[b] - 1` of entry
    `cache_batch_idx[b]` (default b, from row 0), as flash_attn 2's `cache_batch_idx` and
    `cache_leftpad` calls run (`interface._queries_over_entries`: a packed batch over the
    cache's rows, no copy). `vectors` `(cu_seqlens_q, _, cache_seqlens)`, `rows`
    `(cache_batch_idx, cache_leftpad)`."""
    cu_seqlens_q, _, cache_seqlens = vectors
    cache_batch_idx, cache_leftpad = rows
    _check((("q", q.unsqueeze(0) if isinstance(q, Tensor) else q), ("k_cache", caches[0]), ("v_cache", caches[1])), "[total_q, H, D] and the caches [B, S_cache, H, D]")
    batch = cu_seqlens_q.shape[0] - 1 if isinstance(cu_seqlens_q, Tensor) else -1
    for name, t in (("cu_seqlens_q", cu_seqlens_q), ("cache_seqlens", cache_seqlens), ("cache_batch_idx", cache_batch_idx), ("cache_leftpad", cache_leftpad)):
        if t is not None:
            _check_int32(name, t, q, 1)
            if name != "cu_seqlens_q" and t.shape[0] != batch:
                raise ValueError(f"`{name}` has {t.shape[0]} entries, `cu_seqlens_q` {batch + 1}: need B and B + 1")
    if caches[0].shape[0] == 0 or caches[0].shape[1] == 0:
        raise ValueError(f"`k_cache` {tuple(caches[0].shape)} holds no keys")
    index = interface._entries(cache_batch_idx, batch, q.device)
    return interface._queries_over_entries(q, (cu_seqlens_q, max_seqlen_q), caches, (cache_seqlens, index, cache_leftpad), options)


def flash_attn_combine(out_partial: Tensor, lse_partial: Tensor, out: Optional[Tensor] = None, out_dtype: Optional[torch.dtype] = None) -> Tuple[Tensor, Tensor]:
    """FA3's `flash_attn_combine`: partial results of key splits merged by their log-sum-exps.
    `out_partial [splits, ..., D]` and `lse_partial [splits, ...]` (the same leading dims, f32;
    FA3's `[splits, B, S, H, D]` and `[splits, B, S, H]`) → `(out [..., D], lse [...])`:
    `lse = logsumexp` over the splits, `out = Σ exp(lse_i − lse)·out_i`; a row whose every
    split is −inf gets `out = 0`, `lse = −inf`. `out_dtype` (default: `out`'s, else
    `out_partial`'s); written into `out` when given. In PyTorch (a few kernels), not a fused
    kernel."""
    for name, t in (("out_partial", out_partial), ("lse_partial", lse_partial)):
        if not isinstance(t, Tensor):
            raise TypeError(f"`{name}` must be a torch.Tensor, got {type(t).__name__}")
    if out_partial.dim() != lse_partial.dim() + 1 or out_partial.shape[:-1] != lse_partial.shape:
        raise ValueError(f"`out_partial` {tuple(out_partial.shape)} must be `lse_partial` {tuple(lse_partial.shape)} plus a head dim")
    lse = torch.logsumexp(lse_partial.float(), dim=0)
    scale = torch.exp(lse_partial.float() - lse)
    scale = torch.where(torch.isfinite(scale), scale, torch.zeros_like(scale))  # every split -inf: 0, not NaN
    combined = (scale.unsqueeze(-1) * out_partial.float()).sum(0)
    dtype = out_dtype or (out.dtype if out is not None else out_partial.dtype)
    if out is None:
        return combined.to(dtype), lse
    if out.shape != combined.shape:
        raise ValueError(f"`out` {tuple(out.shape)} must be {tuple(combined.shape)}")
    out.copy_(combined)
    return out, lse


def get_scheduler_metadata(*args: object, **kwargs: object) -> None:
    """FA3's scheduling precomputation for `flash_attn_with_kvcache`: FlashCore plans each call
    itself, so there is none; None, which `scheduler_metadata` takes."""
    return None
