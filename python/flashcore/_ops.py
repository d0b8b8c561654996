"""The op layer: `flashcore::fwd` and `flashcore::bwd`, for packed batches
`flashcore::varlen_fwd` and `flashcore::varlen_bwd`, and for KV caches `flashcore::fwd_kvcache`,
registered once with torch.library (fakes for torch.compile; each forward's autograd rule calls
its backward), and the calls into the extension.

Every function and op here takes ALiBi's slopes as its last argument, `alibi_slopes`: None, or
the f32 tensor `[Hq]` or `[B, Hq]` that `interface` checked (contiguous, on q's device). Last
and None by default, so that calls written before ALiBi keep their meaning.

Tensors cross into Rust as (data pointer, shape, strides, dtype name); the kernel runs on
PyTorch's current stream of the tensors' device; outputs and scratch memory come from
PyTorch's caching allocator. Nothing here synchronises.
"""

from __future__ import annotations

import os
from typing import Callable, List, Optional, Tuple

import torch
from torch import Tensor

from . import _flashcore

DTYPE_NAMES = {torch.float16: "f16", torch.bfloat16: "bf16"}


def _arg(t: Tensor) -> tuple:
    return (t.data_ptr(), t.shape, t.stride(), DTYPE_NAMES[t.dtype])


def _vector(t: Tensor) -> Tuple[int, int]:
    return (t.data_ptr(), t.numel())


# Attention dropout: `(p, state)`, p in (0, 1) and `state` the call's generator state, an
# int64 pair (seed, offset) on the device (flash_attn's `rng_state`) that the kernels read
# there, so that a CUDA graph's replays each draw a new one (`interface._dropout`); the mask
# is a function of the pair and the score's place (flashcore::Dropout). None: no dropout.
# With it, `probs` (or None) is where a forward stores each probability, negated where
# dropped (flash_attn's S_dmask, `[B, Hq, rows, cols]` in q's dtype).
Dropout = Tuple[float, Tensor]


def _op_dropout(dropout_p: float, rng_state: Optional[Tensor]) -> Optional[Dropout]:
    """The registered ops' dropout, which their schema carries as `dropout_p` and `rng_state`
    (None: no dropout)."""
    return None if rng_state is None else (dropout_p, rng_state)


def _dropout_arg(dropout: Optional[Dropout]) -> Optional[_flashcore.DropoutArg]:
    """Dropout as the extension takes it: `(p, address of the state)`, or None."""
    return None if dropout is None else (dropout[0], dropout[1].data_ptr())


def _alibi_arg(alibi_slopes: Optional[Tensor]) -> Optional[_flashcore.AlibiArg]:
    """ALiBi's slopes as the extension takes them: `(address, elements)` of the f32 vector, or None."""
    return None if alibi_slopes is None else _vector(alibi_slopes)


def _scratch(like: Tensor) -> Callable[[int], int]:
    """The scratch allocator a call hands to Rust: buffers from the caching allocator on
    `like`'s device, which the call holds until it returns; their reuse is then ordered after
    the work already queued on this stream. (`like.new_empty` measured 1 µs slower a buffer.)"""
    keep: List[Tensor] = []

    def allocate(nbytes: int) -> int:
        buf = torch.empty(nbytes, dtype=torch.uint8, device=like.device)
        keep.append(buf)
        return buf.data_ptr()

    return allocate


def _call(like: Tensor, check: bool = False) -> _flashcore.CallArg:
    """Where a call on `like`'s device runs: PyTorch's current stream of it (the raw handle,
    without building a torch.cuda.Stream or a torch.device: microseconds a call), with scratch
    memory from its caching allocator; `check` first checks a packed batch's or a cache's
    device values."""
    index = like.get_device()
    return (index, torch._C._cuda_getCurrentRawStream(index), _scratch(like), check)


def options_arg(
    softmax_scale: Optional[float], causal: bool, window: Tuple[int, int], softcap: float, num_splits: int = 0, deterministic: bool = False
) -> _flashcore.OptionsArg:
    """Every call's options as the extension takes them. `window` is flash_attn's
    `window_size` (-1 unbounded), `softcap` 0 for none, `num_splits` 0 for FlashCore's choice,
    `deterministic` for a backward."""
    return (softmax_scale, causal, window[0], window[1], softcap, num_splits if num_splits > 0 else None, deterministic)


def _lse_for(q: Tensor) -> Tensor:
    """The f32 log-sum-exp buffer a forward of `q` writes: `[B, Hq, Sq]` for BSHD q, `[Hq,
    total_q]` for a packed q `[total_q, Hq, D]`."""
    *batch, sq, hq, _ = q.shape
    return q.new_empty((*batch, hq, sq), dtype=torch.float32)


def _empty_outputs(q: Tensor, *_: object) -> Tuple[Tensor, Tensor]:
    """Empty `(o like q, lse)`: every forward op's fake (a fake reads only the tensors the
    shapes come from; the op's other arguments, its one signature in the op's definition, pass
    by), and the packed forward's outputs."""
    return q.new_empty(q.shape), _lse_for(q)


def _grads_fake(q: Tensor, k: Tensor, v: Tensor, *_: object) -> Tuple[Tensor, Tensor, Tensor]:
    """Every backward op's fake: `(dq, dk, dv)` like `q`, `k`, `v`. Permissive like the
    forwards': torch.compile traces the backward of every forward whose inputs require grad,
    so a refusal here would fail inference too; the real op refuses when it runs."""
    return torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)


def forward_into(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    o: Tensor,
    lse: Optional[Tensor],
    softmax_scale: float,
    causal: bool,
    window: Tuple[int, int],
    softcap: float,
    num_splits: int,
    alibi_slopes: Optional[Tensor] = None,
    dropout: Optional[Dropout] = None,
    probs: Optional[Tensor] = None,
) -> None:
    """Runs the kernel: `o` (BSHD, q's dtype) and, if given, `lse [B, Hq, Sq]` f32 are written.
    `window` is flash_attn's `window_size` (-1 unbounded), `softcap` 0 for none; `dropout`
    `(p, state)` or None, `probs` where its probabilities go (see `Dropout`)."""
    _flashcore.attention_forward(
        _call(q),
        (_arg(q), _arg(k), _arg(v)),
        (_arg(o), None if lse is None else _vector(lse)),
        options_arg(softmax_scale, causal, window, softcap, num_splits),
        alibi=_alibi_arg(alibi_slopes),
        dropout=_dropout_arg(dropout),
        probs=None if probs is None else _arg(probs),
    )


def forward(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    softmax_scale: float,
    causal: bool,
    window: Tuple[int, int],
    softcap: float,
    num_splits: int,
    want_lse: bool = True,
    alibi_slopes: Optional[Tensor] = None,
    dropout: Optional[Dropout] = None,
    probs: Optional[Tensor] = None,
) -> Tuple[Tensor, Optional[Tensor]]:
    """Attention on BSHD tensors: `(o [B, Sq, Hq, D], lse [B, Hq, Sq] f32)`, lse None unless
    `want_lse`. Rows that see no key (no keys at all, or a causal mask or window that leaves
    them none) give o = 0 and lse = -inf."""
    o = q.new_empty(q.shape)  # new_empty: a few microseconds less than torch.empty(...)
    lse = _lse_for(q) if want_lse else None
    forward_into(q, k, v, o, lse, softmax_scale, causal, window, softcap, num_splits, alibi_slopes, dropout, probs)
    return o, lse


def varlen_forward(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    cu_seqlens_q: Tensor,
    cu_seqlens_k: Tensor,
    seqused_k: Optional[Tensor],
    max_seqlen_q: int,
    max_seqlen_k: int,
    softmax_scale: float,
    causal: bool,
    window: Tuple[int, int],
    softcap: float,
    alibi_slopes: Optional[Tensor] = None,
    checkable: bool = True,
    dropout: Optional[Dropout] = None,
    probs: Optional[Tensor] = None,
) -> Tuple[Tensor, Tensor]:
    """Attention over a packed batch (q [total_q, Hq, D], k, v [total_k, Hkv, D], int32
    cu_seqlens on q's device): `(o [total_q, Hq, D], lse [Hq, total_q] f32)`. With the
    environment variable FLASHCORE_CHECK_VARLEN=1 the cu_seqlens values are checked first
    (this synchronises), unless not `checkable`: sequences placed anywhere in the keys by
    cu_seqlens_k and seqused_k, which the packed-batch contract (starting at 0, rising) does
    not describe (a KV cache's rows: `interface._kvcache_rows`)."""
    o, lse = _empty_outputs(q)
    _flashcore.attention_forward(
        _call(q, checkable and _check_varlen()),
        tuple(_arg(t.unsqueeze(0)) for t in (q, k, v)),
        (_arg(o.unsqueeze(0)), _vector(lse)),
        options_arg(softmax_scale, causal, window, softcap),
        varlen=_varlen_arg(cu_seqlens_q, cu_seqlens_k, seqused_k, max_seqlen_q, max_seqlen_k),
        alibi=_alibi_arg(alibi_slopes),
        dropout=_dropout_arg(dropout),
        probs=None if probs is None else _arg(probs),
    )
    return o, lse


def _varlen_arg(cu_seqlens_q: Tensor, cu_seqlens_k: Tensor, seqused_k: Optional[Tensor], max_seqlen_q: int, max_seqlen_k: int) -> _flashcore.VarlenArg:
    return (_vector(cu_seqlens_q), _vector(cu_seqlens_k), None if seqused_k is None else _vector(seqused_k), max_seqlen_q, max_seqlen_k)


def _check_varlen() -> bool:
    return os.environ.get("FLASHCORE_CHECK_VARLEN", "") not in ("", "0")


def varlen_backward(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    o: Tensor,
    lse: Tensor,
    dout: Tensor,
    cu_seqlens_q: Tensor,
    cu_seqlens_k: Tensor,
    seqused_k: Optional[Tensor],
    max_seqlen_q: int,
    max_seqlen_k: int,
    softmax_scale: float,
    causal: bool,
    deterministic: bool,
    window: Tuple[int, int],
    softcap: float,
    alibi_slopes: Optional[Tensor] = None,
    dropout: Optional[Dropout] = None,
) -> Tuple[Tensor, Tensor, Tensor]:
    """Gradients `(dq, dk, dv)` of a packed batch, laid out like `q`, `k`, `v` (`[total, H,
    D]`), from the forward's `o` and `lse [Hq, total_q]`: every element written (zero for rows
    that saw no key and keys no row saw, those past seqused_k included)."""
    dq, dk, dv = torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)
    varlen_backward_into(
        q, k, v, o, lse, dout, dq, dk, dv, cu_seqlens_q, cu_seqlens_k, seqused_k, max_seqlen_q, max_seqlen_k, softmax_scale, causal, deterministic, window, softcap, alibi_slopes,
        dropout,
    )
    return dq, dk, dv


def varlen_backward_into(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    o: Tensor,
    lse: Tensor,
    dout: Tensor,
    dq: Tensor,
    dk: Tensor,
    dv: Tensor,
    cu_seqlens_q: Tensor,
    cu_seqlens_k: Tensor,
    seqused_k: Optional[Tensor],
    max_seqlen_q: int,
    max_seqlen_k: int,
    softmax_scale: float,
    causal: bool,
    deterministic: bool,
    window: Tuple[int, int],
    softcap: float,
    alibi_slopes: Optional[Tensor] = None,
    dropout: Optional[Dropout] = None,
) -> None:
    """`varlen_backward` into the given `dq`, `dk`, `dv` (packed like q, k, v; every element
    written)."""
    if dout.stride(-1) != 1:
        dout = dout.contiguous()  # autograd may hand over any layout; the kernels read rows
    _flashcore.attention_backward(
        _call(q, _check_varlen()),
        (*(_arg(t.unsqueeze(0)) for t in (q, k, v, o)), _vector(lse), _arg(dout.unsqueeze(0))),
        tuple(_arg(t.unsqueeze(0)) for t in (dq, dk, dv)),
        options_arg(softmax_scale, causal, window, softcap, deterministic=deterministic),
        varlen=_varlen_arg(cu_seqlens_q, cu_seqlens_k, seqused_k, max_seqlen_q, max_seqlen_k),
        alibi=_alibi_arg(alibi_slopes),
        dropout=_dropout_arg(dropout),
    )


@torch.library.custom_op("flashcore::varlen_fwd", mutates_args=(), device_types="cuda")
def varlen_fwd(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    cu_seqlens_q: Tensor,
    cu_seqlens_k: Tensor,
    seqused_k: Optional[Tensor],
    max_seqlen_q: int,
    max_seqlen_k: int,
    softmax_scale: float,
    causal: bool,
    window_left: int,
    window_right: int,
    softcap: float,
    deterministic: bool,
    alibi_slopes: Optional[Tensor] = None,
    dropout_p: float = 0.0,
    rng_state: Optional[Tensor] = None,
) -> Tuple[Tensor, Tensor]:
    """The registered packed-batch op: see `varlen_forward`. `deterministic` is for its
    backward; dropout is `dropout_p` with its state `rng_state` (see `Dropout`)."""
    window = (window_left, window_right)
    return varlen_forward(
        q, k, v, cu_seqlens_q, cu_seqlens_k, seqused_k, max_seqlen_q, max_seqlen_k, softmax_scale, causal, window, softcap, alibi_slopes, True,
        _op_dropout(dropout_p, rng_state),
    )


varlen_fwd.register_fake(_empty_outputs)


@torch.library.custom_op("flashcore::varlen_bwd", mutates_args=(), device_types="cuda")
def varlen_bwd(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    o: Tensor,
    lse: Tensor,
    dout: Tensor,
    cu_seqlens_q: Tensor,
    cu_seqlens_k: Tensor,
    seqused_k: Optional[Tensor],
    max_seqlen_q: int,
    max_seqlen_k: int,
    softmax_scale: float,
    causal: bool,
    deterministic: bool,
    window_left: int,
    window_right: int,
    softcap: float,
    alibi_slopes: Optional[Tensor] = None,
    dropout_p: float = 0.0,
    rng_state: Optional[Tensor] = None,
) -> Tuple[Tensor, Tensor, Tensor]:
    """The registered packed-batch backward op: see `varlen_backward`."""
    window = (window_left, window_right)
    return varlen_backward(
        q, k, v, o, lse, dout, cu_seqlens_q, cu_seqlens_k, seqused_k, max_seqlen_q, max_seqlen_k, softmax_scale, causal, deterministic, window, softcap, alibi_slopes,
        _op_dropout(dropout_p, rng_state),
    )


varlen_bwd.register_fake(_grads_fake)


def _varlen_setup_context(ctx, inputs, output) -> None:
    q, k, v, cu_seqlens_q, cu_seqlens_k, seqused_k, max_seqlen_q, max_seqlen_k, softmax_scale, causal, window_left, window_right, softcap, deterministic, alibi_slopes, dropout_p, rng_state = inputs
    o, lse = output
    ctx.save_for_backward(q, k, v, o, lse, cu_seqlens_q, cu_seqlens_k, seqused_k, alibi_slopes, rng_state)
    ctx.max_seqlen_q, ctx.max_seqlen_k, ctx.softmax_scale, ctx.causal, ctx.deterministic = max_seqlen_q, max_seqlen_k, softmax_scale, causal, deterministic
    ctx.dropout_p = dropout_p
    ctx.window_left, ctx.window_right, ctx.softcap = window_left, window_right, softcap
    _lse_has_no_gradient(ctx, lse)


def _lse_has_no_gradient(ctx, lse: Tensor) -> None:
    """lse is not differentiable, and autograd is told not to fill a zero gradient for it (or
    for an `o` the loss did not use): a kernel launch fewer each backward."""
    ctx.mark_non_differentiable(lse)
    ctx.set_materialize_grads(False)


def _varlen_backward(ctx, grad_o, grad_lse):
    if grad_o is None:  # the loss did not use o
        return (None,) * 17
    q, k, v, o, lse, cu_seqlens_q, cu_seqlens_k, seqused_k, alibi_slopes, rng_state = ctx.saved_tensors
    dq, dk, dv = varlen_bwd(
        q,
        k,
        v,
        o,
        lse,
        grad_o,
        cu_seqlens_q,
        cu_seqlens_k,
        seqused_k,
        ctx.max_seqlen_q,
        ctx.max_seqlen_k,
        ctx.softmax_scale,
        ctx.causal,
        ctx.deterministic,
        ctx.window_left,
        ctx.window_right,
        ctx.softcap,
        alibi_slopes,
        ctx.dropout_p,
        rng_state,
    )
    return (dq, dk, dv) + (None,) * 14


varlen_fwd.register_autograd(_varlen_backward, setup_context=_varlen_setup_context)


def kvcache_forward(
    q: Tensor,
    k_cache: Tensor,
    v_cache: Tensor,
    k: Optional[Tensor],
    v: Optional[Tensor],
    cache_seqlens: Optional[Tensor],
    block_table: Optional[Tensor],
    softmax_scale: float,
    causal: bool,
    window: Tuple[int, int],
    softcap: float,
    num_splits: int,
    want_lse: bool,
    alibi_slopes: Optional[Tensor] = None,
) -> Tuple[Tensor, Optional[Tensor]]:
    """Attention over a KV cache (see `flash_attn_with_kvcache`): `(o [B, Sq, Hq, D], lse
    [B, Hq, Sq] f32 or None)`; `k`, `v` are first written into the caches at
    `cache_seqlens[b]...`. With the environment variable FLASHCORE_CHECK_PAGED=1 the table and
    lengths are checked first (this synchronises)."""
    o = q.new_empty(q.shape)
    lse = _lse_for(q) if want_lse else None
    table = None if block_table is None else (block_table.data_ptr(), (block_table.shape[0], block_table.shape[1]), block_table.stride(0))
    _flashcore.attention_forward(
        _call(q, os.environ.get("FLASHCORE_CHECK_PAGED", "") not in ("", "0")),
        (_arg(q), _arg(k_cache), _arg(v_cache)),
        (_arg(o), None if lse is None else _vector(lse)),
        options_arg(softmax_scale, causal, window, softcap, num_splits),
        paged=(None if k is None else _arg(k), None if v is None else _arg(v), None if cache_seqlens is None else _vector(cache_seqlens), table, None),
        alibi=_alibi_arg(alibi_slopes),
    )
    return o, lse


def _table_arg(block_table: Tensor) -> tuple:
    return (block_table.data_ptr(), (block_table.shape[0], block_table.shape[1]), block_table.stride(0))


def paged_varlen_forward(
    q: Tensor,
    k_cache: Tensor,
    v_cache: Tensor,
    cu_seqlens_q: Tensor,
    seqlens_k: Tensor,
    block_table: Tensor,
    max_seqlen_q: int,
    softmax_scale: float,
    causal: bool,
    window: Tuple[int, int],
    softcap: float,
    alibi_slopes: Optional[Tensor] = None,
) -> Tuple[Tensor, Tensor]:
    """Packed queries over a paged cache (flash_attn's varlen call with a block table):
    `(o [total_q, Hq, D], lse [Hq, total_q] f32)`; sequence b's queries rows
    `cu_seqlens_q[b]...` of q, its keys the first `seqlens_k[b]` of its table row. With
    FLASHCORE_CHECK_PAGED=1 the vectors and the table are checked first (this synchronises)."""
    o, lse = _empty_outputs(q)
    _flashcore.attention_forward(
        _call(q, os.environ.get("FLASHCORE_CHECK_PAGED", "") not in ("", "0")),
        (_arg(q.unsqueeze(0)), _arg(k_cache), _arg(v_cache)),
        (_arg(o.unsqueeze(0)), _vector(lse)),
        options_arg(softmax_scale, causal, window, softcap),
        paged=(None, None, _vector(seqlens_k), _table_arg(block_table), (_vector(cu_seqlens_q), max_seqlen_q)),
        alibi=_alibi_arg(alibi_slopes),
    )
    return o, lse


@torch.library.custom_op("flashcore::varlen_fwd_paged", mutates_args=(), device_types="cuda")
def varlen_fwd_paged(
    q: Tensor,
    k_cache: Tensor,
    v_cache: Tensor,
    cu_seqlens_q: Tensor,
    seqlens_k: Tensor,
    block_table: Tensor,
    max_seqlen_q: int,
    softmax_scale: float,
    causal: bool,
    window_left: int,
    window_right: int,
    softcap: float,
    alibi_slopes: Optional[Tensor] = None,
) -> Tuple[Tensor, Tensor]:
    """The registered op of packed queries over a paged cache: see `paged_varlen_forward`."""
    window = (window_left, window_right)
    return paged_varlen_forward(q, k_cache, v_cache, cu_seqlens_q, seqlens_k, block_table, max_seqlen_q, softmax_scale, causal, window, softcap, alibi_slopes)


varlen_fwd_paged.register_fake(_empty_outputs)


# The caches are written (the appended keys): the op says so, so that torch.compile orders it.
@torch.library.custom_op("flashcore::fwd_kvcache", mutates_args=("k_cache", "v_cache"), device_types="cuda")
def fwd_kvcache(
    q: Tensor,
    k_cache: Tensor,
    v_cache: Tensor,
    k: Optional[Tensor],
    v: Optional[Tensor],
    cache_seqlens: Optional[Tensor],
    block_table: Optional[Tensor],
    softmax_scale: float,
    causal: bool,
    window_left: int,
    window_right: int,
    softcap: float,
    num_splits: int,
    alibi_slopes: Optional[Tensor] = None,
) -> Tuple[Tensor, Tensor]:
    """The registered KV-cache op: see `kvcache_forward`."""
    window = (window_left, window_right)
    o, lse = kvcache_forward(q, k_cache, v_cache, k, v, cache_seqlens, block_table, softmax_scale, causal, window, softcap, num_splits, True, alibi_slopes)
    return o, lse


fwd_kvcache.register_fake(_empty_outputs)


# The op's schema holds only tensors and scalars: the window travels as its two sides.
@torch.library.custom_op("flashcore::fwd", mutates_args=(), device_types="cuda")
def fwd(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    softmax_scale: float,
    causal: bool,
    window_left: int,
    window_right: int,
    softcap: float,
    num_splits: int,
    deterministic: bool,
    alibi_slopes: Optional[Tensor] = None,
    dropout_p: float = 0.0,
    rng_state: Optional[Tensor] = None,
) -> Tuple[Tensor, Tensor]:
    """The registered op: see `forward`. `deterministic` is for its backward; dropout is
    `dropout_p` with its state `rng_state` (see `Dropout`)."""
    window = (window_left, window_right)
    return forward(q, k, v, softmax_scale, causal, window, softcap, num_splits, True, alibi_slopes, _op_dropout(dropout_p, rng_state))


fwd.register_fake(_empty_outputs)


def backward(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    o: Tensor,
    lse: Tensor,
    dout: Tensor,
    softmax_scale: float,
    causal: bool,
    deterministic: bool,
    window: Tuple[int, int],
    softcap: float,
    alibi_slopes: Optional[Tensor] = None,
    dropout: Optional[Dropout] = None,
) -> Tuple[Tensor, Tensor, Tensor]:
    """Gradients `(dq, dk, dv)`, laid out like `q`, `k`, `v` (dk and dv summed over the query
    heads that share a KV head), under the forward's `window`, `softcap` and `alibi_slopes`
    (the backward kernels' forms of them; the slopes get no gradient)."""
    dq, dk, dv = torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)
    # empty_like of a contiguous tensor has its strides: the grads then cross as addresses.
    like_inputs = q.is_contiguous() and k.is_contiguous() and v.is_contiguous()
    backward_into(q, k, v, o, lse, dout, dq, dk, dv, softmax_scale, causal, deterministic, window, softcap, alibi_slopes, dropout, like_inputs)
    return dq, dk, dv


def backward_into(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    o: Tensor,
    lse: Tensor,
    dout: Tensor,
    dq: Tensor,
    dk: Tensor,
    dv: Tensor,
    softmax_scale: float,
    causal: bool,
    deterministic: bool,
    window: Tuple[int, int],
    softcap: float,
    alibi_slopes: Optional[Tensor] = None,
    dropout: Optional[Dropout] = None,
    grads_like_inputs: bool = False,
) -> None:
    """`backward` into the given `dq`, `dk`, `dv` (BSHD like q, k, v; every element written).
    `grads_like_inputs`: the caller vouches that each grad has its input's shape and strides,
    so only their addresses cross into the extension."""
    if dout.stride(-1) != 1:
        dout = dout.contiguous()  # autograd may hand over any layout; the kernels read rows
    grads = (dq.data_ptr(), dk.data_ptr(), dv.data_ptr()) if grads_like_inputs else (_arg(dq), _arg(dk), _arg(dv))
    _flashcore.attention_backward(
        _call(q),
        (_arg(q), _arg(k), _arg(v), _arg(o), _vector(lse), _arg(dout)),
        grads,
        options_arg(softmax_scale, causal, window, softcap, deterministic=deterministic),
        alibi=_alibi_arg(alibi_slopes),
        dropout=_dropout_arg(dropout),
    )


@torch.library.custom_op("flashcore::bwd", mutates_args=(), device_types="cuda")
def bwd(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    o: Tensor,
    lse: Tensor,
    dout: Tensor,
    softmax_scale: float,
    causal: bool,
    deterministic: bool,
    window_left: int,
    window_right: int,
    softcap: float,
    alibi_slopes: Optional[Tensor] = None,
    dropout_p: float = 0.0,
    rng_state: Optional[Tensor] = None,
) -> Tuple[Tensor, Tensor, Tensor]:
    """The registered backward op: see `backward`."""
    window = (window_left, window_right)
    return backward(q, k, v, o, lse, dout, softmax_scale, causal, deterministic, window, softcap, alibi_slopes, _op_dropout(dropout_p, rng_state))


bwd.register_fake(_grads_fake)


def _fwd_setup_context(ctx, inputs, output) -> None:
    q, k, v, softmax_scale, causal, window_left, window_right, softcap, _, deterministic, alibi_slopes, dropout_p, rng_state = inputs
    o, lse = output
    ctx.save_for_backward(q, k, v, o, lse, alibi_slopes, rng_state)
    ctx.softmax_scale, ctx.causal, ctx.deterministic, ctx.dropout_p = softmax_scale, causal, deterministic, dropout_p
    ctx.window_left, ctx.window_right, ctx.softcap = window_left, window_right, softcap
    _lse_has_no_gradient(ctx, lse)


def _fwd_backward(ctx, grad_o, grad_lse):
    if grad_o is None:  # the loss did not use o
        return (None,) * 13
    q, k, v, o, lse, alibi_slopes, rng_state = ctx.saved_tensors
    window_left, window_right = ctx.window_left, ctx.window_right
    dq, dk, dv = bwd(q, k, v, o, lse, grad_o, ctx.softmax_scale, ctx.causal, ctx.deterministic, window_left, window_right, ctx.softcap, alibi_slopes, ctx.dropout_p, rng_state)
    return (dq, dk, dv) + (None,) * 10


fwd.register_autograd(_fwd_backward, setup_context=_fwd_setup_context)


# The eager path with autograd. torch.library's Python autograd layer (the op's dispatch,
# its default filling and its autograd wrapper) cost ~80 µs a call in training mode on the
# H100 host, five times SDPA's whole call; outside torch.compile the public functions call
# the extension through these instead (the ops above stay for torch.compile and export).
# Both go through `forward` / `backward` and their packed forms: one implementation.


class Attention(torch.autograd.Function):
    """`forward` with `backward` as its gradient, for eager calls that record autograd. It
    takes q, k, v and one tuple of options, and gives `o` alone unless the caller wants lse:
    `Function.apply`'s own host cost grows with each argument and output (on the H100 host, B1
    S128: 12 µs with three tensors in and one out, 22 with nine arguments in, two out and lse
    marked non-differentiable). The ALiBi slopes ride in the options too: they get no gradient,
    so they need not be an argument of `apply` of their own, and `ctx.options` keeps them alive
    for the backward."""

    @staticmethod
    def forward(ctx, q, k, v, options):
        softmax_scale, causal, window, softcap, num_splits, deterministic, want_lse, alibi_slopes, dropout, probs = options
        o, lse = forward(q, k, v, softmax_scale, causal, window, softcap, num_splits, True, alibi_slopes, dropout, probs)
        ctx.save_for_backward(q, k, v, o, lse)
        ctx.options = (softmax_scale, causal, deterministic, window, softcap, alibi_slopes, dropout)
        if want_lse:
            _lse_has_no_gradient(ctx, lse)
            return o, lse
        return o

    @staticmethod
    def backward(ctx, grad_o, *_grad_lse):
        if grad_o is None:  # the loss did not use o
            return None, None, None, None
        q, k, v, o, lse = ctx.saved_tensors
        dq, dk, dv = backward(q, k, v, o, lse, grad_o, *ctx.options)
        return dq, dk, dv, None


class VarlenAttention(torch.autograd.Function):
    """`varlen_forward` with `varlen_backward` as its gradient, for eager calls that record
    autograd: q, k, v, the batch `(cu_seqlens_q, cu_seqlens_k, seqused_k, max_seqlen_q,
    max_seqlen_k)` and the options (the ALiBi slopes among them) in a tuple each, `(o, lse)`
    out (see `Attention`)."""

    @staticmethod
    def forward(ctx, q, k, v, batch, options):
        cu_seqlens_q, cu_seqlens_k, seqused_k, max_seqlen_q, max_seqlen_k = batch
        softmax_scale, causal, window, softcap, deterministic, alibi_slopes, dropout, probs = options
        args = (max_seqlen_q, max_seqlen_k, softmax_scale, causal, window, softcap, alibi_slopes, True, dropout, probs)
        o, lse = varlen_forward(q, k, v, cu_seqlens_q, cu_seqlens_k, seqused_k, *args)
        ctx.save_for_backward(q, k, v, o, lse, cu_seqlens_q, cu_seqlens_k, seqused_k)
        ctx.options = (max_seqlen_q, max_seqlen_k, softmax_scale, causal, deterministic, window, softcap, alibi_slopes, dropout)
        _lse_has_no_gradient(ctx, lse)
        return o, lse

    @staticmethod
    def backward(ctx, grad_o, grad_lse):
        if grad_o is None:  # the loss did not use o
            return None, None, None, None, None
        q, k, v, o, lse, cu_seqlens_q, cu_seqlens_k, seqused_k = ctx.saved_tensors
        dq, dk, dv = varlen_backward(q, k, v, o, lse, grad_o, cu_seqlens_q, cu_seqlens_k, seqused_k, *ctx.options)
        return dq, dk, dv, None, None


_UNWRAP_IF_DEAD = torch._C._functorch.unwrap_if_dead
_C_APPLY = {f: torch._C._FunctionBase.__dict__["apply"].__get__(None, f) for f in (Attention, VarlenAttention)}


def record(function: type, q: Tensor, k: Tensor, v: Tensor, *rest: object):
    """`function.apply(q, k, v, *rest)` for `Attention` or `VarlenAttention`, minus
    `Function.apply`'s Python wrapper where that wrapper adds nothing: with no functorch
    transform active it only unwraps dead functorch wrappers (done here, on the three tensors;
    the rest are tuples, which it leaves alone too) and calls the C method
    `_FunctionBase.apply`, while its own frame, `setup_context` test and generator over the
    arguments cost a few microseconds a call."""
    if torch._C._are_functorch_transforms_active():
        return function.apply(q, k, v, *rest)
    return _C_APPLY[function](_UNWRAP_IF_DEAD(q), _UNWRAP_IF_DEAD(k), _UNWRAP_IF_DEAD(v), *rest)
