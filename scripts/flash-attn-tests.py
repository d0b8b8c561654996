#!/usr/bin/env python3
"""flash-attention's own test files against FlashCore's namespaces (`flashcore.compat`).

    python3 scripts/flash-attn-tests.py --self-test
    python3 scripts/flash-attn-tests.py TESTS_FILE [--fa 2|3] [--samples N] [--seed S]
                                        [--functions A,B] [--part K/N] [--deselected-out FILE]
                                        [-- PYTEST_ARGS]

TESTS_FILE, from a clone of the public repository (github.com/Dao-AILab/flash-attention;
nothing of it is kept in this repository):
- `--fa 2` (the default): `tests/test_flash_attn.py` at tag v2.8.3 (the release on the
  package index), run with `flashcore.compat.use_as_flash_attn()` in effect. Its one extra
  dependency is einops.
- `--fa 3`: `hopper/test_flash_attn.py` (FlashAttention-3; read at 0251105a), run with
  `flashcore.compat.use_as_flash_attn_interface()` in effect and the file's folder first on
  the path (its `padding.py` and `test_util.py`). Its extra dependency is einops too.

The script collects every parametrization, deselects those that use what FlashCore does not
have yet, each with its reason (the counts printed, every case written to --deselected-out),
samples N of the others per test function with the seed, prints the selection and runs it,
unmodified. The exit status is pytest's. `--functions` keeps those test functions alone (the
others deselected as "not in --functions"), so that a long run splits over processes, which
may share one GPU: each function's sample depends only on the seed and the function's own
cases. `--part K/N` runs the K-th of N interleaved shares of the sample (N processes with the
same seed run it all, each case once). What FA3's test bodies draw inside a case (a random `attention_chunk` beside 0, V head
dims other than d at d 64 and 192) is not a parametrization: the cases whose bodies need what
FlashCore lacks are deselected by the parameters that lead to it.
"""

from __future__ import annotations

import argparse
import collections
import os
import random
import sys


def unsupported_fa2(params: dict, test: str, hopper: bool) -> str | None:
    """Why FlashCore cannot run a parametrization of FA2's tests yet (`item.callspec.params`), or None."""
    d = params.get("d")
    if d is not None and not hopper and d not in (32, 64, 96, 128, 192, 256):
        return f"head dim {d} (other than 32/64/96/128/192/256 on Hopper alone)"
    return None


def unsupported_fa3(params: dict, test: str, hopper: bool) -> str | None:
    """Why FlashCore cannot run a parametrization of FA3's tests yet, or None."""
    if str(params.get("dtype")) == "torch.float8_e4m3fn":
        return "FP8 inputs (float8_e4m3fn with descales)"
    if params.get("has_qv"):
        return "qv (absorbed MLA's extra q·v term)"
    # The tests' dv loop, inside one parametrization: 256 and 512 at d 64 (256 runs, forward and
    # the padded backward; 512 not yet, so the whole parametrization waits), 128 at d 192 (runs).
    if test in ("test_flash_attn_output", "test_flash_attn_varlen_output") and params.get("d") == 64:
        return "a V head dim other than d (the test's dv loop at d 64: 512 not yet; 256 runs)"
    if test == "test_flash_attn_kvcache" and params.get("page_size") is not None:
        if params["page_size"] % 16:
            return f"page size {params['page_size']} (FlashCore's pages: multiples of 16)"
        if params.get("has_leftpad"):
            return "cache_leftpad with a page table (as flash_attn 2 refuses it)"
    if test == "test_flash3_bw_compatibility":
        return "FA3's extension internals (torch.ops.flash_attn_3's schemas)"
    if not hopper and params.get("d") not in (None, 32, 64, 96, 128, 192, 256):
        return f"head dim {params.get('d')} (other than 32/64/96/128/192/256 on Hopper alone)"
    return None


class Harness:
    """A pytest plugin: deselects and samples at collection, after enabling the namespace."""

    def __init__(self, fa: int, samples: int, seed: int, deselected_out: str, functions: list, part: tuple):
        import torch

        import flashcore.compat

        if fa == 2:
            flashcore.compat.use_as_flash_attn()
        else:
            flashcore.compat.use_as_flash_attn_interface()
        self.unsupported = unsupported_fa2 if fa == 2 else unsupported_fa3
        self.hopper = torch.cuda.get_device_capability() == (9, 0)
        self.samples, self.seed, self.deselected_out, self.functions = samples, seed, deselected_out, functions
        self.part = part  # (k, n): this process runs the sample's cases k-1, k-1+n, ...

    def pytest_collection_modifyitems(self, session, config, items):
        by_test, dropped = collections.defaultdict(list), []
        for item in items:
            params = getattr(getattr(item, "callspec", None), "params", {})
            reason = self.unsupported(params, item.originalname, self.hopper)
            if self.functions and item.originalname not in self.functions:
                reason = "not in --functions"
            if reason is None:
                by_test[item.originalname].append(item)
            else:
                dropped.append((item.nodeid, reason))
        chosen = []
        print(f"\n{len(items)} parametrizations; {len(dropped)} deselected (reasons below); per test function, sampled / supported:")
        for test, candidates in by_test.items():
            rng = random.Random(f"{self.seed}/{test}")  # a function's sample: the same in any split
            picked = candidates if len(candidates) <= self.samples else rng.sample(candidates, self.samples)
            mine = share(picked, self.part)
            chosen += mine
            print(f"  {test:40s} {len(picked):5d} / {len(candidates)}" + (f", share {self.part[0]} of {self.part[1]}: {len(mine)}" if self.part[1] > 1 else ""))
        for reason, count in collections.Counter(r for _, r in dropped).most_common():
            print(f"  deselected: {count:7d}  {reason}")
        with open(self.deselected_out, "w") as f:
            f.writelines(f"{nodeid}\t{reason}\n" for nodeid, reason in dropped)
        print(f"  every deselected case with its reason: {self.deselected_out}")
        keep = set(id(i) for i in chosen)
        config.hook.pytest_deselected(items=[i for i in items if id(i) not in keep])
        items[:] = [i for i in items if id(i) in keep]
        print("selected:")
        for item in items:
            print(f"  {item.nodeid}")


def share(picked: list, part: tuple) -> list:
    """The K-th of N interleaved shares of a sample (`part` = (K, N)): N processes with the same
    seed run every case once."""
    k, n = part
    return picked[k - 1 :: n]


def parse_part(text: str) -> tuple:
    """`--part K/N` as (K, N), or ValueError unless 1 <= K <= N."""
    k, _, n = text.partition("/")
    if not (k.isdigit() and n.isdigit() and 1 <= int(k) <= int(n)):
        raise ValueError(f"--part takes K/N with 1 <= K <= N, not {text!r}")
    return int(k), int(n)


def self_test() -> None:
    """The deselection rules and the shares, without pytest, a GPU or the tests file."""
    cases = list(range(11))
    for n in (1, 2, 3, 4):
        parts = [share(cases, parse_part(f"{k}/{n}")) for k in range(1, n + 1)]
        assert sorted(sum(parts, [])) == cases, f"{n} shares cover every case once"
        assert max(map(len, parts)) - min(map(len, parts)) <= 1, "shares differ by one case at most"
    for bad in ("0/2", "3/2", "2", "a/b"):
        try:
            parse_part(bad)
        except ValueError:
            continue
        raise AssertionError(f"--part {bad} accepted")
    kv, out = "test_flash_attn_kvcache", "test_flash_attn_output"
    want = {
        (("dtype", "torch.float8_e4m3fn"),): "FP8",
        (("has_qv", True),): "qv",
        (("d", 64),): "V head dim",
        (("page_size", 1),): "page size 1",
        (("page_size", 16), ("has_leftpad", True)): "cache_leftpad",
    }
    for params, reason in want.items():
        got = unsupported_fa3(dict(params), kv if "page_size" in dict(params) else out, True)
        assert got is not None and reason in got, f"{params}: {got!r}, want {reason!r}"
    assert unsupported_fa3({"d": 192}, out, True) is None and unsupported_fa3({"d": 192}, "test_flash_attn_varlen_output", True) is None
    for params in ({"page_size": 16, "has_batch_idx": True}, {"varlen_q": True, "rotary_fraction": 0.5}, {"page_size": 64, "varlen_q": True}, {"d": 128}):
        assert unsupported_fa3(params, kv, True) is None, f"{params} runs: {unsupported_fa3(params, kv, True)!r}"
    assert "extension internals" in unsupported_fa3({}, "test_flash3_bw_compatibility", True)
    assert unsupported_fa3({"d": 80}, out, False) is not None and unsupported_fa3({"d": 80}, out, True) is None
    assert unsupported_fa2({"d": 80}, "test_flash_attn_output", False) is not None and unsupported_fa2({"d": 80}, "x", True) is None
    print("flash-attn-tests.py self-test: ok")


def main(argv=None) -> int:
    if argv is None and sys.argv[1:] == ["--self-test"] or argv == ["--self-test"]:
        self_test()
        return 0
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    ap.add_argument("tests_file")
    ap.add_argument("--fa", type=int, choices=(2, 3), default=2, help="the flash-attention whose tests TESTS_FILE is (default 2)")
    ap.add_argument("--samples", type=int, default=200, help="cases per test function (default 200)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--deselected-out", default="", help="default: fa2-deselected.txt or fa3-deselected.txt")
    ap.add_argument("--functions", default="", help="comma-separated test functions to keep (default: all)")
    ap.add_argument("--part", default="1/1", help="K/N: the K-th of N interleaved shares of the sample (default 1/1, all of it)")
    args, pytest_args = ap.parse_known_args(argv)  # the rest, after --, goes to pytest
    try:
        part = parse_part(args.part)
    except ValueError as e:
        ap.error(str(e))
    pytest_args = [a for a in pytest_args if a != "--"]
    import pytest

    if args.fa == 3:  # FA3's tests import padding.py and test_util.py from their own folder
        sys.path.insert(0, os.path.dirname(os.path.abspath(args.tests_file)))
    deselected_out = args.deselected_out or f"fa{args.fa}-deselected.txt"
    functions = [f for f in args.functions.split(",") if f]
    harness = Harness(args.fa, args.samples, args.seed, deselected_out, functions, part)
    return pytest.main([args.tests_file, "-p", "no:cacheprovider", "-q", *pytest_args], plugins=[harness])


if __name__ == "__main__":
    sys.exit(main())
