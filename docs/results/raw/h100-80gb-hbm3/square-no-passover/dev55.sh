#!/usr/bin/env bash
# Device run 55: square tiles (128x128) without the per-warpgroup pass-over (fp) vs HEAD (fc); check --full fwd_sm90 + synccheck on fp.
set -uo pipefail
FINAL=$OUT; OUT=/tmp/w55; rm -rf $OUT; mkdir -p $OUT
trap 'tar czf $FINAL/run.tgz -C /tmp w55' EXIT
FLASHCORE_CACHE_DIR=/tmp/c_fp timeout 150 scratch/bin/fp check --full --kernel fwd_sm90 > $OUT/checkfull_fp.txt 2>&1; echo "check --full fwd_sm90 fp rc=$? $(tail -1 $OUT/checkfull_fp.txt)"
FLASHCORE_CACHE_DIR=/tmp/c_fp timeout 60 compute-sanitizer --tool synccheck --error-exitcode 1 scratch/bin/fp check --smoke --kernel fwd_sm90 > $OUT/synccheck.txt 2>&1; echo "synccheck fp rc=$? $(tail -1 $OUT/synccheck.txt)"
F=sq512_sk512,sq1024_sk1024,sq2048_sk2048_h16_d128_causal,sq4096_sk4096_h16_d128_causal
i=0
for b in fc fp fp fc fc fp; do
  i=$((i+1))
  FLASHCORE_CACHE_DIR=/tmp/c_$b timeout 60 scratch/bin/$b bench --suite sweep --filter $F --no-verify --json $OUT/sweep_${b}_$i.json > $OUT/sweep_${b}_$i.txt 2>&1 || { echo "sweep $b $i failed rc=$?"; break; }
  FLASHCORE_CACHE_DIR=/tmp/c_$b timeout 30 scratch/bin/$b bench --suite small --no-verify --json $OUT/small_${b}_$i.json > $OUT/small_${b}_$i.txt 2>&1 || { echo "small $b $i failed"; break; }
done
python3 - <<'PY'
import json, glob, collections, statistics as st
r = collections.defaultdict(lambda: collections.defaultdict(list))
for f in sorted(glob.glob('/tmp/w55/s*_*.json')):
    b = f.split('/')[-1].split('_')[1]
    for x in json.load(open(f))['results']:
        r[x['case']['name']][b].append(x['median_ms'] * 1000)
print("microseconds (lower is better); ratio = fc / fp median (> 1: fp faster)")
for n, d in r.items():
    if d['fc'] and d['fp']: print(n[:40].ljust(40), ' | '.join(f"{b} " + ' '.join(f"{x:7.1f}" for x in d[b]) for b in ('fc', 'fp')), f" {st.median(d['fc'])/st.median(d['fp']):.3f}")
PY
