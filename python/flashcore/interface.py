"""The public functions, with the signatures users already know: `flash_attn_func`
(flash_attn 2.x) and `scaled_dot_product_attention` (PyTorch SDPA). They check what needs
torch (type, device, dtype, dims) and call the `flashcore::fwd` op; shapes, strides,
alignment and head dims are checked by the Rust library, whose errors arrive as
`ValueError` / `TypeError` / `NotImplementedError` with its text.
"""

from __future__ import annotations

import math
import numbers
import operator
from typing import Dict, Optional, Tuple, Union

import torch
from torch import Tensor

from . import _flashcore, _native, _ops


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


def _eager(q: Tensor, k: Tensor, v: Tensor) -> bool:
    """Whether the call can skip the registered op and call the extension directly: plain
    tensors (no fake or subclass) and no tracing. The op's dispatch costs a few microseconds,
    and with autograd tens of microseconds (see `_ops.Attention`). Spelled out for three
    tensors rather than a generator: this runs on every call."""
    return type(q) is Tensor and type(k) is Tensor and type(v) is Tensor and not torch.compiler.is_compiling()


def _records_grad(q: Tensor, k: Tensor, v: Tensor) -> bool:
    return (q.requires_grad or k.requires_grad or v.requires_grad) and torch.is_grad_enabled()


NO_WINDOW = _ops.NO_WINDOW

# The paths an eager or traced call of a dense or packed batch can take (`route`), as `explain` names them.
NATIVE = "native operator"  # flashcore_native::attention / ::varlen_attention: autograd in C++ (`_native`)
AUTOGRAD = "Python autograd"  # the extension through `_ops.Attention` / `VarlenAttention` (autograd records)
DIRECT = "extension"  # the extension called directly (nothing to record)
OP = "registered op"  # torch.ops.flashcore.fwd: traced, compiled, fake or subclass tensors


def route(q: Tensor, k: Tensor, v: Tensor, dropout: Optional[_ops.Dropout]) -> str:
    """The one place that picks the path of a dense or packed batch's call (`_attention`,
    `_varlen_attention`): the registered op unless the call is eager on plain tensors; then
    the native operator where it is built (not with dropout, whose mask state it does not carry, nor under a functorch transform);
    else the Python autograd node when autograd records, else the extension directly."""
    if not _eager(q, k, v):
        return OP
    if dropout is None and not torch._C._are_functorch_transforms_active() and _native.attention() is not None:
        return NATIVE
    return AUTOGRAD if _records_grad(q, k, v) else DIRECT


# The head dim a call runs at, by (device, head dim, call kind): the core's answer
# (`_flashcore.run_head_dim`), asked once for each; the sizes it never changes, asked once.
_RUN_HEAD_DIMS: Dict[Tuple[int, int, str], int] = {}
_AS_THEY_ARE = frozenset(_flashcore.head_dims_run_as_they_are())


def _run_head_dim(q: Tensor, call: str) -> int:
    """The head dim a call on q runs at (`flashcore::dispatch::run_head_dim`): q's own, or the
    size its inputs are zero-padded to (`_padded`). `call`: "attention", "dropout" or
    "paged_queries"."""
    key = (q.get_device(), q.shape[-1], call)
    if key[1] in _AS_THEY_ARE:
        return key[1]
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
    path = route(q, k, v, options.dropout)
    if path is NATIVE:
        scale, causal, (left, right), softcap, num_splits, deterministic, alibi_slopes, _ = options  # unpacked: faster than 8 attribute reads
        return _native.attention()(q, k, v, scale, causal, left, right, softcap, num_splits, deterministic, want_lse, alibi_slopes)
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


def _padded(q: Tensor, k: Tensor, v: Tensor, size: int) -> Tuple[Tensor, Tensor, Tensor]:
    """q, k, v with their head dim zero-padded to `size` (`_run_head_dim`): the zeros add
    nothing to q·kᵀ and give output columns that the caller slices off; autograd sees the pad
    and the slice. The softmax scale stays the caller's, from the real head dim."""
    pad = size - q.shape[-1]
    return tuple(torch.nn.functional.pad(t, (0, pad)) for t in (q, k, v))  # type: ignore[return-value]


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


def _options(
    q: Tensor, softmax_scale: Optional[float], causal: object, window_size: object, softcap: object, alibi_slopes: object = None,
    deterministic: object = False, dropout: Optional[_ops.Dropout] = None,
) -> _ops.Options:
    """flash_attn's score arguments, which its functions share, checked, as the call's one
    options record (`_ops.Options`): the scale from q's real head dim (before any padding).
    On every call's path: the defaults are tested inline, and the record made by `_ops.options`."""
    window = NO_WINDOW if window_size == NO_WINDOW else _window(window_size)
    cap = 0.0 if softcap == 0.0 else _softcap(softcap)
    slopes = None if alibi_slopes is None else _alibi(alibi_slopes, q)
    return _ops.options((_scale(softmax_scale, q.shape[-1]), bool(causal), window, cap, 0, bool(deterministic), slopes, dropout))


def _no_dropout(dropout_p: object) -> None:
    """NotImplementedError naming `dropout_p` unless it is 0 (calls without a dropout form)."""
    if dropout_p != 0.0:
        raise _unsupported("dropout_p", dropout_p)


def flash_attn_func(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    dropout_p: float = 0.0,
    softmax_scale: Optional[float] = None,
    causal: bool = False,
    window_size: Tuple[int, int] = (-1, -1),
    softcap: float = 0.0,
    alibi_slopes: Optional[Tensor] = None,
    deterministic: bool = False,
    return_attn_probs: bool = False,
) -> Union[Tensor, Tuple[Tensor, Tensor, None]]:
    """Attention with flash_attn 2.x semantics.

    Args:
        q: `[B, Sq, Hq, D]`, float16 or bfloat16, on a CUDA device.
        k, v: `[B, Sk, Hkv, D]`, same dtype and device; `Hq % Hkv == 0` (GQA/MQA).
            The last dim must be contiguous; other strides are free (multiples of 8
            elements), so BHSD tensors transposed to BSHD need no copy.
            D: on Hopper any size up to 256 (every multiple of 8 runs, as the next size the
            kernels have where it has none of its own; others are zero-padded to a multiple
            of 8 first, as flash_attn does); elsewhere 32, 64, 96, 128, 192 or 256.
        dropout_p: attention dropout, in [0, 1): each probability kept with probability 1 - p
            and scaled by 1 / (1 - p) (p quantised to 1/256, as flash_attn), the mask keyed by
            a pair drawn per call from PyTorch's CUDA generator (`torch.manual_seed`
            reproduces it; CUDA graphs and torch.compile take it) and regenerated by the
            backward. Runs on fwd_sm90 and bwd_sm90 on Hopper (bwd_sm80 with a window, a
            softcap or ALiBi besides), elsewhere on fwd_sm80 and bwd_sm80; head dims other than
            32, 64, 96, 128, 192, 256 zero-padded to the next. Under torch.compile,
            `return_attn_probs` with dropout raises NotImplementedError.
        softmax_scale: multiplies `q·kᵀ`; default `1/sqrt(D)`.
        causal: causal mask aligned to the bottom-right corner when Sq != Sk (query i sees
            key j iff j <= i + Sk - Sq); rows that see no key give 0 (lse -inf).
        window_size: `(left, right)` sliding window, aligned bottom-right as the causal mask:
            query i sees key j iff `i + Sk - Sq - left <= j <= i + Sk - Sq + right`; -1 leaves
            a side unbounded; with causal=True the right side is 0. Ints; each -1 or >= 0
            (else ValueError naming `window`).
        softcap: logit softcapping (Gemma 2): each score `s = q·k * softmax_scale` becomes
            `softcap * tanh(s / softcap)` before the softmax; 0.0 is off, else finite and > 0
            (else ValueError naming `softcap`).
        alibi_slopes: ALiBi: float32 `[Hq]` (every sequence's) or `[B, Hq]` on q's device.
            Score `(i, j)` of head h gains `-slope * |i + Sk - Sq - j|` (bottom-right aligned,
            as the causal mask) after the softcap, before the softmax; the backward uses the
            same slopes (they get no gradient). Under a causal mask with no left window,
            flash_attn's kernels add `slope * j` instead: the same output, and flash_attn's lse
            is this one plus `slope * (i + Sk - Sq)` on row i.
        deterministic: bitwise-reproducible gradients in the backward, run to run on one GPU
            model (the forward is always deterministic).
        return_attn_probs: also return the log-sum-exp and, with dropout, its probabilities
            (flash_attn's S_dmask, `[B, Hq, Sq, Sk]` each rounded up to 128, q's dtype): each
            score's exp(s·scale − m), m the row's running max at its key block (the kernel
            walks 64-key blocks from the last: `flash_attn_interface._get_block_size_n`),
            negated where dropped; 0 where no block visited.

    Returns:
        `out [B, Sq, Hq, D]` (contiguous, q's dtype), or `(out, softmax_lse, None)` with
        `softmax_lse [B, Hq, Sq]` float32 (natural log) when `return_attn_probs` (with ALiBi
        under a causal mask, flash_attn's minus a constant a row: see `alibi_slopes`).

    Runs on the current CUDA stream without synchronising. Differentiable: every head dim runs
    a FlashCore tensor-core backward (bwd_sm80 for D32 and on other GPUs, else bwd_sm90);
    deterministic=True makes its gradients bitwise repeatable; windows, softcaps and ALiBi
    included.
    """
    _check((("q", q), ("k", k), ("v", v)), "[B, S, H, D]")
    options = _options(q, softmax_scale, causal, window_size, softcap, alibi_slopes, deterministic, _dropout(q, dropout_p))
    probs = _probs_for(q.shape, q.shape[0], q.shape[1], k.shape[1], q) if options.dropout is not None and return_attn_probs else None
    out, lse = _attention(q, k, v, options, return_attn_probs, probs)
    return (out, lse, probs) if return_attn_probs else out


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


def flash_attn_varlen_func(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    cu_seqlens_q: Tensor,
    cu_seqlens_k: Tensor,
    max_seqlen_q: int,
    max_seqlen_k: int,
    dropout_p: float = 0.0,
    softmax_scale: Optional[float] = None,
    causal: bool = False,
    window_size: Tuple[int, int] = (-1, -1),
    softcap: float = 0.0,
    alibi_slopes: Optional[Tensor] = None,
    deterministic: bool = False,
    return_attn_probs: bool = False,
    seqused_k: Optional[Tensor] = None,
    block_table: Optional[Tensor] = None,
) -> Union[Tensor, Tuple[Tensor, Tensor, None]]:
    """Attention over a packed batch of sequences of their own lengths, flash_attn 2.x's
    `flash_attn_varlen_func` (no padding: each sequence is its own attention problem).

    Args:
        q: `[total_q, Hq, D]`, the sequences' query rows one after another.
        k, v: `[total_k, Hkv, D]`; dtype, device, GQA and D as in `flash_attn_func`.
        cu_seqlens_q, cu_seqlens_k: int32 `[B + 1]` on q's device: sequence b is rows
            `cu_seqlens_q[b]:cu_seqlens_q[b + 1]` of q and keys `cu_seqlens_k[b]:cu_seqlens_k[b + 1]`
            of k and v (they start at 0, never decrease, and end at total_q / total_k).
        max_seqlen_q, max_seqlen_k: the longest sequence's lengths (ints, as flash_attn takes
            them, so that no call reads the device).
        causal, window_size, softcap, softmax_scale: as in `flash_attn_func`, per sequence
            (bottom-right aligned on each sequence's own lengths).
        seqused_k: optional int32 `[B]`: the keys each sequence uses, from its start (a KV cache
            with room after each sequence's keys).
        alibi_slopes: as in `flash_attn_func`, `[B, Hq]` one row a sequence (B the number of
            sequences), Sq and Sk each sequence's own lengths; lse likewise.
        dropout_p: as in `flash_attn_func` (0.0 only).
        deterministic: bitwise-reproducible gradients in the backward, run to run on one GPU
            model (the forward is always deterministic). A sequence's dk and dv are bitwise
            what it gives alone, in any mode; its dq is not in general (its dQ sums are split
            by a count that depends on the number of sequences).
        return_attn_probs: also return the log-sum-exp `[Hq, total_q]`.
        block_table: int32 `[B, max_pages]` on q's device: the keys are a paged cache, `k` and
            `v` its pools `[num_pages, page_size, Hkv, D]` (page_size a multiple of 16), key j
            of sequence b row `j % page_size` of page `block_table[b, j // page_size]`;
            sequence b has `seqused_k[b]` keys, or `cu_seqlens_k[b + 1] - cu_seqlens_k[b]`
            without seqused_k (flash_attn's serving call: chunked prefill and decode rows in
            one launch). Runs on fwd_sm80's packed paged form (unsplit; decode with GQA heads
            packed as rows; a head dim other than 32, 64, 96, 128, 192, 256 zero-padded to the
            next of them, the pools copied); forward only (flash_attn has no backward for it either: the
            result records no autograd). FLASHCORE_CHECK_PAGED=1 checks the table.

    The cu_seqlens values are the caller's contract: they are read only by the kernels, which
    clamp every offset to the tensors (a bad vector gives wrong output, never a bad memory
    access). FLASHCORE_CHECK_VARLEN=1 in the environment checks them on every call, by name
    (ValueError; it synchronises: for debugging), in the backward too.

    Differentiable: the backward runs FlashCore's tensor-core backward, bwd_sm90's packed form
    on Hopper for D 64/96/128/192/256, else bwd_sm80's (each sequence its own problem;
    windows, softcaps, ALiBi and seqused_k included: keys past seqused_k get zero gradients).
    torch.compile traces both passes.
    """
    if block_table is not None:
        vectors = (cu_seqlens_q, cu_seqlens_k, seqused_k)
        _check_paged_varlen(q, (k, v), vectors, block_table, max_seqlen_q)
        _no_dropout(dropout_p)
        options = _options(q, softmax_scale, causal, window_size, softcap, alibi_slopes)
        out, lse = _paged_varlen(q, (k, v), vectors, (block_table, int(max_seqlen_q)), options)
        return (out, lse, None) if return_attn_probs else out
    _check_packed(q, k, v, cu_seqlens_q, cu_seqlens_k, seqused_k)
    options = _options(q, softmax_scale, causal, window_size, softcap, alibi_slopes, deterministic, _dropout(q, dropout_p))
    for name, value in (("max_seqlen_q", max_seqlen_q), ("max_seqlen_k", max_seqlen_k)):
        if not isinstance(value, numbers.Integral) or value < 0:
            raise ValueError(f"`{name}` must be an int >= 0, got {value!r}")
    batch = _ops.Batch(cu_seqlens_q, cu_seqlens_k, seqused_k, int(max_seqlen_q), int(max_seqlen_k))
    probs = None
    if options.dropout is not None and return_attn_probs:
        probs = _probs_for(q.shape, cu_seqlens_q.shape[0] - 1, batch.max_seqlen_q, batch.max_seqlen_k, q)
    out, lse = _varlen_attention(q, k, v, batch, options, return_attn_probs, probs)
    return (out, lse, probs) if return_attn_probs else out


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
    path = route(q, k, v, options.dropout)
    if path is NATIVE:
        scale, causal, (left, right), softcap, _, deterministic, alibi_slopes, _ = options
        cu_seqlens_q, cu_seqlens_k, seqused_k, max_seqlen_q, max_seqlen_k, _ = batch
        return _native.varlen_attention()(
            q, k, v, cu_seqlens_q, cu_seqlens_k, seqused_k, max_seqlen_q, max_seqlen_k, batch.check(),
            scale, causal, left, right, softcap, deterministic, want_lse, alibi_slopes,
        )  # fmt: skip
    if path is AUTOGRAD:
        return _ops.record(_ops.VarlenAttention, q, k, v, batch, (options, probs))
    if path is DIRECT:
        return _ops.varlen_forward(q, k, v, batch, options, probs)
    _traced_probs(options.dropout, probs)
    return _ops.varlen_fwd(q, k, v, *batch, *options.flat())


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


def _paged_varlen(
    q: Tensor, caches: Tuple[Tensor, Tensor], vectors: Tuple[Tensor, Tensor, Optional[Tensor]], table: Tuple[Tensor, int], options: _ops.Options
) -> Tuple[Tensor, Tensor]:
    """`flash_attn_varlen_func` with a block table (see there), its arguments checked
    (`_check_paged_varlen`): `(out, lse [Hq, total_q])`, without autograd. `table` is
    `(block_table, max_seqlen_q)`."""
    k_cache, v_cache = caches
    cu_seqlens_q, cu_seqlens_k, seqused_k = vectors
    block_table, max_seqlen_q = table
    # The keys each sequence has: seqused_k, else its cu_seqlens_k span (on the device).
    seqlens_k = seqused_k if seqused_k is not None else (cu_seqlens_k[1:] - cu_seqlens_k[:-1]).to(torch.int32)
    d = q.shape[-1]
    # The packed paged form is fwd_sm80's: another head dim runs zero-padded to the next of its
    # (copies of q and of the pools).
    size = _run_head_dim(q, "paged_queries")
    if size != d and k_cache.shape[-1] == d and v_cache.shape[-1] == d:
        q, k_cache, v_cache = (torch.nn.functional.pad(t, (0, size - d)) for t in (q, k_cache, v_cache))
    cache = _ops.Cache(cache_seqlens=seqlens_k, block_table=block_table, cu_seqlens_q=cu_seqlens_q, max_seqlen_q=max_seqlen_q)
    if _eager(q, k_cache, v_cache):
        out, lse = _ops.kvcache_forward(q, (k_cache, v_cache), cache, options)
    else:
        out, lse = _ops.varlen_fwd_paged(q, k_cache, v_cache, *cache, *options.flat())
    return out[..., :d], lse


def flash_attn_with_kvcache(
    q: Tensor,
    k_cache: Tensor,
    v_cache: Tensor,
    k: Optional[Tensor] = None,
    v: Optional[Tensor] = None,
    rotary_cos: Optional[Tensor] = None,
    rotary_sin: Optional[Tensor] = None,
    cache_seqlens: Optional[Union[int, Tensor]] = None,
    cache_batch_idx: Optional[Tensor] = None,
    cache_leftpad: Optional[Tensor] = None,
    block_table: Optional[Tensor] = None,
    softmax_scale: Optional[float] = None,
    causal: bool = False,
    window_size: Tuple[int, int] = (-1, -1),
    softcap: float = 0.0,
    rotary_interleaved: bool = True,
    alibi_slopes: Optional[Tensor] = None,
    num_splits: int = 0,
    return_softmax_lse: bool = False,
) -> Union[Tensor, Tuple[Tensor, Tensor]]:
    """Attention over a KV cache with flash_attn 2.x's `flash_attn_with_kvcache` semantics
    (and its argument order): decode and chunked prefill over a paged or contiguous cache,
    appending new keys first.

    Args:
        q: `[B, Sq, Hq, D]`, float16 or bfloat16, CUDA; D as in `flash_attn_func`.
        k_cache, v_cache: with `block_table`, pools of pages `[num_pages, page_size, Hkv, D]`
            (page_size any multiple of 16: 16, 32, ..., 256 and more); without, contiguous
            caches `[B, S_cache, Hkv, D]`. Last dim contiguous; same dtype as q. Written in
            place when `k`, `v` are given.
        k, v: optional `[B, S_new, Hkv, D]`, q's dtype: written into the caches at positions
            `cache_seqlens[b] ... cache_seqlens[b] + S_new - 1` (through the block table)
            before attention, which then sees `cache_seqlens[b] + S_new` keys. `cache_seqlens`
            is not changed: the caller advances it.
        cache_seqlens: int32 `[B]` on q's device, or an int for every sequence: the keys each
            sequence holds before this call. None: every sequence holds the whole cache
            (`k`, `v` then need it).
        block_table: int32 `[B, max_pages]` on q's device: key j of sequence b is row
            `j % page_size` of page `block_table[b, j // page_size]`.
        softmax_scale, causal, window_size, softcap: as in `flash_attn_func`, aligned to the
            bottom-right of each sequence's own keys (query i of Sq sees key j iff
            `j <= i + cache_seqlens[b] + S_new - Sq` when causal).
        alibi_slopes: as in `flash_attn_func`, `[B, Hq]` one row a sequence; Sk is each
            sequence's keys, `cache_seqlens[b] + S_new`.
        num_splits: split-KV count (0: FlashCore picks it).
        return_softmax_lse: also return the log-sum-exp `[B, Hq, Sq]` float32.
        rotary_cos, rotary_sin: `[seqlen_rotary, rotary_dim / 2]` (rotary_dim a multiple of 16,
            at most D; with `k` and `v` alone): q and the appended keys are rotated first, as
            flash_attn does: the keys at their cache positions `cache_seqlens[b] + j`, the
            queries at `cache_seqlens[b] + i` when causal or windowed, else all at
            `cache_seqlens[b]`; `rotary_interleaved` pairs columns (0, 1), (2, 3), ... (its
            default) instead of i with i + rotary_dim / 2. Done by PyTorch before the kernel
            (`flashcore.rotary`), not fused into it.
        cache_batch_idx: optional int32 `[B]` on q's device (contiguous caches only): sequence
            b is entry `cache_batch_idx[b]` of caches with any number of entries.
        cache_leftpad: optional int32 `[B]` on q's device (contiguous caches only): sequence
            b's keys start at row `cache_leftpad[b]` (left padding; the keys are rows
            `cache_leftpad[b] ... cache_seqlens[b] + S_new - 1`, positions, masks and ALiBi
            counted from it; new keys still go at `cache_seqlens[b]`).
            Either runs as a packed batch over the cache's rows (see `_kvcache_rows`): no copy
            of the caches; the new keys are written by PyTorch first.

    Returns:
        `out [B, Sq, Hq, D]`, or `(out, softmax_lse)` with `return_softmax_lse`.

    The table entries and lengths are the caller's contract (each used entry names a page of
    the pool; `cache_seqlens[b] + S_new` fits the table's pages): the kernels clamp them, so
    bad values give wrong output, never a bad memory access. FLASHCORE_CHECK_PAGED=1 in the
    environment checks them on every call and names the first bad entry (ValueError; it
    synchronises: for debugging). Decode (few query rows) runs on FlashCore's Ampere-class
    split-KV kernel on every GPU; prefill and chunked prefill run on the Hopper kernel (TMA
    loads per page) on sm_90, on the Ampere-class kernel elsewhere. Forward only (no
    autograd).
    """
    tensors = (("q", q), ("k_cache", k_cache), ("v_cache", v_cache))
    if k is not None and v is not None and k.dim() == 4 and k.shape[1] == 0 and v.shape[1] == 0:
        k = v = None  # nothing to append
    if (k is None) != (v is None):
        raise ValueError("`k` and `v` come together: pass both or neither")
    if k is not None:
        tensors += (("k", k), ("v", v))
    _check(tensors, "[B, S, H, D]")
    if isinstance(cache_seqlens, numbers.Integral) and not isinstance(cache_seqlens, bool):
        cache_seqlens = torch.full((q.shape[0],), int(cache_seqlens), dtype=torch.int32, device=q.device)
    if cache_seqlens is not None:
        _check_int32("cache_seqlens", cache_seqlens, q, 1)
    if block_table is not None:
        _check_int32("block_table", block_table, q, 2)
    for name, t in (("cache_batch_idx", cache_batch_idx), ("cache_leftpad", cache_leftpad)):
        if t is not None:
            _check_int32(name, t, q, 1)
            if block_table is not None:
                raise _unsupported(name, "<tensor>", "with a block table is not supported (as in flash_attn): contiguous caches only")
            if t.shape[0] != q.shape[0]:
                raise ValueError(f"`{name}` has {t.shape[0]} entries, q's batch is {q.shape[0]}")
    if not isinstance(num_splits, numbers.Integral) or num_splits < 0:
        raise ValueError(f"`num_splits` must be an int >= 0, got {num_splits!r}")
    options = _options(q, softmax_scale, causal, window_size, softcap, alibi_slopes)
    if num_splits:
        options = options._replace(num_splits=int(num_splits))
    if rotary_cos is not None or rotary_sin is not None:
        q, k = _rotated_for_cache(q, k, rotary_cos, rotary_sin, cache_seqlens, bool(rotary_interleaved), options.causal or options.window != NO_WINDOW)
    d = q.shape[-1]
    present = [t for t in (q, k_cache, v_cache, k, v) if t is not None]  # q and k rotated by now
    if d % 8 and d < 256 and all(t.shape[-1] == d for t in present):
        # flash_attn's way with such a head dim: the caches run zero-padded to a multiple of 8
        # (a copy of each), and the appended keys are copied back into the caller's caches.
        padded = [torch.nn.functional.pad(t, (0, -d % 8)) for t in present]
        q_p, k_cache_p, v_cache_p = padded[:3]
        k_p, v_p = padded[3:] if k is not None else (None, None)
        out, lse = flash_attn_with_kvcache(
            q_p, k_cache_p, v_cache_p, k_p, v_p, cache_seqlens=cache_seqlens, cache_batch_idx=cache_batch_idx, cache_leftpad=cache_leftpad,
            block_table=block_table, softmax_scale=options.softmax_scale, causal=causal, window_size=options.window, softcap=options.softcap,
            alibi_slopes=options.alibi_slopes, num_splits=num_splits, return_softmax_lse=True,
        )
        if k is not None:
            k_cache.copy_(k_cache_p[..., :d])
            v_cache.copy_(v_cache_p[..., :d])
        return (out[..., :d], lse) if return_softmax_lse else out[..., :d]
    if cache_batch_idx is not None or cache_leftpad is not None:
        out, lse = _kvcache_rows(q, (k_cache, v_cache), None if k is None else (k, v), (cache_seqlens, cache_batch_idx, cache_leftpad), options)
        return (out, lse) if return_softmax_lse else out
    cache = _ops.Cache(k, v, cache_seqlens, block_table)
    if _eager(q, k_cache, v_cache):  # no autograd: the op has none either
        out, lse = _ops.kvcache_forward(q, (k_cache, v_cache), cache, options, return_softmax_lse)
    else:
        out, lse = _ops.fwd_kvcache(q, k_cache, v_cache, *cache, *options.flat())
    return (out, lse) if return_softmax_lse else out


def _kvcache_rows(
    q: Tensor, caches: Tuple[Tensor, Tensor], appended: Optional[Tuple[Tensor, Tensor]], lengths: Tuple[Optional[Tensor], ...], options: _ops.Options
) -> Tuple[Tensor, Tensor]:
    """`flash_attn_with_kvcache` with `cache_batch_idx` or `cache_leftpad` (contiguous caches
    `caches`; `appended` the new keys and values or None; `lengths` `(cache_seqlens,
    batch_idx, leftpad)`): `(out, lse [B, Hq, Sq])`. The new keys are written at
    `cache_seqlens[b]...` of entry `batch_idx[b]` by PyTorch (their positions clamped into the
    cache, as the kernels clamp a table: bad lengths give wrong output, never an access
    outside the cache); then each sequence's keys, rows `leftpad[b] ... cache_seqlens[b] +
    S_new - 1` of its entry, are a packed batch's sequence over the caches viewed as `[entries
    · S_cache, Hkv, D]` (`cu_seqlens_k[b]` its first row, `seqused_k[b]` its count: the
    varlen kernels take sequences anywhere in the keys), and q's rows `[B · Sq, Hq, D]` its
    queries: no copy of the caches (unless their entries are not evenly strided), no host
    synchronisation, and masks, positions and ALiBi counted from each sequence's first key,
    as flash_attn."""
    k_cache, v_cache = caches
    cache_seqlens, batch_idx, leftpad = lengths
    b, sq, hq, d = q.shape
    entries, capacity, hkv = k_cache.shape[0], k_cache.shape[1], k_cache.shape[2]
    if entries == 0 or capacity == 0:
        raise ValueError(f"`k_cache` {tuple(k_cache.shape)} holds no keys")
    if appended is not None and sq > capacity:  # as the paged path and flash_attn refuse it
        raise ValueError(f"`k_cache` holds {capacity} keys a sequence, fewer than q's {sq} rows with keys appended")
    index = torch.arange(b, dtype=torch.int32, device=q.device) if batch_idx is None else batch_idx
    lens = torch.full((b,), capacity, dtype=torch.int32, device=q.device) if cache_seqlens is None else cache_seqlens
    new = 0 if appended is None else appended[0].shape[1]
    if appended is not None:
        positions = (lens.long()[:, None] + torch.arange(new, device=q.device)).clamp_(0, capacity - 1)
        rows = index.long()[:, None].clamp(0, entries - 1)
        k_cache[rows, positions] = appended[0]
        v_cache[rows, positions] = appended[1]
    first = torch.zeros_like(lens) if leftpad is None else leftpad.clamp(0, capacity)
    used = (lens + new).clamp(0, capacity) - first
    starts = index.clamp(0, entries - 1) * capacity + first
    cu_seqlens_k = torch.cat([starts, starts.new_full((1,), entries * capacity)]).to(torch.int32)
    cu_seqlens_q = torch.arange(0, (b + 1) * sq, sq, dtype=torch.int32, device=q.device)
    packed = (q.reshape(b * sq, hq, d), k_cache.reshape(entries * capacity, hkv, d), v_cache.reshape(entries * capacity, hkv, d))
    # Sequences anywhere in the keys: not the packed-batch contract FLASHCORE_CHECK_VARLEN checks.
    batch = _ops.Batch(cu_seqlens_q, cu_seqlens_k, used.clamp(min=0).to(torch.int32), sq, capacity, checkable=False)
    if _eager(q, k_cache, v_cache):
        out, lse = _ops.varlen_forward(*packed, batch, options)
    else:
        out, lse = _ops.varlen_fwd(*packed, *batch, *options.flat())
    return out.view(b, sq, hq, d), lse.view(hq, b, sq).transpose(0, 1).contiguous()


def _rotated_for_cache(q: Tensor, k: Optional[Tensor], cos: object, sin: object, cache_seqlens: Optional[Tensor], interleaved: bool, per_row: bool) -> Tuple[Tensor, Tensor]:
    """`flash_attn_with_kvcache`'s rotary embedding (see its docstring): `(q, k)` rotated, or
    the error naming the argument."""
    from .rotary import apply_rotary_emb

    if k is None:
        raise ValueError("`rotary_cos` and `rotary_sin` rotate the appended keys: pass `k` and `v` too")
    for name, t in (("rotary_cos", cos), ("rotary_sin", sin)):
        if not isinstance(t, Tensor) or t.dim() != 2 or t.device != q.device:
            raise ValueError(f"`{name}` must be a 2-D tensor [seqlen_rotary, rotary_dim / 2] on q's device, got {t if not isinstance(t, Tensor) else tuple(t.shape)}")
    if cos.shape != sin.shape:
        raise ValueError(f"`rotary_cos` {tuple(cos.shape)} and `rotary_sin` {tuple(sin.shape)} differ")
    rotary_dim = 2 * cos.shape[1]
    if rotary_dim % 16 or rotary_dim > q.shape[-1]:
        raise ValueError(f"rotary dim {rotary_dim} (2 x rotary_cos.shape[1]) must be a multiple of 16 and at most the head dim {q.shape[-1]}")
    offsets = 0 if cache_seqlens is None else cache_seqlens
    k = apply_rotary_emb(k, cos, sin, interleaved=interleaved, seqlen_offsets=offsets)
    if per_row:
        return apply_rotary_emb(q, cos, sin, interleaved=interleaved, seqlen_offsets=offsets), k
    b, sq, h, d = q.shape  # every query at the first new position: as one row of Sq·H heads
    return apply_rotary_emb(q.reshape(b, 1, sq * h, d), cos, sin, interleaved=interleaved, seqlen_offsets=offsets).reshape(b, sq, h, d), k


def scaled_dot_product_attention(
    query: Tensor,
    key: Tensor,
    value: Tensor,
    attn_mask: Optional[Tensor] = None,
    dropout_p: float = 0.0,
    is_causal: bool = False,
    scale: Optional[float] = None,
    enable_gqa: bool = False,
) -> Tensor:
    """Drop-in for `torch.nn.functional.scaled_dot_product_attention` on 4-D BHSD tensors.

    Args:
        query: `[B, Hq, Sq, D]`; key, value: `[B, Hkv, Sk, D]`; float16 or bfloat16, CUDA.
        attn_mask, dropout_p: not supported (NotImplementedError unless None / 0.0).
        is_causal: **SDPA's convention, top-left aligned**: query i sees key j iff j <= i,
            whatever Sq and Sk (`flash_attn_func` aligns to the bottom-right instead).
            Query rows past Sk see every key.
        scale: default `1/sqrt(D)`.
        enable_gqa: allow `Hq` a multiple of `Hkv`, as in SDPA; without it the heads must
            be equal.

    Returns:
        `[B, Hq, Sq, D]` in query's dtype (a BSHD-contiguous tensor viewed as BHSD, as
        SDPA's flash backend returns).
    """
    _check((("query", query), ("key", key), ("value", value)), "[B, H, S, D]")
    if attn_mask is not None:
        raise _unsupported("attn_mask", "<tensor>", "(an explicit mask) is not supported yet: use is_causal")
    if dropout_p != 0.0:
        raise _unsupported("dropout_p", dropout_p)
    hq, hkv = query.shape[1], key.shape[1]
    if hq != hkv and not enable_gqa:
        raise ValueError(f"`key` has {hkv} heads and `query` {hq}: pass enable_gqa=True for grouped-query attention")
    q, k, v = (t.transpose(1, 2) for t in (query, key, value))
    options = _ops.Options(_scale(scale, query.shape[-1]), bool(is_causal))
    sq, sk = q.shape[1], k.shape[1]
    if not is_causal or sq == sk:
        out = _attention(q, k, v, options, False)[0]
    elif sq < sk:
        # Top-left: no query sees a key past Sq, and on the first Sq keys the mask is square.
        out = _attention(q, k[:, :sq], v[:, :sq], options, False)[0]
    else:
        # The first Sk rows form a square causal problem; the rows after them see every key.
        head = _attention(q[:, :sk], k, v, options, False)[0]
        tail = _attention(q[:, sk:], k, v, options._replace(causal=False), False)[0]
        out = torch.cat((head, tail), dim=1)
    return out.transpose(1, 2)


def explain(q: Tensor, k: Tensor, v: Tensor, causal: bool = False, window_size: Tuple[int, int] = NO_WINDOW, softcap: float = 0.0, dropout_p: float = 0.0) -> str:
    """How `flash_attn_func(q, k, v, ...)` would run here, in one line: the path (`route`:
    the native operator, the Python autograd node, the extension directly or the registered
    op; with the native path's status when it is not taken) and the kernel (`kernel_plan`)."""
    dropout = (dropout_p, None) if dropout_p > 0.0 else None
    path = route(q, k, v, dropout)
    why = ""
    if path is AUTOGRAD or path is DIRECT:
        reason = _native.status()["reason"] or ("it does not take dropout" if dropout is not None else "a functorch transform is active")
        why = f" (not the native operator: {reason})"
    return f"path: {path}{why}; kernel: {kernel_plan(q, k, causal, window_size, softcap)}"


def kernel_plan(q: Tensor, k: Tensor, causal: bool = False, window_size: Tuple[int, int] = NO_WINDOW, softcap: float = 0.0) -> str:
    """What FlashCore would run for BSHD `q`, `k` on their device: kernel, tile, grid."""
    _check((("q", q), ("k", k)), "[B, S, H, D]")
    options = _options(q, None, causal, window_size, softcap)
    return _flashcore.plan(q.device.index, tuple(q.shape), tuple(k.shape), _ops.DTYPE_NAMES[q.dtype], options.arg())

