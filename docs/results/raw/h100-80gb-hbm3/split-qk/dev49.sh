#!/usr/bin/env bash
# Device run 49: Q·K^T in two halves (first half's softmax under the second's product): fs (D64), fsa (all dims) vs fc0 (off).
set -uo pipefail
FINAL=$OUT; OUT=/tmp/w49; rm -rf $OUT; mkdir -p $OUT
trap 'tar czf $FINAL/run.tgz -C /tmp w49' EXIT
FLASHCORE_CACHE_DIR=/tmp/c_fsa timeout 90 scratch/bin/fsa check --quick --kernel fwd_sm90 > $OUT/check_fsa.txt 2>&1; echo "check --quick fsa rc=$? $(tail -1 $OUT/check_fsa.txt)"
F=b8_sq2048_sk2048_h32_d64,b2_sq8192_sk8192_h32_d64,b1_sq16384_sk16384_h32_d64,sq16384_sk16384_h16_d128,b1_sq16384_sk16384_h8_d256_full,b8_sq2048_sk2048_h16_d128_full
i=0
for b in fc0 fs fsa fsa fs fc0; do
  i=$((i+1))
  FLASHCORE_CACHE_DIR=/tmp/c_$b timeout 90 scratch/bin/$b bench --suite sweep --filter $F --no-verify --json $OUT/sweep_${b}_$i.json > $OUT/sweep_${b}_$i.txt 2>&1 || { echo "sweep $b $i failed rc=$?"; }
  FLASHCORE_CACHE_DIR=/tmp/c_$b timeout 30 scratch/bin/$b bench --suite seed --filter b16_sq2048 --no-verify --json $OUT/seed_${b}_$i.json > $OUT/seed_${b}_$i.txt 2>&1 || echo "seed $b $i failed"
done
python3 - <<'PY'
import json, glob, collections, statistics as st
r = collections.defaultdict(lambda: collections.defaultdict(list))
for f in sorted(glob.glob('/tmp/w49/s*_*.json')):
    b = f.split('/')[-1].split('_')[1]
    for x in json.load(open(f))['results']:
        r[x['case']['name']][b].append(x['tflops'])
for n, d in r.items():
    print(n[:38].ljust(38), ' | '.join(f"{b} " + ' '.join(f"{x:4.0f}" for x in d[b]) for b in ('fc0', 'fs', 'fsa')), f" {st.median(d['fs'])/st.median(d['fc0']):.3f} {st.median(d['fsa'])/st.median(d['fc0']):.3f}")
PY
FLASHCORE_CACHE_DIR=/tmp/c_fs timeout 200 scratch/bin/fs check --full --kernel fwd_sm90 > $OUT/checkfull_fs.txt 2>&1; echo "check --full fwd_sm90 fs rc=$? $(tail -1 $OUT/checkfull_fs.txt)"
FLASHCORE_CACHE_DIR=/tmp/c_fs timeout 100 compute-sanitizer --tool synccheck --error-exitcode 1 scratch/bin/fs check --smoke --kernel fwd_sm90 > $OUT/synccheck.txt 2>&1; echo "synccheck fs rc=$? $(tail -1 $OUT/synccheck.txt)"
