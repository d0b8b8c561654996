#!/usr/bin/env bash
# Device run 33: D64 rows, HEAD d473820 (fc0) vs fccb312 (fc) vs fc with D64 keeping the one straight wait (fcD); check --full all kernels; sm_86/89 tiles.
set -uo pipefail
FINAL=$OUT; OUT=/tmp/w33; rm -rf $OUT; mkdir -p $OUT
trap 'tar czf $FINAL/run.tgz -C /tmp w33' EXIT
i=0
for b in fc0 fc fcD fcD fc fc0 fc0 fc fcD fcD fc fc0; do
  i=$((i+1))
  FLASHCORE_CACHE_DIR=/tmp/c_$b timeout 100 scratch/bin/$b bench --suite sweep --filter d64 --no-verify --json $OUT/sweep_${b}_$i.json > $OUT/sweep_${b}_$i.txt 2>&1 || echo "sweep $b $i failed"
done
python3 - <<'PY'
import json, glob, statistics as st, collections
r = collections.defaultdict(lambda: collections.defaultdict(list))
for f in sorted(glob.glob('/tmp/w33/sweep_*.json')):
    b = f.split('_')[1]
    for x in json.load(open(f))['results']:
        r[x['case']['name']][b].append(x['tflops'])
for n, d in r.items():
    a = st.median(d['fc0'])
    print(n[:36].ljust(36), ' | '.join(f"{b} " + ' '.join(f"{x:4.0f}" for x in d[b]) for b in ('fc0', 'fc', 'fcD')), f"| fc {st.median(d['fc'])/a:.3f} fcD {st.median(d['fcD'])/a:.3f}")
PY
FLASHCORE_CACHE_DIR=/tmp/c_fc timeout 250 scratch/bin/fc check --full > $OUT/check_full.txt 2>&1; echo "check --full rc=$? $(tail -1 $OUT/check_full.txt)"
grep -E "FAIL|NaN|rel error|lse error|differ" $OUT/check_full.txt | head -5
FLASHCORE_CACHE_DIR=/tmp/c_fcS timeout 150 scratch/bin/fcS check --full --kernel fwd_sm80 > $OUT/check_fcS.txt 2>&1; echo "fcS check rc=$? $(tail -1 $OUT/check_fcS.txt)"
grep -E "FAIL|NaN|rel error|lse error|differ" $OUT/check_fcS.txt | head -5
