#!/usr/bin/env bash
# One-off (session 8): varlen decode GQA packing + the dQ writer fix on the GPU.
set -u
export FLASHCORE_NVRTC=$(ls /opt/torch/.venv/lib/python3*/site-packages/nvidia/cu13/lib/libnvrtc.so.13)
OLD=scratch/bin/flashcore; NEW=scratch/bin-new/flashcore; PY=/opt/torch/.venv/bin/python; mkdir -p /tmp/l; T0=$SECONDS
$PY -m pip install -q --no-deps --force-reinstall scratch/lead/wheel/*.whl > /tmp/l/pip.log 2>&1; echo "pip rc=$?"
( export FLASHCORE_CACHE_DIR=/tmp/fc-race; timeout 150 compute-sanitizer --tool racecheck --error-exitcode 1 $NEW check --smoke --kernel bwd_sm90 --only varlen > /tmp/l/race-varlen.log 2>&1; echo "rc=$?" >> /tmp/l/race-varlen.log ) &
( export FLASHCORE_CACHE_DIR=/tmp/fc-80; timeout 280 $NEW check --kernel fwd_sm80 --only varlen > $OUT/varlen-fwd_sm80.log 2>&1; echo "rc=$?" >> $OUT/varlen-fwd_sm80.log ) &
( export FLASHCORE_CACHE_DIR=/tmp/fc-90; timeout 280 $NEW check --quick --kernel bwd_sm90 > $OUT/quick-bwd_sm90.log 2>&1; echo "rc=$?" >> $OUT/quick-bwd_sm90.log ) &
wait; echo "checks $((SECONDS-T0)) s"
for r in 1 2 3; do for b in old new; do
  BIN=$OLD; [ $b = new ] && BIN=$NEW
  FLASHCORE_CACHE_DIR=/tmp/fc-80 timeout 60 $BIN bench --suite varlen --filter decode_varlen,b16_sq1_ --samples 30 --json /tmp/l/dec-$b-$r.json > /tmp/l/dec-$b-$r.txt 2>&1
done; done
echo "bench $((SECONDS-T0)) s"
$PY - <<'PY'
import json, glob, statistics
t = {}
for f in sorted(glob.glob("/tmp/l/dec-*.json")):
    b = f.split("dec-")[1].split("-")[0]
    for r in json.load(open(f))["results"]:
        t.setdefault(r["case"]["name"], {}).setdefault(b, []).append((r.get("median_ms"), r.get("gbps")))
for k, v in t.items():
    o = statistics.median(x[0] for x in v["old"]); n = statistics.median(x[0] for x in v["new"])
    print(f"{k[:60]:60s} old {o*1e3:8.1f} us ({statistics.median(x[1] or 0 for x in v['old']):6.0f} GB/s)  new {n*1e3:8.1f} us ({statistics.median(x[1] or 0 for x in v['new']):6.0f} GB/s)  old/new {o/n:.2f}x")
PY
cd python/tests && FLASHCORE_CACHE_DIR=/tmp/fc-py timeout $(( 570 - (SECONDS-T0) )) $PY -m pytest -q -x -p no:cacheprovider . > $OUT/pytest.log 2>&1; echo "pytest rc=$?"; cd ../..
tail -3 $OUT/pytest.log
tar czf $OUT/logs.tgz -C /tmp l
for f in /tmp/l/race-*.log $OUT/*.log; do echo "== $(basename $f): $(grep -E 'passed|failed|RACECHECK SUMMARY|ERROR SUMMARY' $f | tail -2 | tr '\n' ' ') $(tail -1 $f)"; grep -E " FAIL" $f | head -3; done
echo "total $((SECONDS-T0)) s"
