#!/usr/bin/env bash
# Device run 72: a tile's first block without its max too (shift 0, lift both ways, rescore) (fb)
# vs HEAD before it (ls: 259ffb5 + small L2 sections). Correctness first, then interleaved rounds
# on short and long rows, normal and fallback inputs.
set -uo pipefail
FINAL=$OUT; OUT=/tmp/w72; rm -rf $OUT; mkdir -p $OUT
trap 'tar czf $FINAL/run.tgz -C /tmp w72' EXIT
export FLASHCORE_CACHE_DIR=/tmp/c_fb
timeout 200 scratch/bin/fb check --full --kernel fwd_sm90 > $OUT/checkfull_fb.txt 2>&1; echo "check --full fwd_sm90 fb rc=$? $(tail -1 $OUT/checkfull_fb.txt)"
for tool in memcheck racecheck synccheck; do
  timeout 150 compute-sanitizer --tool $tool --error-exitcode 1 scratch/bin/fb check --smoke --kernel fwd_sm90 > $OUT/san_$tool.txt 2>&1; echo "$tool rc=$? $(grep -h 'passed\|SUMMARY' $OUT/san_$tool.txt | tr '\n' ' ')"
done
F=sq512_sk512_h32_d64,sq1024_sk1024_h32_d64,sq512_sk512_h16_d128,sq1024_sk1024_h16_d128,b8_sq2048_sk2048_h32_d64,b8_sq2048_sk2048_h16_d128,b1_sq16384_sk16384_h32_d64_full,b1_sq16384_sk16384_h16_d128_full
i=0
for b in ls fb fb ls ls fb; do
  i=$((i+1))
  FLASHCORE_CACHE_DIR=/tmp/c_$b timeout 90 scratch/bin/$b bench --suite sweep --filter $F --no-verify --json $OUT/sweep_${b}_$i.json > $OUT/sweep_${b}_$i.txt 2>&1 || echo "sweep $b $i failed rc=$?"
  FLASHCORE_CACHE_DIR=/tmp/c_$b timeout 30 scratch/bin/$b bench --suite seed --filter b16_sq2048,b32_sq512 --no-verify --json $OUT/seed_${b}_$i.json > $OUT/seed_${b}_$i.txt 2>&1 || echo "seed $b $i failed"
  for inp in large-logits rising-logits; do
    FLASHCORE_CACHE_DIR=/tmp/c_$b timeout 60 scratch/bin/$b bench --suite sweep --filter sq512_sk512_h32_d64_causal,sq512_sk512_h16_d128_full --inputs $inp --json $OUT/s${inp}_${b}_$i.json > $OUT/inp_${inp}_${b}_$i.txt 2>&1 || echo "inputs $inp $b failed rc=$?"
  done
done
python3 - <<'PY'
import json, glob, collections, statistics as st
r = collections.defaultdict(lambda: collections.defaultdict(list))
err = {}
for f in sorted(glob.glob('/tmp/w72/s*_*_*.json')):
    base = f.split('/')[-1]
    kind, b = base.split('_')[0], base.split('_')[1]
    inp = 'normal' if kind in ('sweep', 'seed') else kind[1:]
    for x in json.load(open(f))['results']:
        key = (inp, x['case']['name'])
        r[key][b].append(x['median_ms'] * 1000)
        if x.get('rel_error') is not None: err[(key, b)] = x['rel_error']
print("microseconds per round; last column: median ls/fb (> 1: fb faster); rel_error ls / fb where verified")
for (inp, n), d in r.items():
    e = f"{err.get(((inp, n), 'ls'), float('nan')):.1e} / {err.get(((inp, n), 'fb'), float('nan')):.1e}"
    print(inp[:13].ljust(13), n[:38].ljust(38), ' | '.join(f"{b} " + ' '.join(f"{x:7.1f}" for x in d[b]) for b in ("ls", "fb")),
          f" {st.median(d['ls'])/st.median(d['fb']):.3f}  {e}")
PY
