#!/usr/bin/env bash
# Device run 64: the final skip-max build (nw3: lift() for finite overshoots, warp_qk only for
# overflow/NaN, spill-free): A/B against fc2 (HEAD d742cf9 kernels + bench --inputs), normal and
# slow-path inputs, then gpu-validate (check --full all kernels, sanitizers with the new
# large-logits smoke cases, compile, bench quick).
set -uo pipefail
FINAL=$OUT; OUT=/tmp/w64; rm -rf $OUT; mkdir -p $OUT
trap 'tar czf $FINAL/run.tgz -C /tmp w64' EXIT
nvidia-smi --query-gpu=name,clocks.sm,power.draw,temperature.gpu --format=csv > $OUT/smi0.txt
F=b8_sq2048_sk2048_h32_d64_full,b1_sq16384_sk16384_h32_d64_full,b1_sq16384_sk16384_h16_d128,b8_sq2048_sk2048_h16_d128_full
i=0
for b in fc2 nw3 nw3 fc2; do
  i=$((i+1))
  FLASHCORE_CACHE_DIR=/tmp/c_$b timeout 60 scratch/bin/$b bench --suite sweep --filter $F --no-verify --json $OUT/sweep_${b}_$i.json > $OUT/sweep_${b}_$i.txt 2>&1 || echo "sweep $b $i failed rc=$?"
  FLASHCORE_CACHE_DIR=/tmp/c_$b timeout 30 scratch/bin/$b bench --suite seed --filter b16_sq2048 --no-verify --json $OUT/seed_${b}_$i.json > $OUT/seed_${b}_$i.txt 2>&1 || echo "seed $b $i failed"
  for inp in rising-logits large-logits; do
    FLASHCORE_CACHE_DIR=/tmp/c_$b timeout 60 scratch/bin/$b bench --suite sweep --filter b8_sq2048_sk2048_h32_d64_full,b1_sq16384_sk16384_h16_d128_full --inputs $inp --json $OUT/s${inp}_${b}_$i.json > $OUT/inp_${inp}_${b}_$i.txt 2>&1 || echo "inputs $inp $b failed rc=$?"
    FLASHCORE_CACHE_DIR=/tmp/c_$b timeout 30 scratch/bin/$b bench --suite seed --filter b16_sq2048 --inputs $inp --json $OUT/s${inp}-f16_${b}_$i.json > $OUT/inpf_${inp}_${b}_$i.txt 2>&1 || echo "inputs f16 $inp $b failed rc=$?"
  done
done
python3 - <<'PY'
import json, glob, collections, statistics as st
r = collections.defaultdict(lambda: collections.defaultdict(list))
err = {}
for f in sorted(glob.glob('/tmp/w64/s*_*.json')):
    base = f.split('/')[-1]
    kind, b = base.split('_')[0], base.split('_')[1]
    inp = 'normal' if kind in ('sweep', 'seed') else kind[1:].replace('-f16', '')
    for x in json.load(open(f))['results']:
        key = (inp, x['case']['name'])
        r[key][b].append(x['tflops'])
        if x.get('rel_error') is not None: err[(key, b)] = x['rel_error']
print("TFLOPS per round; last column: median nw3/fc2; rel_error fc2 / nw3 where verified")
for (inp, n), d in r.items():
    e = f"{err.get(((inp, n), 'fc2'), float('nan')):.1e} / {err.get(((inp, n), 'nw3'), float('nan')):.1e}"
    print(inp[:13].ljust(13), n[:38].ljust(38), ' | '.join(f"{b} " + ' '.join(f"{x:4.0f}" for x in d[b]) for b in ("fc2", "nw3")),
          f" {st.median(d['nw3'])/st.median(d['fc2']):.3f}  {e}")
PY
export FLASHCORE_BIN=scratch/bin/nw3 FLASHCORE_CACHE_DIR=/tmp/fccache64
timeout 420 bash scripts/gpu-validate.sh $OUT/validate 2>&1 | grep -E "^==|ok \(|FAILED|passed|SUMMARY"
