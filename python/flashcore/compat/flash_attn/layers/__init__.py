"""flash_attn.layers on FlashCore: `rotary` alone (see `flashcore.compat`)."""
