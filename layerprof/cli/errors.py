"""The command line's failures, each with its own exit status, so a script can tell them apart.

=====  ==========================================================================================
 0     done (and ``compare --fail-if-slower`` found no regression)
 1     ``compare --fail-if-slower``: B is slower than A beyond the limit and the noise; ``gather
       --fail-on-stragglers``: a rank is a straggler on the whole step
 2     usage error: the command line asks for something impossible (option, spec, shape, path)
 3     unreadable input: a profile file is missing, unreadable, not JSON or not a layerprof profile
 4     ``compare --fail-if-slower``: the two profiles are of different models, so there is no verdict
 5     the run failed: the model, its factory or an export raised
 70    internal error: a bug of layerprof itself (``--debug`` shows the traceback)
 130   interrupted (Ctrl-C)
=====  ==========================================================================================
"""
from __future__ import annotations

__all__ = ["CLIError", "UsageError", "UnreadableInput", "NotComparable", "RunError", "one_line", "EXIT_OK",
           "EXIT_SLOWER", "EXIT_USAGE", "EXIT_UNREADABLE", "EXIT_NOT_COMPARABLE", "EXIT_RUN", "EXIT_INTERNAL",
           "EXIT_INTERRUPTED"]

EXIT_OK = 0
EXIT_SLOWER = 1
EXIT_USAGE = 2
EXIT_UNREADABLE = 3
EXIT_NOT_COMPARABLE = 4
EXIT_RUN = 5
EXIT_INTERNAL = 70  # sysexits.h's EX_SOFTWARE
EXIT_INTERRUPTED = 130


class CLIError(Exception):
    """A failure reported as one line on stderr; ``exit_code`` is the process's exit status."""

    exit_code = EXIT_RUN


class UsageError(CLIError):
    """The command line asks for something impossible (bad spec, shape, dtype, JSON, device): exit status 2."""

    exit_code = EXIT_USAGE


class UnreadableInput(CLIError):
    """A profile file given to ``show`` or ``compare`` is missing or is not a layerprof profile: exit status 3."""

    exit_code = EXIT_UNREADABLE


class NotComparable(CLIError):
    """``compare --fail-if-slower`` on profiles of two different models, or measured otherwise: exit status 4."""

    exit_code = EXIT_NOT_COMPARABLE


class RunError(CLIError):
    """The model, its factory or an export failed while running: exit status 5."""

    exit_code = EXIT_RUN


def one_line(exc: BaseException) -> str:
    """``Type: first line of the message``, with layerprof's notes (which module raised) appended."""
    text = str(exc).strip().split("\n", 1)[0]
    if isinstance(exc, KeyError) and text.startswith(("'", '"')):
        text = f"key {text} not found"
    notes = [note.replace("layerprof: ", "", 1) for note in getattr(exc, "__notes__", ())
             if note.startswith("layerprof:")]
    shown = f"{type(exc).__name__}: {text}" if text else type(exc).__name__
    return shown + "".join(f" [{note}]" for note in notes)
