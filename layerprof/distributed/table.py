"""Text table of a gathered (cross-rank) profile: min / median / max over ranks, slowest rank, stragglers."""
from __future__ import annotations

from typing import TYPE_CHECKING

from ..render.export import to_text
from ..render.summary import partial_note
from ..render.units import MISSING, format_counted, format_ms

if TYPE_CHECKING:
    from .crossrank import ModuleSpread, Spread
    from .gather import GatheredProfile

__all__ = ["rank_table", "ranks_compared"]


def _three(values: Spread | None) -> str:
    if values is None:
        return MISSING
    return f"{format_ms(values.min)} / {format_ms(values.median)} / {format_ms(values.max)}"


def _ranks(ranks: list[int]) -> str:
    return ", ".join(str(rank) for rank in ranks)


def _measured(module: ModuleSpread) -> list[int]:
    """The ranks where the module ran (a rank whose model holds it may never call it: an unused branch)."""
    return sorted(module.total_ms.values) if module.total_ms is not None else []


def _row(module: ModuleSpread) -> list[str]:
    shown = ("  " * module.depth) + (module.name.rsplit(".", 1)[-1] if module.name else "(model)")
    slowest = module.total_ms.slowest_rank if len(_measured(module)) > 1 else None
    return [
        shown,
        module.type,
        _three(module.forward_ms),
        _three(module.backward_ms),
        _three(module.total_ms),
        MISSING if slowest is None else str(slowest),
        _ranks(module.stragglers),
    ]


def _partial_ranks(gathered: GatheredProfile) -> list[str]:
    """A line per rank whose run ended early: its means are over the steps it completed, not the others' steps."""
    notes = ((rank, partial_note(payload.get("meta") or {})) for rank, payload in gathered.per_rank.items())
    return [f"Rank {rank}: {note}" for rank, note in sorted(notes) if note is not None]


def _run_on_some_ranks(gathered: GatheredProfile, shown: int = 4) -> list[str]:
    """A line naming the modules that ran on some of the compared ranks only, and where: their spreads are over
    those ranks, not a comparison of every rank."""
    some = [(name, measured) for name, module in gathered.modules.items()
            if 0 < len(measured := _measured(module)) < len(gathered.ranks)]
    if not some:
        return []
    named = "; ".join(f"{name or '(model)'} on rank{'s' if len(ranks) > 1 else ''} {_ranks(ranks)}"
                      for name, ranks in some[:shown])
    more = f" and {len(some) - shown} more" if len(some) > shown else ""
    return [f"Run on some ranks only (spread over those ranks): {named}{more}"]


def ranks_compared(gathered: GatheredProfile) -> str:
    """How many ranks the view compares: ``"2 ranks"``, or ``"1 of 2 ranks"`` where some of the job's have no
    profile (a failed rank, a file not given)."""
    whole = format_counted(gathered.world_size, "rank")
    return whole if len(gathered.ranks) == gathered.world_size else f"{len(gathered.ranks)} of {whole}"


def rank_table(gathered: GatheredProfile, depth: int | None = None) -> str:
    """The cross-rank view as text; ``depth`` limits the module rows (the root has depth 0)."""
    step = gathered.step
    lines = [
        f"Across {ranks_compared(gathered)}, per step: min / median / max over ranks. "
        f"Straggler: total above the median by more than {gathered.margin:.0%} and {format_ms(gathered.min_ms)}.",
        f"Step ({step.type}): total {_three(step.total_ms)}"
        + (f", slowest rank {step.total_ms.slowest_rank}" if step.total_ms is not None and len(gathered.ranks) > 1
           else "")
        + f"; stragglers: {_ranks(step.stragglers) or 'none'}",
    ]
    lines.extend(_partial_ranks(gathered))
    lines.extend(f"Rank {rank}: no profile ({why})" for rank, why in sorted(gathered.failed_ranks.items()))
    lines.extend(_run_on_some_ranks(gathered))
    comm = gathered.communication
    if comm:
        parts = [f"{label} {_three(comm.get(field))}" for field, label in
                 (("comm_ms", "in flight (summed over buckets)"), ("exposed_ms", "exposed after the last backward node"),
                  ("launch_ms", "launching (inside module backward)"))]
        lines.append("DDP gradient all-reduce: " + "; ".join(parts))
    fsdp = gathered.fsdp_communication
    if fsdp:
        lines.append(f"FSDP2 communication (in no module's time): forward {_three(fsdp.get('comm_forward_ms'))}; "
                     f"backward {_three(fsdp.get('comm_backward_ms'))}")
    header = ["module", "type", "forward min / median / max", "backward min / median / max",
              "total min / median / max", "slowest", "stragglers"]
    rows = [dict(zip(header, _row(m))) for m in gathered.modules.values() if depth is None or m.depth <= depth]
    lines.append(to_text(rows, header, raw=True).rstrip("\n"))
    return "\n".join(lines)
