"""The ``layerprof`` command: profile a model from the shell (``layerprof SPEC --input SHAPE``)."""
from __future__ import annotations

from .command import main

__all__ = ["main"]
