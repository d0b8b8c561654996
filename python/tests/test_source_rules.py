"""Rules of the package's source, read from its syntax tree (no torch, no GPU: CI runs this).

No function takes more than eight parameters, apart from those whose signatures mirror a
public API users already call (flash-attn's, ring-flash-attn's, transformers' attention
interface): options travel as one record (`_ops.Options`, with `Batch` and `Cache`), not as a
dozen positional arguments. And every direct call of a registered op in the tests and the
benchmarks passes every argument of its schema (below)."""

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



# ---- direct calls of the registered ops pass every argument of their schema ---------------
# The schemas have no defaults (`_ops.Options.SCHEMA`), so a positional call such as
# `torch.ops.flashcore.fwd(q, k, v, 0.125, True, ...)` must list every value: one written for an
# older record fails only on a GPU, where the op runs. These calls are counted here against the
# schemas `_ops.py` registers (calls that spread a record, `*options.flat()`, are right by
# construction and left out).

REPO = PACKAGE.parents[1]
CALLERS = [*sorted((REPO / "python" / "tests").glob("*.py")), *sorted((REPO / "bench").glob("*.py"))]


def _strings(tree: ast.Module) -> dict:
    """The module's string constants a schema is built from: `NAME = "..."` at the top and
    `SCHEMA = ...` in each class, as `NAME` and `Class.SCHEMA`."""
    out: dict = {}

    def text(node) -> str:
        if isinstance(node, ast.Constant) and isinstance(node.value, str):
            return node.value
        if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add):
            return text(node.left) + text(node.right)
        if isinstance(node, ast.JoinedStr):
            return "".join(text(v) if isinstance(v, ast.Constant) else out[ast.unparse(v.value)] for v in node.values)
        raise ValueError(f"not a string: {ast.unparse(node)}")

    for node in tree.body:
        if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name):
            try:
                out[node.targets[0].id] = text(node.value)
            except (ValueError, KeyError):
                pass
        if isinstance(node, ast.ClassDef):
            for item in node.body:
                if isinstance(item, ast.Assign) and [ast.unparse(t) for t in item.targets] == ["SCHEMA"]:
                    out[f"{node.name}.SCHEMA"] = text(item.value)
    return out


def op_argument_counts() -> dict:
    """Op name -> the number of arguments its schema takes, for every `_op("name", schema, ...)`
    of `_ops.py`."""
    tree = ast.parse((PACKAGE / "_ops.py").read_text())
    strings = _strings(tree)
    counts = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "_op":
            name = node.args[0].value
            schema = "".join(v.value if isinstance(v, ast.Constant) else strings[ast.unparse(v.value)] for v in node.args[1].values)
            arguments = schema[schema.index("(") + 1 : schema.index(") ->")]
            counts[name] = arguments.count(",") + 1
    return counts


def test_direct_op_calls_pass_every_argument_of_the_schema():
    counts = op_argument_counts()
    assert {"fwd", "bwd", "varlen_fwd", "varlen_bwd", "bwd_sinks", "fwd_kvcache"} <= counts.keys(), counts
    assert counts["fwd"] == 3 + counts["bwd"] - 6, "fwd and bwd share the options' values"
    checked, wrong = 0, []
    for path in CALLERS:
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)):
                continue
            owner = ast.unparse(node.func.value)
            if owner not in ("torch.ops.flashcore", "torch.ops.flashcore.default") or node.func.attr not in counts:
                continue
            if any(isinstance(a, ast.Starred) for a in node.args):
                continue
            checked += 1
            if len(node.args) + len(node.keywords) != counts[node.func.attr]:
                wrong.append(f"{path.relative_to(REPO)}:{node.lineno} {node.func.attr}: {len(node.args)} values, its schema {counts[node.func.attr]}")
    assert not wrong, "direct op calls that miss schema values:\n" + "\n".join(wrong)
    assert checked > 0, "no direct op call found: the rule checks nothing"
