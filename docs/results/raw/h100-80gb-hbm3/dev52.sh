#!/usr/bin/env bash
# Device run 52: gpu-validate (info, compile, check --full, sanitizers, bench quick) on the final binary.
set -uo pipefail
FINAL=$OUT; OUT=/tmp/w52; rm -rf $OUT; mkdir -p $OUT
trap 'tar czf $FINAL/run.tgz -C /tmp w52' EXIT
export FLASHCORE_BIN=scratch/bin/fc FLASHCORE_CACHE_DIR=/tmp/fccache52
timeout 560 bash scripts/gpu-validate.sh $OUT/validate 2>&1 | grep -E "^==|ok \(|FAILED|passed|SUMMARY"
