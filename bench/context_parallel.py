#!/usr/bin/env python3
"""Context-parallel scaling of flashcore.distributed: one GPU against W GPUs on the same
sequence, forward and forward + backward, in one torchrun job.

    torchrun --standalone --nproc_per_node W bench/context_parallel.py [--tokens 131072,262144]
        [--hq 32 --hkv 8 --d 128] [--ring-flash-attn PATH] [--torch-cp] [--json OUT]

Llama-style attention by default (Hq 32, Hkv 8, D128, bf16, causal, batch 1). Rank 0 times
FlashCore on one GPU over the whole sequence while the others wait; then every rank runs its
zigzag shard. On W GPUs the contenders run in `--reps` interleaved rounds (each once a
round, after a warm-up call of each), CUDA events around each call, the slowest rank's; each
time is the median over rounds and each comparison the median of same-round ratios. The one-GPU
time is the median of `--reps` calls. Efficiency = time(1 GPU) / (W x time(W GPUs)). With
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


def median_ms(fn, reps: int) -> float:
    """Median milliseconds of `fn` over `reps` calls after one warm-up (one GPU)."""
    fn()
    times = []
    for _ in range(reps):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(end))
    return statistics.median(times)


def interleaved(contenders: dict, reps: int) -> dict:
    """Each of `contenders` ({label: fn}, collectives started together on every rank) timed
    once a round, `reps` rounds after a warm-up call of each, so that runs compared met the
    same clock and the same neighbours (single runs of one code moved 5% between jobs): per
    label the milliseconds of each round, the slowest rank's."""
    for fn in contenders.values():
        fn()
    per_round = {label: [] for label in contenders}
    for _ in range(reps):
        for label, fn in contenders.items():
            dist.barrier()
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            fn()
            end.record()
            torch.cuda.synchronize()
            per_round[label].append(start.elapsed_time(end))
    labels = list(per_round)
    slowest = torch.tensor([per_round[label] for label in labels], device="cuda", dtype=torch.float64)
    dist.all_reduce(slowest, op=dist.ReduceOp.MAX)
    return {label: slowest[i].tolist() for i, label in enumerate(labels)}


def paired(mine: list, theirs: list) -> float:
    """The median over rounds of `theirs / mine` (above 1: `mine` is faster)."""
    return statistics.median(b / a for a, b in zip(mine, theirs))


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
        print(f"{torch.cuda.get_device_name()} x{world}; Hq {args.hq}, Hkv {args.hkv}, D{args.d}, bf16, causal, batch 1; median of {args.reps} interleaved rounds, CUDA events, slowest rank")
        print("tokens | pass | 1 GPU ms | flashcore W ms | efficiency" + (" | ring-flash-attn W ms | its time / flashcore's, paired" if rfa else "")
              + (" | torch CP W ms | its time / flashcore's, paired" if args.torch_cp else ""))
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
            contenders = {"flashcore": ours[i]}
            if rfa:
                contenders["ring-flash-attn"] = theirs[i]
            if torch_cp[i]:
                contenders["torch CP"] = torch_cp[i]
            rounds = interleaved(contenders, args.reps)
            if rank == 0:
                t_w = statistics.median(rounds["flashcore"])
                eff = single[name] / (world * t_w)
                row = dict(world=world, hq=args.hq, hkv=args.hkv, d=args.d, tokens=s, one_gpu_ms=single[name], flashcore_ms=t_w, **{"pass": name})
                line = f"{s} | {name} | {single[name]:.1f} | {t_w:.1f} | {eff:.2f}"
                for label, key in (("ring-flash-attn", "ring_flash_attn"), ("torch CP", "torch_cp")):
                    if label in rounds:
                        row[f"{key}_ms"] = statistics.median(rounds[label])
                        row[f"{key}_over_flashcore_paired"] = paired(rounds["flashcore"], rounds[label])
                        line += f" | {row[f'{key}_ms']:.1f} | {row[f'{key}_over_flashcore_paired']:.3f}"
                row["rounds_ms"] = rounds
                print(line, flush=True)
                rows.append(row)
        if torch_cp[2] is not None:
            torch_cp[2].__exit__(None, None, None)  # restores its buffers and SDPA
        del mine, torch_cp
        torch.cuda.empty_cache()
    if rank == 0 and args.json:
        with open(args.json, "w") as f:
            json.dump(dict(device=torch.cuda.get_device_name(), gpus=torch.cuda.device_count(), torch=torch.__version__,
                           command=" ".join(sys.argv), method="W GPUs: median of --reps interleaved rounds (every contender once a round) after a warm-up, CUDA events, the slowest rank; paired = median of same-round ratios; 1 GPU: median of --reps calls",
                           rows=rows), f, indent=1)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
