#!/usr/bin/env bash
# Device run 74: check --full with the new unscaled large-logits cases (fwd_sm90's rescore path,
# warp_qk, past f32's exp2 range) on every kernel, and the sanitizers on the new smoke cases.
set -uo pipefail
FINAL=$OUT; OUT=/tmp/w74; rm -rf $OUT; mkdir -p $OUT
trap 'tar czf $FINAL/run.tgz -C /tmp w74' EXIT
export FLASHCORE_CACHE_DIR=/tmp/c74
F=scratch/bin/fc
timeout 240 $F check --full > $OUT/checkfull.txt 2>&1; echo "check --full rc=$? $(tail -1 $OUT/checkfull.txt)"
grep -E "scale1_|scale1 " $OUT/checkfull.txt | grep large | head -4
for k in fwd_sm90 fwd_sm80; do for tool in memcheck racecheck synccheck; do
  [ $k = fwd_sm80 ] && [ $tool = synccheck ] && continue
  timeout 120 compute-sanitizer --tool $tool --error-exitcode 1 $F check --smoke --kernel $k > $OUT/san_${k}_$tool.txt 2>&1; echo "$k $tool rc=$? $(grep -h 'passed\|SUMMARY' $OUT/san_${k}_$tool.txt | tr '\n' ' ')"
done; done
