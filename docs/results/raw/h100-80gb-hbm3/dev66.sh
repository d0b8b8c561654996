#!/usr/bin/env bash
# Device run 66: run-all (main results page: sweep seed quick small with SDPA anchors) at 259ffb5 (skip-max).
set -uo pipefail
FINAL=$OUT; OUT=/tmp/w66; rm -rf $OUT; mkdir -p $OUT
trap 'tar czf $FINAL/run.tgz -C /tmp w66' EXIT
export FLASHCORE_CACHE_DIR=/tmp/fccache60
F=scratch/bin/fc
timeout 560 bash bench/run-all.sh --bin $F --out $OUT/raw --results-dir $OUT/results --suites "sweep seed quick small" > $OUT/run-all.log 2>&1; echo "run-all rc=$?"
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm,temperature.gpu,power.draw,power.limit --format=csv > $OUT/nvidia-smi.txt 2>&1
cat $OUT/nvidia-smi.txt
grep -A16 "Suite \`seed\`" $OUT/results/*.md | awk -F'|' '{print $2,$3,$5,$6,$7,$10,$11,$12,$14}'
