#!/usr/bin/env bash
# Device run 61: softmax without the block max (exp at the current max, mma.sync slow path):
# sk = D64 only, ska = all head dims (D128/D256 with 8-40 B of tile-level spill), fc = HEAD (d742cf9).
set -uo pipefail
FINAL=$OUT; OUT=/tmp/w61; rm -rf $OUT; mkdir -p $OUT
trap 'tar czf $FINAL/run.tgz -C /tmp w61' EXIT
nvidia-smi --query-gpu=name,clocks.sm,power.draw,temperature.gpu --format=csv > $OUT/smi0.txt
for b in sk ska; do
  FLASHCORE_CACHE_DIR=/tmp/c_$b timeout 120 scratch/bin/$b check --quick --kernel fwd_sm90 > $OUT/check_$b.txt 2>&1; echo "check --quick $b rc=$? $(tail -1 $OUT/check_$b.txt)"
done
F=b8_sq2048_sk2048_h32_d64_full,b1_sq16384_sk16384_h32_d64,b1_sq16384_sk16384_h16_d128,b8_sq2048_sk2048_h16_d128_full,b1_sq16384_sk16384_h8_d256_full
i=0
for b in fc sk ska ska sk fc fc sk ska; do
  i=$((i+1))
  FLASHCORE_CACHE_DIR=/tmp/c_$b timeout 60 scratch/bin/$b bench --suite sweep --filter $F --no-verify --json $OUT/sweep_${b}_$i.json > $OUT/sweep_${b}_$i.txt 2>&1 || echo "sweep $b $i failed rc=$?"
  FLASHCORE_CACHE_DIR=/tmp/c_$b timeout 30 scratch/bin/$b bench --suite seed --filter b16_sq2048 --no-verify --json $OUT/seed_${b}_$i.json > $OUT/seed_${b}_$i.txt 2>&1 || echo "seed $b $i failed"
done
nvidia-smi --query-gpu=name,clocks.sm,power.draw,temperature.gpu --format=csv > $OUT/smi1.txt
python3 - <<'PY'
import json, glob, collections, statistics as st
r = collections.defaultdict(lambda: collections.defaultdict(list))
for f in sorted(glob.glob('/tmp/w61/s*_*.json')):
    b = f.split('/')[-1].split('_')[1]
    for x in json.load(open(f))['results']:
        r[x['case']['name']][b].append(x['tflops'])
print("TFLOPS per round; last columns: median sk/fc, ska/fc")
for n, d in r.items():
    print(n[:40].ljust(40), ' | '.join(f"{b} " + ' '.join(f"{x:4.0f}" for x in d[b]) for b in ("fc", "sk", "ska")),
          f" {st.median(d['sk'])/st.median(d['fc']):.3f} {st.median(d['ska'])/st.median(d['fc']):.3f}")
PY
FLASHCORE_CACHE_DIR=/tmp/c_ska timeout 240 scratch/bin/ska check --full --kernel fwd_sm90 > $OUT/checkfull_ska.txt 2>&1; echo "check --full fwd_sm90 ska rc=$? $(tail -1 $OUT/checkfull_ska.txt)"
grep -i "fail" $OUT/checkfull_ska.txt | head -5
