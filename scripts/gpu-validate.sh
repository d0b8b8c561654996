#!/usr/bin/env bash
# On a GPU machine: device info, ahead-of-time compile report, the full correctness suite,
# compute-sanitizer (memcheck, racecheck; synccheck for the sm_90 kernels) on one small case per variant, and the quick
# benchmark. Logs go to the folder given as $1 (default: gpu-validate-out).
#   scripts/gpu-validate.sh [OUT_DIR] [--bin target/release/flashcore]
set -uo pipefail
out="${1:-gpu-validate-out}"
bin="${FLASHCORE_BIN:-target/release/flashcore}"
mkdir -p "$out"
status=0
step() {
    local name="$1"; shift
    echo "== $name: $*"
    local t0=$SECONDS
    if "$@" >"$out/$name.log" 2>&1; then echo "   ok ($((SECONDS - t0)) s)"; else echo "   FAILED ($((SECONDS - t0)) s): see $out/$name.log"; status=1; fi
    tail -n 3 "$out/$name.log" | sed 's/^/   | /'
}
step info "$bin" info
step compile "$bin" compile
step check-full "$bin" check --full
if command -v compute-sanitizer >/dev/null; then
    for kernel in fwd_sm80 fwd_sm90 bwd_sm80 bwd_sm90; do
        for tool in memcheck racecheck; do
            step "sanitizer-$tool-$kernel" timeout 150 compute-sanitizer --tool "$tool" --error-exitcode 1 "$bin" check --smoke --kernel "$kernel"
        done
    done
    # Named barriers and mbarriers (warp specialization) are what synccheck checks.
    for kernel in fwd_sm90 bwd_sm90; do
        step "sanitizer-synccheck-$kernel" timeout 150 compute-sanitizer --tool synccheck --error-exitcode 1 "$bin" check --smoke --kernel "$kernel"
    done
else
    echo "compute-sanitizer not found: sanitizer runs skipped"; status=1
fi
step bench-quick "$bin" bench --suite quick --json "$out/bench-quick.json"
exit $status
