"""What the context-parallel workers (distributed_worker.py, distributed_llama_worker.py) share:
the relative error they measure and their tally of checks. torchrun runs them as scripts from
this folder, which puts it on their import path."""
from __future__ import annotations

import sys

import torch
import torch.distributed as dist

from flashcore import distributed as cp


def rel_l2(got: torch.Tensor, want: torch.Tensor) -> float:
    """Relative L2 error in float64; infinite when `got` holds a NaN or an infinity."""
    got, want = got.double(), want.double()
    if not torch.isfinite(got).all():
        return float("inf")
    return ((got - want).norm() / want.norm().clamp_min(1e-30)).item()


def ring_errors(layout: str, q, k, v, dout, out, lse, grads, causal: bool, softcap: float) -> dict:
    """The zigzag or contiguous ring (`layout`) on this rank's shards of the whole sequence's
    q, k, v (BSHD) and dout, against the whole sequence's `out`, `lse [B, H, S]` and `grads`
    (dq, dk, dv) sharded alike: relative L2 errors by name."""
    mine = [cp.shard(t, layout=layout).requires_grad_() for t in (q, k, v)]
    fn = cp.zigzag_ring_flash_attn_func if layout == "zigzag" else cp.ring_flash_attn_func
    o, lse_mine, _ = fn(*mine, causal=causal, softcap=softcap, return_attn_probs=True)
    o.backward(cp.shard(dout, layout=layout))
    want_lse = cp.shard(lse.transpose(1, 2), layout=layout).transpose(1, 2)
    errors = {"out": rel_l2(o, cp.shard(out, layout=layout)), "lse": rel_l2(lse_mine, want_lse)}
    for name, t, whole in zip(("dq", "dk", "dv"), mine, grads):
        errors[name] = rel_l2(t.grad, cp.shard(whole, layout=layout))
    return errors


class Tally:
    """One rank's checks: a line for each (rank 0's, and every failure on any rank), then
    `done: N failed`, which test_distributed.py counts once per rank."""

    def __init__(self, bounds: dict):
        self.bounds, self.failures = bounds, 0

    def fail(self, text: str) -> None:
        self.failures += 1
        print(f"rank {dist.get_rank()} FAIL {text}", flush=True)

    def report(self, name: str, errors: dict) -> None:
        """Errors by name, each against its bound (NaN fails: it is not <= anything)."""
        bad = {k: e for k, e in errors.items() if not e <= self.bounds[k]}
        self.failures += bool(bad)
        if dist.get_rank() == 0 or bad:
            text = " ".join(f"{k} {e:.1e}" for k, e in errors.items())
            print(f"rank {dist.get_rank()} {'FAIL' if bad else 'ok  '} {name}: {text}", flush=True)

    def finish(self) -> None:
        """Ends the worker: waits for every rank, prints the tally, leaves the process group
        and exits, 1 on any failure."""
        dist.barrier()
        print(f"rank {dist.get_rank()} done: {self.failures} failed", flush=True)
        dist.destroy_process_group()
        sys.exit(1 if self.failures else 0)
