"""flash_attn 2.x's namespace, and FlashAttention-3's `flash_attn_interface`, on FlashCore,
for code written against flash-attn that should run unmodified (its own test suites among it).

    import flashcore.compat
    flashcore.compat.use_as_flash_attn()      # the one step: before anything imports flash_attn
    from flash_attn import flash_attn_func    # FlashCore's

    flashcore.compat.use_as_flash_attn_interface()     # FA3's module name (`flash_attn_3.py`)
    from flash_attn_interface import flash_attn_func   # FlashCore's, FA3's signature

`flashcore.compat.flash_attn` holds the modules (`flash_attn`, `flash_attn.flash_attn_interface`,
`flash_attn.bert_padding`, `flash_attn.layers.rotary`); `use_as_flash_attn` registers them
under flash_attn's names. It refuses when a real flash-attn is installed (FlashCore never
shadows it silently): `force=True` then says the caller means it. Every attention call is
FlashCore's; what flash-attn 2.8.3 has and FlashCore does not yet (dropout,
`cache_leftpad`, ...) raises `NotImplementedError` naming the argument.
"""

from __future__ import annotations

import importlib
import importlib.util
import sys

# flash_attn's module names, and FlashCore's module behind each.
_MODULES = {
    "flash_attn": "flashcore.compat.flash_attn",
    "flash_attn.flash_attn_interface": "flashcore.compat.flash_attn.flash_attn_interface",
    "flash_attn.bert_padding": "flashcore.compat.flash_attn.bert_padding",
    "flash_attn.layers": "flashcore.compat.flash_attn.layers",
    "flash_attn.layers.rotary": "flashcore.compat.flash_attn.layers.rotary",
}


def use_as_flash_attn(force: bool = False) -> None:
    """Makes `import flash_attn` (and its submodules above) give FlashCore's namespace in this
    process. Raises `RuntimeError` if a real flash_attn is installed, or already imported,
    unless `force`. Calling it again is harmless."""
    ours = sys.modules.get("flash_attn")
    if ours is not None and ours.__name__ == _MODULES["flash_attn"]:
        return
    if not force:
        if ours is not None:
            raise RuntimeError(f"flash_attn is already imported from {getattr(ours, '__file__', '?')}: FlashCore does not replace it (force=True to)")
        spec = importlib.util.find_spec("flash_attn")
        if spec is not None:
            raise RuntimeError(f"a flash_attn package is installed ({spec.origin}): FlashCore does not shadow it silently (force=True to)")
    for name, module in _MODULES.items():
        sys.modules[name] = importlib.import_module(module)


def use_as_flash_attn_interface(force: bool = False) -> None:
    """Makes `import flash_attn_interface` (FlashAttention-3's module) give FlashCore's
    (`flashcore.compat.flash_attn_3`) in this process, on the same terms as
    `use_as_flash_attn`: `RuntimeError` if a real one is installed or imported, unless `force`;
    calling it again is harmless."""
    name, module = "flash_attn_interface", "flashcore.compat.flash_attn_3"
    ours = sys.modules.get(name)
    if ours is not None and ours.__name__ == module:
        return
    if not force:
        if ours is not None:
            raise RuntimeError(f"{name} is already imported from {getattr(ours, '__file__', '?')}: FlashCore does not replace it (force=True to)")
        spec = importlib.util.find_spec(name)
        if spec is not None:
            raise RuntimeError(f"a {name} module is installed ({spec.origin}): FlashCore does not shadow it silently (force=True to)")
    sys.modules[name] = importlib.import_module(module)
