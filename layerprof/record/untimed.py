"""Profiles without times: a step on the meta device or on fake tensors, counted and not timed.

On the meta device, and under ``torch._subclasses.fake_tensor.FakeTensorMode``, an op allocates nothing and computes
nothing: it only works out its output's shape, dtype and device. FLOPs, bytes, parameters, shapes and the bytes
saved for backward are functions of those, and hold; a clock around a module reads the host's bookkeeping of
shapes, not the model's work, so such a profile keeps no time at all (``meta["untimed"]`` says why, and every
time field reads None). What needs times (FLOP/s, the measured side of the roofline, checkpoint plans, the
timeline) says so with ``untimed_note``.
"""
from __future__ import annotations

from typing import Any

from .fields import FIELDS, Field

__all__ = ["UNTIMED", "untimed_in", "untimed_note", "reads_time"]

# ``meta["untimed"]``: what the step ran on, as a sentence names it.
UNTIMED = {"meta": "the meta device", "fake": "fake tensors (FakeTensorMode)"}


def untimed_in(meta: Any) -> str | None:
    """``"meta"`` or ``"fake"`` for a profile (its ``meta``) whose step ran without data, None for a timed one."""
    kind = meta.get("untimed") if isinstance(meta, dict) else None
    return kind if isinstance(kind, str) else None


def untimed_note(meta: Any) -> str | None:
    """What a profile without times says of itself (None for a timed one): why it has none, and what it holds."""
    kind = untimed_in(meta)
    if kind is None:
        return None
    return (f"no times: the step ran on {UNTIMED.get(kind, kind)}, where ops compute nothing; FLOPs, bytes, "
            "parameters, shapes and saved bytes are counted from the tensors' shapes")


def reads_time(field: Field) -> bool:
    """Whether ``field`` reads a measured time, which a profile without times lacks on every module: a time, a rate
    over one (FLOP/s, bandwidth), a share of the step's time, the roofline's efficiency."""
    measured = FIELDS.get(field.of or "") if field.unit == "percent" else field
    return measured is not None and measured.unit in ("ms", "flop/s", "byte/s", "ratio")
