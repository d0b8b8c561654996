#!/usr/bin/env python3
"""Context-parallel scaling of flashcore.distributed: one GPU against W GPUs on the same
sequence, forward and forward + backward, in one torchrun job.

    torchrun --standalone --nproc_per_node W bench/context_parallel.py [--tokens 131072,262144]
        [--hq 32 --hkv 8 --d 128] [--ring-flash-attn PATH] [--torch-cp] [--json OUT]

Llama-style attention by default (Hq 32, Hkv 8, D128, bf16, causal, batch 1). Rank 0 times
FlashCore on one GPU over the whole sequence while the others wait; then every rank runs its
zigzag shard. Each time is the median of `--reps` calls after a warm-up, CUDA events around
each, the slowest rank's. Efficiency = time(1 GPU) / (W x time(W GPUs)). With
`--ring-flash-attn PATH` (a checkout of ring-flash-attn), its zigzag ring on FlashCore's
low-level API (flashcore.compat) runs in the same job for comparison; with `--torch-cp`,
PyTorch's context_parallel over SDPA-cuDNN. `--json OUT` writes rank 0's rows
(`bench/context_parallel_plot.py` draws them).
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import types

import torch
import torch.distributed as dist

import flashcore
from flashcore import distributed as cp


def median_ms(fn, reps: int, before=lambda: None) -> float:
    """Median milliseconds of `fn` over `reps` calls after one warm-up (`before` runs ahead
    of each timed call, outside the timing)."""
    fn()
    times = []
    for _ in range(reps):
        before()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(end))
    return statistics.median(times)


def timed(fn, reps: int) -> float:
    """`median_ms` of a collective `fn` started together on every rank: the slowest rank's."""
    t = torch.tensor([median_ms(fn, reps, before=dist.barrier)], device="cuda")
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return t.item()


def passes(attn, q, k, v, dout):
    """The forward alone, and forward + backward, of `attn` on leaf copies of q, k, v."""
    leaves = [t.detach().requires_grad_() for t in (q, k, v)]

    def forward():
        with torch.no_grad():
            attn(*leaves)

    def forward_backward():
        attn(*leaves).backward(dout)

    return forward, forward_backward


def torch_context_parallel(s: int, args, world: int):
    """PyTorch's context parallelism over SDPA with the cuDNN backend: its buffers `[B, H, S,
    D]` (its native layout) sharded by `context_parallel` (load-balanced for causal), K/V
    expanded to the query heads (its SDPA ring takes equal head counts). The forward alone
    and forward + backward, as `passes` gives them."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor.experimental import context_parallel
    from torch.nn.attention import SDPBackend, sdpa_kernel

    mesh = init_device_mesh("cuda", (world,))
    g = torch.Generator(device="cuda").manual_seed(0)
    q, k, v, dout = (torch.randn(1, args.hq, s, args.d, device="cuda", dtype=torch.bfloat16, generator=g) for _ in range(4))
    cm = context_parallel(mesh, buffers=[q, k, v, dout], buffer_seq_dims=[2, 2, 2, 2])
    cm.__enter__()  # shards the buffers in place; kept for the timing calls

    def attn(q, k, v):
        with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
            return torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)

    return (*passes(attn, q, k, v, dout), cm)


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--tokens", default="131072,262144")
    p.add_argument("--hq", type=int, default=32)
    p.add_argument("--hkv", type=int, default=8)
    p.add_argument("--d", type=int, default=128)
    p.add_argument("--reps", type=int, default=3)
    p.add_argument("--ring-flash-attn", default=None, help="a checkout of ring-flash-attn to compare with")
    p.add_argument("--torch-cp", action="store_true", help="also time PyTorch's context_parallel over SDPA (cuDNN)")
    p.add_argument("--json", default=None, help="write rank 0's rows here")
    args = p.parse_args()
    dist.init_process_group("nccl")
    torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))
    world, rank = dist.get_world_size(), dist.get_rank()
    rfa = None
    if args.ring_flash_attn:
        from flashcore import compat

        compat.use_as_flash_attn()
        # Its modules without its __init__, which imports a transformers adapter written for
        # other transformers versions (scripts/ring-flash-attn-check.py does the same).
        package = types.ModuleType("ring_flash_attn")
        package.__path__ = [os.path.join(args.ring_flash_attn, "ring_flash_attn")]
        sys.modules["ring_flash_attn"] = package
        from ring_flash_attn.zigzag_ring_flash_attn import zigzag_ring_flash_attn_func as rfa  # noqa: N813
    if rank == 0:
        print(f"{torch.cuda.get_device_name()} x{world}; Hq {args.hq}, Hkv {args.hkv}, D{args.d}, bf16, causal, batch 1; median of {args.reps}, CUDA events, slowest rank")
        print("tokens | pass | 1 GPU ms | flashcore W ms | efficiency" + (" | ring-flash-attn W ms" if rfa else "") + (" | torch CP W ms" if args.torch_cp else ""))
    rows = []
    for s in [int(t) for t in args.tokens.split(",")]:
        g = torch.Generator(device="cuda").manual_seed(0)
        shapes = [(1, s, args.hq, args.d), (1, s, args.hkv, args.d), (1, s, args.hkv, args.d), (1, s, args.hq, args.d)]
        whole = [torch.randn(sh, device="cuda", dtype=torch.bfloat16, generator=g) for sh in shapes]
        single = {}
        if rank == 0:
            fwd, fb = passes(lambda q, k, v: flashcore.flash_attn_func(q, k, v, causal=True), *whole)
            for name, fn in (("fwd", fwd), ("fwd+bwd", fb)):
                single[name] = median_ms(fn, args.reps)
            del fwd, fb  # the one-GPU leaves and their gradients: free before the W-GPU runs
        torch.cuda.empty_cache()
        dist.barrier()
        mine = [cp.shard(t, layout="zigzag") for t in whole]
        del whole
        ours = passes(lambda q, k, v: cp.zigzag_ring_flash_attn_func(q, k, v, causal=True), *mine)
        theirs = passes(lambda q, k, v: rfa(q, k, v, causal=True), *mine) if rfa else (None, None)
        torch_cp = (None, None, None)
        if args.torch_cp:
            try:
                torch_cp = torch_context_parallel(s, args, world)
            except Exception as e:  # an experimental API: report, and time the rest
                print(f"rank {rank}: PyTorch's context_parallel did not run: {type(e).__name__}: {e}", flush=True)
        for i, name in enumerate(("fwd", "fwd+bwd")):
            t_w = timed(ours[i], args.reps)
            t_rfa = timed(theirs[i], args.reps) if rfa else None
            t_torch = timed(torch_cp[i], args.reps) if torch_cp[i] else None
            if rank == 0:
                eff = single[name] / (world * t_w)
                extra = "".join(f" | {t:.1f}" for t in (t_rfa, t_torch) if t is not None)
                print(f"{s} | {name} | {single[name]:.1f} | {t_w:.1f} | {eff:.2f}{extra}", flush=True)
                rows.append(dict(world=world, hq=args.hq, hkv=args.hkv, d=args.d, tokens=s, one_gpu_ms=single[name], flashcore_ms=t_w,
                                 ring_flash_attn_ms=t_rfa, torch_cp_ms=t_torch, **{"pass": name}))
        if torch_cp[2] is not None:
            torch_cp[2].__exit__(None, None, None)  # restores its buffers and SDPA
        del mine, torch_cp
        torch.cuda.empty_cache()
    if rank == 0 and args.json:
        with open(args.json, "w") as f:
            json.dump(dict(device=torch.cuda.get_device_name(), gpus=torch.cuda.device_count(), torch=torch.__version__,
                           command=" ".join(sys.argv), method="median of --reps calls after a warm-up, CUDA events, the slowest rank",
                           rows=rows), f, indent=1)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
