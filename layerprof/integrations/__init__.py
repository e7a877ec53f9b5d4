"""Integrations with the tools people train and look with: PyTorch Lightning (``integrations.lightning``), the
Hugging Face Trainer (``integrations.transformers``) and TensorBoard (``integrations.tensorboard``).

Each module imports its package where it is used and, when it is missing, raises one line naming the package
and how to install it (``pip install lightning``; from a clone of layerprof, ``pip install -e ".[lightning]"``).
Importing this package imports none of them.
"""
from __future__ import annotations

from ._optional import require

__all__ = ["require"]
