"""The files the command writes, each through a Profile method; checked before the run, written after it, all or
none."""
from __future__ import annotations

import argparse
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .._files import MoveError, destination, is_special, move_all_into_place, temporary_beside
from ..metrics import DEFAULT_METRICS, METERS
from ..profile import Profile
from ..record.fields import FIELDS, canonical
from ..render.plot_metrics import backward_only, metric_meters, saved_for_backward
from .errors import RunError, UsageError, one_line
from .parser import PLOT_DEFAULTS
from .spec import spec_file

__all__ = ["COMPARE_METHODS", "Output", "check_writable", "forward_only_mode", "requested_outputs", "write_outputs"]

_METHODS = {"csv": "to_csv", "json": "to_json", "html": "to_html", "trace": "to_trace",
            "speedscope": "to_speedscope", "report": "to_report", "plot": "plot"}
# ``layerprof compare``'s: the comparison's model-level table (``Comparison`` methods of these names).
COMPARE_METHODS = {"csv": "to_csv", "markdown": "to_markdown", "latex": "to_latex"}


@dataclass(frozen=True)
class Output:
    """One ``--FLAG PATH`` request and the Profile method that writes it."""

    flag: str
    method: str
    path: Path


_PLOT_SUFFIXES = (".png", ".svg", ".pdf")


def check_writable(flag: str, path: Path) -> None:
    """A usage error where ``--FLAG PATH`` cannot be written (a folder, a missing folder, no permission)."""
    try:
        _check_path(flag, path)
    except (OSError, RuntimeError) as exc:  # a name too long, a loop of links: what the system says of the path
        reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
        raise UsageError(f"--{flag} {str(path)[:200]!r}: cannot be written ({reason})") from None


def _check_path(flag: str, path: Path) -> None:
    if os.path.islink(path):
        try:
            os.path.realpath(path, strict=True)  # a loop of links raises (a link to nothing yet is written through)
        except FileNotFoundError:
            pass
    target = destination(path)
    if target.is_dir():
        shown = str(path / ("profile." + flag))
        raise UsageError(f"--{flag} {str(path)!r} is a folder; give the path of a file, e.g. {shown!r}")
    folder = target.parent
    if not folder.is_dir():
        shown = "is a file, not a folder" if folder.exists() else "does not exist"
        raise UsageError(f"--{flag} {str(path)!r}: folder {str(folder)!r} {shown}")
    if is_special(target):
        if not os.access(target, os.W_OK):
            raise UsageError(f"--{flag} {str(path)!r}: cannot be written (no permission)")
        return  # a device or FIFO (/dev/null): written through, not replaced
    try:
        temporary_beside(path).unlink()  # where the output will be written first, so a real test of the folder
    except OSError as exc:
        raise UsageError(f"--{flag} {str(path)!r}: cannot write in folder {str(folder)!r} ({exc.strerror})") from None


def forward_only_mode(options: argparse.Namespace) -> str | None:
    """The option that makes a run forward only (``--eval`` or ``--no-backward``), or None: a backward figure of
    such a run is empty on every module."""
    return "--eval" if options.eval else "--no-backward" if options.no_backward else None


def _check_plot(options: argparse.Namespace, path: Path) -> None:
    if path.suffix.lower() not in _PLOT_SUFFIXES:
        raise UsageError(f"--plot {str(path)!r}: a plot is saved as .png, .svg or .pdf; give a path ending in one of them")
    if getattr(options, "plot_kind", None) == "checkpoint":  # the frontier of checkpoint plans: its axes are fixed
        if options.plot_metric != PLOT_DEFAULTS["plot_metric"]:
            raise UsageError(f"--plot-metric {options.plot_metric}: --plot-kind checkpoint draws saved memory against "
                             "extra time, and takes no metric; drop --plot-metric")
        return
    metric = options.plot_metric
    kind = getattr(options, "plot_kind", None)
    if kind != "roofline":
        try:
            needed = metric_meters(metric)
        except ValueError as exc:
            raise UsageError(f"--plot-metric: {exc}") from None
    if not hasattr(options, "metrics"):
        return  # `show`: the saved profile decides what it holds (``saved._check_plot_figures``, once loaded)
    # (the metric is known here: ``metric_meters`` refused any other name above)
    field = FIELDS[canonical(metric) or metric] if kind != "roofline" else None  # (roofline: no metric)
    mode = forward_only_mode(options)
    if field is not None and mode is not None and backward_only(field):
        raise UsageError(f"--plot-metric {metric}: a run with {mode} has no backward pass to plot; plot forward or "
                         f"total, or drop {mode}")
    if field is not None and options.eval and saved_for_backward(field):
        # (--no-backward keeps gradients on: autograd saves for a backward that does not run, and this counts it)
        raise UsageError(f"--plot-metric {metric}: a run with --eval (torch.inference_mode) saves nothing for "
                         f"backward, so {field.name} is 0 on every module; plot activation_bytes (what the modules "
                         "return), or drop --eval")
    if kind == "roofline":
        needed = ("flops",)
    missing = missing_meters(options, needed)
    if missing:
        asked = ",".join([*(options.metrics or ()), *missing])
        if kind == "roofline":
            raise UsageError(f"--plot-kind roofline needs the flops meter (FLOPs and bytes): add --metrics {asked}")
        raise UsageError(f"--plot-metric {metric} needs the {' and '.join(missing)} meter: add --metrics {asked}")


def missing_meters(options: argparse.Namespace, needed: Any) -> list[str]:
    """Of the meters ``needed`` (names, in order), those that ``--metrics`` (or the default ones) leaves out. A
    chosen meter that replaces another (live_memory: memory with more) gives what that one gives."""
    chosen = DEFAULT_METRICS if options.metrics is None else options.metrics
    covered = {*chosen, *(getattr(METERS.get(name), "replaces", None) for name in chosen)}
    return [meter for meter in dict.fromkeys(needed) if meter not in covered]


def _check_plot_chosen(options: argparse.Namespace) -> None:
    """--plot-kind or --plot-metric without --plot chooses a figure nothing draws: refused, as --wrap-cost without
    a plan is (the run went on, and the user looked for a figure that was never written)."""
    if getattr(options, "plot", None) is not None:
        return
    chosen = [f"--{name.replace('_', '-')} {getattr(options, name)}" for name, default in PLOT_DEFAULTS.items()
              if getattr(options, name, default) != default]
    if chosen:
        raise UsageError(f"{' '.join(chosen)}: no figure is drawn without --plot PATH (a .png, .svg or .pdf)")


def requested_outputs(options: argparse.Namespace, methods: dict[str, str] | None = None) -> list[Output]:
    """The outputs asked for, checked before anything is built: this version can write them, each path is a file
    in a folder that exists and can be written, and a plot's format and metric can be made. ``methods``: the
    flags and what writes each (a Profile's methods unless told)."""
    _check_plot_chosen(options)
    outputs = []
    for flag, method in (_METHODS if methods is None else methods).items():
        path = getattr(options, flag, None)
        if path is None:
            continue
        path = Path(path).expanduser()
        check_writable(flag, path)
        if flag == "plot":
            _check_plot(options, path)
        outputs.append(Output(flag, method, path))
    targets = [output.path.resolve() for output in outputs]
    for index, target in enumerate(targets):
        if target in targets[:index]:
            raise UsageError(f"--{outputs[index].flag} {str(outputs[index].path)!r}: another output writes there too")
    read = {path.resolve(): shown for path, shown in _inputs(options)}
    for output, target in zip(outputs, targets):
        if target in read:
            raise UsageError(f"--{output.flag} {str(output.path)!r} is the {read[target]} this command reads; give "
                             "the output another path")
    return outputs


def _inputs(options: argparse.Namespace) -> list[tuple[Path, str]]:
    """The files the command reads (the model's file, the saved profiles), each with what it is, for the
    check that no output is written over one."""
    found = [(Path(getattr(options, key)).expanduser(), "profile") for key in ("profile", "a", "b")
             if isinstance(getattr(options, key, None), str)]
    model = spec_file(options.spec) if isinstance(getattr(options, "spec", None), str) else None
    if model is not None:
        found.append((model, "model file"))
    return found


def write_outputs(profile: Profile | Any, outputs: list[Output], plot_kind: str = "sunburst",
                  plot_metric: str = "total", **plot_options: Any) -> list[Path]:
    """Write every output, or none: each into a temporary file beside its path, all renamed into place only once
    every one has succeeded (and those renamed undone where a later one cannot be). Returns the paths written.
    ``profile``: what has the outputs' methods (a Profile, or a comparison's for ``COMPARE_METHODS``)."""
    staged: list[Path] = []
    try:
        for output in outputs:
            temporary = temporary_beside(output.path)
            staged.append(temporary)
            method = getattr(profile, output.method)
            try:
                if output.flag == "plot":
                    method(plot_kind, plot_metric, str(temporary), **plot_options)
                else:
                    method(str(temporary))
            except Exception as exc:
                raise RunError(f"writing --{output.flag} {str(output.path)!r} raised {one_line(exc)}; "
                               "no output file was written") from exc
        try:
            move_all_into_place(list(zip(staged, (output.path for output in outputs))))
        except MoveError as exc:  # an existing file that cannot be replaced (another user's, immutable)
            output = outputs[exc.index]
            through = ", ".join(f"--{outputs[i].flag} {str(outputs[i].path)!r}" for i in exc.through)
            said = ("no output file was written (those put in place before it were undone)" if exc.restored else
                    f"undoing the outputs put in place before it failed: {'; '.join(exc.left)}")
            raise RunError(f"writing --{output.flag} {str(output.path)!r}: cannot put it in place "
                           f"({exc.strerror or one_line(exc.cause)}); {said}"
                           + (f"; written through already: {through}" if through else "")) from exc
    finally:
        for temporary in staged:
            temporary.unlink(missing_ok=True)
    return [output.path for output in outputs]
