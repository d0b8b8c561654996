#!/usr/bin/env bash
# Device run 71: the rule (ls): causal with Sk <= 1024 takes 8 MiB sections, at least one tile
# per CTA a section; vs 259ffb5 (fc). Causal rows up to 2k (2k: same code path, control),
# check --quick first.
set -uo pipefail
FINAL=$OUT; OUT=/tmp/w71; rm -rf $OUT; mkdir -p $OUT
trap 'tar czf $FINAL/run.tgz -C /tmp w71' EXIT
FLASHCORE_CACHE_DIR=/tmp/c_ls timeout 120 scratch/bin/ls check --quick --kernel fwd_sm90 > $OUT/check_ls.txt 2>&1; echo "check --quick ls rc=$? $(tail -1 $OUT/check_ls.txt)"
i=0
for b in fc ls ls fc fc ls; do
  i=$((i+1))
  FLASHCORE_CACHE_DIR=/tmp/c_$b timeout 90 scratch/bin/$b bench --suite sweep --filter sq512_sk512_h32_d64_causal,sq1024_sk1024_h32_d64_causal,sq2048_sk2048_h32_d64_causal,sq512_sk512_h16_d128_causal,sq1024_sk1024_h16_d128_causal,sq2048_sk2048_h16_d128_causal,sq512_sk512_h8_d256_causal,sq1024_sk1024_h8_d256_causal --no-verify --json $OUT/sweep_${b}_$i.json > $OUT/sweep_${b}_$i.txt 2>&1 || echo "sweep $b $i failed rc=$?"
  FLASHCORE_CACHE_DIR=/tmp/c_$b timeout 60 scratch/bin/$b bench --suite small --filter causal --no-verify --json $OUT/small_${b}_$i.json > $OUT/small_${b}_$i.txt 2>&1 || echo "small $b $i failed rc=$?"
done
python3 - <<'PY'
import json, glob, collections, statistics as st
r = collections.defaultdict(lambda: collections.defaultdict(list))
for f in sorted(glob.glob('/tmp/w71/s*_*_*.json')):
    b = f.split('/')[-1].split('_')[1]
    for x in json.load(open(f))['results']:
        r[x['case']['name']][b].append(x['median_ms'] * 1000)
print("microseconds per round; last column: median fc/ls (> 1: ls faster)")
for n, d in r.items():
    print(n[:40].ljust(40), ' | '.join(f"{b} " + ' '.join(f"{x:7.1f}" for x in d[b]) for b in ("fc", "ls")), f" {st.median(d['fc'])/st.median(d['ls']):.3f}")
PY
