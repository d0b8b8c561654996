#!/usr/bin/env bash
# One-off (session 8): chunked prefill base vs merged, three more alternating rounds (page 64's
# spread between the first call's two rounds), then bwd_sm90's check --full alone.
set -u
export FLASHCORE_NVRTC=$(ls /opt/torch/.venv/lib/python3*/site-packages/nvidia/cu13/lib/libnvrtc.so.13)
OLD=scratch/bin/flashcore; NEW=scratch/bin-new/flashcore; PY=/opt/torch/.venv/bin/python; mkdir -p /tmp/j2; T0=$SECONDS
for r in 1 2 3; do for b in base new; do BIN=$OLD; [ $b = new ] && BIN=$NEW
  FLASHCORE_CACHE_DIR=/tmp/fc-$b timeout 70 $BIN bench --suite paged --filter sq512,sq1024,sq2048 --samples 20 --json /tmp/j2/prefill-$b-r$r.json > /dev/null 2>&1
done; done
echo "bench $((SECONDS-T0)) s"
$PY docs/results/raw/h100-80gb-hbm3/sm90-page16/summary.py /tmp/j2 | tee $OUT/prefill-summary-b.txt
$PY - <<'PY'
import json
for b in ("base", "new"):
    for x in json.load(open(f"/tmp/j2/prefill-{b}-r1.json"))["results"]:
        if "sq1024" in x["case"]["name"]: print(b, x["case"]["name"][-28:], x.get("kernel", "")[-60:])
PY
tar czf $OUT/json-b.tgz -C /tmp j2
( export FLASHCORE_CACHE_DIR=/tmp/fc-b90; timeout $(( 560 - (SECONDS-T0) )) $NEW check --full --kernel bwd_sm90 > $OUT/full-bwd_sm90.log 2>&1; echo "rc=$?" >> $OUT/full-bwd_sm90.log )
echo "== full bwd_sm90: $(grep -E 'passed|failed' $OUT/full-bwd_sm90.log | tail -1) $(tail -1 $OUT/full-bwd_sm90.log)"; grep -E " FAIL" $OUT/full-bwd_sm90.log | head -5
echo "total $((SECONDS-T0)) s"
