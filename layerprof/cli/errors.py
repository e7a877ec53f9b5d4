"""The command line's two kinds of failure, each with its exit status."""
from __future__ import annotations

__all__ = ["CLIError", "UsageError", "RunError", "one_line"]


class CLIError(Exception):
    """A failure reported as one line on stderr; ``exit_code`` is the process's exit status."""

    exit_code = 1


class UsageError(CLIError):
    """The command line asks for something impossible (bad spec, shape, dtype, JSON, device): exit status 2."""

    exit_code = 2


class RunError(CLIError):
    """The model, its factory or an export failed while running: exit status 1."""

    exit_code = 1


def one_line(exc: BaseException) -> str:
    """``Type: first line of the message``, with layerprof's notes (which module raised) appended."""
    text = str(exc).strip().split("\n", 1)[0]
    if isinstance(exc, KeyError) and text.startswith(("'", '"')):
        text = f"key {text} not found"
    notes = [note.replace("layerprof: ", "", 1) for note in getattr(exc, "__notes__", ())
             if note.startswith("layerprof:")]
    shown = f"{type(exc).__name__}: {text}" if text else type(exc).__name__
    return shown + "".join(f" [{note}]" for note in notes)
