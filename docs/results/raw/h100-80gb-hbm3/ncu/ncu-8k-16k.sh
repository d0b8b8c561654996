#!/usr/bin/env bash
# ncu (clocks as found) of fwd_sm90 D128 full at 8k (B2) and 16k (B1). Run from the repository root on the GPU machine with OUT set.
set -uo pipefail
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
export FLASHCORE_CACHE_DIR=/tmp/c27
F=${1:-target/release/flashcore}
$F compile --kernel fwd_sm90 > /dev/null 2>&1
for c in b2_sq8192_sk8192_h16_d128_full_bf16 b1_sq16384_sk16384_h16_d128_full_bf16; do
  timeout 200 ncu --clock-control none --target-processes all -k regex:fc_fwd_sm90 --launch-skip 3 --launch-count 1 \
    --section SpeedOfLight --section MemoryWorkloadAnalysis --section SchedulerStats \
    --metrics sm__pipe_tensor_op_hmma_cycles_active.avg.pct_of_peak_sustained_active,sm__cycles_elapsed.avg.per_second,lts__t_sector_hit_rate.pct,dram__bytes_read.sum,lts__t_bytes.sum,sm__cycles_active.avg,sm__cycles_active.max,sm__cycles_active.min \
    $F bench --suite sweep --filter $c --samples 2 --eager --no-verify > $OUT/single-launch-$c.txt 2>&1
  echo "$c rc=$?"
  grep -E "Duration|SM Frequency|hmma_cycles|hit_rate|dram__bytes|lts__t_bytes|sm__cycles_active|L2 Hit|DRAM Throughput|Issued Warp|No Eligible|cycles_elapsed.avg.per" $OUT/single-launch-$c.txt | head -16
done
