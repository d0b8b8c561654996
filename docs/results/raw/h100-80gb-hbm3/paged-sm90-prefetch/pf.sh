#!/usr/bin/env bash
# One-off (session 7): fwd_sm90 paged with the table entries of a block fetched at once
# (flashcore-pf) against the merged tree (flashcore): paged checks, chunked-prefill rows interleaved.
set -u
export FLASHCORE_NVRTC=$(ls /opt/torch/.venv/lib/python3*/site-packages/nvidia/cu13/lib/libnvrtc.so.13)
export FLASHCORE_CACHE_DIR=/tmp/fc-pf
B=scratch/bin
timeout 150 $B/flashcore-pf check --kernel fwd_sm90 --only paged > $OUT/check-paged-pf.log 2>&1; echo "check rc=$? $(grep -E 'passed' $OUT/check-paged-pf.log | tail -1)"
for r in 1 2; do for b in flashcore flashcore-pf; do
  timeout 60 $B/$b bench --suite paged --filter sq512,sq2048 --samples 20 --json $OUT/prefill-$b-r$r.json > /dev/null 2>&1; echo "$b r$r rc=$?"
done; done
python3 - <<'PY'
import json, os, glob, statistics as st
out = os.environ["OUT"]
rows = {}
for f in sorted(glob.glob(f"{out}/prefill-*.json")):
    b = "pf" if "flashcore-pf" in f else "main"
    for x in json.load(open(f))["results"]:
        if x.get("tflops"): rows.setdefault(x["case"]["name"], {}).setdefault(b, []).append(x["tflops"])
dense = {}
for name, d in rows.items():
    base, _, tag = name.rpartition("_causal_bf16_")
    if tag in ("dense", "dense-end"):
        dense.setdefault(base, []).extend(d.get("main", []) + d.get("pf", []))
for name, d in sorted(rows.items()):
    base, _, tag = name.rpartition("_causal_bf16_")
    dn = st.median(dense[base])
    m, p = d.get("main", [0]), d.get("pf", [0])
    print(f"{base:26s} {tag:18s} main {' '.join(f'{x:6.1f}' for x in m)} ({max(m)/dn:.3f})  pf {' '.join(f'{x:6.1f}' for x in p)} ({max(p)/dn:.3f})")
PY
