#!/usr/bin/env bash
# Device run 69: where the short causal rows go (B32 H32 S512 D64 causal, 0.80x of cuDNN): ncu on
# flashcore's launch (259ffb5) and on cuDNN's (PyTorch SDPA, CUDNN backend), same shape.
set -uo pipefail
FINAL=$OUT; OUT=/tmp/w69; rm -rf $OUT; mkdir -p $OUT
trap 'tar czf $FINAL/run.tgz -C /tmp w69' EXIT
export FLASHCORE_CACHE_DIR=/tmp/c69
BIN=scratch/bin/fc
$BIN compile --kernel fwd_sm90 > /dev/null 2>&1
SECT="--section SpeedOfLight --section MemoryWorkloadAnalysis --section WarpStateStats --section SchedulerStats --section LaunchStats"
MET="--metrics dram__bytes_read.sum,dram__bytes_write.sum,lts__t_bytes.sum,sm__pipe_tensor_op_hmma_cycles_active.avg.pct_of_peak_sustained_active,sm__inst_executed_pipe_xu.avg.pct_of_peak_sustained_active,lts__t_sector_hit_rate.pct"
for c in b32_sq512_sk512_h32_d64_causal_bf16 b32_sq512_sk512_h32_d64_full_bf16; do
  timeout 150 ncu --clock-control none -k regex:fc_fwd_sm90 --launch-skip 2 --launch-count 1 $SECT $MET \
    $BIN bench --suite sweep --filter $c --samples 2 --eager --no-verify > $OUT/ncu-fc-$c.txt 2>&1; echo "fc $c rc=$?"
done
cat > $OUT/sdpa.py <<'PY'
import torch, sys
from torch.nn.attention import sdpa_kernel, SDPBackend
causal = sys.argv[1] == "causal"
q, k, v = (torch.randn(32, 32, 512, 64, device="cuda", dtype=torch.bfloat16) for _ in range(3))
with sdpa_kernel([SDPBackend.CUDNN_ATTENTION]):
    for _ in range(4):
        torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=causal)
torch.cuda.synchronize()
PY
for m in causal full; do
  timeout 150 ncu --clock-control none --launch-skip 2 --launch-count 1 $SECT $MET python3 $OUT/sdpa.py $m > $OUT/ncu-cudnn-$m.txt 2>&1; echo "cudnn $m rc=$?"
done
for f in $OUT/ncu-*.txt; do
  echo "== $(basename $f)"
  grep -E "^  [a-zA-Z_].*\(|Duration|DRAM Throughput|Memory Throughput|L2 Hit Rate|Compute \(SM\) Throughput|dram__bytes|lts__t_bytes|hmma_cycles|pipe_xu|No Eligible|Issue Slots Busy|Grid Size|Block Size|Registers Per|Dynamic Shared|Waves Per SM|sector_hit" $f | head -24
done
