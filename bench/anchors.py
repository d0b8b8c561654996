#!/usr/bin/env python3
"""Anchor timings: PyTorch SDPA with each backend forced, on exactly a flashcore suite's cases.

For every case of a suite (read from `flashcore bench --suite NAME --list-json`, or from a
file holding that output) and every backend

    sdpa-cudnn      SDPBackend.CUDNN_ATTENTION
    sdpa-flash      SDPBackend.FLASH_ATTENTION      (FlashAttention-2)
    sdpa-efficient  SDPBackend.EFFICIENT_ATTENTION  (xFormers' memory-efficient kernel)
    flashcore-py    flashcore.flash_attn_func       (the Python package: same kernels as the
                                                     `flashcore` binary, plus the Python call)
    flashcore-py-det  flashcore-py with deterministic=True (the backward's bitwise mode; timed
                      beside flashcore-py, its ratio on the page is over the default's)
    fa4             flash_attn.cute.flash_attn_func (FlashAttention-4, CuTe DSL: its SM90
                    kernels on H100/H200; BSHD like flashcore; windows and softcaps as its
                    own arguments, no dropout, packed batches not here; the wheels:
                    ../shared/tools/anchor-wheels.sh)
    cudnn-fp8       cuDNN's FP8 SDPA through its frontend (`cudnn.pygraph`'s sdpa_fp8; the
                    same wheels): the e4m3 rows alone (the `fp8` suite), BSHD strides,
                    scalar descales of 1, inference mode, e4m3 output (what cuDNN gives on
                    Hopper), causal only where Sq = Sk (its mask is top-left)

this times one forward pass the way `flashcore bench` does (docs/design.md §9) and writes
`anchors-<suite>-<system>.json` in the schema of `flashcore bench --json` (schema 1).
For the backward suites (`bwd`, `bwd-dims`, `bwd-sinks`) it times the backward alone instead,
`torch.autograd.grad` of one forward (graph retained; TFLOPS at 2.5x the forward's FLOPs),
and a training step's attention (forward and backward: `fwd_bwd_median_ms`), both as
CUDA-graph replays like the forward. A case with `learnable_sink` (the `sinks` suites) runs
flashcore's sinks (`sink_values`) on flashcore-py and fa4 (FA4's `learnable_sink`), their
gradient part of the backward; the SDPA backends refuse it.

One harness: run every backend of a comparison in ONE invocation (one process), e.g.
`--backends cudnn,flash,flashcore-py`: each backend gets its own layout (SDPA contiguous
BHSD, flashcore BSHD: `Runner.native`), every row of every backend is timed the same way,
and with `--rounds R` each case's backends run back to back in each of R rounds, their
samples pooled. Ratios between these rows are fair; a ratio against the `flashcore` binary's
own `bench` (another process) is not: that column is a regression guard.

Conventions, matching flashcore:
- q [B, Sq, Hq, D], k, v [B, Sk, Hkv, D] (BSHD), handed to SDPA as the BHSD view
  `.transpose(1, 2)` (no copy). Same dtype as the case. Fresh standard-normal inputs.
- GQA (Hq != Hkv) via `enable_gqa=True`; a backend that refuses is recorded "unsupported"
  with the exception text and the warnings PyTorch gave, never dropped.
- causal is BOTTOM-RIGHT aligned (FlashAttention >= 2.1). SDPA's `is_causal` is top-left,
  so it is used only when Sq = Sk (where the two agree). For Sq != Sk:
    sdpa-flash      calls the backend's own op `aten._scaled_dot_product_flash_attention`
                    with is_causal=True, which FA2 aligns bottom-right (what CausalBias does);
    sdpa-efficient  calls `aten._efficient_attention_forward` with custom_mask_type=2
                    (causal from the bottom right, what CausalBias does);
    sdpa-cudnn      gets an explicit boolean bottom-right mask through SDPA.
  Whatever the path, the output is checked against the bottom-right reference, so a
  misaligned mask shows as a large rel_error. Seen on an H100 (torch 2.11, cuDNN 9.19):
  all three agree with the reference for Sq < Sk; for Sq > Sk cuDNN and FA2 agree, and the
  efficient kernel's custom_mask_type=2 does not (rel_error 0.52 on the rows that see keys),
  so those rows come out "error". The efficient backend takes no GQA (-> "unsupported").
- Timing: input sets rotated while 4 sets would fit in L2 (up to 8 sets); 10 warm-up calls;
  one call timed to choose N calls per sample (~2 ms a sample, 1..1000); the graph replayed
  for 300 ms to settle the clock at this row's load; >= 20 samples (default 30), each the
  mean of N back-to-back calls between two CUDA events; median, min, max; the backends'
  order rotated per round and row. By default the N calls are captured once in a CUDA graph and the graph is replayed
  (Python's per-call overhead of ~10-30 us would otherwise dominate the short cases); the
  plain eager median is recorded beside it (`eager_median_ms`). `--timing eager` times eager
  calls only; `--timing profiler` sums the device time of every kernel of N calls
  (torch.profiler, CUDA activity) a sample, for a run with a library whose calls a CUDA
  graph cannot capture (every column of that run timed so: a ratio needs one method).
- FLOPs = 4·B·Hq·D·(visible pairs): Sq·Sk dense; Sq·Sk/2 for causal with Sq = Sk; the exact
  bottom-right count for causal with Sq != Sk. For Sq = 1, gbps = bytes of K and V / time.
  A case's `counts` (flops, kv_bytes), which `flashcore bench --list-json` writes, are used
  as they are; a window's or a packed batch's come only from there (the library counts
  their visible pairs, per sequence for a packed batch).
- Windows, softcap, packed batches (`flashcore bench --window L,R / --softcap X` through this
  script's --window / --softcap; the suite `varlen`): sdpa-flash runs FA2 through
  `aten._flash_attention_forward`, with window_size for a window and with cumulative sequence
  lengths (and seqused_k) for a packed batch, on exactly the lengths flashcore lists;
  cuDNN and the efficient kernel get a window as a boolean mask and refuse packed batches
  (nested tensors only, not an anchor); no SDPA backend has a softcap (refused);
  flashcore-py passes all of it to flash_attn_func / flash_attn_varlen_func. The output
  file is then anchors-<suite>[-win<L>_<R>][-cap<X>]-<system>.json.
- Dropout (`--dropout P`, every backend; output file anchors-<suite>[...]-drop<P>-<system>.json):
  SDPA's `dropout_p` (FA2's own dropout path under sdpa-flash, PyTorch's generator),
  flashcore's `dropout_p`; every backend draws its masks inside the call, so CUDA-graph
  replays time the real thing. A random mask has no reference: such rows check only that
  the output is finite (rel_error none).
- rel_error = ||out - ref||_2 / ||ref||_2 on the first input set, the reference computed in
  float64 on the GPU from the same (rounded) inputs, on a slice (<= 2 batches, <= 4 query
  heads, <= 512 query rows: the first and last 256) so huge shapes stay cheap; a packed
  batch: the sequence with the most keys and the last one, each alone. Rows that see
  no key (causal, Sq > Sk) are left out: their output is a convention, not a result.

Usage:
    anchors.py --suite sweep --backends cudnn,flash,flashcore-py --rounds 2 [--out-dir DIR]
    anchors.py --suite bwd --backends cudnn,flash,flashcore-py --rounds 2
    anchors.py --suite varlen --backends flash,flashcore-py     # FA2 varlen on the same batch
    anchors.py --suite bwd --window 4096,0 --filter sk16384 --backends flash
    anchors.py --suite-json suite.json [--backends cudnn,flash,efficient] [--out-dir DIR]
    anchors.py --self-test        # pure functions; needs neither a GPU nor torch
"""

import argparse
import contextlib
import datetime
import json
import math
import os
import platform
import subprocess
import sys
import time
import traceback
import warnings

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from schema import (  # noqa: E402  (the pure half, shared with report.py)
    SYSTEMS,
    ROW_FIELDS,
    visible_pairs,
    pairs_closed,
    flops,
    kv_bytes,
    storage_lengths,
    min_bytes,
    packed_used_k,
    cumulative,
    BACKWARD_SUITES,
    metrics,
    input_sets,
    bottom_right_allowed,
    bottom_right_mask,
    case_window,
    window_mask,
    check_rows,
    check_heads,
    normalize_case,
    parse_suite,
    make_row,
    make_report,
    validate_report,
    write_json,
    finite_or_none,
)

# ----------------------------------------------------------------------------------------
# GPU side (torch imported lazily).


def torch_env(torch, command):
    props = torch.cuda.get_device_properties(0)
    driver = None
    try:
        driver = subprocess.run(
            ["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader", "-i", "0"], capture_output=True, text=True, timeout=30
        ).stdout.strip() or None
    except Exception:
        pass
    cuda_driver_api = None
    try:
        import ctypes

        v = ctypes.c_int()
        ctypes.CDLL("libcuda.so.1").cuDriverGetVersion(ctypes.byref(v))
        cuda_driver_api = f"{v.value // 1000}.{v.value % 1000 // 10}"
    except Exception:
        pass
    cudnn = torch.backends.cudnn.version()
    return {
        "device": torch.cuda.get_device_name(0),
        "sm": f"sm_{props.major}{props.minor}",
        "sm_count": props.multi_processor_count,
        "l2_bytes": getattr(props, "L2_cache_size", None),
        "driver": driver,
        "cuda_driver_api": cuda_driver_api,
        "cuda_runtime": torch.version.cuda,
        "torch": torch.__version__,
        "cudnn": f"{cudnn // 10000}.{cudnn % 10000 // 100}.{cudnn % 100}" if cudnn and cudnn >= 10000 else cudnn,
        "python": platform.python_version(),
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "command": command,
    }


# What the fa4 backend does not take: recorded "unsupported" (`refusal`).
FA4_PACKED = "packed batches not supported here: FA4's varlen function is not wired into this harness"
FA4_DROPOUT = "dropout not supported by FlashAttention-4"
# Chunked attention, refused by every backend here: no anchor has its backward (FA3's forward
# only; FA4, cuDNN and SDPA none), and flashcore's rows of it compare with its own causal rows.
CHUNK_REFUSAL = "chunked attention not supported here: time it with `flashcore bench --suite chunked` (or bwd-chunked)"
# Learnable sinks (the `sinks` suites): flashcore and FA4 take them (FA4's `learnable_sink`);
# PyTorch's SDPA backends have none.
SINKS_REFUSAL = "learnable sinks not supported here: flashcore-py and fa4 take them"
# e4m3 rows (the `fp8` suite): flashcore-py (FlashAttention-3's FP8 flash_attn_func in
# flashcore.compat: bf16 output, descales of 1) and cudnn-fp8 take them; SDPA and FA4 (no FP8
# on Hopper) do not, and cudnn-fp8 takes nothing else.
FP8_REFUSAL = "e4m3 inputs not supported here: flashcore-py and cudnn-fp8 take them"
# An e4m3 row's error: P rounded to 3 mantissa bits (2-3% on normal inputs), and cuDNN's e4m3
# output once more.
FP8_MAX_REL_ERROR = 0.1
FP8_ONLY = "16-bit rows not supported by cudnn-fp8 (the e4m3 rows alone)"
FP8_CAUSAL = "causal with Sq != Sk not supported by cudnn-fp8 (its causal mask is top-left)"
# FlashAttention-3's qv (the `value-dim-fa3` suite): no anchor here has it (FA3 is not among
# them; FA4 takes qv on Blackwell alone), so its rows are the binary's own comparison.
QV_REFUSAL = "qv not supported here: time it with `flashcore bench --suite value-dim-fa3`"


def sink_values(heads):
    """The sinks `flashcore bench` puts on a case with `learnable_sink` (its `cases::sink_values`),
    one a query head, spread over [-1, 8)."""
    return [math.fmod(h * 2.7, 9.0) - 1.0 for h in range(heads)]


class Runner:
    """Builds the call for one (backend, case) and runs it with the backend forced.

    Beyond the dense causal/full cases: a window goes to FA2 as its own window_size (through
    `aten._flash_attention_forward`) and to cuDNN and the efficient kernel as a boolean mask;
    a packed batch goes to FA2's varlen path (`aten._flash_attention_forward` with cumulative
    sequence lengths and seqused_k) and to `flashcore.flash_attn_varlen_func`; a softcap only
    to flashcore (no SDPA backend has one). What a backend does not take raises a refusal,
    recorded "unsupported"."""

    def __init__(self, torch, key, case):
        from torch.nn.attention import SDPBackend, sdpa_kernel

        self.torch, self.key, self.case = torch, key, case
        self.system, backend_name = SYSTEMS[key]
        if backend_name is None:
            self.ctx = contextlib.nullcontext
        else:
            self.ctx = lambda: sdpa_kernel([getattr(SDPBackend, backend_name)])
        c = case
        self.gqa = c["heads_q"] != c["heads_kv"]
        self.scale = 1.0 / math.sqrt(c["head_dim"])
        self.window = tuple(c["window"]) if c.get("window") is not None else None
        self.softcap = c.get("softcap") or 0.0
        self.packed = c.get("packed")
        self.bottom_right = c["causal"] and c["seqlen_q"] != c["seqlen_k"]
        self.dropout = c.get("dropout") or 0.0
        self.mask = None
        self.refuse = None
        self.kernel = self.system
        self.flashcore = key in ("flashcore-py", "flashcore-py-det")
        self.fa4 = key == "fa4"
        self.e4m3 = c["dtype"] == "e4m3"
        self.cudnn_fp8 = key == "cudnn-fp8"
        if c.get("attention_chunk"):
            self.refuse = CHUNK_REFUSAL
        elif c.get("qv"):
            self.refuse = QV_REFUSAL
        elif self.e4m3 and self.flashcore:
            self.kernel = "flashcore.compat.flash_attn_3.flash_attn_func (e4m3)"
        elif self.e4m3 and self.cudnn_fp8:
            self.kernel = "cudnn.pygraph.sdpa_fp8"
            self.refuse = FP8_CAUSAL if self.bottom_right else None
        elif self.e4m3 or self.cudnn_fp8:
            self.refuse = FP8_REFUSAL if self.e4m3 else FP8_ONLY
        elif self.flashcore:
            self.kernel = "flashcore.flash_attn_varlen_func" if self.packed else "flashcore.flash_attn_func"
        elif self.fa4:
            self.kernel = "flash_attn.cute.flash_attn_func"
            self.refuse = FA4_PACKED if self.packed else FA4_DROPOUT if self.dropout else None
        elif self.softcap:
            self.refuse = "logit softcap not supported by PyTorch's SDPA backends"
        elif self.packed and key != "flash":
            self.refuse = f"packed batches not supported here: {self.system} takes them only as nested tensors through SDPA"
        elif key == "flash" and (self.packed or self.window):
            self.kernel = "aten._flash_attention_forward" + (" (varlen)" if self.packed else " (window_size)")
        elif self.window:
            self.kernel = f"{self.system}+window-mask"
            self.mask = window_mask(c["seqlen_q"], c["seqlen_k"], case_window(c), torch_arange(torch))
        elif self.bottom_right and key == "flash":
            self.kernel = "aten._scaled_dot_product_flash_attention(is_causal=bottom-right)"
        elif self.bottom_right and key == "efficient":
            self.kernel = "aten._efficient_attention_forward(custom_mask_type=2)"
        elif self.bottom_right:
            self.kernel = f"{self.system}+bool-mask"
            self.mask = bottom_right_mask(c["seqlen_q"], c["seqlen_k"], torch_arange(torch))
        self.sinks = None
        if c.get("learnable_sink") and not self.refuse:
            if self.flashcore or self.fa4:
                self.sinks = torch.tensor(sink_values(c["heads_q"]), dtype=torch.float32, device="cuda")
            else:
                self.refuse = SINKS_REFUSAL
        if self.packed:
            cuda = lambda x: torch.tensor(x, dtype=torch.int32, device="cuda")  # noqa: E731
            p = self.packed
            self.cu_q, self.cu_k = cuda(cumulative(p["seqlens_q"])), cuda(cumulative(p["seqlens_k"]))
            self.used = cuda(p["seqused_k"]) if p.get("seqused_k") else None

    def _window_args(self):
        left, right = self.window or (-1, -1)
        return {"window_size_left": left, "window_size_right": 0 if self.case["causal"] else right}

    def __call__(self, q, k, v):
        """q, k, v: BHSD views (packed: [total, H, D]). Returns o in the same layout."""
        if self.refuse:
            raise RuntimeError(self.refuse)
        F = self.torch.nn.functional
        ops = self.torch.ops.aten
        c = self.case
        if self.e4m3 and self.flashcore:
            from flashcore.compat.flash_attn_3 import flash_attn_func as fa3_func

            bshd = (t.transpose(1, 2) for t in (q, k, v))
            return fa3_func(*bshd, softmax_scale=self.scale, causal=c["causal"], window_size=self.window or (-1, -1)).transpose(1, 2)
        if self.cudnn_fp8:
            return self._cudnn_fp8(q, k, v)
        if self.flashcore:
            import flashcore

            kw = dict(softmax_scale=self.scale, causal=c["causal"], window_size=self.window or (-1, -1), softcap=self.softcap)
            kw["deterministic"] = self.key == "flashcore-py-det"
            kw["dropout_p"] = self.dropout
            if self.sinks is not None:
                kw["learnable_sink"] = self.sinks
            if self.packed:
                return flashcore.flash_attn_varlen_func(q, k, v, self.cu_q, self.cu_k, c["seqlen_q"], c["seqlen_k"], seqused_k=self.used, **kw)
            bshd = (t.transpose(1, 2) for t in (q, k, v))
            return flashcore.flash_attn_func(*bshd, **kw).transpose(1, 2)
        if self.fa4:
            from flash_attn.cute import flash_attn_func as fa4_func

            left, right = self.window or (-1, -1)
            window = (None if left < 0 else left, None if right < 0 or c["causal"] else right)
            bshd = (t.transpose(1, 2) for t in (q, k, v))
            sinks = {} if self.sinks is None else {"learnable_sink": self.sinks}
            out = fa4_func(*bshd, softmax_scale=self.scale, causal=c["causal"], window_size=window, softcap=self.softcap, **sinks)
            # Some FA4 releases return (out, lse), others out alone.
            return (out[0] if isinstance(out, tuple) else out).transpose(1, 2)
        if self.key == "flash" and self.packed:
            extra = self._window_args() if self.window else {}
            return ops._flash_attention_forward(
                q, k, v, self.cu_q, self.cu_k, c["seqlen_q"], c["seqlen_k"], self.dropout, c["causal"], False, scale=self.scale, seqused_k=self.used, **extra
            )[0]
        if self.key == "flash" and self.window:
            bshd = [t.transpose(1, 2) for t in (q, k, v)]
            o = ops._flash_attention_forward(*bshd, None, None, c["seqlen_q"], c["seqlen_k"], self.dropout, c["causal"], False, scale=self.scale, **self._window_args())[0]
            return o.transpose(1, 2)
        if self.bottom_right and self.key == "flash" and self.mask is None:
            return ops._scaled_dot_product_flash_attention(q, k, v, self.dropout, is_causal=True, return_debug_mask=False, scale=self.scale)[0]
        if self.bottom_right and self.key == "efficient" and self.mask is None:
            if self.gqa:
                raise RuntimeError("bottom-right causal through aten._efficient_attention_forward needs Hq == Hkv here")
            o = ops._efficient_attention_forward(
                q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), None, None, None, None, None, self.dropout, 2, False, scale=self.scale
            )[0]
            return o.transpose(1, 2)
        kw = {"scale": self.scale, "dropout_p": self.dropout}
        if self.gqa:
            kw["enable_gqa"] = True
        if self.mask is not None:
            return F.scaled_dot_product_attention(q, k, v, attn_mask=self.mask, **kw)
        return F.scaled_dot_product_attention(q, k, v, is_causal=c["causal"], **kw)

    def _cudnn_fp8(self, q, k, v):
        """cuDNN's FP8 SDPA on the BSHD storage under `q`, `k`, `v` (BHSD views): its graph built
        on the first call of the case (the input sets share one layout), scalar descales and
        scales of 1, e4m3 output; returns the output's BHSD view."""
        import cudnn

        torch = self.torch
        if getattr(self, "_graph", None) is None:
            self._handle = cudnn.create_handle()
            e4m3, f32 = cudnn.data_type.FP8_E4M3, cudnn.data_type.FLOAT
            graph = cudnn.pygraph(io_data_type=e4m3, intermediate_data_type=f32, compute_data_type=f32, handle=self._handle)
            tensors = [graph.tensor(name=n, dim=list(t.shape), stride=list(t.stride()), data_type=e4m3) for n, t in zip("qkv", (q, k, v))]
            scalars = [graph.tensor(name=n, dim=[1, 1, 1, 1], stride=[1, 1, 1, 1], data_type=f32) for n in ("dq", "dk", "dv", "ds", "ss", "so")]
            o, _, amax_s, amax_o = graph.sdpa_fp8(
                q=tensors[0], k=tensors[1], v=tensors[2], descale_q=scalars[0], descale_k=scalars[1], descale_v=scalars[2],
                descale_s=scalars[3], scale_s=scalars[4], scale_o=scalars[5], is_inference=True, attn_scale=self.scale,
                use_causal_mask=self.case["causal"], name="sdpa_fp8",
            )  # fmt: skip
            self._out = torch.empty_like(q.transpose(1, 2)).transpose(1, 2)  # BSHD storage, BHSD view, e4m3
            o.set_output(True).set_dim(list(self._out.shape)).set_stride(list(self._out.stride())).set_data_type(e4m3)
            self._amax = [torch.empty(1, 1, 1, 1, dtype=torch.float32, device="cuda") for _ in range(2)]
            for t in (amax_s, amax_o):
                t.set_output(True).set_dim([1, 1, 1, 1]).set_stride([1, 1, 1, 1]).set_data_type(f32)
            graph.validate()
            graph.build_operation_graph()
            graph.create_execution_plans([cudnn.heur_mode.A, cudnn.heur_mode.FALLBACK])
            graph.check_support()
            graph.build_plans()
            one = torch.ones(1, 1, 1, 1, dtype=torch.float32, device="cuda")
            self._graph, self._tensors, self._scalars, self._one = graph, tensors, scalars, one
            self._io = (o, amax_s, amax_o)
            self._workspace = torch.empty(graph.get_workspace_size(), dtype=torch.uint8, device="cuda")
        o, amax_s, amax_o = self._io
        pack = {t: x for t, x in zip(self._tensors, (q, k, v))}
        pack.update({s: self._one for s in self._scalars})
        pack.update({o: self._out, amax_s: self._amax[0], amax_o: self._amax[1]})
        cudnn.set_stream(handle=self._handle, stream=torch.cuda.current_stream().cuda_stream)
        self._graph.execute(pack, self._workspace, handle=self._handle)
        return self._out

    def native(self, q, k, v):
        """The inputs in this backend's own layout, from `make_inputs`' BHSD views of BSHD
        storage: flashcore takes BSHD, so it keeps them (and transposes the views back);
        PyTorch's SDPA takes contiguous BHSD, so it gets contiguous copies. Each side is timed on
        the layout it is fastest on, as a user would call it. A packed batch is [total, H, D]
        for every backend."""
        if self.flashcore or self.fa4 or self.cudnn_fp8 or self.packed:
            return q, k, v
        return tuple(t.contiguous() for t in (q, k, v))

    def forced(self, q, k, v):
        with self.ctx():
            return self(q, k, v)


def torch_arange(torch):
    class _XP:
        @staticmethod
        def arange(n):
            return torch.arange(n, device="cuda")

    return _XP


def make_inputs(torch, case, seed):
    """Standard-normal q, k, v (BHSD views of BSHD storage) in the case's dtype; e4m3: drawn in
    bf16 and rounded (their values are the inputs the reference takes)."""
    if case["dtype"] == "e4m3":
        q, k, v = make_inputs(torch, dict(case, dtype="bf16"), seed)
        return tuple(t.to(torch.float8_e4m3fn) for t in (q, k, v))
    dt = {"bf16": torch.bfloat16, "f16": torch.float16}[case["dtype"]]
    g = torch.Generator(device="cuda").manual_seed(seed)
    b, sq, sk, hq, hkv, d = (case[f] for f in ("batch", "seqlen_q", "seqlen_k", "heads_q", "heads_kv", "head_dim"))
    if case.get("packed") is not None:
        rows, keys = storage_lengths(case)
        return tuple(torch.randn(n, h, d, device="cuda", dtype=dt, generator=g) for n, h in ((rows, hq), (keys, hkv), (keys, hkv)))
    q = torch.randn(b, sq, hq, d, device="cuda", dtype=dt, generator=g)
    k = torch.randn(b, sk, hkv, d, device="cuda", dtype=dt, generator=g)
    v = torch.randn(b, sk, hkv, case.get("head_dim_v") or d, device="cuda", dtype=dt, generator=g)
    return q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)  # BHSD views of BSHD storage


def reference_head(torch, case, q, k, v, rows, sink=None):
    """float64 output of query rows `rows` (a tensor) of one head, q [Sq, D], k, v [Sk, D]:
    the case's scale, softcap (scores become softcap·tanh(s / softcap)) and mask; with the
    head's learnable `sink`, one more logit a row with no value."""
    sq, sk = q.shape[0], k.shape[0]
    s = (q.index_select(0, rows).double() @ k.double().T) / math.sqrt(case["head_dim"])
    cap = case.get("softcap") or 0.0
    if cap:
        s = cap * torch.tanh(s / cap)
    window = case_window(case)
    if window is not None:
        s = s.masked_fill(~window_mask(sq, sk, window, torch_arange(torch), rows), float("-inf"))
    if sink is not None:
        p = torch.softmax(torch.cat([s, s.new_full((s.shape[0], 1), sink)], dim=-1), dim=-1)[:, :-1]
        return p @ v.double()
    p = torch.softmax(s, dim=-1).nan_to_num(0.0)  # fully masked rows: 0, as flashcore
    return p @ v.double()


def reference_rel_error(torch, case, q, k, v, o):
    """||o - ref|| / ||ref|| on a slice; ref in float64 on the GPU, bottom-right aligned masks.
    A packed batch: the sequence with the most keys and the last one (what a wrong offset
    breaks first), each against the reference on that sequence alone."""
    group = case["heads_q"] // case["heads_kv"]
    sinks = sink_values(case["heads_q"]) if case.get("learnable_sink") else None
    if case["dtype"] == "e4m3":  # few ops take float8: widen (exactly) first
        q, k, v, o = (t.float() for t in (q, k, v, o))
    pieces = []  # (q [Sq, Hq, D], k, v [Sk, Hkv, D], o) of one batch entry or sequence
    p = case.get("packed")
    if p is not None:
        used, cu_q, cu_k = packed_used_k(p), cumulative(p["seqlens_q"]), cumulative(p["seqlens_k"])
        longest = max(range(len(used)), key=lambda b: used[b])
        for b in sorted({longest, len(used) - 1}):
            qs, ks = slice(cu_q[b], cu_q[b + 1]), slice(cu_k[b], cu_k[b] + used[b])
            pieces.append((q[qs], k[ks], v[ks], o[qs]))
    else:
        pieces = [(q[b].transpose(0, 1), k[b].transpose(0, 1), v[b].transpose(0, 1), o[b].transpose(0, 1)) for b in range(min(case["batch"], 2))]
    num = den = 0.0
    for qb, kb, vb, ob in pieces:
        sq, sk = qb.shape[0], kb.shape[0]
        rows = check_rows(sq, sk=sk, causal=case["causal"])
        if not rows or sk == 0:
            continue
        rows = torch.tensor(rows, device="cuda")
        for h in check_heads(case["heads_q"], case["heads_kv"]):
            ref = reference_head(torch, case, qb[:, h], kb[:, h // group], vb[:, h // group], rows, None if sinks is None else sinks[h])
            got = ob[:, h].index_select(0, rows).double()
            num += (got - ref).pow(2).sum().item()
            den += ref.pow(2).sum().item()
    if not math.isfinite(num):
        return float("nan")
    return math.sqrt(num / den) if den > 0 else math.sqrt(num)


class SmClock:
    """The GPU's current SM clock in MHz through NVML (the driver's libnvidia-ml, by ctypes:
    no package needed), for the rows' `sm_clock_mhz`: the clock right after the settle and
    right after the samples, so that a page can say at what clock each backend ran (the H100's
    follows its power cap). `read()` is None where NVML is not there (`why` says so); the
    device is found by its PCI bus id, so CUDA_VISIBLE_DEVICES cannot swap it."""

    NVML_CLOCK_SM = 1

    def __init__(self, torch=None, device=0):
        import ctypes

        self.handle, self.why = None, None
        try:
            self.nvml = ctypes.CDLL("libnvidia-ml.so.1")
            if self.nvml.nvmlInit_v2() != 0:
                raise OSError("nvmlInit_v2 failed")
            handle = ctypes.c_void_p()
            if torch is not None and hasattr(torch.cuda.get_device_properties(device), "pci_bus_id"):
                props = torch.cuda.get_device_properties(device)
                bus = f"{props.pci_domain_id:08X}:{props.pci_bus_id:02X}:{props.pci_device_id:02X}.0".encode()
                rc = self.nvml.nvmlDeviceGetHandleByPciBusId_v2(ctypes.c_char_p(bus), ctypes.byref(handle))
            else:
                rc = self.nvml.nvmlDeviceGetHandleByIndex_v2(ctypes.c_uint(device), ctypes.byref(handle))
            if rc != 0:
                raise OSError(f"no NVML handle for the device (NVML error {rc})")
            self.handle, self.ctypes = handle, ctypes
        except OSError as e:
            self.why = f"SM clock not recorded: {e}"

    def read(self):
        if self.handle is None:
            return None
        mhz = self.ctypes.c_uint()
        rc = self.nvml.nvmlDeviceGetClockInfo(self.handle, self.ctypes.c_uint(self.NVML_CLOCK_SM), self.ctypes.byref(mhz))
        return int(mhz.value) if rc == 0 else None


def calls_per_sample(one_ms, target_ms):
    """N back-to-back calls a sample: about `target_ms` of work, 1..1000 calls."""
    return int(min(1000, max(1, math.ceil(target_ms / max(one_ms, 1e-4)))))


def replay_samples(g, stream, n, samples, settle_ms, clocks=None):
    """Samples of graph `g` (N calls) on `stream`, in ms a call. First `g` is replayed for
    `settle_ms`, so that the samples see the SM clock this row's own load holds under the power
    cap, not the clock the previous row left (on an H100 a 16k forward read 3.1 ms settled and
    3.4 ms right after FlashAttention-2's rows). With `clocks` = (an `SmClock`, a list), the
    SM clock after the settle and after the samples is appended to the list."""
    import torch

    t0 = time.perf_counter()
    while True:
        g.replay()
        stream.synchronize()
        if (time.perf_counter() - t0) * 1e3 >= settle_ms:
            break
    if clocks is not None:
        clocks[1].append(clocks[0].read())
    ev0, ev1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    out = []
    for _ in range(samples):
        ev0.record(stream)
        g.replay()
        ev1.record(stream)
        ev1.synchronize()
        out.append(ev0.elapsed_time(ev1) / n)
    if clocks is not None:
        clocks[1].append(clocks[0].read())
    return out


def kernel_time_samples(torch, run, n, samples):
    """Device time a call (ms) by torch.profiler: per sample, `run(n)` (n calls) traced with
    CUDA activity alone, the device times of every kernel of the trace summed and divided by
    n; the gaps between kernels and the host's pace do not count. For a library whose calls a
    CUDA graph cannot capture: every column of such a run is timed so (`--timing profiler`),
    one method for all (docs/design.md §9)."""
    from torch.profiler import ProfilerActivity, profile

    out = []
    for _ in range(samples):
        torch.cuda.synchronize()
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            run(n)
            torch.cuda.synchronize()
        us = sum(e.device_time for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA)
        out.append(us / n / 1000.0)
    return out


def time_calls(torch, fn, sets, warmup, samples, target_ms, method, settle_ms=300.0, clocks=None):
    """Returns (samples_ms, calls_per_sample): each sample the mean of N back-to-back calls,
    by `method`: "graph" (N calls captured once and replayed), "eager" (CUDA events around N
    calls) or "profiler" (`kernel_time_samples`); `clocks` as in `replay_samples`."""
    stream = torch.cuda.current_stream()
    ev0, ev1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    n_sets = len(sets)

    def eager(n, start=0):
        ev0.record(stream)
        for i in range(n):
            fn(*sets[(start + i) % n_sets])
        ev1.record(stream)
        ev1.synchronize()
        return ev0.elapsed_time(ev1)

    eager(warmup)
    n = calls_per_sample(eager(1), target_ms)
    if method == "profiler":
        return kernel_time_samples(torch, eager, n, samples), n
    if method == "eager":
        return [eager(n) / n for _ in range(samples)], n
    g = torch.cuda.CUDAGraph()
    side = torch.cuda.Stream()
    side.wait_stream(stream)
    with torch.cuda.stream(side):  # a few calls on a side stream first, as PyTorch asks
        for i in range(3):
            fn(*sets[i % n_sets])
    stream.wait_stream(side)
    with torch.cuda.graph(g):
        for i in range(n):
            fn(*sets[i % n_sets])
    return replay_samples(g, stream, n, samples, settle_ms, clocks), n


def time_on_stream(torch, fn, stream, warmup, samples, target_ms, method, settle_ms=300.0, clocks=None):
    """`time_calls` for work that must stay on `stream`: autograd runs a backward on the
    stream its forward ran on, so the forward, the warm-up, the capture and the replays all
    use `stream` (a side stream: the legacy default stream cannot be captured). Returns
    (samples_ms, calls_per_sample), by `method` as `time_calls`."""
    ev0, ev1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    with torch.cuda.stream(stream):

        def eager(n):
            ev0.record(stream)
            for _ in range(n):
                fn()
            ev1.record(stream)
            ev1.synchronize()
            return ev0.elapsed_time(ev1)

        eager(warmup)
        n = calls_per_sample(eager(1), target_ms)
        if method == "profiler":
            return kernel_time_samples(torch, eager, n, samples), n
        if method == "eager":
            return [eager(n) / n for _ in range(samples)], n
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g, stream=stream):
            for _ in range(n):
                fn()
        return replay_samples(g, stream, n, samples, settle_ms, clocks), n


def exception_text(e, caught):
    msg = f"{type(e).__name__}: {str(e).strip()}"
    notes = []
    for w in caught:
        t = clean_warning(str(w.message))
        if t and t not in notes:
            notes.append(t)
    if notes:
        msg += " | warnings: " + " | ".join(notes)
    return msg[:4000]


def clean_warning(text):
    """PyTorch's SDPA warnings without source locations, headers and the lines saying that
    the backends we switched off are off; '' when nothing informative is left."""
    import re

    t = re.sub(r"\s*\(Triggered internally at [^)]*\)", "", text).strip()
    if not t or t.endswith("not used because:") or "has been runtime disabled" in t:
        return ""
    return t


def refusal(e):
    """Whether an exception means 'this backend does not take this problem'."""
    t = str(e)
    return any(
        s in t
        for s in (
            "No available kernel",
            "needs Hq == Hkv",
            "number of heads in key/value must divide",
            "not supported",
            "does not support",
            "Unsupported",
            "unsupported",
            "only supports",
            "must be",
            "cuDNN Frontend error",
        )
    )


def bench_case(torch, key, case, args, l2_bytes):
    runner = Runner(torch, key, case)
    n_sets = input_sets(case, l2_bytes)
    sets = []
    try:
        sets = [runner.native(*make_inputs(torch, case, 1000 + s)) for s in range(n_sets)]
        # 1. Does the backend take it? Warnings (why a backend was skipped) go in the message.
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            try:
                o = runner.forced(*sets[0])
                torch.cuda.synchronize()
            except Exception as e:  # noqa: BLE001 - recorded, not swallowed
                status = "unsupported" if refusal(e) else "error"
                return make_row(case, runner.kernel, status, exception_text(e, caught))
        # 2. Correctness on the first input set (with dropout, finiteness alone: see the header).
        dropout_note = None
        if runner.dropout:
            rel = 0.0 if bool(torch.isfinite(o).all()) else math.nan
            dropout_note = f"dropout {runner.dropout:g}: a random mask, not compared with the reference (output finite)"
        else:
            rel = reference_rel_error(torch, case, *sets[0], o)
        del o
        # 3. Timing.
        with runner.ctx():
            timing = args.timing
            graph_note = None
            clocks = []
            if timing == "graph":
                try:
                    samples, n = time_calls(torch, runner, sets, args.warmup, args.samples, args.sample_ms, "graph", clocks=(args.sm_clock, clocks))
                except Exception as e:  # noqa: BLE001
                    torch.cuda.synchronize()
                    graph_note = f"CUDA graph capture failed, eager timing: {type(e).__name__}: {str(e).strip()[:300]}"
                    timing = "eager"
            elif timing == "profiler":
                samples, n = time_calls(torch, runner, sets, args.warmup, args.samples, args.sample_ms, "profiler")
            eager_samples, n_eager = time_calls(torch, runner, sets, 0 if timing != "eager" else args.warmup, args.samples, args.sample_ms, "eager")
            if timing == "eager":
                samples, n = eager_samples, n_eager
        eager_sorted = sorted(eager_samples)
        status, message = "ok", "; ".join(m for m in (graph_note, dropout_note) if m) or None
        bound = max(args.max_rel_error, FP8_MAX_REL_ERROR) if case["dtype"] == "e4m3" else args.max_rel_error
        if not math.isfinite(rel) or rel > bound:
            status = "error"
            message = f"rel_error {rel:.3g} over {bound:g} against the float64 reference" + (f"; {graph_note}" if graph_note else "")
        return make_row(
            case,
            runner.kernel,
            status,
            message,
            samples,
            None if runner.dropout else finite_or_none(rel),
            timing=timing,
            calls_per_sample=n,
            input_sets=n_sets,
            eager_median_ms=eager_sorted[len(eager_sorted) // 2],
            sm_clock_mhz=clocks,
        )
    except torch.cuda.OutOfMemoryError as e:
        return make_row(case, runner.kernel, "error", f"OutOfMemoryError: {str(e).strip()[:500]}")
    except Exception as e:  # noqa: BLE001
        traceback.print_exc()
        return make_row(case, runner.kernel, "error", f"{type(e).__name__}: {str(e).strip()[:2000]}")
    finally:
        del sets
        torch.cuda.synchronize()
        torch.cuda.empty_cache()


def bench_backward_case(torch, key, case, args):
    """The backward alone (`torch.autograd.grad` of one forward, graph retained) and a
    training step's attention (the forward and its backward), the backend forced for both
    passes, each backend on its own layout (`Runner.native`). Timed as CUDA-graph replays of
    back-to-back calls (`--timing graph`, the default: the same method for every backend of
    the row, docs/design.md §9), the eager median beside; a backend whose capture fails is
    timed eager and its row says so (a page forms no ratio with it)."""
    runner = Runner(torch, key, case)
    flop_factor = BACKWARD_SUITES[args.suite_name]
    stream = torch.cuda.Stream()
    try:
        with torch.cuda.stream(stream):
            q, k, v = (t.detach().requires_grad_() for t in runner.native(*make_inputs(torch, case, 1000)))
        # Learnable sinks are trained: their gradient is part of the backward timed.
        wrt = (q, k, v) if runner.sinks is None else (q, k, v, runner.sinks.requires_grad_())
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            try:
                with torch.cuda.stream(stream), runner.ctx():
                    o = runner(q, k, v)
                    dout = torch.randn_like(o)
                    torch.autograd.grad(o, wrt, dout, retain_graph=True)
                torch.cuda.synchronize()
            except Exception as e:  # noqa: BLE001 - recorded, not swallowed
                status = "unsupported" if refusal(e) else "error"
                return make_row(case, runner.kernel, status, exception_text(e, caught), flop_factor=flop_factor)

        def backward():
            with runner.ctx():
                torch.autograd.grad(o, wrt, dout, retain_graph=True)

        def forward_backward():
            with runner.ctx():
                torch.autograd.grad(runner(q, k, v), wrt, dout)

        clocks = []

        def timed(fn, method):
            return time_on_stream(torch, fn, stream, args.warmup, args.samples, args.sample_ms, method, clocks=(args.sm_clock, clocks))

        timing, note = args.timing, None
        if timing == "graph":
            try:
                samples, n = timed(backward, "graph")
                both, _ = timed(forward_backward, "graph")
            except Exception as e:  # noqa: BLE001
                torch.cuda.synchronize()
                timing, note = "eager", f"CUDA graph capture failed, eager timing: {type(e).__name__}: {str(e).strip()[:300]}"
        elif timing == "profiler":
            samples, n = timed(backward, "profiler")
            both, _ = timed(forward_backward, "profiler")
        eager, n_eager = timed(backward, "eager")
        if timing == "eager":
            samples, n = eager, n_eager
            both, _ = timed(forward_backward, "eager")
        median = lambda xs: sorted(xs)[len(xs) // 2]  # noqa: E731
        return make_row(
            case,
            runner.kernel + " (backward)",
            "ok",
            note,
            samples,
            None,
            flop_factor=flop_factor,
            timing=timing,
            calls_per_sample=n,
            eager_median_ms=median(eager),
            fwd_bwd_samples_ms=both,
            fwd_bwd_median_ms=median(both),
            sm_clock_mhz=clocks,
        )
    except torch.cuda.OutOfMemoryError as e:
        return make_row(case, runner.kernel, "error", f"OutOfMemoryError: {str(e).strip()[:500]}", flop_factor=flop_factor)
    finally:
        torch.cuda.synchronize()
        torch.cuda.empty_cache()


def pool_rounds(rows, flop_factor):
    """One row from the same (backend, case) timed in several rounds: the samples of every
    round pooled (median of all), the eager and forward + backward medians likewise. A round
    that did not run ok makes the row that round's."""
    bad = [r for r in rows if r["status"] != "ok"]
    if bad or len(rows) == 1:
        return (bad or rows)[0]
    first = rows[0]
    pooled = lambda field: [x for r in rows for x in (r.get(field) or [])]  # noqa: E731
    median = lambda xs: sorted(xs)[len(xs) // 2] if xs else None  # noqa: E731
    extra = {k: v for k, v in first.items() if k not in ROW_FIELDS}
    timings = {r.get("timing") for r in rows}
    extra["timing"] = timings.pop() if len(timings) == 1 else "mixed"
    extra["rounds"] = len(rows)
    if first.get("eager_median_ms") is not None:
        extra["eager_median_ms"] = median([r["eager_median_ms"] for r in rows])
    if first.get("fwd_bwd_samples_ms"):
        extra["fwd_bwd_samples_ms"] = pooled("fwd_bwd_samples_ms")
        extra["fwd_bwd_median_ms"] = median(extra["fwd_bwd_samples_ms"])
    if "sm_clock_mhz" in first:
        extra["sm_clock_mhz"] = pooled("sm_clock_mhz")
    messages = sorted({r["message"] for r in rows if r["message"]})
    return make_row(first["case"], first["kernel"], "ok", "; ".join(messages) or None, pooled("samples_ms"), first["rel_error"], flop_factor, **extra)


def print_row(system, case, row, when):
    if row["status"] != "ok":
        print(f"{system:<15} {case['name']:<44} {row['status']}: {(row['message'] or '')[:160]}", flush=True)
        return
    val, unit = (row["gbps"], "GB/s") if row["gbps"] is not None else (row["tflops"], "TFLOPS")
    rel = f"{row['rel_error']:.1e}" if row["rel_error"] is not None else "—"
    eager = f"{row['eager_median_ms'] * 1e3:.1f} us" if row.get("eager_median_ms") is not None else "—"
    both = f"  fwd+bwd {row['fwd_bwd_median_ms'] * 1e3:.1f} us" if row.get("fwd_bwd_median_ms") else ""
    mhz = [c for c in row.get("sm_clock_mhz") or [] if c is not None]
    both += f"  SM {min(mhz)}-{max(mhz)} MHz" if mhz else ""
    print(f"{system:<15} {case['name']:<44} {row['median_ms'] * 1e3:10.1f} us  {val:8.1f} {unit:<6} rel {rel}  eager {eager}{both}  ({when})", flush=True)


def mods_args(args):
    """`flashcore bench`'s --window / --softcap, as given to this script."""
    out = []
    if args.window:
        out += ["--window", args.window]
    if args.softcap:
        out += ["--softcap", str(args.softcap)]
    return out


def mods_tag(args):
    """What --window / --softcap add to the output file's name ('' without them)."""
    tag = ""
    if args.window:
        tag += "-win" + args.window.replace(",", "_")
    if args.softcap:
        tag += f"-cap{args.softcap:g}"
    if getattr(args, "dropout", 0.0):
        tag += f"-drop{args.dropout:g}"
    return tag


def load_suite(args):
    if args.suite_json:
        with open(args.suite_json) as f:
            text = f.read()
    else:
        if not args.suite:
            sys.exit("anchors.py: give --suite NAME (runs `flashcore bench --suite NAME --list-json`) or --suite-json FILE")
        if not os.path.exists(args.flashcore):
            sys.exit(f"anchors.py: flashcore binary {args.flashcore} not found (build it: cargo build --release; or pass --flashcore / --suite-json)")
        cmd = [args.flashcore, "bench", "--suite", args.suite, "--list-json"] + mods_args(args)
        p = subprocess.run(cmd, capture_output=True, text=True)
        if p.returncode != 0:
            sys.exit(f"anchors.py: `{' '.join(cmd)}` failed:\n{p.stderr}")
        text = p.stdout
    suite, cases = parse_suite(text)
    if args.suite and args.suite != suite:
        sys.exit(f"anchors.py: --suite {args.suite} but the suite JSON is {suite!r}")
    if args.filter:
        cases = [c for c in cases if args.filter in c["name"]]
    if getattr(args, "dropout", 0.0):
        cases = [dict(c, dropout=args.dropout) for c in cases]
    return suite, cases


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    ap.add_argument("--suite", help="suite name: quick, seed, sweep")
    ap.add_argument("--suite-json", help="a file holding `flashcore bench --suite NAME --list-json` output")
    ap.add_argument("--flashcore", default=os.environ.get("FLASHCORE_BIN", "target/release/flashcore"), help="flashcore binary for --list-json")
    ap.add_argument("--out-dir", default=".", help="writes anchors-<suite>-<system>.json here")
    ap.add_argument("--backends", default="cudnn,flash,efficient", help="comma list of cudnn, flash, efficient, flashcore-py, flashcore-py-det, fa4")
    ap.add_argument("--samples", type=int, default=30, help="timed samples per case (>= 20 for reported numbers)")
    ap.add_argument("--warmup", type=int, default=10)
    ap.add_argument("--sample-ms", type=float, default=2.0, help="target duration of one sample")
    ap.add_argument("--timing", choices=("graph", "eager", "profiler"), default="graph",
                    help="CUDA-graph replays (default), CUDA events around eager calls, or torch.profiler's kernel device time summed a call")
    ap.add_argument("--rounds", type=int, default=1, help="time every (case, backend) this many times, interleaved, and pool the samples")
    ap.add_argument("--max-rel-error", type=float, default=2e-2, help="rel_error above this marks the row 'error'")
    ap.add_argument("--filter", help="only cases whose name contains this")
    ap.add_argument("--window", help="LEFT,RIGHT: `flashcore bench --window` on every case (with --suite)")
    ap.add_argument("--softcap", type=float, help="`flashcore bench --softcap` on every case (with --suite)")
    ap.add_argument("--dropout", type=float, default=0.0, help="attention dropout P on every case and backend (see the header)")
    ap.add_argument("--self-test", action="store_true", help="test the pure functions (no GPU, no torch needed)")
    args = ap.parse_args(argv)
    if args.self_test:
        return self_test()
    keys = [k.strip() for k in args.backends.split(",") if k.strip()]
    bad = [k for k in keys if k not in SYSTEMS]
    if bad:
        sys.exit(f"anchors.py: unknown backends {bad}; known: {', '.join(SYSTEMS)}")
    suite, cases = load_suite(args)
    args.suite_name = suite
    try:
        import torch
    except ImportError:
        sys.exit("anchors.py: PyTorch is not installed (pip install torch); --self-test runs without it")
    if not torch.cuda.is_available():
        sys.exit("anchors.py: torch sees no CUDA GPU")
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    os.makedirs(args.out_dir, exist_ok=True)
    env = torch_env(torch, " ".join([os.path.basename(sys.argv[0])] + sys.argv[1:]))
    args.sm_clock = SmClock(torch)
    env["sm_clock"] = args.sm_clock.why or "NVML, after each graph's settle and after its samples (sm_clock_mhz)"
    l2 = env["l2_bytes"] or 50 << 20
    print(f"# {env['device']}  torch {env['torch']}  CUDA {env['cuda_runtime']}  cuDNN {env['cudnn']}  suite {suite}: {len(cases)} cases", flush=True)
    # Rounds, and within a round each case's backends back to back: a clock step (the power
    # cap) then moves every backend of a row alike instead of biasing their ratio.
    backward = suite in BACKWARD_SUITES
    flop_factor = BACKWARD_SUITES[suite] if backward else 1.0
    timed = {key: [[] for _ in cases] for key in keys}
    paths = {key: os.path.join(args.out_dir, f"anchors-{suite}{mods_tag(args)}-{SYSTEMS[key][0]}.json") for key in keys}
    for r in range(args.rounds):
        for i, case in enumerate(cases):
            # The backends' order rotates from round to round and row to row, so that none
            # always follows the same one (the clock a row inherits depends on it).
            turn = (r + i) % len(keys)
            for key in keys[turn:] + keys[:turn]:
                t0 = time.time()
                row = bench_backward_case(torch, key, case, args) if backward else bench_case(torch, key, case, args, l2)
                timed[key][i].append(row)
                print_row(SYSTEMS[key][0], case, row, f"round {r + 1}/{args.rounds}, {time.time() - t0:.1f}s")
            for key in keys:  # after every case: partial results survive
                rows = [pool_rounds(t, flop_factor) for t in timed[key] if t]
                write_json(paths[key], make_report(SYSTEMS[key][0], suite, env, rows))
    for key in keys:
        print(f"wrote {paths[key]}", flush=True)
    return 0


# ----------------------------------------------------------------------------------------
# Self-test of the pure functions.


def self_test():
    # The fa4 backend: its own system name, BSHD like flashcore (no SDPA backend forced); what
    # it does not take is a refusal (an "unsupported" row, not an error).
    assert SYSTEMS["fa4"] == ("fa4", None)
    assert refusal(RuntimeError(FA4_PACKED)) and refusal(RuntimeError(FA4_DROPOUT)) and refusal(RuntimeError(CHUNK_REFUSAL))
    assert refusal(RuntimeError(SINKS_REFUSAL))
    # FP8 (the `fp8` suite): cudnn-fp8 a system of its own; what each backend does not take is
    # a refusal; e4m3 inputs count a byte an element (the output bf16).
    assert SYSTEMS["cudnn-fp8"] == ("cudnn-fp8", None)
    assert all(refusal(RuntimeError(r)) for r in (FP8_REFUSAL, FP8_ONLY, FP8_CAUSAL))
    fp8_case = dict(batch=1, seqlen_q=4, seqlen_k=4, heads_q=2, heads_kv=2, head_dim=8, causal=False, dtype="e4m3")
    assert min_bytes(fp8_case) == (64 + 128) * 1 + 2 * 64 + 4 * 8 and min_bytes(dict(fp8_case, dtype="bf16")) == (2 * 64 + 128) * 2 + 4 * 8
    # The sinks flashcore bench draws (cases::sink_values: (h * 2.7) mod 9 - 1).
    assert [round(x, 4) for x in sink_values(5)] == [-1.0, 1.7, 4.4, 7.1, 0.8]
    # The SM clock: an int from NVML where a GPU and its driver are, else None and the reason.
    clock = SmClock()
    mhz = clock.read()
    assert (mhz is None and clock.why) or (isinstance(mhz, int) and mhz > 0 and clock.why is None), (mhz, clock.why)
    # Calls a sample: ~2 ms of work, 1..1000 calls, a zero-time call counts as 0.1 us.
    assert (calls_per_sample(0.5, 2.0), calls_per_sample(5.0, 2.0), calls_per_sample(0.0, 2.0)) == (4, 1, 1000)
    # FLOPs: dense, causal Sq = Sk exactly half, bottom-right counts by brute force.
    c = {"name": "x", "batch": 2, "seqlen_q": 8, "seqlen_k": 8, "heads_q": 4, "heads_kv": 2, "head_dim": 64, "causal": False, "dtype": "bf16"}
    assert flops(c) == 4 * 2 * 4 * 8 * 8 * 64
    assert flops(dict(c, causal=True)) == flops(c) / 2
    for sq, sk in [(3, 5), (5, 2), (1, 7), (7, 1), (4, 4), (1, 1), (100, 37), (37, 100)]:
        brute = sum(bottom_right_allowed(i, j, sq, sk) for i in range(sq) for j in range(sk))
        want = sq * sk / 2 if sq == sk else brute
        assert visible_pairs(sq, sk, True) == want, (sq, sk, visible_pairs(sq, sk, True), want)
        if sq != sk:
            assert pairs_closed(sq, sk) == brute, (sq, sk, pairs_closed(sq, sk), brute)
        assert visible_pairs(sq, sk, False) == sq * sk
    assert visible_pairs(3, 5, True) == 3 + 4 + 5 and visible_pairs(5, 2, True) == 1 + 2  # as params.rs's test
    assert pairs_closed(1 << 17, 1 << 18) == sum(range((1 << 18) - (1 << 17) + 1, (1 << 18) + 1))
    # Decode bytes and metrics: B8 Sk4k Hkv8 D128 bf16 reads 2*8*4096*8*128*2 bytes.
    dec = dict(c, batch=8, seqlen_q=1, seqlen_k=4096, heads_q=32, heads_kv=8, head_dim=128)
    assert kv_bytes(dec) == 2 * 8 * 4096 * 8 * 128 * 2
    tf, gb = metrics(dec, 0.1)
    assert abs(gb - kv_bytes(dec) / 1e-4 / 1e9) < 1e-9 and tf is not None
    tf, gb = metrics(c, 1.0)
    assert gb is None and abs(tf - flops(c) / 1e-3 / 1e12) < 1e-12
    assert metrics(c, None) == (None, None)
    # Input sets: small problems rotate up to 8 sets, huge ones use 1.
    assert input_sets(dict(c, batch=1, seqlen_q=512, seqlen_k=512, heads_q=8, heads_kv=8), 50 << 20) == 8
    assert input_sets(dec, 50 << 20) == 2  # K+V 134 MB a set: ceil(210 MB / 134 MB) = 2
    big = dict(c, batch=1, seqlen_q=16384, seqlen_k=16384, heads_q=16, heads_kv=16, head_dim=128)
    assert input_sets(big, 50 << 20) == 1
    # Mask: with numpy when present, else the same formula on lists.
    try:
        import numpy as np

        for sq, sk in [(3, 5), (5, 3), (4, 4), (1, 6)]:
            m = bottom_right_mask(sq, sk, np)
            brute = np.array([[bottom_right_allowed(i, j, sq, sk) for j in range(sk)] for i in range(sq)])
            assert m.shape == (sq, sk) and (m == brute).all(), (sq, sk)
            rows = np.array([0, sq - 1])
            assert (bottom_right_mask(sq, sk, np, rows) == brute[rows]).all()
        assert bottom_right_mask(3, 5, np).sum() == 12 and bottom_right_mask(4, 4, np)[0].sum() == 1
        assert bottom_right_mask(5, 2, np)[:3].sum() == 0  # rows that see nothing
        mask_note = "numpy"
    except ImportError:

        class _ListXP:  # just enough of an array module for bottom_right_mask
            class _A(list):
                def __getitem__(self, idx):
                    if idx == (None, slice(None)):
                        return _ListXP._Row(self)
                    if idx == (slice(None), None):
                        return _ListXP._Col(self)
                    return list.__getitem__(self, idx)

            class _Row(list):
                def __le__(self, col):
                    return [[a <= b for a in self] for b in col.vals]

            class _Col:
                def __init__(self, v):
                    self.vals = list(v)

                def __add__(self, x):
                    return _ListXP._Col([a + x for a in self.vals])

            @staticmethod
            def arange(n):
                return _ListXP._A(range(n))

        for sq, sk in [(3, 5), (5, 3), (4, 4)]:
            m = bottom_right_mask(sq, sk, _ListXP)
            assert m == [[bottom_right_allowed(i, j, sq, sk) for j in range(sk)] for i in range(sq)]
        mask_note = "pure python"
    # Windows: the mask against the documented rule; counts come from flashcore only.
    try:
        import numpy as np

        for sq, sk in [(4, 4), (3, 7), (7, 3), (1, 9)]:
            for win in [(0, 0), (1, 0), (2, 1), (-1, 1), (3, -1)]:
                diag = lambda i: i + sk - sq  # noqa: E731
                brute = np.array([[(win[0] < 0 or j >= diag(i) - win[0]) and (win[1] < 0 or j <= diag(i) + win[1]) for j in range(sk)] for i in range(sq)])
                assert (window_mask(sq, sk, win, np) == brute).all(), (sq, sk, win)
            assert (window_mask(sq, sk, (-1, 0), np) == bottom_right_mask(sq, sk, np)).all()
    except ImportError:
        pass
    assert case_window(dict(c, causal=True)) == (-1, 0) and case_window(c) is None
    assert case_window(dict(c, window=[4, 2])) == (4, 2) and case_window(dict(c, window=[4, 2], causal=True)) == (4, 0)
    assert normalize_case(dict(c, counts={"flops": flops(c), "kv_bytes": 1.0}))
    try:
        normalize_case(dict(c, counts={"flops": flops(c) * 1.01, "kv_bytes": 1.0}))
        raise AssertionError("accepted flashcore's count of a plain case that differs from ours")
    except ValueError:
        pass
    counted = dict(c, window=[2, 0], counts={"flops": 123.0, "kv_bytes": 7.0})
    assert flops(counted) == 123.0 and kv_bytes(counted) == 7.0
    for uncounted in (dict(c, window=[2, 0]), dict(c, packed={"seqlens_q": [1, 2], "seqlens_k": [1, 2]}, batch=2)):
        try:
            flops(uncounted)
            raise AssertionError("a window or a packed batch counted here")
        except ValueError:
            pass
        try:
            normalize_case(uncounted)
            raise AssertionError("accepted a window or a packed batch without counts")
        except ValueError:
            pass
    # learnable_sink is a bool.
    try:
        normalize_case(dict(c, learnable_sink=1))
        raise AssertionError("accepted a learnable_sink that is not a bool")
    except ValueError:
        pass
    assert normalize_case(dict(c, learnable_sink=True))["learnable_sink"] is True
    # qv is a bool, its FLOPs flashcore's count alone, and every backend here refuses it.
    for bad in (dict(c, qv=1), dict(c, qv=True)):
        try:
            normalize_case(bad)
            raise AssertionError(f"accepted {bad.get('qv')!r} for qv without counts")
        except ValueError:
            pass
    assert normalize_case(dict(c, qv=True, counts={"flops": 1.0, "kv_bytes": 1.0}))["qv"] is True
    # A chunk's pairs and V's own head dim's FLOPs (2·(D + Dv) a pair) are flashcore's counts
    # alone; each field a positive int.
    counts = {"flops": 5.0, "kv_bytes": 2.0}
    for field, value in (("attention_chunk", 8), ("head_dim_v", 128)):
        case = dict(c, **{field: value})
        for bad in (case, dict(case, counts=counts, **{field: 0})):
            try:
                normalize_case(bad)
                raise AssertionError(f"accepted {field} {bad.get(field)} / {bad.get('counts')}")
            except ValueError:
                pass
        assert flops(normalize_case(dict(case, counts=counts))) == 5.0
    packed = dict(c, batch=3, packed={"seqlens_q": [1, 1, 1], "seqlens_k": [8, 16, 8], "seqused_k": [5, 16, 2]}, counts={"flops": 1.0, "kv_bytes": 2.0})
    assert normalize_case(packed)["packed"]["seqused_k"] == [5, 16, 2]
    assert storage_lengths(packed) == (3, 32) and packed_used_k(packed["packed"]) == [5, 16, 2] and cumulative([3, 0, 2]) == [0, 3, 3, 5]
    assert min_bytes(packed) == (2 * 3 * 4 * 64 + 2 * 32 * 2 * 64) * 2 + 4 * 4 * 3
    for bad in (dict(packed, batch=2), dict(packed, packed=dict(packed["packed"], seqused_k=[9, 1, 1]))):
        try:
            normalize_case(bad)
            raise AssertionError(f"accepted {bad['packed']}")
        except ValueError:
            pass
    # Check slices.
    assert check_rows(100) == list(range(100))
    assert check_rows(1000, sk=113, causal=True) == list(range(887, 1000))
    assert len(check_rows(1000, sk=113, causal=False)) == 512
    assert check_rows(5, sk=2, causal=True) == [3, 4] and check_rows(2, sk=5, causal=True) == [0, 1]
    r = check_rows(20000, sk=1000, causal=True)
    assert len(r) == 512 and r[0] == 19000 and r[-1] == 19999
    r = check_rows(16384)
    assert len(r) == 512 and r[0] == 0 and r[-1] == 16383 and r[255] == 255 and r[256] == 16384 - 256
    assert check_heads(4, 2) == [0, 1, 2, 3] and check_heads(8, 8) == [0, 2, 4, 6]
    hs = check_heads(32, 8)
    assert len(hs) <= 4 and len({h // 4 for h in hs}) >= 2 and all(0 <= h < 32 for h in hs)
    # Suite parsing: aliases, validation, duplicates.
    suite_text = json.dumps({"suite": "quick", "cases": [c, dict(c, name="y", dtype="fp16")]})
    name, cases = parse_suite(suite_text)
    assert name == "quick" and [k["dtype"] for k in cases] == ["bf16", "f16"]
    for bad in [dict(c, dtype="fp8"), dict(c, heads_kv=3), {k: v for k, v in c.items() if k != "head_dim"}, dict(c, batch=0)]:
        try:
            normalize_case(bad)
        except ValueError:
            pass
        else:
            raise AssertionError(f"accepted {bad}")
    try:
        parse_suite(json.dumps({"suite": "q", "cases": [c, c]}))
        raise AssertionError("accepted duplicate names")
    except ValueError:
        pass
    # Rows and report: the schema flashcore writes; JSON round trip; NaN never written.
    ok = make_row(c, "sdpa-cudnn", "ok", None, [1.2, 1.0, 1.1, 5.0], 1e-3, timing="graph")
    assert ok["median_ms"] == 1.2 and ok["min_ms"] == 1.0 and ok["max_ms"] == 5.0  # sorted[n/2], as flashcore
    assert abs(ok["tflops"] - flops(c) / 1.2e-3 / 1e12) < 1e-12 and ok["gbps"] is None
    un = make_row(c, "sdpa-flash", "unsupported", "RuntimeError: No available kernel")
    assert un["median_ms"] is None and un["tflops"] is None and un["samples_ms"] == []
    doc = make_report("sdpa-cudnn", "quick", {"device": "fake"}, [ok, un])
    validate_report(doc)
    assert list(doc) == ["schema", "system", "suite", "env", "results"]
    assert all(list(r)[: len(ROW_FIELDS)] == list(ROW_FIELDS) for r in doc["results"])
    import tempfile

    with tempfile.TemporaryDirectory() as d:
        p = os.path.join(d, "a.json")
        write_json(p, doc)
        with open(p) as f:
            back = json.load(f)
        validate_report(back)
        assert back == json.loads(json.dumps(doc))
        try:
            write_json(p, make_report("x", "q", {}, [dict(ok, rel_error=float("nan"))]))
            raise AssertionError("NaN was written")
        except ValueError:
            pass
    assert finite_or_none(float("nan")) is None and finite_or_none(2.0) == 2.0
    try:
        validate_report(make_report("x", "q", {}, [dict(un, message=None)]))
        raise AssertionError("a refusal without a message passed")
    except AssertionError as e:
        assert "says why" in str(e)
    # Warning cleanup.
    assert clean_warning("Memory efficient kernel not used because: (Triggered internally at /x/sdp_utils.cpp:986.)") == ""
    assert clean_warning("Flash attention has been runtime disabled. (Triggered internally at /x.h:540.)") == ""
    assert clean_warning("For dense input, both fused kernels require query, key and value to have the same num_heads. (Triggered internally at /x.h:418.)") == (
        "For dense input, both fused kernels require query, key and value to have the same num_heads."
    )
    # Refusal classification.
    assert refusal(RuntimeError("No available kernel. Aborting execution."))
    assert not refusal(RuntimeError("CUDA error: an illegal memory access was encountered"))
    print(f"anchors.py self-test: ok (mask via {mask_note}; torch not imported: {'torch' not in sys.modules})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
