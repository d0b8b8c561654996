#!/usr/bin/env bash
# Benchmarks FlashCore and the PyTorch SDPA anchors on this machine's GPU and writes the
# results page (docs/design.md §9): raw JSON under docs/results/raw/<gpu-slug>/ (or --out), the page
# docs/results/<gpu-slug>.md and its plots.
#
#   bench/run-all.sh [--bin target/release/flashcore] [--out DIR] [--suites "seed sweep quick small"]
#                    [--results-dir docs/results] [--python python3] [--no-anchors] [--no-flashcore]
#                    [--backends cudnn,flash,flashcore-py] [--rounds 2]
#
# The ratios on the page are flashcore-py's against the anchors, all timed by anchors.py in one
# process (the one harness: docs/design.md §9); the binary's own bench is a column beside them,
# a regression guard. Without flashcore-py among the backends the page has no ratio.
# Needs: an NVIDIA GPU, the flashcore binary (cargo build --release), and for the anchors and
# plots a Python with PyTorch (CUDA) and matplotlib. Run from anywhere; paths are relative to
# the repository root.
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
root="$(cd "$here/.." && pwd)"
bin="target/release/flashcore"
out=""
suites="seed sweep quick small"
results="docs/results"
py="${PYTHON:-python3}"
do_anchors=1
do_flashcore=1
backends="cudnn,flash,flashcore-py"
rounds=2

die() { echo "run-all.sh: $*" >&2; exit 1; }
say() { echo "== $*"; }

while [[ $# -gt 0 ]]; do
  case "$1" in
    --bin) bin="${2:?--bin needs a path}"; shift 2 ;;
    --out) out="${2:?--out needs a folder}"; shift 2 ;;
    --suites) suites="${2:?--suites needs names}"; shift 2 ;;
    --results-dir) results="${2:?--results-dir needs a folder}"; shift 2 ;;
    --python) py="${2:?--python needs a command}"; shift 2 ;;
    --no-anchors) do_anchors=0; shift ;;
    --no-flashcore) do_flashcore=0; shift ;;
    --backends) backends="${2:?--backends needs a comma list}"; shift 2 ;;
    --rounds) rounds="${2:?--rounds needs a count}"; shift 2 ;;
    -h|--help) sed -n '2,17p' "${BASH_SOURCE[0]}"; exit 0 ;;
    *) die "unknown argument $1 (see --help)" ;;
  esac
done

cd "$root"
[[ -x "$bin" ]] || die "flashcore binary '$bin' not found or not executable; build it with 'cargo build --release' or pass --bin"
command -v "$py" >/dev/null || die "python '$py' not found; pass --python"
command -v nvidia-smi >/dev/null || die "nvidia-smi not found: this needs an NVIDIA GPU and its driver"
if [[ $do_anchors == 1 ]]; then
  "$py" -c 'import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)' 2>/dev/null \
    || die "$py has no PyTorch with CUDA (pip install torch), or it sees no GPU; --no-anchors skips the anchors"
fi

gpu="$(nvidia-smi --query-gpu=name --format=csv,noheader -i 0 | head -n1)"
[[ -n "$gpu" ]] || die "nvidia-smi lists no GPU"
slug="$("$py" "$here/report.py" --slug-of "$gpu")"
out="${out:-docs/results/raw/$slug}"
mkdir -p "$out" "$results"
cmd="bench/run-all.sh --bin $bin --suites \"$suites\""
if [[ $do_anchors == 0 ]]; then cmd+=" --no-anchors"; fi
if [[ $do_flashcore == 0 ]]; then cmd+=" --no-flashcore"; fi
cmd+=" --backends $backends --rounds $rounds"
say "GPU: $gpu -> $out (page $results/$slug.md)"

say "flashcore info"
"$bin" info | tee "$out/info.txt"
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm,temperature.gpu,power.draw --format=csv | tee "$out/nvidia-smi.txt"

failed=()
for s in $suites; do
  "$bin" bench --suite "$s" --list-json > "$out/suite-$s.json" || die "'$bin bench --suite $s --list-json' failed"
  if [[ $do_flashcore == 1 ]]; then
    say "flashcore bench --suite $s"
    # A non-zero exit means some rows are "error"; the JSON is still written and the page shows them.
    if ! "$bin" bench --suite "$s" --json "$out/flashcore-$s.json"; then
      if [[ -s "$out/flashcore-$s.json" ]]; then
        echo "run-all.sh: flashcore bench --suite $s reported failing rows; continuing" >&2
      else
        echo "run-all.sh: flashcore bench --suite $s failed and wrote no JSON; continuing without it" >&2
      fi
      failed+=("flashcore:$s")
    fi
  fi
  if [[ $do_anchors == 1 ]]; then
    say "anchors (PyTorch SDPA) --suite $s"
    "$py" "$here/anchors.py" --suite-json "$out/suite-$s.json" --out-dir "$out" --backends "$backends" --rounds "$rounds" || { echo "run-all.sh: anchors.py failed on suite $s" >&2; failed+=("anchors:$s"); }
  fi
done

say "report"
"$py" "$here/report.py" "$out" --out-dir "$results" --slug "$slug" --command "$cmd"
if [[ ${#failed[@]} -gt 0 ]]; then
  echo "run-all.sh: done, with failures: ${failed[*]} (see above; the page shows what ran)" >&2
  exit 1
fi
say "done: $results/$slug.md"
