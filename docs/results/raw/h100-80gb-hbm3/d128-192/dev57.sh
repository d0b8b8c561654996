#!/usr/bin/env bash
# Device run 57: D128 128x192 default tile (f192) vs 128x176 (fc); three interleaved rounds.
set -uo pipefail
FINAL=$OUT; OUT=/tmp/w57; rm -rf $OUT; mkdir -p $OUT
trap 'tar czf $FINAL/run.tgz -C /tmp w57' EXIT
FLASHCORE_CACHE_DIR=/tmp/c_f192 timeout 90 scratch/bin/f192 check --quick --kernel fwd_sm90 > $OUT/check_f192.txt 2>&1; echo "check --quick f192 rc=$? $(tail -1 $OUT/check_f192.txt)"
F=sq2048_sk2048_h16_d128,sq4096_sk4096_h16_d128,sq8192_sk8192_h16_d128,sq16384_sk16384_h16_d128,sq1024_sk1024_h16_d128_full
i=0
for b in fc f192 f192 fc fc f192; do
  i=$((i+1))
  FLASHCORE_CACHE_DIR=/tmp/c_$b timeout 60 scratch/bin/$b bench --suite sweep --filter $F --no-verify --json $OUT/sweep_${b}_$i.json > $OUT/sweep_${b}_$i.txt 2>&1 || { echo "sweep $b $i failed rc=$?"; break; }
  FLASHCORE_CACHE_DIR=/tmp/c_$b timeout 30 scratch/bin/$b bench --suite seed --filter d128_full --no-verify --json $OUT/small_${b}_$i.json > $OUT/small_${b}_$i.txt 2>&1 || { echo "small $b $i failed"; break; }
done
python3 - <<'PY'
import json, glob, collections, statistics as st
r = collections.defaultdict(lambda: collections.defaultdict(list))
for f in sorted(glob.glob('/tmp/w57/s*_*.json')):
    b = f.split('/')[-1].split('_')[1]
    for x in json.load(open(f))['results']:
        r[x['case']['name']][b].append(x['median_ms'] * 1000)
print("microseconds; ratio = fc / f192 median (> 1: f192 faster)")
for n, d in r.items():
    if d['fc'] and d['f192']: print(n[:40].ljust(40), ' | '.join(f"{b} " + ' '.join(f"{x:7.1f}" for x in d[b]) for b in ('fc', 'f192')), f" {st.median(d['fc'])/st.median(d['f192']):.3f}")
PY
