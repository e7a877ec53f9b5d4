"""The files the command writes, each through a Profile method; checked before the run, written after it."""
from __future__ import annotations

import argparse
from dataclasses import dataclass
from pathlib import Path

from ..profile import Profile
from .errors import RunError, UsageError, one_line

__all__ = ["Output", "requested_outputs", "write_outputs"]

_METHODS = {"csv": "to_csv", "json": "to_json", "html": "to_html", "trace": "to_trace",
            "speedscope": "to_speedscope", "report": "to_report", "plot": "plot"}


@dataclass(frozen=True)
class Output:
    """One ``--FLAG PATH`` request and the Profile method that writes it."""

    flag: str
    method: str
    path: Path


def requested_outputs(options: argparse.Namespace) -> list[Output]:
    """The outputs asked for, after checking that their folders exist."""
    outputs = []
    for flag, method in _METHODS.items():
        path = getattr(options, flag, None)
        if path is None:
            continue
        path = Path(path).expanduser()
        if not path.parent.is_dir():
            raise UsageError(f"--{flag} {str(path)!r}: folder {str(path.parent)!r} does not exist")
        outputs.append(Output(flag, method, path))
    return outputs


def write_outputs(profile: Profile, outputs: list[Output], plot_kind: str = "sunburst",
                  plot_metric: str = "total") -> list[Path]:
    """Write each output; returns the paths written."""
    written = []
    for output in outputs:
        method = getattr(profile, output.method)
        try:
            if output.flag == "plot":
                method(plot_kind, plot_metric, str(output.path))
            else:
                method(str(output.path))
        except Exception as exc:
            raise RunError(f"writing --{output.flag} {str(output.path)!r} raised {one_line(exc)}") from exc
        written.append(output.path)
    return written
