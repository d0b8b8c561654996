#!/bin/bash
export FLASHCORE_CACHE_DIR=/tmp/fc
O=${OUT:-/tmp/out}; mkdir -p $O
BIN=target/release/flashcore
$BIN compile --kernel fwd_sm90 > /dev/null 2>&1
t=$SECONDS
for c in b1_sq16384_sk16384_h32_d64_full_bf16 b1_sq16384_sk16384_h16_d128_full_bf16 b1_sq16384_sk16384_h8_d256_full_bf16 b16_sq2048_sk2048_h16_d64_full_f16; do
  timeout 170 ncu --target-processes all -k regex:fc_fwd_sm90 --launch-skip 2 --launch-count 1 \
    --section SpeedOfLight --section ComputeWorkloadAnalysis --section WarpStateStats --section SchedulerStats --section Occupancy --section InstructionStats \
    --metrics sm__pipe_tensor_op_hmma_cycles_active.avg.pct_of_peak_sustained_active,sm__inst_executed_pipe_xu.avg.pct_of_peak_sustained_active,smsp__cycles_active.avg,sm__cycles_elapsed.avg.per_second,gpc__cycles_elapsed.max,smsp__average_warp_latency_issue_stalled_barrier,smsp__average_warps_issue_stalled_long_scoreboard_per_issue_active.ratio \
    $BIN bench --suite seed --filter $c --samples 2 --eager --no-verify > $O/ncu-$c.txt 2>&1
  echo "$c rc=$? at $((SECONDS-t)) s"
  grep -E "Duration|SM Frequency|Compute \(SM\) Throughput|Memory Throughput|hmma_cycles|pipe_xu|Issue Slots Busy|No Eligible|Stall|Registers Per|cycles_elapsed.avg.per_second" $O/ncu-$c.txt | head -20
done
