"""A profile in TensorBoard: ``prof.to_tensorboard(writer_or_logdir, step=None, depth=None, top=None)``.

Scalars per module under ``layerprof/<field>/<module name>``, written with ``add_scalar`` through one writer
(``add_scalars`` would open a writer, and an event file, per key); the sunburst, icicle and top plots as
figures; the top-k table as Markdown text; for a partial profile (a run that ended early), why, as text.
Needs ``tensorboard`` (``pip install tensorboard``).
"""
from __future__ import annotations

from pathlib import Path
from typing import Any

from .._check import check_int
from ..record.fields import FIELDS, canonical
from ..render.rows import whole_of
from ..render.summary import partial_note
from ._optional import require

__all__ = ["SCALAR_FIELDS", "write_tensorboard", "scalar_tag"]

# The fields written as scalars, each where the profile holds it ("memory": saved or activation bytes).
SCALAR_FIELDS = ("forward_ms", "backward_ms", "total_ms", "self_forward_ms", "self_backward_ms", "flops",
                 "params", "memory")
_PLOTS = ("sunburst", "icicle", "top")


def scalar_tag(field_name: str, record: Any) -> str:
    """``layerprof/<field>/<module name>``; the root (whose name is empty) goes by its type."""
    return f"layerprof/{field_name}/{record.name or record.type}"


def _writer(target: Any) -> tuple[Any, bool]:
    if isinstance(target, (str, Path)):
        module = require("torch.utils.tensorboard", "tensorboard", "to_tensorboard(logdir)")
        return module.SummaryWriter(log_dir=str(target)), True
    if not hasattr(target, "add_scalar"):
        raise TypeError(f"to_tensorboard expects a SummaryWriter or a log directory, got {type(target).__name__}")
    return target, False


def write_tensorboard(profile: Any, writer_or_logdir: Any, step: int | None = None, depth: int | None = None,
                      top: int | None = None) -> list[str]:
    """Write ``profile`` to TensorBoard; returns the scalar tags written.

    ``depth``: only modules down to this depth (root = 0); ``top``: only the ``top`` modules by total time
    (the root always), and the top table's length (default 10)."""
    # depth=0 or top=0 would write a table with no module beside plots of the whole tree: refused.
    depth, top = check_int("depth", depth, minimum=1, none=True), check_int("top", top, minimum=1, none=True)
    step = check_int("step", step, minimum=None, none=True)  # (the writer's own check comes once files are made)
    records = profile.select(max_depth=depth) if depth is not None else list(profile.records.values())
    if top is not None:
        ranked = {row["name"] for row in profile.top(top, by="total_ms", max_depth=depth).rows}
        records = [r for r in records if r.name in ranked or r is profile.tree]
    present = lambda name: any(getattr(r, name, None) is not None for r in records)  # noqa: E731
    fields = [f for f in (canonical(n, present) for n in SCALAR_FIELDS) if f in FIELDS]
    writer, owned = _writer(writer_or_logdir)
    tags = []
    root = profile.tree
    whole = whole_of(root)  # (a root never called itself: its top-level modules' sums, as the summary's)
    try:
        for name in dict.fromkeys(fields):
            for record in records:
                value = FIELDS[name].value(whole if record is root else record, whole)
                if isinstance(value, (int, float)) and not isinstance(value, bool):
                    tag = scalar_tag(name, record)
                    writer.add_scalar(tag, value, global_step=step)
                    tags.append(tag)
        _write_figures(profile, writer, step, depth, top)
        table = profile.top(10 if top is None else top, by="total_ms", max_depth=depth)
        writer.add_text("layerprof/top", table.to_markdown(), global_step=step)
        note = partial_note(profile.meta)
        if note is not None:  # a run that ended early: said beside its numbers
            writer.add_text("layerprof/partial", note, global_step=step)
        writer.flush()
    finally:
        if owned:
            writer.close()
    return tags


def _write_figures(profile: Any, writer: Any, step: int | None, depth: int | None, top: int | None) -> None:
    for kind in _PLOTS:
        options: dict[str, Any] = ({"k": 10 if top is None else top} if kind == "top" else
                                   ({"depth": depth} if depth is not None else {}))
        ax = profile.plot(kind, "total", **options)
        writer.add_figure(f"layerprof/{kind}", ax.figure, global_step=step, close=True)  # closes the figure
