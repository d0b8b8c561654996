#!/usr/bin/env bash
# On a GPU machine with PyTorch: installs a flashcore-attn wheel (target/wheels/flashcore_attn-*.whl,
# built anywhere with `maturin build --release -m python/Cargo.toml -o target/wheels`), compiles the kernels
# ahead of time with the NVRTC the package picked (so no test waits on NVRTC), then runs the
# Python GPU suite (pytest: API, bad input, torch.compile, CUDA graphs, transformers) and
# the per-call overhead benchmark. Logs and JSON go to OUT_DIR.
#   scripts/gpu-python.sh WHEEL [OUT_DIR]      (PYTHON=python3, FLASHCORE_BIN=target/release/flashcore)
set -uo pipefail
wheel="${1:?usage: scripts/gpu-python.sh WHEEL [OUT_DIR]}"
out="${2:-gpu-python-out}"
py="${PYTHON:-python3}"
bin="${FLASHCORE_BIN:-target/release/flashcore}"
mkdir -p "$out"
status=0
"$py" -m pip install --no-deps --force-reinstall --quiet "$wheel" || { echo "installing $wheel failed"; exit 1; }
nvrtc="$("$py" -c 'import os, flashcore; print(os.environ.get("FLASHCORE_NVRTC", ""))')" || exit 1
"$py" -c 'import flashcore; print(flashcore.device_info())' | tee "$out/device.txt"
if [[ -x "$bin" ]]; then
    echo "== $bin compile (kernel cache for the package; NVRTC: ${nvrtc:-found by the library itself})"
    if [[ -n "$nvrtc" ]]; then export FLASHCORE_NVRTC="$nvrtc"; fi
    "$bin" compile > "$out/compile.log" 2>&1 || { echo "   compile FAILED: see $out/compile.log"; status=1; }
    tail -n 1 "$out/compile.log"
else
    echo "no $bin: the tests compile each kernel on first use (slower)"
fi
echo "== pytest python/tests"
FLASHCORE_WHEEL="$wheel" "$py" -m pytest python/tests -q -rs -s -p no:cacheprovider --junitxml "$out/pytest.xml" 2>&1 | tee "$out/pytest.log"
[[ ${PIPESTATUS[0]} == 0 ]] || status=1
echo "== bench/python_overhead.py"
"$py" bench/python_overhead.py --json "$out/python-overhead.json" 2>&1 | tee "$out/python-overhead.log"
[[ ${PIPESTATUS[0]} == 0 ]] || status=1
exit $status
