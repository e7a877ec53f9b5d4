"""The one place that turns numbers into human-readable text."""
from __future__ import annotations

__all__ = ["format_ms", "format_count", "format_bytes", "format_flops", "format_percent", "format_shapes", "MISSING"]

MISSING = "—"


def format_ms(ms: float | None) -> str:
    """Milliseconds as µs, ms or s with three significant-ish digits: ``format_ms(0.0123) == '12.3 µs'``."""
    if ms is None:
        return MISSING
    magnitude = abs(ms)
    if magnitude >= 1000:
        return f"{ms / 1000:.3g} s"
    if magnitude >= 1 or ms == 0:
        return f"{ms:.3g} ms" if magnitude < 100 else f"{ms:.0f} ms"
    return f"{ms * 1000:.3g} µs"


def _scaled(value: float, base: float, units: tuple[str, ...], suffix: str) -> str:
    magnitude = abs(value)
    for unit in units[:-1]:
        if magnitude < base:
            return f"{value:.3g}{unit}{suffix}" if unit.strip() else f"{value:g}{unit}{suffix}"
        value /= base
        magnitude /= base
    return f"{value:.3g}{units[-1]}{suffix}"


def format_count(value: float | None) -> str:
    """Counts with k/M/G/T: ``format_count(11_689_512) == '11.7M'``."""
    if value is None:
        return MISSING
    return _scaled(float(value), 1000.0, ("", "k", "M", "G", "T", "P"), "")


def format_flops(value: float | None, suffix: str = "FLOPs") -> str:
    """FLOPs (or FLOP/s with ``suffix='FLOP/s'``): ``format_flops(3.6e9) == '3.6 GFLOPs'``."""
    if value is None:
        return MISSING
    text = _scaled(float(value), 1000.0, (" ", " k", " M", " G", " T", " P"), suffix)
    return text


def format_bytes(value: float | None) -> str:
    """Bytes in binary units: ``format_bytes(46_827_520) == '44.7 MiB'``."""
    if value is None:
        return MISSING
    return _scaled(float(value), 1024.0, (" ", " Ki", " Mi", " Gi", " Ti"), "B")


def format_percent(part: float | None, whole: float | None) -> str:
    """``part`` as a percentage of ``whole``, or MISSING where either is unknown or the whole is 0."""
    if part is None or not whole:
        return MISSING
    return f"{100.0 * part / whole:.1f}%"


def format_shapes(shapes: list[list[int]] | None, limit: int = 3) -> str:
    """Tensor shapes, the first ``limit`` of them: ``format_shapes([[4, 10], []]) == '[4, 10], []'``; a call with
    no tensor is ``'()'``; more than ``limit`` end with ``'… +N'``."""
    if shapes is None:
        return MISSING
    if not shapes:
        return "()"
    shown = ", ".join("[" + ", ".join(str(size) for size in shape) + "]" for shape in shapes[:limit])
    return shown + (f", … +{len(shapes) - limit}" if len(shapes) > limit else "")
