"""Rotary position embedding with flash-attn's semantics: `apply_rotary_emb` (on the first
`rotary_dim` columns of each head; plain PyTorch in float32, differentiable), which
`flash_attn.layers.rotary` (flashcore.compat) exports and `flash_attn_with_kvcache` applies
to q and the appended keys when given `rotary_cos` and `rotary_sin`."""

from __future__ import annotations

from typing import Optional, Union

import torch
from torch import Tensor


def apply_rotary_emb(
    x: Tensor,
    cos: Tensor,
    sin: Tensor,
    interleaved: bool = False,
    inplace: bool = False,
    seqlen_offsets: Union[int, Tensor] = 0,
    cu_seqlens: Optional[Tensor] = None,
    max_seqlen: Optional[int] = None,
) -> Tensor:
    """Rotates the first `rotary_dim = 2 · cos.shape[-1]` columns of `x`'s heads by their
    token's position, flash-attn's semantics.

    x: `[B, S, H, D]`, or `[total, H, D]` with `cu_seqlens [B + 1]` (a packed batch; positions
        restart at each sequence).
    cos, sin: `[seqlen_rotary, rotary_dim / 2]`; positions at or past `seqlen_rotary` are left
        as they are (cos 1, sin 0).
    interleaved: rotate the pairs (0, 1), (2, 3), ... (GPT-J) instead of column i with column
        i + rotary_dim / 2 (GPT-NeoX).
    inplace: write the result into `x` and return it.
    seqlen_offsets: an int, or `[B]`: each sequence's positions start there (a KV cache's
        length before the new tokens).
    max_seqlen: accepted for flash-attn's signature; not needed here.
    """
    rot = 2 * cos.shape[-1]
    if rot > x.shape[-1]:
        raise ValueError(f"rotary dim {rot} (2 x cos.shape[-1]) exceeds the head dim {x.shape[-1]}")
    out = rotate_at(x, cos, sin, _positions(x, cu_seqlens, seqlen_offsets), interleaved)
    if inplace:
        return x.copy_(out)
    return out


def rotate_at(x: Tensor, cos: Tensor, sin: Tensor, positions: Tensor, interleaved: bool) -> Tensor:
    """`x`'s first `2 · cos.shape[-1]` columns of every head rotated, each token at its entry of
    `positions` (x's shape without the heads and the head dim; at or past `cos.shape[0]` left
    as it is)."""
    half = cos.shape[-1]
    rot = 2 * half
    seen = positions < cos.shape[0]
    index = positions.clamp(max=cos.shape[0] - 1)
    c = torch.where(seen[..., None], cos[index].float(), 1.0).unsqueeze(-2)  # [..., 1, half]: every head
    s = torch.where(seen[..., None], sin[index].float(), 0.0).unsqueeze(-2)
    part = x[..., :rot].float()
    if interleaved:
        x1, x2 = part[..., 0::2], part[..., 1::2]
        rotated = torch.stack((x1 * c - x2 * s, x1 * s + x2 * c), dim=-1).flatten(-2)
    else:
        x1, x2 = part[..., :half], part[..., half:]
        rotated = torch.cat((x1 * c - x2 * s, x1 * s + x2 * c), dim=-1)
    return torch.cat((rotated.to(x.dtype), x[..., rot:]), dim=-1)


def _positions(x: Tensor, cu_seqlens: Optional[Tensor], seqlen_offsets: Union[int, Tensor]) -> Tensor:
    """Each token's position: `[B, S]` dense, `[total]` packed."""
    if cu_seqlens is None:
        batch, seqlen = x.shape[:2]
        offsets = torch.as_tensor(seqlen_offsets, device=x.device).long().reshape(-1, 1)  # [B, 1] or [1, 1]
        return torch.arange(seqlen, device=x.device).unsqueeze(0) + offsets.expand(batch, 1)
    total = x.shape[0]
    sequence = token_sequences(cu_seqlens, total)
    offsets = torch.as_tensor(seqlen_offsets, device=x.device).long().reshape(-1).expand(cu_seqlens.shape[0] - 1)
    return torch.arange(total, device=x.device) - cu_seqlens[:-1].long()[sequence] + offsets[sequence]


def token_sequences(cu_seqlens: Tensor, total: int) -> Tensor:
    """The sequence of each of a packed batch's `total` tokens (int64 `[total]`), on the device
    without a host synchronisation; clamped to the batch, so that offsets that break the
    packed contract give wrong positions, never an index outside it."""
    rows = torch.arange(total, device=cu_seqlens.device)
    return torch.searchsorted(cu_seqlens[1:].long(), rows, right=True).clamp_(max=max(cu_seqlens.shape[0] - 2, 0))

