"""flash_attn.layers.rotary on FlashCore: `apply_rotary_emb` is `flashcore.rotary`'s."""

from ....rotary import apply_rotary_emb

apply_rotary_emb_func = apply_rotary_emb  # flash-attn's older name

__all__ = ["apply_rotary_emb", "apply_rotary_emb_func"]
