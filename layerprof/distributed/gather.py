"""Profiles of a torch.distributed job: every rank's records gathered on one rank and compared.

Each rank profiles its own model as usual (``LayerProf(ddp_model)``); ``prof.gather()`` then sends the rank's
rows (``Profile.to_dict()`` without the per-call timings) and meta to ``dst`` with ``gather_object`` and returns
there a ``GatheredProfile``: per module the min, median and max over ranks, the slowest rank, the stragglers.
Every rank of the group must call it (it is a collective); ranks other than ``dst`` get None. A rank whose block
raised still takes part (``prof.gather()`` sends why it has no profile, then raises there): ``dst`` lists it in
``failed_ranks`` instead of waiting for it.

Without an initialized process group (a plain ``python train.py``), ``gather()`` returns a one-rank view of the
local profile, so one script runs both under torchrun and alone. ``gathered_from_saved`` makes the same view from
profiles saved per rank (``layerprof.gather_saved``), each knowing its rank from ``meta["distributed"]``.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Any, Mapping, Sequence

from .._check import check_int, check_real
from .crossrank import PASSES, Spread, cross_rank_stats, spread, straggler_floor, stragglers
from ..record.summed import TreeValues
from ..render.table import Table
from ..render.units import format_counted
from .comm import CommMeter, register_timed_comm_hook
from .fsdp import FsdpCommMeter
from .table import rank_table, ranks_compared

if TYPE_CHECKING:
    from ..profile import Profile

__all__ = ["GatheredProfile", "gather_profile", "gather_failure", "gathered_from_saved", "rank_payload",
           "register_timed_comm_hook", "CommMeter"]

COMM_FIELDS = ("comm_ms", "exposed_ms", "launch_ms")


def rank_payload(profile: Profile, rank: int = 0, world_size: int = 1) -> dict[str, Any]:
    """What one rank sends: plain dicts and numbers (no anytree objects, no per-call timings)."""
    rows = {}
    records = profile.records
    values = None
    for name, row in profile.to_dict().items():
        row = dict(row)
        row.pop("call_times", None)
        record = records.get(name)
        if record is not None and not record.calls and record.children:
            # A container never called itself (a ModuleList): its children's totals, as the summary shows them.
            values = values or TreeValues(profile.tree)
            if values.summed(record):
                for field in ("forward_ms", "backward_ms"):
                    if row.get(field) is None:
                        row[field] = values.stored(record, field)
        rows[name] = row
    return {"rank": rank, "world_size": world_size, "rows": rows, "meta": dict(profile.meta)}


class GatheredProfile:
    """Every rank's profile and their comparison, on the rank that gathered them.

    Attributes:
        ranks: the ranks compared, in order. ``per_rank``: ``{rank: payload}`` with each rank's ``rows`` (by
            recorded name, as on that rank) and ``meta``. ``failed_ranks``: ``{rank: why}`` for the ranks of the
            job that have no profile to compare. ``world_size``: the ranks of the job (of the group gathered),
            compared or not.
        step: the whole step (outermost record) across ranks, a ``ModuleSpread``.
        modules: ``{shown name: ModuleSpread}``, names without DDP/FSDP wrapper prefixes (see
            ``layerprof.crossrank``).
        communication: ``{"comm_ms"|"exposed_ms"|"launch_ms": Spread}`` over ranks, from the ``ddp_comm``
            meter (empty when it did not run).
        fsdp_communication: ``{"comm_forward_ms"|"comm_backward_ms": Spread}`` over ranks, FSDP2's communication
            per step summed over units, from the ``fsdp_comm`` meter (empty when it did not run).
        margin, min_ms: the straggler rule: slower than the median by more than ``margin`` (a fraction) and
            ``min_ms`` milliseconds (by default 1 % of the median step time; the value used is kept here).
    """

    def __init__(self, payloads: Sequence[Mapping[str, Any]], margin: float = 0.2, min_ms: float | None = None) -> None:
        # The job's size (the gathering group's), failed ranks included: a view of 1 rank of 2 must not read as a
        # one-rank job. Not the highest rank + 1: ranks are global, and a subgroup's need not start at 0.
        self.world_size = max([len(payloads), *(int(p.get("world_size") or 0) for p in payloads)])
        # Ranks whose profiling failed sent why instead of a profile (``gather_failure``): listed, not compared.
        self.failed_ranks: dict[int, str] = {int(p["rank"]): str(p[_FAILED]) for p in payloads if _FAILED in p}
        # And ranks whose profile recorded no step (every step warm-up or outside the schedule): nothing to
        # compare, and left in they read as ranks that agree.
        for p in payloads:
            if _FAILED not in p and (p.get("meta") or {}).get("steps", 1) == 0:
                self.failed_ranks[int(p["rank"])] = ("it recorded no step: every step was warm-up or outside the "
                                                     "schedule")
        payloads = [p for p in payloads if _FAILED not in p and int(p["rank"]) not in self.failed_ranks]
        self.failed_ranks = dict(sorted(self.failed_ranks.items()))
        if not payloads:
            why = "; ".join(f"rank {rank}: {reason}" for rank, reason in self.failed_ranks.items())
            raise RuntimeError(f"no rank has a profile to compare ({why or 'no rank was gathered'}): profile steps "
                               "that the profile records on at least one rank, then gather again")
        self.per_rank: dict[int, dict[str, Any]] = {int(p["rank"]): dict(p) for p in payloads}
        self.ranks = sorted(self.per_rank)
        self.margin = margin
        rows_by_rank = {rank: payload["rows"] for rank, payload in self.per_rank.items()}
        self.step, self.modules = cross_rank_stats(rows_by_rank, margin, min_ms)
        self.min_ms = straggler_floor(self.step, min_ms)
        self.communication = self._meta_spreads(CommMeter.name, COMM_FIELDS)
        self.fsdp_communication = self._meta_spreads(FsdpCommMeter.name, ("comm_forward_ms", "comm_backward_ms"))

    def _meta_spreads(self, meter: str, names: Sequence[str]) -> dict[str, Spread]:
        """``{name: Spread}`` over ranks of the figures a meter left in each rank's meta, where any rank has one."""
        found = {}
        for name in names:
            values = {rank: (p["meta"].get(meter) or {}).get(name) for rank, p in self.per_rank.items()}
            measured = spread(values)
            if measured is not None:
                found[name] = measured
        return found

    @property
    def straggler_ranks(self) -> list[int]:
        """Ranks slower than the median on the whole step by more than the margin."""
        return list(self.step.stragglers)

    def stragglers(self, field: str = "total_ms") -> dict[str, list[int]]:
        """``{shown name: straggler ranks}`` for the modules that have any, judged on ``field``
        (``"total_ms"``, ``"forward_ms"`` or ``"backward_ms"``)."""
        found = {}
        for name, module in self.modules.items():
            ranks = module.stragglers if field == "total_ms" else stragglers(getattr(module, field), self.margin, self.min_ms)
            if ranks:
                found[name] = ranks
        return found

    def communication_stragglers(self, field: str = "exposed_ms") -> list[int]:
        """Ranks that spent more than the margin over the median on DDP communication (default: exposed)."""
        return stragglers(self.communication.get(field), self.margin, self.min_ms)

    def to_dict(self) -> dict[str, dict[str, Any]]:
        """``{shown name: row}`` (see ``ModuleSpread.to_dict``), the canonical rows of the cross-rank view."""
        return {name: module.to_dict() for name, module in self.modules.items()}

    def to_table(self) -> Any:
        """The canonical rows as a ``layerprof.Table``, for its exports (``to_csv``, ``to_markdown``,
        ``to_dataframe``...), showing each pass's min, median and max over ranks and its slowest rank (the
        fields are detail fields: a table of records shows them only when named)."""
        rows = list(self.to_dict().values())
        shown = ["name", "type", *(f"{p}_{key}" for p in PASSES
                                   for key in ("rank_min", "rank_median", "rank_max", "slowest_rank"))]
        return Table(rows, columns=[column for column in shown if any(column in row for row in rows)] or None)

    def table(self, depth: int | None = None) -> str:
        """A text table: per module, forward/backward/total min, median and max over ranks, slowest rank,
        stragglers; the step and DDP or FSDP2 communication above it."""
        return rank_table(self, depth=depth)

    def __str__(self) -> str:
        return self.table()

    def __repr__(self) -> str:
        return (f"<GatheredProfile {self.step.type}: {ranks_compared(self)}, "
                f"{format_counted(len(self.modules), 'module')}, stragglers {self.straggler_ranks}>")


_FAILED = "failed"  # the key of a failed rank's payload: why it has no profile


def _check_share(name: str, value: Any, share: bool = True) -> None:
    """A TypeError for a ``value`` that is no number, a ValueError for a negative one or NaN (checked on every
    rank before the collective, so that none raises inside it)."""
    what = "a fraction such as 0.2" if share else "milliseconds such as 1.0, or None"
    check_real(name, value, what, lambda number: number >= 0, refused=f"{what} (at least 0)")


def _initialized() -> bool:
    import torch.distributed as dist

    return dist.is_available() and dist.is_initialized()


def _gather(payload: dict[str, Any], dst: int, group: Any) -> list[Any] | None:
    """Every rank's ``payload`` on ``dst`` (None elsewhere): torch's ``gather_object``."""
    import torch.distributed as dist

    received: list[Any] | None = [None] * dist.get_world_size(group) if dist.get_rank() == dst else None
    dist.gather_object(payload, received, dst=dst, group=group)
    return received


def gather_failure(why: str, dst: int = 0, group: Any = None) -> None:
    """This rank's part in ``gather_profile`` where its profiling failed (``why``): it sends that, so that the
    ranks whose profiles it would have joined do not wait for it until the group's timeout; ``dst`` then lists the
    rank in ``failed_ranks``. The caller raises after it. Nothing to do without an initialized process group."""
    if not _initialized():
        return
    import torch.distributed as dist

    _gather({"rank": dist.get_rank(), "world_size": dist.get_world_size(group), _FAILED: why}, dst, group)


def gather_profile(profile: Profile, dst: int = 0, group: Any = None, margin: float = 0.2,
                   min_ms: float | None = None) -> GatheredProfile | None:
    """Collect every rank's profile on rank ``dst``; a collective: every rank of ``group`` must call it.

    ``dst`` is a global rank, as in ``torch.distributed.gather_object``. ``margin`` and ``min_ms`` set the straggler
    rule (see ``GatheredProfile``). Returns the ``GatheredProfile`` on ``dst`` and None elsewhere; without an initialized process group, a
    one-rank view of ``profile``. On NCCL, ``gather_object`` needs ``torch.cuda.set_device(local_rank)`` first.
    """
    dst = check_int("dst", dst)
    _check_share("margin", margin)
    if min_ms is not None:
        _check_share("min_ms", min_ms, share=False)
    if not _initialized():
        return GatheredProfile([rank_payload(profile)], margin=margin, min_ms=min_ms)
    import torch.distributed as dist

    # (the rank is global, as gather_object's dst is; the size is the group's, whose ranks are gathered)
    received = _gather(rank_payload(profile, dist.get_rank(), dist.get_world_size(group)), dst, group)
    if received is None:
        return None
    return GatheredProfile(received, margin=margin, min_ms=min_ms)


def _saved_rank(given: int | None, where: str, meta: Mapping[str, Any], alone: bool) -> tuple[int, int | None]:
    """The rank and world size of one saved profile: its ``meta["distributed"]`` (made under torch.distributed),
    the rank it was given under, or, for a lone profile saved outside any group, rank 0 of 1."""
    saved = meta.get("distributed") if isinstance(meta.get("distributed"), Mapping) else {}
    rank, world_size = saved.get("rank"), saved.get("world_size")
    if rank is None:
        rank = (meta.get("lightning") or {}).get("rank") if isinstance(meta.get("lightning"), Mapping) else None
    if given is not None:
        given = check_int(f"the rank of {where}", given)
        if rank is not None and rank != given:
            raise ValueError(f"{where} was given as rank {given}, but it was saved by rank {rank} "
                             f"(its meta['distributed']): give each file under the rank that saved it")
        rank = given
    if rank is None:
        if not alone:
            raise ValueError(f"cannot tell which rank saved {where}: its meta has no 'distributed' entry (saved "
                             "outside torch.distributed, or by an earlier layerprof); give the files as "
                             "{rank: path}, e.g. gather_saved({0: 'rank0.json', 1: 'rank1.json'}), or from the shell "
                             "layerprof gather 0=rank0.json 1=rank1.json")
        rank, world_size = 0, 1
    if not isinstance(rank, int) or isinstance(rank, bool) or rank < 0:
        raise ValueError(f"{where}: meta['distributed']['rank'] must be a rank (an integer >= 0), got {rank!r}; "
                         "the file is damaged: give the files as {rank: path}")
    return rank, world_size


def gathered_from_saved(profiles: Sequence[tuple[int | None, str, Profile]], margin: float = 0.2,
                        min_ms: float | None = None) -> GatheredProfile:
    """The cross-rank view of per-rank profiles, as ``gather_profile`` makes it on ``dst``, from ``(rank or None,
    what to call it in errors, profile)`` triples. A rank of the job (by the world size the profiles saved) with
    no profile among them is listed in ``failed_ranks``; a rank given twice, or profiles of jobs of different
    sizes, is a ValueError."""
    _check_share("margin", margin)
    if min_ms is not None:
        _check_share("min_ms", min_ms, share=False)
    if not profiles:
        raise ValueError("gather_saved needs at least one saved profile: give the per-rank files (a list of paths, "
                         "or {rank: path})")
    payloads: dict[int, dict[str, Any]] = {}
    where_by_rank: dict[int, str] = {}
    sizes: dict[int, str] = {}
    for given, where, profile in profiles:
        rank, world_size = _saved_rank(given, where, profile.meta, alone=len(profiles) == 1)
        if rank in payloads:
            raise ValueError(f"rank {rank} is given twice ({where_by_rank[rank]} and {where}): give one saved "
                             "profile per rank")
        if world_size is not None:
            sizes.setdefault(int(world_size), where)
        payloads[rank], where_by_rank[rank] = rank_payload(profile, rank, world_size or 0), where
    if len(sizes) > 1:
        shown = ", ".join(f"{size} ({where})" for size, where in sizes.items())
        raise ValueError(f"these profiles come from jobs of different sizes: world sizes {shown}; give the "
                         "files of one run")
    if sizes and max(payloads) >= max(sizes):  # (a rank given to a file without one, past the job's size)
        raise ValueError(f"rank {max(payloads)} ({where_by_rank[max(payloads)]}) is outside a job of {max(sizes)} "
                         "ranks: give each file under the rank that saved it")
    world_size = max([*sizes, max(payloads) + 1])
    missing = [{"rank": rank, "world_size": world_size, _FAILED: "no saved profile of it was given"}
               for rank in range(world_size) if rank not in payloads]
    for payload in payloads.values():
        payload["world_size"] = world_size
    return GatheredProfile([*payloads.values(), *missing], margin=margin, min_ms=min_ms)
