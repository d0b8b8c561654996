"""The op layer: the calls into the extension, and the registered ops `flashcore::fwd` and
`flashcore::bwd`, for packed batches `flashcore::varlen_fwd` and `flashcore::varlen_bwd`, for
KV caches `flashcore::fwd_kvcache` and `flashcore::varlen_fwd_paged` (torch.library, with
fakes for torch.compile; each forward's autograd rule calls its backward).

A call's options travel as one frozen record, `Options` (the Rust library's `AttnParams`, with
ALiBi's slopes and dropout beside them); a packed batch's vectors as `Batch`, a KV cache's as
`Cache`. The registered ops' schemas hold only tensors and scalars: they carry each record
flattened, spelled out once, beside the record (`Options.SCHEMA`, `flat`, `from_flat`).

Tensors cross into Rust as (data pointer, shape, strides, dtype name); the kernel runs on
PyTorch's current stream of the tensors' device; outputs and scratch memory come from
PyTorch's caching allocator. Nothing here synchronises.
"""

from __future__ import annotations

import functools
import os
from typing import Callable, Dict, List, NamedTuple, Optional, Tuple

import torch
from torch import Tensor

from . import _flashcore

DTYPE_NAMES = {torch.float16: "f16", torch.bfloat16: "bf16"}
# The dtypes a tensor crosses with: the 16-bit ones (every path) and e4m3, an FP8 forward's
# inputs alone (`fp8_forward`; `_args._check` keeps it off the other paths).
ARG_DTYPE_NAMES = {**DTYPE_NAMES, torch.float8_e4m3fn: "e4m3"}

NO_WINDOW = (-1, -1)


def _arg(t: Tensor) -> tuple:
    return (t.data_ptr(), t.shape, t.stride(), ARG_DTYPE_NAMES[t.dtype])


def _vector(t: Tensor) -> Tuple[int, int]:
    return (t.data_ptr(), t.numel())


def _optional_vector(t: Optional[Tensor]) -> Optional[Tuple[int, int]]:
    return None if t is None else _vector(t)


# Attention dropout: `(p, state)`, p in (0, 1) and `state` the call's generator state, an
# int64 pair (seed, offset) on the device (flash_attn's `rng_state`) that the kernels read
# there, so that a CUDA graph's replays each draw a new one (`_args._dropout`); the mask
# is a function of the pair and the score's place (flashcore::Dropout). None: no dropout.
# With it, `probs` (or None) is where a forward stores each probability, negated where
# dropped (flash_attn's S_dmask, `[B, Hq, rows, cols]` in q's dtype).
Dropout = Tuple[float, Tensor]


class Options(NamedTuple):
    """A call's options, checked by `interface` (the Rust library checks the values again and
    its errors name the argument). Frozen: autograd keeps the record for the backward as it
    is. The extension reads it as `flashcore::AttnParams` (`arg`), ALiBi's slopes, dropout and
    learnable sinks beside it."""

    softmax_scale: float
    causal: bool = False
    window: Tuple[int, int] = NO_WINDOW  # flash_attn's window_size: -1 leaves a side unbounded
    softcap: float = 0.0  # 0: none
    num_splits: int = 0  # split-KV count, 0: FlashCore's choice
    deterministic: bool = False  # bitwise-reproducible gradients (the backward's)
    alibi_slopes: Optional[Tensor] = None  # f32 [Hq] or [B, Hq], checked and contiguous
    dropout: Optional[Dropout] = None
    attention_chunk: int = 0  # chunked attention's chunk in keys (FA3's attention_chunk), 0: off
    learnable_sink: Optional[Tensor] = None  # f32 [Hq], contiguous (FA4's learnable_sink); its gradient: `_fwd_backward`

    # The registered ops' form: the window as its two sides, dropout as `dropout_p` and its
    # `rng_state` (None: no dropout). No defaults: the dispatcher drops trailing arguments
    # equal to their defaults before a Python kernel sees them.
    SCHEMA = (
        "float softmax_scale, bool causal, SymInt window_left, SymInt window_right, float softcap, SymInt num_splits, "
        "bool deterministic, Tensor? alibi_slopes, float dropout_p, Tensor? rng_state, SymInt attention_chunk, Tensor? learnable_sink"
    )
    FLAT_LEN = SCHEMA.count(",") + 1

    def arg(self) -> _flashcore.OptionsArg:
        """The extension's form (`flashcore::AttnParams`)."""
        return (
            self.softmax_scale, self.causal, self.window[0], self.window[1], self.softcap, self.num_splits or None, self.deterministic,
            self.attention_chunk,
        )  # fmt: skip

    def flat(self) -> tuple:
        """The values of `SCHEMA`, in its order."""
        p, state = (0.0, None) if self.dropout is None else self.dropout
        return (
            self.softmax_scale, self.causal, self.window[0], self.window[1], self.softcap, self.num_splits, self.deterministic,
            self.alibi_slopes, p, state, self.attention_chunk, self.learnable_sink,
        )  # fmt: skip

    @staticmethod
    def from_flat(values: tuple) -> "Options":
        """The record from the values of `SCHEMA`."""
        scale, causal, left, right, softcap, num_splits, deterministic, alibi_slopes, p, state, chunk, sink = values
        dropout = None if state is None else (p, state)
        return Options(scale, causal, (left, right), softcap, num_splits, deterministic, alibi_slopes, dropout, chunk, sink)


# `Options(...)` runs NamedTuple's generated `__new__`, a Python frame (~0.4 µs a call on the
# H200 host, 2% of a small call's host time); the public functions' path makes the record from
# its ten fields in order with the tuple constructor itself (every field: a shorter tuple
# would lack the last ones).
options: Callable[[tuple], Options] = functools.partial(tuple.__new__, Options)


def _check_varlen() -> bool:
    return os.environ.get("FLASHCORE_CHECK_VARLEN", "") not in ("", "0")


def _check_paged() -> bool:
    return os.environ.get("FLASHCORE_CHECK_PAGED", "") not in ("", "0")


class Batch(NamedTuple):
    """A packed batch (flash_attn's varlen arguments), checked by `interface`: int32
    `cu_seqlens_q`, `cu_seqlens_k` `[B + 1]` on q's device, `seqused_k` `[B]` or None, and
    the longest sequence's lengths. `checkable`: FLASHCORE_CHECK_VARLEN=1 may check the
    vectors against the packed-batch contract (starting at 0, rising); False for sequences
    placed anywhere in the keys by cu_seqlens_k and seqused_k, which it does not describe (a
    KV cache's rows: `interface._kvcache_rows`)."""

    cu_seqlens_q: Tensor
    cu_seqlens_k: Tensor
    seqused_k: Optional[Tensor]
    max_seqlen_q: int
    max_seqlen_k: int
    checkable: bool = True

    SCHEMA = "Tensor cu_seqlens_q, Tensor cu_seqlens_k, Tensor? seqused_k, SymInt max_seqlen_q, SymInt max_seqlen_k, bool checkable"
    FLAT_LEN = SCHEMA.count(",") + 1

    def arg(self) -> _flashcore.VarlenArg:
        """The extension's form (`flashcore::VarlenBatch`)."""
        return (_vector(self.cu_seqlens_q), _vector(self.cu_seqlens_k), _optional_vector(self.seqused_k), self.max_seqlen_q, self.max_seqlen_k)

    def check(self) -> bool:
        """Whether a call checks the vectors first (FLASHCORE_CHECK_VARLEN=1; synchronises)."""
        return self.checkable and _check_varlen()


class Cache(NamedTuple):
    """A KV cache's arguments (flash_attn_with_kvcache's), checked by `interface`: `k_new`,
    `v_new` `[B, S_new, Hkv, D]` appended first (the caches are written) or None,
    `cache_seqlens` int32 `[B]` (the keys each sequence holds) or None, `block_table` int32
    `[B, max_pages]` or None (contiguous caches), and for packed queries (`q [total_q, Hq,
    D]`) their int32 `cu_seqlens_q` `[B + 1]` and `max_seqlen_q`."""

    k_new: Optional[Tensor] = None
    v_new: Optional[Tensor] = None
    cache_seqlens: Optional[Tensor] = None
    block_table: Optional[Tensor] = None
    cu_seqlens_q: Optional[Tensor] = None
    max_seqlen_q: int = 0

    SCHEMA = "Tensor? k_new, Tensor? v_new, Tensor? cache_seqlens, Tensor? block_table, Tensor? cu_seqlens_q, SymInt max_seqlen_q"
    FLAT_LEN = SCHEMA.count(",") + 1

    def arg(self) -> _flashcore.PagedArg:
        """The extension's form (`flashcore::PagedKv`)."""
        table = self.block_table
        table_arg = None if table is None else (table.data_ptr(), (table.shape[0], table.shape[1]), table.stride(0))
        queries = None if self.cu_seqlens_q is None else (_vector(self.cu_seqlens_q), self.max_seqlen_q)
        new = (None if t is None else _arg(t) for t in (self.k_new, self.v_new))
        return (*new, _optional_vector(self.cache_seqlens), table_arg, queries)


def _dropout_arg(dropout: Optional[Dropout]) -> Optional[_flashcore.DropoutArg]:
    """Dropout as the extension takes it: `(p, address of the state)`, or None."""
    return None if dropout is None else (dropout[0], dropout[1].data_ptr())


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


def _lse_for(q: Tensor) -> Tensor:
    """The f32 log-sum-exp buffer a forward of `q` writes: `[B, Hq, Sq]` for BSHD q, `[Hq,
    total_q]` for a packed q `[total_q, Hq, D]`."""
    *batch, sq, hq, _ = q.shape
    return q.new_empty((*batch, hq, sq), dtype=torch.float32)


def _output_for(q: Tensor, v: Tensor) -> Tensor:
    """The output buffer of a forward of `q` over `v`: like q, with V's head dim (its own where
    it has one: DeepSeek's Q/K 192 with V 128, FlashAttention-3's Q/K 64 with V 256)."""
    if v.shape[-1] == q.shape[-1]:
        return q.new_empty(q.shape)  # new_empty: a few microseconds less than torch.empty(...)
    return q.new_empty((*q.shape[:-1], v.shape[-1]))


def _empty_outputs(q: Tensor, k: Tensor, v: Tensor, *_: object) -> Tuple[Tensor, Tensor]:
    """Empty `(o, lse)` of a forward of q over k, v: every forward op's fake (a fake reads only
    the tensors the shapes come from; the op's other arguments pass by), and the packed
    forward's outputs."""
    return _output_for(q, v), _lse_for(q)


def _grads_fake(q: Tensor, k: Tensor, v: Tensor, *_: object) -> Tuple[Tensor, Tensor, Tensor]:
    """Every backward op's fake: `(dq, dk, dv)` like `q`, `k`, `v`. Permissive like the
    forwards': torch.compile traces the backward of every forward whose inputs require grad,
    so a refusal here would fail inference too; the real op refuses when it runs."""
    return torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)


def _rows(dout: Tensor) -> Tensor:
    """`dout` with a contiguous last dim: autograd may hand over any layout; the kernels read rows."""
    return dout if dout.stride(-1) == 1 else dout.contiguous()


# ---- calls into the extension --------------------------------------------------------------


def forward_into(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    outputs: Tuple[Tensor, Optional[Tensor]],
    options: Options,
    probs: Optional[Tensor] = None,
    qv: Optional[Tensor] = None,
) -> None:
    """Runs the kernel on BSHD tensors: `outputs` = `(o, lse)`, o like q (q's dtype) and, if
    not None, `lse [B, Hq, Sq]` f32, are written; `probs` where dropout's probabilities go
    (see `Dropout`); `qv` FlashAttention-3's qv (shaped like o; no gradient: the caller's)."""
    o, lse = outputs
    _flashcore.attention_forward(
        _call(q),
        (_arg(q), _arg(k), _arg(v)),
        (_arg(o), None if lse is None else _vector(lse)),
        options.arg(),
        alibi=_optional_vector(options.alibi_slopes),
        dropout=_dropout_arg(options.dropout),
        probs=None if probs is None else _arg(probs),
        sinks=_optional_vector(options.learnable_sink),
        qv=None if qv is None else _arg(qv),
    )


def forward(
    q: Tensor, k: Tensor, v: Tensor, options: Options, want_lse: bool = True, probs: Optional[Tensor] = None, qv: Optional[Tensor] = None
) -> Tuple[Tensor, Optional[Tensor]]:
    """Attention on BSHD tensors: `(o [B, Sq, Hq, Dv], lse [B, Hq, Sq] f32)`, lse None unless
    `want_lse`. Rows that see no key (no keys at all, or a causal mask or window that leaves
    them none) give o = 0 and lse = -inf. `qv`: see `forward_into`."""
    o = _output_for(q, v)
    lse = _lse_for(q) if want_lse else None
    forward_into(q, k, v, (o, lse), options, probs, qv)
    return o, lse


# FlashAttention-3's FP8 descales `(q, k, v)`: each f32 `[B, Hkv]` contiguous, or None (1).
Descales = Tuple[Optional[Tensor], Optional[Tensor], Optional[Tensor]]


def fp8_forward(q: Tensor, k: Tensor, v: Tensor, options: Options, descales: Descales, want_lse: bool = True) -> Tuple[Tensor, Optional[Tensor]]:
    """Attention on e4m3 BSHD tensors (checked by the caller: `compat.flash_attn_3`) with
    FlashAttention-3's descales: `(o [B, Sq, Hq, D] bf16, lse [B, Hq, Sq] f32)`, lse None
    unless `want_lse`. Forward only (FP8 has no backward), dense keys; the core refuses the
    rest naming the argument (`dispatch::e4m3_form`)."""
    o = q.new_empty(q.shape, dtype=torch.bfloat16)
    lse = _lse_for(q) if want_lse else None
    _flashcore.attention_forward(
        _call(q),
        (_arg(q), _arg(k), _arg(v)),
        (_arg(o), None if lse is None else _vector(lse)),
        options.arg(),
        descales=tuple(_optional_vector(d) for d in descales),
    )
    return o, lse


def varlen_forward(q: Tensor, k: Tensor, v: Tensor, batch: Batch, options: Options, probs: Optional[Tensor] = None) -> Tuple[Tensor, Tensor]:
    """Attention over a packed batch (q, k [total, H, D], v [total_k, Hkv, Dv]): `(o
    [total_q, Hq, Dv], lse [Hq, total_q] f32)`. With the environment variable
    FLASHCORE_CHECK_VARLEN=1 the batch's vectors are checked first (`Batch.check`)."""
    o, lse = _empty_outputs(q, k, v)
    _flashcore.attention_forward(
        _call(q, batch.check()),
        (_arg(q.unsqueeze(0)), _arg(k.unsqueeze(0)), _arg(v.unsqueeze(0))),
        (_arg(o.unsqueeze(0)), _vector(lse)),
        options.arg(),
        varlen=batch.arg(),
        alibi=_optional_vector(options.alibi_slopes),
        dropout=_dropout_arg(options.dropout),
        probs=None if probs is None else _arg(probs),
        sinks=_optional_vector(options.learnable_sink),
    )
    return o, lse


def kvcache_forward(q: Tensor, caches: Tuple[Tensor, Tensor], cache: Cache, options: Options, want_lse: bool = True) -> Tuple[Tensor, Optional[Tensor]]:
    """Attention over a KV cache (see `flash_attn_with_kvcache`): `caches` = `(k_cache,
    v_cache)`; `(o like q, lse f32 or None)`: dense queries `q [B, Sq, Hq, D]` give `lse [B,
    Hq, Sq]`, packed ones (`cache.cu_seqlens_q`; `q [total_q, Hq, D]`) `lse [Hq, total_q]`.
    `cache.k_new`, `cache.v_new` are first written into the caches at
    `cache_seqlens[b]...`. With the environment variable FLASHCORE_CHECK_PAGED=1 the table and
    lengths are checked first (this synchronises)."""
    k_cache, v_cache = caches
    o = _output_for(q, v_cache)
    lse = _lse_for(q) if want_lse else None
    packed = cache.cu_seqlens_q is not None
    q_arg, o_arg = (_arg(q.unsqueeze(0)), _arg(o.unsqueeze(0))) if packed else (_arg(q), _arg(o))
    _flashcore.attention_forward(
        _call(q, _check_paged()),
        (q_arg, _arg(k_cache), _arg(v_cache)),
        (o_arg, None if lse is None else _vector(lse)),
        options.arg(),
        paged=cache.arg(),
        alibi=_optional_vector(options.alibi_slopes),
        sinks=_optional_vector(options.learnable_sink),
    )
    return o, lse


def backward_into(
    saved: Tuple[Tensor, ...], dout: Tensor, grads: Tuple[Tensor, Tensor, Tensor], options: Options, grads_like_inputs: bool = False,
    dsink: Optional[Tensor] = None,
) -> None:
    """The gradients of attention on BSHD tensors into `grads` = `(dq, dk, dv)` (like q, k, v;
    every element written; dk and dv summed over the query heads that share a KV head), from
    the forward's `saved` = `(q, k, v, o, lse [B, Hq, Sq])` and its `options` (the slopes get
    no gradient). `grads_like_inputs`: the caller vouches that each grad has its input's shape
    and strides, so only their addresses cross into the extension. `dsink` (f32 `[Hq]`, with
    the options' learnable sinks): where their gradient goes, or None."""
    q, k, v, o, lse = saved
    dq, dk, dv = grads
    grad_args = (dq.data_ptr(), dk.data_ptr(), dv.data_ptr()) if grads_like_inputs else (_arg(dq), _arg(dk), _arg(dv))
    _flashcore.attention_backward(
        _call(q),
        (_arg(q), _arg(k), _arg(v), _arg(o), _vector(lse), _arg(_rows(dout))),
        grad_args,
        options.arg(),
        alibi=_optional_vector(options.alibi_slopes),
        dropout=_dropout_arg(options.dropout),
        sinks=_optional_vector(options.learnable_sink),
        dsink=_optional_vector(dsink),
    )


# Whether a backward with V's own head dim runs padded (`_padded_value_dim`), by (device, D, Dv,
# dropout): the core's answer, asked once for each.
_PADS_VALUE_DIM: Dict[Tuple[int, int, int, bool], bool] = {}


def _padded_value_dim(q: Tensor, v: Tensor, options: Options) -> bool:
    """Whether the backward of q over v (V with a head dim of its own; dense or a packed
    batch) runs `_at_one_head_dim`: where the kernels have no backward form of the pair
    (`_flashcore.backward_pads_value_dim`)."""
    key = (q.get_device(), q.shape[-1], v.shape[-1], options.dropout is not None)
    pads = _PADS_VALUE_DIM.get(key)
    if pads is None:
        pads = _PADS_VALUE_DIM[key] = _flashcore.backward_pads_value_dim(*key)
    return pads


def _at_one_head_dim(run: Callable, saved: Tuple[Tensor, ...], dout: Tensor, *args: object) -> tuple:
    """`run(saved, dout, *args)` (a backward) of a call with V's own head dim, with q, k or v,
    o, dO zero-padded to the larger of the two dims, where the kernels have no backward form
    of the pair (FlashAttention-3 rounds V up the same way). Exact: zero columns of q and k add
    nothing to q·kᵀ, those of v, o and dO nothing to dP = dO·vᵀ or to rowsum(dO∘o), and the
    gradients' padded columns (dq's and dk's, or dv's Pᵀ·0) are cut off, each gradient then
    laid out like its input."""
    q, k, v, o, lse = saved
    d, dv = q.shape[-1], v.shape[-1]
    size = max(d, dv)
    pad = lambda t: t if t.shape[-1] == size else torch.nn.functional.pad(t, (0, size - t.shape[-1]))  # noqa: E731
    cut = lambda t, n: t if t.shape[-1] == n else t[..., :n].contiguous()  # noqa: E731
    grads = run((pad(q), pad(k), pad(v), pad(o), lse), pad(dout), *args)
    return (cut(grads[0], d), cut(grads[1], d), cut(grads[2], dv), *grads[3:])


def backward(saved: Tuple[Tensor, ...], dout: Tensor, options: Options) -> Tuple[Tensor, Tensor, Tensor]:
    """Gradients `(dq, dk, dv)`, laid out like `q`, `k`, `v`: `backward_into` new buffers."""
    q, k, v = saved[:3]
    if v.shape[-1] != q.shape[-1] and _padded_value_dim(q, v, options):
        return _at_one_head_dim(backward, saved, dout, options)
    grads = (torch.empty_like(q), torch.empty_like(k), torch.empty_like(v))
    # empty_like of a contiguous tensor has its strides: the grads then cross as addresses.
    backward_into(saved, dout, grads, options, q.is_contiguous() and k.is_contiguous() and v.is_contiguous())
    return grads


def varlen_backward_into(
    saved: Tuple[Tensor, ...], dout: Tensor, grads: Tuple[Tensor, Tensor, Tensor], batch: Batch, options: Options, dsink: Optional[Tensor] = None
) -> None:
    """The gradients of a packed batch into `grads` = `(dq, dk, dv)` (packed like q, k, v,
    `[total, H, D]`; every element written: zero for rows that saw no key and keys no row saw,
    those past seqused_k included), from the forward's `saved` = `(q, k, v, o, lse [Hq,
    total_q])`; `dsink` as in `backward_into`."""
    q, k, v, o, lse = saved
    _flashcore.attention_backward(
        _call(q, batch.check()),
        (*(_arg(t.unsqueeze(0)) for t in (q, k, v, o)), _vector(lse), _arg(_rows(dout).unsqueeze(0))),
        tuple(_arg(t.unsqueeze(0)) for t in grads),
        options.arg(),
        varlen=batch.arg(),
        alibi=_optional_vector(options.alibi_slopes),
        dropout=_dropout_arg(options.dropout),
        sinks=_optional_vector(options.learnable_sink),
        dsink=_optional_vector(dsink),
    )


def varlen_backward(saved: Tuple[Tensor, ...], dout: Tensor, batch: Batch, options: Options) -> Tuple[Tensor, Tensor, Tensor]:
    """Gradients `(dq, dk, dv)` of a packed batch: `varlen_backward_into` new buffers."""
    q, k, v = saved[:3]
    if v.shape[-1] != q.shape[-1] and _padded_value_dim(q, v, options):
        return _at_one_head_dim(varlen_backward, saved, dout, batch, options)
    grads = (torch.empty_like(q), torch.empty_like(k), torch.empty_like(v))
    varlen_backward_into(saved, dout, grads, batch, options)
    return grads


def sink_backward(saved: Tuple[Tensor, ...], dout: Tensor, options: Options, batch: Optional[Batch] = None) -> Tuple[Tensor, Tensor, Tensor, Tensor]:
    """`(dq, dk, dv, dsink)`: `backward` (`varlen_backward` with a `batch`) and the gradient of
    the options' learnable sinks, f32 `[Hq]`, every row of every sequence of a head summed in
    one fixed order (the same bits every run)."""
    q, k, v = saved[:3]
    if v.shape[-1] != q.shape[-1] and _padded_value_dim(q, v, options):
        return _at_one_head_dim(sink_backward, saved, dout, options, batch)  # type: ignore[return-value]
    grads = (torch.empty_like(q), torch.empty_like(k), torch.empty_like(v))
    dsink = torch.empty_like(options.learnable_sink)
    if batch is None:
        backward_into(saved, dout, grads, options, q.is_contiguous() and k.is_contiguous() and v.is_contiguous(), dsink)
    else:
        varlen_backward_into(saved, dout, grads, batch, options, dsink)
    return (*grads, dsink)


# ---- the registered ops (torch.compile, tracing, fake and subclass tensors) -----------------


def _op(name: str, schema: str, fn: Callable, fake: Callable, mutates: Tuple[str, ...] = ()):
    """The op `flashcore::<name>` of this schema, run by `fn` on CUDA tensors, `fake` its fake."""
    op = torch.library.custom_op(f"flashcore::{name}", fn, mutates_args=mutates, device_types="cuda", schema=schema)
    op.register_fake(fake)
    return op


_FWD_TENSORS = "Tensor q, Tensor k, Tensor v"
_BWD_TENSORS = "Tensor q, Tensor k, Tensor v, Tensor o, Tensor lse, Tensor dout"


def _fwd(q: Tensor, k: Tensor, v: Tensor, *options: object) -> Tuple[Tensor, Tensor]:
    return forward(q, k, v, Options.from_flat(options))


def _bwd(q: Tensor, k: Tensor, v: Tensor, o: Tensor, lse: Tensor, dout: Tensor, *options: object) -> Tuple[Tensor, Tensor, Tensor]:
    return backward((q, k, v, o, lse), dout, Options.from_flat(options))


def _varlen_fwd(q: Tensor, k: Tensor, v: Tensor, *flat: object) -> Tuple[Tensor, Tensor]:
    return varlen_forward(q, k, v, Batch(*flat[: Batch.FLAT_LEN]), Options.from_flat(flat[Batch.FLAT_LEN :]))


def _varlen_bwd(q: Tensor, k: Tensor, v: Tensor, o: Tensor, lse: Tensor, dout: Tensor, *flat: object) -> Tuple[Tensor, Tensor, Tensor]:
    return varlen_backward((q, k, v, o, lse), dout, Batch(*flat[: Batch.FLAT_LEN]), Options.from_flat(flat[Batch.FLAT_LEN :]))


def _bwd_sinks(q: Tensor, k: Tensor, v: Tensor, o: Tensor, lse: Tensor, dout: Tensor, *options: object) -> Tuple[Tensor, Tensor, Tensor, Tensor]:
    return sink_backward((q, k, v, o, lse), dout, Options.from_flat(options))


def _varlen_bwd_sinks(q: Tensor, k: Tensor, v: Tensor, o: Tensor, lse: Tensor, dout: Tensor, *flat: object) -> Tuple[Tensor, Tensor, Tensor, Tensor]:
    return sink_backward((q, k, v, o, lse), dout, Options.from_flat(flat[Batch.FLAT_LEN :]), Batch(*flat[: Batch.FLAT_LEN]))


def _sink_grads_fake(q: Tensor, k: Tensor, v: Tensor, *rest: object) -> Tuple[Tensor, Tensor, Tensor, Tensor]:
    """The sinks' backward ops' fake: `_grads_fake`'s and dsink like the sinks (the options'
    last value)."""
    return (*_grads_fake(q, k, v), torch.empty_like(rest[-1]))


def _kvcache(q: Tensor, k_cache: Tensor, v_cache: Tensor, *flat: object) -> Tuple[Tensor, Tensor]:
    return kvcache_forward(q, (k_cache, v_cache), Cache(*flat[: Cache.FLAT_LEN]), Options.from_flat(flat[Cache.FLAT_LEN :]))


fwd = _op("fwd", f"({_FWD_TENSORS}, {Options.SCHEMA}) -> (Tensor, Tensor)", _fwd, _empty_outputs)
bwd = _op("bwd", f"({_BWD_TENSORS}, {Options.SCHEMA}) -> (Tensor, Tensor, Tensor)", _bwd, _grads_fake)
varlen_fwd = _op("varlen_fwd", f"({_FWD_TENSORS}, {Batch.SCHEMA}, {Options.SCHEMA}) -> (Tensor, Tensor)", _varlen_fwd, _empty_outputs)
varlen_bwd = _op("varlen_bwd", f"({_BWD_TENSORS}, {Batch.SCHEMA}, {Options.SCHEMA}) -> (Tensor, Tensor, Tensor)", _varlen_bwd, _grads_fake)
# The backward with the learnable sinks' gradient too: the forward ops' autograd runs these when
# the sinks want a gradient (their own ops, so that the others keep three outputs).
bwd_sinks = _op("bwd_sinks", f"({_BWD_TENSORS}, {Options.SCHEMA}) -> (Tensor, Tensor, Tensor, Tensor)", _bwd_sinks, _sink_grads_fake)
varlen_bwd_sinks = _op(
    "varlen_bwd_sinks", f"({_BWD_TENSORS}, {Batch.SCHEMA}, {Options.SCHEMA}) -> (Tensor, Tensor, Tensor, Tensor)", _varlen_bwd_sinks, _sink_grads_fake
)  # fmt: skip
# The caches are written (the appended keys): the op says so, so that torch.compile orders it.
# Packed queries over a paged cache append nothing: their op writes nothing (a written cache
# would be copied by torch.compile's functionalisation).
fwd_kvcache = _op(
    "fwd_kvcache", f"(Tensor q, Tensor(a!) k_cache, Tensor(b!) v_cache, {Cache.SCHEMA}, {Options.SCHEMA}) -> (Tensor, Tensor)", _kvcache, _empty_outputs,
    mutates=("k_cache", "v_cache"),
)  # fmt: skip
varlen_fwd_paged = _op("varlen_fwd_paged", f"(Tensor q, Tensor k_cache, Tensor v_cache, {Cache.SCHEMA}, {Options.SCHEMA}) -> (Tensor, Tensor)", _kvcache, _empty_outputs)


def _lse_has_no_gradient(ctx, lse: Tensor) -> None:
    """lse is not differentiable, and autograd is told not to fill a zero gradient for it (or
    for an `o` the loss did not use): a kernel launch fewer each backward."""
    ctx.mark_non_differentiable(lse)
    ctx.set_materialize_grads(False)


def _save(ctx, tensors: Tuple[Tensor, ...], options: Options, batch: Optional[Batch] = None) -> None:
    """Keeps a registered forward's `tensors`, `options` and `batch` for its backward: every
    tensor through `save_for_backward` (as torch.compile wants them), the records' other
    fields on `ctx`."""
    state = None if options.dropout is None else options.dropout[1]
    vectors = () if batch is None else (batch.cu_seqlens_q, batch.cu_seqlens_k, batch.seqused_k)
    ctx.save_for_backward(*tensors, *vectors, options.alibi_slopes, state, options.learnable_sink)
    ctx.options = options._replace(alibi_slopes=None, dropout=None if options.dropout is None else (options.dropout[0], None), learnable_sink=None)
    ctx.batch = None if batch is None else batch._replace(cu_seqlens_q=None, cu_seqlens_k=None, seqused_k=None)


def _saved(ctx) -> Tuple[tuple, Optional[Batch], Options]:
    """What `_save` kept: `(tensors, batch, options)`."""
    *tensors, alibi_slopes, state, sink = ctx.saved_tensors
    batch = ctx.batch
    if batch is not None:
        *tensors, cu_seqlens_q, cu_seqlens_k, seqused_k = tensors
        batch = batch._replace(cu_seqlens_q=cu_seqlens_q, cu_seqlens_k=cu_seqlens_k, seqused_k=seqused_k)
    options = ctx.options
    options = options._replace(alibi_slopes=alibi_slopes, dropout=None if options.dropout is None else (options.dropout[0], state), learnable_sink=sink)
    return tuple(tensors), batch, options


def _fwd_setup_context(ctx, inputs: tuple, output: Tuple[Tensor, Tensor]) -> None:
    q, k, v = inputs[:3]
    o, lse = output
    _save(ctx, (q, k, v, o, lse), Options.from_flat(inputs[3:]))
    _lse_has_no_gradient(ctx, lse)


# learnable_sink's place in the options' values: the last (the one option with a gradient).
_SINK_AT = Options.FLAT_LEN - 1


def _fwd_backward(ctx, grad_o: Optional[Tensor], grad_lse: Optional[Tensor]) -> tuple:
    if grad_o is None:  # the loss did not use o
        return (None,) * (3 + Options.FLAT_LEN)
    saved, _, options = _saved(ctx)
    if options.learnable_sink is not None and ctx.needs_input_grad[3 + _SINK_AT]:
        dq, dk, dv, dsink = bwd_sinks(*saved, grad_o, *options.flat())
        return (dq, dk, dv) + (None,) * _SINK_AT + (dsink,)
    dq, dk, dv = bwd(*saved, grad_o, *options.flat())
    return (dq, dk, dv) + (None,) * Options.FLAT_LEN


def _varlen_setup_context(ctx, inputs: tuple, output: Tuple[Tensor, Tensor]) -> None:
    q, k, v = inputs[:3]
    o, lse = output
    _save(ctx, (q, k, v, o, lse), Options.from_flat(inputs[3 + Batch.FLAT_LEN :]), Batch(*inputs[3 : 3 + Batch.FLAT_LEN]))
    _lse_has_no_gradient(ctx, lse)


def _varlen_backward(ctx, grad_o: Optional[Tensor], grad_lse: Optional[Tensor]) -> tuple:
    if grad_o is None:  # the loss did not use o
        return (None,) * (3 + Batch.FLAT_LEN + Options.FLAT_LEN)
    saved, batch, options = _saved(ctx)
    if options.learnable_sink is not None and ctx.needs_input_grad[3 + Batch.FLAT_LEN + _SINK_AT]:
        dq, dk, dv, dsink = varlen_bwd_sinks(*saved, grad_o, *batch, *options.flat())
        return (dq, dk, dv) + (None,) * (Batch.FLAT_LEN + _SINK_AT) + (dsink,)
    dq, dk, dv = varlen_bwd(*saved, grad_o, *batch, *options.flat())
    return (dq, dk, dv) + (None,) * (Batch.FLAT_LEN + Options.FLAT_LEN)


fwd.register_autograd(_fwd_backward, setup_context=_fwd_setup_context)
varlen_fwd.register_autograd(_varlen_backward, setup_context=_varlen_setup_context)


# The eager path with autograd. torch.library's Python autograd layer (the op's dispatch,
# its default filling and its autograd wrapper) cost ~80 µs a call in training mode on the
# H100 host, five times SDPA's whole call; outside torch.compile the public functions call
# the extension through these instead (the ops above stay for torch.compile and export).
# Both go through `forward` / `backward` and their packed forms: one implementation.


class Attention(torch.autograd.Function):
    """`forward` with `backward` as its gradient, for eager calls that record autograd. It
    takes q, k, v and one tuple `(options, want_lse, probs)`, and gives `o` alone unless the
    caller wants lse: `Function.apply`'s own host cost grows with each argument and output (on
    the H100 host, B1 S128: 12 µs with three tensors in and one out, 22 with nine arguments
    in, two out and lse marked non-differentiable). The ALiBi slopes ride in the options: they
    get no gradient, and `ctx.options` keeps them alive for the backward; so do learnable sinks
    that want no gradient (`_paths.route` sends those that do to the registered op)."""

    @staticmethod
    def forward(ctx, q, k, v, call):
        options, want_lse, probs = call
        o, lse = forward(q, k, v, options, True, probs)
        ctx.save_for_backward(q, k, v, o, lse)
        ctx.options = options
        if want_lse:
            _lse_has_no_gradient(ctx, lse)
            return o, lse
        return o

    @staticmethod
    def backward(ctx, grad_o, *_grad_lse):
        if grad_o is None:  # the loss did not use o
            return None, None, None, None
        dq, dk, dv = backward(ctx.saved_tensors, grad_o, ctx.options)
        return dq, dk, dv, None


class VarlenAttention(torch.autograd.Function):
    """`varlen_forward` with `varlen_backward` as its gradient, for eager calls that record
    autograd: q, k, v, the `Batch` and `(options, probs)`, `(o, lse)` out (see `Attention`)."""

    @staticmethod
    def forward(ctx, q, k, v, batch, call):
        options, probs = call
        o, lse = varlen_forward(q, k, v, batch, options, probs)
        ctx.save_for_backward(q, k, v, o, lse)
        ctx.batch, ctx.options = batch, options
        _lse_has_no_gradient(ctx, lse)
        return o, lse

    @staticmethod
    def backward(ctx, grad_o, grad_lse):
        if grad_o is None:  # the loss did not use o
            return None, None, None, None, None
        dq, dk, dv = varlen_backward(ctx.saved_tensors, grad_o, ctx.batch, ctx.options)
        return dq, dk, dv, None, None


_UNWRAP_IF_DEAD = torch._C._functorch.unwrap_if_dead
_C_APPLY = {f: torch._C._FunctionBase.__dict__["apply"].__get__(None, f) for f in (Attention, VarlenAttention)}


def record(function: type, q: Tensor, k: Tensor, v: Tensor, *rest: object):
    """`function.apply(q, k, v, *rest)` for `Attention` or `VarlenAttention`, minus
    `Function.apply`'s Python wrapper where that wrapper adds nothing: with no functorch
    transform active it only unwraps dead functorch wrappers (done here, on the three tensors;
    the rest are records, which it leaves alone too) and calls the C method
    `_FunctionBase.apply`, while its own frame, `setup_context` test and generator over the
    arguments cost a few microseconds a call."""
    if torch._C._are_functorch_transforms_active():
        return function.apply(q, k, v, *rest)
    return _C_APPLY[function](_UNWRAP_IF_DEAD(q), _UNWRAP_IF_DEAD(k), _UNWRAP_IF_DEAD(v), *rest)
