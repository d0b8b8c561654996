#!/bin/bash
# Nsight Compute on the short-sequence sweep rows where cuDNN still leads (clocks as found).
# Run from the repository root on the GPU machine: bash docs/results/raw/h100-80gb-hbm3/ncu/ncu-short.sh BIN
export FLASHCORE_CACHE_DIR=/tmp/fc
O=${OUT:-/tmp/out}; mkdir -p $O
BIN=${1:-target/release/flashcore}
$BIN compile --kernel fwd_sm90 > /dev/null 2>&1
t=$SECONDS
for c in b32_sq512_sk512_h16_d128_causal_bf16 b32_sq512_sk512_h32_d64_causal_bf16 b32_sq512_sk512_h16_d128_full_bf16; do
  timeout 120 ncu --clock-control none --target-processes all -k regex:fc_fwd_sm90 --launch-skip 2 --launch-count 1 \
    --section SpeedOfLight --section WarpStateStats --section SchedulerStats --section Occupancy --section LaunchStats \
    --metrics sm__pipe_tensor_op_hmma_cycles_active.avg.pct_of_peak_sustained_active,sm__pipe_tensor_op_hmma_cycles_active.max.pct_of_peak_sustained_active,sm__pipe_tensor_op_hmma_cycles_active.min.pct_of_peak_sustained_active,sm__inst_executed_pipe_xu.avg.pct_of_peak_sustained_active,sm__cycles_active.avg,sm__cycles_elapsed.max,smsp__pcsamp_warps_issue_stalled_barrier,smsp__pcsamp_warps_issue_stalled_long_scoreboard,smsp__pcsamp_warps_issue_stalled_wait \
    $BIN bench --suite sweep --filter $c --samples 2 --eager --no-verify > $O/ncu-$c.txt 2>&1
  echo "$c rc=$? at $((SECONDS-t)) s"
  grep -E "Duration|SM Frequency|Compute \(SM\) Throughput|hmma_cycles|pipe_xu|Issue Slots Busy|No Eligible|Active Warps Per|sm__cycles" $O/ncu-$c.txt | head -14
done
