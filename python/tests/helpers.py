"""Helpers of the GPU suite: the float64 reference, the error metric, inputs."""

from __future__ import annotations

import math

import torch


# DESIGN §5: relative L2 error bounds against the float64 reference.
REL_BOUND = {torch.bfloat16: 1e-2, torch.float16: 2e-3}


def reference(q, k, v, scale, causal, top_left=False):
    """float64 attention on BSHD tensors: (o [B, Sq, Hq, D], lse [B, Hq, Sq]).
    causal: bottom-right aligned (query i sees key j iff j <= i + Sk - Sq), or top-left
    (j <= i) with `top_left`. Rows that see no key give o = 0, lse = -inf."""
    q, k, v = (t.double().transpose(1, 2) for t in (q, k, v))  # BHSD
    group = q.shape[1] // k.shape[1]
    k, v = (t.repeat_interleave(group, dim=1) for t in (k, v))
    s = torch.matmul(q, k.transpose(-1, -2)) * scale
    sq, sk = q.shape[2], k.shape[2]
    if causal:
        i = torch.arange(sq, device=q.device)[:, None]
        j = torch.arange(sk, device=q.device)[None, :]
        visible = j <= i if top_left else j <= i + (sk - sq)
        s = s.masked_fill(~visible, -math.inf)
    lse = torch.logsumexp(s, dim=-1)
    p = torch.exp(s - lse[..., None]).nan_to_num(0.0)  # rows with no key: exp(-inf - -inf)
    o = torch.matmul(p, v)
    return o.transpose(1, 2), lse


def rel_l2(x, ref, floor=0.0):
    """||x - ref|| / max(||ref||, floor) in float64; NaN or Inf in x gives inf (never passes).
    `floor` keeps an exactly-zero reference (the dq of a row with one visible key) from
    turning f32 rounding into an infinite relative error."""
    x = x.double()
    if not torch.isfinite(x).all():
        return math.inf
    den = max(ref.norm().item(), floor)
    return (x - ref).norm().item() / max(den, 1e-30)


def randn(*shape, dtype=torch.bfloat16, scale=1.0, seed=0):
    g = torch.Generator(device="cuda").manual_seed(seed)
    return torch.randn(*shape, device="cuda", dtype=torch.float32, generator=g).mul_(scale).to(dtype)


def reference_autograd(q, k, v, scale, causal, top_left=False):
    """float64 attention on BSHD tensors that autograd can differentiate, rows that see no
    key included (their output is 0 and their gradient 0, with no NaN on the way)."""
    q, k, v = (t.transpose(1, 2) for t in (q, k, v))  # BHSD
    group = q.shape[1] // k.shape[1]
    k, v = (t.repeat_interleave(group, dim=1) for t in (k, v))
    s = torch.matmul(q, k.transpose(-1, -2)) * scale
    sq, sk = q.shape[2], k.shape[2]
    visible = torch.ones(sq, sk, dtype=torch.bool, device=q.device)
    if causal:
        i = torch.arange(sq, device=q.device)[:, None]
        j = torch.arange(sk, device=q.device)[None, :]
        visible = j <= i if top_left else j <= i + (sk - sq)
    seen = visible.any(-1, keepdim=True)
    s = s.masked_fill(~visible, -math.inf).masked_fill(~seen, 0.0)
    p = torch.softmax(s, dim=-1) * seen
    return torch.matmul(p, v).transpose(1, 2)
