#!/usr/bin/env bash
# Device run 31: lazy-max softmax in fwd_sm90 (fc) vs HEAD d473820 (fc0), interleaved; then check --full fwd_sm90.
set -uo pipefail
FINAL=$OUT; OUT=/tmp/w31; rm -rf $OUT; mkdir -p $OUT
trap 'tar czf $FINAL/run.tgz -C /tmp w31' EXIT
nvidia-smi --query-gpu=clocks.sm,power.draw,temperature.gpu --format=csv,noheader
FL=sq16384,b16_sq2048
i=0
for b in fc0 fc fc fc0 fc0 fc fc fc0; do
  i=$((i+1))
  FLASHCORE_CACHE_DIR=/tmp/c_$b timeout 120 scratch/bin/$b bench --suite seed --filter $FL --no-verify --json $OUT/seed_${b}_$i.json > $OUT/seed_${b}_$i.txt 2>&1 || echo "bench $b $i failed"
done
for b in fc0 fc fc fc0; do
  i=$((i+1))
  FLASHCORE_CACHE_DIR=/tmp/c_$b timeout 120 scratch/bin/$b bench --suite sweep --filter sq512_,sq1024_,sq4096_ --no-verify --json $OUT/sweep_${b}_$i.json > $OUT/sweep_${b}_$i.txt 2>&1 || echo "sweep $b $i failed"
done
nvidia-smi --query-gpu=clocks.sm,power.draw,temperature.gpu --format=csv,noheader
python3 - <<'PY'
import json, glob, statistics as st, collections
for suite in ('seed', 'sweep'):
    r = collections.defaultdict(lambda: collections.defaultdict(list))
    for f in sorted(glob.glob(f'/tmp/w31/{suite}_*.json')):
        b = f.split('_')[1]
        for x in json.load(open(f))['results']:
            r[x['case']['name']][b].append(x['tflops'])
    for n, d in r.items():
        a, c = d['fc0'], d['fc']
        print(n[:40].ljust(40), 'old', ' '.join(f"{x:4.0f}" for x in a), '| new', ' '.join(f"{x:4.0f}" for x in c), f"| {st.median(c)/st.median(a):.3f}")
PY
FLASHCORE_CACHE_DIR=/tmp/c_fc timeout 240 scratch/bin/fc check --full --kernel fwd_sm90 > $OUT/check_sm90.txt 2>&1; echo "check sm90 rc=$? $(tail -1 $OUT/check_sm90.txt)"
grep -E "FAIL|rising|scale" $OUT/check_sm90.txt | grep -v " ok" | head -5
