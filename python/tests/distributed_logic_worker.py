"""One rank of the context-parallel orchestration check (run by test_distributed.py under
torchrun on CPU processes over gloo, any number of ranks): flashcore.distributed's rings and
packed layout with FlashCore's kernels swapped for a float64 reference, against that
reference on the whole sequence. It covers what the Python layer decides: which blocks each
ring step computes, the merges by LSE, dK/dV travelling home, the packed batch's all-gather
and reduce-scatter, at world sizes no GPU machine lends (3). The kernels and NCCL are
distributed_worker.py's. Prints one line per check and exits 1 on any failure."""
from __future__ import annotations

import math
from datetime import timedelta

import torch
import torch.distributed as dist

from flashcore import _ops
from flashcore import distributed as cp

from distributed_checks import Tally, rel_l2, ring_errors

checks = Tally({"out": 1e-5, "lse": 1e-5, "dq": 1e-5, "dk": 1e-5, "dv": 1e-5})


def scores(q, k, scale, causal, window, softcap):
    """Float64 scores `[B, Hq, Sq, Sk]` after the softcap, -inf where masked (bottom-right
    aligned, as the kernels), and the softcap's derivative (1 without one)."""
    sq, sk, rep = q.shape[1], k.shape[1], q.shape[2] // k.shape[2]
    s = torch.einsum("bqhd,bkhd->bhqk", q.double(), k.double().repeat_interleave(rep, 2)) * scale
    slope = torch.ones_like(s)
    if softcap:
        t = torch.tanh(s / softcap)
        s, slope = softcap * t, 1 - t * t
    i, j = torch.arange(sq)[:, None] + (sk - sq), torch.arange(sk)[None, :]
    seen = torch.ones(sq, sk, dtype=torch.bool)
    if causal:
        seen &= j <= i
    if window[0] >= 0:
        seen &= j >= i - window[0]
    if window[1] >= 0:
        seen &= j <= i + window[1]
    return s.masked_fill(~seen, -math.inf), slope


def finite(lse):
    return torch.where(torch.isinf(lse), torch.zeros_like(lse), lse)


def reference(q, k, v, scale, causal, window, softcap):
    """Attention of one BSHD batch in float64: `(o, lse [B, Hq, Sq])`, o = 0 and lse = -inf on
    rows that see no key."""
    s, _ = scores(q, k, scale, causal, window, softcap)
    lse = torch.logsumexp(s, -1)
    p = torch.exp(s - finite(lse).unsqueeze(-1))
    return torch.einsum("bhqk,bkhd->bqhd", p, v.double().repeat_interleave(q.shape[2] // k.shape[2], 2)), lse


def reference_grads(q, k, v, o, lse, dout, scale, causal, window, softcap):
    """The kernels' backward in float64: from the output `o` and `lse` it is given (the whole
    row's, in a ring, not this block's), P = exp(S - lse) and D = rowsum(dO o O)."""
    rep = q.shape[2] // k.shape[2]
    s, slope = scores(q, k, scale, causal, window, softcap)
    p = torch.exp(s - finite(lse.double()).unsqueeze(-1))
    do, vv = dout.double(), v.double().repeat_interleave(rep, 2)
    dp = torch.einsum("bqhd,bkhd->bhqk", do, vv)
    d = (do * o.double()).sum(-1).transpose(1, 2).unsqueeze(-1)  # [B, Hq, Sq, 1]
    ds = p * (dp - d) * slope * scale
    dq = torch.einsum("bhqk,bkhd->bqhd", ds, k.double().repeat_interleave(rep, 2))
    dk = torch.einsum("bhqk,bqhd->bkhd", ds, q.double())
    dv = torch.einsum("bhqk,bqhd->bkhd", p, do)
    fold = lambda g: g.unflatten(2, (k.shape[2], rep)).sum(3)  # noqa: E731 - query heads onto their KV head
    return dq, fold(dk), fold(dv)


# The kernels' entry points as flashcore.distributed calls them, on CPU tensors.
def score_args(options):
    """The reference's score arguments from an options record (`_ops.Options`)."""
    return options.softmax_scale, options.causal, options.window, options.softcap


def forward(q, k, v, options, want_lse=True, probs=None):
    o, lse = reference(q, k, v, *score_args(options))
    return o.to(q.dtype), lse.float()


def backward_into(saved, dout, grads, options, grads_like_inputs=False):
    for out, grad in zip(grads, reference_grads(*saved, dout, *score_args(options))):
        out.copy_(grad)


def sequences(cu_q, cu_k, used):
    """Each packed sequence's query rows and key rows (seqused_k of them where given)."""
    cq, ck = cu_q.tolist(), cu_k.tolist()
    for b in range(len(cq) - 1):
        keys = ck[b + 1] - ck[b] if used is None else int(used[b])
        yield b, slice(cq[b], cq[b + 1]), slice(ck[b], ck[b] + keys)


def varlen_forward(q, k, v, batch, options, probs=None):
    o, lse = torch.zeros_like(q), torch.full((q.shape[1], q.shape[0]), -math.inf)
    for _, rows, keys in sequences(batch.cu_seqlens_q, batch.cu_seqlens_k, batch.seqused_k):
        ob, lb = reference(q[None, rows], k[None, keys], v[None, keys], *score_args(options))
        o[rows], lse[:, rows] = ob[0].to(q.dtype), lb[0].float()
    return o, lse


def varlen_backward_into(saved, dout, grads, batch, options):
    q, k, v, o, lse = saved
    dq, dk, dv = grads
    dq.zero_(), dk.zero_(), dv.zero_()  # keys past seqused_k get zero, as the kernels write
    for _, rows, keys in sequences(batch.cu_seqlens_q, batch.cu_seqlens_k, batch.seqused_k):
        grads_b = reference_grads(q[None, rows], k[None, keys], v[None, keys], o[None, rows], lse[None, :, rows], dout[None, rows], *score_args(options))
        dq[rows], dk[keys], dv[keys] = (g[0] for g in grads_b)


def check_local_cpu(q, k, v, rank_dim):
    if k.shape != v.shape or q.dim() != rank_dim:
        raise ValueError("shapes")


def dense_case(layout: str, s: int, hq: int, hkv: int, causal: bool, softcap: float) -> None:
    g = torch.Generator().manual_seed(7)
    q, k, v, dout = (torch.randn(1, s, h, 32, generator=g) for h in (hq, hkv, hkv, hq))
    out, lse = reference(q, k, v, 32**-0.5, causal, (-1, -1), softcap)
    grads = reference_grads(q, k, v, out, lse, dout, 32**-0.5, causal, (-1, -1), softcap)
    errors = ring_errors(layout, q, k, v, dout, out, lse, grads, causal, softcap)
    checks.report(f"{layout} S{s} Hq{hq}/Hkv{hkv} causal={causal} softcap={softcap}", errors)


def varlen_case(local_lens, causal: bool, window) -> None:
    world, rank = dist.get_world_size(), dist.get_rank()
    g = torch.Generator().manual_seed(11)
    whole_lens = [world * n for n in local_lens]
    total = sum(whole_lens)
    q, k, v, dout = (torch.randn(total, h, 32, generator=g) for h in (4, 2, 2, 4))
    starts = [sum(whole_lens[:b]) for b in range(len(whole_lens))]
    rows = torch.cat([torch.arange(st + rank * n, st + (rank + 1) * n) for st, n in zip(starts, local_lens)])
    cu_whole = torch.tensor([0] + [sum(whole_lens[: b + 1]) for b in range(len(whole_lens))], dtype=torch.int32)
    batch, options = _ops.Batch(cu_whole, cu_whole, None, 0, 0), _ops.Options(32**-0.5, causal, window)
    out, lse = varlen_forward(q, k, v, batch, options)
    dq, dk, dv = (torch.empty_like(t) for t in (q, k, v))
    varlen_backward_into((q, k, v, out, lse), dout, (dq, dk, dv), batch, options)
    cu_local = torch.tensor([0] + [sum(local_lens[: b + 1]) for b in range(len(local_lens))], dtype=torch.int32)
    mine = [t[rows].clone().requires_grad_() for t in (q, k, v)]
    o, l, _ = cp.ring_flash_attn_varlen_func(*mine, cu_local, max(local_lens), causal=causal, window_size=window, return_attn_probs=True)
    o.backward(dout[rows])
    errors = {"out": rel_l2(o, out[rows]), "lse": rel_l2(l, lse[:, rows])}
    for name, t, whole in zip(("dq", "dk", "dv"), mine, (dq, dk, dv)):
        errors[name] = rel_l2(t.grad, whole[rows])
    checks.report(f"varlen local {local_lens} causal={causal} window={window}", errors)


def main() -> None:
    dist.init_process_group("gloo", timeout=timedelta(seconds=60))
    for name, fn in (("forward", forward), ("backward_into", backward_into), ("varlen_forward", varlen_forward),
                     ("varlen_backward_into", varlen_backward_into)):
        setattr(_ops, name, fn)
    cp._check_local = check_local_cpu  # the real one refuses CPU tensors
    w = dist.get_world_size()
    for layout in ("zigzag", "contiguous"):
        for causal in (True, False):
            dense_case(layout, 2 * w * 13, 4, 2, causal, 0.0)
        dense_case(layout, 2 * w * 7, 2, 2, True, 5.0)
    for causal, window in ((True, (-1, -1)), (False, (-1, -1)), (True, (9, 0))):
        varlen_case([5, 12, 1, 20], causal, window)
    checks.finish()


if __name__ == "__main__":
    main()
