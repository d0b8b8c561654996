#!/usr/bin/env bash
# The test command: finds NVRTC (or installs it from PyPI into ./.venv), then runs
# formatting, lints and every test, kernel compilation for every arch included, then the
# Python checks and the Python package's wheel. No GPU needed. Fails loudly on anything
# missing. Each stage's line starts with the time since the start ([mm:ss]).
#
# Time and disk (docs/testing.md has the measured figures): in this clone, target/ (the
# workspace, the kernels NVRTC compiled in target/kernel-cache, the minimum-Rust check in
# target/msrv) and the Python environments .venv, .venv-nvrtc-13.0 and .venv-cuda; outside
# it, the candle workspace's build in ~/.cache/flashcore/candle-target (or
# $FLASHCORE_CANDLE_TARGET), shared by every clone because candle's own CUDA kernels take
# most of ten minutes to compile. The last line says how much each holds.
set -euo pipefail
cd "$(dirname "$0")/.."
started=$SECONDS
stage() { printf '== [%02d:%02d] %s\n' $(((SECONDS - started) / 60)) $(((SECONDS - started) % 60)) "$*"; }

find_nvrtc() {
    for f in "${FLASHCORE_NVRTC:-}" "${CUDA_HOME:-/nonexistent}"/lib64/libnvrtc.so* /usr/local/cuda/lib64/libnvrtc.so* \
             .venv/lib/python3*/site-packages/nvidia/cu13/lib/libnvrtc.so.13; do
        [ -n "$f" ] && [ -f "$f" ] && { realpath "$f"; return 0; }
    done
    return 1
}

if ! nvrtc=$(find_nvrtc); then
    stage "NVRTC not found: installing nvidia-cuda-nvrtc from PyPI into .venv"
    python3 -m venv .venv
    .venv/bin/python -m pip install --quiet --disable-pip-version-check nvidia-cuda-nvrtc
    nvrtc=$(find_nvrtc) || { echo "error: nvidia-cuda-nvrtc installed but libnvrtc.so.13 not found under .venv" >&2; exit 1; }
fi
export FLASHCORE_NVRTC="$nvrtc"
stage "NVRTC: $FLASHCORE_NVRTC"

# Kernels compiled by NVRTC persist in target/kernel-cache between runs: an entry's key holds
# every source, the options and the NVRTC version, and keeps ptxas's log, so a hit checks the
# same resources, and an entry of another source or options is never read by key (the SASS
# checks read the entries `flashcore compile --keys` names). Entries older than the newest
# CUDA source are dropped first, which bounds the folders (a change to a family's Rust side,
# its launch steps say, keeps every entry whose key it left alone).
kernel_cache="$PWD/target/kernel-cache"
newest_kernel_file=$(find crates/flashcore/src/kernels -type f \( -name '*.cu' -o -name '*.cuh' \) -printf '%T@ %p\n' | sort -n | tail -n 1 | cut -d' ' -f2-)
[ ! -d "$kernel_cache" ] || find "$kernel_cache" -type f ! -newer "$newest_kernel_file" -delete
# Private (0700): FlashCore refuses a cache another user could write (a umask of 002 would
# make mkdir's folders group-writable).
mkdir -p "$kernel_cache"/{newest,nvrtc-13.0}
chmod 700 "$kernel_cache" "$kernel_cache"/{newest,nvrtc-13.0}

stage "cargo fmt --check"
cargo fmt --all -- --check
stage "cargo clippy"
cargo clippy --workspace --all-targets --locked -- -D warnings
stage "cargo test"
FLASHCORE_TEST_CACHE_DIR="$kernel_cache/newest" cargo test --workspace --locked
stage "the README's Rust example, as written (no GPU here: the f64 reference alone)"
cargo run --locked --quiet -p flashcore --example attention
stage "cargo doc (warnings are errors)"
# The libraries, then the CLI's binary on its own: the binary `flashcore` and the library
# `flashcore` share an output folder, and two rustdoc runs writing it at once race
# (rust-lang/cargo#6313: a run failed here with files missing).
RUSTDOCFLAGS="-D warnings" cargo doc --workspace --no-deps --locked --lib
RUSTDOCFLAGS="-D warnings" cargo doc -p flashcore-cli --no-deps --locked --bins

# The minimum Rust the README states (the workspace's rust-version): no locked dependency
# (here or in the candle workspace, which states its own) declares a newer one, clippy's
# incompatible_msrv lint (above) holds our code to it, and the workspace compiles with that
# very toolchain (rustup fetches it once, a minimal profile). A machine whose network gives
# no toolchain gets the first two checks and a WARNING line saying the third did not run.
stage "minimum Rust: dependencies' rust-versions, then cargo +MIN check"
python3 scripts/rust-version-check.py . crates/flashcore-candle
msrv=$(sed -n 's/^rust-version = "\(.*\)"$/\1/p' Cargo.toml)
if rustup run "$msrv" rustc --version > /dev/null 2>&1 || rustup toolchain install "$msrv" --profile minimal --no-self-update; then
    CARGO_TARGET_DIR=target/msrv cargo "+$msrv" check --workspace --all-targets --locked --quiet
    echo "   the workspace compiles with Rust $msrv"
else
    echo "WARNING: rustup could not install Rust $msrv (the stated minimum) here: only the dependencies' rust-versions and clippy's incompatible_msrv checked it" >&2
fi

# The crate as crates.io would hold it: packaged (every kernel source inside), unpacked out of
# the tree, built and unit-tested there with nothing of the workspace around it. Its build
# folder is the workspace's (the dependencies are the same crates: built once).
stage "the packaged crate, built and tested out of the tree"
cargo package -p flashcore --locked --no-verify --allow-dirty > /dev/null
cargo package -p flashcore --list --allow-dirty | grep -q '^src/kernels/fwd_sm90.cu$' || { echo "error: the packaged crate lacks its kernel sources" >&2; exit 1; }
packaged=$(mktemp -d)
tar xzf target/package/flashcore-*.crate -C "$packaged"
workspace_target="$PWD/target"
(cd "$packaged"/flashcore-* && CARGO_TARGET_DIR="$workspace_target" cargo test --lib --quiet)
rm -rf "$packaged"

# The Python side: an independent NumPy check of `flashcore attn --cpu`, and the benchmark
# scripts' self-tests (no GPU needed).
[ -x .venv/bin/python ] || python3 -m venv .venv
.venv/bin/python -m pip install --quiet --disable-pip-version-check numpy safetensors matplotlib nvidia-cuda-nvdisasm
cargo build --locked -p flashcore-cli
stage "scripts/sass-check.py (fwd_sm90 and bwd_sm90 SASS: wgmma, TMA, no local memory, exponentials under the tensor cores)"
.venv/bin/python scripts/sass-check.py --self-test
sass_cache="$kernel_cache/newest"  # cargo test's NVRTC: its fwd_sm90 and bwd_sm90 entries are there already
sass_keys=$(mktemp)
for kernel in fwd_sm90 bwd_sm90; do
    if ! FLASHCORE_CACHE_DIR="$sass_cache" target/debug/flashcore compile --arch sm_90a --kernel "$kernel" > "$sass_keys.log"; then
        grep -E "SPILLS|SERIALIZED|FAILED" "$sass_keys.log" >&2 || cat "$sass_keys.log" >&2
        echo "error: a $kernel variant spills, serializes its wgmma or fails to compile with the newest NVRTC" >&2
        exit 1
    fi
    FLASHCORE_CACHE_DIR="$sass_cache" target/debug/flashcore compile --arch sm_90a --kernel "$kernel" --keys >> "$sass_keys"
done
.venv/bin/python scripts/sass-check.py "$sass_cache" --keys "$sass_keys"
rm -f "$sass_keys" "$sass_keys.log"
.venv/bin/python scripts/cubin-diff.py --self-test "$sass_cache"
# PyTorch's CUDA 13 wheels bring NVRTC 13.0, whose ptxas spilled kernels that the newest
# NVRTC (above, for cargo test) did not: every variant must compile without spills there too,
# and without serialized wgmma (ptxas's C75xx notes: `compile` flags them SERIALIZED).
stage "flashcore compile --all-archs with NVRTC 13.0 (PyTorch's)"
nvrtc_13_0=.venv-nvrtc-13.0/nvidia/cu13/lib/libnvrtc.so.13
[ -f "$nvrtc_13_0" ] || .venv/bin/python -m pip install --quiet --disable-pip-version-check --target .venv-nvrtc-13.0 "nvidia-cuda-nvrtc==13.0.*"
compile_cache="$kernel_cache/nvrtc-13.0"
logs=$(mktemp -d)
trap 'rm -rf "$logs"' EXIT
if ! FLASHCORE_NVRTC="$(realpath "$nvrtc_13_0")" FLASHCORE_CACHE_DIR="$compile_cache" target/debug/flashcore compile --all-archs > "$logs/log"; then
    grep -E "SPILLS|SERIALIZED|error" "$logs/log" >&2 || cat "$logs/log" >&2
    echo "error: a kernel variant spills, serializes its wgmma or fails to compile with NVRTC 13.0" >&2
    exit 1
fi
tail -n 1 "$logs/log"
# The sliding-window and softcap forms of the forward and backward kernels, at the tiles the
# dispatcher runs them with, bf16 only (CI's time: the f16 forms differ in conversions only;
# docs/kernels/bwd_sm90.md and bwd_sm80.md list both dtypes' known spills): they must compile;
# spills are allowed only where those notes list them (bwd_sm90 D64 with a window, a softcap
# and ALiBi, 8 bytes in bf16; bwd_sm80 D96/D128 with all three on sm_80, 8 bytes, and with
# dropout besides 12 and 32;
# bwd_sm80 D64 causal with a softcap on sm_90a, not compiled here).
stage "flashcore compile --mods (sliding window, softcap, ALiBi) with NVRTC 13.0"
# (bwd_sm80's forms on sm_80 only: on Hopper it runs D32 alone; CI's time.)
# fwd_sm90's and bwd_sm80's chunked-attention forms too (their masks are their own code: KeyMask::keys).
for target in "sm_80 fwd_sm80" "sm_90a fwd_sm90 --chunk" "sm_80 bwd_sm80 --chunk" "sm_90a bwd_sm90"; do
    set -- $target
    FLASHCORE_NVRTC="$(realpath "$nvrtc_13_0")" FLASHCORE_CACHE_DIR="$compile_cache" target/debug/flashcore compile --arch "$1" --kernel "$2" --mods ${3:-} --dtype bf16 > "$logs/mods.log" || true
    if grep -E "FAILED|SERIALIZED" "$logs/mods.log" >&2 || grep SPILLS "$logs/mods.log" | grep -Ev "bwd_sm(90_bf16_d64|80_bf16_d(96|128))_.*_local_softcap_alibi" >&2; then
        echo "error: a $2 score-policy variant fails to compile, serializes its wgmma or spills where none is known" >&2
        exit 1
    fi
    grep -c "$2" "$logs/mods.log" | sed "s/^/   $2 variants compiled: /"
done
# Head dims without a variant of their own (`check`'s PADDED_CHECK_DIMS), which the Hopper
# families run as the next size with zero-filled columns: they must compile without spills,
# bf16 only (CI's time).
stage "flashcore compile --head-dims (padded head dims) with NVRTC 13.0"
for kernel in fwd_sm90 bwd_sm90; do
    if ! FLASHCORE_NVRTC="$(realpath "$nvrtc_13_0")" FLASHCORE_CACHE_DIR="$compile_cache" target/debug/flashcore compile --arch sm_90a --kernel "$kernel" --head-dims 8,40,80,104,160,224 --dtype bf16 > "$logs/padded.log"; then
        grep -E "SPILLS|SERIALIZED|FAILED|error" "$logs/padded.log" >&2 || cat "$logs/padded.log" >&2
        echo "error: a $kernel variant of a padded head dim spills, serializes its wgmma or fails to compile" >&2
        exit 1
    fi
    tail -n 1 "$logs/padded.log" | sed "s/^/   $kernel: /"
done
# The packed-batch (varlen) forms of every forward variant and of bwd_sm80's (on sm_80) and
# bwd_sm90's, bf16 only as above: they must compile; fwd_sm80's and both backwards' must not
# spill; fwd_sm90's producer spills in its tile search (docs/kernels/fwd_sm90.md, Tiles).
stage "flashcore compile --varlen (packed batches) with NVRTC 13.0"
for target in "sm_80 fwd_sm80" "sm_90a fwd_sm90" "sm_80 bwd_sm80" "sm_90a bwd_sm90"; do
    set -- $target
    FLASHCORE_NVRTC="$(realpath "$nvrtc_13_0")" FLASHCORE_CACHE_DIR="$compile_cache" target/debug/flashcore compile --arch "$1" --kernel "$2" --varlen --dtype bf16 > "$logs/varlen.log" || true
    if grep -E "FAILED" "$logs/varlen.log" >&2 || grep SPILLS "$logs/varlen.log" | grep -Ev "^fwd_sm90_.*_varlen " >&2; then
        echo "error: a $2 varlen variant fails to compile or spills where none is known" >&2
        exit 1
    fi
    grep -c "_varlen " "$logs/varlen.log" | sed "s/^/   $2 varlen variants compiled: /"
done
# The paged-KV forms of fwd_sm80 (every tile; bf16 only, CI's time: the dtype changes no
# addressing), on Hopper, where the paged cache runs them: they must compile without spills.
stage "flashcore compile --paged (KV caches) with NVRTC 13.0"
FLASHCORE_NVRTC="$(realpath "$nvrtc_13_0")" FLASHCORE_CACHE_DIR="$compile_cache" target/debug/flashcore compile --arch sm_90a --kernel fwd_sm80 --paged --dtype bf16 > "$logs/paged.log" || true
if grep -E "FAILED" "$logs/paged.log" >&2 || grep SPILLS "$logs/paged.log" >&2; then
    echo "error: a fwd_sm80 paged variant fails to compile or spills" >&2
    exit 1
fi
grep -c "_paged " "$logs/paged.log" | sed "s/^/   fwd_sm80 paged variants compiled: /"
# fwd_sm90's paged forms (chunked prefill on Hopper; bf16 only): its producer has 24 registers
# beside two consumer warpgroups, which the page lookups must fit without spilling.
FLASHCORE_NVRTC="$(realpath "$nvrtc_13_0")" FLASHCORE_CACHE_DIR="$compile_cache" target/debug/flashcore compile --arch sm_90a --kernel fwd_sm90 --paged --dtype bf16 --filter _paged > "$logs/paged90.log" || true
if grep -E "FAILED" "$logs/paged90.log" >&2 || grep SPILLS "$logs/paged90.log" >&2; then
    echo "error: a fwd_sm90 paged variant fails to compile or spills" >&2
    exit 1
fi
grep -c "_paged " "$logs/paged90.log" | sed "s/^/   fwd_sm90 paged variants compiled: /"
stage "README quick start without a GPU, as written (scripts/readme-quickstart.sh)"
FLASHCORE_BIN=target/debug/flashcore bash scripts/readme-quickstart.sh
stage "bench/check_reference.py (flashcore attn --cpu vs NumPy float64)"
.venv/bin/python bench/check_reference.py target/debug/flashcore
stage "bench and script self-tests"
.venv/bin/python bench/anchors.py --self-test
.venv/bin/python bench/report.py --self-test
.venv/bin/python bench/context_parallel_plot.py --self-test
.venv/bin/python scripts/flash-attn-tests.py --self-test  # its deselection rules and shares
# Every suite as the anchors read it (a plain case's FLOPs must agree on both sides; a window
# or a packed batch carries flashcore's counts and lengths).
for s in quick seed sweep small dims bwd bwd-dims varlen chunked bwd-chunked sinks bwd-sinks value-dim; do
    target/debug/flashcore bench --suite "$s" --list-json > target/suite.json
    .venv/bin/python -c 'import sys; sys.path.insert(0, "bench"); import schema; schema.parse_suite(open("target/suite.json").read())'
done
target/debug/flashcore bench --suite sweep --window 128,0 --softcap 30 --list-json > target/suite.json
.venv/bin/python -c 'import sys; sys.path.insert(0, "bench"); import schema; schema.parse_suite(open("target/suite.json").read())'

# The candle integration, a workspace of its own (crates/flashcore-candle/README.md says why),
# built with nvcc and the CUDA libraries from PyPI (scripts/cuda-for-candle.sh installs them into
# .venv-cuda when missing), in ~/.cache/flashcore/candle-target (or $FLASHCORE_CANDLE_TARGET):
# outside the clone, so that every clone shares it, as candle's CUDA kernels take most of ten
# minutes to compile, and Cargo's fingerprints keep a shared folder correct. Clippy checks
# every crate of it; the tests that need no GPU (bad input by name) are flashcore-candle's, so
# only it is built for tests: the Llama crate's tests are all #[ignore]d GPU tests, built and run
# on a GPU machine with `cargo test -- --ignored` (docs/candle.md), and building them here would
# compile candle-transformers a second time to run none of them.
stage "flashcore-candle: fmt, clippy, tests without a GPU, docs"
candle_target="${FLASHCORE_CANDLE_TARGET:-${XDG_CACHE_HOME:-$HOME/.cache}/flashcore/candle-target}"
(
    # In a subshell: the CUDA libraries (and the driver stub) stay off the later checks' paths.
    env_exports=$(scripts/cuda-for-candle.sh)
    eval "$env_exports"
    cd crates/flashcore-candle
    export CARGO_TARGET_DIR="$candle_target"
    cargo fmt --all -- --check
    cargo clippy --workspace --all-targets --locked -- -D warnings
    cargo test -p flashcore-candle --locked
    RUSTDOCFLAGS="-D warnings" cargo doc --workspace --no-deps --locked
)

# The Python package: the abi3 wheel is built as a user would build it, then checked
# (tag, contents, no libtorch/libpython link, errors from the extension, NVRTC discovery).
# Its GPU suite (python/tests) runs on a GPU machine: scripts/gpu-python.sh.
stage "Python package: maturin build, python/tests/test_wheel.py"
.venv/bin/python -m pip install --quiet --disable-pip-version-check maturin pytest
rm -rf target/wheels
.venv/bin/maturin build --locked -m python/Cargo.toml -o target/wheels
.venv/bin/python -m pytest -q --noconftest -p no:cacheprovider python/tests/test_wheel.py python/tests/test_source_rules.py
stage "all passed; disk: $(du -sh target .venv .venv-nvrtc-13.0 .venv-cuda "$candle_target" 2>/dev/null | awk '{printf "%s%s %s", sep, $2, $1; sep = ", "}')"
