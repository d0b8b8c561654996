#!/usr/bin/env python3
"""Draws `bench/context_parallel.py --json` rows: one PNG with, for each pass (forward;
forward + backward), the time against tokens (a line per GPU count for FlashCore's zigzag
ring, dotted for ring-flash-attn on the same kernels, dashed for PyTorch's context_parallel
over cuDNN, the one-GPU time in grey) and the scaling efficiency time(1 GPU) / (W x time(W
GPUs)) against tokens, a marker per head layout (GQA, MHA).

    context_parallel_plot.py ROWS.json [ROWS.json ...] --out PNG
    context_parallel_plot.py --self-test      # fake rows, temp dir; no GPU
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile

PASSES = ("fwd", "fwd+bwd")
TITLES = {"fwd": "forward", "fwd+bwd": "forward + backward"}


def load(paths):
    """Every file's rows, and the first file's device name."""
    rows, device = [], None
    for path in paths:
        with open(path) as f:
            doc = json.load(f)
        device = device or doc.get("device")
        rows += doc["rows"]
    return rows, device


def heads(row) -> str:
    return "MHA" if row["hq"] == row["hkv"] else "GQA"


def plot(rows, device, out):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(2, 2, figsize=(11, 8), sharex=True)
    worlds = sorted({r["world"] for r in rows})
    colors = dict(zip(worlds, ("tab:blue", "tab:orange", "tab:green", "tab:red")))
    for col, name in enumerate(PASSES):
        time_ax, eff_ax = axes[0][col], axes[1][col]
        mine = [r for r in rows if r["pass"] == name and heads(r) == "GQA"]
        one = sorted({(r["tokens"], r["one_gpu_ms"]) for r in mine})
        if one:
            time_ax.plot(*zip(*one), color="grey", marker="s", label="1 GPU (FlashCore)")
        for w in worlds:
            of_w = sorted((r for r in mine if r["world"] == w), key=lambda r: r["tokens"])
            tokens = [r["tokens"] for r in of_w]
            for key, style, label in (("flashcore_ms", "-", "FlashCore"), ("ring_flash_attn_ms", ":", "ring-flash-attn"),
                                      ("torch_cp_ms", "--", "PyTorch CP")):
                points = [(t, r[key]) for t, r in zip(tokens, of_w) if r.get(key)]
                if points:
                    time_ax.plot(*zip(*points), style, color=colors[w], marker="o", label=f"{label}, {w} GPUs")
        for r_heads, marker in (("GQA", "o"), ("MHA", "^")):
            for w in worlds:
                of_w = sorted((r for r in rows if r["pass"] == name and r["world"] == w and heads(r) == r_heads), key=lambda r: r["tokens"])
                if of_w:
                    eff = [r["one_gpu_ms"] / (w * r["flashcore_ms"]) for r in of_w]
                    eff_ax.plot([r["tokens"] for r in of_w], eff, marker=marker, color=colors[w], label=f"{r_heads}, {w} GPUs")
        time_ax.set(title=f"{TITLES[name]}, GQA 32/8", ylabel="ms (log)", xscale="log", yscale="log")
        eff_ax.set(title=f"{TITLES[name]}: scaling efficiency", ylabel="time(1) / (W · time(W))", xlabel="tokens (log)", xscale="log",
                   ylim=(0.7, 1.05))
        eff_ax.axhline(0.9, color="grey", lw=0.8, ls=":")
        eff_ax.axhline(0.85, color="grey", lw=0.8, ls=":")
        time_ax.legend(fontsize=7)
        eff_ax.legend(fontsize=7)
    fig.suptitle(f"flashcore.distributed, zigzag ring, D128 bf16 causal, {device}")
    fig.tight_layout()
    fig.savefig(out, dpi=110)
    plt.close(fig)


def self_test() -> None:
    """Fake rows of two GPU counts and both head layouts draw a non-empty PNG."""
    rows = []
    for w in (2, 4):
        for hkv in (8, 32):
            for t in (131072, 262144):
                for name, one in (("fwd", t / 330.0), ("fwd+bwd", t / 80.0)):
                    rows.append(dict(world=w, hq=32, hkv=hkv, d=128, tokens=t, one_gpu_ms=one, flashcore_ms=one / w / 0.95,
                                     ring_flash_attn_ms=one / w / 0.94, torch_cp_ms=None if hkv == 32 else one / w / 0.8, **{"pass": name}))
    with tempfile.TemporaryDirectory() as d:
        src, out = os.path.join(d, "rows.json"), os.path.join(d, "plot.png")
        with open(src, "w") as f:
            json.dump(dict(device="fake GPU", rows=rows), f)
        plot(*load([src]), out)
        size = os.path.getsize(out)
        assert size > 10_000, f"the plot is {size} bytes"
    print("context_parallel_plot self-test: ok")


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("rows", nargs="*")
    p.add_argument("--out")
    p.add_argument("--self-test", action="store_true")
    args = p.parse_args(argv)
    if args.self_test:
        self_test()
        return
    if not args.rows or not args.out:
        p.error("give the rows' JSON files and --out")
    plot(*load(args.rows), args.out)


if __name__ == "__main__":
    sys.exit(main())
