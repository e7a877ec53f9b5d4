"""HTML: a self-contained page with one table, and the fragment notebooks show for a profile."""
from __future__ import annotations

from html import escape
from typing import Any, Sequence

from .export import display_columns, headers, iter_cells

__all__ = ["html_table", "to_html", "notebook_style"]

_STYLE = """
table.layerprof { border-collapse: collapse; font-family: ui-monospace, Menlo, Consolas, monospace; font-size: 12px; }
table.layerprof th, table.layerprof td { padding: 2px 8px; border-bottom: 1px solid #ddd; white-space: nowrap; }
table.layerprof th { text-align: left; border-bottom: 2px solid #444; }
table.layerprof td.num { text-align: right; }
table.layerprof caption { text-align: left; padding: 4px 0; font-weight: bold; }
""".strip()


def html_table(
    rows: Sequence[dict[str, Any]],
    columns: Sequence[str] | None = None,
    raw: bool = False,
    indent: bool = False,
    caption: str | None = None,
    max_rows: int | None = None,
) -> str:
    """A ``<table class="layerprof">``; ``indent`` shifts the name cell by the row's depth (a tree view);
    ``max_rows`` keeps the first rows and says how many were left out."""
    chosen = list(columns) if columns is not None else display_columns(rows)
    shown = list(rows) if max_rows is None else list(rows)[:max_rows]
    numeric = {c for c in chosen if c not in ("name", "type", "parent", "extra_repr", "aliases")}
    parts = ['<table class="layerprof">']
    if caption:
        parts.append(f"<caption>{escape(caption)}</caption>")
    parts.append("<thead><tr>" + "".join(f"<th>{escape(h)}</th>" for h in headers(chosen, raw)) + "</tr></thead>")
    parts.append("<tbody>")
    for row, cells in zip(shown, iter_cells(shown, chosen, raw)):
        tds = []
        for column, cell in zip(chosen, cells):
            text = escape(cell, quote=False)
            if column == "name" and indent:
                pad = 1.2 * int(row.get("depth") or 0)
                tds.append(f'<td style="padding-left: {pad + 0.5:.1f}em">{text}</td>')
            elif column in numeric:
                tds.append(f'<td class="num">{text}</td>')
            else:
                tds.append(f"<td>{text}</td>")
        parts.append("<tr>" + "".join(tds) + "</tr>")
    parts.append("</tbody>")
    left_out = len(rows) - len(shown)
    if left_out > 0:
        parts.append(f'<tfoot><tr><td colspan="{len(chosen)}">… {left_out} more rows</td></tr></tfoot>')
    parts.append("</table>")
    return "\n".join(parts)


def to_html(
    rows: Sequence[dict[str, Any]],
    columns: Sequence[str] | None = None,
    raw: bool = False,
    title: str = "layerprof",
    indent: bool = True,
) -> str:
    """A complete HTML page (inline CSS, no scripts, no external files) holding one table."""
    table = html_table(rows, columns, raw=raw, indent=indent, caption=title)
    return (
        "<!DOCTYPE html>\n<html>\n<head>\n<meta charset=\"utf-8\">\n"
        f"<title>{escape(title)}</title>\n<style>\n{_STYLE}\n</style>\n</head>\n<body>\n{table}\n</body>\n</html>\n"
    )


def notebook_style() -> str:
    """The ``<style>`` block for fragments shown in a notebook."""
    return f"<style>\n{_STYLE}\n</style>"
