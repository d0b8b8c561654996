"""Learnable sinks (`learnable_sink`; gpt-oss, FlashAttention-4's) against a float64 reference
with the sink as one more logit a row and no value: the output, the lse (which holds the sink),
the gradients of q, k, v and of the sinks themselves, causal or not, Sq != Sk both ways (rows
with no key: o = 0, lse = sink), GQA, gpt-oss's window; the sinks' gradient bitwise repeatable
and in their own dtype; sinks without a gradient; a packed batch against its sequences alone;
KV-cache calls (contiguous and paged, split or not, appending or not; decode with GQA heads
packed as rows); the compiled call as the eager one; bad sinks named."""

from __future__ import annotations

import math

import pytest

torch = pytest.importorskip("torch", reason="needs PyTorch")
import flashcore  # noqa: E402
from helpers import REL_BOUND, qkv, randn, rel_l2, visible  # noqa: E402

BF16 = torch.bfloat16

# (B, Sq, Sk, Hq, Hkv, D, causal, window): odd square lengths; Sq < Sk with GQA; Sq > Sk
# causal (rows that see no key); gpt-oss's layers (window (128, 0), GQA 8:2).
CASES = [
    (2, 113, 113, 4, 4, 64, True, (-1, -1)),
    (2, 113, 300, 8, 2, 128, False, (-1, -1)),
    (1, 300, 113, 4, 4, 64, True, (-1, -1)),
    (1, 1000, 1000, 8, 2, 64, True, (128, 0)),
]

# The sinks' gradient's bound against the size of its terms (flashcore check's: the kernels'
# D_i = dO·O read O rounded to bf16, each product off by up to 2^-9, doubled).
DSINK_BOUND = 2.0**-8


def draw_sinks(hq, seed=0, dtype=torch.float32):
    """Sinks spread over [-1, 3]: some below the rows' scores, some above."""
    g = torch.Generator(device="cuda").manual_seed(seed)
    return (torch.rand(hq, device="cuda", generator=g) * 4 - 1).to(dtype)


def sink_reference(q, k, v, sink, scale, causal, window=(-1, -1)):
    """float64 attention with sinks on BSHD tensors, differentiable in every input: (o [B, Sq,
    Hq, D], lse [B, Hq, Sq]), a row's logits its visible scores and its head's sink."""
    q, k, v = (t.transpose(1, 2) for t in (q, k, v))
    group = q.shape[1] // k.shape[1]
    k, v = (t.repeat_interleave(group, dim=1) for t in (k, v))
    s = torch.matmul(q, k.transpose(-1, -2)) * scale
    s = s.masked_fill(~visible(q.shape[2], k.shape[2], causal, window=window, device=q.device), -math.inf)
    logits = torch.cat([s, sink[None, :, None, None].expand(*s.shape[:3], 1)], dim=-1)
    lse = torch.logsumexp(logits, dim=-1)
    p = torch.exp(logits - lse[..., None])[..., :-1]
    return torch.matmul(p, v).transpose(1, 2), lse


def run(q, k, v, sink, dout, **kw):
    """flash_attn_func's out, lse and the gradients `[dq, dk, dv, dsink]` of out against `dout`."""
    leaves = [t.detach().clone().requires_grad_() for t in (q, k, v, sink)]
    out, lse, _ = flashcore.flash_attn_func(*leaves[:3], learnable_sink=leaves[3], return_attn_probs=True, **kw)
    out.backward(dout)
    return out, lse, [t.grad for t in leaves]


def reference_with_gradients(q, k, v, sink, dout, scale, causal, window):
    """sink_reference's o, lse, the gradients `[dq, dk, dv, dsink]` and dsink's terms' size
    `Σ_i P_i(sink)·Σ_c |dO_ic·O_ic|` a head, all in float64."""
    leaves = [t.detach().double().requires_grad_() for t in (q, k, v, sink)]
    o, lse = sink_reference(*leaves, scale, causal, window)
    o.backward(dout.double())
    p_sink = torch.exp(leaves[3].detach()[None, :, None] - lse.detach())  # [B, Hq, Sq]
    terms = (dout.double() * o.detach()).abs().sum(-1).transpose(1, 2)  # [B, Hq, Sq]
    return o.detach(), lse.detach(), [t.grad for t in leaves], (p_sink * terms).sum((0, 2))


@pytest.mark.parametrize("b,sq,sk,hq,hkv,d,causal,window", CASES)
def test_forward_and_gradients_match_the_reference(b, sq, sk, hq, hkv, d, causal, window):
    q, k, v = qkv(b, sq, sk, hq, hkv, d, BF16, seed=sq + sk)
    sink, dout = draw_sinks(hq, seed=d), randn(b, sq, hq, d, seed=7)
    scale = d**-0.5
    out, lse, grads = run(q, k, v, sink, dout, causal=causal, window_size=window)
    ref_o, ref_lse, ref_grads, dsink_size = reference_with_gradients(q, k, v, sink, dout, scale, causal, window)
    assert rel_l2(out, ref_o) <= REL_BOUND[BF16]
    assert torch.isfinite(lse).all(), "with a sink every row's lse is finite"
    assert (lse.double() - ref_lse).abs().max().item() <= 2e-3 * max(1.0, ref_lse.abs().max().item())
    blind = ~visible(sq, sk, causal, window=window).any(-1)  # rows that see no key
    if blind.any():
        assert (out[:, blind] == 0).all(), "a row that sees no key gives o = 0"
        assert torch.allclose(lse[:, :, blind], sink[None, :, None].expand(b, hq, int(blind.sum()))), "and lse = its sink"
    for name, got, want in zip(("dq", "dk", "dv"), grads[:3], ref_grads[:3]):
        assert torch.isfinite(got).all(), name
        assert rel_l2(got, want) <= REL_BOUND[BF16], f"{name}: {rel_l2(got, want):.3g}"
    dsink = grads[3]
    assert dsink.dtype == torch.float32 and dsink.shape == (hq,)
    err = ((dsink.double() - ref_grads[3]).abs() / dsink_size).max().item()
    assert err <= DSINK_BOUND, f"dsink off by {err:.3g} of its terms' size"


def test_the_sinks_gradient_repeats_bit_for_bit_and_comes_in_their_dtype():
    q, k, v = qkv(2, 257, 257, 8, 2, 64, BF16, seed=3)
    dout = randn(2, 257, 8, 64, seed=4)
    first = run(q, k, v, draw_sinks(8, dtype=BF16), dout, causal=True)[2]
    second = run(q, k, v, draw_sinks(8, dtype=BF16), dout, causal=True)[2]
    assert first[3].dtype == BF16, "the gradient comes in the sinks' own dtype"
    assert torch.equal(first[3], second[3]) and torch.equal(first[1], second[1]) and torch.equal(first[2], second[2])


def test_sinks_without_a_gradient_still_shape_the_output_and_the_other_gradients():
    q, k, v = qkv(1, 200, 200, 4, 4, 64, BF16, seed=5)
    sink, dout = draw_sinks(4, seed=9), randn(1, 200, 4, 64, seed=6)
    leaves = [t.detach().clone().requires_grad_() for t in (q, k, v)]
    out = flashcore.flash_attn_func(*leaves, causal=True, learnable_sink=sink)
    out.backward(dout)
    ref_o, _, ref_grads, _ = reference_with_gradients(q, k, v, sink, dout, 64**-0.5, True, (-1, -1))
    assert rel_l2(out, ref_o) <= REL_BOUND[BF16]
    for got, want in zip((t.grad for t in leaves), ref_grads[:3]):
        assert rel_l2(got, want) <= REL_BOUND[BF16]
    with torch.no_grad():
        plain = flashcore.flash_attn_func(q, k, v, causal=True)
    assert rel_l2(out.detach(), plain.double()) > 1e-2, "the sinks change the output"


def test_a_packed_batch_with_sinks_is_its_sequences_alone():
    lengths, hq, d = [(113, 300), (257, 57)], 4, 64
    sink = draw_sinks(hq, seed=2)
    parts = [qkv(1, sq, sk, hq, hq, d, BF16, seed=sq) for sq, sk in lengths]
    douts = [randn(1, sq, hq, d, seed=sk) for sq, sk in lengths]
    cu = lambda i: torch.tensor([0, *torch.tensor([n[i] for n in lengths]).cumsum(0).tolist()], device="cuda", dtype=torch.int32)  # noqa: E731
    packed = [torch.cat([p[i][0] for p in parts]).requires_grad_() for i in range(3)]
    packed_sink = sink.clone().requires_grad_()
    out = flashcore.flash_attn_varlen_func(
        *packed, cu(0), cu(1), max(n[0] for n in lengths), max(n[1] for n in lengths), causal=True, learnable_sink=packed_sink
    )
    out.backward(torch.cat([g[0] for g in douts]))
    alone_dsink = torch.zeros_like(sink)
    row = 0
    for (sq, _), (q, k, v), dout in zip(lengths, parts, douts):
        o, _, grads = run(q, k, v, sink, dout, causal=True)
        assert rel_l2(out[row : row + sq], o[0].double()) < 1e-3, "each sequence's rows as it gives alone"
        alone_dsink += grads[3]
        row += sq
    assert torch.allclose(packed_sink.grad, alone_dsink, rtol=1e-4, atol=1e-4), "dsink sums every sequence's rows"


@pytest.mark.parametrize("paged", [False, True], ids=["contiguous", "paged"])
@pytest.mark.parametrize("num_splits", [0, 5])
@pytest.mark.parametrize("sq,new", [(1, 0), (1, 1), (5, 5)], ids=["decode", "decode-append", "speculative"])
def test_a_kv_cache_call_with_sinks_matches_the_reference(paged, num_splits, sq, new):
    # gpt-oss serving: GQA 8:2 (decode packs a KV head's query heads as rows, each its own
    # head's sink), FlashCore's split count or 5 splits (the combine folds the sinks), and a
    # sequence that holds no key before the call (decode without append: o = 0, lse = sink).
    lens, hq, hkv, d, page = [0, 37, 1000], 8, 2, 64, 16
    b, capacity = len(lens), 1024
    sink = draw_sinks(hq, seed=sq + new)
    q = randn(b, sq, hq, d, seed=1)
    k_full, v_full = randn(b, capacity, hkv, d, seed=2), randn(b, capacity, hkv, d, seed=3)
    k_new, v_new = (randn(b, new, hkv, d, seed=4), randn(b, new, hkv, d, seed=5)) if new else (None, None)
    k_cache, v_cache = k_full.clone(), v_full.clone()
    table = None
    if paged:  # the same keys in shuffled pages of 16
        pages = capacity // page
        order = torch.randperm(b * pages, generator=torch.Generator().manual_seed(0)).to(torch.int32).cuda()
        table = order.view(b, pages)
        k_cache, v_cache = (torch.empty(b * pages, page, hkv, d, dtype=BF16, device="cuda") for _ in range(2))
        k_cache[table.long().flatten()] = k_full.view(b * pages, page, hkv, d)
        v_cache[table.long().flatten()] = v_full.view(b * pages, page, hkv, d)
    seqlens = torch.tensor(lens, dtype=torch.int32, device="cuda")
    out, lse = flashcore.flash_attn_with_kvcache(
        q, k_cache, v_cache, k_new, v_new, cache_seqlens=seqlens, block_table=table, causal=True, num_splits=num_splits,
        return_softmax_lse=True, learnable_sink=sink,
    )  # fmt: skip
    for i, n in enumerate(lens):
        keys, values = k_full[i : i + 1, :n], v_full[i : i + 1, :n]
        if new:
            keys, values = torch.cat([keys, k_new[i : i + 1]], 1), torch.cat([values, v_new[i : i + 1]], 1)
        ref_o, ref_lse = sink_reference(q[i : i + 1].double(), keys.double(), values.double(), sink.double(), d**-0.5, True)
        if keys.shape[1] == 0:
            assert (out[i] == 0).all() and torch.equal(lse[i], sink[:, None].expand(hq, sq)), "no key: o = 0, lse = the sink"
            continue
        assert rel_l2(out[i : i + 1], ref_o) <= REL_BOUND[BF16], f"sequence {i}"
        assert (lse[i : i + 1].double() - ref_lse).abs().max().item() <= 2e-3 * max(1.0, ref_lse.abs().max().item()), f"sequence {i}"


def test_the_compiled_call_gives_the_eager_ones_results():
    q, k, v = qkv(1, 128, 128, 4, 4, 64, BF16, seed=8)
    sink, dout = draw_sinks(4, seed=1), randn(1, 128, 4, 64, seed=2)

    def attention(q, k, v, sink):
        return flashcore.flash_attn_func(q, k, v, causal=True, learnable_sink=sink)

    results = []
    for fn in (attention, torch.compile(attention, fullgraph=True)):
        leaves = [t.detach().clone().requires_grad_() for t in (q, k, v, sink)]
        out = fn(*leaves)
        out.backward(dout)
        results.append((out.detach(), [t.grad for t in leaves]))
    (eager_o, eager_grads), (compiled_o, compiled_grads) = results
    assert torch.equal(eager_o, compiled_o)
    # Both run the registered ops (sinks with a gradient take them eagerly too): dK, dV and
    # dsink repeat bit for bit; dQ's atomic sums may differ in their last bits.
    assert all(torch.equal(a, b) for a, b in zip(compiled_grads[1:], eager_grads[1:]))
    assert rel_l2(compiled_grads[0], eager_grads[0].double()) < 1e-3


@pytest.mark.parametrize(
    "sink,error,words",
    [
        (lambda: torch.zeros(3, device="cuda"), ValueError, "[Hq]"),
        (lambda: torch.zeros(4, 1, device="cuda"), ValueError, "[Hq]"),
        (lambda: torch.zeros(4, dtype=torch.int32, device="cuda"), TypeError, "floating"),
        (lambda: torch.zeros(4), ValueError, "device"),
        (lambda: [0.0] * 4, TypeError, "torch.Tensor"),
    ],
)
def test_bad_sinks_are_named(sink, error, words):
    q, k, v = qkv(1, 16, 16, 4, 4, 64, BF16)
    with pytest.raises(error, match="learnable_sink") as info:
        flashcore.flash_attn_func(q, k, v, learnable_sink=sink())
    assert words in str(info.value)
