"""Table: what a query returns. A list of rows that prints as a table and exports like a profile does."""
from __future__ import annotations

from pathlib import Path
from typing import Any, Iterator, Sequence, overload

from . import export
from .html import html_table, notebook_style, to_html

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

    def __init__(self, rows: Sequence[dict[str, Any]], columns: Sequence[str] | None = None) -> None:
        self.rows: list[dict[str, Any]] = list(rows)
        self.columns: list[str] = list(columns) if columns is not None else export.display_columns(self.rows)

    @overload
    def __getitem__(self, index: int) -> dict[str, Any]: ...
    @overload
    def __getitem__(self, index: slice) -> Table: ...
    def __getitem__(self, index: int | slice) -> dict[str, Any] | Table:
        if isinstance(index, slice):
            return Table(self.rows[index], self.columns)
        return self.rows[index]

    def __len__(self) -> int:
        return len(self.rows)

    def __iter__(self) -> Iterator[dict[str, Any]]:
        return iter(self.rows)

    def _chosen(self, columns: Sequence[str] | None) -> list[str]:
        return list(columns) if columns is not None else self.columns

    def to_dataframe(self, columns: Sequence[str] | None = None) -> Any:
        """A pandas DataFrame of every field (or ``columns``), raw numbers, units in the column names."""
        return export.to_dataframe(self.rows, columns)

    def to_csv(self, path: str | Path | None = None, columns: Sequence[str] | None = None) -> str:
        """CSV of every field (or ``columns``); written to ``path`` if given."""
        return export.write_text(export.to_csv(self.rows, columns), path)

    def to_markdown(self, path: str | Path | None = None, columns: Sequence[str] | None = None,
                    raw: bool = False) -> str:
        """A Markdown table of the shown columns; written to ``path`` if given."""
        return export.write_text(export.to_markdown(self.rows, self._chosen(columns), raw), path)

    def to_latex(self, path: str | Path | None = None, columns: Sequence[str] | None = None, raw: bool = False,
                 caption: str | None = None, label: str | None = None) -> str:
        """A booktabs LaTeX table of the shown columns; written to ``path`` if given."""
        text = export.to_latex(self.rows, self._chosen(columns), raw, caption=caption, label=label)
        return export.write_text(text, path)

    def to_html(self, path: str | Path | None = None, columns: Sequence[str] | None = None, raw: bool = False,
                title: str = "layerprof") -> str:
        """A self-contained HTML page with the table; written to ``path`` if given."""
        return export.write_text(to_html(self.rows, self._chosen(columns), raw, title=title, indent=False), path)

    def __str__(self) -> str:
        return export.to_text(self.rows, self.columns).rstrip("\n")

    def __repr__(self) -> str:
        return f"<Table: {len(self.rows)} rows; columns {', '.join(self.columns)}>"

    def _repr_html_(self) -> str:
        return notebook_style() + "\n" + html_table(self.rows, self.columns, max_rows=500)
