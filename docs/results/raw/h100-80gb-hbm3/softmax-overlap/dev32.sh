#!/usr/bin/env bash
# Device run 32: fwd_sm90 HEAD (fc0) vs lazy max (fcL) vs lazy max + P.V wait after the softmax (fc); then check --full.
set -uo pipefail
FINAL=$OUT; OUT=/tmp/w32; rm -rf $OUT; mkdir -p $OUT
trap 'tar czf $FINAL/run.tgz -C /tmp w32' EXIT
FL=sq16384,b16_sq2048
i=0
for b in fc0 fcL fc fc fcL fc0 fc0 fc fcL; do
  i=$((i+1))
  FLASHCORE_CACHE_DIR=/tmp/c_$b timeout 120 scratch/bin/$b bench --suite seed --filter $FL --no-verify --json $OUT/seed_${b}_$i.json > $OUT/seed_${b}_$i.txt 2>&1 || echo "bench $b $i failed"
done
for b in fc0 fcL fc fc fcL fc0; do
  i=$((i+1))
  FLASHCORE_CACHE_DIR=/tmp/c_$b timeout 120 scratch/bin/$b bench --suite sweep --filter sq1024_,sq4096_ --no-verify --json $OUT/sweep_${b}_$i.json > $OUT/sweep_${b}_$i.txt 2>&1 || echo "sweep $b $i failed"
done
python3 - <<'PY'
import json, glob, statistics as st, collections
for suite in ('seed', 'sweep'):
    r = collections.defaultdict(lambda: collections.defaultdict(list))
    for f in sorted(glob.glob(f'/tmp/w32/{suite}_*.json')):
        b = f.split('_')[1]
        for x in json.load(open(f))['results']:
            r[x['case']['name']][b].append(x['tflops'])
    for n, d in r.items():
        a = st.median(d['fc0'])
        print(n[:38].ljust(38), ' | '.join(f"{b} " + ' '.join(f"{x:4.0f}" for x in d[b]) for b in ('fc0', 'fcL', 'fc')), f"| L {st.median(d['fcL'])/a:.3f} W {st.median(d['fc'])/a:.3f}")
PY
FLASHCORE_CACHE_DIR=/tmp/c_fc timeout 200 scratch/bin/fc check --full --kernel fwd_sm90 > $OUT/check_sm90.txt 2>&1; echo "check sm90 rc=$? $(tail -1 $OUT/check_sm90.txt)"
grep -E "FAIL|failed|NaN" $OUT/check_sm90.txt | head -5
