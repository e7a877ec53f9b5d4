"""Collection of the package's docstring examples (``--doctest-modules``, pyproject.toml) where extras are missing.

An integration module imports its optional packages when it is imported (``layerprof/integrations/_optional.py``):
where they are not installed, collecting its doctests would be an error rather than a skip, so the module is left
out, as its tests skip (``pip install -e ".[test]"`` installs every extra).
"""
from __future__ import annotations

import importlib.util

from layerprof.integrations._optional import EXTRAS


def _installed(package: str) -> bool:
    try:
        return importlib.util.find_spec(package) is not None
    except (ImportError, ValueError):
        return False


collect_ignore = [f"layerprof/integrations/{extra}.py" for extra, packages in EXTRAS.items()
                  if not all(map(_installed, packages))]
