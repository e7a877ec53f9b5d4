"""Table: what a query returns. A list of rows that prints as a table and exports like a profile does.

A table of module records knows the step's total time, so its human-readable forms (text, Markdown, LaTeX,
HTML) add ``total_ms`` and ``time_percent`` (share of the step) after the times; the machine-readable ones (CSV,
DataFrame) keep the stored fields only. Markdown and LaTeX go on a page: by default they show a few columns
(``export.PAGE_COLUMNS``: times, share, params, FLOPs, memory), ``columns=`` any. ``Profile.to_*`` are
``Profile.rows(...).to_*``: one export path."""
from __future__ import annotations

import copy
from pathlib import Path
from typing import Any, Iterable, Iterator, Sequence, overload

from ..record.fields import FIELDS, canonical
from ..record.records import ModuleRecord
from . import export
from .html import html_table, notebook_style, to_html
from .rows import aggregate_by_type, record_rows
from .units import format_counted

__all__ = ["Table"]


class Table(Sequence[dict[str, Any]]):
    """Rows (plain dicts) plus the columns to show by default. Indexing and iteration give the rows.

    >>> table = Table([{"name": "fc", "type": "Linear", "forward_ms": 1.5}])
    >>> table[0]["forward_ms"], len(table)
    (1.5, 1)
    >>> print(table)
    Name  Type    Forward
    ----  ------  -------
    fc    Linear   1.5 ms
    """

    def __init__(self, rows: Sequence[dict[str, Any]], columns: Sequence[str] | None = None,
                 step_ms: float | None = None, page_lead: Sequence[str] | None = None) -> None:
        self.rows: list[dict[str, Any]] = list(rows)
        # The whole step's time, for the share column of human-readable forms; None: no share is shown.
        self.step_ms = step_ms
        self.columns: list[str] = (
            list(columns) if columns is not None else export.display_columns(self.human_rows())
        )
        # A page (Markdown, LaTeX) shows ``page_lead`` then the page's usual columns; a table given its columns
        # and no lead shows just those.
        self._page_lead = list(page_lead) if page_lead is not None else list(columns or ())
        self._page_adds = page_lead is not None or columns is None

    @classmethod
    def of_records(cls, records: Iterable[ModuleRecord], root: ModuleRecord) -> Table:
        """The canonical rows of ``records``, with shares of the step of ``root``."""
        return cls(record_rows(records), step_ms=root.total_ms if root.total_ms else 0.0)

    @classmethod
    def by_type(cls, records: Iterable[ModuleRecord]) -> Table:
        """One row per module type (see ``rows.aggregate_by_type``)."""
        return cls(aggregate_by_type(records))

    def human_rows(self) -> list[dict[str, Any]]:
        """The rows for people: ``total_ms`` and ``time_percent`` inserted after ``backward_ms`` when the table
        knows the step's time. Computed here, never stored on the records."""
        if self.step_ms is None:
            return self.rows
        shown = []
        for row in self.rows:
            forward, backward = row.get("forward_ms"), row.get("backward_ms")
            total = None if forward is None and backward is None else (forward or 0.0) + (backward or 0.0)
            percent = None if total is None or not self.step_ms else 100.0 * total / self.step_ms
            out: dict[str, Any] = {}
            for key, value in row.items():
                out[key] = value
                if key == "backward_ms":
                    out["total_ms"], out["time_percent"] = total, percent
            shown.append(out)
        return shown

    def page_rows(self) -> list[dict[str, Any]]:
        """The human rows, with the summed fields a page shows (``flops``: forward + backward + recompute FLOPs)
        where a row holds their parts. Computed here, never stored on the records."""
        summed = [FIELDS[name] for name in export.PAGE_COLUMNS if name in FIELDS and FIELDS[name].parts]
        shown = []
        for row in self.human_rows():
            out = dict(row)
            for field in summed:
                if field.name not in row and any(part in row for part in field.parts):
                    values = [row[part] for part in field.parts if row.get(part) is not None]
                    out[field.name] = sum(values) if values else None
            shown.append(out)
        return shown

    def _page(self, columns: Sequence[str] | None) -> tuple[list[dict[str, Any]], list[str]]:
        """The rows and columns of a page table: ``columns``, or the lead and the usual page columns."""
        rows = self.page_rows()
        if columns is not None:
            return rows, self._chosen(columns, rows)
        return rows, export.page_columns(rows, self._page_lead) if self._page_adds else self._page_lead

    @overload
    def __getitem__(self, index: int) -> dict[str, Any]: ...
    @overload
    def __getitem__(self, index: slice) -> Table: ...
    def __getitem__(self, index: int | slice) -> dict[str, Any] | Table:
        if isinstance(index, slice):
            part = copy.copy(self)
            part.rows = self.rows[index]
            return part
        return self.rows[index]

    def __len__(self) -> int:
        return len(self.rows)

    def __iter__(self) -> Iterator[dict[str, Any]]:
        return iter(self.rows)

    def _chosen(self, columns: Sequence[str] | None, rows: Sequence[dict[str, Any]] | None = None) -> list[str]:
        """``columns`` checked against what the rows hold (short names such as ``forward`` resolved), or the
        default columns. A name the rows do not hold is a ValueError that lists those they do."""
        if columns is None:
            return self.columns
        if isinstance(columns, str):
            raise TypeError(f"columns must be a list of names, e.g. columns=[{columns!r}], not a string")
        rows = self.human_rows() if rows is None else rows
        present = {key: None for row in rows for key in row}
        chosen = []
        for name in columns:
            resolved = name if name in present else canonical(name, present=lambda key: key in present)
            if resolved not in present:
                raise ValueError(f"unknown column {name!r}: the rows hold {', '.join(present)}")
            chosen.append(resolved)
        return chosen

    def to_dataframe(self, columns: Sequence[str] | None = None) -> Any:
        """A pandas DataFrame of every field (or ``columns``), raw numbers, units in the column names."""
        return export.to_dataframe(self.human_rows() if columns else self.rows,
                                   None if columns is None else self._chosen(columns))

    def to_csv(self, path: str | Path | None = None, columns: Sequence[str] | None = None) -> str:
        """CSV of every field (or ``columns``); written to ``path`` if given."""
        chosen = None if columns is None else self._chosen(columns)
        return export.write_text(export.to_csv(self.human_rows() if columns else self.rows, chosen), path)

    def to_markdown(self, path: str | Path | None = None, columns: Sequence[str] | None = None,
                    raw: bool = False) -> str:
        """A Markdown table of a page's columns (or ``columns``); written to ``path`` if given."""
        rows, chosen = self._page(columns)
        return export.write_text(export.to_markdown(rows, chosen, raw), path)

    def to_latex(self, path: str | Path | None = None, columns: Sequence[str] | None = None, raw: bool = False,
                 caption: str | None = None, label: str | None = None) -> str:
        """A booktabs LaTeX table of a page's columns (or ``columns``); written to ``path`` if given."""
        rows, chosen = self._page(columns)
        text = export.to_latex(rows, chosen, raw, caption=caption, label=label)
        return export.write_text(text, path)

    def to_html(self, path: str | Path | None = None, columns: Sequence[str] | None = None, raw: bool = False,
                title: str = "layerprof") -> str:
        """A self-contained HTML page with the table, names indented by depth; written to ``path`` if given."""
        text = to_html(self.human_rows(), self._chosen(columns), raw, title=title, indent=self.step_ms is not None)
        return export.write_text(text, path)

    def __str__(self) -> str:
        return export.to_text(self.human_rows(), self.columns).rstrip("\n")

    def __repr__(self) -> str:
        return f"<Table: {format_counted(len(self.rows), 'row')}; columns {', '.join(self.columns)}>"

    def _repr_html_(self) -> str:
        return notebook_style() + "\n" + html_table(self.human_rows(), self.columns, max_rows=500)
