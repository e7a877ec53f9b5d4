"""The version of layerprof, in one place (the package, the saved files and the CLI read it), and the oldest torch
it runs on.

``MIN_TORCH`` is pyproject.toml's ``torch>=2.10``. torch 2.9 imports layerprof and profiles, but its CPU live-bytes
reader (``metrics=("live_memory",)``) reads wrong figures there, and so does the checkpoint planner's peak budget
built on them: a ``StorageWeakRef``, which the memory meter holds on storages it has seen, keeps a freed storage's
Python object alive through torch 2.9, so the reader never sees those storages freed. torch 2.8 and older also lack
the dispatch-mode options the FLOP meter and the reader set (flex attention raises under them, a compiled function in
a forward runs eagerly), and torch 2.5 the keyword arguments of global forward hooks (every profile raises).
``import layerprof`` on such a torch raises ImportError (``check_torch``) instead of giving those numbers.
"""
from __future__ import annotations

import re

__version__ = "0.1.0"

MIN_TORCH = (2, 10)


def torch_release(version: str) -> tuple[int, int] | None:
    """(major, minor) of a torch version string (``"2.10.0+cu128"``, ``"2.11.0.dev20260101"``); None where it
    starts otherwise."""
    match = re.match(r"\s*(\d+)\.(\d+)", version)
    return (int(match.group(1)), int(match.group(2))) if match else None


def check_torch(version: str) -> None:
    """Raise ImportError when ``version`` (``torch.__version__``) is older than ``MIN_TORCH``. A version string that
    cannot be read (a build of one's own) passes."""
    release = torch_release(version)
    if release is not None and release < MIN_TORCH:
        minimum = ".".join(map(str, MIN_TORCH))
        raise ImportError(
            f"layerprof {__version__} needs torch {minimum} or newer, and this environment has torch {version}: "
            f"upgrade it (pip install 'torch>={minimum}'). Older torch releases lack private APIs layerprof relies on, "
            "or behave otherwise there, and some of its figures would be wrong without an error."
        )
