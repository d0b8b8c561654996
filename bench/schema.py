"""The benchmark schema shared by bench/anchors.py and bench/report.py: FLOP and byte counts,
the cases a `flashcore bench --list-json` suite holds (windows, packed batches), masks as
index rules, and the JSON rows and reports both scripts write. Pure Python (no torch, no GPU):
bench/report.py and CI import it without PyTorch.
"""

import json
import math
import os

SCHEMA = 1
SYSTEMS = {
    "flashcore-py": ("flashcore-py", None),
    "flashcore-py-det": ("flashcore-py-det", None),  # deterministic=True: the backward's bitwise mode
    "cudnn": ("sdpa-cudnn", "CUDNN_ATTENTION"),
    "flash": ("sdpa-flash", "FLASH_ATTENTION"),
    "efficient": ("sdpa-efficient", "EFFICIENT_ATTENTION"),
    "fa4": ("fa4", None),  # FlashAttention-4 (flash_attn.cute), BSHD, no SDPA backend forced
    "cudnn-fp8": ("cudnn-fp8", None),  # cuDNN's FP8 SDPA through its frontend (the e4m3 rows alone)
}
CASE_FIELDS = ("name", "batch", "seqlen_q", "seqlen_k", "heads_q", "heads_kv", "head_dim", "causal", "dtype")
ROW_FIELDS = ("case", "kernel", "status", "message", "samples_ms", "median_ms", "min_ms", "max_ms", "tflops", "gbps", "rel_error")
DTYPE_ALIASES = {"bf16": "bf16", "bfloat16": "bf16", "f16": "f16", "fp16": "f16", "float16": "f16", "half": "f16", "e4m3": "e4m3"}
ELEM_BYTES = {"bf16": 2, "f16": 2, "e4m3": 1}


def elem_bytes(case):
    """Bytes of one element of the case's inputs (an e4m3 case's output is bf16: 2)."""
    return ELEM_BYTES[DTYPE_ALIASES.get(str(case.get("dtype", "bf16")).lower(), "bf16")]

def visible_pairs(sq, sk, causal):
    """(query, key) pairs one head attends to. Causal is bottom-right aligned: row i sees keys
    0..=i+sk-sq, clamped to [0, sk]. Sq = Sk causal counts exactly half (the convention of
    FlashAttention's benchmarks and docs/design.md §9), not S(S+1)/2."""
    if not causal:
        return sq * sk
    if sq == sk:
        return sq * sk / 2
    return sum(min(max(i + sk - sq + 1, 0), sk) for i in range(sq)) if sq <= 1 << 16 else pairs_closed(sq, sk)


def pairs_closed(sq, sk):
    """Closed form of the bottom-right count (for very long Sq)."""
    off = sk - sq
    # rows with i + off + 1 <= 0 see nothing; rows with i + off + 1 >= sk see all sk keys
    first = max(0, -off)  # first row that sees >= 1 key (i + off + 1 >= 1)
    full = max(0, min(sq, sk - off - 1))  # first row that sees all keys
    total = 0
    if full > first:  # rows first..full-1 see i+off+1 keys
        a, b = first + off + 1, full - 1 + off + 1
        total += (a + b) * (full - first) // 2
    total += (sq - max(full, first)) * sk if sq > max(full, first) else 0
    return total


def _counted(case, key):
    """flashcore's count `key` of a case (its `counts`, written by `flashcore bench`), or None
    for a plain dense case without them. A window's or a packed batch's pairs are counted by
    the library alone (flashcore's `AttnParams::visible_pairs`), never here."""
    counts = case.get("counts")
    if counts is not None:
        return float(counts[key])
    if case.get("window") is not None or case.get("packed") is not None or case.get("attention_chunk") or case.get("qv"):
        raise ValueError(f"case {case.get('name')}: a window's, a chunk's, qv's or a packed batch's {key} come from `flashcore bench --list-json` (its 'counts')")
    return None


def flops(case):
    """Matrix FLOPs of the forward pass: two products of 2·D FLOPs per visible pair."""
    counted = _counted(case, "flops")
    if counted is not None:
        return counted
    return 4.0 * case["batch"] * case["heads_q"] * case["head_dim"] * visible_pairs(case["seqlen_q"], case["seqlen_k"], case["causal"])


def kv_bytes(case):
    """Bytes of K and V attended to: what a decode step must read."""
    counted = _counted(case, "kv_bytes")
    if counted is not None:
        return counted
    return 2.0 * case["batch"] * case["seqlen_k"] * case["heads_kv"] * case["head_dim"] * elem_bytes(case)


def storage_lengths(case):
    """(query rows, keys) per head the tensors hold: B·Sq and B·Sk, or a packed batch's totals."""
    p = case.get("packed")
    if p is not None:
        return sum(p["seqlens_q"]), sum(p["seqlens_k"])
    return case["batch"] * case["seqlen_q"], case["batch"] * case["seqlen_k"]


def min_bytes(case):
    """Fewest bytes a forward pass moves: q, k, v read, o written, f32 lse (as flashcore)."""
    rows, keys = storage_lengths(case)
    q = rows * case["heads_q"] * case["head_dim"]
    kv = 2 * keys * case["heads_kv"] * case["head_dim"]
    return (q + kv) * elem_bytes(case) + 2 * q + 4 * case["heads_q"] * rows


def packed_used_k(packed):
    """Keys each sequence of a packed batch attends over (seqused_k, else its span)."""
    return packed.get("seqused_k") or packed["seqlens_k"]


def cumulative(lens):
    """[B + 1] prefix sums (cu_seqlens)."""
    out = [0]
    for n in lens:
        out.append(out[-1] + n)
    return out


def is_decode(case):
    return case["seqlen_q"] == 1


# The backward's FLOPs over the forward's (FlashAttention's convention), for suites that time
# the backward (`flashcore bench --suite bwd`).
# With V's own head dim the count stays 2.5x the forward's 2·(D + Dv) a pair (the true
# backward's 2·(3D + 2Dv) is 4% more at (192, 128)): every backend's row counts alike.
BACKWARD_SUITES = {"bwd": 2.5, "bwd-dims": 2.5, "bwd-sinks": 2.5, "bwd-value-dim": 2.5}


def metrics(case, median_ms, flop_factor=1.0):
    """(tflops, gbps) of a case run in median_ms; gbps only for decode (Sq = 1). flop_factor:
    2.5 for a backward pass."""
    if median_ms is None or median_ms <= 0:
        return None, None
    secs = median_ms * 1e-3
    tflops = flop_factor * flops(case) / secs * 1e-12
    gbps = kv_bytes(case) / secs * 1e-9 if is_decode(case) else None
    return tflops, gbps


def input_sets(case, l2_bytes, max_sets=8):
    """Input sets to rotate: enough that 4x L2 is covered, as `flashcore bench` does."""
    return max(1, min(max_sets, math.ceil(4.0 * l2_bytes / min_bytes(case))))


def bottom_right_allowed(i, j, sq, sk):
    """Whether query row i may see key j under the bottom-right causal mask."""
    return j <= i + sk - sq


def bottom_right_mask(sq, sk, xp, rows=None):
    """Boolean [len(rows), sk] mask (True = attend) for query rows `rows` (default all),
    with any array module `xp` that has arange (numpy or torch)."""
    r = xp.arange(sq) if rows is None else rows
    return xp.arange(sk)[None, :] <= (r[:, None] + (sk - sq))


def case_window(case):
    """The (left, right) window a case's mask is, -1 unbounded (causal: right 0), or None
    when it attends to every key."""
    left, right = case.get("window") or (-1, -1)
    if case["causal"]:
        right = 0
    return None if (left, right) == (-1, -1) else (left, right)


def window_mask(sq, sk, window, xp, rows=None):
    """Boolean [len(rows), sk] mask (True = attend) of the bottom-right aligned window
    (left, right): row i sees keys i + sk - sq - left ..= i + sk - sq + right."""
    r = xp.arange(sq) if rows is None else rows
    diag = r[:, None] + (sk - sq)
    j = xp.arange(sk)[None, :]
    left, right = window
    ok = j <= (diag + right) if right >= 0 else j >= 0
    if left >= 0:
        ok = ok & (j >= (diag - left))
    return ok


def check_rows(sq, limit=512, sk=None, causal=False):
    """Query rows the reference check covers: all, or the first and last limit/2. Under a
    causal mask with Sq > Sk the first Sq - Sk rows see no key at all; their output is a
    convention (flashcore and FA2 write 0, cuDNN and the efficient kernel do not), not a
    result, so they are left out."""
    first = max(0, sq - sk) if causal and sk is not None else 0
    n = sq - first
    if n <= limit:
        return list(range(first, sq))
    h = limit // 2
    return list(range(first, first + h)) + list(range(sq - h, sq))


def check_heads(hq, hkv, limit=4):
    """Query heads the reference check covers: spread over the kv groups when GQA."""
    if hq <= limit:
        return list(range(hq))
    group = hq // hkv
    step = max(1, hq // limit)
    heads = sorted({(k * step) for k in range(limit)} | {group - 1})
    return heads[:limit] if len(heads) > limit else heads


def normalize_case(c):
    """Validates a list-json case and returns a copy with canonical dtype; raises ValueError.
    Optional fields, as flashcore writes them: `window` [left, right], `softcap`, `packed`
    {seqlens_q, seqlens_k, seqused_k?} (then batch = sequences, seqlen_q/k = the longest),
    `attention_chunk` (keys a chunk), `learnable_sink` (a bool: the call has `flashcore bench`'s
    sinks), `qv` (a bool: FlashAttention-3's qv), `head_dim_v` (V's own head dim), `counts` {flops,
    kv_bytes}."""
    missing = [f for f in CASE_FIELDS if f not in c]
    if missing:
        raise ValueError(f"case {c.get('name', c)!r} lacks {missing}")
    out = dict(c)
    dt = DTYPE_ALIASES.get(str(c["dtype"]).lower())
    if dt is None:
        raise ValueError(f"case {c['name']}: unknown dtype {c['dtype']!r}")
    out["dtype"] = dt
    for f in ("batch", "seqlen_q", "seqlen_k", "heads_q", "heads_kv", "head_dim"):
        if not isinstance(c[f], int) or c[f] < 1:
            raise ValueError(f"case {c['name']}: {f} must be a positive integer, got {c[f]!r}")
    if c["heads_q"] % c["heads_kv"]:
        raise ValueError(f"case {c['name']}: heads_q % heads_kv != 0")
    p = c.get("packed")
    if p is not None:
        n = len(p.get("seqlens_q", ()))
        used = p.get("seqused_k")
        if n != c["batch"] or len(p.get("seqlens_k", ())) != n or (used is not None and len(used) != n):
            raise ValueError(f"case {c['name']}: packed needs batch = {c['batch']} lengths in seqlens_q, seqlens_k (and seqused_k)")
        if used is not None and any(u > h for u, h in zip(used, p["seqlens_k"])):
            raise ValueError(f"case {c['name']}: seqused_k above the keys a sequence holds")
    if not isinstance(c.get("learnable_sink", False), bool):
        raise ValueError(f"case {c['name']}: learnable_sink must be true or false, got {c['learnable_sink']!r}")
    if not isinstance(c.get("qv", False), bool):
        raise ValueError(f"case {c['name']}: qv must be true or false, got {c['qv']!r}")
    chunk = c.get("attention_chunk")
    if chunk is not None and (not isinstance(chunk, int) or chunk < 1):
        raise ValueError(f"case {c['name']}: attention_chunk must be a positive integer, got {chunk!r}")
    dv = c.get("head_dim_v")
    if dv is not None and (not isinstance(dv, int) or dv < 1):
        raise ValueError(f"case {c['name']}: head_dim_v must be a positive integer, got {dv!r}")
    counted_by_flashcore = c.get("window") is not None or p is not None or chunk is not None or dv is not None or c.get("qv", False)
    if counted_by_flashcore and c.get("counts") is None:
        raise ValueError(
            f"case {c['name']}: a window, a chunk, a packed batch, V's own head dim or qv needs flashcore's 'counts' (from `flashcore bench --list-json`)"
        )
    if c.get("counts") is not None and not counted_by_flashcore:
        # A plain case is counted on both sides: they must agree (the formulas drifting apart
        # would make the anchors' TFLOPS and flashcore's incomparable).
        mine = flops(dict(out, counts=None))
        if abs(mine - c["counts"]["flops"]) > 1e-9 * mine:
            raise ValueError(f"case {c['name']}: flashcore counts {c['counts']['flops']:.6g} FLOPs, this script {mine:.6g}")
    return out


def parse_suite(text):
    """Parses `flashcore bench --list-json` output: (suite name, cases)."""
    d = json.loads(text)
    if "suite" not in d or "cases" not in d:
        raise ValueError("suite JSON needs keys 'suite' and 'cases'")
    cases = [normalize_case(c) for c in d["cases"]]
    names = [c["name"] for c in cases]
    if len(set(names)) != len(names):
        raise ValueError("duplicate case names in the suite")
    return d["suite"], cases


def make_row(case, kernel, status, message=None, samples_ms=(), rel_error=None, flop_factor=1.0, **extra):
    """One result row in flashcore's schema; median/min/max and metrics derived from samples."""
    assert status in ("ok", "unsupported", "error"), status
    samples = [float(s) for s in samples_ms]
    med = mn = mx = None
    if samples:
        srt = sorted(samples)
        med, mn, mx = srt[len(srt) // 2], srt[0], srt[-1]  # the same median index as flashcore
    tflops, gbps = metrics(case, med, flop_factor)
    row = {
        "case": case,
        "kernel": kernel,
        "status": status,
        "message": message,
        "samples_ms": samples,
        "median_ms": med,
        "min_ms": mn,
        "max_ms": mx,
        "tflops": tflops,
        "gbps": gbps,
        "rel_error": rel_error,
    }
    row.update(extra)
    return row


def make_report(system, suite, env, rows):
    return {"schema": SCHEMA, "system": system, "suite": suite, "env": env, "results": rows}


def validate_report(doc):
    """Raises AssertionError when `doc` is not a schema-1 bench report."""
    assert doc.get("schema") == SCHEMA, "schema"
    for k in ("system", "suite", "env", "results"):
        assert k in doc, k
    for r in doc["results"]:
        for k in ROW_FIELDS:
            assert k in r, f"row lacks {k}"
        assert r["status"] in ("ok", "unsupported", "error")
        for k in CASE_FIELDS:
            assert k in r["case"], f"case lacks {k}"
        if r["status"] == "ok":
            assert r["median_ms"] is not None and len(r["samples_ms"]) >= 1
        else:
            assert r["message"], "a row that is not ok says why"


def write_json(path, doc):
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        json.dump(doc, f, indent=1, allow_nan=False, default=_nan_to_none)
        f.write("\n")
    os.replace(tmp, path)


def _nan_to_none(x):
    raise TypeError(f"not JSON serializable: {x!r}")


def finite_or_none(x):
    return None if x is None or not math.isfinite(x) else float(x)
