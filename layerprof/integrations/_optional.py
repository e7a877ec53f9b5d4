"""Optional packages: imported where used, with a one-line error naming what to install.

layerprof is installed from a clone, not from a package index, so ``pip install "layerprof[lightning]"`` fails;
the error names the packages themselves (``pip install lightning``) and the extra for a clone
(``pip install -e ".[lightning]"``).
"""
from __future__ import annotations

import importlib
from types import ModuleType

__all__ = ["require", "EXTRAS", "install_hint"]

# The packages of each extra of pyproject.toml's [project.optional-dependencies] that an integration imports
# (tests/test_integrations.py checks them against pyproject.toml).
EXTRAS: dict[str, tuple[str, ...]] = {
    "lightning": ("lightning",),
    "transformers": ("transformers", "accelerate"),
    "tensorboard": ("tensorboard",),
}


def install_hint(extra: str) -> str:
    """What installs ``extra``: ``pip install lightning (from a clone of layerprof: pip install -e ".[lightning]")``."""
    if extra not in EXTRAS:
        raise ValueError(f"unknown extra {extra!r}; choose from: {', '.join(EXTRAS)}")
    return f"pip install {' '.join(EXTRAS[extra])} (from a clone of layerprof: pip install -e \".[{extra}]\")"


def require(module: str, extra: str, what: str) -> ModuleType:
    """Import ``module``, or raise an ImportError naming the packages of ``extra`` and how to install them."""
    hint = install_hint(extra)  # an unknown extra fails here, whether the import would or not
    try:
        return importlib.import_module(module)
    except ImportError as exc:
        packages = " and ".join(repr(package) for package in EXTRAS[extra])
        raise ImportError(f"{what} needs {packages}: {hint}") from exc
