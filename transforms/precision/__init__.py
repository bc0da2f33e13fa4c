"""Precision transforms (issue 24 part 1): ``precision.autocast``, off by default."""
from .autocast import AutocastTransform

__all__ = ["AutocastTransform"]
