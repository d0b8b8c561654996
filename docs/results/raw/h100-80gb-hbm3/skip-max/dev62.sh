#!/usr/bin/env bash
# Device run 62: skip-max, spill-free build. nw = skip-max at every head dim but 256, nwa = also D256,
# fc = HEAD (d742cf9). Correctness (check --full fwd_sm90 on nw, --quick on nwa), interleaved rounds,
# the slow path's cost (rising/large logits), and the 16k rows verified against the GPU reference.
set -uo pipefail
FINAL=$OUT; OUT=/tmp/w62; rm -rf $OUT; mkdir -p $OUT
trap 'tar czf $FINAL/run.tgz -C /tmp w62' EXIT
nvidia-smi --query-gpu=name,clocks.sm,power.draw,temperature.gpu --format=csv > $OUT/smi0.txt
FLASHCORE_CACHE_DIR=/tmp/c_nwa timeout 120 scratch/bin/nwa check --quick --kernel fwd_sm90 > $OUT/check_nwa.txt 2>&1; echo "check --quick nwa rc=$? $(tail -1 $OUT/check_nwa.txt)"
F=b8_sq2048_sk2048_h32_d64_full,b1_sq16384_sk16384_h32_d64,b1_sq16384_sk16384_h16_d128,b8_sq2048_sk2048_h16_d128_full,b1_sq16384_sk16384_h8_d256,b8_sq2048_sk2048_h8_d256_full,b32_sq512_sk512_h32_d64_causal,b32_sq512_sk512_h16_d128_causal,b16_sq1024_sk1024_h16_d128_full
i=0
for b in fc nw nwa nwa nw fc fc nw nwa; do
  i=$((i+1))
  FLASHCORE_CACHE_DIR=/tmp/c_$b timeout 60 scratch/bin/$b bench --suite sweep --filter $F --no-verify --json $OUT/sweep_${b}_$i.json > $OUT/sweep_${b}_$i.txt 2>&1 || echo "sweep $b $i failed rc=$?"
  FLASHCORE_CACHE_DIR=/tmp/c_$b timeout 30 scratch/bin/$b bench --suite seed --filter b16_sq2048 --no-verify --json $OUT/seed_${b}_$i.json > $OUT/seed_${b}_$i.txt 2>&1 || echo "seed $b $i failed"
  FLASHCORE_CACHE_DIR=/tmp/c_$b timeout 30 scratch/bin/$b bench --suite dims --filter d96,d192 --no-verify --json $OUT/sdims_${b}_$i.json > $OUT/dims_${b}_$i.txt 2>&1 || echo "dims $b $i failed"
done
nvidia-smi --query-gpu=name,clocks.sm,power.draw,temperature.gpu --format=csv > $OUT/smi1.txt
python3 - <<'PY'
import json, glob, collections, statistics as st
r = collections.defaultdict(lambda: collections.defaultdict(list))
for f in sorted(glob.glob('/tmp/w62/s*_*.json')):
    b = f.split('/')[-1].split('_')[1]
    for x in json.load(open(f))['results']:
        r[x['case']['name']][b].append(x['tflops'])
print("TFLOPS per round; last columns: median nw/fc, nwa/fc")
for n, d in r.items():
    print(n[:40].ljust(40), ' | '.join(f"{b} " + ' '.join(f"{x:4.0f}" for x in d[b]) for b in ("fc", "nw", "nwa")),
          f" {st.median(d['nw'])/st.median(d['fc']):.3f} {st.median(d['nwa'])/st.median(d['fc']):.3f}")
PY
G=b1_sq16384_sk16384_h32_d64_full,b1_sq16384_sk16384_h16_d128_full,b8_sq2048_sk2048_h32_d64_full
for inp in rising-logits large-logits; do for b in fc nw; do
  FLASHCORE_CACHE_DIR=/tmp/c_$b timeout 60 scratch/bin/$b bench --suite sweep --filter $G --inputs $inp --json $OUT/inp_${inp}_${b}.json > $OUT/inp_${inp}_${b}.txt 2>&1 || echo "inputs $inp $b failed rc=$?"
done; done
FLASHCORE_CACHE_DIR=/tmp/c_nw timeout 90 scratch/bin/nw bench --suite sweep --filter sk16384 --json $OUT/verify_nw.json > $OUT/verify_nw.txt 2>&1; echo "verified 16k rows rc=$?"
python3 - <<'PY'
import json, glob
for f in sorted(glob.glob('/tmp/w62/inp_*.json')) + ['/tmp/w62/verify_nw.json']:
    try:
        for x in json.load(open(f))['results']:
            print(f.split('/')[-1][:-5].ljust(24), x['case']['name'][:40].ljust(40), f"{x['tflops']:5.0f}", x['rel_error'])
    except Exception as e: print(f, e)
PY
FLASHCORE_CACHE_DIR=/tmp/c_nw timeout 240 scratch/bin/nw check --full --kernel fwd_sm90 > $OUT/checkfull_nw.txt 2>&1; echo "check --full fwd_sm90 nw rc=$? $(tail -1 $OUT/checkfull_nw.txt)"
grep -i "fail" $OUT/checkfull_nw.txt | head -5
