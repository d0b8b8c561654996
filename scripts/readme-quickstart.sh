#!/usr/bin/env bash
# Runs the README's no-GPU quick start exactly as written: the ```sh block between
# <!-- quickstart-cpu --> and <!-- /quickstart-cpu --> in README.md, in a fresh temporary
# directory, with this checkout's binary standing in for the `flashcore` that the block's
# `cargo install --locked --path crates/flashcore-cli` (its only cargo command) puts on PATH.
#
#   scripts/readme-quickstart.sh        (FLASHCORE_BIN: the binary, default target/debug/flashcore,
#                                        built with `cargo build -p flashcore-cli` when missing)
#
# Needs python3 with numpy and safetensors: the one on PATH, else ./.venv's (scripts/test.sh
# installs both there). Fails loudly: a missing marker, an empty block, a cargo command other
# than the one above, or any command of the block failing.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
readme="$root/README.md"
die() { echo "readme-quickstart.sh: $*" >&2; exit 1; }

# The fenced block between the markers, without the fences.
block="$(awk '
    /<!-- quickstart-cpu -->/ { inside = 1; next }
    /<!-- \/quickstart-cpu -->/ { inside = 0; done = 1 }
    inside && /^```/ { fence++; next }
    inside && fence == 1 { print }
    END { if (!done) exit 1 }
' "$readme")" || die "README.md has no <!-- quickstart-cpu --> ... <!-- /quickstart-cpu --> pair"
[[ -n "$block" ]] || die "the quick-start block in README.md is empty"
grep -q '^```sh$' <(awk '/<!-- quickstart-cpu -->/{getline; print; exit}' "$readme") \
    || die "the line after <!-- quickstart-cpu --> must open a \`\`\`sh block"

bin="${FLASHCORE_BIN:-$root/target/debug/flashcore}"
if [[ ! -x "$bin" ]]; then
    echo "== building $bin (cargo build -p flashcore-cli)"
    (cd "$root" && cargo build --quiet -p flashcore-cli) || die "cargo build -p flashcore-cli failed"
fi
[[ -x "$bin" ]] || die "no flashcore binary at $bin (set FLASHCORE_BIN)"
bin="$(cd "$(dirname "$bin")" && pwd)/$(basename "$bin")"

if ! python3 -c 'import numpy, safetensors' 2>/dev/null; then
    [[ -x "$root/.venv/bin/python3" ]] && "$root/.venv/bin/python3" -c 'import numpy, safetensors' 2>/dev/null \
        || die "python3 with numpy and safetensors not found (pip install numpy safetensors, or run scripts/test.sh once for ./.venv)"
    export PATH="$root/.venv/bin:$PATH"
fi

work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
# `cargo` inside the block: only the README's install, which this checkout's binary stands in
# for (`flashcore` runs it).
cat > "$work/prelude.sh" <<EOF
set -euo pipefail
cargo() {
    if [[ "\$*" != "install --locked --path crates/flashcore-cli" ]]; then
        echo "readme-quickstart.sh: the quick start runs 'cargo \$*', which this test does not know" >&2
        return 1
    fi
}
flashcore() { "$bin" "\$@"; }
EOF
printf '%s\n' "$block" > "$work/quickstart.sh"
echo "== README quick start (no GPU), in $work"
sed 's/^/   | /' "$work/quickstart.sh"
(cd "$work" && bash -c 'source ./prelude.sh; source ./quickstart.sh') || die "the README's quick start failed (above)"
echo "== README quick start: ok"
