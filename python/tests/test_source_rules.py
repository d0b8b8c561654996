"""Rules of the package's source, read from its syntax tree (no torch, no GPU: CI runs this).

No function takes more than eight parameters, apart from those whose signatures mirror a
public API users already call (flash-attn's, ring-flash-attn's, transformers' attention
interface): options travel as one record (`_ops.Options`, with `Batch` and `Cache`), not as a
dozen positional arguments."""

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
    ("compat/flash_attn_3.py", "flash_attn_func"),
    ("compat/flash_attn_3.py", "flash_attn_varlen_func"),
    ("compat/flash_attn_3.py", "flash_attn_qkvpacked_func"),
    ("compat/flash_attn_3.py", "flash_attn_with_kvcache"),
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


def test_no_function_takes_more_than_eight_parameters_beyond_the_mirrors():
    counts = parameter_counts()
    assert counts, f"no functions found under {PACKAGE}"
    over = {key: n for key, n in counts.items() if n > LIMIT and key not in MIRRORS}
    assert not over, f"over {LIMIT} parameters (pass an options record instead: `_ops.Options`, `Batch`, `Cache`): {over}"
    missing = sorted(key for key in MIRRORS if key not in counts)
    assert not missing, f"MIRRORS names functions that do not exist: {missing}"

