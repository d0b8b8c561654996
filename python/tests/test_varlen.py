"""flash_attn_varlen_func: packed batches against the float64 reference run per sequence,
seqused_k, windows and softcap per sequence, torch.compile, the backward's refusal, and bad
input (named errors)."""

from __future__ import annotations

import pytest
import torch

import flashcore
from helpers import check_against_reference, randn

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


def test_compiles_and_refuses_the_backward():
    seqs, q, k, v, cu_q, cu_k = packed([(100, 100), (37, 80)], 4, 4, 64, torch.bfloat16)
    f = torch.compile(lambda q, k, v: flashcore.flash_attn_varlen_func(q, k, v, cu_q, cu_k, 100, 100, causal=True), fullgraph=True)
    torch.testing.assert_close(f(q, k, v), flashcore.flash_attn_varlen_func(q, k, v, cu_q, cu_k, 100, 100, causal=True), rtol=0, atol=0)
    q.requires_grad_(True)
    out = flashcore.flash_attn_varlen_func(q, k, v, cu_q, cu_k, 100, 100)
    with pytest.raises(NotImplementedError, match="varlen"):
        out.sum().backward()


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
