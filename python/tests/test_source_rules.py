"""Rules of the package's source, read from its syntax tree (no torch, no GPU: CI runs this).

No function takes more than eight parameters, apart from those whose signatures mirror a
public API users already call (flash-attn's, ring-flash-attn's, transformers' attention
interface): options travel as one record, not as a dozen positional arguments. The functions
that break the rule today are listed with their counts in `DEBT`; the list may only shrink: a
new function over the limit fails, a listed one that grows fails, and a listed one that no
longer breaks the rule fails until its entry is removed."""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "flashcore"
LIMIT = 8

# Signatures of public APIs the package reproduces (file, function): their parameters are the
# API's, not ours to regroup.
MIRRORS = {
    ("interface.py", "flash_attn_func"),
    ("interface.py", "flash_attn_varlen_func"),
    ("interface.py", "flash_attn_with_kvcache"),
    ("flash_attn_interface.py", "_flash_attn_forward"),
    ("flash_attn_interface.py", "_flash_attn_varlen_forward"),
    ("flash_attn_interface.py", "_flash_attn_backward"),
    ("flash_attn_interface.py", "_flash_attn_varlen_backward"),
    ("compat/flash_attn/flash_attn_interface.py", "flash_attn_qkvpacked_func"),
    ("compat/flash_attn/flash_attn_interface.py", "flash_attn_kvpacked_func"),
    ("compat/flash_attn/flash_attn_interface.py", "flash_attn_varlen_func"),
    ("compat/flash_attn/flash_attn_interface.py", "flash_attn_varlen_qkvpacked_func"),
    ("compat/flash_attn/flash_attn_interface.py", "flash_attn_varlen_kvpacked_func"),
    ("distributed.py", "ring_flash_attn_func"),
    ("distributed.py", "ring_flash_attn_kvpacked_func"),
    ("distributed.py", "ring_flash_attn_qkvpacked_func"),
    ("distributed.py", "ring_flash_attn_varlen_func"),
    ("distributed.py", "ring_flash_attn_varlen_kvpacked_func"),
    ("distributed.py", "ring_flash_attn_varlen_qkvpacked_func"),
    ("distributed.py", "zigzag_ring_flash_attn_func"),
    ("distributed.py", "zigzag_ring_flash_attn_kvpacked_func"),
    ("distributed.py", "zigzag_ring_flash_attn_qkvpacked_func"),
    ("integrations/transformers.py", "attention_forward"),
}

# The functions over the limit today, with their parameter counts: the options record's work
# (docs/design.md, "Adding an option") removes them.
DEBT = {
    ("_ops.py", "forward_into"): 13,
    ("_ops.py", "forward"): 12,
    ("_ops.py", "varlen_forward"): 16,
    ("_ops.py", "varlen_backward"): 18,
    ("_ops.py", "varlen_backward_into"): 21,
    ("_ops.py", "varlen_fwd"): 17,
    ("_ops.py", "varlen_bwd"): 20,
    ("_ops.py", "kvcache_forward"): 14,
    ("_ops.py", "paged_varlen_forward"): 12,
    ("_ops.py", "varlen_fwd_paged"): 13,
    ("_ops.py", "fwd_kvcache"): 14,
    ("_ops.py", "fwd"): 13,
    ("_ops.py", "backward"): 13,
    ("_ops.py", "backward_into"): 17,
    ("_ops.py", "bwd"): 15,
    ("distributed.py", "_ring_backward"): 12,
    ("distributed.py", "_ring"): 13,
    ("distributed.py", "forward"): 11,
    ("integrations/transformers.py", "_varlen"): 11,
    ("interface.py", "_attention"): 13,
    ("interface.py", "_paged_varlen"): 14,
    ("interface.py", "_kvcache_rows"): 13,
}


def parameter_counts() -> dict:
    """(file, function) -> the most parameters a function of that name there takes (`self`,
    `cls` and an autograd `ctx` not counted)."""
    counts: dict = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        where = path.relative_to(PACKAGE).as_posix()
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                a = node.args
                n = len([p for p in a.posonlyargs + a.args + a.kwonlyargs if p.arg not in ("self", "cls", "ctx")])
                counts[(where, node.name)] = max(n, counts.get((where, node.name), 0))
    return counts


def test_no_function_takes_more_than_eight_parameters_beyond_the_listed_ones():
    counts = parameter_counts()
    assert counts, f"no functions found under {PACKAGE}"
    over = {key: n for key, n in counts.items() if n > LIMIT and key not in MIRRORS}
    new = {key: n for key, n in over.items() if key not in DEBT}
    assert not new, f"over {LIMIT} parameters (pass an options record instead): {new}"
    grown = {key: (DEBT[key], n) for key, n in over.items() if n > DEBT[key]}
    assert not grown, f"listed functions took more parameters (was, now): {grown}"
    paid = sorted(key for key in DEBT if counts.get(key, 0) <= LIMIT)
    assert not paid, f"within the limit now (or gone): remove from DEBT: {paid}"
    missing = sorted(key for key in MIRRORS if key not in counts)
    assert not missing, f"MIRRORS names functions that do not exist: {missing}"
