"""The one place that turns numbers into human-readable text. A field's unit comes from the catalogue."""
from __future__ import annotations

from ..record.fields import FIELDS

__all__ = [
    "format_ms", "format_count", "format_bytes", "format_flops", "format_percent", "format_change", "format_ratio",
    "format_plain", "format_field", "format_value", "field_label", "format_shapes", "format_counted", "format_signed_ms",
    "format_signed_bytes", "format_signed_field",
    "MISSING",
]

MISSING = "—"


def _shown(magnitude: float) -> float:
    """``magnitude`` as ``_three`` shows it: 999.7 shows as 1000 (and 1023.9 as 1024), so it takes the next unit."""
    return float(_three(magnitude))


def _three(value: float) -> str:
    """Three significant digits and never an exponent: '12.3', '0.5', '1010' (a KiB count below 1024)."""
    text = f"{value:.3g}"
    return f"{value:.0f}" if "e+" in text else text


def format_ms(ms: float | None) -> str:
    """Milliseconds as µs, ms or s with three significant-ish digits: ``format_ms(0.0123) == '12.3 µs'``."""
    if ms is None:
        return MISSING
    magnitude = abs(ms)
    if ms != 0 and _shown(magnitude * 1000) < 1000:
        return f"{_three(ms * 1000)} µs"
    if _shown(magnitude) < 100:
        return f"{_three(ms)} ms"
    if round(magnitude) < 1000:
        return f"{ms:.0f} ms"
    return f"{_three(ms / 1000)} s"


def format_signed_ms(ms: float | None) -> str:
    """A time difference with its sign: ``format_signed_ms(2.5) == '+2.5 ms'``, ``format_signed_ms(-0.4) == '-400 µs'``."""
    if ms is None:
        return MISSING
    return ("-" if ms < 0 else "+") + format_ms(abs(ms))


def _scaled(value: float, base: float, units: tuple[str, ...], suffix: str) -> str:
    magnitude = abs(value)
    for unit in units[:-1]:
        whole = not unit.strip() and value == int(value)  # bytes or FLOPs as counted: every digit
        if (magnitude if whole else _shown(magnitude)) < base:
            return f"{value:g}{unit}{suffix}" if whole else f"{_three(value)}{unit}{suffix}"
        value /= base
        magnitude /= base
    return f"{_three(value)}{units[-1]}{suffix}"


def format_counted(count: float, singular: str, plural: str | None = None, shown: str | None = None) -> str:
    """A count and its noun, the noun singular for exactly one: ``format_counted(1, "child", "children")`` is
    ``'1 child'``, ``format_counted(0, "step")`` is ``'0 steps'``. ``plural``: an irregular plural (default
    ``singular + "s"``); ``shown``: the count as written, e.g. ``format_count(calls)`` (default ``str(count)``).

    >>> [format_counted(n, "child", "children") for n in (1, 3)], format_counted(2, "batch", "batches")
    (['1 child', '3 children'], '2 batches')
    """
    noun = singular if count == 1 else (plural if plural is not None else singular + "s")
    return f"{count if shown is None else shown} {noun}"


def format_count(value: float | None) -> str:
    """Counts with k/M/G/T: ``format_count(11_689_512) == '11.7M'``; a mean count below 1000 keeps three
    digits: ``format_count(4 / 3) == '1.33'``."""
    if value is None:
        return MISSING
    if abs(value) < 1000 and value != int(value):
        return _three(value)
    return _scaled(float(value), 1000.0, ("", "k", "M", "G", "T", "P", "E"), "")


def format_flops(value: float | None, suffix: str = "FLOPs") -> str:
    """FLOPs (or FLOP/s with ``suffix='FLOP/s'``): ``format_flops(3.6e9) == '3.6 GFLOPs'``."""
    if value is None:
        return MISSING
    text = _scaled(float(value), 1000.0, (" ", " k", " M", " G", " T", " P", " E", " Z"), suffix)
    return text


def format_bytes(value: float | None) -> str:
    """Bytes in binary units: ``format_bytes(46_827_520) == '44.7 MiB'``."""
    if value is None:
        return MISSING
    return _scaled(float(value), 1024.0, (" ", " Ki", " Mi", " Gi", " Ti", " Pi", " Ei"), "B")


def format_signed_bytes(value: float | None) -> str:
    """A difference of bytes with its sign: ``format_signed_bytes(-3 * 2**20) == '-3 MiB'``."""
    if value is None:
        return MISSING
    return ("-" if value < 0 else "+") + format_bytes(abs(value))


def format_percent(part: float | None, whole: float | None) -> str:
    """``part`` as a percentage of ``whole``, or MISSING where either is unknown or the whole is 0."""
    if part is None or not whole:
        return MISSING
    return f"{100.0 * part / whole:.1f}%"


def format_change(diff: float | None, base: float | None) -> str:
    """A signed relative change: ``format_change(5, 20) == '+25.0%'``; MISSING where ``base`` is unknown or 0."""
    if diff is None or not base:
        return MISSING
    return f"{100.0 * diff / base:+.1f}%"


def format_ratio(ratio: float | None) -> str:
    """A ratio ``b / a`` as a multiplier: ``format_ratio(0.5) == '0.5x'``."""
    if ratio is None:
        return MISSING
    return f"{_three(ratio)}x"


def format_plain(value: object) -> str:
    """A value without units, at full precision (for machine-readable tables): ints as ints, floats by repr."""
    if value is None:
        return ""
    if isinstance(value, float):
        return repr(value)
    return str(value)


def format_value(unit: str, value: object) -> str:
    """A value in a catalogue unit (``record.fields.UNITS``): ``format_value('bytes', 2048) == '2 KiB'``; None, and
    NaN (pandas' missing value, in rows taken back from a DataFrame), as missing."""
    if value is None or (isinstance(value, float) and value != value):
        return MISSING
    if unit == "shapes":
        return format_shapes(value)  # type: ignore[arg-type]
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return str(value)
    if unit == "ms":
        return format_ms(value)
    if unit == "bytes":
        return format_bytes(value)
    if unit == "flops":
        return format_flops(value)
    if unit == "flop/s":
        return format_flops(value, "FLOP/s")
    if unit == "macs":
        return format_flops(value, "MACs")
    if unit == "percent":
        return f"{value:.1f}%"
    if unit == "byte/s":
        return format_bytes(value) + "/s"
    if unit == "flop/byte":
        return f"{value:.3g} FLOP/B"
    if unit == "ratio":
        return f"{value:.2g}"
    return format_count(value)


def format_field(field: str, value: object) -> str:
    """A row value in the unit the catalogue declares for ``field``: ``format_field('param_bytes', 2048) ==
    '2 KiB'``. A field the catalogue does not know (a loaded file's, from a meter not imported here) prints as a
    count, text as is."""
    declared = FIELDS.get(field)
    return format_value("count" if declared is None else declared.unit, value)


def format_signed_field(field: str, value: object) -> str:
    """A difference in ``field``'s unit with its sign either way: ``format_signed_field('total_ms', 0.376) ==
    '+376 µs'``, ``format_signed_field('total_ms', -1.71) == '-1.71 ms'``."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value != value:
        return format_field(field, value)
    return ("-" if value < 0 else "+") + format_field(field, abs(value))


# Words of field names that are acronyms or units, written as a paper writes them (``Forward FLOPs`` is the
# catalogue's label; a header keeps the field's word order: ``FLOPs forward``).
_LABEL_WORDS = {"flops": "FLOPs", "macs": "MACs", "cuda": "CUDA"}


def field_label(field: str) -> str:
    """A header for a field whose unit is shown in the values: ``field_label('self_forward_ms') == 'Self forward'``,
    ``field_label('forward_ms_p95') == 'Forward p95'`` (a statistic of a time), ``field_label('flops_forward') ==
    'FLOPs forward'``, ``field_label('flops_per_s') == 'FLOP/s'``."""
    field = field.replace("_ms_", "_").replace("flops_per_s", "flop/s")
    for suffix in ("_ms", "_percent"):
        if field.endswith(suffix):
            field = field[: -len(suffix)] + (" %" if suffix == "_percent" else "")
    words = [_LABEL_WORDS.get(word, word) for word in field.replace("_", " ").split()]
    text = " ".join(words).replace("flop/s", "FLOP/s")
    return text[:1].upper() + text[1:]


def format_shapes(shapes: list[list[int]] | None, limit: int = 3) -> str:
    """Tensor shapes, the first ``limit`` of them: ``format_shapes([[4, 10], []]) == '[4, 10], []'``; a call with
    no tensor is ``'()'``; more than ``limit`` end with ``'… +N'``."""
    if shapes is None:
        return MISSING
    if not shapes:
        return "()"
    # (a nested tensor's ragged dimension is None: "?")
    shown = ", ".join("[" + ", ".join("?" if size is None else str(size) for size in shape) + "]"
                      for shape in shapes[:limit])
    return shown + (f", … +{len(shapes) - limit}" if len(shapes) > limit else "")
