"""FlashCore as a Hugging Face transformers attention implementation.

    import flashcore
    attn = flashcore.integrations.transformers.register()         # "fc_attention"
    model = AutoModelForCausalLM.from_config(cfg, attn_implementation=attn)

The name is not "flashcore": transformers (5.x) takes every implementation name that
contains "flash" for a FlashAttention build it must import itself
(`transformers.utils.generic.is_flash_attention_requested`), and then fails to find one.

`register()` adds the name to transformers' `AttentionInterface`, and to its
`AttentionMaskInterface` with a mask builder that follows transformers' own
flash_attention_2 contract where FlashCore can express the mask: no mask for plain causal
batches, the 2-D padding mask `[B, Sk]` where there is padding (FlashCore then unpads the
batch into its packed (varlen) kernels and pads the output back: one gather, one scatter),
and for packed sequences (`position_ids` that restart, transformers'
`DataCollatorWithFlattening`) no mask, the boundaries then read from `position_ids` (or from
`cu_seq_lens_q/k` and `max_length_q/k` when the collator passes them). Elsewhere (static or
compiled caches, masks that or/and other patterns into the causal one) it builds SDPA's 4-D
mask, which `attention_forward` refuses with NotImplementedError naming `attention_mask`:
never a silently different result. Finding the padded rows (`torch.nonzero`) and the
longest sequence synchronises once per forward pass, not per layer (cached on the mask
tensor), as transformers' flash_attention_2 path does; with the collator's `cu_seq_lens`
nothing synchronises.

Sliding windows (Mistral, Gemma 2/3) and logit softcapping (Gemma 2) run in FlashCore's
kernels. transformers' sliding-window mask lets query q see key k iff
`q - sliding_window < k <= q` (`masking_utils.sliding_window_overlay`): the query and the
`sliding_window - 1` keys before it. That is flash_attn's `window_size=(sliding_window - 1, 0)`,
what transformers' own flash_attention_2 path passes (`(sliding_window - 1, sliding_window - 1)`
with causal=True, whose right side causal makes 0). The mask builder leaves the window out
(FlashCore applies the layer's `sliding_window`, per sequence in a padded or packed batch).
Differentiable: a training step runs the window and the softcap in the backward kernels
too, padded and packed batches included.
"""

from __future__ import annotations

import weakref
from typing import Callable, Optional, Tuple

import torch
from torch import Tensor

from .. import _ops
from .._args import NO_WINDOW, _check, _scale, _unsupported
from .._paths import _attention
from ..interface import flash_attn_varlen_func

NAME = "fc_attention"


class _Unpadded:
    """Where the real rows of a padded `[B, S]` batch lie: their flat indices, the packed
    batch's cumulative lengths (int32 `[B + 1]`) and its longest sequence."""

    def __init__(self, keep: Tensor):
        keep = keep.bool()
        lengths = keep.sum(-1, dtype=torch.int32)
        self.rows = keep.shape[1]
        self.indices = torch.nonzero(keep.flatten(), as_tuple=False).flatten()  # synchronises
        self.cu_seqlens = torch.nn.functional.pad(torch.cumsum(lengths, 0, dtype=torch.int32), (1, 0))
        self.max_seqlen = int(lengths.max()) if lengths.numel() else 0  # synchronises

    def gather(self, x: Tensor) -> Tensor:
        """`[B, S, H, D]` -> the real rows `[total, H, D]`."""
        return x.reshape(-1, *x.shape[2:])[self.indices]

    def scatter(self, x: Tensor, batch: int) -> Tensor:
        """The real rows `[total, H, D]` back into a zero-padded `[B, S, H, D]`."""
        out = x.new_zeros((batch * self.rows, *x.shape[1:]))
        return out.index_copy(0, self.indices, x).view(batch, self.rows, *x.shape[1:])


class _Packed:
    """A packed row of sequences (`position_ids [1, S]` that restart): cumulative lengths and
    the longest, from the positions where the step to the next position is not +1 (as
    transformers' `find_packed_sequence_indices`)."""

    def __init__(self, cu_seqlens: Tensor, max_seqlen: int):
        self.cu_seqlens, self.max_seqlen = cu_seqlens, max_seqlen

    @classmethod
    def of(cls, position_ids: Tensor) -> Optional["_Packed"]:
        pos = position_ids[0]
        starts = torch.ones_like(pos, dtype=torch.bool)
        starts[1:] = pos[1:] - pos[:-1] != 1
        first = torch.nonzero(starts, as_tuple=False).flatten().to(torch.int32)  # synchronises
        if first.numel() <= 1:
            return None  # one sequence: the dense kernels
        cu = torch.cat((first, first.new_tensor([pos.shape[0]])))
        return cls(cu, int((cu[1:] - cu[:-1]).max()))


class _PerTensor:
    """Values computed once per tensor object: transformers hands every layer of a forward
    pass the same mask and position tensors. Keyed by identity (a WeakKeyDictionary would
    compare tensors with `==`); an entry goes when its tensor is freed."""

    def __init__(self):
        self._entries: dict = {}

    def get(self, t: Tensor, make: Callable):
        key = id(t)
        entry = self._entries.get(key)
        if entry is not None and entry[0]() is t:
            return entry[1]
        value = make(t)
        self._entries[key] = (weakref.ref(t, lambda _, key=key: self._entries.pop(key, None)), value)
        return value


_UNPADDED = _PerTensor()
_PACKED = _PerTensor()


def _varlen(q: Tensor, k: Tensor, v: Tensor, lengths: Tuple[Tensor, Tensor, int, int], options: _ops.Options) -> Tensor:
    """flash_attn_varlen_func over a packed batch of these `lengths` (`(cu_seqlens_q,
    cu_seqlens_k, max_seqlen_q, max_seqlen_k)`) under the layer's `options`."""
    o = options
    return flash_attn_varlen_func(q, k, v, *lengths, softmax_scale=o.softmax_scale, causal=o.causal, window_size=o.window, softcap=o.softcap)


def _padded_attention(q: Tensor, k: Tensor, v: Tensor, mask: Tensor, options: _ops.Options) -> Tensor:
    """Attention over a padded batch (BSHD; `mask [B, Sk]` 1 on real keys, the queries the
    last Sq of them): unpadded into a packed batch, each sequence bottom-right aligned on its
    own lengths, and padded back (zeros on padding rows)."""
    b, sq, sk = q.shape[0], q.shape[1], k.shape[1]
    keys = _UNPADDED.get(mask, _Unpadded)
    if sq == sk:
        queries = keys
    elif sq == 1:  # decode: one real query a sequence
        lengths = (_arange_cu(b, q.device), keys.cu_seqlens, 1, keys.max_seqlen)
        out = _varlen(q.reshape(b, *q.shape[2:]), keys.gather(k), keys.gather(v), lengths, options)
        return out.view(b, 1, *out.shape[1:])
    else:
        queries = _Unpadded(mask[:, -sq:])
    lengths = (queries.cu_seqlens, keys.cu_seqlens, queries.max_seqlen, keys.max_seqlen)
    out = _varlen(queries.gather(q), keys.gather(k), keys.gather(v), lengths, options)
    return queries.scatter(out, b)


def _arange_cu(batch: int, device) -> Tensor:
    return torch.arange(batch + 1, dtype=torch.int32, device=device)


def _packed_lengths(kwargs: dict, q: Tensor) -> Optional[Tuple[Tensor, Tensor, int, int]]:
    """`(cu_seqlens_q, cu_seqlens_k, max_q, max_k)` of a packed row, from the collator's
    `cu_seq_lens_q/k` and `max_length_q/k` or from restarting `position_ids`; None for a batch
    of whole sequences."""
    if kwargs.get("cu_seq_lens_q") is not None:
        cu_q, cu_k = kwargs["cu_seq_lens_q"], kwargs.get("cu_seq_lens_k", kwargs["cu_seq_lens_q"])
        max_q, max_k = kwargs.get("max_length_q"), kwargs.get("max_length_k", kwargs.get("max_length_q"))
        if max_q is None or max_k is None:
            raise ValueError("`cu_seq_lens_q` needs `max_length_q` (and `cu_seq_lens_k` `max_length_k`): the longest sequence's length")
        return cu_q.to(torch.int32), cu_k.to(torch.int32), int(max_q), int(max_k)
    position_ids = kwargs.get("position_ids")
    if position_ids is None or q.shape[0] != 1 or q.shape[1] == 1:
        return None
    if not isinstance(position_ids, Tensor) or position_ids.dim() != 2:
        return None  # e.g. multimodal rotary positions [3, B, S]: not a packing signal
    if tuple(position_ids.shape) != (1, q.shape[1]) or position_ids.is_floating_point():
        raise ValueError(f"`position_ids` must be integers [1, {q.shape[1]}] (a position per query), got {tuple(position_ids.shape)} {position_ids.dtype}")
    packed = _PACKED.get(position_ids, _Packed.of)
    return None if packed is None else (packed.cu_seqlens, packed.cu_seqlens, packed.max_seqlen, packed.max_seqlen)


def attention_forward(
    module: torch.nn.Module,
    query: Tensor,
    key: Tensor,
    value: Tensor,
    attention_mask: Optional[Tensor],
    dropout: float = 0.0,
    scaling: Optional[float] = None,
    is_causal: Optional[bool] = None,
    sliding_window: Optional[int] = None,
    softcap: Optional[float] = None,
    **kwargs,
) -> Tuple[Tensor, None]:
    """transformers' attention-function contract: `query [B, Hq, Sq, D]`, `key, value
    [B, Hkv, Sk, D]` (GQA heads not repeated) in; `[B, Sq, Hq, D]` and no weights out.
    `attention_mask`: None, or the 2-D padding mask `[B, Sk]` of this module's mask builder."""
    _check((("query", query), ("key", key), ("value", value)), "[B, H, S, D]")
    if attention_mask is not None and (attention_mask.dim() != 2 or tuple(attention_mask.shape) != (query.shape[0], key.shape[2])):
        raise _unsupported("attention_mask", f"<{attention_mask.dim()}-D mask {tuple(attention_mask.shape)}>", "(a pattern other than padding, or a static cache's) is not supported yet")
    if dropout != 0.0:
        raise _unsupported("dropout", dropout)
    if kwargs.get("position_bias") is not None:
        raise _unsupported("position_bias", "<tensor>")
    if kwargs.get("output_attentions", False):
        raise _unsupported("output_attentions", True, "(fused attention never forms the weights)")
    model_causal = bool(is_causal if is_causal is not None else getattr(module, "is_causal", True))
    window = NO_WINDOW
    if sliding_window is not None:
        if not model_causal:
            # transformers' bidirectional windows differ by model (|q - k| <= sliding_window in
            # masking_utils, other sizes in some models' flash paths): not guessed at.
            raise _unsupported("sliding_window", sliding_window, "without a causal mask is not supported yet")
        window = (int(sliding_window) - 1, 0)  # see the module's docstring
    scale, cap = _scale(scaling, query.shape[-1]), float(softcap or 0.0)
    q, k, v = (t.transpose(1, 2) for t in (query, key, value))  # BSHD views
    q_len, kv_len = q.shape[1], k.shape[1]
    if attention_mask is not None:
        return _padded_attention(q, k, v, attention_mask, _ops.Options(scale, model_causal, window, cap)), None
    packed = _packed_lengths(kwargs, q) if q_len == kv_len else None
    if packed is not None:
        out = _varlen(q[0], k[0], v[0], packed, _ops.Options(scale, model_causal, window, cap))
        return out.unsqueeze(0), None
    causal = model_causal and q_len > 1
    if causal and kv_len > q_len:
        # No mask and more keys than queries: SDPA's top-left causal (the prefill of an empty
        # static cache), under which no query sees the keys past q_len.
        k, v = k[:, :q_len], v[:, :q_len]
    # One query row (decode) with a window: bottom-right aligned, it sees the last keys.
    out, _ = _attention(q, k, v, _ops.Options(scale, causal, window, cap), False)
    return out, None


def _expressible(mask_function: Optional[Callable]) -> bool:
    """Whether transformers' mask function is causal, its sliding-window form, its packed
    sequences, or an `and_masks` of these: what FlashCore applies from the layer's arguments
    and `position_ids`. Anything else (an `or_masks` overlay, image tokens, ...) is not."""
    if mask_function is None:
        return True
    from transformers import masking_utils

    if mask_function is masking_utils.causal_mask_function:
        return True
    name = getattr(mask_function, "__qualname__", "")
    if name.startswith(("sliding_window_causal_mask_function.", "sliding_window_overlay.", "packed_sequence_mask_function.")):
        return True
    if name.startswith("and_masks."):
        parts = [c.cell_contents for c in (mask_function.__closure__ or ())]
        functions = [f for part in parts for f in (part if isinstance(part, tuple) else (part,)) if callable(f)]
        return bool(functions) and all(_expressible(f) for f in functions)
    return False


def _mask(**kwargs):
    """The mask builder registered with the implementation (see the module): the 2-D padding
    mask or None where FlashCore can express the pattern, else SDPA's 4-D mask (refused by
    `attention_forward`). `allow_is_causal_skip` is False for compileable (static) caches,
    whose unfilled slots only a mask hides, and wherever transformers adds a pattern; of
    those, FlashCore takes only packed sequences without a cache (kv_length = the queries).
    transformers calls it with keywords, which changed across versions (`cache_position`,
    later `q_length` and `q_offset`): only the ones read here are assumed."""
    kv_length, attention_mask = kwargs["kv_length"], kwargs.get("attention_mask")
    q_length = kwargs["q_length"] if "q_length" in kwargs else kwargs["cache_position"].shape[0]
    if _expressible(kwargs.get("mask_function")) and (kwargs.get("allow_is_causal_skip", True) or kv_length == q_length):
        if attention_mask is not None:
            attention_mask = attention_mask[:, -kv_length:]
            if attention_mask.all():  # synchronises, once per forward pass
                attention_mask = None
        return attention_mask
    from transformers.masking_utils import sdpa_mask

    return sdpa_mask(**kwargs)


def register(name: str = NAME) -> str:
    """Registers FlashCore with transformers under `name` and returns it, for
    `attn_implementation=`. A name containing "flash" is refused (see above)."""
    if "flash" in name:
        raise ValueError(f"`name={name!r}`: transformers takes names containing 'flash' for FlashAttention builds it imports itself; choose another")
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface

    AttentionInterface.register(name, attention_forward)
    AttentionMaskInterface.register(name, _mask)
    return name
