"""flash_attn.flash_attn_interface (2.8.3's signatures) on FlashCore: the attention functions,
their packed forms (`qkv [B, S, 3, H, D]`, `kv [B, S, 2, Hkv, D]`, and the varlen ones with
a leading total instead of B, S), the low-level `_flash_attn_forward` family, and the two
names flash-attn's own tests import. The packed forms split their argument into strided views
(no copy; autograd adds the gradients back into the packed tensor)."""

from __future__ import annotations

import re
from typing import Optional, Tuple

import torch
from torch import Tensor

from ... import _flashcore, _ops, interface
from ...flash_attn_interface import (
    _flash_attn_backward,
    _flash_attn_forward,
    _flash_attn_varlen_backward,
    _flash_attn_varlen_forward,
)
from ...interface import flash_attn_func, flash_attn_with_kvcache

__all__ = [
    "USE_TRITON_ROCM",
    "_get_block_size_n",
    "_flash_attn_forward",
    "_flash_attn_backward",
    "_flash_attn_varlen_forward",
    "_flash_attn_varlen_backward",
    "flash_attn_func",
    "flash_attn_kvpacked_func",
    "flash_attn_qkvpacked_func",
    "flash_attn_varlen_func",
    "flash_attn_varlen_kvpacked_func",
    "flash_attn_varlen_qkvpacked_func",
    "flash_attn_with_kvcache",
]

# flash-attn's switch to its Triton kernels on ROCm; FlashCore runs CUDA only.
USE_TRITON_ROCM = False


def _get_block_size_n(device, head_dim: int, is_dropout: bool, is_causal: bool) -> int:
    """flash-attn's key block size, which its tests use to undo the per-block scaling of the
    probabilities `return_attn_probs=True` returns with dropout: FlashCore's, the key block of
    the kernel that writes them (fwd_sm80's, 64 keys on Hopper; the answer is that of a long
    sequence, whose tile elsewhere may differ from a short one's)."""
    index = (torch.device(device).index if not isinstance(device, int) else device) or 0
    d = _flashcore.run_head_dim(index, head_dim, "dropout") if is_dropout else head_dim
    options = _ops.Options(softmax_scale=d**-0.5, causal=bool(is_causal)).arg()
    plan = _flashcore.plan(index, [1, 4096, 1, d], [1, 4096, 1, d], "bf16", options, dropout=0.5 if is_dropout else 0.0, probs=bool(is_dropout))
    return int(re.search(r"_\d+x(\d+)w", plan).group(1))


def flash_attn_qkvpacked_func(
    qkv: Tensor,
    dropout_p: float = 0.0,
    softmax_scale: Optional[float] = None,
    causal: bool = False,
    window_size: Tuple[int, int] = (-1, -1),
    softcap: float = 0.0,
    alibi_slopes: Optional[Tensor] = None,
    deterministic: bool = False,
    return_attn_probs: bool = False,
):
    """`flash_attn_func` on `qkv [B, S, 3, H, D]`."""
    q, k, v = _unpack(qkv, 3, "qkv", "[B, S, 3, H, D]")
    return flash_attn_func(q, k, v, dropout_p, softmax_scale, causal, window_size, softcap, alibi_slopes, deterministic, return_attn_probs)


def flash_attn_kvpacked_func(
    q: Tensor,
    kv: Tensor,
    dropout_p: float = 0.0,
    softmax_scale: Optional[float] = None,
    causal: bool = False,
    window_size: Tuple[int, int] = (-1, -1),
    softcap: float = 0.0,
    alibi_slopes: Optional[Tensor] = None,
    deterministic: bool = False,
    return_attn_probs: bool = False,
):
    """`flash_attn_func` on `q [B, Sq, Hq, D]` and `kv [B, Sk, 2, Hkv, D]`."""
    k, v = _unpack(kv, 2, "kv", "[B, S, 2, H, D]")
    return flash_attn_func(q, k, v, dropout_p, softmax_scale, causal, window_size, softcap, alibi_slopes, deterministic, return_attn_probs)


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
    block_table: Optional[Tensor] = None,
):
    """`flashcore.flash_attn_varlen_func` with flash-attn's argument order (its last,
    `block_table`, a packed batch over a paged cache, after FlashCore's `seqused_k`)."""
    return interface.flash_attn_varlen_func(
        q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, dropout_p, softmax_scale, causal, window_size, softcap, alibi_slopes,
        deterministic, return_attn_probs, block_table=block_table,
    )


def flash_attn_varlen_qkvpacked_func(
    qkv: Tensor,
    cu_seqlens: Tensor,
    max_seqlen: int,
    dropout_p: float = 0.0,
    softmax_scale: Optional[float] = None,
    causal: bool = False,
    window_size: Tuple[int, int] = (-1, -1),
    softcap: float = 0.0,
    alibi_slopes: Optional[Tensor] = None,
    deterministic: bool = False,
    return_attn_probs: bool = False,
):
    """`flash_attn_varlen_func` on `qkv [total, 3, H, D]`, queries and keys of the same lengths."""
    q, k, v = _unpack(qkv, 3, "qkv", "[total, 3, H, D]")
    return flash_attn_varlen_func(
        q, k, v, cu_seqlens, cu_seqlens, max_seqlen, max_seqlen, dropout_p, softmax_scale, causal, window_size, softcap, alibi_slopes, deterministic, return_attn_probs
    )


def flash_attn_varlen_kvpacked_func(
    q: Tensor,
    kv: Tensor,
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
):
    """`flash_attn_varlen_func` on `q [total_q, Hq, D]` and `kv [total_k, 2, Hkv, D]`."""
    k, v = _unpack(kv, 2, "kv", "[total, 2, H, D]")
    return flash_attn_varlen_func(
        q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, dropout_p, softmax_scale, causal, window_size, softcap, alibi_slopes, deterministic, return_attn_probs
    )


def _unpack(packed: object, parts: int, name: str, layout: str) -> Tuple[Tensor, ...]:
    """The `parts` tensors packed along dim -3 (q, k, v or k, v), or the error naming `name`."""
    if not isinstance(packed, Tensor):
        raise TypeError(f"`{name}` must be a torch.Tensor, got {type(packed).__name__}")
    if packed.dim() < 3 or packed.shape[-3] != parts:
        raise ValueError(f"`{name}` must be {layout}, got shape {tuple(packed.shape)}")
    return packed.unbind(dim=-3)
