"""Comparing two profiles (teacher and student, or one model before and after a change).

Every compared quantity is a cost (time, FLOPs, parameters, bytes), so lower is better. ``diff`` is ``b - a``,
``ratio`` is ``b / a`` and ``rel_diff`` is ``(b - a) / a``; they are None where a side is missing or ``a`` is 0.
"""
from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any, Sequence

from .export import to_csv, to_dataframe, to_latex, to_markdown, to_text, write_text
from .._check import check_bool, check_names, check_path, check_text
from ..record.fields import FIELDS, canonical
from ..record.summed import TreeValues, summable
from .rows import derived_names, is_number, numeric_fields, value_of
from .gate import different_machines, different_settings
from .plot_metrics import how_to_record
from .units import field_label, format_change, format_counted, format_field, format_ratio, format_signed_field

if TYPE_CHECKING:
    from ..profile import Profile

__all__ = ["Comparison", "MODEL_FIELDS"]

# Model-level quantities in the order they are shown; other numeric fields follow in row order.
MODEL_FIELDS = (
    "params", "trainable_params", "param_bytes", "buffer_bytes", "flops_forward", "flops_backward", "flops",
    "forward_ms", "backward_ms", "total_ms", "recompute_ms", "activation_bytes", "saved_bytes",
    "cuda_forward_peak_bytes", "cuda_backward_peak_bytes", "cuda_peak_bytes",
)


def _not_costs() -> list[str]:
    """Fields that count or place rather than cost (the catalogue's ``cost=False``): never compared."""
    return ["depth", *(field.name for field in FIELDS.values() if not field.cost)]
# Per-module diffs show a few fields, where both profiles have them, so the table stays readable.
MODULE_FIELDS = ("forward_ms", "backward_ms", "total_ms", "params", "flops_forward", "activation_bytes")


def _ordered_fields(rows: Sequence[dict[str, Any]]) -> list[str]:
    # A root's self time is only what runs outside every child (often hook overhead): not a model-level cost.
    found = [f for f in numeric_fields(rows, skip=_not_costs()) if f not in derived_names() and not f.startswith("self_")]
    known = [f for f in MODEL_FIELDS if f in found or f == "total_ms"]
    return known + [f for f in found if f not in known]


def _model_row(root: Any) -> tuple[dict[str, Any], Any]:
    """The root's row and a reader of its model-level values. A root never called itself (a trainer's step calling
    ``model.net(x)``) takes its top-level modules' costs, summed, as the summary and the gate do."""
    row = root.to_dict()
    values = TreeValues(root)
    if not values.summed(root):
        return row, lambda field: value_of(root, field, row)
    for name, field in FIELDS.items():
        if row.get(name) is None and summable(field):
            found = values.stored(root, name)
            if found is not None:
                row[name] = found
    return row, lambda field: row[field] if field in row else (values.value(root, field) if field in FIELDS else None)


def _with_model_totals(profile: Profile, row: dict[str, Any], read: Any) -> tuple[dict[str, Any], Any]:
    """The model-level row with the totals a meter left in the profile's meta under a field's own name (the
    ``fsdp_comm`` meter's communication and bytes, summed over its units), where the root's record holds only its
    own unit's, or none."""
    meta = profile.meta
    found = {}
    for name, field in FIELDS.items():
        totals = meta.get(field.meter) if field.meter else None
        if isinstance(totals, dict) and is_number(totals.get(name)):
            found[name] = totals[name]
    if not found:
        return row, read
    return {**row, **found}, lambda field: found[field] if field in found else read(field)


def _difference(a: Any, b: Any) -> tuple[float | None, float | None, float | None]:
    if not (is_number(a) and is_number(b)):
        return None, None, None
    diff = b - a
    if a == 0:
        return diff, None, None
    return diff, diff / a, b / a


# The columns the tables put beside the two profiles' labels (``to_dataframe``, the text).
_COLUMNS = frozenset({"metric", "module", "diff", "rel_diff", "ratio", "better", "change"})


def _better(a: Any, b: Any, names: tuple[str, str]) -> str | None:
    if not (is_number(a) and is_number(b)):
        return None
    if a == b:
        return "same"
    return names[0] if a < b else names[1]


def _compared(metric: str, a: Any, b: Any, names: tuple[str, str]) -> dict[str, Any]:
    diff, rel_diff, ratio = _difference(a, b)
    return {"metric": metric, "a": a, "b": b, "diff": diff, "rel_diff": rel_diff, "ratio": ratio,
            "better": _better(a, b, names)}


class Comparison:
    """Model-level rows (``model``) and per-module rows for the modules in both profiles, by name and type
    (``modules``; ``matched`` their names, ``only_a`` and ``only_b`` the others, ``retyped`` the names in both that
    hold another type in each).

    ``model``: ``{metric, a, b, diff, rel_diff, ratio, better}`` for the number of modules and every cost the
    roots carry. ``modules``: ``{name, type_a, type_b, field_a, field_b, field_diff, field_ratio, ...}``.
    ``to_csv``, ``to_markdown`` and ``to_latex`` write the model-level table, or with ``level="modules"`` the
    matching modules' change in one field. ``names`` label the two profiles in the text and the tables, so a name
    that is one of the tables' columns (``metric``, ``module``, ``diff``, ``rel_diff``, ``ratio``, ``better``,
    ``change``, in any case) is refused.
    """

    def __init__(self, a: Profile, b: Profile, names: tuple[str, str] = ("a", "b"),
                 module_fields: Sequence[str] | None = None) -> None:
        self.a, self.b = a, b
        if isinstance(names, str) or not isinstance(names, Sequence) or len(names) != 2:
            raise ValueError(f"names must be two labels, one per profile, e.g. ('teacher', 'student'); got {names!r}")
        self.names = (str(names[0]), str(names[1]))
        if self.names[0] == self.names[1]:
            raise ValueError(f"the two profiles need different names, got {names!r}")
        # (case aside: a page's table heads them "Metric", "Change", ...)
        taken = [name for name in self.names if name.lower() in _COLUMNS]
        if taken:
            raise ValueError(f"names: {taken[0]!r} is a column of the comparison's tables, where the profiles' "
                             f"labels are columns too; name the profiles otherwise, e.g. ('before', 'after') "
                             f"(taken: {', '.join(sorted(_COLUMNS))})")
        root_a, root_b = a.tree, b.tree
        (row_a, read_a), (row_b, read_b) = (_with_model_totals(a, *_model_row(root_a)),
                                            _with_model_totals(b, *_model_row(root_b)))
        self.model: list[dict[str, Any]] = [_compared("modules", len(a.records), len(b.records), self.names)]
        for field in _ordered_fields([row_a, row_b]):
            self.model.append(_compared(field, read_a(field), read_b(field), self.names))
        # Modules match by name and type: a name in both that holds another type (a teacher's block where the
        # student has one layer) is not the same module, and is in neither's matches. The roots always match: they
        # are the two models.
        records_a, records_b = a.records, b.records
        self.retyped = [name for name, record in records_a.items()
                        if name and name in records_b and records_b[name].type != record.type]
        other = set(self.retyped)
        self.matched = [name for name in records_a if name in records_b and name not in other]
        self.only_a = [name for name in records_a if name not in records_b or name in other]
        self.only_b = [name for name in records_b if name not in records_a or name in other]
        self.module_fields = self._module_fields(module_fields)
        self.modules = [self._module_row(name) for name in self.matched]

    def _module_fields(self, chosen: Sequence[str] | None) -> list[str]:
        if chosen is not None:
            fields = _known_fields(chosen)
            for field in fields:
                self._check_recorded(field)
            return fields
        rows_a = [self.a.records[n].to_dict() for n in self.matched]
        rows_b = [self.b.records[n].to_dict() for n in self.matched]
        present = set(numeric_fields(rows_a, skip=_not_costs())) & set(numeric_fields(rows_b, skip=_not_costs()))
        present.add("total_ms")
        return [f for f in MODULE_FIELDS if f in present]

    def _check_recorded(self, field: str) -> None:
        """A chosen field that no matching module of a profile holds would compare as an empty column: refused,
        naming the profile that lacks it and how to record it."""
        lacking = [label for label, profile in zip(self.names, (self.a, self.b))
                   if all(value_of(profile.records[name], field) is None for name in self.matched)]
        if not lacking:
            return
        declared = FIELDS.get(field)
        # (a profile whose steps ran forward only lacks a backward field for want of .backward(), not of its meter)
        records = [(self.a, self.b)[self.names.index(lacking[0])].records[name] for name in self.matched]
        hint = how_to_record(declared, records, "it has") if declared is not None else "record it in both profiles"
        if len(lacking) == 2:
            raise ValueError(f"module_fields: {field!r} was recorded by neither profile ({self.names[0]!r} nor "
                             f"{self.names[1]!r}), so its columns would be empty; {hint}")
        other = self.names[1] if lacking[0] == self.names[0] else self.names[0]
        raise ValueError(f"module_fields: {field!r} was recorded by profile {other!r} but not by {lacking[0]!r}, "
                         f"so nothing of it compares; for {lacking[0]!r}, {hint}")

    def _module_row(self, name: str) -> dict[str, Any]:
        record_a, record_b = self.a.records[name], self.b.records[name]
        row: dict[str, Any] = {"name": name, "type_a": record_a.type, "type_b": record_b.type}
        for field in self.module_fields:
            a, b = value_of(record_a, field), value_of(record_b, field)
            diff, _, ratio = _difference(a, b)
            row.update({f"{field}_a": a, f"{field}_b": b, f"{field}_diff": diff, f"{field}_ratio": ratio})
        return row

    def to_dataframe(self, level: str = "model") -> Any:
        """``level="model"``: one row per metric (columns a, b named after the profiles); ``"modules"``: one row
        per matching module."""
        if level == "model":
            return to_dataframe(*self.model_rows(raw=True))
        if level == "modules":
            return to_dataframe(self.modules)
        raise ValueError(f"level must be 'model' or 'modules', got {level!r}")

    def model_rows(self, raw: bool = False) -> tuple[list[dict[str, Any]], list[str]]:
        """The model-level table's rows and columns: ``metric``, one column per profile, then ``change``,
        ``ratio`` and ``better`` as text (``raw``: the numbers, with ``diff``, ``rel_diff`` and ``ratio``)."""
        a_name, b_name = self.names
        if raw:
            rows = [{**row, a_name: row["a"], b_name: row["b"]} for row in self.model]
            return rows, ["metric", a_name, b_name, "diff", "rel_diff", "ratio", "better"]
        rows = []
        for row in self.model:
            metric = row["metric"]
            rows.append({
                "metric": metric,
                a_name: format_field(metric, row["a"]),
                b_name: format_field(metric, row["b"]),
                "change": format_change(row["diff"], row["a"]),
                "ratio": format_ratio(row["ratio"]),
                "better": row["better"] or format_field(metric, None),
            })
        return rows, ["metric", a_name, b_name, "change", "ratio", "better"]

    def module_rows(self, field: str | None = None, limit: int | None = None,
                    raw: bool = False) -> tuple[list[dict[str, Any]], list[str]]:
        """The matching modules' rows for one field (``total_ms`` unless told, or the first compared), the largest
        change first (``limit``: the first so many): ``module``, the field in each profile, ``diff`` and ``ratio``;
        formatted as text unless ``raw``. The roots compare in the model-level table."""
        field = self._module_field(field)
        if field is None:
            return [], []
        changed = [row for row in self.modules if row[f"{field}_diff"] is not None and row["name"]]
        changed.sort(key=lambda row: abs(row[f"{field}_diff"]), reverse=True)
        a_name, b_name = self.names
        columns = ["module", a_name, b_name, "diff", "ratio"]
        if raw:
            return [{"module": row["name"], a_name: row[f"{field}_a"], b_name: row[f"{field}_b"],
                     "diff": row[f"{field}_diff"], "ratio": row[f"{field}_ratio"]} for row in changed[:limit]], columns
        return [{
            "module": row["name"],
            a_name: format_field(field, row[f"{field}_a"]),
            b_name: format_field(field, row[f"{field}_b"]),
            "diff": format_signed_field(field, row[f"{field}_diff"]),
            "ratio": format_ratio(row[f"{field}_ratio"]),
        } for row in changed[:limit]], columns

    def _module_field(self, field: str | None) -> str | None:
        if field is None:
            return "total_ms" if "total_ms" in self.module_fields else (self.module_fields or [None])[0]
        chosen = canonical(field) if isinstance(field, str) else None
        if chosen not in self.module_fields:
            raise ValueError(f"field: {field!r} is not among the fields this comparison holds per module "
                             f"({', '.join(self.module_fields) or 'none'}); choose one of them, or compare with "
                             f"module_fields=[...] naming it")
        return chosen

    def _rows(self, level: str, field: str | None, limit: int | None,
              raw: bool) -> tuple[list[dict[str, Any]], list[str]]:
        if level == "model":
            if field is not None or limit is not None:
                raise ValueError("field= and limit= choose among the modules: give level='modules' with them")
            return self.model_rows(raw)
        if level == "modules":
            if limit is not None and (isinstance(limit, bool) or not isinstance(limit, int) or limit < 1):
                raise ValueError(f"limit must be a whole number of rows >= 1, or None for every module; got {limit!r}")
            if not self.module_fields:  # (a table of no column: '|  |' in Markdown, a tabular{} LaTeX refuses)
                raise ValueError("level='modules': this comparison holds no field per module (compared with "
                                 "module_fields=[]); compare with module_fields=[...] naming the fields to tabulate")
            return self.module_rows(field, limit, raw)
        raise ValueError(f"level must be 'model' or 'modules', got {level!r}")

    def _page(self, level: str, field: str | None, limit: int | None,
              raw: bool) -> tuple[list[dict[str, Any]], list[str], list[str]]:
        """A page's table (Markdown, LaTeX): the rows and columns, headed and with metrics labelled as a reader
        expects ("Forward", "Trainable params") unless ``raw``, and the columns of figures, right-aligned."""
        rows, columns = self._rows(level, field, limit, raw)
        figures = columns[1:-1] if level == "model" else columns[1:]
        if raw:
            return rows, columns, figures
        heads = {column: column if column in self.names else column[:1].upper() + column[1:] for column in columns}
        paged = [{heads[column]: (field_label(row[column]) if column == "metric" else row[column])
                  for column in columns} for row in rows]
        return paged, [heads[c] for c in columns], [heads[c] for c in figures]

    def to_csv(self, path: str | Path | None = None, level: str = "model", field: str | None = None,
               limit: int | None = None) -> str:
        """The model-level table (or, ``level="modules"``, the matching modules' change in ``field``, the largest
        first) as CSV of raw numbers; written to ``path`` (whole or not at all) if given."""
        check_path(path)
        rows, columns = self._rows(level, field, limit, raw=True)
        return write_text(to_csv(rows, columns), path)

    def to_markdown(self, path: str | Path | None = None, level: str = "model", field: str | None = None,
                    limit: int | None = None, raw: bool = False) -> str:
        """The model-level table (or, ``level="modules"``, the matching modules' change in ``field``) as a Markdown
        table, figures right-aligned; written to ``path`` if given."""
        check_path(path)
        raw = check_bool("raw", raw)
        rows, columns, figures = self._page(level, field, limit, raw)
        return write_text(to_markdown(rows, columns, raw=True, right=figures), path)

    def to_latex(self, path: str | Path | None = None, level: str = "model", field: str | None = None,
                 limit: int | None = None, raw: bool = False, caption: str | None = None, label: str | None = None,
                 longtable: bool = False, fit: bool = False) -> str:
        """The model-level table (or, ``level="modules"``, the matching modules' change in ``field``) as a booktabs
        LaTeX table, as ``Profile.to_latex`` writes one (``caption``, ``label``, ``longtable``, ``fit``); written
        to ``path`` if given."""
        check_path(path)
        raw, longtable, fit = check_bool("raw", raw), check_bool("longtable", longtable), check_bool("fit", fit)
        caption, label = check_text("caption", caption), check_text("label", label)
        rows, columns, figures = self._page(level, field, limit, raw)
        text = to_latex(rows, columns, raw=True, caption=caption, label=label, longtable=longtable, fit=fit,
                        right=figures)
        return write_text(text, path)

    def _model_text(self) -> str:
        return to_text(*self.model_rows(), raw=True)

    def _modules_text(self, limit: int) -> str:
        rows, columns = self.module_rows(limit=limit)
        if not rows:
            return ""
        field = self._module_field(None)
        title = f"Modules with the largest change in {field} ({len(rows)} of {len(self.matched)} matching):\n"
        return title + to_text(rows, columns, raw=True)

    def __str__(self) -> str:
        a_name, b_name = self.names
        head = (f"Comparison {a_name} ({self.a.tree.type}) vs {b_name} ({self.b.tree.type}); "
                f"change and ratio are {b_name} relative to {a_name}; lower is better.\n")
        parts = [head + self._model_text()]
        modules = self._modules_text(limit=10)
        if modules:
            parts.append(modules)
        for why in (different_settings(self.a, self.b, self.names), different_machines(self.a, self.b, self.names)):
            if why is not None:
                parts.append(f"Measured otherwise: {why}: the times compare that too.")
        if self.only_a or self.only_b:
            retyped = (f" ({format_counted(len(self.retyped), 'name')} in both with another type each, such as "
                       f"'{self.retyped[0]}': {self.a.records[self.retyped[0]].type} and "
                       f"{self.b.records[self.retyped[0]].type})" if self.retyped else "")
            parts.append(f"Only in {a_name}: {format_counted(len(self.only_a), 'module')}; "
                         f"only in {b_name}: {len(self.only_b)}{retyped}.")
        return "\n".join(parts).rstrip("\n")

    def _repr_pretty_(self, printer: Any, cycle: bool) -> None:
        # IPython shows a cell's last value by this: the tables ``print`` gives; repr keeps to one line.
        printer.text(str(self))

    def __repr__(self) -> str:
        return (f"<Comparison {self.names[0]} ({self.a.tree.type}) vs {self.names[1]} ({self.b.tree.type}): "
                f"{format_counted(len(self.model), 'metric')}, "
                f"{format_counted(len(self.matched), 'matching module')}>")


def _known_fields(chosen: Any) -> list[str]:
    """``module_fields=`` as canonical field names (short names resolved: "forward" is forward_ms); a string
    (its letters would be the fields) or a name the catalogue does not know is refused: it compared nothing."""
    names = check_names("module_fields", chosen, "('forward_ms', 'saved_bytes')")
    fields = [canonical(name) for name in names]
    unknown = [name for name, field in zip(names, fields) if field is None]
    if unknown:
        raise ValueError(f"module_fields: unknown field(s) {', '.join(map(repr, unknown))}; give field names such as "
                         "'forward_ms', 'backward_ms', 'saved_bytes', 'flops' (the columns of layerwise_summary)")
    return [field for field in fields if field is not None]
