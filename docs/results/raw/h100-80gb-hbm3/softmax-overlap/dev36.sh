#!/usr/bin/env bash
# Device run 36: short tiles for D64 causal S2k and D128 causal S4k (fcQ) vs 4ec2d47 (fc), with cuDNN, interleaved x3.
set -uo pipefail
FINAL=$OUT; OUT=/tmp/w36; rm -rf $OUT; mkdir -p $OUT
trap 'tar czf $FINAL/run.tgz -C /tmp w36' EXIT
FL=sq2048_sk2048_h32_d64_causal,sq4096_sk4096_h32_d64_causal,sq4096_sk4096_h16_d128_causal,sq8192_sk8192_h16_d128_causal,sq2048_sk2048_h16_d128_causal
scratch/bin/fc bench --suite sweep --list-json | python3 -c "
import json, sys
d = json.load(sys.stdin); fl = '$FL'.split(','); d['cases'] = [c for c in d['cases'] if any(f in c['name'] for f in fl)]
json.dump(d, open('$OUT/suite.json', 'w'))"
for r in 1 2 3; do
  for b in fc fcQ; do FLASHCORE_CACHE_DIR=/tmp/c_$b timeout 100 scratch/bin/$b bench --suite sweep --filter $FL --no-verify --json $OUT/${b}_$r.json > $OUT/${b}_$r.txt 2>&1 || echo "$b $r failed"; done
  timeout 150 python3 bench/anchors.py --suite-json $OUT/suite.json --backends cudnn --out-dir $OUT/cudnn_$r > $OUT/cudnn_$r.log 2>&1 || echo "anchors $r failed"
done
python3 - <<'PY'
import json, glob, statistics as st, collections
r = collections.defaultdict(lambda: collections.defaultdict(list))
for b in ('fc', 'fcQ'):
    for i in (1, 2, 3):
        for x in json.load(open(f'/tmp/w36/{b}_{i}.json'))['results']: r[x['case']['name']][b].append(x['tflops'])
for i in (1, 2, 3):
    for f in glob.glob(f'/tmp/w36/cudnn_{i}/*.json'):
        for x in json.load(open(f))['results']:
            if x.get('tflops'): r[x['case']['name']]['cudnn'].append(x['tflops'])
for n, d in r.items():
    c = st.median(d['cudnn'])
    print(n[:36].ljust(36), ' | '.join(f"{b} " + ' '.join(f"{x:4.0f}" for x in d[b]) for b in ('fc', 'fcQ', 'cudnn')), f"| fc/cudnn {st.median(d['fc'])/c:.3f} fcQ/cudnn {st.median(d['fcQ'])/c:.3f}")
PY
