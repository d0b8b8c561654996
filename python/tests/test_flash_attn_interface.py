"""flash_attn's low-level API (`flashcore.flash_attn_interface`) and the eager autograd path:
signatures by name as flash-attn 2.8 has them, attention split over key halves and merged
with the LSEs (ring attention's forward), the backward of a merged result per key half (its
backward), the caller's gradient buffers written, refusals naming the argument."""

from __future__ import annotations

import inspect

import pytest
import torch

import flashcore
from flashcore import _ops
from flashcore import flash_attn_interface as fai
from helpers import REL_BOUND, eager_autograd_node, randn, reference, reference_autograd, rel_l2

SIGNATURES = {  # flash-attn 2.8's argument names, in order (libraries read them by name); main's zero_tensors, num_splits
    "_flash_attn_forward": "q k v dropout_p softmax_scale causal window_size_left window_size_right softcap alibi_slopes return_softmax",
    "_flash_attn_varlen_forward": "q k v cu_seqlens_q cu_seqlens_k max_seqlen_q max_seqlen_k dropout_p softmax_scale causal window_size_left "
    "window_size_right softcap alibi_slopes return_softmax block_table leftpad_k seqused_k zero_tensors num_splits",
    "_flash_attn_backward": "dout q k v out softmax_lse dq dk dv dropout_p softmax_scale causal window_size_left window_size_right softcap "
    "alibi_slopes deterministic rng_state",
    "_flash_attn_varlen_backward": "dout q k v out softmax_lse dq dk dv cu_seqlens_q cu_seqlens_k max_seqlen_q max_seqlen_k dropout_p "
    "softmax_scale causal window_size_left window_size_right softcap alibi_slopes deterministic rng_state",
}


@pytest.mark.parametrize("name", sorted(SIGNATURES))
def test_signatures_match_flash_attn(name):
    assert inspect.getfullargspec(getattr(fai, name)).args == SIGNATURES[name].split()


def merge(o1, lse1, o2, lse2):
    """Two partial attentions over disjoint keys, merged by their LSEs ([B, H, S] f32)."""
    lse = torch.logaddexp(lse1, lse2)
    w1, w2 = (torch.exp(x - lse).transpose(1, 2).unsqueeze(-1) for x in (lse1, lse2))
    return (o1.float() * w1 + o2.float() * w2).to(o1.dtype), lse


def test_forward_over_key_halves_merges_to_one_call():
    b, s, hq, hkv, d = 2, 300, 8, 2, 128
    q, k, v = randn(b, s, hq, d, seed=1), randn(b, 2 * s, hkv, d, seed=2), randn(b, 2 * s, hkv, d, seed=3)
    scale = d**-0.5
    whole, lse, s_dmask, rng_state = fai._flash_attn_forward(q, k, v, 0.0, scale, False, -1, -1, 0.0, None, False)
    assert lse.shape == (b, hq, s) and lse.dtype == torch.float32
    assert s_dmask.numel() == 0 and rng_state.shape == (2,)
    halves = [fai._flash_attn_forward(q, k[:, i * s : (i + 1) * s], v[:, i * s : (i + 1) * s], 0.0, scale, False, -1, -1, 0.0, None, False) for i in (0, 1)]
    merged, merged_lse = merge(halves[0][0], halves[0][1], halves[1][0], halves[1][1])
    ref, ref_lse = reference(q, k, v, scale, False)
    assert rel_l2(merged, ref) < REL_BOUND[torch.bfloat16]
    assert rel_l2(whole, ref) < REL_BOUND[torch.bfloat16]
    assert (merged_lse - lse).abs().max().item() < 1e-4
    assert (lse.double() - ref_lse).abs().max().item() < 1e-3


def test_backward_per_key_half_of_merged_result_equals_one_call():
    """Ring attention's backward: the second half of the queries (causal) against keys in two
    halves, each half's backward from the merged out and lse; dq sums, dk and dv concatenate."""
    b, s, h, d = 1, 256, 4, 64
    scale = d**-0.5
    q, k, v = randn(b, 2 * s, h, d, seed=4), randn(b, 2 * s, h, d, seed=5), randn(b, 2 * s, h, d, seed=6)
    dout = randn(b, s, h, d, seed=7)
    q2 = q[:, s:].contiguous()
    # Whole: queries s..2s-1 against all 2s keys, causal (bottom-right: the diagonal lines up).
    o, lse, _, _ = fai._flash_attn_forward(q2, k, v, 0.0, scale, True, -1, -1, 0.0, None, False)
    dq, dk, dv = torch.empty_like(q2), torch.empty_like(k), torch.empty_like(v)
    fai._flash_attn_backward(dout, q2, k, v, o, lse, dq, dk, dv, 0.0, scale, True, -1, -1, 0.0, None, False)
    # Per half: keys 0..s-1 are all visible (no mask); keys s..2s-1 causal on the diagonal.
    o0, lse0, _, _ = fai._flash_attn_forward(q2, k[:, :s], v[:, :s], 0.0, scale, False, -1, -1, 0.0, None, False)
    o1, lse1, _, _ = fai._flash_attn_forward(q2, k[:, s:], v[:, s:], 0.0, scale, True, -1, -1, 0.0, None, False)
    merged, merged_lse = merge(o0, lse0, o1, lse1)
    assert rel_l2(merged, o.double()) < REL_BOUND[torch.bfloat16]
    dq_acc = torch.zeros_like(q2, dtype=torch.float32)
    dks, dvs = [], []
    for half, causal in ((slice(0, s), False), (slice(s, 2 * s), True)):
        dq_h, dk_h, dv_h = torch.empty_like(q2), torch.empty_like(k[:, half]), torch.empty_like(v[:, half])
        softmax_d = fai._flash_attn_backward(
            dout, q2, k[:, half].contiguous(), v[:, half].contiguous(), merged, merged_lse.transpose(1, 2).contiguous().transpose(1, 2), dq_h, dk_h, dv_h, 0.0, scale, causal, -1, -1, 0.0, None, False
        )
        assert softmax_d.shape == (b, h, 256)
        dq_acc += dq_h.float()
        dks.append(dk_h)
        dvs.append(dv_h)
    bound = 2 * REL_BOUND[torch.bfloat16]
    assert rel_l2(dq_acc, dq.double()) < bound
    assert rel_l2(torch.cat(dks, 1), dk.double()) < bound
    assert rel_l2(torch.cat(dvs, 1), dv.double()) < bound
    # softmax_d is rowsum(dO * O) of the merged output
    want = (dout.double() * merged.double()).sum(-1).transpose(1, 2)
    assert rel_l2(softmax_d[:, :, :s], want) < 1e-5


def test_backward_matches_the_float64_gradient():
    b, s, hq, hkv, d = 2, 197, 8, 4, 128
    scale = d**-0.5
    q, k, v = randn(b, s, hq, d, seed=8), randn(b, s, hkv, d, seed=9), randn(b, s, hkv, d, seed=10)
    dout = randn(b, s, hq, d, seed=11)
    o, lse, _, _ = fai._flash_attn_forward(q, k, v, 0.0, scale, True, -1, -1, 0.0, None, False)
    dq, dk, dv = (torch.full_like(t, float("nan")) for t in (q, k, v))  # every element must be written
    softmax_d = fai._flash_attn_backward(dout, q, k, v, o, lse, dq, dk, dv, 0.0, scale, True, -1, -1, 0.0, None, False)
    qd, kd, vd = (t.double().requires_grad_() for t in (q, k, v))
    ref = reference_autograd(qd, kd, vd, scale, True)
    grads = torch.autograd.grad(ref, (qd, kd, vd), dout.double())
    for got, want in zip((dq, dk, dv), grads):
        assert rel_l2(got, want) < REL_BOUND[torch.bfloat16]
    assert softmax_d.shape == (b, hq, 256)
    assert softmax_d[:, :, s:].abs().max().item() == 0.0


def test_dropout_rng_state_carries_the_mask_to_the_backward():
    # The forward's rng_state (an int64 pair on the device) makes the backward regenerate its
    # mask: the low-level backward equals the autograd path's, which took the same pair.
    b, s, h, d, p = 1, 150, 4, 64, 0.25
    scale = d**-0.5
    q, k, v = (randn(b, s, h, d, seed=20 + i) for i in range(3))
    dout = randn(b, s, h, d, seed=23)
    o, lse, probs, rng_state = fai._flash_attn_forward(q, k, v, p, scale, True, -1, -1, 0.0, None, True)
    assert rng_state.dtype == torch.int64 and rng_state.shape == (2,) and rng_state.device == q.device
    grads = [torch.empty_like(t) for t in (q, k, v)]
    fai._flash_attn_backward(dout, q, k, v, o, lse, *grads, p, scale, True, -1, -1, 0.0, None, False, rng_state)
    keep = probs[:, :, :s, :s] >= 0
    causal = torch.ones(s, s, dtype=torch.bool, device=q.device).tril()
    dropped = (~keep & causal).sum().item() / (causal.sum().item() * b * h)
    assert abs(dropped - p) < 0.02, dropped
    qd, kd, vd = (t.double().requires_grad_() for t in (q, k, v))
    sc = torch.einsum("bqhd,bkhd->bhqk", qd, kd) * scale
    prob = torch.softmax(sc.masked_fill(~causal, float("-inf")), -1) * keep / (1 - p)
    ref = torch.einsum("bhqk,bkhd->bqhd", prob, vd)
    assert rel_l2(o, ref) < 2e-2
    want = torch.autograd.grad(ref, (qd, kd, vd), dout.double())
    for got, ref_grad in zip(grads, want):
        assert rel_l2(got, ref_grad) < 3e-2
    for bad in (None, rng_state.cpu(), rng_state[:1], rng_state.int()):
        with pytest.raises(ValueError, match="rng_state"):
            fai._flash_attn_backward(dout, q, k, v, o, lse, *grads, p, scale, True, -1, -1, 0.0, None, False, bad)


def test_varlen_forward_and_backward_match_each_sequence_alone():
    lens = [5, 130, 64]
    h, d = 4, 64
    scale = d**-0.5
    cu = torch.tensor([0, 5, 135, 199], dtype=torch.int32, device="cuda")
    total = sum(lens)
    q, k, v, dout = (randn(total, h, d, seed=12 + i) for i in range(4))
    out, lse, _, _ = fai._flash_attn_varlen_forward(q, k, v, cu, cu, max(lens), max(lens), 0.0, scale, True)
    assert lse.shape == (h, total)
    dq, dk, dv = (torch.full_like(t, float("nan")) for t in (q, k, v))
    softmax_d = fai._flash_attn_varlen_backward(dout, q, k, v, out, lse, dq, dk, dv, cu, cu, max(lens), max(lens), 0.0, scale, True, -1, -1, 0.0, None, False)
    assert softmax_d.shape == (h, total + 128 * len(lens))
    start = 0
    for i, n in enumerate(lens):
        rows = slice(start, start + n)
        qd, kd, vd = (t[rows].unsqueeze(0).double().requires_grad_() for t in (q, k, v))
        ref = reference_autograd(qd, kd, vd, scale, True)
        grads = torch.autograd.grad(ref, (qd, kd, vd), dout[rows].unsqueeze(0).double())
        assert rel_l2(out[rows].unsqueeze(0), ref.detach()) < REL_BOUND[torch.bfloat16]
        for got, want in zip((dq, dk, dv), grads):
            assert rel_l2(got[rows].unsqueeze(0), want) < REL_BOUND[torch.bfloat16]
        want_d = (dout[rows].double() * out[rows].double()).sum(-1).transpose(0, 1)
        assert rel_l2(softmax_d[:, start + 128 * i : start + 128 * i + n], want_d) < 1e-5
        start += n


def test_varlen_forward_takes_main_branch_num_splits():
    # flash-attn's main branch passes num_splits (and zero_tensors) to the packed forward: a
    # decode batch (one query a sequence) split 1 and 3 ways gives the unsplit answer.
    lens_k = [700, 65, 1000]
    h, d = 8, 128
    cu_q = torch.arange(4, dtype=torch.int32, device="cuda")
    cu_k = torch.tensor([0, 700, 765, 1765], dtype=torch.int32, device="cuda")
    q, k, v = randn(3, h, d, seed=3), randn(sum(lens_k), 2, d, seed=4), randn(sum(lens_k), 2, d, seed=5)
    call = lambda splits: fai._flash_attn_varlen_forward(q, k, v, cu_q, cu_k, 1, max(lens_k), 0.0, d**-0.5, True, zero_tensors=True, num_splits=splits)
    want, want_lse = call(0)[:2]
    for splits in (1, 3):
        out, lse = call(splits)[:2]
        assert rel_l2(out, want) < 1e-2 and torch.allclose(lse, want_lse, atol=1e-3), splits
    with pytest.raises(TypeError, match="`num_splits`"):
        call(1.5)


@pytest.mark.parametrize(
    "call, name",
    [
        (lambda q: fai._flash_attn_varlen_forward(q[0], q[0], q[0], *_cu(), 8, 8, 0.0, 1.0, False, leftpad_k=torch.zeros(1, dtype=torch.int32, device="cuda")), "leftpad_k"),
    ],
)
def test_what_flashcore_lacks_is_refused_by_name(call, name):
    q = randn(1, 8, 4, 64)
    with pytest.raises(NotImplementedError, match=name):
        call(q)


def test_low_level_functions_take_alibi_slopes():
    """`alibi_slopes` through the four functions: the forwards are the public functions'
    (bitwise), the backwards write their gradients (deterministic: bitwise)."""
    b, s, hq, hkv, d = 2, 150, 4, 2, 64
    scale = d**-0.5
    q, k, v, dout = randn(b, s, hq, d, seed=30), randn(b, s, hkv, d, seed=31), randn(b, s, hkv, d, seed=32), randn(b, s, hq, d, seed=33)
    alibi = torch.rand(b, hq, device="cuda") * 0.3
    o, lse, _, _ = fai._flash_attn_forward(q, k, v, 0.0, scale, True, -1, -1, 0.0, alibi, False)
    leaves = [t.clone().requires_grad_() for t in (q, k, v)]
    o_ref, lse_ref, _ = flashcore.flash_attn_func(*leaves, causal=True, alibi_slopes=alibi, deterministic=True, return_attn_probs=True)
    assert torch.equal(o, o_ref) and torch.equal(lse, lse_ref)
    o_ref.backward(dout)
    dq, dk, dv = (torch.full_like(t, float("nan")) for t in (q, k, v))  # every element must be written
    fai._flash_attn_backward(dout, q, k, v, o, lse, dq, dk, dv, 0.0, scale, True, -1, -1, 0.0, alibi, True)
    assert all(torch.equal(a, t.grad) for a, t in zip((dq, dk, dv), leaves))
    # Packed: the two sequences of the batch, one row of slopes each.
    cu = torch.tensor([0, s, 2 * s], dtype=torch.int32, device="cuda")
    flat = [t.reshape(b * s, *t.shape[2:]) for t in (q, k, v, dout)]
    o, lse, _, _ = fai._flash_attn_varlen_forward(*flat[:3], cu, cu, s, s, 0.0, scale, True, alibi_slopes=alibi)
    leaves = [t.clone().requires_grad_() for t in flat[:3]]
    o_ref, lse_ref, _ = flashcore.flash_attn_varlen_func(*leaves, cu, cu, s, s, causal=True, alibi_slopes=alibi, deterministic=True, return_attn_probs=True)
    assert torch.equal(o, o_ref) and torch.equal(lse, lse_ref)
    o_ref.backward(flat[3])
    dq, dk, dv = (torch.full_like(t, float("nan")) for t in flat[:3])
    fai._flash_attn_varlen_backward(flat[3], *flat[:3], o, lse, dq, dk, dv, cu, cu, s, s, 0.0, scale, True, -1, -1, 0.0, alibi, True)
    assert all(torch.equal(a, t.grad) for a, t in zip((dq, dk, dv), leaves))


def _cu():
    cu = torch.tensor([0, 8], dtype=torch.int32, device="cuda")
    return cu, cu


def test_gradient_buffers_of_the_wrong_shape_are_refused_by_name():
    q = randn(1, 64, 4, 64)
    o, lse, _, _ = fai._flash_attn_forward(q, q, q, 0.0, 0.125, False, -1, -1, 0.0, None, False)
    with pytest.raises(ValueError, match="`dk`"):
        fai._flash_attn_backward(q, q, q, q, o, lse, None, torch.empty(1, 32, 4, 64, device="cuda", dtype=q.dtype), None, 0.0, 0.125, False, -1, -1, 0.0, None, False)
    with pytest.raises(ValueError, match="softmax_lse"):
        fai._flash_attn_backward(q, q, q, q, o, lse[:, :2], None, None, None, 0.0, 0.125, False, -1, -1, 0.0, None, False)


def test_eager_autograd_path_equals_the_registered_op():
    """flash_attn_func with grad runs the eager path (the native C++ node, else
    `_ops.Attention`; no torch.library dispatch); its gradients are bitwise the op's in
    deterministic mode."""
    q, k, v = (randn(2, 100, 4, 64, seed=20 + i).requires_grad_() for i in range(3))
    dout = randn(2, 100, 4, 64, seed=23)
    o = flashcore.flash_attn_func(q, k, v, causal=True, deterministic=True)
    assert type(o.grad_fn).__name__ == eager_autograd_node()
    eager = torch.autograd.grad(o, (q, k, v), dout)
    o_op, _ = torch.ops.flashcore.fwd(q, k, v, *_ops.Options(0.125, True, deterministic=True).flat())
    assert type(o_op.grad_fn).__name__ not in ("AttentionBackward", "CppFunction")
    through_op = torch.autograd.grad(o_op, (q, k, v), dout)
    assert torch.equal(o, o_op)
    for a, b in zip(eager, through_op):
        assert torch.equal(a, b)
