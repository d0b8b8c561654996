#!/usr/bin/env bash
# Device run 73: the session's final binary (kernels and host of ffa2ba5: 259ffb5 + small
# L2 sections for causal Sk <= 1024, D <= 128): gpu-validate, then run-all (results page).
set -uo pipefail
FINAL=$OUT; OUT=/tmp/w73; rm -rf $OUT; mkdir -p $OUT
trap 'tar czf $FINAL/run.tgz -C /tmp w73' EXIT
export FLASHCORE_BIN=scratch/bin/fc FLASHCORE_CACHE_DIR=/tmp/fccache73
timeout 250 bash scripts/gpu-validate.sh $OUT/validate 2>&1 | grep -E "^==|ok \(|FAILED|passed|SUMMARY"
timeout 300 bash bench/run-all.sh --bin scratch/bin/fc --out $OUT/raw --results-dir $OUT/results --suites "sweep seed quick small" > $OUT/run-all.log 2>&1; echo "run-all rc=$?"
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm,temperature.gpu,power.draw,power.limit --format=csv > $OUT/nvidia-smi.txt 2>&1
grep -A10 "Suite \`seed\`" $OUT/results/*.md | awk -F'|' '{print $2,$3,$5,$6,$7,$10,$11,$12,$14}'
grep -A40 "Suite \`sweep\`" $OUT/results/*.md | grep "causal" | awk -F'|' '{print $2,$3,$6,$7,$10,$11,$14}'
