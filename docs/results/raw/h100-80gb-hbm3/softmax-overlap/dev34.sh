#!/usr/bin/env bash
# Device run 34: D64 rows: HEAD d473820 (fc0), fccb312 (fc), fc with chain reductions (fcT), fc with eager max (fcE); sanitizers on fc.
set -uo pipefail
FINAL=$OUT; OUT=/tmp/w34; rm -rf $OUT; mkdir -p $OUT
trap 'tar czf $FINAL/run.tgz -C /tmp w34' EXIT
i=0
for b in fc0 fc fcT fcE fcE fcT fc fc0 fc0 fc fcT fcE; do
  i=$((i+1))
  FLASHCORE_CACHE_DIR=/tmp/c_$b timeout 100 scratch/bin/$b bench --suite sweep --filter d64_causal,sq2048_sk2048_h32_d64_full --no-verify --json $OUT/sweep_${b}_$i.json > $OUT/sweep_${b}_$i.txt 2>&1 || echo "sweep $b $i failed"
done
python3 - <<'PY'
import json, glob, statistics as st, collections
r = collections.defaultdict(lambda: collections.defaultdict(list))
for f in sorted(glob.glob('/tmp/w34/sweep_*.json')):
    b = f.split('_')[1]
    for x in json.load(open(f))['results']:
        r[x['case']['name']][b].append(x['tflops'])
B = ('fc0', 'fc', 'fcT', 'fcE')
for n, d in r.items():
    a = st.median(d['fc0'])
    print(n[:36].ljust(36), ' | '.join(f"{b} " + ' '.join(f"{x:4.0f}" for x in d[b]) for b in B), '|', ' '.join(f"{b} {st.median(d[b])/a:.3f}" for b in B[1:]))
PY
for tool in memcheck racecheck synccheck; do
  FLASHCORE_CACHE_DIR=/tmp/c_fc timeout 150 compute-sanitizer --tool $tool --error-exitcode 1 scratch/bin/fc check --smoke --kernel fwd_sm90 > $OUT/$tool-fwd_sm90.log 2>&1; echo "$tool rc=$? $(grep -E 'SUMMARY' $OUT/$tool-fwd_sm90.log | tail -1) $(tail -1 $OUT/$tool-fwd_sm90.log)"
done
