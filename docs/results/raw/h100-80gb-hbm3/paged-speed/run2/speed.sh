#!/usr/bin/env bash
# Task A, attribution: main vs new (3 slots + lookups 4 tiles a read) vs s2 (2 slots + the same lookups), interleaved.
S=scratch/paged-speed
export FLASHCORE_NVRTC=$(ls /opt/torch/.venv/lib/python3*/site-packages/nvidia/cu13/lib/libnvrtc.so.13)
export FLASHCORE_CACHE_DIR=/tmp/fc-cache
nvidia-smi -L
start=$(date +%s)
for b in flashcore-main flashcore flashcore-s2; do timeout 120 $S/$b bench --suite paged --filter sk4096 --samples 3 > $OUT/warm_$b.log 2>&1; echo "warm $b rc=$?"; done
for r in 1 2 3; do
  for b in flashcore-main flashcore flashcore-s2; do
    timeout 100 $S/$b bench --suite paged --json $OUT/${b}_r$r.json > /dev/null 2>&1; echo "$b r$r rc=$? t=$(( $(date +%s) - start ))"
  done
done
python3 - <<'PY'
import json, os, statistics
out = os.environ["OUT"]
def load(p):
    try: return {r["case"]["name"]: r for r in json.load(open(p))["results"] if r.get("gbps")}
    except Exception as e: print("no", p, e); return {}
names = ["paged16", "paged64", "paged256", "paged16-ordered", "paged16+append", "paged64+append", "paged256+append"]
for b in ["flashcore-main", "flashcore", "flashcore-s2"]:
    print(f"== {b}: ratio to its own dense row (min-max over 3 rounds); dense GB/s; copy GB/s")
    runs = [load(f"{out}/{b}_r{r}.json") for r in (1, 2, 3)]
    for s in [4096, 8192, 16384, 32768, 65536, 131072]:
        pre = f"b8_sq1_sk{s}_h32kv8_d128_full_bf16_"
        cells = []
        dense = [x[pre + "dense"]["gbps"] for x in runs if pre + "dense" in x]
        cells.append(f"dense {min(dense):.0f}-{max(dense):.0f}")
        for n in names:
            rs = [x[pre + n]["gbps"] / x[pre + "dense"]["gbps"] for x in runs if pre + n in x]
            g = [x[pre + n]["gbps"] for x in runs if pre + n in x]
            if rs: cells.append(f"{n} {min(rs):.3f}-{max(rs):.3f} ({statistics.median(g):.0f})")
        cp = [x[pre + "hbm-copy"]["gbps"] for x in runs if pre + "hbm-copy" in x]
        if cp: cells.append(f"copy {min(cp):.0f}-{max(cp):.0f}")
        print(f"S{s}: " + " | ".join(cells))
PY
