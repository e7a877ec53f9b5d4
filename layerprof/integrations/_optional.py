"""Optional packages: imported where used, with a one-line error naming the extra that installs them."""
from __future__ import annotations

import importlib
from types import ModuleType

__all__ = ["require"]


def require(module: str, extra: str, what: str) -> ModuleType:
    """Import ``module``, or raise ImportError saying ``pip install "layerprof[extra]"``."""
    try:
        return importlib.import_module(module)
    except ImportError as exc:
        raise ImportError(
            f"{what} needs the {module.split('.')[0]!r} package: pip install \"layerprof[{extra}]\""
        ) from exc
