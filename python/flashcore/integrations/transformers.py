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
NotImplementedError for an explicit mask, sliding windows, softcapping and dropout, which
it cannot express yet: never a silently different result.
"""

from __future__ import annotations

from typing import Optional, Tuple

import torch
from torch import Tensor

from ..interface import _attention, _check, _scale, _unsupported

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
    if sliding_window is not None:
        raise _unsupported("sliding_window", sliding_window)
    if softcap is not None and softcap != 0.0:
        raise _unsupported("softcap", softcap)
    if kwargs.get("position_bias") is not None:
        raise _unsupported("position_bias", "<tensor>")
    if kwargs.get("output_attentions", False):
        raise _unsupported("output_attentions", True, "(fused attention never forms the weights)")
    causal = is_causal if is_causal is not None else getattr(module, "is_causal", True)
    q_len, kv_len = query.shape[2], key.shape[2]
    causal = bool(causal) and q_len > 1
    if causal and kv_len > q_len:
        # No mask and more keys than queries: SDPA's top-left causal (the prefill of an empty
        # static cache), under which no query sees the keys past q_len.
        key, value = key[:, :, :q_len], value[:, :, :q_len]
    q, k, v = (t.transpose(1, 2) for t in (query, key, value))
    out, _ = _attention(q, k, v, _scale(scaling, query.shape[-1]), causal, 0, False)
    return out, None


def register(name: str = NAME) -> str:
    """Registers FlashCore with transformers under `name` and returns it, for
    `attn_implementation=`. A name containing "flash" is refused (see above)."""
    if "flash" in name:
        raise ValueError(f"`name={name!r}`: transformers takes names containing 'flash' for FlashAttention builds it imports itself; choose another")
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

    AttentionInterface.register(name, attention_forward)
    AttentionMaskInterface.register(name, sdpa_mask)
    return name
