"""flash_attn.bert_padding on FlashCore: a padded batch to a packed (varlen) one and back, as
transformers and other flash-attn users call them; plain PyTorch indexing, differentiable
(autograd scatters the gradients back through the same indices)."""

from __future__ import annotations

from typing import Optional, Tuple

import torch
from torch import Tensor


def index_first_axis(input: Tensor, indices: Tensor) -> Tensor:
    """`input`'s rows `indices` along its first axis (`input [N, ...]` -> `[len(indices), ...]`)."""
    return input.index_select(0, indices)


def unpad_input(hidden_states: Tensor, attention_mask: Tensor, unused_mask: Optional[Tensor] = None) -> Tuple[Tensor, Tensor, Tensor, int, Tensor]:
    """A padded batch packed: `hidden_states [B, S, ...]`, `attention_mask [B, S]` (nonzero:
    a real token) -> `(tokens [total, ...], indices, cu_seqlens, max_seqlen, seqused)`:
    the tokens in batch order, their indices in the flattened `B·S`, int32 `cu_seqlens [B +
    1]`, the longest sequence's length, and int32 `seqused [B]` (each row's tokens of
    `attention_mask`). With `unused_mask [B, S]` (tokens kept in the packed batch but not
    attended, flash-attn 2.7's addition) the packed batch and `cu_seqlens` hold both masks'
    tokens and `seqused` `attention_mask`'s alone."""
    kept = attention_mask.bool() if unused_mask is None else attention_mask.bool() | unused_mask.bool()
    seqlens = kept.sum(dim=-1, dtype=torch.int32)
    used = attention_mask.bool().sum(dim=-1, dtype=torch.int32)
    indices = torch.nonzero(kept.flatten(), as_tuple=False).flatten()
    max_seqlen = int(seqlens.max().item()) if seqlens.numel() else 0  # one host read, as flash-attn
    cu_seqlens = torch.nn.functional.pad(torch.cumsum(seqlens, dim=0, dtype=torch.int32), (1, 0))
    tokens = index_first_axis(hidden_states.reshape(-1, *hidden_states.shape[2:]), indices)
    return tokens, indices, cu_seqlens, max_seqlen, used


def pad_input(hidden_states: Tensor, indices: Tensor, batch: int, seqlen: int) -> Tensor:
    """The inverse of `unpad_input`: `hidden_states [total, ...]` back to `[batch, seqlen,
    ...]`, zeros where no token was."""
    out = hidden_states.new_zeros((batch * seqlen, *hidden_states.shape[1:]))
    return out.index_copy(0, indices, hidden_states).reshape(batch, seqlen, *hidden_states.shape[1:])


__all__ = ["index_first_axis", "pad_input", "unpad_input"]
