"""Colours and label fitting shared by the plots. matplotlib is imported where used, so ``import layerprof``
stays light."""
from __future__ import annotations

import re
from typing import Any, Sequence

from .plot_layout import Segment

__all__ = ["segment_colour", "palette_colour", "fit_label", "new_axes", "text_width_pt", "points_per_unit",
           "wrap_label", "plain_text"]

TRUNK_GREY = (0.80, 0.80, 0.80)
OTHER_GREY = (0.93, 0.93, 0.93)
SELF_HATCH = "////"
# DejaVu Sans averages a little under 0.6 em per character; estimating beats measuring with a renderer per label.
CHAR_WIDTH_EM = 0.6


# tab10 without its grey (index 7), which would read as the trunk or as "other".
_HUES = (0, 1, 2, 3, 4, 5, 6, 8, 9)


def palette_colour(index: int) -> tuple[float, float, float]:
    """The ``index``-th colour of tab10 (grey left out), then the light half of tab20, cycling."""
    from matplotlib import colormaps

    hue = _HUES[index % len(_HUES)]
    if index % (2 * len(_HUES)) < len(_HUES):
        return tuple(colormaps["tab10"](hue)[:3])  # type: ignore[return-value]
    return tuple(colormaps["tab20"](2 * hue + 1)[:3])  # type: ignore[return-value]


def _lighten(colour: Sequence[float], amount: float) -> tuple[float, float, float]:
    return tuple(c + (1.0 - c) * amount for c in colour)  # type: ignore[return-value]


def segment_colour(segment: Segment) -> tuple[float, float, float]:
    """One colour per module: its branch's hue, lighter the deeper it is below the head of the branch. A self
    segment takes its parent's colour (and is hatched); "other" is light grey."""
    if segment.kind == "other":
        return OTHER_GREY
    if segment.branch < 0:
        return _lighten(TRUNK_GREY, 0.25 if segment.kind == "self" else 0.0)
    return _lighten(palette_colour(segment.branch), min(0.7, 0.22 * segment.shade))


# The most characters a legend entry or an axis label shows of a module's name (or a type's): a longer one keeps its
# start and end around an ellipsis, so a 200-character ModuleDict key leaves room for the chart.
LABEL_CHARS = 48


def shortened(text: str, most: int = LABEL_CHARS) -> str:
    """``text``, or its first and last characters around "…" where it is longer than ``most``.

    >>> shortened("encoder.layer.11.attention.output", 20)
    'encoder.la…on.output'
    """
    if len(text) <= most:
        return text
    tail = (most - 1) // 2
    return text[:most - 1 - tail] + "…" + text[len(text) - tail:]


def shortened_apart(texts: list[str], most: int = LABEL_CHARS) -> list[str]:
    """``shortened`` of each text, where that keeps them apart; texts that would read alike (names that differ in a
    layer's index, in the middle) keep their ends instead, and whole where those read alike too.

    >>> shortened_apart(["model.layers.0.attention.q_proj", "model.layers.1.attention.q_proj"], 20)
    ['….0.attention.q_proj', '….1.attention.q_proj']
    """
    short = [shortened(text, most) for text in texts]
    if len(set(short)) == len(short):
        return short
    counts = {label: short.count(label) for label in short}
    short = [("…" + text[len(text) - most + 1:] if counts[label] > 1 else label) for text, label in zip(texts, short)]
    counts = {label: short.count(label) for label in short}
    return [text if counts[label] > 1 else label for text, label in zip(texts, short)]


def plain_text(text: str) -> str:
    r"""``text`` (a module's name or type) as matplotlib should draw it: literally. matplotlib reads text between
    two ``$`` as mathtext, which draws ``a$x_1$`` in italics with a subscript and raises on ``$\frac$``; an
    escaped ``\$`` is drawn as ``$`` and opens no formula.

    >>> plain_text("cost$x_1$")
    'cost\\$x_1\\$'
    """
    return text.replace("$", r"\$")


def text_width_pt(text: str, fontsize: float) -> float:
    return len(text) * fontsize * CHAR_WIDTH_EM


def fit_label(candidates: Sequence[str], length_pt: float, thickness_pt: float, fontsize: float) -> str | None:
    """The first candidate whose estimated width fits ``length_pt`` when a line of text fits ``thickness_pt``."""
    if thickness_pt < 1.15 * fontsize:
        return None
    for text in candidates:
        if text_width_pt(text, fontsize) + 0.5 * fontsize <= length_pt:
            return text
    return None


def wrap_label(text: str, width_pt: float, fontsize: float) -> str | None:
    """``text`` broken at its CamelCase words into lines no wider than ``width_pt``; None if a word is wider."""
    words = re.findall(r"[A-Z]+[a-z0-9]*|[a-z0-9]+|[^A-Za-z0-9]+", text) or [text]
    lines: list[str] = []
    for word in words:
        if lines and text_width_pt(lines[-1] + word, fontsize) <= width_pt:
            lines[-1] += word
        elif text_width_pt(word, fontsize) <= width_pt:
            lines.append(word)
        else:
            return None
    return "\n".join(lines)


def points_per_unit(ax: Any) -> tuple[float, float]:
    """Points per data unit along x and y, once limits and aspect are final."""
    ax.apply_aspect()
    (x0, y0), (x1, y1) = ax.transData.transform([(0.0, 0.0), (1.0, 1.0)])
    scale = 72.0 / ax.figure.dpi
    return abs(x1 - x0) * scale, abs(y1 - y0) * scale


def _checked_axes(ax: Any) -> Any:
    """``ax`` if it is an Axes; a TypeError otherwise. The likely slips are the Figure or the array of Axes that
    ``plt.subplots`` returns, which failed deep in the drawing as an AttributeError."""
    from matplotlib.axes import Axes
    from matplotlib.figure import FigureBase

    if isinstance(ax, Axes):
        return ax
    asked = "ax must be a matplotlib Axes (fig, ax = plt.subplots()) or None"
    if isinstance(ax, FigureBase):
        raise TypeError(f"{asked}, got a Figure: pass one of its Axes, e.g. ax=fig.axes[0]")
    if type(ax).__name__ == "ndarray" and all(isinstance(item, Axes) for item in getattr(ax, "flat", ())):
        one = "axes[0]" if ax.ndim == 1 else "axes[0, 0]"  # (a grid of plt.subplots(2, 2) is 2-d)
        raise TypeError(f"{asked}, got an array of {ax.size} Axes: pass one, e.g. ax={one}")
    raise TypeError(f"{asked}, got {ax!r} ({type(ax).__name__})")


def new_axes(ax: Any, figsize: tuple[float, float]) -> Any:
    """``ax`` itself, or the Axes of a new pyplot figure (left open, for ``plt.show()``; a plot saved with
    ``path=`` closes the figure it made)."""
    if ax is not None:
        return _checked_axes(ax)
    import matplotlib.pyplot as plt

    _, ax = plt.subplots(figsize=figsize)
    return ax
