#!/usr/bin/env bash
# Task A: paged decode (3-slot ring on sm_90, lookups 4 tiles at a time) vs main, interleaved.
S=scratch/paged-speed
export FLASHCORE_NVRTC=$(ls /opt/torch/.venv/lib/python3*/site-packages/nvidia/cu13/lib/libnvrtc.so.13)
export FLASHCORE_CACHE_DIR=/tmp/fc-cache
nvidia-smi -L; nvidia-smi --query-gpu=clocks.sm,clocks.mem,power.draw,temperature.gpu --format=csv
start=$(date +%s)
# warm the JIT caches (both binaries) on the smallest case
timeout 120 $S/flashcore-main bench --suite paged --filter sk4096 --samples 3 > $OUT/warm_main.log 2>&1; echo "warm main rc=$?"
timeout 120 $S/flashcore bench --suite paged --filter sk4096 --samples 3 > $OUT/warm_new.log 2>&1; echo "warm new rc=$?"
for r in 1 2; do
  timeout 100 $S/flashcore-main bench --suite paged --json $OUT/main_r$r.json > $OUT/main_r$r.log 2>&1; echo "main r$r rc=$? t=$(( $(date +%s) - start ))"
  timeout 100 $S/flashcore bench --suite paged --json $OUT/new_r$r.json > $OUT/new_r$r.log 2>&1; echo "new r$r rc=$? t=$(( $(date +%s) - start ))"
done
timeout 90 $S/flashcore check --kernel fwd_sm80 --only paged > $OUT/check_paged.log 2>&1; echo "check paged rc=$? t=$(( $(date +%s) - start ))"
tail -4 $OUT/check_paged.log
timeout 150 $S/flashcore check --quick --kernel fwd_sm80 > $OUT/check_quick.log 2>&1; echo "check quick rc=$? t=$(( $(date +%s) - start ))"
tail -4 $OUT/check_quick.log
python3 - <<'PY'
import json, os, glob
out = os.environ["OUT"]
def load(p):
    try: return {r["case"]["name"]: r for r in json.load(open(p))["results"] if r.get("gbps")}
    except Exception as e: print("no", p, e); return {}
for tag in ["main_r1", "new_r1", "main_r2", "new_r2"]:
    rows = load(f"{out}/{tag}.json")
    print(f"== {tag}")
    for s in [4096, 8192, 16384, 32768, 65536, 131072]:
        pre = f"b8_sq1_sk{s}_h32kv8_d128_full_bf16_"
        d = rows.get(pre + "dense", {}).get("gbps")
        if not d: continue
        cells = [f"dense {d:.0f}"]
        for n in ["hbm-copy", "paged16", "paged64", "paged256", "paged16-ordered", "paged16+append", "paged64+append"]:
            g = rows.get(pre + n, {}).get("gbps")
            if g: cells.append(f"{n} {g:.0f} ({g/d:.3f})")
        print(f"S{s}: " + " | ".join(cells))
PY
