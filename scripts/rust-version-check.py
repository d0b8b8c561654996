#!/usr/bin/env python3
"""The minimum Rust each workspace states (`rust-version` in its Cargo.toml) is at least what
every locked dependency it builds on Linux declares: a dependency that needs a newer compiler
than the README promises fails here, not on a user's machine.

    scripts/rust-version-check.py WORKSPACE...      (prints each workspace's minimum)

Reads `cargo metadata --locked` (no build, no network once the registry index is cached).
A dependency that declares no rust-version is not counted; `cargo +MIN check` (scripts/test.sh)
covers those for the main workspace.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path


def version(text: str) -> tuple:
    """`1.88` and `1.88.0` alike, as (1, 88, 0)."""
    parts = [int(x) for x in text.split(".")]
    return tuple(parts + [0] * (3 - len(parts)))


def stated(workspace: Path) -> str:
    """The workspace's `rust-version` (its `[workspace.package]` entry)."""
    text = (workspace / "Cargo.toml").read_text()
    found = re.search(r'^\[workspace\.package\][^\[]*?^rust-version = "([0-9.]+)"', text, re.M | re.S)
    if not found:
        sys.exit(f"rust-version-check: {workspace}/Cargo.toml states no [workspace.package] rust-version")
    return found.group(1)


def needed(workspace: Path) -> list:
    """(version, name) of every locked package built for x86_64 Linux that declares one."""
    out = subprocess.run(
        ["cargo", "metadata", "--format-version", "1", "--locked", "--filter-platform", "x86_64-unknown-linux-gnu"],
        cwd=workspace,
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    meta = json.loads(out)
    built = {node["id"] for node in meta["resolve"]["nodes"]}
    return sorted((version(p["rust_version"]), f"{p['name']} {p['version']}") for p in meta["packages"] if p["id"] in built and p["rust_version"])


def main() -> None:
    failed = False
    for arg in sys.argv[1:] or ["."]:
        workspace = Path(arg)
        minimum = stated(workspace)
        packages = needed(workspace)
        newest, who = packages[-1]  # sorted: the highest last
        over = [f"{name} needs {'.'.join(map(str, v))}" for v, name in packages if v > version(minimum)]
        if over:
            failed = True
            print(f"{workspace}: rust-version {minimum} is too low: " + ", ".join(over), file=sys.stderr)
        else:
            print(f"   {workspace}: rust-version {minimum}; the highest a dependency declares: {'.'.join(map(str, newest))} ({who})")
    if failed:
        sys.exit(1)


if __name__ == "__main__":
    main()
