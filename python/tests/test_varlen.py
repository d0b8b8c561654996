"""flash_attn_varlen_func: packed batches against the float64 reference run per sequence,
seqused_k, windows and softcap per sequence, torch.compile, and bad input (named errors); its
gradients against float64 autograd of each sequence's attention, every element written (zero
for sequences without queries or keys and for keys past seqused_k), deterministic mode bitwise
(and dk, dv bitwise those of each sequence alone), a compiled training step."""

from __future__ import annotations

import pytest
import torch

import flashcore
from helpers import REL_BOUND, check_against_reference, randn, reference_autograd, rel_l2

# Lengths 0, 1, 7, 113, 1000 and 4097 in one batch, Sq != Sk, a sequence without keys.
LENGTHS = [(0, 5), (1, 1), (7, 300), (113, 113), (1000, 1200), (3, 0), (250, 90), (4097, 4097)]


def packed(lens, hq, hkv, d, dtype, slack=None, seed=0):
    """Per-sequence q, k, v ([1, S, H, D]) and the packed tensors with their cu_seqlens; with
    `slack`, each sequence's keys are followed by that many unused rows (seqused_k)."""
    slack = slack or [0] * len(lens)
    seqs = []
    for i, ((sq, sk), extra) in enumerate(zip(lens, slack)):
        seqs.append(
            (
                randn(1, sq, hq, d, dtype=dtype, seed=seed + 3 * i),
                randn(1, sk + extra, hkv, d, dtype=dtype, seed=seed + 3 * i + 1),
                randn(1, sk + extra, hkv, d, dtype=dtype, seed=seed + 3 * i + 2),
            )
        )
    cat = lambda j: torch.cat([s[j][0] for s in seqs])  # noqa: E731
    cu = lambda n: torch.tensor([0] + [sum(n[: i + 1]) for i in range(len(n))], dtype=torch.int32, device="cuda")  # noqa: E731
    cu_q = cu([sq for sq, _ in lens])
    cu_k = cu([sk + e for (_, sk), e in zip(lens, slack)])
    return seqs, cat(0), cat(1), cat(2), cu_q, cu_k


def check_sequences(seqs, lens, out, lse, cu_q, causal, window=(-1, -1), softcap=0.0):
    for (q, k, v), (sq, sk), start in zip(seqs, lens, cu_q.tolist()):
        if sq == 0:
            continue
        o = out[start : start + sq][None]
        l = lse[:, start : start + sq][None]  # noqa: E741
        scale = q.shape[-1] ** -0.5
        check_against_reference(q, k[:, :sk], v[:, :sk], o, l, scale, causal, window=window, softcap=softcap)


@pytest.mark.parametrize("d", [64, 128])
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_packed_batch_matches_each_sequence(d, causal, dtype):
    seqs, q, k, v, cu_q, cu_k = packed(LENGTHS, 8, 2, d, dtype)
    max_q, max_k = max(sq for sq, _ in LENGTHS), max(sk for _, sk in LENGTHS)
    out, lse, _ = flashcore.flash_attn_varlen_func(q, k, v, cu_q, cu_k, max_q, max_k, causal=causal, return_attn_probs=True)
    assert out.shape == q.shape and lse.shape == (8, q.shape[0]) and lse.dtype == torch.float32
    check_sequences(seqs, LENGTHS, out, lse, cu_q, causal)


@pytest.mark.parametrize("window,softcap", [((127, 0), 0.0), ((-1, 64), 0.0), ((0, 0), 30.0), ((-1, -1), 50.0)])
def test_window_and_softcap_per_sequence(window, softcap):
    lens = [(600, 600), (1, 200), (300, 700), (129, 64)]
    seqs, q, k, v, cu_q, cu_k = packed(lens, 4, 2, 128, torch.bfloat16, seed=5)
    if softcap:  # logits past the cap
        q = q * 4
        seqs = [(s[0] * 4, s[1], s[2]) for s in seqs]
    out, lse, _ = flashcore.flash_attn_varlen_func(q, k, v, cu_q, cu_k, 600, 700, window_size=window, softcap=softcap, return_attn_probs=True)
    check_sequences(seqs, lens, out, lse, cu_q, False, window=window, softcap=softcap)


def test_decode_with_seqused_k():
    lens = [(1, 1), (1, 17), (1, 1000), (1, 4097), (1, 0), (1, 300)]
    slack = [0, 3, 40, 1, 9, 0]
    seqs, q, k, v, cu_q, cu_k = packed(lens, 32, 8, 128, torch.bfloat16, slack=slack, seed=9)
    used = torch.tensor([sk for _, sk in lens], dtype=torch.int32, device="cuda")
    out, lse, _ = flashcore.flash_attn_varlen_func(q, k, v, cu_q, cu_k, 1, 4097, seqused_k=used, return_attn_probs=True)
    check_sequences(seqs, lens, out, lse, cu_q, False)


def test_compiles():
    seqs, q, k, v, cu_q, cu_k = packed([(100, 100), (37, 80)], 4, 4, 64, torch.bfloat16)
    f = torch.compile(lambda q, k, v: flashcore.flash_attn_varlen_func(q, k, v, cu_q, cu_k, 100, 100, causal=True), fullgraph=True)
    torch.testing.assert_close(f(q, k, v), flashcore.flash_attn_varlen_func(q, k, v, cu_q, cu_k, 100, 100, causal=True), rtol=0, atol=0)


def packed_grads(q, k, v, cu_q, cu_k, max_q, max_k, dout, **kw):
    """(dq, dk, dv) of flash_attn_varlen_func's output against `dout`."""
    leaves = [t.detach().clone().requires_grad_() for t in (q, k, v)]
    flashcore.flash_attn_varlen_func(*leaves, cu_q, cu_k, max_q, max_k, **kw).backward(dout)
    return [t.grad for t in leaves]


def reference_grads(seqs, lens, cu_q, cu_k, dout, causal=False, window=(-1, -1), softcap=0.0):
    """float64 autograd of each sequence alone, packed like q, k, v (zero for a sequence
    without queries or keys, and for keys past a sequence's first `sk`)."""
    total_k = cu_k[-1].item()
    hq, d = seqs[0][0].shape[2], seqs[0][0].shape[3]
    hkv = seqs[0][1].shape[2]
    ref = [torch.zeros(dout.shape, dtype=torch.float64, device="cuda")] + [torch.zeros(total_k, hkv, d, dtype=torch.float64, device="cuda") for _ in range(2)]
    for (q, k, v), (sq, sk), q0, k0 in zip(seqs, lens, cu_q.tolist(), cu_k.tolist()):
        if sq == 0 or sk == 0:
            continue
        leaves = [t[:, :n].double().requires_grad_() for t, n in ((q, sq), (k, sk), (v, sk))]
        reference_autograd(*leaves, d**-0.5, causal, window=window, softcap=softcap).backward(dout[q0 : q0 + sq][None].double())
        ref[0][q0 : q0 + sq] = leaves[0].grad[0]
        ref[1][k0 : k0 + sk] = leaves[1].grad[0]
        ref[2][k0 : k0 + sk] = leaves[2].grad[0]
    return ref


def check_grads(ours, ref, dtype, bound=1.0):
    floor = 1e-3 * ref[0].numel() ** 0.5  # a row with one visible key has dq exactly 0
    for name, g, r in zip(("dq", "dk", "dv"), ours, ref):
        assert g.dtype == dtype and g.shape == r.shape
        err = rel_l2(g, r, floor)
        assert err <= bound * REL_BOUND[dtype], f"{name}: rel L2 error {err:.3g} over {bound * REL_BOUND[dtype]:g}"
    # Keys no query sees (a sequence without queries, outside every window, past seqused_k)
    # have dv = Pᵀ·dO exactly 0 in the reference: their dk and dv must be written, as 0.
    unseen = (ref[2] == 0).all(-1)  # [total_k, Hkv]
    assert unseen.any(), "the batch holds keys no query sees"
    for name, g in (("dk", ours[1]), ("dv", ours[2])):
        assert (g[unseen] == 0).all(), f"{name}: unwritten or nonzero for a key no query sees"


@pytest.mark.parametrize("d", [64, 128])
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_gradients_match_float64_per_sequence(d, causal, dtype):
    lens = LENGTHS
    seqs, q, k, v, cu_q, cu_k = packed(lens, 4, 2, d, dtype, seed=11)
    max_q, max_k = max(sq for sq, _ in lens), max(sk for _, sk in lens)
    dout = randn(*q.shape, dtype=dtype, seed=99)
    ours = packed_grads(q, k, v, cu_q, cu_k, max_q, max_k, dout, causal=causal)
    check_grads(ours, reference_grads(seqs, lens, cu_q, cu_k, dout, causal), dtype)


@pytest.mark.parametrize("window,softcap", [((127, 0), 0.0), ((-1, 64), 0.0), ((64, 64), 30.0), ((-1, -1), 50.0)])
@pytest.mark.parametrize("causal", [False, True])
def test_gradients_with_window_and_softcap(window, softcap, causal):
    lens = [(600, 600), (1, 200), (300, 700), (129, 64), (0, 33)]
    seqs, q, k, v, cu_q, cu_k = packed(lens, 4, 2, 128, torch.bfloat16, seed=5)
    if softcap:  # logits past the cap
        q = q * 3
        seqs = [(s[0] * 3, s[1], s[2]) for s in seqs]
    dout = randn(*q.shape, seed=17)
    kw = dict(causal=causal, window_size=window, softcap=softcap)
    ours = packed_grads(q, k, v, cu_q, cu_k, 600, 700, dout, **kw)
    check_grads(ours, reference_grads(seqs, lens, cu_q, cu_k, dout, causal, window, softcap), torch.bfloat16, bound=2.0 if softcap else 1.0)


def test_gradients_with_seqused_k_zero_the_unused_keys():
    lens = [(7, 300), (113, 113), (0, 20), (50, 0), (200, 150)]
    slack = [5, 0, 4, 9, 1]
    seqs, q, k, v, cu_q, cu_k = packed(lens, 8, 2, 64, torch.bfloat16, slack=slack, seed=21)
    used = torch.tensor([sk for _, sk in lens], dtype=torch.int32, device="cuda")
    dout = randn(*q.shape, seed=23)
    ours = packed_grads(q, k, v, cu_q, cu_k, 200, 300, dout, causal=True, seqused_k=used)
    ref = reference_grads(seqs, lens, cu_q, cu_k, dout, True)
    check_grads(ours, ref, torch.bfloat16)
    for (_, sk), extra, k0 in zip(lens, slack, cu_k.tolist()):
        for g in ours[1:]:
            assert (g[k0 + sk : k0 + sk + extra] == 0).all(), "keys past seqused_k get zero gradients"


def test_deterministic_gradients_are_bitwise_and_dk_dv_match_each_sequence_alone():
    lens = [(113, 300), (1000, 1000), (1, 1), (250, 90), (0, 5)]
    seqs, q, k, v, cu_q, cu_k = packed(lens, 8, 2, 128, torch.bfloat16, seed=31)
    dout = randn(*q.shape, seed=37)
    kw = dict(causal=True, deterministic=True)
    first = packed_grads(q, k, v, cu_q, cu_k, 1000, 1000, dout, **kw)
    second = packed_grads(q, k, v, cu_q, cu_k, 1000, 1000, dout, **kw)
    assert all(torch.equal(a, b) for a, b in zip(first, second)), "deterministic gradients are bitwise repeatable"
    # dk and dv of a sequence sum in one fixed order whatever else the batch holds (dq's
    # deterministic slices depend on the number of sequences: not compared).
    for (sq, sk), q0, k0 in zip(lens, cu_q.tolist(), cu_k.tolist()):
        if sq == 0:
            continue
        one = lambda n: torch.tensor([0, n], dtype=torch.int32, device="cuda")  # noqa: E731
        alone = packed_grads(q[q0 : q0 + sq], k[k0 : k0 + sk], v[k0 : k0 + sk], one(sq), one(sk), 1000, 1000, dout[q0 : q0 + sq], **kw)
        assert torch.equal(alone[1], first[1][k0 : k0 + sk]) and torch.equal(alone[2], first[2][k0 : k0 + sk]), f"sequence at {q0}"


def test_compiled_training_step_matches_eager():
    lens = [(100, 100), (37, 80), (0, 9), (255, 255)]
    seqs, q, k, v, cu_q, cu_k = packed(lens, 4, 2, 64, torch.bfloat16, seed=41)
    dout = randn(*q.shape, seed=43)

    def step(q, k, v):
        out = flashcore.flash_attn_varlen_func(q, k, v, cu_q, cu_k, 255, 255, causal=True, deterministic=True)
        return (out.float() * dout.float()).sum()

    torch._dynamo.reset()
    compiled = [t.detach().clone().requires_grad_() for t in (q, k, v)]
    torch.compile(step, fullgraph=True)(*compiled).backward()
    eager = [t.detach().clone().requires_grad_() for t in (q, k, v)]
    step(*eager).backward()
    assert all(torch.equal(a.grad, b.grad) for a, b in zip(compiled, eager)), "compiled and eager gradients are bitwise equal"
    check_grads([t.grad for t in eager], reference_grads(seqs, lens, cu_q, cu_k, dout, True), torch.bfloat16)


def test_bad_input_names_the_argument(monkeypatch):
    _, q, k, v, cu_q, cu_k = packed([(10, 10), (5, 7)], 4, 2, 64, torch.bfloat16)
    f = flashcore.flash_attn_varlen_func
    with pytest.raises(TypeError, match="cu_seqlens_q.*int32"):
        f(q, k, v, cu_q.long(), cu_k, 10, 10)
    with pytest.raises(ValueError, match="cu_seqlens_k.*device"):
        f(q, k, v, cu_q, cu_k.cpu(), 10, 10)
    with pytest.raises(ValueError, match="cu_seqlens_k"):
        f(q, k, v, cu_q, cu_k[:2], 10, 10)
    with pytest.raises(ValueError, match="`q` must have 3 dims"):
        f(q[None], k, v, cu_q, cu_k, 10, 10)
    with pytest.raises(ValueError, match="max_seqlen_q"):
        f(q, k, v, cu_q, cu_k, -1, 10)
    # The device values, checked on request (FLASHCORE_CHECK_VARLEN=1).
    monkeypatch.setenv("FLASHCORE_CHECK_VARLEN", "1")
    with pytest.raises(ValueError, match="max_seqlen_q"):
        f(q, k, v, cu_q, cu_k, 9, 10)
    with pytest.raises(ValueError, match="cu_seqlens_q.*decreases"):
        f(q, k, v, torch.tensor([0, 12, 10, 15][:3], dtype=torch.int32, device="cuda"), cu_k, 12, 10)
    with pytest.raises(ValueError, match="cu_seqlens_k.*ends at"):
        f(q, k, v, cu_q, torch.tensor([0, 10, 16], dtype=torch.int32, device="cuda"), 10, 10)
