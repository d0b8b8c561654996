#!/usr/bin/env python3
"""Structural checks of the Hopper kernels' SASS, on CUBINs from the flashcore JIT cache.

    sass-check.py CACHE_DIR [--keys FILE] [--nvdisasm PATH]

For every `fwd_sm90*.fcbin` and `bwd_sm90*.fcbin` in CACHE_DIR (fill it with
`FLASHCORE_CACHE_DIR=CACHE_DIR flashcore compile --arch sm_90a --kernel fwd_sm90`, and
`--kernel bwd_sm90`), or with `--keys` only the entries FILE names (one `KEY.fcbin` a line,
`flashcore compile ... --keys`: the entries this binary reads; a folder kept across source
changes also holds others, and each one named must be there), disassembles the CUBIN and checks. The backward (check_bwd_sass): HGMMA,
UTMALDG and the dQ bulk reduce-add (UBLKRED) present, no LDL/STL, and, up to D128, in the
loop over query blocks the first exponentials (MUFU.EX2) come between the wait for Sᵀ alone
(`WARPGROUP.DEPBAR.LE gsb0, 0x1`) and the wait for dPᵀ (`gsb0, 0x0`): they run under dPᵀ's
wgmma. (D192's and D256's warpgroups take 16 exponentials a step, not 32 or 64; ptxas moves the dPᵀ
wait above them in the non-causal variant, which is not checked.) The forward:
- wgmma present (HGMMA; QGMMA in the e4m3 forms), UTMALDG (TMA loads) present, no LDL/STL
  (local memory: spills);
- in the steady key-block loop (the innermost loop holding both wgmma and MUFU.EX2), every
  wait for all wgmma groups (`WARPGROUP.DEPBAR.LE gsb0, 0x0`) comes after a MUFU.EX2 of the
  block's softmax (after its S wait, `gsb0, 0x1`): the softmax overlaps the block's own P·V.
  The one exception is the slow softmax path that recomputes the scores by mma.sync
  (warp_qk), which waits for the P·V first by design: a wait followed by HMMA before any
  MUFU.EX2. ptxas hoists a plain wait above the softmax
  (docs/kernels/fwd_sm90.md); this catches a kernel edit or a ptxas version that
  brings that back. Exits non-zero on any failure.
"""
import argparse
import glob
import os
import re
import subprocess
import sys
import tempfile


def find_nvdisasm():
    here = os.path.dirname(os.path.abspath(__file__))
    for pattern in (os.path.join(here, "..", ".venv", "lib", "python3*", "site-packages", "nvidia", "cu13", "bin", "nvdisasm"),
                    "/usr/local/cuda/bin/nvdisasm"):
        hits = sorted(glob.glob(pattern))
        if hits:
            return hits[-1]
    return None


def cubin_of(fcbin_path):
    """The CUBIN inside a cache entry (`magic | log | cubin | sha256`): the ELF image."""
    data = open(fcbin_path, "rb").read()
    start = data.find(b"\x7fELF")
    if start < 0:
        raise ValueError(f"{fcbin_path}: no ELF image inside")
    return data[start:len(data) - 32]


def instructions(sass):
    """(list of instruction texts, {label: index of the next instruction})."""
    ins, labels = [], {}
    for line in sass.splitlines():
        m = re.match(r"\s*(\.L_x_\d+):", line)
        if m:
            labels[m.group(1)] = len(ins)
            continue
        m = re.match(r"\s*/\*[0-9a-f]+\*/\s+(.*?)\s*;", line)
        if m:
            ins.append(m.group(1))
    return ins, labels


def loops(ins, labels):
    """(start, end) of every loop: a branch back to a label at or before it."""
    out = []
    for i, text in enumerate(ins):
        m = re.search(r"BRA[.\w]*\s+`\((\.L_x_\d+)\)", text)
        if m and labels.get(m.group(1), len(ins)) <= i:
            out.append((labels[m.group(1)], i))
    return out


# wgmma's SASS: HGMMA with 16-bit operands, QGMMA with e4m3 ones (fwd_sm90's FC_FP8 forms).
WGMMA = ("HGMMA", "QGMMA")


def check_sass(name, sass):
    """A list of failure messages for one kernel's SASS."""
    ins, labels = instructions(sass)
    ops = [re.sub(r"^@!?U?P\w+\s+", "", t) for t in ins]
    failures = []
    if not any(o.startswith(WGMMA) for o in ops):
        failures.append("no HGMMA or QGMMA")
    if not any(o.startswith("UTMALDG") for o in ops):
        failures.append("no UTMALDG")
    local = [o for o in ops if o.startswith(("LDL", "STL"))]
    if local:
        failures.append(f"{len(local)} local-memory instructions (spills), e.g. {local[0]}")

    def body_has(lo, hi, prefix):
        return any(o.startswith(prefix) for o in ops[lo:hi + 1])

    candidates = [(lo, hi) for lo, hi in loops(ins, labels) if body_has(lo, hi, WGMMA) and body_has(lo, hi, "MUFU.EX2")]
    if not candidates:
        return failures + ["no loop holds both wgmma (HGMMA, QGMMA) and MUFU.EX2"]
    lo, hi = min(candidates, key=lambda r: r[1] - r[0])
    body = ops[lo:hi + 1]
    waits = [i for i, o in enumerate(body) if re.match(r"WARPGROUP\.DEPBAR\.LE\s+gsb0,\s*0x0\b", o)]
    if not waits:
        failures.append("steady loop: no wait for all wgmma groups")
    s_waits = [i for i, o in enumerate(body) if re.match(r"WARPGROUP\.DEPBAR\.LE\s+gsb0,\s*0x1\b", o)]

    def softmax_before(i):
        """A MUFU.EX2 between the block's S wait and position i."""
        start = max([j for j in s_waits if j < i], default=0)
        return any(o.startswith("MUFU.EX2") for o in body[start:i])

    def opens_recompute(i):
        """The slow softmax path waits for P·V before warp_qk: an HMMA before the next MUFU.EX2."""
        for o in body[i + 1:]:
            if o.startswith("MUFU.EX2"):
                return False
            if o.startswith("HMMA"):
                return True
        return False

    early = [i for i in waits if not softmax_before(i) and not opens_recompute(i)]
    if early:
        failures.append(f"steady loop: a wait for all wgmma groups at +{early[0]} comes before the softmax's MUFU.EX2 "
                        "(the softmax no longer overlaps its P·V)")
    return failures


def check_bwd_sass(name, sass, overlap=True):
    """A list of failure messages for one backward kernel's SASS; `overlap`: also check that
    the exponentials run under dPᵀ's wgmma."""
    ins, labels = instructions(sass)
    ops = [re.sub(r"^@!?U?P\w+\s+", "", t) for t in ins]
    failures = [f"no {op}" for op in ("HGMMA", "UTMALDG", "UBLKRED") if not any(o.startswith(op) for o in ops)]
    local = [o for o in ops if o.startswith(("LDL", "STL"))]
    if local:
        failures.append(f"{len(local)} local-memory instructions (spills), e.g. {local[0]}")
    if not overlap:
        return failures
    loops_with_ex2 = [(lo, hi) for lo, hi in loops(ins, labels) if any(o.startswith("MUFU.EX2") for o in ops[lo:hi + 1])]
    if not loops_with_ex2:
        return failures + ["no loop holds MUFU.EX2"]
    lo, hi = max(loops_with_ex2, key=lambda r: r[1] - r[0])
    body = ops[lo:hi + 1]
    s_wait = next((i for i, o in enumerate(body) if re.match(r"WARPGROUP\.DEPBAR\.LE\s+gsb0,\s*0x1\b", o)), None)
    if s_wait is None:
        return failures + ["query-block loop: no wait for Sᵀ alone (gsb0, 0x1)"]
    dp_wait = next((i for i, o in enumerate(body[s_wait:]) if re.match(r"WARPGROUP\.DEPBAR\.LE\s+gsb0,\s*0x0\b", o)), None)
    if dp_wait is None or not any(o.startswith("MUFU.EX2") for o in body[s_wait:s_wait + dp_wait]):
        failures.append("query-block loop: no MUFU.EX2 between the Sᵀ and dPᵀ waits (the exponentials no longer run under dPᵀ)")
    return failures


GOOD_BWD_LOOP = """
        /*0000*/                   UTMALDG.4D [UR8], [UR4] ;
.L_x_1:
        /*0010*/                   HGMMA.64x64x16.F32.BF16 R24, gdesc[UR4], RZ, gsb0 ;
        /*0020*/                   HGMMA.64x64x16.F32.BF16 R56, gdesc[UR8], RZ, gsb0 ;
        /*0030*/                   WARPGROUP.DEPBAR.LE gsb0, 0x1 ;
        /*0040*/                   MUFU.EX2 R24, R24 ;
        /*0050*/                   WARPGROUP.DEPBAR.LE gsb0, 0x0 ;
        /*0060*/                   HGMMA.64x128x16.F32.BF16 R88, R24, gdesc[UR12], R88 ;
        /*0070*/                   UBLKRED.G.S.ADD.F32.RN [UR4], [UR8], UR10 ;
        /*0080*/              @P1 BRA `(.L_x_1) ;
"""

GOOD_LOOP = """
        /*0000*/                   UTMALDG.4D [UR8], [UR4] ;
.L_x_1:
        /*0010*/                   HGMMA.64x128x16.F32.BF16 R24, gdesc[UR4], RZ, gsb0 ;
        /*0020*/                   WARPGROUP.DEPBAR.LE gsb0, 0x1 ;
        /*0030*/                   MUFU.EX2 R24, R24 ;
        /*0040*/              @P0 BRA `(.L_x_2) ;
        /*0050*/                   WARPGROUP.DEPBAR.LE gsb0, 0x0 ;
.L_x_2:
        /*0060*/                   WARPGROUP.DEPBAR.LE gsb0, 0x0 ;
        /*0070*/              @P1 BRA `(.L_x_1) ;
"""


def self_test():
    assert check_sass("good", GOOD_LOOP) == [], check_sass("good", GOOD_LOOP)
    hoisted = GOOD_LOOP.replace("gsb0, 0x1 ;", "gsb0, 0x1 ;\n        /*0028*/ WARPGROUP.DEPBAR.LE gsb0, 0x0 ;")
    assert any("before the softmax" in f for f in check_sass("hoisted", hoisted)), check_sass("hoisted", hoisted)
    recompute = GOOD_LOOP.replace("/*0040*/              @P0 BRA `(.L_x_2) ;",
                                  "/*0040*/              @P0 BRA `(.L_x_2) ;\n        /*0044*/ WARPGROUP.DEPBAR.LE gsb0, 0x0 ;\n"
                                  "        /*0048*/ HMMA.16816.F32.BF16 R24, R8, R12, R24 ;\n        /*004c*/ MUFU.EX2 R24, R24 ;")
    assert check_sass("recompute", recompute) == [], check_sass("recompute", recompute)
    spill = GOOD_LOOP.replace("MUFU.EX2 R24, R24 ;", "MUFU.EX2 R24, R24 ;\n        /*0038*/ STL [R1], R24 ;")
    assert any("spills" in f for f in check_sass("spill", spill))
    assert any("UTMALDG" in f for f in check_sass("no tma", GOOD_LOOP.replace("UTMALDG", "LDG")))
    no_wait = GOOD_LOOP.replace("gsb0, 0x0", "gsb0, 0x1")
    assert any("no wait" in f for f in check_sass("no wait", no_wait))
    assert check_bwd_sass("good bwd", GOOD_BWD_LOOP) == [], check_bwd_sass("good bwd", GOOD_BWD_LOOP)
    late = GOOD_BWD_LOOP.replace("gsb0, 0x1 ;", "gsb0, 0x0 ;")
    assert any("Sᵀ alone" in f for f in check_bwd_sass("late", late)), check_bwd_sass("late", late)
    serial = GOOD_BWD_LOOP.replace("MUFU.EX2 R24, R24 ;\n        /*0050*/                   WARPGROUP.DEPBAR.LE gsb0, 0x0 ;",
                                   "WARPGROUP.DEPBAR.LE gsb0, 0x0 ;\n        /*0050*/                   MUFU.EX2 R24, R24 ;")
    assert any("under dPᵀ" in f for f in check_bwd_sass("serial", serial)), check_bwd_sass("serial", serial)
    assert any("UBLKRED" in f for f in check_bwd_sass("no reduce", GOOD_BWD_LOOP.replace("UBLKRED", "REDG")))
    assert check_bwd_sass("serial, wide", serial, overlap=False) == []
    assert any("spills" in f for f in check_bwd_sass("spill", GOOD_BWD_LOOP.replace("MUFU.EX2 R24, R24 ;", "STL [R1], R24 ;\n MUFU.EX2 R24, R24 ;")))
    print("sass-check self-test: ok")


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("cache_dir", nargs="?")
    ap.add_argument("--keys", help="only the cache entries this file names (flashcore compile --keys)")
    ap.add_argument("--nvdisasm")
    ap.add_argument("--self-test", action="store_true")
    args = ap.parse_args()
    if args.self_test:
        self_test()
        return 0
    if not args.cache_dir:
        sys.exit("sass-check.py: give the JIT cache folder")
    nvdisasm = args.nvdisasm or find_nvdisasm()
    if not nvdisasm:
        sys.exit("sass-check.py: nvdisasm not found (pip install nvidia-cuda-nvdisasm into .venv, or pass --nvdisasm)")
    entries = sorted(glob.glob(os.path.join(args.cache_dir, "fwd_sm90*.fcbin")) + glob.glob(os.path.join(args.cache_dir, "bwd_sm90*.fcbin")))
    if args.keys:
        wanted = {line.strip() for line in open(args.keys) if line.strip()}
        missing = sorted(wanted - {os.path.basename(p) for p in entries})
        if missing:
            sys.exit(f"sass-check.py: {len(missing)} entries named in {args.keys} are not in {args.cache_dir}, e.g. {missing[0]}")
        entries = [p for p in entries if os.path.basename(p) in wanted]
    if not entries:
        sys.exit(f"sass-check.py: no fwd_sm90 or bwd_sm90 entries in {args.cache_dir}")
    failed = 0
    with tempfile.TemporaryDirectory() as tmp:
        for path in entries:
            name = os.path.basename(path).split("-sm_")[0]
            cubin = os.path.join(tmp, "k.cubin")
            open(cubin, "wb").write(cubin_of(path))
            sass = subprocess.run([nvdisasm, "-c", cubin], check=True, capture_output=True, text=True).stdout
            if name.startswith("bwd_"):
                head_dim = int(re.search(r"_d(\d+)_", name).group(1))
                failures = check_bwd_sass(name, sass, overlap=head_dim <= 128)
            else:
                failures = check_sass(name, sass)
            failed += bool(failures)
            print(f"{name:48} {'ok' if not failures else 'FAILED: ' + '; '.join(failures)}")
    print(f"{len(entries)} variants, {failed} failed")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
