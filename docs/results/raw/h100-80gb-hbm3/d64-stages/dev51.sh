#!/usr/bin/env bash
# Device run 51: D64 192x128 with 4 K/V stages (fs4) vs 3 (fc); three interleaved rounds.
set -uo pipefail
FINAL=$OUT; OUT=/tmp/w51; rm -rf $OUT; mkdir -p $OUT
trap 'tar czf $FINAL/run.tgz -C /tmp w51' EXIT
F=b8_sq2048_sk2048_h32_d64,b4_sq4096_sk4096_h32_d64,b1_sq16384_sk16384_h32_d64
i=0
for b in fc fs4 fs4 fc fc fs4; do
  i=$((i+1))
  FLASHCORE_CACHE_DIR=/tmp/c_$b timeout 60 scratch/bin/$b bench --suite sweep --filter $F --no-verify --json $OUT/sweep_${b}_$i.json > $OUT/sweep_${b}_$i.txt 2>&1 || { echo "sweep $b $i failed rc=$?"; break; }
  FLASHCORE_CACHE_DIR=/tmp/c_$b timeout 30 scratch/bin/$b bench --suite seed --filter b16_sq2048 --no-verify --json $OUT/seed_${b}_$i.json > $OUT/seed_${b}_$i.txt 2>&1 || { echo "seed $b $i failed"; break; }
done
python3 - <<'PY'
import json, glob, collections, statistics as st
r = collections.defaultdict(lambda: collections.defaultdict(list))
for f in sorted(glob.glob('/tmp/w51/s*_*.json')):
    b = f.split('/')[-1].split('_')[1]
    for x in json.load(open(f))['results']:
        r[x['case']['name']][b].append(x['tflops'])
for n, d in r.items():
    if d['fc'] and d['fs4']: print(n[:38].ljust(38), ' | '.join(f"{b} " + ' '.join(f"{x:4.0f}" for x in d[b]) for b in ('fc', 'fs4')), f" {st.median(d['fs4'])/st.median(d['fc']):.3f}")
PY
FLASHCORE_CACHE_DIR=/tmp/c_fs4 timeout 60 scratch/bin/fs4 check --quick --kernel fwd_sm90 > $OUT/check_fs4.txt 2>&1; echo "check --quick fs4 rc=$? $(tail -1 $OUT/check_fs4.txt)"
