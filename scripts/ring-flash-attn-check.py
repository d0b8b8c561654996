#!/usr/bin/env python3
"""ring-flash-attn (context parallelism over flash-attn's low-level API) on top of FlashCore's
flash_attn namespace, against one GPU: each rank holds its slice of the sequence, the ring (or
zigzag ring, or the packed-batch ring) computes attention and its gradients across the ranks,
and every rank compares its slice of out, lse, dq, dk, dv with FlashCore's single-GPU call over
the whole sequence.

    torchrun --nproc_per_node 2 scripts/ring-flash-attn-check.py PATH_TO_RING_FLASH_ATTN

PATH is a checkout (or unpacked sdist) of ring-flash-attn (https://github.com/zhuzilin/
ring-flash-attention, PyPI `ring-flash-attn`): its `ring_flash_attn` package is imported from
there, not vendored. `flashcore.compat.use_as_flash_attn()` runs first, so its `from flash_attn
import ...` gets FlashCore. Bounds: relative L2 error against the single-GPU result, bf16,
1e-2 for out and lse (the ring merges partial outputs in f32: close to one call) and 2e-2 for
the gradients. Exits 1 on any failure, NaN included.
"""
from __future__ import annotations

import os
import sys
import types

import torch
import torch.distributed as dist

BOUND = {"out": 1e-2, "lse": 1e-2, "dq": 2e-2, "dk": 2e-2, "dv": 2e-2}


def rel_l2(got: torch.Tensor, want: torch.Tensor) -> float:
    got, want = got.double(), want.double()
    if not torch.isfinite(got).all():
        return float("inf")
    return ((got - want).norm() / want.norm().clamp_min(1e-30)).item()


def zigzag(x: torch.Tensor, rank: int, world: int, dim: int = 1) -> torch.Tensor:
    """Rank `rank`'s zigzag share of `x`: chunks rank and 2·world - 1 - rank of 2·world."""
    chunks = x.chunk(2 * world, dim=dim)
    return torch.cat([chunks[rank], chunks[2 * world - 1 - rank]], dim=dim)


def main() -> int:
    ring_path = sys.argv[1]
    import flashcore
    import flashcore.compat

    flashcore.compat.use_as_flash_attn()
    # The package's modules without its __init__, which imports its transformers adapter (that
    # needs private names of the transformers versions it was written for): the ring
    # functions themselves import only torch and flash_attn.
    package = types.ModuleType("ring_flash_attn")
    package.__path__ = [os.path.join(ring_path, "ring_flash_attn")]
    sys.modules["ring_flash_attn"] = package
    from ring_flash_attn.ring_flash_attn import ring_flash_attn_func
    from ring_flash_attn.ring_flash_attn_varlen import ring_flash_attn_varlen_func
    from ring_flash_attn.zigzag_ring_flash_attn import zigzag_ring_flash_attn_func

    dist.init_process_group("nccl")
    rank, world = dist.get_rank(), dist.get_world_size()
    device = torch.device(f"cuda:{int(os.environ.get('LOCAL_RANK', rank))}")
    torch.cuda.set_device(device)
    failures = 0
    b, s, h, hkv, d = 1, 3816, 8, 2, 128  # s divisible by 2·world (zigzag)
    for name, causal in [("ring", True), ("ring", False), ("zigzag", True), ("ring_varlen", True)]:
        torch.manual_seed(0)
        q, k, v, dout = (torch.randn(b, s, heads, d, device=device, dtype=torch.bfloat16) for heads in (h, hkv, hkv, h))
        for t in (q, k, v, dout):
            dist.broadcast(t, src=0)
        # One GPU, the whole sequence.
        full = [t.clone().requires_grad_() for t in (q, k, v)]
        out, lse, _ = flashcore.flash_attn_func(*full, causal=causal, return_attn_probs=True)
        out.backward(dout)
        share = (lambda x, dim=1: zigzag(x, rank, world, dim)) if name == "zigzag" else (lambda x, dim=1: x.chunk(world, dim=dim)[rank])
        want = {"out": share(out), "lse": share(lse, 2), "dq": share(full[0].grad), "dk": share(full[1].grad), "dv": share(full[2].grad)}
        # The ring, each rank its share.
        local = [share(t).detach().clone().requires_grad_() for t in (q, k, v)]
        if name == "ring_varlen":  # one packed sequence a rank (ring-flash-attn's varlen form: B = 1)
            n = local[0].shape[1]
            cu = torch.tensor([0, n], dtype=torch.int32, device=device)
            flat = [t[0] for t in local]
            r_out, r_lse, _ = ring_flash_attn_varlen_func(*flat, cu, n, causal=causal, return_attn_probs=True)
            r_out, r_lse = r_out[None], r_lse[None]
        else:
            fn = zigzag_ring_flash_attn_func if name == "zigzag" else ring_flash_attn_func
            r_out, r_lse, _ = fn(*local, causal=causal, return_attn_probs=True)
        r_out.backward(share(dout))
        got = {"out": r_out, "lse": r_lse, "dq": local[0].grad, "dk": local[1].grad, "dv": local[2].grad}
        errors = {key: rel_l2(got[key], want[key].reshape(got[key].shape)) for key in BOUND}
        bad = [key for key, err in errors.items() if not err <= BOUND[key]]
        failures += bool(bad)
        line = "  ".join(f"{key} {err:.2e}" for key, err in errors.items())
        for r in range(world):
            if r == rank:
                print(f"[rank {rank}] {name:12s} causal={causal!s:5s} {line}  {'FAIL ' + ','.join(bad) if bad else 'ok'}", flush=True)
            dist.barrier()
    total = torch.tensor([failures], device=device)
    dist.all_reduce(total)
    if rank == 0:
        print(f"ring-flash-attn on {world} GPUs over FlashCore: {'all matched' if total.item() == 0 else f'{total.item()} failures'}")
    dist.destroy_process_group()
    return int(total.item() != 0)


if __name__ == "__main__":
    sys.exit(main())
