"""Ctrl-C while ``import layerprof`` imports torch (seconds) ends the ``layerprof`` command without a traceback.

The console script imports the package before ``main`` runs, so ``main``'s own handler is not there yet. Only the
command is quiet: a program that imports layerprof gets its KeyboardInterrupt as usual.
"""
from __future__ import annotations

import contextlib
import os
import sys
from typing import Iterator

__all__ = ["quiet_interrupt", "running_as_command"]


def running_as_command() -> bool:
    """Whether this process is the ``layerprof`` command (the console script or ``python -m layerprof``)."""
    argv = list(getattr(sys, "orig_argv", sys.argv))
    if "-m" in argv[:-1] and argv[argv.index("-m") + 1] == "layerprof":
        return True
    script = os.path.basename(sys.argv[0]) if sys.argv and sys.argv[0] else ""
    return script in ("layerprof", "layerprof.exe", "layerprof-script.py")


@contextlib.contextmanager
def quiet_interrupt() -> Iterator[None]:
    try:
        yield
    except KeyboardInterrupt:
        if not running_as_command():
            raise
        print("layerprof: interrupted", file=sys.stderr)
        raise SystemExit(130) from None
