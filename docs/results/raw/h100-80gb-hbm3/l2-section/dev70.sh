#!/usr/bin/env bash
# Device run 70: causal L2 section size (K+V bytes of the heads a longest-first section holds):
# fc = 32 MiB (259ffb5), s16 = 16 MiB, s8 = 8 MiB. ncu had B32 S512 D64 causal reading 262 MB
# from DRAM for 201 MB of unique Q, K, V (L2 hit 47%). All causal sweep rows, interleaved.
set -uo pipefail
FINAL=$OUT; OUT=/tmp/w70; rm -rf $OUT; mkdir -p $OUT
trap 'tar czf $FINAL/run.tgz -C /tmp w70' EXIT
i=0
for b in fc s16 s8 s8 s16 fc fc s16 s8; do
  i=$((i+1))
  FLASHCORE_CACHE_DIR=/tmp/c_$b timeout 90 scratch/bin/$b bench --suite sweep --filter causal --no-verify --json $OUT/sweep_${b}_$i.json > $OUT/sweep_${b}_$i.txt 2>&1 || echo "sweep $b $i failed rc=$?"
done
python3 - <<'PY'
import json, glob, collections, statistics as st
r = collections.defaultdict(lambda: collections.defaultdict(list))
for f in sorted(glob.glob('/tmp/w70/s*_*_*.json')):
    b = f.split('/')[-1].split('_')[1]
    for x in json.load(open(f))['results']:
        r[x['case']['name']][b].append(x['median_ms'] * 1000)
print("microseconds per round; last columns: median fc/s16, fc/s8 (> 1: smaller section faster)")
for n, d in r.items():
    print(n[:40].ljust(40), ' | '.join(f"{b} " + ' '.join(f"{x:7.1f}" for x in d[b]) for b in ("fc", "s16", "s8")),
          f" {st.median(d['fc'])/st.median(d['s16']):.3f} {st.median(d['fc'])/st.median(d['s8']):.3f}")
PY
