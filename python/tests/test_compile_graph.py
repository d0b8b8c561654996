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
