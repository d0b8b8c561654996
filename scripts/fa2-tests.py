#!/usr/bin/env python3
"""flash-attention's own test file against FlashCore's flash_attn namespace (`flashcore.compat`).

    python3 scripts/fa2-tests.py TESTS_FILE [--samples N] [--seed S] [--functions A,B]
                                 [--deselected-out FILE] [-- PYTEST_ARGS]

TESTS_FILE is flash-attention's `tests/test_flash_attn.py` at tag v2.8.3 (the release on the
package index), from a clone of the public repository (github.com/Dao-AILab/flash-attention;
nothing of it is kept in this repository). Its one extra dependency is einops. The script
collects every parametrization, deselects those that use what FlashCore does not have yet,
each with its reason (the counts printed, every case written to --deselected-out), samples
N of the others per test function with the seed, prints the selection and runs it, unmodified,
with `flashcore.compat.use_as_flash_attn()` in effect. The exit status is pytest's.
`--functions` keeps those test functions alone (the others deselected as "not in
--functions"), so that a long run splits over processes, which may share one GPU: each
function's sample depends only on the seed and the function's own cases.
"""

from __future__ import annotations

import argparse
import collections
import random
import sys


def unsupported(params: dict, test: str, hopper: bool) -> str | None:
    """Why FlashCore cannot run a parametrization yet (`item.callspec.params`), or None."""
    d = params.get("d")
    if d is not None and not hopper and d not in (32, 64, 96, 128, 192, 256):
        return f"head dim {d} (other than 32/64/96/128/192/256 on Hopper alone)"
    return None


class Harness:
    """A pytest plugin: deselects and samples at collection, after enabling the namespace."""

    def __init__(self, samples: int, seed: int, deselected_out: str, functions: list):
        import torch

        import flashcore.compat

        flashcore.compat.use_as_flash_attn()
        self.hopper = torch.cuda.get_device_capability() == (9, 0)
        self.samples, self.seed, self.deselected_out, self.functions = samples, seed, deselected_out, functions

    def pytest_collection_modifyitems(self, session, config, items):
        by_test, dropped = collections.defaultdict(list), []
        for item in items:
            params = getattr(getattr(item, "callspec", None), "params", {})
            reason = unsupported(params, item.originalname, self.hopper)
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
            chosen += picked
            print(f"  {test:40s} {len(picked):5d} / {len(candidates)}")
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


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    ap.add_argument("tests_file")
    ap.add_argument("--samples", type=int, default=200, help="cases per test function (default 200)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--deselected-out", default="fa2-deselected.txt")
    ap.add_argument("--functions", default="", help="comma-separated test functions to keep (default: all)")
    args, pytest_args = ap.parse_known_args(argv)  # the rest, after --, goes to pytest
    pytest_args = [a for a in pytest_args if a != "--"]
    import pytest

    harness = Harness(args.samples, args.seed, args.deselected_out, [f for f in args.functions.split(",") if f])
    return pytest.main([args.tests_file, "-p", "no:cacheprovider", "-q", *pytest_args], plugins=[harness])


if __name__ == "__main__":
    sys.exit(main())
