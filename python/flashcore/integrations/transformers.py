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

Chunked attention (Llama 4's "chunked_attention" layers, `config.attention_chunk_size` C):
transformers' mask lets query q see key k iff both are in one chunk of C positions counted
from the sequence's first real token (`chunked_overlay`, causal besides). FlashCore's
`attention_chunk` counts chunks from each sequence's first key, so the layer's chunk (read
from `module.config.layer_types[module.layer_idx]`) runs in its kernels, forward and
backward, padded batches as above. Packed sequences in a chunked layer take SDPA's mask,
refused by name: Llama 4's layers do not hand `position_ids` to their attention, so the
boundaries would not reach FlashCore. With a cache, a chunked layer's keys are a
window of the last C - 1 positions plus the new ones (transformers' sliding cache layer),
whose first key is no chunk's start: the mask builder then gives the 2-D mask with the keys
before the first query's chunk left out (no query sees them), so that the kept keys start
at a chunk, and generation runs past the chunk without a 4-D mask.

Learnable sinks (gpt-oss: the layer's `sinks` parameter, handed over as `s_aux`) run in
FlashCore's kernels as `learnable_sink`: one logit a query head in every row's softmax, with
their gradient in a training step.
"""

from __future__ import annotations

import weakref
from typing import Callable, Optional, Tuple

import torch
from torch import Tensor

from .. import _ops
from .._args import NO_WINDOW, _check, _check_packed, _scale, _unsupported, _with_sinks
from .._paths import _attention
from ..interface import _packed_batch

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
    cu_seqlens_k, max_seqlen_q, max_seqlen_k)`) under the layer's `options` (its chunk
    included, which flash-attn 2's signature has no place for)."""
    cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k = lengths
    _check_packed(q, k, v, cu_seqlens_q, cu_seqlens_k, None)
    return _packed_batch(q, k, v, (cu_seqlens_q, cu_seqlens_k, None), (max_seqlen_q, max_seqlen_k), options, False)[0]


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
    options = _ops.Options(scale, model_causal, window, cap, attention_chunk=_layer_chunk(module))
    q, k, v = (t.transpose(1, 2) for t in (query, key, value))  # BSHD views
    sinks = kwargs.get("s_aux")  # gpt-oss's learnable sinks, `module.sinks` [Hq]
    if sinks is not None:
        options = _with_sinks(options, sinks, q)
    q_len, kv_len = q.shape[1], k.shape[1]
    if attention_mask is not None:
        return _padded_attention(q, k, v, attention_mask, options), None
    packed = _packed_lengths(kwargs, q) if q_len == kv_len else None
    if packed is not None:
        out = _varlen(q[0], k[0], v[0], packed, options)
        return out.unsqueeze(0), None
    causal = model_causal and q_len > 1
    if causal and kv_len > q_len:
        # No mask and more keys than queries: SDPA's top-left causal (the prefill of an empty
        # static cache), under which no query sees the keys past q_len.
        k, v = k[:, :q_len], v[:, :q_len]
    # One query row (decode) with a window or a chunk: bottom-right aligned, it sees the last keys.
    out, _ = _attention(q, k, v, options._replace(causal=causal), False)
    return out, None


def _layer_chunk(module: torch.nn.Module) -> int:
    """The chunk of a chunked-attention layer (`layer_types[layer_idx] == "chunked_attention"`,
    `config.attention_chunk_size`: Llama 4), else 0."""
    config = getattr(module, "config", None)
    types, index = getattr(config, "layer_types", None), getattr(module, "layer_idx", None)
    if types is None or index is None or types[index] != "chunked_attention":
        return 0
    return int(config.attention_chunk_size)


def _expressible(mask_function: Optional[Callable]) -> bool:
    """Whether transformers' mask function is causal, its sliding-window or chunked form, its
    packed sequences, or an `and_masks` of these: what FlashCore applies from the layer's
    arguments and `position_ids`. Anything else (an `or_masks` overlay, image tokens, ...) is not."""
    if mask_function is None:
        return True
    from transformers import masking_utils

    if mask_function is masking_utils.causal_mask_function:
        return True
    name = getattr(mask_function, "__qualname__", "")
    if name.startswith(("sliding_window_causal_mask_function.", "sliding_window_overlay.", "chunked_overlay.", "packed_sequence_mask_function.")):
        return True
    parts = _and_parts(mask_function)
    return bool(parts) and all(_expressible(f) for f in parts)


def _and_parts(mask_function: Callable) -> list:
    """The mask functions an `and_masks` mask function joins (from its closure), else []."""
    if not getattr(mask_function, "__qualname__", "").startswith("and_masks."):
        return []
    cells = [c.cell_contents for c in (mask_function.__closure__ or ())]
    return [f for cell in cells for f in (cell if isinstance(cell, tuple) else (cell,)) if callable(f)]


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
    function = kwargs.get("mask_function")
    chunked = _holds(function, "chunked_overlay.")
    # Packed sequences reach FlashCore as `position_ids`, which Llama 4's layers do not hand
    # to their attention: a chunked layer's packed batch takes SDPA's mask (refused).
    packed_chunks = chunked and _holds(function, "packed_sequence_mask_function.")
    if _expressible(function) and not packed_chunks and (kwargs.get("allow_is_causal_skip", True) or kv_length == q_length):
        if chunked and kwargs.get("kv_offset", 0) > 0:
            attention_mask = _from_the_first_querys_chunk(attention_mask, kwargs)
        if attention_mask is not None:
            attention_mask = attention_mask[:, -kv_length:]
            if attention_mask.all():  # synchronises, once per forward pass
                attention_mask = None
        return attention_mask
    from transformers.masking_utils import sdpa_mask

    return sdpa_mask(**kwargs)


def _holds(mask_function: Optional[Callable], prefix: str) -> bool:
    """Whether transformers' mask function is, or `and_masks` together, a function whose
    qualified name starts with `prefix` (`_expressible`'s walk)."""
    if getattr(mask_function, "__qualname__", "").startswith(prefix):
        return True
    return mask_function is not None and any(_holds(f, prefix) for f in _and_parts(mask_function))


def _from_the_first_querys_chunk(attention_mask: Optional[Tensor], kwargs: dict) -> Tensor:
    """The 2-D mask `[B, kv_offset + kv_length]` of a chunked layer whose cache holds a window
    of keys (from `kv_offset`): the padding mask with every key before the chunk of each
    sequence's first query left out. Chunks count from the sequence's first real token
    (transformers' `chunked_overlay`); no query of this call sees an earlier key, and the kept
    keys then start at a chunk, where FlashCore's chunks count from."""
    kv_offset, kv_length, q_offset = kwargs["kv_offset"], kwargs["kv_length"], kwargs.get("q_offset")
    batch, chunk = kwargs["batch_size"], int(kwargs["local_size"])
    if q_offset is None:  # transformers before q_offset: the queries are the last q_length keys
        q_offset = kv_offset + kv_length - (kwargs["q_length"] if "q_length" in kwargs else kwargs["cache_position"].shape[0])
    device = kwargs.get("device", attention_mask.device if attention_mask is not None else None)
    total = kv_offset + kv_length
    if attention_mask is None:
        attention_mask = torch.ones(batch, total, dtype=torch.bool, device=device)
    attention_mask = attention_mask[:, -total:].bool()
    left_padding = (attention_mask.cumsum(-1) == 0).sum(-1)  # as create_chunked_causal_mask counts it
    start = left_padding + torch.div(q_offset - left_padding, chunk, rounding_mode="floor").clamp(min=0) * chunk
    return attention_mask & (torch.arange(total, device=attention_mask.device) >= start[:, None])


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
