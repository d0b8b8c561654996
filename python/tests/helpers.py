"""Helpers of the GPU suite: the float64 reference, the error metric, inputs; and for the
real-model tests (transformers), one training step's gradients and their yardstick."""

from __future__ import annotations

import math

import torch


# docs/design.md §8: relative L2 error bounds against the float64 reference.
REL_BOUND = {torch.bfloat16: 1e-2, torch.float16: 2e-3}


def visible(sq, sk, causal, top_left=False, window=(-1, -1), device="cuda", chunk=0):
    """[Sq, Sk] bool: which keys each query sees. Bottom-right aligned (query i sits on key
    i + Sk - Sq), or top-left (on key i) with `top_left`. causal: keys up to the diagonal.
    window (left, right), flash_attn's window_size: keys from diagonal - left to diagonal +
    right, -1 unbounded; with causal the right side is 0. chunk (FA3's attention_chunk, 0
    off): only keys in the diagonal's chunk of `chunk` keys (floor(j / chunk) equal)."""
    i = torch.arange(sq, device=device)[:, None]
    j = torch.arange(sk, device=device)[None, :]
    diag = i if top_left else i + (sk - sq)
    left, right = window
    if causal:
        right = 0
    seen = torch.ones(sq, sk, dtype=torch.bool, device=device)
    if left >= 0:
        seen &= j >= diag - left
    if right >= 0:
        seen &= j <= diag + right
    if chunk:
        seen &= torch.div(j, chunk, rounding_mode="floor") == torch.div(diag, chunk, rounding_mode="floor")
    return seen


def alibi_bias(slopes, sq, sk):
    """float64 ALiBi bias of `slopes` (`[Hq]` or `[B, Hq]`), `[Hq, Sq, Sk]` or `[B, Hq, Sq,
    Sk]`: -slope·|i + Sk - Sq - j|, bottom-right aligned as the causal mask (flash_attn's
    non-causal form; its causal kernels' slope·j differs by a constant a row)."""
    i = torch.arange(sq, device=slopes.device)[:, None]
    j = torch.arange(sk, device=slopes.device)[None, :]
    return -slopes.double()[..., None, None] * (i + sk - sq - j).abs().double()


def reference(q, k, v, scale, causal, top_left=False, window=(-1, -1), softcap=0.0, alibi=None, chunk=0):
    """float64 attention on BSHD tensors: (o [B, Sq, Hq, D], lse [B, Hq, Sq]); the mask as in
    `visible`; softcap: scores s = q·k·scale become softcap·tanh(s / softcap) first; alibi
    (slopes `[Hq]` or `[B, Hq]`): `alibi_bias` added after the softcap. Rows that see no key
    give o = 0, lse = -inf."""
    q, k, v = (t.double().transpose(1, 2) for t in (q, k, v))  # BHSD
    group = q.shape[1] // k.shape[1]
    k, v = (t.repeat_interleave(group, dim=1) for t in (k, v))
    s = torch.matmul(q, k.transpose(-1, -2)) * scale
    if softcap:
        s = softcap * torch.tanh(s / softcap)
    if alibi is not None:
        s = s + alibi_bias(alibi, q.shape[2], k.shape[2])
    s = s.masked_fill(~visible(q.shape[2], k.shape[2], causal, top_left, window, q.device, chunk), -math.inf)
    lse = torch.logsumexp(s, dim=-1)
    p = torch.exp(s - lse[..., None]).nan_to_num(0.0)  # rows with no key: exp(-inf - -inf)
    o = torch.matmul(p, v)
    return o.transpose(1, 2), lse


def rel_l2(x, ref, floor=0.0):
    """||x - ref|| / max(||ref||, floor) in float64; NaN or Inf in x gives inf (never passes).
    `floor` keeps an exactly-zero reference (the dq of a row with one visible key) from
    turning f32 rounding into an infinite relative error."""
    x = x.double()
    if not torch.isfinite(x).all():
        return math.inf
    den = max(ref.norm().item(), floor)
    return (x - ref).norm().item() / max(den, 1e-30)


def randn(*shape, dtype=torch.bfloat16, scale=1.0, seed=0):
    g = torch.Generator(device="cuda").manual_seed(seed)
    return torch.randn(*shape, device="cuda", dtype=torch.float32, generator=g).mul_(scale).to(dtype)


def reference_autograd(q, k, v, scale, causal, top_left=False, window=(-1, -1), softcap=0.0, alibi=None, chunk=0):
    """float64 attention on BSHD tensors that autograd can differentiate, rows that see no
    key included (their output is 0 and their gradient 0, with no NaN on the way); window,
    softcap, alibi and chunk as in `reference`."""
    q, k, v = (t.transpose(1, 2) for t in (q, k, v))  # BHSD
    group = q.shape[1] // k.shape[1]
    k, v = (t.repeat_interleave(group, dim=1) for t in (k, v))
    s = torch.matmul(q, k.transpose(-1, -2)) * scale
    if softcap:
        s = softcap * torch.tanh(s / softcap)
    if alibi is not None:
        s = s + alibi_bias(alibi, q.shape[2], k.shape[2])
    mask = visible(q.shape[2], k.shape[2], causal, top_left, window, q.device, chunk)
    seen = mask.any(-1, keepdim=True)
    s = s.masked_fill(~mask, -math.inf).masked_fill(~seen, 0.0)
    p = torch.softmax(s, dim=-1) * seen
    return torch.matmul(p, v).transpose(1, 2)


def qkv(b, sq, sk, hq, hkv, d, dtype, scale=1.0, seed=0):
    return (
        randn(b, sq, hq, d, dtype=dtype, scale=scale, seed=seed),
        randn(b, sk, hkv, d, dtype=dtype, scale=scale, seed=seed + 1),
        randn(b, sk, hkv, d, dtype=dtype, seed=seed + 2),
    )


def check_against_reference(q, k, v, out, lse, scale, causal, window=(-1, -1), softcap=0.0, alibi=None, chunk=0):
    """out and lse of FlashCore against `reference` (docs/design.md §8 bounds); rows that see no key
    must give 0 and lse = -inf exactly."""
    ref_o, ref_lse = reference(q, k, v, scale, causal, window=window, softcap=softcap, alibi=alibi, chunk=chunk)
    assert out.shape == q.shape and out.dtype == q.dtype and out.is_contiguous()
    err = rel_l2(out, ref_o)
    assert err <= REL_BOUND[q.dtype], f"rel L2 error of o {err:.3g} over {REL_BOUND[q.dtype]:g}"
    seen = torch.isfinite(ref_lse)
    assert torch.equal(torch.isfinite(lse), seen), "lse is -inf exactly on the rows that see no key"
    if seen.any():
        assert (lse[seen].double() - ref_lse[seen]).abs().max().item() <= 2e-3 * max(1.0, ref_lse[seen].abs().max().item())
    if (~seen).any():
        blind = (~seen).transpose(1, 2)[..., None].expand_as(out)  # [B, Sq, Hq, D]
        assert (out[blind] == 0).all(), "rows that see no key give 0"


def model_logits(model, ids, impl):
    """The model's float32 logits on token `ids` with attention implementation `impl`, no grad."""
    model.set_attn_implementation(impl)
    with torch.no_grad():
        return model(ids).logits.float()


def token_ids(batch, length, seed, vocab=32000, low=0):
    """`[batch, length]` random token ids in [low, vocab) on the GPU, from `seed`."""
    g = torch.Generator(device="cuda").manual_seed(seed)
    return torch.randint(low, vocab, (batch, length), device="cuda", generator=g)


def model_rel_l2(x, ref):
    """||x - ref|| / ||ref|| in float64 for model outputs; x must be finite."""
    x, ref = x.double(), ref.double()
    assert torch.isfinite(x).all()
    return ((x - ref).norm() / ref.norm()).item()


def training_step_gradients(model, impl, **inputs):
    """Every parameter's gradient of one `loss.backward()` of the model's loss on `inputs`
    (`input_ids` and `labels` at least), with attention implementation `impl` (float32
    copies, by parameter name); the model's gradients are cleared before and after."""
    model.set_attn_implementation(impl)
    model.zero_grad(set_to_none=True)
    model(**inputs).loss.backward()
    out = {n: p.grad.detach().float().clone() for n, p in model.named_parameters() if p.grad is not None}
    model.zero_grad(set_to_none=True)
    return out


def check_training_step(label, fp32, bf16, flashcore_impl, baseline, cancelling=(), **inputs):
    """One training step's gradients of the bf16 model with FlashCore's attention against the
    float32 model's with `baseline` (the reference), within the yardstick of the logits: 1.5x
    the bf16 model's own error with `baseline`, plus 1e-3, for every parameter; three times
    that for the parameters whose names contain one of `cancelling` (a gradient that is a
    difference of near-equal terms, whose relative error measures the cancellation). `inputs`
    go to the model (`input_ids`, `labels`, and an `attention_mask` or `position_ids`)."""
    ref, theirs = training_step_gradients(fp32, baseline, **inputs), training_step_gradients(bf16, baseline, **inputs)
    ours = training_step_gradients(bf16, flashcore_impl, **inputs)
    assert ref.keys() == ours.keys() and len(ours) > 0
    rows = [(model_rel_l2(ours[n], ref[n]), model_rel_l2(theirs[n], ref[n]), n) for n in ref]
    worst = max(rows, key=lambda r: r[0] - 1.5 * r[1])
    print(f"{label} training step, {len(rows)} parameters: worst against fp32 {worst[2]}: flashcore {worst[0]:.3e}, {baseline} {worst[1]:.3e}")
    for err_ours, err_theirs, n in rows:
        slack = 3.0 if any(c in n for c in cancelling) else 1.0
        assert err_ours <= slack * (1.5 * err_theirs + 1e-3), f"{n}: flashcore {err_ours:.3e}, {baseline} {err_theirs:.3e}"


def eager_autograd_node() -> str:
    """The type name of the autograd node an eager call that records gets: the native path's
    C++ node (`flashcore._native`) where it is built, else `_ops.Attention`'s."""
    from flashcore import _native

    return "CppFunction" if _native.status()["path"] == "native" else "AttentionBackward"
