#!/usr/bin/env bash
# Prints, as shell exports, the environment for building crates/flashcore-candle:
#   eval "$(scripts/cuda-for-candle.sh)"
# (scripts/test.sh does). candle-core compiles its kernels with nvcc and links the CUDA
# libraries (cuBLAS, cuRAND, NVRTC, the runtime, the driver) at build time. This installs nvcc,
# the headers and those libraries from PyPI into ./.venv-cuda when they are missing. The core
# `flashcore` crate needs none of it.
#
# No driver here (CI's machine has no GPU): the link step gets a stub libcuda.so made from the
# driver API that cudarc binds (every function returns CUDA_ERROR_STUB_LIBRARY); the test
# binaries load the real libcuda.so.1 where there is one, the stub elsewhere (the tests that
# run there make no CUDA call).
set -euo pipefail
repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
venv="$repo/.venv-cuda"
# CUDA 13.0: the driver's JIT must read the PTX candle's build emits (13.0 is PyTorch's).
packages=("nvidia-cuda-nvcc==13.0.*" "nvidia-nvvm==13.0.*" "nvidia-cuda-runtime==13.0.*" "nvidia-cuda-crt==13.0.*"
          "nvidia-cuda-cccl==13.0.*" "nvidia-cuda-nvrtc==13.0.*" "nvidia-cublas==13.0.*" "nvidia-curand")
cuda_root() { ls -d "$venv"/lib/python3*/site-packages/nvidia/cu13 2>/dev/null | head -n 1; }
root=$(cuda_root || true)
if [ -z "$root" ] || [ ! -x "$root/bin/nvcc" ]; then
    echo "== nvcc and the CUDA libraries not found: installing them from PyPI into .venv-cuda" >&2
    python3 -m venv "$venv" >&2
    "$venv/bin/python" -m pip install --quiet --disable-pip-version-check "${packages[@]}" >&2
    root=$(cuda_root) || { echo "error: the CUDA wheels installed, but no nvidia/cu13 folder under .venv-cuda" >&2; exit 1; }
    [ -x "$root/bin/nvcc" ] || { echo "error: nvidia-cuda-nvcc installed, but $root/bin/nvcc is missing" >&2; exit 1; }
fi

# The linker wants unversioned names; the wheels ship sonames only.
link="$venv/link"
mkdir -p "$link"
for lib in cublas cublasLt curand nvrtc cudart; do
    so=$(ls "$root/lib/lib$lib.so."* 2>/dev/null | grep -v alt | head -n 1 || true)
    [ -n "$so" ] || { echo "error: lib$lib.so.* missing under $root/lib" >&2; exit 1; }
    ln -sf "$so" "$link/lib$lib.so"
done

# The driver stub, from the driver API of the cudarc that candle-core resolves to.
stubs="$venv/stubs"
if [ ! -f "$stubs/libcuda.so" ]; then
    cudarc=$(cd "$repo/crates/flashcore-candle" && cargo metadata --locked --format-version 1 |
        python3 -c 'import json, sys; print(next(p["manifest_path"] for p in json.load(sys.stdin)["packages"] if p["name"] == "cudarc"))')
    bindings="$(dirname "$cudarc")/src/driver/sys/mod.rs"
    [ -f "$bindings" ] || { echo "error: cudarc's driver bindings not found at $bindings" >&2; exit 1; }
    mkdir -p "$stubs"
    grep -oE '^\s+fn cu[A-Za-z0-9_]+\(' "$bindings" | sed -E 's/^\s+fn (cu[A-Za-z0-9_]+)\(/\1/' | sort -u |
        awk '{print "int " $1 "(void) { return 34; /* CUDA_ERROR_STUB_LIBRARY */ }"}' > "$stubs/cuda_stub.c"
    [ -s "$stubs/cuda_stub.c" ] || { echo "error: no driver functions found in $bindings" >&2; exit 1; }
    cc -shared -fPIC -o "$stubs/libcuda.so" -Wl,-soname,libcuda.so.1 "$stubs/cuda_stub.c"
    ln -sf libcuda.so "$stubs/libcuda.so.1"
fi

# The compute capability candle's kernels are built for (their PTX runs on it and newer).
cap="${CUDA_COMPUTE_CAP:-80}"
# At run time: the real driver first where there is one, the stub otherwise.
driver_dirs=$(ldconfig -p 2>/dev/null | awk '/libcuda\.so\.1 /{print $NF}' | xargs -r -n1 dirname | sort -u | paste -sd: - || true)
echo "export PATH=\"$root/bin:\$PATH\""
echo "export CUDA_ROOT=\"$root\""
echo "export LIBRARY_PATH=\"$link:$stubs\${LIBRARY_PATH:+:\$LIBRARY_PATH}\""
echo "export CUDA_COMPUTE_CAP=\"$cap\""
echo "export CUDAFORGE_THREADS=\"\${CUDAFORGE_THREADS:-$(nproc)}\""
echo "export LD_LIBRARY_PATH=\"${driver_dirs:+$driver_dirs:}$root/lib:$stubs\${LD_LIBRARY_PATH:+:\$LD_LIBRARY_PATH}\""
echo "== CUDA for candle: nvcc $("$root/bin/nvcc" --version | grep -oE 'release [0-9.]+' | head -n 1), CUDA_COMPUTE_CAP=$cap" >&2
