"""Tables from rows: DataFrame, CSV, Markdown, LaTeX (booktabs). Thin writers over the canonical rows form.

Machine-readable outputs (DataFrame, CSV) keep raw numbers with the unit in the column name (``forward_ms``);
human-readable ones (Markdown, LaTeX, HTML) format values through ``units.format_field`` unless ``raw=True``.
"""
from __future__ import annotations

import csv
import io
import json
import re
from pathlib import Path
from typing import Any, Collection, Iterable, Sequence

from .._files import write_text_atomic
from ..record.fields import FIELDS, canonical
from .rows import is_number, numeric_fields
from .units import field_label, format_field, format_plain

__all__ = [
    "table_columns", "display_columns", "page_columns", "PAGE_COLUMNS", "to_dataframe", "to_csv", "to_markdown",
    "to_latex", "to_text", "cell_text", "latex_escape", "markdown_escape", "iter_cells", "headers", "write_text",
]

ROOT_LABEL = "(root)"
# Columns that only machine-readable tables carry.
_TABLE_SKIP = ("call_times",)
_TEXT_FIRST = ("name", "type")


def table_columns(rows: Sequence[dict[str, Any]]) -> list[str]:
    """Every key of the rows except ``call_times`` (nested; it lives in JSON and the trace), first-seen order."""
    seen: dict[str, None] = {}
    for row in rows:
        for key in row:
            if key not in _TABLE_SKIP:
                seen.setdefault(key, None)
    return list(seen)


def display_columns(rows: Sequence[dict[str, Any]]) -> list[str]:
    """Columns for people: the text columns present among ``name``/``type``, then every numeric field that has
    a value in some row (``depth`` is shown by indentation or not at all)."""
    text = [c for c in _TEXT_FIRST if any(c in row for row in rows)]
    return text + numeric_fields(rows, skip=("depth",))


# What a table on a page (Markdown, LaTeX) shows by default: the module, its times and share of the step, and one
# figure per meter where the profile has it (``memory``: saved bytes, else activation bytes). ``columns=`` picks
# any others; text, HTML and CSV keep every field.
PAGE_COLUMNS = ("name", "type", "modules", "forward_ms", "backward_ms", "time_percent", "params", "flops", "memory")


def page_columns(rows: Sequence[dict[str, Any]], lead: Sequence[str] = ()) -> list[str]:
    """``lead``, then the ``PAGE_COLUMNS`` that some row has a value of (short names resolved on the rows)."""
    held = {key for row in rows for key, value in row.items() if value is not None}
    chosen = list(lead)
    for name in PAGE_COLUMNS:
        resolved = canonical(name, present=lambda key: key in held) or name
        if resolved in held and resolved not in chosen:
            chosen.append(resolved)
    return chosen


def write_text(text: str, path: str | Path | None) -> str:
    """Write ``text`` to ``path`` when one is given (completely or not at all); return the text either way."""
    if path is not None:
        write_text_atomic(path, text)
    return text


def _import_pandas() -> Any:
    try:
        import pandas
    except ImportError as error:  # pragma: no cover - pandas is installed in the test environment
        raise ImportError("to_dataframe needs pandas: pip install pandas") from error
    return pandas


# What a column with no value takes, by the unit of its field: the type the same column has where it holds values
# (an empty selection concatenated to a full one keeps its types).
_EMPTY_DTYPES = {"text": "string", "bytes": "Int64", "flops": "Int64", "macs": "Int64", "count": "Int64"}
_TEXT_COLUMNS = ("name", "type", "parent", "extra_repr")


def _dtype(values: list[Any], column: str = "") -> str:
    present = [v for v in values if v is not None]
    if present and all(isinstance(v, bool) for v in present):
        return "boolean"
    if present and all(isinstance(v, int) and not isinstance(v, bool) for v in present):
        return "Int64"  # nullable: a module that never ran has None
    if present and all(is_number(v) for v in present):
        return "float64"
    if present and all(isinstance(v, str) for v in present):
        return "string"
    if not present:
        if column in _TEXT_COLUMNS:
            return "string"
        field = FIELDS.get(column)
        return _EMPTY_DTYPES.get(field.unit, "float64") if field is not None else "float64"
    return "object"


def to_dataframe(rows: Sequence[dict[str, Any]], columns: Sequence[str] | None = None) -> Any:
    """A pandas DataFrame, one row per row, typed columns (Int64/float64/string; lists stay objects)."""
    pandas = _import_pandas()
    chosen = list(columns) if columns is not None else table_columns(rows)
    data = {}
    for column in chosen:
        values = [row.get(column) for row in rows]
        dtype = _dtype(values, column)
        if dtype == "float64":
            values = [float("nan") if v is None else float(v) for v in values]
        data[column] = pandas.Series(values, dtype=dtype)
    return pandas.DataFrame(data, columns=chosen)


def _csv_cell(value: Any) -> str:
    if isinstance(value, (list, tuple, dict)):
        return json.dumps(value)  # shapes and aliases stay parseable
    return format_plain(value)


def to_csv(rows: Sequence[dict[str, Any]], columns: Sequence[str] | None = None) -> str:
    """CSV text: a header of field names, then raw values (floats at full precision, lists as JSON, None empty)."""
    chosen = list(columns) if columns is not None else table_columns(rows)
    buffer = io.StringIO()
    writer = csv.writer(buffer, lineterminator="\n")
    writer.writerow(chosen)
    for row in rows:
        writer.writerow([_csv_cell(row.get(column)) for column in chosen])
    return buffer.getvalue()


def cell_text(column: str, value: Any, raw: bool) -> str:
    """What a human-readable table shows for one value (the root, whose qualified name is "", as ``(root)``)."""
    if column == "name" and value == "":
        return ROOT_LABEL
    if isinstance(value, (list, tuple)):
        return json.dumps(value) if raw else ", ".join(str(v) for v in value)
    if raw:
        return format_plain(value)
    return format_field(column, value)


def _header(column: str, raw: bool) -> str:
    return column if raw else field_label(column)


def _is_numeric_column(rows: Sequence[dict[str, Any]], column: str) -> bool:
    return any(is_number(row.get(column)) for row in rows) and not any(
        isinstance(row.get(column), str) for row in rows
    )


# What a Markdown renderer (CommonMark, GFM tables and strikethrough) would read in a cell rather than show:
# HTML and entities are written as entities, the rest of the punctuation it acts on backslash-escaped.
_MARKDOWN_ESCAPES = str.maketrans({
    "&": "&amp;", "<": "&lt;", ">": "&gt;", "\\": "\\\\", "|": "\\|", "`": "\\`", "*": "\\*", "[": "\\[",
    "]": "\\]", "~": "\\~", "\n": " ", "\r": " ",  # a line break (\n, \r or both) would end the row
})
# An ``_`` between two letters or digits neither opens nor closes emphasis (CommonMark's rule for ``_``): left as
# is, so that ``forward_ms`` and ``word_embeddings`` read as written.
_LOOSE_UNDERSCORE = re.compile(r"(?<![^\W_])_|_(?![^\W_])")


def markdown_escape(text: str) -> str:
    r"""``text`` as a Markdown table cell that renders as ``text``.

    >>> print(markdown_escape("d.<b>|*x*_y_ a_b"))
    d.&lt;b&gt;\|\*x\*\_y\_ a_b
    """
    return _LOOSE_UNDERSCORE.sub(r"\\_", text.translate(_MARKDOWN_ESCAPES))


def to_markdown(rows: Sequence[dict[str, Any]], columns: Sequence[str] | None = None, raw: bool = False,
                right: Collection[str] = ()) -> str:
    """A GitHub-flavoured Markdown pipe table; numeric columns (and those in ``right``, figures already written
    as text) right-aligned."""
    chosen = list(columns) if columns is not None else display_columns(rows)
    lines = ["| " + " | ".join(markdown_escape(_header(c, raw)) for c in chosen) + " |"]
    lines.append("|" + "|".join("---:" if c in right or _is_numeric_column(rows, c) else ":---" for c in chosen)
                 + "|")
    for row in rows:
        lines.append("| " + " | ".join(markdown_escape(cell_text(c, row.get(c), raw)) or " " for c in chosen) + " |")
    return "\n".join(lines) + "\n"


# ``<``, ``>``, ``|`` and ``` ` ``` are no special characters, but in LaTeX's default font encoding (OT1) they
# print as "¡", "¿", "—" and "‘": written as commands, they print as themselves in any encoding. A line break
# would end the cell's paragraph (two in a row are an error inside a tabular): a name's line breaks become spaces.
_LATEX_ESCAPES = {
    "\\": r"\textbackslash{}", "&": r"\&", "%": r"\%", "$": r"\$", "#": r"\#", "_": r"\_", "{": r"\{",
    "}": r"\}", "~": r"\textasciitilde{}", "^": r"\textasciicircum{}", "<": r"\textless{}", ">": r"\textgreater{}",
    "|": r"\textbar{}", "`": r"\textasciigrave{}", "\n": " ", "\r": " ", "µ": r"$\mu$", "—": "---",
}
# pdflatex has no Greek text font (a Greek letter is "Unicode character ... not set up for use with LaTeX", a
# fatal error): the letters of a module's name (``self.σ = nn.Linear(...)``) are written as math, which every
# engine typesets. A capital that looks like a Latin one is that letter.
_GREEK_LETTERS = "αβγδεζηθικλμνξοπρςστυφχψω" "ΑΒΓΔΕΖΗΘΙΚΛΜΝΞΟΠΡΣΤΥΦΧΨΩ"
_GREEK_LATEX = (r"\alpha \beta \gamma \delta \varepsilon \zeta \eta \theta \iota \kappa \lambda \mu \nu \xi o \pi"
                r" \rho \varsigma \sigma \tau \upsilon \varphi \chi \psi \omega A B \Gamma \Delta E Z H \Theta"
                r" I K \Lambda M N \Xi O \Pi P \Sigma T \Upsilon \Phi X \Psi \Omega").split()
_LATEX_ESCAPES.update(
    (char, f"${tex}$" if tex.startswith("\\") else tex) for char, tex in zip(_GREEK_LETTERS, _GREEK_LATEX, strict=True)
)


def latex_escape(text: str) -> str:
    r"""Escape LaTeX's special characters (and write µ, Greek letters and the missing-value dash in plain LaTeX).

    >>> print(latex_escape("a<b>|c_1 50% µs Δσ"))
    a\textless{}b\textgreater{}\textbar{}c\_1 50\% $\mu$s $\Delta$$\sigma$
    """
    return "".join(_LATEX_ESCAPES.get(char, char) for char in text)


def to_latex(
    rows: Sequence[dict[str, Any]],
    columns: Sequence[str] | None = None,
    raw: bool = False,
    caption: str | None = None,
    label: str | None = None,
    longtable: bool = False,
    fit: bool = False,
    right: Collection[str] = (),
) -> str:
    """A booktabs ``tabular`` (``\\usepackage{booktabs}``), wrapped in a ``table`` when a caption is given (and
    ``label``, which needs one).

    ``longtable``: a ``longtable`` (``\\usepackage{longtable}``) instead, which breaks across pages and repeats its
    header on each; a tabular is one box, and a table taller than the page runs off its bottom. ``fit``: a tabular
    wider than the line is scaled down to the line's width (``\\usepackage{graphicx}``); a narrower one is left as is.
    Numeric columns, and those in ``right`` (figures already written as text), are right-aligned.
    """
    if longtable and fit:
        raise ValueError("longtable=True and fit=True cannot go together: a longtable breaks across pages and "
                         "cannot be scaled; pick fewer columns (columns=...) to narrow it")
    if label is not None and caption is None:
        raise ValueError(f"label={label!r} needs a caption: LaTeX numbers a table by its caption, and without one "
                         f"\\ref{{{label}}} gives the number of the section; give caption= too")
    chosen = list(columns) if columns is not None else display_columns(rows)
    spec = "".join("r" if c in right or _is_numeric_column(rows, c) else "l" for c in chosen)
    header = ["\\toprule", " & ".join(latex_escape(_header(c, raw)) for c in chosen) + r" \\", "\\midrule"]
    body = [" & ".join(latex_escape(cell_text(c, row.get(c), raw)) for c in chosen) + r" \\" for row in rows]
    titled = [f"\\caption{{{latex_escape(caption)}}}"] if caption is not None else []
    if label is not None:
        titled.append(f"\\label{{{label}}}")
    if longtable:
        # The first page's header under the caption, the same header again on every page after it.
        first = [" ".join(titled) + r" \\"] if titled else []
        lines = [f"\\begin{{longtable}}{{{spec}}}", *first, *header, "\\endfirsthead", *header, "\\endhead",
                 *body, "\\bottomrule", "\\end{longtable}"]
        return "\n".join(lines) + "\n"
    tabular = [f"\\begin{{tabular}}{{{spec}}}", *header, *body, "\\bottomrule", "\\end{tabular}"]
    if fit:
        # Measured in a box first: scaled to the line only where wider (graphicx's \resizebox alone would also
        # blow a narrow table up to the line's width); not indented, as a paragraph's first line would be.
        tabular = ["\\sbox0{%", *tabular[:-1], tabular[-1] + "}%",
                   r"\noindent\ifdim\wd0>\linewidth\resizebox{\linewidth}{!}{\usebox0}\else\usebox0\fi"]
    if not titled:
        return "\n".join(tabular) + "\n"
    return "\n".join(["\\begin{table}", "\\centering", *titled, *tabular, "\\end{table}"]) + "\n"


def iter_cells(rows: Iterable[dict[str, Any]], columns: Sequence[str], raw: bool) -> Iterable[list[str]]:
    """Each row's cells as text, for renderers that lay out their own table (HTML, plain text)."""
    for row in rows:
        yield [cell_text(column, row.get(column), raw) for column in columns]


def headers(columns: Sequence[str], raw: bool) -> list[str]:
    """The header of each column: the field name when raw, else a label (the unit is in the values)."""
    return [_header(column, raw) for column in columns]


def to_text(rows: Sequence[dict[str, Any]], columns: Sequence[str] | None = None, raw: bool = False) -> str:
    """A plain-text table with aligned columns, for terminals and ``print``."""
    chosen = list(columns) if columns is not None else display_columns(rows)
    table = [headers(chosen, raw), *iter_cells(rows, chosen, raw)]
    table = [[cell or " " for cell in line] for line in table]
    widths = [max(len(line[i]) for line in table) for i in range(len(chosen))]
    numeric = [_is_numeric_column(rows, c) for c in chosen]

    def layout(line: list[str]) -> str:
        cells = [cell.rjust(w) if right else cell.ljust(w) for cell, w, right in zip(line, widths, numeric)]
        return "  ".join(cells).rstrip()

    rule = "  ".join("-" * w for w in widths)
    return "\n".join([layout(table[0]), rule, *(layout(line) for line in table[1:])]) + "\n"
