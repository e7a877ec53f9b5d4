"""The reading side of a Profile: queries, tables, exports, trace and notebook view, as Profile methods.

Kept apart from ``profile.py`` so that the result class stays short; every method here is a thin call into
``render/`` over the canonical rows (``ModuleRecord.to_dict()``). Filters shared by the table methods:
``depth`` (exactly), ``max_depth``, ``type`` (class name or names), ``name`` (glob on the qualified name),
``leaves`` and ``called`` (see ``render.rows.select``).
"""
from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any, Sequence

from .render import export
from .render.html import html_table, notebook_style, to_html
from .render.rows import (
    DERIVED_FIELDS, aggregate_by_type, numeric_fields, record_rows, select, top_records, value_of,
)
from .render.table import Table
from .render.trace import trace_json

if TYPE_CHECKING:
    from .records import ModuleRecord

__all__ = ["ProfileReports"]


def _human_rows(rows: list[dict[str, Any]], root: ModuleRecord) -> list[dict[str, Any]]:
    """Rows for people: ``total_ms`` and ``time_percent`` (share of the step) inserted after the times.
    Computed here, never stored on the records."""
    step = root.total_ms
    shown = []
    for row in rows:
        forward, backward = row.get("forward_ms"), row.get("backward_ms")
        total = None if forward is None and backward is None else (forward or 0.0) + (backward or 0.0)
        percent = None if total is None or not step else 100.0 * total / step
        out: dict[str, Any] = {}
        for key, value in row.items():
            out[key] = value
            if key == "backward_ms":
                out["total_ms"], out["time_percent"] = total, percent
        shown.append(out)
    return shown


class ProfileReports:
    """Mixed into ``Profile``: needs ``self.tree``, ``self.records`` and ``self.meta``."""

    tree: ModuleRecord
    records: dict[str, ModuleRecord]
    meta: dict[str, Any]

    # -- queries ---------------------------------------------------------------------------------------------
    def select(self, **filters: Any) -> list[ModuleRecord]:
        """The records that pass the filters, in ``named_modules()`` order."""
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
        return Table(record_rows(self.select(**filters)))

    def aggregate(self, by: str = "type", **filters: Any) -> Table:
        """One row per module type (``by="type"``): module count, calls, numeric fields summed (peaks: max).
        Use ``leaves=True`` for a breakdown whose times add up without counting containers."""
        if by != "type":
            raise ValueError(f"aggregate groups by 'type' only, got by={by!r}")
        return Table(aggregate_by_type(self.select(**filters)))

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
        known = set(numeric_fields(self.to_dict().values())) | set(DERIVED_FIELDS)
        if by not in known:
            raise ValueError(f"cannot rank by {by!r}; numeric fields of this profile: {', '.join(sorted(known))}")
        candidates = self.select(depth=depth, **filters)
        if depth is None:
            candidates = [record for record in candidates if record is not self.tree]
        chosen = top_records(candidates, k, by)
        rows = record_rows(chosen)
        if by in DERIVED_FIELDS:
            rows = [{**row, by: value_of(record, by, row)} for record, row in zip(chosen, rows)]
        rest = [c for c in export.display_columns(rows) if c not in ("name", "type", "calls", by)]
        columns = ["name", "type", "calls", by, *rest]
        return Table(rows, columns)

    # -- machine-readable exports ----------------------------------------------------------------------------
    def to_dataframe(self, columns: Sequence[str] | None = None, **filters: Any) -> Any:
        """A pandas DataFrame, one row per module: every row field except ``call_times``, typed, units in the
        column names (``forward_ms``, ``param_bytes``)."""
        return export.to_dataframe(record_rows(self.select(**filters)), columns)

    def to_csv(self, path: str | Path | None = None, columns: Sequence[str] | None = None, **filters: Any) -> str:
        """CSV text of the rows (raw numbers; lists as JSON); written to ``path`` if given."""
        return export.write_text(export.to_csv(record_rows(self.select(**filters)), columns), path)

    def to_json(self, path: str | Path | None = None, indent: int | None = 1) -> str:
        """The whole profile as JSON (format version, ``meta``, every row with its call timings); written to
        ``path`` if given. ``layerprof.load`` reads it back into an identical profile."""
        from .io import dumps

        return export.write_text(dumps(self, indent=indent) + "\n", path)  # type: ignore[arg-type]

    def to_trace(self, path: str | Path | None = None) -> str:
        """Chrome trace-event JSON of every call's forward and backward, for ui.perfetto.dev or
        chrome://tracing; written to ``path`` if given."""
        return export.write_text(trace_json(self.tree, self.meta), path)

    # -- human-readable tables -------------------------------------------------------------------------------
    def _table_rows(self, filters: dict[str, Any]) -> list[dict[str, Any]]:
        return _human_rows(record_rows(self.select(**filters)), self.tree)

    def to_markdown(self, path: str | Path | None = None, columns: Sequence[str] | None = None, raw: bool = False,
                    **filters: Any) -> str:
        """A Markdown table (units in the values, or raw numbers with ``raw=True``); written to ``path`` if given."""
        return export.write_text(export.to_markdown(self._table_rows(filters), columns, raw), path)

    def to_latex(self, path: str | Path | None = None, columns: Sequence[str] | None = None, raw: bool = False,
                 caption: str | None = None, label: str | None = None, **filters: Any) -> str:
        """A booktabs LaTeX table (needs ``\\usepackage{booktabs}``); written to ``path`` if given."""
        text = export.to_latex(self._table_rows(filters), columns, raw, caption=caption, label=label)
        return export.write_text(text, path)

    def to_html(self, path: str | Path | None = None, columns: Sequence[str] | None = None, raw: bool = False,
                title: str | None = None, **filters: Any) -> str:
        """A self-contained HTML page with the table, names indented by depth; written to ``path`` if given."""
        shown = title if title is not None else f"layerprof: {self.tree.type}"
        return export.write_text(to_html(self._table_rows(filters), columns, raw, title=shown), path)

    def _repr_html_(self) -> str:
        rows = self._table_rows({})
        # Self times make the notebook view too wide; they are one ``columns=`` away in the other tables.
        rest = [c for c in export.display_columns(rows) if c not in ("name", "type") and not c.startswith("self_")]
        columns = ["name", "type", *rest]
        caption = f"{self.tree.type}: {len(self.records)} modules"
        return notebook_style() + "\n" + html_table(rows, columns, indent=True, caption=caption, max_rows=500)
