#!/usr/bin/env bash
# Device run 68: O in a tile of its own where it fits (D64, short D96/D128/D192 tiles), so the
# next tile's V loads need not wait for the O store (so) vs 259ffb5 (fc). Correctness first
# (check --full fwd_sm90, the three sanitizers on the smoke cases), then interleaved rounds.
set -uo pipefail
FINAL=$OUT; OUT=/tmp/w68; rm -rf $OUT; mkdir -p $OUT
trap 'tar czf $FINAL/run.tgz -C /tmp w68' EXIT
export FLASHCORE_CACHE_DIR=/tmp/c_so
timeout 200 scratch/bin/so check --full --kernel fwd_sm90 > $OUT/checkfull_so.txt 2>&1; echo "check --full fwd_sm90 so rc=$? $(tail -1 $OUT/checkfull_so.txt)"
for tool in memcheck racecheck synccheck; do
  timeout 150 compute-sanitizer --tool $tool --error-exitcode 1 scratch/bin/so check --smoke --kernel fwd_sm90 > $OUT/san_$tool.txt 2>&1; echo "$tool rc=$? $(grep -h 'passed\|SUMMARY' $OUT/san_$tool.txt | tr '\n' ' ')"
done
F=sq512_,sq1024_,b8_sq2048_sk2048_h32_d64,b1_sq16384_sk16384_h32_d64_full,b8_sq2048_sk2048_h16_d128_causal
i=0
for b in fc so so fc fc so; do
  i=$((i+1))
  FLASHCORE_CACHE_DIR=/tmp/c_$b timeout 90 scratch/bin/$b bench --suite sweep --filter $F --no-verify --json $OUT/sweep_${b}_$i.json > $OUT/sweep_${b}_$i.txt 2>&1 || echo "sweep $b $i failed rc=$?"
  FLASHCORE_CACHE_DIR=/tmp/c_$b timeout 30 scratch/bin/$b bench --suite seed --filter b16_sq2048,b32_sq512 --no-verify --json $OUT/seed_${b}_$i.json > $OUT/seed_${b}_$i.txt 2>&1 || echo "seed $b $i failed"
  FLASHCORE_CACHE_DIR=/tmp/c_$b timeout 30 scratch/bin/$b bench --suite small --no-verify --json $OUT/small_${b}_$i.json > $OUT/small_${b}_$i.txt 2>&1 || echo "small $b $i failed"
done
python3 - <<'PY'
import json, glob, collections, statistics as st
r = collections.defaultdict(lambda: collections.defaultdict(list))
for f in sorted(glob.glob('/tmp/w68/s*_*_*.json')):
    b = f.split('/')[-1].split('_')[1]
    for x in json.load(open(f))['results']:
        r[x['case']['name']][b].append(x['median_ms'] * 1000)
print("microseconds per round; last column: median fc/so (> 1: so faster)")
for n, d in r.items():
    print(n[:40].ljust(40), ' | '.join(f"{b} " + ' '.join(f"{x:7.1f}" for x in d[b]) for b in ("fc", "so")), f" {st.median(d['fc'])/st.median(d['so']):.3f}")
PY
