"""Calls without (query, key) pairs: no sequences, no rows or no keys. The core answers them
(`ProblemShape::has_no_pairs`: o = 0 and lse = -inf, or each head's learnable sink, where they
have elements; gradients 0), so every Python entry point gives the core's answer and none
restates it. The outputs start as NaN here: what the core did not write stays NaN and fails."""

from __future__ import annotations

import pytest
import torch

import flashcore
from flashcore import _ops

NAN = float("nan")
CAUSAL = _ops.Options(64**-0.5, True)
FULL = _ops.Options(64**-0.5, False)


def randn(*shape: int) -> torch.Tensor:
    return torch.randn(*shape, device="cuda", dtype=torch.bfloat16)


def nan_like(t: torch.Tensor) -> torch.Tensor:
    return torch.full_like(t, NAN)


@pytest.mark.parametrize("b, sq, sk", [(0, 16, 16), (2, 0, 16), (2, 5, 0), (3, 0, 0)])
def test_dense_forward_and_backward_write_the_core_answer(b, sq, sk):
    q, k, v = randn(b, sq, 4, 64), randn(b, sk, 2, 64), randn(b, sk, 2, 64)
    o, lse = nan_like(q), torch.full((b, 4, sq), NAN, device="cuda")
    _ops.forward_into(q, k, v, (o, lse), CAUSAL)
    assert (o == 0).all() and torch.isneginf(lse).all()
    dq, dk, dv = nan_like(q), nan_like(k), nan_like(v)
    _ops.backward_into((q, k, v, o, lse), randn(b, sq, 4, 64), (dq, dk, dv), CAUSAL)
    for name, g in (("dq", dq), ("dk", dk), ("dv", dv)):
        assert (g == 0).all(), name


def test_no_keys_zeroes_only_the_output_view_of_a_wider_buffer():
    """o a view of every other 64 columns of a wider buffer (its rows do not fill their span):
    the core zeroes the view's elements and nothing between them."""
    q, k = randn(2, 7, 4, 64), randn(2, 0, 2, 64)
    wide = torch.full((2, 7, 4, 128), NAN, device="cuda", dtype=torch.bfloat16)
    o = wide[..., :64]
    _ops.forward_into(q, k, k, (o, None), FULL)
    assert (wide[..., :64] == 0).all() and wide[..., 64:].isnan().all()
    # BHSD memory seen as BSHD (SDPA's layout): the elements fill their span, one memset.
    bhsd = torch.full((2, 4, 7, 64), NAN, device="cuda", dtype=torch.bfloat16)
    _ops.forward_into(q, k, k, (bhsd.transpose(1, 2), None), FULL)
    assert (bhsd == 0).all()


def test_packed_batches_without_sequences_or_keys():
    cu = torch.tensor([0], dtype=torch.int32, device="cuda")  # no sequences at all
    q, k = randn(0, 4, 64), randn(0, 2, 64)
    o, lse = _ops.varlen_forward(q, k, k, _ops.Batch(cu, cu, None, 0, 0), CAUSAL)
    assert o.shape == (0, 4, 64) and lse.shape == (4, 0)
    cu_q = torch.tensor([0, 3, 5], dtype=torch.int32, device="cuda")
    cu_k = torch.tensor([0, 0, 0], dtype=torch.int32, device="cuda")
    q, k = randn(5, 4, 64), randn(0, 2, 64)
    batch = _ops.Batch(cu_q, cu_k, None, 3, 0)
    o, lse = _ops.varlen_forward(q, k, k, batch, CAUSAL)
    assert (o == 0).all() and torch.isneginf(lse).all()
    dq, dk, dv = nan_like(q), nan_like(k), nan_like(k)
    _ops.varlen_backward_into((q, k, k, o, lse), randn(5, 4, 64), (dq, dk, dv), batch, CAUSAL)
    assert (dq == 0).all()


def test_public_functions_agree_on_calls_without_pairs():
    q, k = randn(2, 5, 4, 64), randn(2, 0, 2, 64)
    out, lse, _ = flashcore.flash_attn_func(q, k, k, return_attn_probs=True)
    assert (out == 0).all() and torch.isneginf(lse).all()
    sdpa = flashcore.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), k.transpose(1, 2), enable_gqa=True)
    assert sdpa.shape == (2, 4, 5, 64) and (sdpa == 0).all()
    cache = randn(3, 16, 2, 64)
    lens = torch.zeros(0, dtype=torch.int32, device="cuda")
    out = flashcore.flash_attn_with_kvcache(randn(0, 1, 4, 64), cache, cache, cache_seqlens=lens)
    assert out.shape == (0, 1, 4, 64)


def test_a_problem_without_heads_is_refused_naming_q():
    q, k = randn(2, 5, 0, 64), randn(2, 5, 0, 64)
    with pytest.raises(ValueError, match="`q`.*no heads or no head dim"):
        flashcore.flash_attn_func(q, k, k)


def test_with_learnable_sinks_a_call_without_keys_has_each_heads_sink_as_lse():
    """With learnable sinks a row that sees no key gives o = 0 and lse = its head's sink (the
    sink is the softmax's only term); a call without any key takes the core's shortcut, which
    writes that in the dense layout `[B, Hq, Sq]` and the packed one `[Hq, total_q]`. The
    backward's gradients are 0, the sinks' too (each row's D_i = dO·O = 0)."""
    sink = torch.randn(4, device="cuda", dtype=torch.float32)
    q, k = randn(3, 5, 4, 64), randn(3, 0, 2, 64)
    out, lse, _ = flashcore.flash_attn_func(q, k, k, causal=True, learnable_sink=sink, return_attn_probs=True)
    assert (out == 0).all() and torch.equal(lse, sink[None, :, None].expand(3, 4, 5))
    leaves = [t.clone().requires_grad_() for t in (q, k, k, sink)]
    flashcore.flash_attn_func(*leaves[:3], causal=True, learnable_sink=leaves[3]).backward(randn(3, 5, 4, 64))
    for name, t in zip(("dq", "dk", "dv", "dsink"), leaves):
        assert t.grad is not None and (t.grad == 0).all(), name
    cu_q = torch.tensor([0, 3, 7], dtype=torch.int32, device="cuda")
    cu_k = torch.zeros(3, dtype=torch.int32, device="cuda")
    qp, kp = randn(7, 4, 64), randn(0, 2, 64)
    out, lse, _ = flashcore.flash_attn_varlen_func(qp, kp, kp, cu_q, cu_k, 4, 0, learnable_sink=sink, return_attn_probs=True)
    assert (out == 0).all() and torch.equal(lse, sink[:, None].expand(4, 7))
