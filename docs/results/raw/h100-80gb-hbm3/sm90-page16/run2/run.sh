#!/usr/bin/env bash
# One-off (session 8, helper sm90-page16), second call: base (f0dcb42) against new (boxes spread
# at every page size, span divided out per load), all (every page size, span hoisted) and solo3
# (span hoisted, the producer alone up to 3 boxes a block: the committed kernel). Paged checks,
# then the chunked-prefill rows, binaries alternating.
set -u
export FLASHCORE_NVRTC=$(ls /opt/torch/.venv/lib/python3*/site-packages/nvidia/cu13/lib/libnvrtc.so.13)
export FLASHCORE_CACHE_DIR=/tmp/fc-page16
B=scratch/page16
nvidia-smi --query-gpu=name,clocks.sm,power.draw,temperature.gpu --format=csv,noheader
for b in solo3 all; do
  timeout 100 $B/flashcore-$b check --kernel fwd_sm90 --only paged > $OUT/check-$b.log 2>&1; echo "check $b rc=$? $(grep -E 'passed|failed' $OUT/check-$b.log | tail -1)"
done
mkdir -p /tmp/j
for r in 1 2; do for b in base new all solo3; do
  timeout 60 $B/flashcore-$b bench --suite paged --filter sq512,sq1024,sq2048 --rounds 2 --samples 20 --json /tmp/j/prefill-$b-r$r.json > /dev/null 2>&1; echo "$b r$r rc=$?"
done; done
python3 $B/summary.py /tmp/j | tee $OUT/summary.txt
tar czf $OUT/prefill-json.tgz -C /tmp/j .
