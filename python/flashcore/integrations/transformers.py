"""FlashCore as a Hugging Face transformers attention implementation.

    import flashcore
    attn = flashcore.integrations.transformers.register()         # "fc_attention"
    model = AutoModelForCausalLM.from_config(cfg, attn_implementation=attn)

The name is not "flashcore": transformers (5.x) takes every implementation name that
contains "flash" for a FlashAttention build it must import itself
(`transformers.utils.generic.is_flash_attention_requested`), and then fails to find one.

`register()` adds the name to transformers' `AttentionInterface`, and to its
`AttentionMaskInterface` with the SDPA mask builder: transformers then passes no mask
where the mask is plain causal (or none), exactly as it does for `"sdpa"`, and a 4-D mask
where there is padding or another pattern. FlashCore follows SDPA's reading of a missing
mask (causal when more than one query row, aligned top-left) and raises
NotImplementedError for an explicit mask and dropout, which it cannot express yet: never a
silently different result.

Sliding windows (Mistral, Gemma 2/3) and logit softcapping (Gemma 2) run in FlashCore's
kernels. transformers' sliding-window mask lets query q see key k iff
`q - sliding_window < k <= q` (`masking_utils.sliding_window_overlay`): the query and the
`sliding_window - 1` keys before it. That is flash_attn's `window_size=(sliding_window - 1, 0)`,
what transformers' own flash_attention_2 path passes (`(sliding_window - 1, sliding_window - 1)`
with causal=True, whose right side causal makes 0). The mask builder is SDPA's told nothing of
the window (`local_size`), so where the window is the only thing beyond causal it returns no
mask and the window is applied here; where there is padding it still builds the 4-D mask, which
is refused as above. Differentiable: a training step runs the window and the softcap in the
backward kernels too.
"""

from __future__ import annotations

from typing import Optional, Tuple

import torch
from torch import Tensor

from ..interface import NO_WINDOW, _attention, _check, _scale, _unsupported

NAME = "fc_attention"


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
    [B, Hkv, Sk, D]` (GQA heads not repeated) in; `[B, Sq, Hq, D]` and no weights out."""
    _check((("query", query), ("key", key), ("value", value)), "[B, H, S, D]")
    if attention_mask is not None:
        raise _unsupported("attention_mask", "<4-D mask>", "(padding or a non-causal pattern) is not supported yet")
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
    q_len, kv_len = query.shape[2], key.shape[2]
    causal = model_causal and q_len > 1
    if causal and kv_len > q_len:
        # No mask and more keys than queries: SDPA's top-left causal (the prefill of an empty
        # static cache), under which no query sees the keys past q_len.
        key, value = key[:, :, :q_len], value[:, :, :q_len]
    # One query row (decode) with a window: bottom-right aligned, it sees the last keys.
    q, k, v = (t.transpose(1, 2) for t in (query, key, value))
    out, _ = _attention(q, k, v, _scale(scaling, query.shape[-1]), causal, 0, False, window=window, softcap=float(softcap or 0.0))
    return out, None


def _mask_without_window(*args, local_size: Optional[int] = None, **kwargs):
    """SDPA's mask builder, told of a causal window's size only where it may not skip the mask
    anyway (`allow_is_causal_skip=False`: compiled caches, bidirectional windows): elsewhere it
    returns no mask where there is no padding, and `attention_forward` applies the window
    transformers passes it as `sliding_window`. The masks it does build hold the window."""
    from transformers.masking_utils import sdpa_mask

    if not kwargs.get("allow_is_causal_skip", True):
        kwargs["local_size"] = local_size
    return sdpa_mask(*args, **kwargs)


def register(name: str = NAME) -> str:
    """Registers FlashCore with transformers under `name` and returns it, for
    `attn_implementation=`. A name containing "flash" is refused (see above)."""
    if "flash" in name:
        raise ValueError(f"`name={name!r}`: transformers takes names containing 'flash' for FlashAttention builds it imports itself; choose another")
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface

    AttentionInterface.register(name, attention_forward)
    AttentionMaskInterface.register(name, _mask_without_window)
    return name
