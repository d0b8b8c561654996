"""flash_attn's low-level functions, as the libraries built on FlashAttention call them
(ring and sequence-parallel attention, serving engines): `_flash_attn_forward`,
`_flash_attn_backward`, `_flash_attn_varlen_forward`, `_flash_attn_varlen_backward`, with
flash-attn 2.8's parameter names, order, defaults and return values (libraries read them by
name, e.g. with `inspect.getfullargspec`).

- The forwards return `(out, softmax_lse, S_dmask, rng_state)`: `softmax_lse` `[B, Hq, Sq]`
  (packed: `[Hq, total_q]`) f32, natural log; `S_dmask` an empty tensor (no dropout, so no
  mask to return) and `rng_state` two int64 zeros, both only so that the tuple unpacks (with
  dropout, see below).
- `alibi_slopes` (f32 `[Hq]` or `[B, Hq]`) as in `flashcore.flash_attn_func`. Under a causal
  mask with no left window, flash-attn's causal kernels add `slope · j` to the scores where
  FlashCore adds `slope · (j - i - Sk + Sq)`: the same output, and flash-attn's `softmax_lse`
  is FlashCore's plus `slope · (i + Sk - Sq)` on row i. The backwards take FlashCore's.
- The backwards write `dq`, `dk`, `dv` into the caller's buffers (allocated here when None,
  as flash-attn does, and then lost to the caller) and return `softmax_d`, rowsum(dO ∘ O) in
  f32 laid out as flash-attn lays it out: `[B, Hq, round_up(Sq, 128)]`, packed `[Hq, total_q
  + 128·B]` with sequence b's rows from `cu_seqlens_q[b] + 128·b`. FlashCore's kernels keep
  their D_i internally; this one is computed by PyTorch after the kernel (a pass over dO and
  O), since few callers read it.

Plain eager functions (not registered ops): under torch.compile they run as a graph break.
What FlashCore does not have raises `NotImplementedError` naming the argument: the packed
forward's `leftpad_k`. With `dropout_p > 0`, `rng_state` is the (seed, offset) pair on the
device the backward needs (drawn per call, CUDA-graph safe), and `return_softmax` returns the
probabilities (see `flash_attn_func`).
"""

from __future__ import annotations

from typing import Optional, Tuple

import torch
from torch import Tensor

from . import _ops
from ._args import _check, _check_packed, _check_paged_varlen, _dropout, _no_dropout, _num_splits, _options, _probs_for, _unsupported
from .interface import _paged_varlen


def _last_dim_contiguous(*tensors: Tensor) -> Tuple[Tensor, ...]:
    return tuple(t if t.stride(-1) == 1 else t.contiguous() for t in tensors)


def _placeholders(q: Tensor, dropout: Optional[_ops.Dropout] = None, probs: Optional[Tensor] = None) -> Tuple[Tensor, Tensor]:
    """flash-attn's `S_dmask` (the probabilities with dropout and return_softmax, else empty)
    and `rng_state`: with dropout, its generator state, the int64 pair (seed, offset) on q's
    device that the backward takes (as flash-attn's); without, two int64 zeros on the host."""
    state = dropout[1] if dropout is not None else torch.zeros(2, dtype=torch.int64)
    return (probs if probs is not None else torch.empty((0,), dtype=q.dtype, device=q.device)), state


def _dropout_from(q: Tensor, dropout_p: float, rng_state: Optional[Tensor]) -> Optional[_ops.Dropout]:
    """The forward's dropout from `dropout_p` and its `rng_state` (`_placeholders`: an int64
    pair on q's device), or the ValueError naming `rng_state` when dropout has none."""
    if dropout_p == 0.0:
        return None
    if not isinstance(rng_state, Tensor) or rng_state.numel() != 2 or rng_state.dtype != torch.int64 or rng_state.device != q.device:
        got = f"{tuple(rng_state.shape)} {rng_state.dtype} on {rng_state.device}" if isinstance(rng_state, Tensor) else type(rng_state).__name__
        raise ValueError(f"`rng_state`: the forward's int64 (seed, offset) pair on {q.device} is required with dropout_p > 0, got {got}")
    return (float(dropout_p), rng_state.contiguous())


def _rowsum_do_o(dout: Tensor, out: Tensor) -> Tensor:
    """rowsum(dO ∘ O) in f32 over the last dim: `[..., S, H]`."""
    return torch.einsum("...d,...d->...", dout.float(), out.float())


def _flash_attn_forward(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    dropout_p: float,
    softmax_scale: float,
    causal: bool,
    window_size_left: int,
    window_size_right: int,
    softcap: float,
    alibi_slopes: Optional[Tensor],
    return_softmax: bool,
) -> Tuple[Tensor, Tensor, Tensor, Tensor]:
    """Attention on BSHD `q [B, Sq, Hq, D]`, `k`, `v [B, Sk, Hkv, D]`: `(out, softmax_lse,
    S_dmask, rng_state)` (see the module). `return_softmax` asks for the dropout mask, which
    without dropout is empty."""
    q, k, v = _last_dim_contiguous(q, k, v)
    _check((("q", q), ("k", k), ("v", v)), "[B, S, H, D]")
    window = (window_size_left, window_size_right)
    options = _options(q, (softmax_scale, causal, window, softcap), alibi_slopes, dropout=_dropout(q, dropout_p))
    probs = _probs_for(q.shape, q.shape[0], q.shape[1], k.shape[1], q) if options.dropout is not None and return_softmax else None
    out, lse = _ops.forward(q, k, v, options, True, probs)
    return (out, lse, *_placeholders(q, options.dropout, probs))


def _flash_attn_varlen_forward(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    cu_seqlens_q: Tensor,
    cu_seqlens_k: Tensor,
    max_seqlen_q: int,
    max_seqlen_k: int,
    dropout_p: float,
    softmax_scale: float,
    causal: bool,
    window_size_left: int = -1,
    window_size_right: int = -1,
    softcap: float = 0.0,
    alibi_slopes: Optional[Tensor] = None,
    return_softmax: bool = False,
    block_table: Optional[Tensor] = None,
    leftpad_k: Optional[Tensor] = None,
    seqused_k: Optional[Tensor] = None,
    zero_tensors: bool = False,
    num_splits: int = 0,
) -> Tuple[Tensor, Tensor, Tensor, Tensor]:
    """Attention over a packed batch (`q [total_q, Hq, D]`, `k`, `v [total_k, Hkv, D]`, int32
    `cu_seqlens_*` on q's device): `(out, softmax_lse [Hq, total_q], S_dmask, rng_state)`.
    flash-attn's main branch's `zero_tensors` (every output is written: nothing to zero) and
    `num_splits` (0 FlashCore's choice, 1 unsplit, n > 1 that many where fwd_sm80 splits) too."""
    if leftpad_k is not None:
        raise _unsupported("leftpad_k", "<tensor>")
    window = (window_size_left, window_size_right)
    splits = _num_splits(num_splits)
    if block_table is not None:
        vectors = (cu_seqlens_q, cu_seqlens_k, seqused_k)
        _check_paged_varlen(q, (k, v), vectors, block_table, max_seqlen_q)
        _no_dropout(dropout_p)
        options = _options(q, (softmax_scale, causal, window, softcap), alibi_slopes, num_splits=splits)
        out, lse = _paged_varlen(q, (k, v), vectors, (block_table, int(max_seqlen_q)), options)
        return (out, lse, *_placeholders(q))
    q, k, v = _last_dim_contiguous(q, k, v)
    _check_packed(q, k, v, cu_seqlens_q, cu_seqlens_k, seqused_k)
    options = _options(q, (softmax_scale, causal, window, softcap), alibi_slopes, dropout=_dropout(q, dropout_p), num_splits=splits)
    batch = _ops.Batch(cu_seqlens_q, cu_seqlens_k, seqused_k, int(max_seqlen_q), int(max_seqlen_k))
    probs = None
    if options.dropout is not None and return_softmax:
        probs = _probs_for(q.shape, cu_seqlens_q.shape[0] - 1, batch.max_seqlen_q, batch.max_seqlen_k, q)
    out, lse = _ops.varlen_forward(q, k, v, batch, options, probs)
    return (out, lse, *_placeholders(q, options.dropout, probs))


def _grad_buffers(q: Tensor, k: Tensor, v: Tensor, dq: Optional[Tensor], dk: Optional[Tensor], dv: Optional[Tensor]) -> Tuple[Tensor, Tensor, Tensor]:
    """The caller's gradient buffers, each like its input, or new ones where None."""
    out = []
    for name, like, buf in (("dq", q, dq), ("dk", k, dk), ("dv", v, dv)):
        if buf is None:
            buf = torch.empty_like(like)
        elif not isinstance(buf, Tensor) or buf.shape != like.shape or buf.dtype != like.dtype or buf.device != like.device:
            got = f"{tuple(buf.shape)} {buf.dtype} on {buf.device}" if isinstance(buf, Tensor) else type(buf).__name__
            raise ValueError(f"`{name}` must be shaped, typed and placed like its input ({tuple(like.shape)} {like.dtype} on {like.device}), got {got}")
        out.append(buf)
    return out[0], out[1], out[2]


def _flash_attn_backward(
    dout: Tensor,
    q: Tensor,
    k: Tensor,
    v: Tensor,
    out: Tensor,
    softmax_lse: Tensor,
    dq: Optional[Tensor],
    dk: Optional[Tensor],
    dv: Optional[Tensor],
    dropout_p: float,
    softmax_scale: float,
    causal: bool,
    window_size_left: int,
    window_size_right: int,
    softcap: float,
    alibi_slopes: Optional[Tensor],
    deterministic: bool,
    rng_state: Optional[Tensor] = None,
) -> Tensor:
    """Gradients of attention on BSHD tensors into `dq`, `dk`, `dv`, from the forward's `out`
    and `softmax_lse [B, Hq, Sq]`; returns `softmax_d [B, Hq, round_up(Sq, 128)]`. The
    `softmax_lse` and `out` may be a merge of several calls (ring attention's): the gradient
    is that of the attention they describe."""
    dout, q, k, v, out = _last_dim_contiguous(dout, q, k, v, out)
    _check((("q", q), ("k", k), ("v", v), ("out", out), ("dout", dout)), "[B, S, H, D]")
    window = (window_size_left, window_size_right)
    options = _options(q, (softmax_scale, causal, window, softcap), alibi_slopes, deterministic, _dropout_from(q, dropout_p, rng_state))
    softmax_lse = _lse_arg(softmax_lse, (q.shape[0], q.shape[2], q.shape[1]), q)
    grads = _grad_buffers(q, k, v, dq, dk, dv)
    _ops.backward_into((q, k, v, out, softmax_lse), dout, grads, options)
    b, sq, h, _ = q.shape
    softmax_d = torch.zeros((b, h, (sq + 127) // 128 * 128), dtype=torch.float32, device=q.device)
    softmax_d[:, :, :sq] = _rowsum_do_o(dout, out).transpose(1, 2)
    return softmax_d


def _flash_attn_varlen_backward(
    dout: Tensor,
    q: Tensor,
    k: Tensor,
    v: Tensor,
    out: Tensor,
    softmax_lse: Tensor,
    dq: Optional[Tensor],
    dk: Optional[Tensor],
    dv: Optional[Tensor],
    cu_seqlens_q: Tensor,
    cu_seqlens_k: Tensor,
    max_seqlen_q: int,
    max_seqlen_k: int,
    dropout_p: float,
    softmax_scale: float,
    causal: bool,
    window_size_left: int,
    window_size_right: int,
    softcap: float,
    alibi_slopes: Optional[Tensor],
    deterministic: bool,
    rng_state: Optional[Tensor] = None,
) -> Tensor:
    """Gradients of attention over a packed batch into `dq`, `dk`, `dv`, from `out` and
    `softmax_lse [Hq, total_q]`; returns `softmax_d [Hq, total_q + 128·B]` (sequence b's rows
    from `cu_seqlens_q[b] + 128·b`)."""
    dout, q, k, v, out = _last_dim_contiguous(dout, q, k, v, out)
    _check_packed(q, k, v, cu_seqlens_q, cu_seqlens_k, None)
    _check((("q", q.unsqueeze(0)), ("out", out.unsqueeze(0)), ("dout", dout.unsqueeze(0))), "[total, H, D]")
    window = (window_size_left, window_size_right)
    options = _options(q, (softmax_scale, causal, window, softcap), alibi_slopes, deterministic, _dropout_from(q, dropout_p, rng_state))
    softmax_lse = _lse_arg(softmax_lse, (q.shape[1], q.shape[0]), q)
    grads = _grad_buffers(q, k, v, dq, dk, dv)
    batch = _ops.Batch(cu_seqlens_q, cu_seqlens_k, None, int(max_seqlen_q), int(max_seqlen_k))
    _ops.varlen_backward_into((q, k, v, out, softmax_lse), dout, grads, batch, options)
    total, h = q.shape[0], q.shape[1]
    batch = cu_seqlens_q.shape[0] - 1
    softmax_d = torch.zeros((h, total + 128 * batch), dtype=torch.float32, device=q.device)
    rows = torch.arange(total, device=q.device)
    sequence = torch.searchsorted(cu_seqlens_q[1:], rows.to(torch.int32), right=True)  # no host sync
    softmax_d[:, rows + 128 * sequence] = _rowsum_do_o(dout, out).transpose(0, 1)
    return softmax_d


def _lse_arg(lse: object, shape: Tuple[int, ...], q: Tensor) -> Tensor:
    """`softmax_lse` checked, contiguous (a merged LSE often arrives as a transposed view)."""
    if not isinstance(lse, Tensor):
        raise TypeError(f"`softmax_lse` must be a torch.Tensor, got {type(lse).__name__}")
    if lse.dtype != torch.float32 or tuple(lse.shape) != shape or lse.device != q.device:
        raise ValueError(f"`softmax_lse` must be a float32 tensor of shape {shape} on {q.device}, got {tuple(lse.shape)} {lse.dtype} on {lse.device}")
    return lse.contiguous()
