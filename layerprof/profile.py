"""Profile: the result of profiling, a tree of records plus where it was measured. Live or loaded alike.

Every way of reading a profile (summary, tables, exports, plots, comparisons) is a method here or takes one;
none of them needs the model or the profiler that made it. This module is the one place where records meet
their renderers: ``record/`` knows nothing of rendering, ``render/`` knows nothing of collecting or files.
Table methods share the filters of ``render.rows.select``: ``depth`` (exactly), ``max_depth``, ``type`` (class
name or names), ``name`` (glob on the qualified name), ``leaves`` and ``called``.
"""
from __future__ import annotations

import functools
import sys
import threading
from pathlib import Path
from typing import IO, Any, Callable, Iterable, Mapping, Sequence

import torch

from ._check import check_bool, check_path, check_text
from ._gc import gc_paused
from .distributed.gather import GatheredProfile, gather_failure, gather_profile, gathered_from_saved
from ._machine import environment_in, memory_in, other_machine
from ._warn import warn_user
from .metrics.memory import hidden_shown
from .metrics.peaks import check_peaks
from .metrics.peaks import peaks as measure_peaks
from .record import io
from .record.records import ModuleRecord, preorder, release_tree
from .record.roofs import attach_peaks, no_roofs_for
from .record.summed import TreeValues
from .record.untimed import untimed_in, untimed_note
from .plan.plan import CheckpointPlan, make_plan, saved_today
from .plan.profiled_as import profiled_as
from .render import export
from .render.compare import Comparison
from .render.html import html_table, notebook_style
from .render.plot import save_plot
from .record.fields import FIELDS, canonical, detail_fields
from .render.rows import FILTERS, derived_names, is_number, numeric_fields, select, top_records, value_of
from .metrics.roofline import ROOFLINE_FIELDS
from .render.summary import annotated_repr, partial_note
from .render.table import Table
from .render.report import report_html
from .render.speedscope import speedscope_json
from .render.trace import trace_json
from .integrations.tensorboard import write_tensorboard
from .render.tree import render_tree, timepool
from .render.units import format_counted, format_ms

__all__ = ["Profile", "load", "loads", "save", "as_profile", "compare", "gather_saved"]


# The dtypes whose roofs a plain matrix product measures (float8's FLOPs run in scaled products, which it does not).
_MATMUL_DTYPES = ("float32", "bfloat16", "float16", "float64")


# The roofline's columns that set a measured time beside the counts, blank on a profile without times.
_MEASURED_ROOFLINE = ("self_total_ms", "achieved_bandwidth", "efficiency", "lost_ms")


def _meta_peaks(meta: dict[str, Any]) -> dict[str, Any] | None:
    """``Profile.peaks`` of the profile whose meta is ``meta``: the roofs it holds, else measured now where this
    process runs on the machine that measured the profile (``other_machine``), else None."""
    found = meta.get("peaks")
    if found is None and untimed_in(meta) is not None:
        return None  # (a step on the meta device or fake tensors: the roofs are the machine's it is estimated for)
    if found is None:
        environment = environment_in(meta)
        device = environment.get("device") or "cpu"
        if device.startswith("cuda") and not torch.cuda.is_available():
            return None
        if other_machine(environment) is not None:
            return None
        # The roofs of the dtype the FLOPs ran in (the flops meter's count), else the one autocast computes in, the
        # parameters' or the input's.
        flops_meta = meta.get("flops")
        counted = flops_meta.get("dtype") if isinstance(flops_meta, dict) else None
        given = environment.get("input_dtype")
        dtype = ((counted if counted in _MATMUL_DTYPES else None) or environment.get("autocast_dtype")
                 or environment.get("dtype") or (given if given in _MATMUL_DTYPES else None))
        found = meta["peaks"] = dict(measure_peaks(device, dtype, threads=environment.get("threads")))
    return found


class _Probe:
    pass


def _attribute_references() -> int:
    """What ``sys.getrefcount`` reads, as ``Profile.__del__`` calls it, for an object only an instance's
    attribute holds (measured, not assumed: the count of the call's own references differs between versions)."""
    probe = _Probe()
    probe.held = {}
    return sys.getrefcount(probe.__dict__["held"])


_ATTRIBUTE_REFERENCES = _attribute_references()

# Held while a deferred profile makes its records (``Profile._made``); re-entrant: a build that reads a profile.
_MAKING = threading.RLock()

# How the warning of a plan made on another machine than its profile's begins (the CLI words it for the shell).
OTHER_MACHINE_WARNING = "checkpoint_plan: this profile was measured on another machine ("


class Profile:
    """Records of one profiled model: ``tree`` (anytree root), ``records`` by qualified name, ``meta``."""

    # Set by LayerProf on a profile it can plan checkpoints on: how to measure on this host the figures a plan takes
    # off its prices, by ``meta`` key (``hook_ms``; ``live_op_ms`` for a one-step live profile), measured when the
    # profile is first planned or saved, not as it is made: most profiles are never planned. A measure that returns
    # None (it failed) leaves its key out.
    measures: dict[str, Any] = {}

    def __init__(self, tree: ModuleRecord, meta: dict[str, Any] | None = None,
                 records: dict[str, ModuleRecord] | None = None) -> None:
        """``records`` (by qualified name, in tree order) saves walking the tree where the caller has them."""
        self.meta = dict(meta or {})
        self._hold(tree, records)

    @classmethod
    def deferred(cls, meta: dict[str, Any], build: Callable[[], tuple[ModuleRecord, dict[str, ModuleRecord]]],
                 meta_later: Callable[[], dict[str, Any]] | None = None) -> Profile:
        """A profile whose records ``build()`` makes (root, records by name in tree order) when they are first
        read: what a profiler captured when it stopped, turned into records only when someone looks. ``build``
        must hold only that capture (numbers and texts: no module, so a profile never read holds no model); so
        must ``meta_later``, whose entries join ``meta`` when it is first read."""
        profile = cls.__new__(cls)
        profile.meta = dict(meta)
        profile._build = build
        profile._meta_later = meta_later
        return profile

    # Set on a deferred profile until its records are made.
    _build: Callable[[], tuple[ModuleRecord, dict[str, ModuleRecord]]] | None = None
    # Set on a deferred profile until the entries of its meta made when first read are in it.
    _meta_later: Callable[[], dict[str, Any]] | None = None

    @property
    def meta(self) -> dict[str, Any]:
        """Where and how the profile was measured: environment, steps, clocks, the meters' totals."""
        if self._meta_later is not None:
            with _MAKING:  # one thread makes them, as the records
                later = self._meta_later
                if later is not None:
                    self._meta.update(later())
                    self._meta_later = None
        return self._meta

    @meta.setter
    def meta(self, meta: dict[str, Any]) -> None:
        self._meta, self._meta_later = meta, None

    def _hold(self, tree: ModuleRecord, records: dict[str, ModuleRecord] | None) -> None:
        self._tree = tree
        self._records: dict[str, ModuleRecord] = (
            dict(records) if records is not None else {record.name: record for record in preorder(tree)}
        )
        # The roofline fields read the peaks through the root; measured only when one of them is first read.
        # Through the meta, not the Profile: a root that held the Profile would make every profile a reference
        # cycle, freed only by a garbage collection instead of when the last reference goes.
        attach_peaks(tree, functools.partial(_meta_peaks, self.meta))

    def _made(self) -> None:
        if self._build is None:
            return
        # One build at a time: a second thread reading meanwhile waits for the first's records instead of making
        # a tree of its own (then one reader would hold a tree the profile no longer has).
        with _MAKING:
            build = self._build
            if build is not None:
                with gc_paused():
                    tree, records = build()
                self._hold(tree, records)
                self._build = None  # after: a build that raised raises again at the next read

    @property
    def tree(self) -> ModuleRecord:
        """The root record (the whole model); its descendants are the modules' records."""
        if self._build is not None:
            self._made()
        return self._tree

    @tree.setter
    def tree(self, tree: ModuleRecord) -> None:
        self._made()
        self._tree = tree

    @property
    def records(self) -> dict[str, ModuleRecord]:
        """Every record by qualified name, in ``named_modules()`` order."""
        if self._build is not None:
            self._made()
        return self._records

    @records.setter
    def records(self, records: dict[str, ModuleRecord]) -> None:
        self._made()
        self._records = records

    def __getstate__(self) -> dict[str, Any]:
        """Pickled (or deep-copied) with its records made: what a deferred profile would make from holds weak
        references to the model's modules, which do not pickle."""
        self._made()
        state = self.__dict__.copy()
        state["meta"] = self.meta  # as pickled before the meta had entries made when first read
        del state["_meta"]
        state.pop("_meta_later", None)
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        # A profile pickled by layerprof before records were made on first read held them as ``tree``/``records``.
        for old in ("tree", "records", "meta"):
            if old in state:
                state["_" + old] = state.pop(old)
        self.__dict__.update(state)

    def __del__(self) -> None:
        # A record tree is a reference cycle (parents and children): freed now if this was its last holder. The
        # records dict held elsewhere (``records = prof.records``, a view of it) keeps every record in use: then
        # the tree stays whole, as when a record itself is held (``release_tree`` checks those).
        own = self.__dict__
        if "_tree" in own and "_records" in own and sys.getrefcount(own["_records"]) == _ATTRIBUTE_REFERENCES:
            release_tree(own["_tree"], own["_records"])

    def to_dict(self) -> dict[str, dict[str, Any]]:
        """``{qualified name: row}`` in ``named_modules()`` order; the root's name is ``""``."""
        return {name: record.to_dict() for name, record in self.records.items()}

    # -- text views ------------------------------------------------------------------------------------------
    def layerwise_summary(self, columns: Iterable[str] | None = None, depth: int | None = None,
                          footer: bool = False) -> str:
        """The model's repr, each module annotated with its costs and share of the step; ``footer=True`` adds
        the totals (model size, activation and saved memory, the largest modules). A partial profile (a run
        that ended early) says so in its first line. A column the run left out (its meter did not run, backward
        of a forward-only run) is a ValueError that says how to record it."""
        footer = check_bool("footer", footer)
        text = annotated_repr(self.tree, columns=columns, depth=depth, footer=footer, meta=self.meta)
        note = partial_note(self.meta)
        return text if note is None else f"{note}.\n{text}"

    def layerwise_timepool(self) -> dict[str, Any]:
        """The nested-dict form: ``{name: {forward_ms, backward_ms, depth, calls, children}}``."""
        return timepool(self.tree)

    def render_tree(self, maxdepth: int | None = None) -> str:
        """An anytree ``RenderTree`` view for terminals."""
        return render_tree(self.tree, maxdepth=maxdepth)

    # -- queries ---------------------------------------------------------------------------------------------
    def select(self, **filters: Any) -> list[ModuleRecord]:
        """The records that pass the filters, in ``named_modules()`` order."""
        unknown = [key for key in filters if key not in FILTERS]
        if unknown:
            raise TypeError(f"unknown filter {unknown[0]!r}; filters are: {', '.join(FILTERS)}")
        return select(self.records.values(), **filters)

    def rows(self, **filters: Any) -> Table:
        """The canonical rows of the selected modules, as a printable Table.

        >>> import torch, layerprof
        >>> net = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 1))
        >>> with layerprof.LayerProf(net) as prof:
        ...     net(torch.randn(2, 4)).sum().backward()
        >>> [row["name"] for row in prof.rows(type="Linear")]
        ['0', '2']
        """
        return Table.of_records(self.select(**filters), self.tree)

    def aggregate(self, by: str = "type", **filters: Any) -> Table:
        """One row per module type (``by="type"``): module count, calls, numeric fields summed (peaks: max).
        Use ``leaves=True`` for a breakdown whose times add up without counting containers."""
        if by != "type":
            raise ValueError(f"aggregate groups by 'type' only, got by={by!r}")
        return Table.by_type(self.select(**filters), root=self.tree)

    def top(self, k: int = 10, by: str = "total_ms", depth: int | None = None, **filters: Any) -> Table:
        """The ``k`` modules with the largest ``by`` (any numeric field: times, FLOPs, params, bytes; or
        ``total_ms``), optionally at one ``depth``. Without ``depth`` the root (the whole model) is left out.

        >>> import torch, layerprof
        >>> net = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 1))
        >>> with layerprof.LayerProf(net) as prof:
        ...     net(torch.randn(2, 4)).sum().backward()
        >>> len(prof.top(2, by="forward_ms", depth=1))
        2
        """
        if not isinstance(by, str):
            raise TypeError(f"by must be the name of one numeric field, such as by='forward_ms', got {by!r}")
        by = canonical(by) or by
        records = self.records.values()
        known = set(numeric_fields(self.to_dict().values()))
        # A derived field (only ``by`` is computed: a roofline field would measure the machine's peaks) or a detail
        # one (``forward_ms_p95``: left out of the tables unless asked for, and asked for here).
        if (by not in known and (by in derived_names() or by in detail_fields())
                and any(is_number(value_of(record, by)) for record in records)):
            known.add(by)
        if by not in known:
            untimed = untimed_note(self.meta)
            if untimed is not None and by in FIELDS and FIELDS[by].unit == "ms" and by != "attainable_ms":
                raise ValueError(f"cannot rank by {by!r}: {untimed}. Rank by one of them: top(by='flops')")
            if by in ROOFLINE_FIELDS and self.peaks() is None and any(
                    is_number(getattr(record, "flops_forward", None)) for record in records):
                # FLOPs counted, but no roofs to hold them against (a file from another machine, saved without them).
                raise ValueError(f"cannot rank by {by!r}: {no_roofs_for(self.meta)}")
            known |= {name for name in derived_names() if name not in ROOFLINE_FIELDS
                      and any(is_number(value_of(record, name)) for record in records)}
            raise ValueError(f"cannot rank by {by!r}; numeric fields of this profile: {', '.join(sorted(known))}")
        candidates = self.select(depth=depth, **filters)
        if depth is None:
            candidates = [record for record in candidates if record is not self.tree]
        chosen = top_records(candidates, k, by)
        table = Table.of_records(chosen, self.tree)
        # Ranked by a roofline field: the why (bound, efficiency) beside it.
        beside = list(dict.fromkeys([by, "bound", "efficiency", "attainable_ms"])) if by in ROOFLINE_FIELDS else [by]
        rows = [{**row, **{name: value_of(record, name, row) for name in beside}}
                for record, row in zip(chosen, table.rows)]
        lead = ["name", "type", "calls", *(c for c in beside if c not in ("name", "type", "calls"))]
        rest = [c for c in export.display_columns(rows) if c not in lead]
        page_lead = list(dict.fromkeys(["name", "type", *beside]))
        return Table(rows, [*lead, *rest], step_ms=table.step_ms, page_lead=page_lead, records=chosen)

    def roofline(self, **filters: Any) -> Table:
        """Each module's own ops against the machine's roofs (``peaks()``): self time, FLOPs, bytes, own intensity,
        achieved bandwidth, attainable time, efficiency, bound and lost time; modules with own work only.
        Needs ``metrics=("flops",)``.

        >>> import torch, layerprof
        >>> net = torch.nn.Sequential(*[torch.nn.Linear(4, 4) for _ in range(3)])
        >>> with layerprof.LayerProf(net, metrics=("flops",), peaks={"flops": 1e12, "bandwidth": 1e11}) as prof:
        ...     for _ in range(2):
        ...         net(torch.randn(2, 4)).sum().backward()
        ...         prof.step()
        >>> [(row["name"], row["bound"]) for row in prof.roofline()]
        [('0', 'overhead'), ('1', 'overhead'), ('2', 'overhead')]
        """
        if all(getattr(record, "self_bytes", None) is None for record in self.records.values()):
            raise ValueError("the roofline needs FLOPs and bytes: profile with LayerProf(model, metrics=('flops',))")
        if self.peaks() is None:
            raise ValueError(no_roofs_for(self.meta))
        columns = ["name", "type", "self_total_ms", "self_flops", "self_bytes", "self_intensity",
                   "achieved_bandwidth", "attainable_ms", "efficiency", "bound", "lost_ms"]
        if untimed_in(self.meta) is not None:  # (what needs a measured time would be blank on every row)
            columns = [name for name in columns if name not in _MEASURED_ROOFLINE]
        rows, shown = [], []
        for record in self.select(**filters):
            row = {name: value_of(record, name) for name in columns}
            if row["bound"] is not None and (row["self_flops"] or row["self_bytes"]):
                rows.append({**row, "depth": record.depth})
                shown.append(record)
        return Table(rows, columns, records=shown)  # (a column asked for beyond these is computed from the records)

    # -- exports: every table export is ``self.rows(**filters).to_*()`` ---------------------------------------
    def to_dataframe(self, columns: Sequence[str] | None = None, **filters: Any) -> Any:
        """A pandas DataFrame, one row per module: every row field except ``call_times``, typed, units in the
        column names (``forward_ms``, ``param_bytes``)."""
        return self.rows(**filters).to_dataframe(columns)

    def to_csv(self, path: str | Path | None = None, columns: Sequence[str] | None = None, **filters: Any) -> str:
        """CSV text of the rows (raw numbers; lists as JSON); written to ``path`` if given."""
        return self.rows(**filters).to_csv(path, columns)

    def to_markdown(self, path: str | Path | None = None, columns: Sequence[str] | None = None, raw: bool = False,
                    **filters: Any) -> str:
        """A Markdown table (units in the values, or raw numbers with ``raw=True``); written to ``path`` if given.
        Its default columns fit a page: name, type, forward, backward, time %, params, FLOPs, memory (those the
        profile holds); ``columns=`` picks any."""
        return self.rows(**filters).to_markdown(path, columns, raw)

    def to_latex(self, path: str | Path | None = None, columns: Sequence[str] | None = None, raw: bool = False,
                 caption: str | None = None, label: str | None = None, longtable: bool = False, fit: bool = False,
                 **filters: Any) -> str:
        """A booktabs LaTeX table (needs ``\\usepackage{booktabs}``); written to ``path`` if given. Columns as
        ``to_markdown``. ``longtable=True`` breaks across pages (``\\usepackage{longtable}``); ``fit=True`` scales a
        table wider than the line down to it (``\\usepackage{graphicx}``)."""
        return self.rows(**filters).to_latex(path, columns, raw, caption=caption, label=label, longtable=longtable,
                                             fit=fit)

    def to_html(self, path: str | Path | None = None, columns: Sequence[str] | None = None, raw: bool = False,
                title: str | None = None, **filters: Any) -> str:
        """A self-contained HTML page with the table, names indented by depth; written to ``path`` if given."""
        shown = f"layerprof: {self.tree.type}" if check_text("title", title) is None else title
        return self.rows(**filters).to_html(path, columns, raw, title=shown)

    def to_json(self, path: str | Path | None = None, indent: int | None = 1) -> str:
        """The whole profile as JSON (format version, ``meta``, every row with its call timings); written to
        ``path`` if given. ``layerprof.load`` reads it back into an identical profile, one that plans checkpoints
        as this one does (a profile with memory figures gets its ``meta["hook_ms"]``, and a one-step live one its
        ``meta["live_op_ms"]``, measured first, once per process)."""
        check_path(path)
        self._measured("hook_ms")
        self._measured("live_op_ms")
        if "peaks" not in self.meta and untimed_in(self.meta) is None and any(
                getattr(record, "self_bytes", None) is not None
                                            for record in self.records.values()):
            # The roofs of the machine that measured the profile, which only a process on it can measure (once per
            # process): a file read on another machine has no others to hold its modules against. A measurement
            # that fails (no matmul for the profile's dtype, such as int8 on CUDA; out of memory) does not stop
            # the save: the file holds no roofs, as files saved before they were saved.
            try:
                self.peaks()
            except (RuntimeError, ValueError, TypeError) as error:  # (torch's OutOfMemoryError is a RuntimeError)
                why = (str(error).strip().splitlines() or [""])[0]
                warn_user(
                    f"to_json: this machine's roofs could not be measured for the file ({type(error).__name__}: "
                    f"{why}), so it holds none and its roofline needs them given where it is read: "
                    "layerprof.load(path, peaks={'flops': FLOP/s, 'bandwidth': bytes/s}). To save them, profile "
                    "with LayerProf(model, peaks=...)", RuntimeWarning)
        return export.write_text(io.dumps(self.tree, self.meta, indent=indent) + "\n", path)

    def to_trace(self, path: str | Path | None = None) -> str:
        """Chrome trace-event JSON of every call's forward and backward, for ui.perfetto.dev or
        chrome://tracing; written to ``path`` if given."""
        check_path(path)
        return export.write_text(trace_json(self.tree, self.meta), path)

    def to_speedscope(self, path: str | Path | None = None) -> str:
        """The speedscope format (speedscope.app): evented forward and backward timelines and a flame graph of
        self time over the module tree; written to ``path`` if given.

        >>> import json, torch, layerprof
        >>> net = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU())
        >>> with layerprof.LayerProf(net) as prof:
        ...     net(torch.randn(2, 4)).sum().backward()
        >>> doc = json.loads(prof.to_speedscope())
        >>> [frame["name"] for frame in doc["shared"]["frames"]], [p["type"] for p in doc["profiles"]]
        (['Sequential', '0 (Linear)', '1 (ReLU)'], ['evented', 'evented', 'sampled'])
        """
        check_path(path)
        return export.write_text(speedscope_json(self.tree, self.meta), path)

    def to_report(self, path: str | Path | None = None) -> str:
        """One self-contained interactive HTML page (icicle with zoom and a metric switch, sortable table,
        timeline of a step, and with memory figures the frontier of checkpoint plans with the plan for half the
        saved memory; nothing fetched, opens from file://); written to ``path`` if given.

        >>> import torch, layerprof
        >>> net = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU())
        >>> with layerprof.LayerProf(net) as prof:
        ...     net(torch.randn(2, 4)).sum().backward()
        >>> page = prof.to_report()
        >>> page.startswith("<!DOCTYPE html>"), "<script src" in page
        (True, False)
        """
        check_path(path)
        plan: Any = None
        if getattr(self.tree, "checkpoint_freed_bytes", None) is not None:
            try:
                plan = self.checkpoint_plan(0.5)
            except ValueError as error:  # a step the planner does not plan on (micro-batches): the panel says why
                plan = str(error).removeprefix("checkpoint_plan: ")
        return export.write_text(report_html(self.tree, self.meta, checkpoint=plan), path)

    def to_tensorboard(self, writer_or_logdir: Any, step: int | None = None, depth: int | None = None,
                       top: int | None = None) -> list[str]:
        """Scalars per module under ``layerprof/<field>/<module name>``, the plots as figures and the top table
        as Markdown text, through one SummaryWriter (or a new one on a log directory); returns the scalar tags.
        Needs ``pip install tensorboard``."""
        return write_tensorboard(self, writer_or_logdir, step=step, depth=depth, top=top)

    # -- plots, distributed, FLOPs ---------------------------------------------------------------------------
    def plot(self, kind: str, metric: str = "total", path: str | Path | None = None, **kwargs: Any) -> Any:
        """Draw a ``kind`` of plot ("sunburst", "icicle", "top", "roofline", or "checkpoint": the frontier of
        checkpoint plans, ``budget=`` marked) of ``metric`` and return its Axes; saves a PNG or SVG only when ``path``
        is given. Other keywords go to ``layerprof.plot_<kind>`` (ax, depth, k, ...)."""
        return save_plot(self, kind, metric=metric, path=path, **kwargs)

    def gather(self, dst: int = 0, group: Any = None, margin: float = 0.2, min_ms: float | None = None) -> Any:
        """Collect every rank's profile on rank ``dst`` (a collective) and compare them: a ``GatheredProfile``
        there, None on other ranks, a one-rank view without torch.distributed. See ``layerprof.distributed``."""
        return gather_profile(self, dst=dst, group=group, margin=margin, min_ms=min_ms)

    @staticmethod
    def gather_failure(why: str, dst: int = 0, group: Any = None) -> None:
        """The part in ``gather`` of a rank that has no profile (``why``): the other ranks then list it instead of
        waiting for it (``layerprof.distributed.gather_failure``)."""
        gather_failure(why, dst=dst, group=group)

    def checkpoint_plan(self, budget: Any = None, allow_side_effects: bool = False, resolution: int = 4096,
                        wrap_cost: Any = "measured", runs: bool = True, *, peak: Any = None) -> CheckpointPlan:
        """The modules to recompute (wrap in ``torch.utils.checkpoint``) so that the memory saved for backward
        fits ``budget`` at the least recompute time: bytes (an int), a size (``"2GiB"``), a percentage (``"50%"``)
        or a fraction (``0.5`` or ``"0.5"``: a float in (0, 1]; a float above 1 is refused) of today's. Needs a
        profile of a training step with ``metrics=("memory",)``.
        ``peak=`` instead (the same forms, a fraction of the profiled step's peak): the cheapest plan on the
        saved-bytes frontier (and the frontiers of the bytes held at the peak) whose predicted step peak
        (``predicted_peak_bytes``) fits; it needs the step's memory at every module boundary: a live profile
        with ``metrics=("live_memory",)`` on the CPU, ``("memory",)`` on CUDA (``layerprof.plan.peak_budget``). Modules
        whose recomputation repeats a side effect (BatchNorm in training) are left out unless
        ``allow_side_effects``. The time a plan costs is the recomputed forwards plus the checkpoint wrapper's own
        cost, priced by ``wrap_cost``: "measured" on this host once per process (``layerprof.plan.wrap_cost``),
        None to count recomputation only, or a pair (ms per wrapped call, ms per tensor saved inside). Measured,
        the plan is chosen on every wrapper priced cold, and its figures then price each wrapped call by the other
        work between it and the last wrapped call (``cold_extra_ms`` keeps the cold figure). A
        recomputation is priced as the profiled forward less the profiler's own hooks inside it
        (``meta["hook_ms"]`` per module call: measured on this host when the profile is
        first planned or saved, about 0.4 s once per process, and kept in the profile, so a saved profile plans
        with the figure of the host that profiled it). On CUDA events the forward is the GPU's time, which holds
        the hooks only where the GPU waited on the host: the price is then read from the host's time of the
        forward beside it (``host_forward_ms``), less the hooks, as far as the events do not exceed it
        (``layerprof.plan.candidates.less_hooks``). On a profile of one step with ``metrics=("live_memory",)``
        (the live-bytes reader on in the timed step, ``meta["timing_distorted_by"]``) the reader's time comes off
        too: ``live_forward_ops`` (the ops it saw in the module's forward) x ``meta["live_op_ms"]`` (its time per op,
        measured on this host when the profile is first planned or saved, ``layerprof.collect.live_op_cost``). A
        profile of several steps times steps without the reader and takes nothing off.
        Besides modules, a plan can wrap runs of consecutive children of an ``nn.Sequential`` under one
        checkpoint (named ``parent[first:stop]``, as ``checkpoint_sequential`` does), on a live profile;
        ``runs=False`` plans over modules only.
        A saved profile planned on another machine than the one that measured it (another host, CPU or GPU) with
        the measured wrapper price warns: that price is this host's Python, not the profiled one's; give the pair
        ``layerprof.plan.wrap_cost.wrap_cost()`` reads there.
        A step of several forwards each of whose backward ran before the next began (gradient accumulation) is
        refused for a saved-bytes budget: its saved bytes sum forwards never held at once. Profile one micro-batch a
        step (``prof.step()`` after each backward), or plan by ``peak=``.
        See ``layerprof.plan``."""
        untimed = untimed_note(self.meta)
        if untimed is not None:
            raise ValueError(
                f"checkpoint_plan: {untimed}. A plan prices each module's recomputation by its measured forward "
                "time, which this profile lacks: profile a step on the device (a smaller batch or fewer layers "
                "where the model does not fit). Its saved bytes per module (saved_bytes, self_saved_bytes) are "
                "what a plan frees")
        memory = memory_in(self.meta)
        hidden = memory.get("under_other_saved_tensors_hooks")
        if hidden:
            raise ValueError(
                f"checkpoint_plan: in the profiled step, {hidden_shown(hidden)} ran under saved-tensor hooks entered "
                "inside the block (torch.autograd.graph.save_on_cpu, saved_tensors_hooks), which autograd ran instead "
                "of the memory meter's, so what they saved for backward is unknown. Profile with your hooks entered "
                "around the block (with save_on_cpu(): with LayerProf(model, metrics=(\"memory\",)): ...), where the "
                "meter counts through them")
        if peak is None:
            accumulated = memory.get("forwards_after_backward", 0)
            if accumulated:
                saved = saved_today(self.tree)
                raise ValueError(
                    f"checkpoint_plan: in the profiled step, {accumulated} forward(s) that saved for backward began "
                    "after the backward of every earlier one had run (gradient accumulation: micro-batches, each "
                    f"with its backward), so its saved bytes{f' ({saved})' if saved else ''} sum forwards never "
                    "held at once, and a budget against that sum would wrap more than needed. Profile one forward "
                    "and its backward a step (call prof.step() after each backward; with a trainer, profile with "
                    "gradient_accumulation_steps=1 or accumulate_grad_batches=1), or plan against the step's peak "
                    "with checkpoint_plan(peak=...)")
        other_shapes = (self.meta.get("shapes") or {}).get("steps_with_other_shapes")
        if other_shapes:
            warn_user(
                f"checkpoint_plan: the profiled steps' inputs changed shape ({other_shapes} step(s) other than the "
                "first's): the plan's bytes are of the step the memory meter counted, its times over every timed "
                "step. Plan on a profile of steps of one shape (the largest you train on) for a plan that fits it",
                RuntimeWarning)
        if isinstance(wrap_cost, str) and wrap_cost == "measured":
            other = other_machine(environment_in(self.meta))
            if other is not None:
                warn_user(
                    f"{OTHER_MACHINE_WARNING}{other}), and the checkpoint "
                    "wrapper's cost (host-side Python) is measured on this one: the plan's extra time holds this "
                    "machine's wrapper price. For that machine's, run layerprof.plan.wrap_cost.wrap_cost() there "
                    "and pass wrap_cost=(per_call_ms, per_tensor_ms)", RuntimeWarning)
        return make_plan(self.tree, budget, allow_side_effects=allow_side_effects, resolution=resolution,
                         wrap_cost=wrap_cost, hook_ms=self._measured("hook_ms"), runs=runs, peak=peak,
                         op_ms=self._measured("live_op_ms"), profiled_as=profiled_as(self.meta))

    def _measured(self, key: str) -> float:
        """``meta[key]``, measured now (``measures``) for a profile LayerProf made here that has none yet; 0 where
        there is none to measure or its measure failed."""
        found = self.meta.get(key)
        measure = self.measures.get(key) if found is None else None
        if measure is not None:
            try:
                with torch.inference_mode(False):
                    found = measure()
            except (RuntimeError, ValueError, TypeError) as error:  # (torch's OutOfMemoryError is a RuntimeError)
                # A calibration that cannot run here (a full GPU, a CUDA error) costs the figure, not the plan or
                # the save: as if it was not measured, said once.
                why = (str(error).strip().splitlines() or [""])[0]
                warn_user(f"layerprof could not measure {key} on this machine ({type(error).__name__}: {why}); "
                              "the plan takes nothing off for it, so its recompute times read high by the "
                              "profiler's own cost", RuntimeWarning)
                found = None
            if found is not None:
                self.meta[key] = found
            else:  # failed: not tried again at every plan and save
                self.measures = {other: m for other, m in self.measures.items() if other != key}
        return float(found or 0.0)

    def unknown_ops(self) -> dict[str, int]:
        """Ops that ran inside the model with no FLOP formula (so counted 0), with their call counts, most
        called first; empty when every op was priced or FLOPs were not measured (``metrics=("flops",)``). A root
        never called (a trainer's step calls ``model.net(x)``) has those of its top-level modules that ran.
        Register a formula with ``layerprof.register_flop_formula``."""
        return TreeValues(self.tree).counts(self.tree, "unknown_ops")

    def peaks(self) -> dict[str, Any] | None:
        """The machine's roofs the roofline fields hold modules against: ``meta["peaks"]`` (given with
        ``LayerProf(model, peaks=...)``), else measured now by ``layerprof.peaks`` on the profile's device,
        dtype and thread count and kept in ``meta``. None for a profile of a device this process cannot use, or
        one measured on another machine (``meta["environment"]`` names another host, CPU model or GPU) that was
        saved without its roofs: give them with ``layerprof.load(path, peaks=...)``."""
        return _meta_peaks(self.meta)

    # -- notebooks and repr ----------------------------------------------------------------------------------
    def _repr_html_(self) -> str:
        table = self.rows()
        # Self times make the notebook view too wide; they are one ``columns=`` away in the other tables.
        rest = [c for c in table.columns if c not in ("name", "type") and not c.startswith("self_")]
        caption = f"{self.tree.type}: {format_counted(len(self.records), 'module')}"
        shown = table.human_rows()
        return notebook_style() + "\n" + html_table(shown, ["name", "type", *rest], indent=True, caption=caption,
                                                    max_rows=500)

    def __repr__(self) -> str:
        root = self.tree
        return (
            f"<Profile {root.type}: {format_counted(len(self.records), 'module')}, "
            f"forward {format_ms(root.forward_ms)}, "
            f"backward {format_ms(root.backward_ms)}>"
        )


# -- files ---------------------------------------------------------------------------------------------------
def loads(text: str, peaks: dict[str, Any] | None = None) -> Profile:
    """A Profile from JSON text written by ``save``/``Profile.to_json``; a ValueError saying what is wrong with
    any other text. ``peaks``: the roofs of the machine that measured it (``{"flops": FLOP/s, "bandwidth":
    bytes/s}``), in place of those saved with it; for a profile saved without them on another machine."""
    return _parsed(text, "the profile text", check_peaks(peaks))


def _parsed(text: Any, source: str, peaks: dict[str, Any] | None = None) -> Profile:
    if isinstance(text, bytes):
        try:
            text = text.decode("utf-8")
        except UnicodeDecodeError as error:
            raise ValueError(f"cannot load {source}: not UTF-8 text ({error.reason} at byte {error.start})") from None
    if not isinstance(text, str):
        raise TypeError(f"loads takes the JSON text of a profile, got {type(text).__name__}")
    try:
        tree, meta = io.parse(text)
    except ValueError as error:
        raise ValueError(f"cannot load {source}: {error}") from None
    if peaks is None and meta.get("peaks") is not None:
        try:  # the roofs a saved profile holds, checked as given ones are (where none are given in their place)
            check_peaks(meta["peaks"])
        except (TypeError, ValueError) as error:
            raise ValueError(f"cannot load {source}: meta['peaks']: {error}; the file is damaged: "
                             "load(path, peaks=...) gives the roofs instead") from None
    if peaks is not None:
        meta["peaks"] = peaks
    return Profile(tree, meta)


def load(source: str | Path | IO[str], peaks: dict[str, Any] | None = None) -> Profile:
    """Load a profile saved with ``prof.to_json(path)`` or ``layerprof.save(prof, path)`` (a path or an open file).
    Anything else is a ValueError naming the file and the first thing wrong with it. ``peaks``: the roofs of the
    machine that measured it, as for ``loads``.

    >>> import torch, tempfile, os, layerprof
    >>> net = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU())
    >>> with layerprof.LayerProf(net) as prof:
    ...     net(torch.randn(2, 4)).sum().backward()
    >>> path = os.path.join(tempfile.mkdtemp(), "net.json")
    >>> _ = prof.to_json(path)
    >>> layerprof.load(path).layerwise_summary() == prof.layerwise_summary()
    True
    """
    peaks = check_peaks(peaks)
    if hasattr(source, "read"):
        name = getattr(source, "name", None)
        return _parsed(source.read(), repr(name) if isinstance(name, str) else "the stream",  # type: ignore[union-attr]
                       peaks)
    if not isinstance(source, (str, Path)):
        raise TypeError(f"load takes a path or an open file, got {type(source).__name__}; for JSON text use loads")
    if isinstance(source, str) and source.lstrip().startswith("{"):
        raise ValueError("load takes a path or an open file, and this is JSON text: read it with layerprof.loads(text)")
    return _parsed(Path(source).read_bytes(), repr(str(source)), peaks)


def as_profile(value: Any) -> Profile:
    """A Profile from a Profile, a LayerProf after its ``with`` block, or the path of a saved profile."""
    if isinstance(value, Profile):
        return value
    if isinstance(value, (str, Path)):
        return load(value)
    profile = getattr(value, "profile", None)  # LayerProf: raises a clear error before its block has exited
    if isinstance(profile, Profile):
        return profile
    raise TypeError(f"expected a Profile, a LayerProf or a saved profile's path, got {type(value).__name__}")


def save(profile: Any, path: str | Path) -> str:
    """Write the profile's JSON to ``path`` and return the text. ``layerprof.load(path)`` reads it back."""
    return as_profile(profile).to_json(path)


def compare(a: Any, b: Any, names: tuple[str, str] = ("a", "b"), module_fields: Sequence[str] | None = None
            ) -> Comparison:
    """Compare two profiles (or LayerProf objects after their ``with`` block, or paths to saved profiles).

    >>> import torch, layerprof
    >>> def run(width):
    ...     net = torch.nn.Sequential(torch.nn.Linear(8, width), torch.nn.ReLU(), torch.nn.Linear(width, 1))
    ...     with layerprof.LayerProf(net) as prof:
    ...         net(torch.randn(4, 8)).sum().backward()
    ...     return prof
    >>> result = layerprof.compare(run(64), run(16), names=("teacher", "student"))
    >>> result.model[0]["metric"], result.model[0]["ratio"]
    ('modules', 1.0)
    >>> len(result.matched)
    4
    """
    return Comparison(as_profile(a), as_profile(b), names, module_fields)


def gather_saved(sources: Sequence[Any] | Mapping[int, Any], margin: float = 0.2,
                 min_ms: float | None = None) -> GatheredProfile:
    """The cross-rank view of a torch.distributed job from each rank's saved profile: what ``prof.gather()``
    returns on its ``dst``, made after the run, in any process (no process group needed).

    ``sources``: the per-rank files (paths, or Profiles, or LayerProfs after their block), in any order: each
    profile made under torch.distributed knows its rank and the world size (``meta["distributed"]``). A mapping
    ``{rank: path}`` names the ranks of files that do not (saved outside a process group, or by an earlier
    layerprof). A rank of the job with no file among them is listed in ``failed_ranks``. ``margin``, ``min_ms``:
    the straggler rule, as for ``gather()``.
    """
    if isinstance(sources, (str, Path, Profile)) or not isinstance(sources, (Sequence, Mapping)):
        raise TypeError(f"gather_saved takes the per-rank profiles as a list (of paths or Profiles) or as "
                        f"{{rank: path}}, got {type(sources).__name__}: wrap a single one in a list")
    given = list(sources.items()) if isinstance(sources, Mapping) else [(None, source) for source in sources]
    named = [(rank, repr(str(source)) if isinstance(source, (str, Path)) else f"profile {index}", as_profile(source))
             for index, (rank, source) in enumerate(given)]
    return gathered_from_saved(named, margin=margin, min_ms=min_ms)
