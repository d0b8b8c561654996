#!/usr/bin/env bash
# One-off (session 8): the merged tree (90675b1+) on the GPU: checks of the changed kernels' new
# forms and the whole Python suite side by side, then the speed rows, binaries alternating.
set -u
export FLASHCORE_NVRTC=$(ls /opt/torch/.venv/lib/python3*/site-packages/nvidia/cu13/lib/libnvrtc.so.13)
OLD=scratch/bin/flashcore; NEW=scratch/bin-new/flashcore; PY=/opt/torch/.venv/bin/python; mkdir -p /tmp/l /tmp/j; T0=$SECONDS
$PY -m pip install -q --no-deps --force-reinstall scratch/lead/wheel/*.whl > /tmp/l/pip.log 2>&1; echo "pip rc=$?"
mkdir -p target/wheels && cp scratch/lead/wheel/*.whl target/wheels/
( export FLASHCORE_CACHE_DIR=/tmp/fc-90; timeout 230 $NEW check --kernel fwd_sm90 --only paged > $OUT/paged-fwd_sm90.log 2>&1; echo "rc=$?" >> $OUT/paged-fwd_sm90.log ) &
( export FLASHCORE_CACHE_DIR=/tmp/fc-80; timeout 230 $NEW check --kernel fwd_sm80 --only varlen > $OUT/varlen-fwd_sm80.log 2>&1; echo "rc=$?" >> $OUT/varlen-fwd_sm80.log ) &
( cd python/tests && FLASHCORE_CACHE_DIR=/tmp/fc-py timeout 320 $PY -m pytest -q -p no:cacheprovider . > $OUT/pytest.log 2>&1; echo "pytest rc=$?" >> $OUT/pytest.log ) &
wait; echo "checks + pytest $((SECONDS-T0)) s"
for r in 1 2; do for b in base new; do BIN=$OLD; [ $b = new ] && BIN=$NEW
  FLASHCORE_CACHE_DIR=/tmp/fc-$b timeout 70 $BIN bench --suite paged --filter sq512,sq1024,sq2048 --samples 20 --json /tmp/j/prefill-$b-r$r.json > /dev/null 2>&1
  FLASHCORE_CACHE_DIR=/tmp/fc-$b timeout 40 $BIN bench --suite varlen --filter decode_varlen,b16_sq1_ --samples 30 --json /tmp/l/d-$b-$r.json > /dev/null 2>&1
done; done
echo "bench $((SECONDS-T0)) s"
$PY docs/results/raw/h100-80gb-hbm3/sm90-page16/summary.py /tmp/j | tee $OUT/prefill-summary.txt
$PY - <<'PY'
import json, glob, statistics, collections
t = collections.defaultdict(lambda: collections.defaultdict(list)); kern = {}
for f in sorted(glob.glob("/tmp/l/d-*.json")):
    b = f.split("/d-")[1].rsplit("-", 1)[0]
    for r in json.load(open(f))["results"]:
        t[r["case"]["name"][:40]][b].append(r.get("gbps") or 0); kern[(r["case"]["name"][:40], b)] = r.get("kernel", "")
for k, v in t.items():
    for b, g in sorted(v.items()):
        print(f"{k:40s} {b:5s} {statistics.median(g):6.0f} GB/s  rounds {['%.0f' % x for x in g]}  {kern[(k, b)][-45:]}")
PY
tar czf $OUT/json.tgz -C /tmp j l
for f in $OUT/*.log; do echo "== $(basename $f): $(grep -E 'passed|failed' $f | tail -1) $(tail -1 $f)"; grep -E " FAIL|^FAILED|^ERROR" $f | head -5; done
echo "total $((SECONDS-T0)) s"
