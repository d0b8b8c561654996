"""The public functions' arguments: checked (what needs torch: type, device, dtype, dims;
shapes, strides, alignment and head dims are the Rust library's, whose errors arrive as
`ValueError` / `TypeError` / `NotImplementedError` with its text) and made into the call's
one options record (`_ops.Options`). Shared by `interface`, `flash_attn_interface`,
`distributed` and the transformers integration.
"""

from __future__ import annotations

import math
import numbers
import operator
from typing import Optional, Tuple

import torch
from torch import Tensor

from . import _ops


def _check(tensors: Tuple[Tuple[str, object], ...], layout: str) -> None:
    """Raises the named error for the first bad tensor: not a tensor, not 4-D, not on a CUDA
    device, not fp16/bf16, or on another device or of another dtype than the first."""
    first = tensors[0][1]
    if isinstance(first, Tensor) and first.is_cuda and first.dim() == 4 and first.dtype in _ops.DTYPE_NAMES:
        dtype, device = first.dtype, first.get_device()
        for _, t in tensors[1:]:
            if not (isinstance(t, Tensor) and t.dtype is dtype and t.is_cuda and t.dim() == 4 and t.get_device() == device):
                break
        else:
            return  # the common case, in few attribute reads: this runs on every call
    _diagnose(tensors, layout)


def _diagnose(tensors: Tuple[Tuple[str, object], ...], layout: str) -> None:
    first_name, first = tensors[0]
    for name, t in tensors:
        if not isinstance(t, Tensor):
            raise TypeError(f"`{name}` must be a torch.Tensor, got {type(t).__name__}")
        if t.dim() != 4:
            raise ValueError(f"`{name}` must have 4 dims {layout}, got shape {tuple(t.shape)}")
        if t.device.type != "cuda":
            raise ValueError(f"`{name}` is on {t.device}: FlashCore runs on CUDA tensors")
        if t.dtype not in _ops.DTYPE_NAMES:
            raise TypeError(f"`{name}` has dtype {t.dtype}: FlashCore takes torch.float16 and torch.bfloat16")
        if t.device != first.device:
            raise ValueError(f"`{name}` is on {t.device} and `{first_name}` on {first.device}: all must be on one device")
        if t.dtype != first.dtype:
            raise TypeError(f"`{name}` has dtype {t.dtype} and `{first_name}` {first.dtype}: all must have one dtype")
    raise AssertionError("_diagnose found nothing wrong")


def _unsupported(name: str, value: object, why: str = "is not supported yet") -> NotImplementedError:
    return NotImplementedError(f"flashcore: `{name}={value!r}` {why}")


def _scale(softmax_scale: Optional[float], head_dim: int) -> float:
    return 1.0 / math.sqrt(head_dim) if softmax_scale is None else float(softmax_scale)


NO_WINDOW = _ops.NO_WINDOW


def _dropout(q: Tensor, dropout_p: object) -> Optional[_ops.Dropout]:
    """`dropout_p` checked (a float in [0, 1), else ValueError naming it) and, when not 0, the
    call's dropout `(p, state)`: `state` a fresh int64 pair (seed, offset) drawn on q's device
    from PyTorch's CUDA generator (`randint`, one small kernel; 62 random bits each), which
    the kernels read there. So `torch.manual_seed` reproduces the masks, each call draws a new
    one, and so does each replay of a captured CUDA graph (PyTorch's generator is graph-safe;
    a pair fixed on the host would repeat one mask on every replay). The backward takes the
    same pair."""
    if not isinstance(dropout_p, numbers.Real) or isinstance(dropout_p, bool) or not 0.0 <= float(dropout_p) < 1.0:
        raise ValueError(f"`dropout_p` must be a float in [0, 1), got {dropout_p!r}")
    if dropout_p == 0.0:
        return None
    return (float(dropout_p), torch.randint(2**62, (2,), dtype=torch.int64, device=q.device))


def _probs_for(q_shape: Tuple[int, ...], batch: int, seqlen_q: int, seqlen_k: int, q: Tensor) -> Tensor:
    """Zeros for dropout's probabilities, flash_attn's S_dmask: `[B, Hq, Sq, Sk]` each rounded
    up to 128, in q's dtype."""
    round_up = lambda n: -(-n // 128) * 128  # noqa: E731
    return q.new_zeros((batch, q_shape[-2], round_up(seqlen_q), round_up(seqlen_k)))


def _window(window_size: object) -> Tuple[int, int]:
    """`window_size` as two ints, or the TypeError naming it; their values (-1 or >= 0) are
    checked by the Rust library, whose error names `window`."""
    try:
        left, right = window_size  # type: ignore[misc]
        return operator.index(left), operator.index(right)
    except (TypeError, ValueError):
        raise TypeError(f"`window_size` must be a pair of ints (left, right), got {window_size!r}") from None


def _softcap(softcap: object) -> float:
    """`softcap` as a float, or the TypeError naming it (its value is checked by the Rust library)."""
    if not isinstance(softcap, numbers.Real):
        raise TypeError(f"`softcap` must be a float, got {type(softcap).__name__}")
    return float(softcap)


def _alibi(alibi_slopes: object, q: Tensor) -> Optional[Tensor]:
    """`alibi_slopes` checked: None, or a float32 tensor on q's device shaped `[Hq]` or `[B,
    Hq]`, contiguous (a copy if it was not); else the TypeError / ValueError naming it. The
    shape is checked here, the count of rows by the Rust library: it takes a flat vector (so
    it cannot tell `[Hq, B]` from `[B, Hq]`), and it alone knows B for every layout (a packed
    batch's sequences, a cache's), its ValueError naming `alibi_slopes` too."""
    if alibi_slopes is None:
        return None
    if not isinstance(alibi_slopes, Tensor):
        raise TypeError(f"`alibi_slopes` must be a torch.Tensor, got {type(alibi_slopes).__name__}")
    if alibi_slopes.dtype is not torch.float32:
        raise TypeError(f"`alibi_slopes` has dtype {alibi_slopes.dtype}: it must be torch.float32")
    if alibi_slopes.device != q.device:
        raise ValueError(f"`alibi_slopes` is on {alibi_slopes.device} and `q` on {q.device}: it must live on q's device")
    heads = q.shape[-2]
    if alibi_slopes.dim() not in (1, 2) or alibi_slopes.shape[-1] != heads:
        raise ValueError(f"`alibi_slopes` must be [Hq] or [B, Hq] with Hq = {heads}, q's heads; got shape {tuple(alibi_slopes.shape)}")
    return alibi_slopes.contiguous()


def _learnable_sink(learnable_sink: object, q: Tensor) -> Tensor:
    """`learnable_sink` checked: a floating tensor `[Hq]` on q's device, as the kernels
    take it: float32, contiguous (a differentiable conversion, so that its gradient reaches the
    caller's tensor in its own dtype); else the TypeError / ValueError naming it."""
    if not isinstance(learnable_sink, Tensor):
        raise TypeError(f"`learnable_sink` must be a torch.Tensor, got {type(learnable_sink).__name__}")
    if not learnable_sink.is_floating_point():
        raise TypeError(f"`learnable_sink` has dtype {learnable_sink.dtype}: it must be a floating dtype")
    if learnable_sink.device != q.device:
        raise ValueError(f"`learnable_sink` is on {learnable_sink.device} and `q` on {q.device}: it must live on q's device")
    heads = q.shape[-2]
    if learnable_sink.dim() != 1 or learnable_sink.shape[0] != heads:
        raise ValueError(f"`learnable_sink` must be [Hq] with Hq = {heads}, q's heads; got shape {tuple(learnable_sink.shape)}")
    return learnable_sink.float().contiguous()


def _options(
    q: Tensor, scores: tuple, alibi_slopes: object = None, deterministic: object = False, dropout: Optional[_ops.Dropout] = None,
    num_splits: int = 0, attention_chunk: int = 0,
) -> _ops.Options:
    """flash_attn's score arguments, which its functions share, `scores = (softmax_scale, causal,
    window_size, softcap)` and the rest, checked, as the call's one options record
    (`_ops.Options`): the scale from q's real head dim (before any padding). `num_splits` and
    `attention_chunk` come checked (`_num_splits`, `_chunk`) and go into the record as it is
    made: a `_replace` after it costs a call as much host time as the checks. On every call's
    path: the defaults are tested inline, and the record made by `_ops.options`."""
    softmax_scale, causal, window_size, softcap = scores
    window = NO_WINDOW if window_size == NO_WINDOW else _window(window_size)
    cap = 0.0 if softcap == 0.0 else _softcap(softcap)
    slopes = None if alibi_slopes is None else _alibi(alibi_slopes, q)
    return _ops.options((_scale(softmax_scale, q.shape[-1]), bool(causal), window, cap, num_splits, bool(deterministic), slopes, dropout, attention_chunk, None))


def _with_sinks(options: _ops.Options, learnable_sink: object, q: Tensor) -> _ops.Options:
    """`options` with `learnable_sink` checked (`_learnable_sink`); `options` itself without one."""
    if learnable_sink is None:
        return options
    return options._replace(learnable_sink=_learnable_sink(learnable_sink, q))


def _num_splits(num_splits: object) -> int:
    """flash-attn's `num_splits` (FA3's calls, flash-attn 2's `_flash_attn_varlen_forward`) as
    the options record takes it: 1 unsplit, n > 1 that many, 0 or less (flash-attn's
    heuristic) FlashCore's choice; TypeError naming it unless an int."""
    if type(num_splits) is int:  # the usual call's path: a plain int, no ABC check
        return num_splits if num_splits > 0 else 0
    if not isinstance(num_splits, numbers.Integral) or isinstance(num_splits, bool):
        raise TypeError(f"`num_splits` must be an int, got {num_splits!r}")
    return max(int(num_splits), 0)


def _no_dropout(dropout_p: object) -> None:
    """NotImplementedError naming `dropout_p` unless it is 0 (calls without a dropout form)."""
    if dropout_p != 0.0:
        raise _unsupported("dropout_p", dropout_p)


def _check_int32(name: str, t: object, q: Tensor, dims: int) -> None:
    """An int32 argument (cu_seqlens, seqused_k, cache_seqlens, block_table): `dims` dims on
    q's device, its last dim contiguous, or the named error."""
    if not isinstance(t, Tensor):
        raise TypeError(f"`{name}` must be a torch.Tensor, got {type(t).__name__}")
    if t.dtype is not torch.int32:
        raise TypeError(f"`{name}` has dtype {t.dtype}: it must be torch.int32")
    if t.dim() != dims:
        raise ValueError(f"`{name}` must have {dims} dim(s), got shape {tuple(t.shape)}")
    if t.device != q.device:
        raise ValueError(f"`{name}` is on {t.device} and `q` on {q.device}: it must live on q's device")
    if t.numel() > 0 and t.stride(-1) != 1:
        raise ValueError(f"`{name}` must have a contiguous last dim")


def _check_packed(q: Tensor, k: Tensor, v: Tensor, cu_seqlens_q: Tensor, cu_seqlens_k: Tensor, seqused_k: Optional[Tensor]) -> None:
    """A packed batch's tensors (`[total, H, D]`) and int32 vectors, or the named error."""
    for name, t in (("q", q), ("k", k), ("v", v)):
        if isinstance(t, Tensor) and t.dim() != 3:
            raise ValueError(f"`{name}` must have 3 dims [total, H, D], got shape {tuple(t.shape)}")
    _check((("q", q.unsqueeze(0)), ("k", k.unsqueeze(0)), ("v", v.unsqueeze(0))), "[total, H, D]")
    for name, t in (("cu_seqlens_q", cu_seqlens_q), ("cu_seqlens_k", cu_seqlens_k)) + ((("seqused_k", seqused_k),) if seqused_k is not None else ()):
        _check_int32(name, t, q, 1)


def _check_paged_varlen(q: Tensor, caches: Tuple[Tensor, Tensor], vectors: Tuple[Tensor, Tensor, Optional[Tensor]], block_table: Tensor, max_seqlen_q: object) -> None:
    """`flash_attn_varlen_func`'s arguments with a block table: q `[total, H, D]`, the pools
    `caches`, the int32 `vectors` `(cu_seqlens_q, cu_seqlens_k, seqused_k)`, the table and
    `max_seqlen_q`, or the named error."""
    if isinstance(q, Tensor) and q.dim() != 3:
        raise ValueError(f"`q` must have 3 dims [total, H, D], got shape {tuple(q.shape)}")
    _check((("q", q.unsqueeze(0)), ("k", caches[0]), ("v", caches[1])), "[1, total, H, D] and the pools [num_pages, page_size, H, D]")
    for name, t in zip(("cu_seqlens_q", "cu_seqlens_k", "seqused_k"), vectors):
        if t is not None:
            _check_int32(name, t, q, 1)
    _check_int32("block_table", block_table, q, 2)
    if not isinstance(max_seqlen_q, numbers.Integral) or max_seqlen_q < 0:
        raise ValueError(f"`max_seqlen_q` must be an int >= 0, got {max_seqlen_q!r}")
