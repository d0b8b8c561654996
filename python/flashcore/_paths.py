"""The paths a call of a dense or packed batch takes to the kernels: `route` picks one (the
native operator, the Python autograd node, the extension directly, or the registered op),
`_attention` and `_varlen_attention` run it, with the inputs zero-padded first to the head
dim the core runs the call at (`_run_head_dim`).
"""

from __future__ import annotations

from typing import Dict, Optional, Tuple

import torch
from torch import Tensor

from . import _flashcore, _native, _ops
from ._args import _unsupported


def _eager(q: Tensor, k: Tensor, v: Tensor) -> bool:
    """Whether the call can skip the registered op and call the extension directly: plain
    tensors (no fake or subclass) and no tracing. The op's dispatch costs a few microseconds,
    and with autograd tens of microseconds (see `_ops.Attention`). Spelled out for three
    tensors rather than a generator: this runs on every call."""
    return type(q) is Tensor and type(k) is Tensor and type(v) is Tensor and not torch.compiler.is_compiling()


def _records_grad(q: Tensor, k: Tensor, v: Tensor) -> bool:
    return (q.requires_grad or k.requires_grad or v.requires_grad) and torch.is_grad_enabled()


# The paths an eager or traced call of a dense or packed batch can take (`route`), as `explain` names them.
NATIVE = "native operator"  # flashcore_native::attention / ::varlen_attention: autograd in C++ (`_native`)
AUTOGRAD = "Python autograd"  # the extension through `_ops.Attention` / `VarlenAttention` (autograd records)
DIRECT = "extension"  # the extension called directly (nothing to record)
OP = "registered op"  # torch.ops.flashcore.fwd: traced, compiled, fake or subclass tensors


def route(q: Tensor, k: Tensor, v: Tensor, dropout: Optional[_ops.Dropout], sink: Optional[Tensor] = None) -> str:
    """The one place that picks the path of a dense or packed batch's call (`_attention`,
    `_varlen_attention`): the registered op unless the call is eager on plain tensors, or when
    learnable sinks want a gradient (the op's autograd computes it); then the native operator
    where it is built (not with dropout, whose mask state it does not carry, nor with sinks,
    nor with V's own head dim, nor under a functorch transform); else the Python autograd node
    when autograd records, else the extension directly."""
    if not _eager(q, k, v):
        return OP
    if sink is not None:
        if sink.requires_grad and torch.is_grad_enabled():
            return OP
    elif dropout is None and v.shape[-1] == q.shape[-1] and not torch._C._are_functorch_transforms_active() and _native.attention() is not None:
        return NATIVE
    return AUTOGRAD if _records_grad(q, k, v) else DIRECT


# The head dim a call runs at, by (device, head dim, call kind): the core's answer
# (`_flashcore.run_head_dim`), asked once for each; the sizes it never changes, asked once.
_RUN_HEAD_DIMS: Dict[Tuple[int, int, str], int] = {}
_AS_THEY_ARE = frozenset(_flashcore.head_dims_run_as_they_are())


def _run_head_dim(q: Tensor, call: str) -> int:
    """The head dim a call on q runs at (`flashcore::dispatch::run_head_dim`): q's own, or the
    size its inputs are zero-padded to (`_padded`). `call`: "attention", "dropout" or
    "paged_queries". Callers test `_AS_THEY_ARE` first, inline: the calls of every step take it."""
    key = (q.get_device(), q.shape[-1], call)
    size = _RUN_HEAD_DIMS.get(key)
    if size is None:
        size = _RUN_HEAD_DIMS[key] = _flashcore.run_head_dim(*key)
    return size


def _attention(q: Tensor, k: Tensor, v: Tensor, options: _ops.Options, want_lse: bool = True, probs: Optional[Tensor] = None) -> Tuple[Tensor, Optional[Tensor]]:
    """(o, lse) of a dense call under `options`: by the path `route` picks; without autograd
    lse is None when not wanted (neither allocated nor written). A head dim the kernels lack
    runs zero-padded to the size the core picks (`_run_head_dim`, `_padded`; the slopes, one
    a head, are the same)."""
    d = q.shape[-1]
    size = d if d in _AS_THEY_ARE else _run_head_dim(q, "attention" if options.dropout is None else "dropout")
    if size != d and k.shape[-1] == d and v.shape[-1] == d:
        out, lse = _attention(*_padded(q, k, v, size), options, want_lse, probs)
        return out[..., :d], lse
    path = route(q, k, v, options.dropout, options.learnable_sink)
    if path is NATIVE:
        scale, causal, (left, right), softcap, num_splits, deterministic, alibi_slopes, _, chunk, _ = options  # unpacked: faster than attribute reads
        return _native.attention()(q, k, v, scale, causal, left, right, chunk, softcap, num_splits, deterministic, want_lse, alibi_slopes)
    if path is AUTOGRAD:
        if want_lse:
            return _ops.record(_ops.Attention, q, k, v, (options, True, probs))
        return _ops.record(_ops.Attention, q, k, v, (options, False, probs)), None
    if path is DIRECT:
        return _ops.forward(q, k, v, options, want_lse, probs)
    _traced_probs(options.dropout, probs)
    return _ops.fwd(q, k, v, *options.flat())


def _traced_probs(dropout: Optional[_ops.Dropout], probs: Optional[Tensor]) -> None:
    """Under torch.compile or tracing, dropout runs through the registered ops (their
    `dropout_p` and `rng_state`), which return no probabilities: NotImplementedError naming
    `return_attn_probs` when they are asked for."""
    if dropout is not None and probs is not None:
        raise _unsupported("return_attn_probs", True, "with dropout under torch.compile or tracing is not supported yet (eager calls return them)")


def _padded(q: Tensor, k: Tensor, v: Tensor, size: int) -> Tuple[Tensor, Tensor, Tensor]:
    """q, k, v with their head dim zero-padded to `size` (`_run_head_dim`): the zeros add
    nothing to q·kᵀ and give output columns that the caller slices off; autograd sees the pad
    and the slice. The softmax scale stays the caller's, from the real head dim."""
    pad = size - q.shape[-1]
    return tuple(torch.nn.functional.pad(t, (0, pad)) for t in (q, k, v))  # type: ignore[return-value]


def _varlen_attention(
    q: Tensor, k: Tensor, v: Tensor, batch: _ops.Batch, options: _ops.Options, want_lse: bool = True, probs: Optional[Tensor] = None
) -> Tuple[Tensor, Optional[Tensor]]:
    """(o, lse [Hq, total_q]) of a packed batch, as `_attention` for a dense one: by the path
    `route` picks, zero-padded to the head dim the core picks. lse may be None where not
    wanted and no autograd records (the native operator's calls); the other paths write it."""
    d = q.shape[-1]
    size = d if d in _AS_THEY_ARE else _run_head_dim(q, "attention" if options.dropout is None else "dropout")
    if size != d and k.shape[-1] == d and v.shape[-1] == d:
        out, lse = _varlen_attention(*_padded(q, k, v, size), batch, options, want_lse, probs)
        return out[..., :d], lse
    path = route(q, k, v, options.dropout, options.learnable_sink)
    if path is NATIVE:
        scale, causal, (left, right), softcap, _, deterministic, alibi_slopes, _, chunk, _ = options
        cu_seqlens_q, cu_seqlens_k, seqused_k, max_seqlen_q, max_seqlen_k, _ = batch
        return _native.varlen_attention()(
            q, k, v, cu_seqlens_q, cu_seqlens_k, seqused_k, max_seqlen_q, max_seqlen_k, batch.check(),
            scale, causal, left, right, chunk, softcap, deterministic, want_lse, alibi_slopes,
        )  # fmt: skip
    if path is AUTOGRAD:
        return _ops.record(_ops.VarlenAttention, q, k, v, batch, (options, probs))
    if path is DIRECT:
        return _ops.varlen_forward(q, k, v, batch, options, probs)
    _traced_probs(options.dropout, probs)
    return _ops.varlen_fwd(q, k, v, *batch, *options.flat())
