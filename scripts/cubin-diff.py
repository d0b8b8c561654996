#!/usr/bin/env python3
"""Machine code of two JIT caches, variant by variant, without a GPU or a CUDA toolkit.

    cubin-diff.py OLD_CACHE_DIR NEW_CACHE_DIR
    cubin-diff.py --self-test CACHE_DIR    (CI: the parsing and the verdicts on edited copies)

Fill each folder with one binary's `FLASHCORE_CACHE_DIR=DIR flashcore compile --arch sm_90a
--kernel K`. For every variant in both (matched by name, the part before `-sm_`), compares the
kernels' `.text` sections 16-byte instruction by instruction and prints how many differ, and in
which bytes. Hopper's encoding keeps an instruction's constant-bank offset in bytes 4-5, so a
variant whose only differing bytes are 4 and 5 is the same code reading its parameters at other
offsets (a parameter struct that grew): the same speed. Anything else is a real code change.
Exits 1 when any variant differs beyond the constant offsets.
"""
import glob
import os
import struct
import sys

TRAILER = 32  # the cache entry's SHA-256
CONSTANT_OFFSET_BYTES = {4, 5}


def cubin(path):
    """The CUBIN inside a cache entry: MAGIC, u64 log length, log, u64 cubin length, cubin, digest."""
    body = open(path, "rb").read()[:-TRAILER]
    for magic_len in range(4, 17):
        log_len = struct.unpack_from("<Q", body, magic_len)[0]
        if magic_len + 8 + log_len + 8 > len(body):
            continue
        cubin_len = struct.unpack_from("<Q", body, magic_len + 8 + log_len)[0]
        if magic_len + 16 + log_len + cubin_len == len(body):
            return body[magic_len + 16 + log_len:]
    raise ValueError(f"{path}: not a flashcore cache entry")


def text_sections(elf):
    """ELF64 section name -> bytes, for the `.text.*` sections (one per kernel)."""
    shoff = struct.unpack_from("<Q", elf, 0x28)[0]
    shentsize, shnum, shstrndx = struct.unpack_from("<HHH", elf, 0x3A)
    headers = [struct.unpack_from("<IIQQQQIIQQ", elf, shoff + i * shentsize) for i in range(shnum)]
    names_at = headers[shstrndx][4]

    def name(offset):
        raw = elf[names_at + offset:]
        return raw[: raw.index(b"\0")].decode()

    return {name(h[0]): elf[h[4] : h[4] + h[5]] for h in headers if name(h[0]).startswith(".text")}


def classify(x, y):
    """(instructions differing, verdict) of two `.text` sections."""
    if len(x) != len(y):
        return None, f"CODE DIFFERS ({len(x) // 16} -> {len(y) // 16} instructions)"
    differing = [i for i in range(0, len(x), 16) if x[i : i + 16] != y[i : i + 16]]
    positions = {j for i in differing for j in range(16) if x[i + j] != y[i + j]}
    if not differing:
        return 0, "identical"
    return len(differing), "constant offsets only" if positions <= CONSTANT_OFFSET_BYTES else "CODE DIFFERS"


def self_test(folder):
    entries = load(folder)
    assert entries, f"no cache entries in {folder}"
    for variant, elf in entries.items():
        sections = text_sections(elf)
        assert sections and all(len(t) % 16 == 0 and len(t) > 0 for t in sections.values()), variant
        text = next(iter(sections.values()))
        edited = lambda at: text[:at] + bytes([text[at] ^ 1]) + text[at + 1 :]  # noqa: E731
        assert classify(text, text) == (0, "identical")
        assert classify(text, edited(16 + 4)) == (1, "constant offsets only")
        assert classify(text, edited(16 + 0)) == (1, "CODE DIFFERS")
        assert classify(text, text[:-16])[1].startswith("CODE DIFFERS")
    print(f"cubin-diff self-test: {len(entries)} cache entries parsed, verdicts as expected")
    return 0


def load(folder):
    return {os.path.basename(p).split("-sm_")[0]: cubin(p) for p in glob.glob(os.path.join(folder, "*.fcbin"))}


def main():
    if len(sys.argv) == 3 and sys.argv[1] == "--self-test":
        return self_test(sys.argv[2])
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    old, new = load(sys.argv[1]), load(sys.argv[2])
    real_changes = 0
    for variant in sorted(set(old) & set(new)):
        a, b = text_sections(old[variant]), text_sections(new[variant])
        for section in sorted(set(a) | set(b)):
            differing, verdict = classify(a.get(section, b""), b.get(section, b""))
            real_changes += verdict.startswith("CODE DIFFERS")
            count = "" if differing is None else f"{len(a[section]) // 16} instructions, {differing} differ "
            print(f"{variant} {section}: {count}({verdict})")
    only = sorted(set(old) ^ set(new))
    if only:
        print("in one cache only:", ", ".join(only))
    print(f"{len(set(old) & set(new))} variants compared, {real_changes} with code changes")
    return 1 if real_changes else 0


if __name__ == "__main__":
    sys.exit(main())
