#!/usr/bin/env bash
# One-off (session 8, helper sm90-page16), first call: fwd_sm90 paged with a key block's page
# boxes issued by lane 0 of each producer warp at every page size (flashcore-new, the span
# divided out per load) against the branch point f0dcb42 (flashcore-base).
set -u
export FLASHCORE_NVRTC=$(ls /opt/torch/.venv/lib/python3*/site-packages/nvidia/cu13/lib/libnvrtc.so.13)
export FLASHCORE_CACHE_DIR=/tmp/fc-page16
B=scratch/page16
nvidia-smi --query-gpu=name,clocks.sm,power.draw,temperature.gpu --format=csv,noheader
timeout 170 $B/flashcore-new check --kernel fwd_sm90 --only paged > $OUT/check-paged-new.log 2>&1; echo "check rc=$? $(grep -E 'passed|failed' $OUT/check-paged-new.log | tail -2 | tr '\n' ' ')"
for r in 1 2; do for b in base new; do
  timeout 75 $B/flashcore-$b bench --suite paged --filter sq512,sq1024,sq2048 --rounds 2 --samples 20 --json $OUT/prefill-$b-r$r.json > $OUT/bench-$b-r$r.log 2>&1; echo "$b r$r rc=$?"
done; done
python3 $B/summary.py $OUT | tee $OUT/summary.txt
