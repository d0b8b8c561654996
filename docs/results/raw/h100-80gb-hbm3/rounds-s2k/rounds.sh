#!/usr/bin/env bash
# Device run 39: sweep rows with S >= 2k, flashcore (default kernels) and cuDNN interleaved, 3 rounds each.
set -uo pipefail
FINAL=$OUT; OUT=/tmp/w39; rm -rf $OUT; mkdir -p $OUT
trap 'tar czf $FINAL/run.tgz -C /tmp w39' EXIT
export FLASHCORE_CACHE_DIR=/tmp/c39 FLASHCORE_BIN=scratch/bin/fc
F=scratch/bin/fc
$F compile --kernel fwd_sm90 > /dev/null 2>&1
FL=sq2048_,sq4096_,sq8192_,sq16384_
$F bench --suite sweep --list-json | python3 -c "
import json, sys
d = json.load(sys.stdin); d['cases'] = [c for c in d['cases'] if c['seqlen_q'] >= 2048]; d['suite'] = 'sweep'
json.dump(d, open('$OUT/suite.json', 'w'))"
for r in 1 2 3; do
  timeout 100 $F bench --suite sweep --filter $FL --json $OUT/fc_$r.json > $OUT/fc_$r.txt 2>&1; echo "fc $r rc=$?"
  timeout 150 python3 bench/anchors.py --suite-json $OUT/suite.json --backends cudnn --out-dir $OUT/cudnn_${r}_x > $OUT/cudnn_$r.log 2>&1 || echo "anchors $r failed"
  echo "cudnn $r done"
done
python3 - <<'PY'
import json, glob, statistics as st
fc = [{r['case']['name']: r['tflops'] for r in json.load(open(f'/tmp/w39/fc_{i}.json'))['results']} for i in (1, 2, 3)]
cu = [{}, {}, {}]
for i in (1, 2, 3):
    for f in glob.glob(f'/tmp/w39/cudnn_{i}_*/*.json'):
        for r in json.load(open(f))['results']:
            if r.get('tflops'): cu[i - 1][r['case']['name']] = r['tflops']
ahead_med = ahead_all = 0
for n in fc[0]:
    a = [x[n] for x in fc]; b = [x.get(n, 0) for x in cu]
    ahead_med += st.median(a) > st.median(b); ahead_all += all(x > y for x, y in zip(a, b))
    print(n[:36].ljust(36), 'fc', ' '.join(f"{x:5.0f}" for x in a), '| cudnn', ' '.join(f"{x:5.0f}" for x in b), f"| med ratio {st.median(a)/st.median(b):.3f}")
print(f"median over rounds ahead: {ahead_med}/{len(fc[0])}; ahead in every round: {ahead_all}/{len(fc[0])}")
PY
# ncu, one launch after three, clocks as found: the 16k target rows and fp16 S2k D64.
for c in b1_sq16384_sk16384_h32_d64_full_bf16 b1_sq16384_sk16384_h16_d128_full_bf16 b1_sq16384_sk16384_h8_d256_full_bf16 b1_sq16384_sk16384_h16_d128_causal_bf16 b16_sq2048_sk2048_h16_d64_full_f16; do
  timeout 100 ncu --clock-control none --target-processes all -k regex:fc_fwd_sm90 --launch-skip 3 --launch-count 1 \
    --section SpeedOfLight --metrics sm__pipe_tensor_op_hmma_cycles_active.avg.pct_of_peak_sustained_active,sm__inst_executed_pipe_xu.avg.pct_of_peak_sustained_active,smsp__issue_active.avg.pct_of_peak_sustained_active \
    $F bench --suite seed --filter $c --samples 2 --eager --no-verify > $OUT/ncu-$c.txt 2>&1
  echo "$c rc=$? $(grep -E 'Duration|SM Frequency|hmma_cycles|pipe_xu|issue_active' $OUT/ncu-$c.txt | awk '{print $(NF-1), $NF}' | tr '\n' ' ')"
done
# The dims suite (D32/D96/D192) with its anchors.
timeout 120 $F bench --suite dims --json $OUT/flashcore-dims.json > $OUT/dims.txt 2>&1; echo "dims rc=$?"
$F bench --suite dims --list-json > $OUT/suite-dims.json
timeout 200 python3 bench/anchors.py --suite-json $OUT/suite-dims.json --out-dir $OUT/anchors-dims > $OUT/anchors-dims.log 2>&1; echo "anchors dims rc=$?"
$F info > $OUT/info.txt 2>&1
nvidia-smi > $OUT/nvidia-smi.txt 2>&1
