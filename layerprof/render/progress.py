"""A progress bar for long runs (the CLI's steps, ``benchmark``'s iterations): tqdm on stderr, only on a
terminal unless asked for, and only where tqdm is installed (an optional dependency)."""
from __future__ import annotations

import sys
from typing import Any, Iterable, Iterator

__all__ = ["progress_bar", "progress"]


def progress_bar(total: int, enabled: bool | None, desc: str, unit: str, required: bool = False) -> Any:
    """A tqdm bar of ``total`` units, or None. ``enabled=None``: on when stdout and stderr are terminals.
    ``required``: a bar asked for (``enabled=True``) without tqdm installed is an ImportError, not silence."""
    if enabled is None:
        enabled = sys.stdout.isatty() and sys.stderr.isatty()
    if not enabled:
        return None
    try:
        from tqdm.auto import tqdm
    except ImportError:
        if required:
            raise ImportError("a progress bar needs tqdm: pip install tqdm") from None
        return None
    return tqdm(total=total, desc=desc, unit=unit, leave=False, file=sys.stderr)


def progress(steps: Iterable[int], total: int, enabled: bool | None = None) -> Iterator[int]:
    """``steps`` under a bar (see ``progress_bar``); the bar is a nicety, so a missing tqdm just hides it."""
    bar = progress_bar(total, enabled, "layerprof", "step")
    if bar is None:
        yield from steps
        return
    try:
        for step in steps:
            yield step
            bar.update(1)
    finally:
        bar.close()
