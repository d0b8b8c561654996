"""Attention dropout (forward on fwd_sm90 on Hopper, else fwd_sm80; fwd_sm80 wherever the
probabilities are asked for; backward on bwd_sm90 on Hopper, else bwd_sm80): the output and the gradients equal the
float64 reference under the kernel's own mask (read back from the probabilities
`return_attn_probs` gives, negated where dropped), the mask drops its fraction, is the same
for the same generator state and new for the next call, whichever forward kernel draws it,
the probabilities are exp(s·scale − running max) at the kernel's key blocks walked from the
last, and head dims the Ampere-class kernels lack run padded. Packed batches too, and CUDA
graphs (each replay its own mask)."""

from __future__ import annotations

import math

import pytest
import torch

import flashcore
from flashcore.compat.flash_attn.flash_attn_interface import _get_block_size_n
from helpers import randn, rel_l2


def reference(q, k, v, keep, p, scale, causal):
    """float64 attention with the kept mask `keep [B, H, Sq, Sk]` (bool) scaled by 1/(1-p):
    (o, lse of the undropped softmax)."""
    q, k, v = (t.double() for t in (q, k, v))
    g = q.shape[2] // k.shape[2]
    k, v = (t.repeat_interleave(g, dim=2) for t in (k, v))
    s = torch.einsum("bqhd,bkhd->bhqk", q, k) * scale
    sq, sk = q.shape[1], k.shape[1]
    if causal:
        visible = torch.arange(sk, device=q.device)[None, :] <= torch.arange(sq, device=q.device)[:, None] + sk - sq
        s = s.masked_fill(~visible, -math.inf)
    lse = torch.logsumexp(s, dim=-1)
    prob = torch.softmax(s, dim=-1).nan_to_num(0.0) * keep / (1 - p)
    return torch.einsum("bhqk,bkhd->bqhd", prob, v), lse


@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("d", [64, 128, 80])
@pytest.mark.parametrize("p", [0.17, 0.5])
def test_output_and_gradients_under_the_kernels_own_mask(p, d, causal):
    torch.manual_seed(0)
    b, sq, sk, hq, hkv = 2, 301, 517, 4, 2
    q, k, v = (randn(b, s, h, d, seed=i).requires_grad_() for i, (s, h) in enumerate([(sq, hq), (sk, hkv), (sk, hkv)]))
    out, lse, probs = flashcore.flash_attn_func(q, k, v, dropout_p=p, causal=causal, return_attn_probs=True)
    assert probs.shape == (b, hq, 384, 640) and probs.dtype == q.dtype
    keep = probs[:, :, :sq, :sk] >= 0
    scale = d**-0.5
    ref_o, ref_lse = reference(q, k, v, keep, p, scale, causal)
    assert torch.isfinite(out).all() and rel_l2(out, ref_o) < 2e-2
    seen = torch.isfinite(ref_lse)
    assert (lse[seen].double() - ref_lse[seen]).abs().max() < 1e-2
    # The mask drops its fraction of the visible scores (sampled over ~600k of them).
    if causal:
        visible = torch.arange(sk, device="cuda")[None, :] <= torch.arange(sq, device="cuda")[:, None] + sk - sq
        fraction = (~keep & visible).sum().item() / (visible.sum().item() * b * hq)
    else:
        fraction = (~keep).float().mean().item()
    assert abs(fraction - p) < 0.01, fraction
    # The probabilities are exp(s·scale − m), m the running max over the kernel's key blocks
    # from the last (their size: what flash_attn's _get_block_size_n answers).
    block = _get_block_size_n("cuda", d, True, causal)
    s = torch.einsum("bqhd,bkhd->bhqk", q.double(), k.double().repeat_interleave(2, dim=2)) * scale
    if causal:
        s = s.masked_fill(~visible, -math.inf)
    block_max = torch.stack([blk.amax(-1) for blk in s.split(block, dim=-1)], dim=-1)
    running = block_max.flip(-1).cummax(-1).values.flip(-1).repeat_interleave(block, dim=-1)[..., :sk]
    want = torch.exp(s - running).nan_to_num(0.0)
    got = probs[:, :, :sq, :sk].abs().double()
    assert (got - want).abs().max() < 1e-2
    # Gradients under the same mask.
    g = randn(*out.shape, seed=9)
    dq, dk, dv = torch.autograd.grad(out, (q, k, v), g)
    rq, rk, rv = (t.detach().double().requires_grad_() for t in (q, k, v))
    ref_o, _ = reference(rq, rk, rv, keep, p, scale, causal)
    want = torch.autograd.grad(ref_o, (rq, rk, rv), g.double())
    for name, got, ref in zip("qkv", (dq, dk, dv), want):
        assert torch.isfinite(got).all() and rel_l2(got, ref) < 3e-2, f"d{name}: {rel_l2(got, ref):.3g}"


def test_the_mask_follows_the_generator():
    q = randn(1, 256, 4, 64)
    torch.manual_seed(5)
    a = flashcore.flash_attn_func(q, q, q, dropout_p=0.3, return_attn_probs=True)[2]
    b = flashcore.flash_attn_func(q, q, q, dropout_p=0.3, return_attn_probs=True)[2]
    torch.manual_seed(5)
    c = flashcore.flash_attn_func(q, q, q, dropout_p=0.3, return_attn_probs=True)[2]
    assert torch.equal(a, c), "the same seed and offset, the same mask"
    assert not torch.equal(a >= 0, b >= 0), "the next call, another mask"


@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("d", [64, 80, 128, 256])
def test_the_mask_is_the_same_whichever_forward_kernel_draws_it(d, causal):
    # Asked for the probabilities, the forward runs fwd_sm80; without, the default kernel
    # (fwd_sm90 on Hopper). Under one generator state both must drop the same scores: their
    # outputs agree to rounding (another mask would move them by some 10%), and so do the
    # gradients, which the backward computes under the mask it draws again.
    b, sq, sk, h = 2, 333, 517, 4
    q, k, v = (randn(b, s, h, d, seed=i).requires_grad_() for i, s in enumerate([sq, sk, sk]))
    g = randn(b, sq, h, d, seed=9)
    torch.manual_seed(11)
    with_probs = flashcore.flash_attn_func(q, k, v, dropout_p=0.2, causal=causal, return_attn_probs=True)[0]
    torch.manual_seed(11)
    default = flashcore.flash_attn_func(q, k, v, dropout_p=0.2, causal=causal)
    assert torch.isfinite(default).all() and rel_l2(default, with_probs) < 1e-2
    for x, y in zip(torch.autograd.grad(with_probs, (q, k, v), g), torch.autograd.grad(default, (q, k, v), g)):
        assert torch.isfinite(y).all() and rel_l2(y, x) < 1e-2


def test_a_packed_batch_under_its_own_mask():
    torch.manual_seed(1)
    lens = [37, 300, 1]
    d, h = 64, 4
    q, k, v = (randn(sum(lens), h, d, seed=i).requires_grad_() for i in range(3))
    cu = torch.tensor([0, 37, 337, 338], dtype=torch.int32, device="cuda")
    out, lse, probs = flashcore.flash_attn_varlen_func(q, k, v, cu, cu, 300, 300, dropout_p=0.2, causal=True, return_attn_probs=True)
    assert probs.shape == (3, h, 384, 384)
    g = randn(*out.shape, seed=7)
    dq, dk, dv = torch.autograd.grad(out, (q, k, v), g)
    for i, n in enumerate(lens):
        rows = slice(int(cu[i]), int(cu[i + 1]))
        keep = probs[i : i + 1, :, :n, :n] >= 0
        rq, rk, rv = (t[rows][None].detach().double().requires_grad_() for t in (q, k, v))
        ref_o, _ = reference(rq, rk, rv, keep, 0.2, d**-0.5, True)
        assert rel_l2(out[rows][None], ref_o) < 2e-2
        want = torch.autograd.grad(ref_o, (rq, rk, rv), g[rows][None].double())
        # floor: a one-key row's dq and dk are zero but for O's bf16 rounding in D_i = rowsum(dO ∘ O)
        for got, ref in zip((dq, dk, dv), want):
            assert rel_l2(got[rows][None], ref, floor=2.0) < 3e-2


def test_cuda_graph_replays_draw_new_masks_and_the_backward_follows_each():
    # Forward and backward captured in one graph: each replay draws a fresh (seed, offset)
    # pair on the device; the output and the gradients must follow that replay's own mask
    # (read back from the probabilities), and torch.manual_seed reproduces a replay.
    b, s, h, d, p = 1, 200, 4, 64, 0.3
    q, k, v = (randn(b, s, h, d, seed=i).requires_grad_() for i in range(3))
    g = randn(b, s, h, d, seed=5)

    def step():
        out, _, probs = flashcore.flash_attn_func(q, k, v, dropout_p=p, causal=True, return_attn_probs=True)
        return (out, probs, *torch.autograd.grad(out, (q, k, v), g))

    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):  # warm-up: compiles and loads the kernels
        step()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        static = step()
    replays = []
    for seed in (3, 4, 3):
        torch.manual_seed(seed)
        graph.replay()
        torch.cuda.synchronize()
        replays.append(tuple(t.clone() for t in static))
    assert not torch.equal(replays[0][1] >= 0, replays[1][1] >= 0), "each replay, another mask"
    assert all(torch.equal(a, c) for a, c in zip(replays[0], replays[2])), "the same seed, the same replay"
    for out, probs, dq, dk, dv in replays[:2]:
        keep = probs[:, :, :s, :s] >= 0
        rq, rk, rv = (t.detach().double().requires_grad_() for t in (q, k, v))
        ref_o, _ = reference(rq, rk, rv, keep, p, d**-0.5, True)
        assert rel_l2(out, ref_o) < 2e-2
        want = torch.autograd.grad(ref_o, (rq, rk, rv), g.double())
        for name, got, ref in zip("qkv", (dq, dk, dv), want):
            assert torch.isfinite(got).all() and rel_l2(got, ref) < 3e-2, f"d{name}: {rel_l2(got, ref):.3g}"
