#!/usr/bin/env bash
# Device run 56: D64 causal short tile 192x64 s4 (3 consumer WGs, 64-key blocks; f64s) vs 128x128 s3 (fc); three interleaved rounds.
set -uo pipefail
FINAL=$OUT; OUT=/tmp/w56; rm -rf $OUT; mkdir -p $OUT
trap 'tar czf $FINAL/run.tgz -C /tmp w56' EXIT
FLASHCORE_CACHE_DIR=/tmp/c_f64s timeout 90 scratch/bin/f64s check --quick --kernel fwd_sm90 > $OUT/check_f64s.txt 2>&1; echo "check --quick f64s rc=$? $(tail -1 $OUT/check_f64s.txt)"
F=sq512_sk512_h32_d64_causal,sq1024_sk1024_h32_d64_causal
i=0
for b in fc f64s f64s fc fc f64s; do
  i=$((i+1))
  FLASHCORE_CACHE_DIR=/tmp/c_$b timeout 60 scratch/bin/$b bench --suite sweep --filter $F --no-verify --json $OUT/sweep_${b}_$i.json > $OUT/sweep_${b}_$i.txt 2>&1 || { echo "sweep $b $i failed rc=$?"; break; }
  FLASHCORE_CACHE_DIR=/tmp/c_$b timeout 30 scratch/bin/$b bench --suite small --filter d64 --no-verify --json $OUT/small_${b}_$i.json > $OUT/small_${b}_$i.txt 2>&1 || { echo "small $b $i failed"; break; }
done
python3 - <<'PY'
import json, glob, collections, statistics as st
r = collections.defaultdict(lambda: collections.defaultdict(list))
for f in sorted(glob.glob('/tmp/w56/s*_*.json')):
    b = f.split('/')[-1].split('_')[1]
    for x in json.load(open(f))['results']:
        r[x['case']['name']][b].append(x['median_ms'] * 1000)
print("microseconds; ratio = fc / f64s median (> 1: f64s faster)")
for n, d in r.items():
    if d['fc'] and d['f64s']: print(n[:40].ljust(40), ' | '.join(f"{b} " + ' '.join(f"{x:7.1f}" for x in d[b]) for b in ('fc', 'f64s')), f" {st.median(d['fc'])/st.median(d['f64s']):.3f}")
PY
