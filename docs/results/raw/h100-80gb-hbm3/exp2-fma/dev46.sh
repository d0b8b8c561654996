#!/usr/bin/env bash
# Device run 45: exp2 on the FMA pipe for every k-th 8-column chunk (fe8/fe5/fe4/fe3) vs MUFU only (fc).
set -uo pipefail
FINAL=$OUT; OUT=/tmp/w46; rm -rf $OUT; mkdir -p $OUT
trap 'tar czf $FINAL/run.tgz -C /tmp w46' EXIT
nvidia-smi --query-gpu=name,clocks.sm,power.draw,temperature.gpu --format=csv > $OUT/smi0.txt
FLASHCORE_CACHE_DIR=/tmp/c_fe4 timeout 90 scratch/bin/fe4 check --quick --kernel fwd_sm90 > $OUT/check_fe4.txt 2>&1; echo "check --quick fe4 rc=$? $(tail -1 $OUT/check_fe4.txt)"
F=b8_sq2048_sk2048_h32_d64_full,b1_sq16384_sk16384_h32_d64,b1_sq16384_sk16384_h16_d128_full
i=0
for b in fc fe16 fe8 fe4 fe4 fe8 fe16 fc; do
  i=$((i+1))
  FLASHCORE_CACHE_DIR=/tmp/c_$b timeout 60 scratch/bin/$b bench --suite sweep --filter $F --no-verify --json $OUT/sweep_${b}_$i.json > $OUT/sweep_${b}_$i.txt 2>&1 || { echo "sweep $b $i failed rc=$?"; }
  FLASHCORE_CACHE_DIR=/tmp/c_$b timeout 30 scratch/bin/$b bench --suite seed --filter b16_sq2048 --no-verify --json $OUT/seed_${b}_$i.json > $OUT/seed_${b}_$i.txt 2>&1 || echo "seed $b $i failed"
done
nvidia-smi --query-gpu=name,clocks.sm,power.draw,temperature.gpu --format=csv > $OUT/smi1.txt
python3 - <<'PY'
import json, glob, collections
r = collections.defaultdict(lambda: collections.defaultdict(list))
for f in sorted(glob.glob('/tmp/w46/s*_*.json')):
    b = f.split('/')[-1].split('_')[1]
    for x in json.load(open(f))['results']:
        r[x['case']['name']][b].append(x['tflops'])
for n, d in r.items():
    print(n[:38].ljust(38), ' | '.join(f"{b} " + ' '.join(f"{x:4.0f}" for x in d[b]) for b in ("fc", "fe16", "fe8", "fe4")))
PY
FLASHCORE_CACHE_DIR=/tmp/c_fe4 timeout 200 scratch/bin/fe4 check --full --kernel fwd_sm90 > $OUT/checkfull_fe4.txt 2>&1; echo "check --full fwd_sm90 fe4 rc=$? $(tail -1 $OUT/checkfull_fe4.txt)"
