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
    half = cos.shape[-1]
    rot = 2 * half
    if rot > x.shape[-1]:
        raise ValueError(f"rotary dim {rot} (2 x cos.shape[-1]) exceeds the head dim {x.shape[-1]}")
    positions = _positions(x, cu_seqlens, seqlen_offsets)
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
    out = torch.cat((rotated.to(x.dtype), x[..., rot:]), dim=-1)
    if inplace:
        return x.copy_(out)
    return out


def _positions(x: Tensor, cu_seqlens: Optional[Tensor], seqlen_offsets: Union[int, Tensor]) -> Tensor:
    """Each token's position: `[B, S]` dense, `[total]` packed."""
    if cu_seqlens is None:
        batch, seqlen = x.shape[:2]
        offsets = torch.as_tensor(seqlen_offsets, device=x.device).long().reshape(-1, 1)  # [B, 1] or [1, 1]
        return torch.arange(seqlen, device=x.device).unsqueeze(0) + offsets.expand(batch, 1)
    lengths = cu_seqlens.diff().long()
    total = x.shape[0]
    sequence = torch.repeat_interleave(torch.arange(lengths.numel(), device=x.device), lengths, output_size=total)
    offsets = torch.as_tensor(seqlen_offsets, device=x.device).long().reshape(-1).expand(lengths.numel())
    return torch.arange(total, device=x.device) - cu_seqlens[:-1].long()[sequence] + offsets[sequence]

