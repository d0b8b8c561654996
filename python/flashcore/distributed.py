"""Context parallelism: attention over a sequence split across the GPUs of a process group
(torch.distributed, NCCL), forward and backward, on FlashCore's kernels.

Three layouts, ring-flash-attn's names and argument order (flash_attn's `softcap` after
`window_size`, `group` last), so its users switch by import:

- `ring_flash_attn_func` (and `_kvpacked`, `_qkvpacked`): rank r holds chunk r of the
  sequence (`shard(x, group, "contiguous")`). K/V blocks travel around the ring
  (`batch_isend_irecv`, overlapped with the local attention); partial outputs are merged in
  fp32 by their log-sum-exps. Causal attention leaves rank 0 one block and rank W-1 W blocks.
- `zigzag_ring_flash_attn_func` (and packed forms): rank r holds chunks r and 2W-1-r of 2W
  (`shard(x, group, "zigzag")`), so every rank computes the same causal work.
- `ring_flash_attn_varlen_func` (and packed forms): a packed batch in which rank r holds
  chunk r of every sequence (lengths divisible by W). K/V of the batch are all-gathered
  (llama3-style) and each rank runs one packed call of its queries against the keys they
  see; the backward reduce-scatters dK/dV in fp32. Chosen over a per-sequence zigzag ring
  because it takes any mix of lengths and sliding windows unchanged, with one collective each
  way; it holds the batch's K/V on every rank, which GQA keeps small.

The backward passes dK/dV around the ring with the K/V blocks, accumulated in fp32, and
returns each home. Everything is usable inside `torch.autograd`.

Validation: before any transfer one small all-gather of every rank's shapes and options
compares them, so a mismatch raises the same ValueError naming the argument on every rank
instead of leaving ranks waiting on a transfer. A rank that never arrives is caught by the
process group's timeout (`init_process_group(timeout=...)`): set it.

Not supported: dropout and ALiBi; sliding windows in the ring layouts (NotImplementedError
naming them; the varlen layout takes causal windows). Tested on 2 GPUs of one host; across nodes it
is the same process-group code, not run here.
"""
from __future__ import annotations

from typing import List, NamedTuple, Optional, Sequence, Tuple

import torch
import torch.distributed as dist
from torch import Tensor

from . import _ops
from ._args import NO_WINDOW, _scale, _softcap, _window

__all__ = [
    "ring_flash_attn_func",
    "ring_flash_attn_kvpacked_func",
    "ring_flash_attn_qkvpacked_func",
    "zigzag_ring_flash_attn_func",
    "zigzag_ring_flash_attn_kvpacked_func",
    "zigzag_ring_flash_attn_qkvpacked_func",
    "ring_flash_attn_varlen_func",
    "ring_flash_attn_varlen_kvpacked_func",
    "ring_flash_attn_varlen_qkvpacked_func",
    "shard",
    "unshard",
]


# ---- layouts ---------------------------------------------------------------------------


def _world(group: Optional[dist.ProcessGroup]) -> Tuple[int, int]:
    if not dist.is_available() or not dist.is_initialized():
        raise RuntimeError("flashcore.distributed needs torch.distributed initialised (init_process_group with the nccl backend)")
    return dist.get_world_size(group), dist.get_rank(group)


def _chunks(x: Tensor, parts: int, dim: int, name: str) -> List[Tensor]:
    if x.shape[dim] % parts:
        raise ValueError(f"`{name}`: its sequence dim ({x.shape[dim]}) must be divisible by {parts} for this layout")
    return list(x.chunk(parts, dim=dim))


def shard(x: Tensor, group: Optional[dist.ProcessGroup] = None, layout: str = "zigzag", dim: int = 1) -> Tensor:
    """This rank's share of the whole sequence `x` (dim `dim`): `"zigzag"` chunks r and
    2W-1-r of 2W, `"contiguous"` chunk r of W."""
    world, rank = _world(group)
    if layout == "zigzag":
        c = _chunks(x, 2 * world, dim, "x")
        return torch.cat([c[rank], c[2 * world - 1 - rank]], dim=dim).contiguous()
    if layout == "contiguous":
        return _chunks(x, world, dim, "x")[rank].contiguous()
    raise ValueError(f"`layout` must be 'zigzag' or 'contiguous', got {layout!r}")


def unshard(x: Tensor, group: Optional[dist.ProcessGroup] = None, layout: str = "zigzag", dim: int = 1) -> Tensor:
    """The whole sequence from every rank's share `x` (an all-gather; inverse of `shard`)."""
    world, _ = _world(group)
    parts = [torch.empty_like(x) for _ in range(world)]
    dist.all_gather(parts, x.contiguous(), group=group)
    if layout == "contiguous":
        return torch.cat(parts, dim=dim)
    if layout != "zigzag":
        raise ValueError(f"`layout` must be 'zigzag' or 'contiguous', got {layout!r}")
    halves = [p.chunk(2, dim=dim) for p in parts]
    return torch.cat([halves[r][0] for r in range(world)] + [halves[r][1] for r in reversed(range(world))], dim=dim)


# ---- validation ------------------------------------------------------------------------


def _agree(group: Optional[dist.ProcessGroup], what: Sequence[Tuple[str, object]]) -> None:
    """Raises the same ValueError on every rank when any rank's `what` differs from rank 0's
    (one all-gather of a few hundred bytes)."""
    world, _ = _world(group)
    if world == 1:
        return
    mine = [(name, repr(value)) for name, value in what]
    everyone: List[object] = [None] * world
    dist.all_gather_object(everyone, mine, group=group)
    first = everyone[0]
    for rank, theirs in enumerate(everyone):
        for (name, want), (_, got) in zip(first, theirs):  # type: ignore[arg-type]
            if got != want:
                raise ValueError(f"`{name}` differs across ranks: rank {rank} has {got}, rank 0 has {want}")


def _describe(t: Tensor) -> Tuple[object, ...]:
    return (tuple(t.shape), str(t.dtype))


def _check_local(q: Tensor, k: Tensor, v: Tensor, rank_dim: int) -> None:
    for name, t in (("q", q), ("k", k), ("v", v)):
        if not isinstance(t, Tensor) or not t.is_cuda:
            raise ValueError(f"`{name}` must be a CUDA tensor")
        if t.dim() != rank_dim:
            raise ValueError(f"`{name}` must have {rank_dim} dims, it has shape {tuple(t.shape)}")
    if k.shape != v.shape:
        raise ValueError(f"`v` must be shaped as `k` {tuple(k.shape)}, it is {tuple(v.shape)}")


class _FlashArgs(NamedTuple):
    """The public functions' flash_attn arguments, in their order, as given (unchecked)."""

    dropout_p: float
    softmax_scale: Optional[float]
    causal: bool
    window_size: object
    softcap: object
    alibi_slopes: object
    deterministic: bool
    return_attn_probs: bool


def _options(args: _FlashArgs, q: Tensor, ring: bool) -> _ops.Options:
    """`args` checked, as the call's options record; NotImplementedError for what the layouts
    do not run (dropout, ALiBi; the ring layouts a window)."""
    if args.dropout_p:
        raise NotImplementedError(f"`dropout_p` = {args.dropout_p}: flashcore.distributed runs no dropout")
    if args.alibi_slopes is not None:
        raise NotImplementedError("`alibi_slopes`: flashcore.distributed runs no ALiBi")
    window = NO_WINDOW if tuple(args.window_size) == NO_WINDOW else _window(args.window_size)  # type: ignore[arg-type]
    if ring and window != NO_WINDOW:
        raise NotImplementedError(f"`window_size` = {args.window_size}: the ring layouts run no sliding window (ring_flash_attn_varlen_func does)")
    cap = 0.0 if args.softcap == 0.0 else _softcap(args.softcap)
    return _ops.Options(_scale(args.softmax_scale, q.shape[-1]), bool(args.causal), window, cap, 0, bool(args.deterministic))


# ---- the ring --------------------------------------------------------------------------


class _Ring:
    """Sends tensors to the next rank and receives the previous rank's, asynchronously."""

    def __init__(self, group: Optional[dist.ProcessGroup]):
        self.group = group
        world, rank = _world(group)
        to_global = (lambda r: dist.get_global_rank(group, r)) if group is not None else (lambda r: r)
        self.next, self.prev = to_global((rank + 1) % world), to_global((rank - 1) % world)

    def start(self, tensors: Sequence[Tensor]) -> Tuple[List[Tensor], list]:
        received = [torch.empty_like(t) for t in tensors]
        ops = [dist.P2POp(dist.isend, t, self.next, self.group) for t in tensors]
        ops += [dist.P2POp(dist.irecv, r, self.prev, self.group) for r in received]
        return received, dist.batch_isend_irecv(ops)

    @staticmethod
    def wait(pending: Tuple[List[Tensor], list]) -> List[Tensor]:
        received, requests = pending
        for request in requests:
            request.wait()
        return received


def _blocks(world: int, rank: int, step: int, causal: bool, zigzag: bool, local: int):
    """What this rank computes at ring step `step` (K/V of rank `(rank - step) % world`):
    `(q_rows, kv_rows, causal)` as slices of the local sequence, or None to skip."""
    whole = slice(0, local)
    if step == 0:
        return whole, whole, causal
    if not causal:
        return whole, whole, False
    source = (rank - step) % world
    if not zigzag:
        return (whole, whole, False) if source < rank else None
    half = local // 2
    if source < rank:
        return whole, slice(0, half), False  # every query sees the source's early chunk
    return slice(half, local), whole, False  # this rank's late chunk sees both of the source's


def _merge(out: Tensor, lse: Tensor, rows: slice, o: Tensor, lse_b: Tensor) -> None:
    """Folds a partial result `(o, lse_b)` of query rows `rows` into the fp32 `out`, `lse`, in
    place: two passes over `out`'s rows (a scale, then a multiply-add of the bf16 `o` converted
    as it is read), where out-of-place arithmetic would make five and three temporaries."""
    current = lse[:, :, rows]
    merged = torch.logaddexp(current, lse_b)
    finite = torch.where(torch.isinf(merged), torch.zeros_like(merged), merged)  # rows that see no key yet
    keep = torch.exp(current - finite).transpose(1, 2).unsqueeze(-1)
    take = torch.exp(lse_b - finite).transpose(1, 2).unsqueeze(-1)
    out[:, rows].mul_(keep).addcmul_(o, take)
    lse[:, :, rows] = merged


def _ring_forward(q: Tensor, k: Tensor, v: Tensor, options: _ops.Options, group, zigzag: bool) -> Tuple[Tensor, Tensor]:
    world, rank = _world(group)
    ring = _Ring(group)
    local = q.shape[1]
    out = lse = None
    kv = [k, v]
    for step in range(world):
        pending = ring.start(kv) if step + 1 < world else None
        block = _blocks(world, rank, step, options.causal, zigzag, local)
        if block is not None:
            rows, cols, block_causal = block
            o, lse_b = _ops.forward(q[:, rows], kv[0][:, cols], kv[1][:, cols], options._replace(causal=block_causal))
            if out is None:  # step 0, every row (`_blocks`): the first partial result is the running one
                out, lse = o.float(), lse_b
            else:
                _merge(out, lse, rows, o, lse_b)
        if pending is not None:
            kv = _Ring.wait(pending)
    return out.to(q.dtype), lse


def _ring_backward(dout: Tensor, saved: Tuple[Tensor, ...], options: _ops.Options, group, zigzag: bool) -> Tuple[Tensor, Tensor, Tensor]:
    q, k, v, out, lse = saved
    world, rank = _world(group)
    ring = _Ring(group)
    local = q.shape[1]
    dq = dkv = None
    kv = [k, v]
    dkv_pending = None  # the fp32 dK/dV sums of the block now held, on their way from the previous rank
    dout = dout.contiguous()
    for step in range(world):
        pending = ring.start(kv) if step + 1 < world else None
        block = _blocks(world, rank, step, options.causal, zigzag, local)
        if block is not None:
            rows, cols, block_causal = block
            qb, kb, vb = q[:, rows], kv[0][:, cols], kv[1][:, cols]
            dq_b, dk_b, dv_b = torch.empty_like(qb), torch.empty_like(kb), torch.empty_like(vb)
            saved_b = (qb, kb, vb, out[:, rows], lse[:, :, rows].contiguous())
            _ops.backward_into(saved_b, dout[:, rows], (dq_b, dk_b, dv_b), options._replace(causal=block_causal))
        # Waited for only now, so the sums' transfer ran beside this step's kernel.
        if dkv_pending is not None:
            dkv = _Ring.wait(dkv_pending)
        if block is not None:
            if dq is None:  # step 0, every row and key (`_blocks`): the first gradients start the sums
                dq, dkv = dq_b.float(), [dk_b.float(), dv_b.float()]
            else:
                dq[:, rows] += dq_b
                dkv[0][:, cols] += dk_b
                dkv[1][:, cols] += dv_b
        # dK/dV travel with the block they belong to; after `world` passes they are home.
        dkv_pending = ring.start(dkv)
        if pending is not None:
            kv = _Ring.wait(pending)
    dkv = _Ring.wait(dkv_pending)
    return dq.to(q.dtype), dkv[0].to(k.dtype), dkv[1].to(v.dtype)


class _RingAttention(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, options, group, zigzag):
        out, lse = _ring_forward(q, k, v, options, group, zigzag)
        ctx.mark_non_differentiable(lse)
        ctx.save_for_backward(q, k, v, out, lse)
        ctx.args = (options, group, zigzag)
        return out, lse

    @staticmethod
    def backward(ctx, dout, _dlse):
        dq, dk, dv = _ring_backward(dout, ctx.saved_tensors, *ctx.args)
        return dq, dk, dv, None, None, None


def _ring(q: Tensor, k: Tensor, v: Tensor, args: _FlashArgs, group, zigzag: bool):
    _check_local(q, k, v, 4)
    world, _ = _world(group)
    name = "zigzag_ring_flash_attn_func" if zigzag else "ring_flash_attn_func"
    _agree(group, [("q", _describe(q)), ("k", _describe(k)), ("v", _describe(v)), ("causal", bool(args.causal)), ("softmax_scale", args.softmax_scale),
                   ("softcap", args.softcap), ("window_size", tuple(args.window_size)), ("deterministic", bool(args.deterministic)), ("function", name)])
    if zigzag and q.shape[1] % 2:
        raise ValueError(f"`q`: the zigzag layout holds two equal chunks a rank; the local sequence ({q.shape[1]}) must be even")
    if k.shape[1] != q.shape[1]:
        raise ValueError(f"`k`: the ring layouts split q and k alike; local lengths {q.shape[1]} (q) and {k.shape[1]} (k) differ")
    out, lse = _RingAttention.apply(q, k, v, _options(args, q, ring=True), group, zigzag)
    return (out, lse, None) if args.return_attn_probs else out


# ---- packed batches: K/V all-gathered ---------------------------------------------------


def _varlen_layout(cu_seqlens: Tensor, world: int, rank: int, causal: bool, device):
    """Index maps between the rank-major gathered K/V and the sequence-major whole batch, the
    whole batch's cu_seqlens and the keys each local sequence's queries use."""
    ends = cu_seqlens.tolist()  # one host copy of B + 1 integers
    local_lens = [b - a for a, b in zip(ends[:-1], ends[1:])]
    total_local = ends[-1]
    order = []
    for s, n in enumerate(local_lens):
        for r in range(world):
            order.extend(range(r * total_local + ends[s], r * total_local + ends[s] + n))
    index = torch.tensor(order, dtype=torch.long, device=device)
    whole = torch.tensor([0] + [world * e for e in ends[1:]], dtype=torch.int32, device=device)
    used = torch.tensor([(rank + 1) * n if causal else world * n for n in local_lens], dtype=torch.int32, device=device)
    return index, whole, used, max(local_lens, default=0)


class _GatheredVarlen(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, cu_seqlens, options, group):
        world, rank = _world(group)
        index, whole, used, max_local = _varlen_layout(cu_seqlens, world, rank, options.causal, q.device)
        gathered = [torch.empty((world * t.shape[0], *t.shape[1:]), dtype=t.dtype, device=t.device) for t in (k, v)]
        for buf, t in zip(gathered, (k, v)):
            dist.all_gather_into_tensor(buf, t.contiguous(), group=group)
        k_all, v_all = (g.index_select(0, index) for g in gathered)
        # The queries of sequence b are chunk `rank` of it. Causal, its keys end where its local
        # queries end (`used[b]`), and bottom-right alignment against them places each query at
        # its global position, for a window too; otherwise every key of the sequence is seen.
        max_k = world * max_local
        out, lse = _ops.varlen_forward(q, k_all, v_all, _ops.Batch(cu_seqlens, whole, used, max_local, max_k), options)
        ctx.mark_non_differentiable(lse)
        ctx.save_for_backward(q, k_all, v_all, out, lse, cu_seqlens, whole, used, index)
        ctx.args = (max_local, max_k, options, group, k.shape[0])
        return out, lse

    @staticmethod
    def backward(ctx, dout, _dlse):
        q, k_all, v_all, out, lse, cu_seqlens, whole, used, index = ctx.saved_tensors
        max_local, max_k, options, group, total_local = ctx.args
        dq, dk_all, dv_all = torch.empty_like(q), torch.empty_like(k_all), torch.empty_like(v_all)
        batch = _ops.Batch(cu_seqlens, whole, used, max_local, max_k)
        _ops.varlen_backward_into((q, k_all, v_all, out, lse), dout.contiguous(), (dq, dk_all, dv_all), batch, options)
        grads = []
        for d in (dk_all, dv_all):
            rank_major = torch.empty((d.shape[0], *d.shape[1:]), dtype=torch.float32, device=d.device)
            rank_major[index] = d.float()
            mine = torch.empty((total_local, *d.shape[1:]), dtype=torch.float32, device=d.device)
            dist.reduce_scatter_tensor(mine, rank_major, group=group)
            grads.append(mine.to(d.dtype))
        return dq, grads[0], grads[1], None, None, None


def ring_flash_attn_varlen_func(
    q: Tensor, k: Tensor, v: Tensor, cu_seqlens: Tensor, max_seqlen: int, dropout_p: float = 0.0, softmax_scale: Optional[float] = None,
    causal: bool = False, window_size: Tuple[int, int] = (-1, -1), softcap: float = 0.0, alibi_slopes: Optional[Tensor] = None,
    deterministic: bool = False, return_attn_probs: bool = False, group: Optional[dist.ProcessGroup] = None,
):
    """Attention over a packed batch split across the group: `q [total_local, Hq, D]`, `k`, `v
    [total_local, Hkv, D]` hold chunk `rank` of every sequence, whose local lengths
    `cu_seqlens` (int32 `[B + 1]`, the same on every rank) give; each sequence's whole length
    is W times its local one. Returns this rank's rows of the output (and its LSE `[Hq,
    total_local]` with `return_attn_probs`)."""
    _check_local(q, k, v, 3)
    if not isinstance(cu_seqlens, Tensor) or cu_seqlens.dtype != torch.int32 or cu_seqlens.dim() != 1 or cu_seqlens.device != q.device:
        raise ValueError("`cu_seqlens` must be a 1-D int32 tensor on q's device")
    _agree(group, [("q", _describe(q)), ("k", _describe(k)), ("v", _describe(v)), ("cu_seqlens", cu_seqlens.tolist()), ("causal", bool(causal)),
                   ("softmax_scale", softmax_scale), ("softcap", softcap), ("window_size", tuple(window_size)), ("function", "ring_flash_attn_varlen_func")])
    if k.shape[0] != q.shape[0]:
        raise ValueError(f"`k`: q and k hold the same rows of every sequence; {q.shape[0]} (q) and {k.shape[0]} (k) rows differ")
    options = _options(_FlashArgs(dropout_p, softmax_scale, causal, window_size, softcap, alibi_slopes, deterministic, return_attn_probs), q, ring=False)
    if options.window != NO_WINDOW and not options.causal:
        raise NotImplementedError(f"`window_size` = {window_size} without `causal`: the packed layout runs windows on causal attention only")
    out, lse = _GatheredVarlen.apply(q, k, v, cu_seqlens, options, group)
    return (out, lse, None) if return_attn_probs else out


# ---- the public functions --------------------------------------------------------------


def ring_flash_attn_func(q, k, v, dropout_p=0.0, softmax_scale=None, causal=False, window_size=(-1, -1), softcap=0.0, alibi_slopes=None,
                         deterministic=False, return_attn_probs=False, group=None):
    """Ring attention, contiguous layout: `q [B, S_local, Hq, D]`, `k`, `v [B, S_local, Hkv,
    D]` this rank's chunk of the sequence (`shard(x, group, "contiguous")`). Returns this
    rank's rows of the output (with `return_attn_probs`: `(out, lse [B, Hq, S_local], None)`)."""
    args = _FlashArgs(dropout_p, softmax_scale, causal, window_size, softcap, alibi_slopes, deterministic, return_attn_probs)
    return _ring(q, k, v, args, group, zigzag=False)


def zigzag_ring_flash_attn_func(q, k, v, dropout_p=0.0, softmax_scale=None, causal=False, window_size=(-1, -1), softcap=0.0, alibi_slopes=None,
                                deterministic=False, return_attn_probs=False, group=None):
    """Ring attention, zigzag layout: this rank holds chunks r and 2W-1-r of 2W
    (`shard(x, group, "zigzag")`), so causal work is even across ranks. As
    `ring_flash_attn_func` otherwise."""
    args = _FlashArgs(dropout_p, softmax_scale, causal, window_size, softcap, alibi_slopes, deterministic, return_attn_probs)
    return _ring(q, k, v, args, group, zigzag=True)


def _unpack_kv(kv: Tensor) -> Tuple[Tensor, Tensor]:
    return kv[..., 0, :, :], kv[..., 1, :, :]


def _unpack_qkv(qkv: Tensor) -> Tuple[Tensor, Tensor, Tensor]:
    return qkv[..., 0, :, :], qkv[..., 1, :, :], qkv[..., 2, :, :]


def ring_flash_attn_kvpacked_func(q, kv, dropout_p=0.0, softmax_scale=None, causal=False, window_size=(-1, -1), softcap=0.0, alibi_slopes=None,
                                  deterministic=False, return_attn_probs=False, group=None):
    """`ring_flash_attn_func` with `kv [B, S_local, 2, Hkv, D]`."""
    return ring_flash_attn_func(q, *_unpack_kv(kv), dropout_p, softmax_scale, causal, window_size, softcap, alibi_slopes, deterministic, return_attn_probs, group)


def ring_flash_attn_qkvpacked_func(qkv, dropout_p=0.0, softmax_scale=None, causal=False, window_size=(-1, -1), softcap=0.0, alibi_slopes=None,
                                   deterministic=False, return_attn_probs=False, group=None):
    """`ring_flash_attn_func` with `qkv [B, S_local, 3, H, D]`."""
    return ring_flash_attn_func(*_unpack_qkv(qkv), dropout_p, softmax_scale, causal, window_size, softcap, alibi_slopes, deterministic, return_attn_probs, group)


def zigzag_ring_flash_attn_kvpacked_func(q, kv, dropout_p=0.0, softmax_scale=None, causal=False, window_size=(-1, -1), softcap=0.0, alibi_slopes=None,
                                         deterministic=False, return_attn_probs=False, group=None):
    """`zigzag_ring_flash_attn_func` with `kv [B, S_local, 2, Hkv, D]`."""
    return zigzag_ring_flash_attn_func(q, *_unpack_kv(kv), dropout_p, softmax_scale, causal, window_size, softcap, alibi_slopes, deterministic, return_attn_probs, group)


def zigzag_ring_flash_attn_qkvpacked_func(qkv, dropout_p=0.0, softmax_scale=None, causal=False, window_size=(-1, -1), softcap=0.0, alibi_slopes=None,
                                          deterministic=False, return_attn_probs=False, group=None):
    """`zigzag_ring_flash_attn_func` with `qkv [B, S_local, 3, H, D]`."""
    return zigzag_ring_flash_attn_func(*_unpack_qkv(qkv), dropout_p, softmax_scale, causal, window_size, softcap, alibi_slopes, deterministic, return_attn_probs, group)


def ring_flash_attn_varlen_kvpacked_func(q, kv, cu_seqlens, max_seqlen, dropout_p=0.0, softmax_scale=None, causal=False, window_size=(-1, -1), softcap=0.0,
                                         alibi_slopes=None, deterministic=False, return_attn_probs=False, group=None):
    """`ring_flash_attn_varlen_func` with `kv [total_local, 2, Hkv, D]`."""
    return ring_flash_attn_varlen_func(q, *_unpack_kv(kv), cu_seqlens, max_seqlen, dropout_p, softmax_scale, causal, window_size, softcap, alibi_slopes,
                                       deterministic, return_attn_probs, group)


def ring_flash_attn_varlen_qkvpacked_func(qkv, cu_seqlens, max_seqlen, dropout_p=0.0, softmax_scale=None, causal=False, window_size=(-1, -1), softcap=0.0,
                                          alibi_slopes=None, deterministic=False, return_attn_probs=False, group=None):
    """`ring_flash_attn_varlen_func` with `qkv [total_local, 3, H, D]`."""
    return ring_flash_attn_varlen_func(*_unpack_qkv(qkv), cu_seqlens, max_seqlen, dropout_p, softmax_scale, causal, window_size, softcap, alibi_slopes,
                                       deterministic, return_attn_probs, group)
