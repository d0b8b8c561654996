#!/usr/bin/env bash
# Device run 37: per-warpgroup key blocks (fc) vs 4ec2d47 (fcP): check, sanitizers, interleaved A/B with cuDNN.
set -uo pipefail
FINAL=$OUT; OUT=/tmp/w37; rm -rf $OUT; mkdir -p $OUT
trap 'tar czf $FINAL/run.tgz -C /tmp w37' EXIT
export FLASHCORE_CACHE_DIR=/tmp/c_fc
timeout 150 scratch/bin/fc check --full --kernel fwd_sm90 > $OUT/check_sm90.txt 2>&1; echo "check rc=$? $(tail -1 $OUT/check_sm90.txt)"
grep -E "FAIL|NaN|rel error|lse error|differ" $OUT/check_sm90.txt | head -5
for tool in memcheck racecheck synccheck; do
  timeout 150 compute-sanitizer --tool $tool --error-exitcode 1 scratch/bin/fc check --smoke --kernel fwd_sm90 > $OUT/$tool-fwd_sm90.log 2>&1; echo "$tool rc=$? $(grep -E 'SUMMARY' $OUT/$tool-fwd_sm90.log | tail -1)"
done
FL=d64_causal,sq1024_sk1024_h32_d64_full,sq512_sk512_h32_d64_full,sq2048_sk2048_h16_d128_causal,sq4096_sk4096_h16_d128_causal,sq8192_sk8192_h16_d128_causal,sq1024_sk1024_h16_d128_causal
scratch/bin/fc bench --suite sweep --list-json | python3 -c "
import json, sys
d = json.load(sys.stdin); fl = '$FL'.split(','); d['cases'] = [c for c in d['cases'] if any(f in c['name'] for f in fl)]
json.dump(d, open('$OUT/suite.json', 'w'))"
for r in 1 2 3; do
  for b in fcP fc; do FLASHCORE_CACHE_DIR=/tmp/c_$b timeout 100 scratch/bin/$b bench --suite sweep --filter $FL --no-verify --json $OUT/${b}_$r.json > $OUT/${b}_$r.txt 2>&1 || echo "$b $r failed"; done
  timeout 150 python3 bench/anchors.py --suite-json $OUT/suite.json --backends cudnn --out-dir $OUT/cudnn_$r > $OUT/cudnn_$r.log 2>&1 || echo "anchors $r failed"
done
python3 - <<'PY'
import json, glob, statistics as st, collections
r = collections.defaultdict(lambda: collections.defaultdict(list))
for b in ('fcP', 'fc'):
    for i in (1, 2, 3):
        for x in json.load(open(f'/tmp/w37/{b}_{i}.json'))['results']: r[x['case']['name']][b].append(x['tflops'])
for i in (1, 2, 3):
    for f in glob.glob(f'/tmp/w37/cudnn_{i}/*.json'):
        for x in json.load(open(f))['results']:
            if x.get('tflops'): r[x['case']['name']]['cudnn'].append(x['tflops'])
for n, d in r.items():
    c = st.median(d['cudnn'])
    print(n[:36].ljust(36), ' | '.join(f"{b} " + ' '.join(f"{x:4.0f}" for x in d[b]) for b in ('fcP', 'fc', 'cudnn')), f"| fc/fcP {st.median(d['fc'])/st.median(d['fcP']):.3f} fc/cudnn {st.median(d['fc'])/c:.3f}")
PY
