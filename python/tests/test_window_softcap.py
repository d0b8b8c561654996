"""Sliding windows and logit softcapping through flash_attn_func against the float64 reference
(helpers.reference: the bottom-right aligned window of `helpers.visible`, scores s becoming
softcap·tanh(s / softcap)); the backward's refusal of both; compiled and eager agree."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch", reason="needs PyTorch")
import flashcore  # noqa: E402
from helpers import REL_BOUND, check_against_reference, qkv, randn, reference, reference_autograd, rel_l2  # noqa: E402

# flash_attn's window_size: one key each side of nothing, the diagonal and one before it, a
# local causal span, a band both ways, and a right side only (which causal turns into plain
# causal).
WINDOWS = [(0, 0), (1, 0), (127, 0), (256, 256), (-1, 64)]

# (B, Sq, Sk, Hq, Hkv, D): square with odd lengths, GQA and MQA, Sq < Sk (rows whose window
# reaches back past key 0 and rows that see the last keys), Sq > Sk (rows that see no key),
# decode (split-KV on one query row).
SHAPES = [
    (2, 113, 113, 8, 8, 64),
    (1, 1000, 1000, 8, 2, 128),
    (1, 113, 1000, 4, 1, 128),
    (1, 1000, 113, 4, 4, 64),
    (3, 1, 1000, 8, 2, 128),
]


def run(q, k, v, **kw):
    out, lse, _ = flashcore.flash_attn_func(q, k, v, return_attn_probs=True, **kw)
    return out, lse


@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("window", WINDOWS, ids=lambda w: f"w{w[0]}_{w[1]}")
@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "x".join(map(str, s)))
def test_window_matches_float64(shape, window, causal):
    q, k, v = qkv(*shape, torch.bfloat16)
    out, lse = run(q, k, v, causal=causal, window_size=window)
    check_against_reference(q, k, v, out, lse, shape[-1] ** -0.5, causal, window=window)


@pytest.mark.parametrize("window", [(0, 0), (127, 0), (256, 256)], ids=lambda w: f"w{w[0]}_{w[1]}")
def test_window_in_float16(window):
    q, k, v = qkv(1, 1000, 1000, 8, 2, 128, torch.float16)
    out, lse = run(q, k, v, causal=True, window_size=window)
    check_against_reference(q, k, v, out, lse, 128**-0.5, True, window=window)


def test_window_that_covers_everything_is_no_window():
    # A window wider than the keys masks nothing (the kernel still runs its window variant).
    q, k, v = qkv(1, 300, 300, 4, 4, 64, torch.bfloat16)
    wide = flashcore.flash_attn_func(q, k, v, window_size=(5000, 5000))
    ref, _ = reference(q, k, v, 0.125, False)
    assert rel_l2(wide, ref) <= REL_BOUND[torch.bfloat16]


def logit_spread(q, k, scale):
    qd, kd = q.double().transpose(1, 2), k.double().transpose(1, 2)
    group = qd.shape[1] // kd.shape[1]
    return (qd @ kd.repeat_interleave(group, dim=1).transpose(-1, -2) * scale).abs().max().item()


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=["bf16", "f16"])
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("softcap", [30.0, 50.0])
@pytest.mark.parametrize("shape", [(1, 1000, 1000, 8, 2, 128), (2, 113, 300, 4, 4, 64), (1, 300, 113, 2, 1, 256)], ids=lambda s: "x".join(map(str, s)))
def test_softcap_with_large_logits_matches_float64(shape, softcap, causal, dtype):
    # q and k scaled by 6: logits q·k/sqrt(D) have a spread of 36 and reach about ±150-200.
    q, k, v = qkv(*shape, dtype, scale=6.0)
    scale = shape[-1] ** -0.5
    assert logit_spread(q, k, scale) > 100, "the logits must reach far past the cap"
    out, lse = run(q, k, v, causal=causal, softcap=softcap)
    check_against_reference(q, k, v, out, lse, scale, causal, softcap=softcap)
    # The cap changes the answer far beyond the bound: the check above could not pass a
    # kernel that ignored it.
    uncapped, _ = reference(q, k, v, scale, causal)
    assert rel_l2(out, uncapped) > 10 * REL_BOUND[dtype]


def test_softcap_with_custom_scale():
    q, k, v = qkv(2, 257, 257, 4, 2, 64, torch.bfloat16, scale=4.0)
    out, lse = run(q, k, v, softmax_scale=0.3, causal=True, softcap=20.0)
    check_against_reference(q, k, v, out, lse, 0.3, True, softcap=20.0)


@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("window", [(127, 0), (64, 64), (0, 0)], ids=lambda w: f"w{w[0]}_{w[1]}")
@pytest.mark.parametrize("shape", [(1, 1000, 1000, 8, 2, 128), (1, 113, 1000, 4, 4, 64), (3, 1, 1000, 8, 1, 128)], ids=lambda s: "x".join(map(str, s)))
def test_window_and_softcap_together(shape, window, causal):
    q, k, v = qkv(*shape, torch.bfloat16, scale=6.0)
    out, lse = run(q, k, v, causal=causal, window_size=window, softcap=30.0)
    check_against_reference(q, k, v, out, lse, shape[-1] ** -0.5, causal, window=window, softcap=30.0)


def test_window_of_bhsd_views():
    q, k, v = (randn(2, 8, 333, 128, seed=s).transpose(1, 2) for s in range(3))  # BHSD storage
    assert not q.is_contiguous()
    out, lse = run(q, k, v, causal=True, window_size=(100, 0), softcap=15.0)
    check_against_reference(q, k, v, out, lse, 128**-0.5, True, window=(100, 0), softcap=15.0)


def test_window_and_softcap_are_deterministic():
    q, k, v = qkv(2, 1000, 1000, 8, 2, 128, torch.bfloat16, scale=3.0)
    a = flashcore.flash_attn_func(q, k, v, causal=True, window_size=(127, 0), softcap=30.0)
    b = flashcore.flash_attn_func(q, k, v, causal=True, window_size=(127, 0), softcap=30.0)
    assert torch.equal(a, b)


@pytest.mark.parametrize(
    "kw",
    [dict(window_size=(64, 0), causal=True), dict(window_size=(100, 30)), dict(softcap=30.0, causal=True), dict(window_size=(-1, 50), softcap=20.0)],
    ids=["window-causal", "window-both-sides", "softcap", "window-softcap"],
)
@pytest.mark.parametrize("deterministic", [False, True])
def test_gradients_through_window_and_softcap(kw, deterministic):
    # Sq != Sk and GQA; logits large enough (scale 3) that the softcap bends them.
    q, k, v = qkv(1, 200, 300, 4, 2, 64, torch.bfloat16, scale=3.0)
    dout = randn(1, 200, 4, 64, seed=7)
    leaves = [t.clone().requires_grad_() for t in (q, k, v)]
    flashcore.flash_attn_func(*leaves, deterministic=deterministic, **kw).backward(dout)
    refs = [t.double().requires_grad_() for t in (q, k, v)]
    window, softcap = kw.get("window_size", (-1, -1)), kw.get("softcap", 0.0)
    reference_autograd(*refs, 0.125, kw.get("causal", False), window=window, softcap=softcap).backward(dout.double())
    for name, ours, ref in zip(("dq", "dk", "dv"), leaves, refs):
        err = rel_l2(ours.grad, ref.grad, floor=1e-3 * ref.grad.numel() ** 0.5)
        assert err <= 2 * REL_BOUND[torch.bfloat16], f"{name}: {err:.3g}"
    if deterministic:
        again = [t.clone().requires_grad_() for t in (q, k, v)]
        flashcore.flash_attn_func(*again, deterministic=True, **kw).backward(dout)
        assert all(torch.equal(a.grad, b.grad) for a, b in zip(leaves, again)), "deterministic gradients are bitwise repeatable"


def test_causal_as_a_window_keeps_its_backward():
    # window (-1, 0) is the causal mask itself (flash_attn's reading): the backward runs it.
    q, k, v = qkv(1, 100, 150, 4, 2, 64, torch.bfloat16)
    dout = randn(1, 100, 4, 64, seed=5)
    leaves = [t.clone().requires_grad_() for t in (q, k, v)]
    flashcore.flash_attn_func(*leaves, window_size=(-1, 0)).backward(dout)
    refs = [t.double().requires_grad_() for t in (q, k, v)]
    reference_autograd(*refs, 0.125, True).backward(dout.double())
    for name, ours, ref in zip(("dq", "dk", "dv"), leaves, refs):
        err = rel_l2(ours.grad, ref.grad)
        assert err <= REL_BOUND[torch.bfloat16], f"{name}: {err:.3g}"


def test_compiled_window_and_softcap_match_eager():
    def f(q, k, v):
        return flashcore.flash_attn_func(q, k, v, causal=True, window_size=(63, 0), softcap=25.0) * 2

    q, k, v = qkv(2, 300, 300, 8, 2, 64, torch.bfloat16, scale=4.0)
    torch._dynamo.reset()
    compiled = torch.compile(f, fullgraph=True)
    assert torch.equal(compiled(q, k, v), f(q, k, v))
    explanation = torch._dynamo.explain(f)(q, k, v)
    assert explanation.graph_break_count == 0 and explanation.graph_count == 1


def test_compiled_backward_through_a_window_matches_eager():
    def f(q, k, v):
        return flashcore.flash_attn_func(q, k, v, causal=True, window_size=(31, 0), softcap=10.0)

    q, k, v = qkv(1, 128, 128, 4, 4, 64, torch.bfloat16, scale=2.0)
    dout = randn(1, 128, 4, 64, seed=3)
    torch._dynamo.reset()
    compiled = [t.clone().requires_grad_() for t in (q, k, v)]
    torch.compile(f, fullgraph=True)(*compiled).backward(dout)
    eager = [t.clone().requires_grad_() for t in (q, k, v)]
    f(*eager).backward(dout)
    assert all(torch.equal(a.grad, b.grad) for a, b in zip(compiled, eager))


def test_plan_names_the_window_variant():
    q, k, _ = qkv(1, 4096, 4096, 16, 16, 128, torch.bfloat16)
    plain = flashcore.kernel_plan(q, k, causal=True)
    local = flashcore.kernel_plan(q, k, causal=True, window_size=(255, 0), softcap=30.0)
    print(plain, "|", local)
    assert local != plain and "fwd_sm" in local


def test_rows_outside_every_window_are_zero():
    # Sq > Sk, window (0, 0): query i sees only key i + Sk - Sq, so the first Sq - Sk rows see
    # nothing (o = 0, lse = -inf).
    q, k, v = qkv(2, 50, 20, 4, 2, 64, torch.float16)
    out, lse = run(q, k, v, window_size=(0, 0))
    assert (out[:, :30] == 0).all() and torch.isneginf(lse[:, :, :30]).all()
    assert torch.isfinite(lse[:, :, 30:]).all()
    check_against_reference(q, k, v, out, lse, 0.125, False, window=(0, 0))
