"""Totals under the annotated summary: model size, tied parameters, activation and saved memory, largest modules,
FSDP communication.

Reads whatever fields the records carry; a line whose meter did not run is left out.
"""
from __future__ import annotations

from typing import Any

from ..record.records import ModuleRecord
from .units import format_bytes, format_count, format_ms

__all__ = ["summary_footer", "largest", "tied_groups", "allocated_where"]


def _get(record: ModuleRecord, field: str) -> Any:
    return getattr(record, field, None)


def largest(root: ModuleRecord, field: str, top: int = 3) -> list[ModuleRecord]:
    """The ``top`` records below the root with the highest non-zero ``field``, highest first."""
    found = [record for record in root.descendants if (_get(record, field) or 0) > 0]
    return sorted(found, key=lambda record: _get(record, field), reverse=True)[:top]


def tied_groups(root: ModuleRecord) -> list[list[str]]:
    """Each tensor registered under several qualified names (tied or shared parameters), as a sorted name list."""
    groups: dict[tuple[str, ...], None] = {}
    for record in (root, *root.descendants):
        prefix = f"{record.name}." if record.name else ""
        for param_name, others in (_get(record, "shared_with") or {}).items():
            groups.setdefault(tuple(sorted({prefix + param_name, *others})))
    return [list(group) for group in groups]


def _params_line(root: ModuleRecord) -> str | None:
    params, trainable, param_bytes, buffer_bytes = (
        _get(root, field) for field in ("params", "trainable_params", "param_bytes", "buffer_bytes")
    )
    if params is None or trainable is None or param_bytes is None or buffer_bytes is None:
        return None  # the params meter did not run (or a loaded file lacks its fields)
    line = (
        f"Model size: {format_bytes(param_bytes + buffer_bytes)} = {format_bytes(param_bytes)} of parameters "
        f"({format_count(params)}, {format_count(params - trainable)} frozen) + {format_bytes(buffer_bytes)} of buffers"
    )
    groups = tied_groups(root)
    if groups:
        shown = "; ".join(" = ".join(group) for group in groups[:3])
        more = f"; {len(groups) - 3} more" if len(groups) > 3 else ""
        line += f"; shared, counted once: {shown}{more}"
    return line + "."


def _memory_line(root: ModuleRecord, top: int) -> str | None:
    saved = _get(root, "saved_bytes")
    activations = _get(root, "activation_bytes")
    if saved is None and activations is None:
        return None
    line = f"Activations: {format_bytes(activations)} returned by modules, {format_bytes(saved)} saved for backward"
    heaviest = largest(root, "self_saved_bytes", top)
    if heaviest:
        line += "; most saved: " + ", ".join(
            f"'{record.name}' ({record.type}) {format_bytes(record.self_saved_bytes)}"  # type: ignore[attr-defined]
            for record in heaviest
        )
    return line + "."


def allocated_where(meta: dict[str, Any] | None) -> str:
    """What the per-call peaks above the start were read from, by the profile's ``meta``: the CUDA allocator where
    a call ran on a CUDA clock or the memory meter's step was on CUDA, the CPU's live tensor bytes where its step
    was on the CPU (only ``live_memory`` reads the CPU); both named where the meta does not say (no meta, or a
    profile whose step peak was not read)."""
    meta = meta or {}
    steps = [meta[name].get("device") for name in ("memory", "live_memory") if isinstance(meta.get(name), dict)]
    cuda = any(str(kind).startswith("cuda") for kind in meta.get("clock") or ())
    cuda = cuda or any(str(device).startswith("cuda") for device in steps)
    cpu = "cpu" in steps
    if cuda and cpu:
        return "CUDA and CPU, live_memory"
    if cuda or cpu:
        return "CUDA" if cuda else "CPU, live_memory"
    return "CUDA; CPU with live_memory"


def _cuda_line(root: ModuleRecord, meta: dict[str, Any] | None) -> str | None:
    forward = _get(root, "cuda_forward_peak_bytes")
    backward = _get(root, "cuda_backward_peak_bytes")
    if forward is None and backward is None:
        return None
    return (f"Allocated above the start ({allocated_where(meta)}): forward peak {format_bytes(forward)}, "
            f"backward peak {format_bytes(backward)}.")


def _comm_line(root: ModuleRecord, top: int) -> str | None:
    units = [record for record in (root, *root.descendants) if _get(record, "comm_forward_ms") is not None]
    if not units:
        return None

    def total(field: str) -> float:
        return sum(_get(record, field) or 0.0 for record in units)

    line = (
        f"FSDP communication, in no module's time: forward {format_ms(total('comm_forward_ms'))}, backward "
        f"{format_ms(total('comm_backward_ms'))}; all-gathered {format_bytes(total('all_gather_bytes'))}, "
        f"reduce-scattered {format_bytes(total('reduce_scatter_bytes'))}"
    )
    busiest = sorted(units, key=lambda r: -((_get(r, "comm_forward_ms") or 0) + (_get(r, "comm_backward_ms") or 0)))
    line += "; most: " + ", ".join(
        f"{repr(record.name) if record.name else 'the model'} "
        f"{format_ms((_get(record, 'comm_forward_ms') or 0) + (_get(record, 'comm_backward_ms') or 0))}"
        for record in busiest[:top]
    )
    return line + "."


def summary_footer(root: ModuleRecord, top: int = 3, meta: dict[str, Any] | None = None) -> str:
    """Lines of totals for the fields present on ``root`` ("" when none): model size and shared parameters,
    activation and saved bytes with the ``top`` modules by self saved bytes, the peaks above the start (named
    by the device ``meta``, the profile's, says they were read on), FSDP communication (summed over units, with
    the ``top`` units by communication time)."""
    lines = [_params_line(root), _memory_line(root, top), _cuda_line(root, meta), _comm_line(root, top)]
    return "\n".join(line for line in lines if line)
