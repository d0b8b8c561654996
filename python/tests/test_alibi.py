"""ALiBi (`alibi_slopes`) against the float64 reference (helpers.reference: score (i, j) of
head h gains -slope·|i + Sk - Sq - j| after the softcap, before the softmax): the forward,
its lse and its gradients with slopes a head (`[Hq]`) and a sequence and head (`[B, Hq]`),
causal or not, Sq != Sk both ways, GQA, with a window and a softcap, at head dims without a
kernel of their own; a packed batch against each sequence alone with its row of slopes; a KV
cache against the dense call over each sequence's keys; slopes of zeros as no slopes; the
compiled calls (the registered ops) as the eager ones. Bad slopes: test_bad_input."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch", reason="needs PyTorch")
import flashcore  # noqa: E402
from helpers import REL_BOUND, check_against_reference, eager_autograd_node, qkv, randn, reference, reference_autograd, rel_l2  # noqa: E402
from test_kvcache import Cache  # noqa: E402
from test_varlen import packed  # noqa: E402

BF16 = torch.bfloat16

# (B, Sq, Sk, Hq, Hkv, D): square with odd lengths; Sq < Sk with GQA; Sq > Sk (under the
# causal mask, rows that see no key; without it, rows whose nearest key is Sq - Sk away);
# decode with MQA (split-KV on one query row).
SHAPES = [
    (2, 113, 113, 4, 4, 64),
    (2, 113, 300, 8, 2, 128),
    (2, 300, 113, 4, 4, 128),
    (3, 1, 1000, 8, 1, 128),
]


def draw_slopes(*shape, seed=0):
    """ALiBi slopes as flash_attn's tests draw them: uniform in [0, 0.3), float32 on the GPU."""
    g = torch.Generator(device="cuda").manual_seed(seed)
    return torch.rand(*shape, device="cuda", generator=g) * 0.3


def forward_and_gradients(q, k, v, dout, **kw):
    """flash_attn_func's `(out, lse, [dq, dk, dv])`, the gradients of out against `dout`."""
    leaves = [t.detach().clone().requires_grad_() for t in (q, k, v)]
    out, lse, _ = flashcore.flash_attn_func(*leaves, return_attn_probs=True, **kw)
    out.backward(dout)
    return out.detach(), lse, [t.grad for t in leaves]


def reference_gradients(q, k, v, dout, scale, causal, **kw):
    """`[dq, dk, dv]` of float64 autograd through `reference_autograd` (window, softcap, alibi in kw)."""
    leaves = [t.double().requires_grad_() for t in (q, k, v)]
    reference_autograd(*leaves, scale, causal, **kw).backward(dout.double())
    return [t.grad for t in leaves]


def check_close(ours, theirs, bound, what=("dq", "dk", "dv")):
    """Each of `ours` within relative L2 `bound` of `theirs` (NaN never passes); an exactly
    zero `theirs` (the dq of a row with one visible key, a sequence without keys) is judged
    against 1e-3 of its size instead."""
    for name, a, b in zip(what, ours, theirs):
        assert a.shape == b.shape, f"{name}: shape {tuple(a.shape)}, want {tuple(b.shape)}"
        err = rel_l2(a, b.double(), floor=1e-3 * b.numel() ** 0.5)
        assert err <= bound, f"{name}: rel L2 error {err:.3g} over {bound:g}"


def check_lse_close(lse, want):
    """lse against another call's: -inf on the same rows (those that see no key), else close."""
    seen = torch.isfinite(want)
    assert torch.equal(torch.isfinite(lse), seen), "lse is -inf exactly on the rows that see no key"
    if seen.any():
        assert (lse[seen] - want[seen]).abs().max().item() <= 2e-3 * max(1.0, want[seen].abs().max().item())


@pytest.mark.parametrize("dtype", [BF16, torch.float16], ids=["bf16", "f16"])
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("per_sequence", [False, True], ids=["slopes-H", "slopes-BH"])
@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "x".join(map(str, s)))
def test_forward_and_gradients_match_float64(shape, per_sequence, causal, dtype):
    b, sq, sk, hq, hkv, d = shape
    q, k, v = qkv(*shape, dtype)
    dout = randn(b, sq, hq, d, dtype=dtype, seed=7)
    alibi = draw_slopes(b, hq) if per_sequence else draw_slopes(hq)
    out, lse, grads = forward_and_gradients(q, k, v, dout, causal=causal, alibi_slopes=alibi)
    # lse included: FlashCore's is the reference's under the causal mask too (flash_attn's differs there).
    check_against_reference(q, k, v, out, lse, d**-0.5, causal, alibi=alibi)
    plain, _ = reference(q, k, v, d**-0.5, causal)
    assert rel_l2(out, plain) > 10 * REL_BOUND[dtype], "the slopes must change the answer far past the bound"
    assert all(g.dtype == dtype for g in grads)
    check_close(grads, reference_gradients(q, k, v, dout, d**-0.5, causal, alibi=alibi), REL_BOUND[dtype])


@pytest.mark.parametrize("causal,window", [(True, (127, 0)), (False, (64, 64))], ids=["causal-w127_0", "w64_64"])
def test_with_a_window_and_a_softcap(causal, window):
    # Logits past the cap (q and k scaled by 3), GQA, Sq != Sk, slopes a sequence and head.
    q, k, v = qkv(2, 200, 300, 4, 2, 64, BF16, scale=3.0)
    dout = randn(2, 200, 4, 64, seed=7)
    alibi = draw_slopes(2, 4, seed=1)
    kw = dict(window=window, softcap=30.0, alibi=alibi)
    out, lse, grads = forward_and_gradients(q, k, v, dout, causal=causal, window_size=window, softcap=30.0, alibi_slopes=alibi)
    check_against_reference(q, k, v, out, lse, 0.125, causal, **kw)
    # Twice the bound, as test_window_softcap's gradients under a cap.
    check_close(grads, reference_gradients(q, k, v, dout, 0.125, causal, **kw), 2 * REL_BOUND[BF16])


@pytest.mark.parametrize("d", [59, 80])
def test_head_dims_without_a_kernel_of_their_own(d):
    """D59 runs zero-padded to 64 (the slopes, one a head, unchanged), D80 on Hopper as the
    D96 kernels with zero-filled columns."""
    if d % 8 == 0 and torch.cuda.get_device_capability() != (9, 0):
        pytest.skip("head dims other than 32/64/96/128/192/256 run on Hopper (fwd_sm90, bwd_sm90) alone")
    q, k, v = qkv(2, 150, 230, 4, 2, d, BF16)
    dout = randn(2, 150, 4, d, seed=7)
    alibi = draw_slopes(2, 4, seed=2)
    out, lse, grads = forward_and_gradients(q, k, v, dout, causal=True, alibi_slopes=alibi)
    # The padded path returns a view of the padded output, as flash_attn does.
    check_against_reference(q, k, v, out.contiguous(), lse, d**-0.5, True, alibi=alibi)
    check_close(grads, reference_gradients(q, k, v, dout, d**-0.5, True, alibi=alibi), REL_BOUND[BF16])


@pytest.mark.parametrize("per_sequence", [False, True], ids=["slopes-H", "slopes-BH"])
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_packed_batch_equals_each_sequence_alone_with_its_slopes(causal, per_sequence):
    # Sq != Sk both ways, a one-row sequence, and empty ones among them: sequence b takes row b
    # of the slopes whatever the sequences before it hold.
    lens = [(113, 300), (1, 1), (0, 5), (300, 113), (3, 0), (257, 257)]
    hq, d = 8, 128
    seqs, q, k, v, cu_q, cu_k = packed(lens, hq, 2, d, BF16, seed=3)
    alibi = draw_slopes(len(lens), hq, seed=4) if per_sequence else draw_slopes(hq, seed=4)
    dout = randn(*q.shape, seed=5)
    leaves = [t.detach().clone().requires_grad_() for t in (q, k, v)]
    out, lse, _ = flashcore.flash_attn_varlen_func(*leaves, cu_q, cu_k, 300, 300, causal=causal, alibi_slopes=alibi, return_attn_probs=True)
    out.backward(dout)
    dq, dk, dv = (t.grad for t in leaves)
    for b, ((qb, kb, vb), (sq, sk), q0, k0) in enumerate(zip(seqs, lens, cu_q.tolist(), cu_k.tolist())):
        rows, keys = slice(q0, q0 + sq), slice(k0, k0 + sk)
        if sq == 0:
            assert (dk[keys] == 0).all() and (dv[keys] == 0).all(), "keys no query sees get zero gradients"
            continue
        row = alibi[b] if per_sequence else alibi
        o_b, lse_b = out.detach()[rows][None], lse[:, rows][None]
        check_against_reference(qb, kb, vb, o_b, lse_b, d**-0.5, causal, alibi=row)
        alone, alone_lse, alone_grads = forward_and_gradients(qb, kb, vb, dout[rows][None], causal=causal, alibi_slopes=row)
        check_close([o_b, dq[rows][None], dk[keys][None], dv[keys][None]], [alone, *alone_grads], REL_BOUND[BF16], ("o", "dq", "dk", "dv"))
        check_lse_close(lse_b, alone_lse)


@pytest.mark.parametrize("per_sequence", [False, True], ids=["slopes-H", "slopes-BH"])
@pytest.mark.parametrize("sq,new,causal", [(1, 0, False), (1, 1, True), (5, 5, True), (300, 300, True)])
def test_kvcache_equals_the_dense_call_over_each_sequences_keys(sq, new, causal, per_sequence):
    """Decode (GQA, split-KV) and chunked prefill over a paged cache, keys appended first:
    sequence b's rows are the dense call's over its `cache_seqlens[b] + S_new` keys (Sk in the
    bias) with its slopes."""
    lens = [20, 1000, 17, 300]
    cache = Cache(lens, new, 2, 128, 64, BF16, seed=3)
    q = randn(len(lens), sq, 8, 128, seed=4)
    alibi = draw_slopes(len(lens), 8, seed=5) if per_sequence else draw_slopes(8, seed=5)
    out, lse = flashcore.flash_attn_with_kvcache(
        q, cache.k_pool, cache.v_pool, cache.k_new, cache.v_new, cache_seqlens=cache.cache_seqlens, block_table=cache.block_table,
        causal=causal, alibi_slopes=alibi, return_softmax_lse=True,
    )
    for b in range(len(lens)):
        row = alibi[b] if per_sequence else alibi
        keys, values = cache.keys[b], cache.values[b]  # [1, lens[b] + new, Hkv, D]
        dense, dense_lse, _ = flashcore.flash_attn_func(q[b : b + 1], keys, values, causal=causal, alibi_slopes=row, return_attn_probs=True)
        check_close([out[b : b + 1]], [dense], REL_BOUND[BF16], ("o",))
        check_lse_close(lse[b : b + 1], dense_lse)
        check_against_reference(q[b : b + 1], keys, values, out[b : b + 1], lse[b : b + 1], 128**-0.5, causal, alibi=row)


@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_zero_slopes_are_no_slopes(causal):
    # The ALiBi kernel variant runs for zeros: the same attention, within rounding (not bitwise).
    q, k, v = qkv(2, 200, 300, 8, 2, 128, BF16)
    dout = randn(2, 200, 8, 128, seed=7)
    out, lse, grads = forward_and_gradients(q, k, v, dout, causal=causal, alibi_slopes=torch.zeros(8, device="cuda"))
    plain, plain_lse, plain_grads = forward_and_gradients(q, k, v, dout, causal=causal)
    check_close([out, *grads], [plain, *plain_grads], REL_BOUND[BF16], ("o", "dq", "dk", "dv"))
    check_lse_close(lse, plain_lse)


def test_compiled_call_and_its_backward_match_eager():
    def f(q, k, v, alibi):
        return flashcore.flash_attn_func(q, k, v, causal=True, alibi_slopes=alibi, deterministic=True)

    q, k, v = qkv(2, 128, 200, 4, 2, 64, BF16)
    dout = randn(2, 128, 4, 64, seed=3)
    alibi = draw_slopes(2, 4)
    torch._dynamo.reset()
    compiled = [t.clone().requires_grad_() for t in (q, k, v)]
    out_c = torch.compile(f, fullgraph=True)(*compiled, alibi)
    out_c.backward(dout)
    eager = [t.clone().requires_grad_() for t in (q, k, v)]
    out_e = f(*eager, alibi)
    out_e.backward(dout)
    assert type(out_e.grad_fn).__name__ == eager_autograd_node(), "the eager call took the eager path, not the op"
    assert torch.equal(out_c, out_e)
    assert all(torch.equal(a.grad, b.grad) for a, b in zip(compiled, eager)), "compiled and eager gradients are bitwise equal"


def test_compiled_packed_batch_and_its_backward_match_eager():
    lens = [(100, 100), (37, 80), (0, 9), (255, 255)]
    _, q, k, v, cu_q, cu_k = packed(lens, 4, 2, 64, BF16, seed=41)
    dout = randn(*q.shape, seed=43)
    alibi = draw_slopes(len(lens), 4, seed=6)

    def f(q, k, v):
        return flashcore.flash_attn_varlen_func(q, k, v, cu_q, cu_k, 255, 255, causal=True, alibi_slopes=alibi, deterministic=True)

    torch._dynamo.reset()
    compiled = [t.detach().clone().requires_grad_() for t in (q, k, v)]
    out_c = torch.compile(f, fullgraph=True)(*compiled)
    out_c.backward(dout)
    eager = [t.detach().clone().requires_grad_() for t in (q, k, v)]
    out_e = f(*eager)
    out_e.backward(dout)
    assert torch.equal(out_c, out_e)
    assert all(torch.equal(a.grad, b.grad) for a, b in zip(compiled, eager)), "compiled and eager gradients are bitwise equal"


def test_compiled_kvcache_call_matches_eager():
    cache = Cache([40, 100], 1, 2, 64, 16, BF16, seed=3)
    q = randn(2, 1, 8, 64, seed=4)
    alibi = draw_slopes(2, 8, seed=7)

    def step(q, k_pool, v_pool, k, v, lens, table):
        return flashcore.flash_attn_with_kvcache(q, k_pool, v_pool, k, v, cache_seqlens=lens, block_table=table, causal=True, alibi_slopes=alibi)

    eager = step(q, cache.k_pool.clone(), cache.v_pool.clone(), cache.k_new, cache.v_new, cache.cache_seqlens, cache.block_table)
    torch._dynamo.reset()
    compiled = torch.compile(step, fullgraph=True)(q, cache.k_pool, cache.v_pool, cache.k_new, cache.v_new, cache.cache_seqlens, cache.block_table)
    assert not eager.isnan().any() and torch.equal(eager, compiled)
