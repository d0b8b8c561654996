#!/usr/bin/env bash
# Device run 59: validation of the D128 128x192 tile (fn = the tree): check --full fwd_sm90, sanitizers on fwd_sm90, seed D128 rows vs fc.
set -uo pipefail
FINAL=$OUT; OUT=/tmp/w59; rm -rf $OUT; mkdir -p $OUT
trap 'tar czf $FINAL/run.tgz -C /tmp w59' EXIT
export FLASHCORE_CACHE_DIR=/tmp/c_fn
timeout 200 scratch/bin/fn check --full --kernel fwd_sm90 > $OUT/checkfull_fn.txt 2>&1; echo "check --full fwd_sm90 fn rc=$? $(tail -1 $OUT/checkfull_fn.txt)"
for t in synccheck racecheck memcheck; do timeout 100 compute-sanitizer --tool $t --error-exitcode 1 scratch/bin/fn check --smoke --kernel fwd_sm90 > $OUT/$t.txt 2>&1; echo "$t fn rc=$? $(tail -1 $OUT/$t.txt)"; done
i=0
for b in fc fn fn fc; do
  i=$((i+1))
  FLASHCORE_CACHE_DIR=/tmp/c_$b timeout 30 scratch/bin/$b bench --suite seed --filter d128 --no-verify --json $OUT/seed_${b}_$i.json > $OUT/seed_${b}_$i.txt 2>&1 || { echo "seed $b $i failed"; break; }
done
python3 - <<'PY'
import json, glob, collections, statistics as st
r = collections.defaultdict(lambda: collections.defaultdict(list))
for f in sorted(glob.glob('/tmp/w59/seed_*.json')):
    b = f.split('/')[-1].split('_')[1]
    for x in json.load(open(f))['results']:
        r[x['case']['name']][b].append(x['tflops'] or x['gbps'])
for n, d in r.items():
    if d['fc'] and d['fn']: print(n[:40].ljust(40), ' | '.join(f"{b} " + ' '.join(f"{x:6.0f}" for x in d[b]) for b in ('fc', 'fn')), f" {st.median(d['fn'])/st.median(d['fc']):.3f}")
PY
