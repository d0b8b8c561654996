#!/usr/bin/env bash
# Device run 29: sweep rows with S >= 2k, flashcore (default kernels) and cuDNN interleaved, 3 rounds each.
set -uo pipefail
FINAL=$OUT; OUT=/tmp/w29; rm -rf $OUT; mkdir -p $OUT
trap 'tar czf $FINAL/run.tgz -C /tmp w29' EXIT
export FLASHCORE_CACHE_DIR=/tmp/c29 FLASHCORE_BIN=scratch/bin/fc
F=scratch/bin/fc
$F compile --kernel fwd_sm90 > /dev/null 2>&1
FL=sq2048_,sq4096_,sq8192_,sq16384_
$F bench --suite sweep --list-json | python3 -c "
import json, sys
d = json.load(sys.stdin); d['cases'] = [c for c in d['cases'] if c['seqlen_q'] >= 2048]; d['suite'] = 'sweep'
json.dump(d, open('$OUT/suite.json', 'w'))"
for r in 1 2 3; do
  timeout 100 $F bench --suite sweep --filter $FL --json $OUT/fc_$r.json > $OUT/fc_$r.txt 2>&1; echo "fc $r rc=$?"
  timeout 150 python3 bench/anchors.py --suite-json $OUT/suite.json --backends cudnn --out-dir $OUT/cudnn_${r}_x > $OUT/cudnn_$r.log 2>&1 || echo "anchors $r failed"
  echo "cudnn $r done"
done
python3 - <<'PY'
import json, glob, statistics as st
fc = [{r['case']['name']: r['tflops'] for r in json.load(open(f'/tmp/w29/fc_{i}.json'))['results']} for i in (1, 2, 3)]
cu = [{}, {}, {}]
for i in (1, 2, 3):
    for f in glob.glob(f'/tmp/w29/cudnn_{i}_*/*.json'):
        for r in json.load(open(f))['results']:
            if r.get('tflops'): cu[i - 1][r['case']['name']] = r['tflops']
ahead_med = ahead_all = 0
for n in fc[0]:
    a = [x[n] for x in fc]; b = [x.get(n, 0) for x in cu]
    ahead_med += st.median(a) > st.median(b); ahead_all += all(x > y for x, y in zip(a, b))
    print(n[:36].ljust(36), 'fc', ' '.join(f"{x:5.0f}" for x in a), '| cudnn', ' '.join(f"{x:5.0f}" for x in b), f"| med ratio {st.median(a)/st.median(b):.3f}")
print(f"median over rounds ahead: {ahead_med}/{len(fc[0])}; ahead in every round: {ahead_all}/{len(fc[0])}")
PY
