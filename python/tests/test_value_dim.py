"""V's own head dim (DeepSeek-V3's prefill: Q and K 192, V 128; FlashAttention-3's Q and K 64,
V 256) through the Python functions, against the float64 reference: the output `[B, Sq, Hq,
Dv]`, its lse, and the gradients of q, k and v (bwd_sm90's form of (192, 128); with dropout,
or where no kernel has one, as for (64, 256), the backward runs with the narrower dim's tensors
zero-padded to the wider, exact), on every path a call takes (the
extension directly, the Python autograd node, the registered op under torch.compile), causal
or not, odd lengths both ways, GQA, a window, softcap, learnable sinks, packed batches; the
calls the kernels cannot run (KV caches, other pairs) refused by name."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch", reason="needs PyTorch")
import flashcore  # noqa: E402
from helpers import REL_BOUND, randn, reference, reference_autograd, rel_l2  # noqa: E402

BF16 = torch.bfloat16
D, DV = 192, 128
# The pairs with forward forms: DeepSeek-V3's (bwd_sm90's form too) and FlashAttention-3's
# (its backward padded: q and k to 256).
PAIRS = [(D, DV), (64, 256)]


def inputs(b, sq, sk, hq, hkv, seed=0, d=D, dv=DV):
    """q [B, Sq, Hq, d], k [B, Sk, Hkv, d], v [B, Sk, Hkv, dv] in bf16."""
    return randn(b, sq, hq, d, seed=seed), randn(b, sk, hkv, d, seed=seed + 1), randn(b, sk, hkv, dv, seed=seed + 2)


def gradients(fn, q, k, v, dout):
    """fn(q, k, v)'s output and the gradients of q, k, v against `dout`."""
    leaves = [t.detach().clone().requires_grad_() for t in (q, k, v)]
    out = fn(*leaves)
    out.backward(dout)
    return out.detach(), [t.grad for t in leaves]


def reference_gradients(q, k, v, dout, scale, causal, window=(-1, -1), softcap=0.0):
    leaves = [t.detach().double().requires_grad_() for t in (q, k, v)]
    out = reference_autograd(*leaves, scale, causal, window=window, softcap=softcap)
    out.backward(dout.double())
    return out.detach(), [t.grad for t in leaves]


def assert_close(name, got, want):
    assert got.shape == want.shape, f"{name}: {tuple(got.shape)} against {tuple(want.shape)}"
    err = rel_l2(got, want)
    assert err <= REL_BOUND[BF16], f"{name}: {err:.3g}"


# (B, Sq, Sk, Hq, Hkv, causal, window, softcap): odd square lengths; Sq < Sk with GQA; Sq > Sk
# causal (rows that see no key); a window with softcap.
CASES = [
    (2, 257, 257, 4, 4, True, (-1, -1), 0.0),
    (1, 113, 600, 8, 2, False, (-1, -1), 0.0),
    (1, 600, 113, 4, 2, True, (-1, -1), 0.0),
    (1, 1000, 1000, 4, 4, True, (100, 0), 30.0),
]


@pytest.mark.parametrize("d,dv", PAIRS)
@pytest.mark.parametrize("b,sq,sk,hq,hkv,causal,window,softcap", CASES)
def test_forward_and_gradients_match_the_reference(b, sq, sk, hq, hkv, causal, window, softcap, d, dv):
    q, k, v = inputs(b, sq, sk, hq, hkv, seed=sq + sk, d=d, dv=dv)
    dout = randn(b, sq, hq, dv, seed=5)
    kw = dict(causal=causal, window_size=window, softcap=softcap)
    with torch.no_grad():  # the extension directly
        out, lse, _ = flashcore.flash_attn_func(q, k, v, return_attn_probs=True, **kw)
    ref_o, ref_lse = reference(q, k, v, d**-0.5, causal, window=window, softcap=softcap)
    assert out.shape == (b, sq, hq, dv) and out.dtype == BF16
    assert_close("o", out, ref_o)
    seen = torch.isfinite(ref_lse)
    assert torch.equal(torch.isfinite(lse), seen), "rows that see no key, and only they, give lse = -inf"
    assert (lse[seen].double() - ref_lse[seen]).abs().max().item() <= 2e-3 * max(1.0, ref_lse[seen].abs().max().item())
    recorded, grads = gradients(lambda *t: flashcore.flash_attn_func(*t, **kw), q, k, v, dout)  # the autograd node
    want_o, want = reference_gradients(q, k, v, dout, d**-0.5, causal, window, softcap)
    assert torch.equal(recorded, out), "the recording call runs the same kernel"
    for name, got, ref in zip(("dq", "dk", "dv"), grads, want):
        assert torch.isfinite(got).all(), name
        assert_close(name, got, ref)


def test_the_compiled_call_is_the_eager_one():
    q, k, v = inputs(1, 300, 300, 4, 2, seed=3)
    dout = randn(1, 300, 4, DV, seed=4)
    fn = lambda *t: flashcore.flash_attn_func(*t, causal=True)  # noqa: E731
    eager_o, eager_grads = gradients(fn, q, k, v, dout)
    compiled_o, compiled_grads = gradients(torch.compile(fn, fullgraph=True), q, k, v, dout)
    assert compiled_o.shape == (1, 300, 4, DV)
    assert torch.equal(compiled_o, eager_o)
    for name, a, b in zip(("dq", "dk", "dv"), compiled_grads, eager_grads):
        assert torch.equal(a, b), name


def test_learnable_sinks_with_v_s_own_head_dim_get_their_gradient():
    q, k, v = inputs(1, 200, 200, 4, 4, seed=7)
    dout = randn(1, 200, 4, DV, seed=8)
    sink = torch.linspace(-1.0, 3.0, 4, device="cuda")
    leaves = [t.detach().clone().requires_grad_() for t in (q, k, v, sink)]
    out = flashcore.flash_attn_func(*leaves[:3], causal=True, learnable_sink=leaves[3])
    out.backward(dout)
    # The sink as one more logit a row with no value: a key of score `sink` and a zero value.
    ref = [t.detach().double().requires_grad_() for t in (q, k, v, sink)]
    qd, kd, vd, sd = ref
    s = torch.einsum("bqhd,bkhd->bhqk", qd, kd) * D**-0.5
    s = s.masked_fill(~torch.ones(200, 200, dtype=torch.bool, device="cuda").tril(), float("-inf"))
    logits = torch.cat([s, sd[None, :, None, None].expand(1, 4, 200, 1)], dim=-1)
    p = torch.softmax(logits, dim=-1)[..., :-1]
    ref_o = torch.einsum("bhqk,bkhd->bqhd", p, vd)
    ref_o.backward(dout.double())
    assert_close("o", out.detach(), ref_o.detach())
    for name, leaf, r in zip(("dq", "dk", "dv", "dsink"), leaves, ref):
        assert_close(name, leaf.grad, r.grad)


@pytest.mark.parametrize("d,dv", PAIRS)
def test_a_packed_batch_matches_each_sequence_alone(d, dv):
    """Odd lengths packed, causal, GQA: the forward's output and the gradients against each
    sequence's float64 reference. (Not a sequence of one token: its dq and dk are exactly 0
    in the reference, P = 1 and dS = P·(dP − dP), and a relative error against 0 measures
    nothing.)"""
    lens, hq, hkv = [37, 300, 5], 4, 2
    total = sum(lens)
    q, k, v = inputs(1, total, total, hq, hkv, seed=11, d=d, dv=dv)
    dout = randn(1, total, hq, dv, seed=12)
    starts = [0, 37, 337, 342]
    cu = torch.tensor(starts, device="cuda", dtype=torch.int32)
    fn = lambda q, k, v: flashcore.flash_attn_varlen_func(q[0], k[0], v[0], cu, cu, max(lens), max(lens), causal=True)  # noqa: E731
    out, grads = gradients(fn, q, k, v, dout[0])
    assert out.shape == (total, hq, dv)
    for i, (a, z) in enumerate(zip(starts, starts[1:])):
        part = [t[:, a:z] for t in (q, k, v)]
        want_o, want = reference_gradients(*part, dout[:, a:z], d**-0.5, True)
        assert_close(f"o of sequence {i}", out[a:z], want_o[0])
        for name, got, ref in zip(("dq", "dk", "dv"), grads, want):
            assert torch.isfinite(got).all(), name
            assert_close(f"{name} of sequence {i}", got[:, a:z], ref)


def test_what_the_kernels_cannot_run_is_refused_by_name():
    q, k, v = inputs(1, 64, 64, 4, 4)
    k_cache, v_cache = k.clone(), v.clone()
    with pytest.raises(Exception, match="v_cache"):
        flashcore.flash_attn_with_kvcache(q, k_cache, v_cache, causal=True)
    q2, k2, v2 = inputs(1, 64, 64, 4, 4, d=128, dv=64)
    with pytest.raises(Exception, match=r"head dim 128 with V's 64"):
        flashcore.flash_attn_func(q2, k2, v2)


@pytest.mark.parametrize("d,dv", PAIRS)
def test_the_padded_backward_is_exact_in_float64(d, dv):
    """`_ops._at_one_head_dim` (the backward where the kernels have no form of the pair): the
    narrower dim's tensors (V, O and dO; or q and k) zero-padded to the wider, the gradients
    cut back; run here around a float64 autograd backward on the CPU at the call's own scale,
    its gradients are the unpadded backward's to rounding (the zero columns add exact zeros),
    each laid out like its input."""
    from flashcore import _ops

    g = torch.Generator().manual_seed(0)
    q, k = (torch.randn(1, 37, 2, d, generator=g, dtype=torch.float64) for _ in range(2))
    v, dout = torch.randn(1, 37, 2, dv, generator=g, dtype=torch.float64), torch.randn(1, 37, 2, dv, generator=g, dtype=torch.float64)

    def run(saved, grad_out, *_):
        leaves = [t.detach().clone().requires_grad_() for t in saved[:3]]
        reference_autograd(*leaves, d**-0.5, True).backward(grad_out)
        return tuple(t.grad for t in leaves)

    o = reference_autograd(q, k, v, d**-0.5, True).detach()
    padded = _ops._at_one_head_dim(run, (q, k, v, o, None), dout)
    plain = run((q, k, v), dout)
    assert [t.shape for t in padded] == [q.shape, k.shape, v.shape] and all(t.is_contiguous() for t in padded)
    for name, a, b in zip(("dq", "dk", "dv"), padded, plain):
        assert torch.allclose(a, b, rtol=0, atol=1e-12), name
