#!/usr/bin/env bash
# Device run 50: D128 causal at S >= 4k on the 128x128 tile (fd) vs 128x176 (fc, default); three interleaved rounds.
set -uo pipefail
FINAL=$OUT; OUT=/tmp/w50; rm -rf $OUT; mkdir -p $OUT
trap 'tar czf $FINAL/run.tgz -C /tmp w50' EXIT
F=d128_causal
i=0
for b in fc fd fd fc fc fd; do
  i=$((i+1))
  FLASHCORE_CACHE_DIR=/tmp/c_$b timeout 60 scratch/bin/$b bench --suite sweep --filter $F --no-verify --json $OUT/sweep_${b}_$i.json > $OUT/sweep_${b}_$i.txt 2>&1 || { echo "sweep $b $i failed rc=$?"; break; }
done
python3 - <<'PY'
import json, glob, collections, statistics as st
r = collections.defaultdict(lambda: collections.defaultdict(list))
for f in sorted(glob.glob('/tmp/w50/s*_*.json')):
    b = f.split('/')[-1].split('_')[1]
    for x in json.load(open(f))['results']:
        r[x['case']['name']][b].append(x['tflops'])
for n, d in r.items():
    if d['fc'] and d['fd']: print(n[:38].ljust(38), ' | '.join(f"{b} " + ' '.join(f"{x:4.0f}" for x in d[b]) for b in ('fc', 'fd')), f" {st.median(d['fd'])/st.median(d['fc']):.3f}")
PY
