"""Warnings attributed to the user's code: the first frame outside layerprof, however deep inside it they are
raised (a meter's ``stop`` runs under ``__exit__`` or ``prof.stop()``, at different depths)."""
from __future__ import annotations

import contextlib
import os
import sys
import warnings
from typing import Any

__all__ = ["PACKAGE", "user_frame", "warn_user"]

PACKAGE = os.path.dirname(os.path.abspath(__file__))
# ``with plan.applied(model):`` enters through contextlib's frames, which say nothing to the user either.
_PASSED_THROUGH = (PACKAGE, contextlib.__file__)


def user_frame() -> tuple[Any, int]:
    """The first frame outside layerprof and contextlib (the user's ``with`` or ``prof.step()`` line), and its
    stack level as seen from the caller of ``user_frame``."""
    frame, level = sys._getframe(1), 1
    while frame is not None and frame.f_code.co_filename.startswith(_PASSED_THROUGH):
        frame, level = frame.f_back, level + 1
    return frame, level


def warn_user(message: str, category: type[Warning] = RuntimeWarning) -> None:
    """``warnings.warn`` of ``message`` at the first frame outside layerprof."""
    warnings.warn(message, category, stacklevel=user_frame()[1])
