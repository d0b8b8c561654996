#!/usr/bin/env bash
# Device run 58: D128 128x192 (f192) vs 128x176 (fc), five interleaved rounds on the 16k rows and S2k full; causal S4k (same code in both) as the control.
set -uo pipefail
FINAL=$OUT; OUT=/tmp/w58; rm -rf $OUT; mkdir -p $OUT
trap 'tar czf $FINAL/run.tgz -C /tmp w58' EXIT
F=b8_sq2048_sk2048_h16_d128_full,sq16384_sk16384_h16_d128,b4_sq4096_sk4096_h16_d128_causal
i=0
for b in fc f192 f192 fc fc f192 f192 fc fc f192; do
  i=$((i+1))
  FLASHCORE_CACHE_DIR=/tmp/c_$b timeout 60 scratch/bin/$b bench --suite sweep --filter $F --no-verify --json $OUT/sweep_${b}_$i.json > $OUT/sweep_${b}_$i.txt 2>&1 || { echo "sweep $b $i failed rc=$?"; break; }
done
python3 - <<'PY'
import json, glob, collections, statistics as st
r = collections.defaultdict(lambda: collections.defaultdict(list))
for f in sorted(glob.glob('/tmp/w58/s*_*.json')):
    b = f.split('/')[-1].split('_')[1]
    for x in json.load(open(f))['results']:
        r[x['case']['name']][b].append(x['median_ms'] * 1000)
print("microseconds; ratio = fc / f192 median (> 1: f192 faster)")
for n, d in r.items():
    if d['fc'] and d['f192']: print(n[:40].ljust(40), ' | '.join(f"{b} " + ' '.join(f"{x:7.1f}" for x in d[b]) for b in ('fc', 'f192')), f" {st.median(d['fc'])/st.median(d['f192']):.3f}")
PY
