"""One rank of the context-parallel checks (run by test_distributed.py under torchrun): every
layout's output, LSE and gradients against FlashCore on one GPU over the gathered sequence,
and bad input raising the same error on every rank. Prints one line per check and exits 1 on
any failure (NaN included)."""
from __future__ import annotations

import os
from datetime import timedelta

import torch
import torch.distributed as dist

import flashcore
from flashcore import distributed as cp

from distributed_checks import Tally, rel_l2, ring_errors

checks = Tally({"out": 1e-2, "lse": 1e-3, "dq": 2e-2, "dk": 2e-2, "dv": 2e-2})


def dense_case(layout: str, s: int, hq: int, hkv: int, d: int, causal: bool, softcap: float) -> None:
    g = torch.Generator(device="cuda").manual_seed(1234)
    q, k, v, dout = (torch.randn(1, s, h, d, device="cuda", dtype=torch.bfloat16, generator=g) for h in (hq, hkv, hkv, hq))
    qr, kr, vr = (t.clone().requires_grad_() for t in (q, k, v))
    out, lse, _ = flashcore.flash_attn_func(qr, kr, vr, causal=causal, softcap=softcap, return_attn_probs=True)
    out.backward(dout)
    errors = ring_errors(layout, q, k, v, dout, out, lse, (qr.grad, kr.grad, vr.grad), causal, softcap)
    checks.report(f"{layout} S{s} Hq{hq}/Hkv{hkv} D{d} causal={causal} softcap={softcap}", errors)


def varlen_case(local_lens, hq: int, hkv: int, d: int, causal: bool, window) -> None:
    world, rank = dist.get_world_size(), dist.get_rank()
    g = torch.Generator(device="cuda").manual_seed(99)
    whole_lens = [world * n for n in local_lens]
    total = sum(whole_lens)
    q, k, v, dout = (torch.randn(total, h, d, device="cuda", dtype=torch.bfloat16, generator=g) for h in (hq, hkv, hkv, hq))
    cu_whole = torch.tensor([0] + list(torch.tensor(whole_lens).cumsum(0)), dtype=torch.int32, device="cuda")
    cu_local = torch.tensor([0] + list(torch.tensor(local_lens).cumsum(0)), dtype=torch.int32, device="cuda")
    qr, kr, vr = (t.clone().requires_grad_() for t in (q, k, v))
    out, lse, _ = flashcore.flash_attn_varlen_func(qr, kr, vr, cu_whole, cu_whole, max(whole_lens), max(whole_lens), causal=causal,
                                                   window_size=window, return_attn_probs=True)
    out.backward(dout)
    # Rank r's rows: chunk r of every sequence.
    rows = torch.cat([torch.arange(a + rank * n, a + (rank + 1) * n) for a, n in zip(cu_whole.tolist(), local_lens)]).cuda()
    mine = [t[rows].clone().requires_grad_() for t in (q, k, v)]
    o, l, _ = cp.ring_flash_attn_varlen_func(*mine, cu_local, max(local_lens), causal=causal, window_size=window, return_attn_probs=True)
    o.backward(dout[rows])
    errors = {"out": rel_l2(o, out[rows]), "lse": rel_l2(l, lse[:, rows])}
    for name, mine_t, whole in zip(("dq", "dk", "dv"), mine, (qr, kr, vr)):
        errors[name] = rel_l2(mine_t.grad, whole.grad[rows])
    checks.report(f"varlen local {local_lens} Hq{hq}/Hkv{hkv} D{d} causal={causal} window={window}", errors)


def bad_input() -> None:
    """A mismatch across ranks must raise the same ValueError on every rank."""
    rank = dist.get_rank()
    s = 64 if rank == 0 else 96
    q = torch.randn(1, s, 4, 64, device="cuda", dtype=torch.bfloat16)
    for name, call in (
        ("shapes differ across ranks", lambda: cp.ring_flash_attn_func(q, q, q, causal=True)),
        ("odd zigzag length", lambda: cp.zigzag_ring_flash_attn_func(q[:, :63], q[:, :63], q[:, :63], causal=rank == 5)),
        ("window in a ring", lambda: cp.ring_flash_attn_func(q[:, :64], q[:, :64], q[:, :64], window_size=(8, 0))),
    ):
        try:
            call()
            ok, text = False, "no error"
        except (ValueError, NotImplementedError) as e:
            ok, text = True, str(e).splitlines()[0]
        if ok:
            print(f"rank {rank} ok   bad input, {name}: {text}", flush=True)
        else:
            checks.fail(f"bad input, {name}: {text}")


def main() -> None:
    dist.init_process_group("nccl", timeout=timedelta(seconds=60))
    torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))
    w = dist.get_world_size()
    for layout in ("zigzag", "contiguous"):
        for causal in (True, False):
            dense_case(layout, 4 * w * 129, 8, 2, 128, causal, 0.0)  # lengths not multiples of 128
        dense_case(layout, 2 * w * 1000, 4, 4, 64, True, 30.0)
    for causal, window in ((True, (-1, -1)), (False, (-1, -1)), (True, (100, 0))):
        varlen_case([37, 64, 5, 300], 8, 2, 64, causal, window)
    bad_input()
    checks.finish()


if __name__ == "__main__":
    main()
