"""The op layer: `flashcore::fwd`, registered once with torch.library (a fake for
torch.compile, an autograd rule), and the one call into the extension.

Tensors cross into Rust as (data pointer, shape, strides, dtype name); the kernel runs on
PyTorch's current stream of the tensors' device; outputs and scratch memory come from
PyTorch's caching allocator. Nothing here synchronises.
"""

from __future__ import annotations

import math
from typing import Optional, Tuple

import torch
from torch import Tensor

from . import _flashcore

DTYPE_NAMES = {torch.float16: "f16", torch.bfloat16: "bf16"}


def _arg(t: Tensor) -> tuple:
    return (t.data_ptr(), t.shape, t.stride(), DTYPE_NAMES[t.dtype])


def _current_stream(device: torch.device) -> int:
    # The raw handle without building a torch.cuda.Stream object (a few microseconds less).
    return torch._C._cuda_getCurrentRawStream(device.index)


def forward_into(q: Tensor, k: Tensor, v: Tensor, o: Tensor, lse: Optional[Tensor], softmax_scale: float, causal: bool, num_splits: int) -> None:
    """Runs the kernel: `o` (BSHD, q's dtype) and, if given, `lse [B, Hq, Sq]` f32 are written."""
    keep = []

    def scratch(nbytes: int) -> int:
        # Freed when this call returns; the caching allocator orders its reuse after the
        # work already queued on this stream.
        buf = torch.empty(nbytes, dtype=torch.uint8, device=q.device)
        keep.append(buf)
        return buf.data_ptr()

    _flashcore.attention_forward(
        q.device.index,
        _current_stream(q.device),
        _arg(q),
        _arg(k),
        _arg(v),
        _arg(o),
        None if lse is None else (lse.data_ptr(), lse.numel()),
        scratch,
        softmax_scale,
        causal,
        num_splits if num_splits > 0 else None,
    )


def forward(q: Tensor, k: Tensor, v: Tensor, softmax_scale: float, causal: bool, num_splits: int, want_lse: bool = True) -> Tuple[Tensor, Optional[Tensor]]:
    """Attention on BSHD tensors: `(o [B, Sq, Hq, D], lse [B, Hq, Sq] f32)`, lse None unless
    `want_lse`. Rows that see no key (no keys at all, or causal with Sq > Sk) give o = 0 and
    lse = -inf."""
    b, sq, hq, d = q.shape
    o = q.new_empty((b, sq, hq, d))  # new_empty: a few microseconds less than torch.empty(...)
    lse = q.new_empty((b, hq, sq), dtype=torch.float32) if want_lse else None
    if o.numel() == 0:
        return o, lse  # an empty batch, as SDPA: nothing to compute
    if k.shape[1] == 0:
        return o.zero_(), (lse.fill_(-math.inf) if lse is not None else None)
    forward_into(q, k, v, o, lse, softmax_scale, causal, num_splits)
    return o, lse


@torch.library.custom_op("flashcore::fwd", mutates_args=(), device_types="cuda")
def fwd(q: Tensor, k: Tensor, v: Tensor, softmax_scale: float, causal: bool, num_splits: int) -> Tuple[Tensor, Tensor]:
    """The registered op: see `forward`."""
    return forward(q, k, v, softmax_scale, causal, num_splits)


@fwd.register_fake
def _fwd_fake(q: Tensor, k: Tensor, v: Tensor, softmax_scale: float, causal: bool, num_splits: int) -> Tuple[Tensor, Tensor]:
    b, sq, hq, d = q.shape
    return q.new_empty((b, sq, hq, d)), q.new_empty((b, hq, sq), dtype=torch.float32)


def _fwd_setup_context(ctx, inputs, output) -> None:
    pass


def _fwd_backward(ctx, grad_o, grad_lse):
    raise NotImplementedError(
        "flashcore: the attention backward pass is not implemented yet (this release is forward-only). "
        "Train with attn_implementation='sdpa' / torch's scaled_dot_product_attention, or run FlashCore "
        "under torch.no_grad() / torch.inference_mode()."
    )


fwd.register_autograd(_fwd_backward, setup_context=_fwd_setup_context)
