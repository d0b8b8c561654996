#!/usr/bin/env bash
# Device run 48: fr0 (row sums by MMA, eager max) vs fr (lazy max) vs fc0: LSE accuracy and speed.
set -uo pipefail
FINAL=$OUT; OUT=/tmp/w48; rm -rf $OUT; mkdir -p $OUT
trap 'tar czf $FINAL/run.tgz -C /tmp w48' EXIT
nvidia-smi --query-gpu=name,clocks.sm,power.draw,temperature.gpu --format=csv > $OUT/smi0.txt
FLASHCORE_CACHE_DIR=/tmp/c_fr0 timeout 90 scratch/bin/fr0 check --quick --kernel fwd_sm90 > $OUT/check_fr.txt 2>&1; echo "check --quick fr0 rc=$? $(tail -1 $OUT/check_fr.txt)"
F=_d64_
i=0
for b in fc0 fr0 fr fr fr0 fc0; do
  i=$((i+1))
  FLASHCORE_CACHE_DIR=/tmp/c_$b timeout 90 scratch/bin/$b bench --suite sweep --filter $F --no-verify --json $OUT/sweep_${b}_$i.json > $OUT/sweep_${b}_$i.txt 2>&1 || { echo "sweep $b $i failed rc=$?"; }
  FLASHCORE_CACHE_DIR=/tmp/c_$b timeout 30 scratch/bin/$b bench --suite seed --filter d64 --no-verify --json $OUT/seed_${b}_$i.json > $OUT/seed_${b}_$i.txt 2>&1 || echo "seed $b $i failed"
done
nvidia-smi --query-gpu=name,clocks.sm,power.draw,temperature.gpu --format=csv > $OUT/smi1.txt
python3 - <<'PY'
import json, glob, collections, statistics as st
r = collections.defaultdict(lambda: collections.defaultdict(list))
for f in sorted(glob.glob('/tmp/w48/s*_*.json')):
    b = f.split('/')[-1].split('_')[1]
    for x in json.load(open(f))['results']:
        r[x['case']['name']][b].append(x['tflops'])
for n, d in r.items():
    print(n[:38].ljust(38), ' | '.join(f"{b} " + ' '.join(f"{x:4.0f}" for x in d[b]) for b in ('fc0', 'fr', 'fr0')), f" {st.median(d['fr'])/st.median(d['fc0']):.3f} {st.median(d['fr0'])/st.median(d['fc0']):.3f}")
PY
FLASHCORE_CACHE_DIR=/tmp/c_fr0 timeout 200 scratch/bin/fr0 check --full --kernel fwd_sm90 > $OUT/checkfull_fr.txt 2>&1; echo "check --full fwd_sm90 fr0 rc=$? $(tail -1 $OUT/checkfull_fr.txt)"
