#!/usr/bin/env python3
"""Merges `flashcore bench --json` and `bench/anchors.py` results into a results page.

Reads every schema-1 JSON given (files, or folders searched for *.json), and writes
`<out-dir>/<gpu-slug>.md`: an environment header, one table per suite (rows = cases;
a column per system with TFLOPS, or GB/s of K+V for decode rows; flashcore / best anchor;
the row's winner in bold), notes on every row that is not "ok", and, for the sweep suite,
one PNG per head dim (`<gpu-slug>-d128.png`, ...: TFLOPS vs sequence length, a line per
system, solid non-causal, dashed causal).

Every system's TFLOPS and GB/s are recomputed here from its median time with one formula
(docs/design.md §9: FLOPs = 4·B·Hq·Sq·Sk·D, half for causal Sq = Sk, exact bottom-right pairs for
causal Sq != Sk; GB/s = bytes of K and V / time), so the columns are comparable whatever
each tool wrote; the ratio is the best anchor's median time over flashcore's.

Usage:
    report.py docs/results/raw/h100-80gb-hbm3 [--out-dir docs/results] [--command "..."]
    report.py --slug-of "NVIDIA H100 80GB HBM3"     # prints h100-80gb-hbm3
    report.py --self-test                           # fake data, temp dir; no GPU
Needs matplotlib for the plots (without it the page is written and the plots skipped).
"""

import argparse
import glob
import json
import math
import os
import re
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import schema  # noqa: E402  (pure functions; torch stays unimported)

FC = "flashcore"
# The same kernels through the Python package: a column of its own, never an anchor.
FC_PY = "flashcore-py"
# The package in deterministic mode: a column of its own, its ratio over flashcore-py's.
FC_PY_DET = "flashcore-py-det"
OURS = (FC, FC_PY, FC_PY_DET)  # never anchors
KNOWN_ORDER = [FC, FC_PY, FC_PY_DET, "fa4", "sdpa-cudnn", "sdpa-flash", "sdpa-efficient"]
SUITE_ORDER = ["seed", "sweep", "quick"]
COLORS = {FC: "#d62728", FC_PY: "#ff7f0e", FC_PY_DET: "#8c564b", "sdpa-cudnn": "#1f77b4", "sdpa-flash": "#2ca02c", "sdpa-efficient": "#9467bd", "fa4": "#17becf"}
SWEEP_TOKENS, SWEEP_HIDDEN = 16384, 2048


def gpu_slug(device):
    s = (device or "unknown-gpu").lower()
    s = re.sub(r"^nvidia\s+", "", s)
    s = re.sub(r"[^a-z0-9]+", "-", s).strip("-")
    return s or "unknown-gpu"


def load(paths):
    """{suite: {system: {"env": env, "rows": {case name: row}, "order": [names]}}} and warnings."""
    files = []
    for p in paths:
        if os.path.isdir(p):
            files += sorted(glob.glob(os.path.join(p, "*.json")))
        else:
            files.append(p)
    data, warns = {}, []
    for f in files:
        try:
            with open(f) as fh:
                doc = json.load(fh)
        except (OSError, ValueError) as e:
            warns.append(f"skipped {f}: {e}")
            continue
        if not isinstance(doc, dict) or doc.get("schema") != 1 or "results" not in doc:
            if isinstance(doc, dict) and "cases" in doc and "suite" in doc and "results" not in doc:
                # a --list-json suite file: gives the rows their suite order
                SUITE_LISTS[doc["suite"]] = [c["name"] for c in doc["cases"]]
                continue
            warns.append(f"skipped {f}: not a schema-1 bench report")
            continue
        entry = data.setdefault(doc["suite"], {}).setdefault(doc["system"], {"env": {}, "rows": {}, "order": [], "files": []})
        entry["env"].update(doc.get("env") or {})
        entry["files"].append(f)
        for r in doc["results"]:
            name = r["case"]["name"]
            if name in entry["rows"]:
                warns.append(f"{doc['suite']}/{doc['system']}: {name} given twice; {f} wins")
            else:
                entry["order"].append(name)
            entry["rows"][name] = r
    return data, warns


def systems_in(suite_data):
    return [s for s in KNOWN_ORDER if s in suite_data] + sorted(s for s in suite_data if s not in KNOWN_ORDER)


SUITE_LISTS = {}  # suite -> case names in the suite's own order, from list-json files


def case_order(suite_data, suite=None):
    order, seen = [], set()
    for n in SUITE_LISTS.get(suite, []):
        if any(n in suite_data[s]["rows"] for s in suite_data):
            seen.add(n)
            order.append(n)
    for s in systems_in(suite_data):
        for n in suite_data[s]["order"]:
            if n not in seen:
                seen.add(n)
                order.append(n)
    return order


def value(row, suite=None):
    """(metric value, unit) of a row, or (None, unit) when it has no usable time. Rows of a
    backward suite count 2.5x the forward's FLOPs."""
    case = dict(row["case"])
    decode = case.get("seqlen_q") == 1
    unit = "GB/s" if decode else "TFLOPS"
    if row.get("status") != "ok":
        return None, unit
    med = row.get("median_ms")
    if med is not None and med > 0:
        tflops, gbps = schema.metrics(case, med, schema.BACKWARD_SUITES.get(suite, 1.0))
        return (gbps if decode else tflops), unit
    v = row.get("gbps" if decode else "tflops")
    return (v if isinstance(v, (int, float)) and math.isfinite(v) else None), unit


def fmt(v, unit):
    if v is None:
        return "—"
    return f"{v:.0f}" if unit == "GB/s" or v >= 100 else f"{v:.1f}"


def fmt_us(row):
    med = row.get("median_ms") if row and row.get("status") == "ok" else None
    if med is None:
        return "—"
    us = med * 1e3
    return f"{us:.1f}" if us < 100 else f"{us:.0f}"


def case_cells(case):
    hq, hkv = case["heads_q"], case["heads_kv"]
    return [
        str(case["batch"]),
        str(case["seqlen_q"]),
        str(case["seqlen_k"]),
        f"{hq}" if hq == hkv else f"{hq}/{hkv}",
        # V's own head dim beside Q's and K's: "192/128".
        f"{case['head_dim']}/{case['head_dim_v']}" if case.get("head_dim_v") else str(case["head_dim"]),
        mask_cell(case),
        case["dtype"],
    ]


def mask_cell(case):
    """The case's mask and score policies as the suite's rows differ in them: causal (or —),
    then a window `win L,R`, a softcap `cap C`, a chunk `chunk N`, learnable `sinks`."""
    parts = ["causal" if case["causal"] else "—"]
    if case.get("window"):
        parts.append("win {},{}".format(*case["window"]))
    if case.get("softcap"):
        parts.append(f"cap {case['softcap']:g}")
    if case.get("attention_chunk"):
        parts.append(f"chunk {case['attention_chunk']}")
    if case.get("learnable_sink"):
        parts.append("sinks")
    return " + ".join(parts)


def comparable(row, anchor_row):
    """Whether two rows may form a ratio: both ok and timed the same way (`timing`: CUDA-graph
    replays or eager), which `bench/anchors.py` guarantees within one run."""
    ok = row and anchor_row and row.get("status") == "ok" and anchor_row.get("status") == "ok"
    return bool(ok) and row.get("timing", "graph") == anchor_row.get("timing", "graph")


def suite_table(suite, suite_data, with_flashcore=False):
    """Markdown lines of one suite's table, and the notes (non-ok rows, errors, kernels).
    with_flashcore: show a flashcore column (all —) even when this suite has no flashcore file.

    The ratio column is `flashcore-py` (the Python package, timed by `bench/anchors.py` in the
    same process as the anchors, with their method) over the best anchor timed the same way.
    The `flashcore` binary's column stays beside as a regression guard, in no ratio: it ran
    in another process (docs/design.md §9)."""
    if with_flashcore and FC not in suite_data:
        suite_data = dict(suite_data, **{FC: {"env": {}, "rows": {}, "order": [], "files": []}})
    systems = systems_in(suite_data)
    anchor_systems = [s for s in systems if s not in OURS]
    subject = FC_PY if FC_PY in systems and anchor_systems else None
    deterministic = FC_PY in systems and FC_PY_DET in systems
    head = ["B", "Sq", "Sk", "Hq(/Hkv)", "D", "mask", "dtype", "unit"] + [f"`{s}`" for s in systems]
    if subject:
        head.append("flashcore-py / best anchor")
    if deterministic:
        head.append("deterministic / default")
    head += (["flashcore-py µs"] if subject else []) + (["best anchor µs"] if anchor_systems else [])
    lines = ["| " + " | ".join(head) + " |", "|" + "|".join(["---"] * 7 + [":--"] + ["--:"] * (len(head) - 8)) + "|"]
    for name in case_order(suite_data, suite):
        rows = {s: suite_data[s]["rows"].get(name) for s in systems}
        case = next(r["case"] for r in rows.values() if r)
        vals, unit = {}, None
        for s, r in rows.items():
            vals[s], u = value(r, suite) if r else (None, None)
            unit = unit or u
        best = max((v for v in vals.values() if v is not None), default=None)
        cells = case_cells(case) + [unit or ""]
        for s in systems:
            c = fmt(vals[s], unit)
            if vals[s] is not None and best is not None and vals[s] == best and sum(v is not None for v in vals.values()) > 1:
                c = f"**{c}**"
            cells.append(c)
        if subject:
            peers = [s for s in anchor_systems if vals[s] is not None and comparable(rows[subject], rows[s])]
            if vals[subject] is not None and peers:
                who = max(peers, key=lambda s: vals[s])
                cells.append(f"{vals[subject] / vals[who]:.2f}× ({who.replace('sdpa-', '')})")
            else:
                cells.append("—")
            cells.append(fmt_us(rows[subject]))
        if deterministic:
            det, default = vals[FC_PY_DET], vals[FC_PY]
            same_method = det is not None and default is not None and comparable(rows[FC_PY_DET], rows[FC_PY])
            cells.insert(len(cells) - (1 if subject else 0), f"{det / default:.2f}" if same_method else "—")
        if anchor_systems:
            ok = [rows[s] for s in anchor_systems if rows[s] and value(rows[s], suite)[0] is not None]
            cells.append(fmt_us(min(ok, key=lambda r: r["median_ms"]) if ok else None))
        lines.append("| " + " | ".join(cells) + " |")
    notes = []
    for s in systems:
        groups = {}
        for name in suite_data[s]["order"]:
            r = suite_data[s]["rows"][name]
            if r.get("status") != "ok":
                msg = (r.get("message") or "").replace("\n", " ").replace("|", "/")
                msg = re.sub(r"\[[\d, ]+\]", "[…]", msg)  # group messages that differ only in shapes
                msg = msg if len(msg) <= 240 else msg[:237] + "..."
                groups.setdefault((r.get("status"), msg), []).append(name)
        for (status, msg), names in groups.items():
            notes.append(f"- `{s}` {status} on {', '.join(f'`{n}`' for n in names)}: {msg or '(no message)'}")
        errs = [r["rel_error"] for r in suite_data[s]["rows"].values() if r.get("status") == "ok" and isinstance(r.get("rel_error"), (int, float))]
        if errs:
            notes.append(f"- `{s}`: max rel. error vs reference {max(errs):.1e} over {len(errs)} ok rows")
        mhz = [c for r in suite_data[s]["rows"].values() for c in (r.get("sm_clock_mhz") or []) if isinstance(c, int)]
        if mhz:
            notes.append(f"- `{s}`: SM clock {min(mhz)}–{max(mhz)} MHz (NVML, after each row's settle and after its samples)")
    fc_kernels = sorted({r.get("kernel") for r in suite_data.get(FC, {}).get("rows", {}).values() if r.get("kernel")})
    if fc_kernels:
        notes.append(f"- flashcore kernels: {', '.join(f'`{k}`' for k in fc_kernels)}")
    return lines, notes


def training_step_table(suite, suite_data):
    """Markdown lines comparing forward + backward times (`fwd_bwd_median_ms`, backward suites),
    or [] when no system has them: ms per system, and flashcore-py's speed-up over the fastest
    anchor timed the same way (the binary's column, from another process, in no ratio)."""
    systems = [s for s in systems_in(suite_data) if any(r.get("fwd_bwd_median_ms") for r in suite_data[s]["rows"].values())]
    anchor_systems = [s for s in systems if s not in OURS]
    if FC_PY not in systems or not anchor_systems:
        return []
    head = ["B", "Sq", "Sk", "Hq(/Hkv)", "D", "mask", "dtype"] + [f"`{s}` ms" for s in systems] + ["fastest anchor / flashcore-py"]
    lines = ["| " + " | ".join(head) + " |", "|" + "|".join(["---"] * 7 + ["--:"] * (len(head) - 7)) + "|"]
    for name in case_order(suite_data, suite):
        rows = {s: suite_data[s]["rows"].get(name) for s in systems}
        ms = {s: r.get("fwd_bwd_median_ms") if r and r.get("status") == "ok" else None for s, r in rows.items()}
        case = next(r["case"] for r in rows.values() if r)
        cells = case_cells(case) + [f"{ms[s]:.3f}" if ms[s] else "—" for s in systems]
        anchor_best = min((ms[s] for s in anchor_systems if ms[s] and comparable(rows[FC_PY], rows[s])), default=None)
        cells.append(f"{anchor_best / ms[FC_PY]:.2f}×" if anchor_best and ms[FC_PY] else "—")
        lines.append("| " + " | ".join(cells) + " |")
    return lines


def env_header(data, command):
    envs = {}
    for suite_data in data.values():
        for system, e in suite_data.items():
            envs.setdefault(system, {}).update(e["env"])
    fc = envs.get(FC, {})
    an = {}
    for s, e in envs.items():
        if s != FC:
            an.update(e)
    device = fc.get("device") or an.get("device") or "unknown GPU"
    devices = sorted({e.get("device") for e in envs.values() if e.get("device")})
    sm = fc.get("sm") or an.get("sm")
    sm_count = fc.get("sm_count") or an.get("sm_count")

    def g(*vals):
        for v in vals:
            if v not in (None, ""):
                return str(v)
        return "—"

    rows = [
        ("GPU", f"{device}" + (f" ({sm}, {sm_count} SMs)" if sm else "")),
        ("Driver", g(an.get("driver"), fc.get("driver")) + f" (CUDA driver API {g(fc.get('cuda_driver_api'), an.get('cuda_driver_api'))})"),
        ("CUDA runtime (PyTorch)", g(an.get("cuda_runtime"))),
        ("NVRTC (flashcore)", g(fc.get("nvrtc"))),
        ("PyTorch", g(an.get("torch"))),
        ("cuDNN", g(an.get("cudnn"))),
        ("FlashCore commit", g(fc.get("flashcore_commit"))),
        ("Date", g(an.get("date"), fc.get("date"), fc.get("date_unix") and _unix_date(fc.get("date_unix")))),
        ("Command", f"`{command}`" if command else g(an.get("command") and f"`{an['command']}`")),
    ]
    lines = ["| | |", "|---|---|"] + [f"| {k} | {v} |" for k, v in rows]
    if len(devices) > 1:
        lines += ["", f"**Warning:** the files come from different devices: {', '.join(devices)}."]
    return device, lines


def _unix_date(t):
    import datetime

    try:
        return datetime.datetime.fromtimestamp(int(t), datetime.timezone.utc).isoformat(timespec="seconds")
    except (TypeError, ValueError, OverflowError):
        return None


def is_sweep_case(c):
    return c["seqlen_q"] == c["seqlen_k"] and c["batch"] * c["seqlen_q"] == SWEEP_TOKENS and c["heads_q"] * c["head_dim"] == SWEEP_HIDDEN


def plot_sweep(suite_data, device, out_dir, slug, suite="sweep"):
    """One PNG per head dim of the sweep (or the backward's `bwd`, the sweep's cases); returns
    [(D, file name)]. Empty when matplotlib is missing."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("report.py: matplotlib not installed; plots skipped (pip install matplotlib)", file=sys.stderr)
        return []
    by_d = {}
    for system in systems_in(suite_data):
        for r in suite_data[system]["rows"].values():
            c = r["case"]
            if not is_sweep_case(c):
                continue
            v, _ = value(r, suite)
            by_d.setdefault(c["head_dim"], {}).setdefault((system, c["causal"]), []).append((c["seqlen_q"], v, c["dtype"]))
    made = []
    for d in sorted(by_d):
        fig, ax = plt.subplots(figsize=(8, 5), dpi=120)
        dtypes, xs = set(), set()
        for (system, causal), pts in sorted(by_d[d].items(), key=lambda kv: (KNOWN_ORDER.index(kv[0][0]) if kv[0][0] in KNOWN_ORDER else 99, kv[0])):
            pts.sort()
            dtypes |= {p[2] for p in pts}
            xs |= {p[0] for p in pts}
            good = [(s, v) for s, v, _ in pts if v is not None]
            if not good:
                continue
            ax.plot(
                [s for s, _ in good],
                [v for _, v in good],
                linestyle="--" if causal else "-",
                marker="o",
                markersize=4,
                color=COLORS.get(system),
                linewidth=2.2 if system == FC else 1.5,
                label=f"{system}, {'causal' if causal else 'non-causal'}",
            )
        ax.set_xscale("log", base=2)
        ticks = sorted(xs)
        ax.set_xticks(ticks)
        ax.set_xticklabels([f"{t // 1024}k" if t >= 1024 else str(t) for t in ticks])
        ax.set_xlabel("sequence length S = Sq = Sk (tokens; batch B = 16384 / S)")
        factor = schema.BACKWARD_SUITES.get(suite)
        ax.set_ylabel(f"TFLOPS ({factor} × 4·B·H·S²·D / time, ½ for causal)" if factor else "TFLOPS (4·B·H·S²·D / time, ½ for causal)")
        ax.set_ylim(bottom=0)
        ax.grid(True, alpha=0.3)
        what = "attention backward" if factor else "attention forward"
        ax.set_title(f"{device}: {what}, {'/'.join(sorted(dtypes))}, D = {d}, H = {SWEEP_HIDDEN // d}")
        ax.legend(fontsize=8, ncol=2, loc="lower right")
        fig.tight_layout()
        name = f"{slug}-d{d}.png"
        fig.savefig(os.path.join(out_dir, name))
        plt.close(fig)
        made.append((d, name))
    return made


# How a row was timed (`timing` in anchors.py's rows; the binary's own rows have none): the
# page's method sentence, which must say what the numbers are.
TIMING_TEXT = {
    "graph": ("CUDA events", "timed as CUDA-graph replays of back-to-back calls (eager medians are in the raw JSON)"),
    "eager": ("CUDA events", "timed as back-to-back eager calls"),
    "profiler": ("torch.profiler", "timed as the device time of every kernel of a call (torch.profiler's kernel events summed over a sample's calls)"),
}


def timing_text(data):
    """(clock, sentence) for the rows' timing method, or a sentence saying it is mixed."""
    timings = {r.get("timing") for suite in data.values() for system in suite.values() for r in system["rows"].values() if r.get("timing")}
    if len(timings) == 1 and next(iter(timings)) in TIMING_TEXT:
        return TIMING_TEXT[timings.pop()]
    if not timings:
        return TIMING_TEXT["graph"]
    return ("CUDA events or torch.profiler", f"timed as each row's `timing` in the raw JSON says ({', '.join(sorted(map(str, timings)))}; ratios only between rows timed alike)")


def render(data, out_dir, slug=None, command=None, warns=(), notes=()):
    """Writes the page (and plots); returns the markdown path."""
    device, header = env_header(data, command)
    header += [""] + [f"- {n}" for n in notes] if notes else []
    slug = slug or gpu_slug(device)
    os.makedirs(out_dir, exist_ok=True)
    md = [f"# FlashCore results: {device}", ""]
    backward = bool(data) and all(s in schema.BACKWARD_SUITES for s in data)
    flops = "2.5 × 4·B·Hq·Sq·Sk·D" if backward else "4·B·Hq·Sq·Sk·D"
    clock, method = timing_text(data)
    md += [
        f"{'Backward' if backward else 'Forward'} attention, device time per call (median of ≥ 20 samples, {clock}; input sets rotated",
        f"while they fit in L2). TFLOPS = {flops} / time (half for causal Sq = Sk); decode rows",
        "(Sq = 1) in GB/s of K and V read. Anchors are PyTorch SDPA with one backend forced",
        "(`sdpa-cudnn` = cuDNN, `sdpa-flash` = FlashAttention-2, `sdpa-efficient` = memory-efficient) and FlashAttention-4 (`fa4`, `flash_attn.cute`, BSHD),",
        f"{method}, each on",
        "its own layout (SDPA contiguous BHSD, flashcore BSHD). `flashcore-py` is FlashCore through its",
        "Python package, timed by the same script in the same process, in rounds with the anchors: the",
        "ratio column is `flashcore-py` over the best anchor timed the same way (> 1: flashcore faster).",
        "The `flashcore` column is the binary's own `bench` (another process): a regression guard, in no",
        "ratio. The winner of each row is in bold. — : not run, unsupported, failed, or no ratio.",
        "",
    ]
    md += header + [""]
    suites = [s for s in SUITE_ORDER if s in data] + sorted(s for s in data if s not in SUITE_ORDER)
    for suite in suites:
        lines, notes = suite_table(suite, data[suite], with_flashcore=any(FC in d for d in data.values()))
        md += [f"## Suite `{suite}`", ""] + lines + [""]
        if suite in ("sweep", "bwd"):
            plots = plot_sweep(data[suite], device, out_dir, slug, suite)
            for d, name in plots:
                md += [f"![{suite} D{d}]({name})", ""]
        if notes:
            md += ["Notes:", ""] + notes + [""]
        step = training_step_table(suite, data[suite])
        if step:
            md += [f"### Suite `{suite}`: forward + backward (a training step's attention)", ""] + step + [""]
    if warns:
        md += ["## Warnings while merging", ""] + [f"- {w}" for w in warns] + [""]
    path = os.path.join(out_dir, f"{slug}.md")
    with open(path, "w") as f:
        f.write("\n".join(md))
    return path


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    ap.add_argument("inputs", nargs="*", help="JSON files or folders of them")
    ap.add_argument("--out-dir", default="docs/results")
    ap.add_argument("--slug", help="page name (default: from the GPU name, e.g. h100-80gb-hbm3)")
    ap.add_argument("--command", help="the command that produced the data, for the header")
    ap.add_argument("--note", action="append", default=[], help="a line for the header (repeatable)")
    ap.add_argument("--slug-of", metavar="DEVICE", help="print the slug of a GPU name and exit")
    ap.add_argument("--self-test", action="store_true")
    args = ap.parse_args(argv)
    if args.slug_of is not None:
        print(gpu_slug(args.slug_of))
        return 0
    if args.self_test:
        return self_test()
    if not args.inputs:
        ap.error("give result JSON files or folders")
    data, warns = load(args.inputs)
    for w in warns:
        print(f"report.py: {w}", file=sys.stderr)
    if not data:
        sys.exit("report.py: no schema-1 result files found in " + ", ".join(args.inputs))
    path = render(data, args.out_dir, args.slug, args.command, warns, args.note)
    print(f"wrote {path}")
    return 0


# ----------------------------------------------------------------------------------------


def _fake_doc(system, suite, device, rows):
    env = {"device": device, "sm": "sm_90", "sm_count": 132}
    if system == FC:
        env.update(cuda_driver_api="13.0", nvrtc="13.0", flashcore_commit="abc1234", date_unix=1795000000)
    else:
        env.update(driver="580.159.04", cuda_runtime="13.0", torch="2.11.0+cu130", cudnn="9.19.0", date="2026-11-22T08:00:00+00:00")
    return schema.make_report(system, suite, env, rows)


def self_test():
    assert gpu_slug("NVIDIA H100 80GB HBM3") == "h100-80gb-hbm3" and gpu_slug("NVIDIA H200") == "h200" and gpu_slug(None) == "unknown-gpu"
    dev = "NVIDIA H100 80GB HBM3"

    def case(b, s, h, d, causal, dtype="bf16", sk=None, hkv=None):
        sk = sk or s
        hkv = hkv or h
        n = f"b{b}_sq{s}_sk{sk}_h{h}" + (f"kv{hkv}" if hkv != h else "") + f"_d{d}_{'causal' if causal else 'full'}_{dtype}"
        return dict(name=n, batch=b, seqlen_q=s, seqlen_k=sk, heads_q=h, heads_kv=hkv, head_dim=d, causal=causal, dtype=dtype)

    assert case_cells(dict(case(2, 8192, 128, 192, True), head_dim_v=128))[4] == "192/128" and case_cells(case(2, 64, 4, 64, True))[4] == "64"
    sweep = [case(16384 // s, s, 2048 // d, d, c) for d in (64, 128) for c in (False, True) for s in (512, 1024, 2048)]
    fc_rows, cu_rows = [], []
    for i, c in enumerate(sweep):
        t_cu = 1.0 + 0.1 * i
        cu_rows.append(schema.make_row(c, "sdpa-cudnn", "ok", None, [t_cu] * 20, 2e-3))
        if i == 2:  # flashcore failed here: the table shows — and no ratio
            fc_rows.append(schema.make_row(c, "flashcore.flash_attn_func", "error", "launch failed: out of resources"))
        else:  # flashcore 1.25x faster on even rows, 0.8x on odd rows
            t_fc = t_cu / 1.25 if i % 2 == 0 else t_cu / 0.8
            fc_rows.append(schema.make_row(c, "flashcore.flash_attn_func", "ok", None, [t_fc * 0.99, t_fc, t_fc * 1.02], 3e-3))
    dec = case(8, 1, 32, 128, False, sk=4096, hkv=8)
    seed_fc = [schema.make_row(dec, "decode", "ok", None, [0.05], 2e-3)]
    seed_py = [schema.make_row(dec, "flashcore.flash_attn_func", "ok", None, [0.05], 2e-3)]
    seed_cu = [schema.make_row(dec, "sdpa-cudnn", "ok", None, [0.0512], 2e-3)]
    seed_ef = [schema.make_row(dec, "sdpa-efficient", "unsupported", "RuntimeError: No available kernel. Aborting execution.")]
    with tempfile.TemporaryDirectory() as tmp:
        raw = os.path.join(tmp, "raw")
        os.makedirs(raw)
        for name, doc in [
            ("anchors-sweep-flashcore-py.json", _fake_doc(FC_PY, "sweep", dev, fc_rows)),
            ("anchors-sweep-sdpa-cudnn.json", _fake_doc("sdpa-cudnn", "sweep", dev, cu_rows)),
            ("flashcore-seed.json", _fake_doc(FC, "seed", dev, seed_fc)),
            ("anchors-seed-flashcore-py.json", _fake_doc(FC_PY, "seed", dev, seed_py)),
            ("anchors-seed-sdpa-cudnn.json", _fake_doc("sdpa-cudnn", "seed", dev, seed_cu)),
            ("anchors-seed-sdpa-efficient.json", _fake_doc("sdpa-efficient", "seed", dev, seed_ef)),
            ("suite-seed.json", {"suite": "seed", "cases": [dec]}),  # list-json files give the order only
            ("suite-sweep.json", {"suite": "sweep", "cases": list(reversed(sweep))}),
        ]:
            schema.write_json(os.path.join(raw, name), doc)
        data, warns = load([raw])
        assert not warns, warns
        assert set(data) == {"sweep", "seed"} and systems_in(data["seed"]) == [FC, FC_PY, "sdpa-cudnn", "sdpa-efficient"]
        out = os.path.join(tmp, "results")
        path = render(data, out, command="bench/run-all.sh --bin target/release/flashcore", notes=["a note line"])
        assert os.path.basename(path) == "h100-80gb-hbm3.md", path
        text = open(path).read()
        lines = [l for l in text.splitlines() if l.startswith("| ")]

        def row_of(c):
            cells = case_cells(c)
            hits = [l for l in lines if l.startswith("| " + " | ".join(cells) + " |")]
            assert len(hits) == 1, (c["name"], hits)
            return [x.strip() for x in hits[0].strip("|").split("|")]

        for i, c in enumerate(sweep):
            cells = row_of(c)
            assert cells[8] == "—", cells  # the binary's column (its file covers the seed suite only)
            fc_cell, cu_cell, ratio = cells[9], cells[10], cells[11]
            t_cu = 1.0 + 0.1 * i
            want_cu = schema.flops(c) / (t_cu * 1e-3) / 1e12
            if i == 2:
                assert fc_cell == "—" and ratio == "—" and cu_cell == fmt(want_cu, "TFLOPS"), cells
            elif i % 2 == 0:
                assert ratio == "1.25× (cudnn)", cells
                assert fc_cell.startswith("**") and not cu_cell.startswith("**"), cells
            else:
                assert ratio == "0.80× (cudnn)", cells
                assert cu_cell == f"**{fmt(want_cu, 'TFLOPS')}**" and not fc_cell.startswith("**"), cells
        d = row_of(dec)
        assert d[7] == "GB/s", d
        fast = f"**{schema.kv_bytes(dec) / 0.05e-3 / 1e9:.0f}**"
        assert d[8] == fast and d[9] == fast and d[11] == "—" and d[12] == "1.02× (cudnn)", d  # the binary: in no ratio
        assert d[13] == "50.0" and d[14] == "51.2", d  # flashcore-py µs, best anchor µs
        assert "`flashcore-py` error on `" + sweep[2]["name"] + "`: launch failed" in text
        assert "`sdpa-efficient` unsupported on `" + dec["name"] + "`: RuntimeError: No available kernel" in text
        for must in ("| GPU | NVIDIA H100 80GB HBM3 (sm_90, 132 SMs) |", "| cuDNN | 9.19.0 |", "| FlashCore commit | abc1234 |", "| PyTorch | 2.11.0+cu130 |", "run-all.sh", "- a note line"):
            assert must in text, must
        assert text.index("## Suite `seed`") < text.index("## Suite `sweep`")
        assert "timed as CUDA-graph replays" in text  # the rows' own timing (the fakes': graph)
        profiled = {"bwd": {FC_PY: {"rows": {"a": {"timing": "profiler"}}}, "fa4": {"rows": {"a": {"timing": "profiler"}}}}}
        assert timing_text(profiled) == TIMING_TEXT["profiler"]
        profiled["bwd"]["fa4"]["rows"]["a"]["timing"] = "graph"
        assert "(graph, profiler;" in timing_text(profiled)[1]
        pos = [text.index("| " + " | ".join(case_cells(c)) + " |") for c in sweep]
        assert pos == sorted(pos, reverse=True), "rows follow the suite list's order"
        try:
            import matplotlib  # noqa: F401

            for dd in (64, 128):
                png = os.path.join(out, f"h100-80gb-hbm3-d{dd}.png")
                with open(png, "rb") as f:
                    assert f.read(8) == b"\x89PNG\r\n\x1a\n", png
                assert f"(h100-80gb-hbm3-d{dd}.png)" in text
            plot_note = "2 plots"
        except ImportError:
            plot_note = "plots skipped: no matplotlib"
        # A page with anchors only (no flashcore at all) still renders, without a ratio column.
        only = {"seed": {k: v for k, v in data["seed"].items() if k not in (FC, FC_PY)}}
        text2 = open(render(only, os.path.join(tmp, "only"), slug="x")).read()
        assert "/ best anchor" not in text2 and "| FlashCore commit | — |" in text2
        # The binary alone beside anchors: its column, but no ratio (another process).
        binary = {"seed": {k: v for k, v in data["seed"].items() if k != FC_PY}}
        text5 = open(render(binary, os.path.join(tmp, "binary"), slug="b")).read()
        assert "`flashcore`" in text5 and "/ best anchor" not in text5
        # Rows timed differently (graph against eager) form no ratio.
        eager = json.loads(json.dumps(data))
        for r in eager["seed"]["sdpa-cudnn"]["rows"].values():
            r["timing"] = "eager"
        text6 = open(render(eager, os.path.join(tmp, "eager"), slug="e")).read()
        d6 = [x.strip() for x in [l for l in text6.splitlines() if l.startswith("| " + " | ".join(case_cells(dec)) + " |")][0].strip("|").split("|")]
        assert d6[12] == "—", d6
        # The binary present in one suite only: the other suite still gets a flashcore column of —.
        text4 = open(render(data, os.path.join(tmp, "mixed"), slug="z")).read()
        sweep_part = text4.split("## Suite `sweep`")[1]
        assert "`flashcore`" in sweep_part and "flashcore-py / best anchor" in sweep_part
        row1 = [l for l in sweep_part.splitlines() if l.startswith("| " + " | ".join(case_cells(sweep[1])) + " |")][0]
        c1 = [x.strip() for x in row1.strip().strip("|").split("|")]
        assert c1[8] == "—" and c1[9] not in ("—", "") and c1[11] == "0.80× (cudnn)", c1
        # Messages that differ only in shapes are grouped into one note.
        g = {"seed": {"sdpa-efficient": {"env": {}, "files": [], "order": ["a", "b"], "rows": {
            "a": schema.make_row(dict(dec, name="a"), "k", "unsupported", "needs same heads, sizes [1, 32, 1, 128]"),
            "b": schema.make_row(dict(dec, name="b"), "k", "unsupported", "needs same heads, sizes [8, 32, 1, 128]")}}}}
        _, gnotes = suite_table("seed", g["seed"])
        assert any("`a`, `b`" in n for n in gnotes), gnotes
        # A partial flashcore file (a case missing) shows — for that case.
        part = json.loads(json.dumps(data))
        part["sweep"][FC_PY]["order"] = part["sweep"][FC_PY]["order"][1:]
        del part["sweep"][FC_PY]["rows"][sweep[0]["name"]]
        text3 = open(render(part, os.path.join(tmp, "part"), slug="y")).read()
        row0 = [l for l in text3.splitlines() if l.startswith("| " + " | ".join(case_cells(sweep[0])) + " |")][0]
        cells0 = [x.strip() for x in row0.strip().strip("|").split("|")]
        assert cells0[9] == "—" and cells0[11] == "—" and cells0[12] == "—" and cells0[13] == "1000", cells0
        # Forward + backward times (backward suites): flashcore 2 ms, cuDNN 3 ms -> 1.50x; none: no table.
        c0 = sweep[0]
        step = {"bwd": {
            FC_PY: {"env": {}, "files": [], "order": [c0["name"]], "rows": {c0["name"]: schema.make_row(c0, "bwd", "ok", None, [1.0], fwd_bwd_median_ms=2.0)}},
            "sdpa-cudnn": {"env": {}, "files": [], "order": [c0["name"]], "rows": {c0["name"]: schema.make_row(c0, "cudnn", "ok", None, [1.5], fwd_bwd_median_ms=3.0)}}}}
        lines = training_step_table("bwd", step["bwd"])
        assert len(lines) == 3 and lines[2].endswith("| 2.000 | 3.000 | 1.50× |"), lines
        # Deterministic mode beside the default: its own column and ratio, never an anchor
        # (cuDNN at 1.5 ms stays the best anchor though the deterministic row is 1.2 ms).
        det = dict(step["bwd"], **{FC_PY_DET: {"env": {}, "files": [], "order": [c0["name"]], "rows": {c0["name"]: schema.make_row(c0, "bwd", "ok", None, [1.2])}}})
        dlines, _ = suite_table("bwd", det)
        assert dlines[0].split("|")[-5:-1] == [" flashcore-py / best anchor ", " deterministic / default ", " flashcore-py µs ", " best anchor µs "], dlines[0]
        dcells = [x.strip() for x in dlines[2].strip().strip("|").split("|")]
        assert dcells[-4:] == ["1.50× (cudnn)", "0.83", "1000", "1500"], dcells
        # The SM clock the rows recorded becomes a note per system (None readings left out).
        step["bwd"][FC_PY]["rows"][c0["name"]]["sm_clock_mhz"] = [1980, None, 1755]
        _, cnotes = suite_table("bwd", step["bwd"])
        assert "- `flashcore-py`: SM clock 1755–1980 MHz (NVML, after each row's settle and after its samples)" in cnotes, cnotes
        assert training_step_table("sweep", data["sweep"]) == []
    print(f"report.py self-test: ok ({plot_note})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
