#!/usr/bin/env bash
# One-off (session 8, helper sm90-page16), third call: base (branch point) against solo3 (page
# boxes spread over the producer warps' lane 0 above 3 boxes a block; the committed kernel) and
# leaderonly (solo3's producer loop alone: no helpers, no entry or q_empty change), to find what
# costs page 64. Chunked-prefill rows, binaries alternating, three rounds.
set -u
export FLASHCORE_NVRTC=$(ls /opt/torch/.venv/lib/python3*/site-packages/nvidia/cu13/lib/libnvrtc.so.13)
export FLASHCORE_CACHE_DIR=/tmp/fc-page16
B=scratch/page16
nvidia-smi --query-gpu=name,clocks.sm,power.draw,temperature.gpu --format=csv,noheader
mkdir -p /tmp/j
for r in 1 2 3; do for b in base solo3 leaderonly; do
  timeout 60 $B/flashcore-$b bench --suite paged --filter sq512,sq1024,sq2048 --rounds 2 --samples 20 --json /tmp/j/prefill-$b-r$r.json > /dev/null 2>&1; echo "$b r$r rc=$?"
done; done
python3 $B/summary.py /tmp/j | tee $OUT/summary.txt
tar czf $OUT/prefill-json.tgz -C /tmp/j .
