#!/usr/bin/env bash
# Device run 44: D64 four consumer warpgroups 256x64 s4 (112 regs; fc4a) vs 192x128 (fc), then fc check --full at HEAD.
set -uo pipefail
FINAL=$OUT; OUT=/tmp/w44; rm -rf $OUT; mkdir -p $OUT
trap 'tar czf $FINAL/run.tgz -C /tmp w44' EXIT
nvidia-smi --query-gpu=name,clocks.sm,power.draw,temperature.gpu --format=csv > $OUT/smi0.txt
FLASHCORE_CACHE_DIR=/tmp/c_fc4a timeout 60 scratch/bin/fc4a check --quick --kernel fwd_sm90 > $OUT/check_fc4a.txt 2>&1; echo "check --quick fc4a rc=$? $(tail -1 $OUT/check_fc4a.txt)"
F=b8_sq2048_sk2048_h32_d64,b1_sq16384_sk16384_h32_d64,b32_sq512_sk512_h32_d64_full,b16_sq1024_sk1024_h32_d64_full
i=0
for b in fc4a fc fc fc4a fc4a fc; do
  i=$((i+1))
  FLASHCORE_CACHE_DIR=/tmp/c_$b timeout 60 scratch/bin/$b bench --suite sweep --filter $F --no-verify --json $OUT/sweep_${b}_$i.json > $OUT/sweep_${b}_$i.txt 2>&1 || { echo "sweep $b $i failed rc=$?"; }
  FLASHCORE_CACHE_DIR=/tmp/c_$b timeout 30 scratch/bin/$b bench --suite seed --filter b16_sq2048 --no-verify --json $OUT/seed_${b}_$i.json > $OUT/seed_${b}_$i.txt 2>&1 || echo "seed $b $i failed"
done
python3 - <<'PY'
import json, glob, collections
r = collections.defaultdict(lambda: collections.defaultdict(list))
for f in sorted(glob.glob('/tmp/w44/s*_*.json')):
    b = f.split('/')[-1].split('_')[1]
    for x in json.load(open(f))['results']:
        r[x['case']['name']][b].append(x['tflops'])
for n, d in r.items():
    print(n[:38].ljust(38), ' | '.join(f"{b} " + ' '.join(f"{x:4.0f}" for x in d[b]) for b in ('fc', 'fc4a')))
PY
FLASHCORE_CACHE_DIR=/tmp/c_fc4a timeout 60 compute-sanitizer --tool synccheck --error-exitcode 1 scratch/bin/fc4a check --smoke --kernel fwd_sm90 > $OUT/sync_fc4a.txt 2>&1; echo "synccheck fc4a rc=$?"
FLASHCORE_CACHE_DIR=/tmp/c_fc timeout 280 scratch/bin/fc check --full > $OUT/checkfull_fc.txt 2>&1; echo "check --full fc rc=$? $(tail -1 $OUT/checkfull_fc.txt)"
