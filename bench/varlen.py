#!/usr/bin/env python3
"""Packed (varlen) batches, sliding windows and softcapping through the Python package,
against FlashAttention-2's varlen kernel and against FlashCore's own dense rate, in one
process on one GPU (issue 17's speed goals).

Rows (bf16, 16 heads):
  varlen-*   flashcore's varlen suite's packed batch: 64k tokens in sequences of lengths drawn
             uniformly from 128..8192 (seed 17; the last takes the remainder), read from
             `flashcore bench --suite varlen --list-json` (the one definition of the batch,
             crates/flashcore-cli/src/suites.rs), D128 full and causal, D64 full:
               flashcore   flashcore.flash_attn_varlen_func
               fa2-varlen  torch.ops.aten._flash_attention_forward with cumulative lengths
               dense       flashcore.flash_attn_func on B16 S4096 (the same 64k tokens,
                           one length: the dense rate the packed batch is held to)
  window-*   B1 S16k D128, window (4096, 0) against the causal mask (the same kernel
             family): TFLOPS counted on the visible pairs of each.
  softcap-*  B1 S16k D128 full and causal, softcap 30 against none.
  bwd-varlen-*  the backward alone on the varlen rows' batch (H16, D128 and D64, full and
             causal), from each kernel's own forward's o and lse:
               flashcore        the op flash_attn_varlen_func's backward calls (bwd_sm90's
                                varlen form on Hopper, bwd_sm80's elsewhere)
               fa2-varlen       torch.ops.aten._flash_attention_backward with cumulative lengths
               dense-b16-s4096  flashcore's dense backward of the same 64k tokens (its
                                dispatcher's kernel: bwd_sm90 on Hopper)
               uniform-16x4096  flashcore's varlen backward on 16 sequences of 4096 (the varlen
                                form on the dense shape: what packing costs the kernel itself)
             FLOPs = 2.5 x the forward's (FlashAttention's convention).

Timing: anchors.time_calls (10 warm-up calls, samples of N back-to-back calls between CUDA
events, N chosen for ~20 ms, eager), 3 input sets rotated, median of 20 samples.
FLOPs = 4·H·D·(visible query-key pairs). The packed output is checked against FA2's
(relative L2 error, printed), and so is the packed backward's dq, dk, dv. Writes varlen.json
(rows) into --out; --part forward / backward runs one half.

    varlen.py --out DIR [--part all|forward|backward] [--flashcore BIN]
      (BIN: default $FLASHCORE_BIN, else target/release/flashcore)
"""

import argparse
import json
import os
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import anchors  # noqa: E402
import schema  # noqa: E402


def suite_lengths(binary):
    """The sequence lengths of the varlen suite's packed batch (its first case without
    seqused_k), as `flashcore bench --suite varlen --list-json` lists them."""
    listed = subprocess.run([binary, "bench", "--suite", "varlen", "--list-json"], check=True, capture_output=True, text=True).stdout
    _, cases = schema.parse_suite(listed)
    return next(c["packed"]["seqlens_q"] for c in cases if c.get("packed") and not c["packed"].get("seqused_k"))


def pairs(lens_q, lens_k, causal, window=(-1, -1)):
    """Visible pairs, bottom-right aligned per sequence (window sides -1 = unbounded)."""
    n = 0
    for sq, sk in zip(lens_q, lens_k):
        left, right = window
        if causal:
            right = 0
        for i in range(sq):
            diag = i + sk - sq
            hi = sk - 1 if right < 0 else min(sk - 1, diag + right)
            lo = 0 if left < 0 else max(0, diag - left)
            n += max(0, hi - lo + 1)
    return n


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", required=True)
    ap.add_argument("--samples", type=int, default=20)
    ap.add_argument("--part", choices=["all", "forward", "backward"], default="all")
    ap.add_argument("--flashcore", default=os.environ.get("FLASHCORE_BIN", "target/release/flashcore"))
    args = ap.parse_args(argv)
    lens = suite_lengths(args.flashcore)
    import torch
    import flashcore
    from flashcore import _ops

    dev = torch.device("cuda")
    rows = []

    def timed(name, kernel, fn, sets, flop_pairs, heads, d, flop_factor=1.0, **extra):
        try:
            samples, n = anchors.time_calls(torch, fn, sets, 10, args.samples, 20.0, "eager")
        except Exception as e:  # a refusal is a row, never dropped
            rows.append(dict(name=name, kernel=kernel, status="error", message=str(e)[:300]))
            return None
        samples.sort()
        med = samples[len(samples) // 2]
        tflops = flop_factor * 4 * heads * d * flop_pairs / (med * 1e-3) / 1e12
        rows.append(dict(name=name, kernel=kernel, status="ok", median_ms=med, min_ms=samples[0], max_ms=samples[-1],
                         calls_per_sample=n, tflops=tflops, **extra))
        return med

    def rand(*shape):
        return torch.randn(*shape, device=dev, dtype=torch.bfloat16)

    heads = 16
    cu = torch.tensor([0] + [sum(lens[: i + 1]) for i in range(len(lens))], dtype=torch.int32, device=dev)
    total, max_len = sum(lens), max(lens)
    if args.part in ("all", "backward"):
        backward_rows(torch, flashcore, _ops, timed, rand, rows, lens, cu, heads)
    for d, causal in [(128, False), (128, True), (64, False)] if args.part != "backward" else []:
        tag = f"varlen-d{d}-{'causal' if causal else 'full'}"
        sets = [tuple(rand(total, heads, d) for _ in range(3)) for _ in range(3)]
        p = pairs(lens, lens, causal)
        fc = lambda q, k, v: flashcore.flash_attn_varlen_func(q, k, v, cu, cu, max_len, max_len, causal=causal)  # noqa: E731
        fa = lambda q, k, v: torch.ops.aten._flash_attention_forward(q, k, v, cu, cu, max_len, max_len, 0.0, causal, False)  # noqa: E731
        timed(tag, "flashcore", fc, sets, p, heads, d, sequences=len(lens), tokens=total)
        timed(tag, "fa2-varlen", fa, sets, p, heads, d, sequences=len(lens), tokens=total)
        q, k, v = sets[0]
        try:
            a, b = fc(q, k, v).float(), fa(q, k, v)[0].float()
            rows[-2]["rel_error_vs_fa2"] = ((a - b).norm() / b.norm()).item()
        except Exception as e:
            rows[-2]["rel_error_vs_fa2"] = f"error: {e}"[:200]
        dense = [tuple(rand(16, 4096, heads, d) for _ in range(3)) for _ in range(3)]
        timed(tag, "dense-b16-s4096", lambda q, k, v: flashcore.flash_attn_func(q, k, v, causal=causal), dense,
              16 * pairs([4096], [4096], causal), heads, d)

    s, d = 16384, 128
    sets = [tuple(rand(1, s, heads, d) for _ in range(3)) for _ in range(3)] if args.part != "backward" else []
    if sets:
        timed("window-s16k-d128", "flashcore-window-4096", lambda q, k, v: flashcore.flash_attn_func(q, k, v, window_size=(4096, 0)),
              sets, pairs([s], [s], False, (4096, 0)), heads, d)
        timed("window-s16k-d128", "flashcore-causal", lambda q, k, v: flashcore.flash_attn_func(q, k, v, causal=True),
              sets, pairs([s], [s], True), heads, d)
    for causal in [False, True] if sets else []:
        tag = f"softcap-s16k-d128-{'causal' if causal else 'full'}"
        p = pairs([s], [s], causal)
        timed(tag, "flashcore-softcap-30", lambda q, k, v: flashcore.flash_attn_func(q, k, v, causal=causal, softcap=30.0), sets, p, heads, d)
        timed(tag, "flashcore", lambda q, k, v: flashcore.flash_attn_func(q, k, v, causal=causal), sets, p, heads, d)

    env = anchors.torch_env(torch, " ".join(sys.argv))
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "varlen.json"), "w") as f:
        json.dump(dict(env=env, lengths=lens, rows=rows), f, indent=1)
    print(f"{'case':<28} {'kernel':<24} {'ms':>8} {'TFLOPS':>7}  note")
    for r in rows:
        if r["status"] != "ok":
            print(f"{r['name']:<28} {r['kernel']:<24} {'-':>8} {'-':>7}  {r['status']}: {r.get('message', '')[:80]}")
            continue
        rel = r.get("rel_error_vs_fa2", "")
        note = f"rel vs fa2 {rel:.1e}" if isinstance(rel, float) else ", ".join(f"{k} {v:.1e}" for k, v in rel.items()) if isinstance(rel, dict) else str(rel)
        print(f"{r['name']:<28} {r['kernel']:<24} {r['median_ms']:>8.3f} {r['tflops']:>7.1f}  {note}")


def backward_rows(torch, flashcore, _ops, timed, rand, rows, lens, cu, heads):
    """The bwd-varlen-* rows (see the module's docstring)."""
    total, max_len = sum(lens), max(lens)
    uniform = [4096] * 16
    cu_uniform = torch.arange(0, 16 * 4096 + 1, 4096, dtype=torch.int32, device=cu.device)
    for d, causal in [(128, False), (128, True), (64, False), (64, True)]:
        tag = f"bwd-varlen-d{d}-{'causal' if causal else 'full'}"
        scale = d**-0.5
        flop_pairs = pairs(lens, lens, causal)

        def packed_sets(cu_seqlens, n_max):
            out = []
            for _ in range(3):
                q, k, v, do = (rand(total, heads, d) for _ in range(4))
                o, lse = _ops.varlen_forward(q, k, v, _ops.Batch(cu_seqlens, cu_seqlens, None, n_max, n_max), _ops.Options(scale, causal))
                out.append((q, k, v, o, lse, do))
            return out

        def fc(cu_seqlens, n_max):
            batch = _ops.Batch(cu_seqlens, cu_seqlens, None, n_max, n_max)
            return lambda q, k, v, o, lse, do: _ops.varlen_backward((q, k, v, o, lse), do, batch, _ops.Options(scale, causal))

        sets = packed_sets(cu, max_len)
        timed(tag, "flashcore", fc(cu, max_len), sets, flop_pairs, heads, d, flop_factor=2.5, sequences=len(lens), tokens=total)
        fa_sets = []
        for q, k, v, _, _, do in sets:
            o, lse, seed, offset, _ = torch.ops.aten._flash_attention_forward(q, k, v, cu, cu, max_len, max_len, 0.0, causal, False)
            fa_sets.append((q, k, v, o, lse, do, seed, offset))

        def fa(q, k, v, o, lse, do, seed, offset):
            return torch.ops.aten._flash_attention_backward(do, q, k, v, o, lse, cu, cu, max_len, max_len, 0.0, causal, seed, offset)

        timed(tag, "fa2-varlen", fa, fa_sets, flop_pairs, heads, d, flop_factor=2.5, sequences=len(lens), tokens=total)
        try:
            ours, theirs = fc(cu, max_len)(*sets[0]), fa(*fa_sets[0])
            rows[-2]["rel_error_vs_fa2"] = {n: ((a.float() - b.float()).norm() / b.float().norm()).item() for n, a, b in zip(("dq", "dk", "dv"), ours, theirs)}
        except Exception as e:
            rows[-2]["rel_error_vs_fa2"] = f"error: {e}"[:200]
        dense = []
        for q, k, v, _, _, do in sets:
            q, k, v, do = (t.view(16, 4096, heads, d) for t in (q, k, v, do))
            o, lse = _ops.forward(q, k, v, _ops.Options(scale, causal))
            dense.append((q, k, v, o, lse, do))
        dense_fn = lambda q, k, v, o, lse, do: _ops.backward((q, k, v, o, lse), do, _ops.Options(scale, causal))  # noqa: E731
        timed(tag, "dense-b16-s4096", dense_fn, dense, 16 * pairs([4096], [4096], causal), heads, d, flop_factor=2.5)
        timed(tag, "uniform-16x4096", fc(cu_uniform, 4096), packed_sets(cu_uniform, 4096), 16 * pairs(uniform[:1], uniform[:1], causal), heads, d,
              flop_factor=2.5)
        del sets, fa_sets, dense


if __name__ == "__main__":
    main()
