"""The end of every plot function: a figure layerprof created is grown to hold all it drew, and saved when
``path=`` asks for it.

A legend beside the Axes or long tick labels fall outside a figure of fixed size, so a plain ``savefig`` of the
returned Axes would cut them off. ``fit_figure`` enlarges the figure around its Axes (their size in inches kept,
so labels fitted to them stay fitted); a saved file is also cropped to what was drawn (``bbox_inches="tight"``).
A figure the caller made (``ax=...``) is the caller's: it is never resized, only saved if asked.

A PDF goes into a paper: its text is embedded as TrueType (``pdf.fonttype`` 42) rather than matplotlib's default
Type 3 fonts, which publishers' PDF checks (IEEE PDF eXpress, ACM) refuse.
"""
from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from .._files import move_into_place, temporary_beside

__all__ = ["PLOT_SUFFIXES", "plot_suffix", "fit_figure", "finish_plot"]

PLOT_SUFFIXES = ("png", "svg", "pdf")
# What a saved file is written with, whatever the user's rcParams (only for this save).
_SAVE_RC = {"pdf.fonttype": 42}
PAD_INCHES = 0.1


def plot_suffix(path: str | os.PathLike[str] | None) -> str | None:
    """The format ``path`` asks for (``png``, ``svg`` or ``pdf``, by its suffix), None for no path; checked before
    any drawing, so a bad path fails at once."""
    if path is None:
        return None
    if not isinstance(path, (str, os.PathLike)):
        raise TypeError(f"path must be a str or a pathlib.Path ending in .png, .svg or .pdf, got {type(path).__name__}")
    suffix = Path(path).suffix.lower().lstrip(".")
    if suffix not in PLOT_SUFFIXES:
        raise ValueError(f"cannot save a plot as {str(path)!r}: use a .png, .svg or .pdf path")
    return suffix


def fit_figure(figure: Any) -> None:
    """Grow ``figure`` so that everything drawn on it (a legend beside the Axes, tick labels, the title) lies
    on it, with each Axes kept at its size and place relative to the others, in inches."""
    width, height = figure.get_size_inches()
    drawn = figure.get_tightbbox(figure.canvas.get_renderer())  # in inches
    left = max(0.0, PAD_INCHES - drawn.x0)
    bottom = max(0.0, PAD_INCHES - drawn.y0)
    right = max(0.0, drawn.x1 + PAD_INCHES - width)
    top = max(0.0, drawn.y1 + PAD_INCHES - height)
    if not (left or bottom or right or top):
        return
    new_width, new_height = width + left + right, height + bottom + top
    for ax in figure.axes:
        x0, y0, box_width, box_height = ax.get_position(original=True).bounds  # fractions of the old figure
        ax.set_position([(x0 * width + left) / new_width, (y0 * height + bottom) / new_height,
                         box_width * width / new_width, box_height * height / new_height])
    figure.set_size_inches(new_width, new_height)


def finish_plot(ax: Any, path: str | os.PathLike[str] | None, created: bool) -> Any:
    """Fit a figure made by the plot function (``created``), save it to ``path`` if given (complete or not at
    all) and close it then; return ``ax``."""
    figure = ax.figure
    if created:
        fit_figure(figure)
    suffix = plot_suffix(path)
    if path is None:
        return ax
    target = Path(path)
    temporary: Path | None = None
    try:
        temporary = temporary_beside(target)
        import matplotlib

        with matplotlib.rc_context(_SAVE_RC):
            figure.savefig(temporary, format=suffix, dpi=110, bbox_inches="tight", pad_inches=PAD_INCHES)
        move_into_place(temporary, target)
    finally:
        if temporary is not None:
            temporary.unlink(missing_ok=True)
        if created:
            import matplotlib.pyplot as plt

            plt.close(figure)
    return ax
