"""Table: what a query returns. A list of rows that prints as a table and exports like a profile does.

A table of module records knows the step's total time, so its human-readable forms (text, Markdown, LaTeX,
HTML) add ``total_ms`` and ``time_percent`` (share of the step) after the times; the machine-readable ones (CSV,
DataFrame) keep the stored fields only. Markdown and LaTeX go on a page: by default they show a few columns
(``export.PAGE_COLUMNS``: times, share, params, FLOPs, memory), ``columns=`` any. ``Profile.to_*`` are
``Profile.rows(...).to_*``: one export path."""
from __future__ import annotations

import copy
from pathlib import Path
from typing import Any, Callable, Iterable, Iterator, Sequence, overload

from .._check import check_bool, check_names, check_path, check_text
from ..record.fields import FIELDS, canonical
from ..record.records import ModuleRecord, preorder, tree_rows
from . import export
from .html import html_table, notebook_style, to_html
from .rows import (AGGREGATE_COLUMNS, RowView, aggregate_by_type, is_number, record_rows, value_of, whole_of,
                   with_fields)
from .units import format_counted

__all__ = ["Table"]


def _checked_rows(rows: Any) -> list[dict[str, Any]]:
    """``rows`` as a list of dicts; a TypeError for anything else (a string, a dict of rows, rows of lists)."""
    try:
        listed = None if isinstance(rows, (str, bytes, dict)) else list(rows)
    except TypeError:
        listed = None
    if listed is None:
        raise TypeError(f"rows must be a list of dicts (one per row), got {type(rows).__name__}")
    for row in listed:
        if not isinstance(row, dict):
            raise TypeError(f"rows must be a list of dicts (one per row), got an item of type {type(row).__name__}")
    return listed


def _checked_columns(columns: Any) -> list[str]:
    """``columns`` as a list of names; a string (one name, or several in one) is refused with the list to write."""
    if isinstance(columns, str):
        raise TypeError(f"columns must be a list of names, e.g. columns=[{columns!r}], not a string")
    return list(check_names("columns", columns, "['name', 'forward']"))


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
                 step_ms: float | None = None, page_lead: Sequence[str] | None = None,
                 like: Table | None = None, records: Sequence[ModuleRecord] | None = None) -> None:
        self.rows: list[dict[str, Any]] = _checked_rows(rows)
        if columns is not None:
            columns = _checked_columns(columns)
        if step_ms is not None and not is_number(step_ms):
            raise TypeError(f"step_ms must be a number of milliseconds or None, got {step_ms!r}")
        # The whole step's time, for the share column of human-readable forms; None: no share is shown.
        self.step_ms = step_ms
        # An empty table takes its columns from ``like`` (the table it was selected from): a filter that matches
        # no module gives a header, with the columns a selection that matched some would have.
        self._like = like
        # The records the rows are of, where known: a field asked for by name and not in the rows is computed
        # from them (a share of the model, a roofline figure), else from the row itself.
        self._records: list[ModuleRecord] | None = None if records is None else list(records)
        if self._records is not None and len(self._records) != len(self.rows):
            raise ValueError(f"records must be one per row: {len(self._records)} for {len(self.rows)} rows")
        self.columns: list[str] = (
            list(columns) if columns is not None else export.display_columns(self._template().human_rows())
        )
        # A page (Markdown, LaTeX) shows ``page_lead`` then the page's usual columns; a table given its columns
        # and no lead shows just those.
        self._page_lead = list(page_lead) if page_lead is not None else list(columns or ())
        self._page_adds = page_lead is not None or columns is None

    @classmethod
    def of_records(cls, records: Iterable[ModuleRecord], root: ModuleRecord) -> Table:
        """The canonical rows of ``records``, with shares of the step of ``root``; with no records, the columns of
        every record under ``root``."""
        chosen = list(records)
        # (a root never called itself: its top-level modules' sum, as the summary's total)
        step_ms = FIELDS["total_ms"].value(whole_of(root)) or 0.0
        like = None if chosen else cls(tree_rows(root), step_ms=step_ms)
        table = cls(record_rows(chosen), step_ms=step_ms, like=like)
        table._records = chosen
        return table

    @classmethod
    def by_type(cls, records: Iterable[ModuleRecord], root: ModuleRecord | None = None) -> Table:
        """One row per module type (see ``rows.aggregate_by_type``); with no records, the columns of the
        aggregate of every record under ``root``, or without a root those every aggregate has."""
        rows = aggregate_by_type(records)
        if rows:
            return cls(rows)
        if root is None:
            return cls(rows, AGGREGATE_COLUMNS)
        return cls(rows, like=cls.by_type(preorder(root)))

    def _template(self) -> Table:
        """The table whose rows give the columns: this one, or for an empty one the table it was selected from."""
        return self._like if not self.rows and self._like is not None else self

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
        if columns is not None:
            return self._select(columns, Table.page_rows)
        if not self._page_adds:
            return self.page_rows(), self._page_lead
        return self.page_rows(), export.page_columns(self._template().page_rows(), self._page_lead)

    @overload
    def __getitem__(self, index: int) -> dict[str, Any]: ...
    @overload
    def __getitem__(self, index: slice) -> Table: ...
    def __getitem__(self, index: int | slice) -> dict[str, Any] | Table:
        if isinstance(index, slice):
            part = copy.copy(self)
            part.rows = self.rows[index]
            part._records = None if self._records is None else self._records[index]
            part._like = self._template()
            return part
        return self.rows[index]

    def __len__(self) -> int:
        return len(self.rows)

    def __iter__(self) -> Iterator[dict[str, Any]]:
        return iter(self.rows)

    def _select(self, columns: Sequence[str] | None, form: Callable[[Table], list[dict[str, Any]]] | None = None
                ) -> tuple[list[dict[str, Any]], list[str]]:
        """The rows in ``form`` and ``columns`` checked against what such rows hold (short names such as ``forward``
        resolved; a derived field they lack, such as ``macs``, computed into them), or the default columns. A
        name they neither hold nor can compute is a ValueError that lists those they hold."""
        form = form or Table.human_rows
        if columns is None:
            return form(self), self.columns
        columns = _checked_columns(columns)
        rows = form(self)
        if not columns:
            raise ValueError("columns is empty: name at least one column, e.g. columns=('name', 'forward'), or "
                             "leave columns out for the default ones")
        template = self._template()
        if template.rows:
            present = {key: None for row in form(template) for key in row}
        else:
            present = dict.fromkeys(self.columns)
        chosen = []
        for name in columns:
            resolved = name if name in present else canonical(name, present=lambda key: key in present)
            declared = FIELDS.get(resolved) if resolved is not None else None
            if resolved not in present and declared is None:
                raise ValueError(f"unknown column {name!r}: the rows hold {', '.join(present)}")
            # A declared field the rows lack is computed (a derived one) or read off the records. With no rows to
            # look at it is taken as it would be; else some module must hold it, or the column is blank throughout.
            if resolved not in present and template.rows and not template._holds(declared):
                raise ValueError(f"column {resolved!r}: no module of this profile holds it; {declared.hint}")
            chosen.append(resolved)
        return with_fields(rows, [c for c in chosen if c not in present], self._records), chosen

    def _holds(self, field: Any) -> bool:
        """Whether some module of the tree these rows are of (every module, not only the rows selected) holds a
        value of ``field``; for rows with no records behind them (an aggregate), some row."""
        if self._records:
            return any(value_of(record, field.name) is not None for record in preorder(self._records[0].root))
        return any(value_of(RowView(row), field.name, row) is not None for row in self.page_rows())

    def _machine(self, columns: Sequence[str] | None) -> tuple[list[dict[str, Any]], list[str]]:
        """The rows and columns of a machine-readable table: every stored field, or ``columns``."""
        if columns is not None:
            return self._select(columns)
        template = self._template()
        return self.rows, export.table_columns(template.rows) if template.rows else self.columns

    def to_dataframe(self, columns: Sequence[str] | None = None) -> Any:
        """A pandas DataFrame of every field (or ``columns``), raw numbers, units in the column names."""
        return export.to_dataframe(*self._machine(columns))

    def to_csv(self, path: str | Path | None = None, columns: Sequence[str] | None = None) -> str:
        """CSV of every field (or ``columns``); written to ``path`` if given."""
        check_path(path, columns=True)
        return export.write_text(export.to_csv(*self._machine(columns)), path)

    def to_markdown(self, path: str | Path | None = None, columns: Sequence[str] | None = None,
                    raw: bool = False) -> str:
        """A Markdown table of a page's columns (or ``columns``); written to ``path`` if given."""
        check_path(path, columns=True)
        raw = check_bool("raw", raw)
        rows, chosen = self._page(columns)
        return export.write_text(export.to_markdown(rows, chosen, raw), path)

    def to_latex(self, path: str | Path | None = None, columns: Sequence[str] | None = None, raw: bool = False,
                 caption: str | None = None, label: str | None = None, longtable: bool = False,
                 fit: bool = False) -> str:
        """A booktabs LaTeX table of a page's columns (or ``columns``); written to ``path`` if given.
        ``longtable=True``: one that breaks across pages; ``fit=True``: one scaled down to the line's width where
        wider (see ``export.to_latex``)."""
        check_path(path, columns=True)
        raw, longtable, fit = check_bool("raw", raw), check_bool("longtable", longtable), check_bool("fit", fit)
        caption, label = check_text("caption", caption), check_text("label", label)
        rows, chosen = self._page(columns)
        text = export.to_latex(rows, chosen, raw, caption=caption, label=label, longtable=longtable, fit=fit)
        return export.write_text(text, path)

    def to_html(self, path: str | Path | None = None, columns: Sequence[str] | None = None, raw: bool = False,
                title: str = "layerprof") -> str:
        """A self-contained HTML page with the table, names indented by depth; written to ``path`` if given."""
        check_path(path, columns=True)
        raw = check_bool("raw", raw)
        if not isinstance(title, str):
            raise TypeError(f"title must be a string, got {title!r}")
        rows, chosen = self._select(columns)
        text = to_html(rows, chosen, raw, title=title, indent=self.step_ms is not None)
        return export.write_text(text, path)

    def __str__(self) -> str:
        return export.to_text(self.human_rows(), self.columns).rstrip("\n")

    def __repr__(self) -> str:
        return f"<Table: {format_counted(len(self.rows), 'row')}; columns {', '.join(self.columns)}>"

    def _repr_html_(self) -> str:
        return notebook_style() + "\n" + html_table(self.human_rows(), self.columns, max_rows=500)
