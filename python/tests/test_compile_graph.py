"""torch.compile(fullgraph=True) traces through the op; CUDA graphs capture it."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch", reason="needs PyTorch")
import flashcore  # noqa: E402
from helpers import randn  # noqa: E402


def block(x, wq, wk, wv):
    b, s, _ = x.shape
    q = (x @ wq).view(b, s, 8, 64)
    k = (x @ wk).view(b, s, 2, 64)
    v = (x @ wv).view(b, s, 2, 64)
    return flashcore.flash_attn_func(q, k, v, causal=True).reshape(b, s, 512).relu()


def weights():
    return randn(2, 300, 512, seed=1), randn(512, 512, seed=2, scale=0.05), randn(512, 128, seed=3, scale=0.05), randn(512, 128, seed=4, scale=0.05)


def test_torch_compile_fullgraph_matches_eager():
    args = weights()
    eager = block(*args)
    torch._dynamo.reset()
    compiled = torch.compile(block, fullgraph=True)
    assert torch.equal(compiled(*args), eager)
    # The op appears in the graph as itself (no graph break, no fallback).
    explanation = torch._dynamo.explain(block)(*args)
    assert explanation.graph_break_count == 0 and explanation.graph_count == 1


def test_torch_compile_sdpa_with_dynamic_shapes():
    def f(q, k, v):
        return flashcore.scaled_dot_product_attention(q, k, v, is_causal=True) * 2

    torch._dynamo.reset()
    compiled = torch.compile(f, fullgraph=True, dynamic=True)
    for s in (64, 100, 257):
        q, k, v = (randn(1, 4, s, 128, seed=i) for i in range(3))
        assert torch.equal(compiled(q, k, v), f(q, k, v))


def test_cuda_graph_capture_and_replay():
    x, wq, wk, wv = weights()
    static_x = x.clone()
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):  # warm-up: compiles and loads the kernel
        block(static_x, wq, wk, wv)
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        static_out = block(static_x, wq, wk, wv)
    for seed in (10, 11):
        new_x = randn(*x.shape, seed=seed)
        static_x.copy_(new_x)
        graph.replay()
        torch.cuda.synchronize()
        assert torch.equal(static_out, block(new_x, wq, wk, wv))


def test_cuda_graph_of_split_kv_decode():
    # Decode runs split-KV: the partials live in scratch memory from the caching allocator,
    # which CUDA graphs keep in their private pool.
    q, k, v = randn(4, 1, 32, 128), randn(4, 4096, 8, 128, seed=1), randn(4, 4096, 8, 128, seed=2)
    assert "split" in flashcore.kernel_plan(q, k)
    expected = flashcore.flash_attn_func(q, k, v)
    graph = torch.cuda.CUDAGraph()
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        flashcore.flash_attn_func(q, k, v)
    torch.cuda.current_stream().wait_stream(side)
    with torch.cuda.graph(graph):
        out = flashcore.flash_attn_func(q, k, v)
    graph.replay()
    torch.cuda.synchronize()
    assert torch.equal(out, expected)


def test_torch_compile_runs_dropout_through_the_ops_with_their_rng_state():
    # The registered ops carry dropout as (dropout_p, rng_state): compiled, forward and
    # backward equal the eager path's bit for bit under the same state (deterministic: no
    # atomic order in dQ).
    q, k, v = (randn(2, 200, 4, 64, seed=i).requires_grad_() for i in range(3))
    g = randn(2, 200, 4, 64, seed=7)
    state = torch.empty(2, dtype=torch.int64, device="cuda").random_()

    def f(q, k, v, state):
        o, _ = torch.ops.flashcore.fwd(q, k, v, 0.125, True, -1, 0, 0.0, 0, True, None, 0.3, state, 0, None)
        return o

    torch._dynamo.reset()
    compiled = torch.compile(f, fullgraph=True)
    out = compiled(q, k, v, state)
    grads = torch.autograd.grad(out, (q, k, v), g)
    options = flashcore._ops.Options(0.125, True, (-1, 0), deterministic=True, dropout=(0.3, state))
    eager = flashcore._ops.record(flashcore._ops.Attention, q, k, v, (options, False, None))
    eager_grads = torch.autograd.grad(eager, (q, k, v), g)
    assert torch.equal(out, eager)
    assert all(torch.equal(a, b) for a, b in zip(grads, eager_grads))
    # And the mask is there: without dropout the output differs.
    assert not torch.equal(out, flashcore.flash_attn_func(q, k, v, causal=True, softmax_scale=0.125))

    # The packed ops likewise.
    pq, pk, pv, pg = (t.detach().reshape(400, 4, 64).requires_grad_(t.requires_grad) for t in (q, k, v, g))
    cu = torch.tensor([0, 150, 400], dtype=torch.int32, device="cuda")

    def packed(q, k, v, state):
        return torch.ops.flashcore.varlen_fwd(q, k, v, cu, cu, None, 250, 250, True, 0.125, True, -1, 0, 0.0, 0, True, None, 0.3, state, 0, None)[0]

    out = torch.compile(packed, fullgraph=True)(pq, pk, pv, state)
    grads = torch.autograd.grad(out, (pq, pk, pv), pg)
    batch = flashcore._ops.Batch(cu, cu, None, 250, 250)
    eager, _ = flashcore._ops.record(flashcore._ops.VarlenAttention, pq, pk, pv, batch, (options, None))
    eager_grads = torch.autograd.grad(eager, (pq, pk, pv), pg)
    assert torch.equal(out, eager)
    assert all(torch.equal(a, b) for a, b in zip(grads, eager_grads))


def test_torch_compile_fullgraph_with_dropout_draws_a_mask_per_call():
    def f(q, k, v):
        return flashcore.flash_attn_func(q, k, v, dropout_p=0.5)

    # v = 1: each output is the kept probabilities' sum / (1 - p), 1 on average, not 1 each.
    q, k = randn(1, 256, 4, 64, seed=1), randn(1, 256, 4, 64, seed=2)
    v = torch.ones_like(k)
    torch._dynamo.reset()
    compiled = torch.compile(f, fullgraph=True)
    a, b = compiled(q, k, v), compiled(q, k, v)
    assert not torch.equal(a, b), "each call, another mask"
    assert (a.float() - 1).abs().max() > 0.05 and abs(a.float().mean().item() - 1) < 0.05
    explanation = torch._dynamo.explain(f)(q, k, v)
    assert explanation.graph_break_count == 0
    # The probabilities are not an op output: refused by name (fullgraph: inside Dynamo's
    # Unsupported, which carries the message; otherwise the call runs eagerly and has them).
    with pytest.raises(Exception, match="return_attn_probs"):
        torch.compile(lambda q: flashcore.flash_attn_func(q, q, q, dropout_p=0.5, return_attn_probs=True), fullgraph=True)(q)
