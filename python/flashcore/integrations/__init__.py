"""Integrations with model libraries: `flashcore.integrations.transformers`."""

from . import transformers

__all__ = ["transformers"]
