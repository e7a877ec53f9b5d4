"""The version of layerprof, in one place (the package, the saved files and the CLI read it), and the oldest torch
it runs on.

``MIN_TORCH`` is pyproject.toml's ``torch>=2.9``: ``import layerprof`` on an older torch raises ImportError
(``check_torch``) instead of giving wrong numbers. torch 2.8 and older lack the dispatch-mode options the FLOP meter
and the live-bytes reader set (flex attention raises under them, a compiled function in a forward runs eagerly).
``LIVE_BYTES_TORCH``: on torch 2.9 a ``StorageWeakRef``, which the memory meter holds on the storages it has seen,
keeps a freed storage's Python object alive, so the CPU live-bytes reader (``metrics=("live_memory",)``) would never
see those storages freed and read wrong figures, and so would the checkpoint planner's peak budgets built on them:
that meter is refused there (``check_live_bytes_torch``), and the rest runs.
"""
from __future__ import annotations

import re

__version__ = "0.1.0"

MIN_TORCH = (2, 9)
LIVE_BYTES_TORCH = (2, 10)


def torch_release(version: str) -> tuple[int, int] | None:
    """(major, minor) of a torch version string (``"2.10.0+cu128"``, ``"2.11.0.dev20260101"``); None where it
    starts otherwise."""
    match = re.match(r"\s*(\d+)\.(\d+)", version)
    return (int(match.group(1)), int(match.group(2))) if match else None


def _short_of(version: str, floor: tuple[int, int]) -> str | None:
    """``floor`` as text ("2.10") where ``version`` (``torch.__version__``) is an older release; None where it is not,
    or cannot be read (a build of one's own)."""
    release = torch_release(version)
    return ".".join(map(str, floor)) if release is not None and release < floor else None


def check_torch(version: str) -> None:
    """Raise ImportError when ``version`` (``torch.__version__``) is older than ``MIN_TORCH``. A version string that
    cannot be read (a build of one's own) passes."""
    minimum = _short_of(version, MIN_TORCH)
    if minimum is not None:
        raise ImportError(
            f"layerprof {__version__} needs torch {minimum} or newer, and this environment has torch {version}: "
            f"upgrade it (pip install 'torch>={minimum}'). Older torch releases lack private APIs layerprof relies on, "
            "or behave otherwise there, and some of its figures would be wrong without an error."
        )


def check_live_bytes_torch(version: str) -> None:
    """Raise ValueError when ``version`` (``torch.__version__``) is older than ``LIVE_BYTES_TORCH``: the CPU live-bytes
    reader would read wrong figures there (the module doc)."""
    minimum = _short_of(version, LIVE_BYTES_TORCH)
    if minimum is not None:
        raise ValueError(
            f"metrics=('live_memory',) needs torch {minimum} or newer, and this environment has torch {version}: "
            "there a storage's weak reference keeps a freed storage's Python object alive, so the live-bytes reader "
            f"would not see frees and its figures (and peak budgets planned on them) would be wrong. Upgrade torch "
            f"(pip install 'torch>={minimum}'), or profile with metrics=('memory',) for the saved-for-backward bytes"
        )
